//! Block replication at a mirror: which blocks an applied entry adds, cancels or purges, and
//! the pool of workers that copies them from the origin store to the mirror store, limited in
//! bytes/s and requests/s, retried with capped exponential backoff, verified by length and by
//! the CRC32C the slice recorded (format 2; on a format-1 volume, by the origin's MD5 ETag
//! where it has one). The copies run in the `Copier` worker.

use crate::metrics::Metrics;
use crate::staging::Meta;
use crate::state::{Changes, QItem, State};
use background::{WorkerState, WorkerStatus};
use fs_core::keys::{self, Key};
use fs_core::{BlockCheck, BlockStore, Entry, ErrorKind, Mutation, Settings, SliceRec};
use objstore::limits::Limits;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

/// The block keys of every slice in a chunk value.
fn chunk_blocks(s: &Settings, value: &[u8], out: &mut Vec<(String, u32)>) {
    for r in SliceRec::decode_list(value).unwrap_or_default() {
        if r.id != 0 {
            slice_keys(s, r.id, r.size, |k, len| out.push((k, len)));
        }
    }
}

fn slice_keys(s: &Settings, id: u64, size: u32, mut f: impl FnMut(String, u32)) {
    for (key, len) in keys::slice_block_keys(&s.name, id, size, s.block_size) {
        f(key, len);
    }
}

/// What applying these entries means for the block queue.
pub fn changes_of_entries(s: &Settings, entries: &[Entry]) -> Changes {
    let mut ch = Changes::default();
    for e in entries {
        for m in &e.writes {
            match (m, keys::parse(m.key())) {
                (Mutation::Put { value, .. }, Key::Chunk(..)) => {
                    chunk_blocks(s, value, &mut ch.add)
                }
                (Mutation::Put { .. }, Key::Pending(id, size)) => {
                    slice_keys(s, id, size, |k, _| ch.cancel.push(k))
                }
                (Mutation::Delete { .. }, Key::Pending(id, size)) => {
                    slice_keys(s, id, size, |k, _| ch.purge.push(k))
                }
                _ => {}
            }
        }
    }
    // A block added then cancelled within the same batch stays cancelled (record() applies
    // adds before cancels).
    ch
}

/// What a page of snapshot pairs means for the block queue.
pub fn changes_of_pairs(s: &Settings, pairs: &[(Vec<u8>, Vec<u8>)]) -> Changes {
    let mut ch = Changes::default();
    for (k, v) in pairs {
        if let Key::Chunk(..) = keys::parse(k) {
            chunk_blocks(s, v, &mut ch.add);
        }
    }
    ch
}

pub struct Replicator {
    pub state: Arc<State>,
    /// The mirror's metadata (applied before blocks are queued), and the resync staging
    /// while there is one: the checksums of slices.
    meta: Arc<Meta>,
    settings: Settings,
    pub origin: Arc<dyn BlockStore>,
    pub dest: Arc<dyn BlockStore>,
    pub limits: Arc<Limits>,
    pub workers: usize,
    pub notify: Notify,
    pub metrics: Arc<Metrics>,
    inflight: Mutex<HashSet<String>>,
    pub last_error: Mutex<Option<String>>,
}

