//! Point-in-time metadata recovery: the primary's metadata snapshots and its journal,
//! shipped in segments, in the volume's own object store; `jfs recover` rebuilds the
//! metadata of any instant between the oldest kept snapshot and the last shipped entry.
//!
//! Objects (under the volume's prefix, beside `blocks_prefix`, never under it: gc's block
//! listing, `owner`'s check and the storage cutover's copy see none of them):
//! - `<vol>/meta-backup/snap/<seq:020>/part-<n:06>`: the key space, in key order, in parts
//!   of at most `PART_BYTES` (so memory stays bounded at any size);
//! - `<vol>/meta-backup/snap/<seq:020>/manifest`: written last, naming every part with its
//!   length and CRC32C: a snapshot without one (half written, its writer died) is never
//!   used, and is deleted once a newer snapshot is complete;
//! - `<vol>/meta-backup/journal/<first:020>-<last:020>`: the journal's frames `first..=last`.
//!
//! Every object is sealed: an 8-byte kind, the body, the CRC32C of both. A torn or damaged
//! object is an error naming it, never skipped.
//!
//! Consistency (the mirror bootstrap's rule, sound on every engine through `Engine` alone):
//! a snapshot reads the head `base`, then the whole key space page by page while writers go
//! on, then the head `seq`, and ships the journal `base+1..=seq` before its manifest. A key
//! no entry of that window writes had the same value all along (the scan read it); a key one
//! does gets the value of the last such entry when recover replays the window over the
//! pairs. So a snapshot plus its window is the metadata exactly as of `seq`, on RocksDB,
//! Redis and PostgreSQL alike (no engine-specific snapshot read; a Redis scan is not one).
//!
//! Who writes them: the primary's background work, exactly one process at a time (see
//! `my_turn`): the primary agent while its lease is alive, otherwise the live writing mount
//! session with the smallest id. Never a mirror (its metadata carries the marker). Two
//! writers in a hand-over write the same objects with the same bytes (names are seqs), and
//! recover takes overlapping segments entry by entry, so a race costs work, never a backup.
//!
//! Retention (`BackupSettings`): the newest snapshot, the oldest of each hour for
//! `keep_hourly` hours and the oldest of each day for `keep_daily` days; the journal is kept
//! from the oldest kept snapshot on, so every instant from there to the last shipped entry
//! is recoverable. gc holds the pending deletes of that range (`hold_seq`).

use crate::engine::{Engine, KvPair};
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::journal::Entry;
use crate::keys;
use crate::store::BlockStore;
use crate::types::{now_ns, Settings};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A snapshot part is cut once it holds this many bytes.
pub const PART_BYTES: usize = 8 << 20;
/// A journal segment holds at most this many bytes of frames (more objects otherwise).
pub const SEGMENT_BYTES: usize = 8 << 20;
const MANIFEST_VERSION: u32 = 1;
const SNAP_KIND: &[u8; 8] = b"JFSSNAP1";
const SEG_KIND: &[u8; 8] = b"JFSJSEG1";
const MAN_KIND: &[u8; 8] = b"JFSMANI1";
const BEGIN_KIND: &[u8; 8] = b"JFSBEGN1";

/// The volume's backup settings (`Settings::backup`; absent: these defaults).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackupSettings {
    /// Off: no snapshot is taken and no segment shipped (those in the store stay, and keep
    /// holding gc, until `jfs backup META --purge`).
    pub enabled: bool,
    /// A snapshot is taken when the newest is older than this.
    pub snapshot_every_secs: u64,
    /// The journal is shipped this often: the most a destroyed engine loses.
    pub segment_every_secs: u64,
    /// The oldest snapshot of each hour is kept this many hours.
    pub keep_hourly: u32,
    /// The oldest snapshot of each day is kept this many days.
    pub keep_daily: u32,
}

impl Default for BackupSettings {
    fn default() -> Self {
        BackupSettings {
            enabled: true,
            snapshot_every_secs: 3600,
            segment_every_secs: 10,
            keep_hourly: 48,
            keep_daily: 14,
        }
    }
}

impl BackupSettings {
    /// Refuse settings that would never back up or never keep a snapshot.
    pub fn validate(&self) -> Result<()> {
        if self.snapshot_every_secs == 0 || self.segment_every_secs == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "backup intervals must be at least 1s (turn backups off with --off instead)",
            ));
        }
        Ok(())
    }
}

