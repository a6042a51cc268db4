//! The mirror agent's own state, in RocksDB under `state_dir`:
//!
//! | key                 | value                                                      |
//! |---------------------|------------------------------------------------------------|
//! | `m/queued_through`  | u64: blocks of entries up to here are queued (or done)     |
//! | `m/bootstrap`       | JSON `Bootstrap` while a snapshot is installed/caught up   |
//! | `m/format`          | u32: the format of the records below (absent: 1)           |
//! | `q/<block key>`     | `QItem`: a copy still to do (length, attempts, next try)   |
//! | `t/<next:8><key>`   | index of `q/` by next try time, so finding due copies costs |
//! |                     | what is due, not the queue's length                         |
//! | `d/<block key>`     | the block is at the mirror store, verified                 |
//! | `x/<block key>`     | the mirror copy must be deleted (its slice was purged)     |
//!
//! Every change is one WriteBatch with the WAL synced, so a kill -9 loses no queued copy.
//!
//! Versions: `QItem`s are postcard (positional), so each record starts with the format's
//! version byte (format 2; format 1, the first release's, had none). A state directory of an
//! older format is migrated at open in one atomic batch; a newer one is refused, naming both.

use anyhow::{Context, Result};
use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QItem {
    pub len: u32,
    pub attempts: u32,
    pub next_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bootstrap {
    /// A snapshot taken at `s0` is being installed: a restart starts it over.
    Installing {
        s0: u64,
        /// Into the resync staging beside the live metadata (see `staging`), not into it.
        #[serde(default)]
        staged: bool,
    },
    /// Installed; the mirror is consistent once `applied >= s_end` (staged: once the
    /// staging has, and the live metadata has been switched to it).
    CatchingUp {
        s0: u64,
        s_end: u64,
        #[serde(default)]
        staged: bool,
    },
}

impl Bootstrap {
    /// A resync beside the live state, which keeps serving meanwhile.
    pub fn staged(&self) -> bool {
        match self {
            Bootstrap::Installing { staged, .. } | Bootstrap::CatchingUp { staged, .. } => *staged,
        }
    }
}

pub struct State {
    db: DB,
    dir: std::path::PathBuf,
    /// Serializes read-modify-write of queue items (enqueue/cancel vs. worker results), and
    /// holds the queue's counts, kept up to date by every change (one scan at open), so
    /// status costs nothing however long the queue is.
    lock: Mutex<Counts>,
}

/// (pending blocks, pending bytes, failing blocks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    n: i64,
    bytes: i64,
    failing: i64,
}

impl Counts {
    fn add(&mut self, q: &QItem, sign: i64) {
        self.n += sign;
        self.bytes += sign * q.len as i64;
        self.failing += sign * (q.attempts > 0) as i64;
    }
}

/// Queue changes produced by applying entries.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// New blocks to copy: key and length.
    pub add: Vec<(String, u32)>,
    /// Blocks of freed slices: pending copies are dropped.
    pub cancel: Vec<String>,
    /// Blocks of purged slices: mirror copies are deleted.
    pub purge: Vec<String>,
}

const QUEUED: &[u8] = b"m/queued_through";
const BOOT: &[u8] = b"m/bootstrap";
const FORMAT: &[u8] = b"m/format";
/// The format this release writes.
pub const STATE_FORMAT: u32 = 2;

fn encode_item(q: &QItem) -> Vec<u8> {
    let mut v = vec![STATE_FORMAT as u8];
    v.extend(postcard::to_allocvec(q).expect("serializes"));
    v
}

/// A queue record of format `format` (1: bare postcard; 2: version byte, then postcard).
fn decode_item(v: &[u8], format: u32) -> Result<QItem> {
    let body = match format {
        1 => v,
        _ => match v.split_first() {
            Some((2, rest)) => rest,
            _ => anyhow::bail!("a queue item of an unknown version ({:?})", v.first()),
        },
    };
    postcard::from_bytes(body).context("a queue item does not decode")
}

fn k(prefix: &str, key: &str) -> Vec<u8> {
    format!("{prefix}{key}").into_bytes()
}

fn tkey(next_ns: i64, key: &str) -> Vec<u8> {
    let mut v = b"t/".to_vec();
    v.extend_from_slice(&(next_ns.max(0) as u64).to_be_bytes());
    v.extend_from_slice(key.as_bytes());
    v
}

