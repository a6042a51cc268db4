//! A diverged tail, saved before a resync replaces it. A site that was the primary and
//! rejoins a newer primary as a mirror (after a failover) may hold entries the new primary
//! never received: what it committed after the promotion point. The resync that makes it
//! equal to the new primary drops them from its metadata, so they are saved first, as
//! MongoDB saves rollback files: the entries themselves and the files they wrote, with their
//! bytes read from the blocks, in a directory that stays until the operator deletes it. The
//! switch to the new state waits until the save is complete (a save that fails leaves the
//! site serving its previous state, and is retried).
//!
//! Layout of a saved tail (`<state_dir>/rollback/tail-<first>-<last>-epoch<E>/`):
//! - `README.txt`: what this is and how to re-apply it;
//! - `manifest.json`: the divergence point, the entries' range, every file saved (volume
//!   path, inode, length, CRC32C, mode, mtime), symlinks, files deleted in the tail, failures;
//! - `entries.jsonl`: one JSON object per entry (seq, time, op, every key put or deleted with
//!   its value in hex), and `entries.frames`: the journal frames as they were (u32 LE length,
//!   frame);
//! - `files/<volume path>`: the content of every regular file the tail wrote, as this site
//!   last had it; `unlinked/<inode>`: files with no name any more (unlinked while open);
//! - `dump.json` instead, when the journal no longer reaches back to the divergence point:
//!   the whole metadata as it was (`jfs load` it into an empty engine to read it).
//!
//! Volume names are untrusted here: each path component is checked (not empty, not `.` or
//! `..`, no `/` or NUL) before it is pushed onto the host path, so nothing is written
//! outside the saved directory.

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::keys::{self, Key};
use fs_core::site::Rollback;
use fs_core::{BlockCheck, BlockStore, Engine, Entry, FileKind, Fs, Ino, Mutation, ObjectMeta};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a tail parted from the history that replaces it.
#[derive(Debug, Clone)]
pub struct Tail {
    /// The last entry both histories share.
    pub parted_at: u64,
    /// False when the replacing history's epoch record does not reach back to this site's
    /// epoch (written by an older release): `parted_at` is then the earliest point known.
    pub exact: bool,
    pub from_epoch: u64,
    pub to_epoch: u64,
}