/// Where a volume's backups live in its store.
pub fn prefix(volume: &str) -> String {
    format!("{volume}/meta-backup/")
}
fn snap_prefix(volume: &str) -> String {
    format!("{volume}/meta-backup/snap/")
}
fn seg_prefix(volume: &str) -> String {
    format!("{volume}/meta-backup/journal/")
}
fn snap_dir(volume: &str, seq: u64) -> String {
    format!("{}{seq:020}/", snap_prefix(volume))
}
fn seg_key(volume: &str, first: u64, last: u64) -> String {
    format!("{}{first:020}-{last:020}", seg_prefix(volume))
}

fn seal(kind: &[u8; 8], body: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Bytes::from(out)
}

fn unseal<'a>(kind: &[u8; 8], key: &str, b: &'a [u8]) -> Result<&'a [u8]> {
    let damaged = |why: &str| {
        corrupt(format!(
            "backup object {key} is torn or damaged ({why}): it cannot be used; recover to an instant it does not cover, or from another copy of the store"
        ))
    };
    if b.len() < 12 {
        return Err(damaged(&format!("{} bytes", b.len())));
    }
    let (data, tail) = b.split_at(b.len() - 4);
    if &data[..8] != kind {
        return Err(damaged("not an object of this kind"));
    }
    let want = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    if crc32c::crc32c(data) != want {
        return Err(damaged("checksum mismatch"));
    }
    Ok(&data[8..])
}

/// One object of a snapshot, as its manifest names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PartRef {
    pub key: String,
    pub bytes: u64,
    pub crc32c: u32,
    pub pairs: u64,
}

/// What a complete snapshot is: written last.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub volume: String,
    pub uuid: String,
    /// The seq naming its directory: the head before its `begin` object was written (at
    /// most `base_seq`; gc holds what was freed after it, see `hold_seq`).
    pub dir_seq: u64,
    /// The head when the scan began: recover replays the journal from `base_seq + 1`.
    pub base_seq: u64,
    /// The instant the snapshot stands for (with the journal up to it replayed).
    pub seq: u64,
    /// When entry `seq` was committed.
    pub time_ns: i64,
    /// When the snapshot was taken.
    pub taken_ns: i64,
    pub pairs: u64,
    pub bytes: u64,
    pub parts: Vec<PartRef>,
}

impl crate::record::Versioned for Manifest {
    const KIND: &'static str = "a metadata backup's manifest";
    const VERSION: u32 = MANIFEST_VERSION;
}

/// A journal segment object: entries `first..=last`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub key: String,
    pub first: u64,
    pub last: u64,
}

/// What a volume's store holds of its backups.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// Complete snapshots, oldest first.
    pub snapshots: Vec<Manifest>,
    /// Snapshot directories without a usable manifest (half written, or its manifest
    /// damaged): seq and their objects.
    pub unfinished: BTreeMap<u64, Vec<String>>,
    /// Manifests that do not read (torn, damaged, moved): key and why. Their snapshots are
    /// never used; `recover` names them; retention deletes them once a newer one is complete.
    pub damaged: Vec<(String, String)>,
    /// Every object of each complete snapshot.
    pub snapshot_objects: BTreeMap<u64, Vec<String>>,
    /// Journal segments by first entry.
    pub segments: Vec<Segment>,
}

impl Catalog {
    /// The last entry reachable from `from` through segments without a gap.
    pub fn shipped_from(&self, from: u64) -> u64 {
        let mut at = from;
        for s in &self.segments {
            if s.first > at + 1 {
                break;
            }
            at = at.max(s.last);
        }
        at
    }
    /// The last entry recoverable from the newest snapshot (None: no snapshot).
    pub fn last_recoverable(&self) -> Option<u64> {
        let newest = self.snapshots.iter().max_by_key(|m| m.seq)?;
        // Each snapshot ships its own window before its manifest: from its base on.
        Some(self.shipped_from(newest.base_seq).max(newest.seq))
    }
}

