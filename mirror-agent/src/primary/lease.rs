//! The lease: an aux record beside the volume naming the primary agent that keeps its slots
//! (its admin address, pid, host), refreshed every `LEASE_EVERY` and removed at a clean stop.
//! `mirror-agent slot drop` reads it to go through the running agent. A `Versioned` record:
//! a lease written by a newer release is refused, never taken for absent.
//!
//! One primary agent per volume: at its start an agent refuses to serve while another one's
//! lease is alive (it still beats: seen to change within `LEASE_STALE`; on this host, its
//! process is there), naming it; and an agent that finds at a beat another live lease
//! written by an agent that started earlier stops, so two started at once do not both
//! serve.

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
    /// Where it serves mirrors (its `listen`).
    pub listen: Option<String>,
    /// This run of the agent (random), and when it started: the earlier of two keeps the
    /// volume.
    pub instance: String,
    pub started_ns: i64,
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

impl Lease {
    /// Who holds it, for a message.
    pub fn describe(&self) -> String {
        format!(
            "the primary agent of pid {} on host {}{}{}",
            self.pid,
            self.host,
            self.listen
                .as_ref()
                .map_or(String::new(), |l| format!(", serving mirrors on {l}")),
            self.admin
                .as_ref()
                .map_or(String::new(), |a| format!(", admin {a}"))
        )
    }
}

/// The lease record beside the volume, if any.
async fn read(engine: &dyn Engine) -> Result<Option<Lease>> {
    let Some(v) = fs_core::site::aux_exact(engine, LEASE).await? else {
        return Ok(None);
    };
    Ok(Some(record::decode::<Lease>(&v)?))
}

/// Whether process `pid` exists on this host.
fn alive_here(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl Primary {
    /// Refuse to start while another primary agent serves this volume (its lease is alive),
    /// then take the lease. An agent on this host whose process is gone, or one whose lease
    /// stops changing, is gone: its lease is taken over.
    pub async fn take_lease(&self) -> Result<()> {
        let me = fs_core::retry::hostname();
        let mut seen: Option<Lease> = None;
        let t0 = tokio::time::Instant::now();
        loop {
            let Some(l) = read(&*self.engine).await? else {
                break;
            };
            if l.instance == self.instance {
                break;
            }
            let Some(l) = l.live(fs_core::now_ns()) else {
                break;
            };
            if l.host == me && (l.pid == std::process::id() as u64 || !alive_here(l.pid)) {
                break; // this host's agent, killed: its lease lingers
            }
            let beating = seen.as_ref().is_some_and(|s| s.beat_ns != l.beat_ns)
                || (l.host == me && seen.is_none());
            if beating {
                bail!(
                    "another primary agent serves this volume ({}): it holds the lease `{LEASE}` beside {} and beats; one primary agent per volume: stop that one first (or point this one at another volume)",
                    l.describe(),
                    self.engine.display_url()
                );
            }
            if t0.elapsed() > LEASE_STALE {
                break;
            }
            if seen.is_none() {
                tracing::info!(holder = %l.describe(), "a lease of another primary agent is recent: waiting a few seconds to see whether it is alive");
            }
            seen = Some(l);
            tokio::time::sleep(LEASE_EVERY).await;
        }
        // Taken over (not through `beat`, which would stop this agent for the lease of the
        // earlier one found gone just now).
        let admin = *self.admin.lock().unwrap_or_else(|p| p.into_inner());
        self.write_lease(admin).await
    }

    /// Tell `slot drop` in other processes that this agent keeps the slots (so they go
    /// through it): an aux record refreshed every few seconds, removed at a clean stop. A
    /// live lease of another agent that started before this one stops this one.
    pub(super) async fn beat(&self, admin: Option<std::net::SocketAddr>) -> Result<()> {
        if let Some(l) = read(&*self.engine).await? {
            let older =
                (l.started_ns, l.instance.as_str()) < (self.started_ns, self.instance.as_str());
            if l.instance != self.instance && older && l.clone().live(fs_core::now_ns()).is_some() {
                let why = format!(
                    "another primary agent serves this volume ({}), started before this one: this one stops (one primary agent per volume)",
                    l.describe()
                );
                self.halt(anyhow!(why.clone()));
                bail!(why);
            }
        }
        self.write_lease(admin).await
    }

    /// Write this agent's lease.
    async fn write_lease(&self, admin: Option<std::net::SocketAddr>) -> Result<()> {
        let rec = Lease {
            admin: admin.map(|a| a.to_string()),
            pid: std::process::id() as u64,
            host: fs_core::retry::hostname(),
            beat_ns: fs_core::now_ns(),
            listen: Some(self.cfg.listen.to_string()),
            instance: self.instance.clone(),
            started_ns: self.started_ns,
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
                ..Default::default()
            }
        );
        assert!(l.clone().live(l.beat_ns + 1_000_000_000).is_some());
        assert!(l.clone().live(l.beat_ns + 11_000_000_000).is_none());
        assert_eq!(record::decode::<Lease>(&record::encode(&l)).unwrap(), l);
        let e = record::decode::<Lease>(br#"{"version":2,"beat_ns":1}"#).unwrap_err();
        assert_eq!(e.kind(), fs_core::ErrorKind::UnsupportedVersion);
    }
}
