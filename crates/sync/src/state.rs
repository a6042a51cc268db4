//! Resume state of one sync job in RocksDB (default under ~/.cache/jfs-sync/<hash of src, dst
//! and options>): the listing cursor (every key at or before it is resolved) with the tally of
//! what those keys came to, the keys copied after it (with what was done to them), the
//! destination keys to delete at the end, and the journal position for `--from-journal`.
//! A state records whose progress it is (`claim`: what SRC and DST are, by volume uuid,
//! resolved path or store, and the options), and is never used for another job.
//! Puts go through the WAL without fsync: a killed process (even kill -9) loses nothing the
//! OS has, and a lost tail only means a few objects are copied again.

use crate::stats::Tally;
use anyhow::{bail, Result};
use rocksdb::{WriteBatch, DB};
use std::path::{Path, PathBuf};

/// The resume state's memtable: a million done-keys should not cost 64 MiB buffers of RAM.
const STATE_WRITE_BUFFER: u64 = 8 << 20;
/// What RocksDB sets aside as the state opens: its write-ahead log, preallocated a block of
/// 1.1 write buffers at a time, and the manifest (`meta::base_options`).
const OPEN_NEED: u64 = STATE_WRITE_BUFFER + STATE_WRITE_BUFFER / 10 + (4 << 20);

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
/// Whose progress this is: SRC's and DST's identities, the options, the shared job.
const IDENTITY: &[u8] = b"identity";
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
        // Owner-only: the state names every file of the job (and a planted directory at a
        // predictable name would be another user's to read and change).
        cli_common::private::ensure_private_dir(
            path,
            "state directory",
            "give the job another --state-dir",
        )?;
        // Refused at open on a disk without room for what RocksDB sets aside there (its
        // write-ahead log and manifest) and the floor every write keeps: a write that meets a
        // full disk leaves RocksDB's log writer failed, and Debian's librocksdb aborts the
        // process on its next sync.
        meta::check_room(path, OPEN_NEED).map_err(|m| {
            anyhow::anyhow!(
                "jfs-sync's resume state cannot be kept in {}: {}; or give the job a --state-dir on a disk with room (nothing was copied)",
                path.display(),
                m.replace(" (nothing was written)", "")
            )
        })?;
        let mut o = meta::base_options();
        o.create_if_missing(true);
        // Small memtables: a million done-keys should not cost 64 MiB buffers of RAM.
        o.set_write_buffer_size(STATE_WRITE_BUFFER as usize);
        o.set_max_write_buffer_number(2);
        let db = match DB::open(&o, path) {
            Ok(db) => db,
            Err(e) if locked(&e) => {
                return Err(anyhow::Error::new(Locked(path.to_path_buf())));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("opening the resume state in {}", path.display())))
            }
        };
        Ok(State {
            db,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every write is refused short of a full disk (`meta::check_room`), naming the
    /// directory: the run stops with its progress so far kept, and resumes once there is room.
    fn room(&self, bytes: usize) -> Result<()> {
        meta::check_room(&self.path, bytes as u64).map_err(|m| {
            anyhow::anyhow!(
                "jfs-sync's resume state: {m}; the progress so far is kept: rerun the same command once there is room"
            )
        })
    }

    fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let (key, value) = (key.as_ref(), value.as_ref());
        self.room(key.len() + value.len())?;
        Ok(self.db.put(key, value)?)
    }

    fn write(&self, b: WriteBatch) -> Result<()> {
        self.room(b.size_in_bytes())?;
        Ok(self.db.write(b)?)
    }

    fn del(&self, key: impl AsRef<[u8]>) -> Result<()> {
        self.room(key.as_ref().len())?;
        Ok(self.db.delete(key)?)
    }

    /// Tie this state to `identity` (what SRC and DST are and the options): a fresh state
    /// records it; a state kept for another identity is refused, naming both (`chosen`: the
    /// user named this directory); a state of an earlier release, which recorded none, is
    /// started afresh. Progress is never taken from another job's state.
    pub fn claim(&self, identity: &str, chosen: bool) -> Result<()> {
        match self.db.get(IDENTITY)? {
            Some(v) if v == identity.as_bytes() => Ok(()),
            Some(v) => {
                let had = String::from_utf8_lossy(&v).into_owned();
                let show = |s: &str| {
                    let mut l = s.lines();
                    format!("{} -> {}", l.next().unwrap_or("?"), l.next().unwrap_or("?"))
                };
                let what = if show(&had) == show(identity) {
                    "with other options".to_string()
                } else {
                    format!("for {}", show(&had))
                };
                bail!(
                    "the resume state in {} holds the progress of another sync ({what}); this run is {}: {}",
                    self.path.display(),
                    show(identity),
                    if chosen {
                        "give this run another --state-dir (or --reset-state to discard that progress)"
                    } else {
                        "run with --reset-state to start this one afresh"
                    }
                )
            }
            None => {
                let has_progress = self.cursor()?.is_some()
                    || self.journal_seq()?.is_some()
                    || self
                        .db
                        .prefix_iterator(DONE)
                        .next()
                        .is_some_and(|r| r.is_ok_and(|(k, _)| k.starts_with(DONE)));
                if has_progress {
                    cli_common::eprintln!(
                        "jfs-sync: the resume state in {} does not say whose progress it holds (an earlier release wrote it): starting afresh",
                        self.path.display()
                    );
                    let mut b = WriteBatch::default();
                    b.delete_range(&[0u8][..], &[0xffu8; 8][..]);
                    self.write(b)?;
                }
                self.put(IDENTITY, identity)?;
                Ok(self.db.flush_wal(true)?)
            }
        }
    }

    pub fn cursor(&self) -> Result<Option<String>> {
        Ok(self
            .db
            .get(CURSOR)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    pub fn set_cursor(&self, key: &str) -> Result<()> {
        self.put(CURSOR, key)
    }

    /// The tally of the keys at or before the cursor, from earlier attempts.
    /// A tally a newer release wrote is refused; a damaged one reads as none.
    pub fn tally(&self) -> Result<Option<crate::stats::Summary>> {
        let Some(v) = self.db.get(TALLY)? else {
            return Ok(None);
        };
        match Tally::decode(&String::from_utf8_lossy(&v)) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == fs_core::ErrorKind::UnsupportedVersion => {
                Err(anyhow::Error::new(e)
                    .context(format!("the resume state in {}", self.path.display())))
            }
            Err(_) => Ok(None),
        }
    }

    /// Move the cursor and record the tally of everything at or before it, in one write.
    pub fn checkpoint(&self, cursor: &str, tally: &crate::stats::Summary) -> Result<()> {
        let mut b = WriteBatch::default();
        b.put(CURSOR, cursor);
        b.put(TALLY, Tally::encode(tally));
        self.write(b)
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
        self.del(k(MULTIPART, key))
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
        self.write(b)
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
        self.put(JOURNAL_SEQ, seq.to_string())?;
        self.db.flush_wal(true)?;
        Ok(())
    }

    /// A run finished: forget its progress (keep the journal position). One range tombstone,
    /// then a flush and compaction, so the next run opens a small database instead of
    /// replaying a WAL with a put and a delete per object of this run.
    pub fn finish(&self) -> Result<()> {
        let seq = self.journal_seq()?;
        let identity = self.db.get(IDENTITY)?;
        let mut b = WriteBatch::default();
        b.delete_range(&[0u8][..], &[0xffu8; 8][..]);
        if let Some(seq) = seq {
            b.put(JOURNAL_SEQ, seq.to_string());
        }
        if let Some(id) = identity {
            b.put(IDENTITY, id);
        }
        self.write(b)?;
        self.db.flush()?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        Ok(())
    }

    pub fn flush(&self) -> Result<()> {
        Ok(self.db.flush_wal(true)?)
    }

    /// Write a raw value, as a damaged disk or an older release might have left it.
    #[cfg(test)]
    pub(crate) fn raw_put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(key, value)
    }
}

