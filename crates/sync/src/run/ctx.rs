//! What the workers of a run share (`Ctx`): the endpoints, options, state and stats, the
//! listers of both sides, and the work done per key (copy, update, compare, mkdir,
//! symlink), dispatched to a bounded pool.

use super::window::*;
use super::*;
use crate::copy::{checksum, with_retries, Copier};
use crate::endpoint::{Endpoint, Entry, Kind, Page};
use crate::plan::{Action, Why};
use crate::range::KeyRange;
use crate::state::{Done, State};
use crate::stats::{Outcome, OutcomeKind, Stats, Summary};
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

pub(super) struct Ctx {
    pub(super) src: Arc<dyn Endpoint>,
    pub(super) dst: Arc<dyn Endpoint>,
    pub(super) o: Arc<Options>,
    pub(super) stats: Arc<Stats>,
    pub(super) state: Option<Arc<State>>,
    pub(super) shared: Option<Arc<dyn Shared>>,
    /// Extraneous keys to hand to `shared` at the next save.
    pub(super) extras: Mutex<Vec<(String, bool)>>,
    /// Why a save to `shared` was refused (the lease was lost): the run stops.
    pub(super) lost: Mutex<Option<String>>,
    /// Earlier attempts' tally (keys at or before the starting cursor).
    pub(super) base: Summary,
    pub(super) window: Mutex<Window>,
    pub(super) unsynced: Mutex<Vec<Finished>>,
    pub(super) flush_now: Notify,
    /// One flush at a time (the saver's and the final one).
    pub(super) flushing: tokio::sync::Mutex<()>,
    pub(super) abort: AtomicBool,
}

impl Ctx {
    pub(super) fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a finished copy now, or after the next durability flush.
    pub(super) async fn finished(&self, f: Finished) {
        if self.dst.durable_later() {
            let n = {
                let mut u = self.unsynced.lock().unwrap_or_else(|p| p.into_inner());
                u.push(f);
                u.len()
            };
            if n >= UNSYNCED_MAX {
                self.flush_now.notify_one();
            }
        } else {
            self.record(vec![f]).await;
        }
    }

    /// Make waiting completions durable, then record them. If the sync fails they were not
    /// made durable: they count as failed and stay unresolved (the next run copies them).
    pub(super) async fn flush(&self) {
        let _one = self.flushing.lock().await;
        let batch = std::mem::take(&mut *self.unsynced.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            return;
        }
        match self.dst.sync().await {
            Ok(()) => self.record(batch).await,
            Err(e) => {
                cli_common::eprintln!(
                    "jfs-sync: failed: making {} copies durable on {}: {e:#}",
                    batch.len(),
                    self.dst.describe()
                );
                Stats::add(&self.stats.failed, batch.len() as u64);
            }
        }
    }

    pub(super) async fn record(&self, batch: Vec<Finished>) {
        for f in batch {
            let st = &self.stats;
            match f.outcome.kind {
                OutcomeKind::Copied => Stats::add(&st.copied, 1),
                OutcomeKind::Updated => Stats::add(&st.updated, 1),
                OutcomeKind::Skipped(w) => st.skip(w),
                _ => {}
            }
            Stats::add(&st.bytes, f.outcome.bytes);
            if let Some(state) = &self.state {
                let what = match f.outcome.kind {
                    OutcomeKind::Copied => Done::Copied,
                    OutcomeKind::Updated => Done::Updated,
                    _ => Done::Skipped,
                };
                if let Err(e) = state.mark_done(&f.key, f.size, f.mtime_ns, what) {
                    tracing::warn!(key = %crate::names::show(&f.key), error = %e, "could not record progress");
                }
            }
            // The source goes only once the destination's copy is durable.
            if self.o.delete_src && f.kind == Kind::File {
                if let Err(e) = self.src.delete(&f.key, f.kind).await {
                    tracing::error!(key = %crate::names::show(&f.key), error = %format!("{e:#}"), "deleting the source after the copy failed");
                }
            }
            self.window().resolve(f.id, f.outcome);
        }
    }

    /// Flush, then save the cursor with its tally.
    pub(super) async fn checkpoint(&self) -> Result<()> {
        self.flush().await;
        if self.state.is_none() && self.shared.is_none() {
            return Ok(());
        }
        let (cursor, mut tally) = {
            let mut w = self.window();
            (w.cursor(), w.tally.clone())
        };
        let Some(c) = cursor else { return Ok(()) };
        tally.add(&self.base);
        match &self.shared {
            Some(sh) => {
                let extras =
                    std::mem::take(&mut *self.extras.lock().unwrap_or_else(|p| p.into_inner()));
                if let Err(e) = sh.save(&c, &tally, extras).await {
                    let why = format!("{e:#}");
                    *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                    self.abort.store(true, Ordering::SeqCst);
                    anyhow::bail!(why);
                }
            }
            None => {
                if let Some(st) = &self.state {
                    st.checkpoint(&c, &tally)?;
                }
            }
        }
        Ok(())
    }
}

