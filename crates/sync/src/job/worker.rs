//! One worker of a shared job: claims units up to its slots, runs the sync over each unit's
//! range (`run_unit`), and reports how the job ended (`work`). The job's limits are one
//! bucket in the engine that every worker draws from (`JobBudget`).

use super::*;
use crate::endpoint::Endpoint;
use crate::range::MovableEnd;
use crate::run::{self, Options};
use crate::state::State;
use crate::stats::{Stats, Summary};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Worker settings beyond the sync's own options.
pub struct WorkerOptions {
    pub worker: String,
    pub lease: Duration,
    pub max_attempts: u32,
    /// Units worked at once (each with its share of the transfer threads).
    pub slots: usize,
    pub threads: usize,
    /// Log the job's progress every this often (stderr, when not a terminal too).
    pub every: Duration,
    pub quiet: bool,
}

/// The end of a worker's run.
#[derive(Debug, Serialize)]
pub struct JobReport {
    /// The job's totals over all units.
    pub summary: Summary,
    /// This worker's share.
    pub worker: Summary,
    pub state: String,
    pub units: usize,
    pub reassigned: i64,
    pub refused: u64,
    #[serde(skip)]
    pub message: Option<String>,
    #[serde(skip)]
    pub code: i32,
}

/// What a worker shares between its units and its lease keeper.
pub(super) struct Worker {
    pub(super) board: Arc<dyn Board>,
    pub(super) o: WorkerOptions,
    /// Units held now: id -> (token, stop signal for the run on it).
    pub(super) held: Mutex<std::collections::BTreeMap<i64, (i64, watch::Sender<bool>)>>,
    /// Totals of finished units, and the stats of units in progress.
    pub(super) done: Mutex<Summary>,
    pub(super) live: Mutex<std::collections::BTreeMap<i64, Arc<Stats>>>,
    pub(super) refused: AtomicU64,
    /// The last time every held lease was renewed.
    pub(super) renewed: Mutex<Instant>,
    pub(super) control: Mutex<Control>,
    pub(super) limits: Arc<crate::limits::Limits>,
    /// This round works on the keys its plan stored (read from the journal), not listings.
    pub(super) keys_mode: bool,
    /// The job was deleted while this worker ran: it stops, and writes nothing more (every
    /// write is refused by the engine anyway).
    pub(super) gone: AtomicBool,
    pub(super) started: Instant,
}

impl Worker {
    /// Note an error of a call to the job: a deleted job stops every unit at once.
    pub(super) fn note(&self, e: &anyhow::Error) {
        if is_gone(e) && !self.gone.swap(true, Ordering::SeqCst) {
            self.stop_all();
        }
    }

    pub(super) fn totals(&self) -> Summary {
        let mut t = self.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for s in self.live.lock().unwrap_or_else(|p| p.into_inner()).values() {
            t.add(&s.summary(0.0));
        }
        t
    }

    pub(super) fn stop_all(&self) {
        for (_, (_, tx)) in self.held.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = tx.send(true);
        }
    }

    pub(super) fn refused(&self, what: &str, id: i64, token: i64) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        cli_common::eprintln!("jfs-sync: unit {id}: {what} refused: the lease passed to another worker (token {token} is stale); that worker resumes the range");
    }
}

/// Budget shared through the job: the limits draw from the engine's bucket.
pub(super) struct JobBudget(std::sync::Weak<Worker>);

#[async_trait]
impl crate::limits::SharedBudget for JobBudget {
    async fn take(&self, what: &'static str, rate: u64, n: u64) -> Result<Option<Duration>> {
        let Some(w) = self.0.upgrade() else {
            return Ok(None);
        };
        if w.gone.load(Ordering::SeqCst) {
            return Ok(None); // the copies in flight are stopping: nothing more to pace
        }
        let r = w.board.take(what, rate, n).await;
        if let Err(e) = &r {
            w.note(e);
        }
        r
    }
}

pub fn default_worker_name() -> String {
    format!("{}-{}", fs_core::retry::hostname(), std::process::id())
}

pub(super) fn apply_limits(limits: &crate::limits::Limits, c: &Control) {
    let bw = c
        .bwlimit
        .as_deref()
        .and_then(|b| crate::limits::BwSchedule::parse(b).ok());
    limits.set(bw, c.tps);
}

