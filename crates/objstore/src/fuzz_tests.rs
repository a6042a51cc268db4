//! Decoder harnesses of the object-store layer (see `fs_core::fuzz` for the kit, the case
//! count and the seed): keys as a `file://` store maps them onto its directory (from block
//! keys, listings and the CLI), and the bandwidth timetables of `--bwlimit` and the agents'
//! `bwlimit` ("08:00,50M 20:00,off"). A key is either a path below the store's directory,
//! part for part, or refused; a timetable is either one whose every entry is a time of the day
//! and a rate, or refused naming the part that is wrong. Never a panic.

use crate::limits::BwSchedule;
use crate::plain_key_path;
use fs_core::fuzz::{self, damaged};
use proptest::prelude::*;
use std::path::{Component, Path};

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<u64>(), any::<u32>(), any::<u32>())
            .prop_map(|(id, i, l)| fs_core::keys::block_key("vol", id, i, l)),
        "[a-z0-9._/-]{0,32}",
        Just("vol/chunks/0/0/1_0_4096".to_string()),
        Just(".jfs-tmp/x".to_string()),
    ]
}

#[test]
fn fuzz_store_key_paths() {
    let root = Path::new("/srv/store");
    fuzz::run(
        "store_key_paths",
        damaged(key().prop_map(String::into_bytes)),
        |(_, bad)| {
            let k = String::from_utf8_lossy(&bad);
            if let Some(p) = plain_key_path(root, &k) {
                let rel = p.strip_prefix(root);
                prop_assert!(
                    rel.is_ok(),
                    "{k:?} maps to {} outside the store",
                    p.display()
                );
                let rel = rel.unwrap();
                prop_assert!(
                    rel.components().all(|c| matches!(c, Component::Normal(_))),
                    "{k:?} maps to {}",
                    p.display()
                );
                // Part for part: the path names the key and nothing else.
                prop_assert_eq!(rel.to_str(), Some(&*k));
                prop_assert_eq!(rel.components().count(), k.split('/').count());
            } else {
                prop_assert!(
                    k.is_empty()
                        || k.starts_with('/')
                        || k.split('/').any(|c| c.is_empty() || c == "." || c == ".."),
                    "the plain key {k:?} was refused"
                );
            }
            Ok(())
        },
    );
}

fn rate() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("off".to_string()),
        Just("0".to_string()),
        (
            1u32..4096,
            prop_oneof![Just(""), Just("K"), Just("M"), Just("G"), Just("MiB")]
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
    ]
}

fn timetable() -> impl Strategy<Value = String> {
    prop_oneof![
        rate(),
        proptest::collection::vec((0u32..24, 0u32..60, rate()), 1..4).prop_map(|v| {
            v.iter()
                .map(|(h, m, r)| format!("{h:02}:{m:02},{r}"))
                .collect::<Vec<_>>()
                .join(" ")
        }),
    ]
}

#[test]
fn fuzz_bwlimit_timetables() {
    fuzz::run(
        "bwlimit_timetables",
        damaged(timetable().prop_map(String::into_bytes)),
        |(valid, bad)| {
            let s = String::from_utf8_lossy(&bad);
            match BwSchedule::parse(&s) {
                Ok(t) => {
                    // Every minute of the day has one limit in force; the entries are times of
                    // the day, in order.
                    for m in [0, 1, 479, 480, 1439] {
                        let _ = t.at(m);
                    }
                    let entries = t.entries();
                    prop_assert!(entries.iter().all(|(m, _)| *m < 1440), "{entries:?}");
                    prop_assert!(entries.windows(2).all(|w| w[0].0 <= w[1].0));
                    if s.contains(',') {
                        // No sign, no third digit: only the spelling HH:MM (or H:M) is a time.
                        for part in s.split_whitespace() {
                            let t = part.split_once(',').unwrap().0;
                            prop_assert!(
                                t.bytes().all(|b| b.is_ascii_digit() || b == b':'),
                                "time {t:?} of {s:?} was taken"
                            );
                        }
                    }
                }
                Err(e) => {
                    let m = format!("{e:#}");
                    prop_assert!(bad != valid, "a valid timetable was refused: {m}");
                    prop_assert!(
                        ["time", "timetable entry", "rate", "size", "negative"]
                            .iter()
                            .any(|w| m.contains(w)),
                        "{m} does not say what is wrong"
                    );
                }
            }
            Ok(())
        },
    );
}

/// A time with a sign, a third digit or no digits is not a time of the day: refused, naming
/// the entry (`u32::from_str` took "+8" and "0008" for 8).
#[test]
fn a_timetable_time_with_a_sign_or_extra_digits_is_refused_naming_its_entry() {
    for bad in [
        "+08:00,10M",
        "08:+0,10M",
        "008:00,10M",
        "08:000,10M",
        ":00,10M",
        "08:,off",
    ] {
        let e = format!("{:#}", BwSchedule::parse(bad).unwrap_err());
        assert!(
            e.contains("expected HH:MM") && e.contains(bad),
            "{bad}: {e}"
        );
    }
    let e = format!("{:#}", BwSchedule::parse("08:00,10Q").unwrap_err());
    assert!(e.contains("timetable entry \"08:00,10Q\""), "{e}");
    assert_eq!(
        BwSchedule::parse("8:5,1K 20:00,off").unwrap().entries(),
        &[(485, Some(1024)), (1200, None)]
    );
}
