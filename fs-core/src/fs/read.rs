//! Reading files: a read is *planned* (which bytes of which blocks land where, holes as
//! zeros) from the chunks' slice records, then its blocks are fetched from the store.
//!
//! `FileReader` is the reader of one open file, shared by the mount and `jfs get`: it keeps
//! the file's chunk records, keeps the blocks it fetched while the reader is still inside
//! them (a 4 MiB block serves many kernel reads) or just behind (they arrive out of order),
//! and reads ahead on sequential access with a window that starts at one block and doubles
//! while the reader keeps consuming it, as far as the store's latency asks for and at most
//! `max_window` (`next_window`). Random access reads no further
//! than it needs. Memory for blocks held is taken from a `Budget` shared by every reader and
//! writer of a process, so read-ahead never grows past it (it reads less ahead instead).

use super::data::{build_view, decode_chunk};
use super::Fs;
use crate::engine::Engine;
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::keys;
use crate::store::BlockCheck;
use crate::types::{FileKind, Ino, Settings, SliceRec, CHUNK_SIZE};
use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where some bytes of a read come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A hole: zeros.
    Zeros { dst: usize, len: usize },
    /// `len` bytes of block `key` (`block_len` long, CRC32C `crc` where the slice recorded
    /// one) from `from`, to `dst` in the result.
    Block {
        key: String,
        block_len: u32,
        crc: Option<u32>,
        from: usize,
        len: usize,
        dst: usize,
    },
}

/// A planned read of `len` bytes at `offset` (already cut at the end of the file).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub offset: u64,
    pub len: usize,
    pub pieces: Vec<Piece>,
}

/// One chunk's slice records, with the block checksums of the slices they name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub recs: Vec<SliceRec>,
    /// Slice id to the CRC32C of each of its blocks (empty on a format-1 volume).
    pub sums: HashMap<u64, Vec<u32>>,
}

impl Chunk {
    fn crc(&self, slice: u64, block: u32) -> Option<u32> {
        self.sums.get(&slice)?.get(block as usize).copied()
    }
}

/// Plan chunk bytes `[from, to)` of the view of `c` into `out`, `dst_base` being where
/// chunk byte `from` goes in the result. Regions no slice covers are left out (zeros).
pub(crate) fn plan_chunk(
    s: &Settings,
    c: &Chunk,
    from: u32,
    to: u32,
    dst_base: usize,
    out: &mut Vec<Piece>,
) {
    let bs = s.block_size;
    for g in build_view(&c.recs) {
        let (a, b) = (g.start.max(from), g.end.min(to));
        if a >= b {
            continue;
        }
        let mut d = dst_base + (a - from) as usize;
        if g.id == 0 {
            out.push(Piece::Zeros {
                dst: d,
                len: (b - a) as usize,
            });
            continue;
        }
        let mut soff = g.slice_off + (a - g.start); // offset inside the slice
        let mut left = b - a;
        while left > 0 {
            let bi = soff / bs;
            let blen = keys::block_len(g.size, bs, bi);
            let in_block = soff - bi * bs;
            let n = (blen - in_block).min(left);
            out.push(Piece::Block {
                key: keys::block_key(&s.name, g.id, bi, blen),
                block_len: blen,
                crc: c.crc(g.id, bi),
                from: in_block as usize,
                len: n as usize,
                dst: d,
            });
            soff += n;
            d += n as usize;
            left -= n;
        }
    }
}

/// The block checksums of slices `ids` (format 2), read in one round trip per 4096 slices:
/// slice id to the CRC32C of each block. Slices without a record, or with one that does not
/// decode, are absent (callers decide whether that is an error).
pub async fn slice_checksums(engine: &dyn Engine, ids: &[u64]) -> Result<HashMap<u64, Vec<u32>>> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut out = HashMap::with_capacity(ids.len());
    for part in ids.chunks(4096) {
        let keys: Vec<Vec<u8>> = part.iter().map(|&id| keys::checksums(id)).collect();
        for (&id, v) in part.iter().zip(engine.get_many(&keys).await?) {
            if let Some(c) = v.as_deref().and_then(keys::decode_checksums) {
                out.insert(id, c);
            }
        }
    }
    Ok(out)
}

