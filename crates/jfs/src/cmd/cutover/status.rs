//! `jfs cutover status`: the phase and generation, the next step, the repair lists, the
//! sessions not yet following, degraded writers and the audit log.

use super::super::{open_engine, Outcome};
use super::*;
use crate::cli::Global;
use anyhow::Result;
use fs_core::storage::{self, Phase, Role};
use std::time::Duration;

pub(super) async fn status(g: &Global, meta_url: &str, json: bool) -> Result<Outcome> {
    let e = open_engine(g, meta_url, true).await?;
    let st = state_of(&*e).await?;
    let waiting = storage::waiting_sessions(&*e, st.gen, fs_core::session::DEFAULT_TIMEOUT).await?;
    let (ra, rb) = (
        storage::repairs(&*e, Some(Role::A)).await?,
        storage::repairs(&*e, Some(Role::B)).await?,
    );
    let audit = storage::audit_log(&*e).await?;
    // Live writers whose puts to the other store fail.
    let now = fs_core::now_ns();
    let degraded: Vec<(fs_core::session::Session, fs_core::session::Degraded)> =
        fs_core::session::list(&*e)
            .await?
            .into_iter()
            .filter(|s| s.is_live(now, fs_core::session::DEFAULT_TIMEOUT))
            .filter_map(|s| s.degraded.clone().map(|d| (s, d)))
            .collect();
    if json {
        let v = serde_json::json!({
            "state": st,
            "describe": st.phase.describe(),
            "waiting_sessions": waiting,
            "degraded_sessions": degraded.iter().map(|(s, d)| serde_json::json!({
                "session": s.id, "mountpoint": s.mountpoint, "host": s.host, "pid": s.pid, "degraded": d,
            })).collect::<Vec<_>>(),
            "repairs": {"a": ra.len(), "b": rb.len()},
            "audit": audit,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(Outcome::Done);
    }
    println!("storage: {} (generation {})", st.phase.describe(), st.gen);
    let next = match &st.phase {
        Phase::Single { .. } => "nothing in progress (jfs cutover start META_URL --to STORE)",
        Phase::Dual { aborting: true, .. } => &format!(
            "finish the interrupted abort: jfs cutover abort {meta_url} (or jfs cutover switch {meta_url} to make the new store the primary again)"
        ),
        Phase::Dual {
            backfilled: false, ..
        } => "backfill",
        Phase::Dual {
            verified: false, ..
        } => "verify",
        Phase::Dual { .. } => "switch",
        Phase::Switched { .. } => "finish (or abort)",
    };
    println!("next step: {next}");
    println!(
        "repair list: {} blocks missing in the old store (A), {} in the new one (B)",
        ra.len(),
        rb.len()
    );
    if waiting.is_empty() {
        println!("sessions: every live session follows generation {}", st.gen);
    }
    for s in &waiting {
        println!(
            "waiting for session {} ({}@{} pid {}): acknowledged generation {}",
            s.id,
            s.mountpoint,
            s.host,
            s.pid,
            s.acks.get(storage::ACK).copied().unwrap_or(0)
        );
    }
    let now = fs_core::now_ns();
    for (s, d) in &degraded {
        println!(
            "DEGRADED writer {} ({}@{} pid {}): {} blocks it wrote since {:.0}s ago are not in {} (store {}); they are in the repair list. Latest error: {}",
            s.id,
            s.mountpoint,
            s.host,
            s.pid,
            d.failures,
            (now - d.since_ns) as f64 / 1e9,
            d.role.to_uppercase(),
            d.store,
            d.error
        );
    }
    for a in audit.iter().rev().take(10).rev() {
        println!(
            "{}  {:<8} gen {}  {}  ({} -> {})",
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_nanos(a.at_ns.max(0) as u64)
            ),
            a.action,
            a.gen,
            a.who,
            a.from,
            a.to
        );
    }
    Ok(Outcome::Done)
}
