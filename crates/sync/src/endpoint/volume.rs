//! A volume, file by file through fs-core: `jfs://NAME/path`, where the environment variable
//! `NAME` holds the META_URL (as JuiceFS does; it keeps URLs and passwords out of arguments).
//! Files are written under a temporary name and renamed into place when complete.

use super::{check_path as check_key, Endpoint, Entry, Kind, Listing, Page, Sink};
use crate::names::{bytes_of, key_of, show};
use anyhow::{anyhow, bail, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::{Attr, ErrorKind, FileKind, Fs, Ino, Owner, SetAttr};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The META_URL of `jfs://NAME/...`: the value of the environment variable NAME.
pub fn meta_url_of(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| {
        anyhow!("jfs://{name}/: set the environment variable {name} to the volume's META_URL")
    })
}

pub struct VolumeEndpoint {
    fs: Arc<Fs>,
    name: String,
    /// Volume path this endpoint is rooted at ("" is the volume root).
    base: String,
}

fn entry(key: String, a: &Attr, target: Option<String>) -> Entry {
    let kind = match a.kind {
        FileKind::Dir => Kind::Dir,
        FileKind::Symlink => Kind::Symlink,
        // Special nodes are left out of listings (`children`); a stat of one reads as empty.
        _ => Kind::File,
    };
    Entry {
        key,
        kind,
        size: if kind == Kind::File { a.length } else { 0 },
        mtime_ns: a.mtime,
        mode: Some(a.mode),
        target,
        owner: Some((a.uid, a.gid)),
    }
}

/// Where a fenced volume moved (`volume.moved`), read without writing anything.
async fn moved_to(url: &str) -> Option<String> {
    let opts = meta::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let engine = meta::open(url, &opts).await.ok()?;
    fs_core::site::moved(&*engine)
        .await
        .ok()
        .flatten()
        .map(|m| m.meta_url)
}

impl VolumeEndpoint {
    /// Open `NAME/path`. `write`: this volume is the destination (refused on a mirror's
    /// metadata); otherwise it is only read (RocksDB: a secondary beside its writer).
    pub async fn open(rest: &str, write: bool) -> Result<Self> {
        let (name, path) = rest.split_once('/').unwrap_or((rest, ""));
        // Resolved inside the volume before anything is opened: `..` never climbs above its
        // root (such a path is refused, naming it).
        let base = fs_core::VolPath::parse(path)
            .with_context(|| format!("jfs://{name}/{path}"))?
            .to_string()
            .trim_start_matches('/')
            .to_string();
        let url = meta_url_of(name)?;
        let opts = volume::Options {
            access: if write {
                volume::Access::Write
            } else {
                volume::Access::Read
            },
            ..Default::default()
        };
        let fs = match volume::open(&url, &opts).await {
            Ok(fs) => fs,
            Err(e) => {
                // A fenced old primary: say where the volume went (the META_URL to point NAME
                // at), not only which agent follows whom.
                let moved = if write && e.kind() == ErrorKind::ReadOnly {
                    moved_to(&url).await
                } else {
                    None
                };
                let e = anyhow::Error::new(e);
                return Err(match moved {
                    Some(to) => e.context(format!(
                        "opening volume {name}: its primary moved to {to} (this metadata was fenced): point {name} at it (export {name}='{to}', with its password as before) and run again"
                    )),
                    None => e.context(format!(
                        "opening volume {name} (its metadata at {})",
                        meta::redact(&url)
                    )),
                });
            }
        };
        Ok(VolumeEndpoint {
            fs: Arc::new(fs),
            name: name.to_string(),
            base,
        })
    }

    /// The path inside the volume this endpoint is rooted at ("" is the root).
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// The volume path of a key.
    pub fn path_of(&self, key: &str) -> String {
        let k = key.trim_end_matches('/');
        match (self.base.is_empty(), k.is_empty()) {
            (true, _) => format!("/{k}"),
            (false, true) => format!("/{}", self.base),
            (false, false) => format!("/{}/{k}", self.base),
        }
    }

