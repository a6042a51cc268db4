//! Namespace operations: lookup, create, link, unlink, rename, attributes, xattrs, readdir.
//!
//! Guard rule (see txn.rs): an operation that adds or removes entries of directory D writes
//! D's attributes (mtime/ctime, nlink), so two such operations on D always conflict, and an
//! emptiness check of D (a range scan) is protected by reading D's attributes.

mod attrs;
mod remove;

use crate::error::{invalid, not_found, Error, ErrorKind, Result};
use crate::fs::{
    check_name, get_attr, get_dir, lookup_entry, lossy, new_attr, prefetch_entry,
    prefetch_entry_and_inode, put_attr, transact, Fs,
};
use crate::journal::Op;
use crate::keys;
use crate::path::VolPath;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, FileKind, Ino, ROOT_INO};

/// The set-group-ID bit of a mode.
const SETGID: u32 = 0o2000;

/// Who creates a node. In a set-group-ID directory a mount's new node takes the directory's
/// group instead of `gid` (`Fs::set_setgid_inherit`).
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Default for Owner {
    fn default() -> Self {
        Owner { uid: 0, gid: 0 }
    }
}

fn touch_dir(a: &mut Attr, now: i64) {
    a.mtime = now;
    a.ctime = now;
}

impl Fs {
    pub async fn getattr(&self, ino: Ino) -> Result<Attr> {
        let mut tx = Txn::new(&*self.engine);
        get_attr(&mut tx, ino).await
    }