fn parse_seq(s: &str) -> Option<u64> {
    (s.len() == 20 && s.bytes().all(|c| c.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Read the catalog of `volume`'s backups from `store` (every manifest is read and checked).
pub async fn catalog(store: &dyn BlockStore, volume: &str) -> Result<Catalog> {
    let mut dirs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let sp = snap_prefix(volume);
    store
        .list(&sp, &mut |page| {
            for o in page {
                if let Some(rest) = o.key.strip_prefix(&sp) {
                    if let Some(seq) = rest.split('/').next().and_then(parse_seq) {
                        dirs.entry(seq).or_default().push(o.key);
                    }
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| e.context("listing the metadata snapshots"))?;
    let mut segments = Vec::new();
    let gp = seg_prefix(volume);
    store
        .list(&gp, &mut |page| {
            for o in page {
                let Some(rest) = o.key.strip_prefix(&gp) else {
                    continue;
                };
                let mut it = rest.split('-');
                if let (Some(a), Some(b), None) = (
                    it.next().and_then(parse_seq),
                    it.next().and_then(parse_seq),
                    it.next(),
                ) {
                    if a <= b {
                        segments.push(Segment {
                            key: o.key,
                            first: a,
                            last: b,
                        });
                    }
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| e.context("listing the shipped journal segments"))?;
    segments.sort_by_key(|s| (s.first, s.last));
    let mut cat = Catalog {
        segments,
        ..Default::default()
    };
    for (seq, objs) in dirs {
        let mkey = format!("{}manifest", snap_dir(volume, seq));
        if !objs.contains(&mkey) {
            cat.unfinished.insert(seq, objs);
            continue;
        }
        let m = match read_manifest(store, &mkey).await {
            Ok(m) if m.dir_seq != seq || m.base_seq < seq || m.volume != volume => Err(corrupt(
                format!(
                    "backup manifest {mkey} describes snapshot {} of volume {:?}: it was moved or damaged",
                    m.dir_seq, m.volume
                ),
            )),
            r => r,
        };
        match m {
            Ok(m) => {
                cat.snapshots.push(m);
                cat.snapshot_objects.insert(seq, objs);
            }
            // A store that does not answer is an error; a manifest that is not one is named.
            Err(e)
                if e.kind() == ErrorKind::Corrupt || e.kind() == ErrorKind::UnsupportedVersion =>
            {
                cat.damaged.push((mkey, e.to_string()));
                cat.unfinished.insert(seq, objs);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(cat)
}

async fn read_manifest(store: &dyn BlockStore, key: &str) -> Result<Manifest> {
    let b = store
        .get(key)
        .await
        .map_err(|e| e.context(format!("reading backup manifest {key}")))?;
    let body = unseal(MAN_KIND, key, &b)?;
    crate::record::decode(body).map_err(|e| e.context(format!("backup manifest {key}")))
}

fn put_frame(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn take_frame<'a>(key: &str, b: &mut &'a [u8]) -> Result<&'a [u8]> {
    let short = || corrupt(format!("backup object {key} ends inside a record: torn"));
    if b.len() < 4 {
        return Err(short());
    }
    let n = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
    if b.len() < 4 + n {
        return Err(short());
    }
    let out = &b[4..4 + n];
    *b = &b[4 + n..];
    Ok(out)
}

/// Ship the journal `from..=to` as segments; returns the last entry shipped (`to`).
pub async fn ship(
    engine: &dyn Engine,
    store: &dyn BlockStore,
    volume: &str,
    from: u64,
    to: u64,
) -> Result<u64> {
    let mut next = from;
    while next <= to {
        let mut body = Vec::new();
        let (first, mut last) = (next, next - 1);
        'fill: while next <= to && body.len() < SEGMENT_BYTES {
            let want = ((to - next + 1) as usize).min(1000);
            let frames = engine.journal_read(next, want).await.map_err(|e| {
                e.context(format!(
                    "reading journal entry {next} to ship it (the journal was trimmed past what was shipped: the next snapshot starts a new range)"
                ))
            })?;
            if frames.is_empty() {
                return Err(Error::new(
                    ErrorKind::SeqNotRetained,
                    format!("journal entry {next} is not there to ship"),
                ));
            }
            for (seq, f) in frames {
                if seq != next {
                    return Err(Error::new(
                        ErrorKind::SeqNotRetained,
                        format!("journal entry {seq} came where {next} was expected"),
                    ));
                }
                put_frame(&mut body, &f);
                last = seq;
                next += 1;
                if next > to || body.len() >= SEGMENT_BYTES {
                    break 'fill;
                }
            }
        }
        let mut obj = Vec::with_capacity(body.len() + 16);
        obj.extend_from_slice(&first.to_le_bytes());
        obj.extend_from_slice(&last.to_le_bytes());
        obj.extend_from_slice(&body);
        let key = seg_key(volume, first, last);
        store
            .put(&key, seal(SEG_KIND, &obj))
            .await
            .map_err(|e| e.context(format!("writing journal segment {key}")))?;
    }
    Ok(to)
}

/// Read segment `s`: its entries, checked (frame checksums, seqs `first..=last` in order).
pub async fn read_segment(store: &dyn BlockStore, s: &Segment) -> Result<Vec<Entry>> {
    let b = store
        .get(&s.key)
        .await
        .map_err(|e| e.context(format!("reading journal segment {}", s.key)))?;
    let mut body = unseal(SEG_KIND, &s.key, &b)?;
    if body.len() < 16 {
        return Err(corrupt(format!("journal segment {} is torn", s.key)));
    }
    let first = u64::from_le_bytes(body[..8].try_into().expect("8"));
    let last = u64::from_le_bytes(body[8..16].try_into().expect("8"));
    if (first, last) != (s.first, s.last) {
        return Err(corrupt(format!(
            "journal segment {} holds entries {first}..={last}: renamed or damaged",
            s.key
        )));
    }
    body = &body[16..];
    let mut out = Vec::with_capacity((last - first + 1) as usize);
    for seq in first..=last {
        let f = take_frame(&s.key, &mut body)?;
        out.push(
            Entry::decode_at(seq, f)
                .map_err(|e| e.context(format!("journal segment {}", s.key)))?,
        );
    }
    if !body.is_empty() {
        return Err(corrupt(format!(
            "journal segment {} has bytes after entry {last}",
            s.key
        )));
    }
    Ok(out)
}

async fn entry_time(engine: &dyn Engine, seq: u64) -> Result<i64> {
    let f = engine.journal_read(seq, 1).await?;
    match f.first() {
        Some((s, f)) if *s == seq => Ok(Entry::decode_at(seq, f)?.time_ns),
        _ => Err(Error::new(
            ErrorKind::SeqNotRetained,
            format!("journal entry {seq} is gone"),
        )),
    }
}

/// Take a snapshot of `engine` (the volume `s`) into `store`, shipping its window (entries
/// after `shipped` up to its seq) before its manifest. Returns the manifest.
pub async fn snapshot(
    engine: &dyn Engine,
    store: &dyn BlockStore,
    s: &Settings,
    shipped: u64,
) -> Result<Manifest> {
    let taken_ns = now_ns();
    // `begin` first, the base read after it: a gc that did not see `begin` read its pending
    // deletes before the base was read, so they are freed in the snapshot too; one that saw
    // it holds what was freed after the directory's seq (`hold_seq`).
    let dir_seq = engine.journal_bounds().await?.last;
    let dir = snap_dir(&s.name, dir_seq);
    store
        .put(&format!("{dir}begin"), seal(BEGIN_KIND, b""))
        .await
        .map_err(|e| e.context(format!("writing {dir}begin")))?;
    let base = engine.journal_bounds().await?.last;
    // The window's entries must still be there when the scan ends: check the base is.
    let _ = entry_time(engine, base).await?;
    let mut parts = Vec::new();
    let mut buf = Vec::new();
    let mut in_buf = 0u64;
    let (mut pairs, mut bytes) = (0u64, 0u64);
    let mut from = Vec::new();
    async fn flush(
        store: &dyn BlockStore,
        dir: &str,
        parts: &mut Vec<PartRef>,
        buf: &mut Vec<u8>,
        in_buf: &mut u64,
    ) -> Result<u64> {
        let key = format!("{dir}part-{:06}", parts.len());
        let obj = seal(SNAP_KIND, buf);
        let r = PartRef {
            key: key.clone(),
            bytes: obj.len() as u64,
            crc32c: crc32c::crc32c(&obj),
            pairs: *in_buf,
        };
        store
            .put(&key, obj)
            .await
            .map_err(|e| e.context(format!("writing snapshot part {key}")))?;
        parts.push(r);
        buf.clear();
        *in_buf = 0;
        Ok(parts.last().expect("pushed").bytes)
    }
    loop {
        let page: Vec<KvPair> = engine.scan(&from, &[0xff], 1000).await?;
        // Only an empty page ends it: a key the snapshot lacks, recover never gets.
        let Some((k, _)) = page.last() else { break };
        from = k.clone();
        from.push(0);
        for (k, v) in page {
            put_frame(&mut buf, &k);
            put_frame(&mut buf, &v);
            in_buf += 1;
            pairs += 1;
        }
        if buf.len() >= PART_BYTES {
            bytes += flush(store, &dir, &mut parts, &mut buf, &mut in_buf).await?;
        }
    }
    if in_buf > 0 || parts.is_empty() {
        bytes += flush(store, &dir, &mut parts, &mut buf, &mut in_buf).await?;
    }
    let seq = engine.journal_bounds().await?.last;
    let from = shipped.max(base) + 1;
    if from <= seq {
        ship(engine, store, &s.name, from, seq).await?;
    }
    let m = Manifest {
        version: MANIFEST_VERSION,
        volume: s.name.clone(),
        uuid: s.uuid.clone(),
        dir_seq,
        base_seq: base,
        seq,
        time_ns: entry_time(engine, seq).await?,
        taken_ns,
        pairs,
        bytes,
        parts,
    };
    let key = format!("{dir}manifest");
    store
        .put(
            &key,
            seal(
                MAN_KIND,
                &serde_json::to_vec(&m).expect("manifests serialize"),
            ),
        )
        .await
        .map_err(|e| e.context(format!("writing snapshot manifest {key}")))?;
    Ok(m)
}

/// The snapshots retention keeps (by directory seq): the newest, the oldest of each of the last
/// `keep_hourly` hours and of each of the last `keep_daily` days.
pub fn keep(
    snaps: &[Manifest],
    b: &BackupSettings,
    now_ns: i64,
) -> std::collections::BTreeSet<u64> {
    const H: i64 = 3600 * 1_000_000_000;
    let mut out = std::collections::BTreeSet::new();
    if let Some(n) = snaps.iter().max_by_key(|m| m.seq) {
        out.insert(n.dir_seq);
    }
    for (unit, count) in [(H, b.keep_hourly as i64), (24 * H, b.keep_daily as i64)] {
        let mut seen = std::collections::BTreeSet::new();
        // Oldest first: the first of each bucket is its oldest.
        for m in snaps {
            let bucket = m.time_ns.div_euclid(unit);
            if bucket > now_ns.div_euclid(unit) - count && seen.insert(bucket) {
                out.insert(m.dir_seq);
            }
        }
    }
    out
}

/// What a retention pass deleted.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub snapshots: u64,
    pub unfinished: u64,
    /// Of those, snapshots whose manifest was damaged (named in the log).
    pub damaged: Vec<String>,
    pub segments: u64,
}

/// Delete the snapshots retention does not keep (manifest first, so none is half used), the
/// unfinished ones older than the newest complete one, and the segments no kept snapshot
/// needs (all entries at or before the oldest kept base).
pub async fn prune(store: &dyn BlockStore, volume: &str, b: &BackupSettings) -> Result<Pruned> {
    let mut cat = catalog(store, volume).await?;
    cat.snapshots.sort_by_key(|m| m.dir_seq);
    let kept = keep(&cat.snapshots, b, now_ns());
    let oldest_base = cat
        .snapshots
        .iter()
        .filter(|m| kept.contains(&m.dir_seq))
        .map(|m| m.base_seq)
        .min();
    let mut out = Pruned::default();
    let del = |k: String| async move {
        match store.delete(&k).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.context(format!("deleting backup object {k}"))),
        }
    };
    for m in &cat.snapshots {
        if kept.contains(&m.dir_seq) {
            continue;
        }
        let mkey = format!("{}manifest", snap_dir(volume, m.dir_seq));
        del(mkey.clone()).await?;
        for k in cat.snapshot_objects.remove(&m.dir_seq).unwrap_or_default() {
            if k != mkey {
                del(k).await?;
            }
        }
        out.snapshots += 1;
    }
    let newest = cat.snapshots.iter().map(|m| m.dir_seq).max().unwrap_or(0);
    for (seq, objs) in cat.unfinished {
        if seq < newest {
            let mkey = format!("{}manifest", snap_dir(volume, seq));
            if let Some((k, why)) = cat.damaged.iter().find(|(k, _)| *k == mkey) {
                out.damaged.push(format!("{k}: {why}"));
            }
            for k in objs {
                del(k).await?;
            }
            out.unfinished += 1;
        }
    }
    if let Some(oldest) = oldest_base {
        for s in cat.segments.into_iter().filter(|s| s.last <= oldest) {
            del(s.key).await?;
            out.segments += 1;
        }
    }
    Ok(out)
}

/// Delete every backup object of `volume` (`jfs backup --purge`); returns how many.
pub async fn purge(store: &dyn BlockStore, volume: &str) -> Result<u64> {
    let mut keys = Vec::new();
    store
        .list(&prefix(volume), &mut |page| {
            keys.extend(page.into_iter().map(|o| o.key));
            Ok(())
        })
        .await?;
    // Manifests first: a purge cut short leaves no snapshot that looks complete.
    keys.sort_by_key(|k| !k.ends_with("/manifest"));
    for k in &keys {
        match store.delete(k).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e.context(format!("deleting backup object {k}"))),
        }
    }
    Ok(keys.len() as u64)
}

/// gc's hold: pending deletes stamped at a seq above this may be referenced by a
/// recoverable instant: the smallest directory seq of the snapshots in the store, complete
/// or being written (None: no snapshot, nothing held). A gc calls it after reading its
/// pending deletes (see `snapshot` for why that order is sound).
pub async fn hold_seq(store: &dyn BlockStore, volume: &str) -> Result<Option<u64>> {
    let cat = catalog(store, volume).await?;
    Ok(cat
        .snapshots
        .iter()
        .map(|m| m.dir_seq)
        .chain(cat.unfinished.keys().copied())
        .min())
}

/// Whose turn it is to back up: the primary agent's while its lease is alive, else the
/// live writing session with the smallest id. `me`: this process's session id (a mount), or
/// None for the primary agent. Never a mirror's.
pub async fn my_turn(engine: &dyn Engine, me: Option<&str>) -> Result<bool> {
    if crate::site::aux_exact(engine, crate::site::MARKER)
        .await?
        .is_some()
    {
        return Ok(false);
    }
    let now = now_ns();
    let agent_live = match crate::site::aux_exact(engine, AGENT_LEASE).await? {
        Some(v) => serde_json::from_slice::<serde_json::Value>(&v)
            .ok()
            .and_then(|j| j.get("beat_ns").and_then(|b| b.as_i64()))
            .is_some_and(|b| now.saturating_sub(b) <= AGENT_STALE_NS),
        None => false,
    };
    let Some(me) = me else { return Ok(true) };
    if agent_live {
        return Ok(false);
    }
    let sessions = crate::session::list(engine).await?;
    let first = sessions
        .iter()
        .filter(|s| {
            !s.read_only
                && s.relayed_by.is_none()
                && !s.forwarded
                && s.is_live(now, crate::session::DEFAULT_TIMEOUT)
        })
        .map(|s| s.id.as_str())
        .min();
    Ok(first.is_none_or(|f| f == me))
}

/// The primary agent's lease record (mirror-agent's `primary::lease::LEASE`).
pub const AGENT_LEASE: &str = "primary.agent";
const AGENT_STALE_NS: i64 = 10_000_000_000;

/// The state of a process's backup work between its steps.
#[derive(Debug, Default)]
pub struct Runner {
    /// The last entry known shipped (None: not read from the store yet).
    shipped: Option<u64>,
    newest_ns: Option<i64>,
    /// The newest snapshot's seq: an idle volume gets no new snapshot of the same state.
    newest_seq: Option<u64>,
    last_ship_ns: i64,
    pub last: Option<String>,
}

/// What one step did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub snapshot: Option<u64>,
    pub shipped_to: Option<u64>,
    pub pruned: Option<Pruned>,
}

impl Runner {
    /// One step: a snapshot when due (then retention), else the journal shipped up to the
    /// head when the segment interval passed. `force`: a snapshot now.
    pub async fn step(
        &mut self,
        engine: &dyn Engine,
        store: &dyn BlockStore,
        force: bool,
    ) -> Result<Step> {
        if crate::site::aux_exact(engine, crate::site::MARKER)
            .await?
            .is_some()
        {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{} is a mirror's metadata: metadata backups are taken at the primary (its agent or a read-write mount there), into the volume's store",
                    engine.display_url()
                ),
            ));
        }
        let s: Settings = match engine.get(keys::SETTING).await? {
            Some(v) => serde_json::from_slice(&v).map_err(|e| corrupt(format!("settings: {e}")))?,
            None => return Ok(Step::default()),
        };
        let b = s.backup();
        let mut out = Step::default();
        if !b.enabled && !force {
            return Ok(out);
        }
        let now = now_ns();
        if self.shipped.is_none() {
            let cat = catalog(store, &s.name).await?;
            self.newest_ns = cat.snapshots.iter().map(|m| m.taken_ns).max();
            self.newest_seq = cat.snapshots.iter().map(|m| m.seq).max();
            self.shipped = cat.last_recoverable();
        }
        let head = engine.journal_bounds().await?.last;
        let due = force
            || (self.newest_seq != Some(head)
                && self
                    .newest_ns
                    .is_none_or(|t| now - t >= b.snapshot_every_secs as i64 * 1_000_000_000));
        let mut shipped = self.shipped;
        if let Some(sh) = shipped.filter(|&sh| sh < head) {
            if due || now - self.last_ship_ns >= b.segment_every_secs as i64 * 1_000_000_000 {
                match ship(engine, store, &s.name, sh + 1, head).await {
                    Ok(to) => {
                        shipped = Some(to);
                        out.shipped_to = Some(to);
                        self.last_ship_ns = now;
                    }
                    // Trimmed past what was shipped: a new snapshot starts a new range.
                    Err(e) if e.kind() == ErrorKind::SeqNotRetained => shipped = None,
                    Err(e) => return Err(e),
                }
            }
        }
        self.shipped = shipped;
        if due || shipped.is_none() {
            let m = snapshot(engine, store, &s, shipped.unwrap_or(0)).await?;
            self.shipped = Some(m.seq.max(shipped.unwrap_or(0)));
            self.newest_ns = Some(m.taken_ns);
            self.newest_seq = Some(m.seq);
            self.last_ship_ns = now;
            out.snapshot = Some(m.seq);
            out.pruned = Some(prune(store, &s.name, &b).await?);
        }
        Ok(out)
    }
}

/// The instant to recover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The last shipped entry.
    Latest,
    /// The metadata as of this entry.
    Seq(u64),
    /// The metadata as of the last entry committed at or before this time (ns).
    Time(i64),
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Latest => "the last shipped entry".into(),
            Target::Seq(n) => format!("seq {n}"),
            Target::Time(t) => crate::owner::rfc3339(*t),
        }
    }
}

