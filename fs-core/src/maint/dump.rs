//! `jfs dump` / `jfs load`: the whole metadata as engine-independent JSON (names and values
//! that are not UTF-8 written as `\\x:<hex>`), loaded into an empty volume of any engine.

use super::PAGE;
use crate::engine::{scan_all, CommitOutcome, Engine};
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::journal::{parse_counter, Op};
use crate::keys::{self, Key};
use crate::txn::Txn;
use crate::types::{Attr, Ino, Settings, SliceRec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const HEX_MARK: &str = "\\x:";

/// Names and values that are not UTF-8 (or look like the escape) are written as `\x:<hex>`.
pub fn encode_name(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.starts_with(HEX_MARK) => s.to_string(),
        _ => format!("{HEX_MARK}{}", hex(b)),
    }
}

/// The bytes of a name `encode_name` wrote. Only its own spelling is accepted: a `\x:` form
/// of a name that has a plain one (`\x:41` for `A`), upper-case or signed hex would load as
/// the same key as another item of the dump, one silently replacing the other.
pub fn decode_name(s: &str) -> Result<Vec<u8>> {
    let Some(h) = s.strip_prefix(HEX_MARK) else {
        return Ok(s.as_bytes().to_vec());
    };
    let b = unhex(h).ok_or_else(|| {
        corrupt(format!(
            "bad hex name {s:?} in the dump: after \\x: come two lower-case hex digits per byte"
        ))
    })?;
    if encode_name(&b) != s {
        return Err(corrupt(format!(
            "name {s:?} in the dump is not spelled as jfs dump writes it ({:?}): a dump edited by hand? write the name as {:?}",
            encode_name(&b),
            encode_name(&b)
        )));
    }
    Ok(b)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    // Digits only: `from_str_radix` alone takes a sign ("+f").
    if s.len() % 2 != 0 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
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
    /// In the trash: its record (`fs::trash::TrashInfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trash: Option<TrashDump>,
}

/// A trashed inode's two records: `trash::TrashInfo` and the stamp of its deletion.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct TrashDump {
    /// The time in its `T` key (ns).
    pub key_ns: u64,
    /// `"<seq> <time_ns>"` of the commit that trashed it.
    pub stamp: String,
    /// `A<ino>T` as it is (JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<serde_json::Value>,
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
    /// The metadata the dump was taken from (its URL as shown, no password; `jfs dump` sets
    /// it): `jfs load` looks there for live mounts before it takes the volume's store over
    /// (absent: a dump of an older jfs, or one made by a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
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
    let mut clones = Vec::new();
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
                // Reference counts are the chunk records' to count: `load` counts them again.
                Key::Refs(_) => {}
                Key::Cloning(_) => clones.push(crate::fs::clone::Staging::decode(&v)?),
                Key::Kept(ino) => {
                    inodes.entry(ino).or_default().kept =
                        Some(String::from_utf8_lossy(&v).into_owned())
                }
                Key::Trash(at, ino) => {
                    let t = inodes
                        .entry(ino)
                        .or_default()
                        .trash
                        .get_or_insert_with(Default::default);
                    t.key_ns = at;
                    t.stamp = encode_name(&v);
                }
                Key::TrashInfo(ino) => {
                    let info = serde_json::from_slice(&v).map_err(|e| {
                        corrupt(format!(
                            "the trash record of inode {ino} does not decode: {e}"
                        ))
                    })?;
                    inodes
                        .entry(ino)
                        .or_default()
                        .trash
                        .get_or_insert_with(Default::default)
                        .info = Some(info);
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
    // A clone still being written is not part of the volume: its inodes stay out.
    for st in clones {
        for (start, count) in st.ranges {
            let gone: Vec<Ino> = inodes
                .range(start..start.saturating_add(count))
                .map(|(i, _)| *i)
                .collect();
            for i in gone {
                inodes.remove(&i);
            }
        }
    }
    Ok(Dump {
        setting,
        counters,
        pending,
        inodes,
        checksums,
        storage,
        audit,
        epoch,
        source: None,
    })
}

/// Whether `load` would take this dump: its settings, namespace and slice records (what
/// `load` checks before writing anything), without an engine.
pub fn check_dump(d: &Dump) -> Result<()> {
    check_and_pairs(d).map(|_| ())
}

/// Every key/value pair a dump stands for.
/// `load` writes nothing before this passes: the settings are ones `jfs format` could have
/// made (a block size of 0 would divide by zero at the first read), every slice record
/// describes bytes its slice has, inside its chunk.
pub(crate) fn check_and_pairs(d: &Dump) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    d.setting
        .validate()
        .map_err(|e| corrupt(format!("the dump's settings: {e}")))?;
    check_tree(d)?;
    for (ino, n) in &d.inodes {
        for (idx, recs) in &n.chunks {
            for r in recs {
                let past_slice = r.id != 0 && r.off as u64 + r.len as u64 > r.size as u64;
                if past_slice || r.pos as u64 + r.len as u64 > crate::types::CHUNK_SIZE {
                    return Err(corrupt(format!(
                        "chunk {idx} of inode {ino} in the dump has a slice record past its slice or chunk ({r:?}): the dump is damaged"
                    )));
                }
            }
        }
    }
    dump_pairs(d)
}

