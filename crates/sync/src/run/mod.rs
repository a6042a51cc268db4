//! One sync run: list both sides in key order, merge, decide per key, hand work to a bounded
//! pool, delete extraneous objects only after a clean run, and keep the resume state.
//!
//! A finished copy is *recorded* (done in the state, counted, its source deleted with
//! `--delete-src`) only once it is durable. Object stores and volumes are durable when the
//! write returns; a local destination is made durable in batches: completions wait in a list
//! that is flushed with one `syncfs` (files and directories alike) before each checkpoint,
//! instead of one fsync per file.
//!
//! Checkpoints save the cursor (every key at or before it is resolved) and the tally of what
//! those keys came to, in one write, so a resumed run's summary counts the work of the
//! attempts before it exactly once.

use crate::copy::with_retries;
use crate::endpoint::{Endpoint, Kind};
use crate::filter::Filter;
use crate::limits::Limits;
use crate::plan::{Action, Compare, Why};
use crate::range::KeyRange;
use crate::state::{Done, State};
use crate::stats::{Outcome, OutcomeKind, Stats, Summary};
use anyhow::{bail, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};

mod ctx;
mod window;

use ctx::*;
use window::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxDelete {
    Count(u64),
    Percent(f64),
}

#[derive(Clone)]
pub struct Options {
    pub threads: usize,
    /// Subtrees listed at once (1: one sequential listing per side).
    pub list_threads: usize,
    /// How many levels are expanded into separately listed subtrees.
    pub list_depth: usize,
    pub compare: Compare,
    pub filter: Filter,
    pub delete_dst: bool,
    pub delete_src: bool,
    pub max_delete: Option<MaxDelete>,
    pub max_failure: Option<u64>,
    pub dry_run: bool,
    pub dirs: bool,
    pub perms: bool,
    /// Copies get their source's owner (`Entry::owner`); otherwise it is dropped first.
    pub owners: bool,
    pub links: bool,
    pub check_new: bool,
    pub retries: u32,
    /// Only these keys (sorted), instead of listing everything.
    pub keys: Option<Vec<String>>,
    /// The keys came from the user (--files-from): one the source lacks is reported and
    /// counted as failed. (--from-journal's keys may name things deleted since.)
    pub keys_from_user: bool,
    pub limits: Arc<Limits>,
    /// The part of the key space this run covers (a shared job's range; all by default).
    pub range: KeyRange,
    /// Keys whose content `--from-journal` saw rewritten: copied whatever size and time say.
    pub rewritten: Option<Arc<std::collections::HashSet<String>>>,
}

/// Where the resume point of a range held in a shared job is kept (instead of the local
/// state): the holder of the range's lease saves it there, and a save is refused once the
/// lease has passed to another worker.
#[async_trait::async_trait]
pub trait Shared: Send + Sync {
    /// Where earlier attempts stopped, and what the keys up to there came to.
    fn start(&self) -> (Option<String>, Summary);
    /// Every key at or before `cursor` is resolved and came to `tally`; `deletes` are the
    /// extraneous destination keys found since the last save (with --delete-dst).
    async fn save(&self, cursor: &str, tally: &Summary, deletes: Vec<(String, bool)>)
        -> Result<()>;
    /// The range's upper end as the holder may lower it during the run.
    fn end(&self) -> Option<Arc<crate::range::MovableEnd>> {
        None
    }
}

#[derive(Debug)]
pub struct Report {
    pub summary: Summary,
    /// Why the run stopped early or refused a step (exit 2), if it did.
    pub fatal: Option<String>,
    pub interrupted: bool,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if self.fatal.is_some() || self.interrupted {
            2
        } else if self.summary.failed + self.summary.rechecked.as_ref().map_or(0, |r| r.failed) > 0
        {
            1
        } else {
            0
        }
    }
}

