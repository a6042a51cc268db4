//! File data: slices written as immutable blocks, read back through the chunk's slice view,
//! truncate without touching data, and compaction of chunks with many slices.
//!
//! Write order: every block of a slice is durably in the store before the transaction that
//! references the slice commits. A crash in between leaves unreferenced objects for `gc`.

use super::layout::decode_chunk;
use super::{get_attr, put_attr, transact, Fs};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::journal::Op;
use crate::keys;
use crate::storage::{self, Placement};
use crate::store::BlockCheck;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, FileKind, Ino, SliceRec, CHUNK_SIZE, MAX_FILE_LEN};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Fence a commit that references blocks placed under generation `gen` (read in the
/// transaction, so a transition committed meanwhile makes it conflict and re-check).
pub(crate) async fn check_generation(tx: &mut Txn<'_>, gen: u64) -> Result<()> {
    let now = storage::gen_of(tx.get(keys::STORAGE).await?.as_deref())?;
    if now != gen {
        return Err(storage::fenced(gen, now));
    }
    Ok(())
}

/// Files of up to this many chunks (4 GiB) have their chunk records freed by key (see
/// `Fs::free_file_chunks`).
const FREE_BY_KEY: u64 = 64;

/// Delete chunk records (`(key, value)` as read) and let go of the slices they reference:
/// each record holds one reference to each slice it names (see `release_slices`).
async fn free_chunk_records(
    tx: &mut Txn<'_>,
    ino: Ino,
    records: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<()> {
    let mut released = Vec::new();
    for (k, v) in records {
        let recs = SliceRec::decode_list(&v)
            .ok_or_else(|| corrupt(format!("chunk of inode {ino} does not decode")))?;
        let one: BTreeSet<(u64, u32)> = recs
            .iter()
            .filter(|r| r.id != 0)
            .map(|r| (r.id, r.size))
            .collect();
        released.extend(one);
        tx.delete(k);
    }
    release_slices(tx, &released).await
}

/// Take one reference away from each slice of `slices` (one item per chunk record that let
/// go of it): a slice a clone still shares loses a count (`keys::refs`); the last reference
/// stamps its pending delete. The counts are read in the transaction, so a clone that adds
/// a reference meanwhile makes the commit conflict and re-run.
pub(crate) async fn release_slices(tx: &mut Txn<'_>, slices: &[(u64, u32)]) -> Result<()> {
    if slices.is_empty() {
        return Ok(());
    }
    let keys: Vec<Vec<u8>> = slices.iter().map(|(id, _)| keys::refs(*id)).collect();
    tx.prefetch(&keys).await?;
    for &(id, size) in slices {
        let k = keys::refs(id);
        let extra = match tx.get(&k).await? {
            None => 0,
            Some(v) => crate::journal::parse_counter(Some(&v))
                .map_err(|e| e.context(format!("the reference count of slice {id}")))?,
        };
        if extra > 0 {
            if extra == 1 {
                tx.delete(k);
            } else {
                tx.put(k, (extra - 1).to_string().into_bytes());
            }
        } else {
            if extra < 0 {
                return Err(corrupt(format!(
                    "slice {id} has a negative reference count ({extra})"
                )));
            }
            tx.stamp(keys::pending(id, size));
        }
    }
    Ok(())
}

/// A slice whose blocks are in the store, not yet referenced (see `Fs::upload_slice`).
#[derive(Debug, Clone)]
pub struct NewSlice {
    pub id: u64,
    pub len: u32,
    /// CRC32C of each block, in block order (empty on a format-1 volume).
    pub crcs: Vec<u32>,
    /// Where its blocks were put: a commit is fenced unless this is still the volume's
    /// storage generation (see `storage`).
    pub placed: Arc<Placement>,
}

impl PartialEq for NewSlice {
    fn eq(&self, o: &Self) -> bool {
        (self.id, self.len, &self.crcs, self.placed.gen) == (o.id, o.len, &o.crcs, o.placed.gen)
    }
}

impl NewSlice {
    fn record_checksums(&self, tx: &mut Txn<'_>) {
        if !self.crcs.is_empty() {
            tx.put(keys::checksums(self.id), keys::encode_checksums(&self.crcs));
        }
    }
}

/// Buffers contiguous writes (as `torch.save` and many writers issue: small appends) and
/// commits them as few large slices. `flush` (or dropping past a chunk boundary) commits.
pub struct FileWriter<'a> {
    fs: &'a Fs,
    ino: Ino,
    start: u64,
    buf: Vec<u8>,
    limit: usize,
}

impl FileWriter<'_> {
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        if !self.buf.is_empty() && offset != self.start + self.buf.len() as u64 {
            self.flush().await?;
        }
        if self.buf.is_empty() {
            self.start = offset;
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= self.limit {
            self.flush().await?;
        }
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::take(&mut self.buf);
        self.fs.write(self.ino, self.start, &data).await
    }
}

