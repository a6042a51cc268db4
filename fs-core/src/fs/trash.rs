//! The trash: what a delete, an overwrite (a rename over a file) or a truncate to zero would
//! free is kept for the volume's trash time (`Settings::trash_secs`), restorable by path and
//! instant, then purged by the primary's background work.
//!
//! A trashed inode keeps its number and every `A<ino>...` record (attributes, chunks,
//! xattrs, symlink target), loses its directory entry, and gets two records in the same
//! transaction: `A<ino>T` (`TrashInfo`: the directory and name it had, its kind, why it went,
//! its size) and `T<at_ns><ino>` (stamped with the seq and time of the deleting commit; the
//! keys sort oldest first, so expiry and the size cap scan from the start). A directory
//! removed by `rm -rf` is trashed by its own rmdir (it is empty then): what was deleted in it
//! still names it as its directory, so the tree's shape is known. A truncate to zero moves the
//! file's chunk records to a new inode with the old attributes (`why: truncated, of: ino`):
//! nothing is copied and no slice is referenced twice.
//!
//! Trashed inodes are not orphans: their chunks stay referenced (gc keeps their blocks, a
//! mirror keeps its copies: no pending delete is stamped), their sizes stay in the volume's
//! usage. A purge frees one through the normal free path (`Fs::free_inode`), so its slices
//! then wait as pending deletes like any freed slice. Everything here is an ordinary journaled
//! commit: the trash, its purges and restores reach every mirror; only the primary purges.

use super::{get_attr, get_dir, lookup_entry, put_attr, transact, Fs};
use crate::error::{invalid, not_found, Error, ErrorKind, Result};
use crate::journal::{parse_stamp, Op};
use crate::keys::{self, Key};
use crate::maint::{decode_name, encode_name};
use crate::path::VolPath;
use crate::record::{self, Versioned};
use crate::txn::Txn;
use crate::types::{now_ns, Attr, FileKind, Ino, ROOT_INO};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Why an inode went to the trash.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    Deleted,
    /// Replaced by a rename over it (or by `jfs restore --version`).
    Overwritten,
    /// The old data of a file truncated to zero (an inode of its own, see `of`).
    Truncated,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Deleted => "deleted",
            Why::Overwritten => "overwritten",
            Why::Truncated => "truncated",
        }
    }
}

/// The record `A<ino>T` of a trashed inode.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TrashInfo {
    /// When it went (the key's time).
    pub at_ns: i64,
    /// The directory it was in (a truncated file's old data: the file's directory).
    pub parent: Ino,
    /// Its name there, as `jfs dump` writes names (empty for a truncated file's old data).
    pub name: String,
    pub kind: FileKind,
    pub why: Why,
    /// The file whose old data this is (`why: truncated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<Ino>,
    /// Its length then (0 for a directory).
    pub size: u64,
    /// Its directory's mtime before this removal changed it (0: not known): a directory
    /// restored with what was deleted in it gets back the mtime it had before the first.
    #[serde(default)]
    pub dir_mtime: i64,
}

impl Versioned for TrashInfo {
    const KIND: &'static str = "trash record";
    const VERSION: u32 = 1;
}

impl TrashInfo {
    pub fn name_bytes(&self) -> Vec<u8> {
        decode_name(&self.name).unwrap_or_else(|_| self.name.as_bytes().to_vec())
    }
}

/// Where an inode going to the trash was, and why it goes.
#[derive(Clone, Copy, Debug)]
pub struct From<'a> {
    pub parent: Ino,
    pub name: &'a [u8],
    pub why: Why,
    /// Trash it even with the trash off (a restore's replaced file: the restore is undoable).
    pub force: bool,
    /// The directory's mtime before this removal (0: not known).
    pub dir_mtime: i64,
    /// Free it at once even with the trash on: a temporary file of an unfinished copy
    /// (`Fs::unlink_temp`), which is nobody's data.
    pub never: bool,
}

impl<'a> From<'a> {
    pub fn new(parent: Ino, name: &'a [u8], why: Why) -> Self {
        From {
            parent,
            name,
            why,
            force: false,
            dir_mtime: 0,
            never: false,
        }
    }

