//! Whole-file entries of the local cache: one file's bytes assembled into one local file,
//! which a mount hands to the kernel for FUSE passthrough (reads and mmap then go to the local
//! disk without the mount in the path).
//!
//! An entry is `<dir>/<volume uuid>/whole/<ino>` (the bytes, mode 0400: the cache's mode made
//! read-only; the mount opens it for the kernel) and `<ino>.rec` (its
//! record: the file's content version it holds, a CRC32C per 4 MiB, and the stamp the local
//! file had once written: device, inode, size, mtime, ctime). It is made from bytes read
//! through the checked read path, written to a temporary name, synced, renamed, and only then
//! recorded; a crash leaves a temporary or an entry without record, both removed at the next
//! start. It shares the block cache's index: one LRU, one capacity, one free-space floor.
//!
//! Invariants: an entry is handed out only for the exact content version asked for (a change
//! at the primary, or a new version applied at a mirror, is never served from it), and only
//! while its file still has the stamp recorded (any write, truncate or replacement changes
//! the ctime or the inode); the caller asks for a full CRC check before the first hand-off
//! in a process. A failing entry is removed and counted (`jfs_cache_damaged`).

use crate::cache::DiskCache;
use fs_core::error::{Error, ErrorKind, Result};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Index keys of whole-file entries (block keys start with the volume name, never with `@`).
const PREFIX: &str = "@whole/";
/// Bytes per CRC32C in an entry's record.
pub(crate) const SEG: u64 = 4 << 20;
pub(crate) const FORMAT: u32 = 1;

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Eq, Debug, Clone, Copy)]
pub(crate) struct Stamp {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) mtime_ns: i64,
    pub(crate) ctime_ns: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) format: u32,
    /// The content version (`Fs::content_version`), hex.
    pub(crate) version: String,
    /// One CRC32C per `SEG` bytes of the file (the last of what is left): exactly as many as
    /// its size needs, so that the full check covers every byte.
    pub(crate) crcs: Vec<u32>,
    pub(crate) stamp: Stamp,
}

/// Why an entry's record cannot be trusted, if it cannot: it does not decode, or its CRCs do
/// not cover its file exactly (one too few would leave the tail unchecked; one too many is
/// not what was written). A record of another format decodes: it is old, not damaged.
pub(crate) fn decode_record(raw: &[u8]) -> std::result::Result<Record, &'static str> {
    let r: Record =
        serde_json::from_slice(raw).map_err(|_| "its record is missing or does not decode")?;
    if r.format == FORMAT && r.crcs.len() as u64 != r.stamp.size.div_ceil(SEG) {
        return Err("its record's checksums do not cover its size");
    }
    Ok(r)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Backend, format!("whole-file cache: {what}: {e}"))
}

impl DiskCache {
    fn whole_dir(&self) -> PathBuf {
        self.root
            .parent()
            .expect("the cache root has a parent")
            .join("whole")
    }

    fn whole_paths(&self, ino: u64) -> (PathBuf, PathBuf) {
        let d = self.whole_dir();
        (d.join(ino.to_string()), d.join(format!("{ino}.rec")))
    }

    /// Remove the files of index key `key` if it names a whole-file entry.
    pub(crate) fn remove_whole_files(&self, key: &str) {
        if let Some(ino) = key.strip_prefix(PREFIX).and_then(|i| i.parse().ok()) {
            let (data, rec) = self.whole_paths(ino);
            let _ = std::fs::remove_file(rec);
            let _ = std::fs::remove_file(data);
        }
    }

