//! Decoder harnesses of the sync engine and of the URLs it parses (see `fs_core::fuzz` for
//! the kit, the case count and the seed): the resume state's values, the records a shared
//! job keeps in its engine (the job's spec, workers' reports, tallies), and META and store
//! URLs as `jfs-sync`, `jfs` and the agents take them from users.

use crate::job::{Spec, WorkerReport};
use crate::state::{Done, State};
use crate::stats::{Summary, Tally};
use fs_core::fuzz::{self, damaged, json_damaged, Shown};
use fs_core::record::{self, Versioned};
use proptest::prelude::*;
use serde_json::Value;

fn summary() -> impl Strategy<Value = Summary> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        proptest::collection::btree_map("[a-z_]{1,10}", any::<u64>(), 0..3),
        0f64..1e6,
        any::<bool>(),
    )
        .prop_map(
            |(listed, copied, bytes, skipped_reasons, seconds, resumed)| {
                let s = Summary {
                    listed,
                    copied,
                    bytes,
                    skipped: skipped_reasons
                        .values()
                        .fold(0u64, |a, b| a.wrapping_add(*b)),
                    skipped_reasons,
                    seconds,
                    ..Summary::default()
                };
                Summary {
                    resumed: resumed.then(|| Box::new(s.clone())),
                    ..s
                }
            },
        )
}

/// Summaries equal but for their floats, which JSON brings back to within an ulp.
fn same_summary(a: &Summary, b: &Summary) -> bool {
    fn flat(s: &Summary) -> Value {
        let mut v = serde_json::to_value(s).unwrap();
        strip_floats(&mut v);
        v
    }
    flat(a) == flat(b)
}

fn strip_floats(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => *v = Value::Null,
        Value::Array(a) => a.iter_mut().for_each(strip_floats),
        Value::Object(o) => o.values_mut().for_each(strip_floats),
        _ => {}
    }
}

fn as_json<T: Versioned>(r: T) -> Value {
    serde_json::from_slice(&record::encode(&r)).unwrap()
}

#[test]
fn fuzz_sync_tally() {
    fuzz::run(
        "sync_tally",
        json_damaged(
            summary().prop_map(|s| as_json(Tally(s))),
            Tally::VERSION_KEY,
        ),
        |(valid, bad)| fuzz::check_record::<Tally>(&valid, &bad, |a, b| same_summary(&a.0, &b.0)),
    );
}

#[test]
fn fuzz_job_spec() {
    let spec = (
        "[a-z:/._-]{1,30}",
        "[a-z:/._-]{1,30}",
        proptest::option::of("[0-9a-f]{8}"),
        proptest::collection::vec("--[a-z-]{1,10}=[a-z0-9]{0,6}", 0..4),
        any::<bool>(),
        proptest::option::of("[0-9]{1,3}%?"),
    )
        .prop_map(|(src, dst, src_id, opts, delete_dst, max_delete)| Spec {
            src,
            dst,
            src_id: src_id.clone(),
            dst_id: src_id,
            identity: opts.join("\n"),
            delete_dst,
            max_delete,
            from_journal: delete_dst,
            legacy_identity: None,
        });
    fuzz::run(
        "job_spec",
        json_damaged(spec.prop_map(as_json), Spec::VERSION_KEY),
        |(valid, bad)| fuzz::check_record::<Spec>(&valid, &bad, |a, b| a == b),
    );
}

#[test]
fn fuzz_job_worker_report() {
    let report = (
        "[a-z0-9-]{1,12}",
        any::<u32>(),
        summary(),
        0f64..1e9,
        proptest::collection::vec(any::<i64>(), 0..4),
        any::<u64>(),
    )
        .prop_map(|(worker, pid, totals, rate, units, refused)| WorkerReport {
            host: worker.clone(),
            worker,
            pid,
            totals,
            rate,
            units,
            refused,
            age_ms: 0,
        });
    fuzz::run(
        "job_worker_report",
        json_damaged(report.prop_map(as_json), WorkerReport::VERSION_KEY),
        |(valid, bad)| {
            fuzz::check_record::<WorkerReport>(&valid, &bad, |a, b| {
                same_summary(&a.totals, &b.totals)
                    && (a.worker.as_str(), a.pid, &a.units, a.refused)
                        == (b.worker.as_str(), b.pid, &b.units, b.refused)
            })
        },
    );
}

