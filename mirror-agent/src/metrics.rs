//! Prometheus metrics (prometheus-client) shared by both roles, and the `/status` document.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

pub type Labels = Vec<(String, String)>;
type FGauge = Gauge<f64, AtomicU64>;

#[derive(Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The block stores' own metrics, by role ("origin", "mirror"): `jfs_blockstore_*` with
    /// the label `store`.
    stores: Mutex<std::collections::HashMap<String, std::sync::Arc<volume::StoreMetrics>>>,
    // mirror role
    pub applied_seq: Gauge,
    pub primary_head: Gauge,
    pub lag_entries: Gauge,
    pub lag_seconds: FGauge,
    pub window_seconds: FGauge,
    /// The copy bandwidth limit in force (0: none).
    pub copy_limit: Gauge,
    pub within_window: Gauge,
    pub connected: Gauge,
    pub needs_resync: Gauge,
    pub bootstrapping: Gauge,
    /// 1 while a resync is staged beside the live metadata (which serves its previous state).
    pub resync_staged: Gauge,
    /// The staging's applied seq during a staged resync (0 otherwise).
    pub staged_seq: Gauge,
    /// Staged resyncs switched into the live metadata.
    pub resync_switches: Counter,
    pub entries_applied: Counter,
    pub apply_batches: Counter,
    pub frame_errors: Counter,
    pub reconnects: Counter,
    pub blocks_pending: Gauge,
    pub bytes_pending: Gauge,
    pub blocks_failing: Gauge,
    pub blocks_copied: Counter,
    pub bytes_copied: Counter,
    pub blocks_skipped: Counter,
    /// Queued copies dropped because their slice is gone from the mirror's metadata.
    pub blocks_dropped: Counter,
    pub blocks_checksummed: Counter,
    /// Queued copies moved ahead of the queue because a mount at the site read them.
    pub blocks_prioritized: Counter,
    pub blocks_deleted: Counter,
    pub copy_errors: Counter,
    // primary role
    pub head_seq: Gauge,
    pub journal_first: Gauge,
    pub auth_failures: Counter,
    /// Connections dropped before authenticating: not the protocol, too big, too slow, or
    /// over the caps on unauthenticated connections.
    pub unauth_dropped: Counter,
    pub entries_sent: Counter,
    pub journal_trimmed: Counter,
    pub slot_acked: Family<Labels, Gauge>,
    pub slot_lag_entries: Family<Labels, Gauge>,
    pub slot_needs_resync: Family<Labels, Gauge>,
    pub slot_connected: Family<Labels, Gauge>,
    /// Changes forwarded by a mirror's mounts: committed, conflicted (retried there after
    /// catching up), refused (not allowed, outside the file tree, fenced, failed).
    pub fwd_committed: Family<Labels, Counter>,
    pub fwd_conflicts: Family<Labels, Counter>,
    pub fwd_refused: Family<Labels, Counter>,
    /// Seconds spent committing forwarded changes (sum; divide by the counts for a mean).
    pub fwd_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    // mirror role, writes through to the primary
    /// Changes this site's mounts sent, by outcome.
    pub fwd_sent: Counter,
    pub fwd_sent_conflicts: Counter,
    pub fwd_sent_failed: Counter,
    /// Writes this site's mounts reported failed where this agent did not see them (a block
    /// the origin store refused, a change not answered in time).
    pub mount_write_failures: Counter,
    /// Seconds from a mount's request to the primary's answer (sum).
    pub fwd_sent_seconds: Counter<f64, AtomicU64>,
    /// 1 while the primary lets this mirror write and the forward connection is up.
    pub fwd_connected: Gauge,
    /// The JSON served at `/status`, refreshed by the running role.
    pub status: Mutex<serde_json::Value>,
}

impl Metrics {
    /// Forget a dropped slot's series.
    pub fn remove_slot(&self, name: &str) {
        let l = label(name);
        self.slot_acked.remove(&l);
        self.slot_lag_entries.remove(&l);
        self.slot_needs_resync.remove(&l);
        self.slot_connected.remove(&l);
        // And what it forwarded: a dropped mirror is gone from every series.
        self.fwd_committed.remove(&l);
        self.fwd_conflicts.remove(&l);
        self.fwd_refused.remove(&l);
        self.fwd_seconds.remove(&l);
    }

