//! The small transactional interface every metadata engine implements (RocksDB, Redis,
//! PostgreSQL live in the `meta` crate). fs-core builds all file-system semantics on it.
//!
//! Contract for `commit`, the one subtle method:
//! - atomically with respect to every other commit on this volume (from any process), check
//!   that each key in `reads` still has the value recorded (absent = None), and if any differs
//!   return `Conflict` and change nothing;
//! - otherwise take `seq = head + 1`, build the entry with `CommitRequest::materialize`, apply
//!   its write-set, append its frame to the journal under `seq`, set `head = seq`, all in one
//!   atomic write, and wake journal readers.
//! Hence sequence numbers are gap-free, strictly increasing and in commit order.
//!
//! Site fencing (see `site`): `commit` fails with `ReadOnly` on metadata that carries the
//! mirror marker, checked inside the same commit section; `apply` and `install_*` fail with
//! `ReadOnly` on metadata that does not carry it.

use crate::error::Result;
use crate::journal::{CommitRequest, Entry, Mutation};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed { seq: u64, time_ns: i64 },
    Conflict,
}

/// Retained journal range: entries `first..=last` can be read. Empty when `first > last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct JournalBounds {
    pub first: u64,
    pub last: u64,
}

impl JournalBounds {
    /// Where a read asked to start at `from` begins (0 means the first entry), or
    /// `SeqNotRetained` when that entry was trimmed: a reader never jumps a gap silently.
    pub fn check_from(&self, from: u64) -> Result<u64> {
        let from = from.max(1);
        if from < self.first {
            return Err(crate::Error::new(
                crate::ErrorKind::SeqNotRetained,
                format!(
                    "journal entry {from} is no longer retained (first retained is {})",
                    self.first
                ),
            ));
        }
        Ok(from)
    }
}

/// The entries to replay after `head`: those at or below it are skipped (replay is
/// idempotent), the rest must run on from `head + 1` without a gap.
pub fn entries_after(head: u64, entries: &[Entry]) -> Result<Vec<&Entry>> {
    let todo: Vec<&Entry> = entries.iter().filter(|e| e.seq > head).collect();
    for (i, e) in todo.iter().enumerate() {
        let want = head + 1 + i as u64;
        if e.seq != want {
            return Err(crate::Error::new(
                crate::ErrorKind::InvalidArgument,
                format!("replay gap: entry {} where {want} was expected", e.seq),
            ));
        }
    }
    Ok(todo)
}

pub type KvPair = (Vec<u8>, Vec<u8>);
/// The values of a list of keys, in its order (`None`: absent).
pub type Values = Vec<Option<Vec<u8>>>;

/// What `Engine::get_many_via` reads besides its keys: records of the inode that the first
/// key's value names (a directory entry's value starts with the 8 bytes of its inode).
#[derive(Clone, Copy, Debug)]
pub struct Follow<'a> {
    /// The inode's records' keys are `prefix ++ inode (8 bytes) ++ ...`.
    pub prefix: &'a [u8],
    /// Point reads: `prefix ++ inode ++ s` for each `s`.
    pub suffixes: &'a [Vec<u8>],
    /// A range read: at most `limit` pairs with keys in `[prefix ++ inode ++ from,
    /// prefix ++ inode ++ to)`, in key order (`limit` 0: none).
    pub range: (&'a [u8], &'a [u8], usize),
}

impl Follow<'_> {
    /// The 8 bytes naming the inode, from the first key's value; none when it is absent or
    /// shorter.
    pub fn inode_of(value: Option<&[u8]>) -> Option<&[u8]> {
        value.filter(|v| v.len() >= 8).map(|v| &v[..8])
    }
    /// The followed point keys under `inode`.
    pub fn keys(&self, inode: &[u8]) -> Vec<Vec<u8>> {
        self.suffixes
            .iter()
            .map(|s| [self.prefix, inode, s].concat())
            .collect()
    }
    /// The followed range under `inode`: start, end, limit.
    pub fn range_of(&self, inode: &[u8]) -> (Vec<u8>, Vec<u8>, usize) {
        let (from, to, limit) = self.range;
        (
            [self.prefix, inode, from].concat(),
            [self.prefix, inode, to].concat(),
            limit,
        )
    }
}

