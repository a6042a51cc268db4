//! The read layer of the stack: the local disk cache first (its copy checked against the
//! slice's checksum), then one fetch per block from below however many readers want it at
//! once (singleflight), filling the cache in the background. Writes and listings pass
//! through; a delete also drops the cached copy.

use crate::cache::DiskCache;
use crate::metrics::StoreMetrics;
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::{BlockCheck, BlockStore, StoreLayer};
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// Background fills in flight at most; more are skipped (the block is simply not cached).
const FILLS_IN_FLIGHT: usize = 32;

type Flight = Shared<BoxFuture<'static, Result<Bytes>>>;

/// Takes a fetch out of its singleflight map when dropped: at the fetch's end, where the
/// fetch drops it, or while a panic in the fetch unwinds. A fetch left in the map after a
/// panic would hand that same panic to every later reader of its block until the mount
/// restarted (a `Shared` future that panicked panics again at every poll).
pub(crate) struct Landing<V> {
    pub(crate) flights: Arc<Mutex<HashMap<String, V>>>,
    pub(crate) key: String,
}

impl<V> Drop for Landing<V> {
    fn drop(&mut self) {
        self.flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// The read side of the stack: the local cache first, then one fetch per block however many
/// readers want it at once (singleflight), filling the cache in the background.
pub struct CachedStore {
    inner: Arc<dyn BlockStore>,
    cache: Option<Arc<DiskCache>>,
    metrics: Arc<StoreMetrics>,
    flights: Arc<Mutex<HashMap<String, Flight>>>,
    fills: Arc<Semaphore>,
}

impl CachedStore {
    pub fn new(
        inner: Arc<dyn BlockStore>,
        cache: Option<Arc<DiskCache>>,
        metrics: Arc<StoreMetrics>,
    ) -> CachedStore {
        CachedStore {
            inner,
            cache,
            metrics,
            flights: Default::default(),
            fills: Arc::new(Semaphore::new(FILLS_IN_FLIGHT)),
        }
    }

    /// The one fetch of `key` from below (checked against `want` when given).
    fn flight(&self, key: &str, fill: bool, want: Option<BlockCheck>) -> Flight {
        let mut m = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = m.get(key) {
            return f.clone();
        }
        let inner = self.inner.clone();
        let flights = self.flights.clone();
        let cache = self.cache.clone().filter(|_| fill);
        let fills = self.fills.clone();
        let metrics = self.metrics.clone();
        let k = key.to_string();
        let f = async move {
            let landing = Landing {
                flights,
                key: k.clone(),
            };
            let r = match want {
                Some(w) => inner.get_block(&k, w).await,
                None => inner.get(&k).await,
            };
            drop(landing);
            if let (Ok(b), Some(c)) = (&r, cache) {
                match fills.try_acquire_owned() {
                    Ok(permit) => {
                        let b = b.clone();
                        tokio::spawn(async move {
                            let crc = want.and_then(|w| w.crc);
                            if let Err(e) = c.insert_checked(&k, b, crc).await {
                                tracing::warn!(error = %e, "caching a block failed; reads go to the store");
                            }
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        metrics.cache_skipped.inc();
                    }
                }
            }
            r
        }
        .boxed()
        .shared();
        m.insert(key.to_string(), f.clone());
        f
    }

    /// Make sure block `key` is in the local cache (durable once `DiskCache::sync` returns:
    /// a warm-up syncs once at its end). Ok(true): fetched now; Ok(false): it was there. An
    /// error when there is no cache or the block does not fit.
    pub async fn warm(&self, key: &str, want: BlockCheck) -> Result<bool> {
        let Some(c) = &self.cache else {
            return Err(Error::new(
                ErrorKind::Config,
                "this mount has no local cache (mount it with --cache-size above 0)",
            ));
        };
        if c.contains(key) {
            return Ok(false);
        }
        let b = self.inner.get_block_to_keep(key, want).await?;
        if !c.insert_checked(key, b, want.crc).await? {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "the local cache is full ({} bytes, or its disk is at the free-space floor): block {key} not cached",
                    c.capacity
                ),
            ));
        }
        Ok(true)
    }

    pub fn cache(&self) -> Option<&Arc<DiskCache>> {
        self.cache.as_ref()
    }

    /// Block `key` for a whole-file copy (which holds the bytes itself): the cached copy if
    /// there is one (true), else one fetch from below that fills no cache (false).
    pub async fn get_block_for_copy(&self, key: &str, want: BlockCheck) -> Result<(Bytes, bool)> {
        if let Some(c) = self.cache.as_ref().filter(|c| c.cacheable(key)) {
            if let Some(b) = c.lookup(key, want.crc).await {
                self.metrics.cache_hits.inc();
                self.metrics.cache_hit_bytes.inc_by(b.len() as u64);
                return Ok((b, true));
            }
        }
        let b = self.flight(key, false, Some(want)).await?;
        Ok((b, false))
    }

    /// The cache first (its copy checked against the slice's checksum when `want` has
    /// one), then one fetch from below.
    async fn read(&self, key: &str, want: Option<BlockCheck>) -> Result<Bytes> {
        let Some(c) = self.cache.as_ref().filter(|c| c.cacheable(key)) else {
            return match want {
                Some(w) => self.inner.get_block(key, w).await,
                None => self.inner.get(key).await,
            };
        };
        if let Some(b) = c.lookup(key, want.and_then(|w| w.crc)).await {
            self.metrics.cache_hits.inc();
            self.metrics.cache_hit_bytes.inc_by(b.len() as u64);
            return Ok(b);
        }
        let b = self.flight(key, true, want).await?;
        self.metrics.cache_misses.inc();
        self.metrics.cache_miss_bytes.inc_by(b.len() as u64);
        Ok(b)
    }
}

#[async_trait]
impl StoreLayer for CachedStore {
    fn below(&self) -> &dyn BlockStore {
        &*self.inner
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        self.read(key, None).await
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.read(key, Some(want)).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        if let Some(c) = &self.cache {
            c.remove(key);
        }
        self.inner.delete(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fallback::FallbackStore;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Over a `memory://` store: the first block read panics (a bug below), later reads go
    /// down.
    struct PanicsOnce {
        below: Arc<dyn BlockStore>,
        reads: AtomicU64,
    }

    #[async_trait]
    impl StoreLayer for PanicsOnce {
        fn below(&self) -> &dyn BlockStore {
            &*self.below
        }
        async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
            if self.reads.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("a bug in the store below");
            }
            self.below.get_block(key, want).await
        }
    }

