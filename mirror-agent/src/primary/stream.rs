//! One mirror's connection: the handshake (bounded before it authenticates), the checks of
//! where it asks to resume (its slot, retention, its history's checksum, epochs), then the
//! journal in batches with heartbeats while idle, and its acknowledgements into its slot.

use super::*;

const BATCH: usize = 1024;
const BATCH_BYTES: usize = 8 << 20;

impl Primary {
    pub(super) async fn serve(
        self: Arc<Self>,
        sock: TcpStream,
        stop: CancellationToken,
    ) -> Result<()> {
        let peer = sock.peer_addr().ok();
        let peer_s = peer.map(|a| a.to_string()).unwrap_or_default();
        let _ = sock.set_nodelay(true);
        // Until it proves a token, the peer is bounded in time, size and number.
        let ip = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let (gate_id, evicted, n) = self.gate.admit(ip);
        if n > 0 {
            self.metrics.unauth_dropped.inc_by(n as u64);
        }
        let tokens = &self.tokens;
        let handshake = async {
            let io: Box<dyn proto::Io> = match &self.tls {
                Some(acc) => Box::new(
                    acc.accept(sock)
                        .await
                        .map_err(|e| handshake::Failure::Garbage(format!("TLS handshake: {e}")))?,
                ),
                None => Box::new(sock),
            };
            let mut wire = proto::wire(io);
            let hello = handshake::accept(&mut wire, |m| tokens.get(m).cloned()).await?;
            Ok::<_, handshake::Failure>((wire, hello))
        };
        let res = tokio::select! {
            r = tokio::time::timeout(handshake::HANDSHAKE_TIMEOUT, handshake) => match r {
                Ok(r) => r,
                Err(_) => Err(handshake::Failure::Garbage(format!("no handshake within {:?}", handshake::HANDSHAKE_TIMEOUT))),
            },
            _ = evicted.cancelled() => Err(handshake::Failure::Garbage("dropped: too many unauthenticated connections".into())),
            _ = stop.cancelled() => Err(handshake::Failure::Garbage("stopping".into())),
        };
        self.gate.leave(gate_id);
        let (wire, hello) = match res {
            Ok(x) => x,
            Err(f) => {
                // Counted, at debug, and summed up in the log (never a line each: a peer
                // without a token must not be able to fill the disk).
                match &f {
                    handshake::Failure::Auth(_) => self.metrics.auth_failures.inc(),
                    _ => self.metrics.unauth_dropped.inc(),
                };
                self.refusals.note(ip, &peer_s, &f);
                return Ok(());
            }
        };
        let (mut sink, mut stream) = wire.split();
        let handshake::Hello {
            mirror,
            volume_uuid,
            want,
            prev_crc,
            epoch,
            identity,
        } = hello;
        // The copy of the mirror's metadata: another one under this name is refused before
        // anything else (a probe of `check-config --connect` included).
        if let Err(r) = self.check_holder(&mirror, &identity, &peer_s).await? {
            tracing::error!(mirror = %mirror, peer = %peer_s, "{r}");
            proto::send(
                &mut sink,
                &ToMirror::Refused {
                    reason: r.clone(),
                    resync: false,
                },
            )
            .await?;
            bail!(r);
        }
        let refuse = |reason: String, resync: bool| ToMirror::Refused { reason, resync };
        if let Some(u) = &volume_uuid {
            if u != &self.uuid {
                let r = format!("the mirror holds volume {u}, this primary serves {}; refusing to mix them (resync the mirror into an empty metadata store)", self.uuid);
                proto::send(&mut sink, &refuse(r.clone(), false)).await?;
                bail!(r);
            }
        }
        // Epochs: a primary that was fenced, or that a mirror knows was superseded by a
        // promotion, ships nothing.
        if let Some(m) = fs_core::site::marker(&*self.engine).await? {
            let r = format!("this primary was fenced: its metadata is now mirror {:?} of the primary at {} (the volume moved); point this mirror at the new primary", m.name, m.primary);
            tracing::error!(mirror = %mirror, "{r}");
            proto::send(&mut sink, &refuse(r.clone(), false)).await?;
            bail!(r);
        }
        let mine = fs_core::site::epoch(&*self.engine).await?;
        if epoch > mine {
            let r = format!("this primary is at epoch {mine} but mirror {mirror:?} has seen epoch {epoch}: another site was promoted and this one is superseded; fence it (`mirror-agent fence`) and rejoin it as a mirror of the new primary (runbooks/failover.md)");
            tracing::error!(mirror = %mirror, "{r}");
            proto::send(&mut sink, &refuse(r.clone(), false)).await?;
            bail!(r);
        }
        // The changes of the mirror's mounts: a connection of its own, beside the journal's.
        if want == Want::Forward {
            if epoch < mine {
                let r = format!("mirror {mirror:?} is at epoch {epoch}, this primary at {mine}: its writes wait until it has caught up with the promotion");
                proto::send(&mut sink, &refuse(r.clone(), false)).await?;
                bail!(r);
            }
            return self
                .serve_forward(&mirror, &mut sink, &mut stream, &stop)
                .await;
        }
        // A mirror from before a promotion (the old primary rejoining): a history that
        // differs past the promotion point is that site's lost tail, and it resyncs.
        let rejoining = epoch < mine;
        // Replace an older connection of the same mirror.
        let my_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let conn_stop = stop.child_token();
        if let Some((_, old)) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mirror.clone(), (my_id, conn_stop.clone()))
        {
            old.cancel();
        }
        let res = self
            .stream(
                &mirror,
                &identity,
                &peer_s,
                want,
                prev_crc,
                rejoining,
                &mut sink,
                &mut stream,
                &conn_stop,
            )
            .await;
        {
            let mut c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            if c.get(&mirror).is_some_and(|(id, _)| *id == my_id) {
                c.remove(&mirror);
            }
        }
        if let Err(e) = &res {
            tracing::info!(mirror = %mirror, error = %format!("{e:#}"), "stream ended");
        }
        res
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stream<S: crate::proto::FrameSink, R: crate::proto::FrameStream + Send>(
        &self,
        mirror: &str,
        identity: &str,
        peer: &str,
        want: Want,
        prev_crc: Option<u32>,
        rejoining: bool,
        sink: &mut S,
        stream: &mut R,
        stop: &CancellationToken,
    ) -> Result<()> {
        let refuse = |reason: String, resync: bool| ToMirror::Refused { reason, resync };
        let slot = slots::get(&*self.engine, mirror).await?;
        if slot.is_none() {
            // Dropped by an operator: start a fresh slot; the mirror must bootstrap.
            tracing::warn!(mirror, "a mirror whose slot was dropped connected again: registering a new slot; it resyncs from a snapshot");
            self.register_slots().await?;
        }
        if let Want::From(from) = want {
            let b = self.engine.journal_bounds().await?;
            let reason = match &slot {
                None => Some("this mirror's replication slot was dropped".to_string()),
                Some(s) if s.state == SlotState::NeedsResync => Some(format!(
                    "the replication slot was dropped ({})",
                    s.reason.clone().unwrap_or_default()
                )),
                _ if from < b.first => Some(format!(
                    "entry {from} is no longer retained (first retained is {})",
                    b.first
                )),
                _ => None,
            };
            if let Some(r) = reason {
                return Err(refuse_resync(sink, r).await);
            }
            if let (Some(c), true) = (prev_crc, from > b.first) {
                let ours = self
                    .engine
                    .journal_read(from - 1, 1)
                    .await?
                    .into_iter()
                    .next()
                    .filter(|(seq, _)| *seq == from - 1);
                if let Some((_, f)) = ours {
                    if crc32c::crc32c(&f) != c && rejoining {
                        // A site from before a promotion whose history parted from this one
                        // (a failover): expected, its tail is saved when it resyncs.
                        let r = format!("this site's history parted from the new primary's at or before entry {} (it is from before the promotion: expected after a failover): its diverged tail is saved and dropped by a resync", from - 1);
                        tracing::warn!(mirror, seq = from - 1, "{r}");
                        return Err(refuse_resync(sink, r).await);
                    }
                    if crc32c::crc32c(&f) != c {
                        let r = format!("the mirror's entry {} differs from the primary's: its metadata was changed by something other than its agent, or the primary's history changed", from - 1);
                        tracing::error!(
                            mirror,
                            seq = from - 1,
                            "a mirror's history differs from the primary's"
                        );
                        return Err(refuse_resync(sink, r).await);
                    }
                }
            }
            if from > b.last + 1 && rejoining {
                let r = format!("this site's history goes on past the promotion point (it has {} entries, the new primary {}): its diverged tail is dropped by a resync", from - 1, b.last);
                tracing::warn!(mirror, "{r}");
                return Err(refuse_resync(sink, r).await);
            }
            if from > b.last + 1 {
                let r = format!("the mirror has applied up to {} but the primary's head is {}: a different history (was the primary restored from a backup?); resync the mirror by hand (runbooks/resync-mirror.md)", from - 1, b.last);
                proto::send(sink, &refuse(r.clone(), false)).await?;
                bail!(r);
            }
        }
        // The slot is this copy's from now on (checked again under the slot lock: two copies
        // connecting at once cannot both take it).
        if let Err(r) = self.take_slot(mirror, identity, peer).await? {
            tracing::error!(mirror, peer, "{r}");
            proto::send(sink, &refuse(r.clone(), false)).await?;
            bail!(r);
        }
        self.stream_inner(mirror, want, sink, stream, stop).await
    }