    /// The metrics of the block store in `role`, registered on first use.
    pub fn store(&self, role: &str) -> std::sync::Arc<volume::StoreMetrics> {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores
            .entry(role.to_string())
            .or_insert_with(|| {
                let m = std::sync::Arc::new(volume::StoreMetrics::default());
                let mut r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
                m.register(r.sub_registry_with_label(("store".into(), role.to_string().into())));
                m
            })
            .clone()
    }

    pub fn new(primary: bool) -> Metrics {
        let m = Metrics::default();
        {
            let mut r = m.registry.lock().expect("fresh");
            let r = r.sub_registry_with_prefix("jfs_mirror");
            if primary {
                r.register(
                    "head_seq",
                    "Journal head (last committed sequence number)",
                    m.head_seq.clone(),
                );
                r.register(
                    "journal_first_seq",
                    "First retained journal entry",
                    m.journal_first.clone(),
                );
                r.register(
                    "auth_failures",
                    "Mirror connections refused for bad credentials",
                    m.auth_failures.clone(),
                );
                r.register(
                    "unauthenticated_dropped",
                    "Connections dropped before they authenticated (not the protocol, oversized, too slow, or over the caps)",
                    m.unauth_dropped.clone(),
                );
                r.register(
                    "entries_sent",
                    "Journal entries sent to mirrors",
                    m.entries_sent.clone(),
                );
                r.register(
                    "journal_trimmed",
                    "Journal entries trimmed by the agent",
                    m.journal_trimmed.clone(),
                );
                r.register(
                    "slot_acked_seq",
                    "Last sequence number a mirror acknowledged",
                    m.slot_acked.clone(),
                );
                r.register(
                    "slot_lag_entries",
                    "Entries a mirror has not acknowledged",
                    m.slot_lag_entries.clone(),
                );
                r.register(
                    "slot_needs_resync",
                    "1 when a mirror's slot was dropped (retention cap) and it must resync",
                    m.slot_needs_resync.clone(),
                );
                r.register(
                    "slot_connected",
                    "1 while the mirror is connected",
                    m.slot_connected.clone(),
                );
                r.register(
                    "forwarded_committed",
                    "Changes from a mirror's mounts committed here",
                    m.fwd_committed.clone(),
                );
                r.register(
                    "forwarded_conflicts",
                    "Changes from a mirror's mounts that read an older state (retried there)",
                    m.fwd_conflicts.clone(),
                );
                r.register(
                    "forwarded_refused",
                    "Changes from a mirror's mounts refused or failed",
                    m.fwd_refused.clone(),
                );
                r.register(
                    "forwarded_commit_seconds",
                    "Seconds spent committing changes from a mirror's mounts",
                    m.fwd_seconds.clone(),
                );
            } else {
                r.register(
                    "applied_seq",
                    "Last sequence number applied at this mirror",
                    m.applied_seq.clone(),
                );
                r.register(
                    "forward_sent",
                    "Changes of this site's mounts committed at the primary",
                    m.fwd_sent.clone(),
                );
                r.register(
                    "forward_conflicts",
                    "Changes of this site's mounts that read an older state than the primary's",
                    m.fwd_sent_conflicts.clone(),
                );
                r.register(
                    "forward_failed",
                    "Changes of this site's mounts refused or not answered",
                    m.fwd_sent_failed.clone(),
                );
                r.register(
                    "mount_write_failures",
                    "Writes of this site's mounts that failed where the agent did not see them (the origin store refused a block, no answer in time)",
                    m.mount_write_failures.clone(),
                );
                r.register(
                    "forward_seconds",
                    "Seconds from a mount's change to the primary's answer (sum)",
                    m.fwd_sent_seconds.clone(),
                );
                r.register(
                    "forward_connected",
                    "1 while the primary lets this mirror write and the connection is up",
                    m.fwd_connected.clone(),
                );
                r.register(
                    "primary_head_seq",
                    "The primary's head as last heard",
                    m.primary_head.clone(),
                );
                r.register(
                    "lag_entries",
                    "Entries committed at the primary and not yet applied here",
                    m.lag_entries.clone(),
                );
                r.register(
                    "lag_seconds",
                    "Now minus the commit time of the oldest unapplied entry",
                    m.lag_seconds.clone(),
                );
                r.register(
                    "window_seconds",
                    "The consistency window: lag_seconds above it is out of window",
                    m.window_seconds.clone(),
                );
                r.register(
                    "copy_limit_bytes_per_second",
                    "The block copy bandwidth limit in force (0: unlimited)",
                    m.copy_limit.clone(),
                );
                r.register(
                    "within_window",
                    "1 while the mirror is within its consistency window",
                    m.within_window.clone(),
                );
                r.register(
                    "connected",
                    "1 while connected to the primary",
                    m.connected.clone(),
                );
                r.register(
                    "needs_resync",
                    "1 when the primary dropped this mirror's slot",
                    m.needs_resync.clone(),
                );
                r.register(
                    "bootstrapping",
                    "1 while a snapshot is installed or caught up",
                    m.bootstrapping.clone(),
                );
                r.register(
                    "resync_staged",
                    "1 while a resync is installed beside the live metadata, which serves its previous state",
                    m.resync_staged.clone(),
                );
                r.register(
                    "staged_seq",
                    "During a staged resync: the seq the staging has applied",
                    m.staged_seq.clone(),
                );
                r.register(
                    "resync_switches",
                    "Staged resyncs switched into the live metadata (one atomic write each)",
                    m.resync_switches.clone(),
                );
                r.register(
                    "entries_applied",
                    "Journal entries applied",
                    m.entries_applied.clone(),
                );
                r.register(
                    "apply_batches",
                    "Engine transactions used to apply entries",
                    m.apply_batches.clone(),
                );
                r.register(
                    "frame_errors",
                    "Corrupt or out-of-order frames detected (re-requested, never applied)",
                    m.frame_errors.clone(),
                );
                r.register(
                    "reconnects",
                    "Connections to the primary after the first",
                    m.reconnects.clone(),
                );
                r.register(
                    "blocks_pending",
                    "Block copies queued",
                    m.blocks_pending.clone(),
                );
                r.register(
                    "bytes_pending",
                    "Bytes of block copies queued",
                    m.bytes_pending.clone(),
                );
                r.register(
                    "blocks_failing",
                    "Queued blocks whose last copy attempt failed",
                    m.blocks_failing.clone(),
                );
                r.register(
                    "blocks_copied",
                    "Blocks copied to the mirror store",
                    m.blocks_copied.clone(),
                );
                r.register(
                    "bytes_copied",
                    "Bytes copied to the mirror store",
                    m.bytes_copied.clone(),
                );
                r.register(
                    "blocks_skipped",
                    "Blocks already at the mirror store",
                    m.blocks_skipped.clone(),
                );
                r.register(
                    "blocks_dropped",
                    "Queued copies dropped: their slice is gone from the mirror's metadata (freed)",
                    m.blocks_dropped.clone(),
                );
                r.register(
                    "blocks_checksummed",
                    "Copied blocks checked against their recorded CRC32C (or the origin's MD5 ETag)",
                    m.blocks_checksummed.clone(),
                );
                r.register(
                    "blocks_prioritized",
                    "Queued copies moved ahead because a mount at this site read them from the origin",
                    m.blocks_prioritized.clone(),
                );
                r.register(
                    "blocks_deleted",
                    "Mirror copies deleted after their slice was purged",
                    m.blocks_deleted.clone(),
                );
                r.register(
                    "copy_errors",
                    "Failed block copy attempts (retried)",
                    m.copy_errors.clone(),
                );
            }
        }
        m
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        encode(&mut s, &r).expect("writing to a String");
        s
    }

    pub fn set_status(&self, v: serde_json::Value) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    pub fn status(&self) -> serde_json::Value {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub fn label(name: &str) -> Labels {
    vec![("mirror".to_string(), name.to_string())]
}
