//! The control channel of a mount: a Unix socket (mode 0600, in the run directory, named
//! after the mount point) through which `jfs warmup`, `jfs stats` and, for a RocksDB volume
//! that only this process may write, `jfs gc --delete` and `jfs cutover` steps reach the mount.
//!
//! Who may use it: the run directory must be this user's own and 0700 (checked without
//! following links before anything is put there or read from there; a missing one is made
//! 0700), the socket is 0600 from the moment it has its name (`bind_private`), and every
//! connection's peer (SO_PEERCRED) must be this user or root (`accept_trusted`); a client
//! checks the server's the same way, so a socket planted by another user is never spoken to.
//!
//! Protocol: the client writes one JSON request line (at most `MAX_REQUEST` bytes; anything
//! else, bytes that are not UTF-8 included, is answered with an `error` line naming what is
//! wrong: `parse_request`); the server answers with JSON lines, progress lines first, and a
//! last line holding `done` or `error`.

use crate::metrics::Exporter;
use crate::vfs::Vfs;
// How a directory this user keeps private (the run directory, a default cache directory)
// falls short, checked without following a symbolic link; None when it is fine.
use cli_common::private::private_dir_problem;
use fs_core::fs::{Piece, Plan};
use fs_core::{FileKind, Ino, CHUNK_SIZE};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Where control sockets live: `JFS_RUN_DIR`, else /run/jfs for root, else
/// `$XDG_RUNTIME_DIR/jfs`, else /tmp/jfs-UID.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("JFS_RUN_DIR") {
        return PathBuf::from(d);
    }
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from("/run/jfs");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("jfs");
    }
    PathBuf::from(format!("/tmp/jfs-{uid}"))
}

/// Make sure `dir` is a directory of this user's that nobody else may use (0700): created
/// so (parents too) if absent; one of this user's that others may read but not change is
/// narrowed to 0700; anything else (a symbolic link, another user's directory, one others
/// may write, one inside a directory another user could change) is refused with what to
/// do. `what` names it in messages (`cli_common::private`).
pub fn ensure_private_dir(dir: &Path, what: &str) -> anyhow::Result<()> {
    let elsewhere = if what == "run directory" {
        "set another place with JFS_RUN_DIR"
    } else {
        "set another place"
    };
    cli_common::private::ensure_private_dir(dir, what, elsewhere)
}

/// The run directory (`run_dir`), checked (`ensure_private_dir`).
pub fn private_run_dir() -> anyhow::Result<PathBuf> {
    let d = run_dir();
    ensure_private_dir(&d, "run directory")?;
    Ok(d)
}

/// Whether a peer of a local socket may talk to this process: its own user or root.
pub fn peer_trusted(sock: &UnixStream) -> std::io::Result<u32> {
    let uid = sock.peer_cred()?.uid();
    let me = rustix::process::geteuid().as_raw();
    if uid == me || uid == 0 {
        Ok(uid)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("the peer is uid {uid}: only uid {me} (this process's user) and root may use this socket"),
        ))
    }
}

/// The next connection to `listener` from this process's user or root (`peer_trusted`);
/// any other is closed at once, unanswered, and logged.
pub async fn accept_trusted(listener: &UnixListener) -> std::io::Result<UnixStream> {
    loop {
        let (sock, _) = listener.accept().await?;
        match peer_trusted(&sock) {
            Ok(_) => return Ok(sock),
            Err(e) => tracing::warn!(error = %e, "refused a local connection"),
        }
    }
}

/// Listen on a Unix socket at `path` that only this user (and root) can connect to from its
/// first moment: it is bound in a new 0700 directory beside `path`, made 0600, and renamed
/// into place (a socket bound in place is open to the umask until restricted). Peers must
/// still be checked (`accept_trusted`): the directory `path` is in may be reachable.
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut n = 0u32;
    let private = loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let p = dir.join(format!(".{name}.{}.{nanos:x}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => break p,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => return Err(e),
        }
    };
    let inner = private.join("s");
    let res = (|| {
        let l = UnixListener::bind(&inner)?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inner, path)?;
        Ok(l)
    })();
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    res
}

/// The control socket of the mount at `mountpoint` (an absolute, canonical path).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    socket_path_in(&run_dir(), mountpoint)
}

