//! `jfs recover` (the metadata of any instant the backups cover, rebuilt into empty metadata
//! from the volume's store alone) and `jfs backup` (the backups' settings, one taken now,
//! all deleted). The backups themselves: `fs_core::maint::backup`.

use super::Outcome;
use crate::cli::Global;
use anyhow::{bail, Context, Result};
use fs_core::maint::backup::{self, BackupSettings, Catalog, Target};
use fs_core::txn::Txn;
use fs_core::{keys, BlockStore, Engine, Op};

fn rfc3339(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `--at`: an RFC 3339 time (`2026-11-28T18:00:00Z`), in ns since the epoch.
fn parse_time(s: &str) -> Result<i64> {
    let t = humantime::parse_rfc3339_weak(s).with_context(|| {
        format!("--at {s:?} is not a time: write it as RFC 3339 UTC, e.g. 2026-11-28T18:00:00Z")
    })?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .context("--at is before 1970")?
        .as_nanos() as i64)
}

#[derive(serde::Serialize)]
struct Listing {
    volume: String,
    store: String,
    first_seq: u64,
    first_time: String,
    last_seq: u64,
    last_time: String,
    snapshots: Vec<SnapLine>,
    segments: usize,
}

#[derive(serde::Serialize)]
struct SnapLine {
    seq: u64,
    time: String,
    keys: u64,
    bytes: u64,
}

async fn listing(store: &dyn BlockStore, name: &str, cat: &Catalog) -> Result<Listing> {
    let Some(last) = cat.last_recoverable() else {
        bail!(
            "no metadata snapshot of volume {name:?} in {} (looked under {}): check the store URL and --name",
            store.display_url(),
            backup::prefix(name)
        );
    };
    let first = cat.snapshots.iter().min_by_key(|m| m.seq).expect("one");
    // The time of the last shipped entry: from the segment that holds it.
    let mut last_time = cat
        .snapshots
        .iter()
        .filter(|m| m.seq == last)
        .map(|m| m.time_ns)
        .next();
    if last_time.is_none() {
        if let Some(seg) = cat
            .segments
            .iter()
            .find(|s| s.first <= last && last <= s.last)
        {
            let es = backup::read_segment(store, seg).await?;
            last_time = es.iter().find(|e| e.seq == last).map(|e| e.time_ns);
        }
    }
    Ok(Listing {
        volume: name.to_string(),
        store: store.display_url(),
        first_seq: first.seq,
        first_time: rfc3339(first.time_ns),
        last_seq: last,
        last_time: last_time.map(rfc3339).unwrap_or_default(),
        snapshots: cat
            .snapshots
            .iter()
            .map(|m| SnapLine {
                seq: m.seq,
                time: rfc3339(m.time_ns),
                keys: m.pairs,
                bytes: m.bytes,
            })
            .collect(),
        segments: cat.segments.len(),
    })
}

#[allow(clippy::too_many_arguments)]
pub async fn recover(
    g: &Global,
    store_url: &str,
    new_meta: Option<&str>,
    name: &str,
    (seq, at): (Option<u64>, Option<&str>),
    list: bool,
    take: bool,
    json: bool,
) -> Result<Outcome> {
    let store = volume::open_store(store_url, g.endpoint.as_deref())
        .with_context(|| format!("opening the store {store_url}"))?;
    if list {
        let cat = backup::catalog(&*store, name).await?;
        let l = listing(&*store, name, &cat).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&l)?);
        } else {
            println!(
                "volume {:?}: recoverable from seq {} ({}) to seq {} ({})",
                l.volume, l.first_seq, l.first_time, l.last_seq, l.last_time
            );
            for s in &l.snapshots {
                println!(
                    "snapshot seq {} at {}: {} keys, {} bytes",
                    s.seq, s.time, s.keys, s.bytes
                );
            }
            println!("journal segments: {}", l.segments);
            for (key, why) in &cat.damaged {
                println!("damaged, never used: {key}: {why}");
            }
        }
        return Ok(Outcome::Done);
    }
    let Some(new_meta) = new_meta else {
        bail!("jfs recover needs NEW_META_URL (empty metadata to rebuild into), or --list");
    };
    let target = match (seq, at) {
        (Some(n), _) => Target::Seq(n),
        (None, Some(t)) => Target::Time(parse_time(t)?),
        (None, None) => Target::Latest,
    };
    let engine = super::open_engine_with(g, new_meta, false, true).await?;
    let r = backup::recover(&*engine, &*store, name, target)
        .await
        .with_context(|| format!("recovering volume {name:?} into {}", engine.display_url()))?;
    for (key, why) in &r.damaged {
        cli_common::eprintln!(
            "warning: snapshot manifest {key} is damaged, that snapshot was not used: {why}"
        );
    }
    let settings = take_over(&*engine, &*store, take).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "recovered volume {:?} as of seq {} ({}) into {}: snapshot seq {} ({} keys) and {} journal entries; {} {}",
            settings.name,
            r.seq,
            rfc3339(r.time_ns),
            engine.display_url(),
            r.snapshot_seq,
            r.pairs,
            r.entries,
            if take {
                "it now holds the blocks in"
            } else {
                "for reading only: the blocks stay held by the metadata that holds them now, in"
            },
            store.display_url(),
        );
    }
    Ok(Outcome::Done)
}