impl Fs {
    /// A buffered writer for `ino` (flushes every `limit` bytes, at least one block).
    pub fn writer(&self, ino: Ino) -> FileWriter<'_> {
        FileWriter {
            fs: self,
            ino,
            start: 0,
            buf: Vec::new(),
            limit: (self.settings.block_size as usize) * 4,
        }
    }

    /// Object keys of the blocks of slice `id` of `size` bytes.
    pub fn slice_block_keys(&self, id: u64, size: u32) -> Vec<(String, u32)> {
        keys::slice_block_keys(&self.settings.name, id, size, self.settings.block_size).collect()
    }

    /// Upload `data` as a new slice; returns it once every block is in the store. The
    /// slice is referenced by nothing until `commit_slice` (a crash in between leaves
    /// unreferenced blocks for gc). The checksum of each block is taken from the bytes
    /// handed to the store, before they leave this process.
    pub async fn upload_slice(&self, data: Bytes) -> Result<NewSlice> {
        let bs = self.settings.block_size as usize;
        let blocks = (0..data.len())
            .step_by(bs)
            .map(|off| data.slice(off..(off + bs).min(data.len())))
            .collect();
        self.upload_blocks(blocks).await
    }

    /// `upload_slice` for a slice already cut into its blocks: every one but the last is
    /// exactly one block long (the mount's writer fills `BlockBuf`s this way, so each block
    /// goes to the store from the memory it was written into).
    pub async fn upload_blocks(&self, blocks: Vec<Bytes>) -> Result<NewSlice> {
        let bs = self.settings.block_size as usize;
        let len: usize = blocks.iter().map(|b| b.len()).sum();
        let n = blocks.len();
        if blocks
            .iter()
            .enumerate()
            .any(|(i, b)| b.len() > bs || (i + 1 < n && b.len() != bs) || (b.is_empty() && n > 1))
        {
            return Err(invalid(format!(
                "a slice's blocks must each be {bs} bytes but the last: got {:?}",
                blocks.iter().map(|b| b.len()).collect::<Vec<_>>()
            )));
        }
        let placed = self.placement.current();
        let id = self.alloc_slice().await?;
        let keys = keys::slice_block_keys(&self.settings.name, id, len as u32, bs as u32);
        let blocks: Vec<(String, Bytes)> = keys.map(|(k, _)| k).zip(blocks).collect();
        let crcs = if self.settings.checksums() {
            blocks.iter().map(|(_, b)| crc32c::crc32c(b)).collect()
        } else {
            Vec::new()
        };
        let store = &placed.store;
        futures::stream::iter(
            blocks
                .into_iter()
                .map(|(k, b)| async move { store.put(&k, b).await }),
        )
        .buffer_unordered(self.io_parallel)
        .try_collect::<Vec<()>>()
        .await?;
        Ok(NewSlice {
            id,
            len: len as u32,
            crcs,
            placed,
        })
    }

    /// A slice uploaded under an older storage generation: copy its blocks (read back
    /// through the stores they were put in) to where generation `to` places blocks.
    async fn place_again(&self, slice: &NewSlice, to: &Placement) -> Result<()> {
        let from = &slice.placed.store;
        let blocks: Vec<(usize, (String, u32))> = self
            .slice_block_keys(slice.id, slice.len)
            .into_iter()
            .enumerate()
            .collect();
        futures::stream::iter(blocks.into_iter().map(|(i, (k, len))| async move {
            let want = BlockCheck {
                len,
                crc: slice.crcs.get(i).copied(),
            };
            let b = from.get_block(&k, want).await?;
            to.store.put(&k, b).await
        }))
        .buffer_unordered(self.io_parallel)
        .try_collect::<Vec<()>>()
        .await?;
        Ok(())
    }

    /// Write `data` at `offset`: one slice per chunk touched, each committed after its blocks.
    pub async fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_LEN);
        if end.is_none() {
            return Err(invalid(format!(
                "write past the {MAX_FILE_LEN}-byte file size limit"
            )));
        }
        let mut done = 0usize;
        while done < data.len() {
            let off = offset + done as u64;
            let idx = (off / CHUNK_SIZE) as u32;
            let pos = (off % CHUNK_SIZE) as u32;
            let n = ((CHUNK_SIZE - pos as u64) as usize).min(data.len() - done);
            self.write_chunk(ino, idx, pos, Bytes::copy_from_slice(&data[done..done + n]))
                .await?;
            done += n;
        }
        Ok(())
    }

    async fn write_chunk(&self, ino: Ino, idx: u32, pos: u32, data: Bytes) -> Result<()> {
        // Refuse early (before uploading) if the inode is not a regular file.
        let kind = self.getattr(ino).await?.kind;
        if kind != FileKind::File {
            return Err(Error::new(
                ErrorKind::IsDir,
                format!("inode {ino} is not a regular file"),
            ));
        }
        let slice = self.upload_slice(data).await?;
        self.commit_slice(ino, idx, pos, &slice).await
    }

    /// Reference `slice` (uploaded by `upload_slice`) at `pos` in chunk `idx` of `ino`, and
    /// record its block checksums in the same transaction: later slices win where they
    /// overlap, so commits of overlapping writes must come in write order. Compacts the
    /// chunk when it has many slices.
    pub async fn commit_slice(&self, ino: Ino, idx: u32, pos: u32, slice: &NewSlice) -> Result<()> {
        let mut slice = slice.clone();
        // The storage generation changed after the upload (a cutover step): follow it, put
        // the blocks where the new generation wants them, and commit again. Bounded: each
        // round needs another transition to fail.
        for round in 0.. {
            match self.commit_placed(ino, idx, pos, &slice).await {
                Err(e) if e.kind() == ErrorKind::Fenced && round < 8 => {
                    let to = self.placement.reload().await?;
                    tracing::info!(
                        slice = slice.id,
                        from = slice.placed.gen,
                        to = to.gen,
                        "storage generation changed under a write; placing its blocks again"
                    );
                    self.place_again(&slice, &to).await?;
                    slice.placed = to;
                }
                r => return r,
            }
        }
        unreachable!("the loop returns")
    }

    async fn commit_placed(&self, ino: Ino, idx: u32, pos: u32, slice: &NewSlice) -> Result<()> {
        let (id, len) = (slice.id, slice.len);
        let rec = SliceRec {
            pos,
            id,
            size: len,
            off: 0,
            len,
        };
        let (nrecs, _) = transact!(self, |tx| {
            // The three records this reads, in one round trip.
            tx.prefetch(&[
                keys::STORAGE.to_vec(),
                keys::attr(ino),
                keys::chunk(ino, idx),
            ])
            .await?;
            check_generation(&mut tx, slice.placed.gen).await?;
            let mut attr = get_attr(&mut tx, ino).await?;
            if attr.kind != FileKind::File {
                return Err(Error::new(
                    ErrorKind::IsDir,
                    format!("inode {ino} is not a regular file"),
                ));
            }
            let key = keys::chunk(ino, idx);
            let mut recs = decode_chunk(ino, idx, tx.get(&key).await?)?;
            recs.push(rec);
            tx.put(key, SliceRec::encode_list(&recs));
            slice.record_checksums(&mut tx);
            let end = idx as u64 * CHUNK_SIZE + (pos + len) as u64;
            if end > attr.length {
                tx.add(keys::USED_SPACE, (end - attr.length) as i64);
                attr.length = end;
            }
            let now = now_ns();
            attr.mtime = now;
            attr.ctime = now;
            put_attr(&mut tx, ino, &attr);
            tx.set_op(Op::Write {
                ino,
                chunk: idx,
                pos,
                slice: id,
                size: len,
                off: 0,
                len,
            });
            Ok::<_, Error>(recs.len())
        })?;
        if nrecs > self.settings.compact_threshold as usize {
            // Compaction is an optimisation: failing it leaves a correct (if slower) chunk.
            if let Err(e) = self.compact_chunk(ino, idx).await {
                tracing::warn!(ino, chunk = idx, error = %e, "compaction failed; chunk left as is");
            }
        }
        Ok(())
    }

    /// Read up to `len` bytes at `offset` (short at end of file).
    pub async fn read(&self, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        let plan = self.plan_read(ino, offset, len).await?;
        self.fetch(&plan).await
    }

    /// Fill `dst` with chunk bytes `[from, to)` of the view of `recs` (compaction); every
    /// block read is checked against its checksum, so damage is never copied into a new
    /// slice with a fresh checksum over it.
    async fn read_view(&self, recs: &[SliceRec], from: u32, to: u32, dst: &mut [u8]) -> Result<()> {
        let chunk = self.with_sums(recs.to_vec()).await?;
        let mut pieces = Vec::new();
        super::layout::plan_chunk(&self.settings, &chunk, from, to, 0, &mut pieces);
        let plan = super::layout::Plan {
            offset: 0,
            len: dst.len(),
            pieces,
        };
        dst.copy_from_slice(&self.fetch(&plan).await?);
        Ok(())
    }

    /// Free every chunk of a file `length` bytes long. Chunk records exist only below the
    /// length (a write extends it in the transaction that adds the record; a truncate frees
    /// the records past it), so a file of up to `FREE_BY_KEY` chunks has its records read by
    /// key, in one call (validated at commit, unlike a scan), and a larger one is scanned.
    pub(crate) async fn free_file_chunks(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        length: u64,
    ) -> Result<()> {
        let n = length.div_ceil(CHUNK_SIZE);
        if n > FREE_BY_KEY {
            return self.free_chunks_from(tx, ino, 0).await;
        }
        let keys: Vec<Vec<u8>> = (0..n as u32).map(|i| keys::chunk(ino, i)).collect();
        tx.prefetch(&keys).await?;
        let mut found = Vec::new();
        for k in keys {
            if let Some(v) = tx.get(&k).await? {
                found.push((k, v));
            }
        }
        free_chunk_records(tx, ino, found).await
    }

    /// Delete chunks with index >= `first` of `ino`, moving their slices to pending deletes.
    /// Touches only chunk keys (one per 64 MiB), never data: truncating a huge file is cheap.
    pub(crate) async fn free_chunks_from(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        first: u32,
    ) -> Result<()> {
        let end = keys::prefix_end(&keys::chunk_prefix(ino));
        let mut start = keys::chunk(ino, first);
        loop {
            let page = tx.scan(&start, &end, 1024).await?;
            let n = page.len();
            if let Some((k, _)) = page.last() {
                start = k.clone();
                start.push(0);
            }
            free_chunk_records(tx, ino, page).await?;
            if n < 1024 {
                return Ok(());
            }
        }
    }

    /// Change a file's length inside a transaction. Shrinking drops whole chunks past the new
    /// end and lays a hole record over the rest of the boundary chunk (so a later extension
    /// reads zeros); growing only changes the length.
    pub(crate) async fn truncate_in(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        attr: &mut Attr,
        len: u64,
    ) -> Result<()> {
        let old = attr.length;
        if len == 0 && old > 0 && self.trash_on() {
            // The old data goes to the trash whole, as an inode of its own (`trash`).
            return self.trash_truncated(tx, ino, attr).await;
        }
        if len < old {
            self.free_chunks_from(tx, ino, len.div_ceil(CHUNK_SIZE) as u32)
                .await?;
            let pos = (len % CHUNK_SIZE) as u32;
            if pos != 0 {
                let idx = (len / CHUNK_SIZE) as u32;
                let key = keys::chunk(ino, idx);
                if let Some(v) = tx.get(&key).await? {
                    let mut recs = decode_chunk(ino, idx, Some(v))?;
                    recs.push(SliceRec {
                        pos,
                        id: 0,
                        size: 0,
                        off: 0,
                        len: CHUNK_SIZE as u32 - pos,
                    });
                    tx.put(key, SliceRec::encode_list(&recs));
                }
            }
            tx.add(keys::USED_SPACE, -((old - len) as i64));
        } else if len > old {
            tx.add(keys::USED_SPACE, (len - old) as i64);
        }
        attr.length = len;
        Ok(())
    }

    /// Rewrite a chunk's visible bytes as one new slice and free the old ones. If the chunk
    /// changed meanwhile the commit conflicts and the new slice stays unreferenced (gc removes
    /// it after the grace period).
    pub async fn compact_chunk(&self, ino: Ino, idx: u32) -> Result<()> {
        let key = keys::chunk(ino, idx);
        let mut tx = Txn::new(&*self.engine);
        let attr = get_attr(&mut tx, ino).await?;
        let raw = tx.get(&key).await?;
        let recs = decode_chunk(ino, idx, raw.clone())?;
        if recs.len() <= 1 {
            return Ok(());
        }
        let chunk_start = idx as u64 * CHUNK_SIZE;
        if attr.length <= chunk_start {
            return Ok(());
        }
        let len = (attr.length - chunk_start).min(CHUNK_SIZE) as u32;
        let mut data = vec![0u8; len as usize];
        self.read_view(&recs, 0, len, &mut data).await?;
        let slice = self.upload_slice(Bytes::from(data)).await?;
        let id = slice.id;
        let mut tx = Txn::new(&*self.engine);
        if let Err(e) = check_generation(&mut tx, slice.placed.gen).await {
            tracing::debug!(ino, chunk = idx, error = %e, "compaction dropped: the storage generation changed");
            return Ok(());
        }
        // Both reads are validated at commit: any write, truncate or compaction in between wins.
        let attr2 = get_attr(&mut tx, ino).await?;
        if tx.get(&key).await? != raw || attr2.length != attr.length {
            return Ok(());
        }
        put_attr(&mut tx, ino, &attr2);
        tx.put(
            key,
            SliceRec::encode_list(&[SliceRec {
                pos: 0,
                id,
                size: len,
                off: 0,
                len,
            }]),
        );
        slice.record_checksums(&mut tx);
        let freed: Vec<(u64, u32)> = recs
            .iter()
            .filter(|r| r.id != 0)
            .map(|r| (r.id, r.size))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        release_slices(&mut tx, &freed).await?;
        tx.set_op(Op::Compact {
            ino,
            chunk: idx,
            slice: id,
            size: len,
            freed: freed.len() as u32,
        });
        match tx.commit().await? {
            crate::engine::CommitOutcome::Committed { .. } => Ok(()),
            crate::engine::CommitOutcome::Conflict => {
                tracing::debug!(
                    ino,
                    chunk = idx,
                    slice = id,
                    "compaction lost a race; new slice left for gc"
                );
                Ok(())
            }
        }
    }

    /// The slice records of every chunk of `ino`, for tools (fsck, dump, get).
    pub async fn chunks(&self, ino: Ino) -> Result<Vec<(u32, Vec<SliceRec>)>> {
        let p = keys::chunk_prefix(ino);
        let mut out = Vec::new();
        crate::engine::scan_all(&*self.engine, &p, &keys::prefix_end(&p), 1024, |page| {
            for (k, v) in page {
                if let keys::Key::Chunk(_, idx) = keys::parse(&k) {
                    out.push((idx, decode_chunk(ino, idx, Some(v))?));
                }
            }
            Ok(())
        })
        .await?;
        Ok(out)
    }
}