    /// Whole-file entries found at start (with their records) join `files`; temporaries and
    /// entries without a readable record are removed. Returns how many were removed.
    pub(crate) fn rebuild_whole(
        &self,
        files: &mut Vec<(std::time::SystemTime, String, u64)>,
    ) -> u64 {
        let Ok(rd) = std::fs::read_dir(self.whole_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".rec") {
                continue;
            }
            // Only the name an entry is written under: `u64::from_str` also takes "+5" and
            // "05", which would index inode 5 a second time (its bytes counted twice) and
            // keep the foreign file.
            let ino = name
                .parse::<u64>()
                .ok()
                .filter(|ino| ino.to_string() == name);
            let kept = ino.and_then(|ino| {
                let (data, rec) = self.whole_paths(ino);
                let r = std::fs::read(&rec).ok()?;
                let m = std::fs::metadata(&data).ok()?;
                decode_record(&r).ok()?;
                Some((
                    m.modified().ok()?,
                    format!("{PREFIX}{ino}"),
                    m.len() + r.len() as u64,
                ))
            });
            match kept {
                Some(f) => files.push(f),
                None => {
                    let _ = std::fs::remove_file(e.path());
                    let _ = std::fs::remove_file(self.whole_dir().join(format!("{name}.rec")));
                    removed += 1;
                }
            }
        }
        // Records whose bytes are gone.
        if let Ok(rd) = std::fs::read_dir(self.whole_dir()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(".rec") {
                    if !self.whole_dir().join(stem).exists() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        removed
    }

    fn drop_whole(&self, ino: u64, why: &str) {
        let key = format!("{PREFIX}{ino}");
        tracing::warn!(ino, why, "whole-file cache entry removed: it is never served; the file is read through the mount until it is made again");
        self.metrics.cache_damaged.inc();
        self.remove_whole_files(&key);
        self.forget(&key);
    }

    /// Drop the entry of `ino` (`jfs warmup --evict`); an open backed by it reads on from
    /// the unlinked file. True if there was one.
    pub fn remove_whole(&self, ino: u64) -> bool {
        let key = format!("{PREFIX}{ino}");
        let was = self.contains(&key);
        self.remove_whole_files(&key);
        self.forget(&key);
        was
    }

    /// Whether an entry of `ino` is indexed (whatever version it holds).
    pub fn has_whole(&self, ino: u64) -> bool {
        self.contains(&format!("{PREFIX}{ino}"))
    }

    /// The whole-file entry of `ino`, opened read-only, if it holds content version
    /// `version` and its file is as it was written; with `verify`, every byte is also
    /// checked against the record's CRCs. An entry of another version is removed (a newer
    /// one is made in its place); a damaged one is removed and counted. Blocking I/O.
    pub fn open_whole(&self, ino: u64, version: &[u8], verify: bool) -> Option<std::fs::File> {
        let key = format!("{PREFIX}{ino}");
        if !self.contains(&key) {
            return None;
        }
        let (data, rec) = self.whole_paths(ino);
        let r = match std::fs::read(&rec)
            .map_err(|_| "its record is missing or does not decode")
            .and_then(|b| decode_record(&b))
        {
            Ok(r) => r,
            Err(why) => {
                self.drop_whole(ino, why);
                return None;
            }
        };
        if r.format != FORMAT || r.version != hex(version) {
            // Another version of the file (or another format): not damage, just old.
            self.remove_whole_files(&key);
            self.forget(&key);
            return None;
        }
        let mut f = match std::fs::File::open(&data) {
            Ok(f) => f,
            Err(_) => {
                self.drop_whole(ino, "its file cannot be opened");
                return None;
            }
        };
        match f.metadata() {
            Ok(m) if Stamp::of(&m) == r.stamp => {}
            _ => {
                self.drop_whole(
                    ino,
                    "its file changed after it was written (size, inode or ctime differ)",
                );
                return None;
            }
        }
        if verify {
            let mut buf = vec![0u8; SEG as usize];
            for (i, want) in r.crcs.iter().enumerate() {
                let n = (r.stamp.size - i as u64 * SEG).min(SEG) as usize;
                if f.read_exact(&mut buf[..n]).is_err() || crc32c::crc32c(&buf[..n]) != *want {
                    self.drop_whole(ino, "its bytes fail their CRC32C");
                    return None;
                }
            }
            if std::io::Seek::rewind(&mut f).is_err() {
                return None;
            }
        }
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lru
            .get(&key);
        Some(f)
    }

    /// Start an entry of `ino`, `len` bytes long, if there is room for it (the room is
    /// reserved until the writer finishes or is dropped). Blocking I/O.
    pub fn whole_writer(self: &Arc<Self>, ino: u64, len: u64) -> Result<Option<WholeWriter>> {
        let size = len + 4096;
        if size > self.capacity || !self.make_room(size) {
            self.metrics.cache_skipped.inc();
            return Ok(None);
        }
        let dir = self.whole_dir();
        let tmp = dir.join(format!(".{ino}.tmp.{:08x}", rand::random::<u32>()));
        let file = crate::cache::create_dirs(&dir, self.dir_mode)
            .and_then(|_| crate::cache::create_file(&tmp, self.file_mode))
            .map_err(|e| {
                self.release_room(size);
                io_err(&format!("creating {}", tmp.display()), e)
            })?;
        Ok(Some(WholeWriter {
            cache: self.clone(),
            ino,
            len,
            tmp,
            file: Some(file),
            crcs: Vec::new(),
            crc: 0,
            written: 0,
            reserved: size,
        }))
    }

    fn release_room(&self, size: u64) {
        let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        ix.reserved -= size;
    }
}

/// An entry being written (see `DiskCache::whole_writer`); dropped unfinished, it leaves
/// nothing behind.
pub struct WholeWriter {
    cache: Arc<DiskCache>,
    ino: u64,
    len: u64,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    crcs: Vec<u32>,
    crc: u32,
    written: u64,
    reserved: u64,
}

impl WholeWriter {
    /// Append the next bytes of the file (verified bytes from the read path). Blocking I/O.
    pub fn write(&mut self, mut data: &[u8]) -> Result<()> {
        if self.written + data.len() as u64 > self.len {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "whole-file cache: more than {} bytes given for inode {}",
                    self.len, self.ino
                ),
            ));
        }
        let f = self.file.as_mut().expect("open until finished");
        // Pieces of a local store's blocks start page-aligned (its pooled read buffers):
        // those go with O_DIRECT.
        objstore::write_at_end(f, self.written, data).map_err(|e| io_err("writing", e))?;
        while !data.is_empty() {
            let room = (SEG - self.written % SEG) as usize;
            let n = room.min(data.len());
            self.crc = crc32c::crc32c_append(self.crc, &data[..n]);
            self.written += n as u64;
            if self.written.is_multiple_of(SEG) {
                self.crcs.push(std::mem::take(&mut self.crc));
            }
            data = &data[n..];
        }
        Ok(())
    }

    /// Make the entry durable and findable, holding content `version`. Blocking I/O.
    pub fn finish(mut self, version: &[u8]) -> Result<()> {
        if self.written != self.len {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "whole-file cache: {} of {} bytes given for inode {}",
                    self.written, self.len, self.ino
                ),
            ));
        }
        if !self.written.is_multiple_of(SEG) {
            self.crcs.push(self.crc);
        }
        let f = self.file.take().expect("open until finished");
        let (data, rec) = self.cache.whole_paths(self.ino);
        let key = format!("{PREFIX}{}", self.ino);
        // An older entry of the same inode goes first (its room is given back).
        self.cache.remove_whole_files(&key);
        self.cache.forget(&key);
        let meta = (|| {
            f.sync_all()?;
            let mut p = f.metadata()?.permissions();
            // Read-only to whoever may read the cache: the mount opens it as a backing file.
            std::os::unix::fs::PermissionsExt::set_mode(&mut p, self.cache.file_mode & 0o444);
            f.set_permissions(p)?;
            std::fs::rename(&self.tmp, &data)?;
            // The stamp after the rename (which changes the ctime).
            std::fs::metadata(&data)
        })()
        .map_err(|e| io_err("finishing", e))?;
        let r = serde_json::to_vec(&Record {
            format: FORMAT,
            version: hex(version),
            crcs: std::mem::take(&mut self.crcs),
            stamp: Stamp::of(&meta),
        })
        .expect("a record encodes");
        let rtmp = rec.with_extension("rec.tmp");
        (|| {
            let mut g = crate::cache::create_file(&rtmp, self.cache.file_mode)?;
            g.write_all(&r)?;
            g.sync_all()?;
            std::fs::rename(&rtmp, &rec)?;
            std::fs::File::open(self.cache.whole_dir())?.sync_all()
        })()
        .map_err(|e| {
            let _ = std::fs::remove_file(&data);
            io_err("recording", e)
        })?;
        let size = self.len + r.len() as u64;
        let mut ix = self.cache.index.lock().unwrap_or_else(|p| p.into_inner());
        ix.reserved -= self.reserved;
        self.reserved = 0;
        if let Some(old) = ix.lru.put(key, size) {
            ix.used -= old;
        }
        ix.used += size;
        self.cache.publish(&ix);
        Ok(())
    }
}

