//! FUSE passthrough: a read-only open of a file held whole in the local cache (a
//! `volume::DiskCache` whole-file entry of the file's current content version) is answered
//! with that local file, and the kernel serves reads and mmap from it without asking the
//! mount.
//!
//! The kernel's rules (fs/fuse/iomode.c) shape the state kept per open inode (`IoState`):
//! while any open of an inode is in passthrough, every new open of it must be in passthrough
//! with the same backing file (else the open fails with EIO), and a passthrough open fails
//! while an open in caching mode exists. So:
//! - an inode with caching opens gets no passthrough open until they are all released (the
//!   kernel drops its count before it sends the release, so ours is never below its own);
//! - an inode in passthrough answers every further open with its backing file: a read-only
//!   open of the same content version plainly; any other (a writer, or a reader after the
//!   content changed) with FOPEN_DIRECT_IO as well, so that its reads and writes come to the
//!   mount (the current version). Only an mmap by such a later open maps the backing file,
//!   the version the inode's first passthrough open saw, until those opens are closed.
//!
//! Whole-file entries are made in the background from bytes read through the checked read
//! path: after `jfs warmup` of a file, and when a handle that read a whole file is closed.
//! An entry found at start (made by an earlier process) is checked against its CRCs before
//! its first hand-off.

use super::*;
use std::collections::HashSet;
use volume::DiskCache;

/// Files smaller than this are not copied whole (their reads are few and the copy would
/// double the small-file work).
pub const MIN_WHOLE: u64 = 4 << 20;
/// How many checked entries are remembered (past it, entries are checked again).
const VERIFIED_MAX: usize = 100_000;

/// The local file one inode's passthrough opens share. The FUSE adapter registers it with
/// the kernel once (its backing id lives in `id`, dropped with this).
pub struct Backing {
    pub file: std::fs::File,
    version: Vec<u8>,
    pub id: Mutex<Option<Result<Arc<dyn std::any::Any + Send + Sync>, ()>>>,
}

/// How one inode is open at this mount, as the kernel sees it.
#[derive(Default)]
pub struct IoState {
    cached: u64,
    passthrough: u64,
    backing: Option<Arc<Backing>>,
}

/// How one handle was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    Cached,
    Passthrough,
}

/// The mount's passthrough state.
pub struct Passthrough {
    cache: Arc<DiskCache>,
    enabled: std::sync::atomic::AtomicBool,
    /// Entries checked against their CRCs in this process: (inode, content version).
    verified: Mutex<HashSet<(Ino, Vec<u8>)>>,
    /// Inodes whose whole-file entry is being made.
    making: Mutex<HashSet<Ino>>,
}

impl Passthrough {
    pub fn new(cache: Arc<DiskCache>) -> Passthrough {
        Passthrough {
            cache,
            enabled: true.into(),
            verified: Default::default(),
            making: Default::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Turn passthrough off for the rest of this mount, saying why once.
    pub fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::SeqCst) {
            tracing::warn!("FUSE passthrough is off: {why}; reads go through the mount");
        }
    }
}

/// What an open answers about passthrough: the backing file, and whether reads and writes
/// still come to the mount (FOPEN_DIRECT_IO beside FOPEN_PASSTHROUGH).
pub struct PtOpen {
    pub backing: Arc<Backing>,
    pub direct: bool,
}

impl Vfs {
    /// Whether an open of `ino` may find a whole-file entry (so its attributes must be
    /// read, not trusted from `--open-cache`).
    pub(super) fn whole_candidate(&self, ino: Ino) -> bool {
        self.pt
            .as_ref()
            .is_some_and(|p| p.enabled() && p.cache.has_whole(ino))
    }

