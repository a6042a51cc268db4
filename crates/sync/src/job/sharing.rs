//! Sharing the work: a fresh unit is cut at the directory level its range starts at
//! (`cuts`), and a running unit hands the back of its range to an idle worker when one asks
//! (`UnitProgress::save`, `share_cut`). Its resume point is saved under its token, so a
//! save whose lease passed to another worker is refused and records nothing.

use super::*;
use crate::endpoint::{Endpoint, Entry, Kind};
use crate::range::{KeyRange, MovableEnd};
use crate::run::Shared;
use crate::stats::Summary;
use anyhow::{bail, Result};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};

/// Where to cut a fresh unit: at each subdirectory of the directory its range starts at, and
/// every `FILES_PER_UNIT` files between them, at most `MAX_CUTS` cuts (evenly thinned).
pub(super) const FILES_PER_UNIT: usize = 2000;
pub(super) const MAX_CUTS: usize = 63;
/// Directories deeper than this are not split further.
pub(super) const MAX_SPLIT_DEPTH: usize = 4;

pub async fn cuts(src: &dyn Endpoint, u: &Unit) -> Result<Vec<String>> {
    let prefix = match &u.lo {
        None => String::new(),
        Some(lo) if lo.ends_with('/') => lo.clone(),
        Some(_) => return Ok(Vec::new()),
    };
    if prefix.matches('/').count() >= MAX_SPLIT_DEPTH {
        return Ok(Vec::new());
    }
    let kids = match src.list_level(&prefix).await {
        Ok(k) => k,
        Err(e) if e.is::<crate::endpoint::TooWide>() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let range = u.range();
    let mut cuts = Vec::new();
    let mut files = 0;
    for (i, k) in kids.iter().enumerate() {
        if !range.contains(&k.key) {
            continue;
        }
        let cut = i > 0 && (k.kind == Kind::Dir || files >= FILES_PER_UNIT);
        if cut && u.lo.as_deref().is_none_or(|lo| k.key.as_str() > lo) {
            cuts.push(k.key.clone());
            files = 0;
        }
        if k.kind != Kind::Dir {
            files += 1;
        }
    }
    if cuts.len() > MAX_CUTS {
        let step = cuts.len().div_ceil(MAX_CUTS);
        cuts = cuts.into_iter().step_by(step).collect();
    }
    Ok(cuts)
}

/// The resume point of a held unit, saved to the job under its token, and the back of its
/// range handed to an idle worker when one asks.
pub(super) struct UnitProgress {
    pub(super) me: std::sync::Weak<UnitProgress>,
    pub(super) w: Arc<Worker>,
    pub(super) id: i64,
    pub(super) token: i64,
    pub(super) start: (Option<String>, Summary),
    pub(super) src: Arc<dyn Endpoint>,
    /// The range as recorded in the job (its upper end lowered by each confirmed cut).
    pub(super) range: Mutex<KeyRange>,
    pub(super) end: Arc<MovableEnd>,
    /// Held while a cut is made; holds a cut applied here but not yet confirmed by the job.
    pub(super) cutting: tokio::sync::Mutex<Option<String>>,
}

impl UnitProgress {
    /// An idle worker asked for a share: cut the rest of the range where a listing level
    /// along the last key worked on has entries left, and record the cut in the job. The
    /// run here stops at the cut before the job hears of it, so no key is worked twice.
    async fn share(self: Arc<Self>) {
        let Ok(mut pending) = self.cutting.try_lock() else {
            return; // a cut is being made
        };
        if pending.is_some() {
            return; // the last one is not confirmed yet: the end of the run settles it
        }
        let Some(last) = self.end.last() else { return };
        let range = self.range.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // A round of journal keys is cut into small units up front; they are not shared.
        let found = if self.w.keys_mode {
            Ok(None)
        } else {
            share_cut(&*self.src, &range, &last).await
        };
        let cut = match found {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(unit = self.id, error = %format!("{e:#}"), "looking for where to share a range");
                return;
            }
        };
        let Some(cut) = cut else {
            // Nothing left worth handing over: say so, so that nobody asks again.
            if let Ok(false) = self.w.board.split(self.id, self.token, &[]).await {
                self.w.refused("declining to share", self.id, self.token);
            }
            return;
        };
        if !self.end.cut(&cut) {
            return; // the run went past it meanwhile: the next save tries again
        }
        *pending = Some(cut);
        self.confirm_cut(&mut pending).await;
    }

    /// Record the cut held in `pending` in the job: Some(true) once recorded (or when there
    /// is none), Some(false) when the lease passed to another worker, None when unanswered.
    /// Cutting again at the same key is harmless (the second piece would be empty), so an
    /// unanswered call is simply repeated.
    pub(super) async fn confirm_cut(&self, pending: &mut Option<String>) -> Option<bool> {
        let Some(cut) = pending.clone() else {
            return Some(true);
        };
        match self
            .w
            .board
            .split(self.id, self.token, std::slice::from_ref(&cut))
            .await
        {
            Ok(true) => {
                tracing::info!(unit = self.id, at = %cut, "handed the back of the range to an idle worker");
                cli_common::eprintln!(
                    "jfs-sync: unit {}: handed the keys from {cut} on to an idle worker",
                    self.id
                );
                self.range.lock().unwrap_or_else(|p| p.into_inner()).hi = Some(cut);
                *pending = None;
                Some(true)
            }
            Ok(false) => {
                self.w.refused("sharing", self.id, self.token);
                Some(false)
            }
            Err(e) if is_gone(&e) => {
                self.w.note(&e);
                Some(false)
            }
            Err(e) => {
                tracing::warn!(unit = self.id, error = %format!("{e:#}"), "recording a cut of the range");
                None
            }
        }
    }
}

