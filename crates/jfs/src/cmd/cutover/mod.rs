//! `jfs cutover`: move a volume's blocks from its store (A) to another (B) while mounts and
//! writers go on (design §7; the state machine is `fs_core::storage`).
//!
//! Each step checks its preconditions, commits one journaled transition (through the mount
//! when a live mount holds a RocksDB volume), and returns once every live session has
//! acknowledged the new generation. Each is safe to run again: a step already done only
//! waits again, and backfill resumes from its state.

use super::mount::live_mount;
use super::{open_engine, Outcome};
use crate::cli::{BarrierArgs, CutoverCmd, Global};
use anyhow::{bail, Context, Result};
use fs_core::storage::{self, Event, Phase, Role, StorageState};
use fs_core::{BlockStore, Engine, ErrorKind, Settings};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod status;
mod verify;

use status::status;
use verify::{drain, verify};

pub async fn run(g: &Global, cmd: CutoverCmd) -> Result<Outcome> {
    match cmd {
        CutoverCmd::Status { meta_url, json } => status(g, &meta_url, json).await,
        CutoverCmd::Start {
            meta_url,
            to,
            barrier,
        } => {
            let e = open_engine(g, &meta_url, true).await?;
            // A mirror's (or a fenced primary's) metadata refuses the transition anyway: say
            // so before B is created.
            volume::check_site(&*e, volume::Access::Write, false).await?;
            // B must be another place than A (and than the metadata), however spelled:
            // checked before B is opened, which creates a local directory.
            let ep = g.endpoint.as_deref();
            let settings = settings_of(&*e).await?;
            let a = &settings.storage;
            let there = fs_core::place::of_spec(&to, ep);
            let why = fs_core::place::find(&fs_core::place::of_spec(a, ep), &there).or_else(|| {
                fs_core::place::find(&fs_core::place::meta_places(&meta_url, ""), &there)
            });
            if let Some(why) = why {
                bail!("cannot move the volume's blocks to {to}: {} (with the store {a} and the metadata {}); nothing was changed: choose a store outside both", why.replace("the destination's", "the new store's").replace("the source's", "the volume's"), meta::redact(&meta_url));
            }
            // Prove B answers (and create a local store's directory) before any writer
            // depends on it: an unreachable B would only fill the repair list.
            let b = volume::create_store(&to, g.endpoint.as_deref())
                .with_context(|| format!("opening the new store {to} (nothing was changed)"))?;
            b.check().await.with_context(|| {
                format!("the new store {to} does not answer (nothing was changed)")
            })?;
            fs_core::owner::claim(&*b, &settings)
                .await
                .with_context(|| format!("claiming {to} for this volume (nothing was changed)"))?;
            let (_, after) = step(g, &meta_url, &Event::Start { to: to.clone() }).await?;
            wait_barrier(&*e, after.gen, &barrier).await?;
            println!(
                "cutover started: {} (generation {}); every live session writes to both stores. Next: jfs cutover backfill {meta_url}",
                after.phase.describe(),
                after.gen
            );
            Ok(Outcome::Done)
        }
        CutoverCmd::Backfill {
            meta_url,
            threads,
            bwlimit,
            tps,
            state_dir,
            json,
            barrier,
        } => {
            backfill(
                g, &meta_url, threads, bwlimit, tps, state_dir, json, &barrier,
            )
            .await
        }
        CutoverCmd::Verify {
            meta_url,
            threads,
            json,
            barrier,
        } => verify(g, &meta_url, threads, json, &barrier).await,
        CutoverCmd::Switch { meta_url, barrier } => {
            let e = open_engine(g, &meta_url, true).await?;
            let cur = state_of(&*e).await?;
            if let Phase::Dual { .. } = cur.phase {
                let left = storage::repairs(&*e, Some(Role::B)).await?;
                if !left.is_empty() {
                    bail!("{} blocks are recorded as missing in the new store since verify: run `jfs cutover verify {meta_url}` again, then switch", left.len());
                }
            }
            let (_, after) = step(g, &meta_url, &Event::Switch).await?;
            wait_barrier(&*e, after.gen, &barrier).await?;
            println!(
                "switched: {} (generation {}); reads go to the new store first. Next: jfs cutover finish {meta_url} (or abort)",
                after.phase.describe(),
                after.gen
            );
            Ok(Outcome::Done)
        }
        CutoverCmd::Finish { meta_url, barrier } => finish(g, &meta_url, &barrier).await,
        CutoverCmd::Abort { meta_url, barrier } => abort(g, &meta_url, &barrier).await,
    }
}

