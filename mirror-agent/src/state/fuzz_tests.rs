//! Decoder harnesses of the agent state's records (see `fs_core::fuzz` for the kit, the case
//! count and the seed): queue items of both formats (postcard, with and without the version
//! byte) and the bootstrap record (a `Versioned` JSON record). What a damaged state holds is
//! refused with a `Corrupt` or `UnsupportedVersion` error, never a panic; what is accepted
//! encodes back to a record that reads the same.

use super::bootstrap::{self, Record};
use super::format::{decode_item, encode_item};
use super::{Bootstrap, QItem, STATE_FORMAT};
use fs_core::error::ErrorKind;
use fs_core::fuzz::{self, damaged, json_damaged};
use fs_core::record::{self, Versioned, VersionedBin};
use proptest::prelude::*;

fn item() -> impl Strategy<Value = QItem> {
    (any::<u32>(), any::<u32>(), any::<i64>()).prop_map(|(len, attempts, next_ns)| QItem {
        len,
        attempts,
        next_ns,
    })
}

fn boot() -> impl Strategy<Value = Bootstrap> {
    prop_oneof![
        (any::<u64>(), any::<bool>()).prop_map(|(s0, staged)| Bootstrap::Installing { s0, staged }),
        (any::<u64>(), any::<u64>(), any::<bool>())
            .prop_map(|(s0, s_end, staged)| { Bootstrap::CatchingUp { s0, s_end, staged } }),
    ]
}

fn kind_of(e: &anyhow::Error) -> Option<ErrorKind> {
    e.chain()
        .find_map(|c| c.downcast_ref::<fs_core::Error>())
        .map(fs_core::Error::kind)
}

#[test]
fn fuzz_agent_queue_items() {
    fuzz::run(
        "agent_queue_items",
        damaged(item().prop_map(|q| encode_item(&q))),
        |(valid, bad)| {
            let want = decode_item(&valid, STATE_FORMAT).unwrap();
            match decode_item(&bad, STATE_FORMAT) {
                Ok(q) => {
                    prop_assert_eq!(decode_item(&encode_item(&q), STATE_FORMAT).unwrap(), q);
                    if bad == valid {
                        prop_assert_eq!(q, want);
                    }
                }
                Err(e) => {
                    prop_assert!(bad != valid, "a valid queue item was refused: {e:#}");
                    let k = kind_of(&e);
                    prop_assert!(
                        matches!(k, Some(ErrorKind::Corrupt | ErrorKind::UnsupportedVersion)),
                        "{e:#} is not Corrupt or UnsupportedVersion"
                    );
                    if bad.first().is_some_and(|v| *v > QItem::VERSION) {
                        prop_assert_eq!(k, Some(ErrorKind::UnsupportedVersion));
                    }
                }
            }
            // The same bytes as a format-1 item (bare postcard), as the migration reads them.
            if let Ok(q) = decode_item(&bad, 1) {
                prop_assert_eq!(
                    decode_item(&postcard::to_allocvec(&q).unwrap(), 1).unwrap(),
                    q
                );
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_agent_bootstrap_record() {
    fuzz::run(
        "agent_bootstrap_record",
        json_damaged(
            boot().prop_map(|b| serde_json::from_slice(&bootstrap::encode(&b)).unwrap()),
            Record::VERSION_KEY,
        ),
        |(valid, bad)| {
            fuzz::check_record::<Record>(&valid, &bad, |a, b| a.b == b.b)?;
            // The state's own reader says where the record is, and reads what the kit accepts.
            match (bootstrap::decode(&bad), record::decode::<Record>(&bad)) {
                (Ok(b), Ok(r)) => prop_assert_eq!(b, r.b),
                (Err(e), Err(_)) => {
                    prop_assert!(format!("{e:#}").contains("bootstrap record"), "{e:#}")
                }
                (a, b) => prop_assert!(false, "the readers disagree: {a:?} / {b:?}"),
            }
            Ok(())
        },
    );
}
