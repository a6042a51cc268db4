//! The mirror role: connects to the primary agent, bootstraps from a snapshot when it has
//! nothing (or its slot was dropped), applies journal entries strictly in order, many per
//! engine transaction (the engine stores the applied sequence number as its head in the same
//! atomic write: exactly-once apply), acknowledges what is durable, and queues the blocks
//! each applied entry references for the replicator.

use crate::blocks::{self, Replicator};
use crate::config::MirrorConfig;
use crate::handshake::{self, recv_within};
use crate::metrics::Metrics;
use crate::proto::{self, ToMirror, ToPrimary, Want};
use crate::state::{Bootstrap, Changes, State};
use anyhow::{anyhow, bail, Context, Result};
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
    engine: Arc<dyn Engine>,
    state: Arc<State>,
    metrics: Arc<Metrics>,
    tls: Option<(
        tokio_rustls::TlsConnector,
        tokio_rustls::rustls::pki_types::ServerName<'static>,
    )>,
    dest: Arc<dyn BlockStore>,
    limits: Arc<Limits>,
    settings: RwLock<Option<Settings>>,
    repl: RwLock<Option<Arc<Replicator>>>,
    /// The replicator's task, awaited at shutdown (it drains copies in flight).
    repl_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    live: Mutex<Live>,
    stop_blocks: CancellationToken,
    /// Set when the primary asked for a resync; cleared once a snapshot is installed.
    force_snapshot: std::sync::atomic::AtomicBool,
}

enum End {
    /// Reconnect after a short pause.
    Retry(anyhow::Error),
    /// The primary wants a snapshot-based resync.
    Resync(String),
    /// Clean stop (SIGTERM).
    Stopped,
}

