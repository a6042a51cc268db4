//! The replication protocol between a mirror agent and the primary agent, over TCP (TLS when
//! configured). Every message is one length-delimited frame (at most `MAX_MESSAGE`) holding
//! `[crc32c u32 LE][postcard message]`, the message and nothing after it; a bad checksum or
//! an undecodable message ends the connection and the mirror reconnects from its applied
//! sequence number. Journal entries travel as the journal's own frames (version + CRC32C),
//! checked again before apply, with their seqs (`check_entries`: consecutive from the next
//! one expected, or the whole message is refused). The harnesses of all of it are in
//! `fuzz_tests`.
//!
//! Handshake (protocol 3; mutual proof of the per-mirror token, which never crosses the
//! wire; the connecting side proves first, so a peer that knows no token learns nothing it
//! could test guesses of the token against):
//! 1. mirror -> `Hello { proto, mirror, nonce_m, want, .., identity }`; `proto` is the first
//!    field of the first variant in every version, so a primary reads it from any peer and
//!    answers another version with a `Refused` naming both (`Refused` keeps its place too);
//! 2. primary -> `Challenge { nonce_p }`, whatever the name (nothing in it depends on the
//!    token or on the name being registered);
//! 3. mirror -> `Auth { mac = mac(token, "mirror", nonce_p, nonce_m, hello) }`;
//! 4. primary: an unknown name or a wrong MAC -> the same `Refused` ("authentication
//!    failed"), byte for byte, after the same delay; else -> `Proof { mac(token, "primary",
//!    nonce_m, nonce_p, hello) }`, which the mirror checks before it takes anything else;
//! 5. primary -> `Welcome` then entries (or a snapshot first), or `Refused`.
//!
//! `hello` in the MACs is the SHA-256 of the hello as sent, so its fields (name, wants,
//! identity) cannot be changed on the way without the token.
//!
//! A second connection with `want = Forward` (a mirror the primary lets write) carries no
//! journal: `Commit { id, req }` one way, `Forwarded { id, reply }` back, many in flight. A
//! mirror the primary does not let write gets `WritesRefused` instead of `Welcome`.
//!
//! This module knows only the messages and their framing; `handshake` (which uses it) runs
//! the exchange above.

