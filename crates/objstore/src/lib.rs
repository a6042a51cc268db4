//! Block stores over OpenDAL behind fs-core's `BlockStore` trait, and STORE_URL parsing:
//!
//! - `file:///path/to/dir` — a local directory (the default); writes go to a temp file in
//!   `<dir>/.jfs-tmp` and are renamed into place, so a crash never leaves a half block;
//! - `memory://` — in-process, for tests;
//! - `s3://bucket[/prefix][?endpoint=URL&region=R&path_style=true]` — any S3-compatible store;
//!   credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`),
//!   endpoint also from `AWS_ENDPOINT_URL`, region from `AWS_REGION` (default us-east-1).
//!
//! Temporary failures are retried with jittered exponential backoff (OpenDAL's RetryLayer
//! retries only errors it classifies as temporary); after the last try the error is returned.
//!
//! # What each store does
//!
//! `file://` (written, read and deleted directly, past OpenDAL's fs service: a write goes to a
//! synced temp file in `<root>/.jfs-tmp` renamed into place, so a crash never leaves half a
//! block; a whole-block read is one `read` of the file; errors are classified by
//! `Error::from_io`, so a read-only, full or forbidden disk is permanent, where OpenDAL calls
//! every unknown io error temporary; a key with empty, `.` or `..` parts is refused; the
//! directories it creates are 0700 and its blocks 0600 whatever the umask, since anyone who
//! can read a store's blocks can read every file of the volume), `s3://`
//! (credentials from the AWS environment only), `memory://`.
//! Decorators come from OpenDAL layers: TimeoutLayer, then RetryLayer (jittered exponential
//! backoff that retries only errors OpenDAL marks temporary). `check_url` validates a URL with
//! no side effect (config checks); a `file://` directory is created only when the caller asks
//! (`format`, a mirror's own store), so a mistyped path never leaves an empty store behind.
//! `limits.rs`: bytes/s (with a timetable) and requests/s over governor, changeable while
//! running; shared by `jfs-sync` and the mirror agent's copy workers. Bytes are charged
//! exactly: 1 KiB cells replenished at the exact period of the rate, and each call's bytes
//! added to a running total of which whole cells are charged (a 2 KB object costs 2 KB).
//! Errors are mapped in one place (`map_err`) to fs-core kinds. A listing error is returned,
//! never swallowed (gc relies on it).

#[cfg(test)]
mod fuzz_tests;
pub mod limits;
pub mod secrets;

use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::store::{BlockCheck, BlockStore, ObjectMeta};
use futures::TryStreamExt;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::{services, Operator};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use opendal;

pub struct OpendalStore {
    op: Operator,
    display: String,
    /// A `file://` store's directory: whole-block reads go straight to the file (one read
    /// into a buffer of the file's size), not through OpenDAL's chunked reader, which copies
    /// each block twice more (its read buffer, then joining the chunks).
    local_root: Option<std::path::PathBuf>,
    /// Pooled page-aligned buffers for reading a local store's blocks (see `read_local`).
    read_bufs: Arc<fs_core::BlockPool>,
}

/// `key` as a path under a store's directory, when it is a plain relative path (no `..`, no
/// empty or `.` parts; block keys always are).
fn plain_key_path(root: &std::path::Path, key: &str) -> Option<std::path::PathBuf> {
    let plain = !key.is_empty()
        && !key.starts_with('/')
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    plain.then(|| root.join(key))
}

fn map_err(e: opendal::Error, what: &str) -> Error {
    let msg = format!("{what}: {e}");
    match e.kind() {
        opendal::ErrorKind::NotFound => Error::new(ErrorKind::NotFound, msg),
        opendal::ErrorKind::PermissionDenied => {
            Error::new(ErrorKind::PermissionDenied, format!("{what}: access denied by the object store (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"))
        }
        opendal::ErrorKind::ConfigInvalid => Error::new(ErrorKind::Config, msg),
        _ if e.is_temporary() => Error::temporary(ErrorKind::Backend, msg),
        _ => Error::new(ErrorKind::Backend, msg),
    }
}

fn ns(t: Option<opendal::raw::Timestamp>) -> Option<i64> {
    let st: SystemTime = t?.into();
    st.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos() as i64)
}

