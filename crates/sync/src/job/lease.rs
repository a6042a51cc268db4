//! The lease keeper of a worker: a `background::Worker` that renews the held leases at a
//! third of their length, reports the worker, and follows the job's state and limits. The
//! worker runs it under its own `background::Supervisor`, shut down (its token cancelled)
//! once every unit has ended: on SIGTERM the units still save and give back under live
//! leases.
//!
//! Invariant: a worker that could not renew for two thirds of a lease stops its units
//! itself (another worker may hold them by then), and nothing more is written to a job
//! that was deleted.

use super::*;
use crate::stats::Stats;
use anyhow::Result;
use async_trait::async_trait;
use background::{CancellationToken, WorkerState, WorkerStatus};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Renew the held leases at a third of their length, report this worker, follow the job's
/// state and limits. A worker that could not renew for most of a lease stops its units
/// itself: by then another worker may hold them.
pub(super) struct LeaseKeeper {
    w: Arc<Worker>,
    metrics: Option<Arc<Stats>>,
    every: Duration,
    /// The first call only waits: leases were just taken (or none are held yet).
    waited: bool,
    last_bytes: u64,
    last_t: Instant,
    last_log: Instant,
    host: String,
}

impl LeaseKeeper {
    pub(super) fn new(w: Arc<Worker>, metrics: Option<Arc<Stats>>) -> LeaseKeeper {
        LeaseKeeper {
            every: (w.o.lease / 3).max(Duration::from_millis(100)),
            w,
            metrics,
            waited: false,
            last_bytes: 0,
            last_t: Instant::now(),
            last_log: Instant::now(),
            host: fs_core::retry::hostname(),
        }
    }

    /// One round: renew, report, follow. False once the job is gone (nothing more is
    /// written to a deleted job).
    async fn round(&mut self) -> bool {
        let w = self.w.clone();
        if w.gone.load(Ordering::SeqCst) {
            return false;
        }
        let held: Vec<(i64, i64)> = w
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, (t, _))| (*id, *t))
            .collect();
        let lease_ms = w.o.lease.as_millis() as u64;
        match w.board.renew(&w.o.worker, &held, lease_ms).await {
            Ok(kept) => {
                *w.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                let h = w.held.lock().unwrap_or_else(|p| p.into_inner());
                for (id, (t, tx)) in h.iter() {
                    if !kept.contains(id) && held.contains(&(*id, *t)) {
                        cli_common::eprintln!("jfs-sync: unit {id}: the lease was lost (another worker holds it now): stopping work on it");
                        let _ = tx.send(true);
                    }
                }
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                return false;
            }
            Err(e) => {
                let since = w
                    .renewed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed();
                tracing::warn!(error = %format!("{e:#}"), "renewing leases");
                if since > w.o.lease * 2 / 3 && !held.is_empty() {
                    cli_common::eprintln!(
                    "jfs-sync: no contact with the job for {:.1}s (lease {:.0}s): stopping work on the units held, another worker may take them over",
                    since.as_secs_f64(),
                    w.o.lease.as_secs_f64()
                );
                    w.stop_all();
                }
                return true;
            }
        }
        let mut totals = w.totals();
        totals.seconds = (w.started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let dt = self.last_t.elapsed().as_secs_f64().max(1e-3);
        let rate = totals.bytes.saturating_sub(self.last_bytes) as f64 / dt;
        (self.last_bytes, self.last_t) = (totals.bytes, Instant::now());
        if let Some(m) = &self.metrics {
            m.set_from(&totals);
        }
        let report = WorkerReport {
            worker: w.o.worker.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            totals: totals.clone(),
            rate,
            units: held.iter().map(|h| h.0).collect(),
            refused: w.refused.load(Ordering::Relaxed),
            age_ms: 0,
        };
        if let Err(e) = w.board.report(&report).await {
            w.note(&e);
            tracing::warn!(error = %format!("{e:#}"), "reporting to the job");
        }
        match w.board.control().await {
            Ok(c) => {
                let mut cur = w.control.lock().unwrap_or_else(|p| p.into_inner());
                if (cur.bwlimit.as_ref(), cur.tps) != (c.bwlimit.as_ref(), c.tps) {
                    cli_common::eprintln!(
                        "jfs-sync: the job's limits changed: bwlimit {}, tps {}",
                        c.bwlimit.as_deref().unwrap_or("off"),
                        c.tps.map_or("off".to_string(), |t| t.to_string())
                    );
                    apply_limits(&w.limits, &c);
                }
                *cur = c;
            }
            Err(e) => {
                w.note(&e);
                tracing::warn!(error = %format!("{e:#}"), "reading the job's state")
            }
        }
        if !w.o.quiet && self.last_log.elapsed() >= w.o.every {
            self.last_log = Instant::now();
            cli_common::eprintln!(
                "jfs-sync: worker {}: {} units held, {} copied, {} bytes, {:.1} MiB/s",
                w.o.worker,
                held.len(),
                totals.copied + totals.updated,
                totals.bytes,
                rate / (1 << 20) as f64
            );
        }
        true
    }
}

#[async_trait]
impl background::Worker for LeaseKeeper {
    fn name(&self) -> String {
        format!("job lease keeper ({})", self.w.o.worker)
    }

    async fn work(&mut self, stop: &CancellationToken) -> Result<WorkerState> {
        if stop.is_cancelled() {
            return Ok(WorkerState::Done);
        }
        if !std::mem::replace(&mut self.waited, true) {
            return Ok(WorkerState::Throttled(self.every));
        }
        Ok(if self.round().await {
            WorkerState::Throttled(self.every)
        } else {
            WorkerState::Done
        })
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        WorkerState::Throttled(self.every)
    }

    fn status(&self) -> WorkerStatus {
        let held = self.w.held.lock().unwrap_or_else(|p| p.into_inner()).len();
        let renewed = self
            .w
            .renewed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        WorkerStatus {
            progress: Some(format!(
                "{held} leases held, renewed {:.1}s ago",
                renewed.as_secs_f64()
            )),
            ..Default::default()
        }
    }
}
