//! The primary role: registers a replication slot per configured mirror, authenticates
//! mirrors, streams the journal to each from the sequence number it asks for (or a snapshot
//! first), records their acknowledgements in the slots, enforces the retention cap and trims
//! the journal behind the slowest active mirror.

use crate::config::PrimaryConfig;
use crate::handshake;
use crate::metrics::{label, Metrics};
use crate::proto::{self, ToMirror, ToPrimary, Want};
use anyhow::{anyhow, bail, Context, Result};
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

const BATCH: usize = 1024;
/// The aux record naming the primary agent that keeps this volume's slots.
pub const LEASE: &str = "primary.agent";
const LEASE_EVERY: Duration = Duration::from_secs(2);
/// A lease older than this belongs to an agent that is gone.
pub const LEASE_STALE: Duration = Duration::from_secs(10);

const BATCH_BYTES: usize = 8 << 20;

pub struct Primary {
    cfg: PrimaryConfig,
    engine: Arc<dyn Engine>,
    tokens: HashMap<String, String>,
    metrics: Arc<Metrics>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    uuid: String,
    /// One live connection per mirror: a newer one cancels the older.
    conns: std::sync::Mutex<HashMap<String, (u64, CancellationToken)>>,
    next_conn: AtomicU64,
    slot_lock: tokio::sync::Mutex<()>,
    /// Connections that have not authenticated yet.
    gate: handshake::Gate,
    /// The admin address, recorded in the lease.
    admin: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// Slots whose series are exported.
    seen_slots: std::sync::Mutex<std::collections::HashSet<String>>,
}

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
        Ok(Arc::new(Primary {
            cfg,
            engine,
            tokens,
            metrics,
            tls,
            uuid: settings.uuid,
            conns: Default::default(),
            next_conn: AtomicU64::new(1),
            slot_lock: tokio::sync::Mutex::new(()),
            gate: handshake::Gate::default(),
            admin: Default::default(),
            seen_slots: Default::default(),
        }))
    }

    /// Record the admin address (for the lease that `slot drop` reads).
    pub fn set_admin(&self, a: std::net::SocketAddr) {
        *self.admin.lock().unwrap_or_else(|p| p.into_inner()) = Some(a);
    }

    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Result<()> {
        self.register_slots().await?;
        let listener = TcpListener::bind(self.cfg.listen)
            .await
            .with_context(|| format!("listening on {}", self.cfg.listen))?;
        tracing::info!(listen = %self.cfg.listen, tls = self.tls.is_some(), mirrors = self.tokens.len(), "primary agent serving the journal");
        let maint = tokio::spawn(self.clone().maintain(stop.clone()));
        loop {
            let (sock, peer) = tokio::select! {
                _ = stop.cancelled() => break,
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
            tokio::spawn(async move {
                if let Err(e) = me.serve(sock, stop).await {
                    tracing::info!(%peer, error = %format!("{e:#}"), "mirror connection ended");
                }
            });
        }
        // Stop every connection, then persist the acknowledgements they hold.
        for (_, (_, t)) in self.conns.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            t.cancel();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = maint.await;
        Ok(())
    }

    async fn register_slots(&self) -> Result<()> {
        let existing = slots::list(&*self.engine).await?;
        let head = self.engine.journal_bounds().await?.last;
        for name in self.tokens.keys() {
            if !existing.iter().any(|s| &s.name == name) {
                let now = fs_core::now_ns();
                slots::put(
                    &*self.engine,
                    &Slot {
                        version: slots::SLOT_VERSION,
                        name: name.clone(),
                        acked: head,
                        acked_ns: now,
                        state: SlotState::Active,
                        reason: None,
                        registered_ns: now,
                    },
                )
                .await?;
                tracing::info!(mirror = %name, from = head, "registered a replication slot");
            }
        }
        for s in &existing {
            if !self.tokens.contains_key(&s.name) {
                tracing::warn!(mirror = %s.name, acked = s.acked, "a replication slot exists for a mirror that is not in the config; it still holds gc (drop it with `mirror-agent slot drop`)");
            }
        }
        Ok(())
    }

    /// Drop a slot, here where acknowledgements are written: under the slot lock, so no
    /// acknowledgement persisted concurrently can bring it back; the mirror's connection is
    /// closed and the status shows the slot gone at once.
    pub async fn drop_slot(&self, name: &str) -> Result<String> {
        {
            let _g = self.slot_lock.lock().await;
            if slots::get(&*self.engine, name).await?.is_none() {
                bail!("no replication slot named {name:?} (see `mirror-agent slot list`)");
            }
            slots::remove(&*self.engine, name).await?;
        }
        if let Some((_, t)) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
        {
            t.cancel();
        }
        self.metrics.remove_slot(name);
        let _ = self.refresh_status().await;
        tracing::warn!(mirror = %name, "replication slot dropped by an operator: gc and journal retention no longer wait for it; if it connects again it must resync");
        Ok(format!("dropped slot {name:?}: gc and journal retention no longer wait for it; if the mirror connects again, it resyncs from a snapshot"))
    }

    /// Tell `slot drop` in other processes that this agent keeps the slots (so they go
    /// through it): an aux record refreshed every few seconds, removed at a clean stop.
    async fn beat(&self, admin: Option<std::net::SocketAddr>) -> Result<()> {
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

    /// Read-modify-write of one slot; None when the slot is gone (dropped by an operator).
    async fn update_slot(&self, name: &str, f: impl FnOnce(&mut Slot)) -> Result<Option<Slot>> {
        let _g = self.slot_lock.lock().await;
        let Some(mut s) = slots::get(&*self.engine, name).await? else {
            return Ok(None);
        };
        let before = s.clone();
        f(&mut s);
        if s != before {
            slots::put(&*self.engine, &s).await?;
        }
        Ok(Some(s))
    }

    async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_trim = tokio::time::Instant::now() - self.cfg.trim_interval;
        let mut last_beat = tokio::time::Instant::now() - LEASE_EVERY;
        let mut trim_unsupported = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = self.engine.aux_put(LEASE, None).await;
                    return;
                }
                _ = tick.tick() => {}
            }
            if last_beat.elapsed() >= LEASE_EVERY {
                last_beat = tokio::time::Instant::now();
                let admin = *self.admin.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.beat(admin).await {
                    tracing::warn!(error = %format!("{e:#}"), "recording this agent beside the volume");
                }
            }
            if let Err(e) = self.refresh_status().await {
                tracing::warn!(error = %format!("{e:#}"), "refreshing status");
            }
            if last_trim.elapsed() < self.cfg.trim_interval {
                continue;
            }
            last_trim = tokio::time::Instant::now();
            if let Err(e) = self.enforce_caps().await {
                tracing::warn!(error = %format!("{e:#}"), "checking replication slots");
            }
            if trim_unsupported {
                continue;
            }
            match self.trim().await {
                Ok(n) if n > 0 => {
                    self.metrics.journal_trimmed.inc_by(n);
                    tracing::info!(entries = n, "journal trimmed behind the slowest mirror");
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ReadOnly => {
                    trim_unsupported = true;
                    tracing::info!("the volume is open read-only here (RocksDB has one writer): journal trimming is left to `jfs gc`, which honours the slots");
                }
                Err(e) => tracing::warn!(error = %e, "trimming the journal"),
            }
        }
    }

    async fn trim(&self) -> fs_core::Result<u64> {
        let slots = slots::list(&*self.engine).await?;
        let floor = slots::retain_floor(&slots);
        // Read each time: settings change through the journal (a cutover, `jfs` commands).
        let settings = fs_core::Fs::load_settings(&*self.engine).await?;
        let cutoff = fs_core::now_ns() - settings.journal_retention_secs as i64 * 1_000_000_000;
        let r = fs_core::maint::trim_journal(&*self.engine, cutoff, floor).await;
        tracing::debug!(floor, retention_secs = settings.journal_retention_secs, result = ?r, "journal trim");
        r
    }

    /// The volume's settings as they are now (they change through the journal).
    async fn settings_now(&self) -> Result<Vec<u8>> {
        self.engine
            .get(keys::SETTING)
            .await?
            .context("the volume's settings are gone")
    }

    /// Mark slots past the retention cap as needing resync: loudly, never silently.
    async fn enforce_caps(&self) -> Result<()> {
        let head = self.engine.journal_bounds().await?.last;
        for s in slots::list(&*self.engine).await? {
            if s.state != SlotState::Active || s.acked >= head {
                continue;
            }
            let behind = head - s.acked;
            let mut reason = None;
            if behind > self.cfg.retain_max_entries {
                reason = Some(format!(
                    "{behind} entries behind, over retain_max_entries = {}",
                    self.cfg.retain_max_entries
                ));
            } else if let Some((_, f)) = self
                .engine
                .journal_read(s.acked + 1, 1)
                .await
                .ok()
                .and_then(|v| v.into_iter().next())
            {
                let e = Entry::decode(&f)?;
                let age = Duration::from_nanos((fs_core::now_ns() - e.time_ns).max(0) as u64);
                if age > self.cfg.retain_max_age {
                    reason = Some(format!(
                        "oldest unacknowledged entry is {} old, over retain_max_age = {}",
                        humantime::format_duration(Duration::from_secs(age.as_secs())),
                        humantime::format_duration(self.cfg.retain_max_age)
                    ));
                }
            }
            if let Some(reason) = reason {
                tracing::error!(mirror = %s.name, acked = s.acked, head, %reason, "replication slot dropped: the journal is no longer held for this mirror; it must resync from a snapshot");
                self.update_slot(&s.name, |s| {
                    s.state = SlotState::NeedsResync;
                    s.reason = Some(reason.clone());
                })
                .await?;
            }
        }
        Ok(())
    }

    async fn refresh_status(&self) -> Result<()> {
        let b = self.engine.journal_bounds().await?;
        self.metrics.head_seq.set(b.last as i64);
        self.metrics.journal_first.set(b.first as i64);
        let slots = slots::list(&*self.engine).await?;
        let connected: Vec<String> = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        // Series of slots that are gone (dropped by `slot drop` elsewhere) go too.
        {
            let now: std::collections::HashSet<String> =
                slots.iter().map(|s| s.name.clone()).collect();
            let mut seen = self.seen_slots.lock().unwrap_or_else(|p| p.into_inner());
            for gone in seen.difference(&now) {
                self.metrics.remove_slot(gone);
            }
            *seen = now;
        }
        let mut list = Vec::new();
        for s in &slots {
            let l = label(&s.name);
            let lag = b.last.saturating_sub(s.acked);
            self.metrics
                .slot_acked
                .get_or_create(&l)
                .set(s.acked as i64);
            self.metrics
                .slot_lag_entries
                .get_or_create(&l)
                .set(lag as i64);
            self.metrics
                .slot_needs_resync
                .get_or_create(&l)
                .set((s.state == SlotState::NeedsResync) as i64);
            let conn = connected.contains(&s.name);
            self.metrics
                .slot_connected
                .get_or_create(&l)
                .set(conn as i64);
            list.push(serde_json::json!({
                "name": s.name, "acked_seq": s.acked, "lag_entries": lag,
                "state": s.state, "reason": s.reason, "connected": conn,
            }));
        }
        self.metrics.set_status(serde_json::json!({
            "role": "primary",
            "volume_uuid": self.uuid,
            "meta": self.engine.display_url(),
            "listen": self.cfg.listen.to_string(),
            "tls": self.tls.is_some(),
            "head_seq": b.last,
            "journal_first_seq": b.first,
            "mirrors": list,
            "auth_failures": self.metrics.auth_failures.get(),
            "unauthenticated_dropped": self.metrics.unauth_dropped.get(),
            "unauthenticated_pending": self.gate.pending(),
            "entries_sent": self.metrics.entries_sent.get(),
        }));
        Ok(())
    }

    async fn serve(self: Arc<Self>, sock: TcpStream, stop: CancellationToken) -> Result<()> {
        let peer = sock.peer_addr().ok();
        let peer_s = peer.map(|a| a.to_string()).unwrap_or_default();
        let _ = sock.set_nodelay(true);
        // Until it proves a token, the peer is bounded in time, size and number.
        let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let (gate_id, evicted, n) = self.gate.admit(ip);
        if n > 0 {
            self.metrics.unauth_dropped.inc_by(n as u64);
        }
        let tokens = &self.tokens;
        let handshake = async {
            let io: Box<dyn proto::Io> = match &self.tls {
                Some(acc) => Box::new(
                    acc.accept(sock)
                        .await
                        .map_err(|e| handshake::Failure::Garbage(format!("TLS handshake: {e}")))?,
                ),
                None => Box::new(sock),
            };
            let mut wire = proto::wire(io);
            let hello = handshake::accept(&mut wire, |m| tokens.get(m).cloned()).await?;
            Ok::<_, handshake::Failure>((wire, hello))
        };
        let res = tokio::select! {
            r = tokio::time::timeout(handshake::HANDSHAKE_TIMEOUT, handshake) => match r {
                Ok(r) => r,
                Err(_) => Err(handshake::Failure::Garbage(format!("no handshake within {:?}", handshake::HANDSHAKE_TIMEOUT))),
            },
            _ = evicted.cancelled() => Err(handshake::Failure::Garbage("dropped: too many unauthenticated connections".into())),
            _ = stop.cancelled() => Err(handshake::Failure::Garbage("stopping".into())),
        };
        self.gate.leave(gate_id);
        let (wire, hello) = match res {
            Ok(x) => x,
            Err(handshake::Failure::Auth(why)) => {
                self.metrics.auth_failures.inc();
                tracing::warn!(peer = %peer_s, %why, "refused: authentication failed");
                bail!("{why}");
            }
            Err(handshake::Failure::Garbage(why)) => {
                self.metrics.unauth_dropped.inc();
                tracing::debug!(peer = %peer_s, %why, "unauthenticated connection dropped");
                bail!("{why}");
            }
            Err(handshake::Failure::Io(e)) => return Err(e),
        };
        let (mut sink, mut stream) = wire.split();
        let handshake::Hello {
            mirror,
            volume_uuid,
            want,
            prev_crc,
            epoch,
        } = hello;
        let refuse = |reason: String, resync: bool| ToMirror::Refused { reason, resync };
        if let Some(u) = &volume_uuid {
            if u != &self.uuid {
                let r = format!("the mirror holds volume {u}, this primary serves {}; refusing to mix them (resync the mirror into an empty metadata store)", self.uuid);
                proto::send(&mut sink, &refuse(r.clone(), false)).await?;
                bail!(r);
            }
        }
        // Epochs: a primary that was fenced, or that a mirror knows was superseded by a
        // promotion, ships nothing.
        if let Some(m) = fs_core::site::marker(&*self.engine).await? {
            let r = format!("this primary was fenced: its metadata is now mirror {:?} of the primary at {} (the volume moved); point this mirror at the new primary", m.name, m.primary);
            tracing::error!(mirror = %mirror, "{r}");
            proto::send(&mut sink, &refuse(r.clone(), false)).await?;
            bail!(r);
        }
        let mine = fs_core::site::epoch(&*self.engine).await?;
        if epoch > mine {
            let r = format!("this primary is at epoch {mine} but mirror {mirror:?} has seen epoch {epoch}: another site was promoted and this one is superseded; fence it (`mirror-agent fence`) and rejoin it as a mirror of the new primary (runbooks/failover.md)");
            tracing::error!(mirror = %mirror, "{r}");
            proto::send(&mut sink, &refuse(r.clone(), false)).await?;
            bail!(r);
        }
        // A mirror from before a promotion (the old primary rejoining): a history that
        // differs past the promotion point is that site's lost tail, and it resyncs.
        let rejoining = epoch < mine;
        // Replace an older connection of the same mirror.
        let my_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let conn_stop = stop.child_token();
        if let Some((_, old)) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mirror.clone(), (my_id, conn_stop.clone()))
        {
            old.cancel();
        }
        let res = self
            .stream(
                &mirror,
                want,
                prev_crc,
                rejoining,
                &mut sink,
                &mut stream,
                &conn_stop,
            )
            .await;
        {
            let mut c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            if c.get(&mirror).is_some_and(|(id, _)| *id == my_id) {
                c.remove(&mirror);
            }
        }
        if let Err(e) = &res {
            tracing::info!(mirror = %mirror, error = %format!("{e:#}"), "stream ended");
        }
        res
    }

    async fn stream<S, R>(
        &self,
        mirror: &str,
        want: Want,
        prev_crc: Option<u32>,
        rejoining: bool,
        sink: &mut S,
        stream: &mut R,
        stop: &CancellationToken,
    ) -> Result<()>
    where
        S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
        R: futures::Stream<Item = std::io::Result<bytes::BytesMut>> + Unpin + Send,
    {
        let refuse = |reason: String, resync: bool| ToMirror::Refused { reason, resync };
        let slot = slots::get(&*self.engine, mirror).await?;
        if slot.is_none() {
            // Dropped by an operator: start a fresh slot; the mirror must bootstrap.
            tracing::warn!(mirror, "a mirror whose slot was dropped connected again: registering a new slot; it resyncs from a snapshot");
            self.register_slots().await?;
        }
        if let Want::From(from) = want {
            let b = self.engine.journal_bounds().await?;
            let reason = match &slot {
                None => Some("this mirror's replication slot was dropped".to_string()),
                Some(s) if s.state == SlotState::NeedsResync => Some(format!(
                    "the replication slot was dropped ({})",
                    s.reason.clone().unwrap_or_default()
                )),
                _ if from < b.first => Some(format!(
                    "entry {from} is no longer retained (first retained is {})",
                    b.first
                )),
                _ => None,
            };
            if let Some(r) = reason {
                return Err(refuse_resync(sink, r).await);
            }
            if let (Some(c), true) = (prev_crc, from > b.first) {
                let ours = self
                    .engine
                    .journal_read(from - 1, 1)
                    .await?
                    .into_iter()
                    .next()
                    .filter(|(seq, _)| *seq == from - 1);
                if let Some((_, f)) = ours {
                    if crc32c::crc32c(&f) != c {
                        let r = format!("the mirror's entry {} differs from the primary's: its metadata was changed by something other than its agent, or the primary's history changed", from - 1);
                        tracing::error!(
                            mirror,
                            seq = from - 1,
                            "a mirror's history differs from the primary's"
                        );
                        return Err(refuse_resync(sink, r).await);
                    }
                }
            }
            if from > b.last + 1 && rejoining {
                let r = format!("this site's history goes on past the promotion point (it has {} entries, the new primary {}): its diverged tail is dropped by a resync", from - 1, b.last);
                tracing::warn!(mirror, "{r}");
                return Err(refuse_resync(sink, r).await);
            }
            if from > b.last + 1 {
                let r = format!("the mirror has applied up to {} but the primary's head is {}: a different history (was the primary restored from a backup?); resync the mirror by hand (runbooks/resync-mirror.md)", from - 1, b.last);
                proto::send(sink, &refuse(r.clone(), false)).await?;
                bail!(r);
            }
        }
        self.stream_inner(mirror, want, sink, stream, stop).await
    }

    async fn stream_inner<S, R>(
        &self,
        mirror: &str,
        want: Want,
        sink: &mut S,
        stream: &mut R,
        stop: &CancellationToken,
    ) -> Result<()>
    where
        S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
        R: futures::Stream<Item = std::io::Result<bytes::BytesMut>> + Unpin + Send,
    {
        let head = self.engine.journal_bounds().await?.last;
        proto::send(
            sink,
            &ToMirror::Welcome {
                volume_uuid: self.uuid.clone(),
                head,
                epoch: fs_core::site::epoch(&*self.engine).await?,
            },
        )
        .await?;
        let mut cursor = match want {
            Want::From(f) => f.max(1),
            Want::Snapshot => self.send_snapshot(mirror, sink).await? + 1,
        };
        tracing::info!(mirror, from = cursor, "streaming the journal");
        // Acknowledgements arrive on the other half; the slot is written at most every 500 ms.
        let acked = Arc::new(AtomicU64::new(cursor - 1));
        let reader = {
            let acked = acked.clone();
            async move {
                loop {
                    match proto::recv::<ToPrimary, _>(stream).await? {
                        Some(ToPrimary::Ack { seq }) => {
                            acked.fetch_max(seq, Ordering::SeqCst);
                        }
                        Some(other) => bail!("unexpected message {other:?}"),
                        None => return Ok::<(), anyhow::Error>(()),
                    }
                }
            }
        };
        tokio::pin!(reader);
        let mut persisted = 0u64;
        const PERSIST_EVERY: Duration = Duration::from_millis(500);
        let mut last_persist = tokio::time::Instant::now() - PERSIST_EVERY;
        let mut last_send = tokio::time::Instant::now();
        let res: Result<()> = loop {
            // Persist acknowledgements; a slot dropped meanwhile ends the stream.
            let a = acked.load(Ordering::SeqCst);
            if a > persisted && last_persist.elapsed() >= PERSIST_EVERY {
                last_persist = tokio::time::Instant::now();
                match self.persist_ack(mirror, a).await? {
                    None => {
                        let r = "this mirror's replication slot was dropped by an operator";
                        break Err(refuse_resync(sink, r.to_string()).await);
                    }
                    Some(s) if s.state == SlotState::NeedsResync => {
                        let r = format!(
                            "the replication slot was dropped ({})",
                            s.reason.unwrap_or_default()
                        );
                        break Err(refuse_resync(sink, r).await);
                    }
                    Some(_) => persisted = a,
                }
            }
            let frames = match self.read_batch(cursor).await {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::SeqNotRetained => {
                    break Err(refuse_resync(sink, e.to_string()).await);
                }
                Err(e) => break Err(e.into()),
            };
            if !frames.is_empty() {
                let n = frames.len() as u64;
                cursor = frames.last().expect("non-empty").0 + 1;
                let msg = ToMirror::Entries { frames };
                tokio::select! {
                    r = proto::send(sink, &msg) => r?,
                    r = &mut reader => break r.and(Err(anyhow!("the mirror closed the connection"))),
                    _ = stop.cancelled() => break Ok(()),
                }
                self.metrics.entries_sent.inc_by(n);
                last_send = tokio::time::Instant::now();
                continue;
            }
            if last_send.elapsed() >= Duration::from_millis(500) {
                let (head, t) = self.head_time().await?;
                proto::send(
                    sink,
                    &ToMirror::Heartbeat {
                        head,
                        head_time_ns: t,
                    },
                )
                .await?;
                last_send = tokio::time::Instant::now();
            }
            tokio::select! {
                r = self.engine.journal_wait(cursor - 1, Duration::from_millis(500)) => { r?; }
                r = &mut reader => break r.and(Err(anyhow!("the mirror closed the connection"))),
                _ = stop.cancelled() => break Ok(()),
            }
        };
        // Keep what was acknowledged.
        let a = acked.load(Ordering::SeqCst);
        if a > persisted {
            let _ = self.persist_ack(mirror, a).await;
        }
        res
    }

    /// Record an acknowledgement in an active slot; the slot as it now is (None: dropped).
    async fn persist_ack(&self, mirror: &str, acked: u64) -> Result<Option<Slot>> {
        self.update_slot(mirror, |s| {
            if s.state == SlotState::Active && acked > s.acked {
                s.acked = acked;
                s.acked_ns = fs_core::now_ns();
            }
        })
        .await
    }

    async fn read_batch(&self, cursor: u64) -> fs_core::Result<Vec<(u64, Vec<u8>)>> {
        let mut frames = self.engine.journal_read(cursor, BATCH).await?;
        let mut bytes = 0;
        if let Some(cut) = frames.iter().position(|(_, f)| {
            bytes += f.len();
            bytes > BATCH_BYTES
        }) {
            frames.truncate(cut.max(1));
        }
        Ok(frames)
    }

    async fn head_time(&self) -> Result<(u64, i64)> {
        let head = self.engine.journal_bounds().await?.last;
        let t = match self.engine.journal_read(head, 1).await {
            Ok(v) => match v.first() {
                Some((_, f)) => Entry::decode(f)?.time_ns,
                None => 0,
            },
            Err(_) => 0,
        };
        Ok((head, t))
    }

    /// Send a snapshot and return its starting sequence number. The slot is pinned at the
    /// start first, so the journal after it is retained while the pairs are read.
    async fn send_snapshot<S>(&self, mirror: &str, sink: &mut S) -> Result<u64>
    where
        S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
    {
        let s0 = loop {
            let s0 = self.engine.journal_bounds().await?.last;
            self.update_slot(mirror, |s| {
                s.acked = s0;
                s.acked_ns = fs_core::now_ns();
                s.state = SlotState::Active;
                s.reason = None;
            })
            .await?;
            // A trim that raced the pin would show as a first entry past s0 + 1.
            let b = self.engine.journal_bounds().await?;
            if b.first <= s0 + 1 {
                break s0;
            }
        };
        tracing::info!(mirror, seq = s0, "sending a snapshot");
        proto::send(
            sink,
            &ToMirror::SnapshotBegin {
                seq: s0,
                settings: self.settings_now().await?,
            },
        )
        .await?;
        let mut n = 0u64;
        let mut from = Vec::new();
        loop {
            let page = self.engine.scan(&from, &[0xff], 1000).await?;
            let len = page.len();
            n += len as u64;
            if let Some((k, _)) = page.last() {
                from = k.clone();
                from.push(0);
            }
            if len > 0 {
                proto::send(sink, &ToMirror::SnapshotPairs { pairs: page }).await?;
            }
            if len < 1000 {
                break;
            }
        }
        let s_end = self.engine.journal_bounds().await?.last;
        proto::send(sink, &ToMirror::SnapshotEnd { seq: s_end }).await?;
        tracing::info!(mirror, keys = n, s0, s_end, "snapshot sent");
        Ok(s0)
    }
}

/// Tell the mirror it must resync from a snapshot; the error that ends the stream.
async fn refuse_resync<S>(sink: &mut S, why: String) -> anyhow::Error
where
    S: futures::Sink<bytes::Bytes, Error = std::io::Error> + Unpin,
{
    let reason = format!("{why}: resync from a snapshot");
    let _ = proto::send(
        sink,
        &ToMirror::Refused {
            reason: reason.clone(),
            resync: true,
        },
    )
    .await;
    anyhow!(reason)
}
