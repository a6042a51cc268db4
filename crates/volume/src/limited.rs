//! The limits layer: a store below it is called at most as fast as a `Limits` allows
//! (requests per second, and bytes per second, on a timetable if one is set). One `Limits`
//! may be shared by several layers (a mirror's copier charges its origin and its own store
//! against one budget); `Charge` says which calls of this layer pay bytes, so that a copy
//! (a read below one layer, a write below another) pays its bytes once.

use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::Result;
use fs_core::{BlockCheck, BlockStore, ObjectMeta, StoreLayer};
use objstore::limits::Limits;
use std::sync::Arc;

/// Which calls pay bytes (every call pays a request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Reads pay their bytes (a store data is copied from).
    Reads,
    /// Writes pay their bytes (a store data is copied into).
    Writes,
    /// Requests only (the other side of a copy already paid the bytes).
    Requests,
}

pub struct LimitedStore {
    inner: Arc<dyn BlockStore>,
    limits: Arc<Limits>,
    charge: Charge,
}

impl LimitedStore {
    pub fn new(inner: Arc<dyn BlockStore>, limits: Arc<Limits>, charge: Charge) -> LimitedStore {
        LimitedStore {
            inner,
            limits,
            charge,
        }
    }

    pub fn limits(&self) -> &Arc<Limits> {
        &self.limits
    }

    /// A read of `len` bytes (when known before it starts: a block key names its length).
    async fn before_read(&self, len: Option<u64>) {
        self.limits.request().await;
        if let (Charge::Reads, Some(n)) = (self.charge, len) {
            self.limits.bytes(n).await;
        }
    }

    /// Bytes of a read whose length was not known before it.
    async fn after_read(&self, known: bool, got: &Result<Bytes>) {
        if let (Charge::Reads, false, Ok(b)) = (self.charge, known, got) {
            self.limits.bytes(b.len() as u64).await;
        }
    }
}

#[async_trait]
impl StoreLayer for LimitedStore {
    fn below(&self) -> &dyn BlockStore {
        &*self.inner
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.limits.request().await;
        if self.charge == Charge::Writes {
            self.limits.bytes(data.len() as u64).await;
        }
        self.inner.put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        let len = BlockCheck::of_key(key, None).map(|c| c.len as u64);
        self.before_read(len).await;
        let r = self.inner.get(key).await;
        self.after_read(len.is_some(), &r).await;
        r
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.before_read(Some(want.len as u64)).await;
        self.inner.get_block(key, want).await
    }
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.before_read(Some(want.len as u64)).await;
        self.inner.get_block_to_keep(key, want).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        self.limits.request().await;
        self.inner.head(key).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.limits.request().await;
        self.inner.delete(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        self.limits.request().await;
        self.inner.list(prefix, f).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore::limits::BwSchedule;

    /// A store that answers every read with `n` bytes and counts calls.
    struct Fixed(std::sync::atomic::AtomicU64);

    #[async_trait]
    impl BlockStore for Fixed {
        fn display_url(&self) -> String {
            "fixed://".into()
        }
        async fn put(&self, _key: &str, _data: Bytes) -> Result<()> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        async fn get(&self, _key: &str) -> Result<Bytes> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Bytes::from(vec![7u8; 64 << 10]))
        }
        async fn head(&self, _key: &str) -> Result<Option<ObjectMeta>> {
            Ok(None)
        }
        async fn delete(&self, _key: &str) -> Result<()> {
            Ok(())
        }
        async fn list(
            &self,
            _prefix: &str,
            _f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
        ) -> Result<()> {
            Ok(())
        }
    }

    /// 1 MiB read through a 512 KiB/s limit takes about two seconds (the burst is a tenth
    /// of a second); the writes of a copy pay requests only; everything reaches the store.
    #[tokio::test]
    async fn reads_pay_bytes_and_writes_of_a_copy_pay_requests() {
        let below = Arc::new(Fixed(Default::default()));
        let limits = Arc::new(Limits::new(Some(BwSchedule::parse("512K").unwrap()), None).unwrap());
        let reads = LimitedStore::new(below.clone(), limits.clone(), Charge::Reads);
        let writes = LimitedStore::new(below.clone(), limits.clone(), Charge::Requests);
        let t0 = std::time::Instant::now();
        let mut got = 0;
        for _ in 0..16 {
            let b = StoreLayer::get(&reads, "not-a-block-key").await.unwrap();
            got += b.len();
            StoreLayer::put(&writes, "k", b).await.unwrap();
        }
        assert_eq!(got, 1 << 20);
        assert_eq!(below.0.load(std::sync::atomic::Ordering::SeqCst), 32);
        let took = t0.elapsed().as_secs_f64();
        assert!(
            (1.5..4.0).contains(&took),
            "1 MiB at 512 KiB/s took {took:.2} s"
        );
    }
}