async fn settings_of(e: &dyn Engine) -> Result<Settings> {
    Ok(fs_core::Fs::load_settings(e).await?)
}

async fn state_of(e: &dyn Engine) -> Result<StorageState> {
    let s = settings_of(e).await?;
    Ok(storage::current(e, &s.storage).await?)
}

/// Commit `ev`: directly, or through the live mount that holds a RocksDB volume.
async fn step(g: &Global, meta_url: &str, ev: &Event) -> Result<(StorageState, StorageState)> {
    match open_engine(g, meta_url, false).await {
        Ok(e) => {
            volume::check_site(&*e, volume::Access::Write, true).await?;
            Ok(storage::transition(&*e, ev).await?)
        }
        Err(err) => {
            let busy = err.chain().any(|c| {
                c.downcast_ref::<fs_core::Error>()
                    .is_some_and(|x| x.kind() == ErrorKind::Busy)
            });
            let Some(mp) = (if busy {
                live_mount(g, meta_url).await?
            } else {
                None
            }) else {
                return Err(err);
            };
            tracing::info!(mountpoint = %mp.display(), "the volume is mounted read-write here: the step goes through the mount");
            let v = mount::control::call(
                &mp,
                &mount::control::Request::Cutover {
                    event: ev.clone(),
                    who: Some(storage::Audit::who_am_i()),
                },
                |_| {},
            )
            .await?;
            let de = |k: &str| -> Result<StorageState> {
                serde_json::from_value(v[k].clone())
                    .with_context(|| format!("the mount's answer ({k}) does not decode"))
            };
            Ok((de("before")?, de("after")?))
        }
    }
}

