//! The status worker: `/status` and metrics, the progress record for the site's mounts, read
//! priority from their want records, and trimming the mirror's own journal.

use super::*;

/// The status worker: every 100 ms the status and metrics; every `PROGRESS_EVERY_MS` the
/// progress record and the mounts' wants; every minute the mirror's own journal trim. Its
/// failures are logged and retried at the next tick (never backed off: status stays fresh).
pub(super) struct StatusWorker {
    m: Arc<Mirror>,
    tick: tokio::time::Interval,
    last_trim: Instant,
    last_progress: Instant,
    wants_seen: HashMap<String, i64>,
}

impl StatusWorker {
    pub(super) fn new(m: Arc<Mirror>) -> Self {
        let every = Duration::from_millis(100);
        StatusWorker {
            m,
            tick: tokio::time::interval_at(tokio::time::Instant::now() + every, every),
            last_trim: Instant::now(),
            last_progress: Instant::now(),
            wants_seen: HashMap::new(),
        }
    }
}

#[async_trait::async_trait]
impl background::Worker for StatusWorker {
    fn name(&self) -> String {
        "status".into()
    }

    async fn work(&mut self, _stop: &CancellationToken) -> Result<background::WorkerState> {
        let m = &self.m;
        if let Err(e) = m.refresh().await {
            tracing::debug!(error = %e, "refreshing status");
        }
        if self.last_progress.elapsed() >= Duration::from_millis(fs_core::site::PROGRESS_EVERY_MS) {
            self.last_progress = Instant::now();
            if let Err(e) = m.publish_progress().await {
                tracing::debug!(error = %e, "writing the progress record for the site's mounts");
            }
            if let Err(e) = m.prioritize_wants(&mut self.wants_seen).await {
                tracing::debug!(error = %format!("{e:#}"), "reading the blocks the site's mounts want first");
            }
        }
        if self.last_trim.elapsed() >= Duration::from_secs(60) {
            self.last_trim = Instant::now();
            match m.trim_own_journal().await {
                Ok(n) if n > 0 => {
                    tracing::info!(entries = n, "trimmed the mirror's own journal")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "trimming the mirror's own journal")
                }
            }
        }
        Ok(background::WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> background::WorkerState {
        self.tick.tick().await;
        background::WorkerState::Busy
    }
}

impl Mirror {
    /// Tell the mounts at this site how fresh the mirror is (the `mirror.progress` record
    /// beside its metadata), from the figures `refresh` just computed.
    pub(super) async fn publish_progress(&self) -> Result<()> {
        let m = &self.metrics;
        let lag = m.lag_seconds.get();
        let writes = self.fwd.allowed_now();
        let p = fs_core::site::Progress {
            version: fs_core::site::MARKER_VERSION,
            applied_seq: m.applied_seq.get().max(0) as u64,
            primary_head_seq: m.primary_head.get().max(0) as u64,
            lag_seconds: (lag >= 0.0).then_some(lag),
            window_seconds: m.window_seconds.get(),
            within_window: m.within_window.get() == 1,
            at_ns: fs_core::now_ns(),
            resyncing: m.resync_staged.get() == 1,
            forward_socket: matches!(writes, Some(Ok(())))
                .then(|| self.forward_socket().to_string_lossy().into_owned()),
            writes_refused: writes.and_then(|w| w.err()),
        };
        fs_core::site::set_progress(&*self.engine, &p).await?;
        self.clear_finished_move().await
    }

    /// A former primary that rejoined: once it holds the new primary's epoch, the fence's
    /// `volume.moved` record is history. Left in place, its mounts took the rejoined site's
    /// own entries for a fork past the promotion (an ERROR telling a healthy mount to
    /// unmount) and `jfs status` called it fenced. The `volume.fenced` record stays: a
    /// second fence of this site reads it to say the site rejoined since.
    async fn clear_finished_move(&self) -> Result<()> {
        let Some(mv) = fs_core::site::moved(&*self.engine).await? else {
            return Ok(());
        };
        let epoch = fs_core::site::epoch(&*self.engine).await?;
        if epoch >= mv.epoch {
            fs_core::site::set_moved(&*self.engine, None).await?;
            tracing::info!(
                epoch,
                to = %mv.meta_url,
                "this site has rejoined the primary it was fenced for: the fence's move record is cleared (the move is over)"
            );
        }
        Ok(())
    }

