//! The deletion step of `--delete-dst`: one more unit, claimable only once every range is
//! done without errors, that deletes what the units recorded as extraneous, with the same
//! caps (`--max-delete`) as a single-host run.

use super::*;
use crate::endpoint::{Endpoint, Kind};
use crate::run::{self, Options};
use crate::stats::Summary;
use anyhow::Result;
use std::sync::Arc;

/// The deletion step: once, after every range finished without errors, with the same caps
/// as a single-host run.
pub(super) async fn delete_step(
    w: &Arc<Worker>,
    u: &Unit,
    dst: Arc<dyn Endpoint>,
    base: &Options,
) -> Result<()> {
    let deletes = w.board.deletes().await?;
    let units = w.board.units().await?;
    let listed: u64 = units
        .iter()
        .map(|u| u.dst_listed.max(0) as u64)
        .sum::<u64>()
        .max(deletes.len() as u64);
    if let Some(why) = run::refused(base.max_delete, deletes.len() as u64, listed) {
        let msg = format!("refusing to delete: {why}; nothing was deleted");
        cli_common::eprintln!("jfs-sync: {msg}");
        let f = Finish {
            state: "failed",
            dst_listed: 0,
            error: Some(msg),
            tally: None,
        };
        if !w.board.finish(u.id, u.token, &f).await? {
            w.refused("finishing", u.id, u.token);
        }
        return Ok(());
    }
    let mut ordered = deletes;
    ordered.sort();
    ordered.reverse(); // deepest first: `a/x` before `a/`
    let mut tally = Summary::default();
    let mut files = Vec::new();
    for (key, is_dir) in ordered {
        let kind = if is_dir { Kind::Dir } else { Kind::File };
        match crate::copy::with_retries(base.retries, &key, || dst.delete(&key, kind)).await {
            Ok(()) => {
                tally.deleted += 1;
                if !is_dir {
                    files.push(key);
                }
            }
            Err(e) => {
                tally.failed += 1;
                cli_common::eprintln!("jfs-sync: failed: deleting {key}: {e:#}");
            }
        }
    }
    if !base.dirs {
        crate::endpoint::prune_emptied(&*dst, &files).await;
    }
    let f = Finish {
        state: if tally.failed == 0 { "done" } else { "failed" },
        dst_listed: 0,
        error: (tally.failed > 0).then(|| format!("{} deletes failed", tally.failed)),
        tally: Some(&tally),
    };
    w.done.lock().unwrap_or_else(|p| p.into_inner()).add(&tally);
    if !w.board.finish(u.id, u.token, &f).await? {
        w.refused("finishing", u.id, u.token);
    }
    Ok(())
}
