//! `Fs`: file-system semantics over an `Engine` (metadata) and a `BlockStore` (data).
//! Every method is one or more optimistic transactions, retried on conflict.

mod blockbuf;
mod budget;
pub mod clone;
mod data;
mod layout;
pub mod namespace;
mod prefetch;
mod read;
pub mod trash;

pub use blockbuf::{BlockBuf, BlockPool};
pub use budget::{Budget, SPARE};
pub use data::{FileWriter, NewSlice};
pub use layout::{Chunk, Piece, Plan};
pub use prefetch::{FileReader, ReadAhead, ReadStats, MIN_WINDOW_BLOCKS};
pub use read::slice_checksums;

use crate::engine::{CommitOutcome, Engine, Follow};
use crate::error::{invalid, not_found, Error, ErrorKind, Result};
use crate::journal::Op;
use crate::keys;
use crate::storage::{self, StorageFollow};
use crate::store::BlockStore;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, FileKind, Ino, Settings, MAX_NAME_LEN, ROOT_INO};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Mutex;

/// How many times a transaction is re-run after losing a race before giving up.
const INODE_BATCH: u64 = 1024;
const SLICE_BATCH: u64 = 256;

/// Run `$body` (an expression using `$tx: &mut Txn` and `?`, evaluating to `Result<T>`) as a
/// transaction, re-running it on conflict with jittered backoff. Evaluates to `Result<(T, seq)>`
/// where seq is 0 if the body wrote nothing.
macro_rules! transact {
    ($fs:expr, |$tx:ident| $body:expr) => {{
        let mut attempt = 0u32;
        loop {
            let mut $tx = $crate::txn::Txn::new(&*$fs.engine);
            let out = async { $body }.await;
            match out {
                Err(e) => break Err(e),
                Ok(v) => {
                    if $tx.is_read_only() {
                        break Ok((v, 0u64));
                    }
                    let written = $fs.dirs_written_by(&$tx);
                    match $tx.commit().await {
                        Ok($crate::engine::CommitOutcome::Committed { seq, .. }) => {
                            $fs.note_commit(written, seq);
                            break Ok((v, seq));
                        }
                        Ok($crate::engine::CommitOutcome::Conflict) => {
                            attempt += 1;
                            if let Err(e) = $crate::retry::conflict(attempt).await {
                                break Err(e);
                            }
                        }
                        Err(e) => break Err(e),
                    }
                }
            }
        }
    }};
}
pub(crate) use transact;

/// An id range handed out by the volume counter, used locally without a transaction per id.
struct IdPool {
    next: u64,
    end: u64,
}

pub struct Fs {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) store: Arc<dyn BlockStore>,
    pub(crate) settings: Settings,
    inodes: Mutex<IdPool>,
    slices: Mutex<IdPool>,
    /// Block transfers in flight per read or write call.
    pub io_parallel: usize,
    /// Which files this process has open (a mount): their last unlink keeps them.
    pub(crate) keeper: Option<Arc<dyn Keeper>>,
    /// Where uploads go, by storage generation (see `storage`).
    pub(crate) placement: Arc<dyn StorageFollow>,
    /// New nodes in a set-group-ID directory take its group (and new directories its bit),
    /// as POSIX file systems do; a mount sets this. Tools that copy ownership from a source
    /// (`jfs put`, `jfs-sync`) keep the group they give.
    pub(crate) setgid_inherit: bool,
    /// Directories' attributes as this process's own commits left them, kept for
    /// `dir_attr_ttl` (zero: off): see `recent_dir_attr`.
    dir_attr_ttl: std::time::Duration,
    dirs_written: std::sync::Mutex<HashMap<Ino, (u64, std::time::Instant, Attr)>>,
    /// The trash time this process deletes under (seconds, 0: none): the volume's setting,
    /// followed by `Fs::set_trash_secs` (a mount's background loop reads it again).
    pub(crate) trash_secs: std::sync::atomic::AtomicU64,
    /// `jfs rm --skip-trash`: this process frees what it deletes at once.
    pub(crate) skip_trash: bool,
}

