//! `jfs put` and `jfs get`: trees in and out of a volume, files in parallel, each file's
//! pieces in parallel, mode and mtime kept. A file lands under a temporary name and is renamed
//! into place when complete, in the volume and on local disk alike.
//!
//! Temporary files are owner-only (0600) from their first byte and get their mode (after
//! their owner) only once complete; on local disk they are new files (`O_EXCL`, no link
//! followed). A put's temporary names carry its session (`fs_core::maint::tmp_name`), so a
//! rerun and `gc` can tell a killed put's leftovers from a copy in flight. `get` restores
//! owners only with `--owners` (root); otherwise setuid and setgid are dropped (`GetOpts`).
//! Both place a directory the same way: it becomes the destination, merged into an existing
//! one, and goes into it under its own name only when the destination ends in `/`.
//!
//! Names (and link targets) are bytes, carried as they are; messages print them escaped
//! (`sync::names::quote`). A put rerun skips a file of a tree whose volume copy has its size,
//! mtime and mode; summaries count only bytes of files that completed. A link or file where
//! get needs a directory is a failure of that subtree (exit 1), never written through.
//!
//! `get` opens by path only the directory DEST goes into (LOCAL as given, its ancestors
//! checked first); below it every directory is entered from its parent's descriptor with
//! `O_DIRECTORY | O_NOFOLLOW` and held (`LocalDir`), every file is created (`O_EXCL |
//! O_NOFOLLOW`), renamed and linked relative to one, and modes, times and owners are set
//! through descriptors. So a link planted there, or swapped in while get runs, is never
//! followed: no check-then-open-by-path window.

use super::{parent_of, Outcome};
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use fs_core::{ErrorKind, FileKind, Fs, Ino, Owner, SetAttr, VolPath};
use futures::{StreamExt, TryStreamExt};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use sync::names::{bytes_of, key_of, quote};

/// Bytes per write/read call: two 4 MiB blocks, so pieces of one file move in parallel.
const PIECE: u64 = 8 << 20;
const PIECES_IN_FLIGHT: usize = 4;
/// `jfs get` has the disk write out what it wrote at least this often (see `get_file`).
const FLUSH_EVERY: u64 = 64 << 20;

pub use fs_core::maint::{is_tmp_name, tmp_name, tmp_prefix};

/// Whether the entry named `name` (bytes) is a temporary file of an unfinished put or get
/// (exactly `tmp_name`'s form): never listed or copied out.
pub fn is_tmp_entry(name: &[u8]) -> bool {
    is_tmp_name(&key_of(name))
}

/// The temporary name (bytes) beside the entry named `name`. Names are bytes: the
/// temporary name is made from the name's key (`sync::names`) and holds the same bytes.
fn tmp_name_of(name: &[u8], session: Option<&str>) -> Vec<u8> {
    bytes_of(&tmp_name(&key_of(name), session)).into_owned()
}

/// Remove temporary files a killed `jfs get` left beside `name` in directory `dir` (their
/// process is gone from this host; one from before pids were in the name,
/// `.NAME.jfs-tmp-<8 hex>`, counts as gone). Other names are the user's and stay. `local`
/// names the directory in log lines.
fn remove_stale_temps(dir: &std::fs::File, name: &[u8], local: &Path) {
    let prefix = format!("{}-", tmp_prefix(&key_of(name)));
    let Ok(rd) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    for e in rd.flatten() {
        let f = e.file_name().to_bytes().to_vec();
        let k = key_of(&f);
        if !k.starts_with(&prefix) {
            continue;
        }
        let old_style = |rest: &str| rest.len() == 8 && rest.bytes().all(|b| b.is_ascii_hexdigit());
        let gone = match fs_core::maint::tmp_writer(&k) {
            Some(w) => fs_core::session::process_start(w.pid).is_none(),
            None => old_style(&k[prefix.len()..]),
        };
        if gone {
            let shown_at = local.with_file_name(OsStr::from_bytes(&f));
            tracing::info!(path = %quote(shown_at.as_os_str().as_bytes()), "removing a temporary file a killed jfs get left");
            let _ = rustix::fs::unlinkat(dir, OsStr::from_bytes(&f), rustix::fs::AtFlags::empty());
        }
    }
}

pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

