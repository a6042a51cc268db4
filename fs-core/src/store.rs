//! The block store interface (implemented over OpenDAL in the `objstore` crate).

use crate::error::{corrupt, Result};
use async_trait::async_trait;
use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// Last-modified time in ns since the epoch, when the store reports one.
    pub modified_ns: Option<i64>,
    /// The store's entity tag, when it reports one (an S3 single-part upload's is the MD5 of
    /// the content; a multipart or SSE-KMS one is not: see `md5_etag`).
    pub etag: Option<String>,
}

impl ObjectMeta {
    /// The MD5 an entity tag stands for, when it has the shape of one (32 hex digits, no
    /// multipart suffix); None otherwise.
    pub fn md5_etag(&self) -> Option<[u8; 16]> {
        let t = self.etag.as_deref()?.trim_matches('"');
        if t.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    }
}

/// What a block must be: as long as its key names, and with the CRC32C its slice recorded
/// (format version 2; None on older volumes, which are checked by length only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCheck {
    pub len: u32,
    pub crc: Option<u32>,
}

impl BlockCheck {
    /// The check for block `key`: its length from the key itself, and `crc` if known.
    pub fn of_key(key: &str, crc: Option<u32>) -> Option<BlockCheck> {
        let len = key.rsplit('_').next()?.parse().ok()?;
        Some(BlockCheck { len, crc })
    }

    /// `Corrupt` naming the block and what is wrong, unless `data` is the block.
    pub fn verify(&self, key: &str, data: &[u8]) -> Result<()> {
        self.verify_summed(key, data.len(), || crc32c::crc32c(data))
    }

    /// `verify` of a block of `len` bytes whose CRC32C `crc` gives (called only when the
    /// check has one): for a reader that summed the bytes as they arrived.
    pub fn verify_summed(&self, key: &str, len: usize, crc: impl FnOnce() -> u32) -> Result<()> {
        if len != self.len as usize {
            return Err(corrupt(format!(
                "block {key} has {len} bytes, its key says {}",
                self.len
            )));
        }
        if let Some(want) = self.crc {
            let got = crc();
            if got != want {
                return Err(corrupt(format!(
                    "block {key} fails its checksum (CRC32C {got:08x}, its slice recorded {want:08x}): damaged at rest or in transit"
                )));
            }
        }
        Ok(())
    }
}

#[async_trait]
pub trait BlockStore: Send + Sync + 'static {
    /// The store URL, without credentials.
    fn display_url(&self) -> String;
    async fn put(&self, key: &str, data: Bytes) -> Result<()>;
    /// The whole object or an error (`NotFound`, or `Corrupt` when fewer bytes arrive).
    async fn get(&self, key: &str) -> Result<Bytes>;
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>>;
    /// Block `key`, verified against `want` (`Corrupt` when it fails). A layer that keeps
    /// copies (the local cache, a mirror's store) checks its copy and, when it is damaged,
    /// fetches the block again from below rather than serve it; layers that wrap another
    /// must pass this call down, not turn it into `get`.
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        let b = self.get(key).await?;
        want.verify(key, &b)?;
        Ok(b)
    }
    /// `get_block` for warm-up, which wants the block kept close: a mirror site's fallback
    /// layer also waits until a block read from the origin is in the mirror store.
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.get_block(key, want).await
    }
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

/// A layer of the store stack over one store below it (`below`): it implements only the
/// calls it changes; every other call goes down unchanged (OpenDAL's `LayeredAccess` shape).
/// Every `StoreLayer` is a `BlockStore`. A layer that keeps copies overrides `get_block`
/// (and `get_block_to_keep` when it must wait for its copy); it never turns one into `get`.
#[async_trait]
pub trait StoreLayer: Send + Sync + 'static {
    /// The store below this layer.
    fn below(&self) -> &dyn BlockStore;

    fn display_url(&self) -> String {
        self.below().display_url()
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.below().put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        self.below().get(key).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        self.below().head(key).await
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.below().get_block(key, want).await
    }
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.below().get_block_to_keep(key, want).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.below().delete(key).await
    }
    async fn check(&self) -> Result<()> {
        self.below().check().await
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        self.below().list(prefix, f).await
    }
}

#[async_trait]
impl<L: StoreLayer> BlockStore for L {
    fn display_url(&self) -> String {
        StoreLayer::display_url(self)
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        StoreLayer::put(self, key, data).await
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        StoreLayer::get(self, key).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        StoreLayer::head(self, key).await
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        StoreLayer::get_block(self, key, want).await
    }
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        StoreLayer::get_block_to_keep(self, key, want).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        StoreLayer::delete(self, key).await
    }
    async fn check(&self) -> Result<()> {
        StoreLayer::check(self).await
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        StoreLayer::list(self, prefix, f).await
    }
}

#[cfg(test)]
mod tests {
    use super::{BlockCheck, ObjectMeta};

    #[test]
    fn block_checks_name_what_is_wrong() {
        let key = crate::keys::block_key("v", 1, 0, 5);
        let c = BlockCheck::of_key(&key, Some(crc32c::crc32c(b"hello"))).unwrap();
        assert_eq!(c.len, 5);
        c.verify(&key, b"hello").unwrap();
        let e = c.verify(&key, b"hellO").unwrap_err().to_string();
        assert!(e.contains("fails its checksum") && e.contains(&key), "{e}");
        let e = c.verify(&key, b"hell").unwrap_err().to_string();
        assert!(e.contains("has 4 bytes"), "{e}");
        // No recorded checksum (format 1): the length alone.
        BlockCheck { len: 5, crc: None }
            .verify(&key, b"hellO")
            .unwrap();
    }

    #[test]
    fn only_md5_shaped_etags_count_as_checksums() {
        let m = |e: &str| ObjectMeta {
            key: "k".into(),
            size: 0,
            modified_ns: None,
            etag: Some(e.into()),
        };
        // MD5 of the empty string, as S3 quotes it.
        let e = m("\"d41d8cd98f00b204e9800998ecf8427e\"")
            .md5_etag()
            .unwrap();
        assert_eq!(e[0], 0xd4);
        assert_eq!(e[15], 0x7e);
        assert!(
            m("d41d8cd98f00b204e9800998ecf8427e-3").md5_etag().is_none(),
            "multipart"
        );
        assert!(m("W/\"abc\"").md5_etag().is_none());
        assert!(m("zz1d8cd98f00b204e9800998ecf8427e").md5_etag().is_none());
    }
}