/// Write a queue item and its time index entry (replacing `old`'s).
fn put_item(wb: &mut WriteBatch, key: &str, old: Option<&QItem>, new: &QItem) {
    if let Some(o) = old {
        wb.delete(tkey(o.next_ns, key));
    }
    wb.put(k("q/", key), encode_item(new));
    wb.put(tkey(new.next_ns, key), b"");
}

/// Remove a queue item and its time index entry.
fn del_item(wb: &mut WriteBatch, key: &str, old: Option<&QItem>) {
    wb.delete(k("q/", key));
    if let Some(o) = old {
        wb.delete(tkey(o.next_ns, key));
    }
}

impl State {
    pub fn open(dir: &Path) -> Result<State> {
        let st = Self::open_db(dir)?;
        st.migrate(dir)?;
        let c = st.load_queue()?;
        *st.lock.lock().unwrap_or_else(|p| p.into_inner()) = c;
        Ok(st)
    }

    /// What `run` would find in an existing state directory, for its checks: refused when
    /// another agent holds it, or when a newer release wrote it. Its queue is left as it is.
    /// Returns (queued through, a bootstrap record present).
    pub fn probe(dir: &Path) -> Result<(u64, bool)> {
        let st = Self::open_db(dir)?;
        let f = st.format()?;
        if f > STATE_FORMAT {
            anyhow::bail!(
                "the state directory {} was written by a newer mirror-agent (state format {f}; this one reads up to {STATE_FORMAT}): run that release, or see runbooks/lost-agent-state.md to start from an empty state directory",
                dir.display()
            );
        }
        Ok((st.queued_through()?, st.get(BOOT)?.is_some()))
    }

