//! The file system a mount serves, independent of FUSE: every operation goes through fs-core
//! and answers with an errno on failure. The FUSE adapter (`fuse.rs`) only converts types.
//!
//! State kept here:
//! - the open-file table (`OpenFiles`, also fs-core's `Keeper`): per open inode, its handle
//!   count, its write buffer and a generation bumped at every commit, so that readers drop
//!   what they hold when the file changed under them;
//! - handles: per open file, a `FileReader` (read-ahead, held blocks) made on first read;
//! - directory snapshots taken at opendir (offsets are positions in the snapshot);
//! - lookup counts (entries handed to the kernel, minus forgets);
//! - per inode, (mtime, length) seen at the last open, for FOPEN_KEEP_CACHE.

use crate::metrics::MountMetrics;
use crate::writer::Writer;
use fs_core::{
    Attr, Budget, DirEntry, ErrorKind, FileKind, FileReader, Fs, Ino, Keeper, Owner, ReadAhead,
    SetAttr,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type Errno = i32;
pub type VResult<T> = std::result::Result<T, Errno>;

/// The errno an fs-core error stands for.
pub fn errno(e: &fs_core::Error) -> Errno {
    match e.kind() {
        ErrorKind::NotFound => libc::ENOENT,
        ErrorKind::AlreadyExists => libc::EEXIST,
        ErrorKind::NotDir => libc::ENOTDIR,
        ErrorKind::IsDir => libc::EISDIR,
        ErrorKind::NotEmpty => libc::ENOTEMPTY,
        ErrorKind::InvalidArgument => libc::EINVAL,
        ErrorKind::NameTooLong => libc::ENAMETOOLONG,
        ErrorKind::NoData => libc::ENODATA,
        ErrorKind::PermissionDenied => libc::EPERM,
        ErrorKind::ReadOnly => libc::EROFS,
        ErrorKind::Busy => libc::EBUSY,
        _ => {
            tracing::warn!(error = %e, "operation failed");
            libc::EIO
        }
    }
}

fn err(e: fs_core::Error) -> Errno {
    errno(&e)
}

#[derive(Debug, Clone)]
pub struct VfsConfig {
    pub read_only: bool,
    /// The largest read-ahead window of one file.
    pub max_readahead: u64,
    /// Memory for write buffers and read-ahead.
    pub buffer_size: u64,
    /// How long an open may trust the previous open's attributes without asking the
    /// metadata (0: always ask).
    pub open_cache: Duration,
    /// A mirror site: an open pins the version it opened (every chunk record read at open).
    pub pin_versions: bool,
    /// A mirror site: what opens do while the mirror is out of its consistency window.
    pub stale: Stale,
}

/// The staleness policy of a mirror-site mount (`--stale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stale {
    /// Serve the state applied so far (counted).
    #[default]
    Serve,
    /// Wait up to this long for the mirror to be within its window, then serve; fail (EIO)
    /// if it is not by then.
    Wait(Duration),
    /// Fail opens (EIO) while the mirror is out of its window.
    Fail,
}

impl std::str::FromStr for Stale {
    type Err = String;
    fn from_str(s: &str) -> Result<Stale, String> {
        match s {
            "serve" => Ok(Stale::Serve),
            "fail" => Ok(Stale::Fail),
            "wait" => Ok(Stale::Wait(Duration::from_secs(10))),
            _ => match s.strip_prefix("wait=") {
                Some(d) => humantime::parse_duration(d)
                    .map(Stale::Wait)
                    .map_err(|e| format!("--stale wait={d}: {e}")),
                None => Err(format!(
                    "--stale {s:?}: give serve, fail, wait or wait=DURATION (e.g. wait=30s)"
                )),
            },
        }
    }
}

/// Whether the mirror is within its consistency window, as its agent last said.
#[derive(Default)]
pub struct Freshness {
    stale: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

impl Freshness {
    pub fn set_stale(&self, stale: bool) {
        if self.stale.swap(stale, Ordering::SeqCst) != stale {
            self.changed.notify_waiters();
        }
    }
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }
}

