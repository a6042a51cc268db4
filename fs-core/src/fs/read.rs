//! Reading files: a read is planned (`layout`) from the chunks' slice records, then its
//! blocks are fetched from the store and checked against their checksums.

use super::layout::{decode_chunk, plan_chunk, Chunk, Piece, Plan};
use super::Fs;
use crate::engine::Engine;
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::keys;
use crate::store::BlockCheck;
use crate::types::{FileKind, Ino, SliceRec, CHUNK_SIZE};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::sync::Arc;

/// The block checksums of slices `ids` (format 2), read in one round trip per 4096 slices:
/// slice id to the CRC32C of each block. Slices without a record, or with one that does not
/// decode, are absent (callers decide whether that is an error).
pub async fn slice_checksums(engine: &dyn Engine, ids: &[u64]) -> Result<HashMap<u64, Vec<u32>>> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut out = HashMap::with_capacity(ids.len());
    for part in ids.chunks(4096) {
        let keys: Vec<Vec<u8>> = part.iter().map(|&id| keys::checksums(id)).collect();
        for (&id, v) in part.iter().zip(engine.get_many(&keys).await?) {
            if let Some(c) = v.as_deref().and_then(keys::decode_checksums) {
                out.insert(id, c);
            }
        }
    }
    Ok(out)
}

impl Fs {
    /// Exactly what `ino` holds now: its attributes, and its length followed by every chunk
    /// record, raw (read in one round trip). Slices are immutable and never reuse an id, so
    /// two equal versions show the same bytes; any commit, truncate or compaction changes it.
    /// The whole-file cache entries behind FUSE passthrough are keyed by it.
    pub async fn content_version(&self, ino: Ino) -> Result<(crate::types::Attr, Vec<u8>)> {
        let attr = self.getattr(ino).await?;
        if attr.kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a file"),
            ));
        }
        let n = attr.length.div_ceil(CHUNK_SIZE) as u32;
        let keys: Vec<Vec<u8>> = (0..n).map(|i| keys::chunk(ino, i)).collect();
        let mut v = attr.length.to_be_bytes().to_vec();
        for (i, rec) in self.engine.get_many(&keys).await?.into_iter().enumerate() {
            if let Some(rec) = rec {
                v.extend_from_slice(&(i as u32).to_be_bytes());
                v.extend_from_slice(&(rec.len() as u32).to_be_bytes());
                v.extend_from_slice(&rec);
            }
        }
        Ok((attr, v))
    }

    /// The chunk records of chunk `idx` of `ino`.
    pub async fn chunk_records(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRec>> {
        decode_chunk(ino, idx, self.engine.get(&keys::chunk(ino, idx)).await?)
    }

    /// Chunk `idx` of `ino` with the checksums of its slices.
    pub async fn load_chunk(&self, ino: Ino, idx: u32) -> Result<Chunk> {
        let recs = self.chunk_records(ino, idx).await?;
        self.with_sums(recs).await
    }

    /// `recs` with the block checksums of the slices they name (none on a format-1 volume).
    /// A format-2 slice without its record is damaged metadata, refused rather than read
    /// unchecked.
    pub async fn with_sums(&self, recs: Vec<SliceRec>) -> Result<Chunk> {
        let mut sums = HashMap::new();
        if self.settings.checksums() {
            let ids: Vec<u64> = recs.iter().filter(|r| r.id != 0).map(|r| r.id).collect();
            sums = slice_checksums(&*self.engine, &ids).await?;
            if let Some(id) = ids.iter().find(|id| !sums.contains_key(id)) {
                return Err(corrupt(format!("slice {id} has no valid checksum record (this volume records one per slice): damaged metadata; `jfs fsck` names the files")));
            }
        }
        Ok(Chunk { recs, sums })
    }

    /// Plan a read of up to `len` bytes at `offset` of `ino` (short at the end of the file).
    pub async fn plan_read(&self, ino: Ino, offset: u64, len: usize) -> Result<Plan> {
        let attr = self.getattr(ino).await?;
        if attr.kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a regular file"),
            ));
        }
        let mut chunks = HashMap::new();
        let end = (offset + len as u64).min(attr.length);
        let mut i = (offset / CHUNK_SIZE) as u32;
        while offset < end && (i as u64) * CHUNK_SIZE < end {
            chunks.insert(i, Arc::new(self.load_chunk(ino, i).await?));
            i += 1;
        }
        Ok(self.plan_with(&chunks, attr.length, offset, len))
    }

    /// Plan from chunk records already at hand (`chunks` must hold every chunk the range
    /// touches; a missing one reads as a hole).
    pub fn plan_with(
        &self,
        chunks: &HashMap<u32, Arc<Chunk>>,
        length: u64,
        offset: u64,
        len: usize,
    ) -> Plan {
        let end = (offset.saturating_add(len as u64)).min(length);
        let mut plan = Plan {
            offset,
            len: end.saturating_sub(offset) as usize,
            pieces: Vec::new(),
        };
        let mut off = offset;
        while off < end {
            let idx = (off / CHUNK_SIZE) as u32;
            let cstart = (off % CHUNK_SIZE) as u32;
            let cend = (((idx as u64 + 1) * CHUNK_SIZE).min(end) - idx as u64 * CHUNK_SIZE) as u32;
            if let Some(c) = chunks.get(&idx) {
                plan_chunk(
                    &self.settings,
                    c,
                    cstart,
                    cend,
                    (off - offset) as usize,
                    &mut plan.pieces,
                );
            }
            off = idx as u64 * CHUNK_SIZE + cend as u64;
        }
        plan
    }

    /// One block, checked against the length its key gives and its recorded checksum.
    pub async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.store.get_block(key, want).await
    }

    /// Fetch a plan's blocks (in parallel) and assemble its bytes.
    pub async fn fetch(&self, plan: &Plan) -> Result<Vec<u8>> {
        let mut out = vec![0u8; plan.len];
        let wanted: Vec<(String, BlockCheck, usize, usize, usize)> = plan
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Block {
                    key,
                    check,
                    from,
                    len,
                    dst,
                } => Some((key.clone(), *check, *from, *len, *dst)),
                Piece::Zeros { .. } => None,
            })
            .collect();
        let fetched: Vec<(Bytes, usize, usize, usize)> = futures::stream::iter(wanted)
            .map(|(key, want, from, len, dst)| async move {
                let b = self.get_block(&key, want).await?;
                Ok::<_, Error>((b, from, len, dst))
            })
            .buffered(self.io_parallel)
            .try_collect()
            .await?;
        for (b, from, n, d) in fetched {
            out[d..d + n].copy_from_slice(&b[from..from + n]);
        }
        Ok(out)
    }
}
