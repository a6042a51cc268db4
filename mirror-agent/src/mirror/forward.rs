//! Writes at this mirror site: the agent relays the changes of the site's mounts to the
//! primary. A `forward link` worker keeps a second authenticated connection to the primary
//! agent (`Want::Forward`); the primary says there whether it lets this mirror write, and
//! the answer goes into the progress record the mounts read (`forward_socket`). The mounts
//! send each change (a `CommitRequest` with what it read) to the forward socket in the state
//! directory (`volume::forward::SOCKET_NAME`, mode 0600 from its first moment, and only
//! the agent's user and root are answered: SO_PEERCRED); the agent sends it on with an id and
//! hands the primary's answer back. Many changes are in flight on the one connection.
//!
//! Bounded everywhere: a change waits at most `ANSWER_WAIT` for the primary; a lost link fails
//! what was in flight at once (such a change may have been committed: it then arrives with
//! the journal), and the next change finds the link reconnecting and fails at once, EIO at
//! the mount. The mirror's metadata is written only by applying the journal, as before.
//!
//! Failed writes are counted here, where the operator looks: the changes this agent failed
//! or was refused (`forward_failed`), and what the mounts report over the same socket
//! (`ForwardRequest::Failed`: a block the origin store refused, a change the agent did not
//! answer; `mount_write_failures`); the status shows both counts and the last cause.

use super::*;
use background::{Worker, WorkerState};
use fs_core::retry::Backoff;
use tokio::sync::oneshot;
use volume::forward::{self as fwd, ForwardReply, ForwardRequest};

/// How long a change waits for the primary's answer (below the mount's own bound).
const ANSWER_WAIT: Duration = Duration::from_secs(8);
/// The pause before reconnecting the forward link (short: writes at the site wait on it).
const RELINK: Backoff = Backoff {
    base: Duration::from_millis(200),
    cap: Duration::from_secs(1),
    full_jitter: false,
};
/// How long an answer waits for this site to apply its change (the mount waits longer).
const APPLIED_WAIT: Duration = Duration::from_secs(1);
/// How often the sessions of the site's writing mounts are sent to the primary (well within
/// the session timeout, and soon after a mount starts).
const SESSIONS_EVERY: Duration = Duration::from_secs(3);
/// The pause after the primary refused this mirror's writes (it may be allowed later: an
/// operator who sets `allow_writes` and restarts the primary agent sees the site's mounts
/// allowed within a few seconds; 30 s here made it 26 s). A refusal costs one handshake.
const REFUSED_PAUSE: Duration = Duration::from_secs(3);
/// The pause after the primary refused the link itself (fenced, superseded, this mirror not
/// yet past a promotion it must apply first, a bad token): 2 s, doubling to 30 s while it
/// goes on (the first cases may change within seconds; each refusal is logged there).
const LINK_REFUSED: Backoff = Backoff {
    base: Duration::from_secs(2),
    cap: Duration::from_secs(30),
    full_jitter: false,
};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<ForwardReply>>>>;

/// The forward link's state, shared by the worker and the socket's connections.
#[derive(Default)]
pub(crate) struct Forwarding {
    /// Requests for the live link, when there is one.
    tx: Mutex<Option<mpsc::Sender<(u64, fs_core::CommitRequest)>>>,
    pending: Pending,
    next_id: std::sync::atomic::AtomicU64,
    /// Whether the primary lets this mirror write: None until it said; Err(why) if not.
    pub(crate) allowed: Mutex<Option<std::result::Result<(), String>>>,
    last_error: Mutex<Option<String>>,
    /// The cause of the last failed write at this site (a refused or unanswered change, or
    /// what a mount reported: `ForwardRequest::Failed`), for the status.
    pub(crate) last_failure: Mutex<Option<String>>,
    /// A change went unanswered: the link is torn down (and reset, so that what it had not
    /// delivered never arrives later), and the next change finds a new one.
    give_up: tokio::sync::Notify,
}

