//! Volume administration: format, dump/load, fsck, gc, journal, status.

use super::Outcome;
use crate::cli::Global;
use anyhow::{bail, Context, Result};
use fs_core::maint::{self, GcOptions};
use fs_core::{Engine, Entry, Fs, Mutation, Settings};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

#[allow(clippy::too_many_arguments)]
pub async fn format(
    g: &Global,
    meta_url: &str,
    name: &str,
    storage: &str,
    block_size: u64,
    capacity: u64,
    retention: Duration,
    trash: Duration,
    grace: Duration,
) -> Result<Outcome> {
    // Validate everything before touching metadata: nothing is written on bad input.
    let mut s = Settings::new(name, storage, u32::try_from(block_size).unwrap_or(u32::MAX));
    s.capacity = capacity;
    s.journal_retention_secs = retention.as_secs();
    s.trash_secs = trash.as_secs();
    s.gc_grace_secs = grace.as_secs();
    s.validate()?;
    objstore::check_url(storage)?;
    // The metadata first, read-only: a volume formatted there already is named, and nothing
    // is created (neither the store's directory nor the engine's).
    already_formatted(g, meta_url).await?;
    // A local store's directory (and any missing parent) is created only by a format that
    // then succeeds: these are the directories this attempt would make, deepest first.
    let made_dirs: Vec<std::path::PathBuf> = storage
        .strip_prefix("file://")
        .map(|d| {
            std::path::Path::new(d)
                .ancestors()
                .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
                .map(std::path::Path::to_path_buf)
                .collect()
        })
        .unwrap_or_default();
    let made = async {
        let store = volume::create_store(storage, g.endpoint.as_deref())
            .with_context(|| format!("opening the storage {storage}"))?;
        store
            .check()
            .await
            .with_context(|| format!("checking the storage {storage}"))?;
        // A store prefix that cannot be this volume's is refused before the metadata is
        // created (format claims it, writing its owner record, once the metadata checks pass).
        fs_core::owner::claimable(&*store, &s)
            .await
            .with_context(|| format!("formatting {}", meta::redact(meta_url)))?;
        let engine = super::open_engine_with(g, meta_url, false, true).await?;
        volume::check_site(&*engine, volume::Access::Write, true).await?;
        Fs::format(engine, store, s)
            .await
            .with_context(|| format!("formatting {}", meta::redact(meta_url)))
    }
    .await;
    let fs = match made {
        Ok(fs) => fs,
        Err(e) => {
            // Only what this attempt made: its temp dir and the (then empty) directories.
            if let Some(d) = made_dirs.first() {
                let _ = std::fs::remove_dir(d.join(".jfs-tmp"));
            }
            for d in &made_dirs {
                let _ = std::fs::remove_dir(d);
            }
            return Err(e);
        }
    };
    super::mount::warn_if_shared_volume(meta_url, storage);
    println!(
        "formatted volume {:?} (uuid {}) in {} with blocks in {}",
        fs.settings().name,
        fs.settings().uuid,
        fs.engine().display_url(),
        storage
    );
    Ok(Outcome::Done)
}