/// What `Engine::get_many_via` read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// The values of the keys asked for.
    pub values: Values,
    /// The values of the followed point keys (empty when nothing was followed).
    pub followed: Values,
    /// The followed range's pairs (empty when nothing was followed).
    pub range: Vec<KvPair>,
    /// No more keys lie in the range than `range` holds (fewer than the limit were found).
    pub range_complete: bool,
}

#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// "rocksdb", "redis" or "postgres".
    fn kind(&self) -> &'static str;
    /// The metadata URL with any password removed, for logs and `status`.
    fn display_url(&self) -> String;

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.get(k).await?);
        }
        Ok(out)
    }
    /// `get_many(keys)`, and the records of the inode that the value of `keys[0]` names
    /// (`Follow`): in one round trip, at one moment, on Redis (a script) and PostgreSQL (one
    /// statement); the default (RocksDB, local) reads them one call after another, which
    /// transactions tolerate (point reads are checked at commit). A lookup reads the name,
    /// the inode and the parent in one call instead of two; an unlink also the file's first
    /// chunk and its extended attributes.
    async fn get_many_via(&self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<Followed> {
        let values = self.get_many(keys).await?;
        let mut out = Followed {
            values,
            ..Default::default()
        };
        if let Some(ino) = Follow::inode_of(out.values.first().and_then(|v| v.as_deref())) {
            let ino = ino.to_vec();
            let ks = follow.keys(&ino);
            if !ks.is_empty() {
                out.followed = self.get_many(&ks).await?;
            }
            let (start, end, limit) = follow.range_of(&ino);
            if limit > 0 {
                out.range = self.scan(&start, &end, limit).await?;
                out.range_complete = out.range.len() < limit;
            }
        }
        Ok(out)
    }
    /// Up to `limit` pairs with `start <= key < end`, in key order. Fewer than `limit` only
    /// when no more keys lie in the range (callers page on that), even while other clients
    /// change keys in it.
    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>>;

    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome>;

    async fn journal_bounds(&self) -> Result<JournalBounds>;
    /// Raw frames of entries with `seq >= from`, ascending, at most `max`. Errors with
    /// `SeqNotRetained` when `from` is below the first retained entry.
    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>>;
    /// Wait until an entry after `after` exists or `timeout` passes; true if one exists.
    /// Never a tight poll loop.
    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool>;
    /// Drop entries with `seq < before` (never the head entry). Returns how many were dropped.
    async fn journal_trim(&self, before: u64) -> Result<u64>;

    /// Replay entries produced elsewhere, in order: apply each write-set, append the same
    /// frames to this journal and advance the head, as one atomic write per call. The first
    /// entry must be `head + 1` (entries at or below head are skipped: replay is idempotent).
    async fn apply(&self, entries: &[Entry]) -> Result<u64>;

    /// Small named records kept beside the volume but outside its key space and journal:
    /// never replicated, never part of a dump (replication slots live here). Names are
    /// `[A-Za-z0-9._-]+`. `None` deletes.
    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()>;
    /// Every aux record whose name starts with `prefix`, sorted by name.
    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;

    /// Snapshot install at a mirror, step 1: remove every key, the journal and the head.
    async fn install_reset(&self) -> Result<()>;
    /// Step 2 (any number of times): write pairs as they are, without journal entries.
    async fn install_put(&self, pairs: &[KvPair]) -> Result<()>;
    /// Step 3: set the head to the snapshot's sequence number; the journal stays empty, so
    /// the next `apply` must start at `head + 1`.
    async fn install_head(&self, head: u64) -> Result<()>;

    /// Snapshot install *beside* the live state (a mirror that already serves a consistent
    /// state resyncs into a staging copy, see `diff`), last step: in one atomic write, apply
    /// `writes` (puts and deletes), replace the whole journal by `frames` (ascending and
    /// gap-free) and set the head to `head` (the last frame's seq, or the snapshot's when
    /// there are none). Readers see the state before or after, never a mix. Refused with
    /// `ReadOnly` unless the metadata carries the mirror marker.
    async fn install_switch(
        &self,
        writes: &[Mutation],
        frames: &[(u64, Vec<u8>)],
        head: u64,
    ) -> Result<()>;
}