struct PutJob {
    local: PathBuf,
    parent: Ino,
    /// Names are bytes: carried as they are on disk.
    name: Vec<u8>,
    meta: std::fs::Metadata,
    /// Its directory was there before this put (a rerun): temporary files a killed put
    /// left beside it are looked for.
    rerun: bool,
    /// Found inside a directory being put: skipped when the volume's file there has its
    /// size, mtime and mode (a rerun finishes a tree without copying it again). A file named
    /// on its own is always copied.
    in_tree: bool,
}

/// What every file of one `jfs put` shares: its session (in its temporary names) and the
/// judge of other writers' temporary files.
struct PutCtx {
    session: Option<String>,
    judge: fs_core::maint::TmpJudge,
}

/// A local entry found in a directory being put that cannot be read, as that entry's
/// failure: one deleted since its directory was listed is named as vanished (as rsync's "file
/// has vanished"); the put goes on with the rest.
fn unreadable(local: &Path, what: &str, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "{} vanished (it was deleted while the put ran), so it was not copied",
            shown(local)
        )
    } else {
        anyhow::Error::new(e).context(format!("{what} {}", shown(local)))
    }
}

/// Create the directory tree in the volume; collect file jobs; return (dir ino, mtime) pairs to
/// fix up at the end (creating children changes a directory's mtime). `rerun`: `parent` was
/// there before this put; `in_tree`: `local` was found in a directory being put. An entry of
/// the tree that cannot be read or listed (vanished, unreadable) is a failure of that entry,
/// added to `failed`; LOCAL itself failing is an error.
#[allow(clippy::too_many_arguments)]
fn plan_put<'a>(
    fs: &'a Fs,
    local: &'a Path,
    parent: Ino,
    name: &'a [u8],
    rerun: bool,
    in_tree: bool,
    jobs: &'a mut Vec<PutJob>,
    dirs: &'a mut Vec<(Ino, std::fs::Metadata)>,
    failed: &'a mut Vec<anyhow::Error>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let meta = match std::fs::symlink_metadata(local) {
            Ok(m) => m,
            Err(e) if in_tree => {
                failed.push(unreadable(local, "reading", e));
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", shown(local))),
        };
        let ft = meta.file_type();
        let owner = Owner {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        if ft.is_dir() {
            let (ino, existed) = match fs.mkdir(parent, name, meta.mode() & 0o7777, owner).await {
                Ok((ino, _)) => (ino, false),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let (ino, a) = fs.lookup(parent, name).await?;
                    if a.kind != FileKind::Dir {
                        bail!(
                            "{} exists in the volume and is not a directory",
                            quote(name)
                        );
                    }
                    (ino, true)
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("creating directory {}", quote(name)))
                }
            };
            let children = match sorted_children(local) {
                Ok(c) => c,
                Err(e) if in_tree => {
                    failed.push(e.context("nothing under it was copied"));
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            for (path, cname) in children {
                plan_put(fs, &path, ino, &cname, existed, true, jobs, dirs, failed).await?;
            }
            dirs.push((ino, meta));
        } else if ft.is_symlink() {
            // A link's target is bytes too, kept as it is.
            let target = match std::fs::read_link(local) {
                Ok(t) => t,
                Err(e) if in_tree => {
                    failed.push(unreadable(local, "reading the link", e));
                    return Ok(());
                }
                Err(e) => return Err(e).with_context(|| format!("reading {}", shown(local))),
            };
            if let Ok((_, a)) = fs.lookup(parent, name).await {
                if a.kind == FileKind::Dir {
                    bail!("{} exists in the volume as a directory", quote(name));
                }
                fs.unlink(parent, name).await?;
            }
            fs.symlink(parent, name, target.as_os_str().as_bytes(), owner)
                .await
                .with_context(|| format!("symlink {}", quote(name)))?;
        } else if ft.is_file() {
            jobs.push(PutJob {
                local: local.to_path_buf(),
                parent,
                name: name.to_vec(),
                meta,
                rerun,
                in_tree,
            });
        } else {
            tracing::warn!(path = %shown(local), "skipping: not a file, directory or symlink");
        }
        Ok(())
    })
}

