//! The origin fallback layer of a mirror site: blocks are read from the mirror's own store;
//! a block not there yet (NotFound, and only that) is read from the origin store, verified,
//! served, and written to the mirror store in the background (a read-through fill), so the
//! mirror agent's copier finds it there and skips it.
//!
//! Invariants:
//! - a fallback returns the verified block or an error, never wrong or partial bytes: the
//!   length its key names is checked, and the CRC32C its slice recorded (format 2);
//! - a mirror-store copy that fails its checksum is not served: the block is read again
//!   from the origin, served, and written over the damaged copy (counted);
//! - concurrent reads of one missing block share one origin fetch;
//! - a fill writes the block whole or not at all (the store's put is atomic: a temp file
//!   renamed, or one S3 PUT), so a mount killed during a fill leaves no torn block;
//! - the mirror store is written only by fills and the agent: `put` and `delete` through
//!   this layer are refused (a mirror's data is the primary's).

use crate::metrics::StoreMetrics;
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::{BlockCheck, BlockStore, StoreLayer};
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Fills in flight at once; more are skipped (the agent copies those).
const FILLS_IN_FLIGHT: usize = 16;

/// The longest an origin fetch may take before the read fails (a cut link must give EIO in
/// bounded time, never a hang).
pub const ORIGIN_TIMEOUT: Duration = Duration::from_secs(60);

type Flight = Shared<BoxFuture<'static, Result<Bytes>>>;

/// The blocks this site's readers fetched from the origin, newest last, at most
/// `fs_core::site::WANT_MAX`: the mount publishes them (`mirror.want.<session>`) so that the
/// agent copies them ahead of its background queue.
#[derive(Default)]
pub struct Wanted {
    inner: Mutex<(std::collections::VecDeque<String>, u64)>,
}

impl Wanted {
    fn push(&self, key: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.iter().rev().take(64).any(|k| k == key) {
            return;
        }
        if g.0.len() >= fs_core::site::WANT_MAX {
            g.0.pop_front();
        }
        g.0.push_back(key.to_string());
        g.1 += 1;
    }

    /// The blocks, if they changed since generation `seen`, with the new generation.
    pub fn changed_since(&self, seen: u64) -> Option<(u64, Vec<String>)> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (g.1 != seen).then(|| (g.1, g.0.iter().cloned().collect()))
    }
}

pub struct FallbackStore {
    mirror: Arc<dyn BlockStore>,
    origin: Arc<dyn BlockStore>,
    enabled: bool,
    timeout: Duration,
    flights: Arc<Mutex<HashMap<String, Flight>>>,
    fills: Arc<Semaphore>,
    metrics: Arc<StoreMetrics>,
    wanted: Arc<Wanted>,
}

impl FallbackStore {
    /// `enabled: false` (`--no-fallback`): a block missing at the mirror is an error (counted).
    pub fn new(
        mirror: Arc<dyn BlockStore>,
        origin: Arc<dyn BlockStore>,
        enabled: bool,
        metrics: Arc<StoreMetrics>,
    ) -> FallbackStore {
        FallbackStore {
            mirror,
            origin,
            enabled,
            timeout: ORIGIN_TIMEOUT,
            flights: Default::default(),
            fills: Arc::new(Semaphore::new(FILLS_IN_FLIGHT)),
            metrics,
            wanted: Default::default(),
        }
    }

    /// The blocks readers fetched from the origin (for the agent's copy priority).
    pub fn wanted(&self) -> Arc<Wanted> {
        self.wanted.clone()
    }

    pub fn with_timeout(mut self, t: Duration) -> FallbackStore {
        self.timeout = t;
        self
    }

