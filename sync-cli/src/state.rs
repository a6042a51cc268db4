//! Resume state of one sync job in RocksDB (default under ~/.cache/jfs-sync/<hash of src, dst
//! and options>): the listing cursor (every key at or before it is resolved) with the tally of
//! what those keys came to, the keys copied after it (with what was done to them), the
//! destination keys to delete at the end, and the journal position for `--from-journal`.
//! Puts go through the WAL without fsync: a killed process (even kill -9) loses nothing the
//! OS has, and a lost tail only means a few objects are copied again.

use anyhow::{Context, Result};
use rocksdb::{WriteBatch, DB};
use std::path::{Path, PathBuf};

pub struct State {
    db: DB,
    path: PathBuf,
}

const CURSOR: &[u8] = b"cursor";
/// JSON `Summary` of the keys at or before the cursor, over every attempt of this job.
const TALLY: &[u8] = b"tally";
/// Deletes done so far in the deletion step (it may be interrupted too).
const DELETED: &[u8] = b"deleted";
const JOURNAL_SEQ: &[u8] = b"journal_seq";
const DONE: &[u8] = b"done:";
const DELETE: &[u8] = b"del:";
const MULTIPART: &[u8] = b"mpu:";

fn k(prefix: &[u8], key: &str) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.extend_from_slice(key.as_bytes());
    v
}

/// (size, mtime) of a completed copy.
fn stamp(size: u64, mtime_ns: i64) -> String {
    format!("{size} {mtime_ns}")
}

/// What an earlier attempt did to a key it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    Copied,
    Updated,
    Skipped,
}

