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
        let board = sync_cli::job::open(&format!("{pg}#{name}")).await.unwrap();
        // The first draw makes the bucket.
        assert_eq!(board.take("bytes", 1 << 20, 1).await.unwrap(), None);
        // A connection set up as the workers' are, holding the bucket's row and then silent.
        let (mut cfg, schema) = meta::pg_config(&pg, &meta::OpenOptions::default()).unwrap();
        sync_cli::job::pg::session(&mut cfg);
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