impl Drop for WholeWriter {
    fn drop(&mut self) {
        if self.reserved > 0 {
            self.cache.release_room(self.reserved);
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cache::tests::open;
    use crate::cache::DiskCache;
    use std::io::Read;
    use std::sync::Arc;

    fn make(c: &Arc<DiskCache>, ino: u64, data: &[u8], version: &[u8]) {
        let mut w = c.whole_writer(ino, data.len() as u64).unwrap().unwrap();
        for part in data.chunks(1 << 20) {
            w.write(part).unwrap();
        }
        w.finish(version).unwrap();
    }

    fn bytes_of(mut f: std::fs::File) -> Vec<u8> {
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn an_entry_serves_only_its_version_and_survives_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let data: Vec<u8> = (0..9_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        make(&c, 5, &data, b"v1");
        assert_eq!(bytes_of(c.open_whole(5, b"v1", true).unwrap()), data);
        drop(c);
        let c = open(d.path(), 1 << 30);
        assert_eq!(c.usage().items, 1, "the entry is found at start");
        assert_eq!(bytes_of(c.open_whole(5, b"v1", true).unwrap()), data);
        // Another version of the file: never served, and the old entry is gone.
        assert!(c.open_whole(5, b"v2", false).is_none());
        assert!(!c.has_whole(5));
        assert!(c.open_whole(5, b"v1", false).is_none());
    }

    #[test]
    fn an_altered_or_torn_entry_is_never_served() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let data = vec![3u8; 5 << 20];
        make(&c, 9, &data, b"v");
        let path = d.path().join("uuid1/whole/9");
        // Altered in place (one byte): the ctime moves, the stamp no longer matches.
        let mut p = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o644);
        std::fs::set_permissions(&path, p).unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b"X").unwrap();
        drop(f);
        assert!(c.open_whole(9, b"v", false).is_none());
        assert!(!path.exists(), "a damaged entry is removed");
        // A crash half-way: a temporary and an entry without its record; both removed at
        // the next start, nothing indexed.
        make(&c, 10, &data, b"v");
        std::fs::remove_file(d.path().join("uuid1/whole/10.rec")).unwrap();
        std::fs::write(d.path().join("uuid1/whole/.11.tmp.00000000"), b"half").unwrap();
        drop(c);
        let c = open(d.path(), 1 << 30);
        assert_eq!(c.usage().items, 0);
        assert!(std::fs::read_dir(d.path().join("uuid1/whole"))
            .unwrap()
            .next()
            .is_none());
    }

