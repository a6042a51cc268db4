//! The decision for one key, given what each side has. Pure: the merge loop feeds it.

use crate::endpoint::{Entry, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// New on the destination.
    Copy,
    /// Exists but differs.
    Update,
    /// Left alone, and why.
    Skip(Why),
    /// Same size and time, but --checksum asks the workers to compare contents.
    Compare,
    /// Only on the destination.
    Extra,
}

/// Why a key was skipped: the summary counts each reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// The destination already has this version.
    UpToDate,
    /// It exists on the destination and --ignore-existing leaves it.
    Exists,
    /// It is not on the destination and --existing creates nothing.
    NotOnDestination,
    /// --update: the destination is as new or newer.
    NotNewer,
    /// A symlink, and --links was not given (never followed).
    Symlink,
}

impl Why {
    pub const ALL: [Why; 5] = [
        Why::UpToDate,
        Why::Exists,
        Why::NotOnDestination,
        Why::NotNewer,
        Why::Symlink,
    ];
    pub fn describe(self) -> &'static str {
        match self {
            Why::UpToDate => "up to date",
            Why::Exists => "exist (--ignore-existing)",
            Why::NotOnDestination => "not on the destination (--existing)",
            Why::NotNewer => "not newer (--update)",
            Why::Symlink => "symlinks (no --links)",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Compare {
    pub checksum: bool,
    /// Same size means current, whatever the times.
    pub size_only: bool,
    pub update: bool,
    pub ignore_existing: bool,
    pub existing: bool,
    pub force_update: bool,
    /// The coarser of the two sides' mtime precisions (ns).
    pub precision_ns: i64,
    /// The destination's mtimes are upload times (object stores).
    pub dst_upload_time: bool,
}

impl Compare {
    /// Same modification time at the coarser side's precision. Against an object store the
    /// destination's time is when it was uploaded: the copy is current if it was uploaded at or
    /// after the source's last change.
    pub fn same_time(&self, src: &Entry, dst: &Entry) -> bool {
        let p = self.precision_ns.max(1);
        if self.dst_upload_time {
            dst.mtime_ns.div_euclid(p) >= src.mtime_ns.div_euclid(p)
        } else {
            dst.mtime_ns.div_euclid(p) == src.mtime_ns.div_euclid(p)
        }
    }

    fn newer(&self, src: &Entry, dst: &Entry) -> bool {
        let p = self.precision_ns.max(1);
        src.mtime_ns.div_euclid(p) > dst.mtime_ns.div_euclid(p)
    }

    pub fn decide(&self, src: Option<&Entry>, dst: Option<&Entry>) -> Action {
        match (src, dst) {
            (None, None) => Action::Skip(Why::UpToDate),
            (None, Some(_)) => Action::Extra,
            (Some(_), None) => {
                if self.existing {
                    Action::Skip(Why::NotOnDestination)
                } else {
                    Action::Copy
                }
            }
            (Some(s), Some(d)) => {
                if self.ignore_existing {
                    return Action::Skip(Why::Exists);
                }
                if self.force_update {
                    return Action::Update;
                }
                match (s.kind, d.kind) {
                    (Kind::Dir, Kind::Dir) => return Action::Skip(Why::UpToDate),
                    (Kind::Symlink, Kind::Symlink) => {
                        return if s.target == d.target {
                            Action::Skip(Why::UpToDate)
                        } else {
                            Action::Update
                        };
                    }
                    (a, b) if a != b => return Action::Update,
                    _ => {}
                }
                if self.update {
                    return if self.newer(s, d) {
                        Action::Update
                    } else {
                        Action::Skip(Why::NotNewer)
                    };
                }
                if s.size != d.size {
                    return Action::Update;
                }
                if self.checksum {
                    return Action::Compare;
                }
                if self.size_only || self.same_time(s, d) {
                    Action::Skip(Why::UpToDate)
                } else {
                    Action::Update
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(size: u64, t: i64) -> Entry {
        Entry {
            key: "k".into(),
            kind: Kind::File,
            size,
            mtime_ns: t,
            mode: None,
            target: None,
            owner: None,
        }
    }

    fn check(c: &Compare, cases: &[(Option<Entry>, Option<Entry>, Action)]) {
        for (s, d, want) in cases {
            assert_eq!(c.decide(s.as_ref(), d.as_ref()), *want, "{c:?} {s:?} {d:?}");
        }
    }

    const S: i64 = 1_000_000_000;

    #[test]
    fn default_is_size_and_mtime_at_the_coarser_precision() {
        let c = Compare {
            precision_ns: S,
            ..Default::default()
        };
        check(
            &c,
            &[
                (Some(e(1, 10 * S + 5)), None, Action::Copy),
                (None, Some(e(1, 0)), Action::Extra),
                (
                    Some(e(1, 10 * S + 5)),
                    Some(e(1, 10 * S)),
                    Action::Skip(Why::UpToDate),
                ), // same second
                (Some(e(1, 11 * S)), Some(e(1, 10 * S)), Action::Update),
                (Some(e(2, 10 * S)), Some(e(1, 10 * S)), Action::Update),
            ],
        );
        let fine = Compare {
            precision_ns: 1,
            ..Default::default()
        };
        check(
            &fine,
            &[(Some(e(1, 10 * S + 5)), Some(e(1, 10 * S)), Action::Update)],
        );
    }

    #[test]
    fn object_store_destinations_compare_against_upload_time() {
        let c = Compare {
            precision_ns: S,
            dst_upload_time: true,
            ..Default::default()
        };
        check(
            &c,
            &[
                (
                    Some(e(1, 10 * S)),
                    Some(e(1, 20 * S)),
                    Action::Skip(Why::UpToDate),
                ), // uploaded after the change
                (Some(e(1, 30 * S)), Some(e(1, 20 * S)), Action::Update), // changed after the upload
            ],
        );
    }

    #[test]
    fn flags() {
        let base = Compare {
            precision_ns: 1,
            ..Default::default()
        };
        let same = (Some(e(1, 5)), Some(e(1, 5)));
        let newer = (Some(e(1, 9)), Some(e(2, 5)));
        let older = (Some(e(1, 1)), Some(e(2, 5)));
        let c = Compare {
            ignore_existing: true,
            ..base.clone()
        };
        check(
            &c,
            &[
                (newer.0.clone(), newer.1.clone(), Action::Skip(Why::Exists)),
                (Some(e(1, 1)), None, Action::Copy),
            ],
        );
        let c = Compare {
            existing: true,
            ..base.clone()
        };
        check(
            &c,
            &[
                (Some(e(1, 1)), None, Action::Skip(Why::NotOnDestination)),
                (newer.0.clone(), newer.1.clone(), Action::Update),
            ],
        );
        let c = Compare {
            force_update: true,
            ..base.clone()
        };
        check(&c, &[(same.0.clone(), same.1.clone(), Action::Update)]);
        let c = Compare {
            update: true,
            ..base.clone()
        };
        check(
            &c,
            &[
                (newer.0.clone(), newer.1.clone(), Action::Update),
                (older.0, older.1, Action::Skip(Why::NotNewer)),
            ],
        );
        let c = Compare {
            size_only: true,
            ..base.clone()
        };
        check(
            &c,
            &[
                (Some(e(1, 9)), Some(e(1, 5)), Action::Skip(Why::UpToDate)),
                (Some(e(2, 5)), Some(e(1, 5)), Action::Update),
            ],
        );
        let c = Compare {
            checksum: true,
            ..base
        };
        check(
            &c,
            &[
                (same.0, same.1, Action::Compare),
                (newer.0, newer.1, Action::Update),
            ],
        );
    }
}
