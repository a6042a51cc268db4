//! Decoder harnesses of the mirror agent (see `fs_core::fuzz` for the kit, the case count and
//! the seed): the wire protocol's messages both ways, damaged in transit (the checksum kept)
//! and by a peer that checksums what it damages (after authentication, a buggy or hostile
//! agent); its framing with lying lengths, before and after authentication; both halves of
//! the handshake fed damaged messages on a duplex pipe (the real `accept` and `connect`); the
//! session's check of journal frames (a seq that goes back, repeats or jumps, an entry sent
//! under another's seq); the session's checks of a whole received sequence (epoch, snapshot
//! order and seqs: `mirror::received`); and the agent's TOML config with its environment overlay. The agent
//! state's records have their own harnesses (`state::fuzz_tests`).
//!
//! Allocation: the codec refuses a frame whose header is over its limit before buffering it
//! (`PRE_AUTH_MAX_MESSAGE` until the peer has proven the token, `MAX_MESSAGE` after), and
//! postcard preallocates at most 1 MiB per sequence from a length it has not checked (serde's
//! cautious size hint) and fails at the first missing byte; a frame claiming 4 GiB is checked
//! against the process's peak virtual size (`a_frame_claiming_4_gib_...`).

use crate::config::Config;
use crate::handshake::{self, Failure, Welcome};
use crate::proto::{self, BadEntries, ToMirror, ToPrimary, Want};
use bytes::Bytes;
use fs_core::fuzz::{self, apply, damaged, damages, Damage, Shown};
use fs_core::{CommitRequest, Entry, ErrorKind, Mutation, Op};
use futures::SinkExt;
use proptest::prelude::*;
use std::time::Duration;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9._-]{0,16}",
        ".{0,24}",
        Just("x".repeat(5000)),
        Just("\u{1b}[31m\n\u{202e}".to_string()),
    ]
}

