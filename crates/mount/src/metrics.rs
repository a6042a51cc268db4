//! Metrics of a mount: FUSE operations by type (count, errors, latency), bytes read and
//! written, read-ahead, buffer memory, open handles. Served with the block store's metrics at
//! `--metrics ADDR` and through the control socket (`jfs stats`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

type Latency = Family<OpLabel, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 10 µs .. ~10 s
    Histogram::new(exponential_buckets(0.00001, 2.0, 21))
}

#[derive(Debug)]
pub struct MountMetrics {
    pub ops: Family<OpLabel, Counter>,
    pub op_errors: Family<OpLabel, Counter>,
    pub op_seconds: Latency,
    pub read_bytes: Counter,
    pub write_bytes: Counter,
    /// Blocks the readers fetched (by a read or ahead of it).
    pub blocks_fetched: Counter,
    /// Reads served by a block a reader already held or had in flight.
    pub blocks_reused: Counter,
    /// Of those, blocks brought in by read-ahead.
    pub readahead_hits: Counter,
    /// Bytes held by write buffers and read-ahead (out of `--buffer-size`).
    pub buffer_used: Gauge,
    pub buffer_size: Gauge,
    pub open_handles: Gauge,
    /// Slices committed by write buffers.
    pub slices_committed: Counter,
    /// Writes that failed to store (reported as EIO at flush, fsync or close).
    pub write_errors: Counter,
    /// The journal sequence number this mount's metadata view has reached (a mirror site:
    /// what its agent has applied; a RocksDB reader: what it has caught up with).
    pub applied_seq: Gauge,
    /// Seconds since that number last moved.
    pub applied_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// 1 at a mirror site (reads fall back to the origin; the mirror_* figures apply).
    pub mirror_site: Gauge,
    /// A mirror site: within its consistency window (1) or not (0), as its agent says.
    pub mirror_within_window: Gauge,
    /// A mirror site: seconds behind the primary, as its agent says (-1: unknown).
    pub mirror_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// A mirror site: 1 while its agent installs a resync beside the metadata (this mount
    /// serves the previous state until the switch).
    pub mirror_resyncing: Gauge,
    /// Opens served while out of the window (`--stale serve`).
    pub stale_opens: Counter,
    /// Opens failed while out of the window (`--stale fail`, or `wait` running out).
    pub stale_refused: Counter,
    /// Opens handed to the kernel with a local whole-file copy (FUSE passthrough).
    pub passthrough_opens: Counter,
    /// Whole-file copies made in the local cache for passthrough.
    pub whole_files_made: Counter,
}

impl Default for MountMetrics {
    fn default() -> Self {
        MountMetrics {
            ops: Family::default(),
            op_errors: Family::default(),
            op_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            read_bytes: Counter::default(),
            write_bytes: Counter::default(),
            blocks_fetched: Counter::default(),
            blocks_reused: Counter::default(),
            readahead_hits: Counter::default(),
            buffer_used: Gauge::default(),
            buffer_size: Gauge::default(),
            open_handles: Gauge::default(),
            slices_committed: Counter::default(),
            write_errors: Counter::default(),
            applied_seq: Gauge::default(),
            applied_age_seconds: Gauge::default(),
            mirror_site: Gauge::default(),
            mirror_within_window: Gauge::default(),
            mirror_lag_seconds: Gauge::default(),
            mirror_resyncing: Gauge::default(),
            stale_opens: Counter::default(),
            stale_refused: Counter::default(),
            passthrough_opens: Counter::default(),
            whole_files_made: Counter::default(),
        }
    }
}

