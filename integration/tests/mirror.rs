//! mirror-agent end to end: real agent processes (primary and mirror) on loopback, real
//! engines and stores, a mixed workload of file-system operations with data. Every test
//! asserts on data: dumps, file bytes, journal frames, sequence numbers, counts.

use integration::mirror::*;
use integration::{bin, meta_url, store_url, volume_with, TestVol};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Site {
    dir: tempfile::TempDir,
    vol: TestVol,
    primary: Agent,
    mirror: Agent,
    m_meta: String,
    m_store: String,
    listen: String,
    _keep: Vec<tempfile::TempDir>,
}

async fn setup(
    p_engine: &'static str,
    m_engine: &'static str,
    primary_extra: &str,
    mirror_extra: &str,
) -> Site {
    setup_with(
        p_engine,
        m_engine,
        primary_extra,
        mirror_extra,
        |_| {},
        None,
    )
    .await
}

async fn setup_with(
    p_engine: &'static str,
    m_engine: &'static str,
    primary_extra: &str,
    mirror_extra: &str,
    settings: impl FnOnce(&mut fs_core::Settings),
    via: Option<&str>,
) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with(p_engine, "file", settings).await;
    let (m_meta, d1) = meta_url(m_engine);
    let (m_store, d2) = store_url("file");
    let listen = format!("127.0.0.1:{}", free_port());
    let env = [("MIRROR_TOKEN", TOKEN)];
    let p_admin = format!("127.0.0.1:{}", free_port());
    let primary = Agent::start(
        dir.path(),
        "primary",
        &primary_toml(
            &vol.meta_url,
            &dir.path().join("pstate"),
            &p_admin,
            &listen,
            &["m1"],
            primary_extra,
        ),
        &env,
    );
    let m_admin = format!("127.0.0.1:{}", free_port());
    let target = via.unwrap_or(&listen).to_string();
    let mirror = Agent::start(
        dir.path(),
        "mirror",
        &mirror_toml(
            &m_meta,
            &dir.path().join("mstate"),
            &m_admin,
            "m1",
            &target,
            &m_store,
            mirror_extra,
        ),
        &env,
    );
    Site {
        dir,
        vol,
        primary,
        mirror,
        m_meta,
        m_store,
        listen,
        _keep: d1.into_iter().chain(d2).collect(),
    }
}

async fn converge_pair(p: &'static str, m: &'static str) {
    let mut s = setup(p, m, "", "").await;
    let committed = workload(&s.vol.fs, 16_000, 7, None).await;
    assert!(committed >= 10_000, "only {committed} operations committed");
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(180)).await;
    let files = assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    let (first, last) = assert_same_journal(&**s.vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    assert!(files > 20, "only {files} files compared");
    assert!(
        last - first >= 10_000,
        "only {} entries replicated",
        last - first
    );
    assert!(n(&st, "blocks.copied") > 0);
    assert_eq!(st["within_window"], true, "{st}");
    assert_eq!(n(&st, "lag_entries"), 0);
    // The primary's slot records the acknowledgement (written every 500 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ps = s.primary.status();
    assert_eq!(n(&ps["mirrors"][0], "acked_seq"), last, "{ps}");
    // SIGTERM: both drain and exit 0.
    assert_eq!(
        s.mirror.term(),
        0,
        "mirror exit code; log:\n{}",
        tail(&s.mirror.log_text(), 20)
    );
    assert_eq!(s.primary.term(), 0, "primary exit code");
    eprintln!(
        "{p}->{m}: {committed} operations, entries {first}..={last}, {files} files identical"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_rocksdb_to_rocksdb() {
    converge_pair("rocksdb", "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_redis_to_rocksdb() {
    converge_pair("redis", "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_postgres_to_redis() {
    converge_pair("postgres", "redis").await;
}
