//! Writes at a mirror site (a mount that writes through to the primary): real agents, a real
//! FUSE mount of the mirror's metadata, changes committed by the primary's engine and applied
//! back at the mirror before the writer returns. Every test asserts on bytes, errnos and counts.

use integration::mirror::*;
use integration::mountproc::Mount;
use integration::{data, read_all, volume_with};
use std::time::{Duration, Instant};

/// Wait until the mirror agent knows whether the primary lets it write (its status).
async fn writes_known(pair: &Pair) -> serde_json::Value {
    status_until(&pair.mirror, Duration::from_secs(30), |st| {
        st["bootstrap"].is_null() && !st["writes"]["allowed"].is_null()
    })
    .await
}

/// A primary volume on `engine` and a mount of it at `dir/pm` (on RocksDB the mount is the
/// one writing process, through which the primary agent commits a mirror's changes); the
/// volume's metadata and store URLs.
struct Primary {
    meta: String,
    store: String,
    mount: Mount,
    _keep: Vec<tempfile::TempDir>,
}

fn primary_volume(engine: &str) -> (String, String, Vec<tempfile::TempDir>) {
    let (meta, d1) = integration::meta_url(engine);
    let (store, d2) = integration::store_url("file");
    let o = integration::run(
        "jfs",
        &[
            "format",
            &meta,
            &integration::unique("v"),
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
    (meta, store, d1.into_iter().chain(d2).collect())
}

/// The primary's volume, opened to read (after the mount's changes).
async fn primary_fs(p: &Primary) -> fs_core::Fs {
    let e = open_ro(&p.meta).await;
    fs_core::Fs::open(e, integration::open_store(&p.store))
        .await
        .unwrap()
}

async fn writes_through(p_engine: &'static str, m_engine: &'static str, loops: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (meta, store, keep) = primary_volume(p_engine);
    // The agent's copier held back (1 byte/s): blocks reach the mirror store only as the
    // mount writes them there.
    let pair = Pair::start(
        dir.path(),
        &meta,
        m_engine,
        None,
        ALLOW_WRITES,
        "bwlimit = \"1\"",
    )
    .await;
    let p = Primary {
        mount: Mount::start(&meta, dir.path(), "pm", &["--cache-size", "0"]),
        meta,
        store,
        _keep: keep,
    };
    let st = writes_known(&pair).await;
    assert_eq!(st["writes"]["allowed"], true, "{st}");
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("committed at the primary"), "{log}");
    let at_primary = |path: &str| std::fs::read(p.mount.mp.join(path)).unwrap();
    // A directory and a file of several blocks, written and closed at the mirror: read back
    // there at once, and at the primary.
    let big = data(1, (9 << 20) + 333);
    std::fs::create_dir(m.mp.join("out")).unwrap();
    std::fs::write(m.mp.join("out/ckpt"), &big).unwrap();
    assert!(
        std::fs::read(m.mp.join("out/ckpt")).unwrap() == big,
        "re-read at the mirror"
    );
    // Its blocks went to the mirror's store too (however the writer cut its slices): read
    // back there without the origin.
    let in_mirror: u64 = integration::mountproc::store_blocks(&pair.m_store)
        .iter()
        .map(|(_, len)| len)
        .sum();
    assert!(
        in_mirror >= big.len() as u64,
        "{in_mirror} bytes in the mirror store"
    );
    let fallback = integration::mountproc::metric(&m.stats(), "jfs_fallback_reads_total");
    assert_eq!(
        fallback, 0.0,
        "blocks written at the mirror were read from the origin"
    );
    assert!(at_primary("out/ckpt") == big, "read at the primary");
    // `cp` at the mirror (copy_file_range) shares the checkpoint's slices: committed at the
    // primary like any change, no block written to either store.
    let (o_before, m_before) = (
        integration::mountproc::store_blocks(&p.store).len(),
        integration::mountproc::store_blocks(&pair.m_store).len(),
    );
    let cp = std::process::Command::new("cp")
        .arg(m.mp.join("out/ckpt"))
        .arg(m.mp.join("out/ckpt-copy"))
        .output()
        .unwrap();
    assert!(
        cp.status.success(),
        "{}",
        String::from_utf8_lossy(&cp.stderr)
    );
    assert!(std::fs::read(m.mp.join("out/ckpt-copy")).unwrap() == big);
    assert!(
        at_primary("out/ckpt-copy") == big,
        "the copy at the primary"
    );
    assert_eq!(
        integration::mountproc::store_blocks(&p.store).len(),
        o_before
    );
    assert_eq!(
        integration::mountproc::store_blocks(&pair.m_store).len(),
        m_before
    );
    // Read-your-writes, in a loop: create, write, close, reopen, read. No miss.
    let t0 = Instant::now();
    for i in 0..loops {
        let f = m.mp.join(format!("out/f{i}"));
        let b = data(100 + i, 1000 + i as usize);
        std::fs::write(&f, &b).unwrap();
        let got = std::fs::read(&f).unwrap();
        assert!(
            got == b,
            "f{i}: read {} bytes, not what was written",
            got.len()
        );
    }
    let per_file = t0.elapsed() / loops as u32;
    // Renames, an overwrite and an unlink at the mirror: the primary sees each.
    std::fs::rename(m.mp.join("out/f0"), m.mp.join("out/renamed")).unwrap();
    std::fs::write(m.mp.join("out/f1"), b"short now").unwrap();
    std::fs::remove_file(m.mp.join("out/f2")).unwrap();
    assert!(at_primary("out/renamed") == data(100, 1000));
    assert_eq!(at_primary("out/f1"), b"short now");
    assert!(
        !p.mount.mp.join("out/f2").exists(),
        "f2 still at the primary"
    );
    assert!(
        !p.mount.mp.join("out/f0").exists(),
        "f0 still at the primary"
    );
    // A change at the primary shows at the mirror; the mirror's next change builds on it.
    std::fs::write(p.mount.mp.join("out/from-primary"), b"v1").unwrap();
    let t0 = Instant::now();
    while !m.mp.join("out/from-primary").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the primary's file never showed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(m.mp.join("out/from-primary"), b"overwritten at the mirror").unwrap();
    assert_eq!(at_primary("out/from-primary"), b"overwritten at the mirror");
    // The mirror agent counted the changes; none failed.
    let st = pair.mirror.status();
    assert!(n(&st, "writes.committed") >= 2 * loops, "{st}");
    assert_eq!(n(&st, "writes.failed"), 0, "{st}");
    let pm = pair.primary.metrics();
    assert!(
        pm.contains("jfs_mirror_forwarded_committed_total{mirror=\"m1\"}"),
        "{pm}"
    );
    m.stop();
    // After convergence the two metadata stores hold the same tree, and every block the
    // mirror's writes reference is in the origin store (the write-order invariant).
    let pfs = primary_fs(&p).await;
    wait_converged(&pair.mirror, &**pfs.engine(), Duration::from_secs(60)).await;
    let files = assert_same(&pfs, &pair.m_meta, &pair.m_store).await;
    assert!(files as u64 >= loops, "only {files} files compared");
    let o = integration::run("jfs", &["fsck", &p.meta, "--deep"], &[]);
    assert!(
        o.status.success(),
        "fsck --deep at the primary: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    p.mount.stop();
    eprintln!(
        "{p_engine}->{m_engine}: create+write+close+read at the mirror, {per_file:?} per file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_mount_writes_through_to_the_primary_rocksdb() {
    writes_through("rocksdb", "rocksdb", 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_mount_writes_through_to_the_primary_redis_to_postgres() {
    writes_through("redis", "postgres", 1000).await;
}

/// A mirror the primary does not let write: its mounts are read-only (EROFS) and say why;
/// its agent's status says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_not_allowed_to_write_mounts_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    let st = writes_known(&pair).await;
    assert_eq!(st["writes"]["allowed"], false, "{st}");
    assert!(
        st["writes"]["refused"]
            .as_str()
            .is_some_and(|r| r.contains("allow_writes")),
        "{st}"
    );
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("mounting read-only") && log.contains("allow_writes"),
        "{log}"
    );
    let e = std::fs::write(m.mp.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30 /* EROFS */), "{e}");
    m.stop();
    assert_eq!(
        vol.fs.engine().journal_bounds().await.unwrap().last,
        pair.mirror.status()["applied_seq"].as_u64().unwrap(),
        "nothing was committed at the primary"
    );
}

/// Issue 43, item 25: a mirror the primary lets write, on a host that cannot write the origin
/// store (here a read-only bind over it): the mount comes up read-only and says why (it came
/// up read-write, and every close failed with EIO, leaving 0-byte files at every site);
/// nothing is made at the primary; `check-config --connect` warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_that_cannot_write_the_origin_store_mounts_read_only_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, ALLOW_WRITES, "").await;
    let st = writes_known(&pair).await;
    assert_eq!(st["writes"]["allowed"], true, "{st}");
    let ro = integration::mountproc::ReadOnlyBind::over_store(&vol.store_url);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("mounting read-only")
            && log.contains("this host cannot write the origin store")
            && log.contains(&vol.store_url),
        "{log}"
    );
    let e = std::fs::write(m.mp.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30 /* EROFS */), "{e}");
    m.stop();
    assert!(
        vol.fs.resolve("/new").await.is_err(),
        "a file was made at the primary"
    );
    // The agent's config as a second agent would use it (its state directory is in use).
    let check = dir.path().join("check.toml");
    std::fs::write(
        &check,
        std::fs::read_to_string(&pair.mirror.cfg)
            .unwrap()
            .replace("mstate", "mstate-check")
            .replace(&pair.mirror.admin, &format!("127.0.0.1:{}", free_port())),
    )
    .unwrap();
    let o = std::process::Command::new(integration::bin("mirror-agent"))
        .args(["check-config", "--connect", "--config"])
        .arg(&check)
        .env("MIRROR_TOKEN", TOKEN)
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && out.contains("warning: this host cannot write the origin store")
            && out.contains("allow_writes"),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    drop(ro);
}

