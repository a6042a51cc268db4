//! The mirror role: connects to the primary agent, bootstraps from a snapshot when it has
//! nothing (or its slot was dropped), applies journal entries strictly in order, many per
//! engine transaction (the engine stores the applied sequence number as its head in the same
//! atomic write: exactly-once apply), acknowledges what is durable, and queues the blocks
//! each applied entry references for the replicator.
//!
//! By concern: `session` (connect, handshake, the frame pipeline), `bootstrap` (snapshots in
//! place or beside the live state, the switch, resync requests), `apply` (batches, block
//! queuing, re-queuing after a restart), `status` (status, progress for the mounts, read
//! priority, journal trim), `replication` (the worker that runs sessions and reconnects);
//! here the agent's state and its start. Its loops are `background::Worker`s under one
//! supervisor: `replication`, `block copier` (`crate::blocks`) and `status`; on shutdown
//! they drain within `DRAIN` (the session applies what it received, copies in flight
//! finish), and what is left stays queued in the agent state.

mod apply;
pub mod awaiting;
mod bootstrap;
mod forward;
pub mod received;
mod replication;
mod session;
mod status;

use crate::blocks::{self, Replicator};
use crate::config::MirrorConfig;
use crate::handshake::{self, recv_within};
use crate::metrics::Metrics;
use crate::proto::{self, ToMirror, ToPrimary, Want};
use crate::staging::Meta;
use crate::state::{Bootstrap, Changes, State};
use anyhow::{anyhow, bail, Context, Result};
use background::Supervisor;
use fs_core::engine::Engine;
use fs_core::{keys, BlockStore, Entry, Settings};
use futures::StreamExt;
use objstore::limits::Limits;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const READ_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the workers may take to stop: the applier's drain (60 s at most) and the block
/// copier's (10 s) run side by side.
const DRAIN: Duration = Duration::from_secs(75);

#[derive(Default)]
struct Live {
    connected: bool,
    primary_head: u64,
    last_contact: Option<Instant>,
    /// Received, not yet applied: (seq, commit time).
    received: VecDeque<(u64, i64)>,
    /// Last instant the mirror was known to have applied everything the primary had.
    caught_up_at: Option<Instant>,
    needs_resync: bool,
    last_error: Option<String>,
    /// Why the primary keeps refusing this mirror (a configuration problem), if it does.
    refused: Option<String>,
    volume_uuid: Option<String>,
}

pub struct Mirror {
    cfg: MirrorConfig,
    token: String,
    /// The live metadata, which the site's mounts read (`meta.live`).
    engine: Arc<dyn Engine>,
    /// The live metadata and, during a staged resync, the staging beside it.
    meta: Arc<Meta>,
    state: Arc<State>,
    metrics: Arc<Metrics>,
    tls: TlsTo,
    dest: Arc<dyn BlockStore>,
    limits: Arc<Limits>,
    settings: RwLock<Option<Settings>>,
    /// Where the primary's blocks are, following its storage record (a cutover moves them);
    /// None when `origin_store` names the origin by hand.
    origin: RwLock<Option<Arc<volume::StorageHolder>>>,
    repl: RwLock<Option<Arc<Replicator>>>,
    /// Runs the workers: replication, the block copier (once the settings are known), status.
    workers: Arc<Supervisor>,
    live: Mutex<Live>,
    /// Cancelled when the agent must stop by itself (`fatal` says why).
    halt: CancellationToken,
    fatal: Mutex<Option<anyhow::Error>>,
    /// Set when the primary asked for a resync; cleared once a snapshot is installed.
    force_snapshot: std::sync::atomic::AtomicBool,
    /// Ends the current replication session (an operator asked for a resync).
    kick: tokio::sync::Notify,
    /// The agent's state directory (its `rollback/` keeps saved diverged tails).
    state_dir: std::path::PathBuf,
    /// Writes of the site's mounts, relayed to the primary (`forward`).
    fwd: forward::Forwarding,
}

enum End {
    /// Reconnect after a short pause.
    Retry(anyhow::Error),
    /// The primary wants a snapshot-based resync.
    Resync(String),
    /// Clean stop (SIGTERM).
    Stopped,
    /// An operator asked for a resync: reconnect at once, asking for a snapshot.
    Kicked,
    /// The primary refuses this mirror (a wrong token or name, a foreign volume, a
    /// superseded primary): a configuration problem, retried seldom.
    Refused(anyhow::Error),
    /// The peer's first reply was not the mirror protocol: damage in transit once, a
    /// configuration problem (not a primary agent) when it keeps happening.
    Foreign(anyhow::Error),
}

