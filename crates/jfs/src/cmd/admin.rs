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
    (trash, trash_max_bytes): (Duration, Option<u64>),
    grace: Duration,
) -> Result<Outcome> {
    // Validate everything before touching metadata: nothing is written on bad input.
    let mut s = Settings::new(name, storage, u32::try_from(block_size).unwrap_or(u32::MAX));
    s.capacity = capacity;
    s.journal_retention_secs = retention.as_secs();
    s.trash_secs = trash.as_secs();
    s.trash_max_bytes = trash_max_bytes;
    s.gc_grace_secs = grace.as_secs();
    s.validate()?;
    objstore::check_url(storage)?;
    // The metadata first, read-only: a volume formatted there already is named, and nothing
    // is created (neither the store's directory nor the engine's).
    already_formatted(g, meta_url).await?;
    // Local places another user could swap for their own are refused before anything is
    // made (as every writer refuses them at open).
    if let Some(why) = volume::local_places_problem(meta_url, storage) {
        bail!("{why}");
    }
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
    // Likewise the metadata's local directory (RocksDB): what this attempt would make.
    let meta_made = MadeDir::before(meta::local_dir(meta_url));
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
            meta_made.undo();
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

/// A local directory a command may create (a RocksDB volume's), as it was before: a failed
/// `format` or `load` removes what it made there and nothing else (the directories it
/// created, or the contents of one that was there empty).
struct MadeDir {
    dir: Option<std::path::PathBuf>,
    /// The highest missing ancestor of `dir` (or `dir` itself): all of it is the attempt's.
    top: Option<std::path::PathBuf>,
    /// `dir` was there, empty: what a failed attempt leaves in it is its own. (One that held
    /// anything is left as it is: a RocksDB opened there rewrites its own files, so no
    /// newcomer among them can be told from a file it replaced.)
    was_empty: bool,
}

impl MadeDir {
    fn before(dir: Option<std::path::PathBuf>) -> MadeDir {
        let Some(d) = dir else {
            return MadeDir {
                dir: None,
                top: None,
                was_empty: false,
            };
        };
        let top = d
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err())
            .last()
            .map(Path::to_path_buf);
        let was_empty =
            top.is_none() && std::fs::read_dir(&d).is_ok_and(|mut rd| rd.next().is_none());
        MadeDir {
            dir: Some(d),
            top,
            was_empty,
        }
    }

    /// Remove what was made since `before` (the engine is closed by then).
    fn undo(&self) {
        if let Some(t) = &self.top {
            let _ = std::fs::remove_dir_all(t);
            return;
        }
        let Some(d) = self.dir.as_ref().filter(|_| self.was_empty) else {
            return;
        };
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            let _ = match e.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
                _ => std::fs::remove_file(&p),
            };
        }
    }
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
    let mut d = maint::dump(engine).await.context("dumping metadata")?;
    // Where it came from: `jfs load` looks there for live mounts before a take-over.
    d.source = Some(engine.display_url());
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
            cli_common::eprintln!(
                "dumped {} inodes to {}",
                d.inodes.len(),
                cli_common::names::quote(std::os::unix::ffi::OsStrExt::as_bytes(f.as_os_str()))
            );
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
/// its gc at once), so that the two never write or delete each other's blocks. So the load is
/// refused while that metadata has live mounts (they would lose their writes), unless
/// `take_over`; with `--block-store URL` the loaded volume uses that store (a copy of the
/// blocks) and the source's is left alone.
pub async fn load(g: &Global, meta_url: &str, file: &Path, take_over: bool) -> Result<Outcome> {
    // A refused or failed load leaves no metadata directory it made (as `format`).
    let made = MadeDir::before(meta::local_dir(meta_url));
    let r = async {
        let engine = super::open_engine_with(g, meta_url, false, true).await?;
        load_into(g, &*engine, file, take_over).await
    }
    .await;
    if r.is_err() {
        made.undo();
    }
    r
}

