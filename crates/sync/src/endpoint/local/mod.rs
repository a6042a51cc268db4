//! A local directory, opened once as a capability (cap-std): every path below is resolved
//! relative to that descriptor, `..` and absolute paths cannot leave it, and symlinks are never
//! followed out of it (a planted `dst/a -> /etc` makes writes under `a/` fail, not escape).
//! Files are written under a temporary name, owner-only, and renamed into place when
//! complete (`sink.rs`).

use super::{check_path as check_key, Endpoint, Entry, Kind, Page, Sink};
use crate::names::{key_of_os, path_of, show};
use anyhow::{anyhow, bail, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use cap_std::fs::Dir;
use cap_std::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;

mod sink;
mod spill;

pub use sink::LocalSink;

pub struct LocalDir {
    root: PathBuf,
    dir: Arc<Dir>,
    /// Handles of destination directories recently written to, by key prefix: a small file
    /// is then created and renamed relative to its directory (no path walk per call).
    parents: std::sync::Mutex<std::collections::HashMap<String, Arc<Dir>>>,
}

/// At most this many directory handles are kept open.
const PARENTS_MAX: usize = 256;

/// The entry `key` of `dir`, whose metadata is `m` (a symlink's target is read here).
fn entry_at(dir: &Dir, key: String, m: &cap_std::fs::Metadata) -> Result<Entry> {
    let target = if m.is_symlink() {
        Some(key_of_os(dir.read_link_contents(rel(&key))?.as_os_str()).into_owned())
    } else {
        None
    };
    let kind = if m.is_dir() {
        Kind::Dir
    } else if m.is_symlink() {
        Kind::Symlink
    } else {
        Kind::File
    };
    Ok(Entry {
        key,
        kind,
        size: if kind == Kind::File { m.len() } else { 0 },
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        mode: Some(m.mode() & 0o7777),
        target,
        owner: Some((m.uid(), m.gid())),
    })
}

/// The entries of directory `key` ("": the root).
fn read_level(dir: &Dir, key: &str) -> std::io::Result<cap_std::fs::ReadDir> {
    if key.is_empty() {
        dir.entries()
    } else {
        dir.read_dir(rel(key))
    }
}

/// The key of an entry's name: its bytes, whatever they are (`crate::names`).
fn name_of(e: &cap_std::fs::DirEntry) -> String {
    key_of_os(&e.file_name()).into_owned()
}

/// The path (relative to the root) a key names: its bytes (`crate::names`).
fn rel(key: &str) -> PathBuf {
    path_of(key.trim_end_matches('/'))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("I/O task failed: {e}"))?
}

