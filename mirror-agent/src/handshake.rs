//! Both halves of the mirror handshake (see `proto` for the messages), and what a peer may
//! cost the primary before it has proven a token:
//!
//! - until authenticated, a message may be at most `PRE_AUTH_MAX_MESSAGE` bytes (a hello is
//!   a few dozen): a peer announcing a 64 MiB frame is cut off at its header, never buffered;
//! - the `Gate` bounds connections that have not authenticated yet: `PER_PEER` per source
//!   address and `MAX_PENDING` in all. Past either, the oldest connection of the busiest
//!   address is dropped, so a flood from a few hosts cannot lock a real mirror out;
//! - the whole handshake (TLS included) has `HANDSHAKE_TIMEOUT`.
//!
//! Together an unauthenticated peer can make the primary hold at most a few hundred KiB per
//! pending connection (codec buffer, TLS buffers), a few tens of MiB in all.
//!
//! The mirror's half says how it failed with an `fs_core::Error` and its status (see
//! `failure`): permanent for a refusal, temporary for a reply that is not the protocol; any
//! other error is the network. This module uses `proto`; `proto` does not know it.

use crate::proto::{self, ToMirror, ToPrimary, Want, Wire};
use anyhow::{anyhow, bail, Result};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use crate::proto::PRE_AUTH_MAX_MESSAGE;
pub const PER_PEER: usize = 16;
pub const MAX_PENDING: usize = 256;
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Unauthenticated connections in flight.
#[derive(Default)]
pub struct Gate {
    inner: Mutex<GateInner>,
}

#[derive(Default)]
struct GateInner {
    next: u64,
    /// id (in arrival order) -> (source address, its cancel token).
    pending: BTreeMap<u64, (IpAddr, CancellationToken)>,
}

impl GateInner {
    fn count(&self, ip: IpAddr) -> usize {
        self.pending.values().filter(|(a, _)| *a == ip).count()
    }
    /// Drop the oldest pending connection of `ip`.
    fn evict_oldest_of(&mut self, ip: IpAddr) -> bool {
        let id = self
            .pending
            .iter()
            .find(|(_, (a, _))| *a == ip)
            .map(|(id, _)| *id);
        match id.and_then(|id| self.pending.remove(&id)) {
            Some((_, t)) => {
                t.cancel();
                true
            }
            None => false,
        }
    }
}

impl Gate {
    /// Admit a new connection from `ip`, evicting to stay within the caps. Returns its id (for
    /// `leave`) and a token cancelled if it is evicted later, and how many were evicted now.
    pub fn admit(&self, ip: IpAddr) -> (u64, CancellationToken, usize) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut evicted = 0;
        if g.count(ip) >= PER_PEER && g.evict_oldest_of(ip) {
            evicted += 1;
        }
        if g.pending.len() >= MAX_PENDING {
            // The busiest address gives way, not whoever happens to be oldest.
            let mut per: HashMap<IpAddr, usize> = HashMap::new();
            for (a, _) in g.pending.values() {
                *per.entry(*a).or_default() += 1;
            }
            if let Some((busiest, _)) = per.into_iter().max_by_key(|(_, n)| *n) {
                if g.evict_oldest_of(busiest) {
                    evicted += 1;
                }
            }
        }
        let id = g.next;
        g.next += 1;
        let t = CancellationToken::new();
        g.pending.insert(id, (ip, t.clone()));
        (id, t, evicted)
    }

    /// The connection authenticated or ended: it no longer counts.
    pub fn leave(&self, id: u64) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .remove(&id);
    }

    pub fn pending(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .len()
    }
}

/// What the primary learns from a mirror that authenticated.
pub struct Hello {
    pub mirror: String,
    pub volume_uuid: Option<String>,
    pub want: Want,
    pub prev_crc: Option<u32>,
    pub epoch: u64,
    /// The identity of the mirror's metadata copy (empty: it has none yet).
    pub identity: String,
}

/// Why a handshake failed, for the caller's counters and log level.
#[derive(Debug)]
pub enum Failure {
    /// A registered-looking peer with a wrong token, or an unknown name (counted).
    Auth(String),
    /// Not the mirror protocol at all, or too big, or too slow (never authenticated).
    Garbage(String),
    /// The connection failed (I/O).
    Io(anyhow::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Auth(s) | Failure::Garbage(s) => f.write_str(s),
            Failure::Io(e) => write!(f, "{e:#}"),
        }
    }
}