/// Refuse to format metadata that already holds a volume, naming it (read-only: creates
/// nothing).
async fn already_formatted(g: &Global, meta_url: &str) -> Result<()> {
    let engine = match super::open_engine(g, meta_url, true).await {
        Ok(e) => e,
        // Nothing to read there (a RocksDB directory that does not exist yet), or nothing
        // readable: the format's own open creates it, or reports why it cannot.
        Err(_) => return Ok(()),
    };
    // A mirror's metadata: the refusal every writer gets there.
    volume::check_site(&*engine, volume::Access::Write, true).await?;
    match Fs::load_settings(&*engine).await {
        Ok(have) => bail!(
            "{} already holds volume {:?} (uuid {}, blocks in {}): nothing was changed. To start afresh, give other metadata (a new RocksDB path, Redis database or PostgreSQL schema)",
            meta::redact(meta_url),
            have.name,
            have.uuid,
            have.storage
        ),
        Err(e) if e.kind() == fs_core::ErrorKind::NotFormatted => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub async fn dump(engine: &dyn Engine, file: Option<&Path>) -> Result<Outcome> {
    let d = maint::dump(engine).await.context("dumping metadata")?;
    match file {
        Some(f) => {
            if f.is_dir() {
                bail!(
                    "dump: {} is a directory: give the name of the file to write",
                    f.display()
                );
            }
            let tmp = f.with_extension("jfs-tmp");
            let written = (|| -> Result<()> {
                // The dump holds every name of the volume: owner-only from the first byte, and
                // a new file (what sits at the temporary name, a leftover or a link someone
                // planted, is removed, never followed nor written through).
                match std::fs::remove_file(&tmp) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| {
                            format!(
                                "removing {} (a leftover of an earlier dump?)",
                                tmp.display()
                            )
                        });
                    }
                    _ => {}
                }
                use std::os::unix::fs::OpenOptionsExt;
                let mut w = std::io::BufWriter::new(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&tmp)
                        .with_context(|| format!("creating {}", tmp.display()))?,
                );
                serde_json::to_writer_pretty(&mut w, &d)?;
                w.write_all(b"\n")?;
                w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
                std::fs::rename(&tmp, f)
                    .with_context(|| format!("renaming into {}", f.display()))?;
                Ok(())
            })();
            if let Err(e) = written {
                // No half-written copy of the metadata is left behind.
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            cli_common::eprintln!("dumped {} inodes to {}", d.inodes.len(), f.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            // As an io::Error, so that a closed pipe is recognised as one.
            serde_json::to_writer_pretty(&mut out, &d).map_err(std::io::Error::from)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(Outcome::Done)
}

/// Load a dump into empty metadata, which then holds the volume's store: the metadata the
/// dump was taken from is refused as a writer from then on (its mounts at their next start,
/// its gc at once), so that the two never write or delete each other's blocks.
pub async fn load(engine: &dyn Engine, file: &Path, endpoint: Option<&str>) -> Result<Outcome> {
    volume::check_site(engine, volume::Access::Write, true).await?;
    let raw = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let d: maint::Dump = serde_json::from_slice(&raw)
        .with_context(|| format!("{} is not a jfs dump", file.display()))?;
    // The store must answer before anything is loaded: the load ends by taking it over.
    let store = volume::open_store(&d.setting.storage, endpoint)
        .with_context(|| format!("opening the volume's store {}", d.setting.storage))?;
    store
        .check()
        .await
        .with_context(|| format!("checking the volume's store {}", d.setting.storage))?;
    let n = maint::load(engine, &d).await.context("loading")?;
    let settings = Fs::load_settings(engine).await?;
    fs_core::owner::take_over(&*store, &settings).await.with_context(|| {
        format!(
            "loaded {n} keys into {}, but taking over the store {} failed: the loaded volume will not write until it can be taken over; run `jfs load` again into fresh metadata once the store answers",
            engine.display_url(),
            d.setting.storage
        )
    })?;
    cli_common::eprintln!(
        "loaded {} keys ({} inodes) into {}; it now holds the blocks in {}: the metadata the dump came from can no longer write there (stop its mounts)",
        n,
        d.inodes.len(),
        engine.display_url(),
        d.setting.storage
    );
    Ok(Outcome::Done)
}

pub async fn fsck(fs: &Fs, deep: bool, json: bool) -> Result<Outcome> {
    let r = fs.fsck(deep).await.context("fsck")?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        for b in &r.broken {
            println!("BROKEN {}: block {} {}", b.path, b.key, b.problem);
        }
        println!(
            "checked {} files, {} blocks{}: {} broken",
            r.files,
            r.blocks,
            if !deep {
                ""
            } else if fs.settings().checksums() {
                " (read and checked against their CRC32C)"
            } else {
                " (read; format-1 volume: lengths only, no checksums recorded)"
            },
            r.broken.len()
        );
    }
    Ok(if r.broken.is_empty() {
        Outcome::Done
    } else {
        Outcome::Partial
    })
}

pub async fn gc(fs: &Fs, delete: bool, session_timeout: Duration, json: bool) -> Result<Outcome> {
    let opts = GcOptions {
        delete,
        session_timeout,
        ..maint::gc_defaults()
    };
    let r = fs.gc(&opts).await.context("gc")?;
    print_gc(&r, delete, json)
}

pub fn print_gc(r: &maint::GcReport, delete: bool, json: bool) -> Result<Outcome> {
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "pending deletes: {} ({} due, {} held for mirrors, {} purged)\nobjects: {} listed, {} leaked ({} bytes, {} deleted), {} too young, {} not block keys\njournal entries trimmed: {}",
            r.pending, r.pending_due, r.pending_held_for_mirrors, r.pending_purged, r.objects, r.leaked, r.leaked_bytes,
            r.leaked_deleted, r.leaked_young, r.foreign, r.journal_trimmed
        );
        println!(
            "sessions: {} live, {} dead ({} removed); kept open after unlink: {} ({} of dead sessions, {} freed)",
            r.sessions_live, r.sessions_dead, r.sessions_removed, r.kept, r.kept_dead, r.kept_released
        );
        println!(
            "temporary files of killed copies: {} ({} removed)",
            r.temps_dead, r.temps_removed
        );
        if let Some(c) = &r.cutover {
            println!("a storage cutover is in progress ({c}): no block is deleted from either store until `jfs cutover finish` or `abort`");
        } else if !delete && (r.pending_due > 0 || r.leaked > 0 || r.temps_dead > 0) {
            println!("(dry run: run with --delete to remove them)");
        }
    }
    Ok(Outcome::Done)
}