impl Replicator {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        state: Arc<State>,
        meta: Arc<Meta>,
        settings: Settings,
        origin: Arc<dyn BlockStore>,
        dest: Arc<dyn BlockStore>,
        limits: Arc<Limits>,
        workers: usize,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Replicator {
            state,
            meta,
            settings,
            origin,
            dest,
            limits,
            workers,
            notify: Notify::new(),
            metrics,
            inflight: Mutex::new(HashSet::new()),
            last_error: Mutex::new(None),
        })
    }

    /// The worker that runs the copies (see `Copier`).
    pub fn worker(self: &Arc<Self>) -> Copier {
        Copier {
            sem: Arc::new(Semaphore::new(self.workers)),
            r: self.clone(),
            tasks: tokio::task::JoinSet::new(),
            minute: tokio::time::interval(Duration::from_secs(60)),
        }
    }

    async fn purge_some(&self) -> anyhow::Result<()> {
        // During a staged resync the live metadata, which mounts read, may still reference
        // what the staging's entries purge: deletions wait for the switch.
        if self.state.bootstrap()?.is_some_and(|b| b.staged()) {
            return Ok(());
        }
        for key in self.state.purges(256)? {
            if !self.state.purge_wanted(&key)? {
                continue; // queued again meanwhile
            }
            match self.dest.delete(&key).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(anyhow::anyhow!("{key}: {e}")),
            }
            self.state.purged(&key)?;
            self.metrics.blocks_deleted.inc();
        }
        Ok(())
    }

    async fn copy_one(&self, key: &str, item: QItem) {
        match self.try_copy(key, item.len).await {
            Ok(Some(Copy::NotNeeded(why))) => {
                // Its slice is gone from the mirror's metadata: nothing references the block
                // any more, and nothing ever will (slice ids are never reused). Waiting for it
                // would keep the mirror from ever reporting converged.
                match self.state.drop_unneeded(key) {
                    Ok(true) => {
                        self.metrics.blocks_dropped.inc();
                        tracing::info!(key, %why, "a queued copy is not needed any more: dropped from the queue");
                    }
                    Ok(false) => {}
                    Err(e) => tracing::error!(error = %e, key, "dropping a copy no longer needed"),
                }
            }
            Ok(None) => {
                // A snapshot is being installed and its slice's checksum record has not
                // arrived yet: try again shortly (not an error).
                let next = QItem {
                    next_ns: fs_core::now_ns() + 1_000_000_000,
                    ..item
                };
                if let Err(e) = self.state.retry(key, next) {
                    tracing::error!(error = %e, key, "recording a postponed copy");
                }
            }
            Ok(Some(c)) => {
                let copied = matches!(c, Copy::Copied);
                match self.state.done(key) {
                    Ok(true) => {}
                    Ok(false) if copied => {
                        // Cancelled or purged while copying: the copy just made is not left
                        // behind. It is deleted through the purge queue, which waits for a
                        // staged resync's switch (the live metadata may be another history's).
                        if let Err(e) = self.state.purge_later(key) {
                            tracing::error!(error = %e, key, "recording the removal of a copy no longer wanted");
                        }
                    }
                    // It was at this store before this copy (a former primary rejoining holds
                    // its own history's blocks): not this copy's to remove.
                    Ok(false) => {}
                    Err(e) => tracing::error!(error = %e, key, "recording a finished copy"),
                }
                if copied {
                    self.metrics.blocks_copied.inc();
                    self.metrics.bytes_copied.inc_by(item.len as u64);
                } else {
                    self.metrics.blocks_skipped.inc();
                }
            }
            Err(e) => {
                self.metrics.copy_errors.inc();
                let attempts = item.attempts.saturating_add(1);
                let wait = fs_core::retry::Backoff::NETWORK.delay(attempts);
                if attempts <= 3 || attempts % 10 == 0 {
                    tracing::warn!(key, attempts, retry_in = ?wait, error = %e, "block copy failed; kept in the queue");
                }
                *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(format!("{key}: {e}"));
                let next = QItem {
                    len: item.len,
                    attempts,
                    next_ns: fs_core::now_ns() + wait.as_nanos() as i64,
                };
                if let Err(e) = self.state.retry(key, next) {
                    tracing::error!(error = %e, key, "recording a failed copy");
                }
            }
        }
    }

    /// What block `key` must be: its length, and the CRC32C its slice recorded (read from
    /// the mirror's metadata, where the entry that referenced the slice was applied). None
    /// while a snapshot install has not brought the record yet; `Needed::No` when the slice
    /// is gone from a consistent mirror's metadata.
    async fn check_of(&self, key: &str, len: u32) -> anyhow::Result<Option<Needed>> {
        if !self.settings.checksums() {
            return Ok(Some(Needed::Yes(BlockCheck { len, crc: None })));
        }
        let Some((id, index, _)) = keys::parse_block_key(&self.settings.name, key) else {
            anyhow::bail!("{key} is not a block key of volume {}", self.settings.name);
        };
        // The staging (a resync's newer state) first, then the live metadata.
        let mut crc = None;
        let mut present = false;
        for e in self
            .meta
            .staging()
            .into_iter()
            .chain([self.meta.live.clone()])
        {
            let raw = e.get(&keys::checksums(id)).await?;
            present |= raw.is_some();
            crc = raw
                .as_deref()
                .and_then(keys::decode_checksums)
                .and_then(|c| c.get(index as usize).copied());
            if crc.is_some() {
                break;
            }
        }
        let Some(crc) = crc else {
            let boot = self.state.bootstrap()?;
            if matches!(boot, Some(crate::state::Bootstrap::Installing { .. })) {
                return Ok(None);
            }
            if !present && boot.is_none() {
                // A format-2 slice has its record from the transaction that first references
                // it until gc purges it: a consistent mirror without the record does not
                // reference the slice (freed and purged). A queue item can outlive its slice
                // when its cancel never reached the queue (a state directory older than the
                // metadata, a record that failed after its apply).
                let freed = !self
                    .meta
                    .live
                    .scan(
                        &keys::pending(id, 0)[..9],
                        &keys::prefix_end(&keys::pending(id, 0)[..9]),
                        1,
                    )
                    .await?
                    .is_empty();
                return Ok(Some(Needed::No(format!(
                    "slice {id} is not referenced by the mirror's metadata ({})",
                    if freed { "freed" } else { "freed and purged" }
                ))));
            }
            anyhow::bail!("slice {id} has no valid checksum record for block {index} at the mirror ({}); not copied", if present { "its record is damaged" } else { "a resync is catching up: retried" });
        };
        Ok(Some(Needed::Yes(BlockCheck {
            len,
            crc: Some(crc),
        })))
    }

    /// What happened to the copy; None: not yet (see `check_of`). Both stores are under
    /// the agent's limits as layers (`volume::LimitedStore`): every call pays a request, the
    /// origin's reads pay their bytes.
    async fn try_copy(&self, key: &str, len: u32) -> anyhow::Result<Option<Copy>> {
        if let Some(m) = self.dest.head(key).await? {
            if m.size == len as u64 {
                return Ok(Some(Copy::AlreadyThere));
            }
        }
        let check = match self.check_of(key, len).await? {
            None => return Ok(None),
            Some(Needed::No(why)) => return Ok(Some(Copy::NotNeeded(why))),
            Some(Needed::Yes(c)) => c,
        };
        // Without a recorded checksum (format 1), the origin's entity tag, when it is an MD5
        // (S3 single-part uploads, which blocks are), is checked against the bytes read.
        let want_md5 = if check.crc.is_none() {
            self.origin.head(key).await?.and_then(|m| m.md5_etag())
        } else {
            None
        };
        // Read like every reader: the block with its check (length and recorded CRC32C).
        let data = self
            .origin
            .get_block(key, check)
            .await
            .map_err(|e| match e.kind() {
                fs_core::ErrorKind::Corrupt => anyhow::anyhow!("{e}; not copied"),
                _ => anyhow::Error::new(e),
            })?;
        if check.crc.is_some() {
            self.metrics.blocks_checksummed.inc();
        }
        if let Some(want) = want_md5 {
            use md5::Digest;
            let got: [u8; 16] = md5::Md5::digest(&data).into();
            if got != want {
                anyhow::bail!("checksum mismatch: the bytes read do not hash to the origin's MD5 ETag; not copied");
            }
            self.metrics.blocks_checksummed.inc();
        }
        self.dest.put(key, data).await?;
        Ok(Some(Copy::Copied))
    }
}