/// Run the sync. `stop` turns true on SIGINT/SIGTERM: no new work starts, work in flight
/// finishes, the cursor is saved.
///
/// A run resumed from a cursor does not take the keys at or before it as settled: the source
/// may have changed there since the interrupted attempt (a file written, renamed or removed).
/// - With a list of keys (`--from-journal`, `--files-from`) the list is what must be
///   settled, whatever an earlier attempt did: the run starts over on the whole list (each
///   key already copied is one comparison), so a key the journal names anew is never
///   skipped for sorting before an old cursor.
/// - A listing run finishes what follows the cursor, then lists and compares the part before
///   it again: what changed there is copied, what went is deleted with `--delete-dst`, the
///   rest costs the listing. The summary counts every key once as before; this second pass's
///   own counts are `rechecked`.
pub async fn sync(
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    o: Options,
    state: Option<Arc<State>>,
    stats: Arc<Stats>,
    stop: watch::Receiver<bool>,
) -> Result<Report> {
    let cursor = match &state {
        Some(st) => st.cursor()?,
        None => None,
    };
    let Some(cursor) = cursor.filter(|c| !o.range.below(c)) else {
        return sync_range(src, dst, o, state, None, stats, stop).await;
    };
    if o.keys.is_some() {
        if let Some(st) = &state {
            tracing::info!(cursor = %cursor, "an earlier attempt stopped: settling the whole list of keys again");
            st.finish()?;
        }
        return sync_range(src, dst, o, state, None, stats, stop).await;
    }
    let mut before = o.clone();
    let report = sync_range(
        src.clone(),
        dst.clone(),
        o,
        state,
        None,
        stats.clone(),
        stop.clone(),
    )
    .await?;
    if report.exit_code() != 0 {
        return Ok(report);
    }
    // Keys up to the cursor: below the cursor followed by a byte above every other.
    before.range.hi = Some(format!("{cursor}\u{0}"));
    cli_common::eprintln!("jfs-sync: resumed run finished after {cursor:?}; checking what came before it again (the source may have changed there since the interrupted attempt)");
    // Counted apart: the summary above already counts these keys once (the earlier attempts'
    // tally); what this pass found changed is reported as `rechecked`.
    let again = sync_range(
        src,
        dst,
        before,
        None,
        None,
        Arc::new(Stats::default()),
        stop,
    )
    .await?;
    let mut summary = report.summary;
    summary.seconds += again.summary.seconds;
    summary.rechecked = Some(Box::new(again.summary));
    Ok(Report {
        summary,
        fatal: again.fatal,
        interrupted: again.interrupted,
    })
}

