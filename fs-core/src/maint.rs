//! Whole-volume maintenance: dump/load (engine-independent JSON), fsck, gc and status.

use crate::engine::{scan_all, CommitOutcome, Engine, JournalBounds};
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::fs::Fs;
use crate::journal::{parse_counter, parse_stamp, Entry, Op};
use crate::keys::{self, Key};
use crate::store::BlockCheck;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, Ino, Settings, SliceRec};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

const PAGE: usize = 4096;
const HEX_MARK: &str = "\\x:";

/// Names and values that are not UTF-8 (or look like the escape) are written as `\x:<hex>`.
pub fn encode_name(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.starts_with(HEX_MARK) => s.to_string(),
        _ => format!("{HEX_MARK}{}", hex(b)),
    }
}

pub fn decode_name(s: &str) -> Result<Vec<u8>> {
    match s.strip_prefix(HEX_MARK) {
        Some(h) => unhex(h).ok_or_else(|| corrupt(format!("bad hex name {s:?} in dump"))),
        None => Ok(s.as_bytes().to_vec()),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct InodeDump {
    pub attr: Option<Attr>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: BTreeMap<String, Ino>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chunks: BTreeMap<u32, Vec<SliceRec>>,
    /// Device number of a device node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<u32>,
    /// The session keeping this inode open after its last unlink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PendingDump {
    pub slice: u64,
    pub size: u32,
    pub stamp: String,
}

/// A whole volume's metadata, engine-independent. Journal positions are not part of it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Dump {
    pub setting: Settings,
    pub counters: BTreeMap<String, i64>,
    pub pending: Vec<PendingDump>,
    pub inodes: BTreeMap<Ino, InodeDump>,
    /// Slice id to the CRC32C of each of its blocks (format version 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checksums: BTreeMap<u64, Vec<u32>>,
    /// Where the blocks are (absent: in `setting.storage` alone, never cut over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<crate::storage::StorageState>,
    /// The storage transitions, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<crate::storage::Audit>,
    /// The primary epoch (absent: never promoted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<crate::site::Epoch>,
}

pub async fn dump(engine: &dyn Engine) -> Result<Dump> {
    let mut setting = None;
    let mut counters = BTreeMap::new();
    let mut pending = Vec::new();
    let mut inodes: BTreeMap<Ino, InodeDump> = BTreeMap::new();
    let mut checksums = BTreeMap::new();
    let mut storage = None;
    let mut audit = Vec::new();
    let mut epoch = None;
    scan_all(engine, b"", &[0xff], PAGE, |page| {
        for (k, v) in page {
            match keys::parse(&k) {
                Key::Setting => {
                    setting = Some(
                        serde_json::from_slice(&v)
                            .map_err(|e| corrupt(format!("settings: {e}")))?,
                    )
                }
                Key::Counter(name) => {
                    counters.insert(encode_name(name), parse_counter(Some(&v))?);
                }
                Key::Pending(slice, size) => {
                    pending.push(PendingDump {
                        slice,
                        size,
                        stamp: encode_name(&v),
                    });
                }
                Key::Attr(ino) => {
                    inodes.entry(ino).or_default().attr = Some(crate::fs::decode_attr(ino, &v)?)
                }
                Key::Dentry(p, name) => {
                    let (ino, _) =
                        keys::decode_dentry(&v).ok_or_else(|| corrupt("dentry does not decode"))?;
                    inodes
                        .entry(p)
                        .or_default()
                        .entries
                        .insert(encode_name(name), ino);
                }
                Key::Chunk(ino, idx) => {
                    let recs = SliceRec::decode_list(&v)
                        .ok_or_else(|| corrupt(format!("chunk {idx} of {ino}")))?;
                    inodes.entry(ino).or_default().chunks.insert(idx, recs);
                }
                Key::Symlink(ino) => inodes.entry(ino).or_default().symlink = Some(encode_name(&v)),
                Key::Rdev(ino) => {
                    let b: [u8; 4] = v.as_slice().try_into().map_err(|_| {
                        corrupt(format!("device number of inode {ino} does not decode"))
                    })?;
                    inodes.entry(ino).or_default().rdev = Some(u32::from_be_bytes(b));
                }
                Key::Checksums(id) => {
                    let c = keys::decode_checksums(&v).ok_or_else(|| {
                        corrupt(format!("the checksum record of slice {id} does not decode"))
                    })?;
                    checksums.insert(id, c);
                }
                Key::Kept(ino) => {
                    inodes.entry(ino).or_default().kept =
                        Some(String::from_utf8_lossy(&v).into_owned())
                }
                Key::Xattr(ino, name) => {
                    inodes
                        .entry(ino)
                        .or_default()
                        .xattrs
                        .insert(encode_name(name), hex(&v));
                }
                Key::Storage => storage = Some(crate::storage::decode(&v)?),
                Key::Epoch => {
                    epoch =
                        Some(serde_json::from_slice(&v).map_err(|e| {
                            corrupt(format!("the epoch record does not decode: {e}"))
                        })?)
                }
                Key::Audit(..) => audit.push(
                    serde_json::from_slice(&v)
                        .map_err(|e| corrupt(format!("an audit record does not decode: {e}")))?,
                ),
                Key::Unknown => {
                    return Err(corrupt(format!(
                        "unknown metadata key {:?}",
                        String::from_utf8_lossy(&k)
                    )))
                }
            }
        }
        Ok(())
    })
    .await?;
    let setting = setting
        .ok_or_else(|| Error::new(ErrorKind::NotFormatted, "no volume settings: not formatted"))?;
    Ok(Dump {
        setting,
        counters,
        pending,
        inodes,
        checksums,
        storage,
        audit,
        epoch,
    })
}

/// Every key/value pair a dump stands for.
fn dump_pairs(d: &Dump) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for (name, v) in &d.counters {
        let mut k = keys::COUNTER_PREFIX.to_vec();
        k.extend(decode_name(name)?);
        out.push((k, v.to_string().into_bytes()));
    }
    for p in &d.pending {
        out.push((keys::pending(p.slice, p.size), decode_name(&p.stamp)?));
    }
    for (&id, c) in &d.checksums {
        out.push((keys::checksums(id), keys::encode_checksums(c)));
    }
    if let Some(st) = &d.storage {
        out.push((keys::STORAGE.to_vec(), crate::storage::encode(st)));
    }
    if let Some(e) = &d.epoch {
        out.push((
            keys::EPOCH.to_vec(),
            serde_json::to_vec(e).expect("the epoch record serializes"),
        ));
    }
    for a in &d.audit {
        out.push((
            keys::audit(a.at_ns, a.gen),
            serde_json::to_vec(a).expect("audit records serialize"),
        ));
    }
    for (&ino, n) in &d.inodes {
        if let Some(a) = &n.attr {
            out.push((keys::attr(ino), crate::fs::encode_attr(a)));
        }
        for (name, &child) in &n.entries {
            let kind = d
                .inodes
                .get(&child)
                .and_then(|c| c.attr.as_ref())
                .map(|a| a.kind)
                .ok_or_else(|| {
                    corrupt(format!(
                        "dump entry {name:?} points at inode {child} which has no attributes"
                    ))
                })?;
            out.push((
                keys::dentry(ino, &decode_name(name)?),
                keys::encode_dentry(child, kind),
            ));
        }
        for (name, v) in &n.xattrs {
            out.push((
                keys::xattr(ino, &decode_name(name)?),
                unhex(v).ok_or_else(|| corrupt("bad xattr hex"))?,
            ));
        }
        if let Some(t) = &n.symlink {
            out.push((keys::symlink(ino), decode_name(t)?));
        }
        for (&idx, recs) in &n.chunks {
            out.push((keys::chunk(ino, idx), SliceRec::encode_list(recs)));
        }
        if let Some(r) = n.rdev {
            out.push((keys::rdev(ino), r.to_be_bytes().to_vec()));
        }
        if let Some(sid) = &n.kept {
            out.push((keys::kept(ino), sid.as_bytes().to_vec()));
        }
    }
    Ok(out)
}