    fn key() -> String {
        fs_core::keys::block_key("vol", 1, 0, 3)
    }

    /// A store holding block `key()` (`abc`) whose first read panics.
    async fn panics_once() -> Arc<PanicsOnce> {
        let below = crate::open_store("memory://", None).unwrap();
        below.put(&key(), Bytes::from_static(b"abc")).await.unwrap();
        Arc::new(PanicsOnce {
            below,
            reads: AtomicU64::new(0),
        })
    }

    const WANT: BlockCheck = BlockCheck { len: 3, crc: None };

    /// The read that met the panic fails (its task panics, as before); the next read of the
    /// same block fetches it again instead of meeting the same panic.
    async fn read_after_a_panic<S: StoreLayer>(s: Arc<S>, below: &PanicsOnce) {
        let s2 = s.clone();
        let first = tokio::spawn(async move { StoreLayer::get_block(&*s2, &key(), WANT).await });
        assert!(first.await.unwrap_err().is_panic());
        let b = StoreLayer::get_block(&*s, &key(), WANT).await.unwrap();
        assert_eq!(&b[..], b"abc");
        assert_eq!(below.reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_fetch_that_panicked_is_not_handed_to_later_readers() {
        // With a local cache: without one, reads go straight below, one fetch each.
        let d = tempfile::tempdir().unwrap();
        let cache = crate::cache::tests::open(d.path(), 1 << 20);
        let below = panics_once().await;
        let c = Arc::new(CachedStore::new(
            below.clone(),
            Some(cache),
            Default::default(),
        ));
        read_after_a_panic(c.clone(), &below).await;
        assert!(c.flights.lock().unwrap().is_empty());

        let origin = panics_once().await;
        let mirror = crate::open_store("memory://", None).unwrap();
        let f = Arc::new(FallbackStore::new(
            mirror,
            origin.clone(),
            true,
            Default::default(),
        ));
        read_after_a_panic(f, &origin).await;
    }
}