/// Save what `engine` (this site's metadata, before the switch) holds after `tail.parted_at`
/// under `root`, reading file bytes through `store`. Returns the record to keep beside the
/// metadata (the caller writes it).
pub async fn save(
    engine: Arc<dyn Engine>,
    store: Arc<dyn BlockStore>,
    tail: &Tail,
    root: &Path,
    host: &str,
) -> Result<Rollback> {
    let bounds = engine.journal_bounds().await?;
    let first = tail.parted_at + 1;
    let last = bounds.last;
    let name = format!("tail-{first}-{last}-epoch{}", tail.to_epoch);
    let dir = root.join(&name);
    let tmp = root.join(format!("{name}.partial"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut man = Manifest {
        version: <Manifest as fs_core::record::Versioned>::VERSION,
        parted_at: tail.parted_at,
        parted_at_exact: tail.exact,
        from_epoch: tail.from_epoch,
        to_epoch: tail.to_epoch,
        first_seq: first,
        last_seq: last,
        ..Default::default()
    };
    let retained = bounds.first <= first;
    let mut touched = BTreeSet::new();
    let mut hints: HashMap<Ino, Vec<(Ino, Vec<u8>)>> = HashMap::new();
    // The entries: from the divergence point, or from the first still retained.
    let from = first.max(bounds.first);
    {
        let mut jsonl = std::io::BufWriter::new(create(&tmp.join("entries.jsonl"))?);
        let mut frames = std::io::BufWriter::new(create(&tmp.join("entries.frames"))?);
        let mut at = from;
        while at <= last {
            let page = engine.journal_read(at, 1000).await?;
            let Some((l, _)) = page.last() else { break };
            at = l + 1;
            for (seq, f) in page {
                // At its position: a frame of another entry stored here is refused, not saved
                // as this one.
                let e =
                    Entry::decode_at(seq, &f).with_context(|| format!("journal entry {seq}"))?;
                frames.write_all(&(f.len() as u32).to_le_bytes())?;
                frames.write_all(&f)?;
                serde_json::to_writer(&mut jsonl, &entry_json(&e))?;
                jsonl.write_all(b"\n")?;
                man.entries += 1;
                note(&e, &mut touched, &mut hints);
            }
        }
        finish(jsonl)?;
        finish(frames)?;
    }
    let fs = Fs::open(engine.clone(), store).await?;
    if !retained {
        // Which files the missing entries wrote cannot be told: the whole metadata is kept.
        let d = fs_core::maint::dump(&*engine).await?;
        let mut w = std::io::BufWriter::new(create(&tmp.join("dump.json"))?);
        serde_json::to_writer(&mut w, &d)?;
        finish(w)?;
        man.dump = true;
        tracing::warn!(
            first_retained = bounds.first,
            parted_at = tail.parted_at,
            "this site's journal no longer reaches back to where its history parted: its whole metadata is saved as dump.json beside the entries still retained"
        );
    }
    let mut paths = Paths::new(&fs, hints);
    for ino in touched {
        let attr = match fs.getattr(ino).await {
            Ok(a) => a,
            Err(e) if e.kind() == fs_core::ErrorKind::NotFound => {
                man.deleted.push(ino);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let path = paths.of(ino).await?;
        match attr.kind {
            FileKind::File => {
                let (host, shown) = match &path {
                    Some(p) => (host_path(&tmp.join("files"), p)?, show(p)),
                    None => (
                        tmp.join("unlinked").join(ino.to_string()),
                        format!("(unlinked) {ino}"),
                    ),
                };
                match save_file(&fs, ino, &attr, &host).await {
                    Ok(crc) => {
                        man.bytes += attr.length;
                        man.files.push(SavedFile {
                            path: shown,
                            ino,
                            len: attr.length,
                            crc32c: crc,
                            mode: attr.mode,
                            mtime_ns: attr.mtime,
                        });
                    }
                    Err(e) => {
                        let _ = std::fs::remove_file(&host);
                        tracing::error!(path = %shown, error = %format!("{e:#}"), "a file of the diverged tail could not be read: it is named in the manifest, without its bytes");
                        man.failed.push(Failed {
                            path: shown,
                            ino,
                            error: format!("{e:#}"),
                        });
                    }
                }
            }
            FileKind::Symlink => {
                let target = fs.readlink(ino).await?;
                man.symlinks.push(SavedLink {
                    path: path.as_deref().map_or(format!("(unlinked) {ino}"), show),
                    ino,
                    target: String::from_utf8_lossy(&target).into_owned(),
                });
            }
            FileKind::Dir => {
                if let Some(p) = &path {
                    let h = host_path(&tmp.join("files"), p)?;
                    std::fs::create_dir_all(&h)
                        .with_context(|| format!("creating {}", h.display()))?;
                }
            }
            _ => {}
        }
    }
    let mut w = create(&tmp.join("manifest.json"))?;
    serde_json::to_writer_pretty(&mut w, &man)?;
    w.sync_all()?;
    let mut r = create(&tmp.join("README.txt"))?;
    r.write_all(readme(&man, &dir).as_bytes())?;
    r.sync_all()?;
    // Complete: under its final name, durably.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    std::fs::File::open(root)?.sync_all()?;
    Ok(Rollback {
        version: fs_core::site::MARKER_VERSION,
        dir: dir.display().to_string(),
        host: host.to_string(),
        from_epoch: tail.from_epoch,
        to_epoch: tail.to_epoch,
        parted_at: tail.parted_at,
        first_seq: first,
        last_seq: last,
        entries: man.entries,
        files: man.files.len() as u64,
        bytes: man.bytes,
        failed: man.failed.len() as u64,
        at_ns: fs_core::now_ns(),
    })
}

/// `manifest.json`: a `Versioned` record (a person reads it; a later release may too).
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Manifest {
    version: u32,
    parted_at: u64,
    parted_at_exact: bool,
    from_epoch: u64,
    to_epoch: u64,
    first_seq: u64,
    last_seq: u64,
    entries: u64,
    bytes: u64,
    /// The journal did not reach back to `first_seq`: `dump.json` holds the whole metadata.
    dump: bool,
    files: Vec<SavedFile>,
    symlinks: Vec<SavedLink>,
    /// Inodes the tail touched that it also deleted.
    deleted: Vec<Ino>,
    failed: Vec<Failed>,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SavedFile {
    path: String,
    ino: Ino,
    len: u64,
    crc32c: u32,
    mode: u32,
    mtime_ns: i64,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SavedLink {
    path: String,
    ino: Ino,
    target: String,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Failed {
    path: String,
    ino: Ino,
    error: String,
}

impl fs_core::record::Versioned for Manifest {
    const KIND: &'static str = "a saved tail's manifest";
    const VERSION: u32 = 1;
}

fn readme(m: &Manifest, dir: &Path) -> String {
    format!(
        "This directory holds what this site had committed after its history parted from the
primary it rejoined (epoch {} -> {}): entries {}..={} ({} entries), which the resync removed
from its metadata. Nothing here is in the volume any more.

- manifest.json: every file saved (volume path, length, CRC32C), symlinks, failures;
- entries.jsonl: the entries, one per line (entries.frames: the journal frames as they were);
- files/: the content of each file the tail wrote, under its volume path;
{}
Review it, then re-apply what should be kept at the primary, e.g. into a directory of its own:

    jfs put PRIMARY_META_URL {}/files /recovered

(runbooks/failover.md, \"Review and re-apply a saved tail\"). Delete this directory when done.
",
        m.from_epoch,
        m.to_epoch,
        m.first_seq,
        m.last_seq,
        m.entries,
        if m.dump {
            "- dump.json: the whole metadata as it was (the journal no longer reached back to the\n  divergence point): `jfs load` it into an empty engine to read it;\n"
        } else {
            ""
        },
        dir.display()
    )
}

fn create(p: &Path) -> Result<std::fs::File> {
    std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))
}

fn finish(w: std::io::BufWriter<std::fs::File>) -> Result<()> {
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    Ok(())
}

/// An entry as a JSON line: its op and every key it put or deleted, values in hex.
fn entry_json(e: &Entry) -> serde_json::Value {
    let writes: Vec<serde_json::Value> = e
        .writes
        .iter()
        .map(|m| match m {
            Mutation::Put { key, value } => serde_json::json!({
                "put": key.escape_ascii().to_string(),
                "value_hex": hex(value),
            }),
            other => serde_json::json!({ "delete": other.key().escape_ascii().to_string() }),
        })
        .collect();
    serde_json::json!({
        "seq": e.seq,
        "time_ns": e.time_ns,
        "op": e.op,
        "writes": writes,
    })
}

fn hex(v: &[u8]) -> String {
    v.iter().map(|b| format!("{b:02x}")).collect()
}

/// The inodes an entry wrote (chunks, attributes, symlinks), and the names it gave them.
fn note(e: &Entry, touched: &mut BTreeSet<Ino>, hints: &mut HashMap<Ino, Vec<(Ino, Vec<u8>)>>) {
    for m in &e.writes {
        match (keys::parse(m.key()), m) {
            (Key::Chunk(ino, _), _) | (Key::Symlink(ino), _) => {
                touched.insert(ino);
            }
            (Key::Attr(ino), Mutation::Put { .. }) => {
                touched.insert(ino);
            }
            (Key::Dentry(parent, name), Mutation::Put { value, .. }) => {
                if let Some((ino, _)) = keys::decode_dentry(value) {
                    hints.entry(ino).or_default().push((parent, name.to_vec()));
                }
            }
            _ => {}
        }
    }
}

/// A volume path as components (each checked), from the root.
type VolPath = Vec<Vec<u8>>;

fn show(p: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for c in p {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    s
}

/// `p` under `base`, component by component; a component that could leave `base` (or is
/// not a name at all) is refused.
fn host_path(base: &Path, p: &[Vec<u8>]) -> Result<PathBuf> {
    let mut out = base.to_path_buf();
    for c in p {
        if c.is_empty() || c == b"." || c == b".." || c.contains(&b'/') || c.contains(&0) {
            bail!(
                "the volume name {:?} is not a plain name: not saved",
                c.escape_ascii().to_string()
            );
        }
        out.push(std::ffi::OsStr::from_bytes(c));
    }
    Ok(out)
}

/// Write the whole content of file `ino` to `host` (read 8 MiB at a time, every block
/// checked by the reads), with its mode and mtime; its CRC32C.
async fn save_file(fs: &Fs, ino: Ino, attr: &fs_core::Attr, host: &Path) -> Result<u32> {
    if let Some(parent) = host.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut f = create(host)?;
    let mut crc = 0u32;
    let mut off = 0u64;
    while off < attr.length {
        let n = (attr.length - off).min(8 << 20) as usize;
        let data = fs.read(ino, off, n).await?;
        if data.len() != n {
            bail!("read {} bytes at offset {off}, expected {n}", data.len());
        }
        crc = crc32c::crc32c_append(crc, &data);
        f.write_all(&data)?;
        off += n as u64;
    }
    f.sync_all()?;
    use std::os::unix::fs::PermissionsExt;
    let _ = f.set_permissions(std::fs::Permissions::from_mode(attr.mode & 0o7777));
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(attr.mtime.max(0) as u64);
    let _ = f.set_modified(mtime);
    Ok(crc)
}

/// Volume paths of inodes: from the names the tail gave them, then from the directory they
/// were created in, then (for what is left) one walk of the whole tree.
struct Paths<'a> {
    fs: &'a Fs,
    hints: HashMap<Ino, Vec<(Ino, Vec<u8>)>>,
    listings: HashMap<Ino, Vec<fs_core::DirEntry>>,
    known: HashMap<Ino, Option<VolPath>>,
    walked: Option<HashMap<Ino, VolPath>>,
}

impl<'a> Paths<'a> {
    fn new(fs: &'a Fs, hints: HashMap<Ino, Vec<(Ino, Vec<u8>)>>) -> Self {
        let mut known = HashMap::new();
        known.insert(fs_core::ROOT_INO, Some(Vec::new()));
        Paths {
            fs,
            hints,
            listings: HashMap::new(),
            known,
            walked: None,
        }
    }

    /// The path of `ino` in the current tree (None: it has no name, unlinked while open).
    async fn of(&mut self, ino: Ino) -> Result<Option<VolPath>> {
        if let Some(p) = self.known.get(&ino) {
            return Ok(p.clone());
        }
        let mut chain: Vec<(Ino, Vec<u8>)> = Vec::new();
        let mut cur = ino;
        let found = loop {
            if let Some(p) = self.known.get(&cur).cloned() {
                break p;
            }
            if chain.len() > 4096 {
                break None;
            }
            match self.name_of(cur).await? {
                Some((parent, name)) => {
                    chain.push((cur, name));
                    cur = parent;
                }
                None => break None,
            }
        };
        let path = match found {
            Some(mut base) => {
                // Fill in every inode along the chain, nearest the root first.
                for (i, name) in chain.iter().rev() {
                    base.push(name.clone());
                    self.known.insert(*i, Some(base.clone()));
                }
                self.known.get(&ino).cloned().flatten()
            }
            None => self.walk_for(ino).await?,
        };
        self.known.insert(ino, path.clone());
        Ok(path)
    }

    /// (parent, name) of `ino` from the tail's names or its creation directory, checked
    /// against the current tree.
    async fn name_of(&mut self, ino: Ino) -> Result<Option<(Ino, Vec<u8>)>> {
        let mut cands: Vec<(Ino, Vec<u8>)> = self
            .hints
            .get(&ino)
            .into_iter()
            .flatten()
            .rev()
            .cloned()
            .collect();
        if let Ok(a) = self.fs.getattr(ino).await {
            if a.parent != 0 && a.parent != ino {
                for e in self.listing(a.parent).await? {
                    if e.ino == ino {
                        cands.push((a.parent, e.name.clone()));
                        break;
                    }
                }
            }
        }
        for (parent, name) in cands {
            if let Ok((i, _)) = self.fs.lookup(parent, &name).await {
                if i == ino {
                    return Ok(Some((parent, name)));
                }
            }
        }
        Ok(None)
    }

    async fn listing(&mut self, dir: Ino) -> Result<&Vec<fs_core::DirEntry>> {
        if !self.listings.contains_key(&dir) {
            let l = self.fs.readdir_all(dir).await.unwrap_or_default();
            self.listings.insert(dir, l);
        }
        Ok(&self.listings[&dir])
    }

    /// One walk of the whole tree, done once, for inodes the cheap ways did not place.
    async fn walk_for(&mut self, ino: Ino) -> Result<Option<VolPath>> {
        if self.walked.is_none() {
            let mut map: HashMap<Ino, VolPath> = HashMap::new();
            let mut stack: Vec<(Ino, VolPath)> = vec![(fs_core::ROOT_INO, Vec::new())];
            while let Some((dir, path)) = stack.pop() {
                for e in self.fs.readdir_all(dir).await? {
                    let mut p = path.clone();
                    p.push(e.name.clone());
                    if e.kind == FileKind::Dir {
                        stack.push((e.ino, p.clone()));
                    }
                    map.entry(e.ino).or_insert(p);
                }
            }
            self.walked = Some(map);
        }
        Ok(self.walked.as_ref().and_then(|m| m.get(&ino).cloned()))
    }
}

/// The store the tail's bytes are read from: the mirror's own store, then the store the
/// site's metadata names (where it wrote them as the primary), for what the first lacks.
pub struct FirstOf {
    pub a: Arc<dyn BlockStore>,
    pub b: Option<Arc<dyn BlockStore>>,
}

#[async_trait]
impl BlockStore for FirstOf {
    fn display_url(&self) -> String {
        match &self.b {
            Some(b) => format!("{} (then {})", self.a.display_url(), b.display_url()),
            None => self.a.display_url(),
        }
    }
    async fn put(&self, _key: &str, _data: Bytes) -> fs_core::Result<()> {
        Err(fs_core::Error::new(
            fs_core::ErrorKind::ReadOnly,
            "saving a diverged tail only reads blocks",
        ))
    }
    async fn get(&self, key: &str) -> fs_core::Result<Bytes> {
        match (self.a.get(key).await, &self.b) {
            (Err(e), Some(b)) if e.kind() == fs_core::ErrorKind::NotFound => b.get(key).await,
            (r, _) => r,
        }
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> fs_core::Result<Bytes> {
        match (self.a.get_block(key, want).await, &self.b) {
            (Err(_), Some(b)) => b.get_block(key, want).await,
            (r, _) => r,
        }
    }
    async fn head(&self, key: &str) -> fs_core::Result<Option<ObjectMeta>> {
        match (self.a.head(key).await?, &self.b) {
            (None, Some(b)) => b.head(key).await,
            (m, _) => Ok(m),
        }
    }
    async fn delete(&self, _key: &str) -> fs_core::Result<()> {
        Err(fs_core::Error::new(
            fs_core::ErrorKind::ReadOnly,
            "saving a diverged tail only reads blocks",
        ))
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> fs_core::Result<()> + Send),
    ) -> fs_core::Result<()> {
        self.a.list(prefix, f).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fs_core::engine::{CommitOutcome, JournalBounds, KvPair};

    /// A journal of two positions whose second holds the frame of entry 1 (a store that
    /// handed back the wrong frame); nothing else is read before the entries are.
    struct Misplaced;

    fn nothing<T>() -> fs_core::Result<T> {
        Err(fs_core::Error::new(
            fs_core::ErrorKind::Backend,
            "not part of this test",
        ))
    }

    #[async_trait::async_trait]
    impl Engine for Misplaced {
        fn kind(&self) -> &'static str {
            "test"
        }
        fn display_url(&self) -> String {
            "test://misplaced".into()
        }
        async fn get(&self, _: &[u8]) -> fs_core::Result<Option<Vec<u8>>> {
            nothing()
        }
        async fn scan(&self, _: &[u8], _: &[u8], _: usize) -> fs_core::Result<Vec<KvPair>> {
            nothing()
        }
        async fn commit(&self, _: &fs_core::CommitRequest) -> fs_core::Result<CommitOutcome> {
            nothing()
        }
        async fn journal_bounds(&self) -> fs_core::Result<JournalBounds> {
            Ok(JournalBounds { first: 1, last: 2 })
        }
        async fn journal_read(&self, from: u64, _: usize) -> fs_core::Result<Vec<(u64, Vec<u8>)>> {
            let e = |seq| {
                Entry {
                    seq,
                    time_ns: 1,
                    op: fs_core::journal::Op::Settings { what: "x".into() },
                    writes: Vec::new(),
                }
                .encode()
            };
            Ok([(1, e(1)), (2, e(1))]
                .into_iter()
                .filter(|(s, _)| *s >= from)
                .collect())
        }
        async fn journal_wait(&self, _: u64, _: std::time::Duration) -> fs_core::Result<bool> {
            nothing()
        }
        async fn journal_trim(&self, _: u64) -> fs_core::Result<u64> {
            nothing()
        }
        async fn apply(&self, _: &[Entry]) -> fs_core::Result<u64> {
            nothing()
        }
        async fn aux_put(&self, _: &str, _: Option<&[u8]>) -> fs_core::Result<()> {
            nothing()
        }
        async fn aux_list(&self, _: &str) -> fs_core::Result<Vec<(String, Vec<u8>)>> {
            nothing()
        }
        async fn install_reset(&self) -> fs_core::Result<()> {
            nothing()
        }
        async fn install_put(&self, _: &[KvPair]) -> fs_core::Result<()> {
            nothing()
        }
        async fn install_head(&self, _: u64) -> fs_core::Result<()> {
            nothing()
        }
        async fn install_switch(
            &self,
            _: &[Mutation],
            _: &[(u64, Vec<u8>)],
            _: u64,
        ) -> fs_core::Result<()> {
            nothing()
        }
    }

    /// A diverged tail whose journal hands back another entry's frame at a position is
    /// refused, naming both, instead of being saved as that position's entry.
    #[tokio::test]
    async fn a_frame_of_another_entry_at_a_position_is_refused_not_saved() {
        let root = tempfile::tempdir().unwrap();
        let tail = Tail {
            parted_at: 0,
            exact: true,
            from_epoch: 0,
            to_epoch: 1,
        };
        let store: Arc<dyn BlockStore> =
            volume::open_store("memory://rollback-test", None).unwrap();
        let e = save(Arc::new(Misplaced), store, &tail, root.path(), "h")
            .await
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("journal entry 2") && msg.contains("holds the frame of entry 1"),
            "{msg}"
        );
    }

    /// A manifest as this release and the previous one write it reads back; one of a newer
    /// version is refused.
    #[test]
    fn a_manifest_of_today_reads_and_a_newer_one_is_refused() {
        use fs_core::record;
        let today = r#"{
  "version": 1,
  "parted_at": 41,
  "parted_at_exact": true,
  "from_epoch": 1,
  "to_epoch": 2,
  "first_seq": 42,
  "last_seq": 44,
  "entries": 3,
  "bytes": 5,
  "dump": false,
  "files": [
    {
      "path": "/a/b",
      "ino": 9,
      "len": 5,
      "crc32c": 123,
      "mode": 33188,
      "mtime_ns": 7
    }
  ],
  "symlinks": [
    {
      "path": "/l",
      "ino": 10,
      "target": "b"
    }
  ],
  "deleted": [
    11
  ],
  "failed": [
    {
      "path": "/c",
      "ino": 12,
      "error": "no block"
    }
  ]
}"#;
        let m = record::decode::<Manifest>(today.as_bytes()).unwrap();
        assert_eq!(
            (m.parted_at, m.first_seq, m.last_seq, m.entries),
            (41, 42, 44, 3)
        );
        assert_eq!(m.files[0].path, "/a/b");
        assert_eq!(m.files[0].crc32c, 123);
        assert_eq!(m.symlinks[0].target, "b");
        assert_eq!((m.deleted.clone(), m.failed[0].ino), (vec![11], 12));
        // What `save` writes (pretty, the version set) is the same record.
        let mut pretty = Vec::new();
        serde_json::to_writer_pretty(&mut pretty, &m).unwrap();
        assert_eq!(String::from_utf8(pretty).unwrap(), today);
        let newer = today.replace("\"version\": 1", "\"version\": 2");
        let e = record::decode::<Manifest>(newer.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), fs_core::ErrorKind::UnsupportedVersion);
    }

    #[test]
    fn hostile_names_never_leave_the_saved_directory() {
        let base = Path::new("/saved/files");
        let ok = host_path(base, &[b"a".to_vec(), b"b c".to_vec()]).unwrap();
        assert_eq!(ok, Path::new("/saved/files/a/b c"));
        for bad in [&b".."[..], b".", b"", b"x/y", b"a\0b"] {
            assert!(
                host_path(base, &[b"a".to_vec(), bad.to_vec()]).is_err(),
                "{bad:?} accepted"
            );
        }
    }
}
