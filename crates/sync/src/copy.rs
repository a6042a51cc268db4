//! Moving one object: server-side when both sides are the same S3 store, copy_file_range for
//! local to local, otherwise ranged reads (several in flight) into the destination's sink in
//! order. Paced by the rate limits, checksummed (CRC32C) when asked, retried with backoff.

use crate::endpoint::{Endpoint, Entry, Sink};
use crate::limits::Limits;
use anyhow::{bail, Result};
use futures::{StreamExt, TryStreamExt};
use std::time::Duration;

/// Bytes per ranged read; 4 reads in flight per object.
pub const PIECE: u64 = 8 << 20;
const READS_IN_FLIGHT: usize = 4;

pub struct Copier<'a> {
    pub src: &'a dyn Endpoint,
    pub dst: &'a dyn Endpoint,
    pub limits: &'a Limits,
    pub perms: bool,
    pub check_new: bool,
    /// Resume state: where multipart upload ids are kept.
    pub state: Option<&'a crate::state::State>,
}

/// Local files up to this size are copied in one blocking call (see
/// `LocalDir::copy_small_from_local`); larger ones in pieces a rate limit can pace.
const SMALL_LOCAL: u64 = 4 << 20;

/// Objects at least this large go to S3 as resumable multipart uploads.
pub const RESUMABLE_MIN: u64 = 2 * crate::endpoint::PART as u64;

/// Every ranged read a sync makes goes through here: the rate limits are charged (one
/// request, `n` bytes) before the read. The only other charges are a request per file
/// (`copy_file`) and the bytes of local-to-local copies, which never pass through a read.
async fn paced_read(
    limits: &Limits,
    ep: &dyn Endpoint,
    key: &str,
    off: u64,
    n: u64,
) -> Result<bytes::Bytes> {
    limits.request().await;
    limits.bytes(n).await;
    ep.read(key, off, n).await
}

/// CRC32C of an object, read in pieces.
pub async fn checksum(ep: &dyn Endpoint, key: &str, size: u64, limits: &Limits) -> Result<u32> {
    let mut crc = 0u32;
    let mut pieces = futures::stream::iter((0..size.div_ceil(PIECE)).map(|i| async move {
        let off = i * PIECE;
        let n = PIECE.min(size - off);
        paced_read(limits, ep, key, off, n).await
    }))
    .buffered(READS_IN_FLIGHT);
    while let Some(b) = pieces.try_next().await? {
        crc = crc32c::crc32c_append(crc, &b);
    }
    Ok(crc)
}

impl Copier<'_> {
    /// Copy `e` (a file). Returns the bytes moved through this process.
    pub async fn copy_file(&self, e: &Entry) -> Result<u64> {
        self.limits.request().await;
        if self.dst.server_side_copy(self.src, &e.key, e.size).await? {
            return Ok(0);
        }
        if let (Some(st), Some(native)) = (
            self.state,
            self.dst.as_object_store().and_then(|o| o.native()),
        ) {
            if e.size >= RESUMABLE_MIN {
                let moved = self.multipart(native, st, e).await?;
                if self.check_new {
                    let want = checksum(self.src, &e.key, e.size, self.limits).await?;
                    let got = checksum(self.dst, &e.key, e.size, self.limits).await?;
                    if got != want {
                        bail!("{}: verification failed: destination CRC32C {got:08x}, source {want:08x}", crate::names::show(&e.key));
                    }
                }
                return Ok(moved);
            }
        }
        let (sink, crc) = match (self.src.as_local(), self.dst.as_local()) {
            (Some(s), Some(d)) if e.size <= SMALL_LOCAL => {
                self.limits.bytes(e.size).await;
                d.copy_small_from_local(s, e, self.perms).await?;
                if self.check_new {
                    let want = checksum(self.src, &e.key, e.size, self.limits).await?;
                    let got = checksum(self.dst, &e.key, e.size, self.limits).await?;
                    if got != want {
                        bail!("{}: verification failed: destination CRC32C {got:08x}, source {want:08x}", crate::names::show(&e.key));
                    }
                }
                return Ok(e.size);
            }
            (Some(s), Some(d)) => {
                let limits = self.limits;
                let sink = d.copy_from_local(s, &e.key, e.size, limits).await?;
                (sink, None)
            }
            _ => self.stream(e).await?,
        };
        sink.finish(e, self.perms).await?;
        if self.check_new {
            let want = match crc {
                Some(c) => c,
                None => checksum(self.src, &e.key, e.size, self.limits).await?,
            };
            let got = checksum(self.dst, &e.key, e.size, self.limits).await?;
            if got != want {
                bail!(
                    "{}: verification failed: destination CRC32C {got:08x}, source {want:08x}",
                    e.key
                );
            }
        }
        Ok(e.size)
    }

    /// A multipart upload that outlives the process: the upload id is recorded before the
    /// first part; a later run lists the parts S3 already has and sends only the others.
    /// Returns the bytes uploaded by this call.
    async fn multipart(
        &self,
        s3: &crate::endpoint::s3native::S3Native,
        st: &crate::state::State,
        e: &Entry,
    ) -> Result<u64> {
        let part = crate::endpoint::PART as u64;
        let version = format!("{} {}", e.size, e.mtime_ns);
        let nparts = e.size.div_ceil(part);
        let part_len = |n: u64| part.min(e.size - (n - 1) * part);
        let mut have = std::collections::BTreeMap::new();
        let mut upload = None;
        if let Some((id, v)) = st.multipart(&e.key)? {
            if v == version {
                if let Some(parts) = s3.parts(&e.key, &id).await? {
                    for (n, size, etag) in parts {
                        if n >= 1 && (n as u64) <= nparts && size as u64 == part_len(n as u64) {
                            have.insert(n, etag);
                        }
                    }
                    upload = Some(id);
                }
            } else {
                s3.abort(&e.key, &id).await; // the source changed since: start over
            }
        }
        let id = match upload {
            Some(id) => {
                tracing::info!(key = %crate::names::show(&e.key), parts_done = have.len(), parts = nparts, "resuming multipart upload");
                id
            }
            None => {
                let id = s3.create(&e.key).await?;
                st.set_multipart(&e.key, &id, &version)?;
                id
            }
        };
        let todo: Vec<u64> = (1..=nparts)
            .filter(|n| !have.contains_key(&(*n as i32)))
            .collect();
        let uploaded: Vec<(i32, String, u64)> = futures::stream::iter(todo.into_iter().map(|n| {
            let id = &id;
            async move {
                let (off, len) = ((n - 1) * part, part_len(n));
                let data = paced_read(self.limits, self.src, &e.key, off, len).await?;
                let etag = s3.upload_part(&e.key, id, n as i32, data).await?;
                Ok::<_, anyhow::Error>((n as i32, etag, len))
            }
        }))
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
        let moved = uploaded.iter().map(|u| u.2).sum();
        for (n, etag, _) in uploaded {
            have.insert(n, etag);
        }
        s3.complete(&e.key, &id, have.into_iter().collect()).await?;
        st.clear_multipart(&e.key)?;
        Ok(moved)
    }

    async fn stream(&self, e: &Entry) -> Result<(Box<dyn Sink>, Option<u32>)> {
        let mut sink = self.dst.sink(&e.key, e.size).await?;
        let mut crc = 0u32;
        let res: Result<()> = async {
            let mut pieces =
                futures::stream::iter((0..e.size.div_ceil(PIECE)).map(|i| async move {
                    let off = i * PIECE;
                    let n = PIECE.min(e.size - off);
                    paced_read(self.limits, self.src, &e.key, off, n).await
                }))
                .buffered(READS_IN_FLIGHT);
            while let Some(b) = pieces.try_next().await? {
                if self.check_new {
                    crc = crc32c::crc32c_append(crc, &b);
                }
                sink.write(b).await?;
            }
            Ok(())
        }
        .await;
        match res {
            Ok(()) => Ok((sink, self.check_new.then_some(crc))),
            Err(err) => {
                sink.abort().await;
                Err(err)
            }
        }
    }
}