/// The TLS connector a mirror uses towards its primary (`tls_ca` set), or none.
pub(crate) type TlsTo = Option<(
    tokio_rustls::TlsConnector,
    tokio_rustls::rustls::pki_types::ServerName<'static>,
)>;

pub(crate) fn tls_for(cfg: &MirrorConfig) -> Result<TlsTo> {
    Ok(match &cfg.tls_ca {
        Some(ca) => {
            let host = cfg.tls_server_name.clone().unwrap_or_else(|| {
                cfg.primary
                    .rsplit_once(':')
                    .map_or(cfg.primary.clone(), |(h, _)| {
                        h.trim_matches(['[', ']']).to_string()
                    })
            });
            Some(crate::tls::connector(ca, &host)?)
        }
        None => None,
    })
}

/// A connection to the primary at `primary` (TLS when `tls` is set), not yet greeted.
pub(crate) async fn dial(primary: &str, tls: &TlsTo) -> Result<proto::Wire> {
    dial_with(primary, tls, false).await
}

/// `dial`; with `abort_on_close`, closing the connection discards what it has not yet
/// delivered and resets it (SO_LINGER 0), so nothing sent before a give-up arrives later.
pub(crate) async fn dial_with(
    primary: &str,
    tls: &TlsTo,
    abort_on_close: bool,
) -> Result<proto::Wire> {
    let sock = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(primary))
        .await
        .map_err(|_| anyhow!("connecting to the primary at {primary}: timed out"))?
        .with_context(|| format!("connecting to the primary at {primary}"))?;
    let _ = sock.set_nodelay(true);
    if abort_on_close {
        // (Deprecated for a nonzero linger, which blocks the dropping thread; zero resets
        // the connection at once.)
        #[allow(deprecated)]
        sock.set_linger(Some(Duration::ZERO))
            .context("setting SO_LINGER on the forward link")?;
    }
    let io: Box<dyn proto::Io> = match tls {
        Some((c, name)) => Box::new(
            tokio::time::timeout(CONNECT_TIMEOUT, c.connect(name.clone(), sock))
                .await
                .map_err(|_| anyhow!("TLS handshake with {primary} timed out"))?
                .with_context(|| format!("TLS handshake with {primary}"))?,
        ),
        None => Box::new(sock),
    };
    Ok(proto::wire(io))
}

