//! Decoder harnesses of fs-core, one per door (see `crate::fuzz` for the kit, the case count
//! and the seed): journal frames and their payloads, persisted JSON records (site records,
//! slots, storage state, owner, sessions, settings), metadata keys and values, block keys,
//! volume paths, and dump files for `jfs load`. Each checks that a decoder answers damaged
//! input with an error, never a panic, and that what it accepts is a value that encodes back
//! to what it read (no wrong value accepted as right).
//!
//! Allocation: every length these decoders read is checked before it sizes anything (journal
//! frames against `MAX_FRAME` and the bytes at hand; postcard's sequences preallocate at most
//! 1 MiB each (serde's cautious size hint) and fail at the first missing byte; JSON allocates
//! only for what it has parsed), so a decode allocates at most a small multiple of its input
//! plus 1 MiB per nesting level. `integration/fuzz.sh` records the peak RSS of each harness.

use crate::error::ErrorKind;
use crate::fuzz::{self, damaged, json_damaged};
use crate::journal::{Entry, Mutation, Op, FRAME_VERSION};
use crate::keys::{self, Key};
use crate::maint::{self as dump, Dump, InodeDump};
use crate::record::{self, Versioned};
use crate::types::{Attr, FileKind, SetAttr, Settings, SliceRec};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use std::collections::BTreeMap;

fn kind() -> impl Strategy<Value = FileKind> {
    prop_oneof![
        Just(FileKind::File),
        Just(FileKind::Dir),
        Just(FileKind::Symlink),
        Just(FileKind::Fifo),
        Just(FileKind::Socket),
        Just(FileKind::CharDev),
        Just(FileKind::BlockDev),
    ]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![".{0,24}", "[a-z0-9._-]{1,12}"]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn op() -> impl Strategy<Value = Op> {
    let u = any::<u64>;
    prop_oneof![
        name().prop_map(|name| Op::Format { name }),
        name().prop_map(|what| Op::Settings { what }),
        (u(), u()).prop_map(|(start, count)| Op::AllocInodes { start, count }),
        (u(), u()).prop_map(|(start, count)| Op::AllocSlices { start, count }),
        (u(), name(), u(), kind(), any::<u32>()).prop_map(|(parent, name, ino, kind, mode)| {
            Op::Mknod {
                parent,
                name,
                ino,
                kind,
                mode,
            }
        }),
        (u(), name(), u(), name()).prop_map(|(parent, name, ino, target)| Op::Symlink {
            parent,
            name,
            ino,
            target
        }),
        (u(), u(), name()).prop_map(|(ino, parent, name)| Op::Link { ino, parent, name }),
        (u(), name(), u(), any::<bool>()).prop_map(|(parent, name, ino, freed)| Op::Unlink {
            parent,
            name,
            ino,
            freed
        }),
        (u(), name(), u(), name(), u(), proptest::option::of(u())).prop_map(
            |(parent, name, new_parent, new_name, ino, replaced)| Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ino,
                replaced
            }
        ),
        (
            u(),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<i64>()),
            proptest::option::of(u())
        )
            .prop_map(|(ino, mode, mtime, length)| Op::SetAttr {
                ino,
                set: SetAttr {
                    mode,
                    mtime,
                    length,
                    ..SetAttr::default()
                }
            }),
        (
            u(),
            any::<u32>(),
            any::<u32>(),
            u(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(ino, chunk, pos, slice, size, off, len)| Op::Write {
                ino,
                chunk,
                pos,
                slice,
                size,
                off,
                len
            }),
        (u(), any::<u32>(), u(), any::<u32>(), any::<u32>()).prop_map(
            |(ino, chunk, slice, size, freed)| Op::Compact {
                ino,
                chunk,
                slice,
                size,
                freed
            }
        ),
        (u(), name()).prop_map(|(ino, name)| Op::SetXattr { ino, name }),
        (u(), name()).prop_map(|(ino, name)| Op::RemoveXattr { ino, name }),
        u().prop_map(|slices| Op::Purge { slices }),
        u().prop_map(|keys| Op::Load { keys }),
        u().prop_map(|ino| Op::Release { ino }),
        (u(), u()).prop_map(|(root, inodes)| Op::CloneStage { root, inodes }),
        (u(), u(), name(), u(), u()).prop_map(|(src, parent, name, ino, at_seq)| Op::Clone {
            src,
            parent,
            name,
            ino,
            entries: at_seq / 2,
            at_seq
        }),
        (u(), u()).prop_map(|(root, inodes)| Op::CloneDrop { root, inodes }),
        (u(), u(), u(), u(), u()).prop_map(|(src, off_in, ino, off_out, len)| Op::CopyRange {
            src,
            off_in,
            ino,
            off_out,
            len
        }),
    ]
}

