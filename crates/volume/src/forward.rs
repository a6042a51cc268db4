//! Writes at a mirror site. A mount at a mirror whose primary lets it write opens the
//! mirror's metadata through `ForwardingEngine`: reads are the mirror's own (a consistent
//! prefix of the primary's), and a commit, carrying what its transaction read, goes to the
//! site's mirror agent over a local socket (`SOCKET_NAME` in the agent's state directory,
//! named in its progress record). The agent relays it over its authenticated connection to
//! the primary agent, whose engine commits it in the primary's order; a read that differs
//! there is a conflict, as between two writers at the primary.
//!
//! Read-your-writes: a commit returns only once this site's metadata has applied its
//! sequence number, and a conflict only once the site has applied what the primary had then,
//! so the retry reads a view at least that new.
//!
//! Invariants: nothing here writes the mirror's metadata (applying the journal stays its only
//! writer; its marker refuses every other commit); every wait is bounded, then an error
//! names what did not answer (EIO at the mount), and a change is either committed at the
//! primary or not at all.

use async_trait::async_trait;
use fs_core::engine::{CommitOutcome, Engine, Follow, Followed, JournalBounds, KvPair};
use fs_core::{CommitRequest, Entry, Error, ErrorKind, Mutation, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The agent's forward socket, in its state directory.
pub const SOCKET_NAME: &str = "forward.sock";
/// How long a change may wait for the primary's answer (through the agent).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a committed change may wait for this site to apply it.
pub const APPLY_WAIT: Duration = Duration::from_secs(30);
/// The largest frame on the forward socket.
const MAX_FRAME: usize = 64 << 20;

/// What a mount asks its agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardRequest {
    Commit(CommitRequest),
    /// A write at the mount failed where the agent did not see it (a block the origin store
    /// refused, a change the agent could not be asked about or that this site did not apply
    /// in time): the agent counts it and keeps the cause for its status. No answer.
    Failed {
        cause: String,
    },
}

/// How long a mount spends telling its agent about a failed write (it is failing anyway).
const REPORT_WAIT: Duration = Duration::from_secs(1);

/// Tell the agent serving `socket` that a write at this mount failed (see
/// `ForwardRequest::Failed`); best effort and bounded, never an error of its own.
pub async fn report_failure(socket: &Path, cause: &str) {
    let io = async {
        let mut s = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        server_trusted(&s, socket)?;
        write_frame(
            &mut s,
            &ForwardRequest::Failed {
                cause: cause.to_string(),
            },
        )
        .await
        .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(REPORT_WAIT, io).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(socket = %socket.display(), error = %e, "a failed write was not reported to the mirror agent")
        }
        Err(_) => {
            tracing::debug!(socket = %socket.display(), "a failed write was not reported to the mirror agent in time")
        }
    }
}

/// The primary's answer, relayed by the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ForwardReply {
    Committed {
        seq: u64,
        time_ns: i64,
    },
    /// What the change read differs at the primary, whose head was `head`.
    Conflict {
        head: u64,
    },
    /// Not committed: refused (not allowed, fenced) or not answered.
    Failed {
        kind: ErrorKind,
        message: String,
        temporary: bool,
    },
}

impl ForwardReply {
    pub fn failed(e: &Error) -> ForwardReply {
        ForwardReply::Failed {
            kind: e.kind(),
            message: e.message().to_string(),
            temporary: e.status() == fs_core::ErrorStatus::Temporary,
        }
    }
}

/// Commit a forwarded change with `engine` and say how it went (a conflict with the head
/// then, so the mirror knows what to catch up to).
pub async fn commit_here(engine: &dyn Engine, req: &CommitRequest) -> ForwardReply {
    match engine.commit(req).await {
        Ok(CommitOutcome::Committed { seq, time_ns }) => ForwardReply::Committed { seq, time_ns },
        Ok(CommitOutcome::Conflict) => match engine.journal_bounds().await {
            Ok(b) => ForwardReply::Conflict { head: b.last },
            Err(e) => ForwardReply::failed(&e),
        },
        Err(e) => ForwardReply::failed(&e),
    }
}

/// Write one frame: a little-endian u32 length, then the postcard body.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> std::io::Result<()> {
    let body = postcard::to_allocvec(msg)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).await?;
    w.flush().await
}

