//! The write commands done through a live read-write mount of the volume, for a RocksDB
//! volume (RocksDB admits one writing process, and the mount is it): plain file-system calls,
//! so the mount's kernel caches and open files stay coherent.
//!
//! Two rules keep a volume path inside the volume. The path was resolved inside the volume
//! first (`VolPath`: `..` never climbs above its root). And it is never joined onto the
//! mount point's host path: it is walked from the mount's root directory one name at a time,
//! no name ever a symlink, and never into another file system mounted below the mount point
//! (a bind mount, another volume: `Root::sub` compares each directory's device with the
//! root's), and every call is made relative to the directory handle so reached (cap-std), so
//! nothing outside the mount can be touched whatever the volume holds. The entry a command
//! acts on is checked the same way (`Root::on_volume`), and `rm -r` walks its tree itself,
//! with the same check at every directory. Errors have the words of the commands without a mount
//! (`fsops::at`), and `put` reports like `transfer::put`: a file counts as done only once
//! the mount has committed it (fsync), a failed one is named, and the summary line and exit
//! code are the same. `put` carries names as bytes (`OsString`), never as text: a local name
//! that is not UTF-8 arrives byte for byte, as with `transfer::put`.

use super::fsops::{at, LinkTarget};
use super::transfer::{mtime_ns, report, system_time, tmp_name, Dest};
use super::{split_last, Outcome};
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, SystemTimeSpec};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};
use fs_core::VolPath;
use futures::StreamExt;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use sync::names::{bytes_of, key_of, quote};

/// An io error in fs-core's words, for `fsops::at`.
fn fse(e: std::io::Error) -> fs_core::Error {
    fs_core::Error::from_io(&e, "through the mount")
}

/// An entry that is another file system mounted below the mount point (`Root::elsewhere`).
#[derive(Debug)]
struct Elsewhere(String);

impl std::fmt::Display for Elsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Elsewhere {}

fn is_elsewhere(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Elsewhere>())
}

/// The root directory of a live mount of the volume.
pub struct Root {
    mp: PathBuf,
    root: Dir,
    /// The mount's device: every directory and entry reached must be on it.
    dev: u64,
}

impl Root {
    pub fn open(mp: &Path) -> Result<Root> {
        let root = Dir::open_ambient_dir(mp, cap_std::ambient_authority())
            .with_context(|| format!("opening the mount at {}", mp.display()))?;
        let dev = cap_std::fs::MetadataExt::dev(&root.dir_metadata()?);
        Ok(Root {
            mp: mp.to_path_buf(),
            root,
            dev,
        })
    }

    /// The error for an entry that is not on the mount's file system.
    fn elsewhere(&self, name: impl AsRef<Path>) -> std::io::Error {
        let name = quote(name.as_ref().as_os_str().as_bytes());
        std::io::Error::other(Elsewhere(format!(
            "{name} is another file system mounted inside the mount at {} (a bind mount or another volume): jfs does not cross into it; unmount it first, or use that file system's own tools",
            self.mp.display()
        )))
    }

    /// Directory `name` in `d`, following no symlink and never into another file system.
    fn sub(&self, d: &Dir, name: impl AsRef<Path>) -> std::io::Result<Dir> {
        let s = d.open_dir_nofollow(name.as_ref())?;
        if cap_std::fs::MetadataExt::dev(&s.dir_metadata()?) != self.dev {
            return Err(self.elsewhere(name));
        }
        Ok(s)
    }

    /// That entry `name` of `d` (not followed) is on the mount's file system, not a mount point
    /// of another one.
    fn on_volume(&self, d: &Dir, name: &str) -> std::io::Result<cap_std::fs::Metadata> {
        let m = d.symlink_metadata(name)?;
        if cap_std::fs::MetadataExt::dev(&m) != self.dev {
            return Err(self.elsewhere(name));
        }
        Ok(m)
    }

    /// The directory at `p`, walked from the root one name at a time (`sub`).
    fn dir(&self, p: &VolPath) -> std::io::Result<Dir> {
        let mut d = self.root.try_clone()?;
        for name in p.parts() {
            d = self.sub(&d, name)?;
        }
        Ok(d)
    }

