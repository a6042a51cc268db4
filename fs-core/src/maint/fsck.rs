//! `jfs fsck`: every block the metadata references exists with the length its key says (and,
//! `deep`, matches its checksum); nothing is changed. Each broken block is reported once,
//! with what is wrong in words ("missing", "damaged: ...", no checksum record) and what a
//! good copy must match (its length, and its recorded CRC32C), so that a repair
//! (`jfs fsck --repair-from`) can check a copy before it writes it.

use super::PAGE;
use crate::error::{corrupt, ErrorKind, Result};
use crate::fs::Fs;
use crate::keys::{self, Key};
use crate::store::BlockCheck;
use crate::types::{Ino, SliceRec};
use futures::StreamExt;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct BrokenBlock {
    pub ino: Ino,
    pub path: String,
    pub key: String,
    /// What is wrong, without the block's name: "missing", "damaged: ...", or the slice's
    /// checksum record is missing.
    pub problem: String,
    /// The length its key says.
    pub len: u32,
    /// The CRC32C its slice recorded (format 2).
    pub crc: Option<u32>,
    /// A good copy of the block would mend it (false: its slice has no checksum record, so
    /// no copy can be checked).
    pub repairable: bool,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct FsckReport {
    pub files: u64,
    pub blocks: u64,
    pub broken: Vec<BrokenBlock>,
    /// Slices whose references disagree with the metadata: a slice a file still names but
    /// pending deletion (gc would delete blocks in use), or a clone's reference count
    /// (`keys::refs`) that is not the number of chunk records naming it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<String>,
}

/// What is wrong with block `key` at `store`, in words, when its length is to be `len` and
/// its CRC32C `crc`: "missing", "damaged: ..." (its length, or its checksum against the
/// recorded one), or None when the copy there checks.
pub async fn describe(
    store: &dyn crate::store::BlockStore,
    key: &str,
    len: u32,
    crc: Option<u32>,
) -> Result<Option<String>> {
    match store.head(key).await? {
        None => return Ok(Some("missing".into())),
        Some(m) if m.size != len as u64 => {
            return Ok(Some(format!(
                "damaged: it has {} bytes, its key says {len}",
                m.size
            )))
        }
        Some(_) => {}
    }
    let b = match store.get(key).await {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Some("missing".into())),
        Err(e) if e.kind() == ErrorKind::Corrupt => {
            return Ok(Some(format!(
                "damaged: {}",
                e.message().replace(&format!("block {key} "), "")
            )))
        }
        Err(e) => return Err(e),
    };
    if b.len() != len as usize {
        return Ok(Some(format!(
            "damaged: it has {} bytes, its key says {len}",
            b.len()
        )));
    }
    Ok(match crc {
        Some(want) if crc32c::crc32c(&b) != want => Some(format!(
            "damaged: fails its checksum (CRC32C {:08x}, its slice recorded {want:08x})",
            crc32c::crc32c(&b)
        )),
        _ => None,
    })
}

impl Fs {
    /// Check that every block the metadata references exists with the length its key says
    /// and, on a format-2 volume, that its slice has its checksum record. `deep`: read every
    /// block and check it against its checksum (on a format-1 volume, its length).
    pub async fn fsck(&self, deep: bool) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        // (inode, key, problem, length, checksum, repairable)
        let mut bad: Vec<(Ino, String, String, u32, Option<u32>, bool)> = Vec::new();
        let mut from = keys::INODE_PREFIX.to_vec();
        let end = keys::prefix_end(keys::INODE_PREFIX);
        let mut last_ino = 0;
        // Pending deletes and clones' reference counts are few (freed slices wait for the
        // trash time; counts exist only for shared slices): held while the chunks are read.
        let mut pending: std::collections::HashSet<u64> = Default::default();
        let mut refs: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
        for (prefix, is_refs) in [(keys::PENDING_PREFIX, false), (keys::REFS_PREFIX, true)] {
            crate::engine::scan_all(
                &*self.engine,
                prefix,
                &keys::prefix_end(prefix),
                PAGE,
                |pg| {
                    for (k, v) in pg {
                        match keys::parse(&k) {
                            Key::Pending(id, _) if !is_refs => {
                                pending.insert(id);
                            }
                            Key::Refs(id) if is_refs => {
                                let n = crate::journal::parse_counter(Some(&v))?;
                                refs.insert(id, (n + 1, 0));
                            }
                            _ => {}
                        }
                    }
                    Ok(())
                },
            )
            .await?;
        }
        let mut in_use_pending: BTreeMap<u64, Ino> = BTreeMap::new();
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
                    let ids: std::collections::BTreeSet<u64> =
                        recs.iter().filter(|r| r.id != 0).map(|r| r.id).collect();
                    for id in ids {
                        if pending.contains(&id) {
                            in_use_pending.entry(id).or_insert(ino);
                        }
                        if let Some(c) = refs.get_mut(&id) {
                            c.1 += 1;
                        }
                    }
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
                        let len = keys::block_len(r.size, bs, 0);
                        let key = keys::block_key(&self.settings.name, r.id, 0, len);
                        bad.push((
                            *ino,
                            key,
                            format!(
                                "slice {} has no valid checksum record (reads of it fail)",
                                r.id
                            ),
                            len,
                            None,
                            false,
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
                            // Looked at again as it is, to say what is wrong with it (a
                            // damaged copy some layer would not hand out reads as absent).
                            Err(e) => match describe(&*self.store, &key, len, crc).await {
                                Ok(Some(d)) => Ok(Some(d)),
                                _ if e.kind() == ErrorKind::NotFound => {
                                    Ok(Some("missing".to_string()))
                                }
                                _ if e.kind() == ErrorKind::Corrupt => Ok(Some(format!(
                                    "damaged: {}",
                                    e.message().replace(&format!("block {key} "), "")
                                ))),
                                _ => Err(e),
                            },
                        }
                    } else {
                        match self.store.head(&key).await {
                            Ok(Some(m)) if m.size == len as u64 => Ok(None),
                            Ok(Some(m)) => Ok(Some(format!(
                                "damaged: it has {} bytes, its key says {len}",
                                m.size
                            ))),
                            Ok(None) => Ok(Some("missing".to_string())),
                            Err(e) => Err(e),
                        }
                    };
                    (key, ino, len, crc, r)
                }))
                .buffer_unordered(if deep { 8 } else { 32 })
                .collect()
                .await;
            for (key, ino, len, crc, r) in results {
                match r {
                    Ok(None) => {}
                    Ok(Some(problem)) => bad.push((ino, key, problem, len, crc, true)),
                    Err(e) => return Err(e.context(format!("checking block {key}"))),
                }
            }
            if n < PAGE {
                break;
            }
        }
        for (id, ino) in in_use_pending {
            report.references.push(format!(
                "slice {id} is named by inode {ino} but pending deletion: gc would delete blocks in use"
            ));
        }
        for (id, (want, found)) in refs {
            if want != found && found > 1 {
                report.references.push(format!(
                    "slice {id} records {want} references, {found} chunk records name it"
                ));
            }
        }
        bad.sort();
        let inos: Vec<Ino> = bad.iter().map(|b| b.0).collect();
        let paths = self.paths_of(&inos).await;
        for (ino, key, problem, len, crc, repairable) in bad {
            let path = paths
                .get(&ino)
                .cloned()
                .unwrap_or_else(|| format!("<inode {ino}>"));
            report.broken.push(BrokenBlock {
                ino,
                path,
                key,
                problem,
                len,
                crc,
                repairable,
            });
        }
        Ok(report)
    }
}
