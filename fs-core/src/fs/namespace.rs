//! Namespace operations: lookup, create, link, unlink, rename, attributes, xattrs, readdir.
//!
//! Guard rule (see txn.rs): an operation that adds or removes entries of directory D writes
//! D's attributes (mtime/ctime, nlink), so two such operations on D always conflict, and an
//! emptiness check of D (a range scan) is protected by reading D's attributes.

use super::{check_name, get_attr, get_dir, lookup_entry, lossy, new_attr, put_attr, transact, Fs};
use crate::error::{invalid, not_found, Error, ErrorKind, Result};
use crate::journal::Op;
use crate::keys;
use crate::path::VolPath;
use crate::txn::Txn;
use crate::types::{now_ns, Attr, DirEntry, FileKind, Ino, SetAttr, StatFs, ROOT_INO};

/// Who creates a node and with what permissions.
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

    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        let mut tx = Txn::new(&*self.engine);
        get_dir(&mut tx, parent).await?;
        let (ino, _) = lookup_entry(&mut tx, parent, name)
            .await?
            .ok_or_else(|| not_found(format!("{:?} in inode {parent}", lossy(name))))?;
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
            let mut pattr = get_dir(&mut tx, parent).await?;
            if lookup_entry(&mut tx, parent, name).await?.is_some() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{:?} already exists", lossy(name)),
                ));
            }
            let now = now_ns();
            let mut attr = new_attr(kind, mode, owner.uid, owner.gid, parent);
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
    async fn drop_link(
        &self,
        tx: &mut Txn<'_>,
        ino: Ino,
        mut attr: Attr,
        now: i64,
    ) -> Result<bool> {
        attr.nlink = attr.nlink.saturating_sub(1);
        attr.ctime = now;
        if attr.nlink > 0 {
            put_attr(tx, ino, &attr);
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
    async fn free_inode(&self, tx: &mut Txn<'_>, ino: Ino, attr: &Attr) -> Result<()> {
        self.free_chunks_from(tx, ino, 0).await?;
        for (k, _) in tx
            .scan(
                &keys::xattr_prefix(ino),
                &keys::prefix_end(&keys::xattr_prefix(ino)),
                usize::MAX,
            )
            .await?
        {
            tx.delete(k);
        }
        tx.delete(keys::attr(ino));
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

    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        transact!(self, |tx| {
            let mut pattr = get_dir(&mut tx, parent).await?;
            let (ino, kind) = lookup_entry(&mut tx, parent, name)
                .await?
                .ok_or_else(|| not_found(format!("{:?}", lossy(name))))?;
            if kind == FileKind::Dir {
                return Err(Error::new(
                    ErrorKind::IsDir,
                    format!("{:?} is a directory", lossy(name)),
                ));
            }
            let attr = get_attr(&mut tx, ino).await?;
            let now = now_ns();
            tx.delete(keys::dentry(parent, name));
            touch_dir(&mut pattr, now);
            put_attr(&mut tx, parent, &pattr);
            let freed = self.drop_link(&mut tx, ino, attr, now).await?;
            tx.set_op(Op::Unlink {
                parent,
                name: lossy(name),
                ino,
                freed,
            });
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

    async fn check_empty_dir(tx: &mut Txn<'_>, ino: Ino) -> Result<()> {
        let p = keys::dentry_prefix(ino);
        if !tx.scan(&p, &keys::prefix_end(&p), 1).await?.is_empty() {
            return Err(Error::new(
                ErrorKind::NotEmpty,
                format!("directory inode {ino} is not empty"),
            ));
        }
        Ok(())
    }

    async fn remove_dir_inode(tx: &mut Txn<'_>, ino: Ino) -> Result<()> {
        for (k, _) in tx
            .scan(
                &keys::xattr_prefix(ino),
                &keys::prefix_end(&keys::xattr_prefix(ino)),
                usize::MAX,
            )
            .await?
        {
            tx.delete(k);
        }
        tx.delete(keys::attr(ino));
        tx.add(keys::USED_INODES, -1);
        Ok(())
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        transact!(self, |tx| {
            let mut pattr = get_dir(&mut tx, parent).await?;
            let (ino, kind) = lookup_entry(&mut tx, parent, name)
                .await?
                .ok_or_else(|| not_found(format!("{:?}", lossy(name))))?;
            if kind != FileKind::Dir {
                return Err(Error::new(
                    ErrorKind::NotDir,
                    format!("{:?} is not a directory", lossy(name)),
                ));
            }
            get_attr(&mut tx, ino).await?; // guard for the emptiness scan
            Self::check_empty_dir(&mut tx, ino).await?;
            Self::remove_dir_inode(&mut tx, ino).await?;
            tx.delete(keys::dentry(parent, name));
            touch_dir(&mut pattr, now_ns());
            pattr.nlink = pattr.nlink.saturating_sub(1);
            put_attr(&mut tx, parent, &pattr);
            tx.set_op(Op::Rmdir {
                parent,
                name: lossy(name),
                ino,
            });
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

    /// Rename `parent/name` to `new_parent/new_name`, replacing a compatible target unless
    /// `no_replace`. A directory cannot move into its own subtree.
    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        no_replace: bool,
    ) -> Result<()> {
        check_name(new_name)?;
        if parent == new_parent && name == new_name {
            return self.lookup(parent, name).await.map(|_| ());
        }
        transact!(self, |tx| {
            let mut pattr = get_dir(&mut tx, parent).await?;
            let mut npattr = if new_parent == parent {
                None
            } else {
                Some(get_dir(&mut tx, new_parent).await?)
            };
            let (ino, kind) = lookup_entry(&mut tx, parent, name)
                .await?
                .ok_or_else(|| not_found(format!("{:?}", lossy(name))))?;
            let mut attr = get_attr(&mut tx, ino).await?;
            if kind == FileKind::Dir && new_parent != parent {
                // Walk up from the new parent; meeting `ino` means a move into its own subtree.
                let mut cur = new_parent;
                let mut hops = 0u32;
                while cur != ROOT_INO {
                    if cur == ino {
                        return Err(invalid("cannot move a directory into its own subtree"));
                    }
                    cur = get_attr(&mut tx, cur).await?.parent;
                    hops += 1;
                    if hops > 100_000 {
                        return Err(crate::error::corrupt(
                            "directory parent chain does not reach the root",
                        ));
                    }
                }
            }
            let now = now_ns();
            let mut replaced = None;
            if let Some((tino, tkind)) = lookup_entry(&mut tx, new_parent, new_name).await? {
                if tino == ino {
                    // Two links to the same inode: POSIX says do nothing.
                    return Ok(());
                }
                if no_replace {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{:?} already exists", lossy(new_name)),
                    ));
                }
                let tattr = get_attr(&mut tx, tino).await?;
                match (kind == FileKind::Dir, tkind == FileKind::Dir) {
                    (true, true) => {
                        Self::check_empty_dir(&mut tx, tino).await?;
                        Self::remove_dir_inode(&mut tx, tino).await?;
                        let target_parent = npattr.as_mut().unwrap_or(&mut pattr);
                        target_parent.nlink = target_parent.nlink.saturating_sub(1);
                    }
                    (true, false) => {
                        return Err(Error::new(
                            ErrorKind::NotDir,
                            format!("{:?} is not a directory", lossy(new_name)),
                        ))
                    }
                    (false, true) => {
                        return Err(Error::new(
                            ErrorKind::IsDir,
                            format!("{:?} is a directory", lossy(new_name)),
                        ))
                    }
                    (false, false) => {
                        self.drop_link(&mut tx, tino, tattr, now).await?;
                    }
                }
                replaced = Some(tino);
            }
            tx.delete(keys::dentry(parent, name));
            tx.put(
                keys::dentry(new_parent, new_name),
                keys::encode_dentry(ino, kind),
            );
            if kind == FileKind::Dir || attr.parent == parent {
                attr.parent = new_parent;
            }
            attr.ctime = now;
            put_attr(&mut tx, ino, &attr);
            touch_dir(&mut pattr, now);
            if let Some(np) = npattr.as_mut() {
                touch_dir(np, now);
                if kind == FileKind::Dir {
                    pattr.nlink = pattr.nlink.saturating_sub(1);
                    np.nlink += 1;
                }
                put_attr(&mut tx, new_parent, np);
            }
            put_attr(&mut tx, parent, &pattr);
            tx.set_op(Op::Rename {
                parent,
                name: lossy(name),
                new_parent,
                new_name: lossy(new_name),
                ino,
                replaced,
            });
            Ok::<_, Error>(())
        })?;
        Ok(())
    }

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
}
