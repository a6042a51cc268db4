//! The embedded engine: RocksDB with three column families: `default` (the key space),
//! `journal` (big-endian seq -> frame) and `meta` (`head`).
//!
//! Commit section: a process-wide mutex around validate + assign seq + one atomic WriteBatch.
//! RocksDB lets one process open a database for writing. Readers (`jfs ls/get/journal`, later
//! the mirror's read-only mount) open it as a *secondary* instance that catches up with the
//! writer's WAL, so they never take the write lock: every commit is one atomic batch, so a
//! secondary sees whole transactions. A secondary learns that the writer committed from
//! inotify on the volume's directory (every commit writes the WAL there), so a follower
//! waiting for the next entry catches up at once; polling stays as the fallback.

use async_trait::async_trait;
use fs_core::engine::{CommitOutcome, Engine, JournalBounds, KvPair};
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::journal::{CommitRequest, Entry};
use rocksdb::{ColumnFamilyDescriptor, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

use crate::localdir::{aux_write, io_err, lock_holder};
pub use crate::localdir::{check_room, check_writer_room, DISK_FLOOR, WRITER_NEED};
use crate::localdir::{MANIFEST_PREALLOC, WRITE_BUFFER};

const CF_JOURNAL: &str = "journal";
const CF_META: &str = "meta";
const HEAD: &[u8] = b"head";

/// The most write-ahead log a RocksDB volume keeps before flushing (`max_total_wal_size`).
pub const WAL_BOUND: u64 = 64 << 20;

fn err(e: rocksdb::Error, what: &str) -> Error {
    err_of(e.into_string(), what)
}

fn err_of(msg: String, what: &str) -> Error {
    if msg.contains("No space left") {
        // RocksDB's status says its cause twice ("IO error: No space left on device: While
        // appending to file: F: No space left on device"): said once, then what failed.
        let rest: Vec<&str> = msg
            .split(": ")
            .filter(|p| !p.contains("No space left") && *p != "IO error")
            .collect();
        let sep = if rest.is_empty() { "" } else { ": " };
        return Error::new(
            ErrorKind::NoSpace,
            format!(
                "rocksdb {what}: disk full (No space left on device){sep}{}",
                rest.join(": ")
            ),
        );
    }
    Error::new(ErrorKind::Backend, format!("rocksdb {what}: {msg}"))
}

/// Options every RocksDB this project opens starts from (volumes, secondaries, the agent's and
/// jfs-sync's state). Debian's librocksdb is built without NDEBUG: it logs at DEBUG level
/// (a line in `LOG` for every WAL sync) and asserts, aborting the process, on the next line
/// after one `LOG` write failed. On a full disk that write fails, so the info log is kept to
/// fatal events only and never grows; errors reach our own logs through the returned status.
pub fn base_options() -> Options {
    let mut o = Options::default();
    o.set_log_level(rocksdb::LogLevel::Fatal);
    o.set_keep_log_file_num(2);
    o.set_max_log_file_size(1 << 20);
    // An open reads what it needs of each table file and nothing more: not the statistics
    // of every file (compaction planning does without them), and with a few threads rather
    // than sixteen started and stopped per column family.
    o.set_skip_stats_update_on_db_open(true);
    o.set_max_file_opening_threads(4);
    // RocksDB's defaults, set here because the room a writer needs at open is computed from
    // them (`localdir::WRITER_NEED`).
    o.set_write_buffer_size(WRITE_BUFFER as usize);
    o.set_manifest_preallocation_size(MANIFEST_PREALLOC as usize);
    o
}

/// Free bytes a RocksDB directory keeps: writes are refused ("disk full") below it, before
/// RocksDB's own write fails. A WAL write that fails on ENOSPC leaves its log writer in an
/// error state, and Debian's librocksdb (built with assertions) aborts the process on the
/// next sync of that writer; stopping short of a full disk keeps the process up, so it
/// recovers by itself once room is made.
struct Inner {
    /// The database. A secondary's is replaced by a fresh open when the writer has flushed
    /// a log that this one read (`RocksEngine::catch_up`); readers hold the one they started
    /// with.
    db: std::sync::RwLock<Arc<DB>>,
    path: PathBuf,
    secondary: Option<tempfile::TempDir>,
    /// A secondary's view of the writer's logs at its last catch-up (their numbers), and how
    /// many times it was opened anew.
    logs: Mutex<(std::collections::BTreeSet<u64>, u64)>,
    commit: Mutex<()>,
    /// Writes made to the WAL so far (counted after each returns), and how many of them a
    /// WAL sync is known to cover: concurrent committers share one sync (group commit).
    written: AtomicU64,
    synced: Mutex<u64>,
    head: AtomicU64,
    /// When a journal wait last saw the head move (secondaries poll faster while it moves).
    last_advance: Mutex<std::time::Instant>,
    /// A secondary's wake-ups: the writer changed a file of the volume (None: poll only).
    wake: Option<DirWatch>,
    sync: bool,
    tx: watch::Sender<u64>,
}

/// A clean close flushes the memtables: the next open (a mount, an agent, the next
/// `jfs-sync --from-journal` pass) then reads SST files instead of replaying a write-ahead
/// log that may hold a whole bulk copy. A crash still replays it, as it must.
impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(w) = &self.wake {
            w.stop.store(true, Ordering::Relaxed);
        }
        if self.secondary.is_some() {
            return;
        }
        // A database whose directory was removed while it was still open (the mirror agent's
        // resync staging, discarded after its switch while a replication task still held it)
        // is gone: there is nothing to flush to and no next open, so no warning.
        if !self.path.join("CURRENT").exists() {
            tracing::debug!(path = %self.path.display(), "closing a RocksDB database whose directory was removed: nothing to flush");
            return;
        }
        let mut o = rocksdb::FlushOptions::default();
        o.set_wait(true);
        let mut flushed = true;
        let db = self.db();
        for name in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, CF_JOURNAL, CF_META] {
            if let Some(cf) = db.cf_handle(name) {
                if let Err(e) = db.flush_cf_opt(cf, &o) {
                    flushed = false;
                    tracing::warn!(path = %self.path.display(), cf = name, error = %e, "flushing at close failed; the next open replays the log");
                }
            }
        }
        // Nothing more is written after a failed flush, nor onto the room kept free.
        if flushed && check_room(&self.path, MERGE_AT_CLOSE_MAX).is_ok() {
            self.merge_small_tables();
        }
    }
}

