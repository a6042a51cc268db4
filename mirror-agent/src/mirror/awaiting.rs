//! The address this mirror's site will serve as the primary once promoted (`[mirror]
//! listen`). While a mirror, the agent answers whoever greets it there with a refusal that
//! says what it is, the agent of a mirror awaiting promotion, and which copy of the metadata
//! it applies to: a digest of its identity record (`crate::site::identity`), never a name,
//! since the peer is not authenticated. `mirror-agent fence --new-primary ADDR --moved-to
//! META` of a planned move checks that the agent answering at ADDR is the one of META
//! (`crate::promote`); a fence naming the wrong mirror, or an address where nothing will
//! serve, is refused before it pauses any writer.
//!
//! What a peer can make it hold is bounded: `MAX_PEERS` connections answered at a time (the
//! rest are closed at once), each for at most `ANSWER_WITHIN`, reading one pre-authentication
//! frame at most.

use crate::proto::{self, ToMirror, ToPrimary};
use anyhow::{Context, Result};
use sha2::Digest;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a refusal from a mirror awaiting promotion starts; the digest follows.
pub const AWAITING: &str =
    "not a primary yet: the agent of a mirror awaiting promotion answers here, metadata ";

const MAX_PEERS: usize = 16;
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The digest of a metadata copy's identity that the agent answers with.
pub fn digest(identity: &str) -> String {
    let h = sha2::Sha256::digest(format!("jfs-awaiting-promotion:{identity}").as_bytes());
    h.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// The digest in a refusal's reason, when it is a mirror's answer.
pub fn answered_digest(reason: &str) -> Option<&str> {
    reason
        .strip_prefix(AWAITING)
        .and_then(|r| r.split_whitespace().next())
}

/// Bind `addr` (a start fails here when it cannot: another process holds it).
pub(super) async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("[mirror] listen = {addr}: binding the address this site's primary agent will serve once promoted (is something else listening there?)")
    })
}

/// Answer every greeting on `l` until `stop`.
pub(super) async fn serve(l: tokio::net::TcpListener, identity: String, stop: CancellationToken) {
    let reason = format!(
        "{AWAITING}{} (it serves as the primary here once promoted)",
        digest(&identity)
    );
    let peers = Arc::new(tokio::sync::Semaphore::new(MAX_PEERS));
    loop {
        let sock = tokio::select! {
            _ = stop.cancelled() => return,
            r = l.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "accepting on [mirror] listen");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = peers.clone().try_acquire_owned() else {
            continue;
        };
        let reason = reason.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut w = proto::wire(Box::new(sock));
            let _ = tokio::time::timeout(ANSWER_WITHIN, async {
                if let Ok(Some(_)) = proto::recv::<ToPrimary, _>(&mut w).await {
                    let r = ToMirror::Refused {
                        reason,
                        resync: false,
                    };
                    let _ = proto::send(&mut w, &r).await;
                }
            })
            .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_carries_the_digest_of_the_identity_and_nothing_else_reads_as_one() {
        let d = digest("00112233445566778899aabbccddeeff");
        assert_eq!(d.len(), 24);
        assert_ne!(d, digest("00112233445566778899aabbccddeefe"));
        let reason = format!("{AWAITING}{d} (it serves as the primary here once promoted)");
        assert_eq!(answered_digest(&reason), Some(d.as_str()));
        assert_eq!(answered_digest("authentication failed"), None);
        assert_eq!(answered_digest(AWAITING), None);
    }
}
