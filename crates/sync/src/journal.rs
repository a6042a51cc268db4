//! `--from-journal`: when the source is a volume, its change journal says exactly which paths
//! changed since the previous run, so nothing is listed. The keys found here go through the
//! same per-key path as `--files-from` (look up both sides, decide, copy or delete).

use crate::endpoint::{Endpoint, Kind, VolumeEndpoint};
use crate::run::Options;
use crate::state::State;
use anyhow::{bail, Result};
use fs_core::{Entry, FileKind, Ino, Op, ROOT_INO};
use std::collections::{BTreeSet, HashMap, HashSet};
use tokio::sync::mpsc;

/// Decide how this run goes. Returns the journal head to record once the run succeeds.
pub async fn prepare(
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    state: Option<&State>,
    opts: &mut Options,
) -> Result<Option<u64>> {
    if src.as_volume().is_none() {
        bail!("--from-journal needs a volume source (jfs://NAME/path)")
    }
    let Some(state) = state else {
        bail!("--from-journal cannot be combined with --dry-run (it needs the recorded position)")
    };
    let since = state.journal_seq()?;
    let (keys, head, rewritten) = changes(src, dst, since).await?;
    opts.keys = keys;
    opts.rewritten = (!rewritten.is_empty()).then(|| std::sync::Arc::new(rewritten));
    Ok(Some(head))
}

/// What changed since journal entry `since`: the keys the entries after it touch, up to the
/// journal's head now, or None (list everything) when there is no earlier position or the
/// journal no longer reaches back to it. Returns the head with them, and the keys whose
/// content the window rewrote (written, truncated, created or renamed onto): those are
/// copied whatever their size and time say (a file replaced by one of the same size and
/// modification time compares equal).
pub async fn changes(
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    since: Option<u64>,
) -> Result<(Option<Vec<String>>, u64, HashSet<String>)> {
    let Some(vol) = src.as_volume() else {
        bail!("--from-journal needs a volume source (jfs://NAME/path)")
    };
    let engine = vol.fs().engine().clone();
    let bounds = engine.journal_bounds().await?;
    let head = bounds.last;
    let Some(since) = since else {
        cli_common::eprintln!("jfs-sync: --from-journal: no earlier run recorded: a full listing this time; the next run reads the journal after entry {head}");
        return Ok((None, head, HashSet::new()));
    };
    if since + 1 < bounds.first {
        cli_common::eprintln!(
            "jfs-sync: WARNING: --from-journal: the journal no longer reaches back to entry {} (first retained is {}): falling back to a FULL LISTING",
            since + 1,
            bounds.first
        );
        return Ok((None, head, HashSet::new()));
    }
    let mut entries = Vec::new();
    let mut next = since + 1;
    while next <= head {
        let frames = engine.journal_read(next, 1000).await?;
        if frames.is_empty() {
            break;
        }
        for (seq, f) in frames {
            if seq > head {
                break;
            }
            entries.push(Entry::decode_at(seq, &f)?);
            next = seq + 1;
        }
    }
    let (keys, rewritten) = match changed_keys(vol, src, dst, &entries).await? {
        Changed::Keys(keys, rewritten) => (keys, rewritten),
        Changed::Unnamed { ino, nlink, found } => {
            cli_common::eprintln!(
                "jfs-sync: WARNING: --from-journal: inode {ino} changed in place and has {nlink} names (hard links), {found} of them found where the journal points: the others are found only by listing: falling back to a FULL LISTING this run"
            );
            return Ok((None, head, HashSet::new()));
        }
    };
    cli_common::eprintln!(
        "jfs-sync: --from-journal: entries {}..={head} touch {} keys",
        since + 1,
        keys.len()
    );
    Ok((Some(keys), head, rewritten))
}

struct Paths<'a> {
    vol: &'a VolumeEndpoint,
    /// Names seen in the journal window: the way to name directories deleted since.
    seen: HashMap<Ino, (Ino, String)>,
    /// Directory paths found so far (None: gone, or being found: a loop ends there).
    cache: HashMap<Ino, Option<String>>,
    /// The directories listed so far, each at most once a run: its entries' names by inode
    /// (more than one where hard links share the directory).
    names: HashMap<Ino, HashMap<Ino, Vec<String>>>,
    /// Names held in `names`.
    held: usize,
}

/// At most this many names of listed directories are kept while the keys are found.
const NAMES_HELD: usize = 1 << 20;

