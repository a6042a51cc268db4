//! `jfs gc`: pending deletes, leaked objects, dead sessions, the temporary files of copies
//! whose writer died (`gc_temps`), and the journal's tail. It deletes nothing unless every
//! listing (metadata and object store) completed without error, and nothing a registered
//! mirror may still need (see `slots`), nor anything a recoverable instant of the metadata
//! backups references: a pending delete stamped at a seq above the oldest snapshot's in the
//! store (`backup::hold_seq`, read after the metadata pass) is held, whatever the trash time.

use super::PAGE;
use crate::engine::{scan_all, Engine};
use crate::error::{corrupt, ErrorKind, Result};
use crate::fs::Fs;
use crate::journal::{parse_stamp, Entry, Op};
use crate::keys::{self, Key};
use crate::session::{self, Reaped};
use crate::txn::Txn;
use crate::types::{now_ns, SliceRec};
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct GcOptions {
    pub delete: bool,
    /// Pending deletes freed at a sequence number above this are kept (mirrors not caught up).
    pub safe_seq: u64,
    pub now_ns: i64,
    /// Sessions without a heartbeat for this long are dead: with `delete`, the inodes they
    /// kept open are freed and their records removed.
    pub session_timeout: std::time::Duration,
}

#[derive(Serialize, serde::Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub pending: u64,
    pub pending_due: u64,
    pub pending_held_for_mirrors: u64,
    /// Pending deletes a recoverable instant of the metadata backups still references.
    #[serde(default)]
    pub pending_held_for_backups: u64,
    pub pending_purged: u64,
    pub objects: u64,
    pub leaked: u64,
    pub leaked_bytes: u64,
    pub leaked_young: u64,
    pub leaked_deleted: u64,
    pub foreign: u64,
    pub journal_trimmed: u64,
    /// Live mount sessions.
    pub sessions_live: u64,
    /// Dead sessions (removed with --delete).
    pub sessions_dead: u64,
    /// Inodes unlinked while open and still kept.
    pub kept: u64,
    /// Of those, kept by dead sessions (freed with --delete).
    pub kept_dead: u64,
    pub kept_released: u64,
    pub sessions_removed: u64,
    /// Temporary files of copies whose writer is dead (`jfs put` killed): removed with
    /// --delete (their blocks then wait as pending deletes).
    #[serde(default)]
    pub temps_dead: u64,
    #[serde(default)]
    pub temps_removed: u64,
    /// Clones whose writer died before linking them (their inodes invisible): dropped with
    /// --delete, their slice references released.
    #[serde(default)]
    pub clones_dead: u64,
    #[serde(default)]
    pub clones_dropped: u64,
    /// A storage cutover in progress (its phase): gc deletes no block from either store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutover: Option<String>,
    /// Trash entries purged (with --delete): past the trash time, and evicted by its cap.
    #[serde(default)]
    pub trash_expired: u64,
    #[serde(default)]
    pub trash_evicted: u64,
}