/// What `recover` rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovered {
    /// Snapshots whose manifest is damaged (never used): key and why.
    pub damaged: Vec<(String, String)>,
    pub snapshot_seq: u64,
    pub seq: u64,
    pub time_ns: i64,
    pub pairs: u64,
    pub entries: u64,
}

/// Refuse metadata that holds anything: recover writes only into an empty engine.
pub async fn check_empty(engine: &dyn Engine) -> Result<()> {
    let keys = engine.scan(b"", &[0xff], 1).await?;
    let b = engine.journal_bounds().await?;
    let aux = engine.aux_list("").await?;
    if !keys.is_empty() || b.last > 0 || !aux.is_empty() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is not empty ({}): recover writes only into empty metadata; give it a new database or directory",
                engine.display_url(),
                if keys.is_empty() && b.last == 0 {
                    format!("it holds records such as {:?}", aux[0].0)
                } else {
                    format!("it holds keys, and journal entries up to {}", b.last)
                }
            ),
        ));
    }
    Ok(())
}

/// Rebuild the metadata of `target` into the empty `engine` from `volume`'s backups in
/// `store`: the newest snapshot at or before it, then the journal up to it (gap-free, each
/// entry checked). The engine is marked as a mirror's while it is filled (so nothing writes
/// it meanwhile, and `install_*`/`apply` take it); the mark goes at the end. A recover cut
/// short leaves it marked: start again on empty metadata.
pub async fn recover(
    engine: &dyn Engine,
    store: &dyn BlockStore,
    volume: &str,
    target: Target,
) -> Result<Recovered> {
    check_empty(engine).await?;
    let mut cat = catalog(store, volume).await?;
    cat.snapshots.sort_by_key(|m| m.seq);
    let Some(last) = cat.last_recoverable() else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no metadata snapshot of volume {volume:?} in {} (under {}): nothing to recover from; check the store URL and --name",
                store.display_url(),
                prefix(volume)
            ),
        ));
    };
    let oldest = &cat.snapshots[0];
    let range = || {
        format!(
            "the recoverable range is seq {}..={last} (see jfs recover --list)",
            oldest.seq
        )
    };
    let snap = match target {
        Target::Latest => cat.snapshots.last(),
        Target::Seq(n) => {
            if n > last {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("seq {n} is past the last shipped entry: {}", range()),
                ));
            }
            cat.snapshots.iter().rev().find(|m| m.seq <= n)
        }
        Target::Time(t) => cat.snapshots.iter().rev().find(|m| m.time_ns <= t),
    }
    .ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} is before the oldest kept snapshot: {}",
                target.describe(),
                range()
            ),
        )
    })?
    .clone();
    let marker = crate::site::MirrorMarker {
        version: crate::site::MARKER_VERSION,
        name: "recover".into(),
        primary: "jfs recover".into(),
        store: store.display_url(),
        origin_store: None,
        since_ns: now_ns(),
    };
    crate::site::set_marker(engine, &marker).await?;
    fill(engine, store, &cat, &snap, target).await.map_err(|e| {
        e.context(format!(
            "{} is left half filled and marked as being recovered: empty it (a new directory or database, FLUSHALL, the schema dropped) before recovering into it again",
            engine.display_url()
        ))
    })
}

