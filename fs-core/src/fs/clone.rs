//! `jfs clone`: a metadata-only copy of a file or a directory tree. No block is read or
//! written: the copy's chunk records name the source's slices, and each record copied adds
//! one reference to each slice it names (`keys::refs`), so deleting, overwriting, compacting
//! or truncating either side frees a slice only when its last reference goes
//! (`data::release_slices`).
//!
//! **One instant.** A directory clone is the source tree exactly as of one journal sequence
//! number, however many transactions writing it takes and while writers change the source:
//! 1. Each source inode is read (its attributes, entries, chunks, xattrs, symlink target)
//!    after noting the journal head `h`; its copy is written under new inode numbers in
//!    staging batches of at most `BATCH_KEYS` keys (well inside every engine's limits: a
//!    RocksDB WriteBatch, one Redis script call, one PostgreSQL transaction), linked
//!    nowhere, so nothing of it is visible.
//! 2. The journal carries every commit's write-set: reading it from the first `h` to the
//!    head `H` names every source inode changed after its copy was read. Those are copied
//!    again (entries added or removed in a changed directory are followed: new children
//!    copied, children no longer in the tree dropped), and the journal read again from `H`.
//!    When a pass finds nothing changed, every copy equals its source as of `H`: the clone
//!    is the tree as of `H` (reported as `at_seq`). Passes are bounded (`MAX_PASSES`).
//! 3. One last transaction links the copy's root as DST (refusing an existing name: of two
//!    clones to one DST one wins, the other fails cleanly and drops its copy) and removes
//!    the staging record.
//!
//! **Nothing leaks.** The staging record (`keys::cloning`, JSON `Staging`) names the
//! writer's session and the inode ranges it allocated, and is written with every batch. A
//! failed clone drops its copy itself; a killed one (its session dead) is dropped by `gc`
//! (`drop_staged`). Both release the references the copy held.
//!
//! **Mirrors** apply the staging batches and the link as any entry: the chunk records they
//! carry name slices whose blocks the mirror has copied or queued already, so no block is
//! copied again (the mirror's block queue skips blocks it has done or queued).
//!
//! Memory: about 100 bytes per entry of the tree for the source-to-copy maps (1,000,000
//! entries: about 100 MiB); records are held one batch at a time.

use super::{decode_attr, encode_attr, get_attr, get_dir, lookup_entry, put_attr, transact, Fs};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::journal::{Entry, Op};
use crate::keys::{self, Key};
use crate::txn::Txn;
use crate::types::{now_ns, FileKind, Ino, SliceRec};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Keys written by one staging transaction (about: an inode's records count one each).
const BATCH_KEYS: usize = 8192;
/// Journal passes before a clone of a source that never stops changing gives up.
const MAX_PASSES: u32 = 64;
/// Source inodes read at once.
const READ_PARALLEL: usize = 32;
/// Inode numbers allocated at a time.
const INODE_RANGE: u64 = 4096;

/// The staging record of a clone in progress (`keys::cloning(root)`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Staging {
    /// The session of the process writing it: once no live session has this id, `gc`
    /// drops the copy.
    pub session: String,
    pub host: String,
    pub pid: u32,
    pub started_ns: i64,
    /// The copy's root inode (also the record's key).
    pub root: Ino,
    pub src: Ino,
    pub parent: Ino,
    /// DST's name, as `maint::dump::encode_name` writes it.
    pub name: String,
    /// Inode ranges `(start, count)` the copy's inodes come from.
    pub ranges: Vec<(Ino, u64)>,
}

impl Staging {
    pub fn decode(v: &[u8]) -> Result<Staging> {
        serde_json::from_slice(v)
            .map_err(|e| corrupt(format!("a clone's staging record does not decode: {e}")))
    }
}

/// What a clone did.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct CloneReport {
    /// The copy's root inode.
    pub ino: Ino,
    /// Inodes in the copy (files, directories, symlinks, others).
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    /// Bytes of file content the copy shares with the source (no block written).
    pub bytes: u64,
    /// The journal sequence number the copy is the source as of.
    pub at_seq: u64,
    /// The sequence number of the commit that linked it.
    pub seq: u64,
    /// Journal passes (1: nothing changed while it was written).
    pub passes: u32,
    /// Inodes copied again because the source changed meanwhile.
    pub recopied: u64,
    /// Staging transactions.
    pub batches: u64,
}

