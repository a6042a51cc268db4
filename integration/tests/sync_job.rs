//! `jfs-sync --job`: one sync shared by worker processes through PostgreSQL or Redis, to a
//! real S3 server (Ceph RGW), with workers killed, cut off by a network namespace, paused,
//! cancelled and throttled. JFS_JOB_OBJECTS sets the size of the shared job (default 6000;
//! the figures in BENCHMARKS.md come from `integration/bench-sync-job.sh` with 100,000).

use integration::jobs::{self, host_port, small_tree, Ns, Worker};
use integration::mirror::Proxy;
use integration::{bin, unique};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `bash integration/services.sh up DIR && source DIR/env` (integration/test.sh does)")
    })
}

fn s3(prefix: &str) -> String {
    format!(
        "s3://jfs-test/{prefix}?endpoint={}",
        env("JFS_TEST_S3_ENDPOINT")
    )
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// `jfs-sync check SRC DST --json`: (missing, differing, extra).
fn check(src: &str, dst: &str) -> (u64, u64, u64) {
    let o = Command::new(bin("jfs-sync"))
        .args(["check", src, dst, "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("check: {}", String::from_utf8_lossy(&o.stderr)));
    (n(&v, "missing"), n(&v, "differing"), n(&v, "extra"))
}

fn objects() -> usize {
    std::env::var("JFS_JOB_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6000)
}

/// Every worker exits 0; the job's summary (from the last report) adds up to the tree.
fn wait_all(ws: &mut [Worker], limit: Duration) -> Value {
    for w in ws.iter_mut() {
        let code = w.wait(limit);
        assert_eq!(code, Some(0), "worker {}: {}", w.name, w.stderr());
    }
    ws.last().unwrap().report()
}

fn shared_job_with_kills(engine_var: &str, tag: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let total = objects();
    let per_dir = 100;
    let listed = small_tree(&src, total / per_dir, per_dir, 7) as u64;
    // Objects only on the destination, for the deletion step.
    let extra = t.path().join("extra");
    small_tree(&extra, 0, 0, 0);
    std::fs::create_dir_all(extra.join("zz-old")).unwrap();
    for i in 0..25 {
        std::fs::write(extra.join(format!("zz-old/x{i}")), b"stale").unwrap();
    }
    let dst = s3(&unique(tag));
    let o = Command::new(bin("jfs-sync"))
        .args([extra.to_str().unwrap(), &dst])
        .env("XDG_CACHE_HOME", t.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let url = format!("{}#{}", env(engine_var), unique(tag));
    let args = [
        src.to_str().unwrap(),
        dst.as_str(),
        "--job",
        &url,
        "--lease",
        "2s",
        "--delete-dst",
        "--max-delete",
        "30",
        "--stats",
        "2s",
    ];
    let mut ws: Vec<Worker> = (0..4)
        .map(|i| Worker::start(t.path(), &format!("w{i}"), &[], &args))
        .collect();
    // Kill a random worker every 1.5 s (4 times) and start a new one in its place, with its
    // state directory (a host that reboots).
    let t0 = Instant::now();
    let mut kills = 0;
    let mut next = 10;
    while kills < 4 && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(1500));
        if ws.iter_mut().all(|w| w.poll()) {
            break;
        }
        let i = rand::random::<u32>() as usize % ws.len();
        if ws[i].poll() {
            continue;
        }
        ws[i].kill9();
        kills += 1;
        ws.push(Worker::start(t.path(), &format!("w{next}"), &[], &args));
        next += 1;
    }
    let mut live: Vec<Worker> = ws.into_iter().filter(|w| w.code != Some(-9)).collect();
    let r = wait_all(&mut live, Duration::from_secs(300));
    let sum = &r["summary"];
    eprintln!(
        "{engine_var}: {listed} objects, {kills} workers killed, {} units, {} reassigned: {sum}",
        r["units"], r["reassigned"]
    );
    assert_eq!(r["state"], "done", "{r}");
    assert_eq!(n(sum, "listed"), listed, "{sum}");
    // Keys past a dead worker's last checkpoint that it had copied are found up to date by
    // the worker that resumed the range; nothing else is skipped.
    assert_eq!(n(sum, "copied") + n(sum, "skipped"), listed, "{sum}");
    assert_eq!(n(sum, "failed"), 0, "{sum}");
    assert_eq!(n(sum, "extra"), 25, "{sum}");
    assert_eq!(n(sum, "deleted"), 25, "{sum}");
    if kills > 0 {
        assert!(
            r["reassigned"].as_u64().unwrap() >= 1,
            "no unit was reassigned after {kills} kills: {r}"
        );
    }
    assert_eq!(
        check(src.to_str().unwrap(), &dst),
        (0, 0, 0),
        "destination differs from the source"
    );
    // The job's status says the same after the fact.
    let st = jobs::status(&url);
    assert_eq!(st["state"], "done");
    assert_eq!(
        n(&st, "units_pending") + n(&st, "units_running") + n(&st, "units_failed"),
        0,
        "{st}"
    );
    assert_eq!(n(&st["totals"], "copied"), n(sum, "copied"));
    jobs::job("delete", &url, &[]);
}

#[test]
fn four_workers_share_a_job_through_postgres_with_kill_9() {
    shared_job_with_kills("JFS_TEST_PG", "jobpg");
}

#[test]
fn four_workers_share_a_job_through_redis_with_kill_9() {
    shared_job_with_kills("JFS_TEST_REDIS", "jobredis");
}

/// One range holds all the work (the root has a single directory, so the first split finds
/// nothing to cut). A second worker that joins finds nothing to claim and asks; the holder
/// hands the back of its range over at its next save, and the two finish the job together:
/// every object copied exactly once, none reassigned.
fn an_idle_worker_gets_the_back_of_a_busy_range(engine_var: &str, tag: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let listed = small_tree(&src.join("big"), 24, 40, 0) as u64;
    let dst = s3(&unique(tag));
    let url = format!("{}#{}", env(engine_var), unique(tag));
    // Slow enough (the whole job at 80 requests/s) that the second worker joins early.
    let args = [
        src.to_str().unwrap(),
        dst.as_str(),
        "--job",
        &url,
        "--job-slots",
        "1",
        "--tps",
        "80",
        "--stats",
        "1s",
    ];
    let mut ws = vec![Worker::start(t.path(), "first", &[], &args)];
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let st = Command::new(bin("jfs-sync"))
            .args(["job", "status", &url, "--json"])
            .output()
            .unwrap();
        let st: Value = serde_json::from_slice(&st.stdout).unwrap_or(Value::Null);
        let started = st["running"]
            .as_array()
            .is_some_and(|r| r.iter().any(|u| !u["cursor"].is_null()));
        if started {
            break;
        }
        assert!(
            Instant::now() < end,
            "the first worker never started: {}",
            ws[0].stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    ws.push(Worker::start(t.path(), "second", &[], &args));
    let r = wait_all(&mut ws, Duration::from_secs(180));
    let sum = &r["summary"];
    eprintln!("{engine_var}: {} units: {sum}", r["units"]);
    assert_eq!(r["state"], "done", "{r}");
    assert_eq!(n(sum, "listed"), listed, "{sum}");
    assert_eq!(n(sum, "copied"), listed, "each object copied once: {sum}");
    assert_eq!(n(sum, "failed"), 0, "{sum}");
    assert_eq!(r["reassigned"], 0, "{r}");
    assert!(
        r["units"].as_u64().unwrap() >= 2,
        "the busy range was never shared: {r}"
    );
    for w in &ws {
        let mine = n(&w.report()["worker"], "copied");
        assert!(mine > 0, "worker {} copied nothing: {}", w.name, w.stderr());
    }
    assert!(
        std::fs::read_to_string(t.path().join("first.err"))
            .unwrap()
            .contains("to an idle worker"),
        "{}",
        ws[0].stderr()
    );
    assert_eq!(check(src.to_str().unwrap(), &dst), (0, 0, 0));
    jobs::job("delete", &url, &[]);
}

#[test]
fn an_idle_worker_gets_the_back_of_a_busy_range_postgres() {
    an_idle_worker_gets_the_back_of_a_busy_range("JFS_TEST_PG", "jobsharepg");
}

#[test]
fn an_idle_worker_gets_the_back_of_a_busy_range_redis() {
    an_idle_worker_gets_the_back_of_a_busy_range("JFS_TEST_REDIS", "jobshareredis");
}

/// A worker in its own network namespace, reaching PostgreSQL and the S3 server through this
/// one, is cut off for three times its lease while it holds ranges. The others take them
/// over; when it comes back its late saves are refused by token, and the job is exact.
#[test]
fn a_worker_cut_off_longer_than_its_lease_is_refused_by_token() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let listed = small_tree(&src, 40, 50, 0) as u64;
    for i in 0..8 {
        std::fs::write(
            src.join(format!("d00{i}-big")),
            integration::data(i, 3 << 20),
        )
        .unwrap();
    }
    let listed = listed + 8;
    let ns = Ns::new(1);
    let pg = env("JFS_TEST_PG");
    let s3e = env("JFS_TEST_S3_ENDPOINT");
    let (pgp, s3p) = rt.block_on(async {
        (
            Proxy::start_on(&ns.host_ip, host_port(&pg), Duration::ZERO, 0).await,
            Proxy::start_on(&ns.host_ip, host_port(&s3e), Duration::ZERO, 0).await,
        )
    });
    let prefix = unique("jobcut");
    let name = unique("cut");
    let url = format!("{pg}#{name}");
    let url_ns = format!("{}#{name}", pg.replace(&host_port(&pg), &pgp.addr));
    let dst = s3(&prefix);
    let dst_ns = format!("s3://jfs-test/{prefix}?endpoint=http://{}", s3p.addr);
    // A slow job (the whole job at 6 MiB/s) so that the cut falls in its middle. The
    // cut-off worker's spec names other addresses for the same places: it joins a job
    // created under its own spelling, so it creates the job.
    let common = [
        "--lease",
        "3s",
        "--bwlimit",
        "6M",
        "--stats",
        "1s",
        "-p",
        "4",
    ];
    let mut a_ns = vec![src.to_str().unwrap(), dst_ns.as_str(), "--job", &url_ns];
    a_ns.extend(common);
    let mut ws = vec![Worker::start(t.path(), "wns", &ns.exec(), &a_ns)];
    // Wait for the job, then join with the loopback spelling of the same places: the spec
    // must match, so the other workers use the namespace's addresses too (reachable here).
    let end = Instant::now() + Duration::from_secs(30);
    while Command::new(bin("jfs-sync"))
        .args(["job", "status", &url])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < end,
            "the job was not created: {}",
            ws[0].stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut a = vec![src.to_str().unwrap(), dst_ns.as_str(), "--job", &url];
    a.extend(common);
    for i in 0..2 {
        ws.push(Worker::start(t.path(), &format!("w{i}"), &[], &a));
    }
    // Cut the link once the namespaced worker holds a range.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let st = jobs::status(&url);
        let holds = st["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["worker"] == "wns" && !w["units"].as_array().unwrap().is_empty());
        if holds {
            break;
        }
        assert!(
            Instant::now() < end,
            "the namespaced worker never held a range: {st}\n{}",
            ws[0].stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Cut for at least three leases, and until another worker has taken a range over (the
    // others claim when one of their own slots frees).
    ns.link(false);
    let cut_at = Instant::now();
    let st = loop {
        std::thread::sleep(Duration::from_millis(500));
        let st = jobs::status(&url);
        if cut_at.elapsed() > Duration::from_secs(9) && n(&st, "reassigned") >= 1 {
            break st;
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(90),
            "the cut-off worker's ranges were not taken over: {st}"
        );
    };
    ns.link(true);
    eprintln!(
        "cut for {:?}; {} ranges reassigned",
        cut_at.elapsed(),
        st["reassigned"]
    );
    let r = wait_all(&mut ws, Duration::from_secs(240));
    let cut = ws[0].report();
    eprintln!("cut-off worker: {cut}\njob: {r}");
    assert!(
        n(&cut, "refused") >= 1,
        "no late save was refused: {}",
        ws[0].stderr()
    );
    assert!(ws[0]
        .stderr()
        .contains("refused: the lease passed to another worker"));
    let sum = &r["summary"];
    assert_eq!(r["state"], "done");
    assert_eq!(n(sum, "listed"), listed, "{sum}");
    assert_eq!(n(sum, "copied") + n(sum, "skipped"), listed, "{sum}");
    assert_eq!(check(src.to_str().unwrap(), &dst), (0, 0, 0));
    jobs::job("delete", &url, &[]);
    drop((pgp, s3p));
}

/// The job's --bwlimit is for all its workers together: 1 and 4 workers move the same bytes
/// in the same time (within 5% over, 10% under: start-up and the last object's tail are in
/// the measured time). `job set` changes it while the job runs; pause stops the copying and
/// resume continues it; cancel ends the workers with exit 2.
#[test]
fn the_job_bandwidth_limit_holds_for_any_number_of_workers_and_can_change() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for d in 0..8 {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..12 {
            std::fs::write(
                src.join(format!("d{d}/f{f}")),
                integration::data(d * 100 + f, 2 << 20),
            )
            .unwrap();
        }
    }
    let bytes = 8 * 12 * (2u64 << 20);
    let limit = 16u64 << 20;
    for workers in [1, 4] {
        let url = format!("{}#{}", env("JFS_TEST_REDIS"), unique("bw"));
        let dst = s3(&unique("jobbw"));
        let args = [
            src.to_str().unwrap(),
            dst.as_str(),
            "--job",
            &url,
            "--bwlimit",
            "16M",
            "--lease",
            "5s",
        ];
        let t0 = Instant::now();
        let mut ws: Vec<Worker> = (0..workers)
            .map(|i| Worker::start(t.path(), &format!("bw{workers}-{i}"), &[], &args))
            .collect();
        let r = wait_all(&mut ws, Duration::from_secs(120));
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!(n(&r["summary"], "bytes"), bytes);
        let rate = bytes as f64 / secs;
        eprintln!(
            "{workers} workers under a 16 MiB/s job limit: {:.2} MiB/s",
            rate / (1 << 20) as f64
        );
        assert!(
            rate <= limit as f64 * 1.05 && rate >= limit as f64 * 0.90,
            "{workers} workers under --bwlimit 16M moved {:.2} MiB/s",
            rate / (1 << 20) as f64
        );
        jobs::job("delete", &url, &[]);
    }

    // Changed while running: a 1 MiB/s job (192 s) raised after 2 s finishes in seconds.
    let url = format!("{}#{}", env("JFS_TEST_PG"), unique("bwset"));
    let dst = s3(&unique("jobbwset"));
    let args = [
        src.to_str().unwrap(),
        dst.as_str(),
        "--job",
        &url,
        "--bwlimit",
        "1M",
        "--lease",
        "3s",
        "-p",
        "4",
    ];
    let t0 = Instant::now();
    let mut ws: Vec<Worker> = (0..2)
        .map(|i| Worker::start(t.path(), &format!("set{i}"), &[], &args))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    jobs::job("set", &url, &["--bwlimit", "64M"]);
    std::thread::sleep(Duration::from_millis(1500));
    // Paused: the copies in flight finish, the ranges are given back, no bytes move.
    jobs::job("pause", &url, &[]);
    std::thread::sleep(Duration::from_secs(3));
    let a = jobs::status(&url);
    assert_eq!(a["state"], "paused");
    assert_eq!(
        n(&a, "units_running"),
        0,
        "units still held while paused: {a}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let b = jobs::status(&url);
    assert_eq!(
        n(&a["totals"], "bytes"),
        n(&b["totals"], "bytes"),
        "bytes moved while paused"
    );
    jobs::job("resume", &url, &[]);
    let r = wait_all(&mut ws, Duration::from_secs(60));
    assert_eq!(n(&r["summary"], "bytes"), bytes);
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "the lifted limit was not taken up: {:?}",
        t0.elapsed()
    );
    assert_eq!(check(src.to_str().unwrap(), &dst), (0, 0, 0));
    jobs::job("delete", &url, &[]);

    // Cancelled: the workers give their ranges back and exit 2; the job stays cancelled.
    let url = format!("{}#{}", env("JFS_TEST_REDIS"), unique("cancel"));
    let dst = s3(&unique("jobcancel"));
    let args = [
        src.to_str().unwrap(),
        dst.as_str(),
        "--job",
        &url,
        "--bwlimit",
        "8M",
        "--lease",
        "3s",
        "-p",
        "2",
        "--job-slots",
        "1",
    ];
    let mut ws: Vec<Worker> = (0..2)
        .map(|i| Worker::start(t.path(), &format!("c{i}"), &[], &args))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    jobs::job("cancel", &url, &[]);
    for w in ws.iter_mut() {
        assert_eq!(w.wait(Duration::from_secs(30)), Some(2), "{}", w.stderr());
        assert!(
            w.stderr().contains("the job was cancelled"),
            "{}",
            w.stderr()
        );
    }
    let st = jobs::status(&url);
    assert_eq!(st["state"], "cancelled");
    assert_eq!(n(&st, "units_running"), 0, "{st}");
    let mut late = Worker::start(t.path(), "late", &[], &args);
    assert_eq!(late.wait(Duration::from_secs(30)), Some(2));
    assert!(late.stderr().contains("was cancelled"), "{}", late.stderr());
    jobs::job("delete", &url, &[]);
}

/// Mistakes: a job URL without a name, another command under an existing job's name, an
/// engine that is not Redis or PostgreSQL, a password in the URL.
#[test]
fn job_mistakes_fail_clearly() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    small_tree(&src, 1, 3, 0);
    let d1 = t.path().join("d1");
    let run = |args: &[&str]| {
        Command::new(bin("jfs-sync"))
            .args(args)
            .env("XDG_CACHE_HOME", t.path())
            .output()
            .unwrap()
    };
    let s = src.to_str().unwrap();
    let pg = env("JFS_TEST_PG");
    integration::fails_clearly(
        &run(&[s, d1.to_str().unwrap(), "--job", &pg]),
        "name the job after '#'",
    );
    integration::fails_clearly(
        &run(&[s, d1.to_str().unwrap(), "--job", "rocksdb:///tmp/x#j"]),
        "Redis or PostgreSQL",
    );
    integration::fails_clearly(
        &run(&[
            s,
            d1.to_str().unwrap(),
            "--job",
            "postgres://u:hunter2@127.0.0.1/db#j",
        ]),
        "do not put the password",
    );
    let url = format!("{pg}#{}", unique("mistake"));
    let o = run(&["job", "create", s, d1.to_str().unwrap(), "--job", &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Another destination under the same job name: refused, nothing copied there.
    let d2 = t.path().join("d2");
    let e = integration::fails_clearly(
        &run(&[s, d2.to_str().unwrap(), "--job", &url]),
        "this job was created for",
    );
    assert!(!e.contains("hunter2"));
    assert!(
        !d2.exists() || std::fs::read_dir(&d2).unwrap().next().is_none(),
        "something was copied to d2"
    );
    // The right command finishes the job; a second run finds it done and copies nothing.
    let o = run(&[s, d1.to_str().unwrap(), "--job", &url, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        integration::snapshot(&src).len(),
        integration::snapshot(&d1).len()
    );
    let o = run(&[s, d1.to_str().unwrap(), "--job", &url, "--json"]);
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(
        o.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(n(&v["worker"], "copied"), 0, "{v}");
    jobs::job("delete", &url, &[]);
}

/// A worker that goes quiet inside a transaction (cut off between two statements) must not
/// stall the job: the server ends that transaction within seconds, so the row it locked (here
/// the job's bandwidth bucket, which every worker draws from) is free again for the others.
#[test]
fn a_worker_silent_inside_a_transaction_does_not_stall_the_others() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pg = env("JFS_TEST_PG");
        let name = unique("quiet");
        let board = sync::job::open(&format!("{pg}#{name}")).await.unwrap();
        // The first draw makes the bucket.
        assert_eq!(board.take("bytes", 1 << 20, 1).await.unwrap(), None);
        // A connection set up as the workers' are, holding the bucket's row and then silent.
        let (mut cfg, schema) = meta::pg_config(&pg, &meta::OpenOptions::default()).unwrap();
        sync::job::pg::session(&mut cfg);
        let (mut quiet, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let tx = quiet.transaction().await.unwrap();
        let locked = tx
            .query_one(
                &format!("SELECT tokens FROM {schema}.jfs_sync_buckets WHERE job = $1 AND what = 'bytes' FOR UPDATE"),
                &[&name],
            )
            .await
            .unwrap();
        assert!(locked.get::<_, f64>(0) < (1 << 20) as f64);
        let t0 = Instant::now();
        let drawn = board.take("bytes", 1 << 20, 1).await;
        let waited = t0.elapsed();
        assert!(
            drawn.is_ok(),
            "a draw behind a silent transaction failed after {waited:?}: {drawn:?}"
        );
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(7),
            "the draw waited {waited:?}: the silent transaction should hold it for about 3 s"
        );
        // The server ended the silent transaction: its commit fails.
        assert!(tx.commit().await.is_err(), "the silent transaction survived");
        board.remove().await.unwrap();
    });
}

/// `--from-journal` shared: the first round of a job lists everything; each later round is
/// planned by one worker from the source volume's journal (the keys the entries since the
/// job's position touch, stored in the job and cut into units of 2,000 keys) and copied by
/// all; a round with no change does nothing. The destination matches the volume each time.
fn from_journal_rounds(engine_var: &str, tag: &str) {
    let t = tempfile::tempdir().unwrap();
    let meta = format!("{}?prefix={}", env("JFS_TEST_REDIS"), unique("jv"));
    let jfs = |args: &[&str]| {
        let o = Command::new(bin("jfs")).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "jfs {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let blocks = format!("file://{}/blocks", t.path().display());
    jfs(&["format", &meta, "v", "--storage", &blocks]);
    let src = t.path().join("src");
    let first = small_tree(&src, 10, 100, 0) as u64;
    jfs(&["put", &meta, src.to_str().unwrap(), "/data"]);
    let dst = s3(&unique(tag));
    let url = format!("{}#{}", env(engine_var), unique(tag));
    let env_arg = format!("JVOL={meta}");
    let prefix = ["env", env_arg.as_str()];
    let args = [
        "jfs://JVOL/data",
        dst.as_str(),
        "--job",
        &url,
        "--from-journal",
        "--delete-dst",
        "--stats",
        "2s",
    ];
    let round = |r: usize| -> (Value, String) {
        let mut ws: Vec<Worker> = (0..2)
            .map(|i| Worker::start(t.path(), &format!("r{r}w{i}"), &prefix, &args))
            .collect();
        let rep = wait_all(&mut ws, Duration::from_secs(180));
        let err: String = ws
            .iter()
            .map(|w| std::fs::read_to_string(t.path().join(format!("{}.err", w.name))).unwrap())
            .collect();
        assert_eq!(rep["state"], "done", "{rep}");
        (rep, err)
    };
    let exact = || {
        let o = Command::new(bin("jfs-sync"))
            .args(["check", "jfs://JVOL/data", &dst, "--json"])
            .env("JVOL", &meta)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|_| panic!("check: {}", String::from_utf8_lossy(&o.stderr)));
        assert_eq!(
            (n(&v, "missing"), n(&v, "differing"), n(&v, "extra")),
            (0, 0, 0),
            "{v}"
        );
    };
    // Round 1: a full listing.
    let (rep, err) = round(1);
    assert!(err.contains("a full listing"), "{err}");
    assert_eq!(n(&rep["summary"], "copied"), first, "{rep}");
    exact();
    // Changes: 2,500 new files in a new directory, an overwrite, a delete, a directory moved.
    let more = t.path().join("more");
    let added = small_tree(&more, 1, 2500, 0) as u64;
    jfs(&[
        "put",
        &meta,
        more.join("d000").to_str().unwrap(),
        "/data/new",
    ]);
    std::fs::write(t.path().join("over"), b"overwritten").unwrap();
    jfs(&[
        "put",
        &meta,
        t.path().join("over").to_str().unwrap(),
        "/data/d001/f00001",
    ]);
    jfs(&["rm", &meta, "/data/d002/f00002"]);
    jfs(&["mv", &meta, "/data/d003", "/data/d003-moved"]);
    // Round 2: planned from the journal, shared by both workers.
    let (rep, err) = round(2);
    let sum = &rep["summary"];
    eprintln!("{engine_var}: round 2: {} units: {sum}", rep["units"]);
    assert_eq!(err.matches("planned a round").count(), 1, "{err}");
    assert_eq!(
        err.matches("--from-journal: entries").count(),
        1,
        "the journal is read by one worker only: {err}"
    );
    assert!(
        err.contains("changed keys in") && rep["units"].as_u64().unwrap() >= 3,
        "the round's keys in more than one unit (and the deletion step): {rep}\n{err}"
    );
    // new files + the moved directory's 100 under the new name; its old names and the
    // deleted file are deleted; the overwrite is an update; nothing else is looked at.
    assert_eq!(n(sum, "copied"), added + 100, "{sum}");
    assert_eq!(n(sum, "updated"), 1, "{sum}");
    assert_eq!(n(sum, "deleted"), 101, "{sum}");
    assert_eq!(
        n(sum, "listed"),
        added + 100 + 1,
        "only the changed keys: {sum}"
    );
    // Both workers' reports add up to the round (a worker that planned in vain joins late).
    let both: u64 = (0..2)
        .map(|i| {
            let mine = &Worker::report_of(t.path(), &format!("r2w{i}"))["worker"];
            n(mine, "copied") + n(mine, "updated")
        })
        .sum();
    assert_eq!(both, added + 100 + 1, "{err}");
    exact();
    // Round 3: nothing changed, nothing to do.
    let (rep, err) = round(3);
    assert!(err.contains("0 changed keys"), "{err}");
    assert_eq!(n(&rep["summary"], "listed"), 0, "{rep}");
    exact();
    jobs::job("delete", &url, &[]);
}

#[test]
fn from_journal_rounds_are_shared_through_postgres() {
    from_journal_rounds("JFS_TEST_PG", "jobjpg");
}

#[test]
fn from_journal_rounds_are_shared_through_redis() {
    from_journal_rounds("JFS_TEST_REDIS", "jobjredis");
}

/// Files under `root` (not directories), counted.
fn files_in(root: &std::path::Path) -> usize {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                n += 1;
            }
        }
    }
    n
}

/// Every record a job `name` has in its engine: Redis keys, or PostgreSQL rows.
fn records_of(engine_var: &str, name: &str) -> usize {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = env(engine_var);
        if engine_var.contains("REDIS") {
            let (info, prefix) = meta::redis_info(&url, &meta::OpenOptions::default()).unwrap();
            let client = redis::Client::open(info).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}*jfs-sync:{name}}}*"))
                .query_async(&mut c)
                .await
                .unwrap();
            keys.len()
        } else {
            let (cfg, schema) = meta::pg_config(&url, &meta::OpenOptions::default()).unwrap();
            let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            let mut n = 0i64;
            for (t, col) in [
                ("jfs_sync_jobs", "name"),
                ("jfs_sync_units", "job"),
                ("jfs_sync_workers", "job"),
                ("jfs_sync_deletes", "job"),
                ("jfs_sync_buckets", "job"),
                ("jfs_sync_keys", "job"),
            ] {
                let r = c
                    .query_one(
                        &format!("SELECT count(*) FROM {schema}.{t} WHERE {col} = $1"),
                        &[&name],
                    )
                    .await
                    .unwrap();
                n += r.get::<_, i64>(0);
            }
            n as usize
        }
    })
}