fn check_interrupted() -> Result<()> {
    if super::interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

async fn put_file(fs: &Fs, ctx: &PutCtx, job: &PutJob, progress: &Progress) -> Result<()> {
    check_interrupted()?;
    if job.rerun {
        let n = fs
            .remove_dead_temps_by_prefix(
                job.parent,
                &bytes_of(&tmp_prefix(&key_of(&job.name))),
                &ctx.judge,
            )
            .await
            .with_context(|| {
                format!(
                    "removing what a killed put left beside {}",
                    quote(&job.name)
                )
            })?;
        if n > 0 {
            tracing::info!(name = %quote(&job.name), removed = n, "removed temporary files a killed jfs put left");
        }
        // A rerun (after a failure, a full disk, an interrupt) skips what an earlier run
        // finished: a file of the same size, mtime and mode, as rsync's quick check does.
        if let (true, Ok((_, a))) = (job.in_tree, fs.lookup(job.parent, &job.name).await) {
            if a.kind == FileKind::File
                && a.length == job.meta.len()
                && a.mtime == mtime_ns(&job.meta)
                && a.mode & 0o7777 == job.meta.mode() & 0o7777
            {
                tracing::debug!(name = %quote(&job.name), "up to date: skipped");
                return Ok(());
            }
        }
    }
    let tmp = tmp_name_of(&job.name, ctx.session.as_deref());
    let owner = Owner {
        uid: job.meta.uid(),
        gid: job.meta.gid(),
    };
    // Owner-only until complete: the final mode is set with the times, before the rename.
    let (ino, _) = fs.create(job.parent, &tmp, 0o600, owner).await?;
    let file = match std::fs::File::open(&job.local) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            let _ = fs.unlink_temp(job.parent, &tmp).await;
            return Err(unreadable(&job.local, "opening", e));
        }
    };
    // Bytes of this file counted so far: taken back if it fails, so the summary counts only
    // what was written.
    let counted = std::sync::atomic::AtomicU64::new(0);
    let counted = &counted;
    let len = job.meta.len();
    let offsets: Vec<u64> = (0..len.div_ceil(PIECE)).map(|i| i * PIECE).collect();
    let result: Result<()> = futures::stream::iter(offsets.into_iter().map(|off| {
        let file = file.clone();
        async move {
            check_interrupted()?;
            let n = PIECE.min(len - off) as usize;
            let buf = tokio::task::spawn_blocking(move || {
                let mut b = vec![0u8; n];
                file.read_exact_at(&mut b, off).map(|_| b)
            })
            .await??;
            fs.write(ino, off, &buf).await?;
            progress.add_bytes(n as u64);
            counted.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(PIECES_IN_FLIGHT)
    .try_collect::<Vec<()>>()
    .await
    .map(|_| ());
    let atime = job.meta.atime() * 1_000_000_000 + job.meta.atime_nsec();
    let result = match result {
        Ok(()) => fs
            .setattr(
                ino,
                &SetAttr {
                    mode: Some(job.meta.mode() & 0o7777),
                    atime: Some(atime),
                    mtime: Some(mtime_ns(&job.meta)),
                    ..Default::default()
                },
            )
            .await
            .map_err(anyhow::Error::from)
            .and(Ok(())),
        Err(e) => Err(e),
    };
    let result = match result {
        Ok(()) => fs
            .rename(job.parent, &tmp, job.parent, &job.name, false)
            .await
            .with_context(|| format!("renaming into place: {}", quote(&job.name))),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        let _ = fs.unlink_temp(job.parent, &tmp).await;
        progress.undo_bytes(counted.load(std::sync::atomic::Ordering::Relaxed));
        return Err(e.context(format!("copying {}", shown(&job.local))));
    }
    progress.add_file();
    Ok(())
}

/// Where `jfs put` puts: a volume path, and whether it was written with a trailing `/`.
pub struct Dest {
    pub path: VolPath,
    pub dir_slash: bool,
}

impl Dest {
    pub fn parse(volpath: &str) -> Result<Dest> {
        Ok(Dest {
            path: super::vol_path(volpath)?,
            dir_slash: volpath.ends_with('/'),
        })
    }

    /// Whether `local` goes *into* the existing directory `self.path` (under its own name),
    /// rather than becoming `self.path`: a file into a directory (like cp), a directory only
    /// into one named with a trailing `/`; without it, a directory is merged into an existing
    /// one (like `rsync -r src/ dst`), so that running the same put again updates the same
    /// tree instead of nesting a copy inside it.
    pub fn goes_into(&self, local: &Path, is_dir: bool) -> bool {
        is_dir
            && (self.dir_slash
                || std::fs::symlink_metadata(local)
                    .map(|m| !m.is_dir())
                    .unwrap_or(true))
    }
}

/// The name (bytes, whatever they are) a local path is put under.
fn base_name_bytes(local: &Path) -> Result<Vec<u8>> {
    local
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .with_context(|| format!("{} has no file name", shown(local)))
}

/// A local path as it is shown in messages: as given, shell-escaped where it holds control
/// bytes or bytes that are not UTF-8 (`sync::names::quote`), and, when it is relative, the
/// absolute path it stands for after it (`sub/f (/home/u/sub/f)`), so a message is clear
/// wherever it is read.
pub fn shown(p: &Path) -> std::borrow::Cow<'_, str> {
    let escaped = |p: &Path| -> String {
        match p.to_str() {
            Some(s) if !s.chars().any(char::is_control) => s.to_string(),
            _ => quote(p.as_os_str().as_bytes()),
        }
    };
    if p.is_relative() && !p.as_os_str().is_empty() {
        if let Ok(cwd) = std::env::current_dir() {
            return format!("{} ({})", escaped(p), escaped(&cwd.join(p))).into();
        }
    }
    escaped(p).into()
}

/// The entries of local directory `dir` in byte order of their names: (path, name bytes).
fn sorted_children(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", shown(dir)))?
        .map(|e| e.map(|e| (e.path(), e.file_name().as_bytes().to_vec())))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("listing {}", shown(dir)))?;
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

pub async fn put(
    fs: &Fs,
    local: &Path,
    dest: &Dest,
    threads: usize,
    quiet: bool,
) -> Result<Outcome> {
    if let Err(e) = std::fs::symlink_metadata(local) {
        if e.kind() == std::io::ErrorKind::NotFound {
            bail!(
                "put: LOCAL {} does not exist; name a file or directory to put",
                shown(local)
            );
        }
    }
    let base = base_name_bytes(local)?;
    let (parent, name) = match fs.resolve_path(&dest.path).await {
        Ok((ino, a)) if dest.goes_into(local, a.kind == FileKind::Dir) => (ino, base),
        Ok(_) if dest.dir_slash => bail!("put: {}/ is not a directory", dest.path),
        _ => {
            let (p, n) = parent_of(fs, &dest.path, "put").await?;
            (p, n.into_bytes())
        }
    };
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    let mut skipped = Vec::new();
    plan_put(
        fs,
        local,
        parent,
        &name,
        true,
        false,
        &mut jobs,
        &mut dirs,
        &mut skipped,
    )
    .await?;
    let engine = fs.engine();
    let ctx = PutCtx {
        session: fs_core::maint::own_session(&**engine).await,
        judge: fs_core::maint::TmpJudge::new(
            fs_core::session::list(&**engine).await?,
            fs_core::now_ns(),
            fs_core::session::DEFAULT_TIMEOUT,
            false,
        ),
    };
    let total: u64 = jobs.iter().map(|j| j.meta.len()).sum();
    let progress = Progress::new("put", total, quiet);
    let t0 = std::time::Instant::now();
    let mut failures: Vec<anyhow::Error> =
        futures::stream::iter(jobs.iter().map(|j| put_file(fs, &ctx, j, &progress)))
            .buffer_unordered(threads.max(1))
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
    failures.extend(skipped);
    for (ino, meta) in &dirs {
        fs.setattr(
            *ino,
            &SetAttr {
                mtime: Some(mtime_ns(meta)),
                ..Default::default()
            },
        )
        .await?;
    }
    let (files, bytes) = progress.finish();
    report("put", files, bytes, t0.elapsed(), &failures, quiet)
}

pub fn report(
    what: &str,
    files: u64,
    bytes: u64,
    took: Duration,
    failures: &[anyhow::Error],
    quiet: bool,
) -> Result<Outcome> {
    if super::interrupted() {
        bail!("{what} interrupted by a signal after {files} files ({bytes} bytes); partial files were removed, run it again to finish");
    }
    for f in failures {
        cli_common::eprintln!("jfs {what}: failed: {f:#}");
    }
    if !quiet {
        let mbs = bytes as f64 / took.as_secs_f64().max(1e-9) / (1 << 20) as f64;
        cli_common::eprintln!(
            "{what}: {files} files, {bytes} bytes in {:.2}s ({mbs:.1} MiB/s), {} failed",
            took.as_secs_f64(),
            failures.len()
        );
    }
    Ok(if failures.is_empty() {
        Outcome::Done
    } else {
        Outcome::Partial
    })
}

struct GetJob {
    ino: Ino,
    /// The directory it goes into, held open (`LocalDir`), and its name there (bytes).
    dir: LocalDir,
    name: Vec<u8>,
    /// Where that is, for messages only: nothing is opened by this path.
    local: PathBuf,
    attr: fs_core::Attr,
}

/// A local directory `jfs get` writes into, held open: entered from its parent's descriptor
/// with `O_DIRECTORY | O_NOFOLLOW` (`enter_dir`), so a link there (planted before the get, or
/// swapped in while it runs) is never followed. Everything below LOCAL is made relative to
/// one of these (`openat`, `mkdirat`, `symlinkat`, `renameat`) and its mode, times and owner
/// are set through a descriptor, never by path.
type LocalDir = Arc<std::fs::File>;

/// Open directory `name` of `parent` (no link followed; a link there fails with ELOOP or
/// ENOTDIR).
fn enter_dir(parent: &std::fs::File, name: &[u8]) -> std::io::Result<std::fs::File> {
    use rustix::fs::OFlags;
    let fd = rustix::fs::openat(
        parent,
        OsStr::from_bytes(name),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(std::fs::File::from(fd))
}

/// Why entry `name` of `parent` could not be entered as a directory, as a message naming
/// `local` and saying what to do.
fn not_a_dir(
    parent: &std::fs::File,
    name: &[u8],
    local: &Path,
    e: std::io::Error,
) -> anyhow::Error {
    match rustix::fs::statat(parent, OsStr::from_bytes(name), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink => anyhow::anyhow!(
            "{} is a symbolic link where the volume has a directory: a symbolic link is in the way (jfs get never writes through links, so nothing under it was copied): remove it or choose another LOCAL",
            shown(local)
        ),
        Ok(_) => anyhow::anyhow!(
            "{} exists and is not a directory, where the volume has one, so nothing under it was copied; remove it or choose another LOCAL",
            shown(local)
        ),
        Err(_) => anyhow::Error::new(e).context(format!("opening the directory {}", shown(local))),
    }
}

/// How `jfs get` treats owners. Without `owners` every copy belongs to whoever runs get, and
/// a file's setuid and setgid bits are cleared (as `cp` and `tar` do for an owner they do
/// not restore): a root get of a user's `chmod 4755` file would otherwise mint a setuid-root
/// binary. With `owners` (root only, like `tar --same-owner`) each entry is given the
/// volume's uid and gid *before* its mode is set, so setuid and setgid stay with the real
/// owner. A directory's setgid and sticky bits are kept either way (they make no one more
/// privileged: setgid only passes the directory's group on to new entries).
#[derive(Debug, Clone, Copy, Default)]
pub struct GetOpts {
    pub owners: bool,
}

impl GetOpts {
    /// Refuse `--owners` to a caller that cannot give files away.
    pub fn check(&self) -> Result<()> {
        if self.owners {
            sync::endpoint::check_owners("get")?;
        }
        Ok(())
    }

    /// The mode a copy of a file with `mode` gets (the rule `jfs-sync` follows too).
    fn file_mode(&self, mode: u32) -> u32 {
        sync::endpoint::copy_mode(mode, self.owners)
    }
}

/// Give `f` the volume's owner of `attr` (`GetOpts::owners`).
fn chown_fd(f: &impl std::os::fd::AsFd, attr: &fs_core::Attr) -> std::io::Result<()> {
    rustix::fs::fchown(
        f,
        Some(rustix::process::Uid::from_raw(attr.uid)),
        Some(rustix::process::Gid::from_raw(attr.gid)),
    )
    .map_err(std::io::Error::from)
}

/// Plan the copy of `ino` to entry `name` of directory `parent` (`local`: where that is, for
/// messages). What cannot be copied where it must go (a symbolic link or a file where the
/// volume has a directory) is a failure of that subtree, added to `failed`; the rest goes on.
#[allow(clippy::too_many_arguments)]
fn plan_get<'a>(
    fs: &'a Fs,
    ino: Ino,
    attr: fs_core::Attr,
    parent: LocalDir,
    name: Vec<u8>,
    local: PathBuf,
    opts: GetOpts,
    jobs: &'a mut Vec<GetJob>,
    dirs: &'a mut Vec<(LocalDir, PathBuf, fs_core::Attr)>,
    failed: &'a mut Vec<anyhow::Error>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let at = OsStr::from_bytes(&name);
        match attr.kind {
            FileKind::Dir => {
                // Made owner-only (its mode is set after everything in it is copied), or
                // one already there; then entered without following a link (`enter_dir`).
                match rustix::fs::mkdirat(&*parent, at, rustix::fs::Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        failed.push(
                            anyhow::Error::new(std::io::Error::from(e))
                                .context(format!("creating {}", shown(&local))),
                        );
                        return Ok(());
                    }
                }
                let d = match enter_dir(&parent, &name) {
                    Ok(d) => d,
                    Err(e) => {
                        failed.push(not_a_dir(&parent, &name, &local, e));
                        return Ok(());
                    }
                };
                // Checked once made too: one another user made there first is theirs.
                let st = rustix::fs::fstat(&d)
                    .map_err(std::io::Error::from)
                    .with_context(|| format!("reading {}", shown(&local)))?;
                if let Some(why) = others_may_change(st.st_uid, st.st_mode) {
                    failed.push(anyhow::anyhow!(
                        "{} {why}: jfs get does not write into a directory another user can change (they could swap what is in it for a link while it is copied), so nothing under it was copied; get into a directory of your own, then move the files",
                        shown(&local)
                    ));
                    return Ok(());
                }
                let d = Arc::new(d);
                for e in fs.readdir_all(ino).await? {
                    // Names are bytes: the local name is the volume's, byte for byte.
                    if is_tmp_entry(&e.name) {
                        continue; // an unfinished put
                    }
                    let a = fs.getattr(e.ino).await?;
                    let to = local.join(OsStr::from_bytes(&e.name));
                    plan_get(
                        fs,
                        e.ino,
                        a,
                        d.clone(),
                        e.name,
                        to,
                        opts,
                        jobs,
                        dirs,
                        failed,
                    )
                    .await?;
                }
                dirs.push((d, local, attr));
            }
            FileKind::Symlink => {
                let t = fs.readlink(ino).await?;
                // What is there is replaced (a link or file; a directory stays, and the
                // link then fails); nothing is followed.
                let _ = rustix::fs::unlinkat(&*parent, at, rustix::fs::AtFlags::empty());
                let made =
                    rustix::fs::symlinkat(OsStr::from_bytes(&t), &*parent, at).and_then(|()| {
                        if opts.owners {
                            rustix::fs::chownat(
                                &*parent,
                                at,
                                Some(rustix::process::Uid::from_raw(attr.uid)),
                                Some(rustix::process::Gid::from_raw(attr.gid)),
                                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                            )
                        } else {
                            Ok(())
                        }
                    });
                if let Err(e) = made {
                    failed.push(
                        anyhow::Error::new(std::io::Error::from(e))
                            .context(format!("creating symlink {}", shown(&local))),
                    );
                }
            }
            FileKind::File => jobs.push(GetJob {
                ino,
                dir: parent,
                name,
                local,
                attr,
            }),
            kind => {
                tracing::warn!(path = %shown(&local), ?kind, "skipped: not a file, directory or symlink");
            }
        }
        Ok(())
    })
}