    /// With the directory's mtime before the removal.
    pub fn dir_mtime(self, mtime: i64) -> Self {
        From {
            dir_mtime: mtime,
            ..self
        }
    }
}

/// One entry of the trash, as `jfs trash` lists it.
#[derive(Serialize, Clone, Debug)]
pub struct TrashEntry {
    pub ino: Ino,
    /// The seq of the commit that trashed it.
    pub seq: u64,
    pub info: TrashInfo,
    /// The path it had (bytes of its names; from its directory's path now, or its trashed
    /// directory's path then).
    #[serde(skip)]
    pub path: Vec<u8>,
    pub mode: u32,
    pub mtime: i64,
}

impl TrashEntry {
    /// Whether it was at `top` or under it.
    pub fn is_under(&self, top: &[u8]) -> bool {
        let p = &self.path;
        p == top || top == b"/" || (p.starts_with(top) && p.get(top.len()) == Some(&b'/'))
    }
}

/// Which of several trash entries at one path: the latest, the latest at or before an
/// instant, or the one trashed by a commit.
#[derive(Clone, Copy, Debug)]
pub enum Pick {
    Latest,
    At(i64),
    Seq(u64),
}

/// What a purge did.
#[derive(Serialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    /// Entries past the trash time.
    pub expired: u64,
    /// Entries purged, oldest first, to bring the trash under its cap.
    pub evicted: u64,
    pub evicted_bytes: u64,
}

/// The trash's size, for `jfs status`.
#[derive(Serialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TrashUsage {
    pub entries: u64,
    pub bytes: u64,
    /// Entries the size cap evicted, ever.
    pub evicted: u64,
}

/// What a restore did.
#[derive(Serialize, Debug, Default, Clone)]
pub struct Restored {
    /// Where the top entry went.
    pub to: String,
    pub restored: u64,
    /// Paths (where each would have gone) not restored, with why: a newer entry holds the
    /// name, or it left the trash meanwhile.
    pub skipped: Vec<(String, String)>,
}

/// How many entries one restore transaction relinks.
const BATCH: usize = 256;

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

impl Fs {
    /// Whether this process's deletes go to the trash.
    pub fn trash_on(&self) -> bool {
        !self.skip_trash && self.trash_secs.load(Ordering::Relaxed) > 0
    }

    /// The trash time this process deletes under (seconds, 0: none).
    pub fn trash_secs(&self) -> u64 {
        self.trash_secs.load(Ordering::Relaxed)
    }

    /// Follow a changed trash time (a mount's background loop reads the settings again).
    pub fn set_trash_secs(&self, secs: u64) {
        self.trash_secs.store(secs, Ordering::Relaxed);
    }

    /// `jfs rm --skip-trash`: free what this process deletes at once.
    pub fn set_skip_trash(&mut self, skip: bool) {
        self.skip_trash = skip;
    }

    /// Put inode `ino` (attributes `attr`, its links already dropped) into the trash.
    pub(crate) fn trash_inode(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        attr: &Attr,
        from: From<'_>,
        now: i64,
    ) {
        let mut attr = attr.clone();
        attr.ctime = now;
        put_attr(tx, ino, &attr);
        let info = TrashInfo {
            at_ns: now,
            parent: from.parent,
            name: encode_name(from.name),
            kind: attr.kind,
            why: from.why,
            of: None,
            size: if attr.kind == FileKind::Dir {
                0
            } else {
                attr.length
            },
            dir_mtime: from.dir_mtime,
        };
        tx.put(keys::trash_info(ino), record::encode(&info));
        tx.stamp(keys::trash(now, ino));
    }