impl Fs {
    /// Garbage collection. Without `delete` it only counts. It deletes nothing unless every
    /// listing (metadata and object store) completed without error.
    pub async fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut rep = GcReport::default();
        let s = &self.settings;
        // Registered mirrors hold both pending deletes and the journal (see `slots`).
        let slots = crate::slots::list(&*self.engine).await?;
        let safe_seq = opts.safe_seq.min(crate::slots::gc_safe_seq(&slots));
        let journal_max = opts.safe_seq.min(crate::slots::retain_floor(&slots));
        // 0. Sessions, and inodes kept open by them: a dead session's are freed first, so
        //    that their slices are counted below as pending deletes.
        let sessions = crate::session::list(&*self.engine).await?;
        let live: std::collections::HashSet<String> = sessions
            .iter()
            .filter(|x| x.is_live(opts.now_ns, opts.session_timeout))
            .map(|x| x.id.clone())
            .collect();
        rep.sessions_live = live.len() as u64;
        rep.sessions_dead = sessions.len() as u64 - rep.sessions_live;
        let kept = self.kept_inodes().await?;
        rep.kept = kept.len() as u64;
        rep.kept_dead = kept.iter().filter(|(_, sid)| !live.contains(sid)).count() as u64;
        if opts.delete {
            let r = self.reap_sessions(opts.session_timeout).await?;
            rep.kept_released = r.inodes;
            rep.sessions_removed = r.sessions;
            // The trash's expired entries (and what its cap evicts) are freed here too, so
            // their slices are counted below as pending deletes.
            let p = self.purge_trash(opts.now_ns).await?;
            rep.trash_expired = p.expired;
            rep.trash_evicted = p.evicted;
        }
        // 0b. Clones whose writer is dead: dropped before the pass below counts references.
        for st in self.clones_in_progress().await? {
            if live.contains(&st.session) {
                continue;
            }
            rep.clones_dead += 1;
            if opts.delete {
                self.drop_staged(&st)
                    .await
                    .map_err(|e| e.context("dropping a dead clone's inodes"))?;
                rep.clones_dropped += 1;
            }
        }
        // 1. Referenced slices (chunks) and pending deletes, from one metadata pass.
        let mut referenced: HashMap<u64, u32> = HashMap::new();
        let mut due: Vec<(u64, u32, u64)> = Vec::new();
        let mut temps: Vec<(u64, Vec<u8>, u64)> = Vec::new();
        scan_all(&*self.engine, b"", &[0xff], PAGE, |page| {
            for (k, v) in page {
                match keys::parse(&k) {
                    Key::Chunk(..) => {
                        for r in SliceRec::decode_list(&v)
                            .ok_or_else(|| corrupt("chunk does not decode"))?
                        {
                            if r.id != 0 {
                                referenced.insert(r.id, r.size);
                            }
                        }
                    }
                    Key::Pending(id, size) => {
                        rep.pending += 1;
                        referenced.insert(id, size);
                        let (seq, t) = parse_stamp(&v).ok_or_else(|| {
                            corrupt(format!("pending delete {id} has a bad stamp"))
                        })?;
                        if opts.now_ns - t < s.trash_secs as i64 * 1_000_000_000 {
                            continue;
                        }
                        if seq > safe_seq {
                            rep.pending_held_for_mirrors += 1;
                            continue;
                        }
                        due.push((id, size, seq));
                    }
                    Key::Dentry(parent, name) => {
                        // A temporary's writer ids are ASCII at the end of its name; the
                        // name before them may hold any bytes (a put of a byte name).
                        if let Some((ino, crate::types::FileKind::File)) = keys::decode_dentry(&v) {
                            if super::is_tmp_name(&String::from_utf8_lossy(name)) {
                                temps.push((parent, name.to_vec(), ino));
                            }
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .await?;
        // 1a. Backups: read after the pass above (see `backup::snapshot`).
        let hold = super::backup::hold_seq(&*self.store, &s.name)
            .await
            .map_err(|e| e.context("reading the metadata backups' catalog (gc deleted nothing)"))?;
        due.retain(|&(_, _, seq)| {
            let held = hold.is_some_and(|h| seq > h);
            rep.pending_held_for_backups += held as u64;
            !held
        });
        rep.pending_due = due.len() as u64;
        // 1b. Temporary files whose writer is dead: unlinked like any file (their slices
        //     become pending deletes, purged by a later gc after the trash time).
        let judge = super::TmpJudge::new(sessions, opts.now_ns, opts.session_timeout, false);
        for (parent, name, ino) in temps {
            let mtime = match self.getattr(ino).await {
                Ok(a) => a.mtime.max(a.ctime),
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !judge.is_stale(&String::from_utf8_lossy(&name), mtime) {
                continue;
            }
            rep.temps_dead += 1;
            if opts.delete {
                match self.unlink_temp(parent, &name).await {
                    Ok(()) => rep.temps_removed += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e.context("removing a dead copy's temporary file")),
                }
            }
        }
        // 2. The object store: complete the listing before any deletion (fail closed).
        let mut leaked: Vec<(String, u64)> = Vec::new();
        let grace = s.gc_grace_secs as i64 * 1_000_000_000;
        let name = s.name.clone();
        let mut objects = 0u64;
        let mut foreign = 0u64;
        let mut young = 0u64;
        self.store
            .list(&keys::blocks_prefix(&s.name), &mut |page| {
                for o in page {
                    objects += 1;
                    let Some((id, index, len)) = keys::parse_block_key(&name, &o.key) else {
                        foreign += 1;
                        continue;
                    };
                    let belongs = referenced.get(&id).is_some_and(|&size| {
                        keys::slice_blocks(size, s.block_size).any(|b| b == (index, len))
                    });
                    if belongs {
                        continue;
                    }
                    // Unknown age counts as young: never delete what we cannot date.
                    if o.modified_ns.is_none_or(|m| opts.now_ns - m < grace) {
                        young += 1;
                        continue;
                    }
                    leaked.push((o.key, o.size));
                }
                Ok(())
            })
            .await
            .map_err(|e| e.context("listing the object store (gc deleted nothing)"))?;
        rep.objects = objects;
        rep.foreign = foreign;
        rep.leaked_young = young;
        rep.leaked = leaked.len() as u64;
        rep.leaked_bytes = leaked.iter().map(|(_, n)| n).sum();
        // A storage cutover copies what the metadata references from one store to the other
        // and may still go back: no block is deleted from either until it is over.
        let st = crate::storage::current(&*self.engine, &s.storage).await?;
        if !matches!(st.phase, crate::storage::Phase::Single { .. }) {
            rep.cutover = Some(st.phase.describe());
            return Ok(rep);
        }
        if !opts.delete {
            return Ok(rep);
        }
        // 3. Delete: pending slices' blocks first, then their keys (a crash in between only
        //    means the next gc deletes already-missing blocks again).
        for batch in due.chunks(1000) {
            for &(id, size, _) in batch {
                for (key, _) in self.slice_block_keys(id, size) {
                    match self.store.delete(&key).await {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => return Err(e.context(format!("deleting block {key}"))),
                    }
                }
            }
            let mut tx = Txn::new(&*self.engine);
            for &(id, size, _) in batch {
                tx.delete(keys::pending(id, size));
                tx.delete(keys::checksums(id));
            }
            tx.set_op(Op::Purge {
                slices: batch.len() as u64,
            });
            tx.commit().await?;
            rep.pending_purged += batch.len() as u64;
        }
        if !leaked.is_empty() {
            // Blocks that look leaked in a prefix another volume of this name claims are
            // that volume's.
            crate::owner::check(&*self.store, s)
                .await
                .map_err(|e| e.context("gc deleted no leaked object"))?;
        }
        for (key, _) in &leaked {
            self.store
                .delete(key)
                .await
                .map_err(|e| e.context(format!("deleting leaked object {key}")))?;
            rep.leaked_deleted += 1;
        }
        // 4. Journal retention by age (the head entry is always kept).
        rep.journal_trimmed = self
            .trim_journal(
                opts.now_ns - s.journal_retention_secs as i64 * 1_000_000_000,
                journal_max,
            )
            .await?;
        Ok(rep)
    }

    /// Drop journal entries committed before `cutoff_ns` (and at or below `max_seq`).
    pub async fn trim_journal(&self, cutoff_ns: i64, max_seq: u64) -> Result<u64> {
        trim_journal(&*self.engine, cutoff_ns, max_seq).await
    }
}

/// Drop journal entries committed before `cutoff_ns` (and at or below `max_seq`); the head
/// entry is always kept.
pub async fn trim_journal(engine: &dyn Engine, cutoff_ns: i64, max_seq: u64) -> Result<u64> {
    {
        let b = engine.journal_bounds().await?;
        let mut before = b.first;
        'outer: while before < b.last && before <= max_seq {
            let frames = engine.journal_read(before, 1000).await?;
            if frames.is_empty() {
                break;
            }
            for (seq, f) in frames {
                let e = Entry::decode_at(seq, &f)
                    .map_err(|e| e.context(format!("journal entry {seq}")))?;
                if e.time_ns >= cutoff_ns || seq >= b.last || seq > max_seq {
                    before = seq;
                    break 'outer;
                }
                before = seq + 1;
            }
        }
        if before > b.first {
            engine.journal_trim(before).await
        } else {
            Ok(0)
        }
    }
}

impl Fs {
    /// Free the kept inodes of dead sessions (a kept inode naming no session record at all is
    /// dead too), then drop the dead sessions' records: inodes first, so a crash in between
    /// leaves nothing unfreeable.
    pub async fn reap_sessions(&self, timeout: Duration) -> Result<Reaped> {
        let now = now_ns();
        let sessions = session::list(&**self.engine()).await?;
        let live: std::collections::HashSet<&str> = sessions
            .iter()
            .filter(|s| s.is_live(now, timeout))
            .map(|s| s.id.as_str())
            .collect();
        let mut out = Reaped::default();
        for (ino, sid) in self.kept_inodes().await? {
            if !live.contains(sid.as_str()) && self.release_kept(ino).await? {
                out.inodes += 1;
            }
        }
        for s in sessions.iter().filter(|s| !live.contains(s.id.as_str())) {
            session::remove(&**self.engine(), &s.id).await?;
            out.sessions += 1;
        }
        Ok(out)
    }
}

pub fn gc_defaults() -> GcOptions {
    GcOptions {
        delete: false,
        safe_seq: u64::MAX,
        now_ns: now_ns(),
        session_timeout: crate::session::DEFAULT_TIMEOUT,
    }
}