fn want() -> impl Strategy<Value = Want> {
    prop_oneof![
        any::<u64>().prop_map(Want::From),
        Just(Want::Snapshot),
        Just(Want::Forward),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let u = any::<u64>;
    prop_oneof![
        (u(), "[a-z0-9._-]{1,12}", u(), any::<u32>()).prop_map(|(parent, name, ino, mode)| {
            Op::Mknod {
                parent,
                name,
                ino,
                kind: fs_core::FileKind::File,
                mode,
            }
        }),
        (u(), "[a-z0-9._-]{1,12}", u(), any::<bool>()).prop_map(|(parent, name, ino, freed)| {
            Op::Unlink {
                parent,
                name,
                ino,
                freed,
            }
        }),
        (u(), any::<u32>(), any::<u32>(), u(), any::<u32>()).prop_map(
            |(ino, chunk, pos, slice, len)| Op::Write {
                ino,
                chunk,
                pos,
                slice,
                size: len,
                off: 0,
                len
            }
        ),
        u().prop_map(|ino| Op::Release { ino }),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (bytes(24), bytes(32)).prop_map(|(key, value)| Mutation::Put { key, value }),
        bytes(24).prop_map(|key| Mutation::Delete { key }),
        (bytes(24), any::<i64>()).prop_map(|(key, delta)| Mutation::Add { key, delta }),
        bytes(24).prop_map(|key| Mutation::Stamp { key }),
    ]
}

fn commit_request() -> impl Strategy<Value = CommitRequest> {
    (
        proptest::collection::vec((bytes(24), proptest::option::of(bytes(32))), 0..4),
        proptest::collection::vec(mutation(), 0..4),
        op(),
    )
        .prop_map(|(reads, writes, op)| CommitRequest { reads, writes, op })
}

fn entry(seq: u64) -> impl Strategy<Value = Entry> {
    (
        any::<i64>(),
        op(),
        proptest::collection::vec(
            prop_oneof![
                (bytes(24), bytes(32)).prop_map(|(key, value)| Mutation::Put { key, value }),
                bytes(24).prop_map(|key| Mutation::Delete { key }),
            ],
            0..4,
        ),
    )
        .prop_map(move |(time_ns, op, writes)| Entry {
            seq,
            time_ns,
            op,
            writes,
        })
}

fn hello() -> impl Strategy<Value = ToPrimary> {
    (
        prop_oneof!["eu", "us", text()],
        proptest::option::of("[0-9a-f-]{36}"),
        any::<[u8; 32]>(),
        want(),
        proptest::option::of(any::<u32>()),
        any::<u64>(),
        prop_oneof![Just(String::new()), "[0-9a-f]{32}", text()],
    )
        .prop_map(
            |(mirror, volume_uuid, nonce, want, prev_crc, epoch, identity)| ToPrimary::Hello {
                proto: proto::PROTO_VERSION,
                mirror,
                volume_uuid,
                nonce,
                want,
                prev_crc,
                epoch,
                identity,
            },
        )
}

fn to_primary() -> impl Strategy<Value = ToPrimary> {
    prop_oneof![
        hello(),
        bytes(40).prop_map(|mac| ToPrimary::Auth { mac }),
        any::<u64>().prop_map(|seq| ToPrimary::Ack { seq }),
        (any::<u64>(), commit_request()).prop_map(|(id, req)| ToPrimary::Commit { id, req }),
        proptest::collection::vec(bytes(64), 0..4)
            .prop_map(|records| ToPrimary::Sessions { records }),
    ]
}

fn error_kind() -> impl Strategy<Value = ErrorKind> {
    prop_oneof![
        Just(ErrorKind::PermissionDenied),
        Just(ErrorKind::Fenced),
        Just(ErrorKind::Conflict),
        Just(ErrorKind::NoSpace),
        Just(ErrorKind::Backend),
    ]
}

fn to_mirror() -> impl Strategy<Value = ToMirror> {
    use volume::forward::ForwardReply;
    let u = any::<u64>;
    prop_oneof![
        any::<[u8; 32]>().prop_map(|nonce| ToMirror::Challenge { nonce }),
        (text(), any::<bool>()).prop_map(|(reason, resync)| ToMirror::Refused { reason, resync }),
        ("[0-9a-f-]{36}", u(), u()).prop_map(|(volume_uuid, head, epoch)| ToMirror::Welcome {
            volume_uuid,
            head,
            epoch
        }),
        (1u64..1 << 40, 0usize..4)
            .prop_flat_map(|(s, n)| {
                (0..n as u64)
                    .map(|i| entry(s + i).prop_map(|e| (e.seq, e.encode())))
                    .collect::<Vec<_>>()
            })
            .prop_map(|frames| ToMirror::Entries { frames }),
        (u(), any::<i64>())
            .prop_map(|(head, head_time_ns)| ToMirror::Heartbeat { head, head_time_ns }),
        prop_oneof![
            (u(), bytes(64)).prop_map(|(seq, settings)| ToMirror::SnapshotBegin { seq, settings }),
            proptest::collection::vec((bytes(24), bytes(32)), 0..4)
                .prop_map(|pairs| ToMirror::SnapshotPairs { pairs }),
            u().prop_map(|seq| ToMirror::SnapshotEnd { seq }),
        ],
        (
            u(),
            prop_oneof![
                (u(), any::<i64>())
                    .prop_map(|(seq, time_ns)| ForwardReply::Committed { seq, time_ns }),
                u().prop_map(|head| ForwardReply::Conflict { head }),
                (error_kind(), text(), any::<bool>()).prop_map(|(kind, message, temporary)| {
                    ForwardReply::Failed {
                        kind,
                        message,
                        temporary,
                    }
                }),
            ]
        )
            .prop_map(|(id, reply)| ToMirror::Forwarded { id, reply }),
        text().prop_map(|reason| ToMirror::WritesRefused { reason }),
        bytes(40).prop_map(|proof| ToMirror::Proof { proof }),
    ]
}

/// `frame` with its checksum made right again: what a peer that damages its own messages
/// (after authentication) sends.
fn rechecksummed(frame: &[u8]) -> Vec<u8> {
    if frame.len() < 4 {
        return frame.to_vec();
    }
    let mut f = frame.to_vec();
    let crc = crc32c::crc32c(&f[4..]);
    f[..4].copy_from_slice(&crc.to_le_bytes());
    f
}

fn corrupt(e: &anyhow::Error) -> Option<proto::Damage> {
    e.chain()
        .find_map(|c| c.downcast_ref::<proto::Corrupt>())
        .map(|c| c.1)
}

/// Damage in transit: never gets past the checksum; what is refused is refused as corrupt.
fn check_transit<T>(valid: &[u8], bad: &[u8]) -> Result<(), TestCaseError>
where
    T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let want: T = proto::decode(valid).unwrap();
    match proto::decode::<T>(bad) {
        Ok(m) => prop_assert_eq!(m, want, "damage got past the checksum"),
        Err(e) => {
            prop_assert!(bad != valid, "a valid message was refused: {e:#}");
            prop_assert!(corrupt(&e).is_some(), "{e:#} is not a corrupt message");
        }
    }
    Ok(())
}

/// Damage by a peer that checksums it: refused as foreign, or a message that encodes back to
/// itself.
fn check_checksummed<T>(bad: &[u8]) -> Result<Option<T>, TestCaseError>
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    match proto::decode::<T>(bad) {
        Ok(m) => {
            let again = proto::decode::<T>(&proto::encode(&m)).unwrap();
            prop_assert!(again == m, "{:?} came back as {:?}", m, again);
            Ok(Some(m))
        }
        Err(e) => {
            let d = corrupt(&e);
            prop_assert!(
                d == Some(proto::Damage::Foreign) || bad.len() < 4,
                "{e:#}: a checksummed message refused as {d:?}"
            );
            Ok(None)
        }
    }
}

