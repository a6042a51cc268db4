//! The lease: an aux record beside the volume naming the primary agent that keeps its slots
//! (its admin address, pid, host), refreshed every `LEASE_EVERY` and removed at a clean stop.
//! `mirror-agent slot drop` reads it to go through the running agent.

use super::*;

/// The aux record naming the primary agent that keeps this volume's slots.
pub const LEASE: &str = "primary.agent";
pub(super) const LEASE_EVERY: Duration = Duration::from_secs(2);
/// A lease older than this belongs to an agent that is gone.
pub const LEASE_STALE: Duration = Duration::from_secs(10);

impl Primary {
    /// Tell `slot drop` in other processes that this agent keeps the slots (so they go
    /// through it): an aux record refreshed every few seconds, removed at a clean stop.
    pub(super) async fn beat(&self, admin: Option<std::net::SocketAddr>) -> Result<()> {
        let rec = serde_json::json!({
            "version": 1,
            "admin": admin.map(|a| a.to_string()),
            "pid": std::process::id(),
            "host": fs_core::retry::hostname(),
            "beat_ns": fs_core::now_ns(),
        });
        self.engine
            .aux_put(LEASE, Some(rec.to_string().as_bytes()))
            .await?;
        Ok(())
    }
}
