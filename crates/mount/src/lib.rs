//! `jfs mount`: a volume as a POSIX file system through FUSE.
//!
//! Layers: `vfs` (the operations over fs-core, with the open-file table, write buffers and
//! readers), `fuse` (the fuser adapter, replies from tokio tasks), `control` (the Unix socket
//! of warmup, stats and gc), `metrics`. `run` ties them together for one mount: it registers
//! a session with a heartbeat, mounts, serves until SIGTERM/SIGINT or an unmount, commits
//! every buffer and removes its session.
//!
//! Invariants: data written through the mount is committed (blocks stored, then the slice
//! referenced) at flush, fsync and close at the latest, and a failure to store it is an
//! EIO there, never silence; an inode unlinked while open here stays until its last close
//! (or until gc finds this session dead). Who may use it: without `--allow-other` the kernel
//! refuses every user but the mounting one (the mount table shows no `allow_other`), and its
//! control socket answers only that user and root (see `control`).
//!
//! # Parts and invariants
//!
//! `vfs/` (every operation over fs-core, answering errnos; the open-file table, which is
//! fs-core's `Keeper`; per-handle `FileReader`s; directory snapshots taken at opendir; lookup
//! counts; FOPEN_KEEP_CACHE when (mtime, length) are unchanged since the previous open),
//! `writer.rs` (the per-inode write buffer: runs sealed at 16 MiB or a chunk boundary, uploaded
//! in the background, committed strictly in write order; memory from a `Budget`), `fuse/`
//! (fuser 0.18 adapter; each request answered from a tokio task), `control.rs` (the Unix socket
//! of warmup, stats and gc), `mounts.rs` (mountinfo, unmount), `metrics.rs`, and `lib.rs::run`
//! (session, mount, heartbeat, signals, and for read-only mounts a follower that catches a
//! RocksDB secondary up every 200 ms and publishes the applied seq), `guard.rs` (a watchdog
//! process started before mounting: when the mount process dies it waits for the kernel to drop
//! the dead connection and unmounts it, since fusermount3's auto-unmount probes once and can
//! lose that race). At a mirror an open pins the version it opened (chunk records and
//! attributes), so the agent applying its deletion does not cut a reader short; NotFound
//! between a lookup's reads, or for an inode the kernel looked up before a deletion, answers
//! ESTALE or looks the name up again. Invariants: data is committed at flush/fsync/close at
//! the latest, a failed upload poisons the buffer (no later slice is committed out of order) and
//! is EIO there; an inode unlinked while open in this mount is kept (`O<ino>` names the session)
//! until its last close; the session record is removed at a clean exit and reaped by gc or the
//! next read-write mount when its process is gone. The mirror agent does not depend on it.

pub mod control;
pub mod fuse;
#[cfg(test)]
mod fuzz_tests;
pub mod guard;
mod loops;
pub mod metrics;
pub mod mounts;
pub mod vfs;
mod writer;

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct MountOptions {
    pub mountpoint: PathBuf,
    pub read_only: bool,
    pub buffer_size: u64,
    pub max_readahead: u64,
    pub attr_cache: Duration,
    pub entry_cache: Duration,
    pub dir_entry_cache: Duration,
    pub open_cache: Duration,
    pub metrics: Option<SocketAddr>,
    pub allow_other: bool,
    /// FUSE request loops.
    pub threads: usize,
    /// A mirror site: what opens do while the mirror is out of its window.
    pub stale: vfs::Stale,
    /// Hand read-only opens of files held whole in the local cache to the kernel (FUSE
    /// passthrough) where the kernel and the mount's rights allow it.
    pub passthrough: bool,
}

