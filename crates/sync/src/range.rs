//! Ranges of the key space: what one listing covers (everything, what follows a resume
//! cursor, one unit of a shared job), and a range end that moves down while it is listed
//! (a shared job hands the back of a running range to an idle worker).
//!
//! Keys compare as bytes; a directory key ends in '/', so a directory sorts just before what
//! it holds.

use std::ops::Bound;

/// A slice of the key space: keys above `lo` and below `hi` (`None`: no upper end), less
/// the subtrees of directories `prune` names (an excluded directory: never opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: Bound<String>,
    pub hi: Option<String>,
    pub prune: Option<Prune>,
}

/// Which directories (keys ending in '/') a listing never opens: the run's filter excludes
/// them and everything under them, so their contents are neither read nor listed (a
/// directory no one may read, or holding names no destination can take, changes nothing).
#[derive(Clone)]
pub struct Prune(pub std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for Prune {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prune")
    }
}

impl PartialEq for Prune {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Prune {}

impl Default for KeyRange {
    fn default() -> Self {
        KeyRange::all()
    }
}

impl KeyRange {
    pub fn all() -> Self {
        KeyRange {
            lo: Bound::Unbounded,
            hi: None,
            prune: None,
        }
    }

    /// `[from, until)`.
    pub fn new(from: Option<String>, until: Option<String>) -> Self {
        KeyRange {
            lo: from.map_or(Bound::Unbounded, Bound::Included),
            hi: until,
            prune: None,
        }
    }

    /// What is left of this range after a resume cursor (every key at or before it resolved).
    pub fn resumed(&self, cursor: Option<&str>) -> Self {
        let mut r = self.clone();
        if let Some(c) = cursor {
            if !self.below(c) {
                r.lo = Bound::Excluded(c.to_string());
            }
        }
        r
    }

    /// The exclusive lower end as a listing's `start_after`: the cursor, or for an inclusive
    /// start a key just before it (a prefix of it; the few keys between are filtered out).
    pub fn start_after(&self) -> Option<String> {
        match &self.lo {
            Bound::Unbounded => None,
            Bound::Excluded(a) => Some(a.clone()),
            Bound::Included(s) => {
                let mut p = s.clone();
                p.pop();
                (!p.is_empty()).then_some(p)
            }
        }
    }

    /// `key` comes before the range.
    pub fn below(&self, key: &str) -> bool {
        match &self.lo {
            Bound::Unbounded => false,
            Bound::Included(s) => key < s.as_str(),
            Bound::Excluded(s) => key <= s.as_str(),
        }
    }

    /// `key` is at or past the upper end (so is everything listed after it).
    pub fn past(&self, key: &str) -> bool {
        self.hi.as_deref().is_some_and(|h| key >= h)
    }

    pub fn contains(&self, key: &str) -> bool {
        !self.below(key) && !self.past(key)
    }

    /// No key under directory `dir` (a key ending in '/') is in the range.
    pub fn skips_tree(&self, dir: &str) -> bool {
        let before = match &self.lo {
            Bound::Unbounded => false,
            Bound::Included(s) | Bound::Excluded(s) => dir < s.as_str() && !s.starts_with(dir),
        };
        before || self.past(dir)
    }
}

/// What a listing that meets entries in key order does with one.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Past the range: the listing ends.
    Stop,
    /// Outside the range: passed over (a directory's subtree is not opened).
    Skip,
    /// A file in the range.
    Keep,
    /// A directory whose subtree meets the range: open it, and list the directory itself
    /// first when `keep`.
    Open { keep: bool },
}

impl KeyRange {
    /// The step for `e`, where directories are listed too when `dirs`.
    pub fn step(&self, e: &crate::entry::Entry, dirs: bool) -> Step {
        if self.past(&e.key) {
            Step::Stop
        } else if e.kind == crate::entry::Kind::Dir {
            if self.skips_tree(&e.key) {
                Step::Skip
            } else if self.prune.as_ref().is_some_and(|p| (p.0)(&e.key)) {
                // Excluded: listed itself (with directories) to be counted, never opened.
                if dirs && self.contains(&e.key) {
                    Step::Keep
                } else {
                    Step::Skip
                }
            } else {
                Step::Open {
                    keep: dirs && self.contains(&e.key),
                }
            }
        } else if self.contains(&e.key) {
            Step::Keep
        } else {
            Step::Skip
        }
    }
}

/// The upper end of a range being worked, which may be lowered while the run goes (a shared
/// job hands the back of a busy range to an idle worker). The run admits each key in order;
/// a cut is accepted only above every key admitted so far, so no key is worked on both sides.
#[derive(Debug, Default)]
pub struct MovableEnd(std::sync::Mutex<(Option<String>, Option<String>)>);

impl MovableEnd {
    /// The run may work on `key` (it is below the end); from now on no cut at or below it.
    pub fn admit(&self, key: &str) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.1.as_deref().is_some_and(|hi| key >= hi) {
            return false;
        }
        if g.0.as_deref().is_none_or(|last| key > last) {
            g.0 = Some(key.to_string());
        }
        true
    }

    /// The last key admitted.
    pub fn last(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Lower the end to `at`: refused when a key at or past `at` was admitted already, or the
    /// end is already at or below it.
    pub fn cut(&self, at: &str) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.as_deref().is_some_and(|last| last >= at)
            || g.1.as_deref().is_some_and(|hi| hi <= at)
        {
            return false;
        }
        g.1 = Some(at.to_string());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_movable_end_is_cut_only_past_what_was_admitted() {
        let e = MovableEnd::default();
        assert!(e.admit("a/1"));
        assert!(e.admit("a/2"));
        assert_eq!(e.last().as_deref(), Some("a/2"));
        // Not at or below a key already admitted.
        assert!(!e.cut("a/2"));
        assert!(!e.cut("a/1"));
        assert!(e.cut("b/"));
        // Keys past the cut are refused from now on; the end only moves down.
        assert!(!e.admit("b/"));
        assert!(!e.admit("c"));
        assert!(e.admit("a/3"));
        assert!(!e.cut("c/"));
        assert!(e.cut("a/5"));
        assert!(!e.admit("a/5"));
        assert!(e.admit("a/4"));
    }
}