fn time_str(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_nanos(t).to_string()
}

fn print_entry(e: &Entry, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let (puts, dels) = e.writes.iter().fold((0, 0), |(p, d), m| match m {
        Mutation::Delete { .. } => (p, d + 1),
        _ => (p + 1, d),
    });
    let r = if json {
        let v = serde_json::json!({
            "seq": e.seq, "time": time_str(e.time_ns), "time_ns": e.time_ns,
            "op": e.op.name(), "args": e.op.args_json(), "puts": puts, "deletes": dels,
        });
        writeln!(out, "{v}")
    } else {
        writeln!(
            out,
            "{:>8} {} {:<12} {} (+{puts} -{dels})",
            e.seq,
            time_str(e.time_ns),
            e.op.name(),
            e.op.args_json()
        )
    };
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}

pub async fn journal(
    engine: &dyn Engine,
    from: Option<u64>,
    follow: bool,
    json: bool,
) -> Result<Outcome> {
    let b = engine.journal_bounds().await?;
    let mut next = from.unwrap_or(b.first).max(1);
    if next < b.first {
        bail!(
            "journal entry {next} is no longer retained: the first retained entry is {}",
            b.first
        );
    }
    loop {
        let frames = engine.journal_read(next, 1000).await?;
        for (seq, f) in &frames {
            let e = Entry::decode(f).with_context(|| {
                format!(
                    "journal entry {seq} in {} is unreadable",
                    engine.display_url()
                )
            })?;
            if e.seq != *seq {
                bail!(
                    "journal entry stored under {seq} says it is {}: the journal is corrupt",
                    e.seq
                );
            }
            print_entry(&e, json)?;
            next = seq + 1;
        }
        if frames.is_empty() {
            if !follow {
                return Ok(Outcome::Done);
            }
            engine
                .journal_wait(next - 1, Duration::from_secs(5))
                .await?;
        }
    }
}

