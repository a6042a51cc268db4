//! One way to open a volume, used by every binary: the metadata engine a META_URL names, the
//! block store (the volume's storage URL, or an override) composed of layers, and the checks
//! that decide whether this caller may use the volume at all:
//!
//! - a mirror that is bootstrapping has an incomplete tree: nobody reads it (the mirror
//!   agent, which builds it, opts out with `allow_incomplete`);
//! - a mirror's metadata is read-only: a writer is refused at open with one line saying whose
//!   mirror it is (the engines refuse the commits themselves too, see `fs_core::site`).
//!
//! The store stack is composed in one place, bottom to top (see `stack`): the raw store,
//! limits, metering, then placement at a primary (a `StorageHolder` that follows the volume's
//! storage record: one store, or the dual write of a cutover) or the origin fallback at a
//! mirror, then the read layer (local disk cache, one fetch per block).
//!
//! Writers register a session that acknowledges the storage generation they write by (the
//! cutover's barrier waits for it); a caller that wants a session for a reader (a mount)
//! names it with `Options::session`.
//!
//! # The stack in detail
//!
//! `open(META_URL, Options)` opens the engine (read: a RocksDB secondary; write: the writer),
//! applies the checks every binary needs, and composes the block store in one place (the
//! backend, metrics, the local cache, and at a mirror site the origin fallback; the dual-write
//! layer of a cutover). `Volume.site` says which: a primary's own store,
//! or a mirror (its marker names the mirror store and the origin).
//! Invariants: a bootstrapping mirror (its `mirror.incomplete` fence) is opened by nobody but
//! the agent (`allow_incomplete`); a writer is refused at open on a mirror's metadata, with the
//! line the engines would give at commit. Used by `jfs`, `jfs-sync`'s volume endpoint and the
//! agents.
//!
//! The store is composed in layers: the backend, `MeteredStore` (count, bytes, latency,
//! errors as Prometheus metrics), then `CachedStore` (the local disk cache `DiskCache`:
//! checksummed files, LRU rebuilt at start, capacity and free-space floor with room reserved
//! before a write, singleflight fetches and bounded background fills). Invariants: every layer
//! passes `get_block(key, BlockCheck)` down (never turns it into a plain `get`), so the layer
//! that keeps a copy checks it; a cache file that fails its own check or the slice's recorded
//! CRC32C is removed and never served. At a mirror (metadata with a mirror marker, opened to
//! read, not by the agent), `FallbackStore` sits between the metered mirror store and the
//! cache: NotFound at the mirror, or a mirror copy that fails its checksum (counted), reads the
//! origin (one fetch per block, checked, bounded by `--origin-timeout`), serves it and fills the
//! mirror store in the background (an atomic put over any damaged copy, so a killed process
//! leaves no torn block); it refuses put/delete.
//!
//! At a primary the backend is a `StorageHolder` (`placement.rs`): the stores the storage
//! record names, one store or a `DualStore` (puts to both, waiting for the primary; a block the
//! secondary did not take within max(2 s, the primary's time) goes to the repair list before the
//! put returns; reads fall to the secondary on NotFound only), swapped when the record's
//! generation changes. It is fs-core's `StorageFollow` for the writers. Every writer (and any
//! opener that names a session, as mounts do) runs a `Follower`: the session record, re-read
//! of the record every 500 ms, the acknowledgement of the generation at once, the heartbeat,
//! and `degraded` while the writer's puts to the other store fail (`WriterHealth`, shown by
//! `jfs cutover status`).
//! At a mirror the origin is a `StorageHolder` over the replicated record too, so a cutover at
//! the primary moves where the mirror falls back to (unless `origin_store` is named by hand).
//!
//! `moving.rs`: a mount opens its engine as a `MovingEngine` (`Options.follow_moves`). When
//! the metadata carries `volume.moved`, the session's follower probes the new META_URL
//! read-only and, once it is promoted at that epoch, swaps the engine in place (inode numbers
//! are equal on both sides, so the kernel's inodes and open files stay valid). A commit refused
//! with `ReadOnly` while a move is recorded waits (at most `MOVE_WAIT`, 120 s) and commits at the
//! new primary; a refusal with no move recorded is final. A move to embedded metadata
//! (`rocksdb://`, the new primary's site's own) is never followed nor opened: such a mount
//! stays on the fenced metadata, read-only, its commits refused at once with what to do.

