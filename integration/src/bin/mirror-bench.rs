//! mirror-bench: the mirror-agent figures in BENCHMARKS.md (run on demand, never in CI):
//!
//! - `apply`: entries/s applied per mirror engine, in batches (the agent) and one entry per
//!   transaction (a serial, JuiceFS-style replayer), from a real workload's journal;
//! - `lag`: metadata lag p50/p99 at 1,000 commits/s, on loopback and through the harness's
//!   delay proxy (50 ms each way);
//! - `blocks`: block replication through a 100 Mbit/s `tc tbf` link between two network
//!   namespaces (origin store served over HTTP in the primary's namespace), against curl
//!   over the same link; and the accuracy of `bwlimit` on loopback;
//! - `writes`: create + 16 KiB write + close at a mirror mount that writes through to the
//!   primary, on loopback and through the delay proxy (5 ms and 50 ms each way), against the
//!   same at a mount of the primary; with `JUICEFS` (its binary) set, the same job with
//!   JuiceFS CE, which has no mirror writes: a mount of the primary's volume (its Redis
//!   reached through the same proxy, its blocks in a local directory as ours);
//! - `writes-link`: a 1 GiB `cp` at a mirror mount whose origin store (WebDAV, `rclone serve
//!   webdav`) is across a 100 Mbit/s `tc tbf` link between two network namespaces, against
//!   curl uploading the same file over the same link.
//!
//! Usage: `source <services env>; mirror-bench [apply|lag|blocks|writes|writes-link]...`
//! (see integration/bench-mirror.sh; no argument: all of them).

#[allow(unused_imports)]
use fs_core::Engine as _;
use fs_core::{SetAttr, ROOT_INO};
use integration::mirror::*;
use integration::{meta_url, volume_with};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all = args.is_empty();
    let want = |s: &str| all || args.iter().any(|a| a == s);
    if want("apply") {
        apply().await;
    }
    if want("lag") {
        lag().await;
    }
    if want("blocks") {
        blocks().await;
    }
    if want("writes") {
        writes().await;
    }
    if want("writes-link") {
        writes_link().await;
    }
}

async fn apply() {
    // A real journal: the mixed workload on an embedded volume with a memory store.
    let vol = volume_with("rocksdb", "memory", |_| {}).await;
    workload(&vol.fs, 40_000, 99, None).await;
    let entries = integration::journal(&**vol.fs.engine()).await;
    println!(
        "## apply rate ({} entries from the mixed workload)\n",
        entries.len()
    );
    println!(
        "| mirror engine | batched (4096/txn), entries/s | serial (1/txn), entries/s | ratio |"
    );
    println!("|---|---|---|---|");
    for engine in integration::ENGINES {
        let mut rates = Vec::new();
        for batch in [4096usize, 1] {
            let (url, _d) = meta_url(engine);
            let e = integration::replica(&url).await;
            // The serial replayer gets a slice of the journal (it is slow); same mix.
            let n = if batch == 1 {
                entries.len().min(5_000)
            } else {
                entries.len()
            };
            let t0 = Instant::now();
            for chunk in entries[..n].chunks(batch) {
                e.apply(chunk).await.expect("apply");
            }
            let secs = t0.elapsed().as_secs_f64();
            assert_eq!(e.journal_bounds().await.unwrap().last, entries[n - 1].seq);
            rates.push(n as f64 / secs);
        }
        println!(
            "| {engine} | {:.0} | {:.0} | {:.0}x |",
            rates[0],
            rates[1],
            rates[0] / rates[1]
        );
    }
    println!();
}