    /// Refuse `rm -r` of `p` when another file system is mounted anywhere below it (the
    /// kernel's mount table), before anything is removed: `remove_tree` would stop at the
    /// mount, but only after removing what it met first.
    fn no_mount_below(&self, p: &VolPath) -> Result<()> {
        let host = p.parts().iter().fold(self.mp.clone(), |h, n| h.join(n));
        for m in mount::mounts::table()? {
            if m.mountpoint != self.mp && m.mountpoint.starts_with(&host) {
                bail!(
                    "rm -r {p}: {} is another file system mounted inside the mount at {} ({}): jfs does not cross into it, and removes nothing while it is there; unmount it first",
                    m.mountpoint.display(),
                    self.mp.display(),
                    m.fstype
                );
            }
        }
        Ok(())
    }

    /// Remove directory `name` of `d` with everything under it, checking each directory as
    /// `sub` does before going into it (so a mount met on the way stops the removal there).
    fn remove_tree(&self, d: &Dir, name: &str) -> std::io::Result<()> {
        let sub = self.sub(d, name)?;
        for e in sub.entries()? {
            let e = e?;
            let n = e.file_name();
            let n = n
                .to_str()
                .ok_or_else(|| std::io::Error::other(format!("{n:?}: a name that is not UTF-8")))?;
            // A directory is checked by `sub` as it is entered; anything else a mount cannot
            // sit on without its removal failing (EBUSY).
            if e.file_type()?.is_dir() {
                self.remove_tree(&sub, n)?;
            } else {
                sub.remove_file_or_symlink(n)?;
            }
        }
        d.remove_dir(name)
    }

    /// Whether `p` names an entry (of any kind; the last name is not followed).
    fn exists(&self, p: &VolPath) -> bool {
        match p.split_last() {
            None => true,
            Some((dir, name)) => self
                .dir(&dir)
                .is_ok_and(|d| d.symlink_metadata(name).is_ok()),
        }
    }

    /// The directory that holds `p`, and `p`'s last name.
    fn parent<'a>(&self, p: &'a VolPath, op: &str) -> Result<(Dir, &'a str)> {
        let (dir, name) = split_last(p, op)?;
        let d = self.dir(&dir).map_err(|e| at(p, op, fse(e)))?;
        Ok((d, name))
    }

    fn ctx(&self, what: String) -> String {
        format!("{what} (through the mount at {})", self.mp.display())
    }

    pub fn mkdir(&self, path: &VolPath, parents: bool) -> Result<Outcome> {
        if !parents {
            let (d, name) = self.parent(path, "mkdir")?;
            d.create_dir(name).map_err(|e| at(path, "mkdir", fse(e)))?;
            return Ok(Outcome::Done);
        }
        let mut d = self.root.try_clone()?;
        for name in path.parts() {
            d = match self.sub(&d, name) {
                Ok(sub) => sub,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    d.create_dir(name).map_err(|e| at(path, "mkdir", fse(e)))?;
                    self.sub(&d, name).map_err(|e| at(path, "mkdir", fse(e)))?
                }
                Err(e) if is_elsewhere(&e) => return Err(at(path, "mkdir", fse(e))),
                Err(_) if d.symlink_metadata(name).is_ok() => {
                    bail!("mkdir -p {path}: {name} exists and is not a directory")
                }
                Err(e) => return Err(at(path, "mkdir", fse(e))),
            };
        }
        Ok(Outcome::Done)
    }

    pub fn rm(&self, path: &VolPath, recursive: bool, dir_only: bool) -> Result<Outcome> {
        if path.is_root() {
            bail!("rm {path}: refusing to remove the volume's root");
        }
        let (d, name) = self.parent(path, "rm")?;
        let m = self
            .on_volume(&d, name)
            .map_err(|e| at(path, "rm", fse(e)))?;
        if dir_only && !m.is_dir() {
            bail!("{}", super::fsops::not_a_dir(path));
        }
        let r = if m.is_dir() {
            if recursive {
                self.no_mount_below(path)?;
                self.remove_tree(&d, name)
            } else {
                d.remove_dir(name)
            }
        } else {
            d.remove_file_or_symlink(name)
        };
        r.map_err(|e| at(path, "rm", fse(e)))
            .with_context(|| self.ctx(format!("rm {path}")))?;
        Ok(Outcome::Done)
    }

    pub fn mv(&self, src: &VolPath, dst: &VolPath, no_clobber: bool) -> Result<Outcome> {
        let (sd, sname) = self.parent(src, "mv")?;
        self.on_volume(&sd, sname)
            .map_err(|e| at(src, "mv", fse(e)))?;
        // Like mv(1): into an existing directory keeps the name.
        let (dd, dname) = match self.dir(dst) {
            Ok(d) => (d, sname),
            Err(e) if is_elsewhere(&e) => return Err(at(dst, "mv", fse(e))),
            Err(_) => self.parent(dst, "mv")?,
        };
        let r = if no_clobber {
            rustix::fs::renameat_with(&sd, sname, &dd, dname, rustix::fs::RenameFlags::NOREPLACE)
                .map_err(std::io::Error::from)
        } else {
            sd.rename(sname, &dd, dname)
        };
        r.map_err(|e| {
            let e = fse(e);
            match e.kind() {
                fs_core::ErrorKind::NotFound => at(src, "mv", e),
                _ => at(dst, "mv", e),
            }
        })?;
        Ok(Outcome::Done)
    }

    pub fn ln(&self, target: &LinkTarget, link: &VolPath) -> Result<Outcome> {
        let (ld, lname) = self.parent(link, "ln")?;
        match target {
            LinkTarget::Text(t) => ld
                .symlink_contents(t, lname)
                .map_err(|e| at(link, "ln -s", fse(e)))?,
            LinkTarget::Path(t) => {
                let (td, tname) = self.parent(t, "ln")?;
                td.hard_link(tname, &ld, lname)
                    .map_err(|e| at(link, "ln", fse(e)))?
            }
        }
        Ok(Outcome::Done)
    }

    pub fn truncate(&self, path: &VolPath, size: u64) -> Result<Outcome> {
        let (d, name) = self.parent(path, "truncate")?;
        let mut o = OpenOptions::new();
        o.write(true).follow(FollowSymlinks::No);
        self.on_volume(&d, name)
            .map_err(|e| at(path, "truncate", fse(e)))?;
        let f = d
            .open_with(name, &o)
            .map_err(|e| at(path, "truncate", fse(e)))?;
        f.set_len(size)
            .and_then(|_| f.sync_all())
            .map_err(|e| at(path, "truncate", fse(e)))
            .with_context(|| self.ctx(format!("truncate {path}")))?;
        Ok(Outcome::Done)
    }
}