/// A table smaller than this is one a short-lived writer's close left (its flush).
const SMALL_TABLE: usize = 1 << 20;
/// A close that finds this many small tables in a column family merges them.
const SMALL_TABLES_BOUND: usize = 32;
/// The most a close writes merging them (a run of small tables is at most this much).
const MERGE_AT_CLOSE_MAX: u64 = 64 << 20;

/// A table's key range.
type KeyRange = (Vec<u8>, Vec<u8>);

/// The runs of small tables worth merging: the key ranges, each spanning at least two
/// small tables and overlapping no large one (merging those would rewrite the large one),
/// each at most `MERGE_AT_CLOSE_MAX` bytes. A small table that overlaps a large one (a
/// range deletion of a journal trim spans old tables) is left out; the others still merge.
fn small_runs(mut small: Vec<(KeyRange, u64)>, large: &[KeyRange]) -> Vec<KeyRange> {
    let overlaps = |s: &[u8], e: &[u8]| large.iter().any(|(ls, le)| s <= &le[..] && &ls[..] <= e);
    small.sort();
    let mut runs = Vec::new();
    let mut cur: Option<(KeyRange, usize, u64)> = None;
    for ((s, e), size) in small {
        if overlaps(&s, &e) {
            runs.extend(cur.take());
            continue;
        }
        cur = match cur.take() {
            Some(((rs, re), n, bytes))
                if !overlaps(&rs, &e) && bytes + size <= MERGE_AT_CLOSE_MAX =>
            {
                let re = re.max(e);
                Some(((rs, re), n + 1, bytes + size))
            }
            done => {
                runs.extend(done);
                Some(((s, e), 1, size))
            }
        };
    }
    runs.extend(cur);
    runs.into_iter()
        .filter(|(_, n, _)| *n >= 2)
        .map(|(r, _, _)| r)
        .collect()
}

impl Inner {
    /// Each short-lived writer (a `jfs put`, every `jfs-sync` pass into a volume) flushes a
    /// small table per column family at close. Where keys only grow (the journal) such
    /// tables overlap nothing below them, so RocksDB moves them down whole instead of
    /// merging them, and their number grows by one a close without bound. Past a bound, a
    /// close merges each run of small tables into one. (RocksDB's manual compaction returns
    /// no error: a failed merge leaves the tables as they were, and the next close tries.)
    fn merge_small_tables(&self) {
        let db = self.db();
        let Ok(files) = db.live_files() else {
            return;
        };
        for name in [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, CF_JOURNAL, CF_META] {
            let Some(cf) = db.cf_handle(name) else {
                continue;
            };
            let (mut small, mut large) = (Vec::new(), Vec::new());
            let mut ranged = true;
            for f in files.iter().filter(|f| f.column_family_name == name) {
                match (f.start_key.clone(), f.end_key.clone()) {
                    (Some(s), Some(e)) if f.size < SMALL_TABLE => {
                        small.push(((s, e), f.size as u64))
                    }
                    (Some(s), Some(e)) => large.push((s, e)),
                    _ => ranged = false,
                }
            }
            // A table without its range: nothing is merged in this family.
            if !ranged || small.len() < SMALL_TABLES_BOUND {
                continue;
            }
            let count = small.len();
            let t = std::time::Instant::now();
            let runs = small_runs(small, &large);
            let mut o = rocksdb::CompactOptions::default();
            o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
            for (start, end) in &runs {
                db.compact_range_cf_opt(cf, Some(start), Some(end), &o);
            }
            tracing::debug!(path = %self.path.display(), cf = name, small = count, runs = runs.len(), ms = t.elapsed().as_millis() as u64, "small tables merged at close");
        }
    }
}

pub struct RocksEngine {
    inner: Arc<Inner>,
}

/// Changes to a volume's directory, seen by a thread reading inotify: each batch of events
/// bumps a counter that journal waits of a secondary wait on. Writes to the WAL are
/// `IN_MODIFY`, a new WAL or MANIFEST is `IN_CREATE`. The thread checks `stop` every second.
struct DirWatch {
    tx: watch::Sender<u64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// False once the thread ended on an error: waits poll again.
    alive: Arc<std::sync::atomic::AtomicBool>,
}