pub mod backup;
mod cache;
mod cached;
mod fallback;
mod follower;
pub mod forward;
mod limited;
mod metered;
mod metrics;
pub mod moving;
pub mod placement;
mod stack;
mod whole;

pub use cache::{CacheConfig, CacheUsage, DiskCache};
pub use cached::CachedStore;
pub use fallback::{FallbackStore, Wanted, ORIGIN_TIMEOUT};
pub use follower::{end_sessions, Follower};
pub use forward::ForwardingEngine;
pub use limited::{Charge, LimitedStore};
pub use metered::MeteredStore;
pub use metrics::StoreMetrics;
pub use moving::MovingEngine;
pub use placement::{DualStore, StorageHolder, WriterHealth};
pub use stack::StoreBuilder;
pub use whole::WholeWriter;

use fs_core::error::{Error, ErrorKind, Result};
use fs_core::{BlockStore, Engine, Fs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What the caller will do with the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Reads only. A RocksDB volume is opened as a secondary instance beside its writer.
    #[default]
    Read,
    /// Writes: the one RocksDB writer; refused on a mirror's metadata.
    Write,
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub access: Access,
    /// The metadata engine's password, from this file (else the environment).
    pub password_file: Option<PathBuf>,
    /// S3 endpoint for the block store (else from the URL or AWS_ENDPOINT_URL).
    pub endpoint: Option<String>,
    /// Read blocks from this store instead of the volume's own (a mirror site's store).
    pub block_store: Option<String>,
    /// Open a mirror's metadata while a snapshot is being installed (the mirror agent only).
    pub allow_incomplete: bool,
    /// Block transfers in flight per read or write call (0: fs-core's default).
    pub io_parallel: usize,
    /// A local disk cache of blocks (the mount, `jfs get`).
    pub cache: Option<CacheConfig>,
    /// At a mirror site: the store blocks not yet copied are read from (else the one the
    /// mirror marker records, else the volume's storage URL).
    pub origin_store: Option<String>,
    /// At a mirror site: a block not yet copied is an error instead of an origin read.
    pub no_fallback: bool,
    /// At a mirror site: how long an origin read may take (default `ORIGIN_TIMEOUT`).
    pub origin_timeout: Option<std::time::Duration>,
    /// Register a session under this label (a mount point; writers get one anyway, labelled
    /// by their command line).
    pub session: Option<String>,
    /// Follow the volume when its primary moves to another metadata (see `moving`): a
    /// long-running opener (a mount).
    pub follow_moves: bool,
    /// At a mirror site whose primary lets it write: the mirror agent's forward socket. The
    /// volume is opened to read here (`Access::Read`) and its commits go to the primary
    /// (`forward`); blocks go where the primary's storage record says.
    pub forward: Option<PathBuf>,
}

/// Where a volume's blocks are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// The volume's own store (a primary, or a store named with `--storage`).
    Primary { store: String },
    /// A mirror site: its own store, falling back to the origin for blocks not yet copied.
    Mirror {
        name: String,
        store: String,
        origin: String,
        fallback: bool,
    },
}

/// An opened volume with the handles on its store stack.
pub struct Volume {
    pub fs: Fs,
    pub site: Site,
    /// The top of the stack (the local cache lives here).
    pub store: Arc<CachedStore>,
    pub metrics: Arc<StoreMetrics>,
    /// At a mirror site: the calls that reached the origin store (metered apart).
    pub origin_metrics: Option<Arc<StoreMetrics>>,
    /// At a mirror site with fallback: the blocks read from the origin (see `Wanted`).
    pub wanted: Option<Arc<Wanted>>,
    /// At a primary: the stores of the current storage generation.
    pub storage: Option<Arc<StorageHolder>>,
    /// The session of this opener, when it has one.
    pub follower: Option<Follower>,
}

impl Volume {
    /// Remove the session record (the process goes on without one).
    pub async fn close(&mut self) {
        if let Some(f) = self.follower.take() {
            f.close().await;
        }
    }
}

/// The label of a writer's session: its command line, shortened.
fn process_label() -> String {
    let mut s: String = std::env::args().take(3).collect::<Vec<_>>().join(" ");
    s.truncate(120);
    s
}