    /// For entries `(name, ino)` of directory `parent` (a listing's page, possibly read a
    /// while ago): whether the name still names that inode, and the inode's attributes, all
    /// in one engine call. `Some(None)`: the name still names it but its attributes are gone
    /// (a mirror applying a deletion); `None`: the name is gone or names another inode now.
    pub async fn entries_now(
        &self,
        parent: Ino,
        entries: &[(&[u8], Ino)],
    ) -> Result<Vec<Option<Option<Attr>>>> {
        let mut keys: Vec<Vec<u8>> = entries.iter().map(|(_, i)| keys::attr(*i)).collect();
        keys.extend(entries.iter().map(|(n, _)| keys::dentry(parent, n)));
        let mut values = self.engine.get_many(&keys).await?;
        let names = values.split_off(entries.len());
        entries
            .iter()
            .zip(values.into_iter().zip(names))
            .map(|((_, ino), (attr, name))| {
                if name.as_deref().and_then(keys::decode_dentry).map(|d| d.0) != Some(*ino) {
                    return Ok(None);
                }
                Ok(Some(
                    attr.map(|v| super::decode_attr(*ino, &v)).transpose()?,
                ))
            })
            .collect()
    }

    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        let mut tx = Txn::new(&*self.engine);
        // The name, the inode it names and the parent in one round trip to Redis or
        // PostgreSQL, read at one moment. Only a directory holds names, so a hit needs nothing
        // of the parent; a miss reads it to say why: gone, not a directory, or no such name.
        prefetch_entry_and_inode(&mut tx, parent, name, false).await?;
        let Some((ino, _)) = lookup_entry(&mut tx, parent, name).await? else {
            get_dir(&mut tx, parent).await?;
            return Err(not_found(format!("{:?} in inode {parent}", lossy(name))));
        };
        Ok((ino, get_attr(&mut tx, ino).await?))
    }

    /// Resolve a volume path ("/a/b"; "" or "/" is the root) inside the volume: `..` is taken
    /// lexically and never climbs above the root (`VolPath::parse`). Symlinks are not followed.
    pub async fn resolve(&self, path: &str) -> Result<(Ino, Attr)> {
        self.resolve_path(&VolPath::parse(path)?).await
    }

    /// Resolve a normalized volume path. Symlinks are not followed: every component but the
    /// last must be a directory.
    pub async fn resolve_path(&self, path: &VolPath) -> Result<(Ino, Attr)> {
        let mut ino = ROOT_INO;
        let mut attr = self.getattr(ROOT_INO).await?;
        for comp in path.parts() {
            if attr.kind != FileKind::Dir {
                return Err(Error::new(
                    ErrorKind::NotDir,
                    format!("{path}: a component is not a directory"),
                ));
            }
            let (i, a) = self.lookup(ino, comp.as_bytes()).await.map_err(|e| {
                if e.kind() == ErrorKind::NotFound {
                    not_found(path)
                } else {
                    e
                }
            })?;
            ino = i;
            attr = a;
        }
        Ok((ino, attr))
    }

    async fn create_node(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        owner: Owner,
        target: Option<&[u8]>,
        rdev: u32,
    ) -> Result<(Ino, Attr)> {
        check_name(name)?;
        let ino = self.alloc_inode().await?;
        let (attr, _) = transact!(self, |tx| {
            prefetch_entry(&mut tx, parent, name).await?;
            let mut pattr = get_dir(&mut tx, parent).await?;
            if lookup_entry(&mut tx, parent, name).await?.is_some() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{:?} already exists", lossy(name)),
                ));
            }
            // A set-group-ID directory gives its group to what is created in it, and its
            // set-group-ID bit to new directories (POSIX; the kernel leaves it to FUSE).
            let (gid, mode) = if self.setgid_inherit && pattr.mode & SETGID != 0 {
                let mode = if kind == FileKind::Dir {
                    mode | SETGID
                } else {
                    mode
                };
                (pattr.gid, mode)
            } else {
                (owner.gid, mode)
            };
            let now = now_ns();
            let mut attr = new_attr(kind, mode, owner.uid, gid, parent);
            attr.atime = now;
            attr.mtime = now;
            attr.ctime = now;
            if let Some(t) = target {
                attr.length = t.len() as u64;
                tx.put(keys::symlink(ino), t.to_vec());
            }
            if matches!(kind, FileKind::CharDev | FileKind::BlockDev) {
                tx.put(keys::rdev(ino), rdev.to_be_bytes().to_vec());
            }
            put_attr(&mut tx, ino, &attr);
            tx.put(keys::dentry(parent, name), keys::encode_dentry(ino, kind));
            touch_dir(&mut pattr, now);
            if kind == FileKind::Dir {
                pattr.nlink += 1;
            }
            put_attr(&mut tx, parent, &pattr);
            tx.add(keys::USED_INODES, 1);
            tx.set_op(match target {
                Some(t) => Op::Symlink {
                    parent,
                    name: lossy(name),
                    ino,
                    target: lossy(t),
                },
                None => Op::Mknod {
                    parent,
                    name: lossy(name),
                    ino,
                    kind,
                    mode: attr.mode,
                },
            });
            Ok::<_, Error>(attr)
        })?;
        Ok((ino, attr))
    }

    /// Create a regular file.
    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> Result<(Ino, Attr)> {
        self.create_node(parent, name, FileKind::File, mode, owner, None, 0)
            .await
    }

    /// Create a node of any kind but directory and symlink: a regular file, a fifo, a socket,
    /// or a device node with device number `rdev` (as `mknod(2)` encodes it).
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<(Ino, Attr)> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(invalid(
                "mknod makes files, fifos, sockets and device nodes",
            ));
        }
        self.create_node(parent, name, kind, mode, owner, None, rdev)
            .await
    }

    /// The device number of a device node (0 for every other kind).
    pub async fn rdev(&self, ino: Ino) -> Result<u32> {
        Ok(match self.engine.get(&keys::rdev(ino)).await? {
            Some(v) if v.len() == 4 => u32::from_be_bytes(v[..].try_into().unwrap()),
            Some(_) => {
                return Err(crate::error::corrupt(format!(
                    "device number of inode {ino} does not decode"
                )))
            }
            None => 0,
        })
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> Result<(Ino, Attr)> {
        self.create_node(parent, name, FileKind::Dir, mode, owner, None, 0)
            .await
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<(Ino, Attr)> {
        if target.is_empty() || target.len() > 4096 || target.contains(&0) {
            return Err(invalid("symlink target must be 1..4096 bytes without NUL"));
        }
        self.create_node(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            owner,
            Some(target),
            0,
        )
        .await
    }

    pub async fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let mut tx = Txn::new(&*self.engine);
        let a = get_attr(&mut tx, ino).await?;
        if a.kind != FileKind::Symlink {
            return Err(invalid(format!("inode {ino} is not a symlink")));
        }
        tx.get(&keys::symlink(ino))
            .await?
            .ok_or_else(|| crate::error::corrupt(format!("symlink {ino} has no target")))
    }

    pub async fn link(&self, ino: Ino, new_parent: Ino, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let (attr, _) = transact!(self, |tx| {
            let mut attr = get_attr(&mut tx, ino).await?;
            if attr.kind == FileKind::Dir {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    "hard links to directories are not allowed",
                ));
            }
            let mut pattr = get_dir(&mut tx, new_parent).await?;
            if lookup_entry(&mut tx, new_parent, name).await?.is_some() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{:?} already exists", lossy(name)),
                ));
            }
            let now = now_ns();
            attr.nlink += 1;
            attr.ctime = now;
            put_attr(&mut tx, ino, &attr);
            tx.put(
                keys::dentry(new_parent, name),
                keys::encode_dentry(ino, attr.kind),
            );
            touch_dir(&mut pattr, now);
            put_attr(&mut tx, new_parent, &pattr);
            tx.set_op(Op::Link {
                ino,
                parent: new_parent,
                name: lossy(name),
            });
            Ok::<_, Error>(attr)
        })?;
        Ok(attr)
    }

    /// Drop one link of a non-directory inode. When it was the last: if this process has the
    /// file open (see `Keeper`), the inode is *kept* (`O<ino>` names the session) until its
    /// last close; otherwise it is deleted and its slices go to the pending-delete set.
    /// Returns whether the inode was freed.
    /// With the trash on, the last link's inode goes to the trash instead (`from` says where
    /// it was and why), whether open or not: it keeps every record, so open handles go on.
    pub(crate) async fn drop_link(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        mut attr: Attr,
        now: i64,
        from: crate::fs::trash::From<'_>,
    ) -> Result<bool> {
        attr.nlink = attr.nlink.saturating_sub(1);
        attr.ctime = now;
        if attr.nlink > 0 {
            put_attr(tx, ino, &attr);
            return Ok(false);
        }
        if from.force || (!from.never && self.trash_on()) {
            self.trash_inode(tx, ino, &attr, from, now);
            return Ok(false);
        }
        if let Some(k) = self.keeper.as_ref().filter(|k| k.is_open(ino)) {
            put_attr(tx, ino, &attr);
            tx.put(keys::kept(ino), k.session().as_bytes().to_vec());
            return Ok(false);
        }
        self.free_inode(tx, ino, &attr).await?;
        Ok(true)
    }

    /// Delete an inode without links: its chunks (slices to pending deletes), xattrs, target,
    /// device number and attributes.
    pub(crate) async fn free_inode(&self, tx: &mut Txn<'_>, ino: Ino, attr: &Attr) -> Result<()> {
        if attr.kind == FileKind::File {
            self.free_file_chunks(tx, ino, attr.length).await?;
        } else {
            self.free_chunks_from(tx, ino, 0).await?;
        }
        delete_xattrs_and_attr(tx, ino).await?;
        match attr.kind {
            FileKind::Symlink => tx.delete(keys::symlink(ino)),
            FileKind::CharDev | FileKind::BlockDev => tx.delete(keys::rdev(ino)),
            FileKind::File => tx.add(keys::USED_SPACE, -(attr.length as i64)),
            _ => {}
        }
        tx.add(keys::USED_INODES, -1);
        Ok(())
    }

    /// Free a kept inode (unlinked while open) at its last close, or when the session that
    /// held it is gone. Returns false when `ino` is not kept (already released: releasing
    /// twice is harmless).
    pub async fn release_kept(&self, ino: Ino) -> Result<bool> {
        let (freed, _) = transact!(self, |tx| {
            if tx.get(&keys::kept(ino)).await?.is_none() {
                return Ok(false);
            }
            tx.delete(keys::kept(ino));
            match tx.get(&keys::attr(ino)).await? {
                Some(v) => {
                    let attr = super::decode_attr(ino, &v)?;
                    if attr.nlink == 0 {
                        self.free_inode(&mut tx, ino, &attr).await?;
                    }
                }
                None => {}
            }
            tx.set_op(Op::Release { ino });
            Ok::<_, Error>(true)
        })?;
        Ok(freed)
    }

    /// Inodes kept open after their last unlink, with the session holding each.
    pub async fn kept_inodes(&self) -> Result<Vec<(Ino, String)>> {
        let mut out = Vec::new();
        crate::engine::scan_all(
            &*self.engine,
            keys::KEPT_PREFIX,
            &keys::prefix_end(keys::KEPT_PREFIX),
            1024,
            |page| {
                for (k, v) in page {
                    if let keys::Key::Kept(ino) = keys::parse(&k) {
                        out.push((ino, String::from_utf8_lossy(&v).into_owned()));
                    }
                }
                Ok(())
            },
        )
        .await?;
        Ok(out)
    }
}

/// Delete every extended attribute of `ino`, and its attributes.
pub(crate) async fn delete_xattrs_and_attr(tx: &mut Txn<'_>, ino: Ino) -> Result<()> {
    let prefix = keys::xattr_prefix(ino);
    for (k, _) in tx
        .scan(&prefix, &keys::prefix_end(&prefix), usize::MAX)
        .await?
    {
        tx.delete(k);
    }
    tx.delete(keys::attr(ino));
    Ok(())
}