impl MountMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("jfs_fuse_ops", "FUSE operations by type", self.ops.clone());
        r.register(
            "jfs_fuse_op_errors",
            "FUSE operations answered with an error, by type",
            self.op_errors.clone(),
        );
        r.register(
            "jfs_fuse_op_seconds",
            "Latency of FUSE operations by type",
            self.op_seconds.clone(),
        );
        r.register(
            "jfs_fuse_read_bytes",
            "Bytes read through the mount",
            self.read_bytes.clone(),
        );
        r.register(
            "jfs_fuse_write_bytes",
            "Bytes written through the mount",
            self.write_bytes.clone(),
        );
        r.register(
            "jfs_reader_blocks_fetched",
            "Blocks fetched by file readers",
            self.blocks_fetched.clone(),
        );
        r.register(
            "jfs_reader_blocks_reused",
            "Reads served from a block a reader already held or had in flight",
            self.blocks_reused.clone(),
        );
        r.register(
            "jfs_readahead_hits",
            "Reads served by blocks fetched ahead",
            self.readahead_hits.clone(),
        );
        r.register(
            "jfs_buffer_used_bytes",
            "Memory held by write buffers and read-ahead",
            self.buffer_used.clone(),
        );
        r.register(
            "jfs_buffer_size_bytes",
            "The memory limit of buffers and read-ahead (--buffer-size)",
            self.buffer_size.clone(),
        );
        r.register(
            "jfs_applied_seq",
            "Journal sequence number the mount's metadata view has reached",
            self.applied_seq.clone(),
        );
        r.register(
            "jfs_applied_age_seconds",
            "Seconds since the mount's applied sequence number last moved",
            self.applied_age_seconds.clone(),
        );
        r.register(
            "jfs_mirror_site",
            "1 when this mount is at a mirror site",
            self.mirror_site.clone(),
        );
        r.register(
            "jfs_mirror_within_window",
            "A mirror site: within its consistency window (1) or not (0)",
            self.mirror_within_window.clone(),
        );
        r.register(
            "jfs_mirror_lag_seconds",
            "A mirror site: seconds behind the primary (-1: unknown)",
            self.mirror_lag_seconds.clone(),
        );
        r.register(
            "jfs_mirror_resyncing",
            "A mirror site: 1 while a resync is installed beside the metadata (the previous state is served)",
            self.mirror_resyncing.clone(),
        );
        r.register(
            "jfs_stale_opens",
            "Opens served while the mirror was out of its window",
            self.stale_opens.clone(),
        );
        r.register(
            "jfs_stale_refused",
            "Opens failed while the mirror was out of its window",
            self.stale_refused.clone(),
        );
        r.register(
            "jfs_passthrough_opens",
            "Opens handed to the kernel with a local whole-file copy (FUSE passthrough)",
            self.passthrough_opens.clone(),
        );
        r.register(
            "jfs_whole_files_made",
            "Whole-file copies made in the local cache for passthrough",
            self.whole_files_made.clone(),
        );
        r.register(
            "jfs_open_handles",
            "Open file handles",
            self.open_handles.clone(),
        );
        r.register(
            "jfs_slices_committed",
            "Slices committed by write buffers",
            self.slices_committed.clone(),
        );
        r.register(
            "jfs_write_errors",
            "Buffered writes that could not be stored (EIO at flush)",
            self.write_errors.clone(),
        );
    }

    pub fn observe(&self, op: &'static str, secs: f64, ok: bool) {
        let l = OpLabel { op };
        self.ops.get_or_create(&l).inc();
        self.op_seconds.get_or_create(&l).observe(secs);
        if !ok {
            self.op_errors.get_or_create(&l).inc();
        }
    }
}

/// Every metric of a mount process in one registry, as Prometheus text.
pub struct Exporter {
    registry: Registry,
}

impl Exporter {
    /// `origin`: at a mirror site, the calls that reached the origin store, exported under
    /// the same names with the label `store="origin"`.
    pub fn new(
        mount: &Arc<MountMetrics>,
        store: &Arc<volume::StoreMetrics>,
        origin: Option<&Arc<volume::StoreMetrics>>,
    ) -> Exporter {
        let mut registry = Registry::default();
        mount.register(&mut registry);
        store.register(&mut registry);
        if let Some(o) = origin {
            o.register(registry.sub_registry_with_label(("store".into(), "origin".into())));
        }
        Exporter { registry }
    }
    pub fn text(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry)
            .expect("encoding metrics into a String cannot fail");
        s
    }
}