impl Mirror {
    pub async fn new(
        cfg: MirrorConfig,
        engine: Arc<dyn Engine>,
        state: Arc<State>,
        state_dir: &std::path::Path,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>> {
        let token = cfg.secret().load("[mirror]")?;
        let tls = tls_for(&cfg)?;
        let bw = cfg
            .bwlimit
            .as_deref()
            .map(objstore::limits::BwSchedule::parse)
            .transpose()?;
        let limits = Arc::new(Limits::new(bw, Some(cfg.tps))?);
        // The mirror's own store, from the one store stack: raw, the copy limits (requests
        // only: the origin's reads pay the bytes), metered as the "mirror" store.
        let dest = volume::StoreBuilder::new(None, metrics.store("mirror"))
            .limited(limits.clone(), volume::Charge::Requests)
            .creating()
            .open(&cfg.store)
            .map_err(|e| anyhow!("[mirror] store: {e}"))?;
        dest.check()
            .await
            .map_err(|e| anyhow!("[mirror] store {}: {e}", cfg.store))?;
        crate::site::claim(&*engine, &state, &cfg).await?;
        drop_relayed_sessions(&*engine).await?;
        let settings = match engine.get(keys::SETTING).await? {
            Some(v) => Some(
                serde_json::from_slice::<Settings>(&v)
                    .context("the mirror's volume settings do not decode")?,
            ),
            None => None,
        };
        let meta = Meta::new(engine.clone(), state_dir);
        let mut force = false;
        match state.bootstrap()? {
            Some(b @ Bootstrap::CatchingUp { staged: true, .. }) => {
                if !meta.reopen()? {
                    tracing::warn!(bootstrap = ?b, "the resync staging is gone: the resync starts over (the live metadata keeps serving meanwhile)");
                    force = true;
                }
            }
            // An install starts over; nothing staged otherwise: a leftover is removed.
            _ => meta.discard()?,
        }
        let m = Arc::new(Mirror {
            cfg,
            token,
            engine,
            meta,
            state,
            metrics,
            tls,
            dest,
            limits,
            settings: RwLock::new(None),
            origin: RwLock::new(None),
            repl: RwLock::new(None),
            workers: Arc::new(Supervisor::new(CancellationToken::new())),
            live: Mutex::new(Live::default()),
            halt: CancellationToken::new(),
            fatal: Mutex::new(None),
            force_snapshot: std::sync::atomic::AtomicBool::new(force),
            kick: tokio::sync::Notify::new(),
            state_dir: state_dir.to_path_buf(),
            fwd: forward::Forwarding::default(),
        });
        if let Some(s) = settings {
            m.set_settings(s).await?;
        }
        Ok(m)
    }

    pub fn limits_arc(&self) -> Arc<Limits> {
        self.limits.clone()
    }

    /// Where diverged tails are saved (`crate::rollback`).
    pub fn rollback_root(&self) -> std::path::PathBuf {
        self.state_dir.join("rollback")
    }

    /// Known settings start the replicator (once).
    async fn set_settings(&self, s: Settings) -> Result<()> {
        let started = self
            .repl
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        // The origin, from the same stack: its reads pay the copy limits' bytes, its calls are
        // metered as the "origin" store.
        let origins = volume::StoreBuilder::new(None, self.metrics.store("origin"))
            .limited(self.limits.clone(), volume::Charge::Reads);
        let origin = if started {
            None
        } else {
            Some(match &self.cfg.origin_store {
                Some(url) => {
                    let o = origins
                        .open(url)
                        .map_err(|e| anyhow!("origin store {url}: {e}"))?;
                    (o, url.clone())
                }
                None => {
                    // The primary's storage record, replicated here: a cutover at the
                    // primary moves where this mirror copies from.
                    let h = volume::StorageHolder::open(self.engine.clone(), origins, &s.storage)
                        .await
                        .map_err(|e| anyhow!("the origin store: {e}"))?;
                    let url = h.display_url();
                    *self.origin.write().unwrap_or_else(|p| p.into_inner()) = Some(h.clone());
                    (h as Arc<dyn BlockStore>, url)
                }
            })
        };
        // A former primary rejoining still describes itself (see below): asked before the
        // lock is taken.
        let rejoining = fs_core::site::fenced(&*self.engine)
            .await
            .ok()
            .flatten()
            .is_some();
        let mut repl = self.repl.write().unwrap_or_else(|p| p.into_inner());
        if let (None, Some((origin, origin_url))) = (repl.as_ref(), origin) {
            let r = Replicator::new(
                self.state.clone(),
                self.meta.clone(),
                s.clone(),
                origin,
                self.dest.clone(),
                self.limits.clone(),
                self.cfg.workers,
                self.metrics.clone(),
            );
            self.workers.spawn(r.worker());
            if origin_url == self.dest.display_url() {
                // The metadata's storage record names this mirror's own store: a mirror
                // sharing the volume's store (nothing to copy), or a former primary rejoining,
                // whose record still describes itself until the new primary's history
                // arrives (the origin follows the record then).
                tracing::info!(
                    store = %self.cfg.store,
                    workers = self.cfg.workers,
                    "block replication started; {}",
                    if rejoining {
                        "this metadata's storage record still names this site's own store (a former primary rejoining): blocks are copied from the new primary's store once its history arrives"
                    } else {
                        "the volume's storage is this mirror's own store: blocks are already there, nothing to copy"
                    }
                );
            } else {
                tracing::info!(origin = %origin_url, dest = %self.cfg.store, workers = self.cfg.workers, "block replication started");
            }
            *repl = Some(r);
        }
        let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
        lv.volume_uuid = Some(s.uuid.clone());
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = Some(s);
        Ok(())
    }

    /// Applied entries changed the volume's settings or storage record: follow them.
    pub(super) async fn follow_settings(&self) -> Result<()> {
        if let Some(v) = self.engine.get(keys::SETTING).await? {
            let s: Settings =
                serde_json::from_slice(&v).context("the mirror's volume settings do not decode")?;
            *self.settings.write().unwrap_or_else(|p| p.into_inner()) = Some(s);
        }
        let origin = self
            .origin
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(h) = origin {
            use fs_core::storage::StorageFollow;
            let before = h.gen();
            let p = h.reload().await?;
            if p.gen != before {
                tracing::info!(origin = %volume::placement::describe(&p), "the primary's storage changed: copying from there now");
            }
        }
        Ok(())
    }

    fn settings(&self) -> Option<Settings> {
        self.settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn notify_blocks(&self) {
        if let Some(r) = self.repl.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            r.notify.notify_one();
        }
    }

    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        self.requeue()
            .await
            .context("re-queuing blocks after a restart")?;
        // Killed between catching up and recording it (or during a staged switch).
        if let Some(Bootstrap::CatchingUp { s_end, .. }) = self.state.bootstrap()? {
            if self.meta.target().journal_bounds().await?.last >= s_end {
                self.complete_bootstrap()
                    .await
                    .context("completing the bootstrap after a restart")?;
            }
        }
        // The address this site serves as the primary once promoted: answered now, so a
        // planned move's fence can check it goes to this mirror (`awaiting`).
        let awaiting_stop = CancellationToken::new();
        let awaiting = match self.cfg.listen {
            Some(addr) => {
                let l = awaiting::bind(addr).await?;
                let id = crate::site::ensure_identity(&*self.engine).await?;
                tracing::info!(%addr, "answering at the address this site serves as the primary once promoted");
                Some(tokio::spawn(awaiting::serve(l, id, awaiting_stop.clone())))
            }
            None => None,
        };
        self.workers.spawn(status::StatusWorker::new(self.clone()));
        self.workers
            .spawn(replication::ReplicationWorker::new(self.clone()));
        self.workers
            .spawn(forward::ForwardWorker::new(self.clone()));
        let socket_stop = CancellationToken::new();
        let socket = tokio::spawn(self.clone().serve_forward_socket(socket_stop.clone()));
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.halt.cancelled() => {}
        }
        awaiting_stop.cancel();
        if let Some(t) = awaiting {
            let _ = t.await;
        }
        // The mounts' changes in flight get their answers before the link goes.
        socket_stop.cancel();
        match socket.await {
            Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "the forward socket failed"),
            Err(e) => tracing::warn!(error = %e, "the forward socket's task failed"),
            Ok(Ok(())) => {}
        }
        // Drain: the session applies what it received and ends; copies in flight finish
        // (or stay queued); then the status is brought up to date one last time.
        self.workers.shutdown(DRAIN).await;
        let _ = self.refresh().await;
        match self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The supervisor of this mirror's workers (replication, block copier, status).
    pub fn workers(&self) -> Arc<Supervisor> {
        self.workers.clone()
    }

    /// Stop the agent with `e` (its workers drain first): replicating further would harm.
    fn halt_with(&self, e: anyhow::Error) {
        *self.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        self.halt.cancel();
    }
}

