//! Changes made by mounts at a mirror site, committed here. A mirror the config lets write
//! (`allow_writes`) opens a second connection with `Want::Forward`; each `Commit` on it is a
//! transaction prepared against the mirror's view, carrying what it read, and the primary's
//! engine commits it in the primary's order like any local writer's: a read that differs
//! here is a conflict, and the mirror retries once it has applied what the primary had.
//!
//! Refused: a mirror not allowed to write (at the handshake, and nothing it sends is read);
//! a change that touches more than the file tree (`volume::forward::tree_only`: never the
//! settings, the storage record or the epoch); any commit this metadata refuses (fenced).
//! On shutdown no new change is read, and those in flight are answered first.

use super::*;
use futures::stream::FuturesUnordered;
use std::time::Instant;
use volume::forward::ForwardReply;

/// Changes of one mirror committed at once.
const IN_FLIGHT: usize = 64;

impl Primary {
    pub(super) async fn serve_forward<S: crate::proto::FrameSink, R: crate::proto::FrameStream>(
        &self,
        mirror: &str,
        sink: &mut S,
        stream: &mut R,
        stop: &CancellationToken,
    ) -> Result<()> {
        let l = label(mirror);
        let allowed = self
            .cfg
            .mirrors
            .iter()
            .any(|m| m.name == mirror && m.allow_writes);
        if !allowed {
            self.metrics.fwd_refused.get_or_create(&l).inc();
            let r = format!("mirror {mirror:?} may not write: the primary agent's config does not allow it (set allow_writes = true in its [[primary.mirrors]] entry)");
            // Asked again every few seconds (`mirror::forward`): counted, not logged each time.
            tracing::debug!(mirror, "refused a mirror's writes: {r}");
            proto::send(sink, &ToMirror::WritesRefused { reason: r.clone() }).await?;
            bail!(r);
        }
        let head = self.engine.journal_bounds().await?.last;
        let epoch = fs_core::site::epoch(&*self.engine).await?;
        proto::send(
            sink,
            &ToMirror::Welcome {
                volume_uuid: self.uuid.clone(),
                head,
                epoch,
            },
        )
        .await?;
        tracing::info!(mirror, "the mirror's mounts write through this primary");
        let mut inflight = FuturesUnordered::new();
        let mut reading = true;
        loop {
            tokio::select! {
                _ = stop.cancelled(), if reading => reading = false,
                Some((id, reply)) = inflight.next(), if !inflight.is_empty() => {
                    proto::send(sink, &ToMirror::Forwarded { id, reply }).await?;
                }
                msg = proto::recv::<ToPrimary, _>(stream), if reading && inflight.len() < IN_FLIGHT => {
                    match msg? {
                        None => reading = false,
                        Some(ToPrimary::Commit { id, req }) => {
                            inflight.push(self.forwarded_commit(mirror, id, req));
                        }
                        Some(ToPrimary::Sessions { records }) => {
                            if let Err(e) = self.keep_sessions(mirror, &records).await {
                                tracing::warn!(mirror, error = %e, "keeping the sessions of a mirror's writing mounts failed; tried again at its next report");
                            }
                        }
                        Some(_) => bail!("mirror {mirror:?} sent something other than a change on its forward connection"),
                    }
                }
            }
            if !reading && inflight.is_empty() {
                return Ok(());
            }
        }
    }

