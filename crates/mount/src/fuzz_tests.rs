//! Decoder harness of the mount's control socket (see `fs_core::fuzz` for the kit, the case
//! count and the seed): request lines as a client of this user (or root) sends them, damaged
//! structurally (a field of the wrong type, a huge number, an unknown `op`, deep nesting) and
//! byte by byte (not UTF-8, cut short, a lying length inside a string). `control::parse_request`
//! answers each with the request or a `bad request: ...` line, never a panic; what it accepts
//! encodes back to the same request.
//!
//! Allocation: a line is read up to `control::MAX_REQUEST` (1 MiB); serde_json allocates only
//! for what it has parsed.

use crate::control::{parse_request, Request, WarmAction, MAX_REQUEST};
use fs_core::fuzz::{self, json_damaged};
use fs_core::{CommitRequest, Mutation, Op};
use proptest::prelude::*;
use serde_json::Value;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn commit_request() -> impl Strategy<Value = CommitRequest> {
    (
        proptest::collection::vec((bytes(16), proptest::option::of(bytes(16))), 0..3),
        proptest::collection::vec(
            prop_oneof![
                (bytes(16), bytes(16)).prop_map(|(key, value)| Mutation::Put { key, value }),
                bytes(16).prop_map(|key| Mutation::Delete { key }),
                (bytes(16), any::<i64>()).prop_map(|(key, delta)| Mutation::Add { key, delta }),
            ],
            0..3,
        ),
        prop_oneof![
            (
                any::<u64>(),
                "[a-z0-9._-]{1,12}",
                any::<u64>(),
                any::<bool>()
            )
                .prop_map(|(parent, name, ino, freed)| Op::Unlink {
                    parent,
                    name,
                    ino,
                    freed
                }),
            any::<u64>().prop_map(|ino| Op::Release { ino }),
        ],
    )
        .prop_map(|(reads, writes, op)| CommitRequest { reads, writes, op })
}

fn request() -> impl Strategy<Value = Request> {
    use fs_core::storage::Event;
    prop_oneof![
        (
            proptest::collection::vec(prop_oneof!["/[a-z0-9/._-]{0,24}", ".{0,12}"], 0..4),
            any::<usize>(),
            prop_oneof![
                Just(WarmAction::Warm),
                Just(WarmAction::Check),
                Just(WarmAction::Evict)
            ],
        )
            .prop_map(|(paths, threads, action)| Request::Warmup {
                paths,
                threads,
                action
            }),
        Just(Request::Stats),
        (any::<bool>(), any::<u64>()).prop_map(|(delete, session_timeout_secs)| Request::Gc {
            delete,
            session_timeout_secs
        }),
        any::<bool>().prop_map(|now| Request::Exit { now }),
        any::<u64>().prop_map(|ino| Request::WriteError { ino }),
        ("[a-z/]{0,12}", "[a-z/]{0,12}", any::<bool>())
            .prop_map(|(src, dst, into)| Request::Clone { src, dst, into }),
        commit_request().prop_map(|req| Request::Commit { req }),
        (
            prop_oneof![
                "file:///[a-z/]{1,12}".prop_map(|to| Event::Start { to }),
                Just(Event::Backfilled),
                Just(Event::Verified),
                Just(Event::Switch),
                Just(Event::Finish),
                Just(Event::Abort),
            ],
            proptest::option::of("[a-z]{1,8}@[a-z]{1,8} pid [0-9]{1,6}"),
        )
            .prop_map(|(event, who)| Request::Cutover { event, who }),
    ]
}

#[test]
fn fuzz_control_requests() {
    fuzz::run(
        "control_requests",
        // The kit's version damage goes to `op`, the field that picks the request.
        json_damaged(
            request().prop_map(|r| serde_json::to_value(r).unwrap()),
            "op",
        ),
        |(valid, bad)| {
            let want: Request = serde_json::from_value(valid.clone()).unwrap();
            let mut line = bad.0.clone();
            line.push(b'\n');
            match parse_request(&line) {
                Ok(r) => {
                    let again = serde_json::to_vec(&r).unwrap();
                    prop_assert_eq!(parse_request(&again).unwrap(), r.clone());
                    if serde_json::from_slice::<Value>(&bad).ok().as_ref() == Some(&valid) {
                        prop_assert_eq!(r, want);
                    }
                }
                Err(e) => {
                    prop_assert!(
                        serde_json::to_vec(&valid).unwrap() != *bad,
                        "a valid request was refused: {e}"
                    );
                    prop_assert!(e.starts_with("bad request: "), "{e}");
                    prop_assert!(e.len() < 4096, "{e}");
                }
            }
            Ok(())
        },
    );
}

/// Lines that are not one JSON request: each refused in a short line that says what is wrong.
#[test]
fn a_request_line_not_utf8_or_over_the_limit_is_refused_in_a_short_line() {
    let e = parse_request(b"{\"op\":\"stats\xff\"}\n").unwrap_err();
    assert!(
        e.contains("not UTF-8") && e.contains("one JSON line"),
        "{e}"
    );
    let mut long = br#"{"op":"warmup","paths":[""#.to_vec();
    long.resize(MAX_REQUEST as usize, b'a');
    let e = parse_request(&long).unwrap_err();
    assert!(e.contains("longer than 1048576 bytes"), "{e}");
    let e = parse_request(b"{\"op\":\"format\"}\n").unwrap_err();
    assert!(
        e.starts_with("bad request: unknown variant `format`"),
        "{e}"
    );
    // A value of the wrong type is named, not sent back whole (serde_json quotes it).
    let mut big = br#"{"op":"writeerror","ino":""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 500_000));
    big.extend_from_slice(b"\"}\n");
    let e = parse_request(&big).unwrap_err();
    assert!(
        e.starts_with("bad request: invalid type: string") && e.len() < 400,
        "{} bytes: {}",
        e.len(),
        &e[..100]
    );
    assert!(e.ends_with("more characters)"), "{e}");
    assert_eq!(
        parse_request(b"{\"op\":\"stats\"}\n").unwrap(),
        Request::Stats
    );
    assert_eq!(
        parse_request(b"{\"op\":\"exit\"}").unwrap(),
        Request::Exit { now: false }
    );
}
