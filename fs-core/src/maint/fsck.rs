//! `jfs fsck`: every block the metadata references exists with the length its key says (and,
//! `deep`, matches its checksum); nothing is changed.

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
        let inos: Vec<Ino> = bad.iter().map(|b| b.0).collect();
        let paths = self.paths_of(&inos).await;
        for (ino, key, problem) in bad {
            let path = paths
                .get(&ino)
                .cloned()
                .unwrap_or_else(|| format!("<inode {ino}>"));
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