    /// Copy first what the site's mounts read from the origin (their `mirror.want.*`
    /// records; each is looked at again only when its mount rewrote it).
    pub(super) async fn prioritize_wants(&self, seen: &mut HashMap<String, i64>) -> Result<()> {
        let wants = fs_core::site::wants(&*self.engine).await?;
        seen.retain(|name, _| wants.iter().any(|(n, _)| n == name));
        let mut moved = 0;
        for (name, w) in wants {
            if seen.get(&name) == Some(&w.at_ns) {
                continue;
            }
            moved += self.state.prioritize(&w.keys)?;
            seen.insert(name, w.at_ns);
        }
        if moved > 0 {
            self.metrics.blocks_prioritized.inc_by(moved);
            tracing::debug!(
                blocks = moved,
                "copies moved ahead: the site's mounts read them"
            );
            self.notify_blocks();
        }
        Ok(())
    }

    /// The mirror keeps the entries it applied (same frames, same numbers) for the volume's
    /// journal retention, but never those whose blocks are not queued yet (a restart re-reads
    /// them). The mirror runs no gc of blocks: purges come from the primary's journal.
    pub(super) async fn trim_own_journal(&self) -> Result<u64> {
        let Some(s) = self.settings() else {
            return Ok(0);
        };
        let cutoff = fs_core::now_ns() - s.journal_retention_secs as i64 * 1_000_000_000;
        let through = self.state.queued_through()?;
        Ok(fs_core::maint::trim_journal(&*self.engine, cutoff, through).await?)
    }