/// `sync` of one range whose resume point lives in `shared` (a shared job's unit) when given,
/// else in `state`. With `shared`, the deletion step is left to the job (it runs once, after
/// every range), and a refused save stops the run with an error.
pub async fn sync_range(
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    o: Options,
    state: Option<Arc<State>>,
    shared: Option<Arc<dyn Shared>>,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<Report> {
    let t0 = Instant::now();
    let o = Arc::new(o);
    let (cursor, mut base) = match (&shared, &state) {
        (Some(sh), _) => sh.start(),
        (None, Some(s)) => (s.cursor()?, s.tally()?.unwrap_or_default()),
        (None, None) => (None, Summary::default()),
    };
    if let (None, Some(st)) = (&shared, &state) {
        base.deleted += st.deleted_count()?;
    }
    if let Some(c) = &cursor {
        tracing::info!(cursor = %c, "resuming after the last resolved key");
    }
    let mut range = o.range.resumed(cursor.as_deref());
    // A directory the rules exclude is never opened, on either side (excluded keys are
    // neither copied nor deleted).
    let rules = o.filter.clone();
    range.prune = Some(crate::range::Prune(Arc::new(move |dir: &str| {
        !rules.key_included(dir)
    })));
    let dst_keys = o.keys.clone();
    let mut sside = Side {
        rx: spawn_lister(
            src.clone(),
            range.clone(),
            &o,
            o.keys.clone(),
            o.keys_from_user.then(|| stats.clone()),
        ),
        buf: VecDeque::new(),
    };
    let mut dside = Side {
        rx: spawn_lister(dst.clone(), range, &o, dst_keys, None),
        buf: VecDeque::new(),
    };
    let ctx = Arc::new(Ctx {
        src: src.clone(),
        dst: dst.clone(),
        o: o.clone(),
        stats: stats.clone(),
        state: state.clone(),
        shared: shared.clone(),
        extras: Mutex::new(Vec::new()),
        lost: Mutex::new(None),
        base: base.clone(),
        window: Mutex::new(Window {
            merged_to: cursor.clone(),
            ..Default::default()
        }),
        unsynced: Mutex::new(Vec::new()),
        flush_now: Notify::new(),
        flushing: tokio::sync::Mutex::new(()),
        abort: AtomicBool::new(false),
    });
    // Flush and checkpoint every second (or at once when many completions wait). Stopped by
    // a signal, never aborted: an aborted flush would drop the completions it holds.
    let (saver_stop, mut saver_stopped) = watch::channel(false);
    let saver = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_secs(1));
            let mut ticks = 0u64;
            loop {
                tokio::select! {
                    _ = iv.tick() => {
                        ticks += 1;
                        if ticks.is_multiple_of(60) {
                            ctx.o.limits.refresh();
                        }
                    }
                    _ = ctx.flush_now.notified() => {}
                    _ = saver_stopped.changed() => return,
                }
                if let Err(e) = ctx.checkpoint().await {
                    tracing::warn!(error = %format!("{e:#}"), "saving progress");
                }
            }
        })
    };
    let pool = Arc::new(Semaphore::new(o.threads.max(1)));
    let end = shared.as_ref().and_then(|sh| sh.end());
    let mut fatal = None;
    let mut pending_deletes: Vec<(String, bool)> = Vec::new();
    let result: Result<()> = async {
        loop {
            if *stop.borrow() || ctx.abort.load(Ordering::SeqCst) {
                break;
            }
            let s = sside.peek().await?.cloned();
            let d = dside.peek().await?.cloned();
            let (se, de) = match (&s, &d) {
                (None, None) => break,
                (Some(a), Some(b)) if a.key == b.key => (s, d),
                (Some(a), Some(b)) if a.key < b.key => (s, None),
                (Some(_), None) => (s, None),
                _ => (None, d),
            };
            // The back of the range was handed to another worker: this run ends at the cut.
            let next = se.as_ref().or(de.as_ref()).map(|e| e.key.as_str());
            if let (Some(end), Some(k)) = (&end, next) {
                if !end.admit(k) {
                    break;
                }
            }
            if se.is_some() {
                sside.buf.pop_front();
            }
            if de.is_some() {
                dside.buf.pop_front();
                Stats::add(&stats.dst_listed, 1);
            }
            let key = se
                .as_ref()
                .or(de.as_ref())
                .map(|e| e.key.clone())
                .expect("one side");
            let inline = |o: Outcome| ctx.window().inline(key.clone(), o);
            if crate::endpoint::is_temp(&key) {
                // A file being written by jfs-sync (or left by an interrupted run): never
                // copied, compared or counted. On the destination it is a leftover of an
                // earlier attempt on this range (this run's own are made after its listing
                // of their directory): removed, so that nothing shows it or copies it on.
                if let (Some(d), false) = (&de, o.dry_run) {
                    match dst.delete(&d.key, Kind::File).await {
                        Ok(()) => tracing::info!(key = %crate::names::show(&d.key), "removed a temporary file an interrupted run left"),
                        Err(e) => tracing::warn!(key = %crate::names::show(&d.key), error = %format!("{e:#}"), "removing a temporary file an interrupted run left"),
                    }
                }
                ctx.window().merged_to = Some(key.clone());
                continue;
            }
            let Some(s) = se else {
                let d = de.expect("dst side");
                if !o.filter.in_range(&d.key) || !o.filter.key_included(&d.key) {
                    // Excluded keys are never deleted; they are not source keys either.
                    ctx.window().merged_to = Some(key.clone());
                    continue;
                }
                Stats::add(&stats.extra, 1);
                if o.delete_dst {
                    if o.dry_run {
                        println!("would delete {}", crate::names::show(&d.key));
                        Stats::add(&stats.deleted, 1);
                    } else if shared.is_some() {
                        ctx.extras
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((d.key.clone(), d.kind == Kind::Dir));
                    } else if let Some(st) = &state {
                        st.add_delete(&d.key, d.kind == Kind::Dir)?;
                    } else {
                        pending_deletes.push((d.key.clone(), d.kind == Kind::Dir));
                    }
                }
                inline(Outcome::of(OutcomeKind::Extra));
                continue;
            };
            Stats::add(&stats.listed, 1);
            if !o.filter.allows(&s) {
                Stats::add(&stats.excluded, 1);
                inline(Outcome::of(OutcomeKind::Excluded));
                continue;
            }
            if s.kind == Kind::Symlink && !o.links {
                // Symlinks are not followed; --links copies them.
                stats.skip(Why::Symlink);
                inline(Outcome::of(OutcomeKind::Skipped(Why::Symlink)));
                continue;
            }
            let rewritten = o.rewritten.as_ref().is_some_and(|r| r.contains(&s.key))
                && !o.compare.ignore_existing
                && !o.compare.update
                && s.kind == Kind::File
                && de.as_ref().is_some_and(|d| d.kind == Kind::File);
            let action = if rewritten {
                Action::Update
            } else {
                o.compare.decide(Some(&s), de.as_ref())
            };
            if let Action::Skip(why) = action {
                stats.skip(why);
                if o.delete_src && !o.dry_run && s.kind == Kind::File && de.is_some() {
                    src.delete(&s.key, s.kind).await?;
                }
                inline(Outcome::of(OutcomeKind::Skipped(why)));
                continue;
            }
            // A copy an interrupted attempt finished counts as what it was, if the
            // destination still holds an object of that size (a lost or torn file is
            // copied again).
            let earlier = match (&state, action) {
                (Some(st), a)
                    if a != Action::Compare && de.as_ref().is_some_and(|d| d.size == s.size) =>
                {
                    st.is_done(&s.key, s.size, s.mtime_ns)?
                }
                _ => None,
            };
            if let Some(done) = earlier {
                let mut out = Outcome::of(match done {
                    Done::Copied => OutcomeKind::Copied,
                    Done::Updated => OutcomeKind::Updated,
                    Done::Skipped => OutcomeKind::Skipped(Why::UpToDate),
                });
                match out.kind {
                    OutcomeKind::Copied => Stats::add(&stats.copied, 1),
                    OutcomeKind::Updated => Stats::add(&stats.updated, 1),
                    _ => stats.skip(Why::UpToDate),
                }
                if matches!(out.kind, OutcomeKind::Copied | OutcomeKind::Updated) {
                    out.bytes = s.size;
                    Stats::add(&stats.bytes, s.size);
                }
                if o.delete_src && !o.dry_run && s.kind == Kind::File {
                    src.delete(&s.key, s.kind).await?;
                }
                inline(out);
                continue;
            }
            if o.dry_run {
                let (word, c) = match action {
                    Action::Copy => ("copy", &stats.copied),
                    Action::Update => ("update", &stats.updated),
                    _ => ("compare", &stats.updated),
                };
                println!("would {word} {}", crate::names::show(&s.key));
                Stats::add(c, 1);
                continue;
            }
            let permit = tokio::select! {
                p = pool.clone().acquire_owned() => p.expect("semaphore open"),
                _ = stop.changed() => {
                    // Not handed out: not counted, and the cursor stays before it.
                    stats.listed.fetch_sub(1, Ordering::Relaxed);
                    break;
                }
            };
            let id = ctx.window().push(key);
            dispatch(&ctx, permit, action, s, id);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        fatal = Some(format!("{e:#}"));
    }
    // Wait for the work in flight, then make it durable and save progress.
    let _all = pool
        .acquire_many(o.threads.max(1) as u32)
        .await
        .expect("semaphore open");
    let _ = saver_stop.send(true);
    let _ = saver.await; // its hold on the state is gone before we return
    let lost = ctx.lost.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(why) = lost {
        bail!(why);
    }
    ctx.checkpoint().await?;
    let interrupted = *stop.borrow();
    if ctx.abort.load(Ordering::SeqCst) && fatal.is_none() {
        fatal = Some(format!(
            "stopped: more than {} objects failed (--max-failure)",
            o.max_failure.unwrap_or(0)
        ));
    }
    if let Some(st) = &state {
        st.flush()?;
    }
    // Deletions only after a complete, clean run.
    let failed = stats.failed.load(Ordering::Relaxed);
    // Deletes that failed count as failures, but belong to no listed key.
    let mut delete_failures = 0u64;
    if o.delete_dst && o.dry_run {
        let n = stats.deleted.load(Ordering::Relaxed);
        if let Some(why) = refused(o.max_delete, n, stats.dst_listed.load(Ordering::Relaxed)) {
            fatal = Some(format!("the deletion step would be refused: {why}"));
        }
    } else if shared.is_some() {
        // The job deletes, once, after every range.
    } else if o.delete_dst && fatal.is_none() && !interrupted && failed == 0 {
        let deletes = match &state {
            Some(st) => st.deletes()?,
            None => {
                pending_deletes.sort();
                pending_deletes.reverse();
                pending_deletes
            }
        };
        // The percentage is of the destination objects this run saw (a resumed run saw fewer,
        // which only makes the limit stricter).
        let listed_dst = stats
            .dst_listed
            .load(Ordering::Relaxed)
            .max(deletes.len() as u64);
        let listed_src = stats.listed.load(Ordering::Relaxed) + base.listed;
        if o.keys.is_none() && listed_src == 0 && !deletes.is_empty() && o.max_delete.is_none() {
            fatal = Some(format!(
                "the source listed nothing, so --delete-dst would delete all {} destination objects (a mistyped, emptied or unmounted source?); nothing was deleted. To empty the destination on purpose, give --max-delete 100%",
                deletes.len()
            ));
            if let Some(st) = &state {
                st.finish()?;
            }
        } else if let Some(why) = refused(o.max_delete, deletes.len() as u64, listed_dst) {
            fatal = Some(format!("refusing to delete: {why}; nothing was deleted"));
            // The copies are done; the next run starts from a fresh listing and counts again.
            if let Some(st) = &state {
                st.finish()?;
            }
        } else {
            let mut files = Vec::new();
            for (key, is_dir) in deletes {
                let kind = if is_dir { Kind::Dir } else { Kind::File };
                match with_retries(o.retries, &key, || dst.delete(&key, kind)).await {
                    Ok(()) => {
                        Stats::add(&stats.deleted, 1);
                        if let Some(st) = &state {
                            st.deleted(&key)?;
                        }
                        if !is_dir {
                            files.push(key);
                        }
                    }
                    Err(e) => {
                        Stats::add(&stats.failed, 1);
                        delete_failures += 1;
                        cli_common::eprintln!(
                            "jfs-sync: failed: deleting {}: {e:#}",
                            crate::names::show(&key)
                        );
                    }
                }
            }
            // Without --dirs, directories are not objects of the sync: those the deletes
            // emptied go with them (with --dirs, an extraneous directory is itself deleted).
            if !o.dirs {
                crate::endpoint::prune_emptied(&*dst, &files).await;
            }
        }
    } else if o.delete_dst && (failed > 0 || fatal.is_some()) {
        tracing::warn!("nothing deleted: the run had errors");
    }
    let mut summary = stats.summary(t0.elapsed().as_secs_f64());
    summary.dry_run = o.dry_run;
    if base != Summary::default() {
        summary.add(&base);
        summary.resumed = Some(Box::new(base));
    }
    if let (None, Some(st)) = (&shared, &state) {
        if fatal.is_none() && !interrupted && summary.failed == 0 {
            st.finish()?;
        }
    }
    let mut check = summary.clone();
    check.failed -= delete_failures;
    if !check.adds_up() && !interrupted && fatal.is_none() {
        bail!(
            "internal error: the summary does not add up: {}",
            summary.line()
        );
    }
    Ok(Report {
        summary,
        fatal,
        interrupted,
    })
}

