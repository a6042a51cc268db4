//! One replication session with the primary: connect (TLS), the handshake, then the
//! pipeline that reads and checks frames, applies them and acknowledges what is durable.

use super::*;

impl Mirror {
    pub(super) async fn connect(&self) -> Result<proto::Wire> {
        dial(&self.cfg.primary, &self.tls).await
    }

    pub(super) async fn session(self: &Arc<Self>, stop: &CancellationToken) -> End {
        let force = self
            .force_snapshot
            .load(std::sync::atomic::Ordering::SeqCst);
        match self.session_inner(force, stop).await {
            Ok(e) => e,
            Err(e) => End::Retry(e),
        }
    }

    pub(super) async fn session_inner(
        self: &Arc<Self>,
        force_snapshot: bool,
        stop: &CancellationToken,
    ) -> Result<End> {
        // Entries applied whose blocks the queue never recorded (a state write refused after
        // the apply, an applier stopped in between) are queued now, before anything newer.
        self.requeue()
            .await
            .context("queuing the blocks of entries applied but not queued")?;
        let force_snapshot = force_snapshot
            || self
                .force_snapshot
                .load(std::sync::atomic::Ordering::SeqCst);
        // Caught up already, the switch still to do (it failed last time, e.g. saving a
        // diverged tail): done now, not only when the next entry arrives.
        if let Some(Bootstrap::CatchingUp { s_end, .. }) = self.state.bootstrap()? {
            if self.meta.target().journal_bounds().await?.last >= s_end {
                self.complete_bootstrap().await?;
            }
        }
        let boot = self.state.bootstrap()?;
        let target = self.meta.target();
        let head = target.journal_bounds().await?.last;
        let has_volume = self.settings().is_some();
        let want = if force_snapshot
            || matches!(boot, Some(Bootstrap::Installing { .. }))
            || !has_volume
        {
            Want::Snapshot
        } else {
            Want::From(head + 1)
        };
        let mut wire = tokio::select! {
            _ = stop.cancelled() => return Ok(End::Stopped),
            w = self.connect() => w?,
        };
        let nonce_m = proto::nonce();
        // The frame at our head lets the primary check that our histories agree.
        let prev_crc = match want {
            Want::From(s) if s > 1 => target
                .journal_read(s - 1, 1)
                .await
                .ok()
                .and_then(|v| v.into_iter().next())
                .filter(|(seq, _)| *seq == s - 1)
                .map(|(_, f)| crc32c::crc32c(&f)),
            _ => None,
        };
        let uuid = if want == Want::Snapshot {
            None
        } else {
            self.settings().map(|s| s.uuid)
        };
        let my_epoch = fs_core::site::epoch(&*self.engine).await?;
        let hello = ToPrimary::Hello {
            proto: proto::PROTO_VERSION,
            mirror: self.cfg.name.clone(),
            volume_uuid: uuid,
            nonce: nonce_m,
            want,
            prev_crc,
            epoch: my_epoch,
            identity: crate::site::identity(&*self.engine)
                .await?
                .unwrap_or_default(),
        };
        let welcome = match handshake::connect(
            &mut wire,
            &self.cfg.primary,
            &self.token,
            hello,
            READ_TIMEOUT,
        )
        .await
        {
            Ok(w) => w,
            // Only the handshake's own failures are classified (an engine's error below is
            // an `fs_core::Error` too, and is retried as the network is).
            Err(e) => {
                return Ok(match handshake::failure(&e).map(fs_core::Error::status) {
                    Some(fs_core::ErrorStatus::Temporary) => End::Foreign(e),
                    Some(_) => End::Refused(e),
                    None => End::Retry(e),
                })
            }
        };
        let (primary_head, primary_epoch) = match welcome {
            handshake::Welcome::In { head, epoch, .. } => (head, epoch),
            handshake::Welcome::Resync(reason) => return Ok(End::Resync(reason)),
        };
        // What this session receives is checked by `received::Received` (epoch, snapshot
        // order, journal seqs); frames from the next seq after what the target holds.
        let expected = self.meta.target().journal_bounds().await?.last + 1;
        let mut checks = match received::Received::new(
            primary_epoch,
            my_epoch,
            want == Want::Snapshot,
            expected,
        ) {
            Ok(c) => c,
            Err(why) => {
                return Ok(End::Refused(anyhow::Error::new(fs_core::Error::new(
                    fs_core::ErrorKind::Fenced,
                    format!("{why} (the primary at {})", self.cfg.primary),
                ))));
            }
        };
        let (mut sink, mut stream) = wire.split();
        {
            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
            lv.connected = true;
            lv.primary_head = lv.primary_head.max(primary_head);
            lv.last_contact = Some(Instant::now());
            lv.last_error = None;
            lv.refused = None;
        }
        tracing::info!(primary = %self.cfg.primary, ?want, primary_head, "connected to the primary");
        if want == Want::Snapshot {
            self.install_snapshot(&mut stream, &mut checks, stop)
                .await?;
            self.force_snapshot
                .store(false, std::sync::atomic::Ordering::SeqCst);
            self.live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .needs_resync = false;
        }
        // Pipeline: this task reads and checks frames, an applier applies them in batches,
        // and acknowledgements go back as they become durable.
        let (tx, rx) = mpsc::channel::<Vec<Entry>>(16);
        let (ack_tx, mut ack_rx) = watch::channel(0u64);
        let applier = tokio::spawn(self.clone().apply_loop(rx, ack_tx));
        let acker = async {
            while ack_rx.changed().await.is_ok() {
                let seq = *ack_rx.borrow_and_update();
                proto::send(&mut sink, &ToPrimary::Ack { seq }).await?;
            }
            Ok::<(), anyhow::Error>(())
        };
        let reader = async {
            loop {
                let msg = recv_within(&mut stream, READ_TIMEOUT).await?;
                self.live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .last_contact = Some(Instant::now());
                let expected = checks.expected().unwrap_or(u64::MAX);
                match checks.step(msg) {
                    Ok(received::Step::Entries(batch)) => {
                        {
                            let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                            for e in &batch {
                                lv.received.push_back((e.seq, e.time_ns));
                            }
                            if let Some(last) = batch.last() {
                                lv.primary_head = lv.primary_head.max(last.seq);
                            }
                        }
                        if tx.send(batch).await.is_err() {
                            bail!("the applier stopped");
                        }
                    }
                    Ok(received::Step::Heartbeat { head }) => {
                        let mut lv = self.live.lock().unwrap_or_else(|p| p.into_inner());
                        lv.primary_head = lv.primary_head.max(head);
                    }
                    Ok(received::Step::Refused {
                        reason,
                        resync: true,
                    }) => return Ok(End::Resync(reason)),
                    Ok(received::Step::Refused { reason, .. }) => {
                        bail!("the primary ended the stream: {reason}")
                    }
                    Ok(other) => bail!("unexpected {other:?} after the snapshot"),
                    Err(bad @ received::Refusal::Entries(_)) => {
                        self.metrics.frame_errors.inc();
                        tracing::error!(expected, error = %bad, "journal frames refused: not applied; re-requesting from {expected}");
                        bail!("{bad}");
                    }
                    Err(bad) => bail!("{bad}"),
                }
            }
        };
        let end = tokio::select! {
            r = reader => r,
            r = acker => r.and(Err(anyhow!("acknowledgements stopped"))),
            _ = stop.cancelled() => Ok(End::Stopped),
            _ = self.kick.notified() => Ok(End::Kicked),
        };
        // Entries already received are applied (drain), then the session ends. The applier
        // never outlives its session: one left running would apply and queue beside the next
        // session's (what it did not queue, the next session's `requeue` does).
        drop(tx);
        let mut applier = applier;
        match tokio::time::timeout(Duration::from_secs(60), &mut applier).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e.context("applying entries")),
            Ok(Err(e)) => bail!("the applier panicked: {e}"),
            Err(_) => {
                applier.abort();
                let _ = applier.await;
                bail!("the applier did not finish within 60 s: stopped")
            }
        }
        end
    }
}