use anyhow::{anyhow, Result};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// 2: the hello and the welcome carry the primary epoch each side has seen. 3: the mirror
/// proves the token first (`Challenge` carries no proof; `Proof` follows a good `Auth`), and
/// the hello carries the mirror's metadata identity.
pub const PROTO_VERSION: u32 = 3;
pub const MAX_MESSAGE: usize = 64 << 20;
/// The largest message a peer may send before it has proven its token (a hello is a few
/// dozen bytes): see `handshake`.
pub const PRE_AUTH_MAX_MESSAGE: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Want {
    /// Stream entries from this sequence number on.
    From(u64),
    /// Send a snapshot first, then the entries after it.
    Snapshot,
    /// No journal: this connection carries changes made by mounts at the mirror site, for
    /// the primary to commit (`ToPrimary::Commit`), when the primary lets the mirror write.
    Forward,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToPrimary {
    Hello {
        proto: u32,
        mirror: String,
        /// The volume the mirror already holds (None when empty).
        volume_uuid: Option<String>,
        nonce: [u8; 32],
        want: Want,
        /// With `Want::From(s)`: CRC32C of the mirror's own journal frame at `s - 1`, so the
        /// primary can tell that both histories agree up to there.
        prev_crc: Option<u32>,
        /// The primary epoch the mirror's metadata holds (`fs_core::site::Epoch`).
        epoch: u64,
        /// The identity of the mirror's metadata copy (`crate::site::identity`; empty when it
        /// has none yet): the primary's slot records the copy that acknowledges into it and
        /// refuses another one under the same name. Last, so that an older primary still
        /// reads `proto` and refuses the version.
        identity: String,
    },
    Auth {
        mac: Vec<u8>,
    },
    /// Everything up to `seq` is durably applied at the mirror.
    Ack {
        seq: u64,
    },
    /// On a `Want::Forward` connection: a change made by a mount at the mirror site, with
    /// what it read; answered by `ToMirror::Forwarded` with the same `id`.
    Commit {
        id: u64,
        req: fs_core::CommitRequest,
    },
    /// On a `Want::Forward` connection, every few seconds: the session records (JSON, as
    /// stored) of the writing mounts at the mirror's site; the primary keeps them as its own
    /// while they come, so what those mounts hold open after an unlink is not reaped.
    Sessions {
        records: Vec<Vec<u8>>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToMirror {
    /// The primary's nonce; the same for every name, registered or not.
    Challenge {
        nonce: [u8; 32],
    },
    /// Keeps its place (variant 1) in every version: the answer to a hello of another one.
    Refused {
        reason: String,
        /// The mirror must bootstrap from a snapshot to continue.
        resync: bool,
    },
    Welcome {
        volume_uuid: String,
        head: u64,
        /// The primary's epoch: a mirror that has seen a newer one refuses this primary.
        epoch: u64,
    },
    /// Raw journal frames, consecutive sequence numbers.
    Entries {
        frames: Vec<(u64, Vec<u8>)>,
    },
    /// Sent when idle: the primary's head and its commit time.
    Heartbeat {
        head: u64,
        head_time_ns: i64,
    },
    /// A snapshot of the key space at (or after) `seq` follows; `settings` is the volume's
    /// settings record, so blocks can be queued while pairs arrive.
    SnapshotBegin {
        seq: u64,
        settings: Vec<u8>,
    },
    SnapshotPairs {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// The snapshot is complete; the state it holds is consistent once entries up to `seq`
    /// have been applied on top of it.
    SnapshotEnd {
        seq: u64,
    },
    /// The answer to `ToPrimary::Commit { id, .. }`.
    Forwarded {
        id: u64,
        reply: volume::forward::ForwardReply,
    },
    /// Instead of `Welcome` on a `Want::Forward` connection: this primary does not let the
    /// mirror write (its config). Any other refusal there (a fenced or superseded primary, a
    /// mirror behind a promotion) is a `Refused`: the link is down, not the permission.
    WritesRefused {
        reason: String,
    },
    /// After a good `Auth`: the primary's proof of the token.
    Proof {
        proof: Vec<u8>,
    },
}

/// The answer to an unknown name and to a wrong MAC alike.
pub const AUTH_FAILED: &str = "authentication failed";

fn hmac(token: &str, role: &str, a: &[u8; 32], b: &[u8; 32], hello: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    m.update(b"jfs-mirror-v3\0");
    m.update(role.as_bytes());
    m.update(b"\0");
    m.update(a);
    m.update(b);
    m.update(hello);
    m
}

/// The proof of `token` by `role` over both nonces and the hello's digest (`hello_digest`).
pub fn mac(token: &str, role: &str, a: &[u8; 32], b: &[u8; 32], hello: &[u8; 32]) -> Vec<u8> {
    hmac(token, role, a, b, hello)
        .finalize()
        .into_bytes()
        .to_vec()
}

/// Constant-time check of a MAC.
pub fn verify(
    token: &str,
    role: &str,
    a: &[u8; 32],
    b: &[u8; 32],
    hello: &[u8; 32],
    got: &[u8],
) -> bool {
    hmac(token, role, a, b, hello).verify_slice(got).is_ok()
}

/// The SHA-256 of a hello's encoding (its postcard body, as sent), bound into both MACs.
pub fn hello_digest(hello: &ToPrimary) -> [u8; 32] {
    use sha2::Digest;
    let body = postcard::to_allocvec(hello).expect("messages serialize");
    Sha256::digest(&body).into()
}

/// The protocol version of a hello from a peer of any version (the first field of the first
/// variant in all of them), without decoding the rest: None if the frame is not a hello.
pub fn hello_version(frame: &[u8]) -> Option<u32> {
    let body = frame.get(4..)?;
    match postcard::take_from_bytes::<(u32, u32)>(body) {
        Ok(((0, v), _)) => Some(v),
        _ => None,
    }
}

pub fn nonce() -> [u8; 32] {
    rand::random()
}

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub type Wire = Framed<Box<dyn Io>, LengthDelimitedCodec>;

/// A framed connection. It starts with the small pre-authentication message limit; the
/// handshake raises it to `MAX_MESSAGE` once the peer has proven its token.
pub fn wire(io: Box<dyn Io>) -> Wire {
    LengthDelimitedCodec::builder()
        .max_frame_length(PRE_AUTH_MAX_MESSAGE)
        .new_framed(io)
}

/// A message's name, for logs.
pub fn msg_name(m: &ToMirror) -> &'static str {
    match m {
        ToMirror::Challenge { .. } => "challenge",
        ToMirror::Refused { .. } => "refused",
        ToMirror::Welcome { .. } => "welcome",
        ToMirror::Entries { .. } => "entries",
        ToMirror::Heartbeat { .. } => "heartbeat",
        ToMirror::SnapshotBegin { .. } => "snapshot-begin",
        ToMirror::SnapshotPairs { .. } => "snapshot-pairs",
        ToMirror::SnapshotEnd { .. } => "snapshot-end",
        ToMirror::Forwarded { .. } => "forwarded",
        ToMirror::WritesRefused { .. } => "writes-refused",
        ToMirror::Proof { .. } => "proof",
    }
}

pub fn encode<T: Serialize>(msg: &T) -> Bytes {
    let body = postcard::to_allocvec(msg).expect("messages serialize");
    let mut b = BytesMut::with_capacity(body.len() + 4);
    b.put_u32_le(crc32c::crc32c(&body));
    b.put_slice(&body);
    b.freeze()
}

/// What was wrong with a message that could not be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The checksum does not match, or it is too short: damaged in transit.
    Transit,
    /// A length over the limit, or a body that checks out but does not decode: not this
    /// protocol (or not this version of it) at all.
    Foreign,
}

/// A message that arrived damaged (bad checksum, bad length, undecodable).
#[derive(Debug)]
pub struct Corrupt(pub String, pub Damage);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "corrupt message: {}", self.0)
    }
}
impl std::error::Error for Corrupt {}

