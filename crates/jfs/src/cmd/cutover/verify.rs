//! `jfs cutover verify`: every block the metadata references is read from the new store
//! and checked (length and CRC32C); what is missing or damaged is copied again from the old
//! one, and the repair list is drained. Also the repair-list drain that finish and abort use.

use super::super::{open_engine, Outcome};
use super::*;
use crate::cli::{BarrierArgs, Global};
use crate::progress::Progress;
use anyhow::{anyhow, bail, Context, Result};
use fs_core::storage::{self, Event, Phase, Role};
use fs_core::{BlockCheck, BlockStore, Engine, ErrorKind, Settings};
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// What verify found.
#[derive(Debug, Default, serde::Serialize)]
struct VerifyReport {
    blocks: u64,
    bytes: u64,
    /// In the new store with the right length and checksum.
    good: u64,
    /// Missing in the new store: copied from the old one.
    copied_missing: u64,
    /// Damaged (wrong length or checksum) in the new store: copied again.
    copied_damaged: u64,
    /// Repair-list entries copied and cleared.
    repairs_drained: u64,
    /// Blocks that could not be made good, with why.
    failed: Vec<String>,
    seconds: f64,
}

/// Copy block `key` from `from` to `to` (verified against `want` on the way).
pub(super) async fn copy_block(
    from: &dyn BlockStore,
    to: &dyn BlockStore,
    key: &str,
    want: BlockCheck,
) -> fs_core::Result<u64> {
    let b = from.get_block(key, want).await?;
    let n = b.len() as u64;
    to.put(key, b).await?;
    Ok(n)
}

/// The check of block `key` (its length from the key, its CRC32C from its slice's record).
pub(super) async fn check_of(e: &dyn Engine, settings: &Settings, key: &str) -> Result<BlockCheck> {
    let (id, index, len) = fs_core::keys::parse_block_key(&settings.name, key)
        .ok_or_else(|| anyhow!("{key} is not a block key of volume {}", settings.name))?;
    let crc = fs_core::fs::slice_checksums(e, &[id])
        .await?
        .get(&id)
        .and_then(|c| c.get(index as usize).copied());
    Ok(BlockCheck { len, crc })
}

/// Copy every block the repair list of `role` names from `from` into `to`, clearing entries
/// as they are done. Returns how many; errors name the block.
pub(super) async fn drain(
    e: &dyn Engine,
    settings: &Settings,
    role: Role,
    from: &dyn BlockStore,
    to: &dyn BlockStore,
) -> Result<u64> {
    let mut n = 0;
    for r in storage::repairs(e, Some(role)).await? {
        let want = check_of(e, settings, &r.key).await?;
        match to.get_block(&r.key, want).await {
            Ok(_) => {}
            Err(_) => {
                copy_block(from, to, &r.key, want).await.with_context(|| {
                    format!("repairing block {} (recorded: {})", r.key, r.error)
                })?;
            }
        }
        storage::repair_done(e, role, &r.key).await?;
        n += 1;
    }
    Ok(n)
}

pub(super) async fn verify(
    g: &Global,
    meta_url: &str,
    threads: usize,
    json: bool,
    barrier: &BarrierArgs,
) -> Result<Outcome> {
    use sync::endpoint::BlockIndex;
    let t0 = Instant::now();
    let e = open_engine(g, meta_url, true).await?;
    let settings = settings_of(&*e).await?;
    let st = state_of(&*e).await?;
    let Phase::Dual {
        from,
        to,
        backfilled,
        ..
    } = &st.phase
    else {
        bail!(
            "verify checks the new store during a cutover's dual write; the volume is in {}",
            st.phase.describe()
        );
    };
    if !backfilled {
        bail!("verify comes after backfill: run `jfs cutover backfill {meta_url}` first");
    }
    wait_barrier(&*e, st.gen, barrier).await?;
    let (a, b) = (store(g, from)?, store(g, to)?);
    let dir = default_state_dir(&settings.uuid, st.gen).join("verify-index");
    let index = BlockIndex::build(&*e, &settings, &dir).await?;
    let rep = Mutex::new(VerifyReport {
        blocks: index.blocks,
        bytes: index.bytes,
        ..Default::default()
    });
    let progress = Progress::new("verify", index.bytes, g.quiet || json);
    let copied = AtomicU64::new(0);
    let mut after: Option<String> = None;
    loop {
        let page = index.page(after.as_deref(), 1000)?;
        let Some(last) = page.last() else { break };
        after = Some(last.0.clone());
        let ids: Vec<u64> = page.iter().map(|(_, _, id)| *id).collect();
        let sums = fs_core::fs::slice_checksums(&*e, &ids).await?;
        let (a, b, rep, progress, copied) = (&a, &b, &rep, &progress, &copied);
        let (sums, name) = (&sums, settings.name.as_str());
        futures::stream::iter(page.into_iter().map(|(key, len, id)| async move {
            let index = fs_core::keys::parse_block_key(name, &key)
                .map(|(_, i, _)| i as usize)
                .unwrap_or(0);
            let want = BlockCheck {
                len,
                crc: sums.get(&id).and_then(|c| c.get(index).copied()),
            };
            let missing = match b.get_block(&key, want).await {
                Ok(_) => {
                    rep.lock().unwrap_or_else(|p| p.into_inner()).good += 1;
                    progress.add_bytes(len as u64);
                    return;
                }
                Err(err) if err.kind() == ErrorKind::NotFound => true,
                Err(err) if err.kind() == ErrorKind::Corrupt => false,
                Err(err) => {
                    rep.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .failed
                        .push(format!("{key}: reading it from the new store: {err}"));
                    return;
                }
            };
            let r = copy_block(&**a, &**b, &key, want).await;
            let mut g = rep.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(n) => {
                    copied.fetch_add(n, Relaxed);
                    if missing {
                        g.copied_missing += 1;
                    } else {
                        g.copied_damaged += 1;
                    }
                }
                Err(err) => g.failed.push(format!(
                    "{key}: {} in the new store, and copying it failed: {err}",
                    if missing { "missing" } else { "damaged" }
                )),
            }
            progress.add_bytes(len as u64);
        }))
        .buffer_unordered(threads.max(1))
        .collect::<Vec<()>>()
        .await;
        if super::super::interrupted() {
            bail!("verify interrupted; run it again");
        }
    }
    progress.finish();
    drop(index);
    let _ = std::fs::remove_dir_all(&dir);
    let drained = drain(&*e, &settings, Role::B, &*a, &*b).await;
    let mut rep = rep.into_inner().unwrap_or_else(|p| p.into_inner());
    match drained {
        Ok(n) => rep.repairs_drained = n,
        Err(err) => rep.failed.push(format!("{err:#}")),
    }
    rep.seconds = t0.elapsed().as_secs_f64();
    if json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        for f in &rep.failed {
            println!("FAILED {f}");
        }
        println!(
            "verified {} blocks ({} MiB) in {to}: {} good, {} copied (missing), {} copied again (damaged), {} repair entries drained, {} failed ({:.1}s)",
            rep.blocks,
            rep.bytes >> 20,
            rep.good,
            rep.copied_missing,
            rep.copied_damaged,
            rep.repairs_drained,
            rep.failed.len(),
            rep.seconds
        );
    }
    if !rep.failed.is_empty() {
        cli_common::eprintln!("jfs: verify did not pass; fix what is named above and run it again");
        return Ok(Outcome::Partial);
    }
    step(g, meta_url, &Event::Verified).await?;
    cli_common::eprintln!("jfs: verify passed. Next: jfs cutover switch {meta_url}");
    Ok(Outcome::Done)
}