/// An error that retrying cannot fix: a hostile key or unsupported kind (a permanent
/// `InvalidArgument`, `endpoint::permanent`), a destination that refuses writes (read-only
/// file system, permission denied, EPERM, a full disk: ENOSPC, EDQUOT) or a name it cannot
/// hold, from the local file
/// system or a volume. An `fs_core::Error` is read by its `status()` first: a temporary one
/// is always retried.
pub fn is_permanent(e: &anyhow::Error) -> Option<&'static str> {
    for c in e.chain() {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            match io.raw_os_error() {
                Some(30) => return Some("a read-only file system"),
                Some(13) | Some(1) => return Some("permission denied"),
                Some(36) => return Some("a name too long for the file system"),
                Some(28) | Some(122) => return Some("no space left on the destination"),
                _ => {}
            }
            match io.kind() {
                std::io::ErrorKind::ReadOnlyFilesystem => return Some("a read-only file system"),
                std::io::ErrorKind::PermissionDenied => return Some("permission denied"),
                _ => {}
            }
        }
        if let Some(f) = c.downcast_ref::<fs_core::Error>() {
            if f.status() != fs_core::ErrorStatus::Permanent {
                continue;
            }
            match f.kind() {
                fs_core::ErrorKind::InvalidArgument => return Some(""),
                fs_core::ErrorKind::ReadOnly => return Some("a read-only volume"),
                fs_core::ErrorKind::PermissionDenied => return Some("permission denied"),
                fs_core::ErrorKind::NameTooLong => return Some("a name too long for the volume"),
                fs_core::ErrorKind::NoSpace => return Some("no space left"),
                _ => {}
            }
        }
    }
    None
}

/// Run `f` up to `1 + retries` times, sleeping 1 s, 2 s, 4 s... (capped at 30 s) in between.
/// Permanent errors (`is_permanent`) fail at once: retrying cannot help.
pub async fn with_retries<T, F, Fut>(retries: u32, key: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    // Printed escaped: never raw control bytes or bytes that are not UTF-8.
    let shown = if crate::names::is_text(key) {
        format!("{key:?}")
    } else {
        crate::names::show(key).into_owned()
    };
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if let Some(why) = is_permanent(&e) {
                    let what = if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why}: not retried)")
                    };
                    return Err(e.context(format!(
                        "{shown}: failed after {} attempt(s){what}",
                        attempt + 1
                    )));
                }
                if attempt >= retries {
                    return Err(
                        e.context(format!("{shown}: failed after {} attempt(s)", attempt + 1))
                    );
                }
                attempt += 1;
                tracing::warn!(key = %shown, attempt, error = %format!("{e:#}"), "retrying");
                tokio::time::sleep(
                    Duration::from_secs(1 << (attempt - 1).min(5)).min(Duration::from_secs(30)),
                )
                .await;
            }
        }
    }
}
