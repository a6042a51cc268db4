//! An optimistic transaction: reads go to the engine and are recorded with the values seen;
//! writes are buffered (read-your-writes); `commit` hands both to the engine, which checks the
//! reads in its commit section. Phantom reads of key ranges are not validated: fs-core keeps
//! the invariant that every change to a directory's entries or a file's chunks also writes
//! that inode's attributes, and every range read also reads them (see ARCHITECTURE.md).

use crate::engine::{CommitOutcome, Engine, Follow, KvPair};
use crate::error::{Error, ErrorKind, Result};
use crate::journal::{CommitRequest, Mutation, Op};
use std::collections::BTreeMap;

enum Pending {
    Put(Vec<u8>),
    Delete,
}

pub struct Txn<'a> {
    engine: &'a dyn Engine,
    reads: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    writes: BTreeMap<Vec<u8>, Pending>,
    /// Adds and stamps, in order, applied after puts/deletes by key.
    extra: Vec<Mutation>,
    op: Option<Op>,
    /// Ranges read ahead by `prefetch_via`: (start, end) -> (pairs, whether they are all the
    /// range held).
    prescanned: BTreeMap<(Vec<u8>, Vec<u8>), (Vec<KvPair>, bool)>,
}

impl<'a> Txn<'a> {
    pub fn new(engine: &'a dyn Engine) -> Self {
        Txn {
            engine,
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            extra: Vec::new(),
            op: None,
            prescanned: BTreeMap::new(),
        }
    }

    pub async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(p) = self.writes.get(key) {
            return Ok(match p {
                Pending::Put(v) => Some(v.clone()),
                Pending::Delete => None,
            });
        }
        if let Some(v) = self.reads.get(key) {
            return Ok(v.clone());
        }
        let v = self.engine.get(key).await?;
        self.reads.insert(key.to_vec(), v.clone());
        Ok(v)
    }

    /// Read `keys` in one engine call (one round trip to Redis or PostgreSQL), recorded as
    /// `get` records a read: later `get`s of them are answered from what was read here.
    pub async fn prefetch(&mut self, keys: &[Vec<u8>]) -> Result<()> {
        // Each key once (a rename within one directory names its parent twice).
        let want: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| !self.writes.contains_key(*k) && !self.reads.contains_key(*k))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if want.is_empty() {
            return Ok(());
        }
        let values = self.engine.get_many(&want).await?;
        for (k, v) in want.into_iter().zip(values) {
            self.reads.insert(k, v);
        }
        Ok(())
    }

    /// `prefetch(keys)`, and in the same engine call the records of the inode `keys[0]`'s
    /// value names (`Engine::get_many_via`): a directory entry and the inode it names in one
    /// round trip. A followed range is kept for this transaction's `scan` of exactly that
    /// range. Keys this transaction already read or wrote keep what it has.
    pub async fn prefetch_via(&mut self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<()> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        if self.writes.contains_key(first) || self.reads.contains_key(first) {
            // The inode is known here: follow it from this transaction's view.
            let v = self.get(first).await?;
            let mut all = keys.to_vec();
            if let Some(ino) = Follow::inode_of(v.as_deref()) {
                all.extend(follow.keys(ino));
            }
            return self.prefetch(&all).await;
        }
        let got = self.engine.get_many_via(keys, follow).await?;
        let ino =
            Follow::inode_of(got.values.first().and_then(|v| v.as_deref())).map(<[u8]>::to_vec);
        let followed = ino.as_deref().map(|i| follow.keys(i)).unwrap_or_default();
        for (k, v) in keys
            .iter()
            .cloned()
            .zip(got.values)
            .chain(followed.into_iter().zip(got.followed))
        {
            if !self.writes.contains_key(&k) {
                self.reads.entry(k).or_insert(v);
            }
        }
        if let Some(i) = ino.filter(|_| follow.range.2 > 0) {
            let (start, end, _) = follow.range_of(&i);
            self.prescanned
                .insert((start, end), (got.range, got.range_complete));
        }
        Ok(())
    }

    /// A range read, merged with this transaction's own buffered writes. Not validated at
    /// commit: callers guard it by reading the owning inode's attributes.
    pub async fn scan(&mut self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        // A range `prefetch_via` read answers it when that read was complete or long enough.
        let found = match self.prescanned.remove(&(start.to_vec(), end.to_vec())) {
            Some((mut pairs, complete)) if complete || limit <= pairs.len() => {
                pairs.truncate(limit);
                pairs
            }
            _ => self.engine.scan(start, end, limit).await?,
        };
        let complete = found.len() < limit;
        // Values seen are validated at commit like point reads (absent keys, i.e. phantoms,
        // are not: see the module comment).
        for (k, v) in &found {
            if !self.writes.contains_key(k) {
                self.reads
                    .entry(k.clone())
                    .or_insert_with(|| Some(v.clone()));
            }
        }
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = found.into_iter().collect();
        for (k, p) in self.writes.range(start.to_vec()..end.to_vec()) {
            match p {
                Pending::Put(v) => {
                    merged.insert(k.clone(), v.clone());
                }
                Pending::Delete => {
                    merged.remove(k);
                }
            }
        }
        let mut out: Vec<KvPair> = merged.into_iter().collect();
        if !complete {
            // Keys past the engine's last returned key were not seen; do not report them yet.
            out.truncate(limit);
        }
        Ok(out)
    }

    /// The keys this transaction writes, with their new values (`None`: deleted).
    pub(crate) fn written(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes.iter().map(|(k, p)| {
            (
                k.as_slice(),
                match p {
                    Pending::Put(v) => Some(v.as_slice()),
                    Pending::Delete => None,
                },
            )
        })
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Pending::Put(value));
    }
    pub fn delete(&mut self, key: Vec<u8>) {
        self.writes.insert(key, Pending::Delete);
    }
    pub fn add(&mut self, key: &[u8], delta: i64) {
        if delta != 0 {
            self.extra.push(Mutation::Add {
                key: key.to_vec(),
                delta,
            });
        }
    }
    pub fn stamp(&mut self, key: Vec<u8>) {
        self.writes.remove(&key);
        self.extra.push(Mutation::Stamp { key });
    }
    pub fn set_op(&mut self, op: Op) {
        self.op = Some(op);
    }
    pub fn is_read_only(&self) -> bool {
        self.writes.is_empty() && self.extra.is_empty()
    }

    pub fn into_request(self) -> Result<CommitRequest> {
        let op = self.op.ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "internal: transaction committed without an op",
            )
        })?;
        let mut writes: Vec<Mutation> = self
            .writes
            .into_iter()
            .map(|(key, p)| match p {
                Pending::Put(value) => Mutation::Put { key, value },
                Pending::Delete => Mutation::Delete { key },
            })
            .collect();
        writes.extend(self.extra);
        Ok(CommitRequest {
            reads: self.reads.into_iter().collect(),
            writes,
            op,
        })
    }

    pub async fn commit(self) -> Result<CommitOutcome> {
        let engine = self.engine;
        let req = self.into_request()?;
        engine.commit(&req).await
    }
}