/// Commit at `rate`/s for `secs` at the primary; the lag of each entry is the time from its
/// commit to the moment the mirror's engine (Redis: readers are woken at once) holds it.
async fn lag_run(
    engines: (&'static str, &'static str),
    via_proxy: Option<Duration>,
    rate: u32,
    secs: u64,
) -> (f64, f64, f64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with(engines.0, "file", |_| {}).await;
    let pair = Pair::start(
        dir.path(),
        &vol.meta_url,
        engines.1,
        via_proxy.map(|d| (d, 0)),
        "",
        "",
    )
    .await;
    let (m, m_meta) = (&pair.mirror, &pair.m_meta);
    let (ino, _) = vol
        .fs
        .create(ROOT_INO, b"lag", 0o644, fs_core::Owner { uid: 0, gid: 0 })
        .await
        .unwrap();
    wait_converged(m, &**vol.fs.engine(), Duration::from_secs(30)).await;
    let mirror = open_ro(m_meta).await;
    let commits = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        u64,
        Instant,
    >::new()));
    let c2 = commits.clone();
    let start_head = mirror.journal_bounds().await.unwrap().last;
    let watcher = tokio::spawn(async move {
        let mut seen = start_head;
        let mut lags = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(secs + 30);
        while Instant::now() < deadline {
            mirror
                .journal_wait(seen, Duration::from_millis(500))
                .await
                .unwrap();
            let now = Instant::now();
            let head = mirror.journal_bounds().await.unwrap().last;
            let c = c2.lock().unwrap();
            for s in seen + 1..=head {
                if let Some(t) = c.get(&s) {
                    lags.push(now.duration_since(*t).as_secs_f64() * 1000.0);
                }
            }
            seen = head;
            if lags.len() >= (rate as u64 * secs) as usize {
                break;
            }
        }
        lags
    });
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    for i in 0..rate as u64 * secs {
        tick.tick().await;
        let set = SetAttr {
            mtime: Some(i as i64),
            ..Default::default()
        };
        vol.fs.setattr(ino, &set).await.unwrap();
        let head = vol.fs.engine().journal_bounds().await.unwrap().last;
        commits.lock().unwrap().insert(head, Instant::now());
    }
    let mut lags = watcher.await.unwrap();
    lags.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p = |q: f64| lags[((lags.len() as f64 * q) as usize).min(lags.len() - 1)];
    (p(0.5), p(0.99), p(1.0), lags.len())
}