    fn open_db(dir: &Path) -> Result<State> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the state directory {}", dir.display()))?;
        let mut o = meta::base_options();
        o.create_if_missing(true);
        o.set_write_buffer_size(8 << 20);
        let db = DB::open(&o, dir.join("agent.db")).map_err(|e| {
            let m = e.into_string();
            if m.contains("lock") {
                anyhow::anyhow!("the state directory {} is in use by another mirror-agent (one agent per state_dir)", dir.display())
            } else {
                anyhow::anyhow!("opening the agent state in {}: {m}", dir.display())
            }
        })?;
        Ok(State {
            db,
            dir: dir.to_path_buf(),
            lock: Mutex::new(Counts::default()),
        })
    }

    fn format(&self) -> Result<u32> {
        Ok(match self.get(FORMAT)? {
            None => 1,
            Some(v) => u32::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("the agent state's format record is damaged"))?,
            ),
        })
    }

    /// Bring a state directory of an older format to this one (one atomic batch, so a kill
    /// leaves it old or new), or refuse one of a newer format.
    fn migrate(&self, dir: &Path) -> Result<()> {
        let f = self.format()?;
        if f > STATE_FORMAT {
            anyhow::bail!(
                "the state directory {} was written by a newer mirror-agent (state format {f}; this one reads up to {STATE_FORMAT}): run that release, or see runbooks/lost-agent-state.md to start from an empty state directory",
                dir.display()
            );
        }
        if f == STATE_FORMAT {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        let mut n = 0u64;
        self.each_queued_as(f, |key, q| {
            wb.put(k("q/", key), encode_item(&q));
            n += 1;
            Ok(())
        })?;
        wb.put(FORMAT, STATE_FORMAT.to_be_bytes());
        // A new state directory has nothing to migrate: it is only stamped.
        let fresh = n == 0 && self.get(QUEUED)?.is_none() && self.get(BOOT)?.is_none();
        self.write(wb)?;
        if fresh {
            return Ok(());
        }
        tracing::info!(
            from = f,
            to = STATE_FORMAT,
            items = n,
            "agent state migrated to the current format"
        );
        Ok(())
    }

    fn write(&self, b: WriteBatch) -> Result<()> {
        // Refused short of a full disk (see `meta::check_room`): nothing written, retried.
        meta::check_room(&self.dir, b.size_in_bytes() as u64)
            .map_err(|m| anyhow::anyhow!("writing the agent state: {m}"))?;
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db
            .write_opt(b, &wo)
            .map_err(|e| anyhow::anyhow!("writing the agent state: {}", e.into_string()))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get(key)
            .map_err(|e| anyhow::anyhow!("reading the agent state: {}", e.into_string()))
    }

    pub fn queued_through(&self) -> Result<u64> {
        Ok(self
            .get(QUEUED)?
            .and_then(|v| v.try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0))
    }

    pub fn bootstrap(&self) -> Result<Option<Bootstrap>> {
        match self.get(BOOT)? {
            None => Ok(None),
            Some(v) => Ok(Some(
                serde_json::from_slice(&v).context("the bootstrap record in the agent state")?,
            )),
        }
    }

    pub fn set_bootstrap(&self, b: Option<&Bootstrap>) -> Result<()> {
        let mut wb = WriteBatch::default();
        match b {
            Some(b) => wb.put(BOOT, serde_json::to_vec(b).expect("serializes")),
            None => wb.delete(BOOT),
        }
        self.write(wb)
    }

    /// Start of a snapshot install: forget pending copies (the snapshot re-queues what it
    /// references); verified copies stay known.
    pub fn begin_install(&self, s0: u64, staged: bool) -> Result<()> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        wb.delete_range(&b"q/"[..], &b"q0"[..]);
        wb.delete_range(&b"t/"[..], &b"t0"[..]);
        wb.put(QUEUED, 0u64.to_be_bytes());
        wb.put(
            BOOT,
            serde_json::to_vec(&Bootstrap::Installing { s0, staged }).expect("serializes"),
        );
        self.write(wb)?;
        *g = Counts::default();
        Ok(())
    }

    /// Forget every pending copy (verified copies stay known), before the queue is rebuilt
    /// from the metadata.
    pub fn reset_queue(&self) -> Result<()> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        wb.delete_range(&b"q/"[..], &b"q0"[..]);
        wb.delete_range(&b"t/"[..], &b"t0"[..]);
        self.write(wb)?;
        *g = Counts::default();
        Ok(())
    }

    fn item(&self, key: &str) -> Result<Option<QItem>> {
        self.get(&k("q/", key))?
            .map(|v| decode_item(&v, STATE_FORMAT))
            .transpose()
    }

    /// Record queue changes and, with them, how far entries have been looked at.
    pub fn record(&self, ch: &Changes, through: Option<u64>, now_ns: i64) -> Result<u64> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        let mut delta = Counts::default();
        // The queue item of each key as this batch leaves it (None: not queued).
        let mut now: std::collections::HashMap<&str, Option<QItem>> = Default::default();
        let mut added = 0u64;
        for (key, len) in &ch.add {
            if now.contains_key(key.as_str()) || self.get(&k("d/", key))?.is_some() {
                continue;
            }
            let old = self.item(key)?;
            if let Some(o) = &old {
                delta.add(o, -1);
            } else {
                added += 1;
            }
            let it = QItem {
                len: *len,
                attempts: 0,
                next_ns: now_ns,
            };
            delta.add(&it, 1);
            put_item(&mut wb, key, old.as_ref(), &it);
            now.insert(key, Some(it));
        }
        for (key, purge) in ch
            .cancel
            .iter()
            .map(|k| (k, false))
            .chain(ch.purge.iter().map(|k| (k, true)))
        {
            let cur = match now.get(key.as_str()) {
                Some(c) => *c,
                None => self.item(key)?,
            };
            if let Some(c) = &cur {
                delta.add(c, -1);
            }
            now.insert(key, None);
            del_item(&mut wb, key, cur.as_ref());
            if purge {
                wb.delete(k("d/", key));
                wb.put(k("x/", key), b"");
            }
        }
        if let Some(t) = through {
            wb.put(QUEUED, t.to_be_bytes());
        }
        self.write(wb)?;
        g.n += delta.n;
        g.bytes += delta.bytes;
        g.failing += delta.failing;
        Ok(added)
    }

    /// Up to `max` copies due at `now_ns`, earliest first, skipping keys for which `skip`
    /// says so (copies in flight). Reads the time index up to `now_ns` only.
    pub fn due(
        &self,
        now_ns: i64,
        max: usize,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(String, QItem)>> {
        let mut out = Vec::new();
        let it = self
            .db
            .iterator(IteratorMode::From(b"t/", rocksdb::Direction::Forward));
        for item in it {
            let (key, _) =
                item.map_err(|e| anyhow::anyhow!("reading the queue: {}", e.into_string()))?;
            if !key.starts_with(b"t/") || key.len() < 10 || out.len() >= max {
                break;
            }
            let next = u64::from_be_bytes(key[2..10].try_into().expect("8 bytes")) as i64;
            if next > now_ns {
                break;
            }
            let name = String::from_utf8_lossy(&key[10..]).into_owned();
            if skip(&name) {
                continue;
            }
            if let Some(q) = self.item(&name)? {
                out.push((name, q));
            }
        }
        Ok(out)
    }

    /// Every queued item, in key order.
    fn each_queued(&self, f: impl FnMut(&str, QItem) -> Result<()>) -> Result<()> {
        self.each_queued_as(STATE_FORMAT, f)
    }

    fn each_queued_as(
        &self,
        format: u32,
        mut f: impl FnMut(&str, QItem) -> Result<()>,
    ) -> Result<()> {
        for item in self
            .db
            .iterator(IteratorMode::From(b"q/", rocksdb::Direction::Forward))
        {
            let (key, v) =
                item.map_err(|e| anyhow::anyhow!("reading the queue: {}", e.into_string()))?;
            if !key.starts_with(b"q/") {
                break;
            }
            let q = decode_item(&v, format)?;
            f(&String::from_utf8_lossy(&key[2..]), q)?;
        }
        Ok(())
    }

    /// At open, one pass over the queue: its counts, and the time index rebuilt (which heals
    /// a state written before the index existed).
    fn load_queue(&self) -> Result<Counts> {
        let mut c = Counts::default();
        let mut wb = WriteBatch::default();
        wb.delete_range(&b"t/"[..], &b"t0"[..]);
        self.each_queued(|key, q| {
            c.add(&q, 1);
            wb.put(tkey(q.next_ns, key), b"");
            if wb.len() >= 10_000 {
                self.write(std::mem::take(&mut wb))?;
            }
            Ok(())
        })?;
        self.write(wb)?;
        Ok(c)
    }

    /// Pending deletions of mirror copies.
    pub fn purges(&self, max: usize) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator(IteratorMode::From(b"x/", rocksdb::Direction::Forward))
        {
            let (key, _) =
                item.map_err(|e| anyhow::anyhow!("reading the queue: {}", e.into_string()))?;
            if !key.starts_with(b"x/") || out.len() >= max {
                break;
            }
            out.push(String::from_utf8_lossy(&key[2..]).into_owned());
        }
        Ok(out)
    }

    pub fn purged(&self, key: &str) -> Result<()> {
        let mut wb = WriteBatch::default();
        wb.delete(k("x/", key));
        self.write(wb)
    }

    /// A verified copy is at the mirror. Returns false when the item was cancelled or purged
    /// meanwhile (the caller then removes the copy it just made).
    pub fn done(&self, key: &str) -> Result<bool> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = self.item(key)? else {
            return Ok(false);
        };
        let mut wb = WriteBatch::default();
        del_item(&mut wb, key, Some(&old));
        wb.put(k("d/", key), b"");
        self.write(wb)?;
        g.add(&old, -1);
        Ok(true)
    }

    /// A queued copy that is not needed any more (its slice is gone from the metadata):
    /// removed, never marked done. False when it was not queued (cancelled meanwhile).
    pub fn drop_unneeded(&self, key: &str) -> Result<bool> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = self.item(key)? else {
            return Ok(false);
        };
        let mut wb = WriteBatch::default();
        del_item(&mut wb, key, Some(&old));
        self.write(wb)?;
        g.add(&old, -1);
        Ok(true)
    }

    /// Move the queued copies of `keys` ahead of the queue (due at time 0, attempts kept):
    /// readers at the site want them. Keys not queued (copied, cancelled) are left alone.
    /// Returns how many moved.
    pub fn prioritize(&self, keys: &[String]) -> Result<u64> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        let mut n = 0;
        for key in keys {
            if let Some(old) = self.item(key)? {
                if old.next_ns > 0 {
                    put_item(&mut wb, key, Some(&old), &QItem { next_ns: 0, ..old });
                    n += 1;
                }
            }
        }
        if n > 0 {
            self.write(wb)?;
        }
        Ok(n)
    }

    /// A failed attempt: try again at `next_ns` (unless the item is gone meanwhile).
    pub fn retry(&self, key: &str, item: QItem) -> Result<()> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = self.item(key)? else {
            return Ok(());
        };
        let mut wb = WriteBatch::default();
        put_item(&mut wb, key, Some(&old), &item);
        self.write(wb)?;
        g.add(&old, -1);
        g.add(&item, 1);
        Ok(())
    }

    /// (pending blocks, pending bytes, failing blocks).
    pub fn pending(&self) -> Result<(u64, u64, u64)> {
        let c = *self.lock.lock().unwrap_or_else(|p| p.into_inner());
        Ok((
            c.n.max(0) as u64,
            c.bytes.max(0) as u64,
            c.failing.max(0) as u64,
        ))
    }

    /// The counts by a scan of the whole queue (tests check the running ones against it).
    #[cfg(test)]
    fn scan_counts(&self) -> Result<Counts> {
        let mut c = Counts::default();
        self.each_queued(|_, q| {
            c.add(&q, 1);
            Ok(())
        })?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_record_of_the_previous_release_reads_as_in_place() {
        let b: Bootstrap = serde_json::from_str(r#"{"CatchingUp":{"s0":3,"s_end":9}}"#).unwrap();
        assert_eq!(
            b,
            Bootstrap::CatchingUp {
                s0: 3,
                s_end: 9,
                staged: false
            }
        );
        let b: Bootstrap = serde_json::from_str(r#"{"Installing":{"s0":3}}"#).unwrap();
        assert!(!b.staged());
        let d = tempfile::tempdir().unwrap();
        let st = State::open(d.path()).unwrap();
        st.begin_install(7, true).unwrap();
        assert!(st.bootstrap().unwrap().unwrap().staged());
    }

    /// A state directory as the previous release wrote it (format 1: bare postcard queue
    /// items, no format record) opens, is migrated, and serves its queue; one of a newer
    /// format is refused.
    #[test]
    fn a_state_of_the_previous_release_opens_and_a_newer_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        {
            let mut o = rocksdb::Options::default();
            o.create_if_missing(true);
            let db = DB::open(&o, d.path().join("agent.db")).unwrap();
            let old = QItem {
                len: 4096,
                attempts: 2,
                next_ns: 5,
            };
            db.put(
                b"q/vol/chunks/0/0/7_0_4096",
                postcard::to_allocvec(&old).unwrap(),
            )
            .unwrap();
            db.put(
                b"q/vol/chunks/0/0/8_0_100",
                postcard::to_allocvec(&QItem {
                    len: 100,
                    attempts: 0,
                    next_ns: 0,
                })
                .unwrap(),
            )
            .unwrap();
            db.put(QUEUED, 42u64.to_be_bytes()).unwrap();
            db.put(BOOT, br#"{"CatchingUp":{"s0":40,"s_end":44}}"#)
                .unwrap();
        }
        let st = State::open(d.path()).unwrap();
        assert_eq!(st.format().unwrap(), STATE_FORMAT);
        assert_eq!(st.pending().unwrap(), (2, 4196, 1));
        assert_eq!(st.queued_through().unwrap(), 42);
        assert!(!st.bootstrap().unwrap().unwrap().staged());
        let due = st.due(10, 10, &|_| false).unwrap();
        assert_eq!(due.len(), 2, "{due:?}");
        assert_eq!(
            due.iter().find(|(k, _)| k.ends_with("7_0_4096")).unwrap().1,
            QItem {
                len: 4096,
                attempts: 2,
                next_ns: 5
            }
        );
        drop(st);
        // Opens again (already migrated), then refuses a newer format.
        let st = State::open(d.path()).unwrap();
        assert_eq!(st.pending().unwrap().0, 2);
        st.db.put(FORMAT, 9u32.to_be_bytes()).unwrap();
        drop(st);
        let e = State::open(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("newer mirror-agent") && e.contains("format 9"),
            "{e}"
        );
    }

    #[test]
    fn prioritized_copies_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(dir.path()).unwrap();
        let add = (0..10)
            .map(|i| (format!("v/{i}"), 1u32))
            .collect::<Vec<_>>();
        for (i, a) in add.iter().enumerate() {
            let ch = Changes {
                add: vec![a.clone()],
                ..Default::default()
            };
            s.record(&ch, None, 100 + i as i64).unwrap();
        }
        let order = |s: &State| {
            s.due(1_000, 100, &|_| false)
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        };
        assert_eq!(order(&s)[0], "v/0");
        assert_eq!(
            s.prioritize(&["v/7".into(), "v/nope".into(), "v/3".into()])
                .unwrap(),
            2
        );
        assert_eq!(&order(&s)[..3], &["v/3", "v/7", "v/0"]);
        assert!(s.done("v/3").unwrap());
        assert_eq!(
            s.prioritize(&["v/3".into()]).unwrap(),
            0,
            "copied: left alone"
        );
        assert_eq!(s.scan_counts().unwrap(), *s.lock.lock().unwrap());
    }

    #[test]
    fn queue_survives_reopen_and_cancel_beats_done() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = State::open(dir.path()).unwrap();
            let ch = Changes {
                add: vec![("v/a".into(), 10), ("v/b".into(), 20), ("v/a".into(), 10)],
                ..Default::default()
            };
            assert_eq!(s.record(&ch, Some(5), 0).unwrap(), 2);
            assert!(s.done("v/a").unwrap());
            let cancel = Changes {
                cancel: vec!["v/b".into()],
                ..Default::default()
            };
            s.record(&cancel, Some(6), 0).unwrap();
            assert!(
                !s.done("v/b").unwrap(),
                "a cancelled copy is not marked done"
            );
        }
        let s = State::open(dir.path()).unwrap();
        assert_eq!(s.queued_through().unwrap(), 6);
        assert_eq!(s.scan_counts().unwrap(), *s.lock.lock().unwrap());
        assert_eq!(s.pending().unwrap(), (0, 0, 0));
        // A block already copied is not queued again.
        let again = Changes {
            add: vec![("v/a".into(), 10)],
            ..Default::default()
        };
        assert_eq!(s.record(&again, None, 0).unwrap(), 0);
        let purge = Changes {
            purge: vec!["v/a".into()],
            ..Default::default()
        };
        s.record(&purge, None, 0).unwrap();
        assert_eq!(s.purges(10).unwrap(), vec!["v/a".to_string()]);
    }

    #[test]
    fn running_counts_match_a_scan_after_any_mix_of_changes() {
        use rand::Rng;
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(dir.path()).unwrap();
        let mut rng = rand::rng();
        for round in 0..300 {
            let key = |r: &mut rand::rngs::ThreadRng| format!("v/{}", r.random_range(0..40));
            match rng.random_range(0..5) {
                0 | 1 => {
                    let ch = Changes {
                        add: (0..rng.random_range(1..5))
                            .map(|_| (key(&mut rng), rng.random_range(1..100)))
                            .collect(),
                        cancel: (0..rng.random_range(0..2)).map(|_| key(&mut rng)).collect(),
                        purge: (0..rng.random_range(0..2)).map(|_| key(&mut rng)).collect(),
                    };
                    s.record(&ch, Some(round), 0).unwrap();
                }
                2 => {
                    let _ = s.done(&key(&mut rng)).unwrap();
                }
                _ => {
                    let k = key(&mut rng);
                    if let Some(q) = s.item(&k).unwrap() {
                        let next = QItem {
                            attempts: q.attempts + 1,
                            next_ns: q.next_ns + rng.random_range(1..1000),
                            ..q
                        };
                        s.retry(&k, next).unwrap();
                    }
                }
            }
            assert_eq!(
                s.scan_counts().unwrap(),
                *s.lock.lock().unwrap(),
                "after round {round}"
            );
            // The time index lists exactly the queued items, each at its next try time.
            let mut due = s.due(i64::MAX, usize::MAX, &|_| false).unwrap();
            due.sort_by(|a, b| a.0.cmp(&b.0));
            let mut queued = Vec::new();
            s.each_queued(|k, q| {
                queued.push((k.to_string(), q));
                Ok(())
            })
            .unwrap();
            assert_eq!(due, queued, "index out of step after round {round}");
            let t =
                s.db.iterator(IteratorMode::From(b"t/", rocksdb::Direction::Forward))
                    .take_while(|i| i.as_ref().unwrap().0.starts_with(b"t/"))
                    .count();
            assert_eq!(t, queued.len(), "stale index entries after round {round}");
        }
    }
}
