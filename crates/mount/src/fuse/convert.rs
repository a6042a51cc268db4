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

/// Nanoseconds since the epoch of a time in a request (setattr), or None for a time a volume
/// cannot hold (before 1677-09-21 or after 2262-04-11, the range of i64 nanoseconds): such a
/// time is refused, never wrapped.
///
/// fuser 0.18 decodes the kernel's `(secs, nsec)` before the epoch as `EPOCH - (|secs| s +
/// nsec ns)`, where the kernel means `secs s + nsec ns` (`-2 s + 0.5 s` is -1.5 s, not
/// -2.5 s): touch -d 1969-12-31T23:59:59.5 through the mount was stored a second early. The
/// seconds and nanoseconds are taken back apart and put together the kernel's way.
pub(super) fn request_ns(t: SystemTime) -> Option<i64> {
    let ns: i128 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => {
            let d = e.duration();
            -(d.as_secs() as i128) * 1_000_000_000 + d.subsec_nanos() as i128
        }
    };
    i64::try_from(ns).ok()
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

pub(super) fn time_ns(t: TimeOrNow) -> Option<i64> {
    match t {
        TimeOrNow::SpecificTime(t) => request_ns(t),
        TimeOrNow::Now => Some(fs_core::now_ns()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What fuser 0.18 hands over for the kernel's `(secs, nsec)`.
    fn as_fuser_decodes(secs: i64, nsec: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nsec)
        } else {
            UNIX_EPOCH - Duration::new((-secs) as u64, nsec)
        }
    }

    #[test]
    fn request_times_keep_every_storable_time_and_refuse_the_rest() {
        let check = |secs: i64, nsec: u32, want: Option<i64>| {
            assert_eq!(
                request_ns(as_fuser_decodes(secs, nsec)),
                want,
                "{secs} s + {nsec} ns"
            )
        };
        check(0, 0, Some(0));
        check(1_700_000_000, 123, Some(1_700_000_000_000_000_123));
        check(-1, 500_000_000, Some(-500_000_000));
        check(-2, 0, Some(-2_000_000_000));
        // 1960-01-01 00:00:00.25
        check(-315_619_200, 250_000_000, Some(-315_619_199_750_000_000));
        // The ends of i64 nanoseconds: 1677-09-21 and 2262-04-11.
        check(9_223_372_036, 854_775_807, Some(i64::MAX));
        check(9_223_372_036, 854_775_808, None);
        check(10_413_792_000, 0, None); // 2300-01-01
        check(-9_223_372_037, 145_224_192, Some(i64::MIN));
        check(-9_223_372_037, 145_224_191, None);
        check(-16_725_225_600, 0, None); // 1440-01-01
                                         // Times the replies carry go back the same way.
        for ns in [
            0,
            -1,
            -500_000_000,
            -315_619_199_750_000_000,
            i64::MIN,
            i64::MAX,
        ] {
            let t = time(ns);
            let (s, n) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
                Err(e) => {
                    let d = e.duration();
                    if d.subsec_nanos() == 0 {
                        (-(d.as_secs() as i64), 0)
                    } else {
                        (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                    }
                }
            };
            assert_eq!(request_ns(as_fuser_decodes(s, n)), Some(ns), "{ns}");
        }
    }
}