    /// The one origin fetch of `key`, checked against `want`; `fill`: write the block to the
    /// mirror store in the background (a warm-up that writes it itself passes false, when it
    /// starts the fetch).
    fn flight(&self, key: &str, fill: bool, want: BlockCheck) -> Flight {
        let mut m = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = m.get(key) {
            return f.clone();
        }
        let (origin, mirror) = (self.origin.clone(), self.mirror.clone());
        let (flights, fills, metrics, wanted) = (
            self.flights.clone(),
            self.fills.clone(),
            self.metrics.clone(),
            self.wanted.clone(),
        );
        let timeout = self.timeout;
        let k = key.to_string();
        let f = async move {
            let landing = crate::cached::Landing {
                flights,
                key: k.clone(),
            };
            let r = match tokio::time::timeout(timeout, origin.get_block(&k, want)).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "the origin store {} did not answer for block {k} within {timeout:?}",
                        origin.display_url()
                    ),
                )),
            };
            drop(landing);
            match &r {
                Ok(b) => {
                    metrics.fallback_reads.inc();
                    metrics.fallback_bytes.inc_by(b.len() as u64);
                    wanted.push(&k);
                    if fill {
                        match fills.try_acquire_owned() {
                            Ok(permit) => {
                                let b = b.clone();
                                tokio::spawn(async move {
                                    match mirror.put(&k, b).await {
                                        Ok(()) => {
                                            metrics.fills.inc();
                                        }
                                        Err(e) => {
                                            metrics.fill_errors.inc();
                                            tracing::warn!(block = %k, error = %e, "filling the mirror store with a block read from the origin failed; the agent copies it");
                                        }
                                    }
                                    drop(permit);
                                });
                            }
                            Err(_) => {
                                metrics.fills_skipped.inc();
                            }
                        }
                    }
                }
                Err(e) => {
                    metrics.origin_errors.inc();
                    tracing::error!(block = %k, error = %e, "a block missing at the mirror could not be read from the origin");
                }
            }
            r
        }
        .boxed()
        .shared();
        m.insert(key.to_string(), f.clone());
        f
    }
}

impl FallbackStore {
    /// The mirror's copy, checked; None when the origin must be read instead (missing, or
    /// damaged: counted and logged, and the fill then writes over it).
    async fn mirror_copy(&self, key: &str, want: BlockCheck) -> Result<Option<Bytes>> {
        match self.mirror.get_block(key, want).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !self.enabled {
                    self.metrics.fallback_refused.inc();
                    // Not NotFound: the file exists, its block is not here yet (EIO).
                    return Err(Error::new(
                        ErrorKind::Backend,
                        format!("block {key} is not at the mirror yet and fallback to the origin is off (--no-fallback): {e}"),
                    ));
                }
                Ok(None)
            }
            Err(e) if e.kind() == ErrorKind::Corrupt => {
                self.metrics.mirror_damaged.inc();
                if !self.enabled {
                    return Err(e);
                }
                tracing::warn!(block = %key, error = %e, "the mirror store's copy is damaged: reading the block from the origin and replacing it");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl StoreLayer for FallbackStore {
    fn below(&self) -> &dyn BlockStore {
        &*self.mirror
    }

    fn display_url(&self) -> String {
        format!(
            "{} (falling back to {})",
            self.mirror.display_url(),
            self.origin.display_url()
        )
    }

    async fn put(&self, key: &str, _data: Bytes) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            format!("block {key}: a mirror site's store is written by its agent only (a damaged block there is replaced from the origin by the mirror's reads and its agent; to repair the primary's store, run this at the primary with --repair-from the mirror's store, see runbooks/repair-damaged-block.md)"),
        ))
    }

    /// Block keys are checked by the length they name at least.
    async fn get(&self, key: &str) -> Result<Bytes> {
        match BlockCheck::of_key(key, None) {
            Some(want) => StoreLayer::get_block(self, key, want).await,
            None => self.mirror.get(key).await,
        }
    }

    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        match self.mirror_copy(key, want).await? {
            Some(b) => Ok(b),
            None => self.flight(key, true, want).await,
        }
    }

    /// Warm-up at a mirror fills the mirror store, not only the local cache: a block read
    /// from the origin is written there before this returns.
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        match self.mirror_copy(key, want).await? {
            Some(b) => Ok(b),
            None => {
                let b = self.flight(key, false, want).await?;
                match self.mirror.put(key, b.clone()).await {
                    Ok(()) => self.metrics.fills.inc(),
                    Err(e) => {
                        self.metrics.fill_errors.inc();
                        return Err(e.context(format!(
                            "warming block {key}: writing it to the mirror store"
                        )));
                    }
                };
                Ok(b)
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            format!("block {key}: a mirror site's store is written by its agent only"),
        ))
    }
}
