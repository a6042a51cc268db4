//! The local disk cache of blocks (the read layer above it is `cached.rs`).
//!
//! Blocks are immutable and named by their key, so a cached block never goes stale: it is
//! valid until evicted. Each block is one file, `<dir>/<volume uuid>/raw/chunks/A/B/ID_I_LEN`
//! (the block key without the volume name), holding a 16-byte header (magic `JFSC`, version,
//! length, CRC32C of the data) and the data. A read checks the header against the file and the
//! key: a torn, truncated or bit-flipped file is removed and the block refetched, never served.
//! Files are written to a temporary name and renamed, so a crash leaves either nothing or a
//! whole file (plus temporaries, removed at the next start). A file of another format version
//! (the header's) is a miss and is replaced: a cache needs no migration.
//!
//! The index (key, size, recency) lives in memory and is rebuilt by scanning the directory at
//! start, oldest first by modification time, so the cache survives restarts. Eviction is LRU,
//! by capacity (`--cache-size`) and by the disk's free space (`--free-space-ratio`): the cache
//! never fills the disk it lives on. Only block keys of this volume are cached.
//!
//! A cached block is the volume's bytes whatever the mode of its file, so the cache is the
//! mount user's alone: files are created 0600 and directories 0700 from the start (not
//! chmod-ed after, and whatever the umask), or `--cache-mode` and its directory mode.

use crate::metrics::StoreMetrics;
use bytes::Bytes;
use fs_core::error::{Error, ErrorKind, Result};
use lru::LruCache;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const MAGIC: &[u8; 4] = b"JFSC";
const VERSION: u8 = 1;
const HEADER: usize = 16;

/// Where and how big the cache is.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    /// Bytes of blocks kept at most (headers included).
    pub capacity: u64,
    /// Keep at least this share of the disk free (0.1 = 10%).
    pub free_ratio: f64,
    /// The permission bits of cached files (`--cache-mode`, 0600 by default); directories get
    /// the same bits plus search where read is given (0600 -> 0700, 0640 -> 0750). The umask
    /// can only take bits away.
    pub mode: u32,
}

impl CacheConfig {
    /// The mode of the cache's directories (see `mode`).
    pub fn dir_mode(&self) -> u32 {
        let m = self.mode & 0o777;
        m | ((m & 0o444) >> 2) | 0o700
    }
}

/// Create `dir` and its missing parents with mode `mode` (the umask can only take bits away).
pub(crate) fn create_dirs(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
}

/// Create `path` for writing (truncated if there), with mode `mode` from its first byte.
pub(crate) fn create_file(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
}

pub(crate) struct Index {
    pub(crate) lru: LruCache<String, u64>,
    pub(crate) used: u64,
    /// Room promised to inserts being written (so concurrent fills never overshoot).
    pub(crate) reserved: u64,
}

pub struct DiskCache {
    pub(crate) root: PathBuf,
    /// Mode of the files (`CacheConfig::mode`) and of the directories it creates.
    pub(crate) file_mode: u32,
    pub(crate) dir_mode: u32,
    volume: String,
    pub(crate) capacity: u64,
    free_ratio: f64,
    pub(crate) index: Mutex<Index>,
    pub(crate) metrics: Arc<StoreMetrics>,
}

/// What the cache holds of some blocks (`jfs warmup --check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheUsage {
    pub items: u64,
    pub bytes: u64,
    pub capacity: u64,
}

/// The header a cache file starts with: magic, version, the block's length and CRC32C.
fn header(len: usize, crc: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(MAGIC);
    h[4] = VERSION;
    h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Read a cache file whole, 256 KiB at a time, summing the block past its header piece by
/// piece while it is still in the CPU's cache: the file, and the CRC32C of its block.
fn read_summed(path: &Path) -> std::io::Result<(Vec<u8>, u32)> {
    use std::io::Read;
    const PIECE: u64 = 256 << 10;
    let mut f = std::fs::File::open(path)?;
    let mut file = Vec::with_capacity(f.metadata()?.len() as usize);
    let mut crc = 0;
    loop {
        let start = file.len();
        if (&mut f).take(PIECE).read_to_end(&mut file)? == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &file[start.max(HEADER).min(file.len())..]);
    }
    Ok((file, crc))
}