impl Mirror {
    pub async fn new(
        cfg: MirrorConfig,
        engine: Arc<dyn Engine>,
        state: Arc<State>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>> {
        let token = cfg.secret().load("[mirror]")?;
        let tls = match &cfg.tls_ca {
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
        };
        let dest: Arc<dyn BlockStore> = Arc::new(
            objstore::OpendalStore::open(
                &cfg.store,
                &objstore::StoreOptions {
                    create: true,
                    ..Default::default()
                },
            )
            .map_err(|e| anyhow!("[mirror] store: {e}"))?,
        );
        dest.check()
            .await
            .map_err(|e| anyhow!("[mirror] store {}: {e}", cfg.store))?;
        let bw = cfg
            .bwlimit
            .as_deref()
            .map(objstore::limits::BwSchedule::parse)
            .transpose()?;
        let limits = Arc::new(Limits::new(bw, Some(cfg.tps))?);
        crate::site::claim(&*engine, &state, &cfg).await?;
        let settings = match engine.get(keys::SETTING).await? {
            Some(v) => Some(
                serde_json::from_slice::<Settings>(&v)
                    .context("the mirror's volume settings do not decode")?,
            ),
            None => None,
        };
        let m = Arc::new(Mirror {
            cfg,
            token,
            engine,
            state,
            metrics,
            tls,
            dest,
            limits,
            settings: RwLock::new(None),
            repl: RwLock::new(None),
            repl_task: Mutex::new(None),
            live: Mutex::new(Live::default()),
            stop_blocks: CancellationToken::new(),
            force_snapshot: Default::default(),
        });
        if let Some(s) = settings {
            m.set_settings(s)?;
        }
        Ok(m)
    }

    pub fn limits_arc(&self) -> Arc<Limits> {
        self.limits.clone()
    }

    /// Known settings start the replicator (once).
    fn set_settings(&self, s: Settings) -> Result<()> {
        let mut repl = self.repl.write().unwrap_or_else(|p| p.into_inner());
        if repl.is_none() {
            let origin_url = self
                .cfg
                .origin_store
                .clone()
                .unwrap_or_else(|| s.storage.clone());
            let origin: Arc<dyn BlockStore> = Arc::new(
                objstore::OpendalStore::open(&origin_url, &Default::default())
                    .map_err(|e| anyhow!("origin store {origin_url}: {e}"))?,
            );
            let r = Replicator::new(
                self.state.clone(),
                self.engine.clone(),
                s.clone(),
                origin,
                self.dest.clone(),
                self.limits.clone(),
                self.cfg.workers,
                self.metrics.clone(),
            );
            let task = tokio::spawn(r.clone().run(self.stop_blocks.clone()));
            *self.repl_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
            tracing::info!(origin = %origin_url, dest = %self.cfg.store, workers = self.cfg.workers, "block replication started");
            *repl = Some(r);
        }
        let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
        lv.volume_uuid = Some(s.uuid.clone());
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = Some(s);
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

    /// After a crash between an apply and its queue record: queue the blocks of applied
    /// entries the queue has not seen, from the mirror's own journal.
    async fn requeue(&self) -> Result<()> {
        let Some(s) = self.settings() else {
            return Ok(());
        };
        if matches!(self.state.bootstrap()?, Some(Bootstrap::Installing { .. })) {
            return Ok(());
        }
        let bounds = self.engine.journal_bounds().await?;
        let head = bounds.last;
        let mut from = self.state.queued_through()? + 1;
        if self.state.bootstrap()?.is_none()
            && fs_core::slots::incomplete(&*self.engine).await?.is_some()
        {
            // The metadata says a snapshot was being installed, the agent's state knows
            // nothing of it (a lost or new state directory): start the snapshot over.
            tracing::warn!("this mirror was bootstrapping and the agent's state does not know it (a lost state directory?): bootstrapping again from a snapshot");
            self.force_snapshot
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        if from <= head && from < bounds.first {
            // The journal no longer reaches back to what the block queue knows: the state
            // directory is new or was lost, or the mirror started from a snapshot the queue
            // never saw. Every block the metadata references is queued again; copies already
            // at the mirror store are skipped by their length check, not copied twice.
            tracing::warn!(
                queued_through = from - 1,
                journal_first = bounds.first,
                "the agent's state does not cover this mirror's journal (a new or lost state directory): queuing every block the metadata references again"
            );
            let mut n = 0u64;
            let mut start = fs_core::keys::INODE_PREFIX.to_vec();
            let end = fs_core::keys::prefix_end(fs_core::keys::INODE_PREFIX);
            loop {
                let page = self.engine.scan(&start, &end, 4096).await?;
                let len = page.len();
                if let Some((k, _)) = page.last() {
                    start = k.clone();
                    start.push(0);
                }
                let ch = blocks::changes_of_pairs(&s, &page);
                n += ch.add.len() as u64;
                self.state.record(&ch, None, fs_core::now_ns())?;
                if len < 4096 {
                    break;
                }
            }
            self.state
                .record(&Default::default(), Some(head), fs_core::now_ns())?;
            tracing::info!(
                blocks = n,
                through = head,
                "block queue rebuilt from the mirror's metadata"
            );
            return Ok(());
        }
        while from <= head {
            let frames = self.engine.journal_read(from, 1000).await?;
            if frames.is_empty() {
                break;
            }
            let entries: Vec<Entry> = frames
                .iter()
                .map(|(_, f)| Entry::decode(f))
                .collect::<fs_core::Result<_>>()?;
            let last = entries.last().expect("non-empty").seq;
            let ch = blocks::changes_of_entries(&s, &entries);
            self.state.record(&ch, Some(last), fs_core::now_ns())?;
            from = last + 1;
        }
        Ok(())
    }

    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        self.requeue()
            .await
            .context("re-queuing blocks after a restart")?;
        let status = tokio::spawn(self.clone().status_loop(stop.clone()));
        let mut backoff = Duration::from_millis(200);
        let mut first = true;
        let mut refusals = 0u32;
        let mut foreign = 0u32;
        loop {
            if stop.is_cancelled() {
                break;
            }
            if !first {
                self.metrics.reconnects.inc();
            }
            first = false;
            let started = Instant::now();
            let end = self.session(&stop).await;
            if started.elapsed() > Duration::from_secs(3) {
                backoff = Duration::from_millis(200); // it was working: retry soon
            }
            {
                let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                lv.connected = false;
                lv.received.clear();
            }
            let not_primary =
                matches!(&end, End::Retry(e) if e.chain().any(|c| c.is::<handshake::NotPrimary>()));
            foreign = if not_primary { foreign + 1 } else { 0 };
            // Three first replies in a row that are not the protocol: the peer is something
            // else, a configuration problem like a refusal.
            let end = match end {
                End::Retry(e) if not_primary && foreign >= 3 => {
                    End::Retry(anyhow::Error::new(handshake::Permanent(format!("{e:#}"))))
                }
                other => other,
            };
            if !matches!(&end, End::Retry(e) if e.chain().any(|c| c.is::<handshake::Permanent>())) {
                refusals = 0;
            }
            match end {
                End::Stopped => break,
                End::Resync(reason) => {
                    self.live
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .needs_resync = true;
                    if self.cfg.auto_resync {
                        tracing::error!(%reason, "the primary requires a resync: bootstrapping again from a snapshot (auto_resync)");
                        self.force_snapshot
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                        backoff = Duration::from_millis(200);
                    } else {
                        tracing::error!(%reason, "the primary requires a resync and auto_resync is off: this mirror is stale until an operator resyncs it (runbooks/resync-mirror.md)");
                        backoff = Duration::from_secs(30);
                    }
                }
                End::Retry(e) if replay_fenced(&e) => {
                    // The marker is gone (`mirror-agent detach`, or a promotion): this
                    // metadata is no longer a mirror's, and replaying into it would fork it.
                    self.stop_blocks.cancel();
                    return Err(e.context(
                        "this metadata is no longer a mirror's (detached?): the mirror agent stops",
                    ));
                }
                End::Retry(e) if e.chain().any(|c| c.is::<handshake::Permanent>()) => {
                    // A configuration problem (a wrong token or name, a foreign volume, not a
                    // primary agent at all): retried, since the other side may be fixed, but
                    // seldom, loudly, and shown in `status` as the reason.
                    refusals += 1;
                    let wait = Duration::from_secs(30)
                        .saturating_mul(1 << (refusals - 1).min(5))
                        .min(Duration::from_secs(600));
                    let msg = format!("{e:#}");
                    tracing::error!(reason = %msg, retry_in = ?wait, "the primary refuses this mirror; fix the configuration (retrying seldom until then)");
                    {
                        let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                        lv.refused = Some(msg.clone());
                        lv.last_error = Some(msg);
                    }
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                End::Retry(e) => {
                    if e.chain()
                        .any(|c| c.downcast_ref::<proto::Corrupt>().is_some())
                    {
                        self.metrics.frame_errors.inc();
                        tracing::error!(error = %format!("{e:#}"), "damaged message from the primary: nothing of it applied; re-requesting");
                    }
                    let msg = format!("{e:#}");
                    tracing::warn!(error = %msg, retry_in = ?backoff, "replication connection lost; reconnecting");
                    self.live
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .last_error = Some(msg);
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        // Drain: stop the copy workers (copies in flight finish or stay queued).
        self.stop_blocks.cancel();
        let _ = status.await;
        let task = self
            .repl_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = task {
            // It lets copies in flight finish for up to 10 s; the rest stay queued.
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
        Ok(())
    }

    async fn connect(&self) -> Result<proto::Wire> {
        let sock = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&self.cfg.primary),
        )
        .await
        .map_err(|_| {
            anyhow!(
                "connecting to the primary at {}: timed out",
                self.cfg.primary
            )
        })?
        .with_context(|| format!("connecting to the primary at {}", self.cfg.primary))?;
        let _ = sock.set_nodelay(true);
        let io: Box<dyn proto::Io> = match &self.tls {
            Some((c, name)) => Box::new(
                tokio::time::timeout(CONNECT_TIMEOUT, c.connect(name.clone(), sock))
                    .await
                    .map_err(|_| anyhow!("TLS handshake with {} timed out", self.cfg.primary))?
                    .with_context(|| format!("TLS handshake with {}", self.cfg.primary))?,
            ),
            None => Box::new(sock),
        };
        Ok(proto::wire(io))
    }

    async fn session(self: &Arc<Self>, stop: &CancellationToken) -> End {
        let force = self
            .force_snapshot
            .load(std::sync::atomic::Ordering::SeqCst);
        match self.session_inner(force, stop).await {
            Ok(e) => e,
            Err(e) => End::Retry(e),
        }
    }

    async fn session_inner(
        self: &Arc<Self>,
        force_snapshot: bool,
        stop: &CancellationToken,
    ) -> Result<End> {
        let boot = self.state.bootstrap()?;
        let head = self.engine.journal_bounds().await?.last;
        let has_volume = self.settings().is_some();
        let want = if force_snapshot
            || matches!(boot, Some(Bootstrap::Installing { .. }))
            || !has_volume
        {
            Want::Snapshot
        } else {
            Want::From(head + 1)
        };
        let mut wire = tokio::select! {
            _ = stop.cancelled() => return Ok(End::Stopped),
            w = self.connect() => w?,
        };
        let nonce_m = proto::nonce();
        // The frame at our head lets the primary check that our histories agree.
        let prev_crc = match want {
            Want::From(s) if s > 1 => self
                .engine
                .journal_read(s - 1, 1)
                .await
                .ok()
                .and_then(|v| v.into_iter().next())
                .filter(|(seq, _)| *seq == s - 1)
                .map(|(_, f)| crc32c::crc32c(&f)),
            _ => None,
        };
        let uuid = if want == Want::Snapshot {
            None
        } else {
            self.settings().map(|s| s.uuid)
        };
        let hello = ToPrimary::Hello {
            proto: proto::PROTO_VERSION,
            mirror: self.cfg.name.clone(),
            volume_uuid: uuid,
            nonce: nonce_m,
            want,
            prev_crc,
        };
        let primary_head = match handshake::connect(
            &mut wire,
            &self.cfg.primary,
            &self.token,
            hello,
            READ_TIMEOUT,
        )
        .await?
        {
            handshake::Welcome::In { head } => head,
            handshake::Welcome::Resync(reason) => return Ok(End::Resync(reason)),
        };
        let (mut sink, mut stream) = wire.split();
        {
            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
            lv.connected = true;
            lv.primary_head = lv.primary_head.max(primary_head);
            lv.last_contact = Some(Instant::now());
            lv.last_error = None;
            lv.refused = None;
        }
        tracing::info!(primary = %self.cfg.primary, ?want, primary_head, "connected to the primary");
        if want == Want::Snapshot {
            self.install_snapshot(&mut stream, stop).await?;
            self.force_snapshot
                .store(false, std::sync::atomic::Ordering::SeqCst);
            self.live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .needs_resync = false;
        }
        // Pipeline: this task reads and checks frames, an applier applies them in batches,
        // and acknowledgements go back as they become durable.
        let (tx, rx) = mpsc::channel::<Vec<Entry>>(16);
        let (ack_tx, mut ack_rx) = watch::channel(0u64);
        let applier = tokio::spawn(self.clone().apply_loop(rx, ack_tx));
        let acker = async {
            while ack_rx.changed().await.is_ok() {
                let seq = *ack_rx.borrow_and_update();
                proto::send(&mut sink, &ToPrimary::Ack { seq }).await?;
            }
            Ok::<(), anyhow::Error>(())
        };
        let mut expected = self.engine.journal_bounds().await?.last + 1;
        let reader = async {
            loop {
                let msg = recv_within(&mut stream, READ_TIMEOUT).await?;
                self.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .last_contact = Some(Instant::now());
                match msg {
                    ToMirror::Entries { frames } => {
                        let mut batch = Vec::with_capacity(frames.len());
                        for (seq, f) in frames {
                            let e = match Entry::decode(&f) {
                                Ok(e) => e,
                                Err(err) => {
                                    self.metrics.frame_errors.inc();
                                    tracing::error!(seq, error = %err, "corrupt journal frame: not applied; re-requesting from {expected}");
                                    bail!("corrupt frame at seq {seq}");
                                }
                            };
                            if e.seq != seq || seq != expected {
                                self.metrics.frame_errors.inc();
                                tracing::error!(
                                    seq,
                                    entry_seq = e.seq,
                                    expected,
                                    "out-of-order journal frame: not applied; re-requesting"
                                );
                                bail!("frame {seq} where {expected} was expected");
                            }
                            expected += 1;
                            batch.push(e);
                        }
                        {
                            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                            for e in &batch {
                                lv.received.push_back((e.seq, e.time_ns));
                            }
                            lv.primary_head = lv.primary_head.max(expected - 1);
                        }
                        if tx.send(batch).await.is_err() {
                            bail!("the applier stopped");
                        }
                    }
                    ToMirror::Heartbeat { head, .. } => {
                        let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                        lv.primary_head = lv.primary_head.max(head);
                    }
                    ToMirror::Refused {
                        reason,
                        resync: true,
                    } => return Ok(End::Resync(reason)),
                    ToMirror::Refused { reason, .. } => {
                        bail!("the primary ended the stream: {reason}")
                    }
                    other => bail!("unexpected message {}", proto::msg_name(&other)),
                }
            }
        };
        let end = tokio::select! {
            r = reader => r,
            r = acker => r.and(Err(anyhow!("acknowledgements stopped"))),
            _ = stop.cancelled() => Ok(End::Stopped),
        };
        // Entries already received are applied (drain), then the session ends.
        drop(tx);
        match tokio::time::timeout(Duration::from_secs(60), applier).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e.context("applying entries")),
            Ok(Err(e)) => bail!("the applier panicked: {e}"),
            Err(_) => bail!("the applier did not finish within 60 s"),
        }
        end
    }

    async fn install_snapshot<R>(&self, stream: &mut R, stop: &CancellationToken) -> Result<()>
    where
        R: futures::Stream<Item = std::io::Result<bytes::BytesMut>> + Unpin,
    {
        let (s0, settings) = match recv_within(stream, Duration::from_secs(120)).await? {
            ToMirror::SnapshotBegin { seq, settings } => (seq, settings),
            other => bail!("expected a snapshot, got {}", proto::msg_name(&other)),
        };
        let settings: Settings =
            serde_json::from_slice(&settings).context("the snapshot's settings do not decode")?;
        tracing::info!(seq = s0, "installing a snapshot");
        self.metrics.bootstrapping.set(1);
        self.state.begin_install(s0)?;
        // Readers are fenced off until the mirror is consistent again.
        self.engine
            .aux_put(
                fs_core::slots::MIRROR_INCOMPLETE,
                Some(format!("snapshot at seq {s0} being installed").as_bytes()),
            )
            .await?;
        self.engine.install_reset().await?;
        let mut n = 0u64;
        loop {
            if stop.is_cancelled() {
                bail!("stopped during the snapshot (it starts over next time)");
            }
            match recv_within(stream, Duration::from_secs(120)).await? {
                ToMirror::SnapshotPairs { pairs } => {
                    n += pairs.len() as u64;
                    self.engine.install_put(&pairs).await?;
                    let ch = blocks::changes_of_pairs(&settings, &pairs);
                    self.state.record(&ch, None, fs_core::now_ns())?;
                }
                ToMirror::SnapshotEnd { seq: s_end } => {
                    self.engine.install_head(s0).await?;
                    self.state
                        .record(&Changes::default(), Some(s0), fs_core::now_ns())?;
                    if s_end > s0 {
                        self.state
                            .set_bootstrap(Some(&Bootstrap::CatchingUp { s0, s_end }))?;
                    } else {
                        self.complete_bootstrap().await?;
                    }
                    tracing::info!(keys = n, s0, s_end, "snapshot installed; catching up");
                    break;
                }
                other => bail!(
                    "unexpected message during the snapshot: {}",
                    proto::msg_name(&other)
                ),
            }
        }
        self.set_settings(settings)?;
        self.notify_blocks();
        Ok(())
    }

    async fn complete_bootstrap(&self) -> Result<()> {
        self.state.set_bootstrap(None)?;
        self.engine
            .aux_put(fs_core::slots::MIRROR_INCOMPLETE, None)
            .await?;
        self.metrics.bootstrapping.set(0);
        let seq = self.engine.journal_bounds().await?.last;
        tracing::info!(seq, "the mirror is consistent (bootstrap complete)");
        Ok(())
    }

    async fn apply_loop(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Vec<Entry>>,
        ack: watch::Sender<u64>,
    ) -> Result<()> {
        let max = self.cfg.batch_entries;
        while let Some(mut batch) = rx.recv().await {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(more) => batch.extend(more),
                    Err(_) => break,
                }
            }
            let n = batch.len() as u64;
            let head = self.engine.apply(&batch).await?;
            self.metrics.entries_applied.inc_by(n);
            self.metrics.apply_batches.inc();
            self.metrics.applied_seq.set(head as i64);
            if let Some(s) = self.settings() {
                let ch = blocks::changes_of_entries(&s, &batch);
                self.state.record(&ch, Some(head), fs_core::now_ns())?;
                self.notify_blocks();
            }
            if let Some(Bootstrap::CatchingUp { s_end, .. }) = self.state.bootstrap()? {
                if head >= s_end {
                    self.complete_bootstrap().await?;
                }
            }
            {
                let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                while lv.received.front().is_some_and(|(s, _)| *s <= head) {
                    lv.received.pop_front();
                }
                if head >= lv.primary_head {
                    lv.caught_up_at = Some(Instant::now());
                }
            }
            let _ = ack.send(head);
        }
        Ok(())
    }

    async fn status_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut last_trim = Instant::now();
        let mut last_progress = Instant::now();
        let mut wants_seen: HashMap<String, i64> = HashMap::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => { let _ = self.refresh().await; return; }
                _ = tick.tick() => {}
            }
            if let Err(e) = self.refresh().await {
                tracing::debug!(error = %e, "refreshing status");
            }
            if last_progress.elapsed() >= Duration::from_millis(fs_core::site::PROGRESS_EVERY_MS) {
                last_progress = Instant::now();
                if let Err(e) = self.publish_progress().await {
                    tracing::debug!(error = %e, "writing the progress record for the site's mounts");
                }
                if let Err(e) = self.prioritize_wants(&mut wants_seen).await {
                    tracing::debug!(error = %format!("{e:#}"), "reading the blocks the site's mounts want first");
                }
            }
            if last_trim.elapsed() >= Duration::from_secs(60) {
                last_trim = Instant::now();
                match self.trim_own_journal().await {
                    Ok(n) if n > 0 => {
                        tracing::info!(entries = n, "trimmed the mirror's own journal")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "trimming the mirror's own journal")
                    }
                }
            }
        }
    }

    /// Tell the mounts at this site how fresh the mirror is (the `mirror.progress` record
    /// beside its metadata), from the figures `refresh` just computed.
    async fn publish_progress(&self) -> Result<()> {
        let m = &self.metrics;
        let lag = m.lag_seconds.get();
        let p = fs_core::site::Progress {
            version: fs_core::site::MARKER_VERSION,
            applied_seq: m.applied_seq.get().max(0) as u64,
            primary_head_seq: m.primary_head.get().max(0) as u64,
            lag_seconds: (lag >= 0.0).then_some(lag),
            window_seconds: m.window_seconds.get(),
            within_window: m.within_window.get() == 1,
            at_ns: fs_core::now_ns(),
        };
        fs_core::site::set_progress(&*self.engine, &p).await?;
        Ok(())
    }

    /// Copy first what the site's mounts read from the origin (their `mirror.want.*`
    /// records; each is looked at again only when its mount rewrote it).
    async fn prioritize_wants(&self, seen: &mut HashMap<String, i64>) -> Result<()> {
        let wants = fs_core::site::wants(&*self.engine).await?;
        seen.retain(|name, _| wants.iter().any(|(n, _)| n == name));
        let mut moved = 0;
        for (name, w) in wants {
            if seen.get(&name) == Some(&w.at_ns) {
                continue;
            }
            moved += self.state.prioritize(&w.keys)?;
            seen.insert(name, w.at_ns);
        }
        if moved > 0 {
            self.metrics.blocks_prioritized.inc_by(moved);
            tracing::debug!(
                blocks = moved,
                "copies moved ahead: the site's mounts read them"
            );
            self.notify_blocks();
        }
        Ok(())
    }

    /// The mirror keeps the entries it applied (same frames, same numbers) for the volume's
    /// journal retention, but never those whose blocks are not queued yet (a restart re-reads
    /// them). The mirror runs no gc of blocks: purges come from the primary's journal.
    async fn trim_own_journal(&self) -> Result<u64> {
        let Some(s) = self.settings() else {
            return Ok(0);
        };
        let cutoff = fs_core::now_ns() - s.journal_retention_secs as i64 * 1_000_000_000;
        let through = self.state.queued_through()?;
        Ok(fs_core::maint::trim_journal(&*self.engine, cutoff, through).await?)
    }

    async fn refresh(&self) -> Result<()> {
        let applied = self.engine.journal_bounds().await?.last;
        let boot = self.state.bootstrap()?;
        let w = self.cfg.window;
        let now_ns = fs_core::now_ns();
        let (
            lag_e,
            lag_s,
            within,
            connected,
            needs_resync,
            primary_head,
            last_error,
            uuid,
            heard,
            refused,
        ) = {
            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
            let ph = lv.primary_head.max(applied);
            let lag_e = ph - applied;
            // Only a live connection vouches for the primary's head: while cut off, the lag
            // in seconds keeps growing from the last moment the mirror knew it was caught up.
            let fresh = lv.connected
                && lv
                    .last_contact
                    .is_some_and(|t| t.elapsed() <= w.max(Duration::from_secs(2)));
            if fresh && lag_e == 0 {
                lv.caught_up_at = Some(Instant::now());
            }
            let lag_s = if fresh && lag_e == 0 {
                0.0
            } else if let Some((_, t)) = lv.received.iter().find(|(s, _)| *s > applied) {
                ((now_ns - t).max(0) as f64) / 1e9
            } else {
                lv.caught_up_at
                    .map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64())
            };
            let within = fresh && boot.is_none() && !lv.needs_resync && lag_s <= w.as_secs_f64();
            (
                lag_e,
                lag_s,
                within,
                lv.connected,
                lv.needs_resync,
                ph,
                lv.last_error.clone(),
                lv.volume_uuid.clone(),
                lv.last_contact.map(|t| t.elapsed().as_secs_f64()),
                lv.refused.clone(),
            )
        };
        let m = &self.metrics;
        // Read in this order: a batch records its blocks and `queued_through` in one write,
        // so a pending count read after `queued_through` covers every block of the entries
        // up to it (the count kept by the copier's loop may be a moment old).
        let queued_through = self.state.queued_through()?;
        let (pending, pending_bytes, failing) = self.state.pending()?;
        m.blocks_pending.set(pending as i64);
        m.bytes_pending.set(pending_bytes as i64);
        m.blocks_failing.set(failing as i64);
        m.applied_seq.set(applied as i64);
        m.primary_head.set(primary_head as i64);
        m.lag_entries.set(lag_e as i64);
        m.lag_seconds
            .set(if lag_s.is_finite() { lag_s } else { -1.0 });
        m.within_window.set(within as i64);
        m.connected.set(connected as i64);
        m.needs_resync.set(needs_resync as i64);
        m.bootstrapping.set(boot.is_some() as i64);
        let repl_err = self
            .repl
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|r| {
                r.last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            });
        let (bw, tps) = self.limits.current();
        m.window_seconds.set(w.as_secs_f64());
        m.copy_limit.set(bw.unwrap_or(0) as i64);
        m.set_status(serde_json::json!({
            "role": "mirror",
            "name": self.cfg.name,
            "primary": self.cfg.primary,
            "volume_uuid": uuid,
            "meta": self.engine.display_url(),
            "store": self.cfg.store,
            "connected": connected,
            "primary_head_seq": primary_head,
            // Seconds since the primary was last heard from (None: never since the start):
            // the head above is as of then.
            "primary_heard_seconds_ago": heard,
            "refused": refused,
            "applied_seq": applied,
            "acked_seq": applied,
            "lag_entries": lag_e,
            "lag_seconds": if lag_s.is_finite() { serde_json::json!(lag_s) } else { serde_json::Value::Null },
            "window_seconds": w.as_secs_f64(),
            "within_window": within,
            "bootstrap": boot,
            "needs_resync": needs_resync,
            "last_error": last_error,
            "frame_errors": m.frame_errors.get(),
            "reconnects": m.reconnects.get(),
            "entries_applied": m.entries_applied.get(),
            "blocks": {
                // Blocks of entries up to this seq are queued or at the mirror store.
                "queued_through": queued_through,
                "pending": pending,
                "pending_bytes": pending_bytes,
                "failing": failing,
                "copied": m.blocks_copied.get(),
                "copied_bytes": m.bytes_copied.get(),
                "skipped": m.blocks_skipped.get(),
                "checksummed": m.blocks_checksummed.get(),
                "prioritized": m.blocks_prioritized.get(),
                "deleted": m.blocks_deleted.get(),
                "copy_errors": m.copy_errors.get(),
                "last_error": repl_err,
            },
            "limits": { "bytes_per_s": bw, "requests_per_s": tps },
        }));
        Ok(())
    }
}

/// An apply or snapshot install refused because the metadata lost its mirror marker.
fn replay_fenced(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<fs_core::Error>()
            .is_some_and(|f| f.kind() == fs_core::ErrorKind::ReadOnly)
    })
}