/// The control socket of the mount at `mountpoint` in run directory `dir`.
pub fn socket_path_in(dir: &Path, mountpoint: &Path) -> PathBuf {
    // FNV-1a: stable across builds, no dependency.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in mountpoint.as_os_str().as_encoded_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    dir.join(format!("mount-{h:016x}.sock"))
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WarmAction {
    /// Fetch blocks durably into the local cache.
    Warm,
    /// Count what is cached.
    Check,
    /// Drop blocks from the local cache.
    Evict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Paths inside the volume ("/a/b").
    Warmup {
        paths: Vec<String>,
        threads: usize,
        action: WarmAction,
    },
    Stats,
    Gc {
        delete: bool,
        session_timeout_secs: u64,
    },
    /// A storage cutover step (`jfs cutover`), committed by this process (the one RocksDB
    /// writer); answers the states before and after.
    /// Commit what is buffered and exit (`jfs umount --force`): answers with this process's
    /// pid first. With `now`, the process does not wait for open files to be closed.
    Exit {
        #[serde(default)]
        now: bool,
    },
    /// `jfs clone` of a volume whose one writer is this process: volume paths.
    Clone {
        src: String,
        dst: String,
        /// Into DST, under SRC's name (DST given with a trailing slash).
        #[serde(default)]
        into: bool,
    },
    /// Why the latest commit of inode `ino` failed (a writer that got EIO asks).
    WriteError {
        ino: u64,
    },
    /// A change a mirror site's mount made, relayed by the primary agent of a RocksDB volume
    /// (whose one writer is this process): committed here, answered as a `ForwardReply`.
    Commit {
        req: fs_core::CommitRequest,
    },
    Cutover {
        event: fs_core::storage::Event,
        /// The operator's command (`user@host pid N`), for the audit record.
        #[serde(default)]
        who: Option<String>,
    },
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct WarmProgress {
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub blocks_done: u64,
    pub bytes_done: u64,
    /// Blocks fetched from the store now (warm), found cached (check, warm), dropped (evict).
    pub fetched: u64,
    pub cached: u64,
    pub evicted: u64,
    pub failed: u64,
    /// Files held as whole-file copies for passthrough: made or found (warm), found
    /// (check), dropped (evict).
    #[serde(default)]
    pub whole_files: u64,
    /// The first few failures, for the summary.
    pub errors: Vec<String>,
}

pub struct Ctl {
    pub vfs: Arc<Vfs>,
    pub store: Arc<volume::CachedStore>,
    pub exporter: Arc<Exporter>,
    pub mountpoint: PathBuf,
    /// Asks `run` to shut down (the flag: without waiting for open files).
    pub exit: tokio::sync::mpsc::Sender<bool>,
}

pub async fn serve(listener: UnixListener, ctl: Arc<Ctl>) {
    loop {
        // Only this user and root: a request can stop the mount or commit changes.
        let Ok(sock) = accept_trusted(&listener).await else {
            continue;
        };
        let ctl = ctl.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(sock, ctl).await {
                tracing::debug!(error = %e, "control connection ended");
            }
        });
    }
}

async fn send(w: &mut (impl AsyncWriteExt + Unpin), v: &serde_json::Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v)?;
    line.push(b'\n');
    w.write_all(&line).await
}

/// The longest request line read (a warmup of many paths is the longest there is).
pub const MAX_REQUEST: u64 = 1 << 20;

/// A request line as it came from the socket (at most `MAX_REQUEST` bytes, its newline
/// included or not): the request, or what is wrong with it in words for the client's error
/// line. Bytes that are not UTF-8, a line cut at the limit and JSON that is not a request
/// are refused alike, never a panic.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    if line.len() as u64 >= MAX_REQUEST && line.last() != Some(&b'\n') {
        return Err(format!(
            "bad request: longer than {MAX_REQUEST} bytes (warm up fewer paths at a time)"
        ));
    }
    let text = std::str::from_utf8(line)
        .map_err(|e| format!("bad request: not UTF-8 ({e}): one JSON line is expected"))?;
    serde_json::from_str(text).map_err(|e| {
        // serde_json quotes a value of the wrong type whole: a line of the answer, not the
        // request sent back (up to 1 MiB of it).
        let e = e.to_string();
        let mut it = e.chars();
        let head: String = it.by_ref().take(300).collect();
        match it.count() {
            0 => format!("bad request: {head}"),
            n => format!("bad request: {head}... ({n} more characters)"),
        }
    })
}