/// Open the metadata engine alone. `create` makes an empty RocksDB database where none exists
/// (`format` and `load`, and the mirror agent on its own metadata).
pub async fn open_engine(
    meta_url: &str,
    access: Access,
    password_file: Option<PathBuf>,
    create: bool,
) -> Result<Arc<dyn Engine>> {
    let opened = meta::open(
        meta_url,
        &meta::OpenOptions {
            read_only: access == Access::Read,
            create,
            password_file: password_file.clone(),
        },
    )
    .await;
    match opened {
        // A RocksDB volume another process writes: when that is a mirror's metadata (its
        // agent applies the journal), the refusal names the mirror and its primary, as every
        // writer's refusal at a mirror does, instead of advising to stop that process.
        Err(e) if e.kind() == ErrorKind::Busy && access == Access::Write => {
            let reader = meta::open(
                meta_url,
                &meta::OpenOptions {
                    read_only: true,
                    create: false,
                    password_file,
                },
            )
            .await;
            match reader {
                // A read-write mount holds it (a fenced old primary's own mount, say): that,
                // not the fence, is what stops this writer, and unmounting is what to do.
                Ok(r) => match writing_mount(&*r).await {
                    Some(s) => Err(locked_by_mount(&r.display_url(), &s)),
                    None => match fs_core::site::marker(&*r).await {
                        Ok(Some(_)) => Err(fs_core::site::refusal(&*r).await),
                        _ => Err(e),
                    },
                },
                Err(_) => Err(e),
            }
        }
        r => r,
    }
}

/// The live read-write mount of this host that holds a RocksDB volume's one writer lock, by
/// its session (None: none, or the metadata is not RocksDB's).
pub async fn writing_mount(engine: &dyn Engine) -> Option<fs_core::session::Session> {
    if engine.kind() != "rocksdb" {
        return None;
    }
    let now = fs_core::now_ns();
    fs_core::session::list(engine)
        .await
        .ok()?
        .into_iter()
        .find(|s| s.is_local_writer() && s.is_live(now, fs_core::session::DEFAULT_TIMEOUT))
}

/// The refusal of a second writer while a read-write mount holds a RocksDB volume.
pub fn locked_by_mount(url: &str, s: &fs_core::session::Session) -> Error {
    Error::new(
        ErrorKind::Busy,
        format!(
            "{url} is locked by a running read-write mount at {mp} (pid {}): a RocksDB volume has one writing process; unmount it first (`jfs umount {mp}`), then start again",
            s.pid,
            mp = cli_common::names::quote(s.mountpoint.as_bytes()),
        ),
    )
}

/// Open an existing block store by URL, composed with this crate's layers.
pub fn open_store(url: &str, endpoint: Option<&str>) -> Result<Arc<dyn BlockStore>> {
    store(url, endpoint, false)
}

/// Open a block store, creating a `file://` store's directory if needed (`jfs format`, a
/// mirror agent's own store).
pub fn create_store(url: &str, endpoint: Option<&str>) -> Result<Arc<dyn BlockStore>> {
    store(url, endpoint, true)
}

fn store(url: &str, endpoint: Option<&str>, create: bool) -> Result<Arc<dyn BlockStore>> {
    let opts = objstore::StoreOptions {
        endpoint: endpoint.map(str::to_string),
        region: None,
        create,
    };
    Ok(Arc::new(objstore::OpendalStore::open(url, &opts)?))
}

/// The checks of `open` on an engine opened elsewhere: the bootstrap fence, and for writers
/// the mirror marker.
pub async fn check_site(engine: &dyn Engine, access: Access, allow_incomplete: bool) -> Result<()> {
    if !allow_incomplete {
        if let Some(what) = fs_core::slots::incomplete(engine).await? {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{} is a mirror that is bootstrapping ({what}): its tree is incomplete until it has caught up; wait for it (`mirror-agent status --wait-applied SEQ`) or read at the primary",
                    engine.display_url()
                ),
            ));
        }
    }
    if access == Access::Write {
        if fs_core::site::marker(engine).await?.is_some() {
            return Err(fs_core::site::refusal(engine).await);
        }
    }
    Ok(())
}

/// At a mirror site, its marker and whether its mounts may write and how: the agent's forward socket when
/// the primary lets this mirror write and the agent says so now (its progress record is
/// fresh and the socket exists), else why not.
/// None when META_URL's metadata is not a mirror's; one open of the engine for both.
pub async fn mirror_writes(
    meta_url: &str,
    password_file: Option<PathBuf>,
) -> Result<
    Option<(
        fs_core::site::MirrorMarker,
        std::result::Result<PathBuf, String>,
    )>,
