//! Metrics of the block-store stack: what went to the store (count, bytes, latency, errors)
//! and what the local cache served. Prometheus types (atomics), registered by whoever serves
//! them (the mount's `--metrics` endpoint) and read live by `jfs stats`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug)]
pub struct StoreMetrics {
    pub gets: Counter,
    pub get_bytes: Counter,
    pub get_errors: Counter,
    pub get_seconds: Histogram,
    pub puts: Counter,
    pub put_bytes: Counter,
    pub put_errors: Counter,
    pub put_seconds: Histogram,
    pub cache_hits: Counter,
    pub cache_hit_bytes: Counter,
    pub cache_misses: Counter,
    pub cache_miss_bytes: Counter,
    pub cache_evictions: Counter,
    /// Cache files that failed their check (torn, truncated, bit-flipped): removed, refetched.
    pub cache_damaged: Counter,
    pub cache_write_errors: Counter,
    /// Fills skipped (too many in flight, or the disk below its free-space floor).
    pub cache_skipped: Counter,
    pub cache_bytes: Gauge,
    pub cache_items: Gauge,
    pub cache_capacity: Gauge,
    /// Mirror sites: blocks missing at the mirror read from the origin (verified).
    pub fallback_reads: Counter,
    pub fallback_bytes: Counter,
    /// Blocks missing at the mirror while fallback is off (`--no-fallback`): read errors.
    pub fallback_refused: Counter,
    /// Origin fetches that failed (unreachable, timed out, wrong length).
    pub origin_errors: Counter,
    /// Blocks read from the origin and written to the mirror store.
    pub fills: Counter,
    pub fill_errors: Counter,
    /// Fills skipped (too many in flight): the agent copies those blocks.
    pub fills_skipped: Counter,
    /// Mirror-store copies that failed their checksum: read again from the origin and
    /// replaced.
    pub mirror_damaged: Counter,
    /// Blocks a cutover's dual write could not put in the other store: recorded for repair.
    pub dual_repairs: Counter,
    /// 1 while this writer's latest put to a cutover's other store failed.
    pub dual_degraded: Gauge,
}

fn latency() -> Histogram {
    // 100 µs .. ~52 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            gets: Counter::default(),
            get_bytes: Counter::default(),
            get_errors: Counter::default(),
            get_seconds: latency(),
            puts: Counter::default(),
            put_bytes: Counter::default(),
            put_errors: Counter::default(),
            put_seconds: latency(),
            cache_hits: Counter::default(),
            cache_hit_bytes: Counter::default(),
            cache_misses: Counter::default(),
            cache_miss_bytes: Counter::default(),
            cache_evictions: Counter::default(),
            cache_damaged: Counter::default(),
            cache_write_errors: Counter::default(),
            cache_skipped: Counter::default(),
            cache_bytes: Gauge::default(),
            cache_items: Gauge::default(),
            cache_capacity: Gauge::default(),
            fallback_reads: Counter::default(),
            fallback_bytes: Counter::default(),
            fallback_refused: Counter::default(),
            origin_errors: Counter::default(),
            fills: Counter::default(),
            fill_errors: Counter::default(),
            fills_skipped: Counter::default(),
            mirror_damaged: Counter::default(),
            dual_repairs: Counter::default(),
            dual_degraded: Gauge::default(),
        }
    }
}

impl StoreMetrics {
    /// Register every metric under `jfs_` names.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "jfs_blockstore_gets",
            "Blocks fetched from the object store",
            self.gets.clone(),
        );
        r.register(
            "jfs_blockstore_get_bytes",
            "Bytes fetched from the object store",
            self.get_bytes.clone(),
        );
        r.register(
            "jfs_blockstore_get_errors",
            "Failed block fetches",
            self.get_errors.clone(),
        );
        r.register(
            "jfs_blockstore_get_seconds",
            "Latency of block fetches from the object store",
            self.get_seconds.clone(),
        );
        r.register("jfs_blockstore_puts", "Blocks uploaded", self.puts.clone());
        r.register(
            "jfs_blockstore_put_bytes",
            "Bytes uploaded",
            self.put_bytes.clone(),
        );
        r.register(
            "jfs_blockstore_put_errors",
            "Failed uploads",
            self.put_errors.clone(),
        );
        r.register(
            "jfs_blockstore_put_seconds",
            "Latency of block uploads",
            self.put_seconds.clone(),
        );
        r.register(
            "jfs_cache_hits",
            "Blocks served from the local disk cache",
            self.cache_hits.clone(),
        );
        r.register(
            "jfs_cache_hit_bytes",
            "Bytes served from the local disk cache",
            self.cache_hit_bytes.clone(),
        );
        r.register(
            "jfs_cache_misses",
            "Block reads the local cache could not serve",
            self.cache_misses.clone(),
        );
        r.register(
            "jfs_cache_miss_bytes",
            "Bytes of block reads the local cache could not serve",
            self.cache_miss_bytes.clone(),
        );
        r.register(
            "jfs_cache_evictions",
            "Blocks evicted from the local cache",
            self.cache_evictions.clone(),
        );
        r.register(
            "jfs_cache_damaged",
            "Cache files that failed their check and were refetched",
            self.cache_damaged.clone(),
        );
        r.register(
            "jfs_cache_write_errors",
            "Failed writes to the local cache",
            self.cache_write_errors.clone(),
        );
        r.register(
            "jfs_cache_skipped",
            "Cache fills skipped (busy, or the disk at its free-space floor)",
            self.cache_skipped.clone(),
        );
        r.register(
            "jfs_cache_bytes",
            "Bytes in the local cache",
            self.cache_bytes.clone(),
        );
        r.register(
            "jfs_cache_items",
            "Blocks in the local cache",
            self.cache_items.clone(),
        );
        r.register(
            "jfs_cache_capacity_bytes",
            "Capacity of the local cache",
            self.cache_capacity.clone(),
        );
        r.register(
            "jfs_fallback_reads",
            "Blocks missing at the mirror read from the origin store",
            self.fallback_reads.clone(),
        );
        r.register(
            "jfs_fallback_bytes",
            "Bytes read from the origin store for blocks missing at the mirror",
            self.fallback_bytes.clone(),
        );
        r.register(
            "jfs_fallback_refused",
            "Reads of blocks missing at the mirror while fallback is off",
            self.fallback_refused.clone(),
        );
        r.register(
            "jfs_mirror_damaged",
            "Mirror-store blocks that failed their checksum, read again from the origin",
            self.mirror_damaged.clone(),
        );
        r.register(
            "jfs_dual_write_repairs",
            "Blocks a storage cutover's dual write could not put in the other store (recorded for repair)",
            self.dual_repairs.clone(),
        );
        r.register(
            "jfs_dual_write_degraded",
            "1 while this writer's latest put to a storage cutover's other store failed (see `jfs cutover status`)",
            self.dual_degraded.clone(),
        );
        r.register(
            "jfs_origin_errors",
            "Failed fetches from the origin store",
            self.origin_errors.clone(),
        );
        r.register(
            "jfs_fills",
            "Blocks read from the origin and written to the mirror store",
            self.fills.clone(),
        );
        r.register(
            "jfs_fill_errors",
            "Failed writes of fallback blocks to the mirror store",
            self.fill_errors.clone(),
        );
        r.register(
            "jfs_fills_skipped",
            "Fallback blocks not written to the mirror store (too many fills in flight)",
            self.fills_skipped.clone(),
        );
    }
}
