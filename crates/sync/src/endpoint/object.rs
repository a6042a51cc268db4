//! Object stores through OpenDAL (`s3://bucket/prefix`, `memory://`): listings in key order
//! from any key (`start_after`), ranged reads, multipart uploads with parts in flight, and
//! server-side copy when source and destination are the same S3 endpoint and bucket.
//! An object becomes visible only when its upload completes, so a killed run leaves no half
//! object under the real key.

use super::{check_key, Endpoint, Entry, Kind, Listing, Page, Sink};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use objstore::opendal::{self, Operator};
use std::time::UNIX_EPOCH;
use tokio::sync::mpsc;

/// Part size and parts in flight for multipart uploads.
pub const PART: usize = 8 << 20;
const PARTS_IN_FLIGHT: usize = 4;

pub struct ObjectStore {
    op: Operator,
    /// aws-sdk-s3 on the same endpoint (s3:// only): resumable multipart, cross-bucket copy.
    native: Option<super::s3native::S3Native>,
    spec: String,
    /// `scheme://bucket?query` and the prefix, to recognise "the same store".
    bucket_url: String,
    prefix: String,
    endpoint: Option<String>,
}

fn ns(t: Option<opendal::raw::Timestamp>) -> i64 {
    t.map(std::time::SystemTime::from)
        .and_then(|s| s.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64)
}

/// A listed object or directory as the sync sees it.
fn entry(key: String, is_dir: bool, meta: &opendal::Metadata) -> Entry {
    Entry {
        key,
        kind: if is_dir { Kind::Dir } else { Kind::File },
        size: meta.content_length(),
        mtime_ns: ns(meta.last_modified()),
        mode: None,
        target: None,
        owner: None,
    }
}

impl ObjectStore {
    pub fn open(spec: &str, endpoint: Option<&str>) -> Result<Self> {
        let opts = objstore::StoreOptions {
            endpoint: endpoint.map(str::to_string),
            region: None,
            create: false,
        };
        let op = objstore::operator(spec, &opts)?;
        let (scheme, rest) = spec.split_once("://").unwrap_or(("", spec));
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let prefix = prefix.trim_matches('/');
        let params: std::collections::HashMap<&str, &str> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let native_endpoint = endpoint
            .map(str::to_string)
            .or_else(|| params.get("endpoint").map(|v| v.to_string()))
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
        let native = (scheme == "s3").then(|| {
            let p = if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            };
            super::s3native::S3Native::new(
                bucket,
                &p,
                native_endpoint,
                params.get("region").map(|v| v.to_string()),
            )
        });
        Ok(ObjectStore {
            op,
            native: native.flatten(),
            // Only ever shown: never a secret (see objstore::secrets).
            spec: objstore::secrets::redact(spec),
            bucket_url: format!("{scheme}://{bucket}?{query}"),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint: endpoint.map(str::to_string),
        })
    }
}

struct ObjectSink {
    w: opendal::Writer,
}

#[async_trait]
impl Sink for ObjectSink {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        self.w.write(data).await?;
        Ok(())
    }
    async fn finish(mut self: Box<Self>, _src: &Entry, _perms: bool) -> Result<()> {
        self.w.close().await?;
        Ok(())
    }
    async fn abort(mut self: Box<Self>) {
        let _ = self.w.abort().await;
    }
}

#[async_trait]
impl Endpoint for ObjectStore {
    fn describe(&self) -> String {
        self.spec.clone()
    }
    fn mtime_precision_ns(&self) -> i64 {
        1_000_000_000
    }
    fn mtime_is_upload(&self) -> bool {
        true
    }

    async fn list(&self, listing: Listing<'_>, tx: mpsc::Sender<Page>) -> Result<()> {
        if !self.ordered_listing() {
            return super::walk::walk(self, listing, &tx).await;
        }
        let Listing {
            prefix,
            range,
            dirs,
        } = listing;
        let mut l = self.op.lister_with(prefix).recursive(true);
        let after = range.start_after().filter(|a| a.as_str() >= prefix);
        if let Some(a) = &after {
            l = l.start_after(a);
        }
        // Errors are returned: the caller forwards them down the channel.
        let mut lister = match l.await {
            Ok(l) => l,
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(anyhow::Error::from(e).context(format!("listing {}", self.spec))),
        };
        let mut page = Vec::with_capacity(1000);
        let mut last: Option<String> = after.clone();
        loop {
            let Some(item) = lister
                .try_next()
                .await
                .with_context(|| format!("listing {}", self.spec))?
            else {
                break;
            };
            let (path, meta) = item.into_parts();
            if path.is_empty() || path == "/" || path == prefix {
                continue;
            }
            let is_dir = meta.is_dir() || path.ends_with('/');
            if range.past(&path) {
                break;
            }
            if !range.contains(&path) || (is_dir && !dirs) {
                continue;
            }
            if last.as_deref().is_some_and(|l| path.as_str() <= l) {
                anyhow::bail!(
                    "{} listed {path:?} after {last:?}: keys out of order, refusing to continue",
                    self.spec
                );
            }
            last = Some(path.clone());
            page.push(entry(path, is_dir, &meta));
            if page.len() >= 1000 && tx.send(Ok(std::mem::take(&mut page))).await.is_err() {
                return Ok(());
            }
        }
        if !page.is_empty() {
            let _ = tx.send(Ok(page)).await;
        }
        Ok(())
    }