> {
    let engine = open_engine(meta_url, Access::Read, password_file, false).await?;
    let Some(marker) = fs_core::site::marker(&*engine).await? else {
        return Ok(None);
    };
    Ok(Some((marker, forward_socket(&*engine).await?)))
}

async fn forward_socket(engine: &dyn Engine) -> Result<std::result::Result<PathBuf, String>> {
    let Some(p) = fs_core::site::progress(engine).await? else {
        return Ok(Err("no mirror agent has run at this site yet".into()));
    };
    let age = Duration::from_nanos(fs_core::now_ns().saturating_sub(p.at_ns).max(0) as u64);
    if age > Duration::from_secs(30) {
        return Ok(Err(format!(
            "this site's mirror agent last reported {}s ago (is it running?)",
            age.as_secs()
        )));
    }
    Ok(match (p.forward_socket, p.writes_refused) {
        (Some(s), _) if Path::new(&s).exists() => Ok(PathBuf::from(s)),
        (Some(s), _) => Err(format!("the agent's forward socket {s} is missing")),
        (None, Some(why)) => Err(why),
        (None, None) => {
            Err("the agent has not heard from the primary whether this mirror may write".into())
        }
    })
}

/// Show that `store` takes writes now: a small object under the volume's prefix (as `jfs
/// cutover`'s probe: no block key), put, read back and deleted. Err says why not.
pub async fn prove_writable(store: &dyn BlockStore, volume_name: &str) -> Result<()> {
    let key = format!("{volume_name}/jfs_probe_{:016x}", rand::random::<u64>());
    let body = bytes::Bytes::from(format!("jfs write probe {}", fs_core::now_ns()));
    store.put(&key, body.clone()).await?;
    let back = store.get(&key).await;
    let _ = store.delete(&key).await;
    if back? != body {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{key} read back different bytes"),
        ));
    }
    Ok(())
}

/// At a mirror whose mounts may write through to the primary: whether this host can write
/// where their blocks go, the origin's stores by the primary's storage record (replicated
/// here), as `open_volume` would place them. A mount that could not would come up read-write
/// and fail every close with EIO, leaving empty files at every site (the commit of the create
/// goes through, the blocks never do). Err(why) when it cannot.
pub async fn origin_writable(
    meta_url: &str,
    password_file: Option<PathBuf>,
    endpoint: Option<String>,
) -> Result<std::result::Result<(), String>> {
    let engine = open_engine(meta_url, Access::Read, password_file, false).await?;
    let settings = Fs::load_settings(&*engine).await?;
    let stores = StoreBuilder::new(endpoint, Arc::new(StoreMetrics::default()));
    let h = StorageHolder::open(engine, stores, &settings.storage).await?;
    Ok(prove_writable(&*h, &settings.name).await.map_err(|e| {
        format!(
            "this host cannot write the origin store {} where this mirror's mounts put their blocks: {e}",
            h.display_url()
        )
    }))
}

/// Open a volume: engine, settings, block store, with the checks above.
pub async fn open(meta_url: &str, o: &Options) -> Result<Fs> {
    let engine = open_engine(meta_url, o.access, o.password_file.clone(), false).await?;
    open_on(engine, o).await
}

/// `open` over an engine the caller already holds. A writer's session lives as long as the
/// returned `Fs` (its storage holder keeps it).
pub async fn open_on(engine: Arc<dyn Engine>, o: &Options) -> Result<Fs> {
    let mut v = open_volume_on(engine, o).await?;
    if let (Some(h), Some(f)) = (&v.storage, v.follower.take()) {
        h.keep(f);
    }
    Ok(v.fs)
}

/// Open a volume and keep the handles on its store stack (cache, metrics).
pub async fn open_volume(meta_url: &str, o: &Options) -> Result<Volume> {
    let engine = open_engine(meta_url, o.access, o.password_file.clone(), false).await?;
    open_volume_on(engine, o).await
}