impl DirWatch {
    /// None when inotify is not available (limits, an unusual file system): callers poll.
    fn start(dir: &Path) -> Option<DirWatch> {
        use rustix::fs::inotify;
        let started = (|| -> std::io::Result<DirWatch> {
            let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
            inotify::add_watch(
                &fd,
                dir,
                inotify::WatchFlags::MODIFY
                    | inotify::WatchFlags::CREATE
                    | inotify::WatchFlags::MOVED_TO,
            )?;
            let (tx, _) = watch::channel(0u64);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let (tx2, stop2, alive2) = (tx.clone(), stop.clone(), alive.clone());
            std::thread::Builder::new()
                .name("rocks-follow".into())
                .spawn(move || {
                    struct Ended(Arc<std::sync::atomic::AtomicBool>);
                    impl Drop for Ended {
                        fn drop(&mut self) {
                            self.0.store(false, Ordering::Relaxed);
                        }
                    }
                    let _ended = Ended(alive2);
                    use rustix::event::{poll, PollFd, PollFlags, Timespec};
                    let mut buf = [0u8; 4096];
                    let second = Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    };
                    while !stop2.load(Ordering::Relaxed) {
                        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                        match poll(&mut fds, Some(&second)) {
                            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                            Ok(_) => {}
                            Err(_) => return,
                        }
                        loop {
                            match rustix::io::read(&fd, &mut buf) {
                                Ok(_) | Err(rustix::io::Errno::INTR) => continue,
                                Err(rustix::io::Errno::AGAIN) => break,
                                Err(_) => return,
                            }
                        }
                        tx2.send_modify(|n| *n = n.wrapping_add(1));
                    }
                })?;
            Ok(DirWatch { tx, stop, alive })
        })();
        match started {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::info!(dir = %dir.display(), error = %e, "no inotify on the volume's directory: this reader polls for the writer's commits (every 10 ms while it writes)");
                None
            }
        }
    }
}

/// How to open: as the one writer, or as a read-only secondary that follows the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocksMode {
    ReadWrite,
    ReadOnly,
}

fn cfs() -> Vec<ColumnFamilyDescriptor> {
    [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, CF_JOURNAL, CF_META]
        .into_iter()
        .map(|n| ColumnFamilyDescriptor::new(n, base_options()))
        .collect()
}

impl RocksEngine {
    pub fn open(path: &Path, mode: RocksMode, create: bool, sync: bool) -> Result<Self> {
        let mut opts = base_options();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_open_files(512);
        // Bounds the log an open after a crash replays: past it, the column families whose
        // data the oldest log holds are flushed.
        opts.set_max_total_wal_size(WAL_BOUND);
        // The writer's logs before a secondary opens: a change after this, even during the
        // open, makes its first catch-up open it anew (see `catch_up`).
        let logs = wal_numbers(path);
        // A writer preallocates its log and manifest at once: on a disk without room for
        // them and the floor, it would open and then refuse every write after its first.
        if mode == RocksMode::ReadWrite {
            check_writer_room(path).map_err(|m| Error::new(ErrorKind::NoSpace, m))?;
        }
        // RocksDB would create a missing directory itself, open to the umask (0755): the
        // metadata names every file and maps its blocks, so it is made owner-only first.
        if create && mode == RocksMode::ReadWrite && !path.exists() {
            crate::localdir::create_private_dirs(path).map_err(|e| {
                Error::new(
                    ErrorKind::Backend,
                    format!("creating {}: {e}", path.display()),
                )
            })?;
        }
        if let Err(e) = std::fs::read_dir(path) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                use std::os::unix::fs::MetadataExt;
                let owner = std::fs::metadata(path)
                    .map(|m| format!(" (uid {}, mode {:04o})", m.uid(), m.mode() & 0o7777))
                    .unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("{}: Permission denied: a volume's metadata is its owner's alone{owner}, since whoever reads it reads every file; run this as that user or root", path.display()),
                ));
            }
        }
        let (db, secondary) = match mode {
            _ if !create && !path.join("CURRENT").exists() => {
                return Err(Error::new(
                    ErrorKind::NotFormatted,
                    format!("no RocksDB volume at {}: run `jfs format` first", path.display()),
                ))
            }
            RocksMode::ReadOnly => {
                if !path.join("CURRENT").exists() {
                    return Err(Error::new(
                        ErrorKind::NotFormatted,
                        format!("no RocksDB volume at {}: run `jfs format` first", path.display()),
                    ));
                }
                remove_stale_secondaries();
                let dir = tempfile::Builder::new()
                    .prefix(&format!("{SECONDARY_PREFIX}{}-", std::process::id()))
                    .tempdir()
                    .map_err(|e| Error::new(ErrorKind::Backend, format!("creating a secondary dir: {e}")))?;
                let db = open_secondary(path, &dir.path().join("0"))?;
                (db, Some(dir))
            }
            RocksMode::ReadWrite => match DB::open_cf_descriptors(&opts, path, cfs()) {
                Ok(db) => (db, None),
                Err(e) if e.as_ref().contains("lock") => {
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!("{} is open for writing by another process{} (one process writes a RocksDB volume; readers open it read-only); stop that process or go through it (a mount: write through its mount point)", path.display(), lock_holder(path).map_or(String::new(), |h| format!(", {h}"))),
                    ))
                }
                // The directory can be read but not written (a volume made before its
                // directory was owner-only, or opened up by hand): RocksDB's own message
                // only names its `LOG` file.
                Err(e) if e.as_ref().contains("Permission denied") => {
                    use std::os::unix::fs::MetadataExt;
                    let owner = std::fs::metadata(path)
                        .map(|m| format!(" (uid {}, mode {:04o})", m.uid(), m.mode() & 0o7777))
                        .unwrap_or_default();
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        format!("{}: Permission denied: only the owner of a volume's metadata{owner} may write it (uid {} may not); run this as that user or root (sudo), or write through a mount of the volume", path.display(), std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())),
                    ));
                }
                Err(e) => return Err(err(e, &format!("opening {}", path.display()))),
            },
        };
        if secondary.is_some() {
            catch_up_steadily(&db)?;
        }
        let head = read_head(&db)?;
        let (tx, _) = watch::channel(head);
        let wake = secondary.as_ref().and_then(|_| DirWatch::start(path));
        Ok(RocksEngine {
            inner: Arc::new(Inner {
                db: std::sync::RwLock::new(Arc::new(db)),
                path: path.to_path_buf(),
                logs: Mutex::new((logs, 0)),
                secondary,
                commit: Mutex::new(()),
                written: AtomicU64::new(0),
                synced: Mutex::new(0),
                head: AtomicU64::new(head),
                last_advance: Mutex::new(std::time::Instant::now()),
                wake,
                sync,
                tx,
            }),
        })
    }

    pub fn is_secondary(&self) -> bool {
        self.inner.secondary.is_some()
    }

    /// Catch a secondary up with the writer. RocksDB's secondary (7.8) keeps in its memtable
    /// what it replayed from a log even once the writer has flushed that log into a table and
    /// deleted it: a key written again after the replay (the head, an inode's attributes)
    /// then reads its old value from the memtable, until the writer's next write, and for
    /// good if it stays idle (a primary agent reported a head 168 entries behind, and
    /// refused its mirrors as another history). A flush starts a new log, and deletes the
    /// old one once every column family is flushed: so when the writer's logs are not those
    /// of the last catch-up, this secondary is opened anew, which reads the tables the
    /// flush made (one open per flush or writer session).
    fn catch_up(&self) -> Result<()> {
        let Some(dir) = &self.inner.secondary else {
            return Ok(());
        };
        let mut logs = self.inner.logs.lock().unwrap_or_else(|p| p.into_inner());
        let db = self.inner.db();
        db.try_catch_up_with_primary()
            .map_err(|e| err(e, "catching up with the primary"))?;
        let now = wal_numbers(&self.inner.path);
        let db = if now != logs.0 {
            logs.1 += 1;
            let sub = dir.path().join(logs.1.to_string());
            let fresh = Arc::new(open_secondary(&self.inner.path, &sub)?);
            catch_up_steadily(&fresh)?;
            *self.inner.db.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
            // The last instance's own files (its LOG): one directory a generation, not one
            // more for each flush the writer makes. Readers still holding it write on to
            // files that are gone.
            let _ = std::fs::remove_dir_all(dir.path().join((logs.1 - 1).to_string()));
            tracing::debug!(path = %self.inner.path.display(), generation = logs.1, "the writer flushed a log this reader had read: opened anew");
            fresh
        } else {
            db
        };
        logs.0 = now;
        self.inner.head.store(read_head(&db)?, Ordering::SeqCst);
        Ok(())
    }

    fn read_only(&self) -> Result<()> {
        if self.inner.secondary.is_some() {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{} is open for writing by another process; this one has it read-only",
                    self.inner.path.display()
                ),
            ));
        }
        Ok(())
    }
}