/// One value of the resume state, as damaged as any other file on a disk.
#[derive(Debug, Clone)]
enum Slot {
    Tally,
    Done,
    Deleted,
    JournalSeq,
    Multipart,
    Cursor,
}

#[test]
fn fuzz_sync_resume_state() {
    // The resume state is a RocksDB of the user's: its values are read back by a later run
    // and must never make it skip a key it has not copied (a done-stamp of another size or
    // time), nor stop it with a panic.
    let dir = tempfile::tempdir().unwrap();
    let state = State::open(&dir.path().join("state")).unwrap();
    let slot = prop_oneof![
        Just(Slot::Tally),
        Just(Slot::Done),
        Just(Slot::Deleted),
        Just(Slot::JournalSeq),
        Just(Slot::Multipart),
        Just(Slot::Cursor),
    ];
    let input = (slot, any::<u64>(), any::<i64>(), summary()).prop_flat_map(
        |(slot, size, mtime, tally)| {
            let valid = match slot {
                Slot::Tally => Tally::encode(&tally),
                Slot::Done => format!("{size} {mtime} c"),
                Slot::Deleted | Slot::JournalSeq => size.to_string(),
                Slot::Multipart => format!("upload-{size}\nv{mtime}"),
                Slot::Cursor => format!("dir/{size}"),
            };
            let n = valid.len();
            (Just(slot), Just(size), Just(mtime), fuzz::damages(n)).prop_map(
                move |(slot, size, mtime, d)| {
                    (slot, size, mtime, Shown(fuzz::apply(valid.as_bytes(), &d)))
                },
            )
        },
    );
    fuzz::run("sync_resume_state", input, |(slot, size, mtime, bad)| {
        state.raw_put(&slot_key(&slot), &bad).unwrap();
        match slot {
            Slot::Tally => match state.tally() {
                Ok(Some(t)) => {
                    let again = Tally::decode(&Tally::encode(&t)).unwrap();
                    prop_assert!(same_summary(&again, &t));
                }
                Ok(None) => {}
                Err(e) => prop_assert!(
                    format!("{e:#}").contains("newer release"),
                    "a damaged tally stopped the run: {e:#}"
                ),
            },
            Slot::Done => {
                let got = state.is_done("k", size, mtime).unwrap();
                let s = String::from_utf8_lossy(&bad);
                let stamp = format!("{size} {mtime}");
                if got.is_some() {
                    prop_assert!(
                        s == stamp || s.starts_with(&format!("{stamp} ")),
                        "{s:?} was taken for the stamp {stamp:?}"
                    );
                }
                if got == Some(Done::Updated) {
                    prop_assert_eq!(s.trim_start_matches(&stamp).trim(), "u");
                }
            }
            Slot::Deleted => {
                let n = state.deleted_count().unwrap();
                if n != 0 {
                    prop_assert_eq!(String::from_utf8_lossy(&bad).parse::<u64>().ok(), Some(n));
                }
            }
            Slot::JournalSeq => {
                if let Some(n) = state.journal_seq().unwrap() {
                    prop_assert_eq!(String::from_utf8_lossy(&bad).parse::<u64>().ok(), Some(n));
                }
            }
            Slot::Multipart => {
                if let Some((id, v)) = state.multipart("k").unwrap() {
                    prop_assert!(!id.contains('\n'));
                    prop_assert_eq!(format!("{id}\n{v}"), String::from_utf8_lossy(&bad));
                }
            }
            Slot::Cursor => {
                let _ = state.cursor().unwrap();
            }
        }
        Ok(())
    });
}

fn slot_key(s: &Slot) -> Vec<u8> {
    match s {
        Slot::Tally => b"tally".to_vec(),
        Slot::Done => b"done:k".to_vec(),
        Slot::Deleted => b"deleted".to_vec(),
        Slot::JournalSeq => b"journal_seq".to_vec(),
        Slot::Multipart => b"mpu:k".to_vec(),
        Slot::Cursor => b"cursor".to_vec(),
    }
}

