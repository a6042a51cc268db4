//! The write buffer of one open inode (shared by its handles in this mount).
//!
//! Contiguous writes accumulate into a *run* (never across a chunk boundary). A run is sealed
//! when it reaches `seal` bytes, ends at a chunk boundary, or a write does not continue it; a
//! sealed run is uploaded as a slice in the background while later writes go on buffering.
//! Slices are committed strictly in write order (later slices win where they overlap), at the
//! latest by `flush`, which fsync, flush and release call: that is the close-to-open point.
//!
//! Memory: every buffered byte holds room in the process's `Budget` until its slice is
//! committed; a writer that finds no room commits its own uploads first, then waits.
//! Failure: the first upload or commit that fails poisons the buffer; later slices are not
//! committed (they could overwrite in the wrong order), and `flush` returns the error (EIO, or
//! ENOSPC for a full store).

use fs_core::{BlockBuf, BlockPool, Budget, Fs, Ino, CHUNK_SIZE};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

/// A run's bytes are kept in whole blocks (`BlockBuf`s from the mount's pool, one block
/// long, page-aligned), so each goes to the store from the memory it was written into.
struct Run {
    start: u64,
    /// Full blocks, then the one being filled.
    blocks: Vec<bytes::Bytes>,
    cur: Option<BlockBuf>,
    len: usize,
    permits: Vec<OwnedSemaphorePermit>,
    reserved: u64,
}

struct Pending {
    start: u64,
    task: JoinHandle<fs_core::Result<fs_core::NewSlice>>,
    _permits: Vec<OwnedSemaphorePermit>,
}

pub struct Writer {
    fs: Arc<Fs>,
    ino: Ino,
    budget: Budget,
    pool: Arc<BlockPool>,
    seal: usize,
    run: Option<Run>,
    pending: VecDeque<Pending>,
    error: Option<fs_core::Error>,
    /// The end of the furthest byte written and not yet committed (for getattr).
    end: u64,
    /// Slices committed since the last `take_committed`.
    committed: u64,
}

/// Room reserved at a time while a run grows.
const RESERVE_STEP: u64 = 256 << 10;

impl Writer {
    /// `pool`'s buffers are one block of `fs` long.
    pub fn new(fs: Arc<Fs>, ino: Ino, budget: Budget, pool: Arc<BlockPool>) -> Writer {
        let bs = fs.settings().block_size as usize;
        debug_assert_eq!(pool.block_size(), bs);
        Writer {
            fs,
            ino,
            budget,
            pool,
            seal: bs * 4,
            run: None,
            pending: VecDeque::new(),
            error: None,
            end: 0,
            committed: 0,
        }
    }

    /// Whether anything is buffered or in flight.
    pub fn dirty(&self) -> bool {
        self.run.is_some() || !self.pending.is_empty()
    }

    /// The end offset of the data not yet committed (0 when clean).
    pub fn end(&self) -> u64 {
        if self.dirty() {
            self.end
        } else {
            0
        }
    }

    pub fn take_committed(&mut self) -> u64 {
        std::mem::take(&mut self.committed)
    }