async fn handle(sock: UnixStream, ctl: Arc<Ctl>) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut line = Vec::new();
    BufReader::new(r.take(MAX_REQUEST))
        .read_until(b'\n', &mut line)
        .await?;
    let req: Request = match parse_request(&line) {
        Ok(r) => r,
        Err(e) => return send(&mut w, &serde_json::json!({ "error": e })).await,
    };
    match req {
        Request::Stats => {
            let v = serde_json::json!({
                "done": true,
                "metrics": ctl.exporter.text(),
                "known_inodes": ctl.vfs.known_inodes(),
                "mountpoint": ctl.mountpoint.to_string_lossy(),
                "pid": std::process::id(),
            });
            send(&mut w, &v).await
        }
        Request::WriteError { ino } => {
            let v = serde_json::json!({"done": true, "error_text": ctl.vfs.write_error(ino)});
            send(&mut w, &v).await
        }
        Request::Exit { now } => {
            let v = serde_json::json!({"done": true, "pid": std::process::id()});
            send(&mut w, &v).await?;
            let _ = ctl.exit.send(now).await;
            Ok(())
        }
        Request::Gc { .. }
        | Request::Cutover { .. }
        | Request::Commit { .. }
        | Request::Clone { .. }
            if fs_core::site::marker(&**ctl.vfs.fs.engine())
                .await
                .map_or(true, |m| m.is_some()) =>
        {
            let v = serde_json::json!({"error": format!("{} is a mount at a mirror site: gc, cutovers and other processes' changes run at the primary (its own changes go there through the site's agent)", ctl.mountpoint.display())});
            send(&mut w, &v).await
        }
        Request::Clone { src, dst, into } => {
            let t = std::time::Instant::now();
            let v = match clone_here(&ctl.vfs.fs, &src, &dst, into).await {
                Ok((to, r)) => serde_json::json!({"done": true, "report": r, "dst": to,
                    "seconds": t.elapsed().as_secs_f64()}),
                Err(e) => serde_json::json!({"error": format!("clone: {e}")}),
            };
            send(&mut w, &v).await
        }
        Request::Gc {
            delete,
            session_timeout_secs,
        } => {
            let opts = fs_core::maint::GcOptions {
                delete,
                session_timeout: std::time::Duration::from_secs(session_timeout_secs),
                ..fs_core::maint::gc_defaults()
            };
            let v = match ctl.vfs.fs.gc(&opts).await {
                Ok(r) => serde_json::json!({"done": true, "report": r}),
                Err(e) => serde_json::json!({"error": format!("gc: {e}")}),
            };
            send(&mut w, &v).await
        }
        Request::Cutover { event, who } => {
            let v = match fs_core::storage::transition_as(
                &**ctl.vfs.fs.engine(),
                &event,
                who.as_deref(),
            )
            .await
            {
                Ok((before, after)) => {
                    serde_json::json!({"done": true, "before": before, "after": after})
                }
                Err(e) => serde_json::json!({"error": format!("cutover {}: {e}", event.name())}),
            };
            send(&mut w, &v).await
        }
        Request::Commit { req } => {
            use volume::forward::ForwardReply;
            let engine = ctl.vfs.fs.engine();
            let reply = match volume::forward::tree_only(&req) {
                Err(why) => ForwardReply::Failed {
                    kind: fs_core::ErrorKind::PermissionDenied,
                    message: why,
                    temporary: false,
                },
                Ok(()) => volume::forward::commit_here(&**engine, &req).await,
            };
            send(&mut w, &serde_json::json!({"done": true, "reply": reply})).await
        }
        Request::Warmup {
            paths,
            threads,
            action,
        } => warmup(&ctl, &mut w, paths, threads.clamp(1, 256), action).await,
    }
}

/// Every block key a file's data shows (visible bytes only), with its length and checksum.
async fn file_blocks(
    vfs: &Vfs,
    ino: Ino,
    len: u64,
) -> fs_core::Result<Vec<(String, u32, Option<u32>)>> {
    let mut keys = BTreeSet::new();
    let mut off = 0u64;
    while off < len {
        let n = CHUNK_SIZE.min(len - off) as usize;
        let plan: Plan = vfs.fs.plan_read(ino, off, n).await?;
        for p in plan.pieces {
            if let Piece::Block { key, check, .. } = p {
                keys.insert((key, check.len, check.crc));
            }
        }
        off += n as u64;
    }
    Ok(keys.into_iter().collect())
}

/// What a warm-up works on: blocks one by one, and (with passthrough) files warmed straight
/// into whole-file copies.
#[derive(Default)]
struct WarmSet {
    blocks: Vec<(String, u32, Option<u32>)>,
    whole: Vec<Ino>,
    files: Vec<Ino>,
    /// Blocks (and bytes) a check found in current whole-file copies.
    in_whole: (u64, u64),
}