/// A pre-auth message that is not the protocol (bad length, checksum, encoding) is garbage,
/// not damage in transit.
fn classify(e: anyhow::Error) -> Failure {
    if e.chain().any(|c| c.is::<proto::Corrupt>()) {
        Failure::Garbage(format!("not the mirror protocol: {e:#}"))
    } else {
        Failure::Io(e)
    }
}

/// How long a refused handshake waits before its answer: an unknown name and a wrong proof
/// alike, so neither the answer nor its time tells which names are registered.
#[cfg(not(test))]
pub const REFUSAL_DELAY: Duration = Duration::from_millis(200);
/// None in this crate's unit tests, whose handshake harness refuses thousands of peers (the
/// process tests run the binary, with the real delay).
#[cfg(test)]
pub const REFUSAL_DELAY: Duration = Duration::ZERO;

/// A name from a peer that has not authenticated, fit for a log line: at most 64 characters
/// (a registered name is at most 64), quoted and escaped, with how much was cut.
pub fn shown(name: &str) -> String {
    const MAX: usize = 64;
    let mut it = name.chars();
    let head: String = it.by_ref().take(MAX).collect();
    let rest = it.count();
    if rest == 0 {
        format!("{head:?}")
    } else {
        format!("{head:?}... ({rest} more characters)")
    }
}

/// At most 512 characters of what an unauthenticated peer said.
fn cut(s: &str) -> String {
    let mut it = s.chars();
    let head: String = it.by_ref().take(512).collect();
    if it.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

/// The primary's half: read the hello (any version: another one is refused naming both),
/// send the challenge, check the mirror's proof, then prove the token. An unknown name and
/// a wrong proof get the same refusal after the same delay. On success the wire accepts
/// full-size messages.
pub async fn accept(
    wire: &mut Wire,
    token_of: impl Fn(&str) -> Option<String>,
) -> Result<Hello, Failure> {
    use futures::StreamExt;
    let frame = match wire.next().await {
        None => return Err(Failure::Garbage("closed before hello".into())),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(Failure::Garbage(format!(
                "not the mirror protocol: bad frame length: {e}"
            )))
        }
        Some(Err(e)) => return Err(Failure::Io(anyhow!("receiving: {e}"))),
        Some(Ok(f)) => f,
    };
    let refuse = |reason: String| ToMirror::Refused {
        reason,
        resync: false,
    };
    match proto::hello_version(&frame) {
        None => {
            return Err(Failure::Garbage(
                "not the mirror protocol: expected a hello".into(),
            ))
        }
        Some(pv) if pv != proto::PROTO_VERSION => {
            let r = if pv < proto::PROTO_VERSION {
                format!(
                    "the mirror agent speaks protocol {pv}, this primary agent speaks {}: upgrade the mirror agent (this primary refuses older handshakes)",
                    proto::PROTO_VERSION
                )
            } else {
                format!(
                    "the mirror agent speaks protocol {pv}, this primary agent speaks {}: upgrade the primary agent",
                    proto::PROTO_VERSION
                )
            };
            let _ = proto::send(wire, &refuse(r.clone())).await;
            return Err(Failure::Garbage(r));
        }
        Some(_) => {}
    }
    let hello: ToPrimary = proto::decode(&frame).map_err(classify)?;
    let digest = proto::hello_digest(&hello);
    let ToPrimary::Hello {
        mirror,
        volume_uuid,
        nonce: nonce_m,
        want,
        prev_crc,
        epoch,
        identity,
        ..
    } = hello
    else {
        return Err(Failure::Garbage("expected a hello".into()));
    };
    // The same challenge for every name: nothing in it depends on a token.
    let nonce_p = proto::nonce();
    proto::send(wire, &ToMirror::Challenge { nonce: nonce_p })
        .await
        .map_err(Failure::Io)?;
    let auth = proto::recv::<ToPrimary, _>(wire)
        .await
        .map_err(classify)?
        .ok_or_else(|| Failure::Garbage("closed before auth".into()))?;
    let ToPrimary::Auth { mac } = auth else {
        return Err(Failure::Garbage("expected the mirror's proof".into()));
    };
    let token = token_of(&mirror);
    // An unknown name is checked against a token nobody has, so that it costs the same.
    let ok = {
        let unknown = proto::nonce().map(|b| b'a' + b % 26);
        let key = token
            .as_deref()
            .unwrap_or(std::str::from_utf8(&unknown).expect("ascii"));
        let good = proto::verify(key, "mirror", &nonce_p, &nonce_m, &digest, &mac);
        good && token.is_some()
    };
    if !ok {
        tokio::time::sleep(REFUSAL_DELAY).await;
        let _ = proto::send(wire, &refuse(proto::AUTH_FAILED.into())).await;
        return Err(Failure::Auth(match token {
            None => format!("not a registered mirror: {}", shown(&mirror)),
            Some(_) => format!("mirror {}: wrong token", shown(&mirror)),
        }));
    }
    let token = token.expect("checked");
    let proof = proto::mac(&token, "primary", &nonce_m, &nonce_p, &digest);
    proto::send(wire, &ToMirror::Proof { proof })
        .await
        .map_err(Failure::Io)?;
    wire.codec_mut().set_max_frame_length(proto::MAX_MESSAGE);
    Ok(Hello {
        mirror,
        volume_uuid,
        want,
        prev_crc,
        epoch,
        identity,
    })
}

