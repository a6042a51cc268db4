//! Directories (snapshots taken at opendir), statfs, extended attributes and access checks.

use super::*;

impl Vfs {
    pub async fn opendir(&self, ino: Ino) -> VResult<u64> {
        self.fresh_gate().await?;
        let a = self.fs.getattr(ino).await.map_err(err)?;
        if a.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        let entries: Vec<DirEntry> = self.fs.readdir_all(ino).await.map_err(err)?;
        let mut v = Vec::with_capacity(entries.len() + 2);
        v.push((b".".to_vec(), ino, FileKind::Dir));
        let parent = if ino == fs_core::ROOT_INO {
            ino
        } else {
            a.parent
        };
        v.push((b"..".to_vec(), parent, FileKind::Dir));
        v.extend(entries.into_iter().map(|e| (e.name, e.ino, e.kind)));
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(v));
        Ok(fh)
    }

    /// Entries of a directory handle from position `offset`.
    pub fn dir_entries(&self, fh: u64) -> VResult<Arc<Vec<(Vec<u8>, Ino, FileKind)>>> {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    /// Attributes of directory `parent`'s entries for readdirplus, read in one engine call
    /// with the entries themselves; `None` for an entry gone or renamed since the directory
    /// was opened (the kernel caches what readdirplus names, so a stale name must not be
    /// handed out). Each entry handed to the kernel must then be counted as a lookup
    /// (`entry_sent`).
    pub async fn entry_attrs(
        &self,
        parent: Ino,
        entries: &[(&[u8], Ino)],
    ) -> VResult<Vec<Option<(Attr, u32)>>> {
        let now = self.fs.entries_now(parent, entries).await.map_err(err)?;
        let mut out = Vec::with_capacity(entries.len());
        for ((_, ino), a) in entries.iter().zip(now) {
            out.push(match a {
                None => None,
                Some(Some(a)) => {
                    let rdev = self.rdev_of(*ino, &a).await?;
                    Some((self.attr_of(*ino, a).await, rdev))
                }
                // Named, but its attributes gone (deleted at the primary while open here:
                // a pinned version): the one-by-one path knows which.
                Some(None) => match self.getattr(*ino).await {
                    Ok(x) => Some(x),
                    Err(libc::ENOENT) | Err(libc::ESTALE) => None,
                    Err(e) => return Err(e),
                },
            });
        }
        Ok(out)
    }

    /// The kernel took a readdirplus entry for `ino`: it counts as a lookup (a `forget` for it
    /// will come).
    pub fn entry_sent(&self, ino: Ino) {
        self.counted_lookup(ino);
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
    }

    pub async fn statfs(&self) -> VResult<fs_core::StatFs> {
        self.fs.statfs().await.map_err(err)
    }

    fn check_xattr_name(name: &[u8]) -> VResult<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(libc::ERANGE);
        }
        // ACLs and capabilities are not kept by the format.
        if name.starts_with(b"system.") || name.starts_with(b"security.") {
            return Err(libc::EOPNOTSUPP);
        }
        Ok(())
    }

    pub async fn getxattr(&self, ino: Ino, name: &[u8]) -> VResult<Vec<u8>> {
        Self::check_xattr_name(name).map_err(|e| {
            if e == libc::EOPNOTSUPP {
                libc::ENODATA
            } else {
                e
            }
        })?;
        self.fs.getxattr(ino, name).await.map_err(err)
    }

    pub async fn listxattr(&self, ino: Ino) -> VResult<Vec<u8>> {
        let names = self.fs.listxattr(ino).await.map_err(err)?;
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> VResult<()> {
        self.rw()?;
        Self::check_xattr_name(name)?;
        if value.len() > 65536 {
            return Err(libc::E2BIG);
        }
        if flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            let exists = match self.fs.getxattr(ino, name).await {
                Ok(_) => true,
                Err(e) if e.kind() == ErrorKind::NoData => false,
                Err(e) => return Err(err(e)),
            };
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(libc::ENODATA);
            }
        }
        self.fs.setxattr(ino, name, value).await.map_err(err)
    }

    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        Self::check_xattr_name(name).map_err(|e| {
            if e == libc::EOPNOTSUPP {
                libc::ENODATA
            } else {
                e
            }
        })?;
        self.fs.removexattr(ino, name).await.map_err(err)
    }

    /// access(2) for a caller (used only when the kernel asks; with default_permissions it
    /// checks modes itself).
    pub async fn access(&self, ino: Ino, mask: i32, uid: u32, gid: u32) -> VResult<()> {
        let a = self.fs.getattr(ino).await.map_err(err)?;
        if mask & libc::W_OK != 0 && self.cfg.read_only {
            return Err(libc::EROFS);
        }
        if mask == libc::F_OK {
            return Ok(());
        }
        let bits = if uid == 0 {
            let x = if mask & libc::X_OK != 0 && a.kind != FileKind::Dir && a.mode & 0o111 == 0 {
                0
            } else {
                1
            };
            0o6 | x
        } else if uid == a.uid {
            (a.mode >> 6) & 7
        } else if gid == a.gid {
            (a.mode >> 3) & 7
        } else {
            a.mode & 7
        };
        if (mask as u32) & !bits & 7 != 0 {
            Err(libc::EACCES)
        } else {
            Ok(())
        }
    }
}
