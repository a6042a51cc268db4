//! A process's session, kept alive: the `Follower` registers the session record and runs
//! one background worker (`background::Worker`, under a supervisor of its own) that, every
//! `FOLLOW_EVERY` or at once when the holder's generation moves:
//! - follows a volume move (`MovingEngine::follow_move`);
//! - re-reads the storage record and moves the holder to a new generation;
//! - acknowledges that generation and publishes a dual write's degraded state in the record;
//! - beats every `fs_core::session::HEARTBEAT` (a failed beat is a worker error: retried with
//!   the supervisor's backoff, counted in its status).
//!
//! `close` stops the worker, then removes the record; dropping a `Follower` removes the record
//! in a task of its own. `end_sessions`, a command's last step, waits for those and removes
//! the records of followers still alive (one kept by a task that has not ended yet: the
//! worker itself holds the volume for the length of a pass). Once a removal has begun the
//! worker beats no more, so a record removed stays removed. A process that dies leaves the
//! record for `gc`, once it is found dead.

use crate::placement::{StorageHolder, FOLLOW_EVERY};
use async_trait::async_trait;
use background::{CancellationToken, Supervisor, Worker, WorkerState, WorkerStatus};
use fs_core::error::Result;
use fs_core::session::Session;
use fs_core::storage::{self, StorageFollow};
use fs_core::{keys, Engine};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long `close` lets a beat in flight finish before the record is removed.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

pub struct Follower {
    workers: Supervisor,
    record: Arc<Record>,
    /// The record is removed already (`close`).
    closed: bool,
}

/// A session record of this process, shared by its follower, its worker and the list of
/// live records (`end_sessions`).
struct Record {
    engine: Arc<dyn Engine>,
    id: String,
    /// Set once the record is being removed; a beat holds it while it writes.
    ended: tokio::sync::Mutex<bool>,
}

impl Record {
    /// Remove the record, after any beat in flight, and stop its beats.
    async fn remove(&self) {
        *self.ended.lock().await = true;
        if let Err(e) = fs_core::session::remove(&*self.engine, &self.id).await {
            tracing::warn!(error = %e, "removing the session record failed; gc removes it once it times out");
        }
    }
}

/// The worker: one pass of following per call.
struct SessionWorker {
    engine: Arc<dyn Engine>,
    mover: Option<Arc<crate::MovingEngine>>,
    /// Weak: the holder may keep this follower (see `keep`).
    holder: Option<Weak<StorageHolder>>,
    gens: Option<watch::Receiver<u64>>,
    poll: tokio::time::Interval,
    record: Arc<Record>,
    session: Session,
    last_beat: Instant,
    moves_seen: u64,
}

impl Follower {
    /// Register `session` (acknowledging the holder's generation) and follow.
    pub async fn start(
        engine: Arc<dyn Engine>,
        mover: Option<Arc<crate::MovingEngine>>,
        holder: Option<Arc<StorageHolder>>,
        mut session: Session,
    ) -> Result<Follower> {
        if let Some(h) = &holder {
            session.acks.insert(storage::ACK.into(), h.gen());
        }
        let record = Arc::new(Record {
            engine: engine.clone(),
            id: session.id.clone(),
            ended: Default::default(),
        });
        // Listed before the record is written, so that an `end_sessions` meanwhile removes
        // it (after this beat: a removal waits for the beat's lock).
        live().push(record.clone());
        {
            let _beating = record.ended.lock().await;
            if let Err(e) = fs_core::session::beat(&*engine, &mut session).await {
                unlist(&record.id);
                return Err(e);
            }
        }
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + FOLLOW_EVERY, FOLLOW_EVERY);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let workers = Supervisor::new(CancellationToken::new());
        workers.spawn(SessionWorker {
            engine: engine.clone(),
            moves_seen: mover.as_ref().map_or(0, |m| m.moves()),
            mover,
            gens: holder.as_ref().map(|h| h.watch()),
            holder: holder.map(|h| Arc::downgrade(&h)),
            poll,
            record: record.clone(),
            session,
            last_beat: Instant::now(),
        });
        Ok(Follower {
            workers,
            record,
            closed: false,
        })
    }

    pub fn session_id(&self) -> &str {
        &self.record.id
    }

    /// Stop following (a beat in flight finishes first) and remove the session record.
    pub async fn close(mut self) {
        self.workers.shutdown(CLOSE_DRAIN).await;
        self.closed = true;
        unlist(&self.record.id);
        self.record.remove().await;
    }
}

#[async_trait]
impl Worker for SessionWorker {
    fn name(&self) -> String {
        "session follower".into()
    }

    async fn work(&mut self, _stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        let mut beat = self.last_beat.elapsed() >= fs_core::session::HEARTBEAT;
        if let Some(mv) = &self.mover {
            if let Err(err) = mv.follow_move().await {
                tracing::warn!(error = %err, "following the volume's move failed; retrying");
            }
            // Moved (here, or by a commit that waited for it): the session lives in the new
            // primary's metadata from now on.
            if mv.moves() != self.moves_seen {
                self.moves_seen = mv.moves();
                beat = true;
            }
        }
        let h = match &self.holder {
            Some(w) => match w.upgrade() {
                Some(h) => Some(h),
                None => return Ok(WorkerState::Done),
            },
            None => None,
        };
        if let Some(h) = &h {
            beat |= self.follow_storage(h).await;
        }
        if beat {
            let ended = self.record.ended.lock().await;
            if *ended {
                return Ok(WorkerState::Done);
            }
            fs_core::session::beat(&*self.engine, &mut self.session)
                .await
                .map_err(|e| anyhow::Error::from(e).context("session heartbeat failed"))?;
            self.last_beat = Instant::now();
        }
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        let gens = self.gens.as_mut();
        tokio::select! {
            _ = self.poll.tick() => {}
            _ = async { match gens { Some(g) => g.changed().await.ok(), None => std::future::pending().await } } => {}
        }
        WorkerState::Busy
    }

    fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus::default();
        s.detail
            .insert("session".into(), self.session.id.clone().into());
        if let Some(g) = self.session.acks.get(storage::ACK) {
            s.detail.insert("storage_generation".into(), (*g).into());
        }
        s
    }
}

impl SessionWorker {
    /// Move `h` to the storage record's generation when it changed; true when the session
    /// record must be written now (a new generation to acknowledge, a degraded state that
    /// began or ended).
    async fn follow_storage(&mut self, h: &StorageHolder) -> bool {
        match self
            .engine
            .get(keys::STORAGE)
            .await
            .map(|r| storage::gen_of(r.as_deref()))
        {
            Ok(Ok(g)) if g != h.gen() => {
                if let Err(err) = h.reload().await {
                    tracing::warn!(error = %err, "following the volume's storage failed; retrying");
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(err)) | Err(err) => {
                tracing::warn!(error = %err, "reading the volume's storage record failed")
            }
        }
        let mut beat = false;
        let session = &mut self.session;
        let g = h.gen();
        if session.acks.get(storage::ACK) != Some(&g) {
            session.acks.insert(storage::ACK.into(), g);
            beat = true;
        }
        // A run of failed writes to the other store starts or ends (its count is refreshed
        // with the heartbeat).
        let d = h.degraded();
        if d.is_some() != session.degraded.is_some()
            || d.as_ref().map(|d| &d.store) != session.degraded.as_ref().map(|d| &d.store)
        {
            beat = true;
        }
        session.degraded = d;
        beat
    }
}

/// Removals of the records of dropped followers, still running.
fn removals() -> std::sync::MutexGuard<'static, Vec<tokio::task::JoinHandle<()>>> {
    static REMOVALS: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>> =
        std::sync::Mutex::new(Vec::new());
    REMOVALS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The records of this process's followers not closed or dropped yet.
fn live() -> std::sync::MutexGuard<'static, Vec<Arc<Record>>> {
    static LIVE: std::sync::Mutex<Vec<Arc<Record>>> = std::sync::Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn unlist(id: &str) {
    live().retain(|l| l.id != id);
}

/// Remove (within `limit`) the session records of this process's writers: those dropped
/// (their removals still running) and those still alive. A command's last step before its
/// runtime ends, so that a `jfs put` or a `jfs-sync` into a volume leaves no dead session
/// behind, whichever task held its volume last. A metadata service that does not answer in
/// time leaves the rest to `gc`. It ends every session of the process: never call it from
/// a process that goes on (a test beside others, a mount, an agent).
pub async fn end_sessions(limit: Duration) {
    let pending = std::mem::take(&mut *removals());
    let alive = std::mem::take(&mut *live());
    let ends = futures::future::join_all(alive.iter().map(|r| r.remove()));
    let _ = tokio::time::timeout(
        limit,
        futures::future::join(futures::future::join_all(pending), ends),
    )
    .await;
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.workers.abort();
        if self.closed {
            return;
        }
        unlist(&self.record.id);
        // Outside a runtime (a test's last drop) the record stays for gc.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let record = self.record.clone();
            let removal = rt.spawn(async move { record.remove().await });
            let mut r = removals();
            r.retain(|t| !t.is_finished());
            r.push(removal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower still alive when the command ends (a task kept its volume) has its record
    /// removed by `end_sessions`, and its worker beats no more. The only test here that calls
    /// `end_sessions`, which ends every session of the process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn end_sessions_removes_the_records_of_followers_still_alive() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("rocksdb://{}", dir.path().join("meta").display());
        let engine = crate::open_engine(&url, crate::Access::Write, None, true)
            .await
            .unwrap();
        let kept = Follower::start(engine.clone(), None, None, Session::new("kept", false))
            .await
            .unwrap();
        let dropped = Follower::start(engine.clone(), None, None, Session::new("dropped", false))
            .await
            .unwrap();
        let ids = |v: Vec<Session>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
        let mut both = vec![
            kept.session_id().to_string(),
            dropped.session_id().to_string(),
        ];
        both.sort();
        let mut listed = ids(fs_core::session::list(&*engine).await.unwrap());
        listed.sort();
        assert_eq!(listed, both);
        drop(dropped);
        end_sessions(Duration::from_secs(5)).await;
        assert_eq!(
            ids(fs_core::session::list(&*engine).await.unwrap()),
            Vec::<String>::new()
        );
        assert!(
            *kept.record.ended.lock().await,
            "the kept follower's worker beats no more"
        );
        assert!(live().is_empty());
        // Its close later removes nothing more and fails nothing.
        kept.close().await;
        assert!(fs_core::session::list(&*engine).await.unwrap().is_empty());
    }
}