pub async fn status(fs: &Fs, json: bool) -> Result<Outcome> {
    let s = fs.status().await?;
    // Diverged tails this site saved when it rejoined a newer primary (`mirror-agent`).
    let rollbacks = fs_core::site::rollbacks(&**fs.engine()).await?;
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["rollbacks"] = serde_json::to_value(&rollbacks)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(Outcome::Done);
    }
    println!("volume      {} (uuid {})", s.name, s.uuid);
    // A promoted mirror keeps the record of its detach: it is the primary, from that epoch.
    let promoted = fs_core::site::epoch_record(&**fs.engine())
        .await?
        .filter(|e| s.detached.as_ref().is_some_and(|d| d.name == e.site));
    match (&s.mirror, &s.detached, &promoted) {
        (Some(m), _, _) => println!(
            "site        mirror {:?} of the primary at {} (read-only; blocks in {})",
            m.name, m.primary, m.store
        ),
        (None, Some(_), Some(e)) => println!(
            "site        primary (promoted from mirror {:?} at epoch {}, after seq {}; it followed {})",
            e.site, e.epoch, e.at_seq, e.from
        ),
        (None, Some(d), None) => println!(
            "site        volume of its own (detached from mirror {:?} of {} at seq {})",
            d.name, d.primary, d.at_seq
        ),
        (None, None, _) => println!("site        primary"),
    }
    for r in &rollbacks {
        let here = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim() == r.host)
            .unwrap_or(false);
        if here && !std::path::Path::new(&r.dir).exists() {
            continue; // the operator deleted the saved copy: done with
        }
        println!(
            "rollback    SAVED {} entries (seq {}..={}) and {} files ({} bytes{}) this site committed at epoch {} that the primary at epoch {} never received: {}:{} (review and re-apply them: runbooks/failover.md; delete it when done)",
            r.entries,
            r.first_seq,
            r.last_seq,
            r.files,
            r.bytes,
            if r.failed > 0 {
                format!(", {} files UNREADABLE, named in its manifest", r.failed)
            } else {
                String::new()
            },
            r.from_epoch,
            r.to_epoch,
            r.host,
            r.dir
        );
    }
    println!("epoch       {}", s.epoch);
    if let Some(m) = &s.moved {
        println!(
            "moved       to {} (epoch {}) after seq {}: this metadata is fenced",
            m.meta_url, m.epoch, m.at_seq
        );
    }
    println!("placement   {}", s.placement);
    println!("metadata    {} ({})", s.meta_url, s.engine);
    println!("storage     {}  block size {}", s.storage, s.block_size);
    println!(
        "format      version {}{}",
        s.settings.format_version,
        if s.settings.checksums() {
            " (block checksums recorded)"
        } else {
            " (no block checksums: blocks checked by length)"
        }
    );
    println!(
        "usage       {} bytes in {} inodes",
        s.used_space, s.used_inodes
    );
    println!(
        "journal     head {}, retained {}..={} (retention {}s)",
        s.journal.last, s.journal.first, s.journal.last, s.settings.journal_retention_secs
    );
    println!(
        "pending     {} freed slices awaiting gc (trash {}s)",
        s.pending_deletes, s.settings.trash_secs
    );
    let live = s.sessions.iter().filter(|x| x.live).count();
    println!(
        "sessions    {live} live, {} dead; {} inodes kept open after unlink",
        s.sessions.len() - live,
        s.kept_inodes
    );
    for x in &s.sessions {
        let m = &x.session;
        println!(
            "  {} {} {}:{} pid {} {}{} since {} last beat {}{}",
            m.id,
            if x.live { "live" } else { "DEAD" },
            m.host,
            m.mountpoint,
            m.pid,
            if m.read_only { "ro" } else { "rw" },
            m.relayed_by.as_ref().map_or(String::new(), |r| format!(
                " (at mirror {r:?}, relayed by its agent)"
            )),
            time_str(m.start_ns),
            time_str(m.beat_ns),
            if m.version.is_empty() {
                String::new()
            } else {
                format!(" (jfs {})", m.version)
            }
        );
    }
    Ok(Outcome::Done)
}
