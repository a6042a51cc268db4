//! Block buffers for writes: page-aligned, one block long, reused.
//!
//! A large write used to append into a growing `Vec`: each doubling copied what was there
//! and faulted in fresh pages, and the store then copied the block once more into the page
//! cache. A `BlockBuf` is one block of room whose bytes start on a 4 KiB boundary, so a
//! `file://` store can write it with `O_DIRECT` (no page-cache copy), and whose memory goes
//! back to a `BlockPool` when the last `Bytes` made of it is dropped (already faulted in
//! for the next block). The pool keeps at most `keep` buffers; others are freed.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// The alignment of a buffer's first byte: what `O_DIRECT` asks of memory on Linux.
pub const ALIGN: usize = 4096;

/// Reusable block buffers of one size.
pub struct BlockPool {
    size: usize,
    keep: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl BlockPool {
    /// A pool of buffers of `size` bytes that keeps at most `keep` of them for reuse.
    pub fn new(size: usize, keep: usize) -> Arc<BlockPool> {
        Arc::new(BlockPool {
            size,
            keep,
            free: Mutex::new(Vec::new()),
        })
    }

    /// The size of each buffer.
    pub fn block_size(&self) -> usize {
        self.size
    }

    /// An empty buffer, reused when one is free.
    pub fn take(self: &Arc<Self>) -> BlockBuf {
        let mem = self
            .free
            .lock()
            .expect("the block pool's lock is never poisoned")
            .pop()
            // Zeroed memory comes from fresh pages; the slack lets the data start aligned.
            .unwrap_or_else(|| vec![0u8; self.size + ALIGN]);
        let off = mem.as_ptr().align_offset(ALIGN);
        BlockBuf {
            mem,
            off,
            len: 0,
            pool: self.clone(),
        }
    }

    /// Buffers kept for reuse now.
    pub fn kept(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    fn give_back(&self, mem: Vec<u8>) {
        if let Ok(mut f) = self.free.lock() {
            if f.len() < self.keep {
                f.push(mem);
            }
        }
    }
}

/// One block of room, filled by `extend`, then frozen into `Bytes` by `freeze`.
pub struct BlockBuf {
    mem: Vec<u8>,
    off: usize,
    len: usize,
    pool: Arc<BlockPool>,
}

impl BlockBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Room left.
    pub fn room(&self) -> usize {
        self.pool.size - self.len
    }
    /// Append as much of `data` as fits; returns how much did.
    pub fn extend(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.room());
        let at = self.off + self.len;
        self.mem[at..at + n].copy_from_slice(&data[..n]);
        self.len += n;
        n
    }
    /// Fill the buffer from `read` (called with the room left, which starts on a 4 KiB
    /// boundary while everything read so far is whole pages) until it returns 0 or the
    /// buffer is full. For `O_DIRECT` reads.
    pub fn fill(
        &mut self,
        mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<()> {
        while self.room() > 0 {
            let at = self.off + self.len;
            let end = self.off + self.pool.size;
            let n = read(&mut self.mem[at..end])?;
            if n == 0 {
                break;
            }
            self.len += n;
        }
        Ok(())
    }
    /// The bytes written so far, as `Bytes` that give the memory back to the pool when the
    /// last of them is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        &self.mem[self.off..self.off + self.len]
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.mem));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_filled_in_order_and_reused() {
        let pool = BlockPool::new(64 << 10, 2);
        let mut b = pool.take();
        assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.extend(&[1u8; 40 << 10]), 40 << 10);
        // Only what fits is taken.
        assert_eq!(b.extend(&[2u8; 40 << 10]), 24 << 10);
        assert_eq!(b.room(), 0);
        let bytes = b.freeze();
        assert_eq!(bytes.len(), 64 << 10);
        assert_eq!(bytes.as_ptr() as usize % ALIGN, 0);
        assert!(bytes[..40 << 10].iter().all(|&x| x == 1));
        assert!(bytes[40 << 10..].iter().all(|&x| x == 2));
        let part = bytes.slice(4096..8192);
        drop(bytes);
        // Still held by `part`.
        assert_eq!(pool.kept(), 0);
        drop(part);
        assert_eq!(pool.kept(), 1);
        // The next buffer reuses that memory and starts empty.
        let b = pool.take();
        assert!(b.is_empty());
        assert_eq!(pool.kept(), 0);
        // Filled by a reader, in pieces, up to its end or the buffer's.
        let mut b = pool.take();
        let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut at = 0;
        b.fill(|room| {
            assert_eq!(room.as_ptr() as usize % ALIGN, 0);
            let n = room.len().min(src.len() - at).min(8192);
            room[..n].copy_from_slice(&src[at..at + n]);
            at += n;
            Ok(n)
        })
        .unwrap();
        assert_eq!(b.as_ref(), &src[..64 << 10]);
        drop(b);
        let b = pool.take();
        // At most `keep` are kept.
        let (x, y, z) = (pool.take(), pool.take(), pool.take());
        drop((b, x, y, z));
        assert_eq!(pool.kept(), 2);
    }
}
