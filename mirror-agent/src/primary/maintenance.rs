//! The primary's background work: the status document and metrics, the retention cap and
//! the journal trim behind the slowest active mirror.

use super::lease::LEASE_EVERY;
use super::*;

impl Primary {
    pub(super) async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last_trim = tokio::time::Instant::now() - self.cfg.trim_interval;
        let mut last_beat = tokio::time::Instant::now() - LEASE_EVERY;
        let mut trim_unsupported = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = self.engine.aux_put(LEASE, None).await;
                    return;
                }
                _ = tick.tick() => {}
            }
            if last_beat.elapsed() >= LEASE_EVERY {
                last_beat = tokio::time::Instant::now();
                let admin = *self.admin.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.beat(admin).await {
                    tracing::warn!(error = %format!("{e:#}"), "recording this agent beside the volume");
                }
            }
            if let Err(e) = self.refresh_status().await {
                tracing::warn!(error = %format!("{e:#}"), "refreshing status");
            }
            if last_trim.elapsed() < self.cfg.trim_interval {
                continue;
            }
            last_trim = tokio::time::Instant::now();
            if let Err(e) = self.enforce_caps().await {
                tracing::warn!(error = %format!("{e:#}"), "checking replication slots");
            }
            if trim_unsupported {
                continue;
            }
            match self.trim().await {
                Ok(n) if n > 0 => {
                    self.metrics.journal_trimmed.inc_by(n);
                    tracing::info!(entries = n, "journal trimmed behind the slowest mirror");
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ReadOnly => {
                    trim_unsupported = true;
                    tracing::info!("the volume is open read-only here (RocksDB has one writer): journal trimming is left to `jfs gc`, which honours the slots");
                }
                Err(e) => tracing::warn!(error = %e, "trimming the journal"),
            }
        }
    }

    pub(super) async fn trim(&self) -> fs_core::Result<u64> {
        let slots = slots::list(&*self.engine).await?;
        let floor = slots::retain_floor(&slots);
        // Read each time: settings change through the journal (a cutover, `jfs` commands).
        let settings = fs_core::Fs::load_settings(&*self.engine).await?;
        let cutoff = fs_core::now_ns() - settings.journal_retention_secs as i64 * 1_000_000_000;
        let r = fs_core::maint::trim_journal(&*self.engine, cutoff, floor).await;
        tracing::debug!(floor, retention_secs = settings.journal_retention_secs, result = ?r, "journal trim");
        r
    }

    pub(super) async fn refresh_status(&self) -> Result<()> {
        let b = self.engine.journal_bounds().await?;
        self.metrics.head_seq.set(b.last as i64);
        self.metrics.journal_first.set(b.first as i64);
        let slots = slots::list(&*self.engine).await?;
        let connected: Vec<String> = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        // Series of slots that are gone (dropped by `slot drop` elsewhere) go too.
        {
            let now: std::collections::HashSet<String> =
                slots.iter().map(|s| s.name.clone()).collect();
            let mut seen = self.seen_slots.lock().unwrap_or_else(|p| p.into_inner());
            for gone in seen.difference(&now) {
                self.metrics.remove_slot(gone);
            }
            *seen = now;
        }
        let mut list = Vec::new();
        for s in &slots {
            let l = label(&s.name);
            let lag = b.last.saturating_sub(s.acked);
            self.metrics
                .slot_acked
                .get_or_create(&l)
                .set(s.acked as i64);
            self.metrics
                .slot_lag_entries
                .get_or_create(&l)
                .set(lag as i64);
            self.metrics
                .slot_needs_resync
                .get_or_create(&l)
                .set((s.state == SlotState::NeedsResync) as i64);
            let conn = connected.contains(&s.name);
            self.metrics
                .slot_connected
                .get_or_create(&l)
                .set(conn as i64);
            list.push(serde_json::json!({
                "name": s.name, "acked_seq": s.acked, "lag_entries": lag,
                "state": s.state, "reason": s.reason, "connected": conn,
            }));
        }
        self.metrics.set_status(serde_json::json!({
            "role": "primary",
            "volume_uuid": self.uuid,
            "meta": self.engine.display_url(),
            "listen": self.cfg.listen.to_string(),
            "tls": self.tls.is_some(),
            "head_seq": b.last,
            "journal_first_seq": b.first,
            "mirrors": list,
            "auth_failures": self.metrics.auth_failures.get(),
            "unauthenticated_dropped": self.metrics.unauth_dropped.get(),
            "unauthenticated_pending": self.gate.pending(),
            "entries_sent": self.metrics.entries_sent.get(),
        }));
        Ok(())
    }
}