/// Bytes a process may hold in read-ahead and write buffers. Permits are KiB.
#[derive(Clone)]
pub struct Budget {
    sem: Arc<Semaphore>,
    total_kib: usize,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        let kib = (bytes >> 10).clamp(1, u32::MAX as u64 >> 4) as usize;
        Budget {
            sem: Arc::new(Semaphore::new(kib)),
            total_kib: kib,
        }
    }
    /// Take room for `bytes` now, if there is any.
    pub fn try_take(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).max(1) as u32;
        self.sem.clone().try_acquire_many_owned(kib).ok()
    }
    /// Take room for `bytes`, waiting for it (at most the whole budget is asked for).
    pub async fn take(&self, bytes: u64) -> OwnedSemaphorePermit {
        let kib = (bytes.div_ceil(1024).max(1) as usize).min(self.total_kib) as u32;
        self.sem
            .clone()
            .acquire_many_owned(kib)
            .await
            .expect("the budget's semaphore is never closed")
    }
    /// Bytes in use now.
    pub fn used(&self) -> u64 {
        ((self.total_kib - self.sem.available_permits()) as u64) << 10
    }
    pub fn total(&self) -> u64 {
        (self.total_kib as u64) << 10
    }
}

impl Fs {
    /// The chunk records of chunk `idx` of `ino`.
    pub async fn chunk_records(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRec>> {
        decode_chunk(ino, idx, self.engine.get(&keys::chunk(ino, idx)).await?)
    }

    /// Chunk `idx` of `ino` with the checksums of its slices.
    pub async fn load_chunk(&self, ino: Ino, idx: u32) -> Result<Chunk> {
        let recs = self.chunk_records(ino, idx).await?;
        self.with_sums(recs).await
    }

    /// `recs` with the block checksums of the slices they name (none on a format-1 volume).
    /// A format-2 slice without its record is damaged metadata, refused rather than read
    /// unchecked.
    pub async fn with_sums(&self, recs: Vec<SliceRec>) -> Result<Chunk> {
        let mut sums = HashMap::new();
        if self.settings.checksums() {
            let ids: Vec<u64> = recs.iter().filter(|r| r.id != 0).map(|r| r.id).collect();
            sums = slice_checksums(&*self.engine, &ids).await?;
            if let Some(id) = ids.iter().find(|id| !sums.contains_key(id)) {
                return Err(corrupt(format!("slice {id} has no valid checksum record (this volume records one per slice): damaged metadata; `jfs fsck` names the files")));
            }
        }
        Ok(Chunk { recs, sums })
    }

    /// Plan a read of up to `len` bytes at `offset` of `ino` (short at the end of the file).
    pub async fn plan_read(&self, ino: Ino, offset: u64, len: usize) -> Result<Plan> {
        let attr = self.getattr(ino).await?;
        if attr.kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a regular file"),
            ));
        }
        let mut chunks = HashMap::new();
        let end = (offset + len as u64).min(attr.length);
        let mut i = (offset / CHUNK_SIZE) as u32;
        while offset < end && (i as u64) * CHUNK_SIZE < end {
            chunks.insert(i, Arc::new(self.load_chunk(ino, i).await?));
            i += 1;
        }
        Ok(self.plan_with(&chunks, attr.length, offset, len))
    }

    /// Plan from chunk records already at hand (`chunks` must hold every chunk the range
    /// touches; a missing one reads as a hole).
    pub fn plan_with(
        &self,
        chunks: &HashMap<u32, Arc<Chunk>>,
        length: u64,
        offset: u64,
        len: usize,
    ) -> Plan {
        let end = (offset.saturating_add(len as u64)).min(length);
        let mut plan = Plan {
            offset,
            len: end.saturating_sub(offset) as usize,
            pieces: Vec::new(),
        };
        let mut off = offset;
        while off < end {
            let idx = (off / CHUNK_SIZE) as u32;
            let cstart = (off % CHUNK_SIZE) as u32;
            let cend = (((idx as u64 + 1) * CHUNK_SIZE).min(end) - idx as u64 * CHUNK_SIZE) as u32;
            if let Some(c) = chunks.get(&idx) {
                plan_chunk(
                    &self.settings,
                    c,
                    cstart,
                    cend,
                    (off - offset) as usize,
                    &mut plan.pieces,
                );
            }
            off = idx as u64 * CHUNK_SIZE + cend as u64;
        }
        plan
    }

    /// One block, checked against the length its key gives and its recorded checksum.
    pub async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.store.get_block(key, want).await
    }

    /// Fetch a plan's blocks (in parallel) and assemble its bytes.
    pub async fn fetch(&self, plan: &Plan) -> Result<Vec<u8>> {
        let mut out = vec![0u8; plan.len];
        let wanted: Vec<(String, BlockCheck, usize, usize, usize)> = plan
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Block {
                    key,
                    block_len,
                    crc,
                    from,
                    len,
                    dst,
                } => Some((
                    key.clone(),
                    BlockCheck {
                        len: *block_len,
                        crc: *crc,
                    },
                    *from,
                    *len,
                    *dst,
                )),
                Piece::Zeros { .. } => None,
            })
            .collect();
        let fetched: Vec<(Bytes, usize, usize, usize)> = futures::stream::iter(wanted)
            .map(|(key, want, from, len, dst)| async move {
                let b = self.get_block(&key, want).await?;
                Ok::<_, Error>((b, from, len, dst))
            })
            .buffered(self.io_parallel)
            .try_collect()
            .await?;
        for (b, from, n, d) in fetched {
            out[d..d + n].copy_from_slice(&b[from..from + n]);
        }
        Ok(out)
    }
}