pub(super) fn spawn_lister(
    ep: Arc<dyn Endpoint>,
    range: KeyRange,
    o: &Options,
    keys: Option<Vec<String>>,
    report_missing: Option<Arc<Stats>>,
) -> mpsc::Receiver<Page> {
    let Some(keys) = keys else {
        return crate::listing::spawn(ep, range, o.dirs, o.list_threads, o.list_depth);
    };
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        // --files-from: look each key up instead of listing, 32 lookups in flight (answers
        // taken in key order).
        use futures::StreamExt;
        let mut page = Vec::new();
        let mut found = futures::stream::iter(keys.into_iter().filter(|k| range.contains(k)))
            .map(|k| {
                let ep = ep.clone();
                async move {
                    let r = ep.stat(&k).await;
                    (k, r)
                }
            })
            .buffered(32);
        while let Some((k, r)) = found.next().await {
            match r {
                Ok(Some(e)) if e.kind != Kind::Dir => page.push(e),
                Ok(found) => {
                    if let Some(stats) = &report_missing {
                        let what = if found.is_some() {
                            "is a directory (list its files)"
                        } else {
                            "does not exist in the source"
                        };
                        cli_common::eprintln!("jfs-sync: failed: {k:?} (from --files-from) {what}");
                        Stats::add(&stats.listed, 1);
                        Stats::add(&stats.failed, 1);
                    }
                }
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
    });
    rx
}

pub(super) async fn work(ctx: Arc<Ctx>, action: Action, s: Entry) -> Result<Outcome> {
    let o = &ctx.o;
    // A sink restores the owner an entry carries: only with --owners.
    let s = if o.owners {
        s
    } else {
        Entry { owner: None, ..s }
    };
    let copier = Copier {
        src: &*ctx.src,
        dst: &*ctx.dst,
        limits: &o.limits,
        perms: o.perms,
        check_new: o.check_new,
        state: ctx.state.as_deref(),
    };
    let mut action = action;
    let mut checked = false;
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
        checked = true;
        if a == b {
            let mut out = Outcome::of(OutcomeKind::Skipped(Why::UpToDate));
            out.checked = true;
            return Ok(out);
        }
        action = Action::Update;
    }
    let mut bytes = 0;
    match s.kind {
        Kind::Dir => with_retries(o.retries, &s.key, || ctx.dst.mkdir(&s.key, &s, o.perms)).await?,
        Kind::Symlink => {
            let t = s.target.clone().unwrap_or_default();
            with_retries(o.retries, &s.key, || ctx.dst.symlink(&s.key, &t)).await?
        }
        Kind::File => bytes = with_retries(o.retries, &s.key, || copier.copy_file(&s)).await?,
    }
    let mut out = Outcome::of(if action == Action::Copy {
        OutcomeKind::Copied
    } else {
        OutcomeKind::Updated
    });
    out.bytes = bytes;
    out.checked = checked;
    Ok(out)
}

pub(super) fn dispatch(
    ctx: &Arc<Ctx>,
    permit: tokio::sync::OwnedSemaphorePermit,
    action: Action,
    s: Entry,
    id: u64,
) {
    let ctx = ctx.clone();
    Stats::add(&ctx.stats.pending, 1);
    tokio::spawn(async move {
        let key = s.key.clone();
        let (size, mtime_ns, kind) = (s.size, s.mtime_ns, s.kind);
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
                "{}: internal error (panic) while copying",
                crate::names::show(&key)
            )),
        };
        ctx.stats.pending.fetch_sub(1, Ordering::Relaxed);
        match res {
            Ok(outcome) => {
                ctx.finished(Finished {
                    id,
                    key,
                    size,
                    mtime_ns,
                    kind,
                    outcome,
                })
                .await;
            }
            Err(e) => {
                // A failed key stays unresolved: the cursor never passes it, the next run retries it.
                Stats::add(&ctx.stats.failed, 1);
                tracing::error!(key = %crate::names::show(&key), error = %format!("{e:#}"), "failed");
                cli_common::eprintln!("jfs-sync: failed: {e:#}");
                if ctx
                    .o
                    .max_failure
                    .is_some_and(|m| ctx.stats.failed.load(Ordering::Relaxed) > m)
                {
                    ctx.abort.store(true, Ordering::SeqCst);
                }
            }
        }
        drop(permit);
    });
}
