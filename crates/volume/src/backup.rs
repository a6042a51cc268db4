//! The metadata backups' worker (`fs_core::maint::backup`): part of the primary's
//! background work, run by the primary agent and by every read-write mount at the primary;
//! each second it asks whose turn it is (`backup::my_turn`: the agent while its lease is
//! alive, otherwise the live writing session with the smallest id) and, when it is its own,
//! takes the step that is due (a snapshot, or the journal shipped since the last segment).

use background::{CancellationToken, Worker, WorkerState, WorkerStatus};
use fs_core::maint::backup::{my_turn, Runner};
use fs_core::{BlockStore, Engine};
use std::sync::Arc;
use std::time::Duration;

/// How often the worker looks (the segment interval itself is a volume setting).
pub const BACKUP_TICK: Duration = Duration::from_secs(1);

pub struct BackupWorker {
    engine: Arc<dyn Engine>,
    store: Arc<dyn BlockStore>,
    /// The agent's: the URL `store` was opened from, opened again when the volume's storage
    /// record names another single store (a cutover finished). A mount's store is its own
    /// stack, which follows the record itself (and writes both stores during a cutover).
    follow_url: Option<String>,
    /// This mount's session id; None: the primary agent.
    session: Option<String>,
    runner: Runner,
    tick: tokio::time::Interval,
    snapshots: u64,
    last_snapshot: Option<u64>,
    shipped_to: Option<u64>,
    failures: u64,
    last_failure: Option<String>,
}

impl BackupWorker {
    pub fn new(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        session: Option<String>,
    ) -> BackupWorker {
        let mut tick = tokio::time::interval(BACKUP_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        BackupWorker {
            engine,
            store,
            follow_url: None,
            session,
            runner: Runner::default(),
            tick,
            snapshots: 0,
            last_snapshot: None,
            shipped_to: None,
            failures: 0,
            last_failure: None,
        }
    }
}

impl BackupWorker {
    /// A failed step: logged, counted, retried at the next tick from what the store holds.
    fn note(&mut self, e: anyhow::Error) {
        self.runner = Runner::default();
        self.failures += 1;
        let msg = format!("{e:#}");
        tracing::warn!(error = %msg, "metadata backup step failed (retried)");
        self.last_failure = Some(msg);
    }

    /// The primary agent's worker: its store opened from the volume's storage record.
    pub fn for_agent(engine: Arc<dyn Engine>, url: &str) -> anyhow::Result<BackupWorker> {
        let store = crate::open_store(url, None)?;
        let mut w = BackupWorker::new(engine, store, None);
        w.follow_url = Some(url.to_string());
        Ok(w)
    }

    async fn follow_store(&mut self) -> anyhow::Result<()> {
        let Some(url) = &self.follow_url else {
            return Ok(());
        };
        let s = fs_core::Fs::load_settings(&*self.engine).await?;
        let st = fs_core::storage::current(&*self.engine, &s.storage).await?;
        if let fs_core::storage::Phase::Single { store } = &st.phase {
            if store != url {
                tracing::info!(from = %url, to = %store, "metadata backups follow the volume to its new store");
                self.store = crate::open_store(store, None)?;
                self.follow_url = Some(store.clone());
                self.runner = Runner::default();
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Worker for BackupWorker {
    fn name(&self) -> String {
        "metadata backup".into()
    }
    async fn work(&mut self, _stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        if let Err(e) = self.follow_store().await {
            self.note(e.context("following the volume's store"));
            return Ok(WorkerState::Idle);
        }
        let r = async {
            if !my_turn(&*self.engine, self.session.as_deref()).await? {
                // Another process does it: start from the store again when the turn comes.
                self.runner = Runner::default();
                return Ok(());
            }
            let s = self.runner.step(&*self.engine, &*self.store, false).await?;
            for d in s.pruned.iter().flat_map(|p| &p.damaged) {
                tracing::warn!(manifest = %d, "a metadata snapshot's manifest was damaged: that snapshot was never usable, and is deleted now that a newer one is complete");
            }
            if let Some(seq) = s.snapshot {
                self.snapshots += 1;
                self.last_snapshot = Some(seq);
                tracing::info!(seq, pruned = ?s.pruned, "metadata snapshot written to the volume's store");
            }
            if s.shipped_to.is_some() {
                self.shipped_to = s.shipped_to;
            }
            Ok::<_, fs_core::Error>(())
        }
        .await;
        if let Err(e) = r {
            self.note(anyhow::Error::from(e));
        }
        Ok(WorkerState::Idle)
    }
    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }
    fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus::default();
        s.detail.insert("snapshots".into(), self.snapshots.into());
        if let Some(x) = self.last_snapshot {
            s.detail.insert("last_snapshot_seq".into(), x.into());
        }
        if let Some(x) = self.shipped_to {
            s.detail.insert("shipped_to_seq".into(), x.into());
        }
        if self.failures > 0 {
            s.detail.insert("failures".into(), self.failures.into());
        }
        if let Some(l) = &self.last_failure {
            s.detail.insert("last_failure".into(), l.clone().into());
        }
        s
    }
}