/// The block copier, a `background::Worker`: takes from the queue only what free workers
/// start now (so that a copy moved ahead, a reader wants it, is next), deletes purged blocks,
/// and refreshes the bandwidth timetable every minute. It is idle only with no copy in
/// flight; on shutdown, copies in flight finish for up to 10 s and the rest stay queued.
pub struct Copier {
    r: Arc<Replicator>,
    sem: Arc<Semaphore>,
    tasks: tokio::task::JoinSet<()>,
    minute: tokio::time::Interval,
}

impl Copier {
    /// Until there may be more to do: a notification, a quarter second, the minute tick.
    async fn pause(&mut self) {
        tokio::select! {
            _ = self.r.notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = self.minute.tick() => self.r.limits.refresh(),
        }
    }
}

#[async_trait::async_trait]
impl background::Worker for Copier {
    fn name(&self) -> String {
        "block copier".into()
    }

    async fn work(&mut self, stop: &CancellationToken) -> anyhow::Result<WorkerState> {
        if stop.is_cancelled() {
            // Drain: let copies in flight finish for a short while, then leave the rest queued.
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while self.tasks.join_next().await.is_some() {}
            })
            .await;
            return Ok(WorkerState::Done);
        }
        let r = self.r.clone();
        if let Err(e) = r.purge_some().await {
            tracing::warn!(error = %e, "deleting purged blocks at the mirror store");
        }
        let free = self.sem.available_permits();
        if free == 0 {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = self.tasks.join_next() => {}
            }
            return Ok(WorkerState::Busy);
        }
        let due = {
            let inflight = r.inflight.lock().unwrap_or_else(|p| p.into_inner());
            r.state
                .due(fs_core::now_ns(), free, &|k| inflight.contains(k))
        };
        let due = match due {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "reading the block queue");
                Vec::new()
            }
        };
        if due.is_empty() {
            if self.tasks.is_empty() {
                return Ok(WorkerState::Idle);
            }
            // Copies in flight: wait here (never idle with copies to drain).
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = self.pause() => {}
            }
            while self.tasks.try_join_next().is_some() {}
            return Ok(WorkerState::Busy);
        }
        for (key, item) in due {
            let Ok(permit) = self.sem.clone().try_acquire_owned() else {
                break; // not reached: `due` asked for no more than the free workers
            };
            r.inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone());
            let me = r.clone();
            self.tasks.spawn(async move {
                me.copy_one(&key, item).await;
                me.inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                drop(permit);
            });
        }
        while self.tasks.try_join_next().is_some() {}
        Ok(WorkerState::Busy)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.pause().await;
        WorkerState::Busy
    }

    fn status(&self) -> WorkerStatus {
        let mut s = WorkerStatus {
            progress: Some(format!("{} copies in flight", self.tasks.len())),
            queue_length: self.r.state.pending().ok().map(|(n, _, _)| n),
            ..Default::default()
        };
        if let Some(e) = self
            .r
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            s.detail.insert("last_copy_error".into(), e.clone().into());
        }
        s
    }
}