    /// A file truncated to zero: its chunk records move to a new inode with its old
    /// attributes, which goes to the trash (`why: truncated, of: ino`); `attr` becomes
    /// the empty file's. The volume's usage keeps the old length (the trash's).
    pub(crate) async fn trash_truncated(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        attr: &mut Attr,
    ) -> Result<()> {
        let old = self.alloc_inode().await?;
        let p = keys::chunk_prefix(ino);
        let end = keys::prefix_end(&p);
        let mut start = p.clone();
        loop {
            let page = tx.scan(&start, &end, 1024).await?;
            let n = page.len();
            if let Some((k, _)) = page.last() {
                start = k.clone();
                start.push(0);
            }
            for (k, v) in page {
                if let Key::Chunk(_, idx) = keys::parse(&k) {
                    tx.put(keys::chunk(old, idx), v);
                    tx.delete(k);
                }
            }
            if n < 1024 {
                break;
            }
        }
        let now = now_ns();
        let mut was = attr.clone();
        was.nlink = 0;
        was.ctime = now;
        put_attr(tx, old, &was);
        tx.add(keys::USED_INODES, 1);
        let info = TrashInfo {
            at_ns: now,
            parent: attr.parent,
            name: String::new(),
            kind: FileKind::File,
            why: Why::Truncated,
            of: Some(ino),
            size: attr.length,
            dir_mtime: 0,
        };
        tx.put(keys::trash_info(old), record::encode(&info));
        tx.stamp(keys::trash(now, old));
        attr.length = 0;
        Ok(())
    }