impl Forwarding {
    /// Keep `cause` as the last failed write's.
    pub(crate) fn failure(&self, cause: &str) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause.to_string());
    }

    /// The cause of the last failed write, if any.
    pub(crate) fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the primary lets this mirror write, as last heard.
    pub(crate) fn allowed_now(&self) -> Option<std::result::Result<(), String>> {
        self.allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn failed(kind: fs_core::ErrorKind, temporary: bool, message: String) -> ForwardReply {
    ForwardReply::Failed {
        kind,
        message,
        temporary,
    }
}

impl Mirror {
    /// The forward socket's path.
    pub(crate) fn forward_socket(&self) -> std::path::PathBuf {
        self.state_dir.join(fwd::SOCKET_NAME)
    }

    /// Relay one change to the primary and return its answer (never waits unbounded).
    pub(crate) async fn forward(&self, req: fs_core::CommitRequest) -> ForwardReply {
        let t0 = Instant::now();
        let f = &self.fwd;
        if let Some(Err(why)) = f.allowed_now() {
            self.metrics.fwd_sent_failed.inc();
            f.failure(&why);
            return failed(fs_core::ErrorKind::ReadOnly, false, why);
        }
        let tx = f.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(tx) = tx else {
            self.metrics.fwd_sent_failed.inc();
            let last = f
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let why = format!(
                "no link to the primary at {}: the change was not made ({})",
                self.cfg.primary,
                last.unwrap_or_else(|| "not connected yet".into())
            );
            f.failure(&why);
            return failed(fs_core::ErrorKind::Backend, true, why);
        };
        let id = f.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (done, answer) = oneshot::channel();
        f.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, done);
        let reply = if tx.send((id, req)).await.is_err() {
            failed(
                fs_core::ErrorKind::Backend,
                true,
                format!(
                    "the link to the primary at {} just closed: the change was not made",
                    self.cfg.primary
                ),
            )
        } else {
            match tokio::time::timeout(ANSWER_WAIT, answer).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => failed(
                    fs_core::ErrorKind::Backend,
                    true,
                    format!("the link to the primary at {} was lost while it committed this change: it may have been made, and then shows here once applied", self.cfg.primary),
                ),
                Err(_) => {
                    f.give_up.notify_one();
                    failed(
                        fs_core::ErrorKind::Backend,
                        true,
                        format!("no answer from the primary at {} within {ANSWER_WAIT:?}: the change may have been made, and then shows here once applied", self.cfg.primary),
                    )
                }
            }
        };
        f.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.metrics
            .fwd_sent_seconds
            .inc_by(t0.elapsed().as_secs_f64());
        let applied_by = match &reply {
            ForwardReply::Committed { seq, .. } => {
                self.metrics.fwd_sent.inc();
                Some(*seq)
            }
            ForwardReply::Conflict { head } => {
                self.metrics.fwd_sent_conflicts.inc();
                Some(*head)
            }
            ForwardReply::Failed { message, .. } => {
                self.metrics.fwd_sent_failed.inc();
                self.fwd.failure(message);
                None
            }
        };
        // The answer goes back once this site has applied the change (briefly bounded: the
        // mount waits on for the rest), so the mount sees it at its first look instead of
        // polling for it (a RocksDB reader catches up when asked).
        if let Some(seq) = applied_by {
            self.wait_applied(seq, APPLIED_WAIT).await;
        }
        reply
    }

    /// Wait until the live metadata holds entry `seq`, at most `limit`.
    async fn wait_applied(&self, seq: u64, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let Ok(b) = self.engine.journal_bounds().await else {
                return;
            };
            let left = limit.saturating_sub(t0.elapsed());
            if b.last >= seq || left.is_zero() {
                return;
            }
            let _ = self.engine.journal_wait(b.last, left).await;
        }
    }

    /// One forward link: connect, greet with `Want::Forward`, then relay until it breaks.
    async fn forward_link(self: &Arc<Self>, stop: &CancellationToken) -> Result<End> {
        let mut wire = tokio::select! {
            _ = stop.cancelled() => return Ok(End::Stopped),
            w = dial_with(&self.cfg.primary, &self.tls, true) => w?,
        };
        let hello = ToPrimary::Hello {
            proto: proto::PROTO_VERSION,
            mirror: self.cfg.name.clone(),
            volume_uuid: self.settings().map(|s| s.uuid),
            nonce: proto::nonce(),
            want: Want::Forward,
            prev_crc: None,
            epoch: fs_core::site::epoch(&*self.engine).await?,
            identity: crate::site::identity(&*self.engine)
                .await?
                .unwrap_or_default(),
        };
        match handshake::connect(
            &mut wire,
            &self.cfg.primary,
            &self.token,
            hello,
            READ_TIMEOUT,
        )
        .await
        {
            Ok(_) => {}
            Err(e) => {
                // Only the primary's "may not write" is about the permission (EROFS at the
                // mounts); its other refusals (fenced, superseded, this mirror behind a
                // promotion, a bad token) leave the link down (EIO), and it is tried again.
                return Ok(
                    match handshake::failure(&e).map(|f| (f.kind(), f.status())) {
                        Some((fs_core::ErrorKind::ReadOnly, _)) => End::Refused(e),
                        Some((_, fs_core::ErrorStatus::Permanent))
                        | Some((_, fs_core::ErrorStatus::Persistent)) => End::Foreign(e),
                        _ => End::Retry(e),
                    },
                );
            }
        }
        let was = self
            .fwd
            .allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(Ok(()));
        if !matches!(was, Some(Ok(()))) {
            tracing::info!(primary = %self.cfg.primary, socket = %self.forward_socket().display(), "the primary lets this mirror write: the site's mounts write through to it");
            self.publish_now().await;
        }
        let (tx, mut rx) = mpsc::channel::<(u64, fs_core::CommitRequest)>(256);
        *self.fwd.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        self.metrics.fwd_connected.set(1);
        let (mut sink, mut stream) = wire.split();
        // A give-up from before this link is not about it.
        let _ = tokio::time::timeout(Duration::ZERO, self.fwd.give_up.notified()).await;
        let mut sessions = tokio::time::interval(SESSIONS_EVERY);
        sessions.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let end = loop {
            tokio::select! {
                _ = stop.cancelled() => break Ok(End::Stopped),
                _ = sessions.tick() => {
                    let records = match self.writing_sessions().await {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!(error = %e, "listing this site's sessions failed; sent at the next tick");
                            continue;
                        }
                    };
                    if let Err(e) = proto::send(&mut sink, &ToPrimary::Sessions { records }).await {
                        break Err(e);
                    }
                }
                _ = self.fwd.give_up.notified() => {
                    break Err(anyhow!("a change went unanswered for {ANSWER_WAIT:?}: the forward link is reset"));
                }
                Some((id, req)) = rx.recv() => {
                    if let Err(e) = proto::send(&mut sink, &ToPrimary::Commit { id, req }).await {
                        break Err(e);
                    }
                }
                msg = proto::recv::<ToMirror, _>(&mut stream) => match msg {
                    Ok(Some(ToMirror::Forwarded { id, reply })) => {
                        if let Some(done) = self.fwd.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id) {
                            let _ = done.send(reply);
                        }
                    }
                    Ok(Some(other)) => break Err(anyhow!("unexpected {} on the forward link", proto::msg_name(&other))),
                    Ok(None) => break Err(anyhow!("the primary closed the forward link")),
                    Err(e) => break Err(e),
                },
            }
        };
        // What was in flight fails now (its senders are dropped); new changes fail at once
        // until the link is back.
        *self.fwd.tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.fwd
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.metrics.fwd_connected.set(0);
        end.or_else(|e| Ok(End::Retry(e)))
    }

    /// The session records of this site's live writing mounts, as stored.
    async fn writing_sessions(&self) -> Result<Vec<Vec<u8>>> {
        let now = fs_core::now_ns();
        let mut out = Vec::new();
        for (name, v) in self.engine.aux_list(fs_core::session::PREFIX).await? {
            let s: fs_core::session::Session =
                fs_core::record::decode_as(&format!("session record {name}"), &v)?;
            if s.forwarded
                && s.relayed_by.is_none()
                && s.is_live(now, fs_core::session::DEFAULT_TIMEOUT)
            {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Serve the forward socket for the site's mounts until `stop`.
    pub(crate) async fn serve_forward_socket(
        self: Arc<Self>,
        stop: CancellationToken,
    ) -> Result<()> {
        let path = self.forward_socket();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("removing the old {}", path.display()))
            }
        }
        // 0600 from the moment it has its name (bound in a private directory, then moved),
        // and each peer checked: a change sent here is committed at the primary.
        let listener = mount::control::bind_private(&path)
            .with_context(|| format!("listening on {}", path.display()))?;
        let conns = tokio_util::task::TaskTracker::new();
        loop {
            let mut sock = tokio::select! {
                _ = stop.cancelled() => break,
                r = mount::control::accept_trusted(&listener) => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting on the forward socket");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let me = self.clone();
            conns.spawn(async move {
                loop {
                    let req = match fwd::read_frame::<_, ForwardRequest>(&mut sock).await {
                        Ok(Some(ForwardRequest::Commit(r))) => r,
                        Ok(Some(ForwardRequest::Failed { cause })) => {
                            // A write the mount could not make (the origin store refused a
                            // block, say): counted and shown in the status, as the operator
                            // looks there rather than at each mount's log.
                            me.metrics.mount_write_failures.inc();
                            me.fwd.failure(&cause);
                            tracing::warn!(%cause, "a write at a mount of this site failed");
                            continue;
                        }
                        Ok(None) => return,
                        Err(e) => {
                            tracing::debug!(error = %e, "a mount's forward request does not decode");
                            return;
                        }
                    };
                    let reply = me.forward(req).await;
                    if fwd::write_frame(&mut sock, &reply).await.is_err() {
                        return;
                    }
                }
            });
        }
        // Changes in flight get their answers (each is bounded by `ANSWER_WAIT`).
        conns.close();
        let _ = tokio::time::timeout(ANSWER_WAIT, conns.wait()).await;
        let _ = std::fs::remove_file(&path);
        Ok(())
    }
}