impl Paths<'_> {
    async fn dir(&mut self, ino: Ino) -> Option<String> {
        if ino == ROOT_INO {
            return Some(String::new());
        }
        if let Some(p) = self.cache.get(&ino) {
            return p.clone();
        }
        self.cache.insert(ino, None);
        let p = match Box::pin(self.current(ino)).await {
            Some(p) => Some(p),
            None => match self.seen.get(&ino).cloned() {
                Some((parent, name)) => self.child(parent, &name).await,
                None => None,
            },
        };
        self.cache.insert(ino, p.clone());
        p
    }

    async fn child(&mut self, parent: Ino, name: &str) -> Option<String> {
        Box::pin(self.dir(parent)).await.map(|p| {
            if p.is_empty() {
                name.to_string()
            } else {
                format!("{p}/{name}")
            }
        })
    }

    /// Where inode `ino` is now: its parent (from its attributes) and its name there; None
    /// when it is gone. A directory is listed once however many of its entries are asked.
    async fn current(&mut self, ino: Ino) -> Option<String> {
        let parent = self.vol.fs().getattr(ino).await.ok()?.parent;
        let name = self.names_in(parent, ino).await?.first()?.clone();
        self.child(parent, &name).await
    }

    /// The names inode `ino` has in directory `parent` now (listed once a run).
    async fn names_in(&mut self, parent: Ino, ino: Ino) -> Option<&Vec<String>> {
        if !self.names.contains_key(&parent) {
            let listed = self.vol.fs().readdir_all(parent).await.ok()?;
            // Listings kept for the run stay under a bound (a window touching many large
            // directories lists some again rather than holding them all).
            self.held += listed.len();
            if self.held > NAMES_HELD {
                self.names.clear();
                self.held = listed.len();
            }
            let mut by_ino: HashMap<Ino, Vec<String>> = HashMap::new();
            for e in listed {
                // Names are bytes: the key form keeps every one of them (`crate::names`).
                let name = crate::names::key_of(&e.name).into_owned();
                by_ino.entry(e.ino).or_default().push(name);
            }
            self.names.insert(parent, by_ino);
        }
        self.names.get(&parent)?.get(&ino)
    }

    /// Every path of file `ino` now, looked for in its recorded parent and in `also` (the
    /// directories the window linked or renamed it into). Err((nlink, found)) when it has
    /// more names than were found there: hard links elsewhere, found only by listing.
    async fn all_paths(
        &mut self,
        ino: Ino,
        also: &[Ino],
    ) -> std::result::Result<Vec<String>, (u32, usize)> {
        let Ok(attr) = self.vol.fs().getattr(ino).await else {
            return Ok(Vec::new()); // gone: its removal named its paths
        };
        let mut dirs = vec![attr.parent];
        for d in also {
            if !dirs.contains(d) {
                dirs.push(*d);
            }
        }
        let mut out = Vec::new();
        for d in dirs {
            let names = self.names_in(d, ino).await.cloned().unwrap_or_default();
            for name in names {
                if let Some(p) = self.child(d, &name).await {
                    out.push(p);
                }
            }
        }
        if attr.kind != FileKind::Dir && (attr.nlink as usize) > out.len() {
            return Err((attr.nlink, out.len()));
        }
        Ok(out)
    }
}

/// What the journal window asks to look at.
enum Changed {
    /// The keys to look at, and those of them whose content was rewritten.
    Keys(Vec<String>, HashSet<String>),
    /// A file changed in place has names the window and its directory do not show.
    Unnamed { ino: Ino, nlink: u32, found: usize },
}

/// Keys under `prefix` (a directory key ending in '/') on one side.
async fn keys_under(ep: &dyn Endpoint, prefix: &str, out: &mut BTreeSet<String>) -> Result<()> {
    let (tx, mut rx) = mpsc::channel(4);
    let all = crate::range::KeyRange::all();
    let listing = crate::endpoint::Listing {
        prefix,
        range: &all,
        dirs: false,
    };
    let lister = ep.list(listing, tx);
    let collect = async {
        while let Some(page) = rx.recv().await {
            for e in page? {
                if !e.key.starts_with(prefix) {
                    return Ok::<_, anyhow::Error>(());
                }
                if e.kind != Kind::Dir {
                    out.insert(e.key);
                }
            }
        }
        Ok(())
    };
    let (l, c) = tokio::join!(lister, collect);
    if let Err(e) = l {
        // A directory this side never had (made and renamed in the window; renamed, then
        // removed): nothing under it. Any other listing error stops the run.
        if matches!(ep.stat(prefix).await, Ok(None)) {
            return Ok(());
        }
        return Err(e);
    }
    c
}