    async fn list_level(&self, prefix: &str) -> Result<Vec<Entry>> {
        let listed = match self.op.list_with(prefix).await {
            Ok(v) => v,
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(
                    anyhow::Error::from(e).context(format!("listing {prefix} in {}", self.spec))
                )
            }
        };
        let mut out = Vec::with_capacity(listed.len());
        for e in listed {
            let (path, meta) = e.into_parts();
            // Some services list the directory itself (as the prefix, or "/" at the root).
            if path.is_empty() || path == "/" || path == prefix {
                continue;
            }
            let is_dir = meta.is_dir() || path.ends_with('/');
            // Some services (fs) list names only: ask for the size and time.
            let meta = if !is_dir && meta.last_modified().is_none() {
                match self.op.stat(&path).await {
                    Ok(m) => m,
                    Err(e) if e.kind() == opendal::ErrorKind::NotFound => continue,
                    Err(e) => return Err(anyhow::Error::from(e).context(format!("stat {path}"))),
                }
            } else {
                meta
            };
            out.push(entry(path, is_dir, &meta));
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn stat(&self, key: &str) -> Result<Option<Entry>> {
        match self.op.stat(key).await {
            Ok(m) => Ok(Some(Entry {
                key: key.to_string(),
                kind: if m.is_dir() { Kind::Dir } else { Kind::File },
                size: m.content_length(),
                mtime_ns: ns(m.last_modified()),
                mode: None,
                target: None,
                owner: None,
            })),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("stat {key}")),
        }
    }

    async fn read(&self, key: &str, offset: u64, len: u64) -> Result<Bytes> {
        let b = self
            .op
            .read_with(key)
            .range(offset..offset + len)
            .await
            .with_context(|| format!("reading {key}"))?
            .to_bytes();
        if b.len() as u64 != len {
            bail!(
                "{key}: got {} bytes at {offset}, expected {len} (object changed during the copy?)",
                b.len()
            );
        }
        Ok(b)
    }

    async fn sink(&self, key: &str, size: u64) -> Result<Box<dyn Sink>> {
        check_key(key)?;
        let mut w = self.op.writer_with(key);
        if size > PART as u64 {
            w = w.chunk(PART).concurrent(PARTS_IN_FLIGHT);
        }
        Ok(Box::new(ObjectSink {
            w: w.await
                .with_context(|| format!("starting the upload of {key}"))?,
        }))
    }

    async fn mkdir(&self, key: &str, _src: &Entry, _perms: bool) -> Result<()> {
        check_key(key)?;
        let k = if key.ends_with('/') {
            key.to_string()
        } else {
            format!("{key}/")
        };
        self.op
            .create_dir(&k)
            .await
            .with_context(|| format!("creating {k}"))?;
        Ok(())
    }

    async fn symlink(&self, key: &str, _target: &str) -> Result<()> {
        Err(super::permanent(format!(
            "{key}: object stores cannot hold symlinks (drop --links or exclude it)"
        )))
    }

    async fn delete(&self, key: &str, _kind: Kind) -> Result<()> {
        self.op
            .delete(key)
            .await
            .with_context(|| format!("deleting {key}"))?;
        Ok(())
    }

    async fn server_side_copy(&self, from: &dyn Endpoint, key: &str, size: u64) -> Result<bool> {
        let Some(src) = from.as_object_store() else {
            return Ok(false);
        };
        if src.endpoint != self.endpoint || !self.bucket_url.starts_with("s3://") {
            return Ok(false);
        }
        if src.bucket_url != self.bucket_url {
            // Another bucket on the same endpoint: CopyObject through aws-sdk-s3. An object the
            // server refuses to copy (over its 5 GiB CopyObject limit) is streamed instead.
            return match (&src.native, &self.native) {
                (Some(a), Some(b)) if a.endpoint == b.endpoint => {
                    match b.copy_from(a, key, size).await {
                        Ok(()) => Ok(true),
                        Err(e)
                            if format!("{e:?}").contains("EntityTooLarge")
                                || format!("{e:?}").contains("InvalidRequest") =>
                        {
                            tracing::info!(key, error = %format!("{e:#}"), "server-side copy refused; streaming instead");
                            Ok(false)
                        }
                        Err(e) => Err(e),
                    }
                }
                _ => Ok(false),
            };
        }
        // One operator at the bucket root sees both prefixes: CopyObject, no bytes through us.
        let root = objstore::operator(
            &self.bucket_url,
            &objstore::StoreOptions {
                endpoint: self.endpoint.clone(),
                region: None,
                create: false,
            },
        )?;
        root.copy(
            &format!("{}{key}", src.prefix),
            &format!("{}{key}", self.prefix),
        )
        .await
        .with_context(|| format!("server-side copy of {key}"))?;
        Ok(true)
    }

    fn as_object_store(&self) -> Option<&ObjectStore> {
        Some(self)
    }
}

impl ObjectStore {
    /// S3 and the in-memory store list keys in order; other services are walked level by level.
    fn ordered_listing(&self) -> bool {
        self.bucket_url.starts_with("s3://") || self.bucket_url.starts_with("memory://")
    }

    pub fn native(&self) -> Option<&super::s3native::S3Native> {
        self.native.as_ref()
    }
}

/// Services without ordered recursive listing are walked one sorted level at a time.
#[async_trait]
impl super::walk::Tree for ObjectStore {
    type Level = std::vec::IntoIter<Entry>;

    async fn level(&self, prefix: &str) -> Result<Self::Level> {
        Ok(self.list_level(prefix).await?.into_iter())
    }

    async fn next(&self, level: &mut Self::Level) -> Result<Option<Entry>> {
        Ok(level.next())
    }
}