const SECONDARY_PREFIX: &str = "jfs-rocks-secondary-";

/// Open the volume at `path` as a secondary whose own files (its LOG) go in `dir`.
fn open_secondary(path: &Path, dir: &Path) -> Result<DB> {
    crate::localdir::create_private_dirs(dir)
        .map_err(|e| Error::new(ErrorKind::Backend, format!("creating a secondary dir: {e}")))?;
    let mut so = base_options();
    so.set_max_open_files(-1);
    DB::open_cf_as_secondary(
        &so,
        path,
        dir,
        [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, CF_JOURNAL, CF_META],
    )
    .map_err(|e| err(e, &format!("opening {} read-only", path.display())))
}

/// The numbers of the writer's log files (`NNNNNN.log`) in the volume's directory.
fn wal_numbers(path: &Path) -> std::collections::BTreeSet<u64> {
    let Ok(rd) = std::fs::read_dir(path) else {
        return Default::default();
    };
    rd.flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".log")?
                .parse::<u64>()
                .ok()
        })
        .collect()
}

/// A secondary instance keeps its own small directory (its LOG) in the temp dir, removed when
/// the engine is dropped. A process killed with SIGKILL cannot remove it: the next secondary
/// opened on this machine removes those whose process is gone.
fn remove_stale_secondaries() {
    let tmp = std::env::temp_dir();
    let Ok(rd) = std::fs::read_dir(&tmp) else {
        return;
    };
    for ent in rd.flatten() {
        let name = ent.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(SECONDARY_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(ent.path());
        }
    }
}

/// Catch a new secondary up until two catch-ups in a row reach the same sequence number.
/// One is not enough: a catch-up reads the writer's MANIFEST, then its log files, and a
/// flush in between can delete a log whose data the MANIFEST read did not list yet, and a
/// young volume may hold everything in that log. A few more catch-ups, bounded, see the
/// flush. (Idle writer: two catch-ups; the mirror's "not formatted" dump is still open.)
fn catch_up_steadily(db: &DB) -> Result<()> {
    let mut seen = None;
    for _ in 0..8 {
        db.try_catch_up_with_primary()
            .map_err(|e| err(e, "catching up with the primary"))?;
        let now = db.latest_sequence_number();
        if seen == Some(now) {
            break;
        }
        seen = Some(now);
    }
    Ok(())
}

fn read_head(db: &DB) -> Result<u64> {
    let cf = db.cf_handle(CF_META).expect("meta cf exists");
    Ok(
        match db.get_cf(cf, HEAD).map_err(|e| err(e, "reading head"))? {
            Some(v) if v.len() == 8 => u64::from_be_bytes(v[..].try_into().unwrap()),
            Some(_) => {
                return Err(fs_core::error::corrupt(
                    "rocksdb journal head is not 8 bytes",
                ))
            }
            None => 0,
        },
    )
}

/// The writes of `entry`, its journal frame and the head, added to `batch`.
fn add_entry(db: &DB, batch: &mut WriteBatch, entry: &Entry) {
    for m in &entry.writes {
        match m {
            fs_core::Mutation::Put { key, value } => batch.put(key, value),
            fs_core::Mutation::Delete { key } => batch.delete(key),
            // materialize() leaves only puts and deletes
            _ => unreachable!("journal entries hold only puts and deletes"),
        }
    }
    batch.put_cf(cf(db, CF_JOURNAL), entry.seq.to_be_bytes(), entry.encode());
    batch.put_cf(cf(db, CF_META), HEAD, entry.seq.to_be_bytes());
}

fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    db.cf_handle(name).expect("column family exists")
}

impl Inner {
    fn db(&self) -> Arc<DB> {
        self.db.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn write(&self, batch: WriteBatch) -> Result<()> {
        check_room(&self.path, batch.size_in_bytes() as u64)
            .map_err(|m| Error::new(ErrorKind::NoSpace, format!("rocksdb: {m}")))?;
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db()
            .write_opt(batch, &wo)
            .map_err(|e| err(e, "commit"))?;
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Make every write this thread has made durable, outside the commit mutex. Concurrent
    /// committers share one fsync: a sync covers every write counted before it started, so
    /// a committer whose write such a sync covered returns without one of its own.
    fn sync_wal(&self) -> Result<()> {
        if !self.sync {
            return Ok(());
        }
        let mine = self.written.load(Ordering::SeqCst);
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if *synced >= mine {
            return Ok(());
        }
        let upto = self.written.load(Ordering::SeqCst);
        self.db()
            .flush_wal(true)
            .map_err(|e| err(e, "syncing the WAL"))?;
        *synced = upto;
        Ok(())
    }

    /// The mirror marker's file (see `fs_core::site`): its presence fences writers off.
    fn marker_path(&self) -> PathBuf {
        self.path.join("jfs-aux").join(fs_core::site::MARKER)
    }

    fn require_mirror(&self) -> Result<()> {
        if !self.marker_path().exists() {
            return Err(fs_core::site::replay_refused(&format!(
                "rocksdb://{}",
                self.path.display()
            )));
        }
        Ok(())
    }

    fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        let guard = self.commit.lock().unwrap_or_else(|p| p.into_inner());
        let marker = self.marker_path();
        if marker.exists() {
            return Err(fs_core::site::refusal_from_record(
                &format!("rocksdb://{}", self.path.display()),
                std::fs::read(&marker).ok().as_deref(),
            ));
        }
        let keys: Vec<&[u8]> = req.reads.iter().map(|(k, _)| k.as_slice()).collect();
        let db = self.db();
        for ((_, want), got) in req.reads.iter().zip(db.multi_get(keys)) {
            if got.map_err(|e| err(e, "validating reads"))?.as_deref() != want.as_deref() {
                return Ok(CommitOutcome::Conflict);
            }
        }
        let ckeys = req.counter_keys();
        let mut counters = HashMap::new();
        for k in ckeys {
            let v = db.get(&k).map_err(|e| err(e, "reading a counter"))?;
            counters.insert(k, v);
        }
        let seq = self.head.load(Ordering::SeqCst) + 1;
        let time_ns = fs_core::types::now_ns();
        let entry = req.materialize(seq, time_ns, &counters)?;
        let mut batch = WriteBatch::default();
        add_entry(&db, &mut batch, &entry);
        self.write(batch)?;
        self.head.store(seq, Ordering::SeqCst);
        drop(guard);
        self.sync_wal()?;
        // Committers finish their syncs in any order: the head seen by waiters only grows.
        self.tx.send_if_modified(|h| {
            let newer = seq > *h;
            if newer {
                *h = seq;
            }
            newer
        });
        Ok(CommitOutcome::Committed { seq, time_ns })
    }

    fn bounds(&self) -> Result<JournalBounds> {
        let last = self.head.load(Ordering::SeqCst);
        let db = self.db();
        let mut it = db.iterator_cf(cf(&db, CF_JOURNAL), IteratorMode::Start);
        let first = match it.next() {
            Some(Ok((k, _))) => u64::from_be_bytes(
                k[..]
                    .try_into()
                    .map_err(|_| fs_core::error::corrupt("journal key is not 8 bytes"))?,
            ),
            Some(Err(e)) => return Err(err(e, "reading the journal")),
            None => last + 1,
        };
        Ok(JournalBounds { first, last })
    }
}

#[async_trait]
impl Engine for RocksEngine {
    fn kind(&self) -> &'static str {
        "rocksdb"
    }
    fn display_url(&self) -> String {
        format!("rocksdb://{}", self.inner.path.display())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.db().get(key).map_err(|e| err(e, "get"))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.inner
            .db()
            .multi_get(keys)
            .into_iter()
            .map(|r| r.map_err(|e| err(e, "get")))
            .collect()
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        let mut out = Vec::new();
        let db = self.inner.db();
        let it = db.iterator(IteratorMode::From(start, rocksdb::Direction::Forward));
        for item in it {
            let (k, v) = item.map_err(|e| err(e, "scan"))?;
            if &*k >= end || out.len() >= limit {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        self.read_only()?;
        let inner = self.inner.clone();
        let req = req.clone();
        tokio::task::spawn_blocking(move || inner.commit(&req))
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, format!("commit task failed: {e}")))?
    }