async fn load_into(
    g: &Global,
    engine: &dyn Engine,
    file: &Path,
    take_over: bool,
) -> Result<Outcome> {
    volume::check_site(engine, volume::Access::Write, true).await?;
    let raw = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let mut d: maint::Dump = serde_json::from_slice(&raw)
        .with_context(|| format!("{} is not a jfs dump", file.display()))?;
    // A damaged or edited dump is named before any store or metadata is touched.
    maint::check_dump(&d).with_context(|| format!("{} cannot be loaded", file.display()))?;
    let other_store = g.storage.clone().filter(|u| *u != d.setting.storage);
    if let Some(url) = &other_store {
        // The loaded volume's blocks are in `url`: its settings and storage record say so.
        if let Some(st) = &mut d.storage {
            match &st.phase {
                fs_core::storage::Phase::Single { .. } => {
                    st.phase = fs_core::storage::Phase::Single { store: url.clone() }
                }
                _ => bail!(
                    "{} was dumped during a storage cutover ({}): it can only be loaded onto its own stores, not --block-store {}",
                    file.display(),
                    st.phase.describe(),
                    objstore::secrets::redact(url)
                ),
            }
        }
        d.setting.storage = url.clone();
    }
    // The store must answer before anything is loaded: the load ends by taking it over.
    let store = volume::open_store(&d.setting.storage, g.endpoint.as_deref())
        .with_context(|| format!("opening the volume's store {}", d.setting.storage))?;
    store
        .check()
        .await
        .with_context(|| format!("checking the volume's store {}", d.setting.storage))?;
    if other_store.is_none() {
        refuse_mirror_source(g, &d, file).await?;
        if !take_over {
            refuse_live_source(g, &d, file).await?;
        }
    }
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
        "loaded {} keys ({} inodes) into {}; it now holds the blocks in {}: {}",
        n,
        d.inodes.len(),
        engine.display_url(),
        d.setting.storage,
        if other_store.is_some() {
            "the store the dump names was left alone".to_string()
        } else {
            "the metadata the dump came from can no longer write there (stop its mounts)"
                .to_string()
        }
    );
    Ok(Outcome::Done)
}

/// Refuse a load of a mirror site's dump onto the store it names: a mirror's settings name
/// its primary's store, live at the primary whatever the mirror's own sessions say, and
/// taking it over would refuse every write there (and let this metadata's gc delete them).
async fn refuse_mirror_source(g: &Global, d: &maint::Dump, file: &Path) -> Result<()> {
    let Some(src) = &d.source else {
        return Ok(());
    };
    // Unreadable now: `refuse_live_source` says so, or `--take-over` asserts the source gone.
    let Ok(engine) = super::open_engine(g, src, true).await else {
        return Ok(());
    };
    match Fs::load_settings(&*engine).await {
        Ok(s) if s.uuid == d.setting.uuid => {}
        _ => return Ok(()),
    }
    let Ok(Some(m)) = fs_core::site::marker(&*engine).await else {
        return Ok(());
    };
    bail!(
        "refusing to load {}: it was dumped from {src}, the metadata of mirror site {:?}, whose settings name its primary's store {}; that store is the primary's, live at the primary, and this load (even with --take-over) would take it over. Load it with --block-store URL: the mirror's own store {} once its copier has caught up, or a copy of the blocks. To make the mirror the primary, use `mirror-agent promote` instead",
        file.display(),
        m.name,
        objstore::secrets::redact(&d.setting.storage),
        objstore::secrets::redact(&m.store),
    )
}

