//! Progress of a sync run: an indicatif bar over the entries to list (counted ahead by a
//! second listing) on a terminal, a summary line every interval otherwise.

use crate::run::Options;
use crate::state::State;
use crate::stats::Stats;
use anyhow::Result;
use std::io::IsTerminal;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// For the progress bar's total and ETA: count the source entries this run will list, with
/// a second listing of its own (the run itself streams and never holds the whole listing).
pub fn count_ahead(
    src: &Arc<dyn crate::endpoint::Endpoint>,
    o: &Options,
    state: Option<&State>,
    stats: &Arc<Stats>,
) -> Result<()> {
    if let Some(keys) = &o.keys {
        stats.total.store(keys.len() as u64, Relaxed);
        stats.total_known.store(true, Relaxed);
        return Ok(());
    }
    let after = match state {
        Some(s) => s.cursor()?,
        None => None,
    };
    let range = o.range.resumed(after.as_deref());
    let mut rx = crate::listing::spawn(src.clone(), range, o.dirs, o.list_threads, o.list_depth);
    let stats = stats.clone();
    tokio::spawn(async move {
        while let Some(page) = rx.recv().await {
            match page {
                Ok(p) => {
                    stats.total.fetch_add(p.len() as u64, Relaxed);
                }
                Err(_) => return, // the run reports listing errors; the bar stays open-ended
            }
        }
        stats.total_known.store(true, Relaxed);
    });
    Ok(())
}

pub fn progress(stats: Arc<Stats>, every: Duration, quiet: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if quiet {
            return;
        }
        let t0 = std::time::Instant::now();
        if std::io::stderr().is_terminal() {
            // A bar over the entries to list (counted ahead); its ETA means something once
            // the count is complete, until then the bar says "counting".
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {elapsed_precise} [{bar:30}] {pos}/{len} ({percent}%) ETA {eta} | {msg}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            loop {
                let b = stats.bytes.load(Relaxed);
                let rate = b as f64 / t0.elapsed().as_secs_f64().max(0.001) / (1 << 20) as f64;
                let listed = stats.listed.load(Relaxed);
                let done = listed.saturating_sub(stats.pending.load(Relaxed));
                bar.set_length(stats.total.load(Relaxed).max(listed));
                bar.set_position(done);
                bar.set_message(format!(
                    "{}copied {} | updated {} | skipped {} | failed {} | {} MiB ({rate:.1} MiB/s)",
                    if stats.total_known.load(Relaxed) {
                        ""
                    } else {
                        "counting | "
                    },
                    stats.copied.load(Relaxed),
                    stats.updated.load(Relaxed),
                    stats.skipped.load(Relaxed),
                    stats.failed.load(Relaxed),
                    b >> 20
                ));
                bar.tick();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        } else {
            loop {
                tokio::time::sleep(every.max(Duration::from_millis(100))).await;
                cli_common::eprintln!(
                    "jfs-sync: progress: {}",
                    stats.summary(t0.elapsed().as_secs_f64()).line()
                );
            }
        }
    })
}