/// What the mirror learns when the primary lets it in.
pub enum Welcome {
    /// Entries (or a snapshot) follow; the primary's head and epoch.
    In { head: u64, epoch: u64 },
    /// The primary wants a snapshot-based resync first.
    Resync(String),
}

/// How the mirror's half failed, when it is not the network: the `fs_core::Error` at the
/// root of what `connect` returned. `Permanent`: retrying soon cannot help (a wrong token, a
/// refusal, a foreign volume, a superseded primary). `Temporary` (kind `Config`): the peer's
/// first reply was not the mirror protocol; once could be damage in transit (a flipped
/// length), several times in a row the peer is something else, and the caller makes it
/// `persist()`. None: the network (retried soon).
pub fn failure(e: &anyhow::Error) -> Option<&fs_core::Error> {
    e.downcast_ref::<fs_core::Error>()
}

/// What `connect`'s error says, for a person (the handshake's own failures without their
/// retry status, which the caller acts on).
pub fn describe(e: &anyhow::Error) -> String {
    failure(e).map_or_else(|| format!("{e:#}"), |f| f.message().to_string())
}

/// A refusal that retrying soon cannot fix.
pub fn refused(msg: String) -> anyhow::Error {
    anyhow::Error::new(fs_core::Error::new(
        fs_core::ErrorKind::PermissionDenied,
        msg,
    ))
}

/// The peer answered with something that is not the mirror protocol.
fn not_primary(msg: String) -> anyhow::Error {
    anyhow::Error::new(fs_core::Error::temporary(fs_core::ErrorKind::Config, msg))
}