impl LocalDir {
    /// Open `path`; with `create`, make it first if missing.
    pub fn open_with(path: &str, create: bool) -> Result<Self> {
        if path.is_empty() {
            bail!("empty local path");
        }
        let root = PathBuf::from(path);
        if create {
            std::fs::create_dir_all(&root)
                .with_context(|| format!("creating {}", root.display()))?;
        }
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority())
            .with_context(|| format!("opening directory {}", root.display()))?;
        Ok(LocalDir {
            root,
            dir: Arc::new(dir),
            parents: Default::default(),
        })
    }

    pub fn open(path: &str) -> Result<Self> {
        Self::open_with(path, false)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Children of directory `key` in key order. A directory with more than `spill_at()`
    /// entries is sorted on disk (runs of names in temp files, merged), so a flat directory of
    /// millions of files costs a few MiB of memory, not gigabytes.
    fn kids(dir: &Dir, key: &str) -> Result<Kids> {
        let rd = read_level(dir, key)?;
        let limit = spill_at();
        let mut names: Vec<String> = Vec::new();
        let mut runs: Vec<std::fs::File> = Vec::new();
        for e in rd {
            let e = e?;
            let name = name_of(&e);
            names.push(if e.file_type()?.is_dir() {
                format!("{name}/")
            } else {
                name
            });
            if names.len() >= limit {
                runs.push(spill::write_run(&mut names)?);
            }
        }
        if runs.is_empty() {
            names.sort();
            return Ok(Kids::Mem(names.into_iter()));
        }
        if !names.is_empty() {
            runs.push(spill::write_run(&mut names)?);
        }
        Ok(Kids::Spilled(spill::Merge::new(runs)?))
    }

    /// Children of directory `key`, sorted by key order: directories as `name/`.
    fn children(dir: &Dir, key: &str) -> Result<Vec<(String, cap_std::fs::Metadata)>> {
        let rd = read_level(dir, key)?;
        let mut out = Vec::new();
        for e in rd {
            let e = e?;
            let name = name_of(&e);
            let meta = match e.metadata() {
                Ok(m) => m,
                // Deleted since the directory was read: gone meanwhile, as in `Kids::next`.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("stat {}", show(&name))),
            };
            out.push((
                if meta.is_dir() {
                    format!("{name}/")
                } else {
                    name
                },
                meta,
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Copy a small file from another local directory in one blocking call: open, create the
    /// temporary file (its directory only when missing), copy_file_range, times and
    /// permissions, rename into place. One trip to the blocking pool per file instead of five
    /// is what makes many small files fast. Not synced: the run syncs finished copies in
    /// batches before it records them.
    pub async fn copy_small_from_local(
        &self,
        src: &LocalDir,
        e: &super::Entry,
        perms: bool,
    ) -> Result<()> {
        check_key(&e.key)?;
        let (parent_key, name) = match e.key.trim_end_matches('/').rsplit_once('/') {
            Some((p, n)) => (p.to_string(), n.to_string()),
            None => (String::new(), e.key.trim_end_matches('/').to_string()),
        };
        let cached = self
            .parents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&parent_key)
            .cloned();
        let (sd, root) = (src.dir.clone(), self.dir.clone());
        let (key, size, mtime, mode, owner) = (e.key.clone(), e.size, e.mtime_ns, e.mode, e.owner);
        let pk = parent_key.clone();
        let dir = blocking(move || {
            let mut from = sd
                .open(rel(&key))
                .with_context(|| format!("opening {}", show(&key)))?
                .into_std();
            let dir = match cached {
                Some(d) => d,
                None if pk.is_empty() => root,
                None => {
                    // Made if missing; a link in the way is refused, never followed.
                    sink::create_parents(&root, &pk, &key)?;
                    Arc::new(
                        root.open_dir(rel(&pk))
                            .with_context(|| format!("opening the directory of {}", show(&key)))?,
                    )
                }
            };
            let tmp = super::temp_name(&name);
            let mut to =
                sink::create_temp(&dir, &tmp).with_context(|| format!("copying {}", show(&key)))?;
            let res = (|| -> Result<()> {
                let n = std::io::copy(&mut from, &mut to)?;
                if n != size {
                    bail!(
                        "{} changed while being copied ({n} bytes where {size} were listed)",
                        show(&key)
                    );
                }
                to.set_times(std::fs::FileTimes::new().set_modified(super::system_time(mtime)))?;
                let kept = sink::restore_owner(&to, owner)
                    .with_context(|| format!("giving {} to its owner", show(&key)))?;
                to.set_permissions(std::fs::Permissions::from_mode(sink::final_mode(
                    perms, mode, kept,
                )))?;
                dir.rename(rel(&tmp), &dir, rel(&name))
                    .with_context(|| format!("renaming into place: {}", show(&key)))?;
                Ok(())
            })();
            if res.is_err() {
                let _ = dir.remove_file(rel(&tmp));
            }
            res.map(|()| dir)
        })
        .await?;
        if !parent_key.is_empty() {
            let mut p = self.parents.lock().unwrap_or_else(|p| p.into_inner());
            if p.len() >= PARENTS_MAX {
                p.clear();
            }
            p.entry(parent_key).or_insert(dir);
        }
        Ok(())
    }

    /// Copy a file from another local directory with copy_file_range (the kernel copies; no
    /// bytes pass through user space), in pieces so a rate limit can pace it.
    pub async fn copy_from_local(
        &self,
        src: &LocalDir,
        key: &str,
        size: u64,
        limits: &crate::limits::Limits,
    ) -> Result<Box<dyn Sink>> {
        check_key(key)?;
        let (sd, k) = (src.dir.clone(), key.to_string());
        let from = blocking(move || Ok(sd.open(rel(&k))?.into_std())).await?;
        let mut sink = LocalSink::create(self.dir.clone(), key).await?;
        let mut done = 0u64;
        const PIECE: u64 = 64 << 20;
        let piece = limits.piece(PIECE);
        let res: Result<()> = async {
            while done < size {
                let n = piece.min(size - done);
                limits.bytes(n).await;
                let (mut f, mut t) = (from.try_clone()?, sink.file.try_clone()?);
                let copied = blocking(move || {
                    use std::io::{Read, Seek, SeekFrom};
                    f.seek(SeekFrom::Start(done))?;
                    Ok(std::io::copy(&mut (&mut f).take(n), &mut t)?)
                })
                .await?;
                if copied != n {
                    bail!(
                        "{} changed while being copied (short read at {done})",
                        show(key)
                    );
                }
                done += n;
                if size > PIECE {
                    sink.wrote(n).await?;
                }
            }
            Ok(())
        }
        .await;
        match res {
            Ok(()) => Ok(Box::new(sink)),
            Err(e) => {
                Box::new(sink).abort().await;
                Err(e)
            }
        }
    }
}

/// Entries above which one directory's listing is sorted on disk (JFS_SYNC_SPILL_AT overrides).
fn spill_at() -> usize {
    std::env::var("JFS_SYNC_SPILL_AT")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(100_000)
}

/// One directory being walked: its names in key order, and entries already read (metadata
/// is read in batches, one trip to the blocking pool per batch).
pub struct LocalLevel {
    prefix: String,
    kids: Option<Kids>,
    ready: std::collections::VecDeque<Entry>,
}

#[async_trait]
impl super::walk::Tree for LocalDir {
    type Level = LocalLevel;

    async fn level(&self, prefix: &str) -> Result<LocalLevel> {
        let (dir, p) = (self.dir.clone(), prefix.to_string());
        let kids = blocking(move || Self::kids(&dir, &p)).await?;
        Ok(LocalLevel {
            prefix: prefix.to_string(),
            kids: Some(kids),
            ready: Default::default(),
        })
    }

    async fn next(&self, l: &mut LocalLevel) -> Result<Option<Entry>> {
        if l.ready.is_empty() {
            let Some(mut kids) = l.kids.take() else {
                return Ok(None);
            };
            let (dir, prefix) = (self.dir.clone(), l.prefix.clone());
            let (kids, batch) = blocking(move || {
                let mut batch = Vec::with_capacity(256);
                while batch.len() < 256 {
                    let Some((name, meta)) = kids.next(&dir, &prefix)? else {
                        return Ok((None, batch));
                    };
                    batch.push(entry_at(&dir, format!("{prefix}{name}"), &meta)?);
                }
                Ok((Some(kids), batch))
            })
            .await?;
            l.kids = kids;
            l.ready.extend(batch);
        }
        Ok(l.ready.pop_front())
    }
}

/// The children of one directory, in key order; metadata is read as they are taken.
enum Kids {
    Mem(std::vec::IntoIter<String>),
    Spilled(spill::Merge),
}

impl Kids {
    fn next(&mut self, dir: &Dir, prefix: &str) -> Result<Option<(String, cap_std::fs::Metadata)>> {
        loop {
            let name = match self {
                Kids::Mem(it) => it.next(),
                Kids::Spilled(m) => m.next()?,
            };
            let Some(name) = name else { return Ok(None) };
            let path = format!("{prefix}{}", name.trim_end_matches('/'));
            match dir.symlink_metadata(rel(&path)) {
                Ok(m) if !(m.is_file() || m.is_dir() || m.is_symlink()) => {
                    // Opening a fifo would block the copy forever; sockets and devices have
                    // no content to copy.
                    tracing::warn!(path = %show(&path), "skipped: not a file, directory or symlink (fifo, socket or device node)");
                    continue;
                }
                Ok(m) => return Ok(Some((name, m))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // gone meanwhile
                Err(e) => return Err(e).with_context(|| format!("stat {}", show(&path))),
            }
        }
    }
}

#[async_trait]
impl Endpoint for LocalDir {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    async fn list(&self, l: super::Listing<'_>, tx: mpsc::Sender<Page>) -> Result<()> {
        super::walk::walk(self, l, &tx)
            .await
            .with_context(|| format!("listing {}", self.root.display()))
    }

    async fn list_level(&self, prefix: &str) -> Result<Vec<Entry>> {
        let (dir, p) = (self.dir.clone(), prefix.to_string());
        blocking(move || {
            let rd = read_level(&dir, &p)?;
            if rd.count() > spill_at() {
                return Err(anyhow::Error::new(super::TooWide));
            }
            let mut out = Vec::new();
            for (name, meta) in Self::children(&dir, &p)? {
                out.push(entry_at(&dir, format!("{p}{name}"), &meta)?);
            }
            Ok(out)
        })
        .await
    }

    async fn stat(&self, key: &str) -> Result<Option<Entry>> {
        check_key(key)?;
        let (dir, k) = (self.dir.clone(), key.to_string());
        blocking(move || match dir.symlink_metadata(rel(&k)) {
            Ok(m) => {
                let key = if m.is_dir() && !k.ends_with('/') {
                    format!("{k}/")
                } else {
                    k
                };
                Ok(Some(entry_at(&dir, key, &m)?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("stat {}", show(&k))),
        })
        .await
    }

    async fn read(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        check_key(key)?;
        let (dir, k) = (self.dir.clone(), key.to_string());
        blocking(move || {
            let f = dir
                .open(rel(&k))
                .with_context(|| format!("opening {}", show(&k)))?
                .into_std();
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, offset)
                .with_context(|| format!("reading {} at {offset}", show(&k)))?;
            Ok(Bytes::from(buf))
        })
        .await
    }

    async fn sink(&self, key: &str, _size: u64) -> Result<Box<dyn Sink>> {
        check_key(key)?;
        Ok(Box::new(LocalSink::create(self.dir.clone(), key).await?))
    }

    async fn mkdir(&self, key: &str, src: &Entry, perms: bool) -> Result<()> {
        check_key(key)?;
        let (dir, k, mode, owner) = (self.dir.clone(), key.to_string(), src.mode, src.owner);
        blocking(move || {
            sink::create_parents(&dir, &k, &k)?;
            if let Some((uid, gid)) = owner {
                // Opened inside the destination (cap-std) without following a link there.
                let mut o = cap_std::fs::OpenOptions::new();
                o.read(true).custom_flags(
                    (rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::NOFOLLOW).bits() as i32,
                );
                let d = dir
                    .open_with(rel(&k), &o)
                    .with_context(|| format!("opening {}", show(&k)))?;
                rustix::fs::fchown(
                    &d,
                    Some(rustix::process::Uid::from_raw(uid)),
                    Some(rustix::process::Gid::from_raw(gid)),
                )
                .with_context(|| format!("giving {} to its owner", show(&k)))?;
            }
            // Without --perms, as `cp -r`: never more open than the source directory (a
            // 0700 one stays closed to others), and always the owner's to fill.
            let m = match (perms, mode) {
                (true, Some(m)) => Some(m),
                (false, Some(m)) => Some((m | 0o700) & 0o777 & !sink::umask()),
                (_, None) => None,
            };
            if let Some(m) = m {
                dir.set_permissions(
                    rel(&k),
                    cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(m)),
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn symlink(&self, key: &str, target: &str) -> Result<()> {
        check_key(key)?;
        let (dir, k, t) = (self.dir.clone(), key.to_string(), target.to_string());
        blocking(move || {
            let p = rel(&k);
            if let Some((parent, _)) = k.trim_end_matches('/').rsplit_once('/') {
                sink::create_parents(&dir, parent, &k)?;
            }
            match dir.symlink_metadata(&p) {
                Ok(m) if m.is_dir() => bail!("{} exists as a directory", show(&k)),
                Ok(_) => dir.remove_file(&p)?,
                Err(_) => {}
            }
            dir.symlink_contents(path_of(&t), &p)
                .with_context(|| format!("creating symlink {}", show(&k)))?;
            Ok(())
        })
        .await
    }

    fn as_local(&self) -> Option<&LocalDir> {
        Some(self)
    }

    async fn remove_empty_dir(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let (dir, k) = (self.dir.clone(), key.to_string());
        blocking(move || match dir.remove_dir(rel(&k)) {
            Ok(()) => Ok(true),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::DirectoryNotEmpty
                    || e.raw_os_error() == Some(39) =>
            {
                Ok(false)
            }
            Err(e) => Err(e).with_context(|| format!("removing directory {}", show(&k))),
        })
        .await
    }

    fn durable_later(&self) -> bool {
        true
    }

    /// One `syncfs` of the destination's file system: every file written and renamed so far,
    /// and the directories naming them, reach the disk.
    async fn sync(&self) -> Result<()> {
        // cap-std holds the directory as an O_PATH descriptor, which syncfs refuses: open it
        // for reading (any descriptor on that file system will do).
        let root = self.root.clone();
        blocking(move || {
            let d = std::fs::File::open(&root)
                .with_context(|| format!("opening {} to sync it", root.display()))?;
            rustix::fs::syncfs(&d)
                .with_context(|| format!("syncing the file system of {}", root.display()))
        })
        .await
    }

    async fn delete(&self, key: &str, kind: Kind) -> Result<()> {
        check_key(key)?;
        let (dir, k) = (self.dir.clone(), key.to_string());
        blocking(move || {
            let r = if kind == Kind::Dir {
                dir.remove_dir(rel(&k))
            } else {
                dir.remove_file(rel(&k))
            };
            match r {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("deleting {}", show(&k)))
                }
                _ => Ok(()),
            }
        })
        .await
    }
}