/// Read one frame; None at a clean end of the stream.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(
    r: &mut R,
) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a forward frame of {len} bytes is over the limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    postcard::from_bytes(&body)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Whether a forwarded change touches only the file tree (what a mount writes): never the
/// volume's settings, storage record or epoch. The primary agent refuses any other.
pub fn tree_only(req: &CommitRequest) -> std::result::Result<(), String> {
    use fs_core::keys::Key;
    for m in &req.writes {
        let key = match m {
            Mutation::Put { key, .. }
            | Mutation::Delete { key }
            | Mutation::Stamp { key }
            | Mutation::Add { key, .. } => key,
        };
        match fs_core::keys::parse(key) {
            Key::Counter(_)
            | Key::Attr(_)
            | Key::Dentry(..)
            | Key::Chunk(..)
            | Key::Symlink(_)
            | Key::Xattr(..)
            | Key::Rdev(_)
            | Key::Pending(..)
            | Key::Checksums(_)
            | Key::Kept(_)
            | Key::Refs(_)
            | Key::Cloning(_)
            | Key::Trash(..)
            | Key::TrashInfo(_) => {}
            other => {
                return Err(format!(
                    "a change forwarded from a mirror may touch only the file tree, not {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// A mirror's metadata whose commits go to the primary (see the module comment).
pub struct ForwardingEngine {
    local: Arc<dyn Engine>,
    socket: PathBuf,
    timeout: Duration,
    apply_wait: Duration,
}

/// Whether the process at the other end of `s` (connected to `path`) is the agent that
/// owns the socket's directory: the peer is this user or root, or it is the owner of a
/// directory that no one else may change (0700-like, its parents root's or this user's).
/// A socket planted by another user in a place they control is refused.
fn server_trusted(s: &tokio::net::UnixStream, path: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let peer = s
        .peer_cred()
        .map_err(|e| format!("who serves it is unknown: {e}"))?
        .uid();
    let me = rustix::process::geteuid().as_raw();
    if peer == me || peer == 0 {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != peer || m.mode() & 0o022 != 0 {
        return Err(format!(
            "it is served by uid {peer}, who does not own {} alone",
            dir.display()
        ));
    }
    // Above it, ssh's rule: root's or this user's, and no one else may replace it.
    if let Some(why) = cli_common::private::ancestors_problem(dir) {
        return Err(format!(
            "it is served by uid {peer} from {}: {why}",
            dir.display()
        ));
    }
    Ok(())
}

impl ForwardingEngine {
    pub fn new(local: Arc<dyn Engine>, socket: &Path) -> ForwardingEngine {
        ForwardingEngine {
            local,
            socket: socket.to_path_buf(),
            timeout: FORWARD_TIMEOUT,
            apply_wait: APPLY_WAIT,
        }
    }

    async fn ask(&self, req: &CommitRequest) -> Result<ForwardReply> {
        let sock = self.socket.display();
        let io = async {
            let mut s = tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(|e| {
                    Error::temporary(
                        ErrorKind::Backend,
                        format!("the mirror agent's forward socket {sock}: {e} (is mirror-agent running at this site?)"),
                    )
                })?;
            // The answer says whether a change was committed: only the agent may give it.
            if let Err(why) = server_trusted(&s, &self.socket) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("refusing the forward socket {sock}: {why}; the mirror agent's state directory must be its own and closed to others (check state_dir)"),
                ));
            }
            let lost = |e: std::io::Error| {
                Error::temporary(
                    ErrorKind::Backend,
                    format!("the mirror agent at {sock} did not answer: {e}"),
                )
            };
            write_frame(&mut s, &ForwardRequest::Commit(req.clone()))
                .await
                .map_err(lost)?;
            read_frame::<_, ForwardReply>(&mut s)
                .await
                .map_err(lost)?
                .ok_or_else(|| {
                    Error::temporary(
                        ErrorKind::Backend,
                        format!(
                            "the mirror agent at {sock} closed the connection without an answer"
                        ),
                    )
                })
        };
        match tokio::time::timeout(self.timeout, io).await {
            Ok(r) => r,
            Err(_) => Err(Error::temporary(
                ErrorKind::Backend,
                format!(
                    "no answer from the primary within {:?} (through the mirror agent at {sock}): the change was not made here; it is at the primary only if the primary committed it just now",
                    self.timeout
                ),
            )),
        }
    }

    /// Wait until this site's metadata has applied `seq` (bounded).
    async fn applied(&self, seq: u64) -> Result<bool> {
        let t0 = Instant::now();
        loop {
            let b = self.local.journal_bounds().await?;
            if b.last >= seq {
                return Ok(true);
            }
            let left = self.apply_wait.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Ok(false);
            }
            self.local
                .journal_wait(b.last, left.min(Duration::from_millis(500)))
                .await?;
        }
    }
}

#[async_trait]
impl Engine for ForwardingEngine {
    fn kind(&self) -> &'static str {
        self.local.kind()
    }
    fn display_url(&self) -> String {
        self.local.display_url()
    }
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.local.get(key).await
    }
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.local.get_many(keys).await
    }
    async fn get_many_via(&self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<Followed> {
        self.local.get_many_via(keys, follow).await
    }
    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        self.local.scan(start, end, limit).await
    }
    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        let reply = match self.ask(req).await {
            Ok(r) => r,
            Err(e) => {
                // This site was promoted (its metadata is no longer a mirror's, and its agent
                // no longer relays): commit here. The engine refuses it atomically should the
                // metadata be a mirror's after all.
                if fs_core::site::marker(&*self.local).await?.is_none() {
                    return self.local.commit(req).await;
                }
                // The agent did not answer (it may still hear this: a timeout, a reset).
                report_failure(&self.socket, e.message()).await;
                return Err(e);
            }
        };
        match reply {
            ForwardReply::Committed { seq, time_ns } => {
                if self.applied(seq).await? {
                    Ok(CommitOutcome::Committed { seq, time_ns })
                } else {
                    let e = Error::temporary(
                        ErrorKind::Backend,
                        format!(
                            "the change was committed at the primary as entry {seq}, but this mirror has not applied it within {:?} (is its agent replicating?); it shows here once applied",
                            self.apply_wait
                        ),
                    );
                    report_failure(&self.socket, e.message()).await;
                    Err(e)
                }
            }
            ForwardReply::Conflict { head } => {
                // The retry must read a view at least as new as the primary's then; a site
                // that does not get there in time fails the change rather than retry it on
                // the same old view.
                if self.applied(head).await? {
                    Ok(CommitOutcome::Conflict)
                } else {
                    let at = self.local.journal_bounds().await?.last;
                    Err(Error::temporary(
                        ErrorKind::Backend,
                        format!(
                            "the change read an older state than the primary's (entry {head}), and this mirror, at entry {at}, did not catch up within {:?}: the change was not made",
                            self.apply_wait
                        ),
                    ))
                }
            }
            ForwardReply::Failed {
                kind,
                message,
                temporary,
            } => Err(if temporary {
                Error::temporary(kind, message)
            } else {
                Error::new(kind, message)
            }),
        }
    }
    async fn journal_bounds(&self) -> Result<JournalBounds> {
        self.local.journal_bounds().await
    }
    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        self.local.journal_read(from, max).await
    }
    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool> {
        self.local.journal_wait(after, timeout).await
    }
    async fn journal_trim(&self, before: u64) -> Result<u64> {
        self.local.journal_trim(before).await
    }
    async fn apply(&self, _entries: &[Entry]) -> Result<u64> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            "a mount's forwarding view of a mirror does not replay entries (its agent does)",
        ))
    }
    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()> {
        self.local.aux_put(name, value).await
    }
    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.local.aux_list(prefix).await
    }
    async fn install_reset(&self) -> Result<()> {
        Err(refused_install())
    }
    async fn install_put(&self, _pairs: &[KvPair]) -> Result<()> {
        Err(refused_install())
    }
    async fn install_head(&self, _head: u64) -> Result<()> {
        Err(refused_install())
    }
    async fn install_switch(
        &self,
        _writes: &[Mutation],
        _frames: &[(u64, Vec<u8>)],
        _head: u64,
    ) -> Result<()> {
        Err(refused_install())
    }
}

