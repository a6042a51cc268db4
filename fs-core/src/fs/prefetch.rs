//! The reader of one open file, with its read-ahead (the prefetcher), shared by the mount and
//! `jfs get`.
//!
//! `FileReader` keeps
//! the file's chunk records, keeps the blocks it fetched while the reader is still inside
//! them (a 4 MiB block serves many kernel reads) or just behind (they arrive out of order),
//! and reads ahead on sequential access with a window that starts at one block and doubles
//! while the reader keeps consuming it, as far as the store's latency asks for and at most
//! `max_window` (`next_window`). Random access reads no further
//! than it needs. Memory for blocks held is taken from a `Budget` shared by every reader and
//! writer of a process, so read-ahead never grows past it (it reads less ahead instead); once
//! it is spent, the block a read is in is held on the budget's small reserve, or not at all.
//!
//! A failed fetch is not kept: the read that started it gets its error; a read that found it
//! held (fetched ahead, or by an earlier read) starts the block's fetch again in its place
//! (`fetch_again`); a later read drops a failed fetch it finds and fetches the block anew.
//! A store that failed for a moment costs one read at most, not every read of that block
//! while the reader is inside it. A fetch that panicked is a failed fetch like any other (a
//! `Shared` future that panicked would panic again in every clone).

use super::layout::{Chunk, Piece};
use super::{Budget, Fs};
use crate::error::{Error, ErrorKind, Result};
use crate::store::BlockCheck;
use crate::types::{FileKind, Ino, CHUNK_SIZE};
use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::OwnedSemaphorePermit;

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
    /// The block's length, and how many of its bytes reads have taken: once all, it goes.
    size: u64,
    served: u64,
    /// Held on the budget's reserve (`Budget::try_take_spare`), not the budget.
    spare: bool,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// Its fetch finished with an error.
    fn failed(&self) -> bool {
        matches!(self.fetch.peek(), Some(Err(_)))
    }
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
    /// The first chunk's records, read with the attributes; their checksums are read when a
    /// read first needs that chunk.
    chunk0: std::sync::Mutex<Option<Vec<crate::types::SliceRec>>>,
}

/// A read that continues within this distance of the last one counts as sequential (the
/// kernel sends concurrent reads of one stream slightly out of order).
const NEAR: u64 = 2 << 20;
/// How far behind the latest read a block not yet read whole is kept (see `read`): past
/// the kernel's own read-ahead (16 MiB), whose reads of one stream arrive out of order.
/// With 8 MiB, a cold 1 GiB read fetched 1.4 GiB from the store.
const BEHIND: u64 = 32 << 20;
/// Blocks a reader holds on the budget's reserve: the ones its latest reads are in.
const UNBUDGETED: usize = 2;
/// A sequential read's window grows to at least this many blocks, whatever the store's
/// latency (see `next_window`). Measured on a cold 1 GiB read from a local-directory store
/// (RocksDB volume, 2 cores, 5 rounds each in turn): 16 blocks read 1632-1670 MiB/s where
/// 4 read 1266-1589, at the same peak RSS (157-181 MiB): the disk is kept busier by more
/// reads in flight than the quickest fetch suggests.
pub const MIN_WINDOW_BLOCKS: u64 = 16;

/// Room on the budget's reserve for a block of `len` bytes, the reader's oldest blocks held
/// there let go first so that it holds at most `UNBUDGETED`.
fn take_spare(
    held: &mut BTreeMap<String, Held>,
    budget: &Budget,
    len: u64,
) -> Option<OwnedSemaphorePermit> {
    let mut mine: Vec<(u64, String)> = held
        .iter()
        .filter(|(_, h)| h.spare)
        .map(|(k, h)| (h.end, k.clone()))
        .collect();
    mine.sort();
    let extra = (mine.len() + 1).saturating_sub(UNBUDGETED);
    for (_, k) in mine.into_iter().take(extra) {
        held.remove(&k);
    }
    budget.try_take_spare(len)
}

