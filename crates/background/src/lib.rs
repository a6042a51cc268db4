//! Background loops in one shape, driven by one supervisor (the shape of Garage's
//! `util/background`): a `Worker` does a unit of work when asked (`work`), says whether more
//! is waiting, waits for work when it has none (`wait_for_work`), and describes itself
//! (`status`). The `Supervisor` runs each worker in its own task, backs off after errors,
//! and on shutdown lets busy workers finish or persist what they hold, within a deadline.
//! `status` reads every worker, for the binaries' `status` commands and metrics.
//!
//! The shutdown signal is a `CancellationToken`: `cli_common::shutdown_on_signals` cancels it
//! on SIGTERM or SIGINT (a second signal exits at once), and `run(config, shutdown)` functions
//! take it as an argument, so tests cancel it themselves.

use async_trait::async_trait;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use tokio_util::sync::CancellationToken;

/// What a worker says after a call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// More work is waiting: call `work` again.
    Busy,
    /// Work is waiting but should not start before this long (a rate, a backoff).
    Throttled(Duration),
    /// Nothing to do: call `wait_for_work`.
    Idle,
    /// Finished for good.
    Done,
}

/// What a worker tells about itself (all optional; `detail` for anything else).
#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkerStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_length: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub detail: BTreeMap<String, serde_json::Value>,
}

#[async_trait]
pub trait Worker: Send {
    /// A stable name: "replicator", "mount heartbeat".
    fn name(&self) -> String;

    /// Do one unit of work. `stop` is cancelled once shutdown began: a worker that holds
    /// something (a batch, a cursor) persists it and returns `Idle` or `Done`; the supervisor
    /// calls `work` again while it answers `Busy`, until the drain deadline.
    async fn work(&mut self, stop: &CancellationToken) -> anyhow::Result<WorkerState>;

    /// Wait until there may be work (a notification, a timer). Cancelled at shutdown.
    async fn wait_for_work(&mut self) -> WorkerState;

    fn status(&self) -> WorkerStatus {
        WorkerStatus::default()
    }
}

/// The supervisor's view of one worker, for `status`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    pub name: String,
    pub state: WorkerState,
    /// Errors returned by `work` since the start, and in a row now.
    pub errors: u64,
    pub consecutive_errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub status: WorkerStatus,
}

