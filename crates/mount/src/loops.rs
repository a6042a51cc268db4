//! The mount's background loops as `background::Worker`s, run by one `Supervisor` per mount
//! and stopped with it: the want publisher (a mirror site: the blocks read from the origin,
//! for the agent to copy first) and the read-only follower (a RocksDB secondary catches up
//! with its writer; the applied seq and, at a mirror, its consistency window are published
//! for the staleness policy and metrics).

use crate::metrics::MountMetrics;
use crate::vfs::Freshness;
use async_trait::async_trait;
use background::{CancellationToken, Worker, WorkerState, WorkerStatus};
use fs_core::Engine;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Publishes `mirror.want.<session>` when the blocks read from the origin changed.
pub struct WantPublisher {
    pub engine: Arc<dyn Engine>,
    pub session: String,
    pub wanted: Arc<volume::Wanted>,
    pub seen: u64,
    pub tick: tokio::time::Interval,
}

impl WantPublisher {
    pub fn new(
        engine: Arc<dyn Engine>,
        session: String,
        wanted: Arc<volume::Wanted>,
        every: Duration,
    ) -> WantPublisher {
        WantPublisher {
            engine,
            session,
            wanted,
            seen: 0,
            tick: tokio::time::interval(every),
        }
    }
}

#[async_trait]
impl Worker for WantPublisher {
    fn name(&self) -> String {
        "want publisher".into()
    }

    async fn work(&mut self, _stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        if let Some((g, keys)) = self.wanted.changed_since(self.seen) {
            let rec = fs_core::site::Want {
                version: 1,
                keys,
                at_ns: fs_core::now_ns(),
            };
            fs_core::site::set_want(&*self.engine, &self.session, Some(&rec))
                .await
                .map_err(|e| {
                    anyhow::anyhow!("publishing the blocks read from the origin (for the agent's copy priority): {e}")
                })?;
            self.seen = g;
        }
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }
}

/// A read-only view following its writer (see the module comment).
pub struct ReadOnlyFollower {
    engine: Arc<dyn Engine>,
    mm: Arc<MountMetrics>,
    mirror: bool,
    freshness: Arc<Freshness>,
    tick: tokio::time::Interval,
    last: u64,
    moved: Instant,
    resyncing: bool,
}

impl ReadOnlyFollower {
    pub fn new(
        engine: Arc<dyn Engine>,
        mm: Arc<MountMetrics>,
        mirror: bool,
        freshness: Arc<Freshness>,
        every: Duration,
    ) -> ReadOnlyFollower {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ReadOnlyFollower {
            engine,
            mm,
            mirror,
            freshness,
            tick,
            last: 0,
            moved: Instant::now(),
            resyncing: false,
        }
    }

    /// Whether the mirror is out of its consistency window (or no agent runs).
    async fn stale(&mut self) -> bool {
        let mm = &self.mm;
        match fs_core::site::progress(&*self.engine).await {
            Ok(Some(p)) => {
                mm.mirror_lag_seconds.set(p.lag_seconds.unwrap_or(-1.0));
                if p.resyncing != self.resyncing {
                    self.resyncing = p.resyncing;
                    if self.resyncing {
                        tracing::warn!(seq = p.applied_seq, "the mirror is resyncing: serving its previous state until the agent switches to the new one");
                    } else {
                        tracing::info!("the mirror's resync is over");
                    }
                }
                mm.mirror_resyncing.set(p.resyncing as i64);
                // A record much older than its period: no agent is running.
                let age = (fs_core::now_ns() - p.at_ns).max(0) as f64 / 1e9;
                let fresh_for =
                    3.0 * fs_core::site::PROGRESS_EVERY_MS as f64 / 1e3 + p.window_seconds;
                !(p.within_window && age <= fresh_for)
            }
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(error = %e, "reading the mirror's progress failed");
                true
            }
        }
    }
}

#[async_trait]
impl Worker for ReadOnlyFollower {
    fn name(&self) -> String {
        "read-only follower".into()
    }

    async fn work(&mut self, _stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        match self.engine.journal_bounds().await {
            Ok(b) => {
                if b.last != self.last {
                    self.last = b.last;
                    self.moved = Instant::now();
                }
                self.mm.applied_seq.set(self.last as i64);
                self.mm
                    .applied_age_seconds
                    .set(self.moved.elapsed().as_secs_f64());
            }
            Err(e) => tracing::warn!(error = %e, "reading the journal head failed"),
        }
        if self.mirror {
            let stale = self.stale().await;
            if stale != self.freshness.is_stale() {
                if stale {
                    tracing::warn!("the mirror is out of its consistency window (or its agent is not running): serving by --stale policy");
                } else {
                    tracing::info!("the mirror is within its consistency window again");
                }
            }
            self.freshness.set_stale(stale);
            self.mm.mirror_within_window.set(!stale as i64);
        }
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.tick.tick().await;
        WorkerState::Busy
    }

    fn status(&self) -> WorkerStatus {
        WorkerStatus {
            progress: Some(format!("applied seq {}", self.last)),
            ..Default::default()
        }
    }
}

/// The trash's purge at the primary (a read-write mount): what is past the trash time, and
/// over its size cap the oldest entries, are freed through the normal free path
/// (`Fs::purge_trash`). It reads the settings each round, so a `jfs config --trash` change
/// holds from then on, here and for this mount's deletes. Never at a mirror: a mirror's
/// trash is the primary's, replayed.
pub struct TrashPurger {
    pub fs: Arc<fs_core::Fs>,
    pub purged: u64,
    pub evicted: u64,
    first: bool,
}

impl TrashPurger {
    pub fn new(fs: Arc<fs_core::Fs>) -> TrashPurger {
        TrashPurger {
            fs,
            purged: 0,
            evicted: 0,
            first: true,
        }
    }

    /// A short trash time is purged within a second of its end; a day's, each minute.
    fn every(&self) -> Duration {
        let secs = self.fs.trash_secs();
        if secs > 0 && secs < 60 {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(60)
        }
    }
}

#[async_trait]
impl Worker for TrashPurger {
    fn name(&self) -> String {
        "trash purge".into()
    }

    async fn work(&mut self, _stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        let p = self
            .fs
            .purge_trash(fs_core::now_ns())
            .await
            .map_err(|e| anyhow::anyhow!("purging the trash: {e}"))?;
        if p.expired > 0 || p.evicted > 0 {
            tracing::info!(
                expired = p.expired,
                evicted = p.evicted,
                "purged trash entries (their blocks wait as pending deletes for gc)"
            );
        }
        self.purged += p.expired;
        self.evicted += p.evicted;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        if self.first {
            self.first = false;
        } else {
            tokio::time::sleep(self.every()).await;
        }
        WorkerState::Busy
    }

    fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus::default();
        s.detail.insert("purged".into(), self.purged.into());
        s.detail.insert("evicted".into(), self.evicted.into());
        s
    }
}