/// Why `n` deletions of `listed` destination objects are over the limit, if they are.
pub fn refused(max: Option<MaxDelete>, n: u64, listed: u64) -> Option<String> {
    let (over, limit) = match max? {
        MaxDelete::Count(c) => (n > c, c.to_string()),
        MaxDelete::Percent(p) => (n as f64 > p / 100.0 * listed as f64, format!("{p}%")),
    };
    over.then(|| format!("{n} of {listed} destination objects is over --max-delete {limit}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(kind: OutcomeKind) -> Outcome {
        Outcome::of(kind)
    }

    #[test]
    fn the_cursor_and_its_tally_move_together() {
        let mut w = Window::default();
        w.inline("a".into(), o(OutcomeKind::Excluded));
        let b = w.push("b".into());
        w.inline("c".into(), o(OutcomeKind::Skipped(Why::UpToDate)));
        let d = w.push("d".into());
        assert_eq!(w.cursor().as_deref(), Some("a"));
        assert_eq!(w.tally.listed, 1);
        w.resolve(d, o(OutcomeKind::Copied));
        assert_eq!(w.cursor().as_deref(), Some("a"), "b is not recorded yet");
        w.resolve(b, o(OutcomeKind::Updated));
        assert_eq!(w.cursor().as_deref(), Some("d"));
        let t = &w.tally;
        assert_eq!(
            (t.listed, t.excluded, t.updated, t.skipped, t.copied),
            (4, 1, 1, 1, 1)
        );
        assert!(t.adds_up());
    }
}