/// `open_volume` over an engine the caller already holds.
pub async fn open_volume_on(engine: Arc<dyn Engine>, o: &Options) -> Result<Volume> {
    check_site(&*engine, o.access, o.allow_incomplete).await?;
    let mover = o
        .follow_moves
        .then(|| MovingEngine::new(engine.clone(), o.access, o.password_file.clone()));
    let engine: Arc<dyn Engine> = match &mover {
        Some(m) => m.clone(),
        None => engine,
    };
    let settings = Fs::load_settings(&*engine).await?;
    // A mirror's reads (never its agent's, which opens it `allow_incomplete` and copies with
    // stores of its own) go to the mirror's store, falling back to the origin.
    let marker = if o.access == Access::Read && !o.allow_incomplete {
        fs_core::site::marker(&*engine).await?
    } else {
        None
    };
    let metrics = Arc::new(StoreMetrics::default());
    let stores = StoreBuilder::new(o.endpoint.clone(), metrics.clone());
    let mut origin_metrics = None;
    let mut wanted = None;
    let mut holder: Option<Arc<StorageHolder>> = None;
    // At a mirror: the origin's stores, followed by the session (not a write placement).
    let mut origin_holder: Option<Arc<StorageHolder>> = None;
    // At a mirror: its own store (a writing mount also puts its blocks there).
    let mut mirror_store: Option<Arc<dyn BlockStore>> = None;
    let (site, metered): (Site, Arc<dyn BlockStore>) = match marker {
        Some(m) => {
            let store_url = o.block_store.clone().unwrap_or(m.store.clone());
            let fixed_origin = o.origin_store.clone().or(m.origin_store.clone());
            let origin_url = fixed_origin.clone().unwrap_or(settings.storage.clone());
            let mirror = stores
                .open(&store_url)
                .map_err(|e| e.context(format!("opening mirror {:?}'s block store", m.name)))?;
            mirror_store = Some(mirror.clone());
            let site = Site::Mirror {
                name: m.name.clone(),
                store: store_url.clone(),
                origin: origin_url.clone(),
                fallback: !o.no_fallback && origin_url != store_url,
            };
            if origin_url == store_url {
                (site, mirror)
            } else {
                // Unless named by hand, the origin is where the primary's storage record
                // (replicated here) says its blocks are: it follows a cutover there. Its
                // calls are metered apart (`origin_metrics`).
                let om = Arc::new(StoreMetrics::default());
                origin_metrics = Some(om.clone());
                let origins = StoreBuilder::new(o.endpoint.clone(), om);
                let origin: Arc<dyn BlockStore> = match &fixed_origin {
                    Some(url) => origins
                        .open(url)
                        .map_err(|e| e.context("opening the origin store"))?,
                    None => {
                        let h = StorageHolder::open(engine.clone(), origins, &settings.storage)
                            .await
                            .map_err(|e| e.context("opening the origin store"))?;
                        origin_holder = Some(h.clone());
                        h
                    }
                };
                let fb = FallbackStore::new(mirror, origin, !o.no_fallback, metrics.clone())
                    .with_timeout(o.origin_timeout.unwrap_or(ORIGIN_TIMEOUT));
                wanted = Some(fb.wanted());
                (site, Arc::new(fb))
            }
        }
        None => match &o.block_store {
            // A store named by hand: that store alone (writes are fenced during a cutover).
            Some(url) => {
                let store = stores
                    .open(url)
                    .map_err(|e| e.context("opening the volume's block store"))?;
                (Site::Primary { store: url.clone() }, store)
            }
            None => {
                let h = StorageHolder::open(engine.clone(), stores, &settings.storage).await?;
                holder = Some(h.clone());
                (
                    Site::Primary {
                        store: settings.storage.clone(),
                    },
                    h,
                )
            }
        },
    };
    let cache = match &o.cache {
        Some(c) if c.capacity > 0 => Some(DiskCache::open(
            c,
            &settings.name,
            &settings.uuid,
            metrics.clone(),
        )?),
        _ => None,
    };
    let store = Arc::new(CachedStore::new(metered, cache, metrics.clone()));
    // A writer's metadata must still hold the store (a `jfs load` of a dump takes it over).
    if o.access == Access::Write && !o.allow_incomplete {
        // At a mirror the store fills as its copier runs: an empty one is no sign of a
        // wrong path there.
        let used = match &site {
            Site::Primary { .. } => {
                let v = engine.get(fs_core::keys::USED_SPACE).await?;
                fs_core::journal::parse_counter(v.as_deref())?.max(0) as u64
            }
            _ => 0,
        };
        fs_core::owner::check_holder(&*store, &settings, used).await?;
        if let Site::Primary { store } = &site {
            if let Some(why) = local_places_problem(&engine.display_url(), store) {
                return Err(Error::new(ErrorKind::PermissionDenied, why));
            }
        }
    }
    // A mirror that writes through to its primary: commits are forwarded, blocks go to the
    // origin's stores by the primary's storage record (replicated here), so the write-order
    // invariant holds there (every block the journal references exists at the origin).
    let forwarding = match (&site, &o.forward) {
        (Site::Mirror { .. }, Some(sock)) => {
            let fwd: Arc<dyn Engine> = Arc::new(ForwardingEngine::new(engine.clone(), sock));
            let writes = StoreBuilder::new(o.endpoint.clone(), metrics.clone());
            let h = StorageHolder::open(engine.clone(), writes, &settings.storage)
                .await
                .map_err(|e| e.context("opening the origin store to write blocks to"))?;
            Some((fwd, h, sock.clone()))
        }
        _ => None,
    };
    let mut fs = match (&holder, &forwarding) {
        (_, Some((fwd, h, sock))) => {
            // Its own copy when the mirror has a store of its own; a refused origin write
            // is told to the agent either way (its status counts the site's failed writes).
            let placement: Arc<dyn fs_core::storage::StorageFollow> =
                Arc::new(forward::AlsoToMirror {
                    origin: h.clone(),
                    mirror: mirror_store
                        .as_ref()
                        .filter(|ms| ms.display_url() != h.display_url())
                        .cloned(),
                    report: sock.clone(),
                });
            Fs::open_following(fwd.clone(), store.clone(), placement).await?
        }
        (Some(h), None) => Fs::open_following(engine.clone(), store.clone(), h.clone()).await?,
        (None, None) => Fs::open(engine.clone(), store.clone()).await?,
    };
    if o.io_parallel > 0 {
        fs.io_parallel = o.io_parallel;
    }
    // Writers register a session (the cutover's barrier waits for it); readers when asked.
    let label = match (&o.session, o.access) {
        (Some(l), _) => Some(l.clone()),
        (None, Access::Write) if !o.allow_incomplete => Some(process_label()),
        _ => None,
    };
    let follower = match label {
        Some(l) => Some(
            Follower::start(
                engine,
                mover,
                holder
                    .clone()
                    .or(forwarding.as_ref().map(|(_, h, _)| h.clone()))
                    .or(origin_holder.clone()),
                // A mount writing through a mirror's agent is a writer, though not this
                // metadata's (its agent relays its session to the primary, where it keeps
                // what the mount holds open after an unlink).
                fs_core::session::Session {
                    forwarded: o.forward.is_some(),
                    ..fs_core::session::Session::new(
                        &l,
                        o.access == Access::Read && o.forward.is_none(),
                    )
                },
            )
            .await
            .map_err(|e| e.context("registering this process's session in the metadata"))?,
        ),
        None => None,
    };
    Ok(Volume {
        fs,
        site,
        store,
        metrics,
        origin_metrics,
        wanted,
        storage: holder,
        follower,
    })
}