    #[test]
    fn a_flipped_bit_fails_the_full_check() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let data = vec![1u8; 6 << 20];
        make(&c, 4, &data, b"v");
        // Change one byte and put the stamp back as it was: only the CRC check can see it.
        let path = d.path().join("uuid1/whole/4");
        let rec_path = d.path().join("uuid1/whole/4.rec");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[5 << 20] ^= 1;
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        let mut rec: super::Record =
            serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
        rec.stamp = super::Stamp::of(&m);
        std::fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
        assert!(
            c.open_whole(4, b"v", false).is_some(),
            "the stamp alone passes"
        );
        assert!(
            c.open_whole(4, b"v", true).is_none(),
            "the CRC check fails it"
        );
        assert!(!path.exists());
    }

    /// A record whose CRCs stop short of its file (or run past it) is not trusted: a flipped
    /// byte in the part no CRC covered would otherwise pass the full check and be served.
    #[test]
    fn a_record_whose_checksums_do_not_cover_its_file_is_never_served() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let data = vec![1u8; 6 << 20];
        for (ino, keep) in [(4u64, 1usize), (5, 0), (6, 3)] {
            make(&c, ino, &data, b"v");
            // A byte of the second 4 MiB changed, the stamp put back as it now is, and the
            // record's CRCs cut to `keep` (3: one made up past the end).
            let path = d.path().join(format!("uuid1/whole/{ino}"));
            let rec_path = d.path().join(format!("uuid1/whole/{ino}.rec"));
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[5 << 20] ^= 1;
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            let mut rec: super::Record =
                serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
            assert_eq!(rec.crcs.len(), 2);
            rec.stamp = super::Stamp::of(&std::fs::metadata(&path).unwrap());
            rec.crcs.resize(keep, 7);
            std::fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
            assert!(
                c.open_whole(ino, b"v", true).is_none(),
                "an entry with {keep} CRCs for 6 MiB was served"
            );
            assert!(!path.exists(), "the untrusted entry is removed");
        }
    }

    /// Files in the whole-file directory named as an inode number is not written ("+5",
    /// "05") are removed at start, never indexed as that inode a second time.
    #[test]
    fn a_file_named_like_an_entry_but_not_as_one_is_removed_at_start() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 1 << 30);
        let data = vec![2u8; 1 << 20];
        make(&c, 5, &data, b"v");
        let one = c.usage();
        drop(c);
        let dir = d.path().join("uuid1/whole");
        for odd in ["+5", "05", "+5.rec", "05.rec"] {
            std::fs::copy(dir.join(odd.replace(['+', '0'], "")), dir.join(odd)).unwrap();
        }
        let c = open(d.path(), 1 << 30);
        assert_eq!((c.usage().items, c.usage().bytes), (one.items, one.bytes));
        for odd in ["+5", "05", "+5.rec", "05.rec"] {
            assert!(!dir.join(odd).exists(), "{odd} was kept");
        }
        assert_eq!(bytes_of(c.open_whole(5, b"v", true).unwrap()), data);
    }

    #[test]
    fn entries_share_the_block_cache_capacity() {
        let d = tempfile::tempdir().unwrap();
        let c = open(d.path(), 12 << 20);
        make(&c, 1, &vec![0u8; 5 << 20], b"a");
        make(&c, 2, &vec![0u8; 5 << 20], b"b");
        // A third does not fit beside the first two: the least recently used goes.
        make(&c, 3, &vec![0u8; 5 << 20], b"c");
        assert!(!c.has_whole(1));
        assert!(c.has_whole(2) && c.has_whole(3));
        assert!(c.usage().bytes <= 12 << 20);
        // Bigger than the whole cache: not made.
        assert!(c.whole_writer(4, 20 << 20).unwrap().is_none());
    }
}