fn refused_install() -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        "a mount's forwarding view of a mirror installs nothing (its agent does)",
    )
}

/// Where a writing mirror mount puts blocks: the origin's placement (the primary's storage
/// record, replicated here), each block then also into the mirror's own store (when it has
/// one of its own), so that reading it back at the mirror costs no origin read. The origin's
/// put must succeed (the write-order invariant is about the origin): a refused one fails the
/// write (EIO at close) and is reported to the agent at `report` (its forward socket), whose
/// status counts it; a failed mirror copy is logged and left to the agent's copier, which
/// queues every block the journal brings.
pub struct AlsoToMirror {
    pub origin: Arc<crate::StorageHolder>,
    pub mirror: Option<Arc<dyn fs_core::BlockStore>>,
    pub report: PathBuf,
}

struct Tee {
    origin: Arc<dyn fs_core::BlockStore>,
    mirror: Option<Arc<dyn fs_core::BlockStore>>,
    report: PathBuf,
}

#[async_trait]
impl fs_core::StoreLayer for Tee {
    fn below(&self) -> &dyn fs_core::BlockStore {
        &*self.origin
    }
    async fn put(&self, key: &str, data: bytes::Bytes) -> Result<()> {
        if let Err(e) = self.origin.put(key, data.clone()).await {
            let cause = format!("the origin store refused a block: {}", e.message());
            report_failure(&self.report, &cause).await;
            return Err(e);
        }
        if let Some(mirror) = &self.mirror {
            if let Err(e) = mirror.put(key, data).await {
                tracing::debug!(key, error = %e, "a block written at the origin was not copied into the mirror store (the agent copies it)");
            }
        }
        Ok(())
    }
}