/// Check the mount point: a directory, not mounted by a live process; a stale FUSE mount
/// (its process killed) is cleared. Returns the canonical path. With `warn_hidden`, says
/// what a mount over a non-empty directory hides (`jfs mount -d` leaves that to the mount
/// process, whose warnings it relays, so that it is said once).
pub fn prepare_mountpoint(mp: &Path, warn_hidden: bool) -> Result<PathBuf> {
    // Another user's link would choose what the mount hides (`/etc`, say).
    if let Some(why) = cli_common::private::foreign_link(mp) {
        bail!("mount point: {why}");
    }
    if mounts::is_stale(mp) {
        tracing::warn!(
            mountpoint = %mp.display(),
            "a stale mount (its process is gone) is at the mount point: clearing it"
        );
        mounts::lazy_unmount(mp)?;
    }
    match std::fs::metadata(mp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "mount point {} does not exist: create the directory first (mkdir -p {})",
            mp.display(),
            mp.display()
        ),
        Err(e) => bail!("mount point {}: {e}", mp.display()),
        Ok(m) if !m.is_dir() => bail!("mount point {} is not a directory", mp.display()),
        Ok(_) => {}
    }
    let canon = mp
        .canonicalize()
        .with_context(|| format!("mount point {}", mp.display()))?;
    if let Some(m) = mounts::find(&canon)? {
        bail!(
            "{} is already mounted ({} {}): unmount it first (jfs umount {})",
            canon.display(),
            m.fstype,
            m.source,
            canon.display()
        );
    }
    // Mounting over files hides them (they are not lost, only out of sight until the
    // unmount): said, so that a mistyped mount point is noticed.
    let listed = if warn_hidden {
        std::fs::read_dir(&canon).ok()
    } else {
        None
    };
    if let Some(rd) = listed {
        let names: Vec<String> = rd
            .flatten()
            .take(4)
            .map(|e| cli_common::names::quote(e.file_name().as_encoded_bytes()))
            .collect();
        if !names.is_empty() {
            tracing::warn!(
                mountpoint = %canon.display(),
                "the mount point is not empty: what it holds ({}{}) is hidden while the volume is mounted over it (not lost: it shows again after unmounting); mount on an empty directory unless that is what you mean",
                names[..names.len().min(3)].join(", "),
                if names.len() > 3 { ", ..." } else { "" }
            );
        }
    }
    Ok(canon)
}

/// Raise the kernel's read-ahead of the mount (its bdi) so sequential reads reach the
/// daemon as 1 MiB requests, several at a time; needs root, best effort. 16 MiB: a model
/// loaded through mmap (safetensors) faults in that much per miss, which measured 0.79x of
/// local disk against 0.70x with 4 MiB; plain reads were the same with either.
pub fn raise_kernel_readahead(mp: &Path, kb: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mp) else { return };
    let dev = m.dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let p = format!("/sys/class/bdi/{maj}:{min}/read_ahead_kb");
    if let Err(e) = std::fs::write(&p, kb.to_string()) {
        tracing::info!(path = %p, error = %e, "could not raise the kernel read-ahead (needs root); sequential reads use 128 KiB requests");
    }
}

/// Whether this process may lend the kernel backing files (FUSE passthrough): root, with
/// CAP_SYS_ADMIN, in the host's user namespace.
fn passthrough_rights() -> std::result::Result<(), &'static str> {
    if !rustix::process::geteuid().is_root() {
        return Err("the mount does not run as root");
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap_eff & (1 << 21) == 0 {
        return Err("the mount lacks CAP_SYS_ADMIN");
    }
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let whole = map.split_whitespace().collect::<Vec<_>>().as_slice() == ["0", "0", "4294967295"];
    if !whole {
        return Err("the mount runs in a user namespace (a container's root is not the host's)");
    }
    Ok(())
}

/// The mount's kernel read-ahead (see `raise_kernel_readahead`).
pub const KERNEL_READAHEAD_KB: u64 = 16 << 10;
/// How often a read-only mount catches up with its metadata's writer (well inside a
/// mirror's consistency window, 1 s by default).
/// How long the mount's background loops may take to stop.
const WORKERS_DRAIN: Duration = Duration::from_secs(5);
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// How often a mirror mount publishes the blocks it read from the origin.
const WANT_EVERY: Duration = Duration::from_millis(250);