/// Why another user could change a directory of owner `uid` and `mode` (it is theirs, not
/// this user's or root's; or others may write it), if they could.
fn others_may_change(uid: u32, mode: u32) -> Option<String> {
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Some(format!("belongs to uid {uid}"));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "may be written by others (mode {:04o})",
            mode & 0o7777
        ));
    }
    None
}

/// A time in ns since 1970 (negative: before) as a `SystemTime`: every time a volume holds,
/// before 1970 too.
pub fn system_time(ns: i64) -> std::time::SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// Memory for read-ahead of all files `jfs get` copies at once.
const GET_BUDGET: u64 = 512 << 20;

async fn get_file(
    fs: &Arc<Fs>,
    budget: &fs_core::Budget,
    job: &GetJob,
    opts: GetOpts,
    progress: &Progress,
) -> Result<()> {
    check_interrupted()?;
    remove_stale_temps(&job.dir, &job.name, &job.local);
    let tmp_name = tmp_name_of(&job.name, None);
    let tmp_at = OsStr::from_bytes(&tmp_name);
    let tmp = job.local.with_file_name(tmp_at);
    // Owner-only from the first byte, and a new file in the directory held open: whatever
    // sits at that name (a file or a link another user planted) is neither followed nor
    // reused (O_EXCL | O_NOFOLLOW).
    let file = {
        use rustix::fs::OFlags;
        let fd = rustix::fs::openat(
            &*job.dir,
            tmp_at,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(std::io::Error::from)
        .with_context(|| format!("creating {}", shown(&tmp)))?;
        Arc::new(std::fs::File::from(fd))
    };
    // Bytes of this file counted so far: taken back if it fails (the summary counts only
    // what was written).
    let mut counted = 0u64;
    let len = job.attr.length;
    file.set_len(len)?;
    // The mount's reader: sequential reads with a growing read-ahead window, blocks fetched
    // in parallel ahead of the writer; one local write in flight while the next piece reads.
    let res: Result<()> = async {
        let counted = &mut counted;
        let reader = fs_core::FileReader::new(
            fs.clone(),
            job.ino,
            fs_core::ReadAhead {
                max_window: 256 << 20,
                budget: Some(budget.clone()),
            },
        )
        .await?;
        let mut off = 0u64;
        let mut pending: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
        // The disk writes what was written so far while later pieces are read, instead of
        // all of it at the final sync (at most one such flush at a time; none is waited for).
        let mut flushing: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
        let mut unflushed = 0u64;
        while off < len {
            check_interrupted()?;
            let buf = reader.read(off, PIECE.min(len - off) as usize).await?;
            if buf.is_empty() {
                anyhow::bail!(
                    "inode {} ended at {off} of {len} bytes while being read",
                    job.ino
                );
            }
            let n = buf.len() as u64;
            if let Some(p) = pending.take() {
                p.await??;
            }
            let f = file.clone();
            let at = off;
            pending = Some(tokio::task::spawn_blocking(move || {
                f.write_all_at(&buf, at)
            }));
            progress.add_bytes(n);
            *counted += n;
            off += n;
            unflushed += n;
            if unflushed >= FLUSH_EVERY && flushing.as_ref().is_none_or(|f| f.is_finished()) {
                if let Some(f) = flushing.take() {
                    f.await??;
                }
                let f = file.clone();
                flushing = Some(tokio::task::spawn_blocking(move || f.sync_data()));
                unflushed = 0;
            }
        }
        if let Some(p) = pending.take() {
            p.await??;
        }
        if let Some(f) = flushing.take() {
            f.await??;
        }
        Ok(())
    }
    .await;
    let res = res.and_then(|_| {
        file.sync_all()?;
        // The owner first: a chown clears setuid and setgid, and the mode is the owner's.
        if opts.owners {
            chown_fd(&*file, &job.attr)?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(
            opts.file_mode(job.attr.mode),
        ))?;
        file.set_times(
            std::fs::FileTimes::new()
                .set_modified(system_time(job.attr.mtime))
                .set_accessed(system_time(job.attr.atime)),
        )?;
        // Within the held directory: a link at the final name is replaced, not followed.
        rustix::fs::renameat(&*job.dir, tmp_at, &*job.dir, OsStr::from_bytes(&job.name))?;
        Ok(())
    });
    if let Err(e) = res {
        let _ = rustix::fs::unlinkat(&*job.dir, tmp_at, rustix::fs::AtFlags::empty());
        progress.undo_bytes(counted);
        return Err(e.context(format!("copying to {}", shown(&job.local))));
    }
    progress.add_file();
    Ok(())
}

/// Where `jfs get` writes VOLPATH, symmetric to `jfs put` (`Dest::goes_into`): a file goes
/// into LOCAL when LOCAL is an existing directory (like cp); a directory becomes LOCAL,
/// merged into an existing one (so a rerun after a partial failure finishes the same tree
/// instead of nesting a copy inside it), and goes into LOCAL under its own name only when
/// LOCAL is written with a trailing `/`.
fn get_dest(local: &Path, volpath: &VolPath, is_dir: bool) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let name = volpath.name().unwrap_or("root");
    let bytes = local.as_os_str().as_bytes();
    let slash = bytes.ends_with(b"/");
    let local_is_dir = local.is_dir();
    // `a/` of a file does not even stat: look at `a`.
    let bare = Path::new(std::ffi::OsStr::from_bytes(
        bytes
            .strip_suffix(b"/")
            .filter(|b| !b.is_empty())
            .unwrap_or(bytes),
    ));
    if slash && !local_is_dir && bare.symlink_metadata().is_ok() {
        bail!(
            "get: {} is not a directory; name a directory, or LOCAL without the trailing /",
            shown(local)
        );
    }
    if local_is_dir && (!is_dir || slash) {
        return Ok(local.join(name));
    }
    // LOCAL itself, as given, may be a link to a directory (nothing below it may be).
    if is_dir && local_is_dir {
        return std::fs::canonicalize(local).with_context(|| format!("resolving {}", shown(local)));
    }
    Ok(local.to_path_buf())
}