pub fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T> {
    if frame.len() < 4 {
        return Err(Corrupt(
            format!("{} bytes is too short", frame.len()),
            Damage::Transit,
        )
        .into());
    }
    let (crc, body) = frame.split_at(4);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc32c::crc32c(body) != want {
        return Err(Corrupt(
            "checksum mismatch (damaged in transit)".into(),
            Damage::Transit,
        )
        .into());
    }
    // One message a frame, and nothing after it: bytes left over are not this protocol's
    // (postcard's `from_bytes` alone would ignore them).
    match postcard::take_from_bytes(body) {
        Ok((m, [])) => Ok(m),
        Ok((_, rest)) => Err(Corrupt(
            format!("{} bytes after the message", rest.len()),
            Damage::Foreign,
        )
        .into()),
        Err(e) => Err(Corrupt(format!("undecodable: {e}"), Damage::Foreign).into()),
    }
}

/// Why the entries of an `Entries` message were not taken (see `check_entries`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadEntries {
    /// The frame sent under `seq` does not decode (its version or CRC32C): `why`.
    Corrupt { seq: u64, why: String },
    /// The frame sent under `seq` holds entry `entry_seq` where `expected` was due next: a
    /// seq that goes back, repeats or jumps, or an entry sent under another's seq.
    OutOfOrder {
        seq: u64,
        entry_seq: u64,
        expected: u64,
    },
}

impl std::fmt::Display for BadEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadEntries::Corrupt { seq, why } => write!(f, "corrupt frame at seq {seq}: {why}"),
            BadEntries::OutOfOrder {
                seq,
                entry_seq,
                expected,
            } => write!(
                f,
                "frame {seq} (holding entry {entry_seq}) where {expected} was expected"
            ),
        }
    }
}

/// The entries of one `Entries` message, checked before any of them is applied: every frame
/// decodes (version, CRC32C), holds the entry of the seq it is sent under, and that seq is the
/// next one (`expected` first, then each one after the previous). A seq that goes back,
/// repeats or jumps refuses the whole message: the session ends and the mirror asks again
/// from what it has applied. At most `frames.len()` entries are allocated (each frame's own
/// decode is bounded by its bytes).
pub fn check_entries(
    expected: u64,
    frames: Vec<(u64, Vec<u8>)>,
) -> std::result::Result<Vec<fs_core::Entry>, BadEntries> {
    let mut next = expected;
    let mut batch = Vec::with_capacity(frames.len());
    for (seq, f) in frames {
        let e = fs_core::Entry::decode(&f).map_err(|err| BadEntries::Corrupt {
            seq,
            why: err.to_string(),
        })?;
        if e.seq != seq || seq != next {
            return Err(BadEntries::OutOfOrder {
                seq,
                entry_seq: e.seq,
                expected: next,
            });
        }
        // The seq after u64::MAX does not exist: nothing may follow it.
        next = next.checked_add(1).ok_or(BadEntries::OutOfOrder {
            seq,
            entry_seq: e.seq,
            expected: next,
        })?;
        batch.push(e);
    }
    Ok(batch)
}

/// The half of a connection that frames are written to.
pub trait FrameSink: futures::Sink<Bytes, Error = std::io::Error> + Unpin {}
impl<T: futures::Sink<Bytes, Error = std::io::Error> + Unpin> FrameSink for T {}