async fn changed_keys(
    vol: &VolumeEndpoint,
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    entries: &[Entry],
) -> Result<Changed> {
    let mut seen = HashMap::new();
    // Directories the window linked or renamed each inode into (where its other names are).
    let mut linked_into: HashMap<Ino, Vec<Ino>> = HashMap::new();
    // Inodes created in the window, with their kind: every name such an inode has was given
    // in the window (its create, links and renames below add those paths), so a write to it
    // needs no lookup of its path, nor a rename of it one of its kind.
    let mut created: HashMap<Ino, FileKind> = HashMap::new();
    // Directories removed in the window: a rename of one is a directory's rename, though it
    // is gone now (the destination still has what was under its old name).
    let mut removed_dirs: HashSet<Ino> = HashSet::new();
    for e in entries {
        match &e.op {
            Op::Mknod {
                parent,
                name,
                ino,
                kind,
                ..
            } => {
                created.insert(*ino, *kind);
                seen.insert(*ino, (*parent, name_in(e, *parent, name)));
            }
            Op::Symlink {
                parent, name, ino, ..
            } => {
                created.insert(*ino, FileKind::Symlink);
                seen.insert(*ino, (*parent, name_in(e, *parent, name)));
            }
            Op::Unlink {
                parent, name, ino, ..
            } => {
                seen.insert(*ino, (*parent, name_in(e, *parent, name)));
            }
            Op::Rmdir { parent, name, ino } => {
                removed_dirs.insert(*ino);
                seen.insert(*ino, (*parent, name_in(e, *parent, name)));
            }
            Op::Rename {
                new_parent,
                new_name,
                ino,
                ..
            } => {
                linked_into.entry(*ino).or_default().push(*new_parent);
                seen.insert(*ino, (*new_parent, name_in(e, *new_parent, new_name)));
            }
            Op::Link { ino, parent, .. } => {
                linked_into.entry(*ino).or_default().push(*parent);
            }
            Op::Clone {
                parent, name, ino, ..
            } => {
                created.insert(*ino, clone_kind(e).unwrap_or(FileKind::Dir));
                seen.insert(*ino, (*parent, name_in(e, *parent, name)));
            }
            _ => {}
        }
    }
    let mut paths = Paths {
        vol,
        seen,
        cache: HashMap::new(),
        names: HashMap::new(),
        held: 0,
    };
    let mut volume_paths: BTreeSet<String> = BTreeSet::new();
    // Paths whose content the window rewrote.
    let mut rewritten_paths: BTreeSet<String> = BTreeSet::new();
    let mut renamed_dirs: Vec<(String, String)> = Vec::new();
    let mut cloned_dirs: Vec<String> = Vec::new();
    let mut looked_up: HashSet<Ino> = HashSet::new();
    // Inodes whose content the window wrote or truncated, and the paths found for them.
    let mut rewritten_inos: HashSet<Ino> = HashSet::new();
    let mut inode_paths: HashMap<Ino, Vec<String>> = HashMap::new();
    for e in entries {
        match &e.op {
            Op::Mknod { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::Link { parent, name, .. }
            | Op::Unlink { parent, name, .. } => {
                if let Some(p) = paths.child(*parent, &name_in(e, *parent, name)).await {
                    if matches!(e.op, Op::Mknod { .. }) {
                        rewritten_paths.insert(p.clone());
                    }
                    volume_paths.insert(p);
                }
            }
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ino,
                ..
            } => {
                let (old, new) = (
                    paths.child(*parent, &name_in(e, *parent, name)).await,
                    paths
                        .child(*new_parent, &name_in(e, *new_parent, new_name))
                        .await,
                );
                let is_dir = match created.get(ino) {
                    Some(k) => *k == FileKind::Dir,
                    None if removed_dirs.contains(ino) => true,
                    None => vol
                        .fs()
                        .getattr(*ino)
                        .await
                        .map(|a| a.kind == FileKind::Dir)
                        .unwrap_or(false),
                };
                match (old, new) {
                    (Some(o), Some(n)) if is_dir => renamed_dirs.push((o, n)),
                    (o, n) => {
                        // Another inode's content now under the new name.
                        rewritten_paths.extend(n.clone());
                        volume_paths.extend(o.into_iter().chain(n))
                    }
                }
            }
            // A clone is a new tree at its name: everything under it is new.
            Op::Clone { parent, name, .. } => {
                if let Some(p) = paths.child(*parent, &name_in(e, *parent, name)).await {
                    if clone_kind(e) == Some(FileKind::Dir) {
                        cloned_dirs.push(p.clone());
                    }
                    rewritten_paths.insert(p.clone());
                    volume_paths.insert(p);
                }
            }
            Op::Restore { .. } => {
                // Entries put back from the trash (`jfs restore`): each name the entry
                // gives is content new at its path, as a create's is (a restored directory's
                // own entries come back in entries of their own).
                for m in &e.writes {
                    if let (fs_core::Mutation::Put { .. }, fs_core::keys::Key::Dentry(p, raw)) =
                        (m, fs_core::keys::parse(m.key()))
                    {
                        let name = crate::names::key_of(raw).into_owned();
                        if let Some(path) = paths.child(p, &name).await {
                            rewritten_paths.insert(path.clone());
                            volume_paths.insert(path);
                        }
                    }
                }
            }
            Op::SetAttr { ino, .. } | Op::Write { ino, .. } | Op::CopyRange { ino, .. } => {
                let content = match &e.op {
                    Op::SetAttr { set, .. } => set.length.is_some(),
                    _ => true,
                };
                if content {
                    rewritten_inos.insert(*ino);
                }
                // Once per inode, and not at all for one created in the window.
                if created.contains_key(ino) || !looked_up.insert(*ino) {
                    continue;
                }
                let also = linked_into.get(ino).map(Vec::as_slice).unwrap_or(&[]);
                match paths.all_paths(*ino, also).await {
                    Ok(ps) => {
                        inode_paths.insert(*ino, ps.clone());
                        volume_paths.extend(ps)
                    }
                    Err((nlink, found)) => {
                        return Ok(Changed::Unnamed {
                            ino: *ino,
                            nlink,
                            found,
                        })
                    }
                }
            }
            _ => {}
        }
    }
    for ino in &rewritten_inos {
        if let Some(ps) = inode_paths.get(ino) {
            rewritten_paths.extend(ps.iter().cloned());
        }
    }
    let key_of = |p: &String| {
        vol.key_of(&format!("/{p}"))
            .filter(|k| !k.is_empty() && !crate::endpoint::is_temp(k))
    };
    let mut keys: BTreeSet<String> = volume_paths.iter().filter_map(key_of).collect();
    let rewritten: HashSet<String> = rewritten_paths.iter().filter_map(key_of).collect();
    // A renamed directory: everything now under the new name, and (for deletion at the
    // destination) everything the destination still has under the old name.
    for (old, new) in renamed_dirs {
        if let Some(k) = vol.key_of(&format!("/{new}")) {
            keys_under(src, &format!("{k}/"), &mut keys).await?;
        }
        if let Some(k) = vol.key_of(&format!("/{old}")) {
            keys_under(dst, &format!("{k}/"), &mut keys).await?;
        }
    }
    for new in cloned_dirs {
        if let Some(k) = vol.key_of(&format!("/{new}")) {
            keys_under(src, &format!("{k}/"), &mut keys).await?;
        }
    }
    Ok(Changed::Keys(keys.into_iter().collect(), rewritten))
}