pub async fn get(
    fs: Arc<Fs>,
    volpath: &VolPath,
    local: &Path,
    threads: usize,
    opts: GetOpts,
    quiet: bool,
) -> Result<Outcome> {
    opts.check()?;
    let (ino, attr) = fs
        .resolve_path(volpath)
        .await
        .map_err(|e| super::fsops::at(volpath, "get", e))?;
    // LOCAL reached through another user's link, or inside a directory another user could
    // change, would let them choose where this copy writes (and what it chmods).
    if let Some(why) = cli_common::private::foreign_link(local) {
        anyhow::bail!("get: {why}");
    }
    let dest = get_dest(local, volpath, attr.kind == FileKind::Dir)?;
    if let Some(why) = cli_common::private::ancestors_problem(&dest) {
        anyhow::bail!(
            "get into {}: {why}: get into a directory of your own, then move the files",
            shown(&dest)
        );
    }
    // The directory DEST goes into is opened by its path (LOCAL as given, checked above);
    // everything below it is reached from descriptors only (`LocalDir`).
    let name = dest
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .with_context(|| {
            format!(
                "get: {} names no entry to create; name a directory below it",
                shown(&dest)
            )
        })?;
    let above = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if attr.kind == FileKind::Dir {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&above)
            .with_context(|| format!("get: creating {}", shown(&above)))?;
    }
    let above_dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(&above)
        .with_context(|| format!("get: opening the directory {}", shown(&above)))?;
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    let mut refused = Vec::new();
    plan_get(
        &fs,
        ino,
        attr,
        Arc::new(above_dir),
        name,
        dest,
        opts,
        &mut jobs,
        &mut dirs,
        &mut refused,
    )
    .await?;
    let budget = fs_core::Budget::new(GET_BUDGET);
    let total = jobs.iter().map(|j| j.attr.length).sum();
    let progress = Progress::new("get", total, quiet);
    let t0 = std::time::Instant::now();
    let mut failures: Vec<anyhow::Error> = futures::stream::iter(
        jobs.iter()
            .map(|j| get_file(&fs, &budget, j, opts, &progress)),
    )
    .buffer_unordered(threads.max(1))
    .filter_map(|r| async move { r.err() })
    .collect()
    .await;
    failures.extend(refused);
    // Through the descriptors held since each was entered: a directory swapped for a link
    // meanwhile is not what is changed.
    for (d, path, attr) in dirs.iter().rev() {
        if opts.owners {
            chown_fd(&**d, attr).with_context(|| format!("giving {} to its owner", shown(path)))?;
        }
        d.set_permissions(std::fs::Permissions::from_mode(attr.mode & 0o7777))
            .and_then(|()| {
                d.set_times(std::fs::FileTimes::new().set_modified(system_time(attr.mtime)))
            })
            .with_context(|| format!("setting the mode and time of {}", shown(path)))?;
    }
    let (files, bytes) = progress.finish();
    report("get", files, bytes, t0.elapsed(), &failures, quiet)
}
