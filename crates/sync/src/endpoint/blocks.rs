//! The blocks a volume's metadata references, as a sync source: a storage cutover's backfill
//! copies them from the volume's store to the new one with the same engine as every other
//! sync (merge against the destination's listing, workers, limits, resume state, stats).
//!
//! The metadata is walked once (every chunk's slices, and the slices pending deletion, which
//! a lagging mirror may still read), and the block keys are sorted through a temporary
//! RocksDB beside the job's state, so memory stays bounded however many blocks the volume
//! has. Reads, and everything else, go to the store the blocks are in.

use super::{Endpoint, Entry, Kind, LocalDir, ObjectStore, Page, Sink, VolumeEndpoint};
use anyhow::{Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::keys::{self, Key};
use fs_core::{Engine, Settings, SliceRec};
use rocksdb::{IteratorMode, WriteBatch, DB};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Block keys in key order, each with its length and slice id.
pub struct BlockIndex {
    db: DB,
    dir: PathBuf,
    /// How many blocks.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Drop for BlockIndex {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn put_slice(s: &Settings, id: u64, size: u32, wb: &mut WriteBatch) {
    for (k, len) in keys::slice_block_keys(&s.name, id, size, s.block_size) {
        let mut v = len.to_be_bytes().to_vec();
        v.extend_from_slice(&id.to_be_bytes());
        wb.put(k.as_bytes(), v);
    }
}

impl BlockIndex {
    /// Walk the metadata and sort its block keys in a RocksDB under `dir` (removed on drop).
    pub async fn build(engine: &dyn Engine, settings: &Settings, dir: &Path) -> Result<BlockIndex> {
        let _ = std::fs::remove_dir_all(dir);
        cli_common::private::ensure_private_dir(
            dir,
            "block index directory",
            "choose another place for it",
        )?;
        let mut o = meta::base_options();
        o.create_if_missing(true);
        o.set_write_buffer_size(16 << 20);
        let db = DB::open(&o, dir)
            .with_context(|| format!("opening the block index {}", dir.display()))?;
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(true);
        fs_core::engine::scan_all(engine, b"", &[0xff], 1000, |page| {
            let mut wb = WriteBatch::default();
            for (k, v) in page {
                match keys::parse(&k) {
                    Key::Chunk(ino, idx) => {
                        let recs = SliceRec::decode_list(&v).ok_or_else(|| {
                            fs_core::error::corrupt(format!(
                                "chunk {idx} of inode {ino} does not decode"
                            ))
                        })?;
                        for r in recs.iter().filter(|r| r.id != 0) {
                            put_slice(settings, r.id, r.size, &mut wb);
                        }
                    }
                    Key::Pending(id, size) => put_slice(settings, id, size, &mut wb),
                    _ => {}
                }
            }
            db.write_opt(wb, &wo).map_err(|e| {
                fs_core::Error::new(
                    fs_core::ErrorKind::Backend,
                    format!("writing the block index: {e}"),
                )
            })
        })
        .await
        .context("walking the volume's metadata")?;
        let (mut blocks, mut bytes) = (0u64, 0u64);
        for item in db.iterator(IteratorMode::Start) {
            let (_, v) = item.context("reading the block index")?;
            blocks += 1;
            bytes += u32::from_be_bytes(v[..4].try_into().expect("4 bytes")) as u64;
        }
        Ok(BlockIndex {
            db,
            dir: dir.to_path_buf(),
            blocks,
            bytes,
        })
    }

    /// Up to `n` blocks after `after` (None: from the first): (key, len, slice id).
    pub fn page(&self, after: Option<&str>, n: usize) -> Result<Vec<(String, u32, u64)>> {
        let mode = match after {
            Some(a) => IteratorMode::From(a.as_bytes(), rocksdb::Direction::Forward),
            None => IteratorMode::Start,
        };
        let mut out = Vec::with_capacity(n);
        for item in self.db.iterator(mode) {
            let (k, v) = item.context("reading the block index")?;
            let key = String::from_utf8_lossy(&k).into_owned();
            if after.is_some_and(|a| key.as_str() <= a) {
                continue;
            }
            out.push((
                key,
                u32::from_be_bytes(v[..4].try_into().expect("4 bytes")),
                u64::from_be_bytes(v[4..12].try_into().expect("8 bytes")),
            ));
            if out.len() >= n {
                break;
            }
        }
        Ok(out)
    }
}

/// The referenced blocks of a volume, read from `store` (where they are).
pub struct BlocksEndpoint {
    store: Arc<dyn Endpoint>,
    index: Arc<BlockIndex>,
}

impl BlocksEndpoint {
    pub fn new(store: Arc<dyn Endpoint>, index: Arc<BlockIndex>) -> BlocksEndpoint {
        BlocksEndpoint { store, index }
    }
}

#[async_trait]
impl Endpoint for BlocksEndpoint {
    fn describe(&self) -> String {
        format!(
            "the blocks the metadata references, in {}",
            self.store.describe()
        )
    }
    fn mtime_precision_ns(&self) -> i64 {
        self.store.mtime_precision_ns()
    }
    fn mtime_is_upload(&self) -> bool {
        self.store.mtime_is_upload()
    }
    async fn list(&self, l: super::Listing<'_>, tx: mpsc::Sender<Page>) -> Result<()> {
        let (prefix, range) = (l.prefix, l.range);
        let mut after = range.start_after();
        loop {
            let page = self.index.page(after.as_deref(), 1000)?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = Some(last.0.clone());
            let done = range.past(&last.0);
            let entries: Vec<Entry> = page
                .into_iter()
                .filter(|(k, _, _)| k.starts_with(prefix) && range.contains(k))
                .map(|(key, len, _)| Entry {
                    key,
                    kind: Kind::File,
                    size: len as u64,
                    // Blocks are immutable: the sync compares sizes only.
                    mtime_ns: 0,
                    mode: None,
                    target: None,
                    owner: None,
                })
                .collect();
            if tx.send(Ok(entries)).await.is_err() || done {
                return Ok(());
            }
        }
    }
    async fn list_level(&self, _prefix: &str) -> Result<Vec<Entry>> {
        Err(anyhow::Error::new(super::TooWide))
    }
    async fn stat(&self, key: &str) -> Result<Option<Entry>> {
        self.store.stat(key).await
    }
    async fn read(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        self.store.read(key, offset, len).await
    }
    async fn sink(&self, key: &str, size: u64) -> Result<Box<dyn Sink>> {
        self.store.sink(key, size).await
    }
    async fn mkdir(&self, key: &str, src: &Entry, perms: bool) -> Result<()> {
        self.store.mkdir(key, src, perms).await
    }
    async fn symlink(&self, key: &str, target: &str) -> Result<()> {
        self.store.symlink(key, target).await
    }
    async fn delete(&self, _key: &str, _kind: Kind) -> Result<()> {
        anyhow::bail!("a volume's blocks are never deleted through a backfill")
    }
    async fn server_side_copy(&self, from: &dyn Endpoint, key: &str, size: u64) -> Result<bool> {
        self.store.server_side_copy(from, key, size).await
    }
    fn as_object_store(&self) -> Option<&ObjectStore> {
        self.store.as_object_store()
    }
    fn as_local(&self) -> Option<&LocalDir> {
        self.store.as_local()
    }
    fn as_volume(&self) -> Option<&VolumeEndpoint> {
        None
    }
}
