//! The fuser adapter: requests are answered from tokio tasks (fuser replies are `Send`), so
//! slow requests (a block fetch, a commit) never hold up others. On a RocksDB volume the
//! short kinds of request are polled once on the request loop's thread first (`first_poll`).
//! Types are converted here; the logic is in `vfs.rs`.

mod convert;

use crate::vfs::{VResult, Vfs};
use convert::*;
use fs_core::{FileKind, Ino, SetAttr};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use fuser::{BackingId, InitFlags};
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[derive(Debug, Clone)]
pub struct Ttls {
    pub attr: Duration,
    pub entry: Duration,
    pub dir_entry: Duration,
}

pub struct FuseFs {
    pub vfs: Arc<Vfs>,
    pub rt: tokio::runtime::Handle,
    pub ttl: Ttls,
    /// Reported as st_blksize (cp and Python size their buffers by it).
    pub blksize: u32,
}

/// Whether a request of kind `op` is polled once on the request loop's thread before it is
/// handed to the runtime. One that then waits on nothing (a RocksDB read, an answer from the
/// mount's caches, a write into the file's buffer) is answered without waking a runtime
/// thread: about 20 us a request on a VM (`jfs-fuse-ceiling`'s `stat_us`, with and without
/// `--from-tasks`). Only for metadata in this process (`engine_kind` "rocksdb": a Redis or
/// PostgreSQL call sent from this thread wakes the connection's task on the runtime anyway,
/// and measured slower), and only for kinds whose work before their first wait is bounded by
/// the request: not listings, opens (a mirror's open reads every chunk record of its file),
/// unlink, rmdir, rename, setattr and release (which may free a whole file's data), fsync,
/// fallocate. A loop thread held by long work stops the kernel's other requests.
fn first_poll(op: &str, engine_kind: &str) -> bool {
    engine_kind == "rocksdb"
        && matches!(
            op,
            "lookup"
                | "getattr"
                | "readlink"
                | "access"
                | "statfs"
                | "getxattr"
                | "listxattr"
                | "setxattr"
                | "removexattr"
                | "read"
                | "write"
                | "flush"
                | "create"
                | "mknod"
                | "mkdir"
                | "symlink"
                | "link"
        )
}

impl FuseFs {
    /// Run `f` (here first if `first_poll`, then on the runtime if it waits), time it under
    /// `op` from the request's arrival, and hand its outcome to `done`.
    fn go<T, F, D>(&self, op: &'static str, f: F, done: D)
    where
        T: Send + 'static,
        F: std::future::Future<Output = VResult<T>> + Send + 'static,
        D: FnOnce(VResult<T>) + Send + 'static,
    {
        let m = self.vfs.metrics.clone();
        let t0 = Instant::now();
        let task = Box::pin(async move {
            let r = f.await;
            m.observe(op, t0.elapsed().as_secs_f64(), r.is_ok());
            done(r);
        });
        // Asked at each request: a mount follows its volume when it moves to another engine.
        if first_poll(op, self.vfs.fs.engine().kind()) {
            poll_here_then_spawn(&self.rt, task);
        } else {
            self.rt.spawn(task);
        }
    }
}

/// Poll `task` once on this thread, in `rt`'s context; if it waits, hand it to `rt`, whose
/// first poll of it registers the runtime's waker (every poll replaces the last one's). A
/// panic ends `task` only, as it would in a task: a request's reply is dropped unsent, and
/// fuser answers EIO for it.
fn poll_here_then_spawn(
    rt: &tokio::runtime::Handle,
    mut task: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
) {
    let _rt = rt.enter();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let polled =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx)));
    if matches!(polled, Ok(std::task::Poll::Pending)) {
        rt.spawn(task);
    }
}

/// What the mount asks of the kernel at init: 64 requests in the background, 1 MiB writes
/// (`jfs-fuse-ceiling` asks the same, to measure the same path).
pub fn negotiate(config: &mut KernelConfig) {
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
    let _ = config.set_max_write(1 << 20);
}