/// Load a dump into an engine that holds no volume. Writes in journaled batches, settings last,
/// so an interrupted load leaves an unformatted engine that a second load completes.
pub async fn load(engine: &dyn Engine, d: &Dump) -> Result<u64> {
    if engine.get(keys::SETTING).await?.is_some() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} already holds a volume; load needs an empty one",
                engine.display_url()
            ),
        ));
    }
    d.setting.check_format()?;
    if d.setting.checksums() {
        for (ino, n) in &d.inodes {
            for r in n.chunks.values().flatten().filter(|r| r.id != 0) {
                if !d.checksums.contains_key(&r.id) {
                    return Err(corrupt(format!(
                        "the dump is of a format-{} volume but has no checksums for slice {} (inode {ino}): it would load as unreadable files; dump the volume again with this jfs",
                        d.setting.format_version, r.id
                    )));
                }
            }
        }
    }
    let mut pairs = dump_pairs(d)?;
    pairs.push((
        keys::SETTING.to_vec(),
        serde_json::to_vec(&d.setting).expect("settings serialize"),
    ));
    let total = pairs.len() as u64;
    for batch in pairs.chunks(2000) {
        let mut tx = Txn::new(engine);
        for (k, v) in batch {
            tx.put(k.clone(), v.clone());
        }
        tx.set_op(Op::Load {
            keys: batch.len() as u64,
        });
        if let CommitOutcome::Conflict = tx.commit().await? {
            return Err(Error::new(
                ErrorKind::Conflict,
                "the engine changed during load",
            ));
        }
    }
    Ok(total)
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct BrokenBlock {
    pub ino: Ino,
    pub path: String,
    pub key: String,
    pub problem: String,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct FsckReport {
    pub files: u64,
    pub blocks: u64,
    pub broken: Vec<BrokenBlock>,
}

impl Fs {
    /// Check that every block the metadata references exists with the length its key says
    /// and, on a format-2 volume, that its slice has its checksum record. `deep`: read every
    /// block and check it against its checksum (on a format-1 volume, its length).
    pub async fn fsck(&self, deep: bool) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        let mut bad: Vec<(Ino, String, String)> = Vec::new();
        let mut from = keys::INODE_PREFIX.to_vec();
        let end = keys::prefix_end(keys::INODE_PREFIX);
        let mut last_ino = 0;
        loop {
            let page = self.engine.scan(&from, &end, PAGE).await?;
            let n = page.len();
            let mut want: BTreeMap<String, (Ino, u32, Option<u32>)> = BTreeMap::new();
            let mut slices: Vec<(Ino, SliceRec)> = Vec::new();
            for (k, v) in &page {
                if let Key::Chunk(ino, idx) = keys::parse(k) {
                    if ino != last_ino {
                        report.files += 1;
                        last_ino = ino;
                    }
                    let recs = SliceRec::decode_list(v)
                        .ok_or_else(|| corrupt(format!("chunk {idx} of inode {ino}")))?;
                    slices.extend(
                        recs.into_iter()
                            .filter(|r| r.id != 0 && r.len > 0)
                            .map(|r| (ino, r)),
                    );
                }
            }
            // The checksum records of the slices on this page (format 2).
            let sums = if self.settings.checksums() {
                let ids: Vec<u64> = slices.iter().map(|(_, r)| r.id).collect();
                crate::fs::slice_checksums(&*self.engine, &ids).await?
            } else {
                HashMap::new()
            };
            let bs = self.settings.block_size;
            for (ino, r) in &slices {
                let crcs = sums.get(&r.id);
                if self.settings.checksums() {
                    let n = r.size.div_ceil(bs) as usize;
                    if crcs.is_none_or(|c| c.len() != n) {
                        let key = keys::block_key(
                            &self.settings.name,
                            r.id,
                            0,
                            keys::block_len(r.size, bs, 0),
                        );
                        bad.push((
                            *ino,
                            key,
                            format!(
                                "slice {} has no valid checksum record (reads of it fail)",
                                r.id
                            ),
                        ));
                        continue;
                    }
                }
                for bi in r.off / bs..=(r.off + r.len - 1) / bs {
                    let blen = keys::block_len(r.size, bs, bi);
                    let crc = crcs.and_then(|c| c.get(bi as usize).copied());
                    want.insert(
                        keys::block_key(&self.settings.name, r.id, bi, blen),
                        (*ino, blen, crc),
                    );
                }
            }
            if let Some((k, _)) = page.last() {
                from = k.clone();
                from.push(0);
            }
            report.blocks += want.len() as u64;
            let results: Vec<_> =
                futures::stream::iter(want.into_iter().map(|(key, (ino, len, crc))| async move {
                    let r = if deep {
                        match self.store.get_block(&key, BlockCheck { len, crc }).await {
                            Ok(_) => Ok(None),
                            Err(e) if e.kind() == ErrorKind::NotFound => {
                                Ok(Some("missing".to_string()))
                            }
                            Err(e) if e.kind() == ErrorKind::Corrupt => Ok(Some(e.to_string())),
                            Err(e) => Err(e),
                        }
                    } else {
                        match self.store.head(&key).await {
                            Ok(Some(m)) if m.size == len as u64 => Ok(None),
                            Ok(Some(m)) => {
                                Ok(Some(format!("has {} bytes, expected {len}", m.size)))
                            }
                            Ok(None) => Ok(Some("missing".to_string())),
                            Err(e) => Err(e),
                        }
                    };
                    (key, ino, r)
                }))
                .buffer_unordered(if deep { 8 } else { 32 })
                .collect()
                .await;
            for (key, ino, r) in results {
                match r {
                    Ok(None) => {}
                    Ok(Some(problem)) => bad.push((ino, key, problem)),
                    Err(e) => return Err(e.context(format!("checking block {key}"))),
                }
            }
            if n < PAGE {
                break;
            }
        }
        bad.sort();
        for (ino, key, problem) in bad {
            let path = self
                .path_of(ino)
                .await
                .unwrap_or_else(|_| format!("<inode {ino}>"));
            report.broken.push(BrokenBlock {
                ino,
                path,
                key,
                problem,
            });
        }
        Ok(report)
    }
}