    /// Count a new handle of `node` and decide its io mode. `entry`: the whole-file entry of
    /// `version` if one was found for this (read-only) open. `read_only`: the open's flags.
    pub(super) fn choose_io(
        &self,
        node: &Node,
        read_only: bool,
        version: Option<Vec<u8>>,
        entry: Option<std::fs::File>,
    ) -> (IoMode, Option<PtOpen>) {
        let mut io = node.io.lock().unwrap_or_else(|p| p.into_inner());
        if io.passthrough > 0 {
            let b = io
                .backing
                .clone()
                .expect("an inode in passthrough has its backing");
            io.passthrough += 1;
            let same = read_only && version.as_deref() == Some(&b.version[..]);
            return (
                IoMode::Passthrough,
                Some(PtOpen {
                    backing: b,
                    direct: !same,
                }),
            );
        }
        if let (Some(file), Some(version), 0) = (entry, version, io.cached) {
            let b = Arc::new(Backing {
                file,
                version,
                id: Mutex::new(None),
            });
            io.backing = Some(b.clone());
            io.passthrough = 1;
            return (
                IoMode::Passthrough,
                Some(PtOpen {
                    backing: b,
                    direct: false,
                }),
            );
        }
        io.cached += 1;
        (IoMode::Cached, None)
    }

    /// A handle released, or one whose passthrough the kernel refused (`refused`: it goes on
    /// in caching mode).
    pub(super) fn io_done(&self, node: &Node, mode: IoMode, refused: bool) {
        let mut io = node.io.lock().unwrap_or_else(|p| p.into_inner());
        match mode {
            IoMode::Cached => io.cached -= 1,
            IoMode::Passthrough => {
                io.passthrough -= 1;
                if io.passthrough == 0 {
                    io.backing = None;
                }
                if refused {
                    io.cached += 1;
                }
            }
        }
    }

    /// The FUSE adapter could not register a backing file (`e`: the kernel's answer): the
    /// handle goes on in caching mode, and passthrough is off from now on (no rights, or a
    /// kernel that refuses it).
    pub fn passthrough_refused(&self, fh: u64, e: &std::io::Error) {
        if let Some(p) = &self.pt {
            p.disable(&format!(
                "the kernel refused a backing file ({e}; it needs root, CAP_SYS_ADMIN)"
            ));
        }
        let h = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned();
        if let Some(h) = h {
            let was = std::mem::replace(
                &mut *h.mode.lock().unwrap_or_else(|p| p.into_inner()),
                IoMode::Cached,
            );
            if was == IoMode::Passthrough {
                self.io_done(&h.node, IoMode::Passthrough, true);
            }
        }
    }