/// Join (or create) the job and work on it until no unit is left, the job is cancelled, or
/// `stop` (SIGTERM) turns true. The sync options are the same as a single-host run's; each
/// unit runs with its range and its progress kept in the job.
#[allow(clippy::too_many_arguments)]
pub async fn work(
    board: Arc<dyn Board>,
    spec: Spec,
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    base: Options,
    local: Option<Arc<State>>,
    o: WorkerOptions,
    metrics: Option<Arc<Stats>>,
    mut stop: watch::Receiver<bool>,
    bwlimit: Option<&str>,
) -> Result<JobReport> {
    let t0 = Instant::now();
    let tps = base.limits.current().1;
    if spec.from_journal {
        plan_round(&*board, &spec, &*src, &*dst, bwlimit, tps).await?;
    } else if board.create(&spec, bwlimit, tps).await? {
        cli_common::eprintln!(
            "jfs-sync: created the job; other workers join with the same command"
        );
    }
    let keys_mode = spec.from_journal && board.round().await?.keys;
    board
        .bind()
        .await
        .context("joining the job (removed just after it was created?)")?;
    let have = board
        .spec()
        .await?
        .context("the job vanished just after it was created (removed meanwhile?)")?;
    have.check_same_work(&spec)?;
    let mut c = board.control().await?;
    match c.state.as_str() {
        "cancelled" => {
            bail!("the job was cancelled: remove it with `jfs-sync job delete URL` to start over")
        }
        "failed" => {
            let n = board.retry_failed().await?;
            cli_common::eprintln!(
                "jfs-sync: the job had finished with errors: {n} unit(s) pending again"
            );
            c = board.control().await?;
        }
        _ => {}
    }
    let limits = base.limits.clone();
    apply_limits(&limits, &c);
    let w = Arc::new(Worker {
        board: board.clone(),
        o,
        held: Default::default(),
        done: Default::default(),
        live: Default::default(),
        refused: AtomicU64::new(0),
        renewed: Mutex::new(Instant::now()),
        control: Mutex::new(c),
        limits: limits.clone(),
        keys_mode,
        gone: AtomicBool::new(false),
        started: t0,
    });
    limits.share(Some(Arc::new(JobBudget(Arc::downgrade(&w)))));
    let base = Arc::new(base);
    let keeper = background::Supervisor::new(background::CancellationToken::new());
    keeper.spawn(LeaseKeeper::new(w.clone(), metrics));
    let stopping = Arc::new(AtomicBool::new(false));
    // SIGTERM: stop every unit (each saves its cursor and is given back).
    {
        let (w, stopping, mut stop) = (w.clone(), stopping.clone(), stop.clone());
        tokio::spawn(async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    return;
                }
            }
            stopping.store(true, Ordering::SeqCst);
            w.stop_all();
        });
    }
    let mut slots = tokio::task::JoinSet::new();
    let mut idle_logged = false;
    let mut last_ask = Instant::now() - Duration::from_secs(1);
    // Claims that keep failing for this long end the worker (a broken database, not a
    // passing outage).
    let mut failing_since: Option<Instant> = None;
    let result: Result<String> = loop {
        if w.gone.load(Ordering::SeqCst) {
            w.stop_all();
            break Ok("deleted".into());
        }
        if stopping.load(Ordering::SeqCst) {
            break Ok("interrupted".into());
        }
        let state = w
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .clone();
        match state.as_str() {
            "cancelled" => {
                w.stop_all();
                break Ok("cancelled".into());
            }
            "paused" => {
                w.stop_all();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            "done" | "failed" if slots.is_empty() => break Ok(state),
            _ => {}
        }
        while slots.try_join_next().is_some() {}
        if slots.len() >= w.o.slots.max(1) {
            tokio::select! {
                _ = slots.join_next() => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let claimed = match board
            .claim(&w.o.worker, w.o.lease.as_millis() as u64, w.o.max_attempts)
            .await
        {
            Ok(u) => {
                failing_since = None;
                u
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                continue;
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(120) {
                    w.stop_all();
                    while slots.join_next().await.is_some() {}
                    break Err(e.context("claiming units failed for 2 minutes"));
                }
                tracing::warn!(error = %format!("{e:#}"), "claiming a unit");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(u) = claimed else {
            // Nothing to claim: others hold what is left, or the job is over. Ask the
            // holders of running ranges to hand over their backs (each answers at its next
            // save), so that the end of a job is not left to a few busy workers.
            if last_ask.elapsed() >= Duration::from_secs(1) {
                last_ask = Instant::now();
                let free = w.o.slots.max(1).saturating_sub(slots.len());
                if let Err(e) = board.ask_split(free).await {
                    tracing::warn!(error = %format!("{e:#}"), "asking for a share of a range");
                }
            }
            if slots.is_empty() {
                let units = match board.units().await {
                    Ok(u) => u,
                    Err(e) => {
                        w.note(&e);
                        break Err(e);
                    }
                };
                let open = units
                    .iter()
                    .filter(|u| matches!(u.state.as_str(), "pending" | "running"))
                    .count();
                if open == 0 {
                    let failed = units.iter().any(|u| u.state == "failed");
                    let end = if failed { "failed" } else { "done" };
                    // Only a running job ends here: a job paused or cancelled meanwhile stays
                    // so, and one deleted meanwhile is not written back (`JobGone`).
                    match board.set_state(end, Some("running")).await {
                        Ok(true) => break Ok(end.into()),
                        Ok(false) => {
                            let now = board.control().await.map(|c| c.state);
                            if let Ok(st) = &now {
                                w.control.lock().unwrap_or_else(|p| p.into_inner()).state =
                                    st.clone();
                            }
                            continue;
                        }
                        Err(e) => {
                            w.note(&e);
                            if is_gone(&e) {
                                continue;
                            }
                            break Err(e);
                        }
                    }
                }
                if !idle_logged {
                    tracing::info!(open, "waiting: the units left are held by other workers");
                    idle_logged = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = slots.join_next(), if !slots.is_empty() => {}
                _ = stop.changed() => {}
            }
            continue;
        };
        idle_logged = false;
        let (tx, rx) = watch::channel(false);
        w.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(u.id, (u.token, tx));
        let (w2, src, dst, base, local) = (
            w.clone(),
            src.clone(),
            dst.clone(),
            base.clone(),
            local.clone(),
        );
        slots.spawn(async move {
            let id = u.id;
            if let Err(e) = run_unit(&w2, u, src, dst, &base, local, rx).await {
                cli_common::eprintln!("jfs-sync: unit {id}: {e:#}");
            }
            w2.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    };
    while slots.join_next().await.is_some() {}
    // Every unit has ended: the keeper stops (a renewal in flight may finish).
    keeper.shutdown(Duration::from_secs(1)).await;
    limits.share(None);
    let seconds = |t: f64| (t * 1000.0).round() / 1000.0;
    let mut mine = w.totals();
    mine.seconds = seconds(t0.elapsed().as_secs_f64());
    let state = match result {
        Ok(s) => s,
        Err(e) if is_gone(&e) || w.gone.load(Ordering::SeqCst) => "deleted".into(),
        Err(e) => return Err(e),
    };
    if state == "deleted" || w.gone.load(Ordering::SeqCst) {
        return Ok(JobReport {
            summary: mine.clone(),
            worker: mine,
            state: "deleted".into(),
            units: 0,
            reassigned: 0,
            refused: w.refused.load(Ordering::Relaxed),
            message: Some(format!(
                "the job {} was deleted while this worker ran (`jfs-sync job delete`): this worker stopped and wrote nothing more to it; what it copied stays at the destination, and a new job (or a plain sync) finds it there",
                board.display()
            )),
            code: 2,
        });
    }
    let units = board.units().await?;
    let mut summary = Summary::default();
    for u in &units {
        summary.add(&u.tally);
        if u.state == "failed" && u.kind == "copy" {
            summary.failed += 1;
        }
    }
    // The job's own duration (from its start, or its round's, to its end), not this
    // worker's: workers join and leave at any time.
    summary.seconds = match board.control().await {
        Ok(c) if c.elapsed_s > 0.0 => seconds(c.elapsed_s),
        _ => mine.seconds,
    };
    let reassigned = units.iter().map(|u| u.reassigned).sum();
    let errors: Vec<String> = units
        .iter()
        .filter_map(|u| {
            u.error
                .as_ref()
                .map(|e| format!("unit {} ({}): {e}", u.id, describe(u)))
        })
        .collect();
    let (code, message) = match state.as_str() {
        "done" => (0, None),
        "failed" => (
            1,
            Some(format!(
                "the job finished with errors (nothing was deleted); run the same command again to retry:\n  {}",
                errors.join("\n  ")
            )),
        ),
        "cancelled" => (2, Some("the job was cancelled".to_string())),
        _ => (
            2,
            Some("interrupted: this worker's units were given back; run the same command again to rejoin".to_string()),
        ),
    };
    Ok(JobReport {
        summary,
        worker: mine,
        state,
        units: units.len(),
        reassigned,
        refused: w.refused.load(Ordering::Relaxed),
        message,
        code,
    })
}

pub(super) fn describe(u: &Unit) -> String {
    if u.kind == "delete" {
        return "the deletion step".into();
    }
    format!(
        "[{}, {})",
        u.lo.as_deref().unwrap_or("start"),
        u.hi.as_deref().unwrap_or("end")
    )
}

/// Work one claimed unit: split it if it is fresh and starts at a directory, run the sync
/// over its range, and record how it ended (under its token).
pub(super) async fn run_unit(
    w: &Arc<Worker>,
    mut u: Unit,
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    base: &Options,
    local: Option<Arc<State>>,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    if u.kind == "delete" {
        return delete_step(w, &u, dst, base).await;
    }
    let keys = if w.keys_mode {
        Some(w.board.keys_in(u.lo.as_deref(), u.hi.as_deref()).await?)
    } else {
        None
    };
    if keys.is_none() && u.cursor.is_none() && u.tally == Summary::default() {
        let cuts = cuts(&*src, &u)
            .await
            .context("listing a level to split the range")?;
        if !cuts.is_empty() {
            if w.board.split(u.id, u.token, &cuts).await? {
                tracing::info!(unit = u.id, pieces = cuts.len() + 1, "split the range");
                u.hi = Some(cuts[0].clone());
            } else {
                w.refused("splitting", u.id, u.token);
                return Ok(());
            }
        }
    }
    let stats = Arc::new(Stats::default());
    w.live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(u.id, stats.clone());
    let end = Arc::new(MovableEnd::default());
    let progress = Arc::new_cyclic(|me| UnitProgress {
        me: me.clone(),
        w: w.clone(),
        id: u.id,
        token: u.token,
        start: (u.cursor.clone(), u.tally.clone()),
        src: src.clone(),
        range: Mutex::new(u.range()),
        end,
        cutting: tokio::sync::Mutex::new(None),
    });
    let opts = Options {
        threads: w.o.threads.div_ceil(w.o.slots.max(1)).max(1),
        list_threads: base.list_threads,
        list_depth: base.list_depth,
        compare: base.compare.clone(),
        filter: base.filter.clone(),
        delete_dst: base.delete_dst,
        delete_src: base.delete_src,
        max_delete: None,
        max_failure: base.max_failure,
        dry_run: false,
        dirs: base.dirs,
        perms: base.perms,
        owners: base.owners,
        links: base.links,
        check_new: base.check_new,
        retries: base.retries,
        keys,
        keys_from_user: false,
        limits: base.limits.clone(),
        range: u.range(),
        rewritten: None,
    };
    let stopped = stop.clone();
    let r = run::sync_range(
        src,
        dst,
        opts,
        local,
        Some(progress.clone()),
        stats.clone(),
        stop,
    )
    .await;
    // Stopped from outside (SIGTERM, pause, cancel, a lease lost or out of reach): whatever
    // the run says, the unit is given back, never marked failed.
    let given_back = *stopped.borrow();
    let ran = stats.summary(0.0);
    w.live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&u.id);
    w.done.lock().unwrap_or_else(|p| p.into_inner()).add(&ran);
    let dst_listed = stats.dst_listed.load(Ordering::Relaxed);
    let (what, fin) = match &r {
        _ if given_back => ("giving back", None),
        Ok(rep) if rep.interrupted => ("giving back", None),
        Ok(rep) if rep.fatal.is_none() && rep.summary.failed == 0 => (
            "finishing",
            Some(Finish {
                state: "done",
                dst_listed,
                error: None,
                tally: None,
            }),
        ),
        Ok(rep) => (
            "finishing",
            Some(Finish {
                state: "failed",
                dst_listed,
                error: Some(
                    rep.fatal
                        .clone()
                        .unwrap_or_else(|| format!("{} object(s) failed", rep.summary.failed)),
                ),
                tally: None,
            }),
        ),
        Err(e) if e.to_string().contains("the lease passed to another worker") => return Ok(()),
        _ if w.gone.load(Ordering::SeqCst) => return Ok(()),
        Err(e) if is_gone(e) => {
            w.note(e);
            return Ok(());
        }
        Err(e) => (
            "finishing",
            Some(Finish {
                state: "failed",
                dst_listed,
                error: Some(format!("{e:#}")),
                tally: None,
            }),
        ),
    };
    // Record the end; the job's engine may be out of reach for a while (a cut-off worker
    // tries until it hears back, then learns whether its token still holds).
    let deadline = Instant::now() + w.o.lease * 4;
    // A cut made here must be in the job before the unit ends: the run stopped at it, and
    // the keys past it belong to the piece the job has not heard of yet.
    let mut pending = progress.cutting.lock().await;
    loop {
        if w.gone.load(Ordering::SeqCst) {
            return Ok(());
        }
        match progress.confirm_cut(&mut pending).await {
            Some(true) => break,
            Some(false) => return Ok(()), // the unit is another worker's now
            None if Instant::now() >= deadline => bail!(
                "unit {}: a cut of the range could not be recorded (its lease will run out and another worker resumes it from its last save)",
                u.id
            ),
            None => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    // `pending` stays held: no cut starts once the unit is ending.
    loop {
        let res = match &fin {
            Some(f) => w.board.finish(u.id, u.token, f).await,
            None => w.board.release(u.id, u.token).await,
        };
        match res {
            Ok(true) => return Ok(()),
            Ok(false) => {
                w.refused(what, u.id, u.token);
                return Ok(());
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                return Ok(()); // the job was deleted: nothing to record it in
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(unit = u.id, error = %format!("{e:#}"), "recording the end of a unit; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.context("recording the end of the unit (its lease will run out and another worker resumes it)")),
        }
    }
}
