//! `--from-journal`: when the source is a volume, its change journal says exactly which paths
//! changed since the previous run, so nothing is listed. The keys found here go through the
//! same per-key path as `--files-from` (look up both sides, decide, copy or delete).

use crate::endpoint::{Endpoint, Kind, VolumeEndpoint};
use crate::run::Options;
use crate::state::State;
use anyhow::{bail, Result};
use fs_core::{Entry, FileKind, Ino, Op, ROOT_INO};
use std::collections::{BTreeSet, HashMap};
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
    let (keys, head) = changes(src, dst, since).await?;
    opts.keys = keys;
    Ok(Some(head))
}

/// What changed since journal entry `since`: the keys the entries after it touch, up to the
/// journal's head now, or None (list everything) when there is no earlier position or the
/// journal no longer reaches back to it. Returns the head with them.
pub async fn changes(
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    since: Option<u64>,
) -> Result<(Option<Vec<String>>, u64)> {
    let Some(vol) = src.as_volume() else {
        bail!("--from-journal needs a volume source (jfs://NAME/path)")
    };
    let engine = vol.fs().engine().clone();
    let bounds = engine.journal_bounds().await?;
    let head = bounds.last;
    let Some(since) = since else {
        cli_common::eprintln!("jfs-sync: --from-journal: no earlier run recorded: a full listing this time; the next run reads the journal after entry {head}");
        return Ok((None, head));
    };
    if since + 1 < bounds.first {
        cli_common::eprintln!(
            "jfs-sync: WARNING: --from-journal: the journal no longer reaches back to entry {} (first retained is {}): falling back to a FULL LISTING",
            since + 1,
            bounds.first
        );
        return Ok((None, head));
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
            entries.push(Entry::decode(&f)?);
            next = seq + 1;
        }
    }
    let keys = changed_keys(vol, src, dst, &entries).await?;
    cli_common::eprintln!(
        "jfs-sync: --from-journal: entries {}..={head} touch {} keys",
        since + 1,
        keys.len()
    );
    Ok((Some(keys), head))
}

struct Paths<'a> {
    vol: &'a VolumeEndpoint,
    /// Names seen in the journal window: the way to name directories deleted since.
    seen: HashMap<Ino, (Ino, String)>,
    cache: HashMap<Ino, Option<String>>,
}

impl Paths<'_> {
    async fn dir(&mut self, ino: Ino) -> Option<String> {
        if ino == ROOT_INO {
            return Some(String::new());
        }
        if let Some(p) = self.cache.get(&ino) {
            return p.clone();
        }
        let p = match self.vol.fs().path_of(ino).await {
            Ok(p) => Some(p.trim_start_matches('/').to_string()),
            Err(_) => match self.seen.get(&ino).cloned() {
                Some((parent, name)) => Box::pin(self.dir(parent)).await.map(|pp| {
                    if pp.is_empty() {
                        name
                    } else {
                        format!("{pp}/{name}")
                    }
                }),
                None => None,
            },
        };
        self.cache.insert(ino, p.clone());
        p
    }

    async fn child(&mut self, parent: Ino, name: &str) -> Option<String> {
        self.dir(parent).await.map(|p| {
            if p.is_empty() {
                name.to_string()
            } else {
                format!("{p}/{name}")
            }
        })
    }
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
    l?;
    c
}

async fn changed_keys(
    vol: &VolumeEndpoint,
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    entries: &[Entry],
) -> Result<Vec<String>> {
    let mut seen = HashMap::new();
    for e in entries {
        match &e.op {
            Op::Mknod {
                parent, name, ino, ..
            }
            | Op::Symlink {
                parent, name, ino, ..
            }
            | Op::Unlink {
                parent, name, ino, ..
            }
            | Op::Rmdir { parent, name, ino } => {
                seen.insert(*ino, (*parent, name.clone()));
            }
            Op::Rename {
                new_parent,
                new_name,
                ino,
                ..
            } => {
                seen.insert(*ino, (*new_parent, new_name.clone()));
            }
            _ => {}
        }
    }
    let mut paths = Paths {
        vol,
        seen,
        cache: HashMap::new(),
    };
    let mut volume_paths: BTreeSet<String> = BTreeSet::new();
    let mut renamed_dirs: Vec<(String, String)> = Vec::new();
    for e in entries {
        match &e.op {
            Op::Mknod { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::Link { parent, name, .. }
            | Op::Unlink { parent, name, .. } => {
                if let Some(p) = paths.child(*parent, name).await {
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
                    paths.child(*parent, name).await,
                    paths.child(*new_parent, new_name).await,
                );
                let is_dir = vol
                    .fs()
                    .getattr(*ino)
                    .await
                    .map(|a| a.kind == FileKind::Dir)
                    .unwrap_or(false);
                match (old, new) {
                    (Some(o), Some(n)) if is_dir => renamed_dirs.push((o, n)),
                    (o, n) => volume_paths.extend(o.into_iter().chain(n)),
                }
            }
            Op::SetAttr { ino, .. } | Op::Write { ino, .. } => {
                if let Ok(p) = vol.fs().path_of(*ino).await {
                    volume_paths.insert(p.trim_start_matches('/').to_string());
                }
            }
            _ => {}
        }
    }
    let mut keys: BTreeSet<String> = volume_paths
        .iter()
        .filter_map(|p| vol.key_of(&format!("/{p}")))
        .filter(|k| !k.is_empty() && !crate::endpoint::is_temp(k))
        .collect();
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
    Ok(keys.into_iter().collect())
}