    /// Keep the sessions a mirror reports (its site's writing mounts) as records of this
    /// metadata, marked `relayed_by` and with the heartbeat of now (this site's clock), and
    /// drop the ones it relayed before and no longer reports. Records are checked: a session
    /// id's shape, never one of this site's own sessions.
    async fn keep_sessions(&self, mirror: &str, records: &[Vec<u8>]) -> Result<()> {
        use fs_core::session::{self, Session};
        let mine = session::list(&*self.engine).await?;
        let mut reported = std::collections::HashSet::new();
        for v in records.iter().take(10_000) {
            let mut s: Session = match fs_core::record::decode_as("a relayed session record", v) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(mirror, error = %e, "skipped a session record a mirror relayed");
                    continue;
                }
            };
            if !Session::valid_id(&s.id)
                || mine
                    .iter()
                    .any(|m| m.id == s.id && m.relayed_by.as_deref() != Some(mirror))
            {
                tracing::warn!(mirror, session = %s.id, "skipped a session a mirror relayed: not one of its own");
                continue;
            }
            s.relayed_by = Some(mirror.to_string());
            s.beat_ns = fs_core::now_ns();
            // Its process is at the mirror's host: never judged by a pid of this host.
            s.pid_start = 0;
            session::put(&*self.engine, &s).await?;
            reported.insert(s.id);
        }
        for s in mine {
            if s.relayed_by.as_deref() == Some(mirror) && !reported.contains(&s.id) {
                session::remove(&*self.engine, &s.id).await?;
            }
        }
        Ok(())
    }

    async fn forwarded_commit(
        &self,
        mirror: &str,
        id: u64,
        req: fs_core::CommitRequest,
    ) -> (u64, ForwardReply) {
        let r = self.forwarded_commit_inner(mirror, id, req).await;
        if matches!(r.1, ForwardReply::Committed { .. }) {
            self.committed_here.notify_waiters();
        }
        r
    }

    async fn forwarded_commit_inner(
        &self,
        mirror: &str,
        id: u64,
        req: fs_core::CommitRequest,
    ) -> (u64, ForwardReply) {
        let l = label(mirror);
        if let Err(why) = volume::forward::tree_only(&req) {
            self.metrics.fwd_refused.get_or_create(&l).inc();
            tracing::warn!(mirror, %why, "refused a change forwarded by a mirror");
            return (
                id,
                ForwardReply::Failed {
                    kind: ErrorKind::PermissionDenied,
                    message: why,
                    temporary: false,
                },
            );
        }
        let t0 = Instant::now();
        let mut reply = volume::forward::commit_here(&*self.engine, &req).await;
        if matches!(
            reply,
            ForwardReply::Failed {
                kind: ErrorKind::ReadOnly,
                ..
            }
        ) {
            if let Ok(Some(m)) = fs_core::site::marker(&*self.engine).await {
                // Fenced: the link's trouble, not the mirror's permission (EIO, not EROFS,
                // at its mounts), and never waited for. Not `ErrorKind::Fenced`: a writer
                // reads that as a storage generation that changed under its write.
                reply = ForwardReply::Failed {
                    kind: ErrorKind::Backend,
                    message: format!("this primary was fenced (the volume moved to the primary at {}): the change was not made; point this mirror's agent at the new primary", m.primary),
                    temporary: true,
                };
            } else if self.engine.kind() == "rocksdb" {
                // A RocksDB volume has one writing process, and this agent only follows it:
                // the change goes through that process (a read-write mount on this host).
                reply = self.commit_through_writer(req).await;
            }
        }
        self.metrics
            .fwd_seconds
            .get_or_create(&l)
            .inc_by(t0.elapsed().as_secs_f64());
        match &reply {
            ForwardReply::Committed { .. } => self.metrics.fwd_committed.get_or_create(&l).inc(),
            ForwardReply::Conflict { .. } => self.metrics.fwd_conflicts.get_or_create(&l).inc(),
            ForwardReply::Failed { message, .. } => {
                tracing::warn!(mirror, error = %message, "a change forwarded by a mirror failed");
                self.metrics.fwd_refused.get_or_create(&l).inc()
            }
        };
        (id, reply)
    }
}