impl FileReader {
    /// A reader of `ino` as it is now (its length and chunk records are read lazily and kept
    /// until `invalidate`).
    pub async fn new(fs: Arc<Fs>, ino: Ino, cfg: ReadAhead) -> Result<FileReader> {
        // The attributes and the first chunk's records in one round trip: most files are
        // one chunk, and a first read starts there.
        let mut got = fs
            .engine
            .get_many(&[crate::keys::attr(ino), crate::keys::chunk(ino, 0)])
            .await?
            .into_iter();
        let attr = match got.next().flatten() {
            Some(v) => super::decode_attr(ino, &v)?,
            None => return Err(crate::error::not_found(format!("inode {ino}"))),
        };
        if attr.kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a regular file"),
            ));
        }
        let chunk0 = if attr.length > 0 {
            Some(super::layout::decode_chunk(ino, 0, got.next().flatten())?)
        } else {
            None
        };
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
            chunk0: std::sync::Mutex::new(chunk0),
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
        self.chunk0.lock().unwrap_or_else(|p| p.into_inner()).take();
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
                let read = match i {
                    0 => self.chunk0.lock().unwrap_or_else(|p| p.into_inner()).take(),
                    _ => None,
                };
                let chunk = match read {
                    Some(recs) => self.fs.with_sums(recs).await?,
                    None => self.fs.load_chunk(self.ino, i).await?,
                };
                e.insert(Arc::new(chunk));
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
            let r = std::panic::AssertUnwindSafe(fs.get_block(&key, want))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(block = %key, "fetching a block panicked; the read fails with EIO, the next one fetches it again");
                    Err(Error::new(
                        ErrorKind::Backend,
                        format!("fetching block {key} panicked"),
                    ))
                });
            if r.is_ok() {
                min.fetch_min(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            r
        }
        .boxed()
        .shared()
    }

    /// The fetch of `key` again, for a read that found it held and failed: the held fetch is
    /// replaced (so that the reads after this one find the new fetch, not the failure), unless
    /// another read replaced it already.
    async fn fetch_again(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        let f = {
            let mut st = self.st.lock().await;
            match st.held.get_mut(key) {
                Some(h) if !h.failed() => h.fetch.clone(),
                held => {
                    let f = self.fetch_of(key, want);
                    self.stats.lock().unwrap_or_else(|p| p.into_inner()).fetched += 1;
                    if let Some(h) = held {
                        h.fetch = f.clone();
                    }
                    f
                }
            }
        };
        f.await
    }

    /// The read-ahead window after `window`, once the reader has consumed a window's worth
    /// (`streak` bytes since `started`, when the window was last sized). It doubles, but
    /// not past four times what the store must have in flight to keep up with the reader:
    /// the reader's recent rate times the quickest fetch of that stretch (the
    /// bandwidth-delay product; four, because fetches under load take longer than the
    /// quickest), and never below `MIN_WINDOW_BLOCKS`. While the store is what the reader
    /// waits for, the rate is the window over the latency, so the window keeps doubling up
    /// to `max_window` (S3, an origin over a WAN); a store that answers within a
    /// millisecond or two (a local disk, the local cache) stops at the floor instead of
    /// 256 MiB (measured: a 1 GiB read through the mount peaked at 138 MiB RSS instead of
    /// 400, at the same speed). The quickest fetch is taken per stretch, so a
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
        // Blocks read whole are dropped, and blocks the reader has gone far past: the kernel
        // sends one stream's reads concurrently and they arrive out of order (a read of a
        // later block before the last pieces of this one), which would otherwise fetch this
        // block again.
        // A fetch that failed goes too: this read fetches that block again.
        st.held
            .retain(|_, h| h.served < h.size && h.end + BEHIND > offset && !h.failed());
        self.ensure_chunks(&mut st, offset, end).await?;
        let plan = self.fs.plan_with(&st.chunks, st.length, offset, len);
        let mut waits = Vec::new();
        for p in &plan.pieces {
            if let Piece::Block {
                key,
                check: want,
                from,
                len,
                dst,
            } = p
            {
                let want = *want;
                let piece_end = offset + (*dst + *len) as u64;
                let f = match st.held.get_mut(key) {
                    Some(h) => {
                        h.end = h.end.max(piece_end);
                        h.served += *len as u64;
                        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                        s.reused += 1;
                        if h.fetch.peek().is_some() || h.end > piece_end {
                            s.ahead_hits += 1;
                        }
                        (h.fetch.clone(), true)
                    }
                    None => {
                        let f = self.fetch_of(key, want);
                        self.stats.lock().unwrap_or_else(|p| p.into_inner()).fetched += 1;
                        // Keep it while later reads may need the rest of it; once the budget
                        // is spent, on its reserve (a few blocks for the whole process, at
                        // most UNBUDGETED a reader): without it each later piece of the
                        // block would fetch it whole again.
                        let budget = self.cfg.budget.as_ref();
                        let mut spare = false;
                        let permit = budget.and_then(|b| {
                            b.try_take(want.len as u64).or_else(|| {
                                spare = true;
                                take_spare(&mut st.held, b, want.len as u64)
                            })
                        });
                        if permit.is_some() || budget.is_none() {
                            st.held.insert(
                                key.clone(),
                                Held {
                                    fetch: f.clone(),
                                    end: piece_end,
                                    size: want.len as u64,
                                    served: *len as u64,
                                    spare,
                                    _permit: permit,
                                },
                            );
                        }
                        (f, false)
                    }
                };
                waits.push((f, key.as_str(), want, *from, *len, *dst));
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
                        check,
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
                            .and_then(|b| b.try_take(check.len as u64))
                        else {
                            break; // out of memory for read-ahead: read less ahead
                        };
                        let f = self.fetch_of(&key, check);
                        // Start it now: a shared future only runs when polled.
                        tokio::spawn(f.clone().map(|_| ()));
                        self.stats.lock().unwrap_or_else(|p| p.into_inner()).fetched += 1;
                        st.held.insert(
                            key,
                            Held {
                                fetch: f,
                                end: piece_end,
                                size: check.len as u64,
                                served: 0,
                                spare: false,
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
        let got = futures::future::try_join_all(waits.into_iter().map(
            |((f, joined), key, want, from, n, d)| async move {
                let b = match f.await {
                    Err(_) if joined => self.fetch_again(key, want).await,
                    r => r,
                }?;
                Ok::<_, Error>((b, from, n, d))
            },
        ))
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
