//! The change journal: one entry per committed metadata transaction, framed with a version
//! and a CRC32C. Entries hold the operation (for humans and metrics) and the write-set
//! (puts and deletes with final values), so replay is deterministic, idempotent and
//! independent of the engine that produced it.
//!
//! Frame layout (all integers little-endian):
//! `[version: u8 = 1][payload length: u32][crc32c(payload): u32][payload: postcard(Entry)]`
//!
//! A frame decodes only if its payload is exactly one entry (no bytes after it) whose writes
//! are puts and deletes; `Entry::decode_at` also checks that the entry is the one its journal
//! position says. The payload length is checked against `MAX_FRAME` and the bytes at hand
//! before anything is read; postcard preallocates at most 1 MiB for a sequence it has not yet
//! read (serde's cautious size hint), so a lying length costs at most that.

use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::types::{FileKind, Ino, SetAttr};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub const FRAME_VERSION: u8 = 1;
pub const FRAME_HEADER: usize = 9;
/// A frame larger than this is refused as corrupt rather than allocated.
pub const MAX_FRAME: usize = 256 << 20;

/// One change to a key, as requested by a transaction.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Add to an ASCII-decimal counter. The engine turns it into a `Put` of the new value in
    /// its commit section, so the journal never holds deltas (replay stays idempotent).
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    /// Put `"<seq> <time_ns>"` of the committing transaction (pending-delete tags).
    Stamp {
        key: Vec<u8>,
    },
}

impl Mutation {
    pub fn key(&self) -> &[u8] {
        match self {
            Mutation::Put { key, .. }
            | Mutation::Delete { key }
            | Mutation::Add { key, .. }
            | Mutation::Stamp { key } => key,
        }
    }
}

/// What a transaction did, in words a human (or a metrics label) can use.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Format {
        name: String,
    },
    Settings {
        what: String,
    },
    AllocInodes {
        start: Ino,
        count: u64,
    },
    AllocSlices {
        start: u64,
        count: u64,
    },
    Mknod {
        parent: Ino,
        name: String,
        ino: Ino,
        kind: FileKind,
        mode: u32,
    },
    Symlink {
        parent: Ino,
        name: String,
        ino: Ino,
        target: String,
    },
    Link {
        ino: Ino,
        parent: Ino,
        name: String,
    },
    Unlink {
        parent: Ino,
        name: String,
        ino: Ino,
        freed: bool,
    },
    Rmdir {
        parent: Ino,
        name: String,
        ino: Ino,
    },
    Rename {
        parent: Ino,
        name: String,
        new_parent: Ino,
        new_name: String,
        ino: Ino,
        replaced: Option<Ino>,
    },
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    Write {
        ino: Ino,
        chunk: u32,
        pos: u32,
        slice: u64,
        size: u32,
        off: u32,
        len: u32,
    },
    Compact {
        ino: Ino,
        chunk: u32,
        slice: u64,
        size: u32,
        freed: u32,
    },
    SetXattr {
        ino: Ino,
        name: String,
    },
    RemoveXattr {
        ino: Ino,
        name: String,
    },
    /// Pending deletes whose blocks `gc` removed.
    Purge {
        slices: u64,
    },
    /// A batch of `jfs load`.
    Load {
        keys: u64,
    },
    /// A file unlinked while open, freed at its last close (or when its session died).
    Release {
        ino: Ino,
    },
    /// A batch of a clone being written: inodes not linked into the tree yet (`fs::clone`).
    CloneStage {
        root: Ino,
        inodes: u64,
    },
    /// A clone linked into place: the tree of `src` as of journal entry `at_seq` is now
    /// `name` in `parent`, inode `ino`, `entries` inodes in all.
    Clone {
        src: Ino,
        parent: Ino,
        name: String,
        ino: Ino,
        entries: u64,
        at_seq: u64,
    },
    /// The inodes of a clone that never finished, removed (its writer died, or it failed).
    CloneDrop {
        root: Ino,
        inodes: u64,
    },
    /// `len` bytes of file `src` from `off_in` laid into file `ino` at `off_out` by sharing
    /// the source's slices (`copy_file_range`, `cp --reflink`).
    CopyRange {
        src: Ino,
        off_in: u64,
        ino: Ino,
        off_out: u64,
        len: u64,
    },
    /// A trashed inode freed: past the trash time, or `evicted` by the trash's size cap.
    TrashPurge {
        ino: Ino,
        evicted: bool,
    },
    /// Entries of the trash put back into directory `parent` (`jfs restore`).
    Restore {
        parent: Ino,
        entries: u64,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Format { .. } => "format",
            Op::Settings { .. } => "settings",
            Op::AllocInodes { .. } => "alloc_inodes",
            Op::AllocSlices { .. } => "alloc_slices",
            Op::Mknod { .. } => "mknod",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::SetAttr { .. } => "setattr",
            Op::Write { .. } => "write",
            Op::Compact { .. } => "compact",
            Op::SetXattr { .. } => "setxattr",
            Op::RemoveXattr { .. } => "removexattr",
            Op::Purge { .. } => "purge",
            Op::Load { .. } => "load",
            Op::Release { .. } => "release",
            Op::CloneStage { .. } => "clone_stage",
            Op::Clone { .. } => "clone",
            Op::CloneDrop { .. } => "clone_drop",
            Op::CopyRange { .. } => "copy_range",
            Op::TrashPurge { .. } => "trash_purge",
            Op::Restore { .. } => "restore",
        }
    }
    /// The operation's arguments as a JSON object (without the variant wrapper).
    pub fn args_json(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) if m.len() == 1 => {
                m.into_iter().next().map(|(_, v)| v).unwrap_or_default()
            }
            Ok(v) => v,
            Err(_) => serde_json::Value::Null,
        }
    }
}