    /// The trash's records, oldest first: (key time, inode, seq, time of the commit).
    async fn trash_keys(&self, end: &[u8]) -> Result<Vec<(i64, Ino, u64)>> {
        let mut out = Vec::new();
        crate::engine::scan_all(&*self.engine, keys::TRASH_PREFIX, end, 1024, |page| {
            for (k, v) in page {
                if let Key::Trash(at, ino) = keys::parse(&k) {
                    let seq = parse_stamp(&v).map(|s| s.0).unwrap_or(0);
                    out.push((at as i64, ino, seq));
                }
            }
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// Every entry of the trash, oldest first, with the path each had.
    pub async fn trash_list(&self) -> Result<Vec<TrashEntry>> {
        let recs = self
            .trash_keys(&keys::prefix_end(keys::TRASH_PREFIX))
            .await?;
        let mut entries = Vec::with_capacity(recs.len());
        for page in recs.chunks(512) {
            let mut ks: Vec<Vec<u8>> = page.iter().map(|r| keys::trash_info(r.1)).collect();
            ks.extend(page.iter().map(|r| keys::attr(r.1)));
            let mut vals = self.engine.get_many(&ks).await?;
            let attrs = vals.split_off(page.len());
            for ((&(_, ino, seq), info), attr) in page.iter().zip(vals).zip(attrs) {
                let (Some(info), Some(attr)) = (info, attr) else {
                    continue; // purged or restored meanwhile
                };
                let info: TrashInfo =
                    record::decode_as(&format!("the trash record of inode {ino}"), &info)?;
                let attr = super::decode_attr(ino, &attr)?;
                entries.push(TrashEntry {
                    ino,
                    seq,
                    info,
                    path: Vec::new(),
                    mode: attr.mode,
                    mtime: attr.mtime,
                });
            }
        }
        // Paths: a trashed directory's from its own record, a live one's as it is now.
        let index: HashMap<Ino, usize> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.ino, i))
            .collect();
        let mut live: HashMap<Ino, Vec<u8>> = HashMap::new();
        let mut done: HashMap<Ino, Vec<u8>> = HashMap::new();
        for i in 0..entries.len() {
            let p = self
                .trash_path(&entries, &index, i, &mut live, &mut done, 0)
                .await;
            entries[i].path = p;
        }
        Ok(entries)
    }

    fn trash_path<'a>(
        &'a self,
        entries: &'a [TrashEntry],
        index: &'a HashMap<Ino, usize>,
        i: usize,
        live: &'a mut HashMap<Ino, Vec<u8>>,
        done: &'a mut HashMap<Ino, Vec<u8>>,
        depth: usize,
    ) -> futures::future::BoxFuture<'a, Vec<u8>> {
        Box::pin(async move {
            let e = &entries[i];
            if let Some(p) = done.get(&e.ino) {
                return p.clone();
            }
            let unknown = |ino: Ino| format!("<inode {ino}>").into_bytes();
            let path = if let Some(of) = e.info.of {
                match index.get(&of) {
                    Some(&j) if depth < 4096 && j != i => {
                        self.trash_path(entries, index, j, live, done, depth + 1)
                            .await
                    }
                    _ => self
                        .live_path(of, live)
                        .await
                        .unwrap_or_else(|| unknown(of)),
                }
            } else {
                let dir = match index.get(&e.info.parent) {
                    Some(&j) if depth < 4096 && j != i => {
                        self.trash_path(entries, index, j, live, done, depth + 1)
                            .await
                    }
                    _ => self
                        .live_path(e.info.parent, live)
                        .await
                        .unwrap_or_else(|| unknown(e.info.parent)),
                };
                join(&dir, &e.info.name_bytes())
            };
            done.insert(e.ino, path.clone());
            path
        })
    }

    async fn live_path(&self, ino: Ino, memo: &mut HashMap<Ino, Vec<u8>>) -> Option<Vec<u8>> {
        if ino == ROOT_INO {
            return Some(b"/".to_vec());
        }
        if let Some(p) = memo.get(&ino) {
            return Some(p.clone());
        }
        let p = self.path_bytes_of(ino, 4096).await?;
        memo.insert(ino, p.clone());
        Some(p)
    }

    /// The trash's size (entries, bytes) and how many entries its cap evicted.
    pub async fn trash_usage(&self) -> Result<TrashUsage> {
        let recs = self
            .trash_keys(&keys::prefix_end(keys::TRASH_PREFIX))
            .await?;
        let mut u = TrashUsage {
            evicted: crate::journal::parse_counter(
                self.engine.get(keys::TRASH_EVICTED).await?.as_deref(),
            )?
            .max(0) as u64,
            ..Default::default()
        };
        for page in recs.chunks(512) {
            let ks: Vec<Vec<u8>> = page.iter().map(|r| keys::trash_info(r.1)).collect();
            for (v, r) in self.engine.get_many(&ks).await?.into_iter().zip(page) {
                if let Some(v) = v {
                    let info: TrashInfo =
                        record::decode_as(&format!("the trash record of inode {}", r.1), &v)?;
                    u.entries += 1;
                    u.bytes += info.size;
                }
            }
        }
        Ok(u)
    }

    /// Purge what is past the trash time (all of it when the trash is off) and, over the
    /// size cap, the oldest entries until it is under. The settings are read again here, so
    /// a `jfs config` change holds from the next round. Only a writer at the primary can.
    pub async fn purge_trash(&self, now: i64) -> Result<Purged> {
        let s = Fs::load_settings(&*self.engine).await?;
        self.set_trash_secs(s.trash_secs);
        let cutoff = now.saturating_sub((s.trash_secs as i64).saturating_mul(1_000_000_000));
        let mut out = Purged::default();
        for (at, ino, _) in self.trash_keys(&keys::trash(cutoff, 0)).await? {
            if self.purge_one(at, ino, false).await? {
                out.expired += 1;
            }
        }
        if let Some(cap) = s.trash_max_bytes {
            let recs = self
                .trash_keys(&keys::prefix_end(keys::TRASH_PREFIX))
                .await?;
            let mut sizes = Vec::with_capacity(recs.len());
            let mut total = 0u64;
            for page in recs.chunks(512) {
                let ks: Vec<Vec<u8>> = page.iter().map(|r| keys::trash_info(r.1)).collect();
                for (v, r) in self.engine.get_many(&ks).await?.into_iter().zip(page) {
                    if let Some(v) = v {
                        let info: TrashInfo = record::decode_as("a trash record", &v)?;
                        total += info.size;
                        sizes.push((r.0, r.1, info.size));
                    }
                }
            }
            for (at, ino, size) in sizes {
                if total <= cap {
                    break;
                }
                if self.purge_one(at, ino, true).await? {
                    out.evicted += 1;
                    out.evicted_bytes += size;
                }
                total -= size;
            }
            if out.evicted > 0 {
                tracing::warn!(
                    evicted = out.evicted,
                    bytes = out.evicted_bytes,
                    cap,
                    "the trash was over its size cap (--trash-max-bytes): its oldest entries were purged before their time"
                );
            }
        }
        Ok(out)
    }

    /// Free one trashed inode through the normal free path. False when it left the trash
    /// meanwhile (restored, or purged by another).
    async fn purge_one(&self, at: i64, ino: Ino, evicted: bool) -> Result<bool> {
        let (done, _) = transact!(self, |tx| {
            let tkey = keys::trash(at, ino);
            tx.prefetch(&[tkey.clone(), keys::attr(ino), keys::trash_info(ino)])
                .await?;
            if tx.get(&tkey).await?.is_none() {
                return Ok(false);
            }
            if let Some(v) = tx.get(&keys::attr(ino)).await? {
                let attr = super::decode_attr(ino, &v)?;
                if attr.kind == FileKind::Dir {
                    super::namespace::delete_xattrs_and_attr(&mut tx, ino).await?;
                    tx.add(keys::USED_INODES, -1);
                } else {
                    self.free_inode(&mut tx, ino, &attr).await?;
                }
            }
            tx.delete(tkey);
            tx.delete(keys::trash_info(ino));
            if evicted {
                tx.add(keys::TRASH_EVICTED, 1);
            }
            tx.set_op(Op::TrashPurge { ino, evicted });
            Ok::<_, Error>(true)
        })?;
        Ok(done)
    }

    /// Put trashed entries back into directory `parent` under their names, in one
    /// transaction. `touch`: the directory's times change (not when it is itself being
    /// restored: it gets back the times it had). Per item: Ok(true) restored, Ok(false) the
    /// name is taken (the taker), Err(()) it left the trash meanwhile.
    async fn relink(
        &self,
        parent: Ino,
        items: &[&TrashEntry],
        touch: bool,
        mtime: Option<i64>,
    ) -> Result<Vec<std::result::Result<(), Option<(Ino, FileKind)>>>> {
        let (out, _) = transact!(self, |tx| {
            let mut pre = vec![keys::attr(parent)];
            for e in items {
                pre.push(keys::dentry(parent, &e.info.name_bytes()));
                pre.push(keys::attr(e.ino));
                pre.push(keys::trash(e.info.at_ns, e.ino));
            }
            tx.prefetch(&pre).await?;
            let mut pattr = get_dir(&mut tx, parent).await?;
            let mut out = Vec::with_capacity(items.len());
            let mut any = false;
            for e in items {
                let name = e.info.name_bytes();
                let tkey = keys::trash(e.info.at_ns, e.ino);
                if tx.get(&tkey).await?.is_none() {
                    out.push(Err(None));
                    continue;
                }
                if let Some(taken) = lookup_entry(&mut tx, parent, &name).await? {
                    out.push(Err(Some(taken)));
                    continue;
                }
                let mut attr = get_attr(&mut tx, e.ino).await?;
                if attr.kind != FileKind::Dir {
                    attr.nlink = attr.nlink.max(1);
                } else {
                    pattr.nlink += 1;
                }
                attr.parent = parent;
                put_attr(&mut tx, e.ino, &attr);
                tx.put(
                    keys::dentry(parent, &name),
                    keys::encode_dentry(e.ino, attr.kind),
                );
                tx.delete(tkey);
                tx.delete(keys::trash_info(e.ino));
                any = true;
                out.push(Ok(()));
            }
            if any {
                if touch {
                    let now = now_ns();
                    pattr.mtime = now;
                    pattr.ctime = now;
                } else if let Some(m) = mtime.filter(|m| *m > 0) {
                    pattr.mtime = m;
                }
                put_attr(&mut tx, parent, &pattr);
                tx.set_op(Op::Restore {
                    parent,
                    entries: out.iter().filter(|r| r.is_ok()).count() as u64,
                });
            }
            Ok::<_, Error>(out)
        })?;
        Ok(out)
    }

    /// `jfs restore --path P`: bring back the entry deleted at P (the latest, or the one
    /// `pick` names) and everything deleted inside it, as it was: names, modes, owners,
    /// times, xattrs, symlinks, the tree's shape. `put_back`: at P (its directory must exist);
    /// else under `/.restored/seq-<N>/` followed by P. Never replaces an entry: a name taken
    /// by a newer one is skipped and named (a directory there is merged into).
    pub async fn restore_path(
        &self,
        path: &VolPath,
        pick: Pick,
        put_back: bool,
    ) -> Result<Restored> {
        let want = path.to_string().into_bytes();
        let all = self.trash_list().await?;
        let cands: Vec<&TrashEntry> = all
            .iter()
            .filter(|e| e.path == want && e.info.why == Why::Deleted)
            .collect();
        let top = pick_one(&cands, pick, path, "deleted")?;
        let (dir, dir_path) = if put_back {
            let (d, _) = path
                .split_last()
                .ok_or_else(|| invalid("the volume's root is never in the trash"))?;
            let (ino, attr) = self.resolve_path(&d).await.map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "cannot put {path} back: its directory {d} is not there ({}); restore {d} first, or restore without --put-back (into /.restored)",
                        e.message()
                    ),
                )
            })?;
            if attr.kind != FileKind::Dir {
                return Err(Error::new(
                    ErrorKind::NotDir,
                    format!("cannot put {path} back: {d} is not a directory now"),
                ));
            }
            (ino, d.to_string())
        } else {
            let mut d = VolPath::parse(&format!("/.restored/seq-{}", top.seq))?;
            if let Some((p, _)) = path.split_last() {
                for part in p.parts() {
                    d = d.join(part)?;
                }
            }
            (self.mkdir_all(&d).await?, d.to_string())
        };
        let mut by_parent: HashMap<Ino, Vec<&TrashEntry>> = HashMap::new();
        for e in all.iter().filter(|e| e.info.why == Why::Deleted) {
            by_parent.entry(e.info.parent).or_default().push(e);
        }
        let mut out = Restored {
            to: show(&join(dir_path.as_bytes(), &top.info.name_bytes())),
            ..Default::default()
        };
        // (directory to put them in, its path, the entries, whether its times change)
        let mut work: Vec<(Ino, Vec<u8>, Vec<&TrashEntry>, bool)> =
            vec![(dir, dir_path.into_bytes(), vec![top], true)];
        while let Some((dir, dpath, items, touch)) = work.pop() {
            // A restored directory's mtime: as it was before the first of these went.
            let mtime = items
                .iter()
                .min_by_key(|e| (e.info.at_ns, e.seq))
                .map(|e| e.info.dir_mtime);
            for batch in items.chunks(BATCH) {
                let res = self.relink(dir, batch, touch, mtime).await?;
                for (e, r) in batch.iter().zip(res) {
                    let at = join(&dpath, &e.info.name_bytes());
                    let kids = by_parent.remove(&e.ino).unwrap_or_default();
                    match r {
                        Ok(()) => {
                            out.restored += 1;
                            if !kids.is_empty() {
                                work.push((e.ino, at, kids, false));
                            }
                        }
                        Err(Some((ino, FileKind::Dir))) if e.info.kind == FileKind::Dir => {
                            // A directory made again since: what was in the old one goes
                            // into it, name by name.
                            if !kids.is_empty() {
                                work.push((ino, at, kids, true));
                            }
                        }
                        Err(Some(_)) => out.skipped.push((
                            show(&at),
                            "a newer entry has that name (left in the trash)".into(),
                        )),
                        Err(None) => out
                            .skipped
                            .push((show(&at), "it left the trash meanwhile".into())),
                    }
                }
            }
        }
        Ok(out)
    }

    /// `jfs restore --version P`: the previous content of file P (overwritten, truncated
    /// to zero, or deleted) comes back as P; the file at P now goes to the trash in turn
    /// (even with the trash off), so the restore itself can be undone the same way.
    pub async fn restore_version(&self, path: &VolPath, pick: Pick) -> Result<Restored> {
        let (d, name) = path
            .split_last()
            .ok_or_else(|| invalid("the volume's root has no versions"))?;
        let name = name.as_bytes().to_vec();
        let (dir, _) = self.resolve_path(&d).await?;
        let now_ino = match self.lookup(dir, &name).await {
            Ok((ino, a)) if a.kind == FileKind::File => Some(ino),
            Ok((_, a)) => {
                return Err(invalid(format!(
                    "{path} is a {} now, not a file: move it away first",
                    format!("{:?}", a.kind).to_lowercase()
                )))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let want = path.to_string().into_bytes();
        let all = self.trash_list().await?;
        let cands: Vec<&TrashEntry> = all
            .iter()
            .filter(|e| e.info.kind == FileKind::File)
            .filter(|e| e.path == want || (now_ino.is_some() && e.info.of == now_ino))
            .collect();
        let v = pick_one(&cands, pick, path, "overwritten, truncated or deleted")?;
        transact!(self, |tx| {
            let vkey = keys::trash(v.info.at_ns, v.ino);
            tx.prefetch(&[
                keys::attr(dir),
                keys::dentry(dir, &name),
                vkey.clone(),
                keys::attr(v.ino),
            ])
            .await?;
            let mut pattr = get_dir(&mut tx, dir).await?;
            if tx.get(&vkey).await?.is_none() {
                return Err(not_found(format!(
                    "that version of {path} (seq {}) left the trash meanwhile",
                    v.seq
                )));
            }
            let now = now_ns();
            if let Some((cur, kind)) = lookup_entry(&mut tx, dir, &name).await? {
                if kind != FileKind::File {
                    return Err(invalid(format!(
                        "{path} is not a file now: move it away first"
                    )));
                }
                let cattr = get_attr(&mut tx, cur).await?;
                let from = From {
                    force: true,
                    ..From::new(dir, &name, Why::Overwritten)
                };
                tx.delete(keys::dentry(dir, &name));
                self.drop_link(&mut tx, cur, cattr, now, from).await?;
            }
            let mut attr = get_attr(&mut tx, v.ino).await?;
            attr.nlink = 1;
            attr.parent = dir;
            put_attr(&mut tx, v.ino, &attr);
            tx.put(
                keys::dentry(dir, &name),
                keys::encode_dentry(v.ino, FileKind::File),
            );
            tx.delete(vkey);
            tx.delete(keys::trash_info(v.ino));
            pattr.mtime = now;
            pattr.ctime = now;
            put_attr(&mut tx, dir, &pattr);
            tx.set_op(Op::Restore {
                parent: dir,
                entries: 1,
            });
            Ok::<_, Error>(())
        })?;
        Ok(Restored {
            to: path.to_string(),
            restored: 1,
            skipped: Vec::new(),
        })
    }

    /// Make directory `path` and its missing parents (root's, 0700 for `/.restored`
    /// itself, 0755 below it); returns its inode.
    async fn mkdir_all(&self, path: &VolPath) -> Result<Ino> {
        let mut ino = ROOT_INO;
        for (i, part) in path.parts().iter().enumerate() {
            let mode = if i == 0 { 0o700 } else { 0o755 };
            ino = match self
                .mkdir(
                    ino,
                    part.as_bytes(),
                    mode,
                    crate::fs::namespace::Owner::default(),
                )
                .await
            {
                Ok((i, _)) => i,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let (i, a) = self.lookup(ino, part.as_bytes()).await?;
                    if a.kind != FileKind::Dir {
                        return Err(Error::new(
                            ErrorKind::NotDir,
                            format!("{path}: {part} is not a directory"),
                        ));
                    }
                    i
                }
                Err(e) => return Err(e),
            };
        }
        Ok(ino)
    }
}

