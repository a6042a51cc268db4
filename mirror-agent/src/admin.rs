//! The admin endpoint: `GET /metrics` (Prometheus text), `GET /status` (JSON), and at a
//! mirror `PUT /limits?bwlimit=RATE&tps=N` to change the copy limits while running. Bind it
//! to loopback or a management network: it has no authentication of its own.

use crate::metrics::Metrics;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use axum::Router;
use objstore::limits::{BwSchedule, Limits};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct App {
    metrics: Arc<Metrics>,
    limits: Option<Arc<dyn Fn(Option<BwSchedule>, Option<u32>) + Send + Sync>>,
    current: Option<Arc<dyn Fn() -> (Option<u64>, Option<u32>) + Send + Sync>>,
}

pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    limits: Option<Arc<Limits>>,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("admin address {addr}: {e}"))?;
    let app = App {
        metrics,
        limits: limits.clone().map(|l| {
            Arc::new(move |b, t| l.set(b, t))
                as Arc<dyn Fn(Option<BwSchedule>, Option<u32>) + Send + Sync>
        }),
        current: limits.map(|l| Arc::new(move || l.current()) as Arc<dyn Fn() -> _ + Send + Sync>),
    };
    let router = Router::new()
        .route("/metrics", get(metrics_h))
        .route("/status", get(status_h))
        .route("/limits", put(limits_h))
        .with_state(app);
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    }))
}

async fn metrics_h(State(a): State<App>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        a.metrics.render(),
    )
}

async fn status_h(State(a): State<App>) -> impl IntoResponse {
    axum::Json(a.metrics.status())
}

async fn limits_h(
    State(a): State<App>,
    Query(q): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let (Some(set), Some(cur)) = (&a.limits, &a.current) else {
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
    let (bw0, tps0) = cur();
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
    set(bw, tps);
    let (b, t) = cur();
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

fn json_opt(v: Option<u64>) -> String {
    v.map_or("null".into(), |v| v.to_string())
}