/// Refuse a load that would take the store over from a volume still mounted: the dump names
/// the metadata it came from, where its mounts' sessions are (as `jfs status` shows them).
async fn refuse_live_source(g: &Global, d: &maint::Dump, file: &Path) -> Result<()> {
    let what_to_do = format!(
        "to look at the dump without touching that volume, load it with --block-store URL (a store holding a copy of its blocks, e.g. made with `jfs-sync {store} URL`); to move the volume to this metadata, stop its mounts (`jfs umount`), then run this again with --take-over",
        store = objstore::secrets::redact(&d.setting.storage)
    );
    let Some(src) = &d.source else {
        bail!(
            "refusing to load {}: loading it takes the store {} of volume {:?} over, and the dump does not name the metadata it came from (made by an older jfs or a program), so whether that volume is still mounted cannot be checked; {what_to_do}",
            file.display(),
            objstore::secrets::redact(&d.setting.storage),
            d.setting.name
        );
    };
    let live = async {
        let engine = super::open_engine(g, src, true).await?;
        match Fs::load_settings(&*engine).await {
            // Another volume there now, or none: nothing of this one is mounted from it.
            Ok(s) if s.uuid == d.setting.uuid => {}
            _ => return anyhow::Ok(Vec::new()),
        }
        let now = fs_core::now_ns();
        Ok(fs_core::session::list(&*engine)
            .await?
            .into_iter()
            .filter(|s| s.is_live(now, fs_core::session::DEFAULT_TIMEOUT))
            .collect::<Vec<_>>())
    }
    .await
    .with_context(|| {
        format!(
            "refusing to load {}: it takes the store {} of volume {:?} over, and the metadata the dump came from, {src}, could not be read to check that none of its mounts is live; {what_to_do}",
            file.display(),
            objstore::secrets::redact(&d.setting.storage),
            d.setting.name
        )
    })?;
    if live.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = live
        .iter()
        .take(3)
        .map(|s| {
            format!(
                "{}:{} pid {} {}",
                s.host,
                s.mountpoint,
                s.pid,
                if s.read_only { "ro" } else { "rw" }
            )
        })
        .collect();
    bail!(
        "refusing to load {}: volume {:?} in {src} has {} live mount session(s) ({}{}), and loading the dump takes its store {} over, after which their writes are refused; {what_to_do}",
        file.display(),
        d.setting.name,
        live.len(),
        shown.join(", "),
        if live.len() > 3 { ", ..." } else { "" },
        objstore::secrets::redact(&d.setting.storage),
    )
}

pub async fn fsck(
    g: &Global,
    fs: &Fs,
    deep: bool,
    repair_from: Option<&str>,
    json: bool,
) -> Result<Outcome> {
    let r = fs.fsck(deep).await.context("fsck")?;
    let repairs = match repair_from {
        Some(url) if !r.broken.is_empty() => Some(repair(g, fs, &r.broken, url).await?),
        Some(_) => Some(Vec::new()),
        None => None,
    };
    let mended = repairs
        .as_ref()
        .map_or(0, |v| v.iter().filter(|x| x.is_ok()).count());
    if json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(rs) = &repairs {
            v["repaired"] = rs
                .iter()
                .filter_map(|x| x.as_ref().ok())
                .map(|k| serde_json::json!(k))
                .collect();
            v["not_repaired"] = rs
                .iter()
                .filter_map(|x| x.as_ref().err())
                .map(|(k, why)| serde_json::json!({"key": k, "why": why}))
                .collect();
        }
        println!("{}", serde_json::to_string(&v)?);
    } else {
        for (i, b) in r.broken.iter().enumerate() {
            // Quoted as `jfs ls` quotes names: a path may hold control bytes.
            let path = cli_common::names::quote(b.path.as_bytes());
            match repairs.as_ref().and_then(|rs| rs.get(i)) {
                Some(Ok(_)) => println!(
                    "REPAIRED {}: block {} (was {}) from {}",
                    path,
                    b.key,
                    b.problem,
                    objstore::secrets::redact(repair_from.unwrap_or_default())
                ),
                Some(Err((_, why))) => {
                    println!(
                        "BROKEN {}: block {} {}; not repaired: {why}",
                        path, b.key, b.problem
                    )
                }
                None => println!("BROKEN {}: block {} {}", path, b.key, b.problem),
            }
        }
        for p in &r.references {
            println!("REFERENCES {p}");
        }
        println!(
            "checked {} files, {} blocks{}: {} broken{}",
            r.files,
            r.blocks,
            if !deep {
                ""
            } else if fs.settings().checksums() {
                " (read and checked against their CRC32C)"
            } else {
                " (read; format-1 volume: lengths only, no checksums recorded)"
            },
            r.broken.len(),
            match &repairs {
                Some(_) => format!(
                    ", {mended} repaired from {}",
                    objstore::secrets::redact(repair_from.unwrap_or_default())
                ),
                None => String::new(),
            }
        );
    }
    Ok(if r.broken.len() == mended && r.references.is_empty() {
        Outcome::Done
    } else {
        Outcome::Partial
    })
}