#[async_trait::async_trait]
impl crate::admin::ResyncAdmin for Mirror {
    async fn resync(&self) -> Result<String> {
        self.request_resync().await
    }
}

/// A temporary handshake failure that kept happening: persistent now.
fn persistent(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<fs_core::Error>() {
        Ok(f) => anyhow::Error::new(f.persist()),
        Err(e) => e,
    }
}

/// An apply or snapshot install refused because the metadata lost its mirror marker.
fn replay_fenced(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<fs_core::Error>()
            .is_some_and(|f| f.kind() == fs_core::ErrorKind::ReadOnly)
    })
}

/// Drop the relayed sessions a mirror's metadata holds: records a primary keeps for another
/// mirror's writing mounts (`relayed_by`), left in the aux records of a former primary that
/// rejoined as a mirror (aux records are neither replicated nor reset by a resync). Nothing
/// refreshes them here, so each showed as live until the session timeout, its mount long
/// gone; at a mirror only its own site's mounts have sessions. Returns how many went.
pub(crate) async fn drop_relayed_sessions(engine: &dyn Engine) -> Result<usize> {
    let mut n = 0;
    for s in fs_core::session::list(engine).await? {
        if let Some(by) = &s.relayed_by {
            tracing::info!(session = %s.id, relayed_by = %by, mountpoint = %s.mountpoint, "dropped a session this metadata kept as a primary for a mirror's mount: a mirror keeps none");
            fs_core::session::remove(engine, &s.id).await?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod relayed_tests {
    use super::*;

    /// Issue 43, item 26: a former primary rejoined as a mirror kept the sessions it had
    /// relayed for another mirror's mounts, each listed live for minutes after its mount was
    /// gone. A mirror drops them (and keeps its own site's sessions).
    #[tokio::test]
    async fn a_rejoined_mirror_drops_the_relayed_sessions_it_kept_as_primary() {
        let d = tempfile::tempdir().unwrap();
        let e: Arc<dyn Engine> = Arc::new(
            meta::RocksEngine::open(&d.path().join("m"), meta::RocksMode::ReadWrite, true, true)
                .unwrap(),
        );
        let mut relayed = fs_core::session::Session::new("/mnt/far", false);
        relayed.relayed_by = Some("m2".into());
        fs_core::session::beat(&*e, &mut relayed).await.unwrap();
        let mut own = fs_core::session::Session::new("/mnt/here", true);
        fs_core::session::beat(&*e, &mut own).await.unwrap();
        let now = fs_core::now_ns();
        assert!(relayed.is_live(now, fs_core::session::DEFAULT_TIMEOUT));
        assert_eq!(drop_relayed_sessions(&*e).await.unwrap(), 1);
        let left: Vec<String> = fs_core::session::list(&*e)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.mountpoint)
            .collect();
        assert_eq!(left, vec!["/mnt/here".to_string()]);
    }
}