/// One source inode's copy.
#[derive(Debug, Clone)]
struct Copy {
    dst: Ino,
    kind: FileKind,
    /// Entries in the copied tree naming it (the root counts one).
    links: u32,
    /// `nlink` its written attributes carry (files; 0: not written yet).
    written_nlink: u32,
    /// The journal head noted before its records were read (0: not copied yet).
    read_at: u64,
    /// Its length as written (files), for the volume's used-space counter.
    length: u64,
    /// Copy it again (first copy, or its source changed).
    dirty: bool,
}

/// The records of one source inode, read at one moment.
struct Read {
    src: Ino,
    read_at: u64,
    /// Every key of the inode, with the part after `A<ino>`.
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

struct Cloner<'a> {
    fs: &'a Fs,
    src: Ino,
    parent: Ino,
    name: Vec<u8>,
    staging: Staging,
    copies: HashMap<Ino, Copy>,
    /// Copy inode to source inode.
    origin: HashMap<Ino, Ino>,
    next: Ino,
    end: Ino,
    rep: CloneReport,
}

impl Fs {
    /// Clone the file or tree at inode `src` as `name` in directory `parent` (see the module
    /// comment). `session` is this process's session id (`maint::own_session`): without one
    /// a killed clone could not be told from a running one, so it is required.
    pub async fn clone_tree(
        &self,
        src: Ino,
        parent: Ino,
        name: &[u8],
        session: &str,
    ) -> Result<CloneReport> {
        super::check_name(name)?;
        let root_attr = self.getattr(src).await?;
        // DST inside SRC (or SRC itself): the copy would contain itself.
        self.check_outside(src, parent).await?;
        {
            let mut tx = Txn::new(&*self.engine);
            get_dir(&mut tx, parent).await?;
            if lookup_entry(&mut tx, parent, name).await?.is_some() {
                return Err(exists(name));
            }
        }
        let mut c = Cloner {
            fs: self,
            src,
            parent,
            name: name.to_vec(),
            staging: Staging {
                session: session.to_string(),
                host: crate::retry::hostname(),
                pid: std::process::id(),
                started_ns: now_ns(),
                root: 0,
                src,
                parent,
                name: crate::maint::encode_name(name),
                ranges: Vec::new(),
            },
            copies: HashMap::new(),
            origin: HashMap::new(),
            next: 0,
            end: 0,
            rep: CloneReport::default(),
        };
        let root = c.assign(src, root_attr.kind).await?;
        if let Some(r) = c.copies.get_mut(&src) {
            r.links = 1;
        }
        c.staging.root = root;
        c.rep.ino = root;
        match c.run().await {
            Ok(()) => Ok(c.rep),
            Err(e) => {
                // Drop what was staged; if that fails too, gc drops it once this process's
                // session is gone.
                if let Err(d) = self.drop_staged(&c.staging).await {
                    tracing::warn!(error = %d, root, "dropping a failed clone's copy failed; gc drops it later");
                }
                Err(e)
            }
        }
    }

    /// `clone_tree` by volume paths: DST must not exist; with `into` (DST was given with a
    /// trailing slash) DST is a directory that receives the clone under SRC's name. Returns
    /// where the clone went with the report.
    pub async fn clone_path(
        &self,
        src: &crate::path::VolPath,
        dst: &crate::path::VolPath,
        into: bool,
        session: &str,
    ) -> Result<(crate::path::VolPath, CloneReport)> {
        let (sino, _) = self
            .resolve_path(src)
            .await
            .map_err(|e| e.context(format!("clone source {src}")))?;
        if src.is_root() {
            return Err(invalid(
                "the source is the volume's root: clone a directory below it",
            ));
        }
        let target = if into {
            dst.join(src.name().unwrap_or_default())?
        } else {
            dst.clone()
        };
        let Some((dir, name)) = target.split_last() else {
            return Err(invalid(
                "the destination is the volume's root: name a new entry",
            ));
        };
        let (pino, _) = self
            .resolve_path(&dir)
            .await
            .map_err(|e| e.context(format!("the clone destination's directory {dir}")))?;
        let name = name.to_string();
        let rep = self
            .clone_tree(sino, pino, name.as_bytes(), session)
            .await?;
        Ok((target, rep))
    }

    /// Refuse a clone into `parent` when `parent` is `src` or below it.
    async fn check_outside(&self, src: Ino, parent: Ino) -> Result<()> {
        let mut tx = Txn::new(&*self.engine);
        check_outside_in(&mut tx, src, parent).await
    }