/// The half of a connection that frames are read from.
pub trait FrameStream: futures::Stream<Item = std::io::Result<BytesMut>> + Unpin {}
impl<T: futures::Stream<Item = std::io::Result<BytesMut>> + Unpin> FrameStream for T {}

pub async fn send<T: Serialize, S: FrameSink>(sink: &mut S, msg: &T) -> Result<()> {
    sink.send(encode(msg))
        .await
        .map_err(|e| anyhow!("sending: {e}"))
}

/// The next message, or None at a clean end of stream.
pub async fn recv<T: DeserializeOwned, S: FrameStream>(stream: &mut S) -> Result<Option<T>> {
    match stream.next().await {
        None => Ok(None),
        // The codec rejects a length over MAX_MESSAGE: a damaged length prefix.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(Corrupt(format!("bad frame length: {e}"), Damage::Foreign).into())
        }
        Some(Err(e)) => Err(anyhow!("receiving: {e}")),
        Some(Ok(f)) => decode(&f).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_corruption_is_caught() {
        let m = ToMirror::Entries {
            frames: vec![(7, vec![1, 2, 3])],
        };
        let b = encode(&m);
        assert_eq!(decode::<ToMirror>(&b).unwrap(), m);
        for i in 0..b.len() {
            let mut c = b.to_vec();
            c[i] ^= 0x40;
            assert!(
                decode::<ToMirror>(&c).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    /// A frame holds one message and nothing else: bytes after it (rightly checksummed, so
    /// not damage in transit) mean the peer is not this protocol, and the message is refused.
    #[test]
    fn a_message_with_bytes_after_it_is_refused() {
        let proof = ToMirror::Proof { proof: vec![9; 32] };
        let mut body = postcard::to_allocvec(&proof).unwrap();
        body.push(0);
        let mut frame = crc32c::crc32c(&body).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        let e = decode::<ToMirror>(&frame).unwrap_err();
        let c = e.downcast_ref::<Corrupt>().expect("a corrupt message");
        assert_eq!(c.1, Damage::Foreign);
        assert!(c.0.contains("1 bytes after the message"), "{}", c.0);
        assert_eq!(decode::<ToMirror>(&encode(&proof)).unwrap(), proof);
    }

    #[test]
    fn macs_bind_token_role_nonces_and_hello() {
        let (a, b, h) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let t = "secret-token-0123456789";
        let m = mac(t, "mirror", &a, &b, &h);
        assert!(verify(t, "mirror", &a, &b, &h, &m));
        assert!(!verify("secret-token-0123456788", "mirror", &a, &b, &h, &m));
        assert!(!verify(t, "primary", &a, &b, &h, &m));
        assert!(!verify(t, "mirror", &b, &a, &h, &m));
        assert!(!verify(t, "mirror", &a, &b, &[4u8; 32], &m));
    }

    /// A hello of protocol 2 (the release before) still shows its version, so the primary
    /// can answer it with a refusal that release reads.
    #[test]
    fn the_version_of_an_older_hello_is_read_and_the_refusal_keeps_its_place() {
        #[derive(Serialize)]
        enum V2 {
            Hello {
                proto: u32,
                mirror: String,
                volume_uuid: Option<String>,
                nonce: [u8; 32],
                want: Want,
                prev_crc: Option<u32>,
                epoch: u64,
            },
        }
        let old = encode(&V2::Hello {
            proto: 2,
            mirror: "eu".into(),
            volume_uuid: None,
            nonce: [7; 32],
            want: Want::Snapshot,
            prev_crc: None,
            epoch: 0,
        });
        assert_eq!(hello_version(&old), Some(2));
        let ours = encode(&ToPrimary::Hello {
            proto: PROTO_VERSION,
            mirror: "eu".into(),
            volume_uuid: None,
            nonce: [7; 32],
            want: Want::Snapshot,
            prev_crc: None,
            epoch: 0,
            identity: "x".into(),
        });
        assert_eq!(hello_version(&ours), Some(PROTO_VERSION));
        assert_eq!(hello_version(&encode(&ToPrimary::Ack { seq: 1 })), None);
        // The refusal as protocol 2 decodes it: variant 1, { reason, resync }.
        #[derive(Deserialize, Debug, PartialEq)]
        enum OldToMirror {
            Challenge { nonce: [u8; 32], proof: Vec<u8> },
            Refused { reason: String, resync: bool },
        }
        let r = encode(&ToMirror::Refused {
            reason: "upgrade".into(),
            resync: false,
        });
        assert_eq!(
            decode::<OldToMirror>(&r).unwrap(),
            OldToMirror::Refused {
                reason: "upgrade".into(),
                resync: false
            }
        );
    }
}
