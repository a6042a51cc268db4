//! Commands that talk to a running agent's admin address: `status` (human or JSON, optionally
//! waiting for a mirror to catch up) and `limits`.

use crate::AdminArgs;
use anyhow::{anyhow, bail, Context, Result};
use mirror_agent::config::{Config, MIRROR_ADMIN, PRIMARY_ADMIN};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

/// The addresses to try, in order, and the admin token for changes (if one is known).
pub fn target(a: &AdminArgs) -> Result<(Vec<SocketAddr>, Option<String>)> {
    let cfg = a
        .config
        .as_deref()
        .map(|p| Config::load(Some(p)))
        .transpose()?;
    let addrs = match (a.admin, &cfg) {
        (Some(x), _) => vec![x],
        (None, Some(c)) => vec![c.admin_addr()],
        (None, None) => vec![
            PRIMARY_ADMIN.parse().expect("valid"),
            MIRROR_ADMIN.parse().expect("valid"),
        ],
    };
    let token = if let Some(f) = &a.admin_token_file {
        // As the agent refuses its own token files: the owner's alone.
        mirror_agent::config::check_token_file("--admin-token-file", f)?;
        Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading --admin-token-file {}", f.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        )
    } else if let Ok(t) = std::env::var("MIRROR_AGENT_ADMIN_TOKEN") {
        Some(t.trim().to_string())
    } else {
        // A token the config names but the environment lacks only matters for changes:
        // those then say they need one.
        cfg.as_ref().and_then(|c| c.admin_token().ok().flatten())
    };
    Ok((addrs, token))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// The status of the first address that answers.
pub async fn fetch_status(addrs: &[SocketAddr]) -> Result<(SocketAddr, Value)> {
    for a in addrs {
        if let Ok(r) = client().get(format!("http://{a}/status")).send().await {
            let v: Value = r
                .json()
                .await
                .context("the status document does not decode")?;
            return Ok((*a, v));
        }
    }
    let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    bail!(
        "no agent answers at {} (is it running? give --admin ADDR or --config FILE)",
        list.join(" or ")
    )
}

pub async fn status(a: &AdminArgs, json: bool, wait: Option<u64>, limit: Duration) -> Result<()> {
    let (addrs, _) = target(a)?;
    let (addr, mut v) = fetch_status(&addrs).await?;
    if let Some(seq) = wait {
        if v["role"] == "primary" {
            bail!("the agent at {addr} is a primary agent: --wait-applied waits for a mirror to catch up; give the mirror agent's --admin (its default is {MIRROR_ADMIN})");
        }
        v = wait_applied(addr, seq, limit).await?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", human(&v));
    }
    Ok(())
}

async fn wait_applied(admin: SocketAddr, seq: u64, limit: Duration) -> Result<Value> {
    let t0 = std::time::Instant::now();
    loop {
        let got = fetch_status(&[admin]).await;
        if let Ok((_, v)) = &got {
            let applied = v["applied_seq"].as_u64();
            let pending = v["blocks"]["pending"].as_u64();
            let (Some(applied), Some(pending)) = (applied, pending) else {
                bail!("the status at {admin} has no applied_seq or blocks.pending: is it a mirror agent?");
            };
            // `queued_through` (absent from an older agent's status: applied stands in)
            // says the blocks of the entries up to `seq` are counted in `pending`.
            let queued = v["blocks"]["queued_through"].as_u64().unwrap_or(applied);
            if applied >= seq && queued >= seq && pending == 0 && v["bootstrap"].is_null() {
                return Ok(v.clone());
            }
            if t0.elapsed() > limit {
                bail!(
                    "the mirror has applied {applied} (waiting for {seq}) with {pending} block copies pending after {}",
                    humantime::format_duration(limit)
                );
            }
        } else if t0.elapsed() > limit {
            got?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn secs(v: &Value) -> String {
    match v.as_f64() {
        Some(s) if s < 10.0 => format!("{s:.2} s"),
        Some(s) => format!("{s:.1} s"),
        None => "unknown (not caught up since the agent started)".into(),
    }
}

fn yes(v: &Value) -> &'static str {
    if v.as_bool().unwrap_or(false) {
        "yes"
    } else {
        "no"
    }
}

fn bytes(v: &Value) -> String {
    let n = v.as_u64().unwrap_or(0) as f64;
    match n {
        n if n >= (1u64 << 30) as f64 => format!("{:.1} GiB", n / (1u64 << 30) as f64),
        n if n >= (1u64 << 20) as f64 => format!("{:.1} MiB", n / (1u64 << 20) as f64),
        n if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        n => format!("{n} B"),
    }
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// The status document for a person: one fact per line, units, stale values marked.
pub fn human(v: &Value) -> String {
    let mut o = String::new();
    let mut line = |s: String| {
        o.push_str(&s);
        o.push('\n');
    };
    if v["role"] == "primary" {
        line(format!(
            "role: primary  volume: {}  listen: {}  tls: {}",
            text(&v["volume_uuid"]),
            text(&v["listen"]),
            yes(&v["tls"])
        ));
        line(format!(
            "head seq: {}  journal retained from: {}",
            num(&v["head_seq"]),
            num(&v["journal_first_seq"])
        ));
        line(format!(
            "refused connections: {} authentication, {} unauthenticated dropped",
            num(&v["auth_failures"]),
            num(&v["unauthenticated_dropped"])
        ));
        let mirrors = v["mirrors"].as_array().cloned().unwrap_or_default();
        if mirrors.is_empty() {
            line("mirrors: none registered".into());
        }
        for m in mirrors {
            let mut s = format!(
                "  mirror {}: acked {}  lag {} entries  slot {}  connected: {}",
                text(&m["name"]),
                num(&m["acked_seq"]),
                num(&m["lag_entries"]),
                text(&m["state"]),
                yes(&m["connected"])
            );
            if let Some(r) = m["reason"].as_str() {
                s.push_str(&format!("  ({r})"));
            }
            line(s);
        }
        workers(v, &mut line);
        return o;
    }
    let b = &v["blocks"];
    line(format!(
        "role: mirror {}  primary: {}  connected: {}",
        text(&v["name"]),
        text(&v["primary"]),
        yes(&v["connected"])
    ));
    let heard = match v["primary_heard_seconds_ago"].as_f64() {
        None => "  (stale: never heard from the primary since the agent started)".to_string(),
        Some(s) if !v["connected"].as_bool().unwrap_or(false) || s > 2.0 => {
            format!("  (stale: last heard {} ago)", secs(&Value::from(s)))
        }
        Some(_) => String::new(),
    };
    line(format!(
        "primary head: {}{heard}  applied: {}  acked: {}",
        num(&v["primary_head_seq"]),
        num(&v["applied_seq"]),
        num(&v["acked_seq"])
    ));
    line(format!(
        "lag: {} entries, {}  window: {}  within window: {}",
        num(&v["lag_entries"]),
        secs(&v["lag_seconds"]),
        secs(&v["window_seconds"]),
        yes(&v["within_window"])
    ));
    line(format!(
        "bootstrap: {}  needs resync: {}",
        if v["bootstrap"].is_null() {
            "no".into()
        } else {
            v["bootstrap"].to_string()
        },
        yes(&v["needs_resync"])
    ));
    if v["resync"].is_object() {
        line(format!(
            "resync: staged beside the live metadata, which serves seq {} (stale) until the switch; staging at seq {}",
            num(&v["resync"]["serving_seq"]),
            num(&v["resync"]["staged_seq"]),
        ));
    }
    if let Some(r) = v["refused"].as_str() {
        line(format!("REFUSED by the primary: {r}"));
    }
    // The site's mounts' writes (absent from an older agent's status: nothing printed).
    let w = &v["writes"];
    if w.is_object() {
        let state = match (w["allowed"].as_bool(), w["refused"].as_str()) {
            (Some(true), _) => format!(
                "allowed, link {}",
                if w["connected"].as_bool().unwrap_or(false) {
                    "up"
                } else {
                    "down"
                }
            ),
            (Some(false), Some(r)) => format!("not allowed ({r}); mounts here are read-only"),
            (Some(false), None) => "not allowed; mounts here are read-only".into(),
            _ => "not known yet (the primary has not answered)".into(),
        };
        let mean = match (w["seconds"].as_f64(), w["committed"].as_u64()) {
            (Some(s), Some(n)) if n > 0 => format!(", {:.1} ms each", s * 1e3 / n as f64),
            _ => String::new(),
        };
        // What the mounts reported (absent from an older agent's status: not printed).
        let mounts = match w["mount_failures"].as_u64() {
            Some(n) => format!(", {n} failed at mounts"),
            None => String::new(),
        };
        line(format!(
            "writes: {state}; {} committed at the primary{mean}, {} conflicts, {} failed{mounts}",
            num(&w["committed"]),
            num(&w["conflicts"]),
            num(&w["failed"])
        ));
        if let Some(c) = w["last_failure"].as_str() {
            line(format!("last failed write: {c}"));
        }
    }
    line(format!(
        "blocks: {} pending ({}), {} failing, {} copied ({}), {} skipped, {} deleted",
        num(&b["pending"]),
        bytes(&b["pending_bytes"]),
        num(&b["failing"]),
        num(&b["copied"]),
        bytes(&b["copied_bytes"]),
        num(&b["skipped"]),
        num(&b["deleted"])
    ));
    line(format!(
        "errors: {} block copies, {} damaged messages, {} reconnects",
        num(&b["copy_errors"]),
        num(&v["frame_errors"]),
        num(&v["reconnects"])
    ));
    if let Some(e) = v["last_error"].as_str() {
        line(format!("last connection error: {e}"));
    }
    if let Some(e) = b["last_error"].as_str() {
        line(format!("last block copy error: {e}"));
    }
    workers(v, &mut line);
    o
}

/// The agent's workers, one a line: name, state, errors, the last one (absent from an older
/// agent's status: nothing is printed).
fn workers(v: &Value, line: &mut impl FnMut(String)) {
    let Some(ws) = v["workers"].as_array().filter(|w| !w.is_empty()) else {
        return;
    };
    line("workers:".into());
    for w in ws {
        // A state is a word, or an object naming it (`{"throttled": ...}`).
        let state = match &w["state"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
            other => other.to_string(),
        };
        let mut s = format!(
            "  {}: {state}, {} errors",
            text(&w["name"]),
            num(&w["errors"])
        );
        if let Some(p) = w["status"]["progress"].as_str() {
            s.push_str(&format!(", {p}"));
        }
        if let Some(q) = w["status"]["queue_length"].as_u64() {
            s.push_str(&format!(", {q} queued"));
        }
        if let Some(e) = w["last_error"].as_str() {
            s.push_str(&format!(" (last error: {e})"));
        }
        line(s);
    }
}

pub async fn limits(a: &AdminArgs, bwlimit: Option<String>, tps: Option<u32>) -> Result<()> {
    let mut q = Vec::new();
    if let Some(b) = bwlimit {
        q.push(("bwlimit", b));
    }
    if let Some(t) = tps {
        q.push(("tps", t.to_string()));
    }
    if q.is_empty() {
        bail!("give --bwlimit and/or --tps");
    }
    change_mirror(a, "changing copy limits", |c, addr| {
        c.put(format!("http://{addr}/limits")).query(&q)
    })
    .await
}

/// `mirror-agent resync`: the running mirror bootstraps again from a snapshot.
pub async fn resync(a: &AdminArgs) -> Result<()> {
    change_mirror(a, "a resync", |c, addr| {
        c.post(format!("http://{addr}/resync"))
    })
    .await
}

/// Send a change to a running *mirror* agent with the admin token, and print its answer.
async fn change_mirror(
    a: &AdminArgs,
    what: &str,
    req: impl FnOnce(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> Result<()> {
    let (addrs, token) = target(a)?;
    let (addr, v) = fetch_status(&addrs).await?;
    if v["role"] != "mirror" {
        bail!("the agent at {addr} is a primary agent: {what} is for a mirror agent (its default admin address is {MIRROR_ADMIN})");
    }
    let Some(token) = token else {
        bail!("{what} needs the agent's admin token: --admin-token-file FILE, MIRROR_AGENT_ADMIN_TOKEN, or --config with admin_token_env/admin_token_file");
    };
    let r = req(&client(), &addr.to_string())
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| anyhow!("no agent answers at {addr}: {e}"))?;
    let ok = r.status().is_success();
    let body = r.text().await.unwrap_or_default();
    if !ok {
        bail!("{}", body.trim());
    }
    print!("{body}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_read_as_numbers_and_stale_heads_say_so() {
        let v = serde_json::json!({
            "role": "mirror", "name": "eu", "primary": "p:1", "connected": false,
            "primary_head_seq": 10, "primary_heard_seconds_ago": 35.5, "applied_seq": 9,
            "acked_seq": 9, "lag_entries": 1, "lag_seconds": 5.399550373, "window_seconds": 1.0,
            "within_window": false, "bootstrap": null, "needs_resync": false,
            "refused": "authentication failed", "last_error": "connecting: refused",
            "frame_errors": 0, "reconnects": 3,
            "blocks": {"pending": 0, "pending_bytes": 0, "failing": 1, "copied": 2,
                       "copied_bytes": 8388608, "skipped": 0, "deleted": 0, "copy_errors": 4,
                       "last_error": "k: access denied"}
        });
        let h = super::human(&v);
        assert!(h.contains("lag: 1 entries, 5.40 s"), "{h}");
        assert!(
            !h.contains("writes:"),
            "an older agent's status has none: {h}"
        );
        let mut w = v.clone();
        w["writes"] = serde_json::json!({"allowed": true, "connected": true, "committed": 4,
            "conflicts": 1, "failed": 2, "seconds": 0.02, "refused": null});
        let hw = super::human(&w);
        assert!(
            hw.contains("writes: allowed, link up; 4 committed at the primary, 5.0 ms each, 1 conflicts, 2 failed\n"),
            "{hw}"
        );
        w["writes"]["mount_failures"] = serde_json::json!(3);
        w["writes"]["last_failure"] =
            serde_json::json!("writing block b to the origin store file:///s: denied");
        let hw = super::human(&w);
        assert!(
            hw.contains("2 failed, 3 failed at mounts\n")
                && hw.contains(
                    "last failed write: writing block b to the origin store file:///s: denied"
                ),
            "{hw}"
        );
        w["writes"] = serde_json::json!({"allowed": false, "refused": "may not write", "committed": 0,
            "conflicts": 0, "failed": 0, "seconds": 0.0, "connected": false});
        assert!(super::human(&w)
            .contains("writes: not allowed (may not write); mounts here are read-only"));
        assert!(h.contains("(stale: last heard 35.5 s ago)"), "{h}");
        assert!(
            h.contains("REFUSED by the primary: authentication failed"),
            "{h}"
        );
        assert!(
            h.contains("last connection error: connecting: refused"),
            "{h}"
        );
        assert!(h.contains("last block copy error: k: access denied"), "{h}");
        assert!(h.contains("2 copied (8.0 MiB)"), "{h}");
        assert!(
            !h.contains("workers:"),
            "an older agent's status lists none: {h}"
        );
        let mut v = v;
        v["workers"] = serde_json::json!([
            {"name": "replication", "state": {"throttled": {"secs": 1, "nanos": 0}},
             "errors": 0, "consecutive_errors": 0, "status": {}},
            {"name": "block copier", "state": "idle", "errors": 2, "consecutive_errors": 0,
             "last_error": "origin: timed out",
             "status": {"progress": "0 copies in flight", "queue_length": 3}},
        ]);
        let h = super::human(&v);
        assert!(h.contains("\n  replication: throttled, 0 errors\n"), "{h}");
        assert!(
            h.contains("  block copier: idle, 2 errors, 0 copies in flight, 3 queued (last error: origin: timed out)"),
            "{h}"
        );
        v["lag_seconds"] = serde_json::Value::Null;
        assert!(
            super::human(&v).contains("unknown (not caught up"),
            "{}",
            super::human(&v)
        );
    }
}