/// A committed transaction as stored in the journal. `writes` holds only `Put` and `Delete`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub time_ns: i64,
    pub op: Op,
    pub writes: Vec<Mutation>,
}

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let payload = postcard::to_stdvec(self).expect("journal entries always serialize");
        let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
        out.push(FRAME_VERSION);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Decode one whole frame. A short, oversized or trailing-garbage frame, a bad checksum or
    /// an unknown version is an error, never skipped.
    pub fn decode(frame: &[u8]) -> Result<Entry> {
        let (entry, used) = Self::decode_prefix(frame)?;
        if used != frame.len() {
            return Err(corrupt(format!(
                "journal frame has {} trailing bytes after its payload",
                frame.len() - used
            )));
        }
        Ok(entry)
    }

    /// Decode the frame read from the journal at position `seq`.
    pub fn decode_at(seq: u64, frame: &[u8]) -> Result<Entry> {
        let e = Self::decode(frame)?;
        if e.seq != seq {
            return Err(corrupt(format!(
                "journal entry {seq} holds the frame of entry {}",
                e.seq
            )));
        }
        Ok(e)
    }

    /// The checked payload of the frame at the start of `buf` and the bytes the frame uses:
    /// its version, length and checksum checked.
    fn checked_payload(buf: &[u8]) -> Result<(&[u8], usize)> {
        if buf.len() < FRAME_HEADER {
            return Err(corrupt(format!(
                "journal frame truncated: {} bytes, header needs 9",
                buf.len()
            )));
        }
        if buf[0] != FRAME_VERSION {
            return Err(Error::new(
                ErrorKind::UnsupportedVersion,
                format!("journal frame version {} is unknown to this build (knows {FRAME_VERSION}): upgrade jfs", buf[0]),
            ));
        }
        let len = u32::from_le_bytes(buf[1..5].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Err(corrupt(format!(
                "journal frame claims {len} bytes, over the {MAX_FRAME} limit"
            )));
        }
        let end = FRAME_HEADER + len;
        if buf.len() < end {
            return Err(corrupt(format!(
                "journal frame truncated: payload {len} bytes, have {}",
                buf.len() - FRAME_HEADER
            )));
        }
        let want = u32::from_le_bytes(buf[5..9].try_into().unwrap());
        let payload = &buf[FRAME_HEADER..end];
        let got = crc32c::crc32c(payload);
        if got != want {
            return Err(corrupt(format!(
                "journal frame checksum mismatch (stored {want:08x}, computed {got:08x})"
            )));
        }
        Ok((payload, end))
    }

    /// The sequence number, time and operation of one whole frame read at `seq`, without
    /// decoding its write-set (checked as `decode_at` checks it, the write-set aside).
    pub fn decode_head_at(seq: u64, frame: &[u8]) -> Result<(i64, Op)> {
        #[derive(Deserialize)]
        struct Head {
            seq: u64,
            time_ns: i64,
            op: Op,
        }
        let (payload, _) = Self::checked_payload(frame)?;
        let (h, _): (Head, &[u8]) = postcard::take_from_bytes(payload)
            .map_err(|e| corrupt(format!("journal frame payload does not decode: {e}")))?;
        if h.seq != seq {
            return Err(corrupt(format!(
                "journal entry {seq} holds the frame of entry {}",
                h.seq
            )));
        }
        Ok((h.time_ns, h.op))
    }

    /// Decode the frame at the start of `buf`; returns the entry and the bytes it used.
    pub fn decode_prefix(buf: &[u8]) -> Result<(Entry, usize)> {
        let (payload, end) = Self::checked_payload(buf)?;
        let (entry, rest): (Entry, &[u8]) = postcard::take_from_bytes(payload)
            .map_err(|e| corrupt(format!("journal frame payload does not decode: {e}")))?;
        if !rest.is_empty() {
            return Err(corrupt(format!(
                "journal frame of entry {} has {} bytes past its entry inside its payload",
                entry.seq,
                rest.len()
            )));
        }
        // Engines apply an entry's writes as they are: a delta or a stamp is resolved by the
        // commit that made the entry, never by a replay.
        if let Some(m) = entry
            .writes
            .iter()
            .find(|m| !matches!(m, Mutation::Put { .. } | Mutation::Delete { .. }))
        {
            let what = match m {
                Mutation::Add { .. } => "an add",
                _ => "a stamp",
            };
            return Err(corrupt(format!(
                "journal entry {} holds {what} of key {:?}: entries hold only puts and deletes",
                entry.seq,
                String::from_utf8_lossy(m.key())
            )));
        }
        Ok((entry, end))
    }

    /// The seq stamped into a pending-delete value, `"<seq> <time_ns>"`.
    pub fn stamp_value(seq: u64, time_ns: i64) -> Vec<u8> {
        format!("{seq} {time_ns}").into_bytes()
    }
}