fn write() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (bytes(40), bytes(64)).prop_map(|(key, value)| Mutation::Put { key, value }),
        bytes(40).prop_map(|key| Mutation::Delete { key }),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        any::<u64>(),
        any::<i64>(),
        op(),
        proptest::collection::vec(write(), 0..8),
    )
        .prop_map(|(seq, time_ns, op, writes)| Entry {
            seq,
            time_ns,
            op,
            writes,
        })
}

/// A frame around `payload`, with its true length and checksum: damage past the checksum.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![FRAME_VERSION];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// What every accepted entry must be: one that encodes and decodes back to itself, whose
/// writes are puts and deletes only (engines' `apply` relies on it).
fn check_accepted(e: &Entry) -> Result<(), TestCaseError> {
    prop_assert_eq!(&Entry::decode(&e.encode()).unwrap(), e);
    prop_assert!(
        e.writes
            .iter()
            .all(|m| matches!(m, Mutation::Put { .. } | Mutation::Delete { .. })),
        "an entry with a write other than a put or delete was accepted: {:?}",
        e.writes
    );
    Ok(())
}

#[test]
fn fuzz_journal_frames() {
    fuzz::run(
        "journal_frames",
        damaged(entry().prop_map(|e| e.encode())),
        |(valid, bad)| {
            match Entry::decode(&bad) {
                Ok(e) => {
                    check_accepted(&e)?;
                    // Byte damage never gets past the frame's checksum unnoticed.
                    prop_assert_eq!(&e.encode(), &*bad);
                }
                Err(err) => {
                    prop_assert!(bad != valid, "a valid frame was refused: {err}");
                    prop_assert!(matches!(
                        err.kind(),
                        ErrorKind::Corrupt | ErrorKind::UnsupportedVersion
                    ));
                }
            }
            // A stream of frames: the damaged one first, then a good one.
            let mut stream = bad.to_vec();
            stream.extend_from_slice(&valid);
            if let Ok((e, used)) = Entry::decode_prefix(&stream) {
                prop_assert!(used <= stream.len());
                check_accepted(&e)?;
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_journal_payloads() {
    // Damage inside the payload with a true length and checksum around it: what a writer
    // with a bug, or a peer that frames its own lies, hands over.
    fuzz::run(
        "journal_payloads",
        damaged(entry().prop_map(|e| postcard::to_stdvec(&e).unwrap())),
        |(valid, bad)| {
            match Entry::decode(&frame(&bad)) {
                Ok(e) => {
                    check_accepted(&e)?;
                    // Postcard takes an over-long varint (`82 00` for 2) for the value it spells,
                    // so the bytes may differ from the canonical ones; the value may not, and
                    // nothing may follow it.
                    let canonical = postcard::to_stdvec(&e).unwrap();
                    prop_assert!(canonical.len() <= bad.len());
                    let (again, rest) = postcard::take_from_bytes::<Entry>(&bad).unwrap();
                    prop_assert!(rest.is_empty(), "bytes past the entry were accepted");
                    prop_assert_eq!(again, e);
                }
                Err(err) => {
                    prop_assert!(bad != valid, "a valid payload was refused: {err}");
                    prop_assert_eq!(err.kind(), ErrorKind::Corrupt);
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_journal_positions() {
    // An entry read from the journal at position `seq`: accepted only if it says it is that
    // entry (every engine keys its journal by seq: RocksDB big-endian keys, Redis stream ids,
    // PostgreSQL rows).
    fuzz::run(
        "journal_positions",
        (entry(), any::<u64>(), any::<bool>()),
        |(e, other, same)| {
            let at = if same { e.seq } else { other };
            match Entry::decode_at(at, &e.encode()) {
                Ok(d) => prop_assert!(d.seq == at && d == e),
                Err(err) => {
                    prop_assert!(at != e.seq);
                    prop_assert_eq!(err.kind(), ErrorKind::Corrupt);
                    prop_assert!(err.to_string().contains(&at.to_string()));
                }
            }
            Ok(())
        },
    );
}

fn as_json<T: Versioned>(r: T) -> Value {
    serde_json::from_slice(&record::encode(&r)).unwrap()
}

macro_rules! record_harness {
    ($test:ident, $t:ty, $strategy:expr) => {
        record_harness!($test, $t, $strategy, |a: &$t, b: &$t| a == b);
    };
    ($test:ident, $t:ty, $strategy:expr, $same:expr) => {
        #[test]
        fn $test() {
            fuzz::run(
                stringify!($test),
                json_damaged(
                    $strategy.prop_map(as_json::<$t>),
                    <$t as Versioned>::VERSION_KEY,
                ),
                |(valid, bad)| fuzz::check_record::<$t>(&valid, &bad, $same),
            );
        }
    };
}

fn i() -> impl Strategy<Value = i64> {
    any::<i64>()
}

record_harness!(
    fuzz_record_slot,
    crate::slots::Slot,
    (
        name(),
        any::<u64>(),
        i(),
        any::<bool>(),
        proptest::option::of(name()),
        i(),
        proptest::option::of((name(), name(), i()))
    )
        .prop_map(
            |(name, acked, acked_ns, active, reason, registered_ns, holder)| {
                crate::slots::Slot {
                    version: crate::slots::SLOT_VERSION,
                    name,
                    acked,
                    acked_ns,
                    state: if active {
                        crate::slots::SlotState::Active
                    } else {
                        crate::slots::SlotState::NeedsResync
                    },
                    reason,
                    registered_ns,
                    holder: holder.map(|(identity, peer, since_ns)| crate::slots::SlotHolder {
                        identity,
                        peer,
                        since_ns,
                    }),
                }
            }
        )
);

record_harness!(
    fuzz_record_session,
    crate::session::Session,
    (
        name(),
        any::<u32>(),
        any::<u64>(),
        any::<bool>(),
        i(),
        proptest::collection::btree_map(name(), any::<u64>(), 0..3),
        proptest::option::of(name())
    )
        .prop_map(|(mp, pid, pid_start, ro, beat, acks, relayed_by)| {
            let mut s = crate::session::Session::new(&mp, ro);
            s.pid = pid;
            s.pid_start = pid_start;
            s.beat_ns = beat;
            s.acks = acks;
            s.relayed_by = relayed_by;
            s
        })
);

record_harness!(
    fuzz_record_owner,
    crate::owner::Owner,
    (name(), name(), i(), proptest::option::of(name())).prop_map(
        |(name, uuid, since_ns, incarnation)| {
            crate::owner::Owner {
                version: crate::owner::VERSION,
                name,
                uuid,
                since_ns,
                incarnation,
            }
        }
    )
);

record_harness!(
    fuzz_record_storage,
    crate::storage::StorageState,
    (name(), name(), any::<u64>(), i(), 0u8..3, any::<bool>()).prop_map(
        |(a, b, gen, ns, phase, f)| {
            use crate::storage::Phase;
            let mut s = crate::storage::StorageState::initial(&a);
            s.gen = gen;
            s.changed_ns = ns;
            s.phase = match phase {
                0 => Phase::Single { store: a },
                1 => Phase::Dual {
                    from: a,
                    to: b,
                    backfilled: f,
                    verified: !f,
                    aborting: f,
                },
                _ => Phase::Switched { from: a, to: b },
            };
            s
        }
    )
);

record_harness!(
    fuzz_record_mirror_marker,
    crate::site::MirrorMarker,
    (name(), name(), name(), proptest::option::of(name()), i()).prop_map(
        |(name, primary, store, origin_store, since_ns)| crate::site::MirrorMarker {
            version: crate::site::MARKER_VERSION,
            name,
            primary,
            store,
            origin_store,
            since_ns,
        }
    )
);

record_harness!(
    fuzz_record_progress,
    crate::site::Progress,
    (
        any::<u64>(),
        any::<u64>(),
        proptest::option::of(0f64..1e9),
        any::<bool>(),
        i(),
        proptest::option::of(name())
    )
        .prop_map(
            |(applied_seq, primary_head_seq, lag_seconds, within_window, at_ns, forward_socket)| {
                crate::site::Progress {
                    version: crate::site::MARKER_VERSION,
                    applied_seq,
                    primary_head_seq,
                    lag_seconds,
                    window_seconds: 5.0,
                    within_window,
                    at_ns,
                    resyncing: within_window,
                    forward_socket,
                    writes_refused: None,
                }
            }
        ),
    |a: &crate::site::Progress, b: &crate::site::Progress| {
        let close = |x: f64, y: f64| (x - y).abs() <= x.abs().max(y.abs()) * 1e-12;
        let lag = match (a.lag_seconds, b.lag_seconds) {
            (Some(x), Some(y)) => close(x, y),
            (x, y) => x == y,
        };
        lag && close(a.window_seconds, b.window_seconds)
            && crate::site::Progress {
                lag_seconds: None,
                window_seconds: 0.0,
                ..a.clone()
            } == crate::site::Progress {
                lag_seconds: None,
                window_seconds: 0.0,
                ..b.clone()
            }
    }
);

record_harness!(
    fuzz_record_want,
    crate::site::Want,
    (proptest::collection::vec(name(), 0..4), i()).prop_map(|(keys, at_ns)| crate::site::Want {
        version: crate::site::MARKER_VERSION,
        keys,
        at_ns
    })
);

record_harness!(
    fuzz_record_epoch,
    crate::site::Epoch,
    (
        any::<u64>(),
        name(),
        any::<u64>(),
        i(),
        name(),
        proptest::collection::vec((any::<u64>(), any::<u64>(), name()), 0..3)
    )
        .prop_map(|(epoch, site, at_seq, at_ns, from, h)| crate::site::Epoch {
            version: crate::site::MARKER_VERSION,
            epoch,
            site,
            at_seq,
            at_ns,
            from,
            history: h
                .into_iter()
                .map(|(epoch, at_seq, site)| crate::site::EpochStart {
                    epoch,
                    at_seq,
                    site
                })
                .collect(),
        })
);

record_harness!(
    fuzz_record_fenced,
    crate::site::Fenced,
    (name(), name(), any::<u64>(), any::<u64>(), i(), name()).prop_map(
        |(name, primary, epoch, at_seq, at_ns, by)| crate::site::Fenced {
            version: crate::site::MARKER_VERSION,
            name,
            primary,
            epoch,
            at_seq,
            at_ns,
            by,
        }
    )
);

#[test]
fn fuzz_settings() {
    // The `setting` key's JSON: any damage is an error or settings that `validate` judges.
    fuzz::run(
        "settings",
        json_damaged(
            (any::<u32>(), name()).prop_map(|(bs, n)| {
                let mut s =
                    Settings::new("vol", "file:///srv/blocks", bs.clamp(64 << 10, 16 << 20));
                s.name = n;
                serde_json::to_value(s).unwrap()
            }),
            "format_version",
        ),
        |(_, bad)| {
            if let Ok(s) = serde_json::from_slice::<Settings>(&bad) {
                let again: Settings =
                    serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
                prop_assert_eq!(&again, &s);
                if s.validate().is_ok() {
                    prop_assert!(s.block_size >= 64 << 10 && s.format_version >= 1);
                }
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_metadata_keys() {
    // Keys as dump, fsck and gc walk them: every key `parse` names is the one its parts make.
    let valid = prop_oneof![
        any::<u64>().prop_map(keys::attr),
        (any::<u64>(), bytes(20)).prop_map(|(p, n)| keys::dentry(p, &n)),
        (any::<u64>(), any::<u32>()).prop_map(|(i, c)| keys::chunk(i, c)),
        any::<u64>().prop_map(keys::symlink),
        (any::<u64>(), bytes(20)).prop_map(|(i, n)| keys::xattr(i, &n)),
        any::<u64>().prop_map(keys::rdev),
        any::<u64>().prop_map(keys::kept),
        (any::<u64>(), any::<u32>()).prop_map(|(s, n)| keys::pending(s, n)),
        any::<u64>().prop_map(keys::checksums),
        any::<u64>().prop_map(keys::refs),
        any::<u64>().prop_map(keys::cloning),
        (any::<i64>(), any::<u64>()).prop_map(|(t, g)| keys::audit(t, g)),
        bytes(12).prop_map(|n| [keys::COUNTER_PREFIX, &n].concat()),
        Just(keys::SETTING.to_vec()),
        Just(keys::STORAGE.to_vec()),
    ];
    fuzz::run("metadata_keys", damaged(valid), |(_, bad)| {
        let made = match keys::parse(&bad) {
            Key::Setting => keys::SETTING.to_vec(),
            Key::Storage => keys::STORAGE.to_vec(),
            Key::Epoch => keys::EPOCH.to_vec(),
            Key::Counter(n) => [keys::COUNTER_PREFIX, n].concat(),
            Key::Attr(i) => keys::attr(i),
            Key::Dentry(p, n) => keys::dentry(p, n),
            Key::Chunk(i, c) => keys::chunk(i, c),
            Key::Symlink(i) => keys::symlink(i),
            Key::Xattr(i, n) => keys::xattr(i, n),
            Key::Rdev(i) => keys::rdev(i),
            Key::Pending(s, n) => keys::pending(s, n),
            Key::Checksums(s) => keys::checksums(s),
            Key::Kept(i) => keys::kept(i),
            Key::Refs(s) => keys::refs(s),
            Key::Cloning(i) => keys::cloning(i),
            Key::Trash(t, i) => keys::trash(t as i64, i),
            Key::TrashInfo(i) => keys::trash_info(i),
            Key::Audit(t, g) => keys::audit(t as i64, g),
            Key::Unknown => return Ok(()),
        };
        prop_assert_eq!(&made, &*bad);
        Ok(())
    });
}

#[test]
fn fuzz_metadata_values() {
    // The binary values beside the keys: chunk slice lists, checksums, dentries, attributes,
    // pending-delete stamps and counters.
    let attr = (
        kind(),
        any::<u32>(),
        any::<u32>(),
        any::<i64>(),
        any::<u64>(),
    )
        .prop_map(|(kind, mode, uid, mtime, length)| Attr {
            kind,
            mode,
            uid,
            gid: uid,
            atime: mtime,
            mtime,
            ctime: mtime,
            nlink: 1,
            length,
            parent: 1,
        });
    let valid = prop_oneof![
        proptest::collection::vec(
            (
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(pos, id, size, off, len)| SliceRec {
                    pos,
                    id,
                    size,
                    off,
                    len
                }),
            0..4
        )
        .prop_map(|r| (0u8, SliceRec::encode_list(&r))),
        proptest::collection::vec(any::<u32>(), 0..4).prop_map(|c| (1, keys::encode_checksums(&c))),
        (any::<u64>(), kind()).prop_map(|(i, k)| (2, keys::encode_dentry(i, k))),
        attr.prop_map(|a| (3, crate::fs::encode_attr(&a))),
        (any::<u64>(), any::<i64>()).prop_map(|(s, t)| (4, Entry::stamp_value(s, t))),
        any::<i64>().prop_map(|n| (5, n.to_string().into_bytes())),
    ];
    let valid = valid.prop_flat_map(|(what, v)| {
        (Just(what), Just(v.clone()), fuzz::damages(v.len()))
            .prop_map(|(what, v, d)| (what, fuzz::Shown(fuzz::apply(&v, &d))))
    });
    fuzz::run("metadata_values", valid, |(what, bad)| {
        match what {
            0 => {
                if let Some(r) = SliceRec::decode_list(&bad) {
                    prop_assert_eq!(&SliceRec::encode_list(&r), &*bad);
                }
            }
            1 => {
                if let Some(c) = keys::decode_checksums(&bad) {
                    prop_assert_eq!(&keys::encode_checksums(&c), &*bad);
                }
            }
            2 => {
                if let Some((i, k)) = keys::decode_dentry(&bad) {
                    prop_assert_eq!(&keys::encode_dentry(i, k), &*bad);
                }
            }
            3 => {
                if let Ok(a) = crate::fs::decode_attr(7, &bad) {
                    prop_assert_eq!(
                        crate::fs::decode_attr(7, &crate::fs::encode_attr(&a)).unwrap(),
                        a
                    );
                }
            }
            // Numbers written as text by the engine itself: a number spelled another way
            // ("+5", "05") is the number it spells.
            4 => {
                if let Some((s, t)) = crate::journal::parse_stamp(&bad) {
                    prop_assert_eq!(
                        crate::journal::parse_stamp(&Entry::stamp_value(s, t)),
                        Some((s, t))
                    );
                }
            }
            _ => {
                if let Ok(n) = crate::journal::parse_counter(Some(&bad)) {
                    prop_assert_eq!(
                        crate::journal::parse_counter(Some(&n.to_string().into_bytes())).unwrap(),
                        n
                    );
                }
            }
        }
        Ok(())
    });
}

#[test]
fn fuzz_block_keys() {
    // Keys listed from a store (gc, fsck, a mirror's copier): a key is taken for a block only
    // if it is exactly the key that block is written under.
    let valid = (any::<u64>(), any::<u32>(), any::<u32>())
        .prop_map(|(id, i, l)| keys::block_key("vol", id, i, l).into_bytes());
    fuzz::run("block_keys", damaged(valid), |(_, bad)| {
        let Ok(s) = std::str::from_utf8(&bad) else {
            return Ok(());
        };
        if let Some((id, index, len)) = keys::parse_block_key("vol", s) {
            prop_assert_eq!(keys::block_key("vol", id, index, len), s);
        }
        Ok(())
    });
}

#[test]
fn fuzz_volume_paths() {
    // Paths from the CLI, `jfs://` URLs and the control socket: a parsed path never climbs
    // out, names no empty, `.` or `..` part, and prints as a path that parses to itself.
    let valid = proptest::collection::vec(
        prop_oneof![name(), Just("..".into()), Just(".".into())],
        0..6,
    )
    .prop_map(|p| p.join("/").into_bytes());
    fuzz::run("volume_paths", damaged(valid), |(_, bad)| {
        let s = String::from_utf8_lossy(&bad);
        if let Ok(p) = crate::VolPath::parse(&s) {
            for part in p.parts() {
                prop_assert!(!part.is_empty() && part != "." && part != "..");
                prop_assert!(!part.contains('/') && !part.contains('\0'));
            }
            prop_assert_eq!(crate::VolPath::parse(&p.to_string()).unwrap(), p.clone());
            let host = std::path::Path::new("/srv/dst");
            let mut joined = host.to_path_buf();
            for part in p.parts() {
                joined.push(part);
            }
            prop_assert!(joined.starts_with(host));
            prop_assert_eq!(joined.components().count(), 3 + p.parts().len());
        }
        Ok(())
    });
}

fn dump_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => name(),
        1 => bytes(6).prop_map(|b| dump::encode_name(&b)),
        1 => bytes(4).prop_map(|b| format!("\\x:{}", b.iter().map(|x| format!("{x:02X}")).collect::<String>())),
        1 => "[0-9a-fA-F+-]{0,6}".prop_map(|h| format!("\\x:{h}")),
    ]
}

fn a_dump() -> impl Strategy<Value = Dump> {
    let entries = proptest::collection::btree_map(dump_name(), 2u64..6, 0..5);
    let chunks = proptest::collection::vec(
        (
            any::<u32>(),
            0u64..4,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        0..3,
    );
    (
        entries,
        chunks,
        proptest::collection::btree_map(dump_name(), -5i64..1000, 0..3),
        dump_name(),
    )
        .prop_map(|(entries, chunks, counters, xname)| {
            let attr = |kind, length| Attr {
                kind,
                mode: 0o644,
                uid: 0,
                gid: 0,
                atime: 0,
                mtime: 0,
                ctime: 0,
                nlink: 1,
                length,
                parent: 1,
            };
            let mut inodes = BTreeMap::new();
            inodes.insert(
                1,
                InodeDump {
                    attr: Some(attr(FileKind::Dir, 0)),
                    entries,
                    xattrs: BTreeMap::from([(xname, "00ff".to_string())]),
                    ..InodeDump::default()
                },
            );
            let recs: Vec<SliceRec> = chunks
                .into_iter()
                .map(|(pos, id, size, off, len)| SliceRec {
                    pos,
                    id,
                    size,
                    off,
                    len,
                })
                .collect();
            let mut checksums = BTreeMap::new();
            for r in &recs {
                checksums.insert(r.id, vec![0u32; 1]);
            }
            for ino in 2..6 {
                inodes.insert(
                    ino,
                    InodeDump {
                        attr: Some(attr(FileKind::File, 1 << 20)),
                        chunks: BTreeMap::from([(0, recs.clone())]),
                        ..InodeDump::default()
                    },
                );
            }
            Dump {
                setting: Settings::new("vol", "file:///srv/blocks", 4 << 20),
                counters,
                pending: vec![],
                inodes,
                checksums,
                storage: None,
                audit: vec![],
                epoch: None,
                source: None,
            }
        })
}

#[test]
fn fuzz_dump_files() {
    // A dump file for `jfs load`: what `load` would write is checked before the first write;
    // every item of an accepted dump becomes a key of its own (two spellings of one name
    // must not become one entry) and every loaded slice record describes bytes its slice has.
    fuzz::run(
        "dump_files",
        json_damaged(
            a_dump().prop_map(|d| serde_json::to_value(d).unwrap()),
            "version",
        ),
        |(_, bad)| {
            let Ok(d) = serde_json::from_slice::<Dump>(&bad) else {
                return Ok(());
            };
            match dump::check_and_pairs(&d) {
                Ok(pairs) => {
                    let mut keys: Vec<&Vec<u8>> = pairs.iter().map(|(k, _)| k).collect();
                    let n = keys.len();
                    keys.sort();
                    keys.dedup();
                    prop_assert_eq!(keys.len(), n, "two items of the dump became one key");
                    let items = d.counters.len()
                        + d.inodes
                            .values()
                            .map(|i| i.entries.len() + i.xattrs.len())
                            .sum::<usize>();
                    prop_assert!(n >= items);
                    for ino in d.inodes.values() {
                        for r in ino.chunks.values().flatten() {
                            prop_assert!(r.off as u64 + r.len as u64 <= r.size as u64 || r.id == 0);
                            prop_assert!(r.pos as u64 + r.len as u64 <= crate::types::CHUNK_SIZE);
                        }
                    }
                    prop_assert!(d.setting.validate().is_ok());
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_dump_names() {
    // `\x:<hex>` names: only the spelling `jfs dump` writes is accepted, so that no two
    // spellings load as one name.
    fuzz::run("dump_names", dump_name(), |s| {
        if let Ok(b) = dump::decode_name(&s) {
            prop_assert_eq!(dump::encode_name(&b), s);
        }
        Ok(())
    });
}

// Regressions: each defect the harnesses found, pinned by the behaviour it broke.

#[test]
fn a_journal_frame_with_bytes_past_its_entry_is_refused() {
    let e = Entry {
        seq: 3,
        time_ns: 1,
        op: Op::Purge { slices: 1 },
        writes: vec![],
    };
    let mut payload = postcard::to_stdvec(&e).unwrap();
    payload.extend_from_slice(b"junk");
    let err = Entry::decode(&frame(&payload)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("4 bytes past its entry"), "{err}");
}

#[test]
fn a_journal_entry_holding_an_add_or_a_stamp_is_refused() {
    // Engines' `apply` (a mirror's replay) writes an entry's writes as they are and took any
    // other kind for impossible (a panic in the agent).
    for m in [
        Mutation::Add {
            key: b"cnext".to_vec(),
            delta: 1,
        },
        Mutation::Stamp {
            key: b"D1".to_vec(),
        },
    ] {
        let e = Entry {
            seq: 9,
            time_ns: 1,
            op: Op::Purge { slices: 1 },
            writes: vec![m],
        };
        let err = Entry::decode(&e.encode()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(
            err.to_string()
                .contains("entries hold only puts and deletes"),
            "{err}"
        );
    }
}

#[test]
fn a_journal_frame_read_at_another_position_is_refused() {
    let e = Entry {
        seq: 7,
        time_ns: 1,
        op: Op::Purge { slices: 1 },
        writes: vec![],
    };
    assert_eq!(Entry::decode_at(7, &e.encode()).unwrap(), e);
    let err = Entry::decode_at(8, &e.encode()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "journal entry 8 holds the frame of entry 7"
    );
}

#[test]
fn a_record_whose_version_is_zero_negative_or_not_a_number_is_refused() {
    // Before, each read as version 1 (or was upgraded from "version 0") and was used.
    for v in ["0", "-1", "\"1\"", "1.5", "null"] {
        let raw = format!(
            r#"{{"version": {v}, "name": "eu", "acked": 1, "acked_ns": 0, "state": "active", "registered_ns": 0}}"#
        );
        let err = record::decode::<crate::slots::Slot>(raw.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{v}");
        assert!(err.to_string().contains("which no release writes"), "{err}");
    }
    let raw = r#"{"record_version": -1, "id": "0123456789abcdef", "host": "h", "pid": 1, "mountpoint": "/m", "version": "0.1.0", "read_only": true, "start_ns": 0, "beat_ns": 0}"#;
    let err = record::decode::<crate::session::Session>(raw.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("record_version is -1"), "{err}");
    let err = record::decode::<crate::owner::Owner>(b"[{\"version\": 1}]").unwrap_err();
    assert!(err.to_string().contains("not a JSON object"), "{err}");
}

#[test]
fn a_dump_name_spelled_another_way_than_dump_writes_it_is_refused() {
    // `\x:41` and `A` loaded as one directory entry (one replaced the other: an inode lost).
    assert_eq!(dump::decode_name("\\x:ff").unwrap(), vec![0xff]);
    for s in ["\\x:41", "\\x:FF", "\\x:+f", "\\x:-0"] {
        let err = dump::decode_name(s).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{s}");
    }
    let err = dump::decode_name("\\x:41").unwrap_err();
    assert!(err.to_string().contains("write the name as \"A\""), "{err}");
}

fn small_dump() -> Dump {
    let attr = |kind| Attr {
        kind,
        mode: 0o755,
        uid: 0,
        gid: 0,
        atime: 0,
        mtime: 0,
        ctime: 0,
        nlink: 1,
        length: 10,
        parent: 1,
    };
    let mut inodes = BTreeMap::new();
    inodes.insert(
        1,
        InodeDump {
            attr: Some(attr(FileKind::Dir)),
            entries: BTreeMap::from([("f".to_string(), 2)]),
            ..InodeDump::default()
        },
    );
    inodes.insert(
        2,
        InodeDump {
            attr: Some(attr(FileKind::File)),
            chunks: BTreeMap::from([(
                0,
                vec![SliceRec {
                    pos: 0,
                    id: 5,
                    size: 10,
                    off: 0,
                    len: 10,
                }],
            )]),
            ..InodeDump::default()
        },
    );
    Dump {
        setting: Settings::new("vol", "file:///srv/blocks", 4 << 20),
        counters: BTreeMap::new(),
        pending: vec![],
        inodes,
        checksums: BTreeMap::from([(5, vec![0])]),
        storage: None,
        audit: vec![],
        epoch: None,
        source: None,
    }
}

#[test]
fn a_dump_whose_settings_no_format_makes_is_refused_before_loading() {
    // A block size of 0 loaded, then divided by zero at the first read of a file.
    assert!(dump::check_and_pairs(&small_dump()).is_ok());
    let mut d = small_dump();
    d.setting.block_size = 0;
    let err = dump::check_and_pairs(&d).unwrap_err();
    assert!(
        err.to_string()
            .contains("the dump's settings: block size 0"),
        "{err}"
    );
}

#[test]
fn a_dump_slice_record_past_its_slice_or_chunk_is_refused_before_loading() {
    for (off, len, pos) in [(5, 10, 0), (0, 10, u32::MAX - 3)] {
        let mut d = small_dump();
        let r = &mut d.inodes.get_mut(&2).unwrap().chunks.get_mut(&0).unwrap()[0];
        (r.off, r.len, r.pos) = (off, len, pos);
        let err = dump::check_and_pairs(&d).unwrap_err();
        assert!(err.to_string().contains("past its slice or chunk"), "{err}");
    }
}

#[test]
fn a_store_key_with_a_sign_or_leading_zeros_is_not_taken_for_a_block() {
    assert_eq!(
        keys::parse_block_key("vol", "vol/chunks/0/0/1_0_5"),
        Some((1, 0, 5))
    );
    for k in [
        "vol/chunks/0/0/+1_0_5",
        "vol/chunks/0/0/01_0_5",
        "vol/chunks/0/0/1_+0_5",
        "vol/chunks/0/0/1_0_05",
    ] {
        assert_eq!(keys::parse_block_key("vol", k), None, "{k}");
    }
}