    pub(super) async fn stream_inner<
        S: crate::proto::FrameSink,
        R: crate::proto::FrameStream + Send,
    >(
        &self,
        mirror: &str,
        want: Want,
        sink: &mut S,
        stream: &mut R,
        stop: &CancellationToken,
    ) -> Result<()> {
        let head = self.engine.journal_bounds().await?.last;
        proto::send(
            sink,
            &ToMirror::Welcome {
                volume_uuid: self.uuid.clone(),
                head,
                epoch: fs_core::site::epoch(&*self.engine).await?,
            },
        )
        .await?;
        let mut cursor = match want {
            Want::From(f) => f.max(1),
            Want::Snapshot => self.send_snapshot(mirror, sink).await? + 1,
            Want::Forward => bail!("internal: a forward connection reached the journal stream"),
        };
        tracing::info!(mirror, from = cursor, "streaming the journal");
        // Acknowledgements arrive on the other half; the slot is written at most every 500 ms.
        let acked = Arc::new(AtomicU64::new(cursor - 1));
        let reader = {
            let acked = acked.clone();
            async move {
                loop {
                    match proto::recv::<ToPrimary, _>(stream).await? {
                        Some(ToPrimary::Ack { seq }) => {
                            acked.fetch_max(seq, Ordering::SeqCst);
                        }
                        Some(other) => bail!("unexpected message {other:?}"),
                        None => return Ok::<(), anyhow::Error>(()),
                    }
                }
            }
        };
        tokio::pin!(reader);
        let mut persisted = 0u64;
        const PERSIST_EVERY: Duration = Duration::from_millis(500);
        let mut last_persist = tokio::time::Instant::now() - PERSIST_EVERY;
        let mut last_send = tokio::time::Instant::now();
        let res: Result<()> = loop {
            // Persist acknowledgements; a slot dropped meanwhile ends the stream.
            let a = acked.load(Ordering::SeqCst);
            if a > persisted && last_persist.elapsed() >= PERSIST_EVERY {
                last_persist = tokio::time::Instant::now();
                match self.persist_ack(mirror, a).await? {
                    None => {
                        let r = "this mirror's replication slot was dropped by an operator";
                        break Err(refuse_resync(sink, r.to_string()).await);
                    }
                    Some(s) if s.state == SlotState::NeedsResync => {
                        let r = format!(
                            "the replication slot was dropped ({})",
                            s.reason.unwrap_or_default()
                        );
                        break Err(refuse_resync(sink, r).await);
                    }
                    Some(_) => persisted = a,
                }
            }
            let frames = match self.read_batch(cursor).await {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::SeqNotRetained => {
                    break Err(refuse_resync(sink, e.to_string()).await);
                }
                Err(e) => break Err(e.into()),
            };
            if !frames.is_empty() {
                let n = frames.len() as u64;
                cursor = frames.last().expect("non-empty").0 + 1;
                let msg = ToMirror::Entries { frames };
                tokio::select! {
                    r = proto::send(sink, &msg) => r?,
                    r = &mut reader => break r.and(Err(anyhow!("the mirror closed the connection"))),
                    _ = stop.cancelled() => break Ok(()),
                }
                self.metrics.entries_sent.inc_by(n);
                last_send = tokio::time::Instant::now();
                continue;
            }
            if last_send.elapsed() >= Duration::from_millis(500) {
                let (head, t) = self.head_time().await?;
                proto::send(
                    sink,
                    &ToMirror::Heartbeat {
                        head,
                        head_time_ns: t,
                    },
                )
                .await?;
                last_send = tokio::time::Instant::now();
            }
            tokio::select! {
                r = self.engine.journal_wait(cursor - 1, Duration::from_millis(500)) => { r?; }
                // A mirror's change committed here just now: ship it without waiting for
                // the next poll of a RocksDB reader.
                _ = self.committed_here.notified() => {}
                r = &mut reader => break r.and(Err(anyhow!("the mirror closed the connection"))),
                _ = stop.cancelled() => break Ok(()),
            }
        };
        // Keep what was acknowledged.
        let a = acked.load(Ordering::SeqCst);
        if a > persisted {
            let _ = self.persist_ack(mirror, a).await;
        }
        res
    }

