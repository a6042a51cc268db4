//! What a run is asked to do (`Request`, as `jfs-sync`'s flags or the cutover's backfill say
//! it) and the one place that turns it into the engine's `run::Options`.
//!
//! Invariants: a request is checked and its options built before any endpoint is opened (a
//! bad filter or `--bwlimit` fails before a destination directory is created); `identity`
//! names every option that decides what is copied or deleted, and nothing else, so a resume
//! state or a shared job is picked up only by a run of the same work.

use crate::endpoint::Endpoint;
use crate::filter::Filter;
use crate::limits::{BwSchedule, Limits};
use crate::plan::Compare;
use crate::run::{MaxDelete, Options};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A run's options as given, before they are parsed and checked.
#[derive(Debug, Clone)]
pub struct Request {
    pub threads: usize,
    pub list_threads: usize,
    pub list_depth: usize,
    /// Include (true) and exclude rules, in the order given.
    pub rules: Vec<(bool, String)>,
    pub files_from: Option<PathBuf>,
    pub min_size: Option<u64>,
    pub max_size: Option<u64>,
    pub min_age: Option<Duration>,
    pub max_age: Option<Duration>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub dirs: bool,
    pub perms: bool,
    /// Give copies their source's numeric owner and group (root only; `--owners`).
    pub owners: bool,
    pub links: bool,
    pub from_journal: bool,
    pub checksum: bool,
    pub size_only: bool,
    pub update: bool,
    pub ignore_existing: bool,
    pub existing: bool,
    pub force_update: bool,
    pub check_new: bool,
    pub delete_dst: bool,
    pub delete_src: bool,
    /// "N" objects or "P%" of the destination.
    pub max_delete: Option<String>,
    pub max_failure: Option<u64>,
    pub retries: u32,
    pub dry_run: bool,
    pub bwlimit: Option<String>,
    pub tps: Option<u32>,
}

impl Default for Request {
    /// `jfs-sync`'s defaults.
    fn default() -> Request {
        Request {
            threads: 16,
            list_threads: 4,
            list_depth: 1,
            rules: Vec::new(),
            files_from: None,
            min_size: None,
            max_size: None,
            min_age: None,
            max_age: None,
            start: None,
            end: None,
            dirs: false,
            perms: false,
            owners: false,
            links: false,
            from_journal: false,
            checksum: false,
            size_only: false,
            update: false,
            ignore_existing: false,
            existing: false,
            force_update: false,
            check_new: false,
            delete_dst: false,
            delete_src: false,
            max_delete: None,
            max_failure: None,
            retries: 3,
            dry_run: false,
            bwlimit: None,
            tps: None,
        }
    }
}

fn parse_max_delete(s: &str) -> Result<MaxDelete> {
    Ok(match s.strip_suffix('%') {
        Some(p) => MaxDelete::Percent(
            p.trim()
                .parse()
                .with_context(|| format!("--max-delete {s:?}"))?,
        ),
        None => MaxDelete::Count(
            s.trim()
                .parse()
                .with_context(|| format!("--max-delete {s:?}: a count or a percentage"))?,
        ),
    })
}

impl Request {
    /// Options that contradict each other.
    pub fn check(&self) -> Result<()> {
        if self.update && self.force_update {
            bail!("--update and --force-update contradict each other");
        }
        if self.existing && self.ignore_existing {
            bail!("--existing and --ignore-existing together would copy nothing");
        }
        if self.size_only && self.checksum {
            bail!("--size-only and --checksum contradict each other (sizes only, or contents too)");
        }
        if self.owners {
            crate::endpoint::check_owners("jfs-sync")?;
        }
        Ok(())
    }

