//! Removing names: unlink, rmdir and rename (which may replace, and so remove, a name).
//! The guard rule of the parent module holds: every operation writes the attributes of
//! each directory whose entries it changes.

use super::touch_dir;
use crate::engine::Follow;
use crate::error::{invalid, not_found, Error, ErrorKind, Result};
use crate::fs::trash::{self, Why};
use crate::fs::{
    check_name, get_attr, get_dir, lookup_entry, lossy, prefetch_entry_and_inode, put_attr,
    transact, Fs,
};
use crate::journal::Op;
use crate::keys;
use crate::txn::Txn;
use crate::types::{now_ns, FileKind, Ino, ROOT_INO};

impl Fs {
    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.unlink_as(parent, name, false).await
    }

    /// Unlink the temporary file of an unfinished copy (a failed or killed `jfs put` or
    /// `jfs-sync`, found by `gc`): freed at once, never kept in the trash (it is nobody's
    /// data, and a day of it per failed copy of a checkpoint is space nobody asked for).
    pub async fn unlink_temp(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.unlink_as(parent, name, true).await
    }

    async fn unlink_as(&self, parent: Ino, name: &[u8], temp: bool) -> Result<()> {
        transact!(self, |tx| {
            // The parent, the name, the inode and its first chunk in one call: a file of up
            // to one chunk that goes needs nothing more to be freed (`free_file_chunks`).
            prefetch_entry_and_inode(&mut tx, parent, name, true).await?;
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
            let from = trash::From {
                never: temp,
                ..trash::From::new(parent, name, Why::Deleted).dir_mtime(pattr.mtime)
            };
            tx.delete(keys::dentry(parent, name));
            touch_dir(&mut pattr, now);
            put_attr(&mut tx, parent, &pattr);
            let freed = self.drop_link(&mut tx, ino, attr, now, from).await?;
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
        super::delete_xattrs_and_attr(tx, ino).await?;
        tx.add(keys::USED_INODES, -1);
        Ok(())
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        transact!(self, |tx| {
            prefetch_entry_and_inode(&mut tx, parent, name, false).await?;
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
            let attr = get_attr(&mut tx, ino).await?; // guard for the emptiness scan
            Self::check_empty_dir(&mut tx, ino).await?;
            let now = now_ns();
            if self.trash_on() {
                // Kept with its own record: what was deleted inside it points at it.
                let from = trash::From::new(parent, name, Why::Deleted).dir_mtime(pattr.mtime);
                self.trash_inode(&mut tx, ino, &attr, from, now);
            } else {
                Self::remove_dir_inode(&mut tx, ino).await?;
            }
            tx.delete(keys::dentry(parent, name));
            touch_dir(&mut pattr, now);
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
            // Both parents, both names and the inode that moves in one round trip.
            tx.prefetch_via(
                &[
                    keys::dentry(parent, name),
                    keys::attr(parent),
                    keys::attr(new_parent),
                    keys::dentry(new_parent, new_name),
                ],
                Follow {
                    prefix: keys::INODE_PREFIX,
                    suffixes: &[keys::ATTR_SUFFIX.to_vec()],
                    range: (&[], &[], 0),
                },
            )
            .await?;
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
                        if self.trash_on() {
                            let from = trash::From::new(new_parent, new_name, Why::Deleted);
                            self.trash_inode(&mut tx, tino, &tattr, from, now);
                        } else {
                            Self::remove_dir_inode(&mut tx, tino).await?;
                        }
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
                        let from = trash::From::new(new_parent, new_name, Why::Overwritten);
                        self.drop_link(&mut tx, tino, tattr, now, from).await?;
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
}
