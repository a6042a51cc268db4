//! Conversions between fuser's types and the volume's, and the reply helpers every request
//! handler uses.

use super::{FuseFs, Ttls};
use crate::vfs::VResult;
use fs_core::{Attr, FileKind, Ino};
use fuser::{
    Errno, FileAttr, FileType, Generation, INodeNo, ReplyAttr, ReplyEmpty, ReplyEntry, ReplyXattr,
    TimeOrNow,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The FUSE inode number of a volume inode (the root is 1 in both).
pub(super) fn ino(i: INodeNo) -> Ino {
    i.0
}

pub(super) fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(super) fn ns_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

pub(super) fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// A cheap copy of what a task needs to build replies.
#[derive(Clone)]
pub(super) struct Out {
    pub(super) ttl: Ttls,
    pub(super) blksize: u32,
}

impl Out {
    pub(super) fn of(f: &FuseFs) -> Out {
        Out {
            ttl: f.ttl.clone(),
            blksize: f.blksize,
        }
    }
}

pub(super) fn to_attr(blksize: u32, i: Ino, a: &Attr, rdev: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(i),
        size: a.length,
        blocks: a.length.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev,
        blksize,
        flags: 0,
    }
}

pub(super) fn entry_reply(o: &Out, r: ReplyEntry, res: VResult<(Ino, Attr, u32)>) {
    match res {
        Ok((i, a, rdev)) => {
            let ettl = if a.kind == FileKind::Dir {
                o.ttl.dir_entry
            } else {
                o.ttl.entry
            };
            r.entry_with_ttls(
                &o.ttl.attr,
                &ettl,
                &to_attr(o.blksize, i, &a, rdev),
                Generation(0),
            )
        }
        Err(e) => r.error(Errno::from_i32(e)),
    }
}

pub(super) fn attr_reply(o: &Out, r: ReplyAttr, i: Ino, res: VResult<(Attr, u32)>) {
    match res {
        Ok((a, rdev)) => r.attr(&o.ttl.attr, &to_attr(o.blksize, i, &a, rdev)),
        Err(e) => r.error(Errno::from_i32(e)),
    }
}

pub(super) fn empty_reply(r: ReplyEmpty, res: VResult<()>) {
    match res {
        Ok(()) => r.ok(),
        Err(e) => r.error(Errno::from_i32(e)),
    }
}

pub(super) fn name_of(n: &OsStr) -> Vec<u8> {
    n.as_bytes().to_vec()
}

pub(super) fn time_ns(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::SpecificTime(t) => ns_of(t),
        TimeOrNow::Now => fs_core::now_ns(),
    }
}

pub(super) fn xattr_reply(reply: ReplyXattr, size: u32, r: VResult<Vec<u8>>) {
    match r {
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}
