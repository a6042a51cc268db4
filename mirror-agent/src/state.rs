//! The mirror agent's own state, in RocksDB under `state_dir`:
//!
//! | key                 | value                                                      |
//! |---------------------|------------------------------------------------------------|
//! | `m/queued_through`  | u64: blocks of entries up to here are queued (or done)     |
//! | `m/bootstrap`       | JSON `Bootstrap` while a snapshot is installed/caught up   |
//! | `q/<block key>`     | `QItem`: a copy still to do (length, attempts, next try)   |
//! | `d/<block key>`     | the block is at the mirror store, verified                 |
//! | `x/<block key>`     | the mirror copy must be deleted (its slice was purged)     |
//!
//! Every change is one WriteBatch with the WAL synced, so a kill -9 loses no queued copy.

use anyhow::{Context, Result};
use rocksdb::{IteratorMode, Options, WriteBatch, WriteOptions, DB};
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
    Installing { s0: u64 },
    /// Installed; the mirror is consistent once `applied >= s_end`.
    CatchingUp { s0: u64, s_end: u64 },
}

pub struct State {
    db: DB,
    /// Serializes read-modify-write of queue items (enqueue/cancel vs. worker results).
    lock: Mutex<()>,
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

fn k(prefix: &str, key: &str) -> Vec<u8> {
    format!("{prefix}{key}").into_bytes()
}

impl State {
    pub fn open(dir: &Path) -> Result<State> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the state directory {}", dir.display()))?;
        let mut o = Options::default();
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
            lock: Mutex::new(()),
        })
    }

    fn write(&self, b: WriteBatch) -> Result<()> {
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
    pub fn begin_install(&self, s0: u64) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        wb.delete_range(&b"q/"[..], &b"q0"[..]);
        wb.put(QUEUED, 0u64.to_be_bytes());
        wb.put(
            BOOT,
            serde_json::to_vec(&Bootstrap::Installing { s0 }).expect("serializes"),
        );
        self.write(wb)
    }

    /// Record queue changes and, with them, how far entries have been looked at.
    pub fn record(&self, ch: &Changes, through: Option<u64>, now_ns: i64) -> Result<u64> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        let mut added = 0u64;
        let mut seen = std::collections::HashSet::new();
        for (key, len) in &ch.add {
            if !seen.insert(key.as_str()) || self.get(&k("d/", key))?.is_some() {
                continue;
            }
            if self.get(&k("q/", key))?.is_none() {
                added += 1;
            }
            let it = QItem {
                len: *len,
                attempts: 0,
                next_ns: now_ns,
            };
            wb.put(
                k("q/", key),
                postcard::to_allocvec(&it).expect("serializes"),
            );
        }
        for key in &ch.cancel {
            wb.delete(k("q/", key));
        }
        for key in &ch.purge {
            wb.delete(k("q/", key));
            wb.delete(k("d/", key));
            wb.put(k("x/", key), b"");
        }
        if let Some(t) = through {
            wb.put(QUEUED, t.to_be_bytes());
        }
        self.write(wb)?;
        Ok(added)
    }

    /// Up to `max` copies due at `now_ns`, skipping keys for which `skip` says so.
    pub fn due(
        &self,
        now_ns: i64,
        max: usize,
        skip: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<(String, QItem)>> {
        let mut out = Vec::new();
        let it = self
            .db
            .iterator(IteratorMode::From(b"q/", rocksdb::Direction::Forward));
        for item in it {
            let (key, v) =
                item.map_err(|e| anyhow::anyhow!("reading the queue: {}", e.into_string()))?;
            if !key.starts_with(b"q/") || out.len() >= max {
                break;
            }
            let name = String::from_utf8_lossy(&key[2..]).into_owned();
            let q: QItem = postcard::from_bytes(&v).context("a queue item does not decode")?;
            if q.next_ns <= now_ns && !skip(&name) {
                out.push((name, q));
            }
        }
        Ok(out)
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
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.get(&k("q/", key))?.is_none() {
            return Ok(false);
        }
        let mut wb = WriteBatch::default();
        wb.delete(k("q/", key));
        wb.put(k("d/", key), b"");
        self.write(wb)?;
        Ok(true)
    }

    /// A failed attempt: try again at `next_ns` (unless the item is gone meanwhile).
    pub fn retry(&self, key: &str, item: QItem) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.get(&k("q/", key))?.is_none() {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        wb.put(
            k("q/", key),
            postcard::to_allocvec(&item).expect("serializes"),
        );
        self.write(wb)
    }

    /// (pending blocks, pending bytes, failing blocks) by a scan of the queue.
    pub fn pending(&self) -> Result<(u64, u64, u64)> {
        let (mut n, mut bytes, mut failing) = (0, 0, 0);
        for item in self
            .db
            .iterator(IteratorMode::From(b"q/", rocksdb::Direction::Forward))
        {
            let (key, v) =
                item.map_err(|e| anyhow::anyhow!("reading the queue: {}", e.into_string()))?;
            if !key.starts_with(b"q/") {
                break;
            }
            let q: QItem = postcard::from_bytes(&v).context("a queue item does not decode")?;
            n += 1;
            bytes += q.len as u64;
            if q.attempts > 0 {
                failing += 1;
            }
        }
        Ok((n, bytes, failing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