async fn lag() {
    println!("## metadata lag at 1,000 commits/s for 10 s (commit at the primary to held by the mirror's engine)\n");
    println!("| primary -> mirror | path | entries | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    let pairs = [
        ("rocksdb", "redis"),
        ("rocksdb", "rocksdb"),
        ("redis", "postgres"),
        ("postgres", "rocksdb"),
    ];
    for proxy in [None, Some(Duration::from_millis(50))] {
        for engines in pairs {
            let (a, b, c, n) = lag_run(engines, proxy, 1000, 10).await;
            println!(
                "| {} -> {} | {} | {n} | {a:.1} | {b:.1} | {c:.1} |",
                engines.0,
                engines.1,
                proxy.map_or("loopback", |_| "delay proxy, 50 ms each way")
            );
        }
    }
    println!();
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect(args[0]);
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Copy `mib` MiB of blocks: (seconds from the write's start to the last block copied,
/// steady rate in bytes/s between 10% and 90% copied).
async fn copy_run(mirror: &Agent, vol: &integration::TestVol, mib: usize) -> (f64, f64) {
    let before = n(&mirror.status(), "blocks.copied_bytes");
    let total = (mib << 20) as u64;
    let t0 = Instant::now();
    let (ino, _) = vol
        .fs
        .create(
            ROOT_INO,
            format!("big{before}").as_bytes(),
            0o644,
            fs_core::Owner { uid: 0, gid: 0 },
        )
        .await
        .unwrap();
    vol.fs
        .write(ino, 0, &integration::data(before, mib << 20))
        .await
        .unwrap();
    let (mut p10, mut p90) = (None, None);
    loop {
        let done = n(&mirror.status(), "blocks.copied_bytes") - before;
        let now = Instant::now();
        if p10.is_none() && done >= total / 10 {
            p10 = Some((now, done));
        }
        if p90.is_none() && done >= total * 9 / 10 {
            p90 = Some((now, done));
        }
        if done >= total {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "copy did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let ((t1, b1), (t2, b2)) = (p10.unwrap(), p90.unwrap());
    (secs, (b2 - b1) as f64 / t2.duration_since(t1).as_secs_f64())
}

async fn blocks() {
    println!("## block replication\n");
    // 1. Through a 100 Mbit/s tbf link: the origin store is served over HTTP inside the
    //    primary's namespace, the mirror agent runs in the other namespace.
    let net = NetPair::new(5);
    net.in_a(&[
        "tc",
        "qdisc",
        "add",
        "dev",
        net.veth_a(),
        "root",
        "tbf",
        "rate",
        "100mbit",
        "burst",
        "256kb",
        "latency",
        "100ms",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let http = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.a,
            "python3",
            "-m",
            "http.server",
            "8080",
            "--bind",
            &net.ip_a,
            "--directory",
        ])
        .arg(vol.store_url.trim_start_matches("file://"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 http.server");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _http = Kill(http);
    let origin = format!("opendal+http://?endpoint=http://{}:8080", net.ip_a);
    let extra = format!("origin_store = \"{origin}\"\nworkers = 8");
    let at = Placement::Netns {
        net: &net,
        port: 19_666,
    };
    let pair = Pair::start_at(dir.path(), &vol.meta_url, "rocksdb", at, "", &extra).await;
    let m = &pair.mirror;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mib = 256;
    let (secs, steady) = copy_run(m, &vol, mib).await;
    let agent_mbit = steady * 8.0 / 1e6;
    // Peer: curl fetching the same amount over the same link (one stream).
    let keys: Vec<String> = walk(vol.store_url.trim_start_matches("file://"));
    let t0 = Instant::now();
    let mut bytes = 0u64;
    for k in keys.iter().take(64) {
        let out = sh(&[
            "ip",
            "netns",
            "exec",
            &net.b,
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("http://{}:8080/{k}", net.ip_a),
        ]);
        bytes += out.trim().parse::<u64>().unwrap_or(0);
    }
    let curl_mbit = bytes as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e6;
    println!("| what | result |\n|---|---|");
    println!("| mirror-agent, {mib} MiB of 4 MiB blocks over a 100 Mbit/s tbf link, 8 workers | {secs:.1} s in all; steady {agent_mbit:.1} Mbit/s = {:.0}% of the link |", agent_mbit);
    println!("| curl, {:.0} MiB over the same link, one stream | {curl_mbit:.1} Mbit/s (agent/curl = {:.2}) |", bytes as f64 / 1048576.0, agent_mbit / curl_mbit);
    drop(pair);
    drop(net);
    // 2. bwlimit accuracy on loopback.
    // Whole-run rate (write start to last copy) over ~25 s: copies complete in rounds of
    // `workers` blocks, so a short window would measure the rounds, not the limit.
    for limit in ["8M", "16M"] {
        let dir = tempfile::tempdir().unwrap();
        let vol = volume_with("rocksdb", "file", |_| {}).await;
        let extra = format!("bwlimit = \"{limit}\"");
        let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", &extra).await;
        let m = &pair.mirror;
        wait_converged(m, &**vol.fs.engine(), Duration::from_secs(30)).await;
        let want = fs_core::parse_size(limit).unwrap() as f64;
        let mib = (want as usize >> 20) * 25;
        let (secs, _) = copy_run(m, &vol, mib).await;
        let got = (mib << 20) as f64 / secs;
        println!(
            "| bwlimit {limit}/s on loopback, {mib} MiB | {:.2} MiB/s = {:+.1}% of the limit |",
            got / 1048576.0,
            (got / want - 1.0) * 100.0
        );
    }
    println!();
}

fn walk(root: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![std::path::PathBuf::from(root)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.metadata().map(|m| m.len() == 4 << 20).unwrap_or(false) {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out
}

/// Per-file time of `n` creates + 16 KiB writes + closes in `dir` (mean).
fn files_at(dir: &std::path::Path, n: usize) -> Duration {
    std::fs::create_dir_all(dir).unwrap();
    let body = integration::data(7, 16 << 10);
    let t0 = Instant::now();
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i}")), &body).unwrap();
    }
    t0.elapsed() / n as u32
}

async fn writes() {
    use integration::mountproc::Mount;
    println!("## create + 16 KiB write + close at a mirror mount that writes through (primary Redis, mirror RocksDB)\n");
    println!("| link to the primary | files | at the primary, ms/file | at the mirror, ms/file | extra | extra in round trips |");
    println!("|---|---|---|---|---|---|");
    for (delay, n) in [(None, 400usize), (Some(5u64), 200), (Some(50), 40)] {
        let dir = tempfile::tempdir().unwrap();
        let (meta, d1) = meta_url("redis");
        let (store, d2) = integration::store_url("file");
        let o = integration::run(
            "jfs",
            &[
                "format",
                &meta,
                &integration::unique("w"),
                "--storage",
                &store,
            ],
            &[],
        );
        assert!(
            o.status.success(),
            "format: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let pair = Pair::start(
            dir.path(),
            &meta,
            "rocksdb",
            delay.map(|ms| (Duration::from_millis(ms), 0)),
            ALLOW_WRITES,
            "",
        )
        .await;
        status_until(&pair.mirror, Duration::from_secs(60), |st| {
            st["bootstrap"].is_null() && st["writes"]["allowed"] == true
        })
        .await;
        let pm = Mount::start(&meta, dir.path(), "pm", &["--cache-size", "0"]);
        let mm = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
        let local = files_at(&pm.mp.join("p"), n);
        let remote = files_at(&mm.mp.join("m"), n);
        let rtt = delay.map(|ms| Duration::from_millis(2 * ms));
        let extra = remote.saturating_sub(local);
        println!(
            "| {} | {n} | {:.2} | {:.2} | {:.2} ms | {} |",
            delay.map_or("loopback".to_string(), |ms| format!(
                "delay proxy, {ms} ms each way"
            )),
            local.as_secs_f64() * 1e3,
            remote.as_secs_f64() * 1e3,
            extra.as_secs_f64() * 1e3,
            rtt.map_or("-".to_string(), |r| format!(
                "{:.1}",
                extra.as_secs_f64() / r.as_secs_f64()
            )),
        );
        mm.stop();
        pm.stop();
        drop(pair);
        drop((d1, d2));
    }
    println!();
    if let Ok(juicefs) = std::env::var("JUICEFS") {
        juicefs_writes(&juicefs).await;
    }
}

/// The same job with JuiceFS CE: no mirror writes, so a job far from the primary mounts the
/// primary's volume itself, its metadata (Redis) across the link (the harness's delay proxy
/// here), blocks in a local directory like the origin store above.
async fn juicefs_writes(juicefs: &str) {
    println!("## the same job with JuiceFS CE 1.4 (a mount of the primary's Redis volume over the link)\n");
    println!("| link to the metadata | files | near, ms/file | over the link, ms/file | extra | extra in round trips |");
    println!("|---|---|---|---|---|---|");
    let redis = std::env::var("JFS_TEST_REDIS").expect("JFS_TEST_REDIS (the services' env)");
    let base = redis.trim_end_matches("/0").to_string();
    let hostport = base.trim_start_matches("redis://").to_string();
    // JuiceFS reads the Redis password from META_PASSWORD.
    let pass = std::env::var("JFS_META_PASSWORD").unwrap_or_default();
    for (db, delay, n) in [(5u32, 5u64, 200usize), (6, 50, 40)] {
        let dir = tempfile::tempdir().unwrap();
        let (host, port) = hostport.rsplit_once(':').expect("host:port");
        let o = Command::new("redis-cli")
            .args(["-h", host, "-p", port, "-n", &db.to_string(), "flushdb"])
            .env("REDISCLI_AUTH", &pass)
            .output()
            .expect("redis-cli");
        assert!(o.status.success(), "flushdb: {o:?}");
        let url = format!("{base}/{db}");
        let mp = dir.path().join("mp");
        std::fs::create_dir_all(&mp).unwrap();
        let run = |args: &[String]| {
            let o = Command::new(juicefs)
                .args(args)
                .env("META_PASSWORD", &pass)
                .output()
                .expect("running juicefs");
            assert!(
                o.status.success(),
                "juicefs {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        let d = dir.path().display();
        run(&[
            "format".into(),
            "--storage=file".into(),
            format!("--bucket={d}/blocks/"),
            url.clone(),
            "bench".into(),
        ]);
        let mount = |meta: String| {
            run(&[
                "mount".into(),
                "-d".into(),
                format!("--log={d}/juicefs.log"),
                format!("--cache-dir={d}/cache"),
                meta,
                mp.display().to_string(),
            ])
        };
        let umount = || run(&["umount".into(), mp.display().to_string()]);
        mount(url.clone());
        let near = files_at(&mp.join("near"), n);
        umount();
        let proxy = Proxy::start(hostport.clone(), Duration::from_millis(delay), 0).await;
        mount(format!("redis://{}/{db}", proxy.addr));
        let far = files_at(&mp.join("far"), n);
        umount();
        drop(proxy);
        let extra = far.saturating_sub(near);
        println!(
            "| delay proxy, {delay} ms each way | {n} | {:.2} | {:.2} | {:.2} ms | {:.1} |",
            near.as_secs_f64() * 1e3,
            far.as_secs_f64() * 1e3,
            extra.as_secs_f64() * 1e3,
            extra.as_secs_f64() / Duration::from_millis(2 * delay).as_secs_f64()
        );
    }
    println!();
}

/// A process started in a namespace; killed (SIGTERM, then SIGKILL) when dropped.
struct Proc(std::process::Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// 1 GiB written at a mirror mount (namespace b) whose origin store is a WebDAV server in the
/// primary's namespace (a), across a veth link shaped to 100 Mbit/s each way; the mount's
/// `cp` returns once every block is at the origin and the file is committed at the primary.
async fn writes_link() {
    println!("## 1 GiB written at a mirror mount, the origin store across a 100 Mbit/s link\n");
    let net = NetPair::new(6);
    let veth_b = net.veth_a().replacen("jva", "jvb", 1);
    for (ns, dev) in [(&net.a, net.veth_a().to_string()), (&net.b, veth_b)] {
        sh(&[
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", &dev, "root", "tbf", "rate",
            "100mbit", "burst", "256kb", "latency", "100ms",
        ]);
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let webdav_dir = d.join("origin");
    std::fs::create_dir_all(&webdav_dir).unwrap();
    let _dav = Proc(
        Command::new("ip")
            .args(["netns", "exec", &net.a, "rclone", "serve", "webdav"])
            .arg(&webdav_dir)
            .args(["--addr", &format!("{}:8081", net.ip_a)])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("rclone serve webdav (apt: rclone)"),
    );
    let origin = format!("opendal+webdav://?endpoint=http://{}:8081", net.ip_a);
    let meta = format!("rocksdb://{}/meta", d.display());
    let jfs = integration::bin("jfs").display().to_string();
    let t0 = Instant::now();
    loop {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.a,
                &jfs,
                "format",
                &meta,
                "linkbench",
                "--storage",
                &origin,
            ])
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "format: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let run_dir = d.join("run");
    // The primary's writing process (a RocksDB volume: forwarded changes go through it).
    let mount_in = |ns: &str, meta: &str, name: &str| {
        let mp = d.join(name);
        std::fs::create_dir_all(&mp).unwrap();
        let log = std::fs::File::create(d.join(format!("{name}.log"))).unwrap();
        let mut p = Proc(
            // Only the network namespace (`ip netns exec` would give the mount a mount
            // namespace of its own, hiding it from the agent and from this process).
            Command::new("nsenter")
                .arg(format!("--net=/run/netns/{ns}"))
                .args([jfs.as_str(), "mount", meta])
                .arg(&mp)
                .args([
                    "--cache-size",
                    "0",
                    "--free-space-ratio",
                    "0.01",
                    "--cache-dir",
                ])
                .arg(d.join(format!("{name}-cache")))
                .env("JFS_RUN_DIR", &run_dir)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .expect("jfs mount"),
        );
        let sock = mount::control::socket_path_in(&run_dir, &mp);
        let t0 = Instant::now();
        while !sock.exists() {
            if let Ok(Some(st)) = p.0.try_wait() {
                panic!(
                    "jfs mount {name} exited ({st}): {}",
                    std::fs::read_to_string(d.join(format!("{name}.log"))).unwrap_or_default()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "mount {name} took over 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (p, mp)
    };
    let (_pm, _) = mount_in(&net.a, &meta, "pm");
    let at = Placement::Netns {
        net: &net,
        port: 19_766,
    };
    let pair = Pair::start_at(d, &meta, "rocksdb", at, ALLOW_WRITES, "").await;
    status_until(&pair.mirror, Duration::from_secs(60), |st| {
        st["bootstrap"].is_null() && st["writes"]["allowed"] == true
    })
    .await;
    let (mm, mmp) = mount_in(&net.b, &pair.m_meta, "mm");
    let src = d.join("src.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&src).unwrap();
        for i in 0..256u64 {
            f.write_all(&integration::data(900 + i, 4 << 20)).unwrap();
        }
    }
    let t0 = Instant::now();
    let o = Command::new("cp")
        .arg(&src)
        .arg(mmp.join("big"))
        .output()
        .unwrap();
    let ours = t0.elapsed();
    assert!(
        o.status.success(),
        "cp: {}\nmirror mount:\n{}\nprimary agent:\n{}\nmirror agent:\n{}",
        String::from_utf8_lossy(&o.stderr),
        tail(
            &std::fs::read_to_string(d.join("mm.log")).unwrap_or_default(),
            15
        ),
        tail(&pair.primary.log_text(), 15),
        tail(&pair.mirror.log_text(), 15)
    );
    let o = Command::new("cmp")
        .arg(&src)
        .arg(mmp.join("big"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the file read back differs: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let t0 = Instant::now();
    let o = Command::new("ip")
        .args(["netns", "exec", &net.b, "curl", "-sS", "-T"])
        .arg(&src)
        .arg(format!("http://{}:8081/peer.bin", net.ip_a))
        .output()
        .unwrap();
    let curl = t0.elapsed();
    assert!(
        o.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mbit = |t: Duration| (1u64 << 30) as f64 * 8.0 / t.as_secs_f64() / 1e6;
    println!("| what | time | rate | of the link |\n|---|---|---|---|");
    println!(
        "| cp of 1 GiB at the mirror mount (blocks to the origin across the link, the file committed at the primary) | {:.1} s | {:.1} Mbit/s | {:.0}% |",
        ours.as_secs_f64(),
        mbit(ours),
        mbit(ours)
    );
    println!(
        "| curl -T of the same file to the same WebDAV server over the same link | {:.1} s | {:.1} Mbit/s | {:.0}% (ours / curl = {:.2}) |",
        curl.as_secs_f64(),
        mbit(curl),
        mbit(curl),
        curl.as_secs_f64() / ours.as_secs_f64()
    );
    println!();
    drop(mm);
    drop(pair);
}
