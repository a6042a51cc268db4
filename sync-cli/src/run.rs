//! One sync run: list both sides in key order, merge, decide per key, hand work to a bounded
//! pool, delete extraneous objects only after a clean run, and keep the resume state.

use crate::copy::{checksum, with_retries, Copier};
use crate::endpoint::{Endpoint, Entry, Kind, Page};
use crate::filter::Filter;
use crate::limits::Limits;
use crate::plan::{Action, Compare};
use crate::state::State;
use crate::stats::{Stats, Summary};
use anyhow::{bail, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxDelete {
    Count(u64),
    Percent(f64),
}

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
    pub links: bool,
    pub check_new: bool,
    pub retries: u32,
    /// Only these keys (sorted), instead of listing everything.
    pub keys: Option<Vec<String>>,
    pub limits: Arc<Limits>,
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
        } else if self.summary.failed > 0 {
            1
        } else {
            0
        }
    }
}

/// A merged listing side: pages from a lister task, one entry at a time.
struct Side {
    rx: mpsc::Receiver<Page>,
    buf: VecDeque<Entry>,
}

impl Side {
    async fn peek(&mut self) -> Result<Option<&Entry>> {
        while self.buf.is_empty() {
            match self.rx.recv().await {
                Some(page) => self.buf.extend(page?),
                None => return Ok(None),
            }
        }
        Ok(self.buf.front())
    }
}

/// Keys handed to workers, in order; the cursor never passes one that is not done.
#[derive(Default)]
struct Window {
    base: u64,
    q: VecDeque<(Option<String>, bool)>, // (merge position before this key, done)
    merged_to: Option<String>,
}

impl Window {
    fn push(&mut self, prev: Option<String>) -> u64 {
        self.q.push_back((prev, false));
        self.base + self.q.len() as u64 - 1
    }
    fn done(&mut self, id: u64) {
        if let Some(e) = self.q.get_mut((id - self.base) as usize) {
            e.1 = true;
        }
    }
    /// Everything at or before the returned key is resolved.
    fn cursor(&mut self) -> Option<String> {
        while self.q.front().is_some_and(|e| e.1) {
            self.q.pop_front();
            self.base += 1;
        }
        match self.q.front() {
            Some((prev, _)) => prev.clone(),
            None => self.merged_to.clone(),
        }
    }
}

struct Ctx {
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    o: Arc<Options>,
    stats: Arc<Stats>,
    state: Option<Arc<State>>,
    window: Mutex<Window>,
    abort: AtomicBool,
}