#[test]
fn fuzz_agent_messages_to_primary() {
    fuzz::run(
        "agent_messages_to_primary",
        (
            damaged(to_primary().prop_map(|m| proto::encode(&m).to_vec())),
            any::<bool>(),
        ),
        |((valid, bad), recrc)| {
            if !recrc {
                return check_transit::<ToPrimary>(&valid, &bad);
            }
            let bad = rechecksummed(&bad);
            // The version a primary reads from any peer's first frame agrees with the hello.
            let version = proto::hello_version(&bad);
            match check_checksummed::<ToPrimary>(&bad)? {
                Some(ToPrimary::Hello { proto: p, .. }) => prop_assert_eq!(version, Some(p)),
                Some(ToPrimary::Commit { req, .. }) => {
                    // What the primary does first with a forwarded change: no panic either.
                    let _ = req.counter_keys();
                    let _ = volume::forward::tree_only(&req);
                }
                _ => {}
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_agent_messages_to_mirror() {
    fuzz::run(
        "agent_messages_to_mirror",
        (
            damaged(to_mirror().prop_map(|m| proto::encode(&m).to_vec())),
            any::<bool>(),
        ),
        |((valid, bad), recrc)| {
            if !recrc {
                return check_transit::<ToMirror>(&valid, &bad);
            }
            let bad = rechecksummed(&bad);
            if let Some(ToMirror::Entries { frames }) = check_checksummed::<ToMirror>(&bad)? {
                // Whatever the peer checksummed, the session's check takes only consecutive,
                // decodable entries.
                let first = frames.first().map_or(1, |f| f.0);
                if let Ok(b) = proto::check_entries(first, frames.clone()) {
                    for (i, e) in b.iter().enumerate() {
                        prop_assert_eq!(e.seq, first + i as u64);
                        prop_assert_eq!(&e.encode(), &frames[i].1);
                    }
                }
            }
            Ok(())
        },
    );
}

/// The bytes of `msgs` on the wire: each a 4-byte big-endian length, then the frame.
fn on_the_wire(msgs: &[Bytes]) -> Vec<u8> {
    let mut w = Vec::new();
    for m in msgs {
        w.extend_from_slice(&(m.len() as u32).to_be_bytes());
        w.extend_from_slice(m);
    }
    w
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every message `wire` yields until its end or its first error (where a session stops).
async fn read_all(wire: &mut proto::Wire) -> (Vec<ToMirror>, Option<anyhow::Error>) {
    let mut got = Vec::new();
    loop {
        match proto::recv::<ToMirror, _>(wire).await {
            Ok(Some(m)) => got.push(m),
            Ok(None) => return (got, None),
            Err(e) => return (got, Some(e)),
        }
    }
}

/// Lying lengths in the framing (the kit writes lengths of every width over the headers),
/// before and after authentication: every message taken is one that was sent, whole; a
/// header over the limit is refused as not the protocol; the stream's end is an end.
#[test]
fn fuzz_agent_wire_lengths() {
    let rt = runtime();
    fuzz::run(
        "agent_wire_lengths",
        (
            proptest::collection::vec(to_mirror(), 1..4).prop_flat_map(|msgs| {
                let frames: Vec<Bytes> = msgs.iter().map(proto::encode).collect();
                let wire = on_the_wire(&frames);
                let n = wire.len();
                (Just(msgs), Just(Shown(wire)), damages(n))
            }),
            any::<bool>(),
        ),
        |((msgs, wire, d), authenticated)| {
            let bad = apply(&wire, &d);
            let (got, err) = rt.block_on(async {
                let mut w = proto::wire(Box::new(std::io::Cursor::new(bad.clone())));
                if authenticated {
                    w.codec_mut().set_max_frame_length(proto::MAX_MESSAGE);
                }
                read_all(&mut w).await
            });
            for m in &got {
                prop_assert!(msgs.contains(m), "{m:?} was never sent");
            }
            if bad == wire.0 {
                // Messages over the pre-auth limit are refused before authentication.
                let limit = if authenticated {
                    proto::MAX_MESSAGE
                } else {
                    proto::PRE_AUTH_MAX_MESSAGE
                };
                let fits = msgs
                    .iter()
                    .map(|m| proto::encode(m).len())
                    .take_while(|n| *n <= limit)
                    .count();
                prop_assert_eq!(got.len(), fits);
                prop_assert_eq!(err.is_none(), fits == msgs.len());
            }
            if let Some(e) = err {
                let s = format!("{e:#}");
                prop_assert!(corrupt(&e).is_some() || s.starts_with("receiving: "), "{s}");
            }
            Ok(())
        },
    );
}

/// The process's peak virtual size so far, in bytes (`VmPeak`).
fn vm_peak() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmPeak:")).unwrap();
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// A header claiming 4 GiB (and 64 MiB + 1 after authentication, 64 KiB + 1 before) is
/// refused at the header, as not the protocol, before anything is buffered; and a message
/// whose checksum is right but whose body claims a 4 GiB sequence is refused as foreign
/// without allocating it.
#[test]
fn a_frame_claiming_4_gib_is_refused_at_its_header_without_allocating_it() {
    let rt = runtime();
    let before = vm_peak();
    for (authenticated, len) in [
        (false, u32::MAX),
        (false, proto::PRE_AUTH_MAX_MESSAGE as u32 + 1),
        (true, u32::MAX),
        (true, proto::MAX_MESSAGE as u32 + 1),
    ] {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 64]);
        let (got, err) = rt.block_on(async {
            let mut w = proto::wire(Box::new(std::io::Cursor::new(bytes)));
            if authenticated {
                w.codec_mut().set_max_frame_length(proto::MAX_MESSAGE);
            }
            read_all(&mut w).await
        });
        assert!(got.is_empty());
        let e = err.expect("refused");
        assert_eq!(corrupt(&e), Some(proto::Damage::Foreign), "{e:#}");
        assert!(format!("{e:#}").contains("bad frame length"), "{e:#}");
    }
    // Postcard's lengths inside a checksummed body: a vector of 2^32 frames, of 2^32 pairs,
    // a string of 2^32 bytes.
    for variant in [3u8, 6, 1] {
        let mut body = vec![variant];
        body.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x10]); // varint 2^32
        body.extend_from_slice(&[7u8; 32]);
        let mut frame = crc32c::crc32c(&body).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        let e = proto::decode::<ToMirror>(&frame).unwrap_err();
        assert_eq!(corrupt(&e), Some(proto::Damage::Foreign), "{e:#}");
    }
    // The handshake's first read, from a peer announcing 4 GiB: refused as garbage.
    let r = rt.block_on(async {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = proto::wire(Box::new(a));
        use tokio::io::AsyncWriteExt;
        b.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        b.write_all(&[0u8; 512]).await.unwrap();
        handshake::accept(&mut w, |_| Some("t".repeat(40))).await
    });
    match r {
        Err(Failure::Garbage(s)) => assert!(s.contains("bad frame length"), "{s}"),
        Err(e) => panic!("not refused as garbage: {e}"),
        Ok(_) => panic!("a 4 GiB hello was let in"),
    }
    let grew = vm_peak().saturating_sub(before);
    assert!(
        // Other tests' threads run beside this one (each may add an allocator arena of 64 MiB
        // of address space); a buffer of 4 GiB would be well past this.
        grew < 3 << 30,
        "the peak virtual size grew by {} MiB reading frames that claim 4 GiB",
        grew >> 20
    );
}

const TOKEN: &str = "6f1e0c3a9b7d5e2f4a8c1b3d5e7f9a0b2c4d6e8f0a1b3c5d";
const OTHER_TOKEN: &str = "0f1e0c3a9b7d5e2f4a8c1b3d5e7f9a0b2c4d6e8f0a1b3c5d";

/// A damage done to one message of a handshake: in transit, or checksummed by its sender.
fn message_damage() -> impl Strategy<Value = Option<(Vec<Damage>, bool)>> {
    prop_oneof![
        2 => Just(None),
        1 => (damages(64), any::<bool>()).prop_map(Some),
    ]
}

fn damage_frame(frame: &[u8], d: &Option<(Vec<Damage>, bool)>) -> Vec<u8> {
    match d {
        None => frame.to_vec(),
        Some((d, false)) => apply(frame, d),
        Some((d, true)) => rechecksummed(&apply(frame, d)),
    }
}

/// The primary's half (`handshake::accept`) against a mirror whose hello or proof is damaged,
/// whose name is not registered, or whose token is wrong: it lets in exactly the registered
/// mirror with the right token and the hello it proved, and answers an unknown name and a
/// wrong token with the same refusal.
#[test]
fn fuzz_agent_handshake_primary_half() {
    let rt = runtime();
    fuzz::run(
        "agent_handshake_primary_half",
        (
            hello(),
            prop_oneof![Just(TOKEN), Just(OTHER_TOKEN)],
            message_damage(),
            message_damage(),
        ),
        |(hello, token, hello_damage, auth_damage)| {
            let digest = proto::hello_digest(&hello);
            let ToPrimary::Hello {
                nonce: nonce_m,
                mirror: ref name,
                ..
            } = hello
            else {
                unreachable!()
            };
            let hello_frame = damage_frame(&proto::encode(&hello), &hello_damage);
            let hello_read = proto::decode::<ToPrimary>(&hello_frame).ok();
            let auth_sent = std::sync::Mutex::new(None);
            let (r, seen) = rt.block_on(async {
                let (a, b) = tokio::io::duplex(1 << 20);
                let mut pw = proto::wire(Box::new(a));
                let mw = proto::wire(Box::new(b));
                let primary = async move {
                    let r = handshake::accept(&mut pw, |n| (n == "eu").then(|| TOKEN.to_string()))
                        .await;
                    drop(pw);
                    r
                };
                let mirror = async {
                    // Owned: the mirror's end closes when it is done.
                    let mut mw = mw;
                    let mut seen = Vec::new();
                    if mw.send(Bytes::from(hello_frame.clone())).await.is_err() {
                        return seen;
                    }
                    while let Ok(Some(m)) = proto::recv::<ToMirror, _>(&mut mw).await {
                        if let ToMirror::Challenge { nonce } = &m {
                            let mac = proto::mac(token, "mirror", nonce, &nonce_m, &digest);
                            let good = proto::encode(&ToPrimary::Auth { mac });
                            let auth = damage_frame(&good, &auth_damage);
                            *auth_sent.lock().unwrap() = Some(auth[..] == good[..]);
                            if mw.send(Bytes::from(auth)).await.is_err() {
                                seen.push(m);
                                return seen;
                            }
                        }
                        seen.push(m);
                    }
                    seen
                };
                tokio::time::timeout(Duration::from_secs(30), async {
                    tokio::join!(primary, mirror)
                })
                .await
                .expect("the handshake hung")
            });
            let auth_good = auth_sent.lock().unwrap().unwrap_or(false);
            let should_enter =
                hello_read.as_ref() == Some(&hello) && name == "eu" && token == TOKEN && auth_good;
            match r {
                Ok(h) => {
                    prop_assert!(should_enter, "let in: {hello_read:?}, token {token}");
                    prop_assert_eq!(&h.mirror, name);
                    let ToPrimary::Hello {
                        want,
                        epoch,
                        identity,
                        ..
                    } = &hello
                    else {
                        unreachable!()
                    };
                    prop_assert_eq!((&h.want, &h.epoch, &h.identity), (want, epoch, identity));
                    prop_assert!(
                        matches!(
                            seen.as_slice(),
                            [ToMirror::Challenge { .. }, ToMirror::Proof { .. }]
                        ),
                        "{:?}",
                        seen
                    );
                    let (ToMirror::Challenge { nonce }, ToMirror::Proof { proof }) =
                        (&seen[0], &seen[1])
                    else {
                        unreachable!()
                    };
                    prop_assert!(proto::verify(
                        TOKEN, "primary", &nonce_m, nonce, &digest, proof
                    ));
                }
                Err(f) => {
                    prop_assert!(!should_enter, "the registered mirror was refused: {f}");
                    prop_assert!(
                        !seen.iter().any(|m| matches!(m, ToMirror::Proof { .. })),
                        "a proof was handed out to a refused peer: {seen:?}"
                    );
                    match &f {
                        // An unknown name and a wrong token: one answer, byte for byte.
                        Failure::Auth(s) => {
                            prop_assert!(s.chars().count() <= 800, "{s}");
                            let refused = ToMirror::Refused {
                                reason: proto::AUTH_FAILED.into(),
                                resync: false,
                            };
                            prop_assert!(
                                matches!(seen.as_slice(), [ToMirror::Challenge { .. }, r] if *r == refused),
                                "{seen:?}"
                            );
                        }
                        Failure::Garbage(s) => prop_assert!(s.chars().count() <= 2000, "{s}"),
                        Failure::Io(_) => {}
                    }
                }
            }
            Ok(())
        },
    );
}

/// The mirror's half (`handshake::connect`) against a primary whose challenge, proof or
/// welcome is damaged, or that holds another token: it goes on only after a proof of its own
/// token over the nonces it saw, and takes the welcome as sent.
#[test]
fn fuzz_agent_handshake_mirror_half() {
    let rt = runtime();
    fuzz::run(
        "agent_handshake_mirror_half",
        (
            hello(),
            prop_oneof![Just(TOKEN), Just(OTHER_TOKEN)],
            any::<[u8; 32]>(),
            to_mirror(),
            (message_damage(), message_damage(), message_damage()),
        ),
        |(hello, primary_token, nonce_p, welcome, (d_challenge, d_proof, d_welcome))| {
            let ToPrimary::Hello { nonce: nonce_m, .. } = hello else {
                unreachable!()
            };
            let challenge = proto::encode(&ToMirror::Challenge { nonce: nonce_p });
            let challenge_sent = damage_frame(&challenge, &d_challenge);
            let welcome_sent = damage_frame(&proto::encode(&welcome), &d_welcome);
            let proof_good = std::sync::Mutex::new(false);
            let r = rt.block_on(async {
                let (a, b) = tokio::io::duplex(1 << 20);
                let mut pw = proto::wire(Box::new(a));
                pw.codec_mut().set_max_frame_length(proto::MAX_MESSAGE);
                let mut mw = proto::wire(Box::new(b));
                let primary = async {
                    // Owned: the primary's end closes when its script stops.
                    let mut pw = pw;
                    let Ok(Some(h)) = proto::recv::<ToPrimary, _>(&mut pw).await else {
                        return;
                    };
                    let digest = proto::hello_digest(&h);
                    if pw.send(Bytes::from(challenge_sent.clone())).await.is_err() {
                        return;
                    }
                    let Ok(Some(ToPrimary::Auth { .. })) =
                        proto::recv::<ToPrimary, _>(&mut pw).await
                    else {
                        return;
                    };
                    let proof = proto::encode(&ToMirror::Proof {
                        proof: proto::mac(primary_token, "primary", &nonce_m, &nonce_p, &digest),
                    });
                    let sent = damage_frame(&proof, &d_proof);
                    *proof_good.lock().unwrap() = sent[..] == proof[..];
                    if pw.send(Bytes::from(sent)).await.is_err() {
                        return;
                    }
                    let _ = pw.send(Bytes::from(welcome_sent.clone())).await;
                };
                let mirror = async {
                    let r = handshake::connect(
                        &mut mw,
                        "primary.test:9566",
                        TOKEN,
                        hello.clone(),
                        Duration::from_secs(10),
                    )
                    .await;
                    drop(mw);
                    r
                };
                tokio::time::timeout(Duration::from_secs(30), async {
                    tokio::join!(primary, mirror).1
                })
                .await
                .expect("the handshake hung")
            });
            let challenge_read = proto::decode::<ToMirror>(&challenge_sent).ok();
            let proven = primary_token == TOKEN
                && challenge_read == Some(ToMirror::Challenge { nonce: nonce_p })
                && *proof_good.lock().unwrap();
            let welcome_read = proto::decode::<ToMirror>(&welcome_sent).ok();
            match r {
                Ok(w) => {
                    prop_assert!(proven, "went on without the primary's proof");
                    match (w, welcome_read) {
                        (
                            Welcome::In { head, epoch },
                            Some(ToMirror::Welcome {
                                head: h, epoch: e, ..
                            }),
                        ) => {
                            prop_assert_eq!((head, epoch), (h, e));
                        }
                        (
                            Welcome::Resync(r),
                            Some(ToMirror::Refused {
                                reason,
                                resync: true,
                            }),
                        ) => {
                            prop_assert_eq!(r, reason);
                        }
                        (_, read) => prop_assert!(false, "let in on {read:?}"),
                    }
                }
                Err(e) => {
                    let in_words = handshake::describe(&e);
                    if !proven {
                        // Nothing a peer says before its proof reaches a log uncut.
                        prop_assert!(in_words.chars().count() <= 1200, "{in_words}");
                    } else {
                        prop_assert!(
                            !matches!(welcome_read, Some(ToMirror::Welcome { .. })),
                            "a proven primary's welcome was refused: {e:#}"
                        );
                    }
                }
            }
            Ok(())
        },
    );
}

/// How the seqs of an `Entries` message are lied about.
#[derive(Debug, Clone)]
enum SeqLie {
    /// Two frames change places.
    Swap(usize, usize),
    /// A frame is sent twice.
    Repeat(usize),
    /// A frame is left out (a jump).
    Skip(usize),
    /// A frame is sent under another seq.
    Outer(usize, u64),
    /// A frame holds an entry of another seq (rightly checksummed).
    Inner(usize, u64),
    /// A frame's bytes are damaged.
    Bytes(usize, Vec<Damage>),
}

fn seq_lie() -> impl Strategy<Value = SeqLie> {
    let i = || 0usize..8;
    let s = || prop_oneof![Just(0u64), Just(1), Just(u64::MAX), any::<u64>(), 0u64..64];
    prop_oneof![
        (i(), i()).prop_map(|(a, b)| SeqLie::Swap(a, b)),
        i().prop_map(SeqLie::Repeat),
        i().prop_map(SeqLie::Skip),
        (i(), s()).prop_map(|(a, v)| SeqLie::Outer(a, v)),
        (i(), s()).prop_map(|(a, v)| SeqLie::Inner(a, v)),
        (i(), damages(64)).prop_map(|(a, d)| SeqLie::Bytes(a, d)),
    ]
}

/// The session's check of journal frames (`proto::check_entries`): a message is taken only
/// when every frame decodes, holds the entry of its seq, and the seqs run on from the next
/// expected one without going back, repeating or jumping; anything else refuses the whole
/// message, naming the first frame that is wrong.
#[test]
fn fuzz_agent_journal_sequences() {
    fuzz::run(
        "agent_journal_sequences",
        (
            prop_oneof![Just(1u64), 1u64..1 << 40, Just(u64::MAX - 3)],
            0usize..6,
        )
            .prop_flat_map(|(start, n)| {
                (
                    Just(start),
                    (0..n as u64)
                        .map(|i| entry(start.saturating_add(i)))
                        .collect::<Vec<_>>(),
                    proptest::collection::vec(seq_lie(), 0..3),
                    prop_oneof![Just(0i64), Just(-1), Just(1), -3i64..3],
                )
            }),
        |(start, entries, lies, offset)| {
            let mut frames: Vec<(u64, Vec<u8>)> =
                entries.iter().map(|e| (e.seq, e.encode())).collect();
            for l in &lies {
                let n = frames.len();
                if n == 0 {
                    break;
                }
                match l {
                    SeqLie::Swap(a, b) => frames.swap(a % n, b % n),
                    SeqLie::Repeat(a) => {
                        let f = frames[a % n].clone();
                        frames.insert(a % n, f);
                    }
                    SeqLie::Skip(a) => {
                        frames.remove(a % n);
                    }
                    SeqLie::Outer(a, v) => frames[a % n].0 = *v,
                    SeqLie::Inner(a, v) => {
                        if let Ok(mut e) = Entry::decode(&frames[a % n].1) {
                            e.seq = *v;
                            frames[a % n].1 = e.encode();
                        }
                    }
                    SeqLie::Bytes(a, d) => frames[a % n].1 = apply(&frames[a % n].1, d),
                }
            }
            // The mirror's next seq: where the primary started, or off by a little.
            let expected = start.saturating_add_signed(offset);
            // What the check must do, step by step.
            let mut taken = Vec::new();
            let mut failed_at = None;
            let mut next = Some(expected);
            for (seq, f) in &frames {
                match (Entry::decode(f), next) {
                    (Ok(e), Some(x)) if e.seq == *seq && *seq == x => {
                        taken.push(e);
                        // Nothing may follow u64::MAX, not even the end of the message.
                        next = x.checked_add(1);
                        if next.is_none() {
                            failed_at = Some(*seq);
                            break;
                        }
                    }
                    _ => {
                        failed_at = Some(*seq);
                        break;
                    }
                }
            }
            let want: Result<Vec<Entry>, u64> = match failed_at {
                Some(s) => Err(s),
                None => Ok(taken),
            };
            match (proto::check_entries(expected, frames.clone()), want) {
                (Ok(got), Ok(w)) => {
                    prop_assert_eq!(got.len(), frames.len());
                    for (i, e) in got.iter().enumerate() {
                        prop_assert_eq!(e.seq, expected + i as u64);
                    }
                    prop_assert_eq!(got, w);
                }
                (Err(bad), Err(at)) => {
                    let seq = match &bad {
                        BadEntries::Corrupt { seq, .. } | BadEntries::OutOfOrder { seq, .. } => {
                            *seq
                        }
                    };
                    prop_assert_eq!(seq, at, "{}", bad);
                    prop_assert!(bad.to_string().contains(&seq.to_string()));
                }
                (got, w) => prop_assert!(false, "checked {got:?}, should be {w:?}"),
            }
            Ok(())
        },
    );
}

/// A change made to a valid sequence of what a primary sends in one session.
#[derive(Debug, Clone)]
enum SessionLie {
    Swap(usize, usize),
    Drop(usize),
    Repeat(usize),
    /// The snapshot's end says this seq.
    EndAt(u64),
    /// The primary's welcome says this epoch.
    Epoch(u64),
    /// Any message, here.
    Insert(usize, ToMirror),
}

fn session_lie() -> impl Strategy<Value = SessionLie> {
    let i = || 0usize..12;
    let s = || prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..64];
    prop_oneof![
        (i(), i()).prop_map(|(a, b)| SessionLie::Swap(a, b)),
        i().prop_map(SessionLie::Drop),
        i().prop_map(SessionLie::Repeat),
        s().prop_map(SessionLie::EndAt),
        s().prop_map(SessionLie::Epoch),
        (i(), to_mirror()).prop_map(|(a, m)| SessionLie::Insert(a, m)),
    ]
}