async fn collect(
    vfs: &Vfs,
    path: &str,
    action: WarmAction,
    set: &mut WarmSet,
    p: &mut WarmProgress,
) -> fs_core::Result<()> {
    let (ino, a) = vfs.fs.resolve(path).await?;
    let mut stack = vec![(ino, a)];
    while let Some((ino, a)) = stack.pop() {
        match a.kind {
            FileKind::File => {
                p.files += 1;
                set.files.push(ino);
                let blocks = file_blocks(vfs, ino, a.length).await?;
                p.blocks += blocks.len() as u64;
                p.bytes += blocks.iter().map(|b| b.1 as u64).sum::<u64>();
                let whole = vfs.warms_whole(a.length);
                match action {
                    WarmAction::Warm if whole => set.whole.push(ino),
                    WarmAction::Check if whole && vfs.has_current_whole(ino).await => {
                        p.whole_files += 1;
                        set.in_whole.0 += blocks.len() as u64;
                        set.in_whole.1 += blocks.iter().map(|b| b.1 as u64).sum::<u64>();
                    }
                    _ => set.blocks.extend(blocks),
                }
            }
            FileKind::Dir => {
                for e in vfs.fs.readdir_all(ino).await? {
                    if matches!(e.kind, FileKind::File | FileKind::Dir) {
                        if let Ok(a) = vfs.fs.getattr(e.ino).await {
                            stack.push((e.ino, a));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

async fn warmup(
    ctl: &Ctl,
    w: &mut (impl AsyncWriteExt + Unpin),
    paths: Vec<String>,
    threads: usize,
    action: WarmAction,
) -> std::io::Result<()> {
    let Some(cache) = ctl.store.cache().cloned() else {
        return send(
            w,
            &serde_json::json!({"error": "this mount has no local cache (mount it with --cache-size above 0)"}),
        )
        .await;
    };
    let mut p = WarmProgress::default();
    let mut set = WarmSet::default();
    for path in &paths {
        if let Err(e) = collect(&ctl.vfs, path, action, &mut set, &mut p).await {
            return send(w, &serde_json::json!({"error": format!("{path}: {e}")})).await;
        }
    }
    let WarmSet {
        mut blocks,
        whole,
        files,
        in_whole,
    } = set;
    blocks.sort();
    blocks.dedup();
    let keys: Vec<String> = blocks.iter().map(|(k, _, _)| k.clone()).collect();
    let (blocks_done, bytes_done) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (fetched, cached, evicted, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let blocks_work = futures::stream::iter(blocks.into_iter().map(|(key, len, crc)| {
        let (store, cache) = (ctl.store.clone(), cache.clone());
        let (bd, byd, fe, ca, ev, fa, errs) = (
            blocks_done.clone(),
            bytes_done.clone(),
            fetched.clone(),
            cached.clone(),
            evicted.clone(),
            failed.clone(),
            errors.clone(),
        );
        async move {
            match action {
                WarmAction::Warm => {
                    match store.warm(&key, fs_core::BlockCheck { len, crc }).await {
                        Ok(true) => {
                            fe.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) => {
                            ca.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            fa.fetch_add(1, Ordering::Relaxed);
                            let mut v = errs.lock().unwrap_or_else(|p| p.into_inner());
                            if v.len() < 10 {
                                v.push(format!("{key}: {e}"));
                            }
                        }
                    }
                }
                WarmAction::Check => {
                    if cache.contains(&key) {
                        ca.fetch_add(1, Ordering::Relaxed);
                    }
                }
                WarmAction::Evict => {
                    if cache.remove(&key) {
                        ev.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            bd.fetch_add(1, Ordering::Relaxed);
            byd.fetch_add(len as u64, Ordering::Relaxed);
        }
    }))
    .buffer_unordered(threads)
    .collect::<Vec<()>>();
    // Files warmed straight into whole-file copies, one after another (each fetches
    // `threads` blocks at once).
    cached.fetch_add(in_whole.0, Ordering::Relaxed);
    blocks_done.fetch_add(in_whole.0, Ordering::Relaxed);
    bytes_done.fetch_add(in_whole.1, Ordering::Relaxed);
    let whole_done = Arc::new(AtomicU64::new(0));
    let whole_work = {
        let (vfs, store, wd) = (ctl.vfs.clone(), ctl.store.clone(), whole_done.clone());
        let (bd, byd, fe, ca, fa, errs) = (
            blocks_done.clone(),
            bytes_done.clone(),
            fetched.clone(),
            cached.clone(),
            failed.clone(),
            errors.clone(),
        );
        async move {
            for ino in whole {
                let each = |len: u64, now: bool| {
                    bd.fetch_add(1, Ordering::Relaxed);
                    byd.fetch_add(len, Ordering::Relaxed);
                    let c = if now { &fe } else { &ca };
                    c.fetch_add(1, Ordering::Relaxed);
                };
                match vfs.warm_whole(&store, ino, threads, each).await {
                    Ok(_) => {
                        wd.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        fa.fetch_add(1, Ordering::Relaxed);
                        let mut v = errs.lock().unwrap_or_else(|p| p.into_inner());
                        if v.len() < 10 {
                            v.push(format!("inode {ino}: {e}"));
                        }
                    }
                }
            }
        }
    };
    let work = futures::future::join(blocks_work, whole_work);
    tokio::pin!(work);
    let snapshot = |p: &WarmProgress| {
        let mut q = p.clone();
        q.blocks_done = blocks_done.load(Ordering::Relaxed);
        q.bytes_done = bytes_done.load(Ordering::Relaxed);
        q.fetched = fetched.load(Ordering::Relaxed);
        q.cached = cached.load(Ordering::Relaxed);
        q.evicted = evicted.load(Ordering::Relaxed);
        q.failed = failed.load(Ordering::Relaxed);
        q.errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
        q
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(300));
    loop {
        tokio::select! {
            _ = &mut work => break,
            _ = tick.tick() => {
                send(w, &serde_json::json!({"progress": snapshot(&p)})).await?;
            }
        }
    }
    // A cache too small for the whole set evicts early blocks for later ones: the warm-up
    // has not done its job then, whatever the order the blocks came in.
    if action == WarmAction::Warm && failed.load(Ordering::Relaxed) == 0 {
        let gone = keys.iter().filter(|k| !cache.contains(k)).count();
        if gone > 0 {
            failed.fetch_add(gone as u64, Ordering::Relaxed);
            errors.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                "the local cache is full ({} bytes): {gone} of {} blocks were evicted by later ones; give the mount a larger --cache-size",
                cache.usage().capacity,
                keys.len()
            ));
        }
    }
    // What was fetched is durable before the warm-up reports done: one sync for all of it.
    if action == WarmAction::Warm && fetched.load(Ordering::Relaxed) > 0 {
        if let Err(e) = cache.sync().await {
            failed.fetch_add(1, Ordering::Relaxed);
            errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("making the warmed blocks durable: {e}"));
        }
    }
    // With passthrough, each warmed file of some size is also copied whole (from the blocks
    // just cached), so that its next open is read by the kernel from the local disk.
    // An eviction drops the files' whole copies too.
    if action == WarmAction::Evict {
        for ino in files {
            if cache.remove_whole(ino) {
                whole_done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    p.whole_files += whole_done.load(Ordering::Relaxed);
    p = snapshot(&p);
    send(w, &serde_json::json!({"done": true, "summary": p})).await
}

/// Send `req` to the mount at `mountpoint`; `on_line` sees every line; returns the last.
/// A clone asked for through the control socket, by this process's session.
async fn clone_here(
    fs: &fs_core::Fs,
    src: &str,
    dst: &str,
    into: bool,
) -> fs_core::Result<(String, fs_core::fs::clone::CloneReport)> {
    let (src, dst) = (fs_core::VolPath::parse(src)?, fs_core::VolPath::parse(dst)?);
    let session = fs_core::maint::own_session(&**fs.engine())
        .await
        .ok_or_else(|| fs_core::error::invalid("this mount has no session in the metadata"))?;
    let (to, r) = fs.clone_path(&src, &dst, into, &session).await?;
    Ok((to.to_string(), r))
}

pub async fn call(
    mountpoint: &Path,
    req: &Request,
    mut on_line: impl FnMut(&serde_json::Value),
) -> anyhow::Result<serde_json::Value> {
    let dir = run_dir();
    let path = socket_path_in(&dir, mountpoint);
    // A run directory someone else made or can change may hold their socket, not the mount's.
    match std::fs::symlink_metadata(&dir) {
        Ok(m) => {
            if let Some(why) = private_dir_problem(&dir, &m) {
                anyhow::bail!(
                    "refusing the run directory {}: {why}; it must be a directory of this user's that no one else may use (mode 0700): remove it and mount again, or set JFS_RUN_DIR",
                    dir.display()
                );
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("the run directory {}: {e}", dir.display()),
    }
    let sock = UnixStream::connect(&path).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the mount at {} through {} ({e}): is it a `jfs mount` of this host, still running?",
            mountpoint.display(),
            path.display()
        )
    })?;
    peer_trusted(&sock).map_err(|e| {
        anyhow::anyhow!(
            "refusing the control socket {}: {e} (not a mount of this user's)",
            path.display()
        )
    })?;
    let (r, mut w) = sock.into_split();
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    let mut lines = BufReader::new(r).lines();
    let mut last = serde_json::Value::Null;
    while let Some(l) = lines.next_line().await? {
        let v: serde_json::Value = serde_json::from_str(&l)?;
        on_line(&v);
        if v.get("done").is_some() || v.get("error").is_some() {
            last = v;
            break;
        }
    }
    if let Some(e) = last.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("{e}");
    }
    if last.is_null() {
        anyhow::bail!(
            "the mount at {} closed the control connection",
            mountpoint.display()
        );
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// As user nobody (65534), connect to `sock`, send an exit request and print what came
    /// back (`b''`: closed unanswered), or the error.
    fn connect_as_nobody(sock: &Path) -> String {
        let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(5)\ntry:\n s.connect(sys.argv[1])\n s.sendall(b'{\"op\":\"exit\"}\\n')\n print(repr(s.recv(100)))\nexcept OSError as e:\n print('error', e.errno)\n";
        let o = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["/usr/bin/python3", "-c", script])
            .arg(sock)
            .output()
            .expect("running setpriv (util-linux) and /usr/bin/python3");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    #[tokio::test]
    async fn another_users_connection_is_closed_unanswered_and_the_owners_accepted() {
        let d = tempfile::tempdir().unwrap();
        // A shared host: the directory is reachable and the socket opened to everyone, so
        // only the peer check stands between another user and the mount.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = d.path().join("ctl.sock");
        let listener = bind_private(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let accept = tokio::spawn(async move { accept_trusted(&listener).await });
        let p = path.clone();
        let nobody = tokio::task::spawn_blocking(move || connect_as_nobody(&p))
            .await
            .unwrap();
        // Closed unanswered: read end of file, or the send met the closed socket (EPIPE,
        // ECONNRESET), depending on who is first.
        assert!(
            ["b''", "error 32", "error 104"].contains(&nobody.as_str()),
            "uid 65534 got {nobody}"
        );
        assert!(!accept.is_finished(), "uid 65534's connection was accepted");
        let me = UnixStream::connect(&path).await.unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), accept)
            .await
            .expect("the owner's connection is accepted")
            .unwrap()
            .unwrap();
        assert_eq!(
            got.peer_cred().unwrap().uid(),
            rustix::process::geteuid().as_raw()
        );
        drop(me);
    }

    #[tokio::test]
    async fn a_socket_is_owner_only_from_its_first_moment_whatever_its_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = d.path().join("ctl.sock");
        let _l = bind_private(&path).unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        // Nothing else is left beside it (the private directory it was bound in is gone).
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ctl.sock")]);
        assert_eq!(connect_as_nobody(&path), "error 13", "EACCES for uid 65534");
    }

    #[test]
    fn a_run_directory_not_this_users_alone_is_refused_and_a_missing_one_made_0700() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // Missing (with a missing parent): made, 0700.
        let made = d.path().join("a/run");
        ensure_private_dir(&made, "run directory").unwrap();
        for p in [&made, &d.path().join("a")] {
            assert_eq!(std::fs::metadata(p).unwrap().mode() & 0o777, 0o700, "{p:?}");
        }
        // This user's, readable by others: narrowed.
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&open, "run directory").unwrap();
        assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o700);
        // Another user's, a link to one of ours, one others may write: refused, untouched.
        let theirs = d.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&made, &link).unwrap();
        let writable = d.path().join("writable");
        std::fs::create_dir(&writable).unwrap();
        std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).unwrap();
        for (p, why) in [
            (&theirs, "belongs to uid 65534"),
            (&link, "is a symbolic link"),
            (&writable, "has mode 0777"),
        ] {
            let e = format!("{:#}", ensure_private_dir(p, "run directory").unwrap_err());
            assert!(e.contains(why), "{e}");
            assert!(e.contains("JFS_RUN_DIR"), "{e}");
        }
        assert_eq!(std::fs::metadata(&writable).unwrap().mode() & 0o777, 0o777);
    }
}