    async fn journal_bounds(&self) -> Result<JournalBounds> {
        self.catch_up()?;
        self.inner.bounds()
    }

    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let b = self.inner.bounds()?;
        let from = b.check_from(from)?;
        let mut out = Vec::new();
        let key = from.to_be_bytes();
        let db = self.inner.db();
        let it = db.iterator_cf(
            cf(&db, CF_JOURNAL),
            IteratorMode::From(&key, rocksdb::Direction::Forward),
        );
        for item in it.take(max) {
            let (k, v) = item.map_err(|e| err(e, "reading the journal"))?;
            let seq = u64::from_be_bytes(
                k[..]
                    .try_into()
                    .map_err(|_| fs_core::error::corrupt("journal key is not 8 bytes"))?,
            );
            out.push((seq, v.to_vec()));
        }
        Ok(out)
    }

    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        if self.inner.secondary.is_some() {
            // A secondary has no in-process signal from the writer: it is woken by inotify
            // (`DirWatch`) and catches up then, and every 100 ms regardless. Without inotify
            // it polls: every 10 ms while the writer was active in the last 2 s (low lag
            // under load), every 100 ms once it is idle (~1% of a core instead of ~13%).
            let mut woken = self
                .inner
                .wake
                .as_ref()
                .filter(|w| w.alive.load(Ordering::Relaxed))
                .map(|w| w.tx.subscribe());
            loop {
                self.catch_up()?;
                let now = std::time::Instant::now();
                if self.inner.head.load(Ordering::SeqCst) > after {
                    *self
                        .inner
                        .last_advance
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = now;
                    return Ok(true);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(false);
                }
                let busy = now.duration_since(
                    *self
                        .inner
                        .last_advance
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()),
                ) < Duration::from_secs(2);
                let every = Duration::from_millis(if busy && woken.is_none() { 10 } else { 100 });
                let nap = every.min(deadline - tokio::time::Instant::now());
                match &mut woken {
                    Some(rx) => {
                        let _ = tokio::time::timeout(nap, rx.changed()).await;
                    }
                    None => tokio::time::sleep(nap).await,
                }
            }
        }
        let mut rx = self.inner.tx.subscribe();
        let res = tokio::time::timeout_at(deadline, rx.wait_for(|h| *h > after)).await;
        Ok(matches!(res, Ok(Ok(_))))
    }

    async fn journal_trim(&self, before: u64) -> Result<u64> {
        self.read_only()?;
        let b = self.inner.bounds()?;
        let before = before.min(b.last);
        if before <= b.first {
            return Ok(0);
        }
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            cf(&self.inner.db(), CF_JOURNAL),
            b.first.to_be_bytes(),
            before.to_be_bytes(),
        );
        self.inner.write(batch)?;
        self.inner.sync_wal()?;
        Ok(before - b.first)
    }

    async fn apply(&self, entries: &[Entry]) -> Result<u64> {
        self.read_only()?;
        let inner = self.inner.clone();
        let entries = entries.to_vec();
        tokio::task::spawn_blocking(move || {
            let guard = inner.commit.lock().unwrap_or_else(|p| p.into_inner());
            inner.require_mirror()?;
            let start = inner.head.load(Ordering::SeqCst);
            let todo = fs_core::engine::entries_after(start, &entries)?;
            let head = todo.last().map_or(start, |e| e.seq);
            let db = inner.db();
            let mut batch = WriteBatch::default();
            for e in todo {
                add_entry(&db, &mut batch, e);
            }
            inner.write(batch)?;
            inner.head.store(head, Ordering::SeqCst);
            drop(guard);
            inner.sync_wal()?;
            inner.tx.send_replace(head);
            Ok(head)
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, format!("apply task failed: {e}")))?
    }

    // Aux records are files in `<db>/jfs-aux/`, replaced atomically (write, fsync, rename):
    // any process may write them, including a read-only one (the primary agent follows the
    // writer as a secondary instance and still keeps the replication slots).
    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()> {
        fs_core::engine::check_aux_name(name)?;
        let dir = self.inner.path.join("jfs-aux");
        let name = name.to_string();
        let value = value.map(|v| v.to_vec());
        tokio::task::spawn_blocking(move || aux_write(&dir, &name, value.as_deref()))
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, format!("aux task failed: {e}")))?
    }

    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let dir = self.inner.path.join("jfs-aux");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(e, &dir)),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| io_err(e, &dir))?;
            let Ok(name) = ent.file_name().into_string() else {
                continue;
            };
            if !name.starts_with(prefix) || name.contains(".tmp") || name.starts_with('.') {
                continue;
            }
            match std::fs::read(ent.path()) {
                Ok(v) => out.push((name, v)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(e, &ent.path())),
            }
        }
        out.sort();
        Ok(out)
    }

    async fn install_reset(&self) -> Result<()> {
        self.read_only()?;
        self.inner.require_mirror()?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = inner.commit.lock().unwrap_or_else(|p| p.into_inner());
            let mut batch = WriteBatch::default();
            batch.delete_range(&b""[..], &[0xffu8; 16][..]);
            batch.delete_range_cf(
                cf(&inner.db(), CF_JOURNAL),
                0u64.to_be_bytes(),
                u64::MAX.to_be_bytes(),
            );
            batch.delete_cf(cf(&inner.db(), CF_META), HEAD);
            inner.write(batch)?;
            inner.head.store(0, Ordering::SeqCst);
            inner.sync_wal()?;
            // Commits only raise the head waiters see: a reset lowers it here.
            inner.tx.send_replace(0);
            Ok(())
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, format!("install task failed: {e}")))?
    }

    async fn install_put(&self, pairs: &[KvPair]) -> Result<()> {
        self.read_only()?;
        self.inner.require_mirror()?;
        let mut batch = WriteBatch::default();
        for (k, v) in pairs {
            batch.put(k, v);
        }
        self.inner.write(batch)
    }

    async fn install_head(&self, head: u64) -> Result<()> {
        self.read_only()?;
        self.inner.require_mirror()?;
        let _guard = self.inner.commit.lock().unwrap_or_else(|p| p.into_inner());
        let mut batch = WriteBatch::default();
        batch.put_cf(cf(&self.inner.db(), CF_META), HEAD, head.to_be_bytes());
        self.inner.write(batch)?;
        self.inner.head.store(head, Ordering::SeqCst);
        self.inner
            .db()
            .flush_wal(true)
            .map_err(|e| err(e, "syncing the WAL"))?;
        self.inner.tx.send_replace(head);
        Ok(())
    }

    async fn install_switch(
        &self,
        writes: &[fs_core::Mutation],
        frames: &[(u64, Vec<u8>)],
        head: u64,
    ) -> Result<()> {
        self.read_only()?;
        fs_core::engine::check_switch(writes, frames, head)?;
        let inner = self.inner.clone();
        let writes = writes.to_vec();
        let frames = frames.to_vec();
        tokio::task::spawn_blocking(move || {
            let guard = inner.commit.lock().unwrap_or_else(|p| p.into_inner());
            inner.require_mirror()?;
            let mut batch = WriteBatch::default();
            for m in &writes {
                match m {
                    fs_core::Mutation::Put { key, value } => batch.put(key, value),
                    fs_core::Mutation::Delete { key } => batch.delete(key),
                    _ => unreachable!("checked by check_switch"),
                }
            }
            batch.delete_range_cf(
                cf(&inner.db(), CF_JOURNAL),
                0u64.to_be_bytes(),
                u64::MAX.to_be_bytes(),
            );
            for (seq, f) in &frames {
                batch.put_cf(cf(&inner.db(), CF_JOURNAL), seq.to_be_bytes(), f);
            }
            batch.put_cf(cf(&inner.db(), CF_META), HEAD, head.to_be_bytes());
            inner.write(batch)?;
            inner.head.store(head, Ordering::SeqCst);
            drop(guard);
            inner
                .db()
                .flush_wal(true)
                .map_err(|e| err(e, "syncing the WAL"))?;
            inner.tx.send_replace(head);
            Ok(())
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, format!("install task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_said_once() {
        let e = err_of(
            "IO error: No space left on device: While appending to file: /m/000012.log: No space left on device".into(),
            "commit",
        );
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(
            e.to_string(),
            "rocksdb commit: disk full (No space left on device): While appending to file: /m/000012.log"
        );
        assert_eq!(e.to_string().matches("No space left").count(), 1);
    }

    #[test]
    fn secondaries_of_dead_processes_are_cleaned_up() {
        let db = tempfile::tempdir().unwrap();
        drop(RocksEngine::open(&db.path().join("v"), RocksMode::ReadWrite, true, false).unwrap());
        // pid_max is at most 2^22: this process cannot exist.
        let stale = std::env::temp_dir().join(format!("{SECONDARY_PREFIX}4194305-test"));
        std::fs::create_dir_all(&stale).unwrap();
        let mine =
            std::env::temp_dir().join(format!("{SECONDARY_PREFIX}{}-test", std::process::id()));
        std::fs::create_dir_all(&mine).unwrap();
        let e = RocksEngine::open(&db.path().join("v"), RocksMode::ReadOnly, false, false).unwrap();
        assert!(e.is_secondary());
        assert!(!stale.exists(), "a dead process's secondary dir was left");
        assert!(mine.exists(), "a live process's secondary dir was removed");
        std::fs::remove_dir_all(&mine).unwrap();
    }

    /// Runs of small tables: split where a large table lies between them, a small table
    /// overlapping a large one left out, single tables not merged, runs bounded in bytes.
    #[test]
    fn small_tables_merge_in_runs_around_large_ones() {
        let k = |i: u32| i.to_be_bytes().to_vec();
        let t = |a: u32, b: u32| ((k(a), k(b)), 1000u64);
        let large = vec![(k(100), k(200))];
        let small = vec![
            t(10, 11),
            t(12, 13),
            t(14, 15),
            t(150, 160), // inside the large table
            t(5, 300),   // a range deletion spanning it
            t(210, 211),
            t(212, 213),
            t(400, 401), // no large table between: joins 210..213
        ];
        let runs = small_runs(small, &large);
        assert_eq!(runs, vec![(k(10), k(15)), (k(210), k(401))], "{runs:?}");
        // A lone small table is no run; bytes bound a run.
        assert!(small_runs(vec![t(1, 2)], &[]).is_empty());
        let big = (MERGE_AT_CLOSE_MAX / 2) + 1;
        let three = vec![
            ((k(1), k(2)), big),
            ((k(3), k(4)), big),
            ((k(5), k(6)), big),
        ];
        assert_eq!(
            small_runs(three, &[]),
            vec![],
            "each run would pass the bound with two"
        );
    }

    /// Short-lived writers, one after another (a `jfs put` or `jfs-sync` pass each), each
    /// adding keys past all earlier ones (as the journal does): the tables their closes
    /// leave are merged instead of growing in number by one a close, and every key written
    /// is read back after the last reopen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_lived_writers_do_not_pile_up_tables() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        drop(RocksEngine::open(&p, RocksMode::ReadWrite, true, false).unwrap());
        std::fs::create_dir_all(p.join("jfs-aux")).unwrap();
        std::fs::write(p.join("jfs-aux").join(fs_core::site::MARKER), b"{}").unwrap();
        let writers = 3 * SMALL_TABLES_BOUND as u32;
        for i in 0..writers {
            let w = RocksEngine::open(&p, RocksMode::ReadWrite, true, false).unwrap();
            w.install_put(&[(format!("k{i:04}").into_bytes(), vec![i as u8; 1000])])
                .await
                .unwrap();
            drop(w);
        }
        let w = RocksEngine::open(&p, RocksMode::ReadWrite, true, false).unwrap();
        let tables = w.inner.db().live_files().unwrap().len();
        assert!(
            tables <= SMALL_TABLES_BOUND + 3,
            "{tables} tables after {writers} writers"
        );
        for i in 0..writers {
            let v = w.get(format!("k{i:04}").as_bytes()).await.unwrap();
            assert_eq!(v, Some(vec![i as u8; 1000]), "k{i:04}");
        }
    }
}

#[cfg(test)]
mod install_tests {
    use super::*;

    /// A mirror's in-place install (reset, pages, head) seen by a secondary opened right
    /// after it: every installed key, each round. (A suspect of the mirror tests' "not
    /// formatted" dump; it has not failed here.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_secondary_opened_after_an_install_sees_the_installed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        let w = RocksEngine::open(&p, RocksMode::ReadWrite, true, false).unwrap();
        std::fs::create_dir_all(p.join("jfs-aux")).unwrap();
        std::fs::write(p.join("jfs-aux").join(fs_core::site::MARKER), b"{}").unwrap();
        let val = vec![7u8; 4096];
        let mut misses = Vec::new();
        for i in 0..40u64 {
            w.install_reset().await.unwrap();
            let mut pairs: Vec<KvPair> = vec![(b"S".to_vec(), i.to_be_bytes().to_vec())];
            for k in 0..600u32 {
                pairs.push((format!("k{k:06}").into_bytes(), val.clone()));
            }
            for c in pairs.chunks(100) {
                w.install_put(c).await.unwrap();
            }
            w.install_head(i + 1).await.unwrap();
            let r = RocksEngine::open(&p, RocksMode::ReadOnly, false, false).unwrap();
            let got = r.get(b"S").await.unwrap();
            let k = r.get(b"k000300").await.unwrap();
            if got.as_deref() != Some(&i.to_be_bytes()[..]) || k.is_none() {
                misses.push(format!("round {i}: S={got:?} k300={}", k.is_some()));
            }
        }
        assert!(misses.is_empty(), "{misses:?}");
    }

    /// A secondary is woken by the writer's commits (inotify on the volume's directory), and
    /// its journal wait then returns the new head: 50 writes in a row, each seen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_secondary_is_woken_by_each_write_of_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        let w = RocksEngine::open(&p, RocksMode::ReadWrite, true, false).unwrap();
        std::fs::create_dir_all(p.join("jfs-aux")).unwrap();
        std::fs::write(p.join("jfs-aux").join(fs_core::site::MARKER), b"{}").unwrap();
        w.install_head(1).await.unwrap();
        let r = RocksEngine::open(&p, RocksMode::ReadOnly, false, false).unwrap();
        let wake = r.inner.wake.as_ref().expect("inotify on a local directory");
        for i in 1..=50u64 {
            let mut rx = wake.tx.subscribe();
            w.install_put(&[(format!("k{i}").into_bytes(), vec![1u8; 100])])
                .await
                .unwrap();
            w.install_head(i + 1).await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), rx.changed())
                .await
                .unwrap_or_else(|_| panic!("write {i}: the secondary was not woken"))
                .unwrap();
            assert!(r.journal_wait(i, Duration::from_secs(10)).await.unwrap());
            assert_eq!(r.journal_bounds().await.unwrap().last, i + 1, "write {i}");
            assert!(r.get(format!("k{i}").as_bytes()).await.unwrap().is_some());
        }
    }
}