/// One file to copy into the mount. Names are bytes, whatever they are (a volume's names
/// may hold any byte but `/` and NUL, as a local file system's do).
struct Job {
    dir: Arc<Dir>,
    name: OsString,
    local: PathBuf,
    meta: std::fs::Metadata,
}

/// A name as messages show it: shell-escaped where it holds control bytes or bytes that are
/// not UTF-8 (`sync::names::quote`, as `jfs ls` prints names).
fn shown(n: &OsStr) -> String {
    quote(n.as_bytes())
}

/// The name a local path is put under: its bytes, whatever they are.
fn base_name_os(local: &Path) -> Result<OsString> {
    local
        .file_name()
        .map(OsStr::to_os_string)
        .with_context(|| format!("{} has no file name", shown(local.as_os_str())))
}

/// The entries of local directory `dir` in byte order of their names: (path, name).
fn children(dir: &Path) -> Result<Vec<(PathBuf, OsString)>> {
    let mut out: Vec<(PathBuf, OsString)> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", shown(dir.as_os_str())))?
        .map(|e| e.map(|e| (e.path(), e.file_name())))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("listing {}", shown(dir.as_os_str())))?;
    out.sort_by(|a, b| a.1.as_bytes().cmp(b.1.as_bytes()));
    Ok(out)
}