/// Mount `vol` at `o.mountpoint` and serve until unmounted or signalled. `ready` is called
/// once the mount answers.
pub async fn run(vol: volume::Volume, o: MountOptions, ready: impl FnOnce()) -> Result<()> {
    // Listening from the start: a SIGTERM at any moment after this, even one sent the
    // instant the mount answers, ends it cleanly.
    let signalled = cli_common::shutdown_on_signals("signalled: committing buffers and unmounting");
    let mp = prepare_mountpoint(&o.mountpoint, false)?;
    let volume::Volume {
        mut fs,
        site,
        store,
        metrics: store_metrics,
        origin_metrics,
        wanted,
        storage,
        follower,
    } = vol;
    if let volume::Site::Mirror {
        name,
        store,
        origin,
        fallback,
    } = &site
    {
        tracing::info!(mirror = %name, %store, %origin, fallback, "a mirror site: blocks come from the mirror store, and those not yet copied from the origin");
    }
    // The session (heartbeat, and at a primary the storage generation it acknowledges):
    // opened with the volume when the caller named it, else registered here.
    let engine = fs.engine().clone();
    let follower = match follower {
        Some(f) => f,
        None => volume::Follower::start(
            engine.clone(),
            None,
            storage,
            fs_core::session::Session::new(&mp.to_string_lossy(), o.read_only),
        )
        .await
        .context("registering the mount's session in the metadata")?,
    };
    let sid = follower.session_id().to_string();
    let open = vfs::OpenFiles::new(sid.clone());
    fs.set_keeper(open.clone());
    fs.set_setgid_inherit(true);
    fs.set_dir_attr_cache(o.attr_cache);
    let fs = Arc::new(fs);
    // The mount's background loops, under one supervisor stopped with the mount.
    let workers = background::Supervisor::new(background::CancellationToken::new());
    // At a mirror: publish the blocks read from the origin, for the agent to copy first.
    let publishing = wanted.is_some();
    if let Some(w) = wanted {
        workers.spawn(loops::WantPublisher::new(
            engine.clone(),
            sid.clone(),
            w,
            WANT_EVERY,
        ));
    }
    // The primary's background work: metadata backups, when it is this mount's turn
    // (`volume::backup`). Never at a mirror, never from a read-only mount.
    if !o.read_only && !matches!(site, volume::Site::Mirror { .. }) {
        workers.spawn(volume::backup::BackupWorker::new(
            engine.clone(),
            fs.store().clone(),
            Some(sid.clone()),
        ));
    }
    let res = serve(
        fs.clone(),
        &site,
        store,
        (store_metrics, origin_metrics),
        open,
        &o,
        &mp,
        &workers,
        ready,
        signalled,
    )
    .await;
    for w in workers.shutdown(WORKERS_DRAIN).await {
        tracing::warn!(worker = %w, "a background loop did not stop in time");
    }
    if publishing {
        let _ = fs_core::site::set_want(&*engine, &sid, None).await;
    }
    follower.close().await;
    res
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    fs: Arc<fs_core::Fs>,
    site: &volume::Site,
    store: Arc<volume::CachedStore>,
    (store_metrics, origin_metrics): (Arc<volume::StoreMetrics>, Option<Arc<volume::StoreMetrics>>),
    open: Arc<vfs::OpenFiles>,
    o: &MountOptions,
    mp: &Path,
    workers: &background::Supervisor,
    ready: impl FnOnce(),
    signalled: tokio_util::sync::CancellationToken,
) -> Result<()> {
    // Only at the primary: a mirror's sessions are its own, and the primary's kept inodes
    // name sessions a mirror never sees.
    if !o.read_only && !matches!(site, volume::Site::Mirror { .. }) {
        let fs = fs.clone();
        tokio::spawn(async move {
            match fs.reap_sessions(fs_core::session::DEFAULT_TIMEOUT).await {
                Ok(r) if r.sessions > 0 || r.inodes > 0 => tracing::info!(
                    sessions = r.sessions,
                    inodes = r.inodes,
                    "freed the files dead mounts kept open"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reaping dead sessions failed"),
            }
        });
    }
    let mm = Arc::new(metrics::MountMetrics::default());
    let vfs = vfs::Vfs::new(
        fs.clone(),
        open,
        vfs::VfsConfig {
            read_only: o.read_only,
            max_readahead: o.max_readahead,
            buffer_size: o.buffer_size,
            open_cache: o.open_cache,
            pin_versions: matches!(site, volume::Site::Mirror { .. }),
            stale: o.stale,
        },
        mm.clone(),
    );
    let vfs = Arc::new(match (store.cache(), o.passthrough) {
        (Some(c), true) => match passthrough_rights() {
            Ok(()) => vfs.with_passthrough(c.clone()),
            Err(why) => {
                tracing::warn!("FUSE passthrough is off: {why} (the kernel lends backing files to CAP_SYS_ADMIN of the host only); reads go through the mount");
                vfs
            }
        },
        _ => vfs,
    });
    let ffs = fuse::FuseFs {
        vfs: vfs.clone(),
        rt: tokio::runtime::Handle::current(),
        ttl: fuse::Ttls {
            attr: o.attr_cache,
            entry: o.entry_cache,
            dir_entry: o.dir_entry_cache,
        },
        blksize: 1 << 20,
    };
    let mut mopts = vec![
        fuser::MountOption::FSName(format!("jfs:{}", fs.settings().name)),
        // As a kernel option, not fuser's Subtype: without AutoUnmount root mounts with
        // mount(2) directly, where fuser drops Subtype and the table would say "fuse"
        // (fusermount3 takes the same option text).
        fuser::MountOption::CUSTOM("subtype=jfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    if o.read_only {
        mopts.push(fuser::MountOption::RO);
    }
    // Without --allow-other the kernel itself refuses other users (no `allow_other` in the
    // mount table): fuser's allow_root passes `allow_other` to the kernel and filters in this
    // process, where requests the kernel answers from its caches (a stat of cached
    // attributes) never arrive, so other users saw them. fusermount3's AutoUnmount needs
    // `allow_other`, so such a mount goes without it: the mount guard (`guard`, started
    // below either way) removes the mount of a killed process; with --allow-other both do.
    // The trade: root cannot use a non-root user's mount without --allow-other, as with any
    // FUSE mount by default.
    let acl = if o.allow_other {
        mopts.push(fuser::MountOption::AutoUnmount);
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    let mut cfg = fuser::Config::default();
    cfg.mount_options = mopts;
    cfg.acl = acl;
    cfg.n_threads = Some(o.threads.max(1));
    cfg.clone_fd = o.threads > 1;
    // Bound before mounting: a busy address refuses the mount with nothing left behind.
    let metrics_listener = match o.metrics {
        Some(addr) => Some((
            addr,
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics {addr}"))?,
        )),
        None => None,
    };
    // Started before mounting, so it holds none of the FUSE descriptors.
    let mut guard = guard::spawn(mp)?;
    let mp2 = mp.to_path_buf();
    let fsession = tokio::task::spawn_blocking(move || fuser::Session::new(ffs, &mp2, &cfg))
        .await?
        .with_context(|| {
            format!(
                "mounting {} (is fuse3 installed, /dev/fuse present?)",
                mp.display()
            )
        })?;
    // fuser unmounts the mount point once more when its handle of the mount is dropped (at
    // the end of `Session::run`): after a clean unmount (ours below, or `jfs umount`'s) the
    // mount point is no longer a mount, and every clean unmount logged "Failed to umount
    // filesystem: Invalid argument" (had another file system been mounted there meanwhile,
    // that one would have been unmounted). Its check for a mount already gone is no help:
    // fuser 0.18 takes POLLERR on /dev/fuse (the connection ended) for "still mounted". Every
    // unmount is ours (`mounts`, fusermount3 or umount(8)), so the handle is taken out of the
    // session (`spawn`) and never dropped: the thread's handle is swapped out and the rest
    // forgotten (a file descriptor and a path, until this process exits).
    let mut bg = fsession.spawn().context("starting the FUSE session")?;
    let session = std::mem::replace(&mut bg.guard, std::thread::spawn(|| Ok(())));
    std::mem::forget(bg);
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let r = session
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the FUSE session thread panicked")));
            let _ = done_tx.send(r);
        })?;
    raise_kernel_readahead(mp, KERNEL_READAHEAD_KB);
    match mounts::find(mp) {
        Ok(Some(m)) if m.is_jfs() => guard.arm(&m.dev),
        _ => {
            tracing::warn!("the new mount is not in the mount table; the mount guard is not armed")
        }
    }

    // The control socket.
    let exporter = Arc::new(metrics::Exporter::new(
        &mm,
        &store_metrics,
        origin_metrics.as_ref(),
    ));
    // In a run directory that is this user's alone, 0600 from its first moment, and each
    // peer checked (see `control`).
    let sock = control::socket_path_in(&control::private_run_dir()?, mp);
    let _ = std::fs::remove_file(&sock);
    let listener = control::bind_private(&sock)
        .with_context(|| format!("binding the control socket {}", sock.display()))?;
    let (exit_tx, mut exit_rx) = tokio::sync::mpsc::channel::<bool>(1);
    let ctl = Arc::new(control::Ctl {
        vfs: vfs.clone(),
        store: store.clone(),
        exporter: exporter.clone(),
        mountpoint: mp.to_path_buf(),
        exit: exit_tx,
    });
    let ctl_task = tokio::spawn(control::serve(listener, ctl));
    let metrics_task = match metrics_listener {
        Some((addr, l)) => {
            let ex = exporter.clone();
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let ex = ex.clone();
                    async move { ex.text() }
                }),
            );
            tracing::info!(%addr, "metrics at http://{addr}/metrics");
            Some(tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            }))
        }
        None => None,
    };
    // A read-only view follows its writer: a RocksDB secondary catches up with it, and the
    // applied sequence number (a mirror's agent's progress) is published. A mirror's view is
    // read-only here even when its mount writes through to the primary.
    let mirror = matches!(site, volume::Site::Mirror { .. });
    if !o.read_only && !mirror {
        workers.spawn(loops::TrashPurger::new(fs.clone()));
    }
    if o.read_only || mirror {
        mm.mirror_site.set(mirror as i64);
        workers.spawn(loops::ReadOnlyFollower::new(
            fs.engine().clone(),
            mm.clone(),
            mirror,
            vfs.freshness.clone(),
            FOLLOW_EVERY,
        ));
    }
    tracing::info!(mountpoint = %mp.display(), read_only = o.read_only, "mounted");
    ready();

    // Ok(session result), or Err(now): asked to stop (now: without waiting for open files).
    let result = tokio::select! {
        r = &mut done_rx => Ok(r),
        _ = signalled.cancelled() => Err(false),
        now = exit_rx.recv() => Err(now.unwrap_or(false)),
    };
    let result = match result {
        Ok(r) => r,
        Err(now) => {
            tracing::info!(now, "asked to stop: committing buffers and unmounting");
            vfs.flush_all().await;
            if let Err(e) = mounts::unmount(mp) {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "unmount failed (files open?); detaching lazily"
                );
                let _ = mounts::lazy_unmount(mp);
            }
            // AutoUnmount's fusermount3 unmounts once the session's socket closes; ask
            // the kernel directly too, so the session loop ends.
            if mounts::find(mp).ok().flatten().is_some() {
                let _ = mounts::lazy_unmount(mp);
            }
            // Files still open keep a lazily detached session going: wait for them a while,
            // or not at all when asked to stop now (their next calls fail once we exit).
            let wait = if now {
                Duration::ZERO
            } else {
                Duration::from_secs(30)
            };
            match tokio::time::timeout(wait, &mut done_rx).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(
                        "the FUSE session did not end within {wait:?} (files open); exiting anyway"
                    );
                    Ok(Ok(()))
                }
            }
        }
    };
    vfs.flush_all().await;
    ctl_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    let _ = std::fs::remove_file(&sock);
    tracing::info!(mountpoint = %mp.display(), "unmounted");
    match result {
        Ok(Ok(())) => Ok(()),
        // A reader that took a request just as an unmount tore the connection down gets
        // ECONNABORTED instead of ENODEV: the same end (so is an abort through fusectl).
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::info!("the FUSE connection was closed while a request was being read");
            Ok(())
        }
        Ok(Err(e)) => Err(e).context("the FUSE session failed"),
        Err(_) => bail!("the FUSE session thread ended without a result"),
    }
}