#[cfg(test)]
mod secondary_tests {
    use super::*;

    fn writer(p: &Path, create: bool) -> RocksEngine {
        RocksEngine::open(p, RocksMode::ReadWrite, create, false).unwrap()
    }

    async fn put(w: &RocksEngine, key: &str, value: &str) {
        w.install_put(&[(key.as_bytes().to_vec(), value.as_bytes().to_vec())])
            .await
            .unwrap();
    }

    /// A secondary reads what the writer flushed, not an older value it had replayed from
    /// the writer's log before the flush (RocksDB 7.8 kept that value in the secondary's
    /// memtable for good once the writer went idle): the head and a key written again, after
    /// a writer that closes (its flush at close), after one that flushes while it runs, and
    /// after a flush of one column family only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_secondary_reads_what_the_writer_flushed_not_its_older_replay() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        {
            let w = writer(&p, true);
            std::fs::create_dir_all(p.join("jfs-aux")).unwrap();
            std::fs::write(p.join("jfs-aux").join(fs_core::site::MARKER), b"{}").unwrap();
            w.install_head(1).await.unwrap();
        }
        let r = RocksEngine::open(&p, RocksMode::ReadOnly, false, false).unwrap();
        let mut head = 1;
        // Writers that come and go (`jfs put`, each `jfs-sync` pass), read mid-session.
        for round in 0..4u64 {
            let w = writer(&p, false);
            for i in 0..300u64 {
                put(&w, "attr", &format!("{round}-{i}")).await;
                head += 1;
                w.install_head(head).await.unwrap();
                if i == 150 {
                    r.catch_up().unwrap();
                }
            }
            drop(w);
            r.catch_up().unwrap();
            assert_eq!(r.inner.head.load(Ordering::SeqCst), head, "round {round}");
            let got = r.get(b"attr").await.unwrap().unwrap();
            assert_eq!(got, format!("{round}-299").into_bytes(), "round {round}");
        }
        // One writer that flushes while it runs, then stays idle; then a flush of the
        // default column family alone (the log is kept for the others).
        let w = writer(&p, false);
        put(&w, "attr", "before").await;
        head += 1;
        w.install_head(head).await.unwrap();
        r.catch_up().unwrap();
        put(&w, "attr", "after").await;
        head += 1;
        w.install_head(head).await.unwrap();
        w.inner.db().flush().unwrap();
        w.inner.db().flush_cf(cf(&w.inner.db(), CF_META)).unwrap();
        r.catch_up().unwrap();
        assert_eq!(r.inner.head.load(Ordering::SeqCst), head);
        assert_eq!(r.get(b"attr").await.unwrap().unwrap(), b"after");
        put(&w, "attr", "default only").await;
        r.catch_up().unwrap();
        put(&w, "attr", "flushed alone").await;
        w.inner.db().flush().unwrap();
        r.catch_up().unwrap();
        assert_eq!(r.get(b"attr").await.unwrap().unwrap(), b"flushed alone");
    }
}
