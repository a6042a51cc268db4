//! Figures for BENCHMARKS.md, "A sync shared by many workers" (needs the test services:
//! `source DIR/env` from integration/services.sh; root, for the network namespaces).
//!
//! 1. JOB_OBJECTS (default 100,000) small objects to Ceph RGW: one host without --job, then
//!    4 workers sharing the job through PostgreSQL and through Redis (overhead and exactness).
//! 2. Scaling: 1, 2 and 4 workers, each in its own network namespace behind a
//!    JOB_MBIT (default 50) Mbit/s tbf link, copying JOB_MIB (default 512) MiB of 1 MiB files.

use integration::jobs::{host_port, small_tree, Ns, Worker};
use integration::mirror::Proxy;
use integration::{bin, unique};
use std::process::Command;
use std::time::{Duration, Instant};

fn env(v: &str) -> String {
    std::env::var(v)
        .unwrap_or_else(|_| panic!("{v} is not set: source the env of integration/services.sh"))
}

fn num(v: &str, d: usize) -> usize {
    std::env::var(v)
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(d)
}

fn main() {
    let t = tempfile::tempdir().unwrap();
    let s3e = env("JFS_TEST_S3_ENDPOINT");
    let dst = |p: &str| format!("s3://jfs-test/{p}?endpoint={s3e}");

    let parts = std::env::var("JOB_PARTS").unwrap_or_else(|_| "overhead,scaling".into());
    if parts.contains("overhead") {
        overhead(&t, &dst);
    }
    if parts.contains("scaling") {
        scaling(&t);
    }
}

/// 1. Overhead and exactness on loopback.
fn overhead(t: &tempfile::TempDir, dst: &dyn Fn(&str) -> String) {
    let n = num("JOB_OBJECTS", 100_000);
    let src = t.path().join("src");
    let listed = small_tree(&src, n / 1000, 1000, 0);
    let s = src.to_str().unwrap();
    let t0 = Instant::now();
    let o = Command::new(bin("jfs-sync"))
        .args([s, &dst(&unique("bench1")), "--json"])
        .env("XDG_CACHE_HOME", t.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let single = t0.elapsed().as_secs_f64();
    println!(
        "one host, no job: {listed} objects in {single:.1} s = {:.0} objects/s",
        listed as f64 / single
    );
    for (engine, var) in [("PostgreSQL", "JFS_TEST_PG"), ("Redis", "JFS_TEST_REDIS")] {
        for workers in [1usize, 4] {
            let url = format!("{}#{}", env(var), unique("bench"));
            let d = dst(&unique("benchjob"));
            let args = [s, d.as_str(), "--job", url.as_str()];
            let t0 = Instant::now();
            let mut ws: Vec<Worker> = (0..workers)
                .map(|i| {
                    Worker::start(
                        t.path(),
                        &format!("{}-{workers}-{i}", &var[9..]),
                        &[],
                        &args,
                    )
                })
                .collect();
            for w in ws.iter_mut() {
                assert_eq!(w.wait(Duration::from_secs(1800)), Some(0), "{}", w.stderr());
            }
            let secs = t0.elapsed().as_secs_f64();
            let r = ws[0].report();
            let sum = &r["summary"];
            assert_eq!(sum["listed"].as_u64(), Some(listed as u64), "{r}");
            assert_eq!(sum["copied"].as_u64(), Some(listed as u64), "{r}");
            println!(
                "{engine}, {workers} worker(s): {listed} objects in {secs:.1} s = {:.0} objects/s ({:.2}x one host without a job), {} units, {} reassigned",
                listed as f64 / secs,
                single / secs,
                r["units"],
                r["reassigned"]
            );
            let _ = Command::new(bin("jfs-sync"))
                .args(["job", "delete", &url])
                .output();
        }
    }
}

/// 2. Scaling behind per-worker links.
fn scaling(t: &tempfile::TempDir) {
    let s3e = env("JFS_TEST_S3_ENDPOINT");
    let mib = num("JOB_MIB", 512);
    let mbit = num("JOB_MBIT", 50) as u32;
    let big = t.path().join("big");
    for i in 0..mib {
        let d = big.join(format!("d{:02}", i % 16));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("f{i:04}")),
            integration::data(i as u64, 1 << 20),
        )
        .unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = env("JFS_TEST_PG");
    let mut base = None;
    for workers in [1usize, 2, 4] {
        let nss: Vec<Ns> = (0..workers).map(|i| Ns::new(i as u32)).collect();
        for ns in &nss {
            ns.limit(mbit);
        }
        let proxies: Vec<(Proxy, Proxy)> = nss
            .iter()
            .map(|ns| {
                rt.block_on(async {
                    (
                        Proxy::start_on(&ns.host_ip, host_port(&pg), Duration::ZERO, 0).await,
                        Proxy::start_on(&ns.host_ip, host_port(&s3e), Duration::ZERO, 0).await,
                    )
                })
            })
            .collect();
        let name = unique("scale");
        let prefix = unique("benchscale");
        // Each worker reaches the engine and the store through its own link (a proxy on the
        // host side of its namespace): the same job and bucket by other addresses.
        let t0 = Instant::now();
        let mut ws = Vec::new();
        for (i, ns) in nss.iter().enumerate() {
            let (pp, sp) = &proxies[i];
            let url = format!("{}#{name}", pg.replace(&host_port(&pg), &pp.addr));
            let d = format!("s3://jfs-test/{prefix}?endpoint=http://{}", sp.addr);
            let args = [
                big.to_str().unwrap(),
                d.as_str(),
                "--job",
                url.as_str(),
                "--lease",
                "10s",
            ];
            ws.push(Worker::start(
                t.path(),
                &format!("scale{workers}-{i}"),
                &ns.exec(),
                &args,
            ));
        }
        for w in ws.iter_mut() {
            assert_eq!(w.wait(Duration::from_secs(900)), Some(0), "{}", w.stderr());
        }
        let secs = t0.elapsed().as_secs_f64();
        let rate = mib as f64 / secs;
        let b = *base.get_or_insert(rate);
        println!(
            "{workers} worker(s), each behind {mbit} Mbit/s: {mib} MiB in {secs:.1} s = {rate:.2} MiB/s ({:.2}x one worker)",
            rate / b
        );
        let _ = Command::new(bin("jfs-sync"))
            .args(["job", "delete", &format!("{pg}#{name}")])
            .output();
        drop(ws);
        drop(proxies);
    }
}