/// A state directory another process holds open (RocksDB's lock).
#[derive(Debug)]
pub struct Locked(pub PathBuf);

impl std::fmt::Display for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the resume state in {} is in use by another jfs-sync (the same SRC, DST and options, or the same --state-dir): wait for it to end, or give this run a --state-dir of its own (each worker of a shared job needs its own)",
            self.0.display()
        )
    }
}

impl std::error::Error for Locked {}

fn locked(e: &rocksdb::Error) -> bool {
    let m = e.to_string();
    m.contains("lock")
        && (m.contains("Resource temporarily unavailable") || m.contains("No locks available"))
}

/// The state of a shared job's worker without `--state-dir`: the first of `dir/worker-N`
/// that no running worker holds, so that several workers of one job run on one host (a
/// restarted worker takes over a slot, with the multipart uploads it recorded).
pub fn open_free_slot(dir: &Path) -> Result<State> {
    for i in 0..64 {
        match State::open(&dir.join(format!("worker-{i}"))) {
            Ok(s) => return Ok(s),
            Err(e) if e.is::<Locked>() => continue,
            Err(e) => return Err(e),
        }
    }
    bail!(
        "64 workers of this job run on this host already (their states are in {}): give this one a --state-dir of its own",
        dir.display()
    )
}

/// The default state dir of a job: a hash of what defines it (`src` and `dst` are the
/// endpoints' identities, not their spelling).
pub fn default_dir(src: &str, dst: &str, options: &str) -> PathBuf {
    let h = crc32c::crc32c_append(
        crc32c::crc32c(format!("{src}\0{dst}").as_bytes()),
        options.as_bytes(),
    );
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|b| b.join("jfs-sync"))
        .unwrap_or_else(|| {
            // No home: a directory of this user's in the shared temporary directory (checked
            // when the state is opened: one another user planted there is refused).
            std::env::temp_dir().join(format!("jfs-sync-{}", rustix::process::geteuid().as_raw()))
        });
    base.join(format!("{h:08x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_state_of_the_release_before_opens_and_a_newer_tally_is_refused() {
        let t = tempfile::tempdir().unwrap();
        {
            // What the release before wrote: the tally as bare JSON, no version.
            let st = State::open(t.path()).unwrap();
            let mut b = WriteBatch::default();
            b.put(CURSOR, "a/b");
            b.put(
                TALLY,
                r#"{"dry_run":false,"listed":2,"copied":1,"updated":0,"skipped":1,"skipped_reasons":{"up_to_date":1},"excluded":0,"failed":0,"deleted":0,"extra":0,"bytes":7,"checked":0,"resumed":null,"seconds":0.25}"#,
            );
            st.db.write(b).unwrap();
        }
        let st = State::open(t.path()).unwrap();
        assert_eq!(st.cursor().unwrap().as_deref(), Some("a/b"));
        let tally = st.tally().unwrap().unwrap();
        assert_eq!((tally.listed, tally.copied, tally.bytes), (2, 1, 7));
        st.checkpoint("a/c", &tally).unwrap();
        assert_eq!(st.tally().unwrap(), Some(tally));
        st.db.put(TALLY, r#"{"version":2,"listed":2}"#).unwrap();
        let e = st.tally().unwrap_err();
        assert!(format!("{e:#}").contains("newer release"), "{e:#}");
    }
}
