//! Attributes, directory listings, extended attributes, and the path of an inode.

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::fs::{get_attr, get_dir, lossy, put_attr, transact, Fs};
use crate::journal::Op;
use crate::keys;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, DirEntry, FileKind, Ino, SetAttr, StatFs, ROOT_INO};
use std::collections::{HashMap, HashSet};

impl Fs {
    pub async fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if let Some(len) = set.length {
            if len > crate::types::MAX_FILE_LEN {
                return Err(invalid(format!(
                    "length {len} is over the {} limit",
                    crate::types::MAX_FILE_LEN
                )));
            }
        }
        let (attr, _) = transact!(self, |tx| {
            let mut attr = get_attr(&mut tx, ino).await?;
            let now = now_ns();
            if let Some(m) = set.mode {
                attr.mode = m & 0o7777;
            }
            if let Some(u) = set.uid {
                attr.uid = u;
            }
            if let Some(g) = set.gid {
                attr.gid = g;
            }
            if let Some(t) = set.atime {
                attr.atime = t;
            }
            if let Some(t) = set.mtime {
                attr.mtime = t;
            }
            if let Some(len) = set.length {
                match attr.kind {
                    FileKind::File => self.truncate_in(&mut tx, ino, &mut attr, len).await?,
                    FileKind::Dir => {
                        return Err(Error::new(
                            ErrorKind::IsDir,
                            format!("inode {ino} is a directory"),
                        ))
                    }
                    _ => {
                        return Err(invalid(format!(
                            "inode {ino} is not a regular file ({:?})",
                            attr.kind
                        )))
                    }
                }
                if set.mtime.is_none() {
                    attr.mtime = now;
                }
            }
            attr.ctime = now;
            put_attr(&mut tx, ino, &attr);
            tx.set_op(Op::SetAttr {
                ino,
                set: set.clone(),
            });
            Ok::<_, Error>(attr)
        })?;
        Ok(attr)
    }

    /// One page of a directory: entries with names after `after`, at most `limit`, in name order.
    pub async fn readdir(
        &self,
        ino: Ino,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        let mut tx = Txn::new(&*self.engine);
        get_dir(&mut tx, ino).await?;
        let prefix = keys::dentry_prefix(ino);
        let start = match after {
            Some(n) => {
                let mut k = keys::dentry(ino, n);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let page = self
            .engine
            .scan(&start, &keys::prefix_end(&prefix), limit)
            .await?;
        page.into_iter()
            .map(|(k, v)| {
                let name = k[prefix.len()..].to_vec();
                // A name no file could have (`..`, `/` inside, empty) is damage, never
                // handed to a caller who would join it to a local path.
                crate::fs::check_name(&name).map_err(|e| {
                    crate::error::corrupt(format!(
                        "directory inode {ino} holds an entry that is not a file name ({}): the metadata is damaged; run jfs fsck",
                        e.message()
                    ))
                })?;
                let (ino, kind) = keys::decode_dentry(&v).ok_or_else(|| {
                    crate::error::corrupt(format!(
                        "directory entry {:?} does not decode",
                        lossy(&name)
                    ))
                })?;
                Ok(DirEntry { name, ino, kind })
            })
            .collect()
    }

    /// All entries of a directory (pages through `readdir`).
    pub async fn readdir_all(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        let mut out: Vec<DirEntry> = Vec::new();
        loop {
            let page = self
                .readdir(ino, out.last().map(|e| e.name.as_slice()), 1000)
                .await?;
            let n = page.len();
            out.extend(page);
            if n < 1000 {
                return Ok(out);
            }
        }
    }

    pub async fn statfs(&self) -> Result<StatFs> {
        let vals = self
            .engine
            .get_many(&[keys::USED_SPACE.to_vec(), keys::USED_INODES.to_vec()])
            .await?;
        Ok(StatFs {
            capacity: self.settings.capacity,
            used_space: crate::journal::parse_counter(vals[0].as_deref())?.max(0) as u64,
            used_inodes: crate::journal::parse_counter(vals[1].as_deref())?.max(0) as u64,
        })
    }

    pub async fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let mut tx = Txn::new(&*self.engine);
        get_attr(&mut tx, ino).await?;
        tx.get(&keys::xattr(ino, name)).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NoData,
                format!("no xattr {:?} on inode {ino}", lossy(name)),
            )
        })
    }

    pub async fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let p = keys::xattr_prefix(ino);
        let mut tx = Txn::new(&*self.engine);
        get_attr(&mut tx, ino).await?;
        Ok(tx
            .scan(&p, &keys::prefix_end(&p), usize::MAX)
            .await?
            .into_iter()
            .map(|(k, _)| k[p.len()..].to_vec())
            .collect())
    }

    pub async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > 255 || value.len() > 64 << 10 {
            return Err(invalid(
                "xattr names are 1..255 bytes and values at most 64 KiB",
            ));
        }
        transact!(self, |tx| {
            let mut attr = get_attr(&mut tx, ino).await?;
            attr.ctime = now_ns();
            put_attr(&mut tx, ino, &attr);
            tx.put(keys::xattr(ino, name), value.to_vec());
            tx.set_op(Op::SetXattr {
                ino,
                name: lossy(name),
            });
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        transact!(self, |tx| {
            let mut attr = get_attr(&mut tx, ino).await?;
            if tx.get(&keys::xattr(ino, name)).await?.is_none() {
                return Err(Error::new(
                    ErrorKind::NoData,
                    format!("no xattr {:?} on inode {ino}", lossy(name)),
                ));
            }
            attr.ctime = now_ns();
            put_attr(&mut tx, ino, &attr);
            tx.delete(keys::xattr(ino, name));
            tx.set_op(Op::RemoveXattr {
                ino,
                name: lossy(name),
            });
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

    /// A path for `ino` for messages (fsck): walks parents, finds the name by scanning the
    /// parent's entries. Hard-linked files report their first parent's name.
    pub async fn path_of(&self, ino: Ino) -> Result<String> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO && parts.len() < 4096 {
            let parent = self.getattr(cur).await?.parent;
            let name = self
                .readdir_all(parent)
                .await?
                .into_iter()
                .find(|e| e.ino == cur)
                .map(|e| lossy(&e.name))
                .unwrap_or_else(|| format!("<inode {cur}>"));
            parts.push(name);
            cur = parent;
        }
        parts.reverse();
        Ok(format!("/{}", parts.join("/")))
    }

    /// The path of `ino` as the bytes of its names (a mount's log lines quote them), walking
    /// at most `max_depth` parents. None when it cannot be told: an unlinked file (held open),
    /// a name gone from its parent (renamed meanwhile), a deeper tree, a failed read. A
    /// hard-linked file gets one of its names.
    pub async fn path_bytes_of(&self, ino: Ino, max_depth: usize) -> Option<Vec<u8>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            if parts.len() >= max_depth {
                return None;
            }
            let a = self.getattr(cur).await.ok()?;
            if a.nlink == 0 {
                return None;
            }
            let name = self
                .readdir_all(a.parent)
                .await
                .ok()?
                .into_iter()
                .find(|e| e.ino == cur && e.name != b"." && e.name != b"..")?
                .name;
            parts.push(name);
            cur = a.parent;
        }
        let mut out = Vec::new();
        for p in parts.iter().rev() {
            out.push(b'/');
            out.extend_from_slice(p);
        }
        if out.is_empty() {
            out.push(b'/');
        }
        Some(out)
    }

    /// `path_of` for many inodes at once: each parent directory is listed once however many
    /// of the inodes it holds (fsck's report of a lost store names every file of a large
    /// directory). An inode whose path cannot be read is named `<inode N>`.
    pub async fn paths_of(&self, inos: &[Ino]) -> HashMap<Ino, String> {
        let mut by_parent: HashMap<Ino, HashSet<Ino>> = HashMap::new();
        let mut out = HashMap::new();
        let mut seen = HashSet::new();
        for &ino in inos {
            if !seen.insert(ino) {
                continue;
            }
            match self.getattr(ino).await {
                Ok(a) if ino != ROOT_INO => {
                    by_parent.entry(a.parent).or_default().insert(ino);
                }
                Ok(_) => {
                    out.insert(ino, "/".to_string());
                }
                Err(_) => {
                    out.insert(ino, format!("<inode {ino}>"));
                }
            }
        }
        for (parent, wanted) in by_parent {
            let dir = self
                .path_of(parent)
                .await
                .unwrap_or_else(|_| format!("<inode {parent}>"));
            let mut names: HashMap<Ino, String> = HashMap::new();
            if let Ok(listed) = self.readdir_all(parent).await {
                for e in listed {
                    if wanted.contains(&e.ino) {
                        names.entry(e.ino).or_insert_with(|| lossy(&e.name));
                    }
                }
            }
            for ino in wanted {
                let name = names
                    .remove(&ino)
                    .unwrap_or_else(|| format!("<inode {ino}>"));
                let sep = if dir.ends_with('/') { "" } else { "/" };
                out.insert(ino, format!("{dir}{sep}{name}"));
            }
        }
        out
    }
}