/// The recovered metadata holds the store from now on, as `jfs load`'s does: a new
/// incarnation (so the metadata it came from, if it still runs, is refused as a writer), its
/// id counters moved past what that one may still hand out, and the store's owner record.
/// Without `take`, the owner record stays: the new incarnation is then refused as a writer
/// (for reading only).
async fn take_over(
    engine: &dyn Engine,
    store: &dyn BlockStore,
    take: bool,
) -> Result<fs_core::Settings> {
    let mut tx = Txn::new(engine);
    let mut s: fs_core::Settings = serde_json::from_slice(
        &tx.get(keys::SETTING)
            .await?
            .context("the recovered metadata has no settings")?,
    )
    .context("the recovered settings do not decode")?;
    s.incarnation = Some(format!("{:032x}", rand::random::<u128>()));
    for k in [keys::NEXT_INODE, keys::NEXT_SLICE] {
        let cur = fs_core::journal::parse_counter(tx.get(k).await?.as_deref())?;
        tx.put(
            k.to_vec(),
            (cur + fs_core::site::ID_MARGIN).to_string().into_bytes(),
        );
    }
    tx.put(keys::SETTING.to_vec(), serde_json::to_vec(&s)?);
    tx.set_op(Op::Settings {
        what: "recover".into(),
    });
    if let fs_core::CommitOutcome::Conflict = tx.commit().await? {
        bail!("the recovered metadata changed while it was being taken over: nothing else may write it yet; recover again into empty metadata");
    }
    if take {
        fs_core::owner::take_over(store, &s)
            .await
            .context("taking over the store for the recovered metadata")?;
    }
    Ok(s)
}

pub struct BackupArgs {
    pub snapshot_every: Option<std::time::Duration>,
    pub segment_every: Option<std::time::Duration>,
    pub keep_hourly: Option<u32>,
    pub keep_daily: Option<u32>,
    pub on: bool,
    pub off: bool,
    pub now: bool,
    pub purge: bool,
    pub json: bool,
}

pub async fn backup(g: &Global, meta_url: &str, a: BackupArgs) -> Result<Outcome> {
    let change = a.snapshot_every.is_some()
        || a.segment_every.is_some()
        || a.keep_hourly.is_some()
        || a.keep_daily.is_some()
        || a.on
        || a.off;
    let mut settings = if change {
        let mut fs = super::open_fs(g, meta_url, false).await?;
        let mut next = fs.settings().backup();
        if let Some(d) = a.snapshot_every {
            next.snapshot_every_secs = d.as_secs();
        }
        if let Some(d) = a.segment_every {
            next.segment_every_secs = d.as_secs();
        }
        if let Some(n) = a.keep_hourly {
            next.keep_hourly = n;
        }
        if let Some(n) = a.keep_daily {
            next.keep_daily = n;
        }
        if a.on {
            next.enabled = true;
        }
        if a.off {
            next.enabled = false;
        }
        next.validate()?;
        let b = next.clone();
        fs.update_settings("backup", move |s| s.backup = Some(b.clone()))
            .await
            .context("changing the backup settings")?;
        fs.settings().clone()
    } else {
        fs_core::Fs::load_settings(&*super::open_engine(g, meta_url, true).await?).await?
    };
    let store = volume::open_store(&settings.storage, g.endpoint.as_deref())
        .with_context(|| format!("opening the volume's store {}", settings.storage))?;
    if a.purge {
        let n = backup::purge(&*store, &settings.name).await?;
        cli_common::eprintln!(
            "deleted {n} backup objects of volume {:?} from {}{}",
            settings.name,
            store.display_url(),
            if settings.backup().enabled {
                " (backups are on: the next snapshot starts again; turn them off with --off)"
            } else {
                ""
            }
        );
        return Ok(Outcome::Done);
    }
    if a.now {
        let engine = super::open_engine(g, meta_url, true).await?;
        let t = std::time::Instant::now();
        let mut r = backup::Runner::default();
        let step = r.step(&*engine, &*store, true).await?;
        cli_common::eprintln!(
            "snapshot of volume {:?} at seq {} written to {} in {:.1}s",
            settings.name,
            step.snapshot.unwrap_or(0),
            store.display_url(),
            t.elapsed().as_secs_f64()
        );
        settings = fs_core::Fs::load_settings(&*engine).await?;
    }
    let b: BackupSettings = settings.backup();
    let cat = backup::catalog(&*store, &settings.name).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "settings": b,
                "snapshots": cat.snapshots.len(),
                "first_seq": cat.snapshots.iter().map(|m| m.seq).min(),
                "last_seq": cat.last_recoverable(),
            }))?
        );
    } else {
        println!(
            "backups {}: a snapshot every {}s, the journal shipped every {}s, kept hourly for {}h and daily for {}d; {} snapshots, recoverable seq {}",
            if b.enabled { "on" } else { "off" },
            b.snapshot_every_secs,
            b.segment_every_secs,
            b.keep_hourly,
            b.keep_daily,
            cat.snapshots.len(),
            match (cat.snapshots.iter().map(|m| m.seq).min(), cat.last_recoverable()) {
                (Some(a), Some(z)) => format!("{a}..={z}"),
                _ => "none".into(),
            }
        );
    }
    Ok(Outcome::Done)
}