fn meta_url() -> impl Strategy<Value = String> {
    prop_oneof![
        "/[a-z]{1,8}(/[a-z]{1,8}){0,2}".prop_map(|p| format!("rocksdb://{p}")),
        ("[a-z0-9.]{1,12}", 1u16..65535, 0u8..16)
            .prop_map(|(h, p, db)| format!("redis://{h}:{p}/{db}")),
        ("[a-z]{1,6}", "[a-z0-9.]{1,12}", "[a-z]{1,8}")
            .prop_map(|(u, h, db)| format!("postgres://{u}@{h}:5432/{db}?schema=jfs")),
        ("[a-z]{1,6}", "[a-z0-9.]{1,12}")
            .prop_map(|(u, h)| format!("redis://{u}:s3cr3t@{h}:6379/1")),
        ("[a-z]{1,6}", "[a-z0-9.]{1,12}")
            .prop_map(|(u, h)| format!("postgres://{u}:s3cr3t@{h}/db")),
    ]
}

#[test]
fn fuzz_meta_urls() {
    // META URLs from users (flags, configs, job records): checked without a panic, and no
    // message about one shows the password it holds.
    let opts = meta::OpenOptions::default();
    fuzz::run(
        "meta_urls",
        damaged(meta_url().prop_map(String::into_bytes)),
        |(_, bad)| {
            let url = String::from_utf8_lossy(&bad).into_owned();
            let mut said = Vec::new();
            if let Err(e) = meta::check_url(&url, &opts) {
                said.push(e.to_string());
            }
            if url.starts_with("redis") {
                if let Err(e) = meta::redis_info(&url, &opts) {
                    said.push(e.to_string());
                }
            }
            if url.starts_with("postgres") {
                if let Err(e) = meta::pg_config(&url, &opts) {
                    said.push(e.to_string());
                }
            }
            said.push(meta::redact(&url));
            // The password as URL syntax has it (RFC 3986): the authority runs from "://" to
            // the first '/', '?' or '#'; its userinfo is what comes before its last '@'; the
            // password is what follows the userinfo's first ':'. No message may hold it. (The
            // first oracle looked for ":s3cr3t" followed by an '@' anywhere; the
            // 1,000,000-case run showed damage that leaves "s3cr3t" in the scheme or the path,
            // where it is no password: `b:s3cr3tredis://...`, `postgres://u:s\03cr3t@h//u:s3cr3t@./db`.)
            let password = url.split_once("://").and_then(|(_, rest)| {
                let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
                let (userinfo, _) = authority.rsplit_once('@')?;
                let (_, pw) = userinfo.split_once(':')?;
                Some(pw.to_string())
            });
            // A second copy of the password's text elsewhere in the URL (a path) is the
            // user's text there, shown as such.
            let password = password.filter(|p| url.matches(p.as_str()).count() == 1);
            if let Some(pw) = password.filter(|p| p.contains("3cr3t")) {
                for s in said {
                    prop_assert!(!s.contains(&pw), "the password {pw:?} is in {s:?}");
                }
            }
            Ok(())
        },
    );
}

fn store_url() -> impl Strategy<Value = String> {
    prop_oneof![
        "/[a-z]{1,8}(/[a-z]{1,8}){0,2}".prop_map(|p| format!("file://{p}")),
        ("[a-z0-9-]{1,12}", "[a-z/]{0,12}")
            .prop_map(|(b, p)| format!("s3://{b}/{p}?region=eu-west-1&path_style=true")),
        Just("memory://".to_string()),
        ("[a-z]{1,8}", "[a-z]{1,8}")
            .prop_map(|(s, v)| format!("opendal+{s}://?root=/{v}&endpoint=env:X")),
    ]
}

#[test]
fn fuzz_store_urls() {
    // Store URLs are checked before any I/O: a damaged one is an error naming it, never a
    // panic.
    fuzz::run(
        "store_urls",
        damaged(store_url().prop_map(String::into_bytes)),
        |(_, bad)| {
            let url = String::from_utf8_lossy(&bad).into_owned();
            if let Err(e) = objstore::check_url(&url) {
                prop_assert!(!e.to_string().is_empty());
            }
            Ok(())
        },
    );
}

#[test]
fn a_tally_with_a_damaged_version_starts_afresh() {
    // Regression: a tally whose version was not a number was read as version 1.
    let dir = tempfile::tempdir().unwrap();
    let state = State::open(&dir.path().join("state")).unwrap();
    let t = Tally::encode(&Summary::default()).replace("\"version\":1", "\"version\":\"x\"");
    state.raw_put(b"tally", t.as_bytes()).unwrap();
    assert!(state.tally().unwrap().is_none());
}
