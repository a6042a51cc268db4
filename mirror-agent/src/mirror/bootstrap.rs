//! Bootstrap: a snapshot installed in place (a mirror with nothing consistent) or beside the
//! live metadata (a resync, see `staging`), the switch once caught up, and resync requests.

use super::*;

impl Mirror {
    pub(super) async fn install_snapshot<R: crate::proto::FrameStream>(
        &self,
        stream: &mut R,
        checks: &mut received::Received,
        stop: &CancellationToken,
    ) -> Result<()> {
        let (s0, settings) =
            match checks.step(recv_within(stream, Duration::from_secs(120)).await?)? {
                received::Step::SnapshotBegin { seq, settings } => (seq, settings),
                other => bail!("expected a snapshot, got {other:?}"),
            };
        let settings: Settings =
            serde_json::from_slice(&settings).context("the snapshot's settings do not decode")?;
        // A mirror that serves a consistent state keeps serving it: the snapshot goes into a
        // staging beside it (see `staging`). One with nothing consistent installs in place.
        let staged = self.serves_a_consistent_state().await?;
        tracing::info!(
            seq = s0,
            staged,
            "installing a snapshot{}",
            if staged {
                " beside the live metadata (which serves its previous state until the switch)"
            } else {
                ""
            }
        );
        self.metrics.bootstrapping.set(1);
        self.state.begin_install(s0, staged)?;
        let target = if staged {
            let t = self.meta.begin().await?;
            // The site's mounts hear at once that they serve the previous state (the record
            // is otherwise rewritten only every `PROGRESS_EVERY_MS`).
            self.publish_now().await;
            t
        } else {
            self.meta.discard()?;
            // Readers are fenced off until the mirror is consistent.
            self.engine
                .aux_put(
                    fs_core::slots::MIRROR_INCOMPLETE,
                    Some(format!("snapshot at seq {s0} being installed").as_bytes()),
                )
                .await?;
            self.engine.install_reset().await?;
            self.engine.clone()
        };
        let mut n = 0u64;
        loop {
            if stop.is_cancelled() {
                bail!("stopped during the snapshot (it starts over next time)");
            }
            // The order of the snapshot's messages and its end's seq are checked there.
            match checks.step(recv_within(stream, Duration::from_secs(120)).await?)? {
                received::Step::SnapshotPairs { pairs } => {
                    n += pairs.len() as u64;
                    target.install_put(&pairs).await?;
                    let ch = blocks::changes_of_pairs(&settings, &pairs);
                    self.state.record(&ch, None, fs_core::now_ns())?;
                }
                received::Step::SnapshotEnd { s_end, .. } => {
                    target.install_head(s0).await?;
                    self.state
                        .record(&Changes::default(), Some(s0), fs_core::now_ns())?;
                    tracing::info!(keys = n, s0, s_end, "snapshot installed; catching up");
                    if s_end > s0 {
                        self.state.set_bootstrap(Some(&Bootstrap::CatchingUp {
                            s0,
                            s_end,
                            staged,
                        }))?;
                    } else {
                        self.complete_bootstrap().await?;
                    }
                    break;
                }
                other => bail!("unexpected {other:?} during the snapshot"),
            }
        }
        self.set_settings(settings).await?;
        self.follow_settings().await?;
        self.notify_blocks();
        Ok(())
    }

    /// Whether the live metadata holds a whole consistent state that its mounts may go on
    /// serving during a resync: it has a volume, and no install in place is unfinished.
    pub(super) async fn serves_a_consistent_state(&self) -> Result<bool> {
        if matches!(
            self.state.bootstrap()?,
            Some(Bootstrap::Installing { staged: false, .. })
                | Some(Bootstrap::CatchingUp { staged: false, .. })
        ) {
            return Ok(false);
        }
        Ok(self.engine.get(keys::SETTING).await?.is_some()
            && fs_core::slots::incomplete(&*self.engine).await?.is_none()
            && self.engine.journal_bounds().await?.last > 0)
    }

    pub(super) async fn complete_bootstrap(&self) -> Result<()> {
        // A state without the volume's settings is never made the mirror's: its mounts would
        // be refused ("not formatted"). A snapshot is asked for again instead; a staged
        // resync's live metadata goes on serving its previous state meanwhile. (It happened
        // when a Redis primary's scan returned a short page while keys were deleted, which
        // ended the snapshot early; engines now return short pages only at the end of a
        // range. This stays as the last check before a state becomes the mirror's.)
        let target = self.meta.target();
        if target.get(keys::SETTING).await?.is_none() {
            let b = target.journal_bounds().await?;
            self.force_snapshot
                .store(true, std::sync::atomic::Ordering::SeqCst);
            tracing::error!(
                staged = self.meta.staging().is_some(),
                first = b.first,
                last = b.last,
                "the bootstrapped metadata has no volume settings: it is not made this mirror's state; asking the primary for a new snapshot"
            );
            bail!("the bootstrapped metadata has no volume settings (a new snapshot is asked for)");
        }
        if self.meta.staging().is_some() {
            // What this site had that the new state lacks (a former primary's diverged
            // tail) is saved before the switch drops it; a failed save leaves the switch for
            // later (the site keeps serving its previous state meanwhile).
            self.save_diverged_tail().await.context(
                "saving this site's diverged tail before the resync replaces it (the switch waits)",
            )?;
            let t0 = Instant::now();
            let sw = self.meta.switch().await?;
            self.metrics.resync_switches.inc();
            tracing::info!(
                keys_changed = sw.changed,
                seq = sw.head,
                took = ?t0.elapsed(),
                "switched the live metadata to the resynced state (one atomic write)"
            );
        }
        self.state.set_bootstrap(None)?;
        self.engine
            .aux_put(fs_core::slots::MIRROR_INCOMPLETE, None)
            .await?;
        self.meta.discard()?;
        self.follow_settings().await?;
        self.metrics.bootstrapping.set(0);
        self.publish_now().await;
        let seq = self.engine.journal_bounds().await?.last;
        tracing::info!(seq, "the mirror is consistent (bootstrap complete)");
        Ok(())
    }