    /// The key of a volume path, if it is under this endpoint's base.
    pub fn key_of(&self, path: &str) -> Option<String> {
        let p = path.trim_start_matches('/');
        if self.base.is_empty() {
            return Some(p.to_string());
        }
        p.strip_prefix(&self.base)
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_string)
    }

    /// The names (bytes, `crate::names`) from the volume's root to `key`: the base's, then
    /// the key's.
    fn components<'k>(&'k self, key: &'k str) -> impl Iterator<Item = Vec<u8>> + 'k {
        self.base
            .split('/')
            .chain(key.trim_end_matches('/').split('/'))
            .filter(|c| !c.is_empty())
            .map(|c| bytes_of(c).into_owned())
    }

    /// The inode `key` names, looked up name by name as bytes. Symlinks are not followed:
    /// every component but the last must be a directory.
    async fn resolve_key(&self, key: &str) -> fs_core::Result<(Ino, Attr)> {
        let mut ino = fs_core::ROOT_INO;
        let mut attr = self.fs.getattr(ino).await?;
        for c in self.components(key) {
            if attr.kind != FileKind::Dir {
                return Err(fs_core::Error::new(
                    ErrorKind::NotDir,
                    format!("{}: a component is not a directory", show(key)),
                ));
            }
            (ino, attr) = self.fs.lookup(ino, &c).await?;
        }
        Ok((ino, attr))
    }

    /// The directory holding `key` (made with `create`) and the key of its name.
    async fn parent_dir(&self, key: &str, create: bool) -> Result<(Ino, String)> {
        let mut comps: Vec<Vec<u8>> = self.components(key).collect();
        let name = comps
            .pop()
            .map(|n| key_of(&n).into_owned())
            .unwrap_or_default();
        let mut cur = fs_core::ROOT_INO;
        for c in comps {
            cur = match self.fs.lookup(cur, &c).await {
                Ok((ino, a)) if a.kind == FileKind::Dir => ino,
                // Retrying cannot help: someone must remove what is in the way.
                Ok((_, a)) => {
                    return Err(super::permanent(format!(
                        "{}: {} is {} where a directory is needed: jfs-sync never writes through links; remove it (or exclude that path) and run again",
                        show(key),
                        crate::names::quote(&c),
                        if a.kind == FileKind::Symlink { "a symbolic link" } else { "not a directory" }
                    )))
                }
                Err(e) if e.kind() == ErrorKind::NotFound && create => match self
                    .fs
                    .mkdir(cur, &c, 0o755, Owner::default())
                    .await
                {
                    Ok((ino, _)) => ino,
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                        self.fs.lookup(cur, &c).await?.0
                    }
                    Err(e) => return Err(e.into()),
                },
                Err(e) => return Err(e.into()),
            };
        }
        Ok((cur, name))
    }

    async fn children(&self, ino: Ino, prefix: &str) -> Result<Vec<(String, Ino, Attr)>> {
        let mut out = Vec::new();
        for e in self.fs.readdir_all(ino).await? {
            let name = key_of(&e.name).into_owned();
            if fs_core::maint::is_tmp_name(&name) {
                // A `jfs put` that has not finished (or was killed: `gc` removes it).
                continue;
            }
            let a = self.fs.getattr(e.ino).await?;
            if a.kind.is_special() {
                tracing::warn!(path = %show(&format!("{prefix}{name}")), kind = ?a.kind, "skipped: not a file, directory or symlink");
                continue;
            }
            let key = if a.kind == FileKind::Dir {
                format!("{prefix}{name}/")
            } else {
                format!("{prefix}{name}")
            };
            out.push((key, e.ino, a));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

struct VolumeSink {
    fs: Arc<Fs>,
    parent: Ino,
    tmp: String,
    name: String,
    ino: Ino,
    off: u64,
}

#[async_trait]
impl Sink for VolumeSink {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        self.fs.write(self.ino, self.off, &data).await?;
        self.off += data.len() as u64;
        Ok(())
    }
    async fn finish(self: Box<Self>, src: &Entry, perms: bool) -> Result<()> {
        // Owner-only while it is written (`sink`); its owner (with `--owners`) and mode now.
        // Without an owner restored, every copy is the volume's default owner, and setuid
        // and setgid are not carried either.
        let set = SetAttr {
            mtime: Some(src.mtime_ns),
            uid: src.owner.map(|o| o.0),
            gid: src.owner.map(|o| o.1),
            mode: Some(match (perms, src.mode) {
                (true, Some(m)) => super::copy_mode(m, src.owner.is_some()),
                // Never more open than the source (a 0600 file stays 0600), as `cp`.
                (false, Some(m)) => m & 0o755,
                (_, None) => 0o644,
            }),
            ..Default::default()
        };
        self.fs.setattr(self.ino, &set).await?;
        self.fs
            .rename(
                self.parent,
                &bytes_of(&self.tmp),
                self.parent,
                &bytes_of(&self.name),
                false,
            )
            .await?;
        Ok(())
    }
    async fn abort(self: Box<Self>) {
        let _ = self.fs.unlink_temp(self.parent, &bytes_of(&self.tmp)).await;
    }
}

#[async_trait]
impl Endpoint for VolumeEndpoint {
    fn describe(&self) -> String {
        format!("jfs://{}/{}", self.name, self.base)
    }

    async fn list(&self, l: Listing<'_>, tx: mpsc::Sender<Page>) -> Result<()> {
        match self.resolve_key(l.prefix).await {
            Ok((_, a)) if a.kind == FileKind::Dir => {}
            Ok(_) => bail!("{} is not a directory", self.describe()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        super::walk::walk(self, l, &tx).await
    }

    async fn list_level(&self, prefix: &str) -> Result<Vec<Entry>> {
        use super::walk::Tree;
        let mut level = self.level(prefix).await?;
        let mut out = Vec::new();
        while let Some(e) = self.next(&mut level).await? {
            out.push(e);
        }
        Ok(out)
    }

    async fn stat(&self, key: &str) -> Result<Option<Entry>> {
        match self.resolve_key(key).await {
            Ok((ino, a)) => {
                let target = if a.kind == FileKind::Symlink {
                    Some(key_of(&self.fs.readlink(ino).await?).into_owned())
                } else {
                    None
                };
                let k = if a.kind == FileKind::Dir && !key.ends_with('/') {
                    format!("{key}/")
                } else {
                    key.to_string()
                };
                Ok(Some(entry(k, &a, target)))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn read(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        let (ino, _) = self
            .resolve_key(key)
            .await
            .with_context(|| format!("reading {}", show(key)))?;
        let b = self.fs.read(ino, offset, len as usize).await?;
        if b.len() as u64 != len {
            bail!(
                "{}: got {} bytes at {offset}, expected {len} (file changed during the copy?)",
                show(key),
                b.len()
            );
        }
        Ok(Bytes::from(b))
    }

    async fn sink(&self, key: &str, _size: u64) -> Result<Box<dyn Sink>> {
        check_key(key)?;
        let (parent, name) = self.parent_dir(key, true).await?;
        // The same temporary name at every attempt: what an interrupted run left under it is
        // replaced here, and renamed into place by this attempt (never left behind).
        let tmp = super::temp_name(&name);
        let t = bytes_of(&tmp);
        let ino = match self.fs.create(parent, &t, 0o600, Owner::default()).await {
            Ok((ino, _)) => ino,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                self.fs.unlink_temp(parent, &t).await?;
                self.fs.create(parent, &t, 0o600, Owner::default()).await?.0
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Box::new(VolumeSink {
            fs: self.fs.clone(),
            parent,
            tmp,
            name,
            ino,
            off: 0,
        }))
    }

    async fn mkdir(&self, key: &str, src: &Entry, perms: bool) -> Result<()> {
        check_key(key)?;
        let (parent, name) = self.parent_dir(key, true).await?;
        let n = bytes_of(&name);
        let ino = match self
            .fs
            .mkdir(parent, &n, src.mode.unwrap_or(0o755), Owner::default())
            .await
        {
            Ok((ino, _)) => ino,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => self.fs.lookup(parent, &n).await?.0,
            Err(e) => return Err(e.into()),
        };
        if perms || src.owner.is_some() {
            self.fs
                .setattr(
                    ino,
                    &SetAttr {
                        mode: if perms { src.mode } else { None },
                        uid: src.owner.map(|o| o.0),
                        gid: src.owner.map(|o| o.1),
                        ..Default::default()
                    },
                )
                .await?;
        }
        Ok(())
    }

    async fn symlink(&self, key: &str, target: &str) -> Result<()> {
        check_key(key)?;
        let (parent, name) = self.parent_dir(key, true).await?;
        let n = bytes_of(&name);
        if self.fs.lookup(parent, &n).await.is_ok() {
            self.fs.unlink(parent, &n).await?;
        }
        self.fs
            .symlink(parent, &n, &bytes_of(target), Owner::default())
            .await?;
        Ok(())
    }

    fn places(&self) -> Vec<(String, fs_core::place::Place)> {
        let s = self.fs.settings();
        fs_core::place::volume_places(&s.uuid, &s.name, &s.storage, &self.base)
    }

    fn as_volume(&self) -> Option<&VolumeEndpoint> {
        Some(self)
    }

    async fn remove_empty_dir(&self, key: &str) -> Result<bool> {
        let Ok((parent, name)) = self.parent_dir(key, false).await else {
            return Ok(false);
        };
        match self.fs.rmdir(parent, &bytes_of(&name)).await {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::NotFound | ErrorKind::NotEmpty | ErrorKind::NotDir
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, key: &str, kind: Kind) -> Result<()> {
        let (parent, name) = match self.parent_dir(key, false).await {
            Ok(p) => p,
            Err(_) => return Ok(()),
        };
        let r = if kind == Kind::Dir {
            self.fs.rmdir(parent, &bytes_of(&name)).await
        } else {
            self.fs.unlink(parent, &bytes_of(&name)).await
        };
        match r {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// A volume is walked one directory at a time (children with their attributes).
#[async_trait]
impl super::walk::Tree for VolumeEndpoint {
    type Level = std::vec::IntoIter<(String, Ino, Attr)>;

    async fn level(&self, prefix: &str) -> Result<Self::Level> {
        let ino = match self.resolve_key(prefix).await {
            Ok((ino, a)) if a.kind == FileKind::Dir => ino,
            // Gone or replaced meanwhile: nothing under it any more.
            Ok(_) => return Ok(Vec::new().into_iter()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new().into_iter()),
            Err(e) => return Err(e.into()),
        };
        Ok(self.children(ino, prefix).await?.into_iter())
    }

    async fn next(&self, level: &mut Self::Level) -> Result<Option<Entry>> {
        let Some((key, ino, a)) = level.next() else {
            return Ok(None);
        };
        let target = if a.kind == FileKind::Symlink {
            Some(key_of(&self.fs.readlink(ino).await?).into_owned())
        } else {
            None
        };
        Ok(Some(entry(key, &a, target)))
    }
}