impl AlsoToMirror {
    fn wrap(&self, p: Arc<fs_core::storage::Placement>) -> Arc<fs_core::storage::Placement> {
        Arc::new(fs_core::storage::Placement {
            gen: p.gen,
            state: p.state.clone(),
            store: Arc::new(Tee {
                origin: p.store.clone(),
                mirror: self.mirror.clone(),
                report: self.report.clone(),
            }),
        })
    }
}

#[async_trait]
impl fs_core::storage::StorageFollow for AlsoToMirror {
    fn current(&self) -> Arc<fs_core::storage::Placement> {
        self.wrap(self.origin.current())
    }
    async fn reload(&self) -> Result<Arc<fs_core::storage::Placement>> {
        Ok(self.wrap(self.origin.reload().await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A listener bound at `path` by user nobody (setpriv), until the child is killed.
    fn nobody_listens(path: &Path) -> std::process::Child {
        let c = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args([
                "/usr/bin/python3",
                "-c",
                "import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\ntime.sleep(60)",
            ])
            .arg(path)
            .spawn()
            .expect("setpriv (util-linux) and /usr/bin/python3");
        let t0 = Instant::now();
        while !path.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no listener at {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }

    /// A forward socket another user planted where they may (a sticky shared directory, or
    /// a directory others may change) is refused: its answer would say whether a change was
    /// committed. The agent's own socket (this user's or root's) is used.
    #[tokio::test]
    async fn a_forward_socket_served_by_another_user_is_refused() {
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let planted = shared.join(SOCKET_NAME);
        let mut child = nobody_listens(&planted);
        let s = tokio::net::UnixStream::connect(&planted).await.unwrap();
        let why = server_trusted(&s, &planted).unwrap_err();
        assert!(why.contains("uid 65534"), "{why}");
        let _ = child.kill();
        let _ = child.wait();
        // An agent running as another user, in its own closed state directory: used.
        let agent = t.path().join("agent-state");
        std::fs::create_dir(&agent).unwrap();
        std::os::unix::fs::chown(&agent, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o700)).unwrap();
        let sock = agent.join(SOCKET_NAME);
        let mut child = nobody_listens(&sock);
        let s = tokio::net::UnixStream::connect(&sock).await.unwrap();
        server_trusted(&s, &sock).unwrap();
        // The same directory opened to others: refused.
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = server_trusted(&s, &sock).unwrap_err();
        assert!(why.contains("does not own"), "{why}");
        let _ = child.kill();
        let _ = child.wait();
        // The agent's own: served by this user.
        let own = t.path().join("own.sock");
        let _l = tokio::net::UnixListener::bind(&own).unwrap();
        let s = tokio::net::UnixStream::connect(&own).await.unwrap();
        server_trusted(&s, &own).unwrap();
    }
}