    /// Remove the inodes of an unfinished clone (its staging record `st`) and the record,
    /// releasing the slice references its copies held. Idempotent.
    pub async fn drop_staged(&self, st: &Staging) -> Result<u64> {
        let mut dropped = 0u64;
        for &(start, count) in &st.ranges {
            let from = keys::inode_prefix(start);
            let to = keys::inode_prefix(start.saturating_add(count));
            loop {
                let page = self.engine.scan(&from, &to, BATCH_KEYS).await?;
                if page.is_empty() {
                    break;
                }
                let ((), _) = transact!(self, |tx| {
                    let mut released = Vec::new();
                    for (k, v) in &page {
                        if let Key::Chunk(ino, _) = keys::parse(k) {
                            released.extend(distinct_slices(ino, v)?);
                        }
                        tx.delete(k.clone());
                    }
                    super::data::release_slices(&mut tx, &released).await?;
                    tx.set_op(Op::CloneDrop {
                        root: st.root,
                        inodes: page
                            .iter()
                            .filter(|(k, _)| matches!(keys::parse(k), Key::Attr(_)))
                            .count() as u64,
                    });
                    Ok::<_, Error>(())
                })?;
                dropped += page
                    .iter()
                    .filter(|(k, _)| matches!(keys::parse(k), Key::Attr(_)))
                    .count() as u64;
            }
        }
        let key = keys::cloning(st.root);
        let ((), _) = transact!(self, |tx| {
            if tx.get(&key).await?.is_some() {
                tx.delete(key.clone());
                tx.set_op(Op::CloneDrop {
                    root: st.root,
                    inodes: 0,
                });
            }
            Ok::<_, Error>(())
        })?;
        Ok(dropped)
    }

    /// The staging records of clones in progress (or abandoned).
    pub async fn clones_in_progress(&self) -> Result<Vec<Staging>> {
        let mut out = Vec::new();
        crate::engine::scan_all(
            &*self.engine,
            keys::CLONING_PREFIX,
            &keys::prefix_end(keys::CLONING_PREFIX),
            256,
            |page| {
                for (_, v) in page {
                    out.push(Staging::decode(&v)?);
                }
                Ok(())
            },
        )
        .await?;
        Ok(out)
    }
}

fn exists(name: &[u8]) -> Error {
    Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "{:?} exists: a clone never replaces anything (remove it, or pick another name)",
            String::from_utf8_lossy(name)
        ),
    )
}

/// In a transaction: `parent` is not `src` and not below it (walking up by the directories'
/// recorded parents, each read in `tx`).
async fn check_outside_in(tx: &mut Txn<'_>, src: Ino, parent: Ino) -> Result<()> {
    let mut at = parent;
    for _ in 0..4096 {
        if at == src {
            return Err(invalid(
                "the destination is inside the source: a clone cannot contain itself (pick a destination outside it)",
            ));
        }
        if at == crate::types::ROOT_INO {
            return Ok(());
        }
        let a = get_attr(tx, at).await?;
        if a.parent == at || a.parent == 0 {
            return Ok(());
        }
        at = a.parent;
    }
    Err(corrupt(format!(
        "directory {parent} is more than 4096 levels deep, or its parents loop"
    )))
}

/// The slices a chunk record names, once each: one reference each.
fn distinct_slices(ino: Ino, v: &[u8]) -> Result<Vec<(u64, u32)>> {
    let recs = SliceRec::decode_list(v)
        .ok_or_else(|| corrupt(format!("a chunk of inode {ino} does not decode")))?;
    Ok(recs
        .iter()
        .filter(|r| r.id != 0)
        .map(|r| (r.id, r.size))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect())
}

/// Add `delta` references to each slice (negative: release, the last one stamping the
/// slice's pending delete), reading the counts in `tx`.
pub(crate) async fn adjust_refs(
    tx: &mut Txn<'_>,
    deltas: &BTreeMap<(u64, u32), i64>,
) -> Result<()> {
    let keys: Vec<Vec<u8>> = deltas
        .iter()
        .filter(|(_, d)| **d != 0)
        .map(|((id, _), _)| keys::refs(*id))
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    tx.prefetch(&keys).await?;
    for (&(id, size), &d) in deltas {
        if d == 0 {
            continue;
        }
        let k = keys::refs(id);
        let extra = match tx.get(&k).await? {
            None => 0,
            Some(v) => crate::journal::parse_counter(Some(&v))
                .map_err(|e| e.context(format!("the reference count of slice {id}")))?,
        };
        let now = extra + d;
        if now < -1 {
            return Err(corrupt(format!(
                "slice {id} would lose more references than it has ({extra} extra, {d})"
            )));
        }
        if now == -1 {
            tx.delete(k);
            tx.stamp(keys::pending(id, size));
        } else if now == 0 {
            tx.delete(k);
        } else {
            tx.put(k, now.to_string().into_bytes());
        }
    }
    Ok(())
}

