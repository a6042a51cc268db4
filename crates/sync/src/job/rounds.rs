//! Rounds planned from a source volume's journal (`--from-journal`): one worker reads the
//! journal and stores the changed keys as the round's units; the others wait for its plan,
//! or take over when it does not come within `PLANNING_TIME`.

use super::*;
use crate::endpoint::Endpoint;
use anyhow::Result;
use std::time::Duration;

/// Where a `--from-journal` job stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// The journal entry the last round that ended done brought the destination to.
    pub journal_seq: Option<u64>,
    /// The entry this round brings it to (recorded as `journal_seq` when it ends done).
    pub target: Option<u64>,
    /// This round works on the keys the journal named (`keys_in`), not on listings.
    pub keys: bool,
}

/// A round's plan: the keys the journal named (None: list everything), and the journal
/// entry they reach to.
pub struct Plan {
    pub keys: Option<Vec<String>>,
    pub target: u64,
}

/// How long one worker may take to plan a round before another takes over.
pub(super) const PLANNING_TIME: Duration = Duration::from_secs(300);

/// Keys per unit of a round planned from the journal.
pub(super) const KEYS_PER_UNIT: usize = 2000;

impl Plan {
    /// Where the sorted keys are cut into units (the first unit starts at the beginning).
    pub fn cuts(&self) -> Vec<String> {
        self.keys.as_deref().map_or_else(Vec::new, |k| {
            k.iter()
                .skip(KEYS_PER_UNIT)
                .step_by(KEYS_PER_UNIT)
                .cloned()
                .collect()
        })
    }
}

/// `--from-journal`: create the job, or start its next round once the last one is done,
/// from what the source volume's journal says changed since the job's position (a full
/// listing the first time, or when the journal no longer reaches back). The journal is read
/// by the worker that plans; the copying is shared.
pub async fn plan_round(
    board: &dyn Board,
    spec: &Spec,
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    bwlimit: Option<&str>,
    tps: Option<u32>,
) -> Result<bool> {
    // One worker reads the journal; the others wait for its plan (or take over when it
    // does not come within the planning time).
    let mut waiting = false;
    loop {
        if let Some(have) = board.spec().await? {
            have.check_same_work(spec)?;
            if board.control().await?.state != "done" {
                return Ok(false); // a round is under way: join it
            }
        }
        if board.claim_planning(spec, PLANNING_TIME).await? {
            break;
        }
        if !waiting {
            cli_common::eprintln!("jfs-sync: another worker is planning the next round from the journal: waiting for its plan");
            waiting = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let since = board.round().await?.journal_seq;
    // A shared round's plan holds the keys only: its workers compare rewritten files by
    // size and time (left as it was; a single-host run copies them regardless).
    let (keys, target, _rewritten) = crate::journal::changes(src, dst, since).await?;
    let plan = Plan { keys, target };
    let started = board
        .new_round(&NewRound {
            spec,
            bwlimit,
            tps,
            plan: &plan,
        })
        .await?;
    if started {
        cli_common::eprintln!(
            "jfs-sync: planned a round up to journal entry {target}: {}; other workers join with the same command",
            match &plan.keys {
                Some(k) => format!("{} changed keys in {} units", k.len(), plan.cuts().len() + 1),
                None => "a full listing".to_string(),
            }
        );
    }
    Ok(started)
}
