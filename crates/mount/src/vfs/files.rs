//! Open files: the open-file table's nodes, handles, reads through each handle's `FileReader`,
//! buffered writes committed on flush/fsync/release, and fallocate.

use super::*;

impl Vfs {
    /// Flush the write buffer of `ino` if this mount has one dirty. Errors are EIO (ENOSPC
    /// for a full store or metadata disk).
    pub async fn flush_ino(&self, ino: Ino) -> VResult<()> {
        let Some(n) = self.open.get(ino) else {
            return Ok(());
        };
        let mut w = n.writer.lock().await;
        let r = w.flush().await;
        let c = w.take_committed();
        drop(w);
        if c > 0 {
            n.gen.fetch_add(1, Ordering::SeqCst);
            self.metrics.slices_committed.inc_by(c);
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.write_errors.inc();
                let no = write_errno(&e);
                let path = describe(&self.fs, ino).await;
                tracing::error!(%path, ino, error = %e, "flush failed: {}", errno_name(no));
                self.note_write_error(ino, &e.to_string());
                Err(no)
            }
        }
    }

    fn node_open(&self, ino: Ino) -> Arc<Node> {
        let mut m = self.open.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let n = m
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(Node {
                    ino,
                    opens: AtomicU64::new(0),
                    maybe_kept: Default::default(),
                    writer: tokio::sync::Mutex::new(Writer::new(
                        self.fs.clone(),
                        ino,
                        self.budget.clone(),
                        self.blocks.clone(),
                    )),
                    gen: AtomicU64::new(0),
                    pinned: Mutex::new(None),
                    io: Default::default(),
                })
            })
            .clone();
        n.opens.fetch_add(1, Ordering::SeqCst);
        n
    }

    /// A new handle of `ino` in caching mode (as long as no open of it is in passthrough).
    fn new_handle(&self, ino: Ino) -> u64 {
        self.new_handle_as(ino, false, None, None).0
    }

    /// A new handle of `ino`, in passthrough when `entry` (the whole-file entry of content
    /// `version`) may be handed out, or when the inode is in passthrough already.
    fn new_handle_as(
        &self,
        ino: Ino,
        read_only: bool,
        version: Option<Vec<u8>>,
        entry: Option<std::fs::File>,
    ) -> (u64, Option<passthrough::PtOpen>) {
        let node = self.node_open(ino);
        let (mode, pt) = self.choose_io(&node, read_only, version, entry);
        let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                fh,
                Arc::new(Handle {
                    ino,
                    node,
                    reader: tokio::sync::Mutex::new(None),
                    counted: Default::default(),
                    mode: Mutex::new(mode),
                    read_bytes: AtomicU64::new(0),
                }),
            );
        self.metrics.open_handles.inc();
        if pt.is_some() {
            self.metrics.passthrough_opens.inc();
        }
        (fh, pt)
    }

    fn handle(&self, fh: u64) -> VResult<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    /// Whether the page cache of `ino` may be kept: unchanged since the previous open.
    fn keep_cache(&self, ino: Ino, a: &Attr) -> bool {
        let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() >= SEEN_MAX {
            s.clear();
        }
        let prev = s.insert(ino, (a.mtime, a.length, Instant::now()));
        prev.is_some_and(|(m, l, _)| m == a.mtime && l == a.length)
    }

    pub async fn open(&self, ino: Ino, flags: i32) -> VResult<Opened> {
        let acc = flags & libc::O_ACCMODE;
        let read_only = acc == libc::O_RDONLY && flags & libc::O_TRUNC == 0;
        if !read_only {
            self.rw()?;
        }
        self.fresh_gate().await?;
        // --open-cache: a recent open's attributes are trusted without a metadata read.
        if !self.cfg.open_cache.is_zero() {
            let recent = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&ino)
                .is_some_and(|(_, _, t)| t.elapsed() < self.cfg.open_cache);
            if recent && self.open.get(ino).is_none() && !self.whole_candidate(ino) {
                let (fh, pt) = self.new_handle_as(ino, read_only, None, None);
                return Ok(Opened {
                    fh,
                    keep_cache: true,
                    passthrough: pt,
                    copy_whole: false,
                });
            }
        }
        // A read-only open may be answered with a whole-file copy: its content version is
        // read instead of the bare attributes.
        let whole = if read_only {
            self.whole_entry(ino).await?
        } else {
            None
        };
        let got = match &whole {
            Some((a, _, _)) => Ok(a.clone()),
            None => self.fs.getattr(ino).await,
        };
        let a = match got {
            Ok(a) => a,
            // At a mirror the agent may have applied the inode's deletion since the kernel
            // looked its name up (a file replaced by rename at the primary): ESTALE makes
            // the kernel look the name up again and open what it names now.
            Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.pin_versions => {
                return Err(libc::ESTALE)
            }
            Err(e) => return Err(err(e)),
        };
        match a.kind {
            FileKind::Dir => return Err(libc::EISDIR),
            FileKind::File => {}
            _ => return Err(libc::ENXIO),
        }
        let keep_cache = self.keep_cache(ino, &a);
        let (version, entry) = match whole {
            Some((_, v, f)) => (Some(v), f),
            None => (None, None),
        };
        let (fh, pt) = self.new_handle_as(ino, read_only, version, entry);
        // A plain passthrough open reads its backing file, which holds the version opened.
        // An open for writing at a mirror that writes through reads what it wrote: unpinned.
        if self.cfg.pin_versions && read_only && pt.as_ref().is_none_or(|p| p.direct) {
            let pinned = async {
                let h = self.handle(fh)?;
                let rd = match self.reader(&h).await {
                    Err(libc::ENOENT) => return Err(libc::ESTALE),
                    r => r?,
                };
                match rd.pin().await {
                    Err(e) if e.kind() == ErrorKind::NotFound => Err(libc::ESTALE),
                    r => r.map_err(err),
                }
            }
            .await;
            if let Err(e) = pinned {
                let _ = self.release(fh).await;
                return Err(e);
            }
            if let Some(n) = self.open.get(ino) {
                *n.pinned.lock().unwrap_or_else(|p| p.into_inner()) = Some(a.clone());
            }
        }
        let copy_whole = read_only
            && keep_cache
            && pt.is_none()
            && a.length >= passthrough::MIN_WHOLE
            && self.pt.as_ref().is_some_and(|p| p.enabled());
        Ok(Opened {
            fh,
            keep_cache,
            passthrough: pt,
            copy_whole,
        })
    }

    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> VResult<(Ino, Attr, u64)> {
        self.rw()?;
        check_name(name)?;
        let owner = Owner { uid, gid };
        let (ino, a) = match self.fs.create(parent, name, mode & 0o7777, owner).await {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::AlreadyExists && flags & libc::O_EXCL == 0 => {
                // Created by another client between the kernel's lookup and now: open it.
                let (ino, a) = self.fs.lookup(parent, name).await.map_err(err)?;
                if a.kind != FileKind::File {
                    return Err(libc::EISDIR);
                }
                (ino, a)
            }
            Err(e) => return Err(err(e)),
        };
        self.counted_lookup(ino);
        self.keep_cache(ino, &a);
        let fh = self.new_handle(ino);
        Ok((ino, a, fh))
    }

    async fn reader(&self, h: &Handle) -> VResult<Arc<FileReader>> {
        let gen = h.node.gen.load(Ordering::SeqCst);
        let mut r = h.reader.lock().await;
        if let Some((g, rd)) = r.as_ref() {
            if *g == gen {
                return Ok(rd.clone());
            }
        }
        let rd = Arc::new(
            FileReader::new(
                self.fs.clone(),
                h.ino,
                ReadAhead {
                    max_window: self.cfg.max_readahead,
                    budget: Some(self.budget.clone()),
                },
            )
            .await
            .map_err(err)?,
        );
        *r = Some((gen, rd.clone()));
        Ok(rd)
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> VResult<bytes::Bytes> {
        let h = self.handle(fh)?;
        // Buffered writes of this file are committed first, so reads see them.
        let dirty = h.node.writer.lock().await.dirty();
        if dirty {
            self.flush_ino(h.ino).await?;
        }
        let rd = self.reader(&h).await?;
        // read(2) has no ENOENT, and a program takes EPERM or EINVAL for its own mistake: a
        // block the store does not have (deleted by hand, a lost disk), or any other failure
        // of the file's data, is EIO, with a line that names what failed.
        let data = match rd.read(offset, size as usize).await {
            Ok(d) => d,
            Err(e) => {
                let path = describe(&self.fs, h.ino).await;
                tracing::error!(%path, ino = h.ino, offset, error = %e, "read failed: EIO");
                return Err(libc::EIO);
            }
        };
        self.metrics.read_bytes.inc_by(data.len() as u64);
        h.read_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let st = rd.stats();
        {
            let mut c = h.counted.lock().unwrap_or_else(|p| p.into_inner());
            self.metrics
                .blocks_fetched
                .inc_by(st.fetched.saturating_sub(c.fetched));
            self.metrics
                .blocks_reused
                .inc_by(st.reused.saturating_sub(c.reused));
            self.metrics
                .readahead_hits
                .inc_by(st.ahead_hits.saturating_sub(c.ahead_hits));
            *c = st;
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        Ok(data)
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> VResult<u32> {
        self.rw()?;
        let h = self.handle(fh)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > fs_core::MAX_FILE_LEN)
        {
            return Err(libc::EFBIG);
        }
        let mut w = h.node.writer.lock().await;
        let r = w.write(offset, data).await;
        let c = w.take_committed();
        drop(w);
        if c > 0 {
            h.node.gen.fetch_add(1, Ordering::SeqCst);
            self.metrics.slices_committed.inc_by(c);
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        match r {
            Ok(()) => {
                self.metrics.write_bytes.inc_by(data.len() as u64);
                Ok(data.len() as u32)
            }
            Err(e) => {
                let no = write_errno(&e);
                let path = describe(&self.fs, h.ino).await;
                tracing::error!(%path, ino = h.ino, error = %e, "write failed: {}", errno_name(no));
                self.metrics.write_errors.inc();
                Err(no)
            }
        }
    }

    pub async fn flush(&self, fh: u64) -> VResult<()> {
        let h = self.handle(fh)?;
        self.flush_ino(h.ino).await
    }

    pub async fn fsync(&self, fh: u64) -> VResult<()> {
        self.flush(fh).await
    }

    /// `release`, and then, when the handle read its whole file (at least
    /// `passthrough::MIN_WHOLE`), a whole-file copy for the next opens' passthrough.
    pub async fn close(self: &Arc<Self>, fh: u64) -> VResult<()> {
        let read = self.handle(fh).ok().and_then(|h| {
            let n = h.read_bytes.load(Ordering::Relaxed);
            (self.pt.is_some() && n >= passthrough::MIN_WHOLE).then_some((h.ino, n))
        });
        let r = self.release(fh).await;
        if let Some((ino, n)) = read {
            if self.fs.getattr(ino).await.is_ok_and(|a| a.length <= n) {
                self.make_whole(ino);
            }
        }
        r
    }

    /// Close a handle: commit its file's buffer; at the last close of an inode unlinked while
    /// open, free it.
    pub async fn release(&self, fh: u64) -> VResult<()> {
        let h = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
            .ok_or(libc::EBADF)?;
        self.metrics.open_handles.dec();
        let mode = *h.mode.lock().unwrap_or_else(|p| p.into_inner());
        self.io_done(&h.node, mode, false);
        let r = self.flush_ino(h.ino).await;
        let last = {
            let mut m = self.open.nodes.lock().unwrap_or_else(|p| p.into_inner());
            let left = h.node.opens.fetch_sub(1, Ordering::SeqCst) - 1;
            if left == 0 {
                m.remove(&h.ino);
            }
            left == 0
        };
        // Only an inode fs-core kept for this mount needs freeing (release_kept is a no-op
        // when the last unlink did not keep it after all).
        if last && h.node.maybe_kept.load(Ordering::SeqCst) {
            if let Err(e) = self.fs.release_kept(h.ino).await {
                // Unlinked: it has no path left to name.
                tracing::warn!(ino = h.ino, error = %e, "freeing an unlinked file at its last close failed; gc frees it once this session ends");
            }
        }
        self.metrics.buffer_used.set(self.budget.used() as i64);
        r
    }

    /// fallocate mode 0 (and KEEP_SIZE, which has nothing to do): extends the file.
    pub async fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> VResult<()> {
        self.rw()?;
        let h = self.handle(fh)?;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
        if end > fs_core::MAX_FILE_LEN {
            return Err(libc::EFBIG);
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Ok(());
        }
        self.flush_ino(h.ino).await?;
        let a = self.fs.getattr(h.ino).await.map_err(err)?;
        if end > a.length {
            self.setattr(
                h.ino,
                SetAttr {
                    length: Some(end),
                    ..Default::default()
                },
            )
            .await?;
        }
        Ok(())
    }

    /// `copy_file_range` (what `cp` uses, and `cp --reflink`'s fallback): the destination
    /// shares the source's slices, no byte is read or written (`Fs::copy_range`). Both
    /// files' buffered writes are committed first, so the copy sees them.
    pub async fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> VResult<u64> {
        self.rw()?;
        let (hi, ho) = (self.handle(fh_in)?, self.handle(fh_out)?);
        self.flush_ino(hi.ino).await?;
        self.flush_ino(ho.ino).await?;
        let n = self
            .fs
            .copy_range(hi.ino, off_in, ho.ino, off_out, len)
            .await
            .map_err(|e| {
                if e.kind() == ErrorKind::InvalidArgument
                    && off_out.saturating_add(len) > fs_core::MAX_FILE_LEN
                {
                    libc::EFBIG
                } else {
                    err(e)
                }
            })?;
        if let Some(n) = self.open.get(ho.ino) {
            n.gen.fetch_add(1, Ordering::SeqCst);
        }
        Ok(n)
    }

    /// Commit every write buffer (unmount, SIGTERM).
    pub async fn flush_all(&self) {
        let nodes: Vec<Ino> = self
            .open
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        for ino in nodes {
            let _ = self.flush_ino(ino).await;
        }
    }
}

/// What a failed write or commit tells the application: ENOSPC when the store or the
/// metadata is full (it can make room and retry), else EIO.
fn write_errno(e: &fs_core::Error) -> Errno {
    match e.kind() {
        fs_core::ErrorKind::NoSpace => libc::ENOSPC,
        _ => libc::EIO,
    }
}

fn errno_name(no: Errno) -> &'static str {
    if no == libc::ENOSPC {
        "ENOSPC"
    } else {
        "EIO"
    }
}
