//! The admin endpoint: `GET /metrics` (Prometheus text) and `GET /status` (JSON) for anyone
//! who can reach it; changes need the admin token (`Authorization: Bearer TOKEN`, from
//! `admin_token_env` / `admin_token_file`): `PUT /limits?bwlimit=RATE&tps=N` and
//! `POST /resync` at a mirror, `DELETE /slots/NAME` at a primary. Without a configured token,
//! changes are refused. `/status` is what the agent's status worker last wrote, with the
//! supervisor's list of workers added.

use crate::metrics::Metrics;
use async_trait::async_trait;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put};
use axum::Router;
use hmac::{Hmac, Mac};
use objstore::limits::{BwSchedule, Limits};
use sha2::Sha256;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a primary lets an operator change through the admin address.
#[async_trait]
pub trait SlotAdmin: Send + Sync {
    /// Drop a mirror's replication slot; a line saying what was done.
    async fn drop_slot(&self, name: &str) -> anyhow::Result<String>;
}

/// What a mirror lets an operator ask for through the admin address.
#[async_trait]
pub trait ResyncAdmin: Send + Sync {
    /// Bootstrap again from a snapshot; a line saying what was done.
    async fn resync(&self) -> anyhow::Result<String>;
}

#[derive(Clone)]
pub struct Admin {
    pub metrics: Arc<Metrics>,
    /// The credential for changes; None: changes are refused.
    pub token: Option<String>,
    /// A mirror's copy limits.
    pub limits: Option<Arc<Limits>>,
    /// A primary's slots.
    pub slots: Option<Arc<dyn SlotAdmin>>,
    /// A mirror's resync.
    pub resync: Option<Arc<dyn ResyncAdmin>>,
    /// The agent's workers, listed in `/status` (`workers`).
    pub workers: Arc<background::Supervisor>,
}

pub async fn serve(
    addr: SocketAddr,
    app: Admin,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("admin address {addr}: {e}"))?;
    let router = Router::new()
        .route("/metrics", get(metrics_h))
        .route("/status", get(status_h))
        .route("/limits", put(limits_h))
        .route("/slots/{name}", delete(drop_slot_h))
        .route("/resync", post(resync_h))
        .with_state(app);
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    }))
}

/// Constant-time comparison of the presented token with the configured one.
fn same_token(configured: &str, presented: &str) -> bool {
    let tag = |key: &str| {
        let mut m = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
        m.update(b"jfs-admin");
        m
    };
    let presented_tag = tag(presented).finalize().into_bytes();
    tag(configured).verify_slice(&presented_tag).is_ok()
}

/// Ok when the request carries the admin token; otherwise the refusal to send back.
fn authorized(a: &Admin, h: &HeaderMap) -> Result<(), (StatusCode, String)> {
    let Some(want) = &a.token else {
        return Err((
            StatusCode::FORBIDDEN,
            "changes through the admin address are disabled: set admin_token_env or admin_token_file in the agent's config\n".into(),
        ));
    };
    let got = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(t) if same_token(want, t.trim()) => Ok(()),
        Some(_) => Err((StatusCode::UNAUTHORIZED, "wrong admin token\n".into())),
        None => Err((
            StatusCode::UNAUTHORIZED,
            "this change needs the admin token (Authorization: Bearer TOKEN)\n".into(),
        )),
    }
}

async fn metrics_h(State(a): State<Admin>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        a.metrics.render(),
    )
}

/// The status the agent's loops keep, with its workers as the supervisor sees them (name,
/// state, errors, last error, what each says of itself).
async fn status_h(State(a): State<Admin>) -> impl IntoResponse {
    axum::Json(status_doc(&a))
}

fn status_doc(a: &Admin) -> serde_json::Value {
    let mut v = a.metrics.status();
    let workers = a.workers.status();
    // A mirror's pending copies: the block copier's own count (the copies in flight are
    // still queued until verified) when it is the larger. The figures the status worker
    // last wrote may be older, or stuck while its refresh fails: they said "0 pending"
    // while the copier listed copies in flight and queued.
    let copier = workers
        .iter()
        .filter(|w| w.name == COPIER)
        .find_map(|w| w.status.queue_length);
    if let (Some(q), Some(b)) = (copier, v.get_mut("blocks").and_then(|b| b.as_object_mut())) {
        if b.get("pending")
            .and_then(|p| p.as_u64())
            .is_none_or(|p| p < q)
        {
            b.insert("pending".into(), q.into());
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "workers".into(),
            serde_json::to_value(workers).unwrap_or_default(),
        );
    }
    v
}

/// The block copier's worker name (`blocks::Copier`).
const COPIER: &str = "block copier";

/// The answer to a change of the copy limits, in words.
fn limits_line(bytes_per_s: Option<u64>, requests_per_s: Option<u32>) -> String {
    let bw = match bytes_per_s {
        None => "unlimited".to_string(),
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB/s", b as f64 / (1u64 << 20) as f64),
        Some(b) if b >= 1 << 10 => format!("{:.1} KiB/s", b as f64 / 1024.0),
        Some(b) => format!("{b} bytes/s"),
    };
    let tps = requests_per_s.map_or("unlimited".to_string(), |t| format!("{t} a second"));
    format!("copy limits now: bandwidth {bw}, requests {tps}\n")
}