/// Wait until every live session has acknowledged generation `gen`, saying whom it waits for.
async fn wait_barrier(e: &dyn Engine, gen: u64, b: &BarrierArgs) -> Result<()> {
    let t0 = Instant::now();
    // Live sessions re-read the record every FOLLOW_EVERY: say whom we wait for only once
    // they have had a few of those to follow, then every 5 s.
    let mut say_at = t0 + 4 * volume::placement::FOLLOW_EVERY;
    loop {
        let waiting = storage::waiting_sessions(e, gen, b.session_timeout).await?;
        if waiting.is_empty() {
            return Ok(());
        }
        let now = fs_core::now_ns();
        let names: Vec<String> = waiting
            .iter()
            .map(|s| {
                format!(
                    "{} ({}@{} pid {}, acknowledged generation {}, last beat {:.0}s ago)",
                    s.id,
                    s.mountpoint,
                    s.host,
                    s.pid,
                    s.acks.get(storage::ACK).copied().unwrap_or(0),
                    (now - s.beat_ns) as f64 / 1e9
                )
            })
            .collect();
        if t0.elapsed() >= b.wait {
            bail!(
                "{} live session(s) have not followed generation {gen} within {:?}: {}. The step is committed and their writes are refused until they follow; a process that is gone stops counting once its session is {:?} old (or at once on this host). Run the command again to wait again",
                waiting.len(),
                b.wait,
                names.join("; "),
                b.session_timeout
            );
        }
        if Instant::now() >= say_at {
            cli_common::eprintln!(
                "jfs: waiting for {} session(s) to follow generation {gen}: {}",
                waiting.len(),
                names.join("; ")
            );
            say_at = Instant::now() + Duration::from_secs(5);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn store(g: &Global, url: &str) -> Result<Arc<dyn BlockStore>> {
    volume::open_store(url, g.endpoint.as_deref()).with_context(|| format!("opening {url}"))
}

fn default_state_dir(uuid: &str, gen: u64) -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("jfs")
        .join("cutover")
        .join(format!("{uuid}-{gen}"))
}

#[allow(clippy::too_many_arguments)]
async fn backfill(
    g: &Global,
    meta_url: &str,
    threads: usize,
    bwlimit: Option<String>,
    tps: Option<u32>,
    state_dir: Option<PathBuf>,
    json: bool,
    barrier: &BarrierArgs,
) -> Result<Outcome> {
    use sync::endpoint::BlockIndex;
    let e = open_engine(g, meta_url, true).await?;
    let settings = settings_of(&*e).await?;
    let st = state_of(&*e).await?;
    let Phase::Dual { from, to, .. } = &st.phase else {
        bail!(
            "backfill copies blocks during a cutover's dual write; the volume is in {}",
            st.phase.describe()
        );
    };
    // Only once every writer puts new blocks in both stores does a walk of the metadata
    // find every block B would lack.
    wait_barrier(&*e, st.gen, barrier).await?;
    let dir = state_dir.unwrap_or_else(|| default_state_dir(&settings.uuid, st.gen));
    let index = Arc::new(
        BlockIndex::build(&*e, &settings, &dir.join("index"))
            .await
            .context("listing the blocks the metadata references")?,
    );
    cli_common::eprintln!(
        "jfs: backfill: {} blocks ({} MiB) referenced; copying those {to} lacks (state in {})",
        index.blocks,
        index.bytes >> 20,
        dir.display()
    );
    let stats = Arc::new(sync::stats::Stats::default());
    let ticker = sync::progress::progress(stats.clone(), Duration::from_secs(5), g.quiet || json);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(async move {
        while !super::interrupted() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop_tx.send(true);
    });
    let how = sync::backfill::BackfillOptions {
        threads,
        bwlimit,
        tps,
    };
    let report = sync::backfill::backfill(
        index.clone(),
        from,
        to,
        g.endpoint.as_deref(),
        &dir.join("sync"),
        &how,
        stats,
        stop_rx,
    )
    .await?;
    ticker.abort();
    watcher.abort();
    cli_common::eprintln!("jfs: backfill: {}", report.summary.line());
    if json {
        println!("{}", serde_json::to_string(&report.summary)?);
    }
    if let Some(f) = &report.fatal {
        bail!("backfill stopped: {f}; run it again to resume");
    }
    if report.interrupted {
        bail!("backfill interrupted; progress saved: run the same command again to resume");
    }
    if report.summary.failed > 0 {
        cli_common::eprintln!(
            "jfs: {} blocks failed to copy; run backfill again (it resumes), or let verify copy them",
            report.summary.failed
        );
        return Ok(Outcome::Partial);
    }
    step(g, meta_url, &Event::Backfilled).await?;
    drop(index);
    let _ = std::fs::remove_dir_all(&dir);
    cli_common::eprintln!("jfs: backfill done. Next: jfs cutover verify {meta_url}");
    Ok(Outcome::Done)
}

async fn finish(g: &Global, meta_url: &str, barrier: &BarrierArgs) -> Result<Outcome> {
    let e = open_engine(g, meta_url, true).await?;
    let settings = settings_of(&*e).await?;
    let st = state_of(&*e).await?;
    if let Phase::Switched { from, to } = &st.phase {
        // Every writer must write B first before A is dropped; and whatever a writer of the
        // generation before could not put in B is copied there now.
        wait_barrier(&*e, st.gen, barrier).await?;
        let n = drain(&*e, &settings, Role::B, &*store(g, from)?, &*store(g, to)?).await?;
        if n > 0 {
            cli_common::eprintln!("jfs: copied {n} blocks recorded as missing in the new store");
        }
    }
    let (before, after) = step(g, meta_url, &Event::Finish).await?;
    wait_barrier(&*e, after.gen, barrier).await?;
    // What only the old store lacked no longer matters.
    for r in storage::repairs(&*e, Some(Role::A)).await? {
        storage::repair_done(&*e, Role::A, &r.key).await?;
    }
    let old = before.phase.stores().map(|(a, _)| a.to_string());
    println!(
        "cutover finished: {} (generation {}).{}",
        after.phase.describe(),
        after.gen,
        old.map(|a| format!(" Nothing reads or writes {a} any more: check `jfs fsck --deep {meta_url}`, then retire it"))
            .unwrap_or_default()
    );
    Ok(Outcome::Done)
}

/// Show that `store` takes writes now: put a small object under the volume's prefix, read it
/// back, delete it.
async fn prove_writable(store: &dyn BlockStore, settings: &Settings) -> fs_core::Result<()> {
    let key = format!("{}/jfs_probe_{:016x}", settings.name, rand::random::<u64>());
    let body = bytes::Bytes::from(format!("jfs cutover probe {}", fs_core::now_ns()));
    store.put(&key, body.clone()).await?;
    let back = store.get(&key).await;
    let _ = store.delete(&key).await;
    if back? != body {
        return Err(fs_core::Error::new(
            ErrorKind::Corrupt,
            format!("{key} read back different bytes"),
        ));
    }
    Ok(())
}

async fn abort(g: &Global, meta_url: &str, barrier: &BarrierArgs) -> Result<Outcome> {
    let e = open_engine(g, meta_url, true).await?;
    let settings = settings_of(&*e).await?;
    let mut st = state_of(&*e).await?;
    if let Phase::Switched { from, to } = &st.phase {
        // Back to dual first, where A is the store written first again. That is committed
        // only once A has shown it takes writes and holds what it lacked: otherwise every
        // write would fail there. Until then the volume stays switched.
        let stay = || {
            format!(
                "abort: nothing was changed: the volume stays {} (reads and writes go to {to} first). Once {from} takes writes, run `jfs cutover abort {meta_url}` again",
                st.phase.describe()
            )
        };
        let (a, b) = (store(g, from)?, store(g, to)?);
        prove_writable(&*a, &settings)
            .await
            .with_context(|| format!("the old store {from} does not take writes"))
            .with_context(stay)?;
        let n = drain(&*e, &settings, Role::A, &*b, &*a)
            .await
            .with_context(stay)?;
        if n > 0 {
            cli_common::eprintln!("jfs: copied back {n} blocks that were missing in {from}");
        }
        let (_, after) = step(g, meta_url, &Event::Abort).await?;
        wait_barrier(&*e, after.gen, barrier).await?;
        st = after;
    }
    if let Phase::Dual { from, to, .. } = &st.phase {
        // Blocks written while B was the primary may be missing in A: copy them back (those
        // a writer could not put in A between the check above and the switch back too).
        wait_barrier(&*e, st.gen, barrier).await?;
        let n = drain(&*e, &settings, Role::A, &*store(g, to)?, &*store(g, from)?)
            .await
            .with_context(|| {
                format!(
                    "the abort is not finished: the volume is {} ({from} is written first). Once {from} takes the blocks it lacks, run `jfs cutover abort {meta_url}` again (or `jfs cutover switch {meta_url}` to make {to} the primary again)",
                    st.phase.describe()
                )
            })?;
        if n > 0 {
            cli_common::eprintln!("jfs: copied back {n} blocks that were missing in {from}");
        }
    }
    let (before, after) = step(g, meta_url, &Event::Abort).await?;
    wait_barrier(&*e, after.gen, barrier).await?;
    for r in storage::repairs(&*e, Some(Role::B)).await? {
        storage::repair_done(&*e, Role::B, &r.key).await?;
    }
    let new = before.phase.stores().map(|(_, b)| b.to_string());
    println!(
        "cutover aborted: {} (generation {}).{}",
        after.phase.describe(),
        after.gen,
        new.map(|b| format!(" {b} is no longer written; its copies can be removed"))
            .unwrap_or_default()
    );
    Ok(Outcome::Done)
}