/// One open inode of this mount.
pub struct Node {
    pub ino: Ino,
    opens: AtomicU64,
    /// fs-core asked whether to keep this inode at its last unlink (so it may be kept).
    maybe_kept: std::sync::atomic::AtomicBool,
    pub writer: tokio::sync::Mutex<Writer>,
    /// Bumped whenever this mount changed the file's data (commit, truncate).
    pub gen: AtomicU64,
    /// A mirror site: the attributes of the version opened, answered while it stays open
    /// after the agent applied its deletion.
    pinned: Mutex<Option<Attr>>,
}

/// The open-file table: fs-core asks it whether an unlinked inode must be kept.
pub struct OpenFiles {
    nodes: Mutex<HashMap<Ino, Arc<Node>>>,
    session: String,
}

impl OpenFiles {
    pub fn new(session: String) -> Arc<OpenFiles> {
        Arc::new(OpenFiles {
            nodes: Mutex::new(HashMap::new()),
            session,
        })
    }
    fn get(&self, ino: Ino) -> Option<Arc<Node>> {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ino)
            .cloned()
    }
}

impl Keeper for OpenFiles {
    fn is_open(&self, ino: Ino) -> bool {
        self.get(ino).is_some_and(|n| {
            let open = n.opens.load(Ordering::SeqCst) > 0;
            if open {
                n.maybe_kept.store(true, Ordering::SeqCst);
            }
            open
        })
    }
    fn session(&self) -> &str {
        &self.session
    }
}

pub struct Handle {
    pub ino: Ino,
    node: Arc<Node>,
    reader: tokio::sync::Mutex<Option<(u64, Arc<FileReader>)>>,
    /// Reader statistics already added to the metrics.
    counted: Mutex<fs_core::fs::ReadStats>,
}

pub struct Vfs {
    pub fs: Arc<Fs>,
    pub cfg: VfsConfig,
    pub budget: Budget,
    pub metrics: Arc<MountMetrics>,
    open: Arc<OpenFiles>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<(Vec<u8>, Ino, FileKind)>>>>,
    next_fh: AtomicU64,
    lookups: Mutex<HashMap<Ino, u64>>,
    seen: Mutex<HashMap<Ino, (i64, u64, Instant)>>,
    pub freshness: Arc<Freshness>,
}

/// How many inodes' last-open attributes are remembered for FOPEN_KEEP_CACHE.
const SEEN_MAX: usize = 200_000;
pub const NAME_MAX: usize = 255;

fn check_name(name: &[u8]) -> VResult<()> {
    if name.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    Ok(())
}

/// What `open` answers.
pub struct Opened {
    pub fh: u64,
    pub keep_cache: bool,
}

impl Vfs {
    pub fn new(
        fs: Arc<Fs>,
        open: Arc<OpenFiles>,
        cfg: VfsConfig,
        metrics: Arc<MountMetrics>,
    ) -> Vfs {
        let budget = Budget::new(cfg.buffer_size);
        metrics.buffer_size.set(budget.total() as i64);
        Vfs {
            fs,
            cfg,
            budget,
            metrics,
            open,
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            lookups: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            freshness: Default::default(),
        }
    }

    /// The staleness policy, at an open: serve (counted), wait for the window, or fail.
    async fn fresh_gate(&self) -> VResult<()> {
        let f = &self.freshness;
        if !f.is_stale() {
            return Ok(());
        }
        match self.cfg.stale {
            Stale::Serve => {
                self.metrics.stale_opens.inc();
                Ok(())
            }
            Stale::Fail => {
                self.metrics.stale_refused.inc();
                Err(libc::EIO)
            }
            Stale::Wait(d) => {
                let deadline = tokio::time::Instant::now() + d;
                while f.is_stale() {
                    let n = f.changed.notified();
                    if !f.is_stale() {
                        break;
                    }
                    if tokio::time::timeout_at(deadline, n).await.is_err() {
                        self.metrics.stale_refused.inc();
                        return Err(libc::EIO);
                    }
                }
                Ok(())
            }
        }
    }