    /// The whole-file entry to answer a read-only open of `ino` with, if passthrough is on
    /// and an entry of `ino` is indexed: (the file's attributes, its content version, the
    /// entry if it holds that version). Without an entry nothing is read here (the open reads
    /// the bare attributes, as without passthrough).
    pub(super) async fn whole_entry(
        &self,
        ino: Ino,
    ) -> VResult<Option<(Attr, Vec<u8>, Option<std::fs::File>)>> {
        let Some(p) = self
            .pt
            .clone()
            .filter(|p| p.enabled() && p.cache.has_whole(ino))
        else {
            return Ok(None);
        };
        let (a, version) = match self.fs.content_version(ino).await {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::IsDir => return Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.pin_versions => {
                return Err(libc::ESTALE)
            }
            Err(e) => return Err(err(e)),
        };
        let verify = !p
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(ino, version.clone()));
        let (c, v) = (p.cache.clone(), version.clone());
        let f = tokio::task::spawn_blocking(move || c.open_whole(ino, &v, verify))
            .await
            .ok()
            .flatten();
        if f.is_some() && verify {
            let mut v = p.verified.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() >= VERIFIED_MAX {
                v.clear();
            }
            v.insert((ino, version.clone()));
        }
        Ok(Some((a, version, f)))
    }

    /// Make a whole-file entry of `ino` in the background, unless one is being made or
    /// passthrough is off. The bytes come through the checked read path (cache, then store);
    /// the entry is kept only if the file's content version did not change meanwhile.
    pub fn make_whole(self: &Arc<Self>, ino: Ino) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.whole_copy(ino).await {
                tracing::info!(ino, error = %e, "a whole-file copy for passthrough was not made");
            }
        });
    }

    /// Make a whole-file entry of `ino` now (see `make_whole`); true if one was made.
    async fn whole_copy(&self, ino: Ino) -> fs_core::Result<bool> {
        let Some(p) = self.pt.clone().filter(|p| p.enabled()) else {
            return Ok(false);
        };
        if !p
            .making
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino)
        {
            return Ok(false);
        }
        let r = {
            let _unmark = Unmark(&p, ino);
            self.make_whole_now(&p, ino).await
        };
        if matches!(r, Ok(true)) {
            self.metrics.whole_files_made.inc();
        }
        r
    }

    async fn make_whole_now(&self, p: &Passthrough, ino: Ino) -> fs_core::Result<bool> {
        let (a, v1) = self.fs.content_version(ino).await?;
        if a.length < MIN_WHOLE {
            return Ok(false);
        }
        let c = p.cache.clone();
        if tokio::task::spawn_blocking({
            let (c, v) = (c.clone(), v1.clone());
            move || c.open_whole(ino, &v, false).is_some()
        })
        .await
        .unwrap_or(false)
        {
            return Ok(false);
        }
        let len = a.length;
        let Some(mut w) = tokio::task::spawn_blocking(move || c.whole_writer(ino, len))
            .await
            .map_err(|e| fs_core::Error::new(ErrorKind::Backend, e.to_string()))??
        else {
            return Ok(false);
        };
        let rd = FileReader::new(
            self.fs.clone(),
            ino,
            ReadAhead {
                max_window: 64 << 20,
                budget: Some(self.budget.clone()),
            },
        )
        .await?;
        let mut off = 0;
        while off < len {
            let data = rd.read(off, (8 << 20).min(len - off) as usize).await?;
            if data.is_empty() {
                return Ok(false);
            }
            off += data.len() as u64;
            w = tokio::task::spawn_blocking(move || w.write(&data).map(|_| w))
                .await
                .map_err(|e| fs_core::Error::new(ErrorKind::Backend, e.to_string()))??;
        }
        let (_, v2) = self.fs.content_version(ino).await?;
        if v2 != v1 {
            return Ok(false);
        }
        let v = v1.clone();
        tokio::task::spawn_blocking(move || w.finish(&v))
            .await
            .map_err(|e| fs_core::Error::new(ErrorKind::Backend, e.to_string()))??;
        // Made here from checked bytes: no CRC pass before its first hand-off.
        p.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ino, v1));
        Ok(true)
    }
}

/// What a warm-up into a whole-file copy did (blocks and their bytes).
#[derive(Debug, Default, Clone, Copy)]
pub struct WarmedWhole {
    pub fetched: u64,
    pub cached: u64,
    pub bytes: u64,
}

impl Vfs {
    /// Whether a warm-up of a file `len` bytes long goes straight into a whole-file copy.
    pub fn warms_whole(&self, len: u64) -> bool {
        len >= MIN_WHOLE && self.pt.as_ref().is_some_and(|p| p.enabled())
    }

    /// Whether `ino` has a whole-file copy of its current content (`jfs warmup --check`).
    pub async fn has_current_whole(&self, ino: Ino) -> bool {
        matches!(self.whole_entry(ino).await, Ok(Some((_, _, Some(_)))))
    }