/// Options that flags can set on top of the URL and environment.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Create a `file://` store's directory when it does not exist (`jfs format`, a mirror's
    /// own store). Otherwise a missing directory is an error: a mistyped path must not leave
    /// an empty store behind, nor hide a store that went missing.
    pub create: bool,
}

fn config_err(url: &str, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("storage URL {:?}: {what}", secrets::redact(url)),
    )
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Temp files of writes that never finished (a process killed mid-write) are removed once
/// they are an hour old: no write takes that long.
fn remove_stale_temp(dir: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Write a block of a `file://` store: a temporary file in `<root>/.jfs-tmp`, synced, then
/// renamed into place (a crash never leaves half a block under a block's name), and the
/// directory synced (the name is durable before the caller commits metadata naming it). Done here
/// rather than by OpenDAL's fs writer, which reports every error it does not know as
/// temporary: a read-only or full disk was retried for seconds per block (a cutover's dual
/// write waited its grace on each). Errors are classified by `Error::from_io`.
///
/// Bytes that start on a 4 KiB boundary (the mount's block buffers) are written with
/// `O_DIRECT`, all but an unaligned tail: the disk reads them from this memory, with no
/// copy into the page cache and no write-back later. The sync that follows is then a
/// cache flush. File systems that refuse `O_DIRECT` get the buffered write.
fn put_local(root: &std::path::Path, path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = root.join(".jfs-tmp").join(format!(
        "{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let written = (|| {
        write_synced(&tmp, data)?;
        let dir = path.parent().unwrap_or(root);
        create_dirs_synced(dir)?;
        std::fs::rename(&tmp, path)?;
        // The new name is durable only once its directory is: without this a power cut
        // after the metadata commit (on another machine: Redis, PostgreSQL) could leave the
        // block under its temporary name, and the committed slice without it.
        sync_dir(dir)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Create `dir` and its missing parents owner-only (0700, whatever the umask): a store's
/// directories hold the volume's bytes, readable by anyone who reaches them.
pub fn create_private_dirs(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// `create_private_dirs(dir)`, with each directory it creates made durable in its parent.
fn create_dirs_synced(dir: &std::path::Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur.filter(|d| !d.is_dir()) {
        missing.push(d);
        cur = d.parent();
    }
    create_private_dirs(dir)?;
    for d in missing.iter().rev() {
        if let Some(parent) = d.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Blocks up to this size (the default block size) and over half of it are read into
/// buffers from a pool. Smaller ones get buffers of their own size: a pooled buffer is held
/// whole while any slice of it is, and a file of many small blocks would hold 4 MiB each.
const READ_BUF: usize = 4 << 20;

/// Whether a block of `len` bytes is read into a pooled buffer.
fn pooled(len: usize) -> bool {
    len > READ_BUF / 2 && len <= READ_BUF
}

/// Read a local store's file whole. A block of 2-4 MiB (`pooled`) is read into a
/// page-aligned buffer from `bufs`: no fresh pages to fault in and clear for each block (the
/// buffer goes back to `bufs` when its last `Bytes` is dropped), and a whole-file copy made
/// of it can be written with `O_DIRECT` (`write_at_end`). The read itself goes through the
/// page cache:
/// measured on this project's disks, `O_DIRECT` reads halved the CPU of a cold read but cut
/// its speed by a third (the kernel's read-ahead keeps more of the disk busy).
fn read_local(path: &std::path::Path, bufs: &Arc<fs_core::BlockPool>) -> std::io::Result<Bytes> {
    read_local_with(path, bufs, |_| {})
}

/// How much of a block is read at a time: a piece is summed (`read_local_summed`) while
/// still in the CPU's cache.
const SUM_PIECE: usize = 256 << 10;

/// `read_local` of a block, with the CRC32C of its bytes, each piece summed as soon as it
/// is read (a whole 4 MiB block summed afterwards is read back from memory, not cache).
fn read_local_summed(
    path: &std::path::Path,
    bufs: &Arc<fs_core::BlockPool>,
) -> std::io::Result<(Bytes, u32)> {
    let mut crc = 0;
    let b = read_local_with(path, bufs, |piece| crc = crc32c::crc32c_append(crc, piece))?;
    Ok((b, crc))
}

/// Read a local store's file whole, handing each piece read to `on_piece` in order.
fn read_local_with(
    path: &std::path::Path,
    bufs: &Arc<fs_core::BlockPool>,
    mut on_piece: impl FnMut(&[u8]),
) -> std::io::Result<Bytes> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if pooled(len as usize) {
        let mut b = bufs.take();
        b.fill(|room| {
            let n = room.len().min(SUM_PIECE);
            let got = f.read(&mut room[..n])?;
            on_piece(&room[..got]);
            Ok(got)
        })?;
        if b.len() as u64 != len {
            return Err(std::io::Error::other(format!(
                "{} changed while it was read ({len} bytes, then {})",
                path.display(),
                b.len()
            )));
        }
        return Ok(b.freeze());
    }
    let mut v = Vec::with_capacity(len as usize);
    f.read_to_end(&mut v)?;
    on_piece(&v);
    Ok(Bytes::from(v))
}

/// The alignment `O_DIRECT` asks of memory, lengths and offsets (the page size: enough for
/// every logical block size up to 4 KiB).
const DIRECT_ALIGN: usize = 4096;

/// Create `path` (it must not exist) holding `data`, synced; owner-only (0600) from its
/// first byte, whatever the umask.
fn write_synced(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    write_at_end(&mut f, 0, data)?;
    f.sync_all()
}

/// Append `data` to `f`, whose length is `at`. Where `at` and `data` start on a 4 KiB
/// boundary, the whole pages go with `O_DIRECT` (from this memory straight to the disk, no
/// page-cache copy, nothing left to write back) and an unaligned tail through the page
/// cache; on a file system without `O_DIRECT` (the flag is refused with EINVAL, or the
/// write is) everything goes through the page cache. The file is left without the flag.
pub fn write_at_end(f: &mut std::fs::File, at: u64, data: &[u8]) -> std::io::Result<()> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    use std::io::{Seek, SeekFrom, Write};
    let direct_len = data.len() & !(DIRECT_ALIGN - 1);
    let mut done = 0;
    if direct_len > 0
        && at.is_multiple_of(DIRECT_ALIGN as u64)
        && (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
    {
        let flags = fcntl_getfl(&*f)?;
        if fcntl_setfl(&*f, flags | OFlags::DIRECT).is_ok() {
            let r = f.write_all(&data[..direct_len]);
            fcntl_setfl(&*f, flags)?;
            match r {
                Ok(()) => done = direct_len,
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                    // Refused: start again through the page cache, from where it began.
                    f.set_len(at)?;
                    f.seek(SeekFrom::Start(at))?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    f.write_all(&data[done..])
}

impl OpendalStore {
    /// `key` under a `file://` store's directory, refused unless it is a plain relative path.
    fn local_path(
        &self,
        root: &std::path::Path,
        key: &str,
        doing: &str,
    ) -> Result<std::path::PathBuf> {
        plain_key_path(root, key).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{doing} {key:?} in {}: not a block key (empty, `.` or `..` parts)",
                    self.display
                ),
            )
        })
    }

    pub fn open(url: &str, opts: &StoreOptions) -> Result<Self> {
        let op = operator(url, opts)?;
        let local_root = match parse_url(url)? {
            ("file", path, _) => Some(std::path::PathBuf::from(path)),
            _ => None,
        };
        Ok(OpendalStore {
            op,
            display: secrets::redact(url),
            local_root,
            read_bufs: fs_core::BlockPool::new(READ_BUF, 8),
        })
    }
}

/// A store URL's scheme, path and query parameters; unknown parameters are refused.
fn parse_url(url: &str) -> Result<(&str, &str, HashMap<String, String>)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(config_err(
            url,
            "expected file:///dir, s3://bucket/prefix or memory://",
        ));
    };
    secrets::check(url).map_err(|why| config_err(url, why))?;
    let (path, q) = rest.split_once('?').unwrap_or((rest, ""));
    let params: HashMap<String, String> = url::form_urlencoded::parse(q.as_bytes())
        .into_owned()
        .collect();
    let known: &[&str] = match scheme {
        "s3" => &["endpoint", "region", "path_style"],
        _ => &[],
    };
    if let Some(k) = params
        .keys()
        .find(|k| !known.contains(&k.as_str()) && !scheme.starts_with("opendal+"))
    {
        return Err(config_err(url, format!("unknown parameter {k:?}")));
    }
    Ok((scheme, path, params))
}

/// Check a store URL as `open` would, without touching the store or the disk: scheme,
/// parameters, an absolute `file://` path (a URL with two slashes names a relative path: the
/// error says which spelling was meant), S3 credentials in the environment.
pub fn check_url(url: &str) -> Result<()> {
    let (scheme, path, _) = parse_url(url)?;
    match scheme {
        "file" => {
            if !path.starts_with('/') {
                return Err(config_err(
                    url,
                    format!("use an absolute path: did you mean file:///{path}?"),
                ));
            }
            if std::path::Path::new(path).is_file() {
                return Err(config_err(url, format!("{path} is a file, not a directory")));
            }
            Ok(())
        }
        "memory" => Ok(()),
        "s3" => {
            if path.split('/').next().unwrap_or("").is_empty() {
                return Err(config_err(url, "no bucket: s3://bucket/prefix"));
            }
            if env("AWS_ACCESS_KEY_ID").is_none() || env("AWS_SECRET_ACCESS_KEY").is_none() {
                return Err(config_err(
                    url,
                    "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                ));
            }
            Ok(())
        }
        s if s.starts_with("opendal+") => Ok(()),
        other => Err(config_err(
            url,
            format!("unsupported scheme {other:?}: use file://, s3://, memory:// or opendal+SERVICE://?option=value"),
        )),
    }
}

/// An OpenDAL operator for a store URL, with the timeout and retry layers, for callers that
/// need more than blocks (ranged reads, multipart writers, listings from a key).
pub fn operator(url: &str, opts: &StoreOptions) -> Result<Operator> {
    check_url(url)?;
    {
        let (scheme, path, params) = parse_url(url)?;
        let op = match scheme {
            "file" => {
                if !std::path::Path::new(path).is_dir() {
                    if !opts.create {
                        return Err(config_err(
                            url,
                            format!("the store directory {path} does not exist (a mistyped path? `jfs format` creates it)"),
                        ));
                    }
                    create_private_dirs(std::path::Path::new(path))
                        .map_err(|e| config_err(url, format!("cannot create {path}: {e}")))?;
                }
                let tmp = format!("{}/.jfs-tmp", path.trim_end_matches('/'));
                create_private_dirs(std::path::Path::new(&tmp))
                    .map_err(|e| config_err(url, format!("cannot create {tmp}: {e}")))?;
                remove_stale_temp(std::path::Path::new(&tmp));
                Operator::new(services::Fs::default().root(path).atomic_write_dir(&tmp))
                    .map_err(|e| map_err(e, "file store"))?
                    .finish()
            }
            "memory" => Operator::new(services::Memory::default())
                .map_err(|e| map_err(e, "memory store"))?
                .finish(),
            "s3" => {
                let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
                if bucket.is_empty() {
                    return Err(config_err(url, "no bucket: s3://bucket/prefix"));
                }
                let endpoint = opts
                    .endpoint
                    .clone()
                    .or_else(|| params.get("endpoint").cloned())
                    .or_else(|| env("AWS_ENDPOINT_URL"));
                let region = opts
                    .region
                    .clone()
                    .or_else(|| params.get("region").cloned())
                    .or_else(|| env("AWS_REGION"))
                    .or_else(|| env("AWS_DEFAULT_REGION"))
                    .unwrap_or_else(|| "us-east-1".into());
                let mut b = services::S3::default()
                    .bucket(bucket)
                    .root(&format!("/{prefix}"))
                    .region(&region)
                    .disable_config_load()
                    .disable_ec2_metadata();
                if let Some(ep) = &endpoint {
                    b = b.endpoint(ep);
                }
                match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                    (Some(ak), Some(sk)) => {
                        b = b.access_key_id(&ak).secret_access_key(&sk);
                        if let Some(t) = env("AWS_SESSION_TOKEN") {
                            b = b.session_token(&t);
                        }
                    }
                    _ => {
                        return Err(config_err(
                            url,
                            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                        ))
                    }
                }
                if params.get("path_style").map(String::as_str) == Some("false") {
                    b = b.enable_virtual_host_style();
                }
                Operator::new(b)
                    .map_err(|e| map_err(e, "s3 store"))?
                    .finish()
            }
            generic if generic.starts_with("opendal+") => {
                // Any OpenDAL service built in (fs, memory, s3, webdav, azblob, gcs), with its
                // options as query parameters; a value "env:NAME" is read from the environment
                // so that keys never appear in arguments.
                let service = &generic["opendal+".len()..];
                let mut opts = Vec::new();
                for (k, v) in &params {
                    let v = match v.strip_prefix("env:") {
                        Some(name) => std::env::var(name).map_err(|_| {
                            config_err(url, format!("option {k} names the environment variable {name}, which is not set"))
                        })?,
                        None => v.clone(),
                    };
                    opts.push((k.clone(), v));
                }
                Operator::via_iter(service, opts)
                    .map_err(|e| config_err(url, format!("OpenDAL service {service:?}: {e}")))?
            }
            other => {
                return Err(config_err(
                    url,
                    format!("unsupported scheme {other:?}: use file://, s3://, memory:// or opendal+SERVICE://?option=value"),
                ))
            }
        };
        let op = op
            .layer(
                TimeoutLayer::new()
                    .with_timeout(Duration::from_secs(60))
                    .with_io_timeout(Duration::from_secs(30)),
            )
            .layer(
                RetryLayer::new()
                    .with_jitter()
                    .with_max_times(6)
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(5)),
            );
        // Concurrent multipart uploads and chunked reads run their parts on tokio.
        op.update_executor(|_| {
            opendal::Executor::with(opendal::executors::TokioExecutor::default())
        });
        Ok(op)
    }
}

impl OpendalStore {
    /// Read object `key`, expected `len` bytes long, as it streams in: each piece is summed
    /// (CRC32C) while it is still in the CPU's cache, and copied into a pooled buffer (see
    /// `pooled`) or one of its own. Returns the bytes kept (at most `len`), how many
    /// arrived, and their CRC32C, for `BlockCheck::verify_summed`.
    async fn get_streamed(&self, key: &str, len: usize) -> Result<(Bytes, usize, u32)> {
        use futures::StreamExt;
        let what = format!("reading {key}");
        let mut stream = self
            .op
            .reader(key)
            .await
            .map_err(|e| map_err(e, &what))?
            .into_stream(..)
            .await
            .map_err(|e| map_err(e, &what))?;
        let mut in_pool = pooled(len).then(|| self.read_bufs.take());
        let mut owned = Vec::new();
        if in_pool.is_none() {
            // Room for what the key says, within reason: a damaged length must not ask for
            // gigabytes before a byte has arrived.
            owned.reserve_exact(len.min(64 << 20));
        }
        let (mut got, mut crc) = (0usize, 0u32);
        while let Some(piece) = stream.next().await {
            for chunk in piece.map_err(|e| map_err(e, &what))? {
                crc = crc32c::crc32c_append(crc, &chunk);
                got += chunk.len();
                // Bytes past `len` are counted, not kept: the length check refuses the block.
                match in_pool.as_mut() {
                    Some(b) => {
                        b.extend(&chunk);
                    }
                    None => {
                        let room = len.saturating_sub(owned.len()).min(chunk.len());
                        owned.extend_from_slice(&chunk[..room]);
                    }
                }
            }
        }
        let b = match in_pool {
            Some(b) => b.freeze(),
            None => Bytes::from(owned),
        };
        Ok((b, got, crc))
    }

    /// The outcome of a blocking read of a local store's file, as the store's error.
    fn local_read_result<T>(
        &self,
        key: &str,
        read: std::result::Result<std::io::Result<T>, tokio::task::JoinError>,
    ) -> Result<T> {
        match read {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::new(
                ErrorKind::NotFound,
                format!("reading {key}: not found in {}", self.display),
            )),
            Ok(Err(e)) => Err(Error::from_io(
                &e,
                format!("reading {key} in {}", self.display),
            )),
            Err(e) => Err(Error::new(
                ErrorKind::Backend,
                format!("reading {key}: {e}"),
            )),
        }
    }
}

#[async_trait]
impl BlockStore for OpendalStore {
    fn display_url(&self) -> String {
        self.display.clone()
    }

    async fn check(&self) -> Result<()> {
        self.op
            .list_with("")
            .limit(1)
            .await
            .map(|_| ())
            .map_err(|e| map_err(e, &format!("reaching {}", self.display)))
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        if let Some(root) = self.local_root.clone() {
            let path = self.local_path(&root, key, "writing")?;
            let what = format!("writing {key} in {}", self.display);
            return match tokio::task::spawn_blocking(move || put_local(&root, &path, &data)).await {
                Ok(r) => r.map_err(|e| Error::from_io(&e, what)),
                Err(e) => Err(Error::new(ErrorKind::Backend, format!("{what}: {e}"))),
            };
        }
        let what = format!("writing {key}");
        let mut w = self.op.writer(key).await.map_err(|e| map_err(e, &what))?;
        let res = async {
            w.write(data).await?;
            w.close().await
        }
        .await;
        if let Err(e) = res {
            // A failed write leaves nothing behind (file://: its temp file; S3: its upload),
            // so a full disk that retries does not fill itself up further.
            let _ = w.abort().await;
            return Err(map_err(e, &what));
        }
        Ok(())
    }

    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        let Some(root) = self.local_root.as_deref() else {
            let (b, len, crc) = self.get_streamed(key, want.len as usize).await?;
            want.verify_summed(key, len, || crc)?;
            return Ok(b);
        };
        let path = self.local_path(root, key, "reading")?;
        let bufs = self.read_bufs.clone();
        let read = tokio::task::spawn_blocking(move || read_local_summed(&path, &bufs)).await;
        let (b, crc) = self.local_read_result(key, read)?;
        want.verify_summed(key, b.len(), || crc)?;
        Ok(b)
    }

    async fn get(&self, key: &str) -> Result<Bytes> {
        if let Some(root) = self.local_root.as_deref() {
            let path = self.local_path(root, key, "reading")?;
            let bufs = self.read_bufs.clone();
            let read = tokio::task::spawn_blocking(move || read_local(&path, &bufs)).await;
            return self.local_read_result(key, read);
        }
        Ok(self
            .op
            .read(key)
            .await
            .map_err(|e| map_err(e, &format!("reading {key}")))?
            .to_bytes())
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        match self.op.stat(key).await {
            Ok(m) => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: m.content_length(),
                modified_ns: ns(m.last_modified()),
                etag: m.etag().map(str::to_string),
            })),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(map_err(e, &format!("checking {key}"))),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        if let Some(root) = self.local_root.as_deref() {
            let path = self.local_path(root, key, "deleting")?;
            let what = format!("deleting {key} in {}", self.display);
            return match tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Ok(Err(e)) => Err(Error::from_io(&e, what)),
                Err(e) => Err(Error::new(ErrorKind::Backend, format!("{what}: {e}"))),
            };
        }
        self.op
            .delete(key)
            .await
            .map_err(|e| map_err(e, &format!("deleting {key}")))
    }

    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        let what = format!("listing {prefix} in {}", self.display);
        let mut lister = match self.op.lister_with(prefix).recursive(true).await {
            Ok(l) => l,
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(map_err(e, &what)),
        };
        let mut page = Vec::with_capacity(1000);
        while let Some(entry) = lister.try_next().await.map_err(|e| map_err(e, &what))? {
            let (path, meta) = entry.into_parts();
            if meta.is_dir() || path.ends_with('/') {
                continue;
            }
            let meta = if meta.last_modified().is_none() {
                // Some services (the local fs) list names only: ask for the rest.
                match self.op.stat(&path).await {
                    Ok(m) => m,
                    Err(e) if e.kind() == opendal::ErrorKind::NotFound => continue, // deleted meanwhile
                    Err(e) => return Err(map_err(e, &what)),
                }
            } else {
                meta
            };
            page.push(ObjectMeta {
                key: path,
                size: meta.content_length(),
                modified_ns: ns(meta.last_modified()),
                etag: meta.etag().map(str::to_string),
            });
            if page.len() >= 1000 {
                f(std::mem::take(&mut page))?;
            }
        }
        if !page.is_empty() {
            f(page)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of every size read back exactly: over 2 MiB and up to 4 MiB into pooled
    /// buffers (whole pages and an unaligned tail), others into a buffer of their own.
    #[test]
    fn local_files_read_back_exactly_pooled_or_not() {
        let bufs = fs_core::BlockPool::new(READ_BUF, 2);
        let dir = tempfile::tempdir().unwrap();
        for (i, len) in [
            0usize,
            100,
            1 << 20,
            (3 << 20) + 4097,
            4 << 20,
            (4 << 20) + 1,
        ]
        .into_iter()
        .enumerate()
        {
            let data: Vec<u8> = (0..len).map(|j| (j * 13 + i) as u8).collect();
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, &data).unwrap();
            for _ in 0..2 {
                let got = read_local(&p, &bufs).unwrap();
                assert_eq!(got.len(), len);
                assert!(got[..] == data[..], "{len} bytes");
                // Summed piece by piece as read: the same bytes, the CRC32C of all of them.
                let (got, crc) = read_local_summed(&p, &bufs).unwrap();
                assert!(got[..] == data[..], "{len} bytes, summed");
                assert_eq!(crc, crc32c::crc32c(&data), "{len} bytes");
            }
        }
        assert!(read_local(&dir.path().join("missing"), &bufs).is_err());
        assert!(read_local_summed(&dir.path().join("missing"), &bufs).is_err());
    }

    /// A local store's block read with its check: the right bytes pass; one changed byte
    /// or a wrong length is `Corrupt`, naming the block.
    #[tokio::test]
    async fn a_damaged_local_block_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = OpendalStore::open(
            &format!("file://{}", dir.path().display()),
            &Default::default(),
        )
        .unwrap();
        // Up to 4 MiB, as blocks are: read and summed piece by piece.
        let data: Vec<u8> = (0..(3 << 20) + 123).map(|j| (j * 31) as u8).collect();
        let key = format!("v/chunks/0/0/7_0_{}", data.len());
        store.put(&key, Bytes::from(data.clone())).await.unwrap();
        let good = BlockCheck::of_key(&key, Some(crc32c::crc32c(&data))).unwrap();
        assert!(store.get_block(&key, good).await.unwrap()[..] == data[..]);
        let path = dir.path().join(&key);
        let mut bad = data.clone();
        bad[(2 << 20) + 7] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let e = store.get_block(&key, good).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(
            e.to_string().contains("fails its checksum") && e.to_string().contains(&key),
            "{e}"
        );
        std::fs::write(&path, &data[..1000]).unwrap();
        let e = store.get_block(&key, good).await.unwrap_err();
        assert!(e.to_string().contains("has 1000 bytes"), "{e}");
    }

    /// A block from a store that is not a local directory, read as it streams in and summed
    /// piece by piece (pooled over 2 MiB and up to 4 MiB, a buffer of its own otherwise):
    /// the right bytes pass; a changed byte, a short or a long object is `Corrupt`, naming
    /// the block; a missing one is `NotFound`. Objects are written in uneven pieces, so that
    /// they stream back in several.
    #[tokio::test]
    async fn a_streamed_block_is_summed_and_checked() {
        use futures::StreamExt;
        let store = OpendalStore::open("memory://", &Default::default()).unwrap();
        let write = |key: String, bytes: Vec<u8>| {
            let op = store.op.clone();
            async move {
                let mut w = op.writer(&key).await.unwrap();
                for piece in bytes.chunks(100_003) {
                    w.write(piece.to_vec()).await.unwrap();
                }
                w.close().await.unwrap();
            }
        };
        for (i, len) in [100usize, 1 << 20, (3 << 20) + 123, 4 << 20, (5 << 20) + 7]
            .into_iter()
            .enumerate()
        {
            let data: Vec<u8> = (0..len).map(|j| (j * 31 + i) as u8).collect();
            let key = format!("v/chunks/0/0/{i}_0_{len}");
            let good = BlockCheck::of_key(&key, Some(crc32c::crc32c(&data))).unwrap();
            let e = store.get_block(&key, good).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
            write(key.clone(), data.clone()).await;
            let mut pieces = 0;
            let mut s = store
                .op
                .reader(&key)
                .await
                .unwrap()
                .into_stream(..)
                .await
                .unwrap();
            while let Some(b) = s.next().await {
                pieces += Iterator::count(b.unwrap());
            }
            assert_eq!(
                pieces,
                len.div_ceil(100_003),
                "{len} bytes stream back in pieces"
            );
            for _ in 0..2 {
                let got = store.get_block(&key, good).await.unwrap();
                assert!(got[..] == data[..], "{len} bytes");
            }
            let mut bad = data.clone();
            bad[len / 2] ^= 1;
            write(key.clone(), bad).await;
            let e = store.get_block(&key, good).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert!(
                e.to_string().contains("fails its checksum") && e.to_string().contains(&key),
                "{e}"
            );
            write(key.clone(), data[..len - 1].to_vec()).await;
            let e = store.get_block(&key, good).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert!(
                e.to_string().contains(&format!("has {} bytes", len - 1)),
                "{e}"
            );
            let mut long = data.clone();
            long.extend_from_slice(&[7; 4096]);
            write(key.clone(), long).await;
            let e = store.get_block(&key, good).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert!(
                e.to_string().contains(&format!("has {} bytes", len + 4096)),
                "{e}"
            );
        }
    }

    /// Aligned bytes (the mount's block buffers) of every shape: whole pages, pages and an
    /// unaligned tail, under a page; and unaligned bytes. Each reads back exactly, on a disk
    /// file system and on tmpfs.
    #[test]
    fn blocks_written_direct_or_buffered_read_back_exactly() {
        let pool = fs_core::BlockPool::new(64 << 10, 1);
        let disk = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        let dirs: Vec<&std::path::Path> = std::iter::once(disk.path())
            .chain(shm.as_ref().map(|d| d.path()))
            .collect();
        for dir in dirs {
            for (i, len) in [4096usize, 3 * 4096 + 17, 100, 64 << 10]
                .into_iter()
                .enumerate()
            {
                let data: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
                let mut b = pool.take();
                assert_eq!(b.extend(&data), len);
                let aligned = b.freeze();
                let p = dir.join(format!("a{i}"));
                write_synced(&p, &aligned).unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), data, "{len} aligned in {dir:?}");
                // The same bytes one past the boundary: never direct.
                let mut v = vec![0u8; len + 1];
                v[1..].copy_from_slice(&data);
                let p = dir.join(format!("u{i}"));
                write_synced(&p, &v[1..]).unwrap();
                assert_eq!(
                    std::fs::read(&p).unwrap(),
                    data,
                    "{len} unaligned in {dir:?}"
                );
                // An existing name is refused, not overwritten.
                assert!(write_synced(&p, &aligned).is_err());
                assert_eq!(std::fs::read(&p).unwrap(), data);
            }
        }
    }

    #[tokio::test]
    async fn file_store_round_trip_and_listing() {
        let dir = tempfile::tempdir().unwrap();
        let s = OpendalStore::open(
            &format!("file://{}/s", dir.path().display()),
            &StoreOptions {
                create: true,
                ..Default::default()
            },
        )
        .unwrap();
        s.put("v/chunks/0/0/1_0_3", Bytes::from_static(b"abc"))
            .await
            .unwrap();
        assert_eq!(&s.get("v/chunks/0/0/1_0_3").await.unwrap()[..], b"abc");
        assert_eq!(s.head("v/chunks/0/0/1_0_3").await.unwrap().unwrap().size, 3);
        assert!(s.head("v/chunks/0/0/2_0_3").await.unwrap().is_none());
        assert_eq!(s.get("nope").await.unwrap_err().kind(), ErrorKind::NotFound);
        // A directory is not a block; a key climbing out of the store is refused.
        assert_ne!(
            s.get("v/chunks").await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        std::fs::write(dir.path().join("outside"), b"x").unwrap();
        let e = s.get("../outside").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let mut seen = Vec::new();
        s.list("v/chunks/", &mut |p| {
            seen.extend(p);
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].key, "v/chunks/0/0/1_0_3");
        assert!(seen[0].modified_ns.is_some());
        s.delete("v/chunks/0/0/1_0_3").await.unwrap();
        assert!(s.head("v/chunks/0/0/1_0_3").await.unwrap().is_none());
    }

    #[test]
    fn bad_store_urls_say_what_is_wrong() {
        for (u, needle) in [
            ("nope", "expected"),
            ("ftp://x", "unsupported scheme"),
            ("file://relative", "absolute path"),
            ("file://tmp/x", "did you mean file:///tmp/x?"),
            ("fil:///x", "unsupported scheme"),
            ("s3://", "no bucket"),
            ("s3://b/p?colour=red", "unknown parameter"),
            ("file:///no/such/store", "does not exist"),
        ] {
            let e = OpendalStore::open(u, &StoreOptions::default())
                .err()
                .unwrap();
            assert!(e.to_string().contains(needle), "{u}: {e}");
        }
    }
}
