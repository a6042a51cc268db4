//! A metadata engine a long-running opener (a mount) can move to another site without
//! restarting: when the primary role moves (a planned site migration or an engine
//! migration), `mirror-agent fence` leaves `volume.moved` in the old metadata, naming the new
//! primary's META_URL and epoch. The session's follower sees it, opens the new metadata once it
//! is the primary at that epoch (promoted: no mirror marker, `site::epoch >= moved.epoch`),
//! and swaps it in here. Inode numbers are the same on both sides (the new primary replayed
//! this one's journal), so open files and the kernel's inodes stay valid; commits refused by
//! the old metadata's fence in the meantime are retried by their callers.
//!
//! That holds only when the new history continues this one: the old metadata's last entry
//! (final once it is fenced) is at most the point where the new primary took over. After a
//! forced promotion beside a live old site it is not: the old site went on acknowledging
//! (its tail is saved and re-applied by the failover runbook), and this mount's inode
//! numbers, the names it resolved and its handles describe files the new primary does not
//! have; a rename by name there would move another file under an acknowledged name. So a
//! mount never follows such a move: its commits are refused at once with a line that says
//! to remount at the new primary, and it goes on serving reads of the old state.
//!
//! A mount follows only to metadata it reaches as a client (Redis, PostgreSQL). An embedded
//! engine (`rocksdb://`) named by the move is never opened, not even to look: it belongs to
//! the new primary's site, where its one writer (that site's read-write mount) must take its
//! lock; a mount here that opened it (as a writer, once promoted) kept that site's writers
//! down until it was unmounted. Such a mount stays on the fenced metadata, serving reads;
//! its commits are refused at once (EROFS) with a line that says to mount the new primary
//! at its site instead. A move undone before the promotion (`mirror-agent detach --meta`)
//! lets its commits through again.
//!
//! A move this metadata has caught up with (it rejoined as a mirror of the new primary and
//! holds its epoch) is over: nothing to follow, nothing to refuse.

use async_trait::async_trait;
use fs_core::engine::{CommitOutcome, Follow, Followed, JournalBounds, KvPair};
use fs_core::error::Result;
use fs_core::{CommitRequest, Engine, Entry, Mutation};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The longest a commit waits for the new primary during a move.
pub const MOVE_WAIT: Duration = Duration::from_secs(120);

pub struct MovingEngine {
    inner: RwLock<Arc<dyn Engine>>,
    /// How many times it moved (the session follower re-registers after each).
    moves: std::sync::atomic::AtomicU64,
    /// One look at the new primary at a time: commits waiting together share it.
    probing: tokio::sync::Mutex<()>,
    /// Set when the move would cross a fork (see the module text): commits are refused.
    diverged: std::sync::OnceLock<String>,
    /// The embedded metadata a move named, said once (see the module text).
    stayed: std::sync::Mutex<Option<String>>,
    /// How to open the next one.
    access: crate::Access,
    password_file: Option<PathBuf>,
}

impl MovingEngine {
    pub fn new(
        e: Arc<dyn Engine>,
        access: crate::Access,
        password_file: Option<PathBuf>,
    ) -> Arc<MovingEngine> {
        Arc::new(MovingEngine {
            inner: RwLock::new(e),
            moves: Default::default(),
            probing: Default::default(),
            diverged: Default::default(),
            stayed: Default::default(),
            access,
            password_file,
        })
    }