    /// Warm `ino` straight into a whole-file copy, without block-cache copies (one write per
    /// byte, as a block warm-up): its pieces in file order, `threads` blocks fetched at
    /// once, each from the block cache when it is there, else from the store, checked.
    /// `each(len, fetched)` is told of every block as it lands. A copy of the current
    /// version already there counts every block as cached.
    pub async fn warm_whole(
        &self,
        store: &volume::CachedStore,
        ino: Ino,
        threads: usize,
        each: impl Fn(u64, bool),
    ) -> fs_core::Result<WarmedWhole> {
        use fs_core::fs::Piece;
        use futures::StreamExt;
        let backend =
            |e: tokio::task::JoinError| fs_core::Error::new(ErrorKind::Backend, e.to_string());
        let Some(p) = self.pt.clone().filter(|p| p.enabled()) else {
            return Err(fs_core::Error::new(ErrorKind::Config, "passthrough is off"));
        };
        // One copy of a file is made at a time: wait for one in the making (a handle that
        // read the file whole just closed), then see whether it is the current version.
        while !p
            .making
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino)
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _unmark = Unmark(&p, ino);
        let (a, v1) = self.fs.content_version(ino).await?;
        let len = a.length;
        // Every block piece of the file, in file order.
        let mut pieces = Vec::new();
        let mut off = 0u64;
        while off < len {
            let n = fs_core::CHUNK_SIZE.min(len - off) as usize;
            let mut plan = self.fs.plan_read(ino, off, n).await?.pieces;
            plan.sort_by_key(|p| match p {
                Piece::Zeros { dst, .. } | Piece::Block { dst, .. } => *dst,
            });
            pieces.extend(plan.into_iter().map(|p| (off, p)));
            off += n as u64;
        }
        let (c, v) = (p.cache.clone(), v1.clone());
        if tokio::task::spawn_blocking(move || c.open_whole(ino, &v, false).is_some())
            .await
            .map_err(backend)?
        {
            let mut w = WarmedWhole::default();
            for (_, piece) in &pieces {
                if let Piece::Block { len, .. } = piece {
                    each(*len as u64, false);
                    w.cached += 1;
                    w.bytes += *len as u64;
                }
            }
            return Ok(w);
        }
        let c = p.cache.clone();
        let Some(mut w) = tokio::task::spawn_blocking(move || c.whole_writer(ino, len))
            .await
            .map_err(backend)??
        else {
            return Err(fs_core::Error::new(
                ErrorKind::Backend,
                format!("the local cache is full ({} bytes): no room for a whole copy of {len} bytes; give the mount a larger --cache-size", p.cache.usage().capacity),
            ));
        };
        let mut done = WarmedWhole::default();
        let mut at = 0u64;
        let mut parts = futures::stream::iter(pieces.into_iter().map(|(base, piece)| async move {
            match piece {
                Piece::Zeros { dst, len } => {
                    Ok((base + dst as u64, bytes::Bytes::from(vec![0u8; len]), None))
                }
                Piece::Block {
                    key,
                    check,
                    from,
                    len,
                    dst,
                } => {
                    let (b, was_cached) = store.get_block_for_copy(&key, check).await?;
                    if b.len() < from + len {
                        return Err(fs_core::error::corrupt(format!(
                            "block {key} is shorter than its slice says"
                        )));
                    }
                    Ok((
                        base + dst as u64,
                        b.slice(from..from + len),
                        Some(was_cached),
                    ))
                }
            }
        }))
        .buffered(threads.clamp(1, 16));
        // The copy is written by a thread of its own, so that the fetches go on while it
        // writes (a stream is only driven while it is polled).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
        let writing = tokio::task::spawn_blocking(move || {
            while let Some(data) = rx.blocking_recv() {
                w.write(&data)?;
            }
            Ok::<_, fs_core::Error>(w)
        });
        while let Some(part) = parts.next().await {
            let (pos, data, block) = part?;
            if pos != at {
                return Err(fs_core::error::corrupt(format!(
                    "inode {ino}: the read plan has a gap at {at}"
                )));
            }
            at += data.len() as u64;
            if let Some(was_cached) = block {
                each(data.len() as u64, !was_cached);
                if was_cached {
                    done.cached += 1;
                } else {
                    done.fetched += 1;
                }
                done.bytes += data.len() as u64;
            }
            if tx.send(data).await.is_err() {
                break; // the writer failed: its error is below
            }
        }
        drop(tx);
        let w = writing.await.map_err(backend)??;
        let (_, v2) = self.fs.content_version(ino).await?;
        if v2 != v1 {
            return Err(fs_core::Error::new(
                ErrorKind::Busy,
                "the file changed while it was warmed; warm it again",
            ));
        }
        let v = v1.clone();
        tokio::task::spawn_blocking(move || w.finish(&v))
            .await
            .map_err(backend)??;
        p.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ino, v1));
        self.metrics.whole_files_made.inc();
        Ok(done)
    }
}

/// Takes an inode off the being-made set when dropped.
struct Unmark<'a>(&'a Passthrough, Ino);
impl Drop for Unmark<'_> {
    fn drop(&mut self) {
        self.0
            .making
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}
