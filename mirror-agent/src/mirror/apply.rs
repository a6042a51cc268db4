//! Applying entries in batches (to the staging during a staged resync) and queuing their
//! blocks; after a restart, re-queuing what the block queue has not seen.

use super::*;

impl Mirror {
    /// After a crash between an apply and its queue record: queue the blocks of applied
    /// entries the queue has not seen, from the mirror's own journal.
    pub(super) async fn requeue(&self) -> Result<()> {
        let Some(s) = self.settings() else {
            return Ok(());
        };
        if matches!(self.state.bootstrap()?, Some(Bootstrap::Installing { .. })) {
            return Ok(());
        }
        // During a staged resync, replication goes into the staging.
        let target = self.meta.target();
        let bounds = target.journal_bounds().await?;
        let head = bounds.last;
        let mut from = self.state.queued_through()? + 1;
        if self.state.bootstrap()?.is_none()
            && fs_core::slots::incomplete(&*self.engine).await?.is_some()
        {
            // The metadata says a snapshot was being installed, the agent's state knows
            // nothing of it (a lost or new state directory): start the snapshot over.
            tracing::warn!("this mirror was bootstrapping and the agent's state does not know it (a lost state directory?): bootstrapping again from a snapshot");
            self.force_snapshot
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        if from <= head && from < bounds.first {
            // The journal no longer reaches back to what the block queue knows: the state
            // directory is new or was lost, or the mirror started from a snapshot the queue
            // never saw. Every block the metadata references is queued again; copies already
            // at the mirror store are skipped by their length check, not copied twice.
            tracing::warn!(
                queued_through = from - 1,
                journal_first = bounds.first,
                "the agent's state does not cover this mirror's journal (a new or lost state directory): queuing every block the metadata references again"
            );
            // The queue is rebuilt, not added to: an item left from before (a state
            // directory older than the metadata) may be of a slice freed since.
            self.state.reset_queue()?;
            let mut n = 0u64;
            let mut start = fs_core::keys::INODE_PREFIX.to_vec();
            let end = fs_core::keys::prefix_end(fs_core::keys::INODE_PREFIX);
            loop {
                let page = target.scan(&start, &end, 4096).await?;
                let len = page.len();
                if let Some((k, _)) = page.last() {
                    start = k.clone();
                    start.push(0);
                }
                let ch = blocks::changes_of_pairs(&s, &page);
                n += ch.add.len() as u64;
                self.state.record(&ch, None, fs_core::now_ns())?;
                if len < 4096 {
                    break;
                }
            }
            self.state
                .record(&Default::default(), Some(head), fs_core::now_ns())?;
            tracing::info!(
                blocks = n,
                through = head,
                "block queue rebuilt from the mirror's metadata"
            );
            return Ok(());
        }
        while from <= head {
            let frames = target.journal_read(from, 1000).await?;
            if frames.is_empty() {
                break;
            }
            let entries: Vec<Entry> = frames
                .iter()
                .map(|(seq, f)| Entry::decode_at(*seq, f))
                .collect::<fs_core::Result<_>>()?;
            let last = entries.last().expect("non-empty").seq;
            let ch = blocks::changes_of_entries(&s, &entries);
            self.state.record(&ch, Some(last), fs_core::now_ns())?;
            from = last + 1;
        }
        Ok(())
    }

    pub(super) async fn apply_loop(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Vec<Entry>>,
        ack: watch::Sender<u64>,
    ) -> Result<()> {
        let max = self.cfg.batch_entries;
        while let Some(mut batch) = rx.recv().await {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(more) => batch.extend(more),
                    Err(_) => break,
                }
            }
            let n = batch.len() as u64;
            let staging = self.meta.staging();
            let head = match &staging {
                Some(st) => st.apply(&batch).await?,
                None => self.engine.apply(&batch).await?,
            };
            self.metrics.entries_applied.inc_by(n);
            self.metrics.apply_batches.inc();
            if staging.is_none() {
                self.metrics.applied_seq.set(head as i64);
            }
            if staging.is_none() && touches_settings(&batch) {
                self.follow_settings().await?;
            }
            if let Some(s) = self.settings() {
                let ch = blocks::changes_of_entries(&s, &batch);
                self.state.record(&ch, Some(head), fs_core::now_ns())?;
                self.notify_blocks();
            }
            if let Some(Bootstrap::CatchingUp { s_end, .. }) = self.state.bootstrap()? {
                if head >= s_end {
                    self.complete_bootstrap().await?;
                }
            }
            {
                let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                while lv.received.front().is_some_and(|(s, _)| *s <= head) {
                    lv.received.pop_front();
                }
                if head >= lv.primary_head {
                    lv.caught_up_at = Some(Instant::now());
                }
            }
            let _ = ack.send(head);
        }
        Ok(())
    }
}

/// Whether entries change the volume's settings or its storage record.
fn touches_settings(entries: &[Entry]) -> bool {
    entries.iter().flat_map(|e| &e.writes).any(|m| match m {
        fs_core::Mutation::Put { key, .. } | fs_core::Mutation::Delete { key } => {
            key == fs_core::keys::SETTING || key == fs_core::keys::STORAGE
        }
        _ => false,
    })
}
