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
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "workers".into(),
            serde_json::to_value(a.workers.status()).unwrap_or_default(),
        );
    }
    v
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
    (
        StatusCode::OK,
        format!(
            "{{\"bytes_per_s\":{},\"requests_per_s\":{}}}\n",
            json_opt(b),
            json_opt(t.map(u64::from))
        ),
    )
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

fn json_opt(v: Option<u64>) -> String {
    v.map_or("null".into(), |v| v.to_string())
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

    #[tokio::test]
    async fn the_status_lists_the_workers_with_their_errors() {
        let workers = std::sync::Arc::new(Supervisor::new(CancellationToken::new()));
        workers.spawn(Failing);
        let a = super::Admin {
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new(false)),
            token: None,
            limits: None,
            slots: None,
            resync: None,
            workers: workers.clone(),
        };
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

    #[test]
    fn tokens_compare_whole() {
        assert!(super::same_token("abcdefghijklmnop", "abcdefghijklmnop"));
        assert!(!super::same_token("abcdefghijklmnop", "abcdefghijklmno"));
        assert!(!super::same_token("abcdefghijklmnop", ""));
    }
}