/// The data of a cache file, if it is whole and is the block `want_len` long, with the
/// CRC32C it was stored with (checked here against `summed`, the data's, from `read_summed`).
fn decode(file: Vec<u8>, want_len: u32, summed: u32) -> Option<(Bytes, u32)> {
    if file.len() < HEADER || &file[..4] != MAGIC || file[4] != VERSION {
        return None;
    }
    let len = u32::from_le_bytes(file[8..12].try_into().unwrap());
    let crc = u32::from_le_bytes(file[12..16].try_into().unwrap());
    if len != want_len || file.len() != HEADER + len as usize {
        return None;
    }
    // The block is the file past its header: a view of the buffer read, not a copy.
    let data = Bytes::from(file).slice(HEADER..);
    (summed == crc).then_some((data, crc))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("cache: {what} {}: {e}", path.display()),
    )
}

impl DiskCache {
    /// Open (create) the cache of volume `volume` (`uuid`) under `cfg.dir` and rebuild its
    /// index from the files there.
    pub fn open(
        cfg: &CacheConfig,
        volume: &str,
        uuid: &str,
        metrics: Arc<StoreMetrics>,
    ) -> Result<Arc<DiskCache>> {
        if !(0.0..1.0).contains(&cfg.free_ratio) {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "--free-space-ratio {} must be in 0..1 (e.g. 0.1 keeps 10% of the disk free)",
                    cfg.free_ratio
                ),
            ));
        }
        if cfg.mode & !0o777 != 0 || cfg.mode & 0o600 != 0o600 {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "--cache-mode {:o} must be permission bits that let the owner read and write (0600, the default; 0640 lets the group read)",
                    cfg.mode
                ),
            ));
        }
        let root = cfg.dir.join(uuid).join("raw");
        create_dirs(&root, cfg.dir_mode()).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "cache directory {}: {e}; choose another with --cache-dir",
                    cfg.dir.display()
                ),
            )
        })?;
        let c = DiskCache {
            root,
            file_mode: cfg.mode & 0o777,
            dir_mode: cfg.dir_mode(),
            volume: volume.to_string(),
            capacity: cfg.capacity,
            free_ratio: cfg.free_ratio,
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                used: 0,
                reserved: 0,
            }),
            metrics,
        };
        c.metrics.cache_capacity.set(cfg.capacity as i64);
        let t0 = Instant::now();
        let (found, removed) = c.rebuild()?;
        c.make_room(0);
        tracing::info!(
            dir = %c.root.display(),
            blocks = found,
            bytes = c.usage().bytes,
            removed_partial = removed,
            ms = t0.elapsed().as_millis() as u64,
            "local block cache ready"
        );
        Ok(Arc::new(c))
    }

    fn rel_path(&self, key: &str) -> Option<(PathBuf, u32)> {
        let (_, _, len) = fs_core::keys::parse_block_key(&self.volume, key)?;
        let rel = key.strip_prefix(&self.volume)?.strip_prefix('/')?;
        Some((self.root.join(rel), len))
    }

    /// Whether `key` is a block this cache would hold.
    pub fn cacheable(&self, key: &str) -> bool {
        self.rel_path(key).is_some()
    }

    /// Scan the directory: whole files enter the index (oldest first), temporaries and files
    /// that cannot be blocks are removed.
    fn rebuild(&self) -> Result<(u64, u64)> {
        let mut files: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        let mut removed = 0u64;
        let chunks = self.root.join("chunks");
        let mut stack = vec![(chunks.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("listing", &dir, e)),
            };
            for e in rd {
                let e = e.map_err(|e| io_err("listing", &dir, e))?;
                let path = e.path();
                let ft = e.file_type().map_err(|e| io_err("stat", &path, e))?;
                if ft.is_dir() && depth < 2 {
                    stack.push((path, depth + 1));
                    continue;
                }
                let key = path
                    .strip_prefix(&self.root)
                    .ok()
                    .and_then(|r| r.to_str())
                    .map(|r| format!("{}/{r}", self.volume));
                let meta = e.metadata().map_err(|e| io_err("stat", &path, e))?;
                match key.as_deref().and_then(|k| self.rel_path(k)) {
                    Some((_, len)) if ft.is_file() && meta.len() == HEADER as u64 + len as u64 => {
                        files.push((
                            meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                            key.unwrap(),
                            meta.len(),
                        ));
                    }
                    _ => {
                        // A temporary left by a crash, a torn file, or something foreign.
                        let _ = if ft.is_dir() {
                            std::fs::remove_dir_all(&path)
                        } else {
                            std::fs::remove_file(&path)
                        };
                        removed += 1;
                    }
                }
            }
        }
        removed += self.rebuild_whole(&mut files);
        files.sort();
        let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        for (_, key, size) in &files {
            ix.lru.put(key.clone(), *size);
            ix.used += size;
        }
        self.publish(&ix);
        Ok((files.len() as u64, removed))
    }

    pub(crate) fn publish(&self, ix: &Index) {
        self.metrics.cache_bytes.set(ix.used as i64);
        self.metrics.cache_items.set(ix.lru.len() as i64);
    }

    pub fn usage(&self) -> CacheUsage {
        let ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        CacheUsage {
            items: ix.lru.len() as u64,
            bytes: ix.used,
            capacity: self.capacity,
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lru
            .contains(key)
    }

    pub(crate) fn forget(&self, key: &str) {
        let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(size) = ix.lru.pop(key) {
            ix.used -= size;
        }
        self.publish(&ix);
    }

    /// The block, if the cache holds it whole. A damaged file is removed (and counted).
    /// The cached block `key`, if its cache file is whole and, when `crc` is given (the
    /// checksum its slice recorded), holds that very block; a failing file is removed.
    pub async fn lookup(&self, key: &str, crc: Option<u32>) -> Option<Bytes> {
        let (path, len) = self.rel_path(key)?;
        if !self.contains(key) {
            return None;
        }
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || read_summed(&p)).await;
        match read {
            Ok(Ok((file, summed))) => {
                match decode(file, len, summed).filter(|(_, c)| crc.is_none_or(|w| w == *c)) {
                    Some((b, _)) => {
                        // Promote: recently read blocks are evicted last.
                        self.index
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .lru
                            .get(key);
                        Some(b)
                    }
                    None => {
                        tracing::warn!(key, path = %path.display(), "cache file is damaged (torn, corrupted, or not the block its slice's checksum names): removed, the block is fetched from the store");
                        self.metrics.cache_damaged.inc();
                        let _ = std::fs::remove_file(&path);
                        self.forget(key);
                        None
                    }
                }
            }
            Ok(Err(e)) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(key, error = %e, "reading the cache failed; fetching from the store");
                }
                self.forget(key);
                None
            }
            Err(_) => None,
        }
    }

    /// Store a block (not synced: see `sync`). Returns false when the block was not cached
    /// (too big for the cache, or the disk is at its floor).
    pub async fn insert(self: &Arc<Self>, key: &str, data: Bytes) -> Result<bool> {
        self.insert_checked(key, data, None).await
    }

    /// `insert` of a block already checked against its CRC32C `crc` (a fetch verified
    /// against the slice's checksum): the cache file records it without computing it again.
    pub async fn insert_checked(
        self: &Arc<Self>,
        key: &str,
        data: Bytes,
        crc: Option<u32>,
    ) -> Result<bool> {
        let Some((path, len)) = self.rel_path(key) else {
            return Ok(false);
        };
        if data.len() != len as usize {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("block {key} has {} bytes, its key says {len}", data.len()),
            ));
        }
        if self.contains(key) {
            return Ok(true);
        }
        let me = self.clone();
        let key = key.to_string();
        tokio::task::spawn_blocking(move || me.insert_blocking(&key, &path, &data, crc))
            .await
            .map_err(|e| Error::new(ErrorKind::Backend, format!("cache writer: {e}")))?
    }

    /// Make every block inserted so far durable: one `syncfs` of the cache's file system
    /// (the files and the renames that name them), instead of two fsyncs per block. A warm-up
    /// calls it once at its end.
    pub async fn sync(self: &Arc<Self>) -> Result<()> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            let d = std::fs::File::open(&root)?;
            rustix::fs::syncfs(&d).map_err(std::io::Error::from)
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, format!("cache writer: {e}")))?
        .map_err(|e| io_err("syncing", &self.root, e))
    }

    fn insert_blocking(
        &self,
        key: &str,
        path: &Path,
        data: &[u8],
        crc: Option<u32>,
    ) -> Result<bool> {
        let size = (HEADER + data.len()) as u64;
        if size > self.capacity || !self.make_room(size) {
            self.metrics.cache_skipped.inc();
            return Ok(false);
        }
        let dir = path.parent().expect("cache paths have a parent");
        let write = || -> std::io::Result<()> {
            create_dirs(dir, self.dir_mode)?;
            let tmp = dir.join(format!(
                ".{}.tmp.{:08x}",
                path.file_name().unwrap().to_string_lossy(),
                rand::random::<u32>()
            ));
            let res = (|| {
                let crc = crc.unwrap_or_else(|| crc32c::crc32c(data));
                let mut f = create_file(&tmp, self.file_mode)?;
                // The header, then the block from where it is (no copy joining the two).
                f.write_all(&header(data.len(), crc))?;
                f.write_all(data)?;
                std::fs::rename(&tmp, path)
            })();
            if res.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            res
        };
        let written = write();
        let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        ix.reserved -= size;
        if let Err(e) = written {
            drop(ix);
            self.metrics.cache_write_errors.inc();
            return Err(io_err("writing", path, e));
        }
        if let Some(old) = ix.lru.put(key.to_string(), size) {
            ix.used -= old;
        }
        ix.used += size;
        self.publish(&ix);
        Ok(true)
    }

    /// Share of the disk free now (1.0 when it cannot be told).
    fn free_share(&self) -> f64 {
        match rustix::fs::statvfs(&self.root) {
            Ok(s) if s.f_blocks > 0 => s.f_bavail as f64 / s.f_blocks as f64,
            _ => 1.0,
        }
    }

    /// Evict least recently used blocks until `incoming` more bytes fit under the capacity
    /// and the disk keeps its free share. False when the disk is at its floor with nothing
    /// left to evict.
    pub(crate) fn make_room(&self, incoming: u64) -> bool {
        loop {
            let victim = {
                let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
                let over = ix.used + ix.reserved + incoming > self.capacity;
                if !over && self.free_share() >= self.free_ratio {
                    ix.reserved += incoming;
                    return true;
                }
                match ix.lru.pop_lru() {
                    Some((k, size)) => {
                        ix.used -= size;
                        self.publish(&ix);
                        k
                    }
                    None => {
                        let ok = !over && self.free_share() >= self.free_ratio;
                        if ok {
                            ix.reserved += incoming;
                        }
                        return ok;
                    }
                }
            };
            if let Some((path, _)) = self.rel_path(&victim) {
                let _ = std::fs::remove_file(path);
            } else {
                self.remove_whole_files(&victim);
            }
            self.metrics.cache_evictions.inc();
        }
    }

    /// Drop a block from the cache (`jfs warmup --evict`). True if it was there.
    pub fn remove(&self, key: &str) -> bool {
        let Some((path, _)) = self.rel_path(key) else {
            return false;
        };
        let was = self.contains(key);
        let _ = std::fs::remove_file(path);
        self.forget(key);
        was
    }
}

