//! The primary role: registers a replication slot per configured mirror, authenticates
//! mirrors, streams the journal to each from the sequence number it asks for (or a snapshot
//! first), records their acknowledgements in the slots, enforces the retention cap and trims
//! the journal behind the slowest active mirror.
//!
//! By concern: `forward` (the changes of mounts at mirrors allowed to write), `slot_keeping` (registering, acknowledging, dropping, the retention cap), `stream`
//! (one mirror's connection: the handshake, the checks of where it resumes, the journal),
//! `snapshot` (a snapshot for a mirror that starts over), `lease` (the record that tells
//! other processes this agent keeps the slots), `maintenance` (the background work: status,
//! the lease, the retention cap and the journal trim). Here the agent's state, its start and
//! its accept loop; on shutdown it stops accepting, cancels the connections (each persists
//! the acknowledgements it holds), stops the workers, and removes the lease last.
//!
//! Invariants: a slot is written only here, under `slot_lock` (an acknowledgement never
//! brings a dropped slot back); one live connection per mirror (a newer one cancels the
//! older); the journal is trimmed only behind the slowest active slot.

mod forward;
mod lease;
mod maintenance;
mod refusals;
mod slot_keeping;
mod snapshot;
mod stream;

pub use lease::{Lease, LEASE, LEASE_STALE};

use crate::config::PrimaryConfig;
use crate::handshake;
use crate::metrics::{label, Metrics};
use crate::proto::{self, ToMirror, ToPrimary, Want};
use anyhow::{anyhow, bail, Context, Result};
use background::Supervisor;
use fs_core::engine::Engine;
use fs_core::slots::{self, Slot, SlotState};
use fs_core::{keys, Entry, ErrorKind};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Primary {
    cfg: PrimaryConfig,
    engine: Arc<dyn Engine>,
    tokens: HashMap<String, String>,
    metrics: Arc<Metrics>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    uuid: String,
    /// The volume's store URL (where the metadata backups go).
    storage: String,
    /// One live connection per mirror: a newer one cancels the older.
    conns: std::sync::Mutex<HashMap<String, (u64, CancellationToken)>>,
    next_conn: AtomicU64,
    slot_lock: tokio::sync::Mutex<()>,
    /// Connections that have not authenticated yet.
    gate: handshake::Gate,
    /// The log lines of their refusals (summed up).
    refusals: refusals::Refusals,
    /// The admin address, recorded in the lease.
    admin: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// Slots whose series are exported.
    seen_slots: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One status refresh at a time: one that listed the slots before a `slot drop` must
    /// not put the dropped slot's series back after the drop's own refresh.
    refreshing: tokio::sync::Mutex<()>,
    /// Runs the background work (`maintenance`).
    workers: Arc<Supervisor>,
    /// Woken when a mirror's change was committed here (`forward`): the streams look now.
    committed_here: tokio::sync::Notify,
    /// This run (the lease's `instance`) and its start.
    instance: String,
    started_ns: i64,
    /// Cancelled when the agent must stop by itself (`fatal` says why): another primary
    /// agent serves the volume.
    halted: CancellationToken,
    fatal: std::sync::Mutex<Option<anyhow::Error>>,
}

/// How long the workers may take to stop (each finishes the step it is in).
const DRAIN: Duration = Duration::from_secs(10);

#[async_trait::async_trait]
impl crate::admin::SlotAdmin for Primary {
    async fn drop_slot(&self, name: &str) -> anyhow::Result<String> {
        Primary::drop_slot(self, name).await
    }
}

impl Primary {
    pub async fn new(
        cfg: PrimaryConfig,
        engine: Arc<dyn Engine>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>> {
        let mut tokens = HashMap::new();
        for m in &cfg.mirrors {
            tokens.insert(
                m.name.clone(),
                m.secret().load(&format!("mirror {:?}", m.name))?,
            );
        }
        let tls = match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(c), Some(k)) => Some(crate::tls::acceptor(c, k)?),
            _ => None,
        };
        let settings_raw = engine.get(keys::SETTING).await?.ok_or_else(|| {
            anyhow!(
                "{} holds no formatted volume: run `jfs format` first",
                engine.display_url()
            )
        })?;
        let settings: fs_core::Settings =
            serde_json::from_slice(&settings_raw).context("the volume's settings do not decode")?;
        // Where the blocks are now (a cutover may have moved them): the backups go there.
        let storage = match fs_core::storage::current(&*engine, &settings.storage).await {
            Ok(fs_core::storage::StorageState {
                phase: fs_core::storage::Phase::Single { store },
                ..
            }) => store,
            _ => settings.storage.clone(),
        };
        Ok(Arc::new(Primary {
            cfg,
            engine,
            tokens,
            metrics,
            tls,
            uuid: settings.uuid,
            storage,
            conns: Default::default(),
            next_conn: AtomicU64::new(1),
            slot_lock: tokio::sync::Mutex::new(()),
            gate: handshake::Gate::default(),
            refusals: Default::default(),
            admin: Default::default(),
            seen_slots: Default::default(),
            refreshing: Default::default(),
            workers: Arc::new(Supervisor::new(CancellationToken::new())),
            committed_here: tokio::sync::Notify::new(),
            instance: format!("{:032x}", rand::random::<u128>()),
            started_ns: fs_core::now_ns(),
            halted: CancellationToken::new(),
            fatal: Default::default(),
        }))
    }

    /// The supervisor of this agent's workers, for `status`.
    pub fn workers(&self) -> Arc<Supervisor> {
        self.workers.clone()
    }

    /// Stop the agent by itself, for `why`.
    pub(super) fn halt(&self, why: anyhow::Error) {
        tracing::error!(error = %format!("{why:#}"), "the primary agent stops");
        self.fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.halted.cancel();
    }

    /// Record the admin address (for the lease that `slot drop` reads).
    pub fn set_admin(&self, a: std::net::SocketAddr) {
        *self.admin.lock().unwrap_or_else(|p| p.into_inner()) = Some(a);
    }

    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        // Also cancelled when this agent halts by itself.
        let stop = stop.child_token();
        self.register_slots().await?;
        let listener = TcpListener::bind(self.cfg.listen)
            .await
            .with_context(|| format!("listening on {}", self.cfg.listen))?;
        tracing::info!(listen = %self.cfg.listen, tls = self.tls.is_some(), mirrors = self.tokens.len(), "primary agent serving the journal");
        maintenance::start(&self);
        // Each mirror's connection is a task of its own, tracked so that shutdown waits for
        // it to persist the acknowledgements it holds.
        let connections = tokio_util::task::TaskTracker::new();
        loop {
            let (sock, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.halted.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let me = self.clone();
            let stop = stop.clone();
            connections.spawn(async move {
                // (A connection refused before it authenticated returns Ok: `refusals` has it.)
                if let Err(e) = me.serve(sock, stop).await {
                    tracing::info!(%peer, error = %format!("{e:#}"), "mirror connection ended");
                }
            });
        }
        stop.cancel();
        // Stop every connection, then persist the acknowledgements they hold.
        for (_, (_, t)) in self.conns.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            t.cancel();
        }
        connections.close();
        if tokio::time::timeout(DRAIN, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                connections = connections.len(),
                ?DRAIN,
                "mirror connections did not end within the drain deadline"
            );
        }
        self.workers.shutdown(DRAIN).await;
        if let Some(e) = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // The lease is another agent's now: left as it is.
            return Err(e);
        }
        // Last: until here `slot drop` goes through this agent.
        let _ = self.engine.aux_put(LEASE, None).await;
        Ok(())
    }
}
