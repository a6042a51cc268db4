//! The block store interface (implemented over OpenDAL in the `objstore` crate).

use crate::error::Result;
use async_trait::async_trait;
use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// Last-modified time in ns since the epoch, when the store reports one.
    pub modified_ns: Option<i64>,
}

#[async_trait]
pub trait BlockStore: Send + Sync + 'static {
    /// The store URL, without credentials.
    fn display_url(&self) -> String;
    async fn put(&self, key: &str, data: Bytes) -> Result<()>;
    /// The whole object or an error (`NotFound`, or `Corrupt` when fewer bytes arrive).
    async fn get(&self, key: &str) -> Result<Bytes>;
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>>;
    async fn delete(&self, key: &str) -> Result<()>;
    /// Every object under `prefix`, recursively, in pages of at most `page` (calls `f` per
    /// page). A listing error is returned, never swallowed: gc relies on this to fail closed.
    /// Prove the store answers and the credentials work (before anything is written).
    async fn check(&self) -> Result<()> {
        Ok(())
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()>;
}
