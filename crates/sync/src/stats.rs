//! Counters of a run, the summary that adds up, progress output and Prometheus metrics.

use crate::plan::Why;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct Stats {
    pub listed: AtomicU64,
    pub copied: AtomicU64,
    pub updated: AtomicU64,
    pub skipped: AtomicU64,
    /// `skipped` by reason, indexed as `Why::ALL`.
    pub skip_why: [AtomicU64; 5],
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

/// Final numbers: listed = copied + updated + skipped + excluded + failed. With `dry_run`,
/// copied, updated and deleted are what the run would do.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Summary {
    #[serde(default)]
    pub dry_run: bool,
    pub listed: u64,
    pub copied: u64,
    pub updated: u64,
    pub skipped: u64,
    /// Why keys were skipped (`up_to_date`, `exists`, `not_on_destination`, `not_newer`,
    /// `symlink`): adds up to `skipped`.
    #[serde(default)]
    pub skipped_reasons: BTreeMap<String, u64>,
    pub excluded: u64,
    pub failed: u64,
    pub deleted: u64,
    pub extra: u64,
    pub bytes: u64,
    pub checked: u64,
    /// Of the above, what earlier attempts of this job did before it was interrupted.
    #[serde(default)]
    pub resumed: Option<Box<Summary>>,
    /// A resumed run's second pass over the keys before its resume point (the source may
    /// have changed there since): what it found and did, apart from the counts above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rechecked: Option<Box<Summary>>,
    pub seconds: f64,
}

/// A `Summary` as it is persisted (the resume state's tally, a job unit's tally): a
/// versioned record (`fs_core::record`), so a newer release's tally is refused, not misread.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(transparent)]
pub struct Tally(pub Summary);

impl fs_core::record::Versioned for Tally {
    const KIND: &'static str = "a sync tally record";
    const VERSION: u32 = 1;
}

impl Tally {
    pub fn encode(s: &Summary) -> String {
        String::from_utf8(fs_core::record::encode(&Tally(s.clone()))).expect("JSON is UTF-8")
    }

    pub fn decode(raw: &str) -> fs_core::Result<Summary> {
        fs_core::record::decode::<Tally>(raw.as_bytes()).map(|t| t.0)
    }
}