/// How a `FileReader` reads ahead.
#[derive(Clone)]
pub struct ReadAhead {
    /// The largest window (bytes beyond the read position fetched ahead).
    pub max_window: u64,
    /// Memory for blocks held; without one, nothing is read ahead.
    pub budget: Option<Budget>,
}

type Fetch = Shared<BoxFuture<'static, std::result::Result<Bytes, Error>>>;

/// A block held by a reader: in flight or fetched, with the memory it holds.
struct Held {
    fetch: Fetch,
    /// The end (file offset) of the last byte of the file this block serves in its plan:
    /// once the reader is past it, the block can go.
    end: u64,
    _permit: Option<OwnedSemaphorePermit>,
}

struct State {
    chunks: HashMap<u32, Arc<Chunk>>,
    length: u64,
    /// Where the next sequential read starts.
    next: u64,
    /// Bytes read sequentially since the window was last sized, and when that was.
    streak: u64,
    streak_start: Option<Instant>,
    window: u64,
    /// How far ahead has been scheduled.
    ahead_to: u64,
    held: BTreeMap<String, Held>,
}

/// Statistics of a reader's work, for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadStats {
    /// Blocks fetched from the store (by a read or ahead of it).
    pub fetched: u64,
    /// Blocks a read found already fetched or in flight.
    pub reused: u64,
    /// Of those, fetched by read-ahead.
    pub ahead_hits: u64,
    /// The read-ahead window now (bytes).
    pub window: u64,
}

/// The reader of one open file (see the module comment).
pub struct FileReader {
    fs: Arc<Fs>,
    ino: Ino,
    cfg: ReadAhead,
    st: tokio::sync::Mutex<State>,
    stats: std::sync::Mutex<ReadStats>,
    /// The quickest block fetch since the window was last sized, in nanoseconds (`u64::MAX`
    /// when none finished).
    min_fetch_ns: Arc<AtomicU64>,
}

/// A read that continues within this distance of the last one counts as sequential (the
/// kernel sends concurrent reads of one stream slightly out of order).
const NEAR: u64 = 2 << 20;
/// How far behind the latest read blocks are kept (see `read`).
const BEHIND: u64 = 8 << 20;
/// The read-ahead window never shrinks below this many blocks on a sequential read (see
/// `next_window`).
const MIN_WINDOW_BLOCKS: u64 = 4;

