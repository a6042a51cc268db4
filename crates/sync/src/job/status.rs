//! `jfs-sync job status`: the job's progress across its workers (units, totals, rate,
//! ETA, errors).

use super::*;
use crate::stats::Summary;
use anyhow::{Context, Result};
use serde::Serialize;

/// `jfs-sync job status`: the job's progress across workers.
#[derive(Debug, Serialize)]
pub struct Status {
    pub job: String,
    pub state: String,
    pub src: String,
    pub dst: String,
    pub bwlimit: Option<String>,
    pub tps: Option<u32>,
    pub units_done: usize,
    pub units_running: usize,
    pub units_pending: usize,
    pub units_failed: usize,
    pub reassigned: i64,
    /// What the units came to; `seconds` is the job's duration (`elapsed_s`).
    pub totals: Summary,
    /// Bytes per second now, summed over the workers heard from in the last minute (0 once
    /// none is).
    pub rate: f64,
    /// Seconds from the job's start (its round's, with --from-journal) to its end, or to now
    /// while it runs.
    pub elapsed_s: f64,
    /// Bytes per second over `elapsed_s`.
    pub average_rate: f64,
    /// Seconds left at the pace of the units done so far (None before any is done).
    pub eta_s: Option<f64>,
    pub workers: Vec<WorkerReport>,
    pub errors: Vec<String>,
    pub running: Vec<Unit>,
}

pub async fn status(board: &dyn Board, url: &str) -> Result<Status> {
    let spec = board
        .spec()
        .await?
        .with_context(|| format!("no job at {}", meta::redact(url)))?;
    let c = board.control().await?;
    let units = board.units().await?;
    let workers = board.workers().await?;
    let count = |s: &str| units.iter().filter(|u| u.state == s).count();
    let mut totals = Summary::default();
    for u in &units {
        totals.add(&u.tally);
    }
    totals.seconds = (c.elapsed_s * 1000.0).round() / 1000.0;
    let live: Vec<WorkerReport> = workers.into_iter().collect();
    // Folded from +0.0: a sum of no f64 is -0.0, which would print as "-0.0 MiB/s".
    let rate: f64 = live
        .iter()
        .filter(|w| w.age_ms < 60_000 && w.rate.is_finite())
        .fold(0.0, |a, w| a + w.rate.max(0.0));
    let average_rate = if c.elapsed_s > 0.0 {
        totals.bytes as f64 / c.elapsed_s
    } else {
        0.0
    };
    let done = count("done");
    let left = count("pending") + count("running");
    let eta_s = (done > 0 && c.state == "running").then(|| c.age_s / done as f64 * left as f64);
    Ok(Status {
        job: meta::redact(url),
        state: c.state,
        // Records written before inline secrets were refused may still hold one.
        src: objstore::secrets::redact(&spec.src),
        dst: objstore::secrets::redact(&spec.dst),
        bwlimit: c.bwlimit,
        tps: c.tps,
        units_done: done,
        units_running: count("running"),
        units_pending: count("pending") + count("held"),
        units_failed: count("failed"),
        reassigned: units.iter().map(|u| u.reassigned).sum(),
        totals,
        rate,
        elapsed_s: c.elapsed_s,
        average_rate,
        eta_s,
        workers: live,
        errors: units
            .iter()
            .filter_map(|u| {
                u.error
                    .as_ref()
                    .map(|e| format!("unit {} {}: {e}", u.id, describe(u)))
            })
            .collect(),
        running: units.into_iter().filter(|u| u.state == "running").collect(),
    })
}

impl Status {
    pub fn text(&self) -> String {
        let mut s = format!(
            "job {} ({} -> {}): {}\n  units: {} done, {} running, {} pending, {} failed; {} reassigned after a lost lease\n  {}\n  rate {:.1} MiB/s now, {:.1} MiB/s on average over {:.1}s, ETA {}; limits: bwlimit {}, tps {}\n",
            self.job,
            self.src,
            self.dst,
            self.state,
            self.units_done,
            self.units_running,
            self.units_pending,
            self.units_failed,
            self.reassigned,
            self.totals.line(),
            self.rate / (1 << 20) as f64,
            self.average_rate / (1 << 20) as f64,
            self.elapsed_s,
            self.eta_s.map_or("unknown".to_string(), |e| format!("{e:.0}s")),
            self.bwlimit.as_deref().unwrap_or("off"),
            self.tps.map_or("off".to_string(), |t| t.to_string()),
        );
        for w in &self.workers {
            s.push_str(&format!(
                "  worker {} (pid {} on {}): last heard {:.1}s ago, {} units held {:?}, copied {}, {} bytes, {:.1} MiB/s, {} refused saves\n",
                w.worker,
                w.pid,
                w.host,
                w.age_ms as f64 / 1000.0,
                w.units.len(),
                w.units,
                w.totals.copied + w.totals.updated,
                w.totals.bytes,
                w.rate / (1 << 20) as f64,
                w.refused
            ));
        }
        for u in &self.running {
            s.push_str(&format!(
                "  unit {} {} held by {} (lease {:.1}s left), at {}\n",
                u.id,
                describe(u),
                u.owner.as_deref().unwrap_or("?"),
                u.lease_left_ms.unwrap_or(0) as f64 / 1000.0,
                u.cursor.as_deref().unwrap_or("its start")
            ));
        }
        for e in &self.errors {
            s.push_str(&format!("  error: {e}\n"));
        }
        s
    }
}