/// Waits after the n-th error in a row: 1 s doubling to 60 s.
fn error_backoff(consecutive: u64) -> Duration {
    Duration::from_secs(1u64 << consecutive.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

/// Runs workers, each in its own task, until shutdown.
pub struct Supervisor {
    stop: CancellationToken,
    infos: Arc<Mutex<Vec<Arc<Mutex<WorkerInfo>>>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Supervisor {
    /// Workers stop taking work once `stop` is cancelled.
    pub fn new(stop: CancellationToken) -> Supervisor {
        Supervisor {
            stop,
            infos: Arc::new(Mutex::new(Vec::new())),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The token that stops these workers.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Start `w` in its own task.
    pub fn spawn(&self, mut w: impl Worker + 'static) {
        let info = Arc::new(Mutex::new(WorkerInfo {
            name: w.name(),
            state: WorkerState::Busy,
            errors: 0,
            consecutive_errors: 0,
            last_error: None,
            status: w.status(),
        }));
        lock(&self.infos).push(info.clone());
        let stop = self.stop.clone();
        let task = tokio::spawn(async move {
            let mut state = WorkerState::Busy;
            loop {
                state = match state {
                    WorkerState::Busy => match w.work(&stop).await {
                        Ok(s) => {
                            lock(&info).consecutive_errors = 0;
                            s
                        }
                        Err(e) => {
                            let mut i = lock(&info);
                            i.errors += 1;
                            i.consecutive_errors += 1;
                            i.last_error = Some(format!("{e:#}"));
                            tracing::warn!(worker = %i.name, error = %format!("{e:#}"), consecutive = i.consecutive_errors, "worker failed; retrying after a pause");
                            WorkerState::Throttled(error_backoff(i.consecutive_errors))
                        }
                    },
                    WorkerState::Throttled(d) => {
                        tokio::select! {
                            _ = tokio::time::sleep(d) => WorkerState::Busy,
                            _ = stop.cancelled() => WorkerState::Idle,
                        }
                    }
                    WorkerState::Idle => {
                        if stop.is_cancelled() {
                            break;
                        }
                        tokio::select! {
                            s = w.wait_for_work() => s,
                            _ = stop.cancelled() => WorkerState::Idle,
                        }
                    }
                    WorkerState::Done => break,
                };
                let mut i = lock(&info);
                i.state = state;
                i.status = w.status();
            }
            let mut i = lock(&info);
            i.state = WorkerState::Done;
            i.status = w.status();
        });
        lock(&self.tasks).push(task);
    }

    /// Every worker's state, errors and status.
    pub fn status(&self) -> Vec<WorkerInfo> {
        lock(&self.infos).iter().map(|i| lock(i).clone()).collect()
    }

    /// Cancel the token and stop every worker at once, wherever it is (an owner that is
    /// dropped and cannot wait).
    pub fn abort(&self) {
        self.stop.cancel();
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }

    /// Cancel the token and wait (at most `deadline`) for every worker to finish what it
    /// holds; those still running then are aborted and named. Returns their names.
    pub async fn shutdown(&self, deadline: Duration) -> Vec<String> {
        self.stop.cancel();
        let tasks: Vec<_> = lock(&self.tasks).drain(..).collect();
        let t0 = Instant::now();
        let mut late = Vec::new();
        for (i, mut t) in tasks.into_iter().enumerate() {
            let left = deadline.saturating_sub(t0.elapsed());
            if tokio::time::timeout(left, &mut t).await.is_err() {
                t.abort();
                let name = lock(&self.infos)
                    .get(i)
                    .map(|i| lock(i).name.clone())
                    .unwrap_or_default();
                tracing::warn!(worker = %name, ?deadline, "worker did not finish within the drain deadline; stopped");
                late.push(name);
            }
        }
        late
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts to `upto`, one per call; fails on the 3rd call once; persists its count
    /// (`saved`) when stopped.
    struct Counter {
        n: u64,
        upto: u64,
        failed: bool,
        saved: Arc<AtomicU64>,
        wake: Arc<tokio::sync::Notify>,
    }

    #[async_trait]
    impl Worker for Counter {
        fn name(&self) -> String {
            "counter".into()
        }
        async fn work(&mut self, stop: &CancellationToken) -> anyhow::Result<WorkerState> {
            if stop.is_cancelled() {
                self.saved.store(self.n, Ordering::SeqCst);
                return Ok(WorkerState::Done);
            }
            if self.n == 2 && !self.failed {
                self.failed = true;
                anyhow::bail!("a transient failure");
            }
            self.n += 1;
            Ok(if self.n < self.upto {
                WorkerState::Busy
            } else {
                WorkerState::Idle
            })
        }
        async fn wait_for_work(&mut self) -> WorkerState {
            self.wake.notified().await;
            self.upto += 1;
            WorkerState::Busy
        }
        fn status(&self) -> WorkerStatus {
            WorkerStatus {
                progress: Some(format!("{}/{}", self.n, self.upto)),
                ..Default::default()
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn workers_run_back_off_wait_and_drain_on_shutdown() {
        let sup = Supervisor::new(CancellationToken::new());
        let saved = Arc::new(AtomicU64::new(0));
        let wake = Arc::new(tokio::sync::Notify::new());
        sup.spawn(Counter {
            n: 0,
            upto: 5,
            failed: false,
            saved: saved.clone(),
            wake: wake.clone(),
        });
        // Runs to 5 through one failure (1 s of backoff), then idles.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s = &sup.status()[0];
        assert_eq!(
            (s.state, s.errors, s.consecutive_errors),
            (WorkerState::Idle, 1, 0)
        );
        assert_eq!(s.status.progress.as_deref(), Some("5/5"));
        assert_eq!(s.last_error.as_deref(), Some("a transient failure"));
        wake.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sup.status()[0].status.progress.as_deref(), Some("6/6"));
        // Shutdown: an idle worker ends; nothing is late.
        assert!(sup.shutdown(Duration::from_secs(5)).await.is_empty());
        assert_eq!(sup.status()[0].state, WorkerState::Done);
    }

    /// Never finishes its unit of work.
    struct Stuck;

    #[async_trait]
    impl Worker for Stuck {
        fn name(&self) -> String {
            "stuck".into()
        }
        async fn work(&mut self, _: &CancellationToken) -> anyhow::Result<WorkerState> {
            std::future::pending().await
        }
        async fn wait_for_work(&mut self) -> WorkerState {
            WorkerState::Busy
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_past_the_drain_deadline_is_stopped_and_named() {
        let sup = Supervisor::new(CancellationToken::new());
        sup.spawn(Stuck);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            sup.shutdown(Duration::from_secs(2)).await,
            vec!["stuck".to_string()]
        );
    }

    #[test]
    fn error_backoff_doubles_to_a_minute() {
        let b: Vec<u64> = (1..=9).map(|n| error_backoff(n).as_secs()).collect();
        assert_eq!(b, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
