//! Memory a process may hold in read-ahead and write buffers, shared by every reader and
//! writer of the process (permits are KiB).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes a process may hold in read-ahead and write buffers. Permits are KiB.
#[derive(Clone)]
pub struct Budget {
    sem: Arc<Semaphore>,
    total_kib: usize,
    /// A small reserve past the budget, for the block a read is in (`try_take_spare`).
    spare: Arc<Semaphore>,
}

/// The reserve past the budget, for the whole process.
pub const SPARE: u64 = 64 << 20;

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        let kib = (bytes >> 10).clamp(1, u32::MAX as u64 >> 4) as usize;
        Budget {
            sem: Arc::new(Semaphore::new(kib)),
            total_kib: kib,
            spare: Arc::new(Semaphore::new((SPARE >> 10) as usize)),
        }
    }
    /// Take room for `bytes` now, if there is any.
    pub fn try_take(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).max(1) as u32;
        self.sem.clone().try_acquire_many_owned(kib).ok()
    }
    /// Take room for `bytes` from the reserve past the budget, if there is any: for a block
    /// a read needs, once the budget is spent (without it each piece of the block would be
    /// fetched whole again). The process holds at most `SPARE` so.
    pub fn try_take_spare(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).max(1) as u32;
        self.spare.clone().try_acquire_many_owned(kib).ok()
    }
    /// Bytes of the reserve in use now.
    pub fn spare_used(&self) -> u64 {
        ((SPARE >> 10) as usize - self.spare.available_permits()) as u64 * 1024
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