/// Issue 43, item 25 (rest): a writing mirror mount whose host can no longer write the origin
/// store (a read-only bind over it after the mount came up): each close fails with EIO, and
/// the mirror agent, where the operator looks, counts each failure and shows its cause (its
/// status said `0 failed`: the block never reached it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_mounts_failed_origin_writes_are_counted_in_the_agents_status() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, ALLOW_WRITES, "").await;
    let st = writes_known(&pair).await;
    assert_eq!(st["writes"]["allowed"], true, "{st}");
    assert_eq!(st["writes"]["mount_failures"], 0, "{st}");
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), b"fine").unwrap();
    let ro = integration::mountproc::ReadOnlyBind::over_store(&vol.store_url);
    for i in 0..3 {
        // Rust's close ignores its error: fsync shows the failed write.
        use std::io::Write;
        let mut f = std::fs::File::create(m.mp.join(format!("f{i}"))).unwrap();
        f.write_all(&data(i, 300_000)).unwrap();
        let e = f.sync_all().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    }
    // The reports arrive beside the failures: wait for them, then for any late one.
    status_until(&pair.mirror, Duration::from_secs(10), |st| {
        st["writes"]["mount_failures"].as_u64() >= Some(3)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st = pair.mirror.status();
    let w = &st["writes"];
    assert_eq!(w["mount_failures"], 3, "one report per failed write: {st}");
    assert_eq!(w["failed"], 0, "no change reached the agent: {st}");
    let cause = w["last_failure"].as_str().unwrap_or_default();
    assert!(
        cause.starts_with("the origin store refused a block: writing ")
            && cause.contains(&vol.store_url)
            && cause.contains("Read-only file system"),
        "{st}"
    );
    let human = std::process::Command::new(integration::bin("mirror-agent"))
        .args(["status", "--admin", &pair.mirror.admin])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("0 failed, 3 failed at mounts")
            && human.contains("last failed write: the origin store refused a block: writing "),
        "{human}"
    );
    assert!(
        pair.mirror
            .metrics()
            .contains("jfs_mirror_mount_write_failures_total 3"),
        "{}",
        pair.mirror.metrics()
    );
    drop(ro);
    m.stop();
}