/// "." or "..": listed, but never looked up.
fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(config);
        // Listings carry the entries' attributes (one engine call per page), so that `ls -l`,
        // `rm -rf` and `find` need no lookup per name; the kernel picks plain or plus.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        if let Some(pt) = self.vfs.pt.as_ref().filter(|p| p.enabled()) {
            // Backing files on a plain local file system (stacking depth 0) need depth 1.
            if config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_err()
                || config.set_max_stack_depth(1).is_err()
            {
                pt.disable("this kernel does not offer it (Linux 6.9 or later with CONFIG_FUSE_PASSTHROUGH)");
            } else {
                tracing::info!("FUSE passthrough is on: read-only opens of files held whole in the local cache are read by the kernel from the local copy");
            }
        }
        Ok(())
    }

    /// No ioctls (programs probe files with TCGETS to see if they are terminals): ENOTTY,
    /// the answer a regular file gives, without fuser's warning per call.
    fn ioctl(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn destroy(&mut self) {
        let vfs = self.vfs.clone();
        // Commit what is buffered before the session ends (unmount).
        let _ = self.rt.block_on(async move { vfs.flush_all().await });
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (v, o, n) = (self.vfs.clone(), Out::of(self), name_of(name));
        let p = ino(parent);
        self.go("lookup", async move { v.lookup(p, &n).await }, move |r| {
            entry_reply(&o, reply, r)
        });
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.vfs.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let (v, o, i) = (self.vfs.clone(), Out::of(self), ino(i));
        self.go("getattr", async move { v.getattr(i).await }, move |r| {
            attr_reply(&o, reply, i, r)
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (v, o, i) = (self.vfs.clone(), Out::of(self), ino(i));
        let (Some(atime), Some(mtime)) = (
            atime.map(time_ns).map_or(Some(None), |t| t.map(Some)),
            mtime.map(time_ns).map_or(Some(None), |t| t.map(Some)),
        ) else {
            // A time past 2262 or before 1677 would wrap: refused, as the kernel refuses a
            // time its file system cannot hold.
            tracing::warn!(
                ino = i,
                "setattr: a time outside 1677-2262 cannot be stored: EOVERFLOW"
            );
            return reply.error(Errno::from_i32(libc::EOVERFLOW));
        };
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime,
            mtime,
            length: size,
        };
        self.go(
            "setattr",
            async move { v.setattr(i, set).await },
            move |r| attr_reply(&o, reply, i, r),
        );
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        let (v, i) = (self.vfs.clone(), ino(i));
        self.go(
            "readlink",
            async move { v.readlink(i).await },
            move |r| match r {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (v, o, n, p) = (self.vfs.clone(), Out::of(self), name_of(name), ino(parent));
        let (uid, gid) = (req.uid(), req.gid());
        self.go(
            "mknod",
            async move { v.mknod(p, &n, mode, rdev, uid, gid).await },
            move |r| entry_reply(&o, reply, r),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let (v, o, n, p) = (self.vfs.clone(), Out::of(self), name_of(name), ino(parent));
        let (uid, gid) = (req.uid(), req.gid());
        self.go(
            "mkdir",
            async move { v.mkdir(p, &n, mode, uid, gid).await.map(|(i, a)| (i, a, 0)) },
            move |r| entry_reply(&o, reply, r),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (v, n, p) = (self.vfs.clone(), name_of(name), ino(parent));
        self.go("unlink", async move { v.unlink(p, &n).await }, move |r| {
            empty_reply(reply, r)
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (v, n, p) = (self.vfs.clone(), name_of(name), ino(parent));
        self.go("rmdir", async move { v.rmdir(p, &n).await }, move |r| {
            empty_reply(reply, r)
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let (v, o, n, p) = (
            self.vfs.clone(),
            Out::of(self),
            name_of(link_name),
            ino(parent),
        );
        let t = target.as_os_str().as_bytes().to_vec();
        let (uid, gid) = (req.uid(), req.gid());
        self.go(
            "symlink",
            async move { v.symlink(p, &n, &t, uid, gid).await.map(|(i, a)| (i, a, 0)) },
            move |r| entry_reply(&o, reply, r),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let v = self.vfs.clone();
        let (p, n, np, nn) = (ino(parent), name_of(name), ino(newparent), name_of(newname));
        let flags = flags.bits();
        self.go(
            "rename",
            async move { v.rename(p, &n, np, &nn, flags).await },
            move |r| empty_reply(reply, r),
        );
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (v, o, i, np, nn) = (
            self.vfs.clone(),
            Out::of(self),
            ino(i),
            ino(newparent),
            name_of(newname),
        );
        self.go(
            "link",
            async move { v.link(i, np, &nn).await.map(|(a, rdev)| (i, a, rdev)) },
            move |r| entry_reply(&o, reply, r),
        );
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (v, i) = (self.vfs.clone(), ino(i));
        self.go(
            "open",
            async move {
                let o = v.open(i, flags.0).await?;
                if o.copy_whole {
                    v.make_whole(i);
                }
                Ok((o, v))
            },
            move |r| match r {
                Ok((o, v)) => open_reply(&v, reply, o),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let v = self.vfs.clone();
        self.go(
            "read",
            async move { v.read(fh.0, offset, size).await },
            move |r| match r {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let v = self.vfs.clone();
        let data = data.to_vec();
        self.go(
            "write",
            async move { v.write(fh.0, offset, &data).await },
            move |r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let v = self.vfs.clone();
        self.go("flush", async move { v.flush(fh.0).await }, move |r| {
            empty_reply(reply, r)
        });
    }

    fn release(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let v = self.vfs.clone();
        self.go("release", async move { v.close(fh.0).await }, move |r| {
            empty_reply(reply, r)
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let v = self.vfs.clone();
        self.go("fsync", async move { v.fsync(fh.0).await }, move |r| {
            empty_reply(reply, r)
        });
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let (v, i) = (self.vfs.clone(), ino(i));
        self.go(
            "opendir",
            async move { v.opendir(i).await },
            move |r| match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t0 = Instant::now();
        match self.vfs.dir_entries(fh.0) {
            Ok(entries) => {
                for (pos, (name, i, k)) in entries.iter().enumerate().skip(offset as usize) {
                    if reply.add(
                        INodeNo(*i),
                        pos as u64 + 1,
                        kind(*k),
                        OsStr::from_bytes(name),
                    ) {
                        break;
                    }
                }
                reply.ok();
                self.vfs
                    .metrics
                    .observe("readdir", t0.elapsed().as_secs_f64(), true);
            }
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        dir: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (v, o) = (self.vfs.clone(), Out::of(self));
        let sent = self.vfs.clone();
        self.go(
            "readdirplus",
            async move {
                let entries = v.dir_entries(fh.0)?;
                // At most a page's worth of attributes (the reply buffer is a few KiB), the
                // entries' attributes in one engine call.
                let page: Vec<(usize, &(Vec<u8>, Ino, FileKind))> = entries
                    .iter()
                    .enumerate()
                    .skip(offset as usize)
                    .take(64)
                    .collect();
                let named: Vec<(&[u8], Ino)> = page
                    .iter()
                    .filter(|(_, (n, _, _))| !is_dot(n))
                    .map(|(_, (n, i, _))| (n.as_slice(), *i))
                    .collect();
                let mut attrs = v.entry_attrs(dir.0, &named).await?.into_iter();
                let mut out = Vec::new();
                for (pos, (name, i, _)) in page {
                    let (a, rdev) = if is_dot(name) {
                        v.getattr(*i).await?
                    } else {
                        match attrs.next().flatten() {
                            Some(x) => x,
                            None => continue, // removed since opendir
                        }
                    };
                    out.push((pos, name.clone(), *i, a, rdev));
                }
                Ok(out)
            },
            move |r| match r {
                Ok(list) => {
                    for (pos, name, i, a, rdev) in list {
                        // One TTL for the name and the attributes: the shorter of the two.
                        let ttl = if a.kind == FileKind::Dir {
                            o.ttl.dir_entry
                        } else {
                            o.ttl.entry
                        }
                        .min(o.ttl.attr);
                        if reply.add(
                            INodeNo(i),
                            pos as u64 + 1,
                            OsStr::from_bytes(&name),
                            &ttl,
                            &to_attr(o.blksize, i, &a, rdev),
                            Generation(0),
                        ) {
                            break;
                        }
                        // The kernel counts "." and ".." entries as no lookup.
                        if !is_dot(&name) {
                            sent.entry_sent(i);
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.vfs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every metadata change is committed before it is answered.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let v = self.vfs.clone();
        self.go(
            "statfs",
            async move { v.statfs().await },
            move |r| match r {
                Ok(s) => {
                    const BS: u64 = 4096;
                    let cap = if s.capacity == 0 {
                        1u64 << 50
                    } else {
                        s.capacity
                    };
                    let blocks = cap / BS;
                    let used = s.used_space.div_ceil(BS).min(blocks);
                    let files = 1u64 << 32;
                    let ffree = files.saturating_sub(s.used_inodes);
                    reply.statfs(
                        blocks,
                        blocks - used,
                        blocks - used,
                        files,
                        ffree,
                        BS as u32,
                        crate::vfs::NAME_MAX as u32,
                        BS as u32,
                    )
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (v, i, n, val) = (self.vfs.clone(), ino(i), name_of(name), value.to_vec());
        self.go(
            "setxattr",
            async move { v.setxattr(i, &n, &val, flags).await },
            move |r| empty_reply(reply, r),
        );
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (v, i, n) = (self.vfs.clone(), ino(i), name_of(name));
        self.go(
            "getxattr",
            async move { v.getxattr(i, &n).await },
            move |r| xattr_reply(reply, size, r),
        );
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let (v, i) = (self.vfs.clone(), ino(i));
        self.go("listxattr", async move { v.listxattr(i).await }, move |r| {
            xattr_reply(reply, size, r)
        });
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (v, i, n) = (self.vfs.clone(), ino(i), name_of(name));
        self.go(
            "removexattr",
            async move { v.removexattr(i, &n).await },
            move |r| empty_reply(reply, r),
        );
    }

    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (v, i) = (self.vfs.clone(), ino(i));
        let (uid, gid, mask) = (req.uid(), req.gid(), mask.bits());
        self.go(
            "access",
            async move { v.access(i, mask, uid, gid).await },
            move |r| empty_reply(reply, r),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (v, o, n, p) = (self.vfs.clone(), Out::of(self), name_of(name), ino(parent));
        let (uid, gid) = (req.uid(), req.gid());
        self.go(
            "create",
            async move { v.create(p, &n, mode, flags, uid, gid).await },
            move |r| match r {
                Ok((i, a, fh)) => {
                    let ettl = o.ttl.entry;
                    reply.created(
                        &ettl,
                        &to_attr(o.blksize, i, &a, 0),
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    )
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let v = self.vfs.clone();
        self.go(
            "copy_file_range",
            async move {
                v.copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
                    .await
            },
            move |r| match r {
                Ok(n) => reply.written(n.min(u32::MAX as u64) as u32),
                Err(e) => reply.error(Errno::from_i32(e)),
            },
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let v = self.vfs.clone();
        self.go(
            "fallocate",
            async move { v.fallocate(fh.0, offset, length, mode).await },
            move |r| empty_reply(reply, r),
        );
    }
}

/// Answer an open: in passthrough with the inode's backing file (registered with the kernel
/// at its first open, kept while the inode is in passthrough), else plainly. A backing file
/// the kernel refuses turns passthrough off and the handle goes on in caching mode.
fn open_reply(vfs: &Arc<Vfs>, reply: ReplyOpen, o: crate::vfs::Opened) {
    let fh = FileHandle(o.fh);
    let Some(pt) = o.passthrough else {
        let flags = if o.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        return reply.opened(fh, flags);
    };
    let id = {
        let mut slot = pt.backing.id.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(Ok(id)) => Ok(id.clone()),
            Some(Err(())) => Err(std::io::Error::other("refused before")),
            None => match reply.open_backing(&pt.backing.file) {
                Ok(id) => {
                    let id: Arc<dyn std::any::Any + Send + Sync> = Arc::new(id);
                    *slot = Some(Ok(id.clone()));
                    Ok(id)
                }
                Err(e) => {
                    *slot = Some(Err(()));
                    Err(e)
                }
            },
        }
    };
    match id {
        Ok(id) => {
            let id = id.downcast_ref::<BackingId>().expect("a backing id");
            let flags = if pt.direct {
                FopenFlags::FOPEN_DIRECT_IO
            } else {
                FopenFlags::empty()
            };
            reply.opened_passthrough(fh, flags, id)
        }
        Err(e) => {
            vfs.passthrough_refused(o.fh, &e);
            reply.opened(fh, FopenFlags::empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{first_poll, poll_here_then_spawn};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_request_runs_here_until_it_waits_then_on_the_runtime() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let here = std::thread::current().id();
        let (tx, rx) = mpsc::channel();

        // Waits on nothing: done before the call returns, on this thread.
        let t = tx.clone();
        poll_here_then_spawn(
            rt.handle(),
            Box::pin(async move { t.send(("ready", std::thread::current().id())).unwrap() }),
        );
        assert_eq!(rx.try_recv().unwrap(), ("ready", here));

        // Waits twice (a timer, then a blocking task): finished by the runtime's threads,
        // woken through the runtime's waker, not the one of the first poll.
        let t = tx.clone();
        poll_here_then_spawn(
            rt.handle(),
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let n = tokio::task::spawn_blocking(|| 7).await.unwrap();
                assert_eq!(n, 7);
                t.send(("waited", std::thread::current().id())).unwrap();
            }),
        );
        let (what, on) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(what, "waited");
        assert_ne!(on, here);

        // A panic in its first poll ends that request only.
        poll_here_then_spawn(rt.handle(), Box::pin(async { panic!("a bad request") }));
        let t = tx.clone();
        poll_here_then_spawn(
            rt.handle(),
            Box::pin(async move { t.send(("after", std::thread::current().id())).unwrap() }),
        );
        assert_eq!(rx.try_recv().unwrap(), ("after", here));
    }

    #[test]
    fn only_short_requests_on_rocksdb_are_polled_on_the_request_thread() {
        for op in [
            "lookup", "getattr", "read", "write", "flush", "create", "mkdir",
        ] {
            assert!(first_poll(op, "rocksdb"), "{op}");
            assert!(!first_poll(op, "redis"), "{op}");
            assert!(!first_poll(op, "postgres"), "{op}");
        }
        for op in [
            "opendir",
            "readdirplus",
            "open",
            "unlink",
            "rmdir",
            "rename",
            "setattr",
            "release",
            "fsync",
            "fallocate",
        ] {
            assert!(!first_poll(op, "rocksdb"), "{op}");
        }
    }
}
