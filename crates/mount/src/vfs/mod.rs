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

mod dirs;
mod files;
mod names;
pub mod passthrough;

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
        ErrorKind::NoSpace => {
            tracing::warn!(error = %e, "operation failed: ENOSPC");
            libc::ENOSPC
        }
        _ => {
            tracing::warn!(error = %e, "operation failed: EIO");
            libc::EIO
        }
    }
}

fn err(e: fs_core::Error) -> Errno {
    errno(&e)
}

/// The most parents walked to name a file in a log line.
const PATH_DEPTH: usize = 256;

/// How a log line names `ino`: its path, shell-escaped as `jfs ls` prints names (a name may
/// hold any byte but `/` and NUL), or "inode N (path unknown)" when it cannot be told (an
/// unlinked file held open, a rename meanwhile, a tree deeper than `PATH_DEPTH`, a failed
/// read). Lines give it beside the inode number. It lists each parent directory: for lines
/// about failures only.
pub async fn describe(fs: &Fs, ino: Ino) -> String {
    match fs.path_bytes_of(ino, PATH_DEPTH).await {
        Some(p) => cli_common::names::quote(&p),
        None => format!("inode {ino} (path unknown)"),
    }
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
    /// Its opens in caching and in passthrough mode (see `passthrough`).
    io: Mutex<passthrough::IoState>,
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
    mode: Mutex<passthrough::IoMode>,
    /// Bytes read through this handle.
    read_bytes: AtomicU64,
}

pub struct Vfs {
    pub fs: Arc<Fs>,
    pub cfg: VfsConfig,
    pub budget: Budget,
    /// Block buffers for writers, reused (see `fs_core::BlockPool`).
    blocks: Arc<fs_core::BlockPool>,
    pub metrics: Arc<MountMetrics>,
    open: Arc<OpenFiles>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<(Vec<u8>, Ino, FileKind)>>>>,
    next_fh: AtomicU64,
    lookups: Mutex<HashMap<Ino, u64>>,
    seen: Mutex<HashMap<Ino, (i64, u64, Instant)>>,
    pub freshness: Arc<Freshness>,
    /// The latest commit failure of each inode (the cause behind an EIO), newest last; a
    /// writer that got EIO asks for it through the control socket (`Request::WriteError`).
    write_errors: Mutex<std::collections::VecDeque<(Ino, String)>>,
    /// FUSE passthrough of files held whole in the local cache (none: no cache, or off).
    pub pt: Option<Arc<passthrough::Passthrough>>,
}

/// How many inodes' latest commit failures are remembered.
const WRITE_ERRORS_MAX: usize = 1024;

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
    /// Answer with this backing file (FUSE passthrough).
    pub passthrough: Option<passthrough::PtOpen>,
    /// A file opened again unchanged with no whole-file copy yet: worth making one (the
    /// kernel may serve this open from its page cache, so no read would show it is hot).
    pub copy_whole: bool,
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
        let bs = fs.settings().block_size as usize;
        // Kept for reuse: up to 8 blocks, within the write budget.
        let keep = ((cfg.buffer_size as usize) / bs).min(8);
        Vfs {
            blocks: fs_core::BlockPool::new(bs, keep),
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
            write_errors: Default::default(),
            pt: None,
        }
    }

    /// Hand read-only opens of files held whole in `cache` to the kernel (see
    /// `passthrough`).
    pub fn with_passthrough(mut self, cache: Arc<volume::DiskCache>) -> Vfs {
        self.pt = Some(Arc::new(passthrough::Passthrough::new(cache)));
        self
    }

    /// Remember why a commit of `ino` failed (the errno the writer got says only EIO).
    fn note_write_error(&self, ino: Ino, e: &str) {
        let mut q = self.write_errors.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|(i, _)| *i != ino);
        if q.len() >= WRITE_ERRORS_MAX {
            q.pop_front();
        }
        q.push_back((ino, e.to_string()));
    }

    /// Why the latest commit of `ino` failed, if one did.
    pub fn write_error(&self, ino: Ino) -> Option<String> {
        let q = self.write_errors.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .rev()
            .find(|(i, _)| *i == ino)
            .map(|(_, e)| e.clone())
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
        // A directory this mount just changed: the attributes its own commit left.
        if let Some(a) = self.fs.recent_dir_attr(ino) {
            return Ok((a, 0));
        }
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
}