    pub(super) async fn read_batch(&self, cursor: u64) -> fs_core::Result<Vec<(u64, Vec<u8>)>> {
        let mut frames = self.engine.journal_read(cursor, BATCH).await?;
        let mut bytes = 0;
        if let Some(cut) = frames.iter().position(|(_, f)| {
            bytes += f.len();
            bytes > BATCH_BYTES
        }) {
            frames.truncate(cut.max(1));
        }
        Ok(frames)
    }

    pub(super) async fn head_time(&self) -> Result<(u64, i64)> {
        head_time_of(&*self.engine).await
    }
}

/// The journal's head and its commit time (0 when it is not retained or cannot be read). The
/// frame must be the head's: one stored under the head's seq holding another entry is an
/// error naming both (its time was sent to every mirror as the head's).
pub(crate) async fn head_time_of(engine: &dyn Engine) -> Result<(u64, i64)> {
    let head = engine.journal_bounds().await?.last;
    let t = match engine.journal_read(head, 1).await {
        Ok(v) => match v.first() {
            Some((seq, f)) if *seq == head => {
                Entry::decode_at(head, f)
                    .with_context(|| {
                        format!(
                            "the journal's head entry {head} in {}",
                            engine.display_url()
                        )
                    })?
                    .time_ns
            }
            _ => 0,
        },
        Err(_) => 0,
    };
    Ok((head, t))
}