async fn fill(
    engine: &dyn Engine,
    store: &dyn BlockStore,
    cat: &Catalog,
    snap: &Manifest,
    target: Target,
) -> Result<Recovered> {
    engine.install_reset().await?;
    let mut pairs = 0u64;
    for p in &snap.parts {
        let b = store
            .get(&p.key)
            .await
            .map_err(|e| e.context(format!("reading snapshot part {}", p.key)))?;
        if b.len() as u64 != p.bytes || crc32c::crc32c(&b) != p.crc32c {
            return Err(corrupt(format!(
                "snapshot part {} is not the one its manifest names ({} bytes where {} were written, or another checksum): damaged; recover to an instant of another snapshot",
                p.key,
                b.len(),
                p.bytes
            )));
        }
        let mut body = unseal(SNAP_KIND, &p.key, &b)?;
        let mut batch = Vec::with_capacity(1000);
        let mut n = 0;
        while !body.is_empty() {
            let k = take_frame(&p.key, &mut body)?.to_vec();
            let v = take_frame(&p.key, &mut body)?.to_vec();
            batch.push((k, v));
            n += 1;
            if batch.len() == 1000 {
                engine.install_put(&batch).await?;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            engine.install_put(&batch).await?;
        }
        if n != p.pairs {
            return Err(corrupt(format!(
                "snapshot part {} holds {n} pairs, its manifest says {}",
                p.key, p.pairs
            )));
        }
        pairs += n;
    }
    engine.install_head(snap.base_seq).await?;
    // The journal from the base on: the snapshot's window, then up to the target.
    let mut head = snap.base_seq;
    let mut time_ns = snap.time_ns;
    let mut entries = 0u64;
    let stop = |e: &Entry| match target {
        Target::Latest => false,
        Target::Seq(n) => e.seq > n,
        Target::Time(t) => e.seq > snap.seq && e.time_ns > t,
    };
    'segs: loop {
        let want = head + 1;
        let Some(seg) = cat
            .segments
            .iter()
            .filter(|s| s.first <= want && s.last >= want)
            .max_by_key(|s| s.last)
        else {
            break;
        };
        let todo: Vec<Entry> = read_segment(store, seg)
            .await?
            .into_iter()
            .filter(|e| e.seq >= want)
            .collect();
        let mut batch = Vec::new();
        for e in todo {
            if stop(&e) {
                if !batch.is_empty() {
                    engine.apply(&batch).await?;
                }
                break 'segs;
            }
            head = e.seq;
            time_ns = e.time_ns;
            entries += 1;
            batch.push(e);
            if batch.len() == 500 {
                engine.apply(&batch).await?;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            engine.apply(&batch).await?;
        }
    }
    let wanted = match target {
        Target::Seq(n) => n,
        _ => snap.seq,
    };
    if head < wanted.max(snap.seq) {
        return Err(corrupt(format!(
            "the shipped journal has a gap: entry {} is in no segment (needed to reach seq {}); recover to an earlier instant",
            head + 1,
            wanted.max(snap.seq)
        )));
    }
    engine.aux_put(crate::site::MARKER, None).await?;
    Ok(Recovered {
        damaged: cat.damaged.clone(),
        snapshot_seq: snap.seq,
        seq: head,
        time_ns,
        pairs,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(base: u64, hours_ago: i64, now: i64) -> Manifest {
        Manifest {
            version: 1,
            volume: "v".into(),
            uuid: "u".into(),
            dir_seq: base,
            base_seq: base,
            seq: base,
            time_ns: now - hours_ago * 3600 * 1_000_000_000,
            taken_ns: 0,
            pairs: 0,
            bytes: 0,
            parts: vec![],
        }
    }

    #[test]
    fn retention_keeps_the_newest_and_the_oldest_of_each_hour_and_day() {
        let now = 1_000 * 24 * 3600 * 1_000_000_000i64 + 1;
        let b = BackupSettings {
            keep_hourly: 2,
            keep_daily: 2,
            ..Default::default()
        };
        // Oldest first: 72 h, 30 h, 25 h, 1 h, 0 h (two in the last hour).
        let snaps = vec![
            m(1, 72, now),
            m(2, 30, now),
            m(3, 25, now),
            m(4, 1, now),
            m(5, 0, now),
            m(6, 0, now),
        ];
        let k: Vec<u64> = keep(&snaps, &b, now).into_iter().collect();
        // 6 the newest; 5 the oldest of this hour (and of today: `now` is just past
        // midnight); 4 of the hour before (and of yesterday); 1, 2, 3 are older than both.
        assert_eq!(k, vec![4, 5, 6]);
        // Four days: the oldest of the day before yesterday (2) and of the day before (1).
        let b4 = BackupSettings {
            keep_daily: 4,
            ..b.clone()
        };
        let k: Vec<u64> = keep(&snaps, &b4, now).into_iter().collect();
        assert_eq!(k, vec![1, 2, 4, 5, 6]);
    }

    #[test]
    fn a_sealed_object_refuses_damage_and_tearing() {
        let s = seal(SEG_KIND, b"hello");
        assert_eq!(unseal(SEG_KIND, "k", &s).unwrap(), b"hello");
        let mut d = s.to_vec();
        d[9] ^= 1;
        let e = unseal(SEG_KIND, "k", &d).unwrap_err().to_string();
        assert!(e.contains("backup object k is torn or damaged"), "{e}");
        let e = unseal(SEG_KIND, "k", &s[..s.len() - 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("torn or damaged"), "{e}");
        assert!(unseal(SNAP_KIND, "k", &s).is_err());
    }
}