impl State {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)
            .with_context(|| format!("creating the state dir {}", path.display()))?;
        let mut o = meta::base_options();
        o.create_if_missing(true);
        // Small memtables: a million done-keys should not cost 64 MiB buffers of RAM.
        o.set_write_buffer_size(8 << 20);
        o.set_max_write_buffer_number(2);
        let db = DB::open(&o, path).with_context(|| {
            format!(
                "opening the state in {} (is another jfs-sync running the same job?)",
                path.display()
            )
        })?;
        Ok(State {
            db,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn cursor(&self) -> Result<Option<String>> {
        Ok(self
            .db
            .get(CURSOR)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    pub fn set_cursor(&self, key: &str) -> Result<()> {
        Ok(self.db.put(CURSOR, key)?)
    }

    /// The tally of the keys at or before the cursor, from earlier attempts.
    pub fn tally(&self) -> Result<Option<crate::stats::Summary>> {
        Ok(self
            .db
            .get(TALLY)?
            .and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// Move the cursor and record the tally of everything at or before it, in one write.
    pub fn checkpoint(&self, cursor: &str, tally: &crate::stats::Summary) -> Result<()> {
        let mut b = WriteBatch::default();
        b.put(CURSOR, cursor);
        b.put(TALLY, serde_json::to_vec(tally)?);
        Ok(self.db.write(b)?)
    }

    pub fn mark_done(&self, key: &str, size: u64, mtime_ns: i64, what: Done) -> Result<()> {
        let tag = match what {
            Done::Copied => "c",
            Done::Updated => "u",
            Done::Skipped => "s",
        };
        Ok(self
            .db
            .put(k(DONE, key), format!("{} {tag}", stamp(size, mtime_ns)))?)
    }

    /// Was this exact source version already finished by an earlier (interrupted) run, and
    /// what was done to it?
    pub fn is_done(&self, key: &str, size: u64, mtime_ns: i64) -> Result<Option<Done>> {
        let Some(v) = self.db.get(k(DONE, key))? else {
            return Ok(None);
        };
        let v = String::from_utf8_lossy(&v).into_owned();
        let want = stamp(size, mtime_ns);
        let Some(rest) = v
            .strip_prefix(&want)
            .filter(|r| r.is_empty() || r.starts_with(' '))
        else {
            return Ok(None);
        };
        Ok(Some(match rest.trim() {
            "u" => Done::Updated,
            "s" => Done::Skipped,
            _ => Done::Copied, // "c", or a record of an earlier release
        }))
    }

    /// The multipart upload in progress for `key`: (upload id, "size mtime" of the source).
    pub fn multipart(&self, key: &str) -> Result<Option<(String, String)>> {
        Ok(self.db.get(k(MULTIPART, key))?.and_then(|v| {
            let s = String::from_utf8_lossy(&v).into_owned();
            s.split_once('\n')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        }))
    }

    /// Record an upload id before any part goes up, synced: a restart must find it.
    pub fn set_multipart(&self, key: &str, upload_id: &str, version: &str) -> Result<()> {
        self.db
            .put(k(MULTIPART, key), format!("{upload_id}\n{version}"))?;
        Ok(self.db.flush_wal(true)?)
    }

    pub fn clear_multipart(&self, key: &str) -> Result<()> {
        Ok(self.db.delete(k(MULTIPART, key))?)
    }

    pub fn add_delete(&self, key: &str, is_dir: bool) -> Result<()> {
        Ok(self
            .db
            .put(k(DELETE, key), if is_dir { "d" } else { "f" })?)
    }

    /// A deletion of the final step is done: forget it and count it, in one write.
    pub fn deleted(&self, key: &str) -> Result<()> {
        let n = self.deleted_count()? + 1;
        let mut b = WriteBatch::default();
        b.delete(k(DELETE, key));
        b.put(DELETED, n.to_string());
        Ok(self.db.write(b)?)
    }

    /// Deletions done by earlier attempts of the final step.
    pub fn deleted_count(&self) -> Result<u64> {
        Ok(self
            .db
            .get(DELETED)?
            .and_then(|v| String::from_utf8_lossy(&v).parse().ok())
            .unwrap_or(0))
    }

    /// Keys to delete, deepest first (descending key order puts `a/x` before `a/`).
    pub fn deletes(&self) -> Result<Vec<(String, bool)>> {
        let mut out = Vec::new();
        for item in self.db.prefix_iterator(DELETE) {
            let (key, v) = item?;
            if !key.starts_with(DELETE) {
                break;
            }
            out.push((
                String::from_utf8_lossy(&key[DELETE.len()..]).into_owned(),
                &*v == b"d",
            ));
        }
        out.reverse();
        Ok(out)
    }

    pub fn journal_seq(&self) -> Result<Option<u64>> {
        Ok(self
            .db
            .get(JOURNAL_SEQ)?
            .and_then(|v| String::from_utf8_lossy(&v).parse().ok()))
    }

    pub fn set_journal_seq(&self, seq: u64) -> Result<()> {
        self.db.put(JOURNAL_SEQ, seq.to_string())?;
        self.db.flush_wal(true)?;
        Ok(())
    }

    /// A run finished: forget its progress (keep the journal position). One range tombstone,
    /// then a flush and compaction, so the next run opens a small database instead of
    /// replaying a WAL with a put and a delete per object of this run.
    pub fn finish(&self) -> Result<()> {
        let seq = self.journal_seq()?;
        let mut b = WriteBatch::default();
        b.delete_range(&[0u8][..], &[0xffu8; 8][..]);
        if let Some(seq) = seq {
            b.put(JOURNAL_SEQ, seq.to_string());
        }
        self.db.write(b)?;
        self.db.flush()?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        Ok(())
    }

    pub fn flush(&self) -> Result<()> {
        Ok(self.db.flush_wal(true)?)
    }
}

/// The default state dir of a job: a hash of what defines it.
pub fn default_dir(src: &str, dst: &str, options: &str) -> PathBuf {
    let h = crc32c::crc32c_append(
        crc32c::crc32c(format!("{src}\0{dst}").as_bytes()),
        options.as_bytes(),
    );
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("jfs-sync").join(format!("{h:08x}"))
}