/// The primary agent stopped: a change at the mirror mount fails with EIO within the bound
/// and is not made; reads go on; once the primary is back, writes go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_primary_down_changes_fail_in_bounded_time_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, ALLOW_WRITES, "").await;
    writes_known(&pair).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), data(5, 100_000)).unwrap();
    assert_eq!(pair.primary.term(), 0);
    let t0 = Instant::now();
    let e = std::fs::write(m.mp.join("during"), b"x").unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    assert!(took < Duration::from_secs(15), "the failure took {took:?}");
    assert!(std::fs::read(m.mp.join("before")).unwrap() == data(5, 100_000));
    assert!(
        vol.fs.resolve("/during").await.is_err(),
        "half a change at the primary"
    );
    pair.primary.restart();
    let t0 = Instant::now();
    loop {
        match std::fs::write(m.mp.join("after"), b"back") {
            Ok(()) => break,
            Err(e) => assert!(
                t0.elapsed() < Duration::from_secs(30),
                "writes did not resume: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ino, _) = vol.fs.resolve("/after").await.unwrap();
    assert_eq!(read_all(&vol.fs, ino).await, b"back");
    m.stop();
}

/// kill -9 of a mount writing at the mirror: every file closed before the kill reads back
/// intact at the mirror (a new mount) and at the primary; the file being written when it
/// died is absent or a prefix of what was written (whole slices only); fsck --deep passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_writing_mirror_mount_loses_no_closed_file() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, store, keep) = primary_volume("redis");
    let pair = Pair::start(dir.path(), &meta, "rocksdb", None, ALLOW_WRITES, "").await;
    let p = Primary {
        mount: Mount::start(&meta, dir.path(), "pm", &["--cache-size", "0"]),
        meta,
        store,
        _keep: keep,
    };
    writes_known(&pair).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let mut want = Vec::new();
    for i in 0..10u64 {
        let b = data(200 + i, 200_000 * (i as usize + 1));
        std::fs::write(m.mp.join(format!("closed-{i}")), &b).unwrap();
        want.push(b);
    }
    let mp = m.mp.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let Ok(mut f) = std::fs::File::create(mp.join("in-flight")) else {
            return;
        };
        for i in 0..400u64 {
            if f.write_all(&data(i, 256 << 10)).is_err() || (i % 16 == 15 && f.sync_all().is_err())
            {
                return;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    std::process::Command::new("kill")
        .args(["-9", &m.pid().to_string()])
        .status()
        .unwrap();
    let _ = writer.join();
    let t0 = Instant::now();
    while integration::mountproc::is_mounted(&m.mp) && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(m);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    for (i, b) in want.iter().enumerate() {
        let name = format!("closed-{i}");
        assert!(
            std::fs::read(m.mp.join(&name)).unwrap() == *b,
            "{name} at the mirror"
        );
        assert!(
            std::fs::read(p.mount.mp.join(&name)).unwrap() == *b,
            "{name} at the primary"
        );
    }
    // Whole slices only: what was committed of the file in flight is a prefix of its bytes.
    let expect: Vec<u8> = (0..400u64).flat_map(|i| data(i, 256 << 10)).collect();
    if let Ok(got) = std::fs::read(p.mount.mp.join("in-flight")) {
        assert!(
            expect.starts_with(&got),
            "the file in flight holds {} bytes that are not a prefix of what was written",
            got.len()
        );
    }
    m.stop();
    let o = integration::run("jfs", &["fsck", &p.meta, "--deep"], &[]);
    assert!(
        o.status.success(),
        "fsck --deep at the primary after kill -9: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    p.mount.stop();
}

/// A mirror site of the three-site tests: its agent, its metadata and store URLs.
struct Site {
    agent: Agent,
    meta: String,
    store: String,
    /// Where its agent answers for the site's primary agent to come (`[mirror] listen`).
    future: String,
    _keep: Vec<tempfile::TempDir>,
}

/// A primary agent on `meta` that lets mirrors m1 (RocksDB metadata) and m2 (Redis) write,
/// and their agents, on loopback under `d` (the mounts' run directory is `d/run`).
fn three_sites(d: &std::path::Path, meta: &str) -> (Agent, Site, Site) {
    let listen = format!("127.0.0.1:{}", free_port());
    let run = d.join("run").display().to_string();
    let env = [("MIRROR_TOKEN", TOKEN), ("JFS_RUN_DIR", run.as_str())];
    let primary = Agent::start_with(
        d,
        "primary",
        &primary_toml(
            meta,
            &d.join("pstate"),
            &format!("127.0.0.1:{}", free_port()),
            &listen,
            &["m1", "m2"],
            ALLOW_WRITES,
        ),
        &env,
        &[],
    );
    let site = |name: &str, engine: &str| {
        let (m_meta, d1) = integration::meta_url(engine);
        let (m_store, d2) = integration::store_url("file");
        let future = format!("127.0.0.1:{}", free_port());
        let agent = Agent::start_with(
            d,
            name,
            &mirror_toml(
                &m_meta,
                &d.join(format!("{name}-state")),
                &format!("127.0.0.1:{}", free_port()),
                name,
                &listen,
                &m_store,
                &format!("listen = \"{future}\""),
            ),
            &env,
            &[],
        );
        Site {
            agent,
            meta: m_meta,
            store: m_store,
            future,
            _keep: d1.into_iter().chain(d2).collect(),
        }
    };
    let m1 = site("m1", "rocksdb");
    let m2 = site("m2", "redis");
    (primary, m1, m2)
}

/// Writers at the primary and at two mirrors at once, in shared directories (creates,
/// overwrites, renames across directories, deletes of the same names), then convergence:
/// the three metadata stores hold the same tree, every file is whole (one writer's complete
/// bytes), files only one writer touched hold exactly its last bytes, and `jfs fsck --deep`
/// passes at all three sites.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_at_the_primary_and_two_mirrors_converge_to_one_state() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (meta, store, _keep) = primary_volume("postgres");
    let (primary, m1, m2) = three_sites(d, &meta);
    let mirrors = [m1, m2];
    let pm = Mount::start(&meta, d, "pm", &["--cache-size", "0"]);
    std::fs::create_dir(pm.mp.join("s")).unwrap();
    std::fs::create_dir(pm.mp.join("t")).unwrap();
    let mut mounts = vec![("p".to_string(), pm.mp.clone())];
    let mut mms = Vec::new();
    for Site {
        agent: a,
        meta: m_meta,
        ..
    } in &mirrors
    {
        status_until(a, Duration::from_secs(60), |st| {
            st["bootstrap"].is_null() && st["writes"]["allowed"] == true
        })
        .await;
        let name = a.status()["name"].as_str().unwrap().to_string();
        let m = Mount::start(m_meta, d, &format!("mm-{name}"), &["--cache-size", "0"]);
        // The shared directories exist there before the writers start.
        let t0 = Instant::now();
        while !m.mp.join("t").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{name}: s/ and t/ never showed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        mounts.push((name, m.mp.clone()));
        mms.push(m);
    }
    let run_for = Duration::from_secs(60);
    let writers: Vec<_> = mounts
        .iter()
        .map(|(who, mp)| {
            let (who, mp) = (who.clone(), mp.clone());
            std::thread::spawn(move || {
                use rand::Rng;
                let mut rng = rand::rng();
                let mut mine: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
                let (mut ok, mut eio) = (0u64, 0u64);
                let t0 = Instant::now();
                let mut k = 0u64;
                while t0.elapsed() < run_for {
                    k += 1;
                    let shared = format!("n{}", rng.random_range(0..12));
                    let dir = if rng.random_bool(0.5) { "s" } else { "t" };
                    let body = format!("{who}:{k}:")
                        .into_bytes()
                        .repeat(rng.random_range(1..400));
                    let r = match rng.random_range(0..10) {
                        // Replace a shared name atomically (write aside, rename over it),
                        // as checkpoints are: two in-place overwrites racing would mix bytes
                        // on any file system.
                        0..=3 => {
                            let tmp = mp.join(dir).join(format!(".tmp-{who}-{k}"));
                            std::fs::write(&tmp, &body)
                                .and_then(|()| std::fs::rename(&tmp, mp.join(dir).join(&shared)))
                        }
                        4..=5 => std::fs::rename(
                            mp.join("s").join(&shared),
                            mp.join("t").join(format!("n{}", rng.random_range(0..12))),
                        ),
                        6 => std::fs::remove_file(mp.join(dir).join(&shared)),
                        _ => {
                            // A file only this writer touches, overwritten in place.
                            let own = format!("own-{who}-{}", rng.random_range(0..8));
                            let r = std::fs::write(mp.join("s").join(&own), &body);
                            if r.is_ok() {
                                mine.insert(own, body);
                            }
                            r
                        }
                    };
                    match r {
                        Ok(()) => ok += 1,
                        Err(e) if e.raw_os_error() == Some(5) => eio += 1,
                        Err(_) => {} // ENOENT and the like: another writer got there first
                    }
                }
                (who, mine, ok, eio)
            })
        })
        .collect();
    let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    for m in mms {
        m.stop();
    }
    let pfs = fs_core::Fs::open(open_ro(&meta).await, integration::open_store(&store))
        .await
        .unwrap();
    for Site {
        agent: a,
        meta: m_meta,
        store: m_store,
        ..
    } in &mirrors
    {
        wait_converged(a, &**pfs.engine(), Duration::from_secs(120)).await;
        assert_same(&pfs, m_meta, m_store).await;
    }
    // fsck --deep passes at every site (each mirror's metadata with its own store).
    for m in std::iter::once(meta.as_str()).chain(mirrors.iter().map(|s| s.meta.as_str())) {
        let o = integration::run("jfs", &["fsck", m, "--deep"], &[]);
        assert!(
            o.status.success(),
            "fsck --deep of {m}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Every file is one writer's whole bytes; a writer's own files hold its last bytes.
    let whole = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let unit = s.split_inclusive(':').take(2).collect::<String>();
        !unit.is_empty()
            && b.len().is_multiple_of(unit.len())
            && s == unit.repeat(b.len() / unit.len())
    };
    // (Read from the primary's metadata itself: a mount's kernel caches may hold a name
    // another site renamed away for up to their TTL.)
    let mut files = 0;
    for sub in ["/s", "/t"] {
        let (d, _) = pfs.resolve(sub).await.unwrap();
        for e in pfs.readdir_all(d).await.unwrap() {
            let b = read_all(&pfs, e.ino).await;
            assert!(
                whole(&b),
                "{sub}/{} is not one writer's whole bytes",
                String::from_utf8_lossy(&e.name)
            );
            files += 1;
        }
    }
    assert!(files > 0);
    let mut total = 0;
    for (who, mine, ok, eio) in &results {
        assert_eq!(*eio, 0, "{who}: {eio} changes failed with EIO");
        assert!(*ok > 20, "{who}: only {ok} changes made");
        total += ok;
        for (name, b) in mine {
            let (ino, _) = pfs.resolve(&format!("/s/{name}")).await.unwrap();
            assert!(
                read_all(&pfs, ino).await == *b,
                "{name}: not {who}'s last bytes"
            );
        }
    }
    eprintln!("{total} changes by 3 writers in {run_for:?}; {files} files at the end");
    pm.stop();
    drop(primary);
    drop(mirrors);
}

/// The link between the sites cut (network namespaces, the link down: packets vanish): a
/// change at the mirror mount fails with EIO within the bound, reads go on, nothing is half
/// made; after the link returns, writes go through again by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_link_cut_changes_fail_in_bounded_time_and_resume_after() {
    let net = NetPair::new(3);
    let dir = tempfile::tempdir().unwrap();
    let (meta, store, keep) = primary_volume("rocksdb");
    // The primary's mount first: the primary agent, started in its namespace next, sees it
    // in its copy of the mount table (it commits the mirror's changes through it).
    let p = Primary {
        mount: Mount::start(&meta, dir.path(), "pm", &["--cache-size", "0"]),
        meta,
        store,
        _keep: keep,
    };
    let at = Placement::Netns {
        net: &net,
        port: 19_630,
    };
    let pair = Pair::start_at(dir.path(), &p.meta, "rocksdb", at, ALLOW_WRITES, "").await;
    let st = writes_known(&pair).await;
    assert_eq!(st["writes"]["allowed"], true, "{st}");
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), data(8, 300_000)).unwrap();
    assert!(std::fs::read(p.mount.mp.join("before")).unwrap() == data(8, 300_000));
    net.link(false);
    for name in ["during-1", "during-2"] {
        let t0 = Instant::now();
        let e = std::fs::write(m.mp.join(name), b"whole").unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{name}: {e}");
        assert!(
            took < Duration::from_secs(15),
            "{name}: the failure took {took:?}"
        );
    }
    assert!(std::fs::read(m.mp.join("before")).unwrap() == data(8, 300_000));
    net.link(true);
    let t0 = Instant::now();
    loop {
        match std::fs::write(m.mp.join("after"), b"back") {
            Ok(()) => break,
            Err(e) => assert!(
                t0.elapsed() < Duration::from_secs(60),
                "writes did not resume after the link came back: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(std::fs::read(p.mount.mp.join("after")).unwrap(), b"back");
    // A change that failed was made whole or not at all (its create may have reached the
    // primary before the cut; its bytes then came with a later commit, or never).
    for name in ["during-1", "during-2"] {
        if let Ok(b) = std::fs::read(p.mount.mp.join(name)) {
            assert!(b.is_empty() || b == b"whole", "{name}: {} bytes", b.len());
        }
    }
    m.stop();
    drop(pair);
    p.mount.stop();
}

/// The mirror whose mount writes through is promoted (the planned site migration of
/// runbooks/site-migration.md, steps run as written): before, its changes go to the old
/// primary; while the old primary is fenced and the agent is stopped, a change fails with
/// EIO and is not made; once the site is the primary, the same mount (never restarted)
/// commits at its own metadata, and every file written before and after reads back there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writing_mirror_mount_keeps_writing_when_its_site_is_promoted() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    let new_listen = format!("127.0.0.1:{}", free_port());
    let mut pair = Pair::start(
        dir.path(),
        &old_meta,
        "redis",
        None,
        ALLOW_WRITES,
        &format!("listen = \"{new_listen}\""),
    )
    .await;
    writes_known(&pair).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), data(21, 700_000)).unwrap();
    let (ino, _) = vol.fs.resolve("/before").await.unwrap();
    assert!(
        read_all(&vol.fs, ino).await == data(21, 700_000),
        "not at the old primary"
    );
    let (m_admin, m_cfg) = (
        pair.mirror.admin.clone(),
        pair.mirror.cfg.display().to_string(),
    );
    let env = [
        ("OLD_META", old_meta.as_str()),
        ("NEW_META", pair.m_meta.as_str()),
        ("NEW_PRIMARY", new_listen.as_str()),
        ("MIRROR_ADMIN", m_admin.as_str()),
        ("MIRROR_CONFIG", m_cfg.as_str()),
        ("OLD_SITE", "old-site"),
    ];
    integration::runbook::run_ok("site-migration", "fence", &env);
    integration::runbook::run_ok("site-migration", "wait", &env);
    assert_eq!(
        pair.mirror.term(),
        0,
        "the mirror agent did not stop cleanly"
    );
    // Between the fence and the promotion: refused, nothing made.
    let e = std::fs::write(m.mp.join("between"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    let out = integration::runbook::run_ok("site-migration", "promote", &env);
    assert!(out.contains("primary at epoch 1"), "{out}");
    // The same mount writes on, now at its own site's metadata.
    let t0 = Instant::now();
    loop {
        match std::fs::write(m.mp.join("after"), data(22, 500_000)) {
            Ok(()) => break,
            Err(e) => assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the mount did not write after its site's promotion: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(std::fs::read(m.mp.join("after")).unwrap() == data(22, 500_000));
    m.stop();
    let newp = volume::open(&pair.m_meta, &volume::Options::default())
        .await
        .unwrap();
    for (name, b) in [
        ("/before", data(21, 700_000)),
        ("/after", data(22, 500_000)),
    ] {
        let (ino, _) = newp.resolve(name).await.unwrap();
        assert!(
            read_all(&newp, ino).await == b,
            "{name} at the promoted site"
        );
    }
    assert!(
        newp.resolve("/between").await.is_err(),
        "a refused change was made"
    );
    assert!(
        vol.fs.resolve("/after").await.is_err(),
        "a change after the move reached the fenced old primary"
    );
}

/// Another mirror is promoted (runbooks/site-migration.md, steps as written, including 4b for
/// a third site) while a checkpoint writer runs at a mirror mount that writes through: every
/// checkpoint it saw acknowledged is at the new primary and at its own site; once its agent
/// follows the new primary, the same mount (never restarted) writes there, blocks at the
/// new primary's store, and nothing reaches the fenced old primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writing_mirror_mount_writes_to_the_new_primary_after_another_mirror_is_promoted() {
    use integration::written::{check_files, Written};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    // m1 writes through its mount; m2 is the site that becomes the primary.
    let (mut old_primary, m1, m2) = three_sites(d, &old_meta);
    let (mut m1_agent, m1_meta) = (m1.agent, m1.meta);
    let (mut m2_agent, m2_meta, m2_store, m2_future) = (m2.agent, m2.meta, m2.store, m2.future);
    let env = [
        ("MIRROR_TOKEN", TOKEN),
        ("JFS_RUN_DIR", &*d.join("run").display().to_string()),
    ];
    status_until(&m1_agent, Duration::from_secs(60), |st| {
        st["bootstrap"].is_null() && st["writes"]["allowed"] == true
    })
    .await;
    let mm = Mount::start(&m1_meta, d, "mm", &["--cache-size", "0"]);
    std::fs::create_dir(mm.mp.join("w")).unwrap();
    let log = d.join("ckpt-writer.log");
    let stop = d.join("ckpt-writer.stop");
    let mut writer = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt-writer"))
        .arg(mm.mp.join("w"))
        .arg(&log)
        .arg(&stop)
        .spawn()
        .expect("starting ckpt-writer");
    let oks = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("ok "))
            .count()
    };
    let t0 = Instant::now();
    while oks(&log) < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer at m1 finished no checkpoint: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Promote m2 (the planned move), then start its primary agent serving the old site and m1.
    let new_listen = m2_future;
    let (m2_admin, m2_cfg, m1_cfg) = (
        m2_agent.admin.clone(),
        m2_agent.cfg.display().to_string(),
        m1_agent.cfg.display().to_string(),
    );
    let rb = [
        ("OLD_META", old_meta.as_str()),
        ("NEW_META", m2_meta.as_str()),
        ("NEW_PRIMARY", new_listen.as_str()),
        ("MIRROR_ADMIN", m2_admin.as_str()),
        ("MIRROR_CONFIG", m2_cfg.as_str()),
        ("OLD_SITE", "old-site"),
        ("OTHER_MIRROR_CONFIG", m1_cfg.as_str()),
        ("MIRROR_TOKEN", TOKEN),
        ("ADMIN_TOKEN", ADMIN_TOKEN),
    ];
    integration::runbook::run_ok("site-migration", "fence", &rb);
    integration::runbook::run_ok("site-migration", "wait", &rb);
    assert_eq!(m2_agent.term(), 0, "m2's agent did not stop cleanly");
    let out = integration::runbook::run_ok("site-migration", "promote", &rb);
    assert!(out.contains("primary at epoch 1"), "{out}");
    let _new_primary = Agent::start_with(
        d,
        "new-primary",
        &primary_toml(
            &m2_meta,
            &d.join("new-primary-state"),
            &format!("127.0.0.1:{}", free_port()),
            &new_listen,
            &["old-site", "m1"],
            ALLOW_WRITES,
        ),
        &env,
        &[],
    );
    // Step 4b at m1: repoint, restart, caught up. The mount is not touched.
    integration::runbook::run_ok("site-migration", "repoint", &rb);
    assert_eq!(m1_agent.term(), 0, "m1's agent did not stop cleanly");
    m1_agent.restart();
    integration::runbook::run_checked("site-migration", "repointed", &rb);
    status_until(&m1_agent, Duration::from_secs(30), |st| {
        st["writes"]["allowed"] == true && st["writes"]["connected"] == true
    })
    .await;
    let oks_at_repoint = oks(&log);
    let t0 = Instant::now();
    while oks(&log) < oks_at_repoint + 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the mount at m1 wrote nothing after its agent followed the new primary: {}",
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 10)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&stop, b"").unwrap();
    assert!(writer.wait().unwrap().success(), "ckpt-writer failed");
    std::fs::write(mm.mp.join("after"), data(31, 900_000)).unwrap();
    // What the writer saw acknowledged: the last of each name.
    let mut files: Vec<Written> = Vec::new();
    let mut errors = Vec::new();
    for l in std::fs::read_to_string(&log).unwrap().lines() {
        let f: Vec<&str> = l.splitn(3, ' ').collect();
        match f.as_slice() {
            ["ok", name, rest] => {
                let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
                let path = format!("w/{name}");
                files.retain(|w| w.path != path);
                files.push(Written {
                    path,
                    crc: v[0] as u32,
                    len: v[1] as usize,
                });
            }
            ["err", _, msg] => errors.push(msg.to_string()),
            _ => panic!("ckpt-writer wrote {l:?}"),
        }
    }
    // Between the fence and m1's agent following the new primary, changes failed (EIO) and
    // were not made; nothing else failed.
    assert!(
        errors.iter().all(|e| e.contains("os error 5")),
        "unexpected errors at m1: {errors:?}"
    );
    let newp = volume::open(&m2_meta, &volume::Options::default())
        .await
        .unwrap();
    wait_converged(&m1_agent, &**newp.engine(), Duration::from_secs(60)).await;
    // At the new primary (through a fresh mount of it, blocks from its own store) and at m1.
    let pm = Mount::start(&m2_meta, d, "pm2", &["--cache-size", "0", "--read-only"]);
    let n = check_files(&pm.mp, &files);
    check_files(&mm.mp, &files);
    for mp in [&pm.mp, &mm.mp] {
        assert!(
            std::fs::read(mp.join("after")).unwrap() == data(31, 900_000),
            "/after differs under {}",
            mp.display()
        );
    }
    // Its blocks are in the new primary's store: a volume on m2's metadata reading only that store.
    let only_m2 = fs_core::Fs::open(open_ro(&m2_meta).await, integration::open_store(&m2_store))
        .await
        .unwrap();
    let (ino, _) = only_m2.resolve("/after").await.unwrap();
    assert!(
        read_all(&only_m2, ino).await == data(31, 900_000),
        "/after's blocks are not in the new primary's store"
    );
    assert!(
        vol.fs.resolve("/after").await.is_err(),
        "a change after the move reached the fenced old primary"
    );
    pm.stop();
    mm.stop();
    old_primary.term();
    eprintln!(
        "another mirror promoted: {n} checkpoints at m1, all at the new primary; {} refused during the move, {} acknowledged after m1's agent followed",
        errors.len(),
        oks(&log) - oks_at_repoint
    );
}