/// Tell the mirror it must resync from a snapshot; the error that ends the stream.
async fn refuse_resync<S: crate::proto::FrameSink>(sink: &mut S, why: String) -> anyhow::Error {
    let reason = format!("{why}: resync from a snapshot");
    let _ = proto::send(
        sink,
        &ToMirror::Refused {
            reason: reason.clone(),
            resync: true,
        },
    )
    .await;
    anyhow!(reason)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A RocksDB journal holding `frames` (seq, entry seq) up to `head`.
    pub(crate) async fn journal(d: &std::path::Path, frames: &[(u64, u64)]) -> Arc<dyn Engine> {
        let e = meta::RocksEngine::open(&d.join("meta"), meta::RocksMode::ReadWrite, true, true)
            .unwrap();
        let frames: Vec<(u64, Vec<u8>)> = frames
            .iter()
            .map(|&(at, seq)| {
                let e = Entry {
                    seq,
                    time_ns: seq as i64 * 1000,
                    op: fs_core::Op::Settings { what: "t".into() },
                    writes: vec![],
                };
                (at, e.encode())
            })
            .collect();
        let head = frames.last().map_or(0, |f| f.0);
        // As a mirror's would be (only a mirror's metadata installs frames as they are).
        let marker = fs_core::site::MirrorMarker {
            version: fs_core::site::MARKER_VERSION,
            name: "m".into(),
            primary: "127.0.0.1:1".into(),
            store: "file:///nowhere".into(),
            origin_store: None,
            since_ns: 1,
        };
        fs_core::site::set_marker(&e, &marker).await.unwrap();
        e.install_switch(&[], &frames, head).await.unwrap();
        Arc::new(e)
    }

    /// Issue 43, fuzzing: the head's time came from whatever frame was stored under the
    /// head's seq (`Entry::decode` without the seq check); a misfiled frame is now an error.
    #[tokio::test]
    async fn the_head_time_is_the_head_entrys_or_an_error() {
        let d = tempfile::tempdir().unwrap();
        let ok = journal(d.path(), &[(1, 1), (2, 2)]).await;
        assert_eq!(head_time_of(&*ok).await.unwrap(), (2, 2000));
        let d = tempfile::tempdir().unwrap();
        let bad = journal(d.path(), &[(1, 1), (2, 7)]).await;
        let e = head_time_of(&*bad).await.unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("head entry 2") && msg.contains("holds the frame of entry 7"),
            "{msg}"
        );
    }
}