/// Whether a queued block is still needed, and how to check it.
enum Needed {
    Yes(BlockCheck),
    /// Not referenced any more: why.
    No(String),
}

/// The outcome of one copy attempt that did not fail.
enum Copy {
    Copied,
    /// Already at the mirror store with the right length.
    AlreadyThere,
    /// Its slice is gone from the mirror's metadata: why.
    NotNeeded(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A former primary rejoining as a mirror holds its own history's blocks in its store:
    /// a copy that finds one there and whose item was cancelled meanwhile (the new history
    /// freed that slice) leaves it alone; the diverged tail still reads it until it is saved.
    #[tokio::test]
    async fn a_cancelled_copy_never_deletes_a_block_it_found_at_the_mirror() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["store", "origin"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let store_url = format!("file://{}", dir.path().join("store").display());
        let dest = volume::open_store(&store_url, None).unwrap();
        let origin = volume::open_store(
            &format!("file://{}", dir.path().join("origin").display()),
            None,
        )
        .unwrap();
        let live = meta::open(
            &format!("rocksdb://{}", dir.path().join("meta").display()),
            &meta::OpenOptions {
                create: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let state = Arc::new(State::open(&dir.path().join("state")).unwrap());
        let key = "v/chunks/0/0/16_0_5";
        dest.put(key, Bytes::from_static(b"mine!")).await.unwrap();
        // Queued by the snapshot, then cancelled by an entry of the new history.
        for ch in [
            Changes {
                add: vec![(key.to_string(), 5)],
                ..Default::default()
            },
            Changes {
                cancel: vec![key.to_string()],
                ..Default::default()
            },
        ] {
            state.record(&ch, None, 0).unwrap();
        }
        let r = Replicator::new(
            state.clone(),
            crate::staging::Meta::new(live, &dir.path().join("state")),
            Settings::new("v", &store_url, 4 << 20),
            origin,
            dest.clone(),
            Arc::new(Limits::new(None, None).unwrap()),
            1,
            Arc::new(Metrics::new(false)),
        );
        let item = QItem {
            len: 5,
            attempts: 0,
            next_ns: 0,
        };
        r.copy_one(key, item).await;
        r.purge_some().await.unwrap();
        assert_eq!(&dest.get(key).await.unwrap()[..], b"mine!");
        assert!(state.purges(10).unwrap().is_empty());
    }
}