    fn rw(&self) -> VResult<()> {
        if self.cfg.read_only {
            Err(libc::EROFS)
        } else {
            Ok(())
        }
    }

    fn counted_lookup(&self, ino: Ino) {
        *self
            .lookups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ino)
            .or_default() += 1;
    }

    pub fn forget(&self, ino: Ino, n: u64) {
        let mut l = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = l.get_mut(&ino) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                l.remove(&ino);
            }
        }
    }

    /// Inodes the kernel holds references to.
    pub fn known_inodes(&self) -> usize {
        self.lookups.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Attributes as this mount sees them: the length includes buffered writes.
    async fn attr_of(&self, ino: Ino, mut a: Attr) -> Attr {
        if let Some(n) = self.open.get(ino) {
            let w = n.writer.lock().await;
            a.length = a.length.max(w.end());
        }
        a
    }

    pub async fn getattr(&self, ino: Ino) -> VResult<(Attr, u32)> {
        let a = match self.fs.getattr(ino).await {
            Ok(a) => a,
            Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.pin_versions => {
                // Deleted at the primary, still open here: the version this mount pinned.
                let pinned = self
                    .open
                    .get(ino)
                    .and_then(|n| n.pinned.lock().unwrap_or_else(|p| p.into_inner()).clone());
                match pinned {
                    Some(a) => a,
                    // Not open here: the kernel looked the name up before the deletion was
                    // applied; ESTALE makes it look the name up again.
                    None => return Err(libc::ESTALE),
                }
            }
            Err(e) => return Err(err(e)),
        };
        let rdev = self.rdev_of(ino, &a).await?;
        Ok((self.attr_of(ino, a).await, rdev))
    }

    async fn rdev_of(&self, ino: Ino, a: &Attr) -> VResult<u32> {
        if matches!(a.kind, FileKind::CharDev | FileKind::BlockDev) {
            self.fs.rdev(ino).await.map_err(err)
        } else {
            Ok(0)
        }
    }

    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> VResult<(Ino, Attr, u32)> {
        check_name(name)?;
        let mut r = self.fs.lookup(parent, name).await;
        // A mirror's agent may delete the inode a name pointed to between the two reads of a
        // lookup (the file replaced by rename at the primary): read the name again.
        for _ in 0..3 {
            match &r {
                Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.pin_versions => {
                    r = self.fs.lookup(parent, name).await;
                }
                _ => break,
            }
        }
        let (ino, a) = r.map_err(err)?;
        let rdev = self.rdev_of(ino, &a).await?;
        let a = self.attr_of(ino, a).await;
        self.counted_lookup(ino);
        Ok((ino, a, rdev))
    }

    /// The owner of a new node: the caller, with the group of a set-gid parent.
    async fn owner_for(&self, parent: Ino, uid: u32, gid: u32) -> VResult<(Owner, bool)> {
        let p = self.fs.getattr(parent).await.map_err(err)?;
        if p.mode & libc::S_ISGID != 0 {
            Ok((Owner { uid, gid: p.gid }, true))
        } else {
            Ok((Owner { uid, gid }, false))
        }
    }

    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr, u32)> {
        self.rw()?;
        check_name(name)?;
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            libc::S_IFDIR => return Err(libc::EINVAL),
            _ => return Err(libc::EINVAL),
        };
        let (owner, _) = self.owner_for(parent, uid, gid).await?;
        let (ino, a) = self
            .fs
            .mknod(parent, name, kind, mode & 0o7777, rdev, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a, rdev))
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr)> {
        self.rw()?;
        check_name(name)?;
        let (owner, sgid) = self.owner_for(parent, uid, gid).await?;
        let mode = (mode & 0o7777) | if sgid { libc::S_ISGID } else { 0 };
        let (ino, a) = self
            .fs
            .mkdir(parent, name, mode, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a))
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr)> {
        self.rw()?;
        check_name(name)?;
        if target.len() > 4095 {
            return Err(libc::ENAMETOOLONG);
        }
        let (owner, _) = self.owner_for(parent, uid, gid).await?;
        let (ino, a) = self
            .fs
            .symlink(parent, name, target, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a))
    }

    pub async fn readlink(&self, ino: Ino) -> VResult<Vec<u8>> {
        self.fs.readlink(ino).await.map_err(err)
    }

    pub async fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> VResult<(Attr, u32)> {
        self.rw()?;
        check_name(name)?;
        let a = self.fs.link(ino, parent, name).await.map_err(|e| {
            if e.kind() == ErrorKind::IsDir {
                libc::EPERM
            } else {
                err(e)
            }
        })?;
        let rdev = self.rdev_of(ino, &a).await?;
        let a = self.attr_of(ino, a).await;
        self.counted_lookup(ino);
        Ok((a, rdev))
    }

    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        self.fs.unlink(parent, name).await.map_err(err)
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        if name == b"." {
            return Err(libc::EINVAL);
        }
        if name == b".." {
            return Err(libc::ENOTEMPTY);
        }
        self.fs.rmdir(parent, name).await.map_err(err)
    }

    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        check_name(new_name)?;
        if flags & !libc::RENAME_NOREPLACE != 0 {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported by the format.
            return Err(libc::EINVAL);
        }
        self.fs
            .rename(
                parent,
                name,
                new_parent,
                new_name,
                flags & libc::RENAME_NOREPLACE != 0,
            )
            .await
            .map_err(err)
    }

    /// Flush the write buffer of `ino` if this mount has one dirty. Errors are EIO.
    pub async fn flush_ino(&self, ino: Ino) -> VResult<()> {
        let Some(n) = self.open.get(ino) else {
            return Ok(());
        };
        let mut w = n.writer.lock().await;
        let r = w.flush().await;
        let c = w.take_committed();
        drop(w);
        if c > 0 {
            n.gen.fetch_add(1, Ordering::SeqCst);
            self.metrics.slices_committed.inc_by(c);
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        r.map_err(|e| {
            self.metrics.write_errors.inc();
            tracing::error!(ino, error = %e, "flush failed: EIO");
            libc::EIO
        })
    }

    pub async fn setattr(&self, ino: Ino, set: SetAttr) -> VResult<(Attr, u32)> {
        self.rw()?;
        if let Some(len) = set.length {
            self.flush_ino(ino).await?;
            if let Some(n) = self.open.get(ino) {
                n.writer.lock().await.truncated(len);
            }
        }
        let a = self.fs.setattr(ino, &set).await.map_err(|e| {
            if e.kind() == ErrorKind::InvalidArgument && set.length.is_some() {
                if set.length.unwrap_or(0) > fs_core::MAX_FILE_LEN {
                    libc::EFBIG
                } else {
                    libc::EINVAL
                }
            } else {
                err(e)
            }
        })?;
        if set.length.is_some() {
            if let Some(n) = self.open.get(ino) {
                n.gen.fetch_add(1, Ordering::SeqCst);
            }
        }
        let rdev = self.rdev_of(ino, &a).await?;
        Ok((self.attr_of(ino, a).await, rdev))
    }

    fn node_open(&self, ino: Ino) -> Arc<Node> {
        let mut m = self.open.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let n = m
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(Node {
                    ino,
                    opens: AtomicU64::new(0),
                    maybe_kept: Default::default(),
                    writer: tokio::sync::Mutex::new(Writer::new(
                        self.fs.clone(),
                        ino,
                        self.budget.clone(),
                    )),
                    gen: AtomicU64::new(0),
                    pinned: Mutex::new(None),
                })
            })
            .clone();
        n.opens.fetch_add(1, Ordering::SeqCst);
        n
    }

    fn new_handle(&self, ino: Ino) -> u64 {
        let node = self.node_open(ino);
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                fh,
                Arc::new(Handle {
                    ino,
                    node,
                    reader: tokio::sync::Mutex::new(None),
                    counted: Default::default(),
                }),
            );
        self.metrics.open_handles.inc();
        fh
    }

    fn handle(&self, fh: u64) -> VResult<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    /// Whether the page cache of `ino` may be kept: unchanged since the previous open.
    fn keep_cache(&self, ino: Ino, a: &Attr) -> bool {
        let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() >= SEEN_MAX {
            s.clear();
        }
        let prev = s.insert(ino, (a.mtime, a.length, Instant::now()));
        prev.is_some_and(|(m, l, _)| m == a.mtime && l == a.length)
    }

    pub async fn open(&self, ino: Ino, flags: i32) -> VResult<Opened> {
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.rw()?;
        }
        self.fresh_gate().await?;
        // --open-cache: a recent open's attributes are trusted without a metadata read.
        if !self.cfg.open_cache.is_zero() {
            let recent = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&ino)
                .is_some_and(|(_, _, t)| t.elapsed() < self.cfg.open_cache);
            if recent && self.open.get(ino).is_none() {
                return Ok(Opened {
                    fh: self.new_handle(ino),
                    keep_cache: true,
                });
            }
        }
        let a = match self.fs.getattr(ino).await {
            Ok(a) => a,
            // At a mirror the agent may have applied the inode's deletion since the kernel
            // looked its name up (a file replaced by rename at the primary): ESTALE makes
            // the kernel look the name up again and open what it names now.
            Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.pin_versions => {
                return Err(libc::ESTALE)
            }
            Err(e) => return Err(err(e)),
        };
        match a.kind {
            FileKind::Dir => return Err(libc::EISDIR),
            FileKind::File => {}
            _ => return Err(libc::ENXIO),
        }
        let keep_cache = self.keep_cache(ino, &a);
        let fh = self.new_handle(ino);
        if self.cfg.pin_versions {
            let pinned = async {
                let h = self.handle(fh)?;
                let rd = match self.reader(&h).await {
                    Err(libc::ENOENT) => return Err(libc::ESTALE),
                    r => r?,
                };
                match rd.pin().await {
                    Err(e) if e.kind() == ErrorKind::NotFound => Err(libc::ESTALE),
                    r => r.map_err(err),
                }
            }
            .await;
            if let Err(e) = pinned {
                let _ = self.release(fh).await;
                return Err(e);
            }
            if let Some(n) = self.open.get(ino) {
                *n.pinned.lock().unwrap_or_else(|p| p.into_inner()) = Some(a.clone());
            }
        }
        Ok(Opened { fh, keep_cache })
    }

    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr, u64)> {
        self.rw()?;
        check_name(name)?;
        let (owner, _) = self.owner_for(parent, uid, gid).await?;
        let (ino, a) = match self.fs.create(parent, name, mode & 0o7777, owner).await {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::AlreadyExists && flags & libc::O_EXCL == 0 => {
                // Created by another client between the kernel's lookup and now: open it.
                let (ino, a) = self.fs.lookup(parent, name).await.map_err(err)?;
                if a.kind != FileKind::File {
                    return Err(libc::EISDIR);
                }
                (ino, a)
            }
            Err(e) => return Err(err(e)),
        };
        self.counted_lookup(ino);
        self.keep_cache(ino, &a);
        let fh = self.new_handle(ino);
        Ok((ino, a, fh))
    }

    async fn reader(&self, h: &Handle) -> VResult<Arc<FileReader>> {
        let gen = h.node.gen.load(Ordering::SeqCst);
        let mut r = h.reader.lock().await;
        if let Some((g, rd)) = r.as_ref() {
            if *g == gen {
                return Ok(rd.clone());
            }
        }
        let rd = Arc::new(
            FileReader::new(
                self.fs.clone(),
                h.ino,
                ReadAhead {
                    max_window: self.cfg.max_readahead,
                    budget: Some(self.budget.clone()),
                },
            )
            .await
            .map_err(err)?,
        );
        *r = Some((gen, rd.clone()));
        Ok(rd)
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> VResult<bytes::Bytes> {
        let h = self.handle(fh)?;
        // Buffered writes of this file are committed first, so reads see them.
        let dirty = h.node.writer.lock().await.dirty();
        if dirty {
            self.flush_ino(h.ino).await?;
        }
        let rd = self.reader(&h).await?;
        let data = rd.read(offset, size as usize).await.map_err(err)?;
        self.metrics.read_bytes.inc_by(data.len() as u64);
        let st = rd.stats();
        {
            let mut c = h.counted.lock().unwrap_or_else(|p| p.into_inner());
            self.metrics
                .blocks_fetched
                .inc_by(st.fetched.saturating_sub(c.fetched));
            self.metrics
                .blocks_reused
                .inc_by(st.reused.saturating_sub(c.reused));
            self.metrics
                .readahead_hits
                .inc_by(st.ahead_hits.saturating_sub(c.ahead_hits));
            *c = st;
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        Ok(data)
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> VResult<u32> {
        self.rw()?;
        let h = self.handle(fh)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > fs_core::MAX_FILE_LEN)
        {
            return Err(libc::EFBIG);
        }
        let mut w = h.node.writer.lock().await;
        let r = w.write(offset, data).await;
        let c = w.take_committed();
        drop(w);
        if c > 0 {
            h.node.gen.fetch_add(1, Ordering::SeqCst);
            self.metrics.slices_committed.inc_by(c);
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        match r {
            Ok(()) => {
                self.metrics.write_bytes.inc_by(data.len() as u64);
                Ok(data.len() as u32)
            }
            Err(e) => {
                tracing::error!(ino = h.ino, error = %e, "write failed: EIO");
                self.metrics.write_errors.inc();
                Err(libc::EIO)
            }
        }
    }

    pub async fn flush(&self, fh: u64) -> VResult<()> {
        let h = self.handle(fh)?;
        self.flush_ino(h.ino).await
    }

    pub async fn fsync(&self, fh: u64) -> VResult<()> {
        self.flush(fh).await
    }

    /// Close a handle: commit its file's buffer; at the last close of an inode unlinked while
    /// open, free it.
    pub async fn release(&self, fh: u64) -> VResult<()> {
        let h = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
            .ok_or(libc::EBADF)?;
        self.metrics.open_handles.dec();
        let r = self.flush_ino(h.ino).await;
        let last = {
            let mut m = self.open.nodes.lock().unwrap_or_else(|p| p.into_inner());
            let left = h.node.opens.fetch_sub(1, Ordering::SeqCst) - 1;
            if left == 0 {
                m.remove(&h.ino);
            }
            left == 0
        };
        // Only an inode fs-core kept for this mount needs freeing (release_kept is a no-op
        // when the last unlink did not keep it after all).
        if last && h.node.maybe_kept.load(Ordering::SeqCst) {
            if let Err(e) = self.fs.release_kept(h.ino).await {
                tracing::warn!(ino = h.ino, error = %e, "freeing an unlinked file at its last close failed; gc frees it once this session ends");
            }
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        r
    }

    pub async fn opendir(&self, ino: Ino) -> VResult<u64> {
        self.fresh_gate().await?;
        let a = self.fs.getattr(ino).await.map_err(err)?;
        if a.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        let entries: Vec<DirEntry> = self.fs.readdir_all(ino).await.map_err(err)?;
        let mut v = Vec::with_capacity(entries.len() + 2);
        v.push((b".".to_vec(), ino, FileKind::Dir));
        let parent = if ino == fs_core::ROOT_INO {
            ino
        } else {
            a.parent
        };
        v.push((b"..".to_vec(), parent, FileKind::Dir));
        v.extend(entries.into_iter().map(|e| (e.name, e.ino, e.kind)));
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(v));
        Ok(fh)
    }

    /// Entries of a directory handle from position `offset`.
    pub fn dir_entries(&self, fh: u64) -> VResult<Arc<Vec<(Vec<u8>, Ino, FileKind)>>> {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    /// Attributes of a directory entry for readdirplus (counted as a lookup).
    pub async fn entry_attr(&self, ino: Ino) -> VResult<(Attr, u32)> {
        let r = self.getattr(ino).await?;
        self.counted_lookup(ino);
        Ok(r)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
    }

    pub async fn statfs(&self) -> VResult<fs_core::StatFs> {
        self.fs.statfs().await.map_err(err)
    }

    fn check_xattr_name(name: &[u8]) -> VResult<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(libc::ERANGE);
        }
        // ACLs and capabilities are not kept by the format.
        if name.starts_with(b"system.") || name.starts_with(b"security.") {
            return Err(libc::EOPNOTSUPP);
        }
        Ok(())
    }

    pub async fn getxattr(&self, ino: Ino, name: &[u8]) -> VResult<Vec<u8>> {
        Self::check_xattr_name(name).map_err(|e| {
            if e == libc::EOPNOTSUPP {
                libc::ENODATA
            } else {
                e
            }
        })?;
        self.fs.getxattr(ino, name).await.map_err(err)
    }

    pub async fn listxattr(&self, ino: Ino) -> VResult<Vec<u8>> {
        let names = self.fs.listxattr(ino).await.map_err(err)?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> VResult<()> {
        self.rw()?;
        Self::check_xattr_name(name)?;
        if value.len() > 65536 {
            return Err(libc::E2BIG);
        }
        if flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            let exists = match self.fs.getxattr(ino, name).await {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::NoData => false,
                Err(e) => return Err(err(e)),
            };
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(libc::ENODATA);
            }
        }
        self.fs.setxattr(ino, name, value).await.map_err(err)
    }

    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        Self::check_xattr_name(name).map_err(|e| {
            if e == libc::EOPNOTSUPP {
                libc::ENODATA
            } else {
                e
            }
        })?;
        self.fs.removexattr(ino, name).await.map_err(err)
    }

    /// access(2) for a caller (used only when the kernel asks; with default_permissions it
    /// checks modes itself).
    pub async fn access(&self, ino: Ino, mask: i32, uid: u32, gid: u32) -> VResult<()> {
        let a = self.fs.getattr(ino).await.map_err(err)?;
        if mask & libc::W_OK != 0 && self.cfg.read_only {
            return Err(libc::EROFS);
        }
        if mask == libc::F_OK {
            return Ok(());
        }
        let bits = if uid == 0 {
            let x = if mask & libc::X_OK != 0 && a.kind != FileKind::Dir && a.mode & 0o111 == 0 {
                0
            } else {
                1
            };
            0o6 | x
        } else if uid == a.uid {
            (a.mode >> 6) & 7
        } else if gid == a.gid {
            (a.mode >> 3) & 7
        } else {
            a.mode & 7
        };
        if (mask as u32) & !bits & 7 != 0 {
            Err(libc::EACCES)
        } else {
            Ok(())
        }
    }

    /// fallocate mode 0 (and KEEP_SIZE, which has nothing to do): extends the file.
    pub async fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> VResult<()> {
        self.rw()?;
        let h = self.handle(fh)?;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
        if end > fs_core::MAX_FILE_LEN {
            return Err(libc::EFBIG);
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Ok(());
        }
        self.flush_ino(h.ino).await?;
        let a = self.fs.getattr(h.ino).await.map_err(err)?;
        if end > a.length {
            self.setattr(
                h.ino,
                SetAttr {
                    length: Some(end),
                    ..Default::default()
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Commit every write buffer (unmount, SIGTERM).
    pub async fn flush_all(&self) {
        let nodes: Vec<Ino> = self
            .open
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        for ino in nodes {
            let _ = self.flush_ino(ino).await;
        }
    }
}