/// The dump's namespace is a tree a file system could have made: every entry name is one a
/// file could have (not empty, `.` or `..`, no `/` or NUL, at most 255 bytes), the root is a
/// directory, and every directory but the root is the child of exactly one entry of a
/// directory reachable from the root (no cycle, no directory linked twice, none cut off).
/// A hand-edited dump naming `/etc/passwd` or `..`, or a directory inside itself, would
/// otherwise send `jfs get` outside its LOCAL or `ls -R` round a loop.
fn check_tree(d: &Dump) -> Result<()> {
    use crate::types::{FileKind, ROOT_INO};
    let damaged = |what: String| {
        corrupt(format!(
            "{what}: a file system cannot hold this tree; the dump is damaged or edited (nothing was loaded)"
        ))
    };
    let is_dir = |ino: Ino| {
        d.inodes
            .get(&ino)
            .and_then(|n| n.attr.as_ref())
            .is_some_and(|a| a.kind == FileKind::Dir)
    };
    if !is_dir(ROOT_INO) {
        return Err(damaged(format!(
            "the root (inode {ROOT_INO}) is missing or not a directory"
        )));
    }
    let mut parent_of: BTreeMap<Ino, Ino> = BTreeMap::new();
    for (&ino, n) in &d.inodes {
        if !n.entries.is_empty() && !is_dir(ino) {
            return Err(damaged(format!(
                "inode {ino} has entries but is not a directory"
            )));
        }
        for (name, &child) in &n.entries {
            let bytes = decode_name(name)?;
            crate::fs::check_name(&bytes).map_err(|e| {
                damaged(format!(
                    "entry {name:?} of directory inode {ino} is not a file name ({})",
                    e.message()
                ))
            })?;
            if child == ROOT_INO {
                return Err(damaged(format!(
                    "entry {name:?} of directory inode {ino} points at the root"
                )));
            }
            if is_dir(child) {
                if let Some(first) = parent_of.insert(child, ino) {
                    return Err(damaged(format!(
                        "directory inode {child} is entered from both inode {first} and inode {ino}"
                    )));
                }
            }
        }
    }
    // Every directory with a parent reaches the root through parents; a loop of parents
    // (a directory inside itself) never does.
    let mut reaches_root: std::collections::BTreeSet<Ino> = [ROOT_INO].into();
    for &start in parent_of.keys() {
        let mut path = Vec::new();
        let mut on_path = std::collections::BTreeSet::new();
        let mut at = start;
        while !reaches_root.contains(&at) {
            path.push(at);
            on_path.insert(at);
            match parent_of.get(&at) {
                Some(&p) if !on_path.contains(&p) => at = p,
                Some(_) => {
                    return Err(damaged(format!(
                        "directory inode {start} is inside itself"
                    )))
                }
                None => {
                    return Err(damaged(format!(
                        "directory inode {start} is not reachable from the root (its topmost directory, inode {at}, is in no directory)"
                    )))
                }
            }
        }
        reaches_root.extend(path);
    }
    Ok(())
}

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
    // Slices named by more than one chunk record (clones) get their reference counts.
    let mut refs: BTreeMap<u64, i64> = BTreeMap::new();
    for n in d.inodes.values() {
        for recs in n.chunks.values() {
            let ids: std::collections::BTreeSet<u64> =
                recs.iter().filter(|r| r.id != 0).map(|r| r.id).collect();
            for id in ids {
                *refs.entry(id).or_default() += 1;
            }
        }
    }
    for (id, n) in refs {
        if n > 1 {
            out.push((keys::refs(id), (n - 1).to_string().into_bytes()));
        }
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
        if let Some(t) = &n.trash {
            if !t.stamp.is_empty() {
                out.push((keys::trash(t.key_ns as i64, ino), decode_name(&t.stamp)?));
            }
            if let Some(info) = &t.info {
                out.push((
                    keys::trash_info(ino),
                    serde_json::to_vec(info).expect("JSON serializes"),
                ));
            }
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
    let mut pairs = check_and_pairs(d)?;
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
    // The loaded metadata is a new holder of the volume's store (see `owner::take_over`),
    // and its ids start past the source's: the metadata the dump came from may still be
    // written until it is stopped, and the two must never name a block alike.
    for (k, v) in pairs.iter_mut() {
        if k.as_slice() == keys::NEXT_INODE || k.as_slice() == keys::NEXT_SLICE {
            let n = crate::journal::parse_counter(Some(v))? + crate::site::ID_MARGIN;
            *v = n.to_string().into_bytes();
        }
    }
    let mut setting = d.setting.clone();
    setting.incarnation = Some(format!("{:032x}", rand::random::<u128>()));
    pairs.push((
        keys::SETTING.to_vec(),
        serde_json::to_vec(&setting).expect("settings serialize"),
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