/// `jfs put` through a mount.
pub async fn put(
    mp: &Path,
    local: &Path,
    dest: &Dest,
    threads: usize,
    quiet: bool,
) -> Result<Outcome> {
    let root = Root::open(mp)?;
    let (dir, name) = match root.dir(&dest.path) {
        Ok(d) if dest.goes_into(local, true) => (d, base_name_os(local)?),
        Ok(_) => {
            let (d, n) = root.parent(&dest.path, "put")?;
            (d, OsString::from(n))
        }
        Err(e) if is_elsewhere(&e) => return Err(at(&dest.path, "put", fse(e))),
        Err(_) if dest.dir_slash && root.exists(&dest.path) => {
            bail!("put: {}/ is not a directory", dest.path)
        }
        Err(_) => {
            let (d, n) = root.parent(&dest.path, "put")?;
            (d, OsString::from(n))
        }
    };
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    remove_dead_temps(&dir);
    plan(&root, &Arc::new(dir), local, &name, &mut jobs, &mut dirs)?;
    let total: u64 = jobs.iter().map(|j| j.meta.len()).sum();
    let progress = Arc::new(Progress::new("put", total, quiet));
    let t0 = std::time::Instant::now();
    let failures: Vec<anyhow::Error> = futures::stream::iter(jobs.into_iter().map(|j| {
        let (progress, mp) = (progress.clone(), root.mp.clone());
        async move {
            tokio::task::spawn_blocking(move || put_file(&j, &progress, &mp))
                .await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("copy task failed: {e}")))
        }
    }))
    .buffer_unordered(threads.max(1))
    .filter_map(|r| async move { r.err() })
    .collect()
    .await;
    // Directories last: creating their children changed their mtimes.
    for (parent, name, meta) in dirs.iter().rev() {
        parent
            .set_times(
                name,
                None,
                Some(SystemTimeSpec::Absolute(
                    cap_std::time::SystemTime::from_std(system_time(mtime_ns(meta))),
                )),
            )
            .with_context(|| root.ctx(format!("setting the mtime of {}", shown(name))))?;
    }
    let progress =
        Arc::try_unwrap(progress).map_err(|_| anyhow::anyhow!("a copy task outlived the put"))?;
    let (files, bytes) = progress.finish();
    report("put", files, bytes, t0.elapsed(), &failures, quiet)
}

/// Create the directory tree in the mount (keeping existing directories), the symlinks, and
/// collect the files to copy.
fn plan(
    root: &Root,
    parent: &Arc<Dir>,
    local: &Path,
    name: &OsStr,
    jobs: &mut Vec<Job>,
    dirs: &mut Vec<(Arc<Dir>, OsString, std::fs::Metadata)>,
) -> Result<()> {
    let shown_name = shown(name);
    let meta =
        std::fs::symlink_metadata(local).with_context(|| format!("reading {}", local.display()))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        let existed = match parent.create_dir(name) {
            Ok(()) => false,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => true,
            Err(e) => {
                return Err(e).with_context(|| root.ctx(format!("creating directory {shown_name}")))
            }
        };
        let d = root.sub(parent, name).map_err(|e| match is_elsewhere(&e) {
            true => anyhow::Error::new(e),
            false => anyhow::anyhow!("{shown_name} exists in the volume and is not a directory"),
        })?;
        if existed {
            remove_dead_temps(&d);
        }
        // The owner before the mode (as for files): a chown clears setgid.
        if rustix::process::geteuid().is_root() {
            rustix::fs::chownat(
                &**parent,
                name,
                Some(rustix::process::Uid::from_raw(meta.uid())),
                Some(rustix::process::Gid::from_raw(meta.gid())),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .with_context(|| root.ctx(format!("setting the owner of {shown_name}")))?;
        }
        parent
            .set_permissions(name, Permissions::from_mode(meta.mode() & 0o7777))
            .with_context(|| root.ctx(format!("setting the mode of {shown_name}")))?;
        let d = Arc::new(d);
        for (path, cname) in children(local)? {
            plan(root, &d, &path, &cname, jobs, dirs)?;
        }
        dirs.push((parent.clone(), name.to_os_string(), meta));
    } else if ft.is_symlink() {
        let target = std::fs::read_link(local)?;
        if let Ok(m) = parent.symlink_metadata(name) {
            if m.is_dir() {
                bail!("{shown_name} exists in the volume as a directory");
            }
            parent
                .remove_file_or_symlink(name)
                .with_context(|| root.ctx(format!("replacing {shown_name}")))?;
        }
        parent
            .symlink_contents(&target, name)
            .with_context(|| root.ctx(format!("symlink {shown_name}")))?;
    } else if ft.is_file() {
        jobs.push(Job {
            dir: parent.clone(),
            name: name.to_os_string(),
            local: local.to_path_buf(),
            meta,
        });
    } else {
        tracing::warn!(path = %local.display(), "skipping: not a file, directory or symlink");
    }
    Ok(())
}

