//! The store stack, composed in one place for every process (mounts, `jfs`, jfs-sync's
//! volume endpoints, the mirror agent's origin and destination). Bottom to top:
//!
//! 1. the raw store (`objstore`: OpenDAL with its retry and timeout layers, or a local
//!    directory written natively);
//! 2. limits (`LimitedStore`): requests and bytes per second, when the process has limits;
//! 3. metering (`MeteredStore`): what reaches the store, counted and timed, into the
//!    `StoreMetrics` of that store's role (the volume's stores, or the origin's);
//! 4. placement, at a primary (`StorageHolder`, with `DualStore` during a cutover), built of
//!    stores opened by this builder; or, at a mirror, the fallback (`FallbackStore`): the
//!    mirror's store first, the origin's for blocks not yet copied;
//! 5. the read layer (`CachedStore`): the local disk cache and one fetch per block.
//!
//! Layers 1-3 are what `StoreBuilder::open` returns; `open_volume_on` adds 4 and 5.

use crate::limited::{Charge, LimitedStore};
use crate::metrics::StoreMetrics;
use crate::MeteredStore;
use fs_core::error::Result;
use fs_core::BlockStore;
use objstore::limits::Limits;
use std::sync::Arc;

/// Opens stores named by URL with the layers below placement (raw, limits, metering).
#[derive(Clone)]
pub struct StoreBuilder {
    /// S3 endpoint (else from the URL or AWS_ENDPOINT_URL).
    pub endpoint: Option<String>,
    /// Where this builder's stores count their calls.
    pub metrics: Arc<StoreMetrics>,
    /// Limits the stores of this builder share, and which of their calls pay bytes.
    pub limits: Option<(Arc<Limits>, Charge)>,
    /// Create a `file://` store's directory if it is missing.
    pub create: bool,
}

impl StoreBuilder {
    pub fn new(endpoint: Option<String>, metrics: Arc<StoreMetrics>) -> StoreBuilder {
        StoreBuilder {
            endpoint,
            metrics,
            limits: None,
            create: false,
        }
    }

    /// The same builder with its stores under `limits`.
    pub fn limited(mut self, limits: Arc<Limits>, charge: Charge) -> StoreBuilder {
        self.limits = Some((limits, charge));
        self
    }

    /// The same builder, creating a local store's directory when missing.
    pub fn creating(mut self) -> StoreBuilder {
        self.create = true;
        self
    }

    /// Store `url` with the layers of this builder.
    pub fn open(&self, url: &str) -> Result<Arc<dyn BlockStore>> {
        let raw = if self.create {
            crate::create_store(url, self.endpoint.as_deref())
        } else {
            crate::open_store(url, self.endpoint.as_deref())
        }
        .map_err(|e| e.context(format!("opening the block store {url}")))?;
        let limited: Arc<dyn BlockStore> = match &self.limits {
            Some((l, charge)) => Arc::new(LimitedStore::new(raw, l.clone(), *charge)),
            None => raw,
        };
        Ok(Arc::new(MeteredStore::new(limited, self.metrics.clone())))
    }
}