    /// Buffer `data` at `offset`. Fails only if an earlier upload failed (the error stays
    /// until `flush` reports it).
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), fs_core::Error> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let mut done = 0usize;
        while done < data.len() {
            let off = offset + done as u64;
            let chunk_end = (off / CHUNK_SIZE + 1) * CHUNK_SIZE;
            let n = ((chunk_end - off) as usize).min(data.len() - done);
            self.write_in_chunk(off, &data[done..done + n]).await?;
            done += n;
            if off + n as u64 == chunk_end {
                self.seal();
            }
        }
        self.end = self.end.max(offset + data.len() as u64);
        self.commit_ready().await;
        Ok(())
    }

    async fn write_in_chunk(&mut self, off: u64, data: &[u8]) -> Result<(), fs_core::Error> {
        let continues = matches!(&self.run, Some(r) if r.start + r.len as u64 == off);
        if !continues {
            if let Some(r) = &self.run {
                tracing::trace!(
                    ino = self.ino,
                    run_start = r.start,
                    run_len = r.len,
                    off,
                    "a write elsewhere seals the run"
                );
            }
            self.seal();
        }
        if self.run.is_none() {
            self.run = Some(Run {
                start: off,
                blocks: Vec::new(),
                cur: None,
                len: 0,
                permits: Vec::new(),
                reserved: 0,
            });
        }
        // Room in the budget for the run's new length.
        let need = self.run.as_ref().map_or(0, |r| r.len) as u64 + data.len() as u64;
        let have = self.run.as_ref().map_or(0, |r| r.reserved);
        if need > have {
            let step = (need - have).max(RESERVE_STEP);
            let permit = loop {
                if let Some(p) = self.budget.try_take(step) {
                    break p;
                }
                // Free what this file holds in flight first (oldest first), then wait for
                // other files to free theirs.
                if self.pending.is_empty() {
                    break self.budget.take(step).await;
                }
                self.commit_front().await;
                if let Some(e) = &self.error {
                    return Err(e.clone());
                }
            };
            let r = self.run.as_mut().expect("a run was started above");
            r.permits.push(permit);
            r.reserved += step;
        }
        let r = self.run.as_mut().expect("a run was started above");
        let mut rest = data;
        while !rest.is_empty() {
            let cur = r.cur.get_or_insert_with(|| self.pool.take());
            let n = cur.extend(rest);
            rest = &rest[n..];
            if cur.room() == 0 {
                let full = r.cur.take().expect("filled just above");
                r.blocks.push(full.freeze());
            }
        }
        r.len += data.len();
        if r.len >= self.seal {
            self.seal();
        }
        Ok(())
    }

    /// Start uploading the current run.
    fn seal(&mut self) {
        let Some(mut r) = self.run.take() else { return };
        if r.len == 0 {
            return;
        }
        if let Some(cur) = r.cur.take().filter(|c| !c.is_empty()) {
            r.blocks.push(cur.freeze());
        }
        let fs = self.fs.clone();
        let blocks = r.blocks;
        let task = tokio::spawn(async move { fs.upload_blocks(blocks).await });
        self.pending.push_back(Pending {
            start: r.start,
            task,
            _permits: r.permits,
        });
    }

    /// Commit the slices whose uploads have finished, in order, without waiting.
    pub async fn commit_ready(&mut self) {
        while self.pending.front().is_some_and(|p| p.task.is_finished()) {
            self.commit_front().await;
        }
    }

    /// Commit every sealed slice in order (waiting for their uploads). Errors poison.
    async fn commit_all(&mut self) {
        while !self.pending.is_empty() {
            self.commit_front().await;
        }
    }

    async fn commit_front(&mut self) {
        if let Some(p) = self.pending.pop_front() {
            if self.error.is_some() {
                p.task.abort();
                return;
            }
            let r = match p.task.await {
                Ok(Ok(slice)) => {
                    let idx = (p.start / CHUNK_SIZE) as u32;
                    let pos = (p.start % CHUNK_SIZE) as u32;
                    self.fs.commit_slice(self.ino, idx, pos, &slice).await
                }
                Ok(Err(e)) => Err(e),
                Err(e) => Err(fs_core::Error::new(
                    fs_core::ErrorKind::Backend,
                    format!("upload task failed: {e}"),
                )),
            };
            match r {
                Ok(()) => self.committed += 1,
                Err(e) => {
                    let path = crate::vfs::describe(&self.fs, self.ino).await;
                    tracing::error!(%path, ino = self.ino, error = %e, "a buffered write could not be stored; the next flush, fsync or close fails (ENOSPC for a full store, else EIO)");
                    self.error = Some(e);
                }
            }
        }
    }

    /// Commit everything buffered: the close-to-open point. Returns (and clears) the first
    /// error since the last flush.
    pub async fn flush(&mut self) -> Result<(), fs_core::Error> {
        self.seal();
        self.commit_all().await;
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Drop buffered data past `len` before a truncate (it is committed first by the caller's
    /// flush; this only keeps `end` right).
    pub fn truncated(&mut self, len: u64) {
        self.end = self.end.min(len);
    }
}