fn why_name(w: Why) -> String {
    serde_json::to_value(w)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Stats {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn skip(&self, why: Why) {
        Self::add(&self.skipped, 1);
        let i = Why::ALL.iter().position(|w| *w == why).expect("listed");
        Self::add(&self.skip_why[i], 1);
    }

    /// Show `s` (a shared job worker's totals over its units) in these counters.
    pub fn set_from(&self, s: &Summary) {
        for (c, v) in [
            (&self.listed, s.listed),
            (&self.copied, s.copied),
            (&self.updated, s.updated),
            (&self.skipped, s.skipped),
            (&self.excluded, s.excluded),
            (&self.failed, s.failed),
            (&self.deleted, s.deleted),
            (&self.extra, s.extra),
            (&self.bytes, s.bytes),
            (&self.checked, s.checked),
        ] {
            c.store(v, Relaxed);
        }
    }

    pub fn summary(&self, seconds: f64) -> Summary {
        let mut reasons = BTreeMap::new();
        for (i, w) in Why::ALL.iter().enumerate() {
            let n = self.skip_why[i].load(Relaxed);
            if n > 0 {
                reasons.insert(why_name(*w), n);
            }
        }
        Summary {
            dry_run: false,
            listed: self.listed.load(Relaxed),
            copied: self.copied.load(Relaxed),
            updated: self.updated.load(Relaxed),
            skipped: self.skipped.load(Relaxed),
            skipped_reasons: reasons,
            excluded: self.excluded.load(Relaxed),
            failed: self.failed.load(Relaxed),
            deleted: self.deleted.load(Relaxed),
            extra: self.extra.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            checked: self.checked.load(Relaxed),
            resumed: None,
            rechecked: None,
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
            ("skipped", &self.skipped, "objects left as they are"),
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
            && self.skipped_reasons.values().sum::<u64>() == self.skipped
    }

    /// Add `o`'s counts (not its time) to these.
    pub fn add(&mut self, o: &Summary) {
        self.listed += o.listed;
        self.copied += o.copied;
        self.updated += o.updated;
        self.skipped += o.skipped;
        for (k, v) in &o.skipped_reasons {
            *self.skipped_reasons.entry(k.clone()).or_default() += v;
        }
        self.excluded += o.excluded;
        self.failed += o.failed;
        self.deleted += o.deleted;
        self.extra += o.extra;
        self.bytes += o.bytes;
        self.checked += o.checked;
    }

    /// Count one resolved key's outcome.
    pub fn count(&mut self, o: Outcome) {
        self.listed += o.listed as u64;
        match o.kind {
            OutcomeKind::Copied => self.copied += 1,
            OutcomeKind::Updated => self.updated += 1,
            OutcomeKind::Skipped(w) => {
                self.skipped += 1;
                *self.skipped_reasons.entry(why_name(w)).or_default() += 1;
            }
            OutcomeKind::Excluded => self.excluded += 1,
            OutcomeKind::Extra => self.extra += 1,
        }
        self.bytes += o.bytes;
        self.checked += o.checked as u64;
    }

    pub fn line(&self) -> String {
        let would = if self.dry_run { "would " } else { "" };
        let mut skipped = self.skipped.to_string();
        if !self.skipped_reasons.is_empty() {
            let why: Vec<String> = Why::ALL
                .iter()
                .filter_map(|w| {
                    self.skipped_reasons
                        .get(&why_name(*w))
                        .map(|n| format!("{n} {}", w.describe()))
                })
                .collect();
            skipped = format!("{skipped} ({})", why.join(", "));
        }
        let mut s = format!(
            "{}listed {}, {would}copy {}, {would}update {}, skipped {skipped}, excluded {}, failed {}, {would}delete {}, extra {}, {} bytes in {:.1}s",
            if self.dry_run { "dry run: " } else { "" },
            self.listed, self.copied, self.updated, self.excluded, self.failed, self.deleted, self.extra, self.bytes, self.seconds
        );
        if !self.dry_run {
            s = s
                .replace(", copy ", ", copied ")
                .replace(", update ", ", updated ")
                .replace(", delete ", ", deleted ");
        }
        if let Some(r) = &self.resumed {
            s.push_str(&format!(
                "; of these, earlier interrupted attempts: listed {}, copied {}, updated {}, skipped {}, deleted {}",
                r.listed, r.copied, r.updated, r.skipped, r.deleted
            ));
        }
        if let Some(r) = &self.rechecked {
            s.push_str(&format!(
                "; the part before the resume point checked again: listed {}, copied {}, updated {}, deleted {}, failed {}",
                r.listed, r.copied, r.updated, r.deleted, r.failed
            ));
        }
        s
    }
}

/// What happened to one listed key, for the checkpointed tally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    Copied,
    Updated,
    Skipped(Why),
    Excluded,
    /// Only on the destination.
    Extra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub kind: OutcomeKind,
    /// Counted in `listed` (source keys; extra destination keys are not).
    pub listed: bool,
    pub bytes: u64,
    /// Contents were compared (--checksum).
    pub checked: bool,
}

impl Outcome {
    pub fn of(kind: OutcomeKind) -> Self {
        Outcome {
            kind,
            listed: kind != OutcomeKind::Extra,
            bytes: 0,
            checked: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tally as the release before this one wrote it (no version field).
    const TALLY_V1: &str = r#"{"dry_run":false,"listed":3,"copied":1,"updated":1,"skipped":1,"skipped_reasons":{"up_to_date":1},"excluded":0,"failed":0,"deleted":0,"extra":0,"bytes":10,"checked":0,"resumed":null,"seconds":0.5}"#;

    #[test]
    fn a_tally_of_the_release_before_decodes_and_a_newer_one_is_refused() {
        let s = Tally::decode(TALLY_V1).unwrap();
        assert_eq!((s.listed, s.copied, s.bytes, s.seconds), (3, 1, 10, 0.5));
        assert_eq!(s.skipped_reasons.get("up_to_date"), Some(&1));
        assert_eq!(Tally::decode(&Tally::encode(&s)).unwrap(), s);
        assert!(Tally::encode(&s).contains(r#""version":1"#));
        let newer = TALLY_V1.replacen('{', r#"{"version":2,"#, 1);
        let e = Tally::decode(&newer).unwrap_err();
        assert_eq!(e.kind(), fs_core::ErrorKind::UnsupportedVersion);
        assert!(e.to_string().contains("newer release"), "{e}");
    }

    #[test]
    fn lines_say_would_in_a_dry_run_and_why_things_were_skipped() {
        let mut s = Summary::default();
        s.count(Outcome::of(OutcomeKind::Copied));
        s.count(Outcome::of(OutcomeKind::Skipped(Why::Symlink)));
        s.count(Outcome::of(OutcomeKind::Skipped(Why::UpToDate)));
        s.deleted = 2;
        assert!(s.adds_up());
        let l = s.line();
        assert!(l.contains("copied 1") && l.contains("deleted 2"), "{l}");
        assert!(
            l.contains("skipped 2 (1 up to date, 1 symlinks (no --links))"),
            "{l}"
        );
        s.dry_run = true;
        let l = s.line();
        assert!(
            l.starts_with("dry run: ")
                && l.contains("would copy 1")
                && l.contains("would delete 2"),
            "{l}"
        );
    }
}