/// The session's checks of what it receives (`mirror::received`: the welcome's epoch, the
/// snapshot's begin, pairs and end in order with an end not below its beginning, then
/// journal frames running on from the snapshot's seq), driven with valid sessions changed by
/// swaps, drops, repeats, lying seqs and epochs and foreign messages: every step the machine
/// takes is one a valid session allows (checked against the rules here), a refusal is an
/// error with a message, never a panic, and a session left as it was is taken whole.
#[test]
fn fuzz_agent_received_sequences() {
    use crate::mirror::received::{Received, Step};
    fuzz::run(
        "agent_received_sequences",
        (
            0u64..4,
            0u64..3,
            any::<bool>(),
            prop_oneof![Just(0u64), 1u64..1 << 40, Just(u64::MAX - 4)],
            0u64..5,
            0usize..3,
            0usize..4,
        )
            .prop_flat_map(|(mine, up, snap, s0, grow, pairs, n)| {
                let first = if snap { s0 + 1 } else { s0 };
                (
                    Just((mine, mine + up, snap, s0, s0 + grow, pairs)),
                    (0..n as u64).map(|i| entry(first + i)).collect::<Vec<_>>(),
                    proptest::collection::vec(session_lie(), 0..3),
                )
            }),
        |((mine, epoch, snap, s0, s_end, pairs), entries, lies)| {
            let mut msgs = Vec::new();
            if snap {
                msgs.push(ToMirror::SnapshotBegin {
                    seq: s0,
                    settings: b"{}".to_vec(),
                });
                for k in 0..pairs {
                    msgs.push(ToMirror::SnapshotPairs {
                        pairs: vec![(vec![k as u8], vec![1])],
                    });
                }
                msgs.push(ToMirror::SnapshotEnd { seq: s_end });
            }
            for e in &entries {
                msgs.push(ToMirror::Entries {
                    frames: vec![(e.seq, e.encode())],
                });
                msgs.push(ToMirror::Heartbeat {
                    head: e.seq,
                    head_time_ns: 0,
                });
            }
            let mut epoch = epoch;
            for l in &lies {
                let n = msgs.len().max(1);
                match l {
                    SessionLie::Swap(a, b) if !msgs.is_empty() => msgs.swap(a % n, b % n),
                    SessionLie::Drop(a) if !msgs.is_empty() => {
                        msgs.remove(a % n);
                    }
                    SessionLie::Repeat(a) if !msgs.is_empty() => {
                        let m = msgs[a % n].clone();
                        msgs.insert(a % n, m);
                    }
                    SessionLie::EndAt(v) => {
                        for m in msgs.iter_mut() {
                            if let ToMirror::SnapshotEnd { seq } = m {
                                *seq = *v;
                            }
                        }
                    }
                    SessionLie::Epoch(v) => epoch = *v,
                    SessionLie::Insert(a, m) => msgs.insert(a % (msgs.len() + 1), m.clone()),
                    _ => {}
                }
            }
            let expected = if snap { 0 } else { s0 };
            let mut r = match Received::new(epoch, mine, snap, expected) {
                Ok(r) => {
                    prop_assert!(epoch >= mine, "a primary at epoch {epoch} < {mine} taken");
                    r
                }
                Err(e) => {
                    prop_assert!(epoch < mine, "epoch {epoch} >= {mine} refused: {e}");
                    prop_assert!(e.to_string().contains(&epoch.to_string()));
                    return Ok(());
                }
            };
            // The rules, step by step, for what the machine takes.
            let mut begun: Option<u64> = None;
            let mut ended = !snap;
            let mut next = if snap { None } else { Some(s0) };
            let mut taken = 0usize;
            for m in msgs.clone() {
                match r.step(m) {
                    Ok(Step::SnapshotBegin { seq, .. }) => {
                        prop_assert!(snap && begun.is_none());
                        begun = Some(seq);
                    }
                    Ok(Step::SnapshotPairs { .. }) => prop_assert!(begun.is_some() && !ended),
                    Ok(Step::SnapshotEnd { s0: b, s_end: e }) => {
                        prop_assert!(!ended && begun == Some(b) && e >= b, "end {e} of {b}");
                        ended = true;
                        next = b.checked_add(1);
                    }
                    Ok(Step::Entries(batch)) => {
                        prop_assert!(ended);
                        for e in batch {
                            prop_assert_eq!(Some(e.seq), next);
                            next = e.seq.checked_add(1);
                        }
                    }
                    Ok(Step::Heartbeat { .. }) | Ok(Step::Refused { .. }) => prop_assert!(ended),
                    Err(e) => {
                        prop_assert!(!e.to_string().is_empty());
                        break;
                    }
                }
                taken += 1;
            }
            if lies.is_empty() {
                prop_assert_eq!(taken, msgs.len(), "a valid session was refused");
            }
            Ok(())
        },
    );
}