async fn limits_h(
    State(a): State<Admin>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    if let Err(r) = authorized(&a, &headers) {
        return r;
    }
    let Some(l) = &a.limits else {
        return (
            StatusCode::BAD_REQUEST,
            "limits apply to a mirror agent\n".to_string(),
        );
    };
    for k in q.keys() {
        if k != "bwlimit" && k != "tps" {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown parameter {k:?} (bwlimit, tps)\n"),
            );
        }
    }
    let (bw0, tps0) = l.current();
    let bw = match q.get("bwlimit") {
        Some(s) => match BwSchedule::parse(s) {
            Ok(b) => Some(b),
            Err(e) => return (StatusCode::BAD_REQUEST, format!("bwlimit {s:?}: {e}\n")),
        },
        None => bw0.map(|b| BwSchedule::parse(&b.to_string()).expect("a number parses")),
    };
    let tps = match q.get("tps") {
        Some(s) => match s.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("tps {s:?}: expected a whole number\n"),
                )
            }
        },
        None => tps0,
    };
    l.set(bw, tps);
    let (b, t) = l.current();
    tracing::info!(bytes_per_s = ?b, requests_per_s = ?t, "copy limits changed");
    (StatusCode::OK, limits_line(b, t))
}

async fn drop_slot_h(
    State(a): State<Admin>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> (StatusCode, String) {
    if let Err(r) = authorized(&a, &headers) {
        return r;
    }
    let Some(s) = &a.slots else {
        return (
            StatusCode::BAD_REQUEST,
            "slots are kept by a primary agent\n".into(),
        );
    };
    match s.drop_slot(&name).await {
        Ok(msg) => (StatusCode::OK, format!("{msg}\n")),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e:#}\n")),
    }
}

async fn resync_h(State(a): State<Admin>, headers: HeaderMap) -> (StatusCode, String) {
    if let Err(r) = authorized(&a, &headers) {
        return r;
    }
    let Some(r) = &a.resync else {
        return (
            StatusCode::BAD_REQUEST,
            "a resync is asked of a mirror agent\n".into(),
        );
    };
    match r.resync().await {
        Ok(msg) => (StatusCode::OK, format!("{msg}\n")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")),
    }
}

#[cfg(test)]
mod tests {
    use background::{CancellationToken, Supervisor, Worker, WorkerState};

    struct Failing;

    #[async_trait::async_trait]
    impl Worker for Failing {
        fn name(&self) -> String {
            "failing".into()
        }
        async fn work(&mut self, _: &CancellationToken) -> anyhow::Result<WorkerState> {
            anyhow::bail!("the store is gone")
        }
        async fn wait_for_work(&mut self) -> WorkerState {
            WorkerState::Busy
        }
    }

    /// An admin endpoint with no token, limits, slots or resync: only its workers.
    fn admin_of(workers: std::sync::Arc<Supervisor>) -> super::Admin {
        super::Admin {
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new(false)),
            token: None,
            limits: None,
            slots: None,
            resync: None,
            workers,
        }
    }

    #[tokio::test]
    async fn the_status_lists_the_workers_with_their_errors() {
        let workers = std::sync::Arc::new(Supervisor::new(CancellationToken::new()));
        workers.spawn(Failing);
        let a = admin_of(workers.clone());
        a.metrics.set_status(serde_json::json!({"role": "mirror"}));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let v = super::status_doc(&a);
        assert_eq!(v["role"], "mirror");
        let w = &v["workers"][0];
        assert_eq!(w["name"], "failing", "{v}");
        assert_eq!(w["errors"], 1, "{v}");
        assert_eq!(w["last_error"], "the store is gone", "{v}");
        assert!(workers
            .shutdown(std::time::Duration::from_secs(1))
            .await
            .is_empty());
    }

    /// A copier that reports copies queued (in flight among them).
    struct Copying;

    #[async_trait::async_trait]
    impl Worker for Copying {
        fn name(&self) -> String {
            super::COPIER.into()
        }
        async fn work(&mut self, _: &CancellationToken) -> anyhow::Result<WorkerState> {
            Ok(WorkerState::Idle)
        }
        async fn wait_for_work(&mut self) -> WorkerState {
            std::future::pending().await
        }
        fn status(&self) -> background::WorkerStatus {
            background::WorkerStatus {
                progress: Some("3 copies in flight".into()),
                queue_length: Some(7),
                ..Default::default()
            }
        }
    }

    /// The status says as many copies pending as the copier holds (in flight and queued),
    /// even when the figures the status worker wrote say none.
    #[tokio::test]
    async fn pending_counts_the_copies_the_copier_holds() {
        let workers = std::sync::Arc::new(Supervisor::new(CancellationToken::new()));
        workers.spawn(Copying);
        let a = admin_of(workers.clone());
        a.metrics.set_status(
            serde_json::json!({"role": "mirror", "blocks": {"pending": 0, "copied": 2}}),
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let v = super::status_doc(&a);
        assert_eq!(v["blocks"]["pending"], 7, "{v}");
        assert_eq!(v["blocks"]["copied"], 2, "{v}");
        // A status worker that counted more (newer than the copier's word) is kept.
        a.metrics
            .set_status(serde_json::json!({"role": "mirror", "blocks": {"pending": 9}}));
        assert_eq!(super::status_doc(&a)["blocks"]["pending"], 9);
        workers.shutdown(std::time::Duration::from_secs(1)).await;
    }

    /// `mirror-agent limits` prints its answer in words, not a raw JSON line.
    #[test]
    fn the_limits_answer_is_words() {
        assert_eq!(
            super::limits_line(None, None),
            "copy limits now: bandwidth unlimited, requests unlimited\n"
        );
        assert_eq!(
            super::limits_line(Some(50 << 20), Some(100)),
            "copy limits now: bandwidth 50.0 MiB/s, requests 100 a second\n"
        );
        assert_eq!(
            super::limits_line(Some(1024), None),
            "copy limits now: bandwidth 1.0 KiB/s, requests unlimited\n"
        );
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(super::same_token("abcdefghijklmnop", "abcdefghijklmnop"));
        assert!(!super::same_token("abcdefghijklmnop", "abcdefghijklmno"));
        assert!(!super::same_token("abcdefghijklmnop", ""));
    }
}