/// Keeps the forward link up (see the module comment).
pub(super) struct ForwardWorker {
    m: Arc<Mirror>,
    failures: u32,
}

impl ForwardWorker {
    pub(super) fn new(m: Arc<Mirror>) -> Self {
        ForwardWorker { m, failures: 0 }
    }
}

#[async_trait::async_trait]
impl Worker for ForwardWorker {
    fn name(&self) -> String {
        "forward link".into()
    }

    async fn work(&mut self, stop: &CancellationToken) -> Result<WorkerState> {
        if stop.is_cancelled() {
            return Ok(WorkerState::Done);
        }
        let m = self.m.clone();
        let started = Instant::now();
        let end = m.forward_link(stop).await.unwrap_or_else(End::Retry);
        if started.elapsed() > Duration::from_secs(3) {
            self.failures = 0;
        }
        match end {
            End::Stopped => Ok(WorkerState::Done),
            End::Refused(e) => {
                let why = handshake::describe(&e);
                let was = m
                    .fwd
                    .allowed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(Err(why.clone()));
                if was.as_ref().and_then(|r| r.as_ref().err()) != Some(&why) {
                    tracing::info!(reason = %why, "the primary does not let this mirror write: the site's mounts are read-only");
                    m.publish_now().await;
                }
                Ok(WorkerState::Throttled(REFUSED_PAUSE))
            }
            End::Foreign(e) => {
                let why = handshake::describe(&e);
                let was = m
                    .fwd
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .replace(why.clone());
                if was.as_deref() != Some(why.as_str()) {
                    tracing::warn!(primary = %m.cfg.primary, reason = %why, "the primary refuses this mirror's link: the site's changes fail (EIO) until it takes them");
                }
                let pause = LINK_REFUSED.delay(self.failures);
                self.failures = self.failures.saturating_add(1);
                Ok(WorkerState::Throttled(pause))
            }
            End::Retry(e) => {
                let msg = format!("{e:#}");
                *m.fwd.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg.clone());
                let pause = RELINK.delay(self.failures);
                self.failures = self.failures.saturating_add(1);
                tracing::debug!(error = %msg, retry_in = ?pause, "the forward link to the primary is down");
                Ok(WorkerState::Throttled(pause))
            }
            End::Kicked | End::Resync(_) => Ok(WorkerState::Busy),
        }
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        WorkerState::Busy
    }
}