    /// The engine's options: filters, limits, deletes and `--files-from`'s keys parsed, with
    /// no endpoint opened yet (`Options::fit` adds what the endpoints tell).
    pub fn options(&self) -> Result<Options> {
        let mut filter = Filter::new(&self.rules)?;
        filter.min_size = self.min_size;
        filter.max_size = self.max_size;
        let now = fs_core::now_ns();
        filter.newest_ns = self.min_age.map(|d| now - d.as_nanos() as i64);
        filter.oldest_ns = self.max_age.map(|d| now - d.as_nanos() as i64);
        filter.start = self.start.clone();
        filter.end = self.end.clone();
        let bw = self
            .bwlimit
            .as_deref()
            .map(BwSchedule::parse)
            .transpose()
            .context("--bwlimit")?;
        let limits = Arc::new(Limits::new(bw, self.tps)?);
        let max_delete = self
            .max_delete
            .as_deref()
            .map(parse_max_delete)
            .transpose()?;
        let keys = match &self.files_from {
            Some(f) => {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("--files-from {}", f.display()))?;
                let mut k: Vec<String> = text
                    .lines()
                    .filter_map(crate::filter::files_from_key)
                    .collect();
                k.sort();
                k.dedup();
                Some(k)
            }
            None => None,
        };
        Ok(Options {
            threads: self.threads,
            list_threads: self.list_threads.max(1),
            list_depth: self.list_depth,
            compare: Compare {
                checksum: self.checksum,
                size_only: self.size_only,
                update: self.update,
                ignore_existing: self.ignore_existing,
                existing: self.existing,
                force_update: self.force_update,
                precision_ns: 1,
                dst_upload_time: false,
            },
            filter,
            delete_dst: self.delete_dst,
            delete_src: self.delete_src,
            max_delete,
            max_failure: self.max_failure,
            dry_run: self.dry_run,
            dirs: self.dirs,
            perms: self.perms,
            owners: self.owners,
            links: self.links,
            check_new: self.check_new,
            retries: self.retries,
            keys_from_user: keys.is_some(),
            keys,
            limits,
            range: Default::default(),
            rewritten: None,
        })
    }

    /// The options that decide which objects are copied and how (a shared job's workers
    /// must agree on them; a resume state is the progress of these and no others), by name.
    pub fn identity(&self) -> String {
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        let num = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
        crate::job::options_identity(&[
            (
                "filters",
                format!(
                    "{:?}",
                    self.rules
                        .iter()
                        .map(|(inc, p)| format!("{} {p}", if *inc { '+' } else { '-' }))
                        .collect::<Vec<_>>()
                ),
            ),
            (
                "--files-from",
                self.files_from
                    .as_ref()
                    .map(|f| {
                        fs_core::place::local(&f.to_string_lossy())
                            .display()
                            .to_string()
                    })
                    .unwrap_or_default(),
            ),
            ("--checksum", self.checksum.to_string()),
            ("--size-only", self.size_only.to_string()),
            ("--update", self.update.to_string()),
            ("--ignore-existing", self.ignore_existing.to_string()),
            ("--existing", self.existing.to_string()),
            ("--force-update", self.force_update.to_string()),
            ("--dirs", self.dirs.to_string()),
            ("--links", self.links.to_string()),
            ("--perms", self.perms.to_string()),
            ("--owners", self.owners.to_string()),
            ("--delete-dst", self.delete_dst.to_string()),
            ("--min-size", num(self.min_size)),
            ("--max-size", num(self.max_size)),
            ("--start", opt(&self.start)),
            ("--end", opt(&self.end)),
            ("--from-journal", self.from_journal.to_string()),
        ])
    }

    /// The same options as the release before named them (one string): a job that release
    /// created is joined when they match.
    pub fn legacy_identity(&self) -> String {
        format!(
            "{:?}|{:?}|{}{}{}{}{}{}{}{}|{:?}|{:?}",
            self.rules,
            self.files_from,
            self.checksum,
            self.update,
            self.ignore_existing,
            self.existing,
            self.force_update,
            self.dirs,
            self.links,
            self.delete_dst,
            (
                self.min_size,
                self.max_size,
                &self.start,
                &self.end,
                self.size_only
            ),
            self.from_journal
        )
    }
}

impl Options {
    /// What the opened endpoints add: the coarser mtime precision of the two, and whether
    /// the destination's mtimes are upload times.
    pub fn fit(&mut self, src: &dyn Endpoint, dst: &dyn Endpoint) {
        self.compare.precision_ns = src.mtime_precision_ns().max(dst.mtime_precision_ns());
        self.compare.dst_upload_time = dst.mtime_is_upload();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contradictions_are_refused_before_anything_is_opened() {
        for (r, why) in [
            (
                Request {
                    update: true,
                    force_update: true,
                    ..Default::default()
                },
                "--update and --force-update",
            ),
            (
                Request {
                    existing: true,
                    ignore_existing: true,
                    ..Default::default()
                },
                "copy nothing",
            ),
            (
                Request {
                    size_only: true,
                    checksum: true,
                    ..Default::default()
                },
                "--size-only and --checksum",
            ),
        ] {
            let e = r.check().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        assert!(Request::default().check().is_ok());
    }

    #[test]
    fn options_parse_limits_and_deletes() {
        let o = Request {
            max_delete: Some("5%".into()),
            bwlimit: Some("10M".into()),
            ..Default::default()
        }
        .options()
        .unwrap();
        assert!(matches!(o.max_delete, Some(MaxDelete::Percent(p)) if p == 5.0));
        let e = Request {
            max_delete: Some("lots".into()),
            ..Default::default()
        }
        .options()
        .map(|_| ())
        .unwrap_err();
        assert!(format!("{e:#}").contains("a count or a percentage"));
        let e = Request {
            bwlimit: Some("fast".into()),
            ..Default::default()
        }
        .options()
        .map(|_| ())
        .unwrap_err();
        assert!(format!("{e:#}").contains("--bwlimit"));
    }

    #[test]
    fn identity_names_what_decides_the_work_and_nothing_else() {
        let a = Request::default();
        let b = Request {
            threads: 64,
            retries: 9,
            dry_run: true,
            ..Default::default()
        };
        assert_eq!(a.identity(), b.identity());
        let c = Request {
            checksum: true,
            ..Default::default()
        };
        assert_ne!(a.identity(), c.identity());
        assert!(c.identity().contains("--checksum=true"));
    }
}
