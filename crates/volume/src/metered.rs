//! The metering layer: every call that reaches the store below, counted and timed (gets,
//! puts, bytes, errors, latency), so what a process costs its object store is visible.

use crate::metrics::StoreMetrics;
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::Result;
use fs_core::{BlockCheck, BlockStore, StoreLayer};
use std::sync::Arc;
use std::time::Instant;

/// The bottom of the stack's accounting: every call that reaches the object store.
pub struct MeteredStore {
    inner: Arc<dyn BlockStore>,
    metrics: Arc<StoreMetrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn BlockStore>, metrics: Arc<StoreMetrics>) -> MeteredStore {
        MeteredStore { inner, metrics }
    }
}

#[async_trait]
impl StoreLayer for MeteredStore {
    fn below(&self) -> &dyn BlockStore {
        &*self.inner
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        let n = data.len() as u64;
        let t0 = Instant::now();
        let r = self.inner.put(key, data).await;
        self.metrics.put_seconds.observe(t0.elapsed().as_secs_f64());
        match &r {
            Ok(()) => {
                self.metrics.puts.inc();
                self.metrics.put_bytes.inc_by(n);
            }
            Err(_) => {
                self.metrics.put_errors.inc();
            }
        }
        r
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        self.timed_get(key, None).await
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.timed_get(key, Some(want)).await
    }
}

impl MeteredStore {
    async fn timed_get(&self, key: &str, want: Option<BlockCheck>) -> Result<Bytes> {
        let t0 = Instant::now();
        let r = match want {
            Some(w) => self.inner.get_block(key, w).await,
            None => self.inner.get(key).await,
        };
        self.metrics.get_seconds.observe(t0.elapsed().as_secs_f64());
        match &r {
            Ok(b) => {
                self.metrics.gets.inc();
                self.metrics.get_bytes.inc_by(b.len() as u64);
            }
            Err(_) => {
                self.metrics.get_errors.inc();
            }
        }
        r
    }
}