/// Remove the temporary files that puts through this mount left in `d` when they were
/// killed: their process is gone from this host (a put through a mount runs on the mount's
/// host, a RocksDB volume's only one). Those of a put with a session of its own are `gc`'s.
fn remove_dead_temps(d: &Dir) {
    let Ok(entries) = d.entries() else { return };
    for e in entries.flatten() {
        let n = e.file_name();
        // A name that is not UTF-8 by its key (`sync::names::key_of`), as gc reads it.
        let Some(w) = fs_core::maint::tmp_writer(&key_of(n.as_bytes())) else {
            continue;
        };
        if w.session.is_none() && fs_core::session::process_start(w.pid).is_none() {
            match d.remove_file(&n) {
                Ok(()) => {
                    tracing::info!(name = %shown(&n), "removed a temporary file a killed jfs put left")
                }
                Err(e) => {
                    tracing::warn!(name = %shown(&n), error = %e, "removing a temporary file a killed jfs put left")
                }
            }
        }
    }
}

/// Why the mount at `mp` failed to commit inode `ino`, asked through its control socket.
fn mount_write_error(mp: &Path, ino: u64) -> Option<String> {
    let req = mount::control::Request::WriteError { ino };
    let v = tokio::runtime::Handle::current()
        .block_on(mount::control::call(mp, &req, |_| {}))
        .ok()?;
    v.get("error_text")?.as_str().map(str::to_string)
}

/// Copy one file under a temporary name, have the mount commit it (fsync: a failed upload
/// is reported there, not lost at close), then rename it into place.
fn put_file(job: &Job, progress: &Progress, mp: &Path) -> Result<()> {
    if super::interrupted() {
        bail!("interrupted");
    }
    // The temporary name as `transfer::put` makes it: a name that is not UTF-8 by its key.
    let tmp =
        OsStr::from_bytes(&bytes_of(&tmp_name(&key_of(job.name.as_bytes()), None))).to_os_string();
    // Owner-only until complete, and made by this process (O_EXCL); its owner, then its mode,
    // are set once it is committed, so that a root put never leaves a root-owned setuid file
    // with another user's bytes, even for a moment (and a chown after the mode would clear it).
    let mut o = OpenOptions::new();
    o.write(true)
        .create_new(true)
        .follow(FollowSymlinks::No)
        .mode(0o600);
    let mut copied = 0u64;
    let result = (|| -> Result<()> {
        let mut out = job
            .dir
            .open_with(&tmp, &o)
            .with_context(|| format!("creating {}", shown(&tmp)))?;
        let mut src = std::fs::File::open(&job.local)
            .with_context(|| format!("opening {}", job.local.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            if super::interrupted() {
                bail!("interrupted");
            }
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            progress.add_bytes(n as u64);
            copied += n as u64;
        }
        if let Err(e) = out.sync_all() {
            // EIO says only that the commit failed: the mount knows why.
            let why = out
                .metadata()
                .ok()
                .and_then(|m| mount_write_error(mp, cap_std::fs::MetadataExt::ino(&m)));
            return Err(match why {
                Some(w) => anyhow::anyhow!("the mount could not commit the file: {w}"),
                None => anyhow::Error::new(e).context(format!(
                    "the mount could not commit the file (its log says why: {})",
                    mount::control::socket_path(mp)
                        .with_extension("log")
                        .display()
                )),
            });
        }
        let out = out.into_std();
        if rustix::process::geteuid().is_root() {
            rustix::fs::fchown(
                &out,
                Some(rustix::process::Uid::from_raw(job.meta.uid())),
                Some(rustix::process::Gid::from_raw(job.meta.gid())),
            )?;
        }
        out.set_permissions(
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(
                job.meta.mode() & 0o7777,
            ),
        )?;
        let atime = job.meta.atime() * 1_000_000_000 + job.meta.atime_nsec();
        out.set_times(
            std::fs::FileTimes::new()
                .set_accessed(system_time(atime))
                .set_modified(system_time(mtime_ns(&job.meta))),
        )?;
        job.dir
            .rename(&tmp, &job.dir, &job.name)
            .with_context(|| format!("renaming into place: {}", shown(&job.name)))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = job.dir.remove_file(&tmp);
        progress.undo_bytes(copied);
        return Err(e.context(format!(
            "copying {} (through the mount at {})",
            job.local.display(),
            mp.display()
        )));
    }
    progress.add_file();
    Ok(())
}