/// The entry `pick` names among the candidates at `path`.
fn pick_one<'a>(
    cands: &[&'a TrashEntry],
    pick: Pick,
    path: &VolPath,
    what: &str,
) -> Result<&'a TrashEntry> {
    if cands.is_empty() {
        return Err(not_found(format!(
            "nothing {what} at {path} is in the trash: `jfs trash META --path {path}` lists what is (a path is the one it had when it went)"
        )));
    }
    let listed = || {
        cands
            .iter()
            .map(|e| format!("seq {} at {}", e.seq, fmt_time(e.info.at_ns)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let best = |it: &mut dyn Iterator<Item = &&'a TrashEntry>| {
        it.max_by_key(|e| (e.info.at_ns, e.seq)).copied()
    };
    match pick {
        Pick::Latest => Ok(best(&mut cands.iter()).expect("not empty")),
        Pick::At(t) => best(&mut cands.iter().filter(|e| e.info.at_ns <= t)).ok_or_else(|| {
            not_found(format!(
                "nothing at {path} went to the trash at or before {}; the trash holds: {}",
                fmt_time(t),
                listed()
            ))
        }),
        Pick::Seq(n) => cands.iter().find(|e| e.seq == n).copied().ok_or_else(|| {
            not_found(format!(
                "no entry at {path} went to the trash at seq {n}; the trash holds: {}",
                listed()
            ))
        }),
    }
}

/// A time as `jfs trash` shows it (UTC, RFC 3339, seconds).
pub fn fmt_time(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}