/// Check the arguments of `install_switch`: puts and deletes only, frames ascending without
/// a gap, ending at `head`.
pub fn check_switch(writes: &[Mutation], frames: &[(u64, Vec<u8>)], head: u64) -> Result<()> {
    if writes
        .iter()
        .any(|m| !matches!(m, Mutation::Put { .. } | Mutation::Delete { .. }))
    {
        return Err(crate::Error::new(
            crate::ErrorKind::InvalidArgument,
            "install_switch takes puts and deletes only",
        ));
    }
    let ok = frames.windows(2).all(|w| w[1].0 == w[0].0 + 1)
        && frames.last().is_none_or(|(s, _)| *s == head);
    if !ok {
        return Err(crate::Error::new(
            crate::ErrorKind::InvalidArgument,
            format!(
                "install_switch: the frames ({:?}..{:?}) are not gap-free up to head {head}",
                frames.first().map(|f| f.0),
                frames.last().map(|f| f.0)
            ),
        ));
    }
    Ok(())
}

/// Reads a whole key space in key order, a page at a time.
struct Pager<'a> {
    engine: &'a dyn Engine,
    buf: VecDeque<KvPair>,
    from: Option<Vec<u8>>,
}

impl<'a> Pager<'a> {
    const PAGE: usize = 4096;

    fn new(engine: &'a dyn Engine) -> Self {
        Pager {
            engine,
            buf: VecDeque::new(),
            from: Some(Vec::new()),
        }
    }

    async fn next(&mut self) -> Result<Option<KvPair>> {
        if self.buf.is_empty() {
            if let Some(from) = self.from.take() {
                let page = self.engine.scan(&from, &[0xff], Self::PAGE).await?;
                // Only an empty page ends it (a key missed here would be deleted by `diff`).
                if !page.is_empty() {
                    let mut after = page.last().expect("a page").0.clone();
                    after.push(0);
                    self.from = Some(after);
                }
                self.buf.extend(page);
            }
        }
        Ok(self.buf.pop_front())
    }
}

/// The writes that make `live`'s key space equal to `staged`'s: a put for every key that is
/// new or changed, a delete for every key `staged` lacks (one ordered pass over both; the
/// result holds only what differs). Neither engine may change meanwhile.
pub async fn diff(live: &dyn Engine, staged: &dyn Engine) -> Result<Vec<Mutation>> {
    let (mut a, mut b) = (Pager::new(live), Pager::new(staged));
    let (mut x, mut y) = (a.next().await?, b.next().await?);
    let mut out = Vec::new();
    loop {
        let order = match (&x, &y) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        match order {
            std::cmp::Ordering::Less => {
                let (key, _) = x.take().expect("present");
                out.push(Mutation::Delete { key });
                x = a.next().await?;
            }
            std::cmp::Ordering::Greater => {
                let (key, value) = y.take().expect("present");
                out.push(Mutation::Put { key, value });
                y = b.next().await?;
            }
            std::cmp::Ordering::Equal => {
                let (_, va) = x.take().expect("present");
                let (key, value) = y.take().expect("present");
                if va != value {
                    out.push(Mutation::Put { key, value });
                }
                x = a.next().await?;
                y = b.next().await?;
            }
        }
    }
    Ok(out)
}

/// Check an aux record name (it becomes a file name with RocksDB).
pub fn check_aux_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 200
        || name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(crate::Error::new(
            crate::ErrorKind::InvalidArgument,
            format!("aux record name {name:?}: use letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
}

/// Read every pair in `[start, end)` page by page, calling `f` for each page.
pub async fn scan_all<F>(
    engine: &dyn Engine,
    start: &[u8],
    end: &[u8],
    page: usize,
    mut f: F,
) -> Result<()>
where
    F: FnMut(Vec<KvPair>) -> Result<()>,
{
    let mut from = start.to_vec();
    loop {
        let batch = engine.scan(&from, end, page).await?;
        let n = batch.len();
        if let Some((k, _)) = batch.last() {
            from = k.clone();
            from.push(0);
        }
        f(batch)?;
        if n < page {
            return Ok(());
        }
    }
}