/// Issue 25, item 19: a job deleted (`job delete --force`) while its workers copy: each
/// worker stops, says so and exits 2, never "job done"; nothing of the job is written back
/// (no record of it is left in the engine once they are gone). A job cancelled meanwhile
/// stays cancelled, its workers exit 2 saying so.
fn a_deleted_or_cancelled_job_stops_its_workers(engine_var: &str, tag: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let total = small_tree(&src, 10, 300, 0);
    for (what, verb) in [
        ("delete", "was deleted while this worker ran"),
        ("cancel", "the job was cancelled"),
    ] {
        let name = unique(tag);
        let url = format!("{}#{name}", env(engine_var));
        let dst = t.path().join(format!("dst-{what}"));
        let args = [
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--job",
            &url,
            "--bwlimit",
            "1M",
            "--lease",
            "3s",
        ];
        let mut ws: Vec<Worker> = (0..2)
            .map(|i| Worker::start(t.path(), &format!("{what}{i}"), &[], &args))
            .collect();
        let t0 = Instant::now();
        while files_in(&dst) < 100 {
            assert!(t0.elapsed() < Duration::from_secs(60), "nothing copied");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Both workers are in the job before it goes: a worker that starts after a delete
        // finds no job and rightly creates a new one (seen under load: it then ran the new
        // job to its end).
        loop {
            let st = jobs::status(&url);
            let joined = st["workers"].as_array().map_or(0, |a| {
                a.iter()
                    .filter(|w| w["worker"].as_str().is_some_and(|n| n.starts_with(what)))
                    .count()
            });
            if joined == 2 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "both workers never joined the job: {st}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        if what == "delete" {
            jobs::job("delete", &url, &["--force"]);
        } else {
            jobs::job("cancel", &url, &[]);
        }
        for w in ws.iter_mut() {
            let code = w.wait(Duration::from_secs(60));
            let err = w.stderr();
            assert_eq!(code, Some(2), "worker {}: {err}", w.name);
            assert!(err.contains(verb), "worker {}: {err}", w.name);
            assert!(!err.contains("job done"), "worker {}: {err}", w.name);
        }
        assert!(
            files_in(&dst) < total,
            "the job ran to its end before the {what}"
        );
        if what == "delete" {
            assert_eq!(
                records_of(engine_var, &name),
                0,
                "the deleted job was written back"
            );
            let o = Command::new(bin("jfs-sync"))
                .args(["job", "status", &url])
                .output()
                .unwrap();
            integration::fails_clearly(&o, "no job at");
        } else {
            assert_eq!(jobs::status(&url)["state"], "cancelled");
            jobs::job("delete", &url, &[]);
        }
    }
}

#[test]
fn a_deleted_or_cancelled_job_stops_its_workers_postgres() {
    a_deleted_or_cancelled_job_stops_its_workers("JFS_TEST_PG", "deljpg");
}

#[test]
fn a_deleted_or_cancelled_job_stops_its_workers_redis() {
    a_deleted_or_cancelled_job_stops_its_workers("JFS_TEST_REDIS", "deljredis");
}

/// `jfs ARGS` with `env` (and JFS_META_PASSWORD removed unless given there), which must
/// succeed.
fn jfs_env(args: &[&str], env: &[(&str, &str)]) {
    let mut c = Command::new(bin("jfs"));
    c.args(args).env_remove("JFS_META_PASSWORD");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "jfs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Issue 25, item 22: a worker that joins with other options is told which option differs,
/// with the job's value and its own; so is one whose `jfs://NAME` names another volume.
#[test]
fn a_worker_with_other_options_is_told_which_and_both_values() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    small_tree(&src, 1, 3, 0);
    let (s, d1) = (src.to_str().unwrap(), t.path().join("d1"));
    let d1 = d1.to_str().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(bin("jfs-sync"));
        c.args(args).env("XDG_CACHE_HOME", t.path());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let url = format!("{}#{}", env("JFS_TEST_PG"), unique("opts"));
    let o = run(&["job", "create", s, d1, "--job", &url, "--size-only"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = integration::fails_clearly(
        &run(&[s, d1, "--job", &url, "--checksum"], &[]),
        r#"--checksum: the job has "false", this worker has "true""#,
    );
    assert!(
        e.contains(r#"--size-only: the job has "true", this worker has "false""#),
        "{e}"
    );
    assert!(
        !e.contains("falsefalse") && !e.contains("|"),
        "no internal strings: {e}"
    );
    let d2 = t.path().join("d2");
    let e = integration::fails_clearly(
        &run(
            &[s, d2.to_str().unwrap(), "--job", &url, "--size-only"],
            &[],
        ),
        &format!("DST: the job has {d1:?}"),
    );
    assert!(
        e.contains(&format!("this worker has {:?}", d2.to_str().unwrap())),
        "{e}"
    );
    jobs::job("delete", &url, &[]);
    // The same `jfs://JV/data` naming another volume on this worker.
    let mut metas = Vec::new();
    for v in ["a", "b"] {
        let m = format!("rocksdb://{}/{v}", t.path().display());
        let store = format!("file://{}/{v}-blocks", t.path().display());
        jfs_env(&["format", &m, v, "--storage", &store], &[]);
        jfs_env(&["put", &m, s, "/data"], &[]);
        metas.push(m);
    }
    let url = format!("{}#{}", env("JFS_TEST_PG"), unique("vols"));
    let d3 = t.path().join("d3");
    let d3 = d3.to_str().unwrap();
    let o = run(
        &["job", "create", "jfs://JV/data", d3, "--job", &url],
        &[("JV", &metas[0])],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = integration::fails_clearly(
        &run(&["jfs://JV/data", d3, "--job", &url], &[("JV", &metas[1])]),
        "what SRC jfs://JV/data is: the job has \"volume path volume uuid",
    );
    assert!(
        !std::path::Path::new(d3).exists() || std::fs::read_dir(d3).unwrap().next().is_none(),
        "nothing was copied: {e}"
    );
    jobs::job("delete", &url, &[]);
}

/// A Redis server without a password on a free port, stopped (by PID) on drop.
struct OpenRedis {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl OpenRedis {
    fn start() -> OpenRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--dir", dir.path().to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (apt: redis-server)");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        OpenRedis {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
            _dir: dir,
        }
    }
}

impl Drop for OpenRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 25, item 23: the engine that refused a password is named (the job's Redis, the
/// job's PostgreSQL, or a volume's metadata), a wrong Redis password is said at once (not
/// "no answer within 10s"), and a job on PostgreSQL with a password-less Redis volume works
/// with the job's password given by `?password_env=` (the documented way).
#[test]
fn each_refused_password_names_its_engine() {
    let wrong = [("JFS_META_PASSWORD", "Wr0ng-pw")];
    for (var, who) in [
        ("JFS_TEST_REDIS", "the job's Redis"),
        ("JFS_TEST_PG", "the job's PostgreSQL"),
    ] {
        let url = format!("{}#{}", env(var), unique("pw"));
        let t0 = Instant::now();
        let o = Command::new(bin("jfs-sync"))
            .args(["job", "status", &url])
            .envs(wrong)
            .output()
            .unwrap();
        let e = integration::fails_clearly(&o, who);
        assert!(e.contains("refused the password"), "{e}");
        assert!(!e.contains("no answer") && !e.contains("Wr0ng"), "{e}");
        assert!(
            t0.elapsed() < Duration::from_secs(9),
            "took {:?}",
            t0.elapsed()
        );
    }
    let t = tempfile::tempdir().unwrap();
    let r = OpenRedis::start();
    let vol = format!("{}?prefix={}", r.url, unique("pv"));
    let store = format!("file://{}/blocks", t.path().display());
    jfs_env(&["format", &vol, "pv", "--storage", &store], &[]);
    let src = t.path().join("src");
    let files = small_tree(&src, 2, 20, 0);
    jfs_env(&["put", &vol, src.to_str().unwrap(), "/data"], &[]);
    let pw = env("JFS_META_PASSWORD");
    let pg = env("JFS_TEST_PG");
    let dst = t.path().join("dst");
    // JFS_META_PASSWORD set for the job is sent to the volume's Redis too: refused, saying
    // which engine and what to do.
    let job = format!("{pg}#{}", unique("pw"));
    let o = Command::new(bin("jfs-sync"))
        .args(["jfs://RV/data", dst.to_str().unwrap(), "--job", &job])
        .env("RV", &vol)
        .env("JFS_META_PASSWORD", &pw)
        .env("XDG_CACHE_HOME", t.path())
        .output()
        .unwrap();
    let e = integration::fails_clearly(&o, "opening volume RV (its metadata at redis://");
    assert!(
        e.contains("has no password") && e.contains("?password_env="),
        "{e}"
    );
    // The job's password by ?password_env=, JFS_META_PASSWORD unset: it works.
    let (base, name) = job.split_once('#').unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let job = format!("{base}{sep}password_env=JOB_PW#{name}");
    let o = Command::new(bin("jfs-sync"))
        .args(["jfs://RV/data", dst.to_str().unwrap(), "--job", &job])
        .env("RV", &vol)
        .env("JOB_PW", &pw)
        .env_remove("JFS_META_PASSWORD")
        .env("XDG_CACHE_HOME", t.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(files_in(&dst), files);
    let o = Command::new(bin("jfs-sync"))
        .args(["job", "delete", &job])
        .env("JOB_PW", &pw)
        .env_remove("JFS_META_PASSWORD")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Issue 25, item 25: a finished job's status shows its duration and average rate, never a
/// negative rate, and every report's seconds are the time it ran.
#[test]
fn job_status_and_reports_show_real_times_and_rates() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    small_tree(&src, 4, 100, 0);
    let url = format!("{}#{}", env("JFS_TEST_REDIS"), unique("rate"));
    let dst = t.path().join("dst");
    let args = [
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--job",
        &url,
        "--bwlimit",
        "400K",
        "--lease",
        "3s",
    ];
    let mut ws = vec![Worker::start(t.path(), "rate0", &[], &args)];
    let rep = wait_all(&mut ws, Duration::from_secs(60));
    for part in ["summary", "worker"] {
        let secs = rep[part]["seconds"].as_f64().unwrap();
        assert!(secs >= 1.0, "{part} seconds {secs}: {rep}");
    }
    let st = jobs::status(&url);
    let f = |k: &str| st[k].as_f64().unwrap_or_else(|| panic!("{k} in {st}"));
    assert!(f("elapsed_s") >= 1.0, "{st}");
    assert!(f("average_rate") > 0.0, "{st}");
    assert!(st["rate"].as_f64().unwrap().is_sign_positive(), "{st}");
    assert!(st["totals"]["seconds"].as_f64().unwrap() >= 1.0, "{st}");
    for w in st["workers"].as_array().unwrap() {
        assert!(w["totals"]["seconds"].as_f64().unwrap() > 0.0, "{w}");
    }
    let o = Command::new(bin("jfs-sync"))
        .args(["job", "status", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        !text.contains("-0.0") && !text.contains(" in 0.0s"),
        "{text}"
    );
    assert!(text.contains("on average"), "{text}");
    jobs::job("delete", &url, &[]);
}

/// Issue 25, item 26: several workers of one job on one host, none given --state-dir, each
/// takes a state of its own (not RocksDB's LOCK error).
#[test]
fn workers_on_one_host_need_no_state_dir_of_their_own() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let total = small_tree(&src, 6, 100, 3);
    let url = format!("{}#{}", env("JFS_TEST_PG"), unique("slots"));
    let dst = t.path().join("dst");
    let args = [
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--job",
        &url,
        "--bwlimit",
        "2M",
    ];
    let mut ws: Vec<Worker> = (0..3)
        .map(|i| Worker::start_with(t.path(), &format!("slot{i}"), &[], &args, false))
        .collect();
    let rep = wait_all(&mut ws, Duration::from_secs(120));
    assert_eq!(n(&rep["summary"], "copied"), total as u64, "{rep}");
    assert_eq!(files_in(&dst), total);
    jobs::job("delete", &url, &[]);
}

/// Issue 25, item 26: runbooks/migrate-with-many-workers.md as an operator runs it, step by
/// step, each step's output compared with the runbook's "Expect"; the refusals its mistakes
/// table lists are refusals, and the incremental rounds of its section 7 run (the table once
/// said they were refused).
#[test]
fn the_many_workers_runbook_runs_as_written() {
    use integration::runbook;
    const RB: &str = "migrate-with-many-workers";
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let total = small_tree(&src, 3, 40, 2);
    let dst = t.path().join("dst");
    let pg = env("JFS_TEST_PG");
    let job = |tag: &str| {
        let sep = if pg.contains('?') { '&' } else { '?' };
        format!("{pg}{sep}password_env=JOB_PW#{}", unique(tag))
    };
    let pw = env("JFS_META_PASSWORD");
    let cache = t.path().to_str().unwrap().to_string();
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    let j1 = job("rb");
    let env1 = [
        ("SRC", s),
        ("DST", d),
        ("JOB", j1.as_str()),
        ("JOB_PW", pw.as_str()),
        ("XDG_CACHE_HOME", cache.as_str()),
    ];
    let out = runbook::run_ok(RB, "create", &env1);
    assert!(
        out.contains("created; start workers with: jfs-sync"),
        "{out}"
    );
    let out = runbook::run_ok(RB, "set", &env1);
    assert!(
        out.contains("job limits now bwlimit 100M, tps 500"),
        "{out}"
    );
    let out = runbook::run_ok(RB, "pause", &env1);
    assert!(out.contains("paused"), "{out}");
    let out = runbook::run_ok(RB, "resume", &env1);
    assert!(out.contains("running"), "{out}");
    let out = runbook::run_ok(RB, "worker", &env1);
    assert!(out.contains("job done: listed"), "{out}");
    assert_eq!(files_in(&dst), total);
    let out = runbook::run_ok(RB, "status", &env1);
    assert!(
        out.contains("0 running, 0 pending, 0 failed") && out.contains(": done"),
        "{out}"
    );
    // The mistakes table: the flags it says are refused with --job are.
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../runbooks/migrate-with-many-workers.md"),
    )
    .unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with('|') && l.contains("with `--job`") && l.contains("refused"))
        .expect("the mistakes table names what is refused with --job");
    let first = row.split('|').nth(1).unwrap();
    assert!(
        !first.contains("--from-journal"),
        "section 7 runs --from-journal jobs: {row}"
    );
    let list = t.path().join("list");
    std::fs::write(&list, "top0\n").unwrap();
    for flag in first
        .split('`')
        .filter(|w| w.starts_with("--") && *w != "--job")
    {
        let mut c = Command::new(bin("jfs-sync"));
        c.args([s, d, "--job", &j1, flag]).env("JOB_PW", &pw);
        if flag == "--files-from" {
            c.arg(&list);
        }
        let o = c.output().unwrap();
        integration::fails_clearly(&o, flag);
    }
    let out = runbook::run_ok(RB, "delete", &env1);
    assert!(out.contains("removed"), "{out}");
    // Cancel: a job stays cancelled.
    let j2 = job("rbc");
    let env2 = [
        ("SRC", s),
        ("DST", d),
        ("JOB", j2.as_str()),
        ("JOB_PW", pw.as_str()),
        ("XDG_CACHE_HOME", cache.as_str()),
    ];
    runbook::run_ok(RB, "create", &env2);
    let out = runbook::run_ok(RB, "cancel", &env2);
    assert!(out.contains("cancelled"), "{out}");
    let out = runbook::run(RB, "worker", &env2);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the job was cancelled"));
    runbook::run_ok(RB, "delete", &env2);
    // Section 7: rounds from a volume's journal.
    let meta = format!("rocksdb://{}/vol", t.path().display());
    let store = format!("file://{}/blocks", t.path().display());
    for args in [
        vec!["format", &meta, "v", "--storage", &store],
        vec!["put", &meta, s, "/data"],
    ] {
        let o = Command::new(bin("jfs")).args(&args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let j3 = job("rbj");
    let d3 = t.path().join("d3");
    let env3 = [
        ("SRCVOL", meta.as_str()),
        ("DST", d3.to_str().unwrap()),
        ("JOB", j3.as_str()),
        ("JOB_PW", pw.as_str()),
        ("XDG_CACHE_HOME", cache.as_str()),
    ];
    let out = runbook::run_ok(RB, "incremental", &env3);
    assert!(
        out.contains("a full listing") && out.contains("job done"),
        "{out}"
    );
    assert_eq!(files_in(&d3), total);
    let out = runbook::run_ok(RB, "incremental", &env3);
    assert!(
        out.contains("0 changed keys") && out.contains("job done"),
        "{out}"
    );
    runbook::run_ok(RB, "delete", &env3);
}

/// Ranges that finish at the same moment still release the deletion step: the last of them
/// to commit sees every range done (found by the runbook's test: a job "done" with its
/// deletion step left held, so nothing was deleted).
#[test]
fn ranges_finishing_at_once_still_start_the_deletion_step() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for var in ["JFS_TEST_PG", "JFS_TEST_REDIS"] {
            for round in 0..8 {
                let url = format!("{}#{}", env(var), unique("fin"));
                let board = sync::job::open(&url).await.unwrap();
                let spec = sync::job::Spec {
                    src: "/a".into(),
                    dst: "/b".into(),
                    src_id: None,
                    dst_id: None,
                    identity: String::new(),
                    delete_dst: true,
                    max_delete: None,
                    from_journal: false,
                    legacy_identity: None,
                };
                assert!(board.create(&spec, None, None).await.unwrap());
                board.bind().await.unwrap();
                let u = board.claim("w", 60_000, 10).await.unwrap().unwrap();
                let cuts: Vec<String> = (1..16).map(|i| format!("k{i:02}")).collect();
                assert!(board.split(u.id, u.token, &cuts).await.unwrap());
                let mut held = vec![u];
                while let Some(u) = board.claim("w", 60_000, 10).await.unwrap() {
                    held.push(u);
                }
                assert_eq!(held.len(), 16, "the copy units (the deletion step is held)");
                let done = sync::job::Finish {
                    state: "done",
                    dst_listed: 0,
                    error: None,
                    tally: None,
                };
                let ends = futures::future::join_all(
                    held.iter().map(|u| board.finish(u.id, u.token, &done)),
                )
                .await;
                assert!(ends.iter().all(|e| matches!(e, Ok(true))), "{ends:?}");
                let units = board.units().await.unwrap();
                let step = units.iter().find(|u| u.kind == "delete").unwrap();
                assert_eq!(step.state, "pending", "{var} round {round}: {units:?}");
                board.remove().await.unwrap();
            }
        }
    });
}
