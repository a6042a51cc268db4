//! Namespace operations of the mount: creating, linking, removing and renaming names, and
//! setting attributes (a length change commits the file's buffered writes first).

use super::*;

impl Vfs {
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr, u32)> {
        self.rw()?;
        check_name(name)?;
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            libc::S_IFDIR => return Err(libc::EINVAL),
            _ => return Err(libc::EINVAL),
        };
        let owner = Owner { uid, gid };
        let (ino, a) = self
            .fs
            .mknod(parent, name, kind, mode & 0o7777, rdev, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a, rdev))
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr)> {
        self.rw()?;
        check_name(name)?;
        // A set-group-ID parent's group (and bit, for a directory) is given by `Fs`.
        let owner = Owner { uid, gid };
        let mode = mode & 0o7777;
        let (ino, a) = self
            .fs
            .mkdir(parent, name, mode, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a))
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr)> {
        self.rw()?;
        check_name(name)?;
        if target.len() > 4095 {
            return Err(libc::ENAMETOOLONG);
        }
        let owner = Owner { uid, gid };
        let (ino, a) = self
            .fs
            .symlink(parent, name, target, owner)
            .await
            .map_err(err)?;
        self.counted_lookup(ino);
        Ok((ino, a))
    }

    pub async fn readlink(&self, ino: Ino) -> VResult<Vec<u8>> {
        self.fs.readlink(ino).await.map_err(err)
    }

    pub async fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> VResult<(Attr, u32)> {
        self.rw()?;
        check_name(name)?;
        let a = self.fs.link(ino, parent, name).await.map_err(|e| {
            if e.kind() == ErrorKind::IsDir {
                libc::EPERM
            } else {
                err(e)
            }
        })?;
        let rdev = self.rdev_of(ino, &a).await?;
        let a = self.attr_of(ino, a).await;
        self.counted_lookup(ino);
        Ok((a, rdev))
    }

    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        self.fs.unlink(parent, name).await.map_err(err)
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        if name == b"." {
            return Err(libc::EINVAL);
        }
        if name == b".." {
            return Err(libc::ENOTEMPTY);
        }
        self.fs.rmdir(parent, name).await.map_err(err)
    }

    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> VResult<()> {
        self.rw()?;
        check_name(name)?;
        check_name(new_name)?;
        if flags & !libc::RENAME_NOREPLACE != 0 {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported by the format.
            return Err(libc::EINVAL);
        }
        self.fs
            .rename(
                parent,
                name,
                new_parent,
                new_name,
                flags & libc::RENAME_NOREPLACE != 0,
            )
            .await
            .map_err(err)
    }

    pub async fn setattr(&self, ino: Ino, set: SetAttr) -> VResult<(Attr, u32)> {
        self.rw()?;
        // Writes still buffered are committed before a time is set: their commit stamps
        // the time of the write, and must not land after an explicit `futimens` (`cp -a`,
        // `rsync -t` and `tar` set the mtime before they close).
        if set.mtime.is_some() && set.length.is_none() {
            self.flush_ino(ino).await?;
        }
        if let Some(len) = set.length {
            self.flush_ino(ino).await?;
            if let Some(n) = self.open.get(ino) {
                n.writer.lock().await.truncated(len);
            }
        }
        let a = self.fs.setattr(ino, &set).await.map_err(|e| {
            if e.kind() == ErrorKind::InvalidArgument && set.length.is_some() {
                if set.length.unwrap_or(0) > fs_core::MAX_FILE_LEN {
                    libc::EFBIG
                } else {
                    libc::EINVAL
                }
            } else {
                err(e)
            }
        })?;
        if set.length.is_some() {
            if let Some(n) = self.open.get(ino) {
                n.gen.fetch_add(1, Ordering::SeqCst);
            }
        }
        let rdev = self.rdev_of(ino, &a).await?;
        Ok((self.attr_of(ino, a).await, rdev))
    }
}