#[derive(Debug, Clone)]
pub struct GcOptions {
    pub delete: bool,
    /// Pending deletes freed at a sequence number above this are kept (mirrors not caught up).
    pub safe_seq: u64,
    pub now_ns: i64,
    /// Sessions without a heartbeat for this long are dead: with `delete`, the inodes they
    /// kept open are freed and their records removed.
    pub session_timeout: std::time::Duration,
}

#[derive(Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub pending: u64,
    pub pending_due: u64,
    pub pending_held_for_mirrors: u64,
    pub pending_purged: u64,
    pub objects: u64,
    pub leaked: u64,
    pub leaked_bytes: u64,
    pub leaked_young: u64,
    pub leaked_deleted: u64,
    pub foreign: u64,
    pub journal_trimmed: u64,
    /// Live mount sessions.
    pub sessions_live: u64,
    /// Dead sessions (removed with --delete).
    pub sessions_dead: u64,
    /// Inodes unlinked while open and still kept.
    pub kept: u64,
    /// Of those, kept by dead sessions (freed with --delete).
    pub kept_dead: u64,
    pub kept_released: u64,
    pub sessions_removed: u64,
    /// A storage cutover in progress (its phase): gc deletes no block from either store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutover: Option<String>,
}

impl Fs {
    /// Garbage collection. Without `delete` it only counts. It deletes nothing unless every
    /// listing (metadata and object store) completed without error.
    pub async fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut rep = GcReport::default();
        let s = &self.settings;
        // Registered mirrors hold both pending deletes and the journal (see `slots`).
        let slots = crate::slots::list(&*self.engine).await?;
        let safe_seq = opts.safe_seq.min(crate::slots::gc_safe_seq(&slots));
        let journal_max = opts.safe_seq.min(crate::slots::retain_floor(&slots));
        // 0. Sessions, and inodes kept open by them: a dead session's are freed first, so
        //    that their slices are counted below as pending deletes.
        let sessions = crate::session::list(&*self.engine).await?;
        let live: std::collections::HashSet<String> = sessions
            .iter()
            .filter(|x| x.is_live(opts.now_ns, opts.session_timeout))
            .map(|x| x.id.clone())
            .collect();
        rep.sessions_live = live.len() as u64;
        rep.sessions_dead = sessions.len() as u64 - rep.sessions_live;
        let kept = self.kept_inodes().await?;
        rep.kept = kept.len() as u64;
        rep.kept_dead = kept.iter().filter(|(_, sid)| !live.contains(sid)).count() as u64;
        if opts.delete {
            let r = self.reap_sessions(opts.session_timeout).await?;
            rep.kept_released = r.inodes;
            rep.sessions_removed = r.sessions;
        }
        // 1. Referenced slices (chunks) and pending deletes, from one metadata pass.
        let mut referenced: HashMap<u64, u32> = HashMap::new();
        let mut due: Vec<(u64, u32)> = Vec::new();
        scan_all(&*self.engine, b"", &[0xff], PAGE, |page| {
            for (k, v) in page {
                match keys::parse(&k) {
                    Key::Chunk(..) => {
                        for r in SliceRec::decode_list(&v)
                            .ok_or_else(|| corrupt("chunk does not decode"))?
                        {
                            if r.id != 0 {
                                referenced.insert(r.id, r.size);
                            }
                        }
                    }
                    Key::Pending(id, size) => {
                        rep.pending += 1;
                        referenced.insert(id, size);
                        let (seq, t) = parse_stamp(&v).ok_or_else(|| {
                            corrupt(format!("pending delete {id} has a bad stamp"))
                        })?;
                        if opts.now_ns - t < s.trash_secs as i64 * 1_000_000_000 {
                            continue;
                        }
                        if seq > safe_seq {
                            rep.pending_held_for_mirrors += 1;
                            continue;
                        }
                        rep.pending_due += 1;
                        due.push((id, size));
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .await?;
        // 2. The object store: complete the listing before any deletion (fail closed).
        let mut leaked: Vec<(String, u64)> = Vec::new();
        let grace = s.gc_grace_secs as i64 * 1_000_000_000;
        let name = s.name.clone();
        let mut objects = 0u64;
        let mut foreign = 0u64;
        let mut young = 0u64;
        self.store
            .list(&keys::blocks_prefix(&s.name), &mut |page| {
                for o in page {
                    objects += 1;
                    let Some((id, index, len)) = keys::parse_block_key(&name, &o.key) else {
                        foreign += 1;
                        continue;
                    };
                    let belongs = referenced.get(&id).is_some_and(|&size| {
                        keys::slice_blocks(size, s.block_size).any(|b| b == (index, len))
                    });
                    if belongs {
                        continue;
                    }
                    // Unknown age counts as young: never delete what we cannot date.
                    if o.modified_ns.is_none_or(|m| opts.now_ns - m < grace) {
                        young += 1;
                        continue;
                    }
                    leaked.push((o.key, o.size));
                }
                Ok(())
            })
            .await
            .map_err(|e| e.context("listing the object store (gc deleted nothing)"))?;
        rep.objects = objects;
        rep.foreign = foreign;
        rep.leaked_young = young;
        rep.leaked = leaked.len() as u64;
        rep.leaked_bytes = leaked.iter().map(|(_, n)| n).sum();
        // A storage cutover copies what the metadata references from one store to the other
        // and may still go back: no block is deleted from either until it is over.
        let st = crate::storage::current(&*self.engine, &s.storage).await?;
        if !matches!(st.phase, crate::storage::Phase::Single { .. }) {
            rep.cutover = Some(st.phase.describe());
            return Ok(rep);
        }
        if !opts.delete {
            return Ok(rep);
        }
        // 3. Delete: pending slices' blocks first, then their keys (a crash in between only
        //    means the next gc deletes already-missing blocks again).
        for batch in due.chunks(1000) {
            for &(id, size) in batch {
                for (key, _) in self.slice_block_keys(id, size) {
                    match self.store.delete(&key).await {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => return Err(e.context(format!("deleting block {key}"))),
                    }
                }
            }
            let mut tx = Txn::new(&*self.engine);
            for &(id, size) in batch {
                tx.delete(keys::pending(id, size));
                tx.delete(keys::checksums(id));
            }
            tx.set_op(Op::Purge {
                slices: batch.len() as u64,
            });
            tx.commit().await?;
            rep.pending_purged += batch.len() as u64;
        }
        if !leaked.is_empty() {
            // Blocks that look leaked in a prefix another volume of this name claims are
            // that volume's.
            crate::owner::check(&*self.store, s)
                .await
                .map_err(|e| e.context("gc deleted no leaked object"))?;
        }
        for (key, _) in &leaked {
            self.store
                .delete(key)
                .await
                .map_err(|e| e.context(format!("deleting leaked object {key}")))?;
            rep.leaked_deleted += 1;
        }
        // 4. Journal retention by age (the head entry is always kept).
        rep.journal_trimmed = self
            .trim_journal(
                opts.now_ns - s.journal_retention_secs as i64 * 1_000_000_000,
                journal_max,
            )
            .await?;
        Ok(rep)
    }

    /// Drop journal entries committed before `cutoff_ns` (and at or below `max_seq`).
    pub async fn trim_journal(&self, cutoff_ns: i64, max_seq: u64) -> Result<u64> {
        trim_journal(&*self.engine, cutoff_ns, max_seq).await
    }
}

/// Drop journal entries committed before `cutoff_ns` (and at or below `max_seq`); the head
/// entry is always kept.
pub async fn trim_journal(engine: &dyn Engine, cutoff_ns: i64, max_seq: u64) -> Result<u64> {
    {
        let b = engine.journal_bounds().await?;
        let mut before = b.first;
        'outer: while before < b.last && before <= max_seq {
            let frames = engine.journal_read(before, 1000).await?;
            if frames.is_empty() {
                break;
            }
            for (seq, f) in frames {
                let e = Entry::decode(&f).map_err(|e| e.context(format!("journal entry {seq}")))?;
                if e.time_ns >= cutoff_ns || seq >= b.last || seq > max_seq {
                    before = seq;
                    break 'outer;
                }
                before = seq + 1;
            }
        }
        if before > b.first {
            engine.journal_trim(before).await
        } else {
            Ok(0)
        }
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct Status {
    pub name: String,
    pub uuid: String,
    pub engine: String,
    pub meta_url: String,
    pub storage: String,
    pub block_size: u32,
    pub journal: JournalBounds,
    pub used_space: u64,
    pub used_inodes: u64,
    pub pending_deletes: u64,
    pub settings: Settings,
    /// The mirror marker when this metadata is a mirror's (None: a volume of its own).
    pub mirror: Option<crate::site::MirrorMarker>,
    /// Set when this metadata was a mirror and was detached.
    pub detached: Option<crate::site::Detached>,
    /// Mount sessions (live ones, and dead ones not yet reaped).
    pub sessions: Vec<SessionStatus>,
    /// Inodes unlinked while open, still kept by a session.
    pub kept_inodes: u64,
    /// The primary epoch (0: never promoted) and where the volume moved, if it did.
    pub epoch: u64,
    pub moved: Option<crate::site::Moved>,
    /// Where blocks go (the cutover state).
    pub placement: String,
}

#[derive(Serialize, Debug, Clone)]
pub struct SessionStatus {
    #[serde(flatten)]
    pub session: crate::session::Session,
    pub live: bool,
}

impl Fs {
    pub async fn status(&self) -> Result<Status> {
        let st = self.statfs().await?;
        let mut pending = 0u64;
        scan_all(
            &*self.engine,
            keys::PENDING_PREFIX,
            &keys::prefix_end(keys::PENDING_PREFIX),
            PAGE,
            |p| {
                pending += p.len() as u64;
                Ok(())
            },
        )
        .await?;
        Ok(Status {
            name: self.settings.name.clone(),
            uuid: self.settings.uuid.clone(),
            engine: self.engine.kind().to_string(),
            meta_url: self.engine.display_url(),
            storage: self.store.display_url(),
            block_size: self.settings.block_size,
            journal: self.engine.journal_bounds().await?,
            used_space: st.used_space,
            used_inodes: st.used_inodes,
            pending_deletes: pending,
            settings: self.settings.clone(),
            mirror: crate::site::marker(&*self.engine).await?,
            detached: crate::site::detached(&*self.engine).await?,
            epoch: crate::site::epoch(&*self.engine).await?,
            moved: crate::site::moved(&*self.engine).await?,
            placement: {
                let st = crate::storage::current(&*self.engine, &self.settings.storage).await?;
                format!("{} (generation {})", st.phase.describe(), st.gen)
            },
            sessions: crate::session::list(&*self.engine)
                .await?
                .into_iter()
                .map(|s| SessionStatus {
                    live: s.is_live(now_ns(), crate::session::DEFAULT_TIMEOUT),
                    session: s,
                })
                .collect(),
            kept_inodes: self.kept_inodes().await?.len() as u64,
        })
    }
}

pub fn gc_defaults() -> GcOptions {
    GcOptions {
        delete: false,
        safe_seq: u64::MAX,
        now_ns: now_ns(),
        session_timeout: crate::session::DEFAULT_TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_dump_encoding() {
        for n in [
            &b"plain"[..],
            b"\xff\xfe",
            b"\\x:looks-escaped",
            b"",
            "ünï".as_bytes(),
        ] {
            assert_eq!(decode_name(&encode_name(n)).unwrap(), n);
        }
    }
}