    /// Refresh the status and rewrite the progress record now (at a change of state the
    /// mounts must hear of: a staged resync starting, its switch).
    pub(super) async fn publish_now(&self) {
        if let Err(e) = self.refresh().await {
            tracing::debug!(error = %e, "refreshing status");
        }
        if let Err(e) = self.publish_progress().await {
            tracing::warn!(error = %format!("{e:#}"), "writing the progress record for the site's mounts");
        }
    }

    /// Before a staged resync's switch: if the live metadata holds entries of an older epoch
    /// past the point where the new state's history parted from it (a former primary
    /// rejoining after a failover), save them and the files they wrote (`crate::rollback`),
    /// record it beside the metadata and say so in the log.
    async fn save_diverged_tail(&self) -> Result<()> {
        let Some(st) = self.meta.staging() else {
            return Ok(());
        };
        let old = fs_core::site::epoch(&*self.engine).await?;
        let Some(rec) = fs_core::site::epoch_record(&*st).await? else {
            return Ok(());
        };
        if rec.epoch <= old {
            return Ok(());
        }
        let (parted_at, exact) = match rec.parted_from(old) {
            Some(p) => (p, true),
            None => {
                let earliest = rec
                    .history
                    .iter()
                    .map(|h| h.at_seq)
                    .chain([rec.at_seq])
                    .min()
                    .unwrap_or(rec.at_seq);
                tracing::warn!(
                    epoch = old,
                    new_epoch = rec.epoch,
                    earliest,
                    "the new primary's epoch record does not say where epoch {} began (written by an older release): the tail is saved from the earliest promotion point it names",
                    old + 1
                );
                (earliest, false)
            }
        };
        let head = self.engine.journal_bounds().await?.last;
        if head <= parted_at {
            return Ok(());
        }
        if fs_core::site::rollbacks(&*self.engine)
            .await?
            .iter()
            .any(|r| r.to_epoch == rec.epoch && r.parted_at == parted_at && r.last_seq == head)
        {
            return Ok(()); // saved before a restart; the switch was what remained
        }
        let settings = fs_core::Fs::load_settings(&*self.engine).await?;
        let own = (settings.storage != self.cfg.store)
            .then(|| volume::open_store(&settings.storage, None).ok())
            .flatten();
        let store = Arc::new(crate::rollback::FirstOf {
            a: self.dest.clone(),
            b: own,
        });
        let tail = crate::rollback::Tail {
            parted_at,
            exact,
            from_epoch: old,
            to_epoch: rec.epoch,
        };
        let root = self.rollback_root();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let r = crate::rollback::save(self.engine.clone(), store, &tail, &root, &host).await?;
        fs_core::site::set_rollback(&*self.engine, &r.name(), Some(&r)).await?;
        tracing::warn!(
            dir = %r.dir,
            entries = r.entries,
            first_seq = r.first_seq,
            last_seq = r.last_seq,
            files = r.files,
            bytes = r.bytes,
            failed = r.failed,
            "this site's diverged tail (entries {}..={} it committed as the primary at epoch {old}, which the primary at epoch {} never received) is SAVED before the resync drops it: review it and re-apply what should be kept (runbooks/failover.md, \"Review and re-apply a saved tail\")",
            r.first_seq,
            r.last_seq,
            rec.epoch
        );
        Ok(())
    }

    /// An operator's `mirror-agent resync`: bootstrap again from a snapshot, beside the live
    /// state when it is consistent (mounts keep serving it).
    pub async fn request_resync(&self) -> Result<String> {
        if let Some(b @ Bootstrap::Installing { .. }) = self.state.bootstrap()? {
            return Ok(format!("a snapshot is being installed already ({b:?})"));
        }
        self.force_snapshot
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.kick.notify_one();
        let staged = self.serves_a_consistent_state().await?;
        tracing::warn!(
            staged,
            "resync requested by an operator: bootstrapping again from a snapshot"
        );
        Ok(if staged {
            "resync started: the snapshot is installed beside the live metadata, which serves its previous state (stale) until the switch".into()
        } else {
            "resync started: this mirror has no consistent state yet, the snapshot is installed in place".into()
        })
    }
}
