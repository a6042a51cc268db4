//! The block queue: `q/<key>` items (length, attempts, next try), their time index
//! `t/<next><key>` (so finding due copies costs what is due, not the queue's length), `d/`
//! done and `x/` purge markers, and the running counts (pending blocks and bytes, failing)
//! kept by every change, so status costs nothing however long the queue is.
//!
//! Invariant: an item and its index entry change in the same WriteBatch; an item's counts
//! change with it under `State::lock`.

use super::format::{decode_item, encode_item};
use super::*;
use rocksdb::IteratorMode;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QItem {
    pub len: u32,
    pub attempts: u32,
    pub next_ns: i64,
}

/// (pending blocks, pending bytes, failing blocks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    n: i64,
    bytes: i64,
    failing: i64,
}

impl Counts {
    pub(super) fn add(&mut self, q: &QItem, sign: i64) {
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

pub(super) fn k(prefix: &str, key: &str) -> Vec<u8> {
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
            // Wanted again (a queue rebuilt while a copy was in flight): a deletion queued
            // for an earlier copy of it is void.
            wb.delete(k("x/", key));
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

    pub(super) fn each_queued_as(
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
    pub(super) fn load_queue(&self) -> Result<Counts> {
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

    /// The mirror copy of `key` is to be deleted, like a purged slice's (`purges`).
    pub fn purge_later(&self, key: &str) -> Result<()> {
        let mut wb = WriteBatch::default();
        wb.put(k("x/", key), b"");
        self.write(wb)
    }

    /// Whether the deletion of `key`'s mirror copy is still wanted (an add since voids it).
    pub fn purge_wanted(&self, key: &str) -> Result<bool> {
        Ok(self.get(&k("x/", key))?.is_some())
    }

    pub fn purged(&self, key: &str) -> Result<()> {
        let mut wb = WriteBatch::default();
        wb.delete(k("x/", key));
        self.write(wb)
    }

    /// A verified copy is at the mirror. Returns false when the item was cancelled or purged
    /// meanwhile (the caller then has a copy it made removed, `purge_later`).
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

    /// A copy that found its item gone (the queue was rebuilt while it ran) has its deletion
    /// queued; the rebuild's add of the same block voids it, so the block the metadata
    /// references is not deleted after its copy is done.
    #[test]
    fn an_add_voids_a_queued_deletion_of_the_same_block() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(dir.path()).unwrap();
        let add = Changes {
            add: vec![("v/k".into(), 5)],
            ..Default::default()
        };
        s.record(&add, None, 0).unwrap();
        s.reset_queue().unwrap();
        assert!(!s.done("v/k").unwrap(), "the item is gone after a reset");
        s.purge_later("v/k").unwrap();
        assert_eq!(s.purges(10).unwrap(), vec!["v/k".to_string()]);
        s.record(&add, None, 0).unwrap();
        assert!(s.purges(10).unwrap().is_empty());
        assert!(!s.purge_wanted("v/k").unwrap());
        assert!(s.done("v/k").unwrap());
        // A real purge after that still counts.
        let purge = Changes {
            purge: vec!["v/k".into()],
            ..Default::default()
        };
        s.record(&purge, None, 0).unwrap();
        assert_eq!(s.purges(10).unwrap(), vec!["v/k".to_string()]);
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