/// The kind of what a clone entry linked (from the entry it wrote).
fn clone_kind(e: &Entry) -> Option<FileKind> {
    let Op::Clone { parent, ino, .. } = &e.op else {
        return None;
    };
    e.writes
        .iter()
        .find_map(|m| match (m, fs_core::keys::parse(m.key())) {
            (fs_core::Mutation::Put { value, .. }, fs_core::keys::Key::Dentry(p, _))
                if p == *parent =>
            {
                fs_core::keys::decode_dentry(value)
                    .filter(|(i, _)| i == ino)
                    .map(|(_, k)| k)
            }
            _ => None,
        })
}

/// The key form (`crate::names`) of the name an entry's operation gives in `parent`. The
/// operation holds names as text, lossily for a name that is not UTF-8 (`k\xfe` reads
/// `k\u{fffd}`), so the name is taken from the entry's write-set, whose directory-entry keys
/// hold the bytes: the one in `parent` whose text form is the operation's.
fn name_in(e: &Entry, parent: Ino, op_name: &str) -> String {
    for m in &e.writes {
        if let fs_core::keys::Key::Dentry(p, raw) = fs_core::keys::parse(m.key()) {
            if p == parent && String::from_utf8_lossy(raw) == op_name {
                return crate::names::key_of(raw).into_owned();
            }
        }
    }
    op_name.to_string()
}