impl FileReader {
    /// A reader of `ino` as it is now (its length and chunk records are read lazily and kept
    /// until `invalidate`).
    pub async fn new(fs: Arc<Fs>, ino: Ino, cfg: ReadAhead) -> Result<FileReader> {
        let attr = fs.getattr(ino).await?;
        if attr.kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a regular file"),
            ));
        }
        Ok(FileReader {
            fs,
            ino,
            cfg,
            st: tokio::sync::Mutex::new(State {
                chunks: HashMap::new(),
                length: attr.length,
                next: 0,
                streak: 0,
                streak_start: None,
                window: 0,
                ahead_to: 0,
                held: BTreeMap::new(),
            }),
            stats: Default::default(),
            min_fetch_ns: Arc::new(AtomicU64::new(u64::MAX)),
        })
    }

    pub fn stats(&self) -> ReadStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file changed (a write through this mount, a truncate): forget chunk records,
    /// blocks held and the length.
    pub async fn invalidate(&self) -> Result<()> {
        let length = self.fs.getattr(self.ino).await?.length;
        let mut st = self.st.lock().await;
        st.chunks.clear();
        st.held.clear();
        st.length = length;
        st.ahead_to = 0;
        Ok(())
    }

    /// Load every chunk record of the file now, so that this reader serves the version it
    /// opened whole even after the inode is replaced or deleted (a mirror site, where the
    /// agent applies a primary's deletions without knowing the mirror's open files; the
    /// blocks stay readable through the origin fallback). Fails with `NotFound` when the
    /// inode went or changed while loading, instead of serving a mix.
    pub async fn pin(&self) -> Result<()> {
        let mut st = self.st.lock().await;
        let len = st.length;
        self.ensure_chunks(&mut st, 0, len).await?;
        let now = self.fs.getattr(self.ino).await?;
        if now.length != len {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("inode {} changed while it was being opened", self.ino),
            ));
        }
        Ok(())
    }

    async fn ensure_chunks(&self, st: &mut State, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let (a, b) = ((from / CHUNK_SIZE) as u32, ((to - 1) / CHUNK_SIZE) as u32);
        for i in a..=b {
            if let std::collections::hash_map::Entry::Vacant(e) = st.chunks.entry(i) {
                e.insert(Arc::new(self.fs.load_chunk(self.ino, i).await?));
            }
        }
        Ok(())
    }

    fn fetch_of(&self, key: &str, want: BlockCheck) -> Fetch {
        let fs = self.fs.clone();
        let key = key.to_string();
        let min = self.min_fetch_ns.clone();
        async move {
            let t = Instant::now();
            let r = fs.get_block(&key, want).await;
            if r.is_ok() {
                min.fetch_min(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            r
        }
        .boxed()
        .shared()
    }

    /// The read-ahead window after `window`, once the reader has consumed a window's worth
    /// (`streak` bytes since `started`, when the window was last sized). It doubles, but
    /// not past four times what the store must have in flight to keep up with the reader:
    /// the reader's recent rate times the quickest fetch of that stretch (the
    /// bandwidth-delay product; four, because fetches under load take longer than the
    /// quickest), and never below `MIN_WINDOW_BLOCKS`. While the store is what the reader
    /// waits for, the rate is the window over the latency, so the window keeps doubling up
    /// to `max_window` (S3, an origin over a WAN); a store that answers within a
    /// millisecond or two (a local disk, the local cache) keeps a few blocks in flight
    /// instead of 256 MiB (measured: a 1 GiB read through the mount peaked at 138 MiB RSS
    /// instead of 400, at the same speed). The quickest fetch is taken per stretch, so a
    /// file whose first part came from the local cache and whose rest comes from S3 grows
    /// its window again within one stretch.
    fn next_window(&self, window: u64, streak: u64, started: Instant) -> u64 {
        let bs = self.fs.settings.block_size as u64;
        let max = self.cfg.max_window.max(bs);
        let doubled = (window * 2).min(max);
        let min_ns = self.min_fetch_ns.swap(u64::MAX, Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64();
        if min_ns == u64::MAX || secs <= 0.0 {
            // No fetch finished while a whole window was read: it was all fetched already.
            return window;
        }
        let needed = 4.0 * (streak as f64 / secs) * (min_ns as f64 / 1e9);
        let floor = (MIN_WINDOW_BLOCKS * bs).min(max);
        doubled.min((needed as u64).max(floor))
    }

    /// Read up to `len` bytes at `offset` (short at the end of the file). A read that one
    /// block serves whole is a slice of that block (no copy).
    pub async fn read(&self, offset: u64, len: usize) -> Result<Bytes> {
        let mut st = self.st.lock().await;
        let end = (offset + len as u64).min(st.length);
        if offset >= end {
            return Ok(Bytes::new());
        }
        // Sequential or not: the window grows while the reader keeps up with it, as far as
        // the store's latency asks for (`next_window`).
        let sequential = offset.abs_diff(st.next) <= NEAR.max(st.window);
        if sequential {
            st.streak += end - offset;
            let started = *st.streak_start.get_or_insert_with(Instant::now);
            if st.window == 0 {
                st.window = self.fs.settings.block_size as u64;
            } else if st.streak >= st.window {
                st.window = self.next_window(st.window, st.streak, started);
                st.streak = 0;
                st.streak_start = Some(Instant::now());
            }
        } else {
            st.streak = end - offset;
            st.streak_start = Some(Instant::now());
            st.window = 0;
            st.ahead_to = 0;
        }
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).window = st.window;
        st.next = end;
        // Blocks the reader has gone past are dropped, keeping those just behind: the kernel
        // sends one stream's reads concurrently and they arrive slightly out of order (a
        // read of the next block before the last piece of this one), which would otherwise
        // fetch this block again.
        st.held.retain(|_, h| h.end + BEHIND > offset);
        self.ensure_chunks(&mut st, offset, end).await?;
        let plan = self.fs.plan_with(&st.chunks, st.length, offset, len);
        let mut waits = Vec::new();
        for p in &plan.pieces {
            if let Piece::Block {
                key,
                block_len,
                crc,
                from,
                len,
                dst,
            } = p
            {
                let want = BlockCheck {
                    len: *block_len,
                    crc: *crc,
                };
                let piece_end = offset + (*dst + *len) as u64;
                let f = match st.held.get_mut(key) {
                    Some(h) => {
                        h.end = h.end.max(piece_end);
                        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                        s.reused += 1;
                        if h.fetch.peek().is_some() || h.end > piece_end {
                            s.ahead_hits += 1;
                        }
                        h.fetch.clone()
                    }
                    None => {
                        let f = self.fetch_of(key, want);
                        self.stats.lock().unwrap_or_else(|p| p.into_inner()).fetched += 1;
                        // Keep it while later reads may need the rest of it.
                        let permit = self
                            .cfg
                            .budget
                            .as_ref()
                            .and_then(|b| b.try_take(*block_len as u64));
                        if permit.is_some() || self.cfg.budget.is_none() {
                            st.held.insert(
                                key.clone(),
                                Held {
                                    fetch: f.clone(),
                                    end: piece_end,
                                    _permit: permit,
                                },
                            );
                        }
                        f
                    }
                };
                waits.push((f, *from, *len, *dst));
            }
        }
        // Schedule read-ahead past this read, within the window and the budget.
        if st.window > 0 && self.cfg.budget.is_some() {
            let want_to = (end + st.window).min(st.length);
            let from = st.ahead_to.max(end);
            if want_to > from {
                self.ensure_chunks(&mut st, from, want_to).await?;
                let ahead =
                    self.fs
                        .plan_with(&st.chunks, st.length, from, (want_to - from) as usize);
                let mut scheduled_to = from;
                for p in ahead.pieces {
                    if let Piece::Block {
                        key,
                        block_len,
                        crc,
                        len,
                        dst,
                        ..
                    } = p
                    {
                        let piece_end = from + (dst + len) as u64;
                        if let Some(h) = st.held.get_mut(&key) {
                            h.end = h.end.max(piece_end);
                            scheduled_to = piece_end;
                            continue;
                        }
                        let Some(permit) = self
                            .cfg
                            .budget
                            .as_ref()
                            .and_then(|b| b.try_take(block_len as u64))
                        else {
                            break; // out of memory for read-ahead: read less ahead
                        };
                        let f = self.fetch_of(
                            &key,
                            BlockCheck {
                                len: block_len,
                                crc,
                            },
                        );
                        // Start it now: a shared future only runs when polled.
                        tokio::spawn(f.clone().map(|_| ()));
                        self.stats.lock().unwrap_or_else(|p| p.into_inner()).fetched += 1;
                        st.held.insert(
                            key,
                            Held {
                                fetch: f,
                                end: piece_end,
                                _permit: Some(permit),
                            },
                        );
                        scheduled_to = piece_end;
                    } else if let Piece::Zeros { dst, len } = p {
                        scheduled_to = from + (dst + len) as u64;
                    }
                }
                st.ahead_to = scheduled_to.max(st.ahead_to);
            }
        }
        drop(st);
        let got = futures::future::try_join_all(
            waits
                .into_iter()
                .map(|(f, from, n, d)| async move { f.await.map(|b| (b, from, n, d)) }),
        )
        .await?;
        if let [(b, from, n, 0)] = got.as_slice() {
            if *n == plan.len {
                return Ok(b.slice(*from..*from + *n));
            }
        }
        let mut out = vec![0u8; plan.len];
        for (b, from, n, d) in got {
            out[d..d + n].copy_from_slice(&b[from..from + n]);
        }
        Ok(Bytes::from(out))
    }
}