/// What a mount tells fs-core about its open files, so that unlinking the last name of an
/// open file keeps the inode (readable and writable through the open handles) until
/// `Fs::release_kept` at its last close, or until `gc` finds its session dead.
pub trait Keeper: Send + Sync {
    /// Whether `ino` is open in this process.
    fn is_open(&self, ino: Ino) -> bool;
    /// The session id (see `session`) recorded with a kept inode.
    fn session(&self) -> &str;
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(invalid(format!(
            "invalid file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::new(
            ErrorKind::NameTooLong,
            format!("file name longer than {MAX_NAME_LEN} bytes"),
        ));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(invalid(format!(
            "file name {:?} contains '/' or NUL",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

pub(crate) fn lossy(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

pub(crate) fn decode_attr(ino: Ino, v: &[u8]) -> Result<Attr> {
    postcard::from_bytes(v)
        .map_err(|e| crate::error::corrupt(format!("attributes of inode {ino} do not decode: {e}")))
}

pub(crate) fn encode_attr(a: &Attr) -> Vec<u8> {
    postcard::to_stdvec(a).expect("attributes always serialize")
}

pub(crate) async fn get_attr(tx: &mut Txn<'_>, ino: Ino) -> Result<Attr> {
    match tx.get(&keys::attr(ino)).await? {
        Some(v) => decode_attr(ino, &v),
        None => Err(not_found(format!("inode {ino}"))),
    }
}

pub(crate) fn put_attr(tx: &mut Txn<'_>, ino: Ino, a: &Attr) {
    tx.put(keys::attr(ino), encode_attr(a));
}

pub(crate) async fn get_dir(tx: &mut Txn<'_>, ino: Ino) -> Result<Attr> {
    let a = get_attr(tx, ino).await?;
    if a.kind != FileKind::Dir {
        return Err(Error::new(
            ErrorKind::NotDir,
            format!("inode {ino} is not a directory"),
        ));
    }
    Ok(a)
}

/// Read directory `parent`'s attributes and its entry `name` in one round trip: every change
/// of a name reads both (`get_dir` and `lookup_entry` are then answered from the transaction).
pub(crate) async fn prefetch_entry(tx: &mut Txn<'_>, parent: Ino, name: &[u8]) -> Result<()> {
    tx.prefetch(&[keys::attr(parent), keys::dentry(parent, name)])
        .await
}

/// `prefetch_entry`, and the attributes of the inode the entry names in the same round trip
/// (`Txn::prefetch_via`); for an unlink also its first chunk record and its extended
/// attributes (up to `XATTRS_AHEAD` of them), which freeing the file reads.
pub(crate) async fn prefetch_entry_and_inode(
    tx: &mut Txn<'_>,
    parent: Ino,
    name: &[u8],
    for_unlink: bool,
) -> Result<()> {
    let mut suffixes = vec![keys::ATTR_SUFFIX.to_vec()];
    let xattr_end;
    let mut range: (&[u8], &[u8], usize) = (&[], &[], 0);
    if for_unlink {
        suffixes.push(keys::first_chunk_suffix());
        xattr_end = keys::prefix_end(keys::XATTR_SUFFIX);
        range = (keys::XATTR_SUFFIX, &xattr_end, XATTRS_AHEAD);
    }
    tx.prefetch_via(
        &[keys::dentry(parent, name), keys::attr(parent)],
        Follow {
            prefix: keys::INODE_PREFIX,
            suffixes: &suffixes,
            range,
        },
    )
    .await
}

/// How many extended attributes of a file an unlink reads with its name.
const XATTRS_AHEAD: usize = 16;

pub(crate) async fn lookup_entry(
    tx: &mut Txn<'_>,
    parent: Ino,
    name: &[u8],
) -> Result<Option<(Ino, FileKind)>> {
    match tx.get(&keys::dentry(parent, name)).await? {
        None => Ok(None),
        Some(v) => keys::decode_dentry(&v).map(Some).ok_or_else(|| {
            crate::error::corrupt(format!(
                "directory entry {:?} in inode {parent} does not decode",
                lossy(name)
            ))
        }),
    }
}

pub(crate) fn new_attr(kind: FileKind, mode: u32, uid: u32, gid: u32, parent: Ino) -> Attr {
    let now = now_ns();
    Attr {
        kind,
        mode: mode & 0o7777,
        uid,
        gid,
        atime: now,
        mtime: now,
        ctime: now,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        length: 0,
        parent,
    }
}

impl Fs {
    /// Format a new volume: fails with `AlreadyExists` if the engine already holds one.
    pub async fn format(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        settings: Settings,
    ) -> Result<Fs> {
        settings.validate()?;
        let json = serde_json::to_vec(&settings).expect("settings serialize");
        let mut tx = Txn::new(&*engine);
        if tx.get(keys::SETTING).await?.is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                "this metadata engine already holds a formatted volume",
            ));
        }
        let root = new_attr(FileKind::Dir, 0o755, 0, 0, ROOT_INO);
        tx.put(keys::SETTING.to_vec(), json);
        put_attr(&mut tx, ROOT_INO, &root);
        tx.put(keys::NEXT_INODE.to_vec(), b"2".to_vec());
        tx.put(keys::NEXT_SLICE.to_vec(), b"1".to_vec());
        tx.put(keys::USED_INODES.to_vec(), b"1".to_vec());
        tx.put(keys::USED_SPACE.to_vec(), b"0".to_vec());
        tx.set_op(Op::Format {
            name: settings.name.clone(),
        });
        // A mirror's metadata refuses the commit below anyway: say so before the store is
        // touched.
        if let Some(m) = crate::site::marker(&*engine).await? {
            return Err(crate::site::writes_refused(&engine.display_url(), Some(&m)));
        }
        // The store's prefix for this name becomes this volume's first: a prefix holding
        // another volume's blocks is refused before anything is written.
        let claim = crate::owner::claim(&*store, &settings).await?;
        let unclaim = || async {
            if claim == crate::owner::Claim::Claimed {
                let _ = store.delete(&crate::owner::key(&settings.name)).await;
            }
        };
        let outcome = match tx.commit().await {
            Ok(o) => o,
            Err(e) => {
                unclaim().await;
                return Err(e);
            }
        };
        match outcome {
            CommitOutcome::Committed { .. } => Self::over_one_store(engine, store, settings).await,
            CommitOutcome::Conflict => {
                unclaim().await;
                Err(Error::new(
                    ErrorKind::AlreadyExists,
                    "another format of this volume won the race",
                ))
            }
        }
    }

    /// Open over one store. Writes are fenced once the volume is in a storage cutover (one
    /// store is not where blocks go then): writers open through `volume`, which follows it.
    pub async fn open(engine: Arc<dyn Engine>, store: Arc<dyn BlockStore>) -> Result<Fs> {
        let settings = Self::load_settings(&*engine).await?;
        Self::over_one_store(engine, store, settings).await
    }

    async fn over_one_store(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        settings: Settings,
    ) -> Result<Fs> {
        let placement =
            storage::Fixed::new(engine.clone(), store.clone(), &settings.storage).await?;
        Ok(Fs::with_settings(
            engine,
            store,
            settings,
            Arc::new(placement),
        ))
    }

    /// Open with a placement that follows the volume's storage record: reads go through
    /// `store` (which should delegate to the current placement's stores), uploads through the
    /// placement.
    pub async fn open_following(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        placement: Arc<dyn StorageFollow>,
    ) -> Result<Fs> {
        let settings = Self::load_settings(&*engine).await?;
        Ok(Fs::with_settings(engine, store, settings, placement))
    }

    pub async fn load_settings(engine: &dyn Engine) -> Result<Settings> {
        match engine.get(keys::SETTING).await? {
            None => Err(Error::new(
                ErrorKind::NotFormatted,
                format!(
                    "no volume at {}: run `jfs format` first",
                    engine.display_url()
                ),
            )),
            Some(v) => {
                let s: Settings = serde_json::from_slice(&v).map_err(|e| {
                    crate::error::corrupt(format!("volume settings do not decode: {e}"))
                })?;
                s.check_format()?;
                Ok(s)
            }
        }
    }

    fn with_settings(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        settings: Settings,
        placement: Arc<dyn StorageFollow>,
    ) -> Fs {
        Fs {
            engine,
            store,
            inodes: Mutex::new(IdPool { next: 0, end: 0 }),
            slices: Mutex::new(IdPool { next: 0, end: 0 }),
            io_parallel: 8,
            keeper: None,
            placement,
            setgid_inherit: false,
            dir_attr_ttl: std::time::Duration::ZERO,
            dirs_written: Default::default(),
            trash_secs: std::sync::atomic::AtomicU64::new(settings.trash_secs),
            skip_trash: false,
            settings,
        }
    }

    /// Where uploads go now.
    pub fn placement(&self) -> &Arc<dyn StorageFollow> {
        &self.placement
    }

    /// Keep inodes this process has open past their last unlink (a mount sets this).
    pub fn set_keeper(&mut self, keeper: Arc<dyn Keeper>) {
        self.keeper = Some(keeper);
    }

    /// Answer `recent_dir_attr` for `ttl` after this process's own commit of a directory's
    /// attributes (a mount sets its attribute-cache time).
    pub fn set_dir_attr_cache(&mut self, ttl: std::time::Duration) {
        self.dir_attr_ttl = ttl;
    }

    /// A directory's attributes as this process's last commit of them left them, if that was
    /// less than the attribute-cache time ago. The kernel drops its cached attributes of a
    /// directory whose entries this mount changed, and asks again before the next change in
    /// it (a permission check); the answer is what the kernel would have kept for as long,
    /// and newer. Changes by other clients show after the same time as through the kernel's
    /// cache.
    pub fn recent_dir_attr(&self, ino: Ino) -> Option<Attr> {
        if self.dir_attr_ttl.is_zero() {
            return None;
        }
        let m = self.dirs_written.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ino)
            .filter(|(_, at, _)| at.elapsed() < self.dir_attr_ttl)
            .map(|(_, _, a)| a.clone())
    }

    /// The inodes whose attributes `tx` writes or deletes, with the new attributes of those
    /// that are directories (nothing when `recent_dir_attr` is off).
    pub(crate) fn dirs_written_by(&self, tx: &Txn<'_>) -> Vec<(Ino, Option<Attr>)> {
        if self.dir_attr_ttl.is_zero() {
            return Vec::new();
        }
        tx.written()
            .filter_map(|(k, v)| match keys::parse(k) {
                keys::Key::Attr(ino) => Some((
                    ino,
                    v.and_then(|v| decode_attr(ino, v).ok())
                        .filter(|a| a.kind == FileKind::Dir),
                )),
                _ => None,
            })
            .collect()
    }

    /// After a commit at `seq` of what `dirs_written_by` found: remember the directories'
    /// attributes, forget the other inodes'.
    pub(crate) fn note_commit(&self, written: Vec<(Ino, Option<Attr>)>, seq: u64) {
        if written.is_empty() {
            return;
        }
        let mut m = self.dirs_written.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 4096 {
            m.clear();
        }
        let now = std::time::Instant::now();
        for (ino, a) in written {
            match a {
                // Concurrent commits may finish out of order: the later entry wins.
                Some(a) => {
                    if m.get(&ino).is_none_or(|(s, _, _)| *s < seq) {
                        m.insert(ino, (seq, now, a));
                    }
                }
                None => {
                    m.remove(&ino);
                }
            }
        }
    }

    /// Give new nodes in a set-group-ID directory its group (a mount sets this).
    pub fn set_setgid_inherit(&mut self, on: bool) {
        self.setgid_inherit = on;
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }
    pub fn store(&self) -> &Arc<dyn BlockStore> {
        &self.store
    }

    async fn alloc(&self, pool: &Mutex<IdPool>, counter: &'static [u8], batch: u64) -> Result<u64> {
        let mut p = pool.lock().await;
        if p.next >= p.end {
            let ((start, end), _) = transact!(self, |tx| {
                let cur = crate::journal::parse_counter(tx.get(counter).await?.as_deref())? as u64;
                tx.put(counter.to_vec(), (cur + batch).to_string().into_bytes());
                tx.set_op(if counter == keys::NEXT_INODE {
                    Op::AllocInodes {
                        start: cur,
                        count: batch,
                    }
                } else {
                    Op::AllocSlices {
                        start: cur,
                        count: batch,
                    }
                });
                Ok::<_, Error>((cur, cur + batch))
            })?;
            p.next = start;
            p.end = end;
        }
        let id = p.next;
        p.next += 1;
        Ok(id)
    }

    pub(crate) async fn alloc_inode(&self) -> Result<Ino> {
        self.alloc(&self.inodes, keys::NEXT_INODE, INODE_BATCH)
            .await
    }
    pub(crate) async fn alloc_slice(&self) -> Result<u64> {
        self.alloc(&self.slices, keys::NEXT_SLICE, SLICE_BATCH)
            .await
    }

    /// Change volume settings (journaled like any metadata).
    pub async fn update_settings(&mut self, what: &str, f: impl Fn(&mut Settings)) -> Result<u64> {
        let mut next = Settings::clone(&self.settings);
        let ((), seq) = transact!(self, |tx| {
            let cur: Settings = match tx.get(keys::SETTING).await? {
                Some(v) => serde_json::from_slice(&v)
                    .map_err(|e| crate::error::corrupt(format!("settings: {e}")))?,
                None => {
                    return Err(Error::new(
                        ErrorKind::NotFormatted,
                        "volume is not formatted",
                    ))
                }
            };
            next = cur;
            f(&mut next);
            tx.put(
                keys::SETTING.to_vec(),
                serde_json::to_vec(&next).expect("settings serialize"),
            );
            tx.set_op(Op::Settings {
                what: what.to_string(),
            });
            Ok::<_, Error>(())
        })?;
        self.set_trash_secs(next.trash_secs);
        self.settings = next;
        Ok(seq)
    }
}