fn spawn_lister(
    ep: Arc<dyn Endpoint>,
    after: Option<String>,
    o: &Options,
    keys: Option<Vec<String>>,
) -> mpsc::Receiver<Page> {
    if keys.is_none() {
        return crate::listing::spawn(ep, after, o.dirs, o.list_threads, o.list_depth);
    }
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let r = match keys {
            None => Ok(()),
            Some(keys) => {
                // --files-from: look each key up instead of listing.
                let mut page = Vec::new();
                for k in keys
                    .into_iter()
                    .filter(|k| after.as_deref().is_none_or(|a| k.as_str() > a))
                {
                    match ep.stat(&k).await {
                        Ok(Some(e)) if e.kind != Kind::Dir => page.push(e),
                        Ok(_) => {}
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                    if page.len() >= 1000 {
                        let _ = tx.send(Ok(std::mem::take(&mut page))).await;
                    }
                }
                let _ = tx.send(Ok(page)).await;
                Ok(())
            }
        };
        if let Err(e) = r {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

async fn work(ctx: Arc<Ctx>, action: Action, s: Entry) -> Result<Action> {
    let o = &ctx.o;
    let copier = Copier {
        src: &*ctx.src,
        dst: &*ctx.dst,
        limits: &o.limits,
        perms: o.perms,
        check_new: o.check_new,
        state: ctx.state.as_deref(),
    };
    let mut action = action;
    if action == Action::Compare {
        let a = with_retries(o.retries, &s.key, || {
            checksum(&*ctx.src, &s.key, s.size, &o.limits)
        })
        .await?;
        let b = with_retries(o.retries, &s.key, || {
            checksum(&*ctx.dst, &s.key, s.size, &o.limits)
        })
        .await?;
        Stats::add(&ctx.stats.checked, 1);
        if a == b {
            return Ok(Action::Skip);
        }
        action = Action::Update;
    }
    match s.kind {
        Kind::Dir => with_retries(o.retries, &s.key, || ctx.dst.mkdir(&s.key, &s, o.perms)).await?,
        Kind::Symlink => {
            let t = s.target.clone().unwrap_or_default();
            with_retries(o.retries, &s.key, || ctx.dst.symlink(&s.key, &t)).await?
        }
        Kind::File => {
            let n = with_retries(o.retries, &s.key, || copier.copy_file(&s)).await?;
            Stats::add(&ctx.stats.bytes, n);
        }
    }
    Ok(action)
}

fn dispatch(
    ctx: &Arc<Ctx>,
    permit: tokio::sync::OwnedSemaphorePermit,
    action: Action,
    s: Entry,
    id: u64,
) {
    let ctx = ctx.clone();
    Stats::add(&ctx.stats.pending, 1);
    tokio::spawn(async move {
        let _permit = permit;
        let key = s.key.clone();
        let (size, mtime, kind) = (s.size, s.mtime_ns, s.kind);
        // A panic in a copy is a failed object, not a lost one.
        let res = match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(work(
            ctx.clone(),
            action,
            s,
        )))
        .await
        {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(
                "{key}: internal error (panic) while copying"
            )),
        };
        ctx.stats.pending.fetch_sub(1, Ordering::Relaxed);
        match res {
            Ok(done) => {
                let counter = match done {
                    Action::Copy => &ctx.stats.copied,
                    Action::Update => &ctx.stats.updated,
                    _ => &ctx.stats.skipped,
                };
                Stats::add(counter, 1);
                if let Some(st) = &ctx.state {
                    if let Err(e) = st.mark_done(&key, size, mtime) {
                        tracing::warn!(key, error = %e, "could not record progress");
                    }
                }
                if ctx.o.delete_src && kind == Kind::File {
                    if let Err(e) = ctx.src.delete(&key, kind).await {
                        tracing::error!(key, error = %format!("{e:#}"), "deleting the source after the copy failed");
                    }
                }
                ctx.window
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .done(id);
            }
            Err(e) => {
                // A failed key stays unresolved: the cursor never passes it, the next run retries it.
                Stats::add(&ctx.stats.failed, 1);
                tracing::error!(key, error = %format!("{e:#}"), "failed");
                eprintln!("jfs-sync: failed: {e:#}");
                if ctx
                    .o
                    .max_failure
                    .is_some_and(|m| ctx.stats.failed.load(Ordering::Relaxed) > m)
                {
                    ctx.abort.store(true, Ordering::SeqCst);
                }
            }
        }
    });
}

/// Run the sync. `stop` turns true on SIGINT/SIGTERM: no new work starts, work in flight
/// finishes, the cursor is saved.
pub async fn sync(
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    o: Options,
    state: Option<Arc<State>>,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) -> Result<Report> {
    let t0 = Instant::now();
    let o = Arc::new(o);
    let cursor = match &state {
        Some(s) => s.cursor()?,
        None => None,
    };
    if let Some(c) = &cursor {
        tracing::warn!(cursor = %c, "resuming after the last resolved key");
    }
    let dst_keys = if o.keys.is_some() {
        o.keys.clone()
    } else {
        None
    };
    let mut sside = Side {
        rx: spawn_lister(src.clone(), cursor.clone(), &o, o.keys.clone()),
        buf: VecDeque::new(),
    };
    let mut dside = Side {
        rx: spawn_lister(dst.clone(), cursor.clone(), &o, dst_keys),
        buf: VecDeque::new(),
    };
    let ctx = Arc::new(Ctx {
        src: src.clone(),
        dst: dst.clone(),
        o: o.clone(),
        stats: stats.clone(),
        state: state.clone(),
        window: Mutex::new(Window {
            merged_to: cursor.clone(),
            ..Default::default()
        }),
        abort: AtomicBool::new(false),
    });
    // Save the cursor every second.
    let saver = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_secs(1));
            let mut ticks = 0u64;
            loop {
                iv.tick().await;
                ticks += 1;
                if ticks % 60 == 0 {
                    ctx.o.limits.refresh();
                }
                let c = ctx
                    .window
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cursor();
                if let (Some(st), Some(c)) = (&ctx.state, c) {
                    let _ = st.set_cursor(&c);
                }
            }
        })
    };
    let pool = Arc::new(Semaphore::new(o.threads.max(1)));
    let mut fatal = None;
    let mut pending_deletes: Vec<(String, bool)> = Vec::new();
    let result: Result<()> = async {
        let mut handled: Option<String> = None;
        loop {
            if let Some(k) = handled.take() {
                ctx.window
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .merged_to = Some(k);
            }
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
            // The merge position is published only once this key is handled (at the top of
            // the next iteration): the cursor saver must never see it while the key still
            // waits for a worker.
            let prev = ctx
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .merged_to
                .clone();
            handled = Some(key.clone());
            let Some(s) = se else {
                let d = de.expect("dst side");
                if !o.filter.in_range(&d.key) || !o.filter.key_included(&d.key) {
                    continue; // excluded keys are never deleted
                }
                Stats::add(&stats.extra, 1);
                if o.delete_dst {
                    if o.dry_run {
                        println!("delete {}", d.key);
                    } else if let Some(st) = &state {
                        st.add_delete(&d.key, d.kind == Kind::Dir)?;
                    } else {
                        pending_deletes.push((d.key.clone(), d.kind == Kind::Dir));
                    }
                }
                continue;
            };
            Stats::add(&stats.listed, 1);
            if !o.filter.allows(&s) {
                Stats::add(&stats.excluded, 1);
                continue;
            }
            if s.kind == Kind::Symlink && !o.links {
                Stats::add(&stats.skipped, 1); // symlinks are not followed; --links copies them
                continue;
            }
            let action = o.compare.decide(Some(&s), de.as_ref());
            if action == Action::Skip
                // A copy an interrupted run finished counts only if the destination still
                // holds an object of that size (a lost or torn file is copied again).
                || (action != Action::Compare
                    && de.as_ref().is_some_and(|d| d.size == s.size)
                    && state
                        .as_ref()
                        .map(|st| st.is_done(&s.key, s.size, s.mtime_ns))
                        .transpose()?
                        .unwrap_or(false))
            {
                Stats::add(&stats.skipped, 1);
                if o.delete_src && !o.dry_run && s.kind == Kind::File && de.is_some() {
                    src.delete(&s.key, s.kind).await?;
                }
                continue;
            }
            if o.dry_run {
                let (word, c) = match action {
                    Action::Copy => ("copy", &stats.copied),
                    Action::Update => ("update", &stats.updated),
                    _ => ("compare", &stats.skipped),
                };
                println!("{word} {}", s.key);
                Stats::add(c, 1);
                continue;
            }
            let permit = tokio::select! {
                p = pool.clone().acquire_owned() => p.expect("semaphore open"),
                _ = stop.changed() => {
                    // This key was not handed out: the cursor must not pass it.
                    // Not handed out: breaking skips publishing it, so the cursor stays before it.
                    stats.listed.fetch_sub(1, Ordering::Relaxed);
                    break;
                }
            };
            let id = ctx
                .window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(prev);
            dispatch(&ctx, permit, action, s, id);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        fatal = Some(format!("{e:#}"));
    }
    // Wait for the work in flight.
    let _all = pool
        .acquire_many(o.threads.max(1) as u32)
        .await
        .expect("semaphore open");
    saver.abort();
    let _ = saver.await; // its hold on the state is gone before we return
    let interrupted = *stop.borrow();
    if ctx.abort.load(Ordering::SeqCst) && fatal.is_none() {
        fatal = Some(format!(
            "stopped: more than {} objects failed (--max-failure)",
            o.max_failure.unwrap_or(0)
        ));
    }
    if let Some(st) = &state {
        if let Some(c) = ctx
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cursor()
        {
            st.set_cursor(&c)?;
        }
        st.flush()?;
    }
    // Deletions only after a complete, clean run.
    let failed = stats.failed.load(Ordering::Relaxed);
    if o.delete_dst && !o.dry_run && fatal.is_none() && !interrupted && failed == 0 {
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
        let refuse = match o.max_delete {
            Some(MaxDelete::Count(n)) => deletes.len() as u64 > n,
            Some(MaxDelete::Percent(p)) => deletes.len() as f64 > p / 100.0 * listed_dst as f64,
            None => false,
        };
        if refuse {
            let limit = match o.max_delete.expect("set") {
                MaxDelete::Count(n) => n.to_string(),
                MaxDelete::Percent(p) => format!("{p}%"),
            };
            fatal = Some(format!(
                "refusing to delete {} of {listed_dst} destination objects: over --max-delete {limit}; nothing was deleted",
                deletes.len()
            ));
            // The copies are done; the next run starts from a fresh listing and counts again.
            if let Some(st) = &state {
                st.finish()?;
            }
        } else {
            for (key, is_dir) in deletes {
                let kind = if is_dir { Kind::Dir } else { Kind::File };
                match with_retries(o.retries, &key, || dst.delete(&key, kind)).await {
                    Ok(()) => Stats::add(&stats.deleted, 1),
                    Err(e) => {
                        Stats::add(&stats.failed, 1);
                        eprintln!("jfs-sync: failed: deleting {key}: {e:#}");
                    }
                }
            }
        }
    } else if o.delete_dst && !o.dry_run && (failed > 0 || fatal.is_some()) {
        tracing::warn!("nothing deleted: the run had errors");
    }
    let summary = stats.summary(t0.elapsed().as_secs_f64());
    if let Some(st) = &state {
        if fatal.is_none() && !interrupted && summary.failed == 0 {
            st.finish()?;
        }
    }
    if !summary.adds_up() && !interrupted && fatal.is_none() {
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