impl Primary {
    /// Commit through the process that writes this RocksDB volume: a live read-write mount
    /// of this host (its control socket), as `jfs` write commands do.
    async fn commit_through_writer(&self, req: fs_core::CommitRequest) -> ForwardReply {
        let fail = |message: String| ForwardReply::Failed {
            kind: ErrorKind::Backend,
            message,
            temporary: true,
        };
        let now = fs_core::now_ns();
        let sessions = match fs_core::session::list(&*self.engine).await {
            Ok(s) => s,
            Err(e) => return ForwardReply::failed(&e),
        };
        let writer = sessions.into_iter().find_map(|s| {
            let mp = std::path::PathBuf::from(&s.mountpoint);
            (s.is_local_writer()
                && s.is_live(now, fs_core::session::DEFAULT_TIMEOUT)
                && mount::mounts::find(&mp)
                    .ok()
                    .flatten()
                    .is_some_and(|e| e.is_jfs()))
            .then_some(mp)
        });
        let Some(mp) = writer else {
            return fail(format!(
                "the primary's RocksDB volume {} has no writing process on this host: mount it read-write at the primary (RocksDB admits one writing process, and a mirror's changes are committed through it)",
                self.engine.display_url()
            ));
        };
        match mount::control::call(&mp, &mount::control::Request::Commit { req }, |_| {}).await {
            Ok(v) => serde_json::from_value(v["reply"].clone()).unwrap_or_else(|e| {
                fail(format!(
                    "the primary's mount at {} answered a change with something else: {e}",
                    mp.display()
                ))
            }),
            Err(e) => fail(format!(
                "committing through the primary's mount at {}: {e:#}",
                mp.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{ToMirror, ToPrimary, Want};
    use fs_core::{keys, CommitRequest, Mutation, Op, Settings};

    /// A primary agent on a new RocksDB volume with two mirrors, "w" allowed to write and "r"
    /// not; its address.
    async fn primary(d: &std::path::Path) -> (Arc<Primary>, String, CancellationToken) {
        let engine: Arc<dyn Engine> = Arc::new(
            meta::RocksEngine::open(&d.join("meta"), meta::RocksMode::ReadWrite, true, true)
                .unwrap(),
        );
        std::fs::create_dir_all(d.join("blocks")).unwrap();
        let store_url = format!("file://{}", d.join("blocks").display());
        let store = volume::open_store(&store_url, None).unwrap();
        fs_core::Fs::format(
            engine.clone(),
            store,
            Settings::new("v", &store_url, fs_core::DEFAULT_BLOCK_SIZE),
        )
        .await
        .unwrap();
        std::fs::write(d.join("token"), TOKEN).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.join("token"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let text = format!(
            "role = \"primary\"\nmeta = \"rocksdb://{}\"\nstate_dir = \"{}\"\n[primary]\nlisten = \"{listen}\"\n\
             [[primary.mirrors]]\nname = \"w\"\ntoken_file = \"{tok}\"\nallow_writes = true\n\
             [[primary.mirrors]]\nname = \"r\"\ntoken_file = \"{tok}\"\n",
            d.join("meta").display(),
            d.join("state").display(),
            tok = d.join("token").display()
        );
        let cfg = crate::config::Config::parse(&text)
            .unwrap()
            .primary
            .unwrap();
        let p = Primary::new(cfg, engine, Arc::new(Metrics::new(true)))
            .await
            .unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(p.clone().run(stop.clone()));
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(&listen).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (p, listen, stop)
    }

    /// The mirror's token in these tests (random, as `openssl rand -hex 32` makes them).
    const TOKEN: &str = "5b0f6c2e9d8a47f1b3c0e6a9d2f5874c1e0b9a6d3c8f7e2a5b4d1c0f9e8a7b6c";

    /// A hand-made forward connection as mirror `name`: the handshake's outcome.
    async fn link(listen: &str, name: &str) -> (proto::Wire, Result<crate::handshake::Welcome>) {
        let sock = tokio::net::TcpStream::connect(listen).await.unwrap();
        let mut wire = proto::wire(Box::new(sock));
        let hello = ToPrimary::Hello {
            proto: proto::PROTO_VERSION,
            mirror: name.into(),
            volume_uuid: None,
            nonce: proto::nonce(),
            want: Want::Forward,
            prev_crc: None,
            epoch: 0,
            identity: String::new(),
        };
        let w = crate::handshake::connect(&mut wire, listen, TOKEN, hello, Duration::from_secs(5))
            .await;
        (wire, w)
    }

    async fn ask(wire: &mut proto::Wire, id: u64, req: CommitRequest) -> ForwardReply {
        proto::send(wire, &ToPrimary::Commit { id, req })
            .await
            .unwrap();
        match proto::recv::<ToMirror, _>(wire).await.unwrap().unwrap() {
            ToMirror::Forwarded { id: got, reply } => {
                assert_eq!(got, id);
                reply
            }
            other => panic!("unexpected {}", proto::msg_name(&other)),
        }
    }

    fn put(key: &[u8], value: &[u8], reads: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> CommitRequest {
        CommitRequest {
            reads,
            writes: vec![Mutation::Put {
                key: key.to_vec(),
                value: value.to_vec(),
            }],
            op: Op::Release { ino: 1 },
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_primary_commits_only_what_an_allowed_mirror_forwards() {
        let d = tempfile::tempdir().unwrap();
        let (p, listen, stop) = primary(d.path()).await;
        let head0 = p.engine.journal_bounds().await.unwrap().last;
        // A mirror not allowed to write is refused at the handshake, naming the setting.
        let (_, w) = link(&listen, "r").await;
        let e = format!("{:#}", w.err().expect("refused"));
        assert!(
            e.contains("may not write") && e.contains("allow_writes"),
            "{e}"
        );
        // An allowed one: a change of the file tree commits, in the primary's order.
        let (mut wire, w) = link(&listen, "w").await;
        assert!(w.is_ok());
        let k = keys::kept(77);
        let r = ask(&mut wire, 1, put(&k, b"s", vec![(k.clone(), None)])).await;
        assert!(
            matches!(r, ForwardReply::Committed { seq, .. } if seq == head0 + 1),
            "{r:?}"
        );
        assert_eq!(p.engine.get(&k).await.unwrap(), Some(b"s".to_vec()));
        // Prepared against an older view (it read the key absent): a conflict, with the head.
        let r = ask(&mut wire, 2, put(&k, b"t", vec![(k.clone(), None)])).await;
        assert_eq!(r, ForwardReply::Conflict { head: head0 + 1 });
        assert_eq!(p.engine.get(&k).await.unwrap(), Some(b"s".to_vec()));
        // Never the volume's settings or its storage record, even from an allowed mirror.
        for key in [keys::SETTING, keys::STORAGE, keys::EPOCH] {
            let r = ask(&mut wire, 3, put(key, b"{}", vec![])).await;
            assert!(
                matches!(
                    &r,
                    ForwardReply::Failed {
                        kind: ErrorKind::PermissionDenied,
                        ..
                    }
                ),
                "{r:?}"
            );
        }
        assert_eq!(p.engine.journal_bounds().await.unwrap().last, head0 + 1);
        let l = label("w");
        assert_eq!(p.metrics.fwd_committed.get_or_create(&l).get(), 1);
        assert_eq!(p.metrics.fwd_conflicts.get_or_create(&l).get(), 1);
        assert_eq!(p.metrics.fwd_refused.get_or_create(&l).get(), 3);
        assert_eq!(p.metrics.fwd_refused.get_or_create(&label("r")).get(), 1);
        stop.cancel();
    }
    /// A mirror's sessions are kept while it reports them, marked as relayed by it, and
    /// dropped when it stops; a report can never replace one of the primary's own sessions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mirrors_sessions_are_kept_while_it_reports_them() {
        use fs_core::session::{self, Session};
        let d = tempfile::tempdir().unwrap();
        let (p, listen, stop) = primary(d.path()).await;
        let mut own = Session::new("/mnt/primary", false);
        session::beat(&*p.engine, &mut own).await.unwrap();
        let (mut wire, w) = link(&listen, "w").await;
        assert!(w.is_ok());
        let theirs = Session::new("/mnt/at-the-mirror", false);
        let rec = |s: &Session| fs_core::record::encode(s);
        let list = |e: Arc<dyn Engine>| async move { session::list(&*e).await.unwrap() };
        let until = |want: &'static str, ok: Box<dyn Fn(&[Session]) -> bool + Send>| {
            let e = p.engine.clone();
            async move {
                for _ in 0..100 {
                    if ok(&list(e.clone()).await) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("{want}: {:?}", list(e).await);
            }
        };
        proto::send(
            &mut wire,
            &ToPrimary::Sessions {
                records: vec![rec(&theirs)],
            },
        )
        .await
        .unwrap();
        let id = theirs.id.clone();
        until(
            "the relayed session was not kept",
            Box::new(move |l| {
                l.iter()
                    .any(|s| s.id == id && s.relayed_by.as_deref() == Some("w"))
            }),
        )
        .await;
        // A report naming the primary's own session (and its own again) changes nothing of it.
        let mut forged = own.clone();
        forged.mountpoint = "/forged".into();
        proto::send(
            &mut wire,
            &ToPrimary::Sessions {
                records: vec![rec(&forged), rec(&theirs)],
            },
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let l = list(p.engine.clone()).await;
        let mine = l
            .iter()
            .find(|s| s.id == own.id)
            .expect("the primary's own session");
        assert_eq!(
            (mine.mountpoint.as_str(), mine.relayed_by.as_deref()),
            ("/mnt/primary", None)
        );
        // The mirror stops reporting it: dropped; the primary's own stays.
        proto::send(&mut wire, &ToPrimary::Sessions { records: vec![] })
            .await
            .unwrap();
        let (gone, kept) = (theirs.id.clone(), own.id.clone());
        until(
            "the session the mirror stopped reporting was kept",
            Box::new(move |l| !l.iter().any(|s| s.id == gone) && l.iter().any(|s| s.id == kept)),
        )
        .await;
        stop.cancel();
    }
}