/// A file unlinked at a mirror mount while open there (POSIX: it lives until closed) is kept
/// at the primary: the mirror agent relays the session of its site's writing mount, so the
/// primary's session reap and `jfs gc --delete` leave it; the open handle reads every byte;
/// once closed it is freed, and once the mount is gone its relayed session goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_unlinked_while_open_at_a_mirror_mount_outlives_the_primarys_reap() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, ALLOW_WRITES, "").await;
    writes_known(&pair).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let want = data(77, 3_000_000);
    std::fs::write(m.mp.join("held"), &want).unwrap();
    let mut f = std::fs::File::open(m.mp.join("held")).unwrap();
    std::fs::remove_file(m.mp.join("held")).unwrap();
    let (_ino, sid) = {
        // The primary's view: the name is gone, the inode is kept for the mirror's session.
        assert!(
            vol.fs.resolve("/held").await.is_err(),
            "the unlink did not reach the primary"
        );
        let kept = vol.fs.kept_inodes().await.unwrap();
        assert_eq!(kept.len(), 1, "kept at the primary: {kept:?}");
        kept[0].clone()
    };
    let relayed = |sid: String| {
        let e = vol.fs.engine().clone();
        async move {
            fs_core::session::list(&*e)
                .await
                .unwrap()
                .into_iter()
                .any(|s| s.id == sid && s.relayed_by.as_deref() == Some("m1"))
        }
    };
    let t0 = Instant::now();
    while !relayed(sid.clone()).await {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the primary never got the mirror mount's session {sid}; at the mirror: {:?}; mirror agent:\n{}",
            fs_core::session::list(&*open_ro(&pair.m_meta).await).await,
            tail(&pair.mirror.log_text(), 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let o = integration::run("jfs", &["status", &vol.meta_url], &[]);
    let st = String::from_utf8_lossy(&o.stdout);
    assert!(
        st.contains(&format!("{sid} live"))
            && st.contains("(at mirror \"m1\", relayed by its agent)"),
        "the primary's status does not show the relayed session:\n{st}"
    );
    let reaped = vol
        .fs
        .reap_sessions(fs_core::session::DEFAULT_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        reaped.inodes, 0,
        "the primary reaped the mirror's open file"
    );
    let o = integration::run("jfs", &["gc", &vol.meta_url, "--delete"], &[]);
    assert!(
        o.status.success(),
        "gc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(vol.fs.kept_inodes().await.unwrap().len(), 1);
    // A gc aimed at the mirror's metadata (an operator's slip) is refused: it is never run
    // through the writing mount there, whose changes would be committed at the primary.
    let o = integration::run("jfs", &["gc", &pair.m_meta, "--delete"], &[]);
    assert!(
        !o.status.success(),
        "gc at the mirror ran: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(vol.fs.kept_inodes().await.unwrap().len(), 1);
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(
        got == want,
        "the open handle read {} bytes that differ",
        got.len()
    );
    drop(f);
    let t0 = Instant::now();
    while !vol.fs.kept_inodes().await.unwrap().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the closed file is still kept at the primary"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    m.stop();
    let t0 = Instant::now();
    while relayed(sid.clone()).await {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the unmounted mirror mount's session is still kept at the primary"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