pub fn parse_stamp(v: &[u8]) -> Option<(u64, i64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (a, b) = s.split_once(' ')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

pub fn parse_counter(v: Option<&[u8]>) -> Result<i64> {
    match v {
        None => Ok(0),
        Some(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                corrupt(format!(
                    "counter value {:?} is not a decimal number",
                    String::from_utf8_lossy(b)
                ))
            }),
    }
}

/// A transaction ready to commit: the values it read (None = absent), what it writes, and
/// the operation it performs. Serializable: a mirror forwards it to its primary (`volume::forward`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRequest {
    pub reads: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    pub writes: Vec<Mutation>,
    pub op: Op,
}

impl CommitRequest {
    /// Keys of the counters this request adds to (their current values are needed to
    /// materialize the entry).
    pub fn counter_keys(&self) -> Vec<Vec<u8>> {
        let mut ks: Vec<Vec<u8>> = self
            .writes
            .iter()
            .filter_map(|m| match m {
                Mutation::Add { key, .. } => Some(key.clone()),
                _ => None,
            })
            .collect();
        ks.sort();
        ks.dedup();
        ks
    }

    /// Build the journal entry for this request committed as `seq` at `time_ns`, given the
    /// current values of its counters. Called by the engines inside their commit section.
    pub fn materialize(
        &self,
        seq: u64,
        time_ns: i64,
        counters: &HashMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<Entry> {
        let mut sums: HashMap<&[u8], i64> = HashMap::new();
        let mut writes = Vec::with_capacity(self.writes.len());
        for m in &self.writes {
            match m {
                Mutation::Put { .. } | Mutation::Delete { .. } => writes.push(m.clone()),
                Mutation::Stamp { key } => writes.push(Mutation::Put {
                    key: key.clone(),
                    value: Entry::stamp_value(seq, time_ns),
                }),
                Mutation::Add { key, delta } => {
                    let cur = match sums.get(key.as_slice()) {
                        Some(v) => *v,
                        None => parse_counter(counters.get(key).and_then(|v| v.as_deref()))?,
                    };
                    sums.insert(key, cur + delta);
                }
            }
        }
        let mut adds: Vec<_> = sums.into_iter().collect();
        adds.sort();
        for (k, v) in adds {
            writes.push(Mutation::Put {
                key: k.to_vec(),
                value: v.to_string().into_bytes(),
            });
        }
        Ok(Entry {
            seq,
            time_ns,
            op: self.op.clone(),
            writes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> Entry {
        Entry {
            seq: 42,
            time_ns: 1_700_000_000_000_000_000,
            op: Op::Write {
                ino: 9,
                chunk: 0,
                pos: 0,
                slice: 3,
                size: 10,
                off: 0,
                len: 10,
            },
            writes: vec![
                Mutation::Put {
                    key: b"A\0\0\0\0\0\0\0\x09I".to_vec(),
                    value: vec![1, 2, 3],
                },
                Mutation::Delete { key: b"x".to_vec() },
            ],
        }
    }

    #[test]
    fn every_corruption_is_an_error() {
        let f = entry().encode();
        assert_eq!(Entry::decode(&f).unwrap(), entry());
        // Any single flipped bit anywhere in the frame is detected.
        for i in 0..f.len() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert!(
                    Entry::decode(&g).is_err(),
                    "flip at byte {i} bit {bit} went unnoticed"
                );
            }
        }
        let mut v2 = f.clone();
        v2[0] = 2;
        assert_eq!(
            Entry::decode(&v2).unwrap_err().kind(),
            ErrorKind::UnsupportedVersion
        );
        assert_eq!(
            Entry::decode(&f[..f.len() - 1]).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        let mut extra = f.clone();
        extra.push(0);
        assert_eq!(
            Entry::decode(&extra).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn materialize_resolves_adds_and_stamps() {
        let req = CommitRequest {
            reads: vec![],
            writes: vec![
                Mutation::Add {
                    key: b"cused".to_vec(),
                    delta: 5,
                },
                Mutation::Stamp {
                    key: b"D1".to_vec(),
                },
                Mutation::Add {
                    key: b"cused".to_vec(),
                    delta: -2,
                },
            ],
            op: Op::Purge { slices: 1 },
        };
        let counters = HashMap::from([(b"cused".to_vec(), Some(b"10".to_vec()))]);
        let e = req.materialize(7, 99, &counters).unwrap();
        assert_eq!(
            e.writes,
            vec![
                Mutation::Put {
                    key: b"D1".to_vec(),
                    value: b"7 99".to_vec()
                },
                Mutation::Put {
                    key: b"cused".to_vec(),
                    value: b"13".to_vec()
                },
            ]
        );
        assert_eq!(parse_stamp(b"7 99"), Some((7, 99)));
    }

    #[test]
    fn op_json_has_name_and_args() {
        let op = Op::Link {
            ino: 3,
            parent: 1,
            name: "b".into(),
        };
        assert_eq!(op.name(), "link");
        assert_eq!(
            op.args_json(),
            serde_json::json!({"ino": 3, "parent": 1, "name": "b"})
        );
    }

    fn arb_mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<Vec<u8>>(), any::<Vec<u8>>())
                .prop_map(|(key, value)| Mutation::Put { key, value }),
            any::<Vec<u8>>().prop_map(|key| Mutation::Delete { key }),
        ]
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(seq in any::<u64>(), t in any::<i64>(), ino in any::<u64>(),
                                 name in ".{0,40}", writes in proptest::collection::vec(arb_mutation(), 0..20)) {
            let e = Entry { seq, time_ns: t, op: Op::Unlink { parent: ino, name, ino, freed: true }, writes };
            let f = e.encode();
            prop_assert_eq!(Entry::decode(&f).unwrap(), e.clone());
            // Frames concatenate: a stream of frames decodes back frame by frame.
            let mut two = f.clone();
            two.extend_from_slice(&f);
            let (a, used) = Entry::decode_prefix(&two).unwrap();
            prop_assert_eq!(used, f.len());
            prop_assert_eq!(Entry::decode(&two[used..]).unwrap(), a);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Entry::decode(&b);
        }
    }
}