/// The harnesses of the cache's files (headers, whole-file records); declared here so that
/// they reach the private decoders.
#[cfg(test)]
#[path = "fuzz_tests.rs"]
mod fuzz_tests;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cache file read piece by piece: its bytes, and the CRC32C of everything past the
    /// header, for files shorter than a header, of one piece, and of several.
    #[test]
    fn a_file_read_in_pieces_is_summed_past_its_header() {
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0,
            10,
            HEADER,
            HEADER + 1,
            (256 << 10) - 3,
            (600 << 10) + HEADER,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            std::fs::write(&p, &data).unwrap();
            let (file, crc) = read_summed(&p).unwrap();
            assert!(file == data, "{len} bytes");
            let want = crc32c::crc32c(data.get(HEADER..).unwrap_or_default());
            assert_eq!(crc, want, "{len} bytes");
        }
    }

    fn key(id: u64, len: u32) -> String {
        fs_core::keys::block_key("vol", id, 0, len)
    }

    /// A cache of volume "vol" (uuid "uuid1") in `dir` (also the whole-file tests').
    pub(crate) fn open(dir: &Path, capacity: u64) -> Arc<DiskCache> {
        DiskCache::open(
            &CacheConfig {
                dir: dir.to_path_buf(),
                capacity,
                free_ratio: 0.0,
                mode: 0o600,
            },
            "vol",
            "uuid1",
            Arc::new(StoreMetrics::default()),
        )
        .unwrap()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn blocks_survive_a_restart_and_damage_is_never_served() {
        let d = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let c = open(d.path(), 1 << 20);
            for id in 1..=3u64 {
                assert!(c
                    .insert(&key(id, 1000), Bytes::from(vec![id as u8; 1000]))
                    .await
                    .unwrap());
            }
            c.sync().await.unwrap();
            assert!(!c.cacheable("vol/other"), "only block keys are cached");
            assert!(!c.insert("vol/other", Bytes::new()).await.unwrap());
            drop(c);
            let c = open(d.path(), 1 << 20);
            assert_eq!(c.usage().items, 3);
            assert_eq!(
                c.lookup(&key(2, 1000), None).await.unwrap(),
                vec![2u8; 1000]
            );
            // A bit flip, a truncation, a foreign temporary.
            let paths: Vec<PathBuf> = (0..=3u64)
                .map(|id| c.rel_path(&key(id, 1000)).unwrap().0)
                .collect();
            let p = |id: usize| paths[id].clone();
            let mut b = std::fs::read(p(1)).unwrap();
            b[HEADER + 500] ^= 0x10;
            std::fs::write(p(1), &b).unwrap();
            let b = std::fs::read(p(3)).unwrap();
            std::fs::write(p(3), &b[..b.len() - 1]).unwrap();
            assert!(
                c.lookup(&key(1, 1000), None).await.is_none(),
                "bit flip caught"
            );
            assert!(
                c.lookup(&key(3, 1000), None).await.is_none(),
                "truncation caught"
            );
            assert!(!p(1).exists() && !p(3).exists(), "damaged files removed");
            assert_eq!(c.metrics.cache_damaged.get(), 2);
            assert_eq!(c.usage().items, 1);
            std::fs::write(p(2).with_file_name(".x.tmp.1234"), b"torn").unwrap();
            drop(c);
            let c = open(d.path(), 1 << 20);
            assert_eq!(c.usage().items, 1);
            assert!(!p(2).with_file_name(".x.tmp.1234").exists());
            // A whole cache file that is not the block its slice's checksum names (cached
            // from a damaged source) is refused and removed too.
            let good = crc32c::crc32c(&[2u8; 1000]);
            assert!(c.lookup(&key(2, 1000), Some(good)).await.is_some());
            assert!(c.lookup(&key(2, 1000), Some(good ^ 1)).await.is_none());
            assert!(!p(2).exists());
        });
    }

    /// A block inserted with the checksum its fetch verified is stored byte for byte as one
    /// whose checksum the cache computes, and reads back under that checksum.
    #[test]
    fn a_block_inserted_with_its_checksum_is_the_same_file() {
        let d = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let c = open(d.path(), 1 << 24);
            let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
            let crc = crc32c::crc32c(&data);
            let (a, b) = (key(1, data.len() as u32), key(2, data.len() as u32));
            assert!(c.insert(&a, Bytes::from(data.clone())).await.unwrap());
            assert!(c
                .insert_checked(&b, Bytes::from(data.clone()), Some(crc))
                .await
                .unwrap());
            let file = |k: &str| std::fs::read(c.rel_path(k).unwrap().0).unwrap();
            assert_eq!(file(&a), file(&b));
            assert_eq!(file(&b).len(), HEADER + data.len());
            assert_eq!(c.lookup(&b, Some(crc)).await.unwrap(), data);
        });
    }

    /// The cache's record is its file header. A cache is disposable, so its migration is
    /// a miss: a file of another format version (a newer release's, or a bare block from
    /// before the header) is never served, is removed, and the next insert replaces it.
    #[test]
    fn a_cache_file_of_another_format_is_a_miss_and_is_replaced() {
        let d = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let c = open(d.path(), 1 << 20);
            let data = Bytes::from(vec![7u8; 1000]);
            assert!(c.insert(&key(1, 1000), data.clone()).await.unwrap());
            assert!(c.insert(&key(2, 1000), data.clone()).await.unwrap());
            let p1 = c.rel_path(&key(1, 1000)).unwrap().0;
            let p2 = c.rel_path(&key(2, 1000)).unwrap().0;
            let mut newer = std::fs::read(&p1).unwrap();
            assert_eq!(newer[4], VERSION);
            newer[4] = VERSION + 1;
            std::fs::write(&p1, &newer).unwrap();
            std::fs::write(&p2, &data).unwrap();
            drop(c);
            let c = open(d.path(), 1 << 20);
            assert!(
                c.lookup(&key(1, 1000), None).await.is_none(),
                "newer format served"
            );
            assert!(
                c.lookup(&key(2, 1000), None).await.is_none(),
                "headerless file served"
            );
            assert!(
                !p1.exists() && !p2.exists(),
                "files of another format removed"
            );
            assert_eq!(c.usage().items, 0);
            assert!(c.insert(&key(1, 1000), data.clone()).await.unwrap());
            assert_eq!(c.lookup(&key(1, 1000), None).await.unwrap(), data);
            assert_eq!(std::fs::read(&p1).unwrap()[4], VERSION);
        });
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_size_holds() {
        let d = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let per = (HEADER + 1000) as u64;
            let c = open(d.path(), 3 * per);
            for id in 1..=3u64 {
                c.insert(&key(id, 1000), Bytes::from(vec![0; 1000]))
                    .await
                    .unwrap();
            }
            c.lookup(&key(1, 1000), None).await.unwrap(); // 1 is now the most recent
            c.insert(&key(4, 1000), Bytes::from(vec![0; 1000]))
                .await
                .unwrap();
            assert!(c.contains(&key(1, 1000)) && !c.contains(&key(2, 1000)));
            assert_eq!(c.usage().bytes, 3 * per);
            assert_eq!(c.metrics.cache_evictions.get(), 1);
            // Too big for the whole cache: not cached.
            assert!(!c
                .insert(&key(5, 4000), Bytes::from(vec![0; 4000]))
                .await
                .unwrap());
            // A smaller capacity at the next start evicts down to it.
            drop(c);
            let c = open(d.path(), per);
            assert_eq!(c.usage().items, 1);
        });
    }
}
