//! The replication worker: runs one session with the primary after another (`session`) and
//! decides how soon to reconnect: at once after an operator's resync request, soon after a
//! lost connection (`RECONNECT`, from its start again after a session that worked), seldom
//! after a refusal (`REFUSED`: a configuration problem). It stops the agent when the metadata
//! is no longer a mirror's (replaying into it would fork it).

use super::*;
use background::{Worker, WorkerState, WorkerStatus};
use fs_core::retry::Backoff;

/// The pause before reconnecting after a lost connection: 200 ms doubling to 5 s.
const RECONNECT: Backoff = Backoff {
    base: Duration::from_millis(200),
    cap: Duration::from_secs(5),
    full_jitter: false,
};

/// The pause after a refusal: 30 s doubling to 10 min.
const REFUSED: Backoff = Backoff {
    base: Duration::from_secs(30),
    cap: Duration::from_secs(600),
    full_jitter: false,
};

pub(super) struct ReplicationWorker {
    m: Arc<Mirror>,
    /// Sessions in a row that failed (the next pause grows with them).
    failures: u32,
    first: bool,
    /// Refusals in a row (their pause grows with them).
    refusals: u32,
    /// First replies in a row that were not the protocol.
    foreign: u32,
}

impl ReplicationWorker {
    pub(super) fn new(m: Arc<Mirror>) -> Self {
        ReplicationWorker {
            m,
            failures: 0,
            first: true,
            refusals: 0,
            foreign: 0,
        }
    }
}

#[async_trait::async_trait]
impl Worker for ReplicationWorker {
    fn name(&self) -> String {
        "replication".into()
    }

    /// One session, then what to do next.
    async fn work(&mut self, stop: &CancellationToken) -> Result<WorkerState> {
        if stop.is_cancelled() {
            return Ok(WorkerState::Done);
        }
        let m = self.m.clone();
        if !self.first {
            m.metrics.reconnects.inc();
        }
        self.first = false;
        let started = Instant::now();
        let end = m.session(stop).await;
        if started.elapsed() > Duration::from_secs(3) {
            self.failures = 0; // it was working: retry soon
        }
        {
            let mut lv = m.live.lock().unwrap_or_else(|p| p.into_inner());
            lv.connected = false;
            lv.received.clear();
        }
        self.foreign = if matches!(end, End::Foreign(_)) {
            self.foreign + 1
        } else {
            0
        };
        // Three first replies in a row that are not the protocol: the peer is something
        // else, a configuration problem like a refusal.
        let end = match end {
            End::Foreign(e) if self.foreign >= 3 => End::Refused(persistent(e)),
            End::Foreign(e) => End::Retry(e),
            other => other,
        };
        if !matches!(end, End::Refused(_)) {
            self.refusals = 0;
        }
        match end {
            End::Stopped => return Ok(WorkerState::Done),
            End::Kicked => {
                self.failures = 0;
                return Ok(WorkerState::Busy);
            }
            End::Resync(reason) => {
                m.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .needs_resync = true;
                if m.cfg.auto_resync {
                    tracing::error!(%reason, "the primary requires a resync: bootstrapping again from a snapshot (auto_resync)");
                    m.force_snapshot
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    self.failures = 0;
                } else {
                    tracing::error!(%reason, "the primary requires a resync and auto_resync is off: this mirror is stale until an operator resyncs it (runbooks/resync-mirror.md)");
                    return Ok(WorkerState::Throttled(Duration::from_secs(30)));
                }
            }
            End::Retry(e) if replay_fenced(&e) => {
                // The marker is gone (`mirror-agent detach`, or a promotion): this metadata
                // is no longer a mirror's, and replaying into it would fork it.
                m.halt_with(e.context(
                    "this metadata is no longer a mirror's (detached?): the mirror agent stops",
                ));
                return Ok(WorkerState::Done);
            }
            End::Refused(e) => {
                // A configuration problem (a wrong token or name, a foreign volume, not a
                // primary agent at all): retried, since the other side may be fixed, but
                // seldom, loudly, and shown in `status` as the reason.
                self.refusals += 1;
                let wait = REFUSED.delay(self.refusals - 1);
                let msg = handshake::describe(&e);
                tracing::error!(reason = %msg, retry_in = ?wait, "the primary refuses this mirror; fix the configuration (retrying seldom until then)");
                {
                    let mut lv = m.live.lock().unwrap_or_else(|p| p.into_inner());
                    lv.refused = Some(msg.clone());
                    lv.last_error = Some(msg);
                }
                return Ok(WorkerState::Throttled(wait));
            }
            // (`Foreign` was made `Retry` or `Refused` above.)
            End::Retry(e) | End::Foreign(e) => {
                if e.chain()
                    .any(|c| c.downcast_ref::<proto::Corrupt>().is_some())
                {
                    m.metrics.frame_errors.inc();
                    tracing::error!(error = %format!("{e:#}"), "damaged message from the primary: nothing of it applied; re-requesting");
                }
                let msg = format!("{e:#}");
                let pause = RECONNECT.delay(self.failures);
                tracing::warn!(error = %msg, retry_in = ?pause, "replication connection lost; reconnecting");
                m.live.lock().unwrap_or_else(|p| p.into_inner()).last_error = Some(msg);
                self.failures = self.failures.saturating_add(1);
                return Ok(WorkerState::Throttled(pause));
            }
        }
        // A resync to do: soon.
        let pause = RECONNECT.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        Ok(WorkerState::Throttled(pause))
    }

    /// Never idle: a session ends in a pause (`Throttled`) or the next one at once.
    async fn wait_for_work(&mut self) -> WorkerState {
        WorkerState::Busy
    }

    fn status(&self) -> WorkerStatus {
        // As of the end of the last session (the supervisor asks between calls).
        let lv = self.m.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = WorkerStatus::default();
        if self.refusals > 0 {
            s.detail
                .insert("refusals_in_a_row".into(), self.refusals.into());
        }
        if let Some(e) = &lv.last_error {
            s.detail.insert("last_error".into(), e.clone().into());
        }
        s
    }
}