impl Cloner<'_> {
    /// A copy inode for source `src` (first seen), queued to be copied.
    async fn assign(&mut self, src: Ino, kind: FileKind) -> Result<Ino> {
        if self.next >= self.end {
            let want = INODE_RANGE;
            let ((start, end), _) = transact!(self.fs, |tx| {
                let cur = crate::journal::parse_counter(tx.get(keys::NEXT_INODE).await?.as_deref())?
                    as u64;
                tx.put(
                    keys::NEXT_INODE.to_vec(),
                    (cur + want).to_string().into_bytes(),
                );
                tx.set_op(Op::AllocInodes {
                    start: cur,
                    count: want,
                });
                Ok::<_, Error>((cur, cur + want))
            })?;
            self.next = start;
            self.end = end;
            self.staging.ranges.push((start, want));
        }
        let dst = self.next;
        self.next += 1;
        self.copies.insert(
            src,
            Copy {
                dst,
                kind,
                links: 0,
                written_nlink: 0,
                read_at: 0,
                length: 0,
                dirty: true,
            },
        );
        self.origin.insert(dst, src);
        Ok(dst)
    }

    async fn run(&mut self) -> Result<()> {
        let engine = self.fs.engine.clone();
        let mut checked = engine.journal_bounds().await?.last;
        loop {
            self.rep.passes += 1;
            // Copy every dirty inode; copying a directory may find new ones.
            loop {
                let mut todo: Vec<Ino> = self
                    .copies
                    .iter()
                    .filter(|(_, c)| c.dirty)
                    .map(|(s, _)| *s)
                    .collect();
                if todo.is_empty() {
                    break;
                }
                todo.sort_unstable();
                for part in todo.chunks(BATCH_KEYS / 4) {
                    self.copy_batch(part).await?;
                }
                self.collect_unlinked().await?;
            }
            // What changed in the source after each copy was read.
            let head = engine.journal_bounds().await?.last;
            let changed = self.changed_since(checked, head).await?;
            checked = head;
            if changed.is_empty() {
                self.rep.at_seq = head;
                break;
            }
            if self.rep.passes >= MAX_PASSES {
                return Err(Error::temporary(
                    ErrorKind::Conflict,
                    format!(
                        "the source kept changing through {MAX_PASSES} passes of the clone (nothing was created): try again when it is quieter"
                    ),
                ));
            }
            for s in changed {
                if let Some(c) = self.copies.get_mut(&s) {
                    c.dirty = true;
                    self.rep.recopied += 1;
                }
            }
        }
        self.fix_link_counts().await?;
        self.link().await
    }

    /// Source inodes in the copy changed by journal entries in `(from, to]` after their
    /// copies were read.
    async fn changed_since(&self, from: u64, to: u64) -> Result<BTreeSet<Ino>> {
        let engine = &self.fs.engine;
        let mut out = BTreeSet::new();
        let mut at = from + 1;
        while at <= to {
            let frames = engine.journal_read(at, 1000).await.map_err(|e| {
                e.context("reading the journal to check the clone's source did not change")
            })?;
            if frames.is_empty() {
                break;
            }
            for (seq, f) in frames {
                if seq > to {
                    return Ok(out);
                }
                at = seq + 1;
                // This clone's own batches touch only its copies.
                if let (_, Op::CloneStage { root, .. }) = Entry::decode_head_at(seq, &f)? {
                    if root == self.staging.root {
                        continue;
                    }
                }
                let e = Entry::decode_at(seq, &f)?;
                for m in &e.writes {
                    let k = m.key();
                    if k.len() >= 9 && k[0] == keys::INODE_PREFIX[0] {
                        let ino = u64::from_be_bytes(k[1..9].try_into().unwrap());
                        if let Some(c) = self.copies.get(&ino) {
                            if seq > c.read_at {
                                out.insert(ino);
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Read the records of `srcs` (sorted), after noting the journal head. Inodes close
    /// together (a directory's children usually are) are read by one range scan each run.
    async fn read_all(&self, srcs: &[Ino]) -> Result<Vec<Read>> {
        let engine = self.fs.engine.clone();
        let read_at = engine.journal_bounds().await?.last;
        // Runs of inode numbers with gaps of at most RUN_GAP.
        const RUN_GAP: u64 = 8;
        let mut runs: Vec<Vec<Ino>> = Vec::new();
        let mut start = 0;
        for i in 1..=srcs.len() {
            if i == srcs.len() || srcs[i] > srcs[i - 1] + RUN_GAP || i - start >= 512 {
                runs.push(srcs[start..i].to_vec());
                start = i;
            }
        }
        let per_run: Vec<Vec<Read>> = futures::stream::iter(runs)
            .map(|run| {
                let engine = engine.clone();
                async move {
                    let (first, last) = (run[0], run[run.len() - 1]);
                    let from = keys::inode_prefix(first);
                    let to = keys::prefix_end(&keys::inode_prefix(last));
                    let mut by: BTreeMap<Ino, Vec<(Vec<u8>, Vec<u8>)>> =
                        run.iter().map(|i| (*i, Vec::new())).collect();
                    crate::engine::scan_all(&*engine, &from, &to, 4096, |page| {
                        for (k, v) in page {
                            if k.len() >= 9 {
                                let ino = u64::from_be_bytes(k[1..9].try_into().unwrap());
                                if let Some(p) = by.get_mut(&ino) {
                                    p.push((k, v));
                                }
                            }
                        }
                        Ok(())
                    })
                    .await?;
                    Ok::<_, Error>(
                        by.into_iter()
                            .map(|(src, pairs)| Read {
                                src,
                                read_at,
                                pairs,
                            })
                            .collect(),
                    )
                }
            })
            .buffered(READ_PARALLEL)
            .try_collect()
            .await?;
        Ok(per_run.into_iter().flatten().collect())
    }

    /// Copy `srcs` (dirty inodes) in staging transactions.
    async fn copy_batch(&mut self, srcs: &[Ino]) -> Result<()> {
        let reads = self.read_all(srcs).await?;
        // New children found in directories are assigned copies (and copied by a later
        // batch); children no longer named lose a link (dropped by `collect_unlinked`).
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut refs: BTreeMap<(u64, u32), i64> = BTreeMap::new();
        let mut inodes = 0u64;
        for r in reads {
            let Some(copy) = self.copies.get(&r.src).cloned() else {
                continue;
            };
            let dst = copy.dst;
            if r.pairs.is_empty() {
                // Gone from the source: its directory changed too, and drops it.
                if r.src == self.src {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        "the source was removed while it was being cloned",
                    ));
                }
                if let Some(c) = self.copies.get_mut(&r.src) {
                    c.dirty = false;
                    c.read_at = r.read_at;
                }
                continue;
            }
            // What an earlier copy of it wrote goes first.
            let old = if copy.read_at == 0 {
                Vec::new()
            } else {
                self.staged(dst).await?
            };
            let mut old_children: Vec<Ino> = Vec::new();
            for (k, v) in &old {
                match keys::parse(k) {
                    Key::Chunk(..) => {
                        for s in distinct_slices(dst, v)? {
                            *refs.entry(s).or_default() -= 1;
                        }
                    }
                    Key::Dentry(..) => {
                        if let Some((child, _)) = keys::decode_dentry(v) {
                            old_children.push(child);
                        }
                    }
                    _ => {}
                }
                writes.push((k.clone(), None));
            }
            let mut length = 0;
            let mut new_children: Vec<(Ino, FileKind)> = Vec::new();
            let mut attr_seen = false;
            for (k, v) in r.pairs {
                let tail = &k[9..];
                let key = [&keys::inode_prefix(dst)[..], tail].concat();
                match keys::parse(&k) {
                    Key::Attr(_) => {
                        let mut a = decode_attr(r.src, &v)?;
                        a.parent = if r.src == self.src {
                            self.parent
                        } else {
                            self.copies
                                .get(&a.parent)
                                .map(|c| c.dst)
                                .unwrap_or(self.parent)
                        };
                        if a.kind != FileKind::Dir {
                            a.nlink = self.copies.get(&r.src).map_or(1, |c| c.links.max(1));
                        }
                        length = if a.kind == FileKind::File {
                            a.length
                        } else {
                            0
                        };
                        attr_seen = true;
                        writes.push((key, Some(encode_attr(&a))));
                    }
                    Key::Dentry(_, _) => {
                        let (child, kind) = keys::decode_dentry(&v).ok_or_else(|| {
                            corrupt(format!("an entry of directory {} does not decode", r.src))
                        })?;
                        new_children.push((child, kind));
                        let cdst = match self.copies.get(&child) {
                            Some(c) => c.dst,
                            None => self.assign(child, kind).await?,
                        };
                        writes.push((key, Some(keys::encode_dentry(cdst, kind))));
                    }
                    Key::Chunk(..) => {
                        for s in distinct_slices(r.src, &v)? {
                            *refs.entry(s).or_default() += 1;
                        }
                        writes.push((key, Some(v)));
                    }
                    Key::Symlink(_) | Key::Xattr(..) | Key::Rdev(_) => writes.push((key, Some(v))),
                    _ => {
                        return Err(corrupt(format!(
                            "inode {} has a record jfs does not know ({:?})",
                            r.src,
                            String::from_utf8_lossy(&k)
                        )))
                    }
                }
            }
            if !attr_seen {
                // Records without attributes: an inode half-removed by a mirror's apply, or
                // damage. Its directory changes too, or fsck reports it.
                return Err(corrupt(format!(
                    "inode {} of the source has records but no attributes",
                    r.src
                )));
            }
            // Links: the children the earlier copy named lose one each, those named now
            // gain one (a child no entry names any more is dropped by `collect_unlinked`).
            for c in old_children {
                if let Some(s) = self.origin.get(&c).copied() {
                    if let Some(cc) = self.copies.get_mut(&s) {
                        cc.links = cc.links.saturating_sub(1);
                    }
                }
            }
            for (child, _) in &new_children {
                if let Some(cc) = self.copies.get_mut(child) {
                    cc.links += 1;
                }
            }
            if let Some(c) = self.copies.get_mut(&r.src) {
                c.dirty = false;
                c.read_at = r.read_at;
                c.length = length;
                c.written_nlink = c.links.max(1);
            }
            inodes += 1;
            if writes.len() >= BATCH_KEYS {
                self.commit_stage(
                    std::mem::take(&mut writes),
                    std::mem::take(&mut refs),
                    inodes,
                )
                .await?;
                inodes = 0;
            }
        }
        if !writes.is_empty() || !refs.is_empty() {
            self.commit_stage(writes, refs, inodes).await?;
        }
        Ok(())
    }

    /// The keys a copy inode has now.
    async fn staged(&self, dst: Ino) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let p = keys::inode_prefix(dst);
        let mut out = Vec::new();
        crate::engine::scan_all(&*self.fs.engine, &p, &keys::prefix_end(&p), 4096, |page| {
            out.extend(page);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    async fn commit_stage(
        &mut self,
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        refs: BTreeMap<(u64, u32), i64>,
        inodes: u64,
    ) -> Result<()> {
        let record = serde_json::to_vec(&self.staging).expect("a staging record serializes");
        let root = self.staging.root;
        let ((), _) = transact!(self.fs, |tx| {
            for (k, v) in &writes {
                match v {
                    Some(v) => tx.put(k.clone(), v.clone()),
                    None => tx.delete(k.clone()),
                }
            }
            adjust_refs(&mut tx, &refs).await?;
            tx.put(keys::cloning(root), record.clone());
            tx.set_op(Op::CloneStage { root, inodes });
            Ok::<_, Error>(())
        })?;
        self.rep.batches += 1;
        Ok(())
    }

    /// Drop copies no entry of the copied tree names any more (removed or moved out of the
    /// source meanwhile), and what only they named.
    async fn collect_unlinked(&mut self) -> Result<()> {
        loop {
            let gone: Vec<Ino> = self
                .copies
                .iter()
                .filter(|(s, c)| c.links == 0 && **s != self.src)
                .map(|(s, _)| *s)
                .collect();
            if gone.is_empty() {
                return Ok(());
            }
            let mut writes = Vec::new();
            let mut refs: BTreeMap<(u64, u32), i64> = BTreeMap::new();
            for s in gone {
                let Some(c) = self.copies.remove(&s) else {
                    continue;
                };
                self.origin.remove(&c.dst);
                for (k, v) in self.staged(c.dst).await? {
                    match keys::parse(&k) {
                        Key::Chunk(..) => {
                            for sl in distinct_slices(c.dst, &v)? {
                                *refs.entry(sl).or_default() -= 1;
                            }
                        }
                        Key::Dentry(..) => {
                            if let Some((child, _)) = keys::decode_dentry(&v) {
                                if let Some(cs) = self.origin.get(&child).copied() {
                                    if let Some(cc) = self.copies.get_mut(&cs) {
                                        cc.links = cc.links.saturating_sub(1);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                    writes.push((k, None));
                }
            }
            if !writes.is_empty() || !refs.is_empty() {
                self.commit_stage(writes, refs, 0).await?;
            }
        }
    }

    /// Files whose number of names in the copy differs from the `nlink` written with them
    /// (hard links found after they were copied) get it corrected.
    async fn fix_link_counts(&mut self) -> Result<()> {
        let wrong: Vec<(Ino, u32)> = self
            .copies
            .values()
            .filter(|c| c.kind != FileKind::Dir && c.links != c.written_nlink)
            .map(|c| (c.dst, c.links))
            .collect();
        for part in wrong.chunks(BATCH_KEYS) {
            let mut writes = Vec::new();
            for &(dst, links) in part {
                let mut tx = Txn::new(&*self.fs.engine);
                let mut a = get_attr(&mut tx, dst).await?;
                a.nlink = links;
                writes.push((keys::attr(dst), Some(encode_attr(&a))));
            }
            self.commit_stage(writes, BTreeMap::new(), 0).await?;
        }
        for c in self.copies.values_mut() {
            c.written_nlink = c.links;
        }
        Ok(())
    }

    /// Link the copy's root as DST: the one commit that makes it visible.
    async fn link(&mut self) -> Result<()> {
        let root = self.staging.root;
        let kind = self.copies[&self.src].kind;
        let (entries, files, dirs, bytes) = self.copies.values().fold((0u64, 0, 0, 0), |a, c| {
            (
                a.0 + 1,
                a.1 + (c.kind == FileKind::File) as u64,
                a.2 + (c.kind == FileKind::Dir) as u64,
                a.3 + c.length,
            )
        });
        let (parent, name, src, at_seq) =
            (self.parent, self.name.clone(), self.src, self.rep.at_seq);
        let (r, seq) = transact!(self.fs, |tx| {
            let mut pa = get_dir(&mut tx, parent).await?;
            if lookup_entry(&mut tx, parent, &name).await?.is_some() {
                return Err(exists(&name));
            }
            check_outside_in(&mut tx, src, parent).await?;
            if tx.get(&keys::cloning(root)).await?.is_none() {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    "this clone's staging record is gone (gc took this process for dead?): nothing was created",
                ));
            }
            let now = now_ns();
            pa.mtime = now;
            pa.ctime = now;
            if kind == FileKind::Dir {
                pa.nlink += 1;
            }
            put_attr(&mut tx, parent, &pa);
            tx.put(keys::dentry(parent, &name), keys::encode_dentry(root, kind));
            tx.delete(keys::cloning(root));
            tx.add(keys::USED_SPACE, bytes as i64);
            tx.add(keys::USED_INODES, entries as i64);
            tx.set_op(Op::Clone {
                src,
                parent,
                name: String::from_utf8_lossy(&name).into_owned(),
                ino: root,
                entries,
                at_seq,
            });
            Ok::<_, Error>(())
        })?;
        let () = r;
        self.rep.entries = entries;
        self.rep.files = files;
        self.rep.dirs = dirs;
        self.rep.bytes = bytes;
        self.rep.seq = seq;
        Ok(())
    }
}

/// Chunks one `copy_range` transaction covers at most (a longer copy takes several).
const COPY_CHUNKS: u64 = 16;

impl Fs {
    /// Lay bytes `[off_in, off_in + len)` of file `src` into file `dst` at `off_out` without
    /// copying data: the source's visible slices (and its holes, as holes) become records of
    /// the destination's chunks, split at chunk boundaries, each chunk record taking one
    /// reference to each slice it newly names. Bytes past the source's end are not copied
    /// (as `copy_file_range(2)`). Returns the bytes laid. Overlapping ranges of one file are
    /// refused (EINVAL, as the kernel does).
    pub async fn copy_range(
        &self,
        src: Ino,
        off_in: u64,
        dst: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        use crate::types::{CHUNK_SIZE, MAX_FILE_LEN};
        if src == dst
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(invalid("copy_range: the two ranges of one file overlap"));
        }
        let mut done = 0u64;
        while done < len {
            let (n, _) = transact!(self, |tx| {
                let sa = get_attr(&mut tx, src).await?;
                let mut da = if src == dst {
                    sa.clone()
                } else {
                    get_attr(&mut tx, dst).await?
                };
                if sa.kind != FileKind::File || da.kind != FileKind::File {
                    return Err(Error::new(
                        ErrorKind::IsDir,
                        "copy_range copies between regular files",
                    ));
                }
                let from = off_in + done;
                if from >= sa.length {
                    return Ok::<u64, Error>(0);
                }
                // Up to the end of the source, and at most COPY_CHUNKS chunks at a time.
                let room = (COPY_CHUNKS * CHUNK_SIZE) - (from % CHUNK_SIZE);
                let n = (len - done).min(sa.length - from).min(room);
                let to = off_out + done;
                if to.checked_add(n).is_none_or(|e| e > MAX_FILE_LEN) {
                    return Err(invalid(
                        "copy_range would make the file longer than the largest file",
                    ));
                }
                // The source's view over [from, from + n): (file offset, length, slice id,
                // slice size, offset in the slice); id 0 for zeros.
                let mut pieces: Vec<(u64, u64, u64, u32, u32)> = Vec::new();
                let mut at = from;
                while at < from + n {
                    let idx = (at / CHUNK_SIZE) as u32;
                    let cstart = idx as u64 * CHUNK_SIZE;
                    let cend = (cstart + CHUNK_SIZE).min(from + n);
                    let recs = super::layout::decode_chunk(
                        src,
                        idx,
                        tx.get(&keys::chunk(src, idx)).await?,
                    )?;
                    let view = super::layout::build_view(&recs);
                    let mut pos = at;
                    for g in view {
                        let (gs, ge) = (cstart + g.start as u64, cstart + g.end as u64);
                        if ge <= pos || gs >= cend {
                            continue;
                        }
                        if gs > pos {
                            pieces.push((pos, gs - pos, 0, 0, 0));
                        }
                        let s = gs.max(pos);
                        let e = ge.min(cend);
                        pieces.push((s, e - s, g.id, g.size, g.slice_off + (s - gs) as u32));
                        pos = e;
                    }
                    if pos < cend {
                        pieces.push((pos, cend - pos, 0, 0, 0));
                    }
                    at = cend;
                }
                // Onto the destination's chunks, split at their boundaries.
                let mut by_chunk: BTreeMap<u32, Vec<SliceRec>> = BTreeMap::new();
                for (s, l, id, size, soff) in pieces {
                    let mut d = s - from + to;
                    let mut left = l;
                    let mut so = soff;
                    while left > 0 {
                        let idx = (d / CHUNK_SIZE) as u32;
                        let pos = (d % CHUNK_SIZE) as u32;
                        let take = left.min(CHUNK_SIZE - pos as u64) as u32;
                        by_chunk.entry(idx).or_default().push(SliceRec {
                            pos,
                            id,
                            size: if id == 0 { 0 } else { size },
                            off: if id == 0 { 0 } else { so },
                            len: take,
                        });
                        d += take as u64;
                        left -= take as u64;
                        so += take;
                    }
                }
                let mut refs: BTreeMap<(u64, u32), i64> = BTreeMap::new();
                for (idx, add) in by_chunk {
                    let key = keys::chunk(dst, idx);
                    let mut recs = super::layout::decode_chunk(dst, idx, tx.get(&key).await?)?;
                    let before: BTreeSet<u64> =
                        recs.iter().filter(|r| r.id != 0).map(|r| r.id).collect();
                    for r in &add {
                        if r.id != 0 && !before.contains(&r.id) {
                            refs.insert((r.id, r.size), 1);
                        }
                    }
                    recs.extend(add);
                    tx.put(key, SliceRec::encode_list(&recs));
                }
                adjust_refs(&mut tx, &refs).await?;
                let now = now_ns();
                let end = to + n;
                if end > da.length {
                    tx.add(keys::USED_SPACE, (end - da.length) as i64);
                    da.length = end;
                }
                da.mtime = now;
                da.ctime = now;
                put_attr(&mut tx, dst, &da);
                tx.set_op(Op::CopyRange {
                    src,
                    off_in: from,
                    ino: dst,
                    off_out: to,
                    len: n,
                });
                Ok(n)
            })?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
}