/// What makes an embedded volume's local places (its RocksDB directory, a `file://` store)
/// unsafe to write, if anything: a directory of another user's (not root), one others may
/// write without the sticky bit, or one under a directory another user could change (ssh's
/// rule). That user could swap it for a directory of theirs and read every block written
/// there, or delete them.
pub fn local_places_problem(meta_url: &str, store_url: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let places = [
        ("metadata directory", meta::local_dir(meta_url)),
        (
            "block store",
            store_url
                .strip_prefix("file://")
                .map(std::path::PathBuf::from),
        ),
    ];
    for (what, dir) in places {
        let Some(dir) = dir else { continue };
        let why = match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.uid() != me && m.uid() != 0 => Some(format!(
                "{} belongs to uid {}, another user",
                dir.display(),
                m.uid()
            )),
            Ok(m)
                if !m.file_type().is_symlink()
                    && m.mode() & 0o022 != 0
                    && m.mode() & 0o1000 == 0 =>
            {
                Some(format!(
                    "{} has mode {:04o}: other users may change it",
                    dir.display(),
                    m.mode() & 0o7777
                ))
            }
            _ => cli_common::private::ancestors_problem(&dir),
        };
        if let Some(why) = why {
            return Some(format!(
                "the volume's {what}: {why}; another user could swap it for a directory of theirs and read or delete what is written there. Nothing was written: move it under a directory of your own (or chmod go-w, chown to this user)"
            ));
        }
    }
    None
}