/// Mend each broken block from the store at `url`: its copy there is read and checked against
/// the block's length and recorded CRC32C (format 1: length only), and only a copy that
/// checks is written to the volume's store, then read back checked. In `broken`'s order: the
/// key mended, or the key and why not.
async fn repair(
    g: &Global,
    fs: &Fs,
    broken: &[maint::BrokenBlock],
    url: &str,
) -> Result<Vec<std::result::Result<String, (String, String)>>> {
    let shown = objstore::secrets::redact(url);
    let from = volume::open_store(url, g.endpoint.as_deref())
        .with_context(|| format!("opening the store to repair from, {shown}"))?;
    from.check()
        .await
        .with_context(|| format!("reaching the store to repair from, {shown}"))?;
    let mut out = Vec::with_capacity(broken.len());
    for b in broken {
        let key = b.key.clone();
        if !b.repairable {
            out.push(Err((
                key,
                "no copy can be checked without the slice's checksum record".into(),
            )));
            continue;
        }
        let want = fs_core::BlockCheck {
            len: b.len,
            crc: b.crc,
        };
        let copy = match from.get_block(&b.key, want).await {
            Ok(c) => c,
            Err(e) => {
                let why = match maint::describe(&*from, &b.key, b.len, b.crc).await {
                    Ok(Some(p)) if p == "missing" => format!("{shown} has no copy of it"),
                    Ok(Some(p)) => format!("the copy in {shown} is refused, {p}"),
                    _ => format!("reading it from {shown}: {e}"),
                };
                out.push(Err((key, why)));
                continue;
            }
        };
        let written = async {
            fs.store().put(&b.key, copy).await?;
            fs.store().get_block(&b.key, want).await.map(|_| ())
        }
        .await;
        match written {
            Ok(()) => {
                tracing::info!(block = %b.key, from = %shown, "repaired a {} block", b.problem);
                out.push(Ok(key));
            }
            Err(e) => out.push(Err((
                key,
                format!("writing the good copy to the volume's store: {e}"),
            ))),
        }
    }
    Ok(out)
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
        println!(
            "clones whose writer died before linking them: {} ({} dropped)",
            r.clones_dead, r.clones_dropped
        );
        if delete {
            println!(
                "trash entries purged: {} past the trash time, {} evicted by its size cap",
                r.trash_expired, r.trash_evicted
            );
        }
        if let Some(c) = &r.cutover {
            println!("a storage cutover is in progress ({c}): no block is deleted from either store until `jfs cutover finish` or `abort`");
        } else if !delete
            && (r.pending_due > 0 || r.leaked > 0 || r.temps_dead > 0 || r.clones_dead > 0)
        {
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
            // Checked: the frame's length and CRC32C, and that it is the entry of its seq.
            let e = Entry::decode_at(*seq, f).with_context(|| {
                format!(
                    "journal entry {seq} in {} is unreadable: the journal is corrupt",
                    engine.display_url()
                )
            })?;
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
    println!(
        "trash       {} entries, {} bytes (trash time {}s, cap {}); {} evicted by the cap",
        s.trash.entries,
        s.trash.bytes,
        s.settings.trash_secs,
        s.settings
            .trash_max_bytes
            .map_or("none".to_string(), |c| format!("{c} bytes")),
        s.trash.evicted
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
            // Quoted as `jfs ls` quotes names: a mount point may hold any byte.
            cli_common::names::quote(m.host.as_bytes()),
            cli_common::names::quote(m.mountpoint.as_bytes()),
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