/// Where to cut what is left of `range` after `last` (the last key worked on): at the middle
/// of the entries left at the shallowest directory level along `last` that has at least
/// two left (or one directory), so the holder keeps the front and the subtree it is in.
pub(super) async fn share_cut(
    src: &dyn Endpoint,
    range: &KeyRange,
    last: &str,
) -> Result<Option<String>> {
    let mut levels = vec![String::new()];
    levels.extend(last.match_indices('/').map(|(i, _)| last[..=i].to_string()));
    for prefix in levels {
        if !prefix.is_empty() && range.skips_tree(&prefix) {
            continue;
        }
        let kids = match src.list_level(&prefix).await {
            Ok(k) => k,
            Err(e) if e.is::<crate::endpoint::TooWide>() => continue,
            Err(e) => return Err(e),
        };
        let left: Vec<&Entry> = kids
            .iter()
            .filter(|k| k.key.as_str() > last && !range.past(&k.key))
            .filter(|k| {
                if k.kind == Kind::Dir {
                    !range.skips_tree(&k.key)
                } else {
                    range.contains(&k.key)
                }
            })
            .collect();
        match left.len() {
            0 => {}
            1 if left[0].kind == Kind::Dir => return Ok(Some(left[0].key.clone())),
            1 => {}
            n => return Ok(Some(left[n / 2].key.clone())),
        }
    }
    Ok(None)
}

#[async_trait]
impl Shared for UnitProgress {
    fn start(&self) -> (Option<String>, Summary) {
        self.start.clone()
    }
    async fn save(
        &self,
        cursor: &str,
        tally: &Summary,
        deletes: Vec<(String, bool)>,
    ) -> Result<()> {
        let saved = self
            .w
            .board
            .save(
                self.id,
                self.token,
                &Progress {
                    cursor,
                    tally,
                    deletes: &deletes,
                },
            )
            .await;
        if let Err(e) = &saved {
            self.w.note(e);
        }
        match saved? {
            Saved::Kept => Ok(()),
            Saved::ShareWanted => {
                if let Some(me) = self.me.upgrade() {
                    tokio::spawn(me.share());
                }
                Ok(())
            }
            Saved::Refused => {
                self.w.refused("saving progress", self.id, self.token);
                bail!("unit {}: the lease passed to another worker", self.id)
            }
        }
    }

    fn end(&self) -> Option<Arc<MovableEnd>> {
        Some(self.end.clone())
    }
}
