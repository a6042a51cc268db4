//! The lease: an aux record beside the volume naming the primary agent that keeps its slots
//! (its admin address, pid, host), refreshed every `LEASE_EVERY` and removed at a clean stop.
//! `mirror-agent slot drop` reads it to go through the running agent. A `Versioned` record:
//! a lease written by a newer release is refused, never taken for absent.

use super::*;
use fs_core::record::{self, Versioned};
use serde::{Deserialize, Serialize};

/// The aux record naming the primary agent that keeps this volume's slots.
pub const LEASE: &str = "primary.agent";
pub(super) const LEASE_EVERY: Duration = Duration::from_secs(2);
/// A lease older than this belongs to an agent that is gone.
pub const LEASE_STALE: Duration = Duration::from_secs(10);

/// The lease record: who keeps the slots, and when it last said so.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lease {
    /// The agent's admin address (where `slot drop` sends the drop).
    pub admin: Option<String>,
    pub pid: u64,
    pub host: String,
    /// When it was last refreshed (ns since the epoch).
    pub beat_ns: i64,
}

impl Versioned for Lease {
    const KIND: &'static str = "the primary agent's lease record";
    const VERSION: u32 = 1;
}

impl Lease {
    /// The lease of a live agent (refreshed within `LEASE_STALE`), or None.
    pub fn live(self, now_ns: i64) -> Option<Lease> {
        (now_ns.saturating_sub(self.beat_ns) <= LEASE_STALE.as_nanos() as i64).then_some(self)
    }
}

impl Primary {
    /// Tell `slot drop` in other processes that this agent keeps the slots (so they go
    /// through it): an aux record refreshed every few seconds, removed at a clean stop.
    pub(super) async fn beat(&self, admin: Option<std::net::SocketAddr>) -> Result<()> {
        let rec = Lease {
            admin: admin.map(|a| a.to_string()),
            pid: std::process::id() as u64,
            host: fs_core::retry::hostname(),
            beat_ns: fs_core::now_ns(),
        };
        self.engine
            .aux_put(LEASE, Some(&record::encode(&rec)))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease as the previous release wrote it reads; a newer one is refused.
    #[test]
    fn a_lease_of_today_reads_and_a_newer_one_is_refused() {
        let today = br#"{"admin":"127.0.0.1:9567","beat_ns":1700000000000000000,"host":"eu-1","pid":4242,"version":1}"#;
        let l = record::decode::<Lease>(today).unwrap();
        assert_eq!(
            l,
            Lease {
                admin: Some("127.0.0.1:9567".into()),
                pid: 4242,
                host: "eu-1".into(),
                beat_ns: 1_700_000_000_000_000_000,
            }
        );
        assert!(l.clone().live(l.beat_ns + 1_000_000_000).is_some());
        assert!(l.clone().live(l.beat_ns + 11_000_000_000).is_none());
        assert_eq!(record::decode::<Lease>(&record::encode(&l)).unwrap(), l);
        let e = record::decode::<Lease>(br#"{"version":2,"beat_ns":1}"#).unwrap_err();
        assert_eq!(e.kind(), fs_core::ErrorKind::UnsupportedVersion);
    }
}