/// The mirror's half: hello, prove the token over the primary's challenge, check the
/// primary's proof, read the welcome. Before the primary has proven the token, replies are
/// held to the pre-auth size too, and anything that is not the protocol means the peer is
/// not a primary agent.
pub async fn connect(
    wire: &mut Wire,
    peer: &str,
    token: &str,
    hello: ToPrimary,
    read_timeout: Duration,
) -> Result<Welcome> {
    let ToPrimary::Hello { nonce: nonce_m, .. } = &hello else {
        bail!("internal: connect needs a hello");
    };
    let nonce_m = *nonce_m;
    let digest = proto::hello_digest(&hello);
    proto::send(wire, &hello).await?;
    let not_primary = |e: anyhow::Error| {
        let foreign = e.chain().any(|c| {
            c.downcast_ref::<proto::Corrupt>()
                .is_some_and(|c| c.1 == proto::Damage::Foreign)
        });
        if foreign {
            not_primary(format!(
                "{peer} is not a primary agent: it answered with something that is not the mirror protocol (check [mirror] primary: the host and the primary's `listen` port, not its admin port; if the primary serves TLS, set tls_ca)"
            ))
        } else {
            e
        }
    };
    // Before the primary has proven the token, what it says is cut short before it is shown.
    let refusal = |reason: String| {
        let reason = cut(&reason);
        let hint = if reason == proto::AUTH_FAILED {
            " (check [mirror] name, and that its token is the one the primary lists for that name)"
        } else {
            ""
        };
        refused(format!("the primary refused this mirror: {reason}{hint}"))
    };
    match recv_within(wire, read_timeout).await.map_err(not_primary)? {
        ToMirror::Challenge { nonce } => {
            let mac = proto::mac(token, "mirror", &nonce, &nonce_m, &digest);
            proto::send(wire, &ToPrimary::Auth { mac }).await?;
            match recv_within(wire, read_timeout).await.map_err(not_primary)? {
                ToMirror::Proof { proof } => {
                    if !proto::verify(token, "primary", &nonce_m, &nonce, &digest, &proof) {
                        return Err(refused(format!("authentication failed: the primary at {peer} did not prove it holds this mirror's token (the tokens differ, or this is not the primary)")));
                    }
                }
                ToMirror::Refused { reason, .. } => return Err(refusal(reason)),
                other => bail!(
                    "unexpected answer to the proof: {}",
                    proto::msg_name(&other)
                ),
            }
        }
        // Another protocol version (said in words), or an older primary's refusal.
        ToMirror::Refused { reason, .. } => {
            let reason = cut(&reason);
            let hint = if reason.starts_with("protocol version") {
                format!(
                    " (this mirror agent speaks protocol {}: upgrade the primary agent)",
                    proto::PROTO_VERSION
                )
            } else {
                String::new()
            };
            return Err(refused(format!(
                "the primary refused this mirror: {reason}{hint}"
            )));
        }
        other => bail!("unexpected first message {}", proto::msg_name(&other)),
    }
    wire.codec_mut().set_max_frame_length(proto::MAX_MESSAGE);
    match recv_within(wire, read_timeout).await? {
        ToMirror::Welcome { head, epoch, .. } => Ok(Welcome::In { head, epoch }),
        ToMirror::Refused {
            reason,
            resync: true,
        } => Ok(Welcome::Resync(reason)),
        // Only on a forward connection: the permission, not the link (EROFS at the mounts).
        ToMirror::WritesRefused { reason } => Err(anyhow::Error::new(fs_core::Error::new(
            fs_core::ErrorKind::ReadOnly,
            reason,
        ))),
        ToMirror::Refused { reason, .. } => Err(refused(format!(
            "the primary refused this mirror: {reason}"
        ))),
        other => bail!("unexpected message {}", proto::msg_name(&other)),
    }
}

/// The next message within `t`; silence or a closed connection is an error.
pub async fn recv_within<R: crate::proto::FrameStream>(s: &mut R, t: Duration) -> Result<ToMirror> {
    tokio::time::timeout(t, proto::recv::<ToMirror, _>(s))
        .await
        .map_err(|_| anyhow!("nothing from the primary for {t:?}"))?
        .and_then(|m| m.ok_or_else(|| anyhow!("the primary closed the connection")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_keeps_per_peer_and_total_caps_and_spares_a_quiet_peer() {
        let g = Gate::default();
        let flood: IpAddr = "10.0.0.1".parse().unwrap();
        let mut toks = Vec::new();
        for _ in 0..PER_PEER + 5 {
            toks.push(g.admit(flood).1);
        }
        assert_eq!(g.pending(), PER_PEER);
        assert_eq!(
            toks.iter().filter(|t| t.is_cancelled()).count(),
            5,
            "the oldest went"
        );
        assert!(toks[0].is_cancelled() && !toks[PER_PEER + 4].is_cancelled());
        // Many flooding addresses: the total stays capped and a lone peer keeps its slot.
        let (_, lone, _) = g.admit("10.9.9.9".parse().unwrap());
        for i in 0..40u8 {
            for _ in 0..PER_PEER {
                g.admit(IpAddr::from([10, 1, i, 1]));
            }
        }
        assert!(g.pending() <= MAX_PENDING);
        assert!(!lone.is_cancelled(), "the quiet peer was evicted");
    }
}
