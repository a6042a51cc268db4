//! The primary's background work, as `background::Worker`s under the primary's supervisor:
//! `primary status` (the status document and metrics), `slot lease` (the lease), `journal
//! maintenance` (the retention cap, the journal trim behind the slowest active mirror, and
//! the purge of what expired in the volume's trash), `metadata backup` (snapshots and journal
//! segments into the volume's store, `volume::backup`).

use super::lease::LEASE_EVERY;
use super::*;
use background::{Worker, WorkerState, WorkerStatus};

/// Start the primary's workers on its supervisor.
pub(super) fn start(p: &Arc<Primary>) {
    p.workers.spawn(Periodic {
        name: "primary status",
        what: "refreshing status",
        p: p.clone(),
        tick: ticker(Duration::from_millis(500)),
        step: |p| {
            Box::pin(async move {
                p.refusals.flush_due();
                p.refresh_status().await
            })
        },
        failures: Failures::default(),
    });
    p.workers.spawn(Periodic {
        name: "slot lease",
        what: "recording this agent beside the volume",
        p: p.clone(),
        tick: ticker(LEASE_EVERY),
        step: |p| {
            Box::pin(async move {
                let admin = *p.admin.lock().unwrap_or_else(|e| e.into_inner());
                p.beat(admin).await
            })
        },
        failures: Failures::default(),
    });
    // Metadata backups (`volume::backup`): the agent's turn while its lease is alive (the
    // mounts at the primary leave them to it).
    match volume::backup::BackupWorker::for_agent(p.engine.clone(), &p.storage) {
        Ok(w) => p.workers.spawn(w),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), store = %p.storage, "metadata backups: the volume's store does not open; the agent takes none")
        }
    }
    p.workers.spawn(MaintenanceWorker {
        p: p.clone(),
        tick: ticker(p.cfg.trim_interval),
        trim_unsupported: false,
        trash: None,
    });
}

/// Ticks every `every`, the first one `every` from now (a worker's first call is at once).
fn ticker(every: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Failures a worker logs and retries at its next tick (its cadence matters more than a
/// backoff: the status stays fresh, the lease alive), shown in its status.
#[derive(Default)]
struct Failures {
    n: u64,
    last: Option<String>,
}

impl Failures {
    fn note(&mut self, e: &anyhow::Error, what: &str) {
        let msg = format!("{e:#}");
        tracing::warn!(error = %msg, "{what}");
        self.n += 1;
        self.last = Some(format!("{what}: {msg}"));
    }

    fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus::default();
        if self.n > 0 {
            s.detail.insert("failures".into(), self.n.into());
        }
        if let Some(l) = &self.last {
            s.detail.insert("last_failure".into(), l.clone().into());
        }
        s
    }
}

/// `primary status` (the status document and metrics, every 500 ms) and `slot lease` (the
/// lease, every `LEASE_EVERY`; `Primary::run` removes it once the workers stopped): one step
/// at each tick, a failure logged and counted, never backed off.
struct Periodic {
    name: &'static str,
    /// What a failure of the step says it was doing.
    what: &'static str,
    p: Arc<Primary>,
    tick: tokio::time::Interval,
    step: fn(Arc<Primary>) -> futures::future::BoxFuture<'static, Result<()>>,
    failures: Failures,
}

#[async_trait::async_trait]
impl Worker for Periodic {
    fn name(&self) -> String {
        self.name.into()
    }
    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState> {
        if let Err(e) = (self.step)(self.p.clone()).await {
            self.failures.note(&e, self.what);
        }
        Ok(WorkerState::Idle)
    }
    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }
    fn status(&self) -> WorkerStatus {
        self.failures.status()
    }
}

/// `journal maintenance`: the retention cap, then the journal trim behind the slowest active
/// mirror, every `trim_interval`. A failure is retried after the supervisor's pause.
struct MaintenanceWorker {
    p: Arc<Primary>,
    tick: tokio::time::Interval,
    /// The volume is open read-only here: trimming is left to `jfs gc`.
    trim_unsupported: bool,
    /// The volume over its metadata, for the trash's purge (None: not yet opened);
    /// `Some(None)`: read-only here (a RocksDB volume: its read-write mount purges).
    trash: Option<Option<fs_core::Fs>>,
}

#[async_trait::async_trait]
impl Worker for MaintenanceWorker {
    fn name(&self) -> String {
        "journal maintenance".into()
    }
    async fn work(&mut self, _stop: &CancellationToken) -> Result<WorkerState> {
        let p = &self.p;
        let caps = p.enforce_caps().await.context("checking replication slots");
        if let Err(e) = &caps {
            tracing::warn!(error = %format!("{e:#}"), "checking replication slots");
        }
        if !self.trim_unsupported {
            match p.trim().await {
                Ok(n) if n > 0 => {
                    p.metrics.journal_trimmed.inc_by(n);
                    tracing::info!(entries = n, "journal trimmed behind the slowest mirror");
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ReadOnly => {
                    self.trim_unsupported = true;
                    tracing::info!("the volume is open read-only here (RocksDB has one writer): journal trimming is left to `jfs gc`, which honours the slots");
                }
                Err(e) => return Err(anyhow::Error::new(e).context("trimming the journal")),
            }
        }
        if !matches!(self.trash, Some(None)) {
            self.purge_trash().await?;
        }
        caps.map(|()| WorkerState::Idle)
    }
    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }
}

impl MaintenanceWorker {
    /// The trash's expired entries (and, over its cap, the oldest) freed through the normal
    /// free path: the primary's background work where no read-write mount runs (Redis,
    /// PostgreSQL). A mirror never purges: its trash is the primary's, replayed.
    async fn purge_trash(&mut self) -> Result<()> {
        if self.trash.is_none() {
            // A purge frees metadata only (its slices become pending deletes, which gc
            // deletes later): no block is read or written, so no store is opened.
            let store = volume::open_store("memory://trash-purge", None)?;
            let fs = fs_core::Fs::open(self.p.engine.clone(), store)
                .await
                .context("opening the volume to purge its trash")?;
            self.trash = Some(Some(fs));
        }
        let Some(Some(fs)) = &self.trash else {
            return Ok(());
        };
        match fs.purge_trash(fs_core::now_ns()).await {
            Ok(p) if p.expired > 0 || p.evicted > 0 => {
                tracing::info!(
                    expired = p.expired,
                    evicted = p.evicted,
                    "purged trash entries (their blocks wait as pending deletes for gc)"
                );
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ReadOnly => {
                self.trash = Some(None);
                tracing::info!("the volume is open read-only here (RocksDB has one writer): its read-write mount, or `jfs gc --delete`, purges the trash");
            }
            Err(e) => return Err(anyhow::Error::new(e).context("purging the trash")),
        }
        Ok(())
    }
}

impl Primary {
    pub(super) async fn trim(&self) -> fs_core::Result<u64> {
        let slots = slots::list(&*self.engine).await?;
        let floor = slots::retain_floor(&slots);
        // Read each time: settings change through the journal (a cutover, `jfs` commands).
        let settings = fs_core::Fs::load_settings(&*self.engine).await?;
        let cutoff = fs_core::now_ns() - settings.journal_retention_secs as i64 * 1_000_000_000;
        let r = fs_core::maint::trim_journal(&*self.engine, cutoff, floor).await;
        tracing::debug!(floor, retention_secs = settings.journal_retention_secs, result = ?r, "journal trim");
        r
    }

    pub(super) async fn refresh_status(&self) -> Result<()> {
        let _one = self.refreshing.lock().await;
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
}