    pub fn moves(&self) -> u64 {
        self.moves.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn cur(&self) -> Arc<dyn Engine> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// If the metadata says the volume moved and the new primary is ready, move there.
    /// Returns the new URL when it moved.
    pub async fn follow_move(&self) -> Result<Option<String>> {
        // Said once, when found; commits refuse by themselves from then on.
        if self.diverged.get().is_some() {
            return Ok(None);
        }
        let _one = self.probing.lock().await;
        let cur = self.cur();
        let Some(m) = fs_core::site::moved(&*cur).await? else {
            return Ok(None);
        };
        if m.meta_url == cur.display_url() {
            return Ok(None);
        }
        // Rejoined since (this metadata took the new primary's epoch): the move is over.
        if fs_core::site::epoch(&*cur).await? >= m.epoch {
            return Ok(None);
        }
        // Its commits are refused by `commit` (with this line); nothing to open.
        if self.stays(&m, &*cur).is_some() {
            return Ok(None);
        }
        // Look first, read-only (a RocksDB writer's lock would keep the promotion out): not
        // promoted yet means wait (commits here stay refused meanwhile).
        {
            let probe = crate::open_engine(
                &m.meta_url,
                crate::Access::Read,
                self.password_file.clone(),
                false,
            )
            .await
            .map_err(|e| e.context(format!("looking at the new primary {}", m.meta_url)))?;
            if fs_core::site::marker(&*probe).await?.is_some()
                || fs_core::site::epoch(&*probe).await? < m.epoch
            {
                return Ok(None);
            }
            // This history is final once the fence's marker is here (commits refused);
            // before that, wait.
            if fs_core::site::marker(&*cur).await?.is_none() {
                return Ok(None);
            }
            let old_head = cur.journal_bounds().await?.last;
            let old_epoch = fs_core::site::epoch(&*cur).await?;
            let parted = fs_core::site::epoch_record(&*probe)
                .await?
                .and_then(|r| r.parted_from(old_epoch));
            if parted.is_none_or(|p| old_head > p) {
                let why = format!(
                    "this mount's metadata {} went on past the point where the new primary {} took over (it holds entries up to {old_head}; the new history continues from {}): its files, names and open handles are not the new primary's, so it does not follow the move and refuses writes; unmount it and mount {} (the failover runbook re-applies what the old site acknowledged)",
                    cur.display_url(),
                    m.meta_url,
                    parted.map_or_else(|| "a point this record does not tell".to_string(), |p| format!("entry {p}")),
                    m.meta_url
                );
                tracing::error!("{why}");
                let _ = self.diverged.set(why);
                return Ok(None);
            }
        }
        let next = crate::open_engine(&m.meta_url, self.access, self.password_file.clone(), false)
            .await
            .map_err(|e| e.context(format!("opening the new primary {}", m.meta_url)))?;
        // Callers take turns (`probing`): nobody moved since `cur` was read.
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = next;
        self.moves.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tracing::warn!(to = %m.meta_url, epoch = m.epoch, "the volume moved to a new primary: following it (open files stay open)");
        Ok(Some(m.meta_url))
    }

    /// Why this mount does not follow `m` (an embedded engine of the new primary's site),
    /// logged once per target; None when it may.
    fn stays(&self, m: &fs_core::site::Moved, cur: &dyn Engine) -> Option<String> {
        meta::local_dir(&m.meta_url)?;
        let why = stay_reason(&m.meta_url, &cur.display_url());
        let mut said = self.stayed.lock().unwrap_or_else(|p| p.into_inner());
        if said.as_deref() != Some(m.meta_url.as_str()) {
            tracing::error!("{why}");
            *said = Some(m.meta_url.clone());
        }
        Some(why)
    }
}

/// The line of a mount that does not follow a move to embedded metadata.
fn stay_reason(to: &str, cur: &str) -> String {
    format!(
        "the volume's primary moved to {to}, embedded metadata (RocksDB) at the new primary's site: a mount follows a move only to metadata it reaches as a client (Redis, PostgreSQL), and opening this one would take the writer's lock from the new primary's own mount; this mount stays on the fenced metadata {cur}, read-only (its writes fail with EROFS). Unmount it and mount {to} at the site that holds it (writers there, or at a mirror of it, go on)"
    )
}

#[async_trait]
impl Engine for MovingEngine {
    fn kind(&self) -> &'static str {
        self.cur().kind()
    }
    fn display_url(&self) -> String {
        self.cur().display_url()
    }
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.cur().get(key).await
    }
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.cur().get_many(keys).await
    }
    async fn get_many_via(&self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<Followed> {
        self.cur().get_many_via(keys, follow).await
    }
    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        self.cur().scan(start, end, limit).await
    }
    /// A commit refused because this metadata was fenced for a move waits for the new
    /// primary (at most `MOVE_WAIT`) and is committed there: the writer pauses, it does not
    /// fail.
    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        let t0 = std::time::Instant::now();
        let mut unexplained = 0;
        loop {
            if let Some(why) = self.diverged.get() {
                return Err(fs_core::Error::new(
                    fs_core::ErrorKind::ReadOnly,
                    why.clone(),
                ));
            }
            let cur = self.cur();
            let r = cur.commit(req).await;
            let Err(e) = &r else { return r };
            if e.kind() != fs_core::ErrorKind::ReadOnly || t0.elapsed() >= MOVE_WAIT {
                tracing::debug!(kind = ?e.kind(), waited = ?t0.elapsed(), "commit failed (moving engine)");
                return r;
            }
            let m = fs_core::site::moved(&*cur).await;
            tracing::debug!(moved = ?m, url = %cur.display_url(), "commit refused (moving engine)");
            match m {
                // Never followed: refused now rather than after `MOVE_WAIT`.
                Ok(Some(m)) if meta::local_dir(&m.meta_url).is_some() => {
                    // A site that rejoined since is a mirror: its own refusal says so.
                    if fs_core::site::epoch(&*cur)
                        .await
                        .is_ok_and(|e| e >= m.epoch)
                    {
                        return r;
                    }
                    let why = self.stays(&m, &*cur).unwrap_or_default();
                    return Err(fs_core::Error::new(fs_core::ErrorKind::ReadOnly, why));
                }
                Ok(Some(_)) => {}
                // A refusal with no move recorded (yet: the fence writes it first, but
                // another process may be slower): look once more, then it is final.
                Ok(None) if unexplained < 3 => unexplained += 1,
                Ok(None) => return r,
                Err(err) => tracing::debug!(error = %err, "reading the moved record"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.follow_move().await {
                Ok(Some(_)) => {
                    tracing::info!(waited = ?t0.elapsed(), "a commit waited for the new primary")
                }
                Ok(None) => {}
                Err(err) => tracing::debug!(error = %err, "the new primary is not ready yet"),
            }
        }
    }
    async fn journal_bounds(&self) -> Result<JournalBounds> {
        self.cur().journal_bounds().await
    }
    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        self.cur().journal_read(from, max).await
    }
    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool> {
        self.cur().journal_wait(after, timeout).await
    }
    async fn journal_trim(&self, before: u64) -> Result<u64> {
        self.cur().journal_trim(before).await
    }
    async fn apply(&self, entries: &[Entry]) -> Result<u64> {
        self.cur().apply(entries).await
    }
    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()> {
        self.cur().aux_put(name, value).await
    }
    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.cur().aux_list(prefix).await
    }
    async fn install_reset(&self) -> Result<()> {
        self.cur().install_reset().await
    }
    async fn install_put(&self, pairs: &[KvPair]) -> Result<()> {
        self.cur().install_put(pairs).await
    }
    async fn install_head(&self, head: u64) -> Result<()> {
        self.cur().install_head(head).await
    }
    async fn install_switch(
        &self,
        writes: &[Mutation],
        frames: &[(u64, Vec<u8>)],
        head: u64,
    ) -> Result<()> {
        self.cur().install_switch(writes, frames, head).await
    }
}
