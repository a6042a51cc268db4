//! A storage cutover's backfill as a sync run: the blocks a volume's metadata references
//! (`endpoint::BlockIndex`) copied from the volume's store to the new one, by size only,
//! with the same engine, limits, resume state and stats as every other sync. `jfs cutover
//! backfill` calls `backfill`; the state machine around it is `fs_core::storage`.

use crate::endpoint::{self, BlockIndex, BlocksEndpoint};
use crate::options::Request;
use crate::run::{self, Report};
use crate::state::State;
use crate::stats::Stats;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::watch;

/// How the backfill copies.
pub struct BackfillOptions {
    pub threads: usize,
    pub bwlimit: Option<String>,
    pub tps: Option<u32>,
}

/// The request a backfill runs: every indexed block whose size differs (a block key is
/// written once, so its size is its identity), a few retries more than a sync's default.
pub fn request(s: &BackfillOptions) -> Request {
    Request {
        threads: s.threads.max(1),
        list_threads: 1,
        list_depth: 0,
        size_only: true,
        retries: 5,
        bwlimit: s.bwlimit.clone(),
        tps: s.tps,
        ..Request::default()
    }
}

/// Copy the blocks of `index` that `to` lacks from `from` (store specs as `jfs-sync` takes
/// them), resuming from the state in `state_dir`. `stats.total` is the number of blocks.
#[allow(clippy::too_many_arguments)]
pub async fn backfill(
    index: Arc<BlockIndex>,
    from: &str,
    to: &str,
    endpoint_flag: Option<&str>,
    state_dir: &Path,
    s: &BackfillOptions,
    stats: Arc<Stats>,
    stop: watch::Receiver<bool>,
) -> Result<Report> {
    let mut opts = request(s).options()?;
    let src = Arc::new(BlocksEndpoint::new(
        endpoint::open(from, endpoint_flag, false, false)
            .await
            .with_context(|| format!("the volume's store {from}"))?,
        index.clone(),
    ));
    let dst = endpoint::open(to, endpoint_flag, true, true)
        .await
        .with_context(|| format!("the new store {to}"))?;
    opts.fit(&*src, &*dst);
    let state = Arc::new(State::open(state_dir)?);
    stats.total.store(index.blocks, Relaxed);
    stats.total_known.store(true, Relaxed);
    run::sync(src, dst, opts, Some(state), stats, stop).await
}