    pub(super) async fn refresh(&self) -> Result<()> {
        let applied = self.engine.journal_bounds().await?.last;
        let boot = self.state.bootstrap()?;
        // During a staged resync: how far the staging is (the live metadata stays at `applied`).
        let staged_seq = match self.meta.staging() {
            Some(st) => Some(st.journal_bounds().await?.last),
            None => None,
        };
        let w = self.cfg.window;
        let now_ns = fs_core::now_ns();
        let (
            lag_e,
            lag_s,
            within,
            connected,
            needs_resync,
            primary_head,
            last_error,
            uuid,
            heard,
            refused,
        ) = {
            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
            let ph = lv.primary_head.max(applied);
            let lag_e = ph - applied;
            // Only a live connection vouches for the primary's head: while cut off, the lag
            // in seconds keeps growing from the last moment the mirror knew it was caught up.
            let fresh = lv.connected
                && lv
                    .last_contact
                    .is_some_and(|t| t.elapsed() <= w.max(Duration::from_secs(2)));
            if fresh && lag_e == 0 {
                lv.caught_up_at = Some(Instant::now());
            }
            let lag_s = if fresh && lag_e == 0 {
                0.0
            } else if let Some((_, t)) = lv.received.iter().find(|(s, _)| *s > applied) {
                ((now_ns - t).max(0) as f64) / 1e9
            } else {
                lv.caught_up_at
                    .map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64())
            };
            let within = fresh && boot.is_none() && !lv.needs_resync && lag_s <= w.as_secs_f64();
            (
                lag_e,
                lag_s,
                within,
                lv.connected,
                lv.needs_resync,
                ph,
                lv.last_error.clone(),
                lv.volume_uuid.clone(),
                lv.last_contact.map(|t| t.elapsed().as_secs_f64()),
                lv.refused.clone(),
            )
        };
        let m = &self.metrics;
        // Read in this order: a batch records its blocks and `queued_through` in one write,
        // so a pending count read after `queued_through` covers every block of the entries
        // up to it (the count kept by the copier's loop may be a moment old).
        let queued_through = self.state.queued_through()?;
        let (pending, pending_bytes, failing) = self.state.pending()?;
        m.blocks_pending.set(pending as i64);
        m.bytes_pending.set(pending_bytes as i64);
        m.blocks_failing.set(failing as i64);
        m.applied_seq.set(applied as i64);
        m.primary_head.set(primary_head as i64);
        m.lag_entries.set(lag_e as i64);
        m.lag_seconds
            .set(if lag_s.is_finite() { lag_s } else { -1.0 });
        m.within_window.set(within as i64);
        m.connected.set(connected as i64);
        m.needs_resync.set(needs_resync as i64);
        m.bootstrapping.set(boot.is_some() as i64);
        m.resync_staged
            .set(boot.as_ref().is_some_and(|b| b.staged()) as i64);
        m.staged_seq.set(staged_seq.unwrap_or(0) as i64);
        let repl_err = self
            .repl
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|r| {
                r.last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            });
        let (bw, tps) = self.limits.current();
        let writes = self.fwd.allowed_now();
        m.window_seconds.set(w.as_secs_f64());
        m.copy_limit.set(bw.unwrap_or(0) as i64);
        m.set_status(serde_json::json!({
            "role": "mirror",
            "name": self.cfg.name,
            "primary": self.cfg.primary,
            "volume_uuid": uuid,
            "meta": self.engine.display_url(),
            "store": self.cfg.store,
            "connected": connected,
            "primary_head_seq": primary_head,
            // Seconds since the primary was last heard from (None: never since the start):
            // the head above is as of then.
            "primary_heard_seconds_ago": heard,
            "refused": refused,
            "applied_seq": applied,
            "acked_seq": applied,
            "lag_entries": lag_e,
            "lag_seconds": if lag_s.is_finite() { serde_json::json!(lag_s) } else { serde_json::Value::Null },
            "window_seconds": w.as_secs_f64(),
            "within_window": within,
            "bootstrap": boot,
            // A staged resync: the live metadata serves `applied_seq` (stale) while the
            // staging beside it catches up to the primary.
            "resync": boot.as_ref().filter(|b| b.staged()).map(|_| serde_json::json!({
                "serving_seq": applied,
                "staged_seq": staged_seq,
            })),
            "needs_resync": needs_resync,
            // The site's mounts' changes, committed at the primary (`forward`).
            "writes": {
                "allowed": match &writes { Some(Ok(())) => serde_json::json!(true), Some(Err(_)) => serde_json::json!(false), None => serde_json::Value::Null },
                "refused": writes.as_ref().and_then(|w| w.as_ref().err()),
                "connected": m.fwd_connected.get() == 1,
                "socket": self.forward_socket(),
                "committed": m.fwd_sent.get(),
                "conflicts": m.fwd_sent_conflicts.get(),
                "failed": m.fwd_sent_failed.get(),
                "mount_failures": m.mount_write_failures.get(),
                "last_failure": self.fwd.last_failure(),
                "seconds": m.fwd_sent_seconds.get(),
            },
            "last_error": last_error,
            "frame_errors": m.frame_errors.get(),
            "reconnects": m.reconnects.get(),
            "entries_applied": m.entries_applied.get(),
            "blocks": {
                // Blocks of entries up to this seq are queued or at the mirror store.
                "queued_through": queued_through,
                "pending": pending,
                "pending_bytes": pending_bytes,
                "failing": failing,
                "copied": m.blocks_copied.get(),
                "copied_bytes": m.bytes_copied.get(),
                "skipped": m.blocks_skipped.get(),
                "dropped": m.blocks_dropped.get(),
                "checksummed": m.blocks_checksummed.get(),
                "prioritized": m.blocks_prioritized.get(),
                "deleted": m.blocks_deleted.get(),
                "copy_errors": m.copy_errors.get(),
                "last_error": repl_err,
            },
            "limits": { "bytes_per_s": bw, "requests_per_s": tps },
        }));
        Ok(())
    }
}
