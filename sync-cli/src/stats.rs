//! Counters of a run, the summary that adds up, progress output and Prometheus metrics.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct Stats {
    pub listed: AtomicU64,
    pub copied: AtomicU64,
    pub updated: AtomicU64,
    pub skipped: AtomicU64,
    pub excluded: AtomicU64,
    pub failed: AtomicU64,
    pub deleted: AtomicU64,
    pub extra: AtomicU64,
    pub bytes: AtomicU64,
    pub checked: AtomicU64,
    pub pending: AtomicU64,
    pub dst_listed: AtomicU64,
    /// Source entries this run will list, counted ahead by a second listing for the
    /// progress bar (terminal only); `total_known` once that count is complete.
    pub total: AtomicU64,
    pub total_known: std::sync::atomic::AtomicBool,
}

/// Final numbers: listed = copied + updated + skipped + excluded + failed.
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
pub struct Summary {
    pub listed: u64,
    pub copied: u64,
    pub updated: u64,
    pub skipped: u64,
    pub excluded: u64,
    pub failed: u64,
    pub deleted: u64,
    pub extra: u64,
    pub bytes: u64,
    pub checked: u64,
    pub seconds: f64,
}

impl Stats {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn summary(&self, seconds: f64) -> Summary {
        Summary {
            listed: self.listed.load(Relaxed),
            copied: self.copied.load(Relaxed),
            updated: self.updated.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            excluded: self.excluded.load(Relaxed),
            failed: self.failed.load(Relaxed),
            deleted: self.deleted.load(Relaxed),
            extra: self.extra.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            checked: self.checked.load(Relaxed),
            seconds: (seconds * 1000.0).round() / 1000.0,
        }
    }

    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (name, c, help) in [
            ("listed", &self.listed, "source objects listed"),
            (
                "copied",
                &self.copied,
                "objects copied (new on the destination)",
            ),
            (
                "updated",
                &self.updated,
                "objects copied over a different version",
            ),
            ("skipped", &self.skipped, "objects already the same"),
            ("excluded", &self.excluded, "objects left out by filters"),
            ("failed", &self.failed, "objects that failed after retries"),
            ("deleted", &self.deleted, "objects deleted"),
            ("extra", &self.extra, "objects only on the destination"),
            ("copied_bytes", &self.bytes, "bytes copied"),
            ("pending", &self.pending, "objects queued or in flight"),
        ] {
            out.push_str(&format!(
                "# HELP jfs_sync_{name} {help}\n# TYPE jfs_sync_{name} gauge\njfs_sync_{name} {}\n",
                c.load(Relaxed)
            ));
        }
        out
    }
}

impl Summary {
    pub fn adds_up(&self) -> bool {
        self.listed == self.copied + self.updated + self.skipped + self.excluded + self.failed
    }

    pub fn line(&self) -> String {
        format!(
            "listed {}, copied {}, updated {}, skipped {}, excluded {}, failed {}, deleted {}, extra {}, {} bytes in {:.1}s",
            self.listed, self.copied, self.updated, self.skipped, self.excluded, self.failed, self.deleted, self.extra, self.bytes, self.seconds
        )
    }
}