const PRIMARY_TOML: &str = include_str!("../../configs/primary.toml");
const MIRROR_TOML: &str = include_str!("../../configs/mirror.toml");

/// The agent's config (TOML, then `MIRROR_AGENT_*` variables over it): damaged text and
/// damaged variables are refused with a message that starts with what was read, never a
/// panic (a span inside a character, a key that is not valid UTF-8, ...).
#[test]
fn fuzz_agent_config() {
    assert!(Config::parse(PRIMARY_TOML).is_ok() && Config::parse(MIRROR_TOML).is_ok());
    fuzz::run(
        "agent_config",
        (
            damaged(
                prop_oneof![Just(PRIMARY_TOML), Just(MIRROR_TOML)]
                    .prop_map(|t| t.as_bytes().to_vec()),
            ),
            proptest::option::of((
                prop_oneof![
                    Just("MIRROR_AGENT_MIRROR__WINDOW"),
                    Just("MIRROR_AGENT_PRIMARY__RETAIN_MAX_AGE"),
                    Just("MIRROR_AGENT_STATE_DIR"),
                    Just("MIRROR_AGENT_MIRROR__WORKERS"),
                    Just("MIRROR_AGENT_PRIMARY__MIRRORS"),
                    Just("MIRROR_AGENT_ADMIN"),
                ],
                damaged(
                    prop_oneof![
                        Just("\"30s\""),
                        Just("8"),
                        Just("[{name = \"x\"}]"),
                        Just("127.0.0.1:1")
                    ]
                    .prop_map(|v| v.as_bytes().to_vec()),
                ),
            )),
        ),
        |((_, bad), env)| {
            let text = String::from_utf8_lossy(&bad);
            let env: Vec<(String, String)> = env
                .into_iter()
                .map(|(k, (_, v))| (k.to_string(), String::from_utf8_lossy(&v).into_owned()))
                .collect();
            if let Err(e) = Config::parse_with_env(&text, "config file t.toml", &env) {
                let s = e.to_string();
                prop_assert!(
                    s.starts_with("config file t.toml") || s.starts_with("MIRROR_AGENT_"),
                    "{s}"
                );
            }
            Ok(())
        },
    );
}
