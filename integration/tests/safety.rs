//! Operator safety: the mistakes a new operator makes (overlapping paths, writing at the wrong
//! site, a mistyped flag...) are refused with one clear line and lose nothing. Every test runs
//! the project's binaries as separate processes and checks files, exit codes and messages.

use integration::mirror::{wait_converged, write_files, Pair};
use integration::{data, digest, fails_clearly, run, snapshot, volume};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn make_tree(root: &Path, n: usize) {
    for i in 0..n {
        let d = root.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), data(i as u64, 1000 + i * 7)).unwrap();
    }
}

/// Run a binary that is expected to exit by itself; killed (and the test failed) past `limit`.
fn run_within(name: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut c = Command::new(integration::bin(name));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{name} {args:?} still running after {limit:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `mirror-agent run --config CFG`, which is expected to refuse to start.
fn agent_run(cfg: &Path, env: &[(&str, &str)]) -> Output {
    run_within(
        "mirror-agent",
        &["run", "--config", s(cfg)],
        env,
        Duration::from_secs(30),
    )
}

/// Item 1: SRC and DST that overlap, in any spelling, are refused before anything is
/// created, copied or deleted.
#[test]
fn overlapping_src_and_dst_are_refused_and_nothing_moves() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let ov = root.join("ov");
    make_tree(&ov, 40);
    std::fs::create_dir_all(ov.join("a")).unwrap();
    std::fs::write(ov.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink(&ov, root.join("alias")).unwrap();
    let before = snapshot(root);
    let cache = root.join("cache");
    let env = [("XDG_CACHE_HOME", s(&cache))];
    let r = root.display();
    let cases: Vec<Vec<String>> = vec![
        vec![
            "--delete-dst".into(),
            format!("{r}/ov"),
            format!("{r}/ov/a"),
        ],
        vec![format!("{r}/ov"), format!("{r}/ov/sub/x")],
        vec![
            "--delete-src".into(),
            format!("{r}/ov/a"),
            format!("{r}/ov"),
        ],
        vec![format!("{r}/ov"), format!("{r}/ov/")],
        vec![format!("{r}/ov"), format!("{r}/ov/a/../.")],
        vec![format!("{r}/ov"), format!("{r}/alias/new")],
        vec![format!("{r}/alias"), format!("file://{r}/ov/b")],
        vec!["--dry-run".into(), format!("{r}/ov"), format!("{r}/ov/a")],
        vec![format!("{r}/ov"), format!("opendal+fs://?root={r}/ov/c")],
    ];
    for args in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = fails_clearly(&run("jfs-sync", &a, &env), "SRC and DST overlap");
        assert!(err.contains("nothing was copied or deleted"), "{err}");
    }
    assert_eq!(
        snapshot(root),
        before,
        "the tree changed (digest {:08x})",
        digest(&before)
    );
    // The same directory through a bind mount, under a path that shares nothing with it.
    {
        let bound = root.join("bound");
        std::fs::create_dir_all(&bound).unwrap();
        let st = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&ov)
            .arg(&bound)
            .status()
            .unwrap();
        assert!(st.success(), "mount --bind");
        struct Unbind(std::path::PathBuf);
        impl Drop for Unbind {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
            }
        }
        let _unbind = Unbind(bound.clone());
        for args in [
            vec![
                "--delete-dst".to_string(),
                format!("{r}/bound/a"),
                format!("{r}/ov"),
            ],
            vec![
                "--delete-dst".to_string(),
                format!("{r}/ov"),
                format!("{r}/bound/a"),
            ],
            vec![format!("{r}/bound"), format!("{r}/ov")],
        ] {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let err = fails_clearly(&run("jfs-sync", &a, &env), "SRC and DST overlap");
            assert!(err.contains("nothing was copied or deleted"), "{err}");
        }
    }
    std::fs::remove_dir(root.join("bound")).unwrap();
    assert_eq!(snapshot(root), before, "the tree changed (bind mount)");
    // Neighbours that only share a name prefix are not an overlap.
    let o = run(
        "jfs-sync",
        &[s(&ov.join("a")), &format!("{r}/ov-copy")],
        &env,
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn overlapping_object_prefixes_and_volume_paths_are_refused() {
    let s3 = std::env::var("JFS_TEST_S3").expect("JFS_TEST_S3 (run under integration/test.sh)");
    let (bucket, query) = s3.split_once('?').unwrap();
    let p = integration::unique("ov");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src, 10);
    let o = run(
        "jfs-sync",
        &[s(&src), &format!("{bucket}/{p}/top?{query}")],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (a, b) in [
        (
            format!("{bucket}/{p}/top?{query}"),
            format!("{bucket}/{p}/top/in?{query}"),
        ),
        (
            format!("{bucket}/{p}/top/d0?{query}"),
            format!("{bucket}/{p}?{query}"),
        ),
    ] {
        fails_clearly(
            &run("jfs-sync", &["--delete-dst", &a, &b], &[]),
            "SRC and DST overlap",
        );
    }
    // Only a shared name prefix: fine.
    let o = run(
        "jfs-sync",
        &[
            &format!("{bucket}/{p}/top?{query}"),
            &format!("{bucket}/{p}/top2?{query}"),
        ],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Volumes: the same volume (two names for one META_URL) with nested paths, and a volume's
    // own block store as a destination.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let vol = rt.block_on(volume("redis", "file"));
    let env = [
        ("VA", vol.meta_url.as_str()),
        ("VB", vol.meta_url.as_str()),
        (
            "JFS_META_PASSWORD",
            &std::env::var("JFS_META_PASSWORD").unwrap_or_default(),
        ),
    ];
    let o = run("jfs-sync", &[s(&src), "jfs://VA/data"], &env);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    fails_clearly(
        &run(
            "jfs-sync",
            &["--delete-dst", "jfs://VA/data", "jfs://VB/data/copy"],
            &env,
        ),
        "SRC and DST overlap",
    );
    let store_dir = vol.store_url.strip_prefix("file://").unwrap().to_string();
    let store_before = snapshot(Path::new(&store_dir));
    let err = fails_clearly(
        &run(
            "jfs-sync",
            &["--delete-dst", "jfs://VA/data", &store_dir],
            &env,
        ),
        "SRC and DST overlap",
    );
    assert!(err.contains("block store"), "{err}");
    assert_eq!(snapshot(Path::new(&store_dir)), store_before);
}

/// Item 2: nothing writes into a mirror's metadata (jfs, jfs-sync, gc, load, format), not
/// even with its agent stopped; an agent at the wrong site is refused; `detach` makes the
/// mirror a volume of its own whose blocks go to the mirror store, and its agent then refuses
/// to overwrite it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_into_a_mirror_are_refused_until_it_is_detached() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "f", 3, 300_000).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let m = pair.m_meta.clone();
    // While its agent runs (and holds the RocksDB writer's lock), a write names the mirror
    // and its primary too, never advising to stop the agent.
    let local0 = dir.path().join("local0");
    std::fs::write(&local0, b"x").unwrap();
    for args in [
        vec!["put", &m, s(&local0), "/new"],
        vec!["mkdir", &m, "/d"],
        vec!["rm", &m, "/f0"],
    ] {
        let err = fails_clearly(&run("jfs", &args, &[]), "is the metadata of mirror \"m1\"");
        assert!(
            err.contains(&pair.listen) && !err.contains("stop that process"),
            "{err}"
        );
    }
    assert_eq!(pair.mirror.term(), 0);
    let m_store = pair.m_store.strip_prefix("file://").unwrap().to_string();
    let p_store = vol.store_url.strip_prefix("file://").unwrap().to_string();
    let dump = |url: &str| {
        let o = run("jfs", &["dump", url], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let m_dump = dump(&m);
    let (m_files, p_files) = (snapshot(Path::new(&m_store)), snapshot(Path::new(&p_store)));
    let local = dir.path().join("local");
    std::fs::write(&local, data(9, 50_000)).unwrap();
    let dump_file = dir.path().join("dump.json");
    std::fs::write(&dump_file, &m_dump).unwrap();
    let want = "is the metadata of mirror \"m1\"";
    for args in [
        vec!["put", &m, s(&local), "/new"],
        vec!["mkdir", &m, "/d"],
        vec!["rm", &m, "/f0"],
        vec!["mv", &m, "/f1", "/g1"],
        vec!["truncate", &m, "/f2", "0"],
        vec!["ln", "-s", &m, "/f0", "/l"],
        vec!["gc", &m, "--delete"],
        vec!["load", &m, s(&dump_file)],
        vec![
            "format",
            &m,
            "v2",
            "--storage",
            &format!("file://{m_store}"),
        ],
    ] {
        let err = fails_clearly(&run("jfs", &args, &[]), want);
        assert!(err.contains("mirror-agent detach"), "{err}");
    }
    // The mirror's dump loaded into fresh metadata would take the primary's store over (the
    // mirror's settings name it): refused, pointing at --block-store and the mirror's store.
    let fresh = format!("rocksdb://{}/fresh", dir.path().display());
    let err = fails_clearly(
        &run("jfs", &["load", &fresh, s(&dump_file)], &[]),
        "the metadata of mirror site \"m1\"",
    );
    assert!(
        err.contains("--block-store") && err.contains(&pair.m_store) && err.contains("promote"),
        "{err}"
    );
    assert!(!dir.path().join("fresh").exists(), "{err}");
    let src = dir.path().join("tree");
    make_tree(&src, 5);
    fails_clearly(
        &run("jfs-sync", &[s(&src), "jfs://MV/x"], &[("MV", m.as_str())]),
        want,
    );
    // Reading is fine.
    let o = run("jfs", &["cat", &m, "/f1"], &[]);
    assert_eq!(o.stdout, data(1, 300_000));
    assert_eq!(dump(&m), m_dump, "the mirror's metadata changed");
    assert_eq!(
        snapshot(Path::new(&m_store)),
        m_files,
        "the mirror store changed"
    );
    assert_eq!(
        snapshot(Path::new(&p_store)),
        p_files,
        "the primary's store changed"
    );

    // The wrong site: a primary agent on a mirror's metadata, a mirror agent on a volume of its
    // own.
    let cfg = dir.path().join("wrong-primary.toml");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&pair.primary.cfg)
            .unwrap()
            .replace(&vol.meta_url, &m),
    )
    .unwrap();
    let env = [
        ("MIRROR_TOKEN", integration::mirror::TOKEN),
        ("ADMIN_TOKEN", integration::mirror::ADMIN_TOKEN),
    ];
    fails_clearly(
        &agent_run(&cfg, &env),
        "a primary agent runs beside the primary's metadata",
    );
    let other = volume("rocksdb", "file").await;
    let other_url = other.meta_url.clone();
    drop(other.fs);
    let cfg = dir.path().join("wrong-mirror.toml");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&pair.mirror.cfg)
            .unwrap()
            .replace(&m, &other_url)
            .replace("mstate", "mstate2"),
    )
    .unwrap();
    fails_clearly(&agent_run(&cfg, &env), "is not a mirror's metadata");

    // Detach: a volume of its own, writing to the mirror store; the agent refuses it after.
    let o = run_within(
        "mirror-agent",
        &["detach", "--config", s(&pair.mirror.cfg)],
        &env,
        Duration::from_secs(30),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("detached mirror \"m1\"") && out.contains("slot drop m1"),
        "{out}"
    );
    let st = String::from_utf8_lossy(&run("jfs", &["status", &m], &[]).stdout).to_string();
    assert!(st.contains("detached from mirror \"m1\""), "{st}");
    let o = run("jfs", &["put", &m, s(&local), "/new"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        run("jfs", &["cat", &m, "/new"], &[]).stdout,
        data(9, 50_000)
    );
    assert_eq!(
        run("jfs", &["cat", &m, "/f1"], &[]).stdout,
        data(1, 300_000)
    );
    assert_eq!(
        snapshot(Path::new(&p_store)),
        p_files,
        "a block went to the primary's store"
    );
    assert!(
        snapshot(Path::new(&m_store)).len() > m_files.len(),
        "the new block is in the mirror store"
    );
    fails_clearly(
        &agent_run(&pair.mirror.cfg, &env),
        "was mirror \"m1\" and was detached",
    );
}

/// Item 3: a mistyped flag or subcommand never gets a destructive suggestion; harmless ones
/// still do, and the habit spellings that mean the same are accepted.
#[test]
fn mistyped_flags_never_suggest_a_destructive_one() {
    let destructive = [
        "--delete-src",
        "--delete-dst",
        "--force-update",
        "--reset-state",
        "'--delete'",
        "'rm'",
        "'drop'",
        "'detach'",
        "--delete ",
        "'--purge'",
        "'recover'",
    ];
    for (bin, args) in [
        ("jfs-sync", vec!["--delete-srx", "a", "b"]),
        ("jfs-sync", vec!["--delete-afte", "a", "b"]),
        ("jfs-sync", vec!["--delet", "a", "b"]),
        ("jfs-sync", vec!["--delete-ds", "a", "b"]),
        ("jfs-sync", vec!["--forc", "a", "b"]),
        ("jfs-sync", vec!["--reset-stat", "a", "b"]),
        ("jfs", vec!["gc", "rocksdb:///x", "--delet"]),
        ("jfs", vec!["rmm", "rocksdb:///x", "/a"]),
        ("jfs", vec!["backup", "rocksdb:///x", "--purg"]),
        (
            "jfs",
            vec!["recovr", "file:///s", "rocksdb:///x", "--name", "v"],
        ),
        ("mirror-agent", vec!["slot", "drp", "x"]),
        ("mirror-agent", vec!["detah"]),
    ] {
        let o = run(bin, &args, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bin} {args:?}: {err}");
        for d in destructive {
            assert!(!err.contains(d), "{bin} {args:?} suggests {d}: {err}");
        }
    }
    let err =
        String::from_utf8_lossy(&run("jfs-sync", &["--dry-rn", "a", "b"], &[]).stderr).to_string();
    assert!(err.contains("'--dry-run'"), "{err}");
    // rsync's and rclone's spellings of "delete after the copies".
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 3);
    make_tree(&dst, 6);
    let env = [("XDG_CACHE_HOME", s(t.path()))];
    let o = run(
        "jfs-sync",
        &[s(&src), s(&dst), "--delete-after", "-n"],
        &env,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("would delete"))
            .count(),
        3,
        "{out}"
    );
    let o = run("jfs-sync", &[s(&src), s(&dst), "--delete", "-n"], &env);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("run as --delete-dst"), "{err}");
    assert_eq!(o.status.code(), Some(0));
}

/// Item 4: a mirror agent whose state directory was lost rebuilds its block queue from the
/// mirror's own metadata (its journal starts at the snapshot, so it cannot be re-read from 1)
/// and re-copies exactly what the mirror store lacks; lost during a bootstrap, it starts the
/// snapshot over instead of leaving the readers' fence up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_state_directory_is_rebuilt_from_the_mirror() {
    use integration::mirror::{assert_same, tail};
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "f", 4, 9 << 20).await; // 3 blocks each
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(pair.mirror.term(), 0);
    let m_store = Path::new(pair.m_store.strip_prefix("file://").unwrap()).to_path_buf();
    let blocks: Vec<String> = snapshot(&m_store)
        .into_keys()
        .filter(|k| k.contains("/chunks/") && !k.ends_with('/'))
        .collect();
    assert_eq!(blocks.len(), 12, "{blocks:?}");
    for b in &blocks[..3] {
        std::fs::remove_file(m_store.join(b)).unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("mstate")).unwrap();
    write_files(&vol.fs, "g", 2, 5 << 20).await;
    pair.mirror.restart();
    let st = wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let log = pair.mirror.log_text();
    assert!(
        log.contains("queuing every block the metadata references again"),
        "{}",
        tail(&log, 20)
    );
    assert!(!log.contains("no longer retained"), "{}", tail(&log, 20));
    assert_eq!(integration::mirror::n(&st, "blocks.copied"), 3 + 4, "{st}");
    assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await;

    // Lost in the middle of a bootstrap: the fence record says so, the state does not.
    assert_eq!(pair.mirror.term(), 0);
    let e = integration::open_engine(&pair.m_meta).await;
    e.aux_put(
        fs_core::slots::MIRROR_INCOMPLETE,
        Some(b"snapshot at seq 1 being installed"),
    )
    .await
    .unwrap();
    drop(e);
    std::fs::remove_dir_all(dir.path().join("mstate")).unwrap();
    pair.mirror.restart();
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    assert!(pair
        .mirror
        .log_text()
        .contains("bootstrapping again from a snapshot"));
    let o = run("jfs", &["ls", &pair.m_meta, "/"], &[]);
    assert!(
        o.status.success(),
        "readers are let in again: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await;
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// One attacker connection from `src` (a loopback address of its own): announces a 64 MiB
/// frame and pushes body bytes until the primary cuts it off (or `hold` passes), or, when
/// `idle`, sends nothing and just holds the connection.
async fn attack(src: std::net::Ipv4Addr, to: std::net::SocketAddr, idle: bool, hold: Duration) {
    use tokio::io::AsyncWriteExt;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    if sock.bind((src, 0).into()).is_err() {
        return;
    }
    let Ok(mut s) = sock.connect(to).await else {
        return;
    };
    let t0 = Instant::now();
    if !idle {
        let _ = s.write_all(&(64u32 << 20).to_be_bytes()).await;
        let chunk = vec![0x5au8; 64 << 10];
        while t0.elapsed() < hold {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    } else {
        tokio::time::sleep(hold).await;
    }
}

/// Item 6: a flood of unauthenticated connections (64 MiB frame headers with bodies behind
/// them, and idle ones from many addresses) keeps the primary's memory bounded, and a real
/// mirror still connects and replicates meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unauthenticated_flood_holds_little_memory_and_a_mirror_still_replicates() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "a", 2, 100_000).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let ppid = pair.primary.pid();
    let base = rss(ppid);
    let to: std::net::SocketAddr = pair.listen.parse().unwrap();
    let hold = Duration::from_secs(12);
    let mut tasks = Vec::new();
    // 300 connections from one host with huge frames; 40 hosts x 16 idle connections.
    for _ in 0..300 {
        tasks.push(tokio::spawn(attack([127, 0, 0, 2].into(), to, false, hold)));
    }
    for h in 0..40u8 {
        for _ in 0..16 {
            tasks.push(tokio::spawn(attack(
                [127, 0, 1, h + 1].into(),
                to,
                true,
                hold,
            )));
        }
    }
    // Meanwhile the real mirror reconnects (its handshake runs during the flood) and
    // replicates new writes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.mirror.kill9();
    write_files(&vol.fs, "b", 3, 200_000).await;
    pair.mirror.restart();
    let mut peak = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        peak = peak.max(rss(ppid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    integration::mirror::assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await;
    let st = pair.primary.status();
    let dropped = integration::mirror::n(&st, "unauthenticated_dropped");
    for t in tasks {
        let _ = t.await;
    }
    eprintln!(
        "primary RSS {} MiB before, {} MiB peak during the flood; {dropped} unauthenticated connections dropped",
        base >> 20,
        peak >> 20
    );
    assert!(dropped >= 300, "{st}");
    assert!(
        peak < base + (64 << 20),
        "the flood raised the primary's RSS from {} MiB to {} MiB",
        base >> 20,
        peak >> 20
    );
}

fn curl(args: &[&str]) -> (String, String) {
    let o = Command::new("curl")
        .args(["-s", "-o", "/dev/stderr", "-w", "%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Item 6: changes through the admin address need the admin token; /metrics and /status stay
/// readable. Plaintext replication across a network is refused unless opted into.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_changes_need_a_token_and_plaintext_across_a_network_is_refused() {
    use integration::mirror::ADMIN_TOKEN;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    let url = format!("http://{}/limits?bwlimit=1K", pair.mirror.admin);
    assert_eq!(curl(&["-X", "PUT", &url]).0, "401");
    let (code, body) = curl(&[
        "-X",
        "PUT",
        "-H",
        "Authorization: Bearer wrong-token-123456",
        &url,
    ]);
    assert_eq!(code, "401", "{body}");
    assert!(body.contains("wrong admin token"), "{body}");
    let (code, body) = curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
        &url,
    ]);
    assert_eq!(code, "200", "{body}");
    integration::mirror::status_until(&pair.mirror, Duration::from_secs(5), |st| {
        st["limits"]["bytes_per_s"].as_u64() == Some(1024)
    })
    .await;
    for path in ["metrics", "status"] {
        assert_eq!(
            curl(&[&format!("http://{}/{path}", pair.mirror.admin)]).0,
            "200"
        );
    }
    // `mirror-agent limits` without the token says what it needs.
    let err = fails_clearly(
        &run(
            "mirror-agent",
            &["limits", "--admin", &pair.mirror.admin, "--bwlimit", "1M"],
            &[],
        ),
        "needs the agent's admin token",
    );
    assert!(!err.contains(ADMIN_TOKEN));
    // An agent with no admin token refuses every change, and says how to enable them.
    let cfg = std::fs::read_to_string(&pair.mirror.cfg).unwrap();
    let no_token = dir.path().join("no-token.toml");
    std::fs::write(
        &no_token,
        cfg.replace("admin_token_env = \"ADMIN_TOKEN\"\n", ""),
    )
    .unwrap();
    let out = String::from_utf8_lossy(
        &run(
            "mirror-agent",
            &["check-config", "--config", s(&no_token)],
            &[("MIRROR_TOKEN", integration::mirror::TOKEN)],
        )
        .stdout,
    )
    .to_string();
    assert!(
        out.contains("warning: no admin_token_env or admin_token_file"),
        "{out}"
    );

    // Plaintext on a non-loopback address: refused by check-config and by run, with the way
    // out; accepted (with a warning) when opted into.
    let env = [
        ("MIRROR_TOKEN", integration::mirror::TOKEN),
        ("ADMIN_TOKEN", ADMIN_TOKEN),
    ];
    let p = dir.path().join("p.toml");
    std::fs::write(
        &p,
        integration::mirror::primary_toml(
            &vol.meta_url,
            &dir.path().join("ps"),
            "127.0.0.1:1",
            "0.0.0.0:1",
            &["m1"],
            "",
        ),
    )
    .unwrap();
    for cmd in ["check-config", "run"] {
        let err = fails_clearly(
            &run_within("mirror-agent", &[cmd, "--config", s(&p)], &env, Duration::from_secs(30)),
            "without TLS would send the volume's file names and metadata across the network in clear",
        );
        assert!(err.contains("insecure_plaintext = true"), "{err}");
    }
    std::fs::write(
        &p,
        integration::mirror::primary_toml(
            &vol.meta_url,
            &dir.path().join("ps"),
            "127.0.0.1:1",
            "0.0.0.0:1",
            &["m1"],
            "insecure_plaintext = true",
        ),
    )
    .unwrap();
    let o = run("mirror-agent", &["check-config", "--config", s(&p)], &env);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("warning: [primary] insecure_plaintext"));
    let m = dir.path().join("m.toml");
    std::fs::write(
        &m,
        integration::mirror::mirror_toml(
            "rocksdb:///tmp/x",
            &dir.path().join("ms"),
            "127.0.0.1:1",
            "m1",
            "192.0.2.10:9566",
            "file:///tmp/b",
            "",
        ),
    )
    .unwrap();
    fails_clearly(
        &run("mirror-agent", &["check-config", "--config", s(&m)], &env),
        "is across a network and tls_ca is not set",
    );
}

/// Items 7-9: check-config makes every check `run` makes (and says the same), a typo is named
/// at its line with the keys of its section, the shipped configs pass with their files in
/// place, and their admin addresses differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_finds_what_run_would_refuse() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let env = [
        ("MIRROR_TOKEN", integration::mirror::TOKEN),
        ("ADMIN_TOKEN", integration::mirror::ADMIN_TOKEN),
    ];
    std::fs::write(d.join("a-file"), "x").unwrap();
    let meta = format!("rocksdb://{}/meta", d.display());
    let good = |store: &str, state: &Path, extra: &str| {
        integration::mirror::mirror_toml(
            &meta,
            state,
            "127.0.0.1:1",
            "m1",
            "127.0.0.1:2",
            store,
            extra,
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            good("fil:///x", &d.join("s"), ""),
            "unsupported scheme \"fil\"",
        ),
        (
            good("file://srv/blocks", &d.join("s"), ""),
            "did you mean file:///srv/blocks?",
        ),
        (
            good("file:///x", &d.join("s"), "")
                .replace(&meta, "redis://u:hunter2@127.0.0.1:6379/0"),
            "do not put the password in the URL",
        ),
        (
            good("file:///x", &d.join("s"), "").replace(&meta, "rocksdb://tmp/x"),
            "did you mean rocksdb:///tmp/x?",
        ),
        (
            good("file:///x", &d.join("s"), "tls_ca = \"/no/such/ca.crt\""),
            "tls_ca /no/such/ca.crt",
        ),
        (
            good("file:///x", &d.join("a-file"), ""),
            "is a file, not a directory",
        ),
        (
            good("file:///x", &d.join("s"), "workers = 0"),
            "workers = 0",
        ),
        (
            good("file:///x", &d.join("s"), "bwlimit = \"lots\""),
            "bwlimit",
        ),
    ];
    for (i, (toml, want)) in cases.iter().enumerate() {
        let f = d.join(format!("c{i}.toml"));
        std::fs::write(&f, toml).unwrap();
        let check = fails_clearly(
            &run("mirror-agent", &["check-config", "--config", s(&f)], &env),
            want,
        );
        let start = fails_clearly(&agent_run(&f, &env), want);
        assert!(
            !check.contains("hunter2") && !start.contains("hunter2"),
            "{check}"
        );
    }
    assert!(
        !d.join("s").exists(),
        "a refused start left its state directory behind"
    );
    assert!(
        !d.join("meta").exists(),
        "a refused start left its metadata directory behind"
    );
    // A start that fails later (the metadata engine does not answer) removes the state
    // directory it created.
    let f = d.join("unreachable.toml");
    std::fs::write(
        &f,
        good("file:///x", &d.join("s2"), "").replace(&meta, "redis://127.0.0.1:1/0"),
    )
    .unwrap();
    fails_clearly(&agent_run(&f, &env), "127.0.0.1:1");
    assert!(
        !d.join("s2").exists(),
        "a failed start left its state directory behind"
    );
    // A mirror's own RocksDB metadata may not exist yet, parents included: the agent creates
    // it (a primary's must exist).
    let f = d.join("new-mirror.toml");
    std::fs::write(
        &f,
        good("file:///x", &d.join("s3"), "")
            .replace(&meta, &format!("rocksdb://{}/new/deeper/meta", d.display())),
    )
    .unwrap();
    let o = run("mirror-agent", &["check-config", "--config", s(&f)], &env);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("new").exists(), "check-config created a directory");
    // A primary with no mirrors: a warning, not an error.
    let f = d.join("p.toml");
    std::fs::write(
        &f,
        integration::mirror::primary_toml(
            &meta,
            &d.join("ps"),
            "127.0.0.1:1",
            "127.0.0.1:2",
            &[],
            "",
        ),
    )
    .unwrap();
    let o = run("mirror-agent", &["check-config", "--config", s(&f)], &env);
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("warning: [primary] has no [[primary.mirrors]]"));
    // A typo: its line, its section, the valid keys of that section; from the environment
    // too.
    let f = d.join("typo.toml");
    std::fs::write(&f, good("file:///x", &d.join("s"), "wrkers = 4")).unwrap();
    let err = fails_clearly(
        &run("mirror-agent", &["check-config", "--config", s(&f)], &env),
        "unknown key `wrkers`",
    );
    assert!(
        err.contains("line 11 (in [mirror])") && err.contains("workers, bwlimit"),
        "{err}"
    );
    let err = fails_clearly(
        &run(
            "mirror-agent",
            &["check-config", "--config", s(&d.join("c6.toml"))],
            &[("MIRROR_AGENT_MIRROR__WRKERS", "4"), env[0], env[1]],
        ),
        "MIRROR_AGENT_MIRROR__WRKERS",
    );
    assert!(err.contains("unknown key `wrkers`"), "{err}");

    // The shipped examples pass every check once their files exist; their admin addresses
    // differ, so a primary and a mirror can share a host.
    integration::mirror::make_certs(d);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::create_dir_all(d.join("vol")).unwrap();
    let mut admins = Vec::new();
    for f in ["primary.toml", "mirror.toml"] {
        let text = std::fs::read_to_string(repo.join("configs").join(f))
            .unwrap()
            .replace(
                "/var/lib/jfs/vol/meta",
                &format!("{}/vol/meta", d.display()),
            )
            .replace(
                "/var/lib/jfs/mirror/meta",
                &format!("{}/vol/mmeta", d.display()),
            )
            .replace("/var/lib/mirror-agent", &format!("{}/state", d.display()))
            .replace(
                "/etc/mirror-agent/tls/primary.crt",
                s(&d.join("server.crt")),
            )
            .replace(
                "/etc/mirror-agent/tls/primary.key",
                s(&d.join("server.key")),
            )
            .replace("/etc/mirror-agent/tls/ca.crt", s(&d.join("ca.crt")))
            .replace("/etc/mirror-agent/us-east.token", s(&d.join("us.token")))
            .replace("/srv/jfs-mirror-blocks", &format!("{}/blocks", d.display()));
        std::fs::write(
            d.join("us.token"),
            format!("{}\n", integration::mirror::TOKEN),
        )
        .unwrap();
        // A token file is the agent's alone (check-config refuses one others may read).
        std::fs::set_permissions(
            d.join("us.token"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let cp = d.join(format!("example-{f}"));
        std::fs::write(&cp, text).unwrap();
        let o = run(
            "mirror-agent",
            &["check-config", "--config", s(&cp)],
            &[
                ("MIRROR_EU_WEST_TOKEN", integration::mirror::TOKEN),
                ("MIRROR_AGENT_ADMIN_TOKEN", integration::mirror::ADMIN_TOKEN),
            ],
        );
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "configs/{f}: {}{out}",
            String::from_utf8_lossy(&o.stderr)
        );
        admins.push(
            out.lines()
                .last()
                .unwrap()
                .split("admin ")
                .nth(1)
                .unwrap()
                .to_string(),
        );
        // The systemd unit runs this config and keeps its state where the config says.
        let role = f.trim_end_matches(".toml");
        let unit = std::fs::read_to_string(
            repo.join(format!("configs/systemd/mirror-agent-{role}.service")),
        )
        .unwrap();
        assert!(
            unit.contains(&format!("mirror-agent run --config /etc/mirror-agent/{f}")),
            "{unit}"
        );
        assert!(
            unit.contains(&format!("StateDirectory=mirror-agent/{role}")),
            "{unit}"
        );
        let cfg = std::fs::read_to_string(repo.join("configs").join(f)).unwrap();
        assert!(cfg.contains(&format!("state_dir = \"/var/lib/mirror-agent/{role}\"")));
    }
    assert_ne!(
        admins[0], admins[1],
        "the examples' admin addresses collide"
    );
}

/// Items 10, 12, 13, 14, 15: the lines an operator acts on. The runbook's "bootstrap complete"
/// appears even with nothing to catch up; status is plain numbers with units and marks a
/// stale head; --wait-applied at a primary says so at once; a mirror pointed at something
/// that is not a primary (or refused for good) says what it is, backs off and shows the
/// reason; a slot dropped through the running primary is gone from its status at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_and_refusals_say_what_an_operator_can_act_on() {
    use integration::mirror::{n, status_until, tail, Agent, ADMIN_TOKEN, TOKEN};
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    // 10: nothing to catch up after the snapshot, and still the line the runbook names.
    let log = pair.mirror.log_text();
    assert!(
        log.contains("the mirror is consistent (bootstrap complete)"),
        "{}",
        tail(&log, 10)
    );
    // 12: human status; --wait-applied against a primary fails at once.
    let o = run(
        "mirror-agent",
        &["status", "--admin", &pair.mirror.admin],
        &[],
    );
    let h = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{h}");
    assert!(
        h.contains("lag: 0 entries, 0.00 s  window: 1.00 s  within window: yes"),
        "{h}"
    );
    assert!(!h.contains("null") && !h.contains(" s s"), "{h}");
    let t0 = Instant::now();
    let err = fails_clearly(
        &run(
            "mirror-agent",
            &[
                "status",
                "--admin",
                &pair.primary.admin,
                "--wait-applied",
                "5",
                "--timeout",
                "60s",
            ],
            &[],
        ),
        "is a primary agent: --wait-applied waits for a mirror",
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{err}");
    pair.primary.term();
    let st = status_until(&pair.mirror, Duration::from_secs(20), |st| {
        st["connected"] == false
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let h = String::from_utf8_lossy(
        &run(
            "mirror-agent",
            &["status", "--admin", &pair.mirror.admin],
            &[],
        )
        .stdout,
    )
    .to_string();
    assert!(h.contains("(stale: last heard"), "{h}\n{st}");
    assert!(h.contains("last connection error: "), "{h}");
    pair.primary.restart();
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;

    // 14: drop through the running primary: needs its admin token, then gone at once.
    let err = fails_clearly(
        &run(
            "mirror-agent",
            &["slot", "drop", "m1", "--meta", &vol.meta_url],
            &[],
        ),
        "keeps this volume's slots: drop it through that agent with its admin token",
    );
    assert!(err.contains(&pair.primary.admin), "{err}");
    pair.mirror.term();
    let o = run(
        "mirror-agent",
        &["slot", "drop", "m1", "--meta", &vol.meta_url],
        &[("MIRROR_AGENT_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("dropped slot \"m1\""));
    let st = pair.primary.status();
    assert_eq!(st["mirrors"].as_array().unwrap().len(), 0, "{st}");
    let mt = pair.primary.metrics();
    assert!(
        !mt.contains("mirror=\"m1\""),
        "{}",
        mt.lines()
            .filter(|l| l.contains("m1"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The mirror comes back: a new slot, a resync, said in the primary's log.
    pair.mirror.restart();
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    assert!(pair
        .primary
        .log_text()
        .contains("a mirror whose slot was dropped connected again"));

    // 13: pointed at the primary's admin port (HTTP), not its listen port.
    let env = [("MIRROR_TOKEN", TOKEN), ("ADMIN_TOKEN", ADMIN_TOKEN)];
    let (meta, _d) = integration::meta_url("rocksdb");
    let wrong = Agent::start(
        dir.path(),
        "wrong-port",
        &integration::mirror::mirror_toml(
            &meta,
            &dir.path().join("w1"),
            &format!("127.0.0.1:{}", integration::mirror::free_port()),
            "m1",
            &pair.primary.admin,
            &pair.m_store,
            "",
        ),
        &env,
    );
    let st = status_until(&wrong, Duration::from_secs(30), |st| {
        !st["refused"].is_null()
    })
    .await;
    assert!(
        st["refused"]
            .as_str()
            .unwrap()
            .contains("is not a primary agent"),
        "{st}"
    );
    assert_eq!(
        n(&st, "frame_errors"),
        0,
        "not counted as damage in transit: {st}"
    );
    // 15: a wrong token: refused for good; ERROR, a long wait, the reason in status.
    let bad = Agent::start(
        dir.path(),
        "bad-token",
        &integration::mirror::mirror_toml(
            &meta.replace("meta", "meta2"),
            &dir.path().join("w2"),
            &format!("127.0.0.1:{}", integration::mirror::free_port()),
            "m1",
            &pair.listen,
            &pair.m_store,
            "",
        ),
        &[
            (
                "MIRROR_TOKEN",
                "e1d2c3b4a5968778695a4b3c2d1e0f1f2e3d4c5b6a79887766554433221100ff",
            ),
            ("ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let st = status_until(&bad, Duration::from_secs(30), |st| !st["refused"].is_null()).await;
    assert!(
        st["refused"]
            .as_str()
            .unwrap()
            .contains("authentication failed"),
        "{st}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let st = bad.status();
    assert!(
        n(&st, "reconnects") <= 1,
        "a refusal is retried seldom: {st}"
    );
    let log = bad.log_text();
    assert!(
        log.contains("ERROR") && log.contains("the primary refuses this mirror"),
        "{}",
        tail(&log, 5)
    );
    assert!(!log.contains("a-wrong-token"), "the token is never printed");
    let h = String::from_utf8_lossy(
        &run("mirror-agent", &["status", "--admin", &bad.admin], &[]).stdout,
    )
    .to_string();
    assert!(h.contains("REFUSED by the primary: "), "{h}");
}

/// Item 11: logs written to a file or a pipe carry no colour codes; on a terminal they do,
/// unless NO_COLOR is set.
#[test]
fn logs_are_colourless_off_a_terminal_and_with_no_color() {
    let t = tempfile::tempdir().unwrap();
    // An agent configured from the environment alone that logs a warning (no admin token),
    // then fails to reach its metadata.
    let env: Vec<(String, String)> = [
        ("MIRROR_AGENT_ROLE", "mirror"),
        ("MIRROR_AGENT_META", "redis://127.0.0.1:1/0"),
        ("MIRROR_AGENT_STATE_DIR", s(&t.path().join("state"))),
        ("MIRROR_AGENT_MIRROR__NAME", "m1"),
        ("MIRROR_AGENT_MIRROR__PRIMARY", "127.0.0.1:2"),
        ("MIRROR_AGENT_MIRROR__TOKEN_ENV", "T"),
        (
            "MIRROR_AGENT_MIRROR__STORE",
            &format!("file://{}/b", t.path().display()),
        ),
        ("T", integration::mirror::TOKEN),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut c = Command::new(integration::bin("mirror-agent"));
    c.arg("run").envs(env.iter().map(|(k, v)| (k, v)));
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        err.contains("WARN") && err.contains("no admin_token_env"),
        "{err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
    // Under a pseudo-terminal (script): colour, and none with NO_COLOR.
    let pty = |no_color: bool| {
        let mut c = Command::new("script");
        c.args([
            "-qec",
            &format!("{} run", integration::bin("mirror-agent").display()),
            "/dev/null",
        ])
        .envs(env.iter().map(|(k, v)| (k, v)));
        if no_color {
            c.env("NO_COLOR", "1");
        }
        String::from_utf8_lossy(&c.output().unwrap().stdout).to_string()
    };
    let out = pty(false);
    assert!(
        out.contains("WARN") && out.contains("\x1b["),
        "no colour on a terminal: {out:?}"
    );
    let out = pty(true);
    assert!(
        out.contains("WARN") && !out.contains("\x1b["),
        "colour with NO_COLOR: {out:?}"
    );
}

/// Item 16: `jfs` names paths, not inodes, and says what to do; a URL with two slashes gets
/// the spelling that was meant; a failed command creates no directory; a temp file a killed
/// `jfs get` left is removed by the next get into that place.
#[test]
fn jfs_messages_name_paths_and_failures_leave_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let meta = format!("rocksdb://{}/meta", d.display());
    let o = run(
        "jfs",
        &[
            "format",
            &meta,
            "v",
            "--storage",
            &format!("file://{}/store", d.display()),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(run("jfs", &["mkdir", "-p", &meta, "/a/b"], &[])
        .status
        .success());
    let err = fails_clearly(
        &run("jfs", &["rm", &meta, "/a"], &[]),
        "/a is a directory that is not empty",
    );
    assert!(err.contains("jfs rm -r") && !err.contains("inode"), "{err}");
    fails_clearly(
        &run("jfs", &["rm", &meta, "/nope"], &[]),
        "/nope: no such file or directory",
    );
    fails_clearly(
        &run(
            "jfs",
            &[
                "ls",
                &format!("rocksdb://{}", &d.display().to_string()[1..]),
            ],
            &[],
        ),
        &format!("did you mean rocksdb:///{}?", &d.display().to_string()[1..]),
    );
    // A mistyped block store for a read: an error, and no directory appears.
    let typo = d.join("typo-store");
    fails_clearly(
        &run(
            "jfs",
            &[
                "--block-store",
                &format!("file://{}", typo.display()),
                "ls",
                &meta,
                "/",
            ],
            &[],
        ),
        "does not exist",
    );
    assert!(!typo.exists());
    // A killed get's temp file beside the destination goes at the next get there.
    let local = d.join("f.bin");
    std::fs::write(&local, data(3, 10_000)).unwrap();
    assert!(run("jfs", &["put", &meta, s(&local), "/f.bin"], &[])
        .status
        .success());
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let stale = out.join(".f.bin.jfs-tmp-4194305-deadbeef"); // a pid no process can have
    std::fs::write(&stale, b"partial").unwrap();
    let old_style = out.join(".f.bin.jfs-tmp-0badf00d");
    std::fs::write(&old_style, b"partial").unwrap();
    let o = run("jfs", &["get", &meta, "/f.bin", s(&out.join("f.bin"))], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !stale.exists() && !old_style.exists(),
        "{:?}",
        snapshot(&out).keys()
    );
    assert_eq!(std::fs::read(out.join("f.bin")).unwrap(), data(3, 10_000));
}

/// Run jfs-sync with `--json` in a cache of its own; (exit code, summary, stdout, stderr).
fn sync_json(cache: &Path, args: &[&str]) -> (i32, serde_json::Value, String, String) {
    let mut a = args.to_vec();
    a.push("--json");
    let o = run("jfs-sync", &a, &[("XDG_CACHE_HOME", s(cache))]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let v = serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap_or_default();
    (o.status.code().unwrap_or(-1), v, out, err)
}

fn files(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_keys()
        .filter(|k| !k.ends_with('/'))
        .collect()
}

/// Item 17: the flags rclone, rsync and JuiceFS users type by habit do what they mean there.
#[test]
fn habit_flags_of_rclone_and_rsync_users_work() {
    let t = tempfile::tempdir().unwrap();
    let (d, c) = (t.path(), t.path().join("cache"));
    let src = d.join("src");
    for (p, n) in [
        ("a.txt", 10),
        ("b.log", 20),
        ("keep/c.txt", 30),
        ("tmp/d.txt", 40),
        ("e.bin", 50),
    ] {
        std::fs::create_dir_all(src.join(p).parent().unwrap()).unwrap();
        std::fs::write(src.join(p), data(n, n as usize * 100)).unwrap();
    }
    let dst = |n: &str| d.join(n);
    // --transfers, --checkers, -P, --stats, -v: accepted with rclone's meaning.
    let (code, v, _, err) = sync_json(
        &c,
        &[
            s(&src),
            s(&dst("d1")),
            "--transfers",
            "2",
            "--checkers",
            "2",
            "-P",
            "--stats",
            "1s",
            "-v",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["copied"], 5);
    assert!(
        err.contains("jfs-sync: progress:") || err.contains("listed 5"),
        "{err}"
    );
    // -n: a dry run.
    let (code, v, out, _) = sync_json(&c, &[s(&src), s(&dst("d2")), "-n"]);
    assert_eq!((code, v["dry_run"].as_bool()), (0, Some(true)));
    assert!(out.contains("would copy a.txt"), "{out}");
    assert!(!dst("d2").exists());
    // --exclude-from / --include-from, --filter / --filter-from: rsync's rules, in order.
    std::fs::write(d.join("ex"), "# comment\n*.log\ntmp/\n").unwrap();
    sync_json(
        &c,
        &[s(&src), s(&dst("d3")), "--exclude-from", s(&d.join("ex"))],
    );
    assert_eq!(files(&dst("d3")), ["a.txt", "e.bin", "keep/c.txt"]);
    std::fs::write(d.join("in"), "*/\n*.txt\n").unwrap();
    sync_json(
        &c,
        &[
            s(&src),
            s(&dst("d4")),
            "--include-from",
            s(&d.join("in")),
            "--exclude",
            "*",
        ],
    );
    assert_eq!(files(&dst("d4")), ["a.txt", "keep/c.txt", "tmp/d.txt"]);
    // As in rsync, "- *" also excludes directories: keep/c.txt needs a "+ */" first.
    sync_json(
        &c,
        &[
            s(&src),
            s(&dst("d5")),
            "--filter",
            "- tmp/",
            "--filter",
            "+ *.txt",
            "--filter",
            "- *",
        ],
    );
    assert_eq!(files(&dst("d5")), ["a.txt"]);
    std::fs::write(d.join("rules"), "- *.bin\n+ keep/\n- keep/*\n").unwrap();
    sync_json(
        &c,
        &[s(&src), s(&dst("d6")), "--filter-from", s(&d.join("rules"))],
    );
    assert_eq!(files(&dst("d6")), ["a.txt", "b.log", "tmp/d.txt"]);
    let err = fails_clearly(
        &run(
            "jfs-sync",
            &[s(&src), s(&dst("d7")), "--filter", ": .rsync-filter"],
            &[],
        ),
        "rules are not supported",
    );
    assert!(err.contains("only + and -"), "{err}");
    // --size-only: same size and another time is current.
    let d8 = dst("d8");
    sync_json(&c, &[s(&src), s(&d8)]);
    std::fs::write(d8.join("a.txt"), data(99, 1000)).unwrap(); // same size, new bytes and time
    let (_, v, _, _) = sync_json(&c, &[s(&src), s(&d8), "--size-only"]);
    assert_eq!(
        (
            v["copied"].as_u64(),
            v["updated"].as_u64(),
            v["skipped"].as_u64()
        ),
        (Some(0), Some(0), Some(5)),
        "{v}"
    );
    let (_, v, _, _) = sync_json(&c, &[s(&src), s(&d8)]);
    assert_eq!(v["updated"], 1, "{v}");
    // --delete-after (the same as --delete-dst) and --delete-during (runs as --delete-dst,
    // and says so: never a silent difference).
    std::fs::write(d8.join("extra"), b"x").unwrap();
    let (_, v, _, err) = sync_json(&c, &[s(&src), s(&d8), "--delete-after"]);
    assert_eq!(v["deleted"], 1, "{v}");
    assert!(!err.contains("note:"), "{err}");
    std::fs::write(d8.join("extra"), b"x").unwrap();
    let (_, v, _, err) = sync_json(&c, &[s(&src), s(&d8), "--delete-during"]);
    assert_eq!(v["deleted"], 1, "{v}");
    assert!(
        err.contains("note: --delete/--delete-during/--delete-before run as --delete-dst"),
        "{err}"
    );
    // --log-file: logs there, not on stderr, without colour.
    let log = d.join("sync.log");
    let (_, _, _, err) = sync_json(&c, &[s(&src), s(&dst("d9")), "-v", "--log-file", s(&log)]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("INFO") && text.contains("sync finished") && !text.contains('\x1b'),
        "{text}"
    );
    assert!(!err.contains("INFO"), "{err}");
    // --files-from as `find` writes it: "./x" and "/x" lines are relative to SRC.
    let list = d.join("list");
    std::fs::write(&list, "./keep/c.txt\n/e.bin\n").unwrap();
    sync_json(&c, &[s(&src), s(&dst("d10")), "--files-from", s(&list)]);
    assert_eq!(files(&dst("d10")), ["e.bin", "keep/c.txt"]);
}

/// Item 19: summaries say "would" in a dry run and count the deletes listed; skipped says
/// why; a resumed run's summary includes what the interrupted attempts did; --max-delete
/// without --delete-dst is an error. Item 20: --help is grouped by purpose.
#[test]
fn summaries_say_what_was_and_would_be_done() {
    let t = tempfile::tempdir().unwrap();
    let (d, c) = (t.path(), t.path().join("cache"));
    let (src, dst) = (d.join("src"), d.join("dst"));
    make_tree(&src, 40);
    std::os::unix::fs::symlink("d0/f0", src.join("link")).unwrap();
    make_tree(&dst, 20);
    for i in 40..45 {
        std::fs::write(dst.join(format!("d0/x{i}")), b"extra").unwrap();
    }
    let (code, v, out, err) = sync_json(&c, &[s(&src), s(&dst), "--delete-dst", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    let listed_deletes = out
        .lines()
        .filter(|l| l.starts_with("would delete "))
        .count();
    assert_eq!(listed_deletes, 5, "{out}");
    assert_eq!(v["deleted"], 5);
    assert!(
        err.contains("dry run: ") && err.contains("would delete 5"),
        "{err}"
    );
    let (_, v, _, err) = sync_json(&c, &[s(&src), s(&dst)]);
    assert_eq!(v["skipped_reasons"]["symlink"], 1, "{v}");
    assert!(err.contains("1 symlinks (no --links)"), "{err}");
    let (_, v, _, err) = sync_json(&c, &[s(&src), s(&dst), "--links"]);
    assert_eq!(v["skipped_reasons"]["up_to_date"], 40, "{v}");
    assert_eq!(v["copied"], 1, "the symlink: {v}");
    assert!(err.contains("skipped 40 (40 up to date)"), "{err}");
    let (_, v, _, _) = sync_json(&c, &[s(&src), s(&d.join("none")), "--existing"]);
    assert_eq!(v["skipped_reasons"]["not_on_destination"], 40, "{v}");
    fails_clearly(
        &run("jfs-sync", &[s(&src), s(&dst), "--max-delete", "10"], &[]),
        "--max-delete limits the deletes of --delete-dst, which was not given",
    );
    // A resumed run counts the attempts before it: kill -9 one run midway (a request rate
    // makes it slow), then finish.
    let big = d.join("big");
    make_tree(&big, 300);
    let out2 = d.join("out2");
    let mut child = Command::new(integration::bin("jfs-sync"))
        .args([s(&big), s(&out2), "--tps", "100", "--threads", "2"])
        .env("XDG_CACHE_HOME", &c)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let (code, v, _, err) = sync_json(&c, &[s(&big), s(&out2), "--tps", "100", "--threads", "2"]);
    assert_eq!(code, 0, "{err}");
    // Every object counted once: copied (by this run or, recorded, by the killed one), or
    // up to date (finished by the killed one after its last checkpoint).
    let (listed, copied, skipped) = (
        v["listed"].as_u64(),
        v["copied"].as_u64().unwrap(),
        v["skipped"].as_u64().unwrap(),
    );
    assert_eq!((listed, copied + skipped), (Some(300), 300), "{v}");
    assert!(v["resumed"]["copied"].as_u64().unwrap() > 0, "{v}");
    assert!(
        err.contains("of these, earlier interrupted attempts"),
        "{err}"
    );
    assert_eq!(files(&out2).len(), 300);
    // --help in groups.
    let help = String::from_utf8_lossy(&run("jfs-sync", &["--help"], &[]).stdout).to_string();
    let mut at = 0;
    for g in [
        "What to copy:",
        "How to compare:",
        "Deletes:",
        "Speed:",
        "Output:",
        "Resume:",
    ] {
        let i = help[at..]
            .find(g)
            .unwrap_or_else(|| panic!("{g} missing or out of order:\n{help}"))
            + at;
        at = i;
    }
    assert!(
        help.contains("--transfers") && help.contains("--checkers"),
        "{help}"
    );
}

/// Item 18: --bwlimit applies to bytes, for many small objects and for large ones, within 5%.
#[test]
fn bwlimit_holds_for_small_and_large_objects() {
    let t = tempfile::tempdir().unwrap();
    let (d, c) = (t.path(), t.path().join("cache"));
    let small = d.join("small");
    std::fs::create_dir_all(&small).unwrap();
    for i in 0..1500 {
        std::fs::write(small.join(format!("f{i:04}")), data(i, 2_000)).unwrap();
    }
    let large = d.join("large");
    std::fs::create_dir_all(&large).unwrap();
    std::fs::write(large.join("f"), data(7, 12 << 20)).unwrap();
    for (src, limit, rate) in [(&small, "1M", 1u64 << 20), (&large, "4M", 4 << 20)] {
        let (code, v, _, err) = sync_json(
            &c,
            &[
                s(src),
                s(&d.join(format!("out-{limit}"))),
                "--bwlimit",
                limit,
            ],
        );
        assert_eq!(code, 0, "{err}");
        let got = v["bytes"].as_f64().unwrap() / v["seconds"].as_f64().unwrap();
        assert!(
            (got - rate as f64).abs() / rate as f64 <= 0.05,
            "--bwlimit {limit}: {:.0} KiB/s",
            got / 1024.0
        );
    }
}

/// Item 22: every metric the Grafana dashboard in configs/ queries is exported by the
/// running binaries (both agent roles and jfs-sync).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_queries_only_exported_metrics() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo.join("configs/grafana/jfs-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut names = std::collections::BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            let b = e.as_bytes();
            let mut i = 0;
            while let Some(at) = e[i..].find("jfs_") {
                let start = i + at;
                let mut end = start;
                while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                    end += 1;
                }
                names.insert(e[start..end].to_string());
                i = end;
            }
        }
    }
    assert!(names.len() > 25, "{names:?}");
    // Both agents, with a mirror connected and blocks copied.
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "f", 3, 100_000).await;
    let pair = Pair::start(
        dir.path(),
        &vol.meta_url,
        "rocksdb",
        None,
        "",
        "bwlimit = \"50M\"",
    )
    .await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut scraped = pair.primary.metrics() + &pair.mirror.metrics();
    // jfs-sync with --metrics, slowed down so that it can be scraped while it runs.
    let t = tempfile::tempdir().unwrap();
    make_tree(&t.path().join("src"), 60);
    let addr = format!("127.0.0.1:{}", integration::mirror::free_port());
    let mut child = Command::new(integration::bin("jfs-sync"))
        .args([
            s(&t.path().join("src")),
            s(&t.path().join("dst")),
            "--tps",
            "20",
            "--metrics",
            &addr,
        ])
        .env("XDG_CACHE_HOME", t.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let (code, body) = curl(&[&format!("http://{addr}/metrics")]);
        if code == "200" {
            scraped += &body;
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "jfs-sync --metrics did not answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let exported: std::collections::BTreeSet<&str> = scraped
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics nobody exports: {missing:?}\nexported: {exported:?}"
    );
}

/// Kills a process by PID when dropped (also when a test fails half-way).
struct Killer(u32);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .status();
    }
}

/// Item 21: an agent runs with no config file at all, every setting from MIRROR_AGENT_*
/// variables (as in a container), and replicates like one with a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_agent_runs_from_the_environment_alone() {
    use integration::mirror::{assert_same, free_port, n, status_until, TOKEN};
    let dir = tempfile::tempdir().unwrap();
    let vol = volume("rocksdb", "file").await;
    write_files(&vol.fs, "f", 3, 200_000).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    let (meta, _d1) = integration::meta_url("rocksdb");
    let (store, _d2) = integration::store_url("file");
    let admin = format!("127.0.0.1:{}", free_port());
    let state = dir.path().join("env-state");
    let log = std::fs::File::create(dir.path().join("env-agent.log")).unwrap();
    let mut child = Command::new(integration::bin("mirror-agent"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .envs([
            ("MIRROR_AGENT_ROLE", "mirror"),
            ("MIRROR_AGENT_META", meta.as_str()),
            ("MIRROR_AGENT_STATE_DIR", s(&state)),
            ("MIRROR_AGENT_ADMIN", admin.as_str()),
            ("MIRROR_AGENT_MIRROR__NAME", "m2"),
            ("MIRROR_AGENT_MIRROR__PRIMARY", pair.listen.as_str()),
            ("MIRROR_AGENT_MIRROR__TOKEN_ENV", "M2_TOKEN"),
            ("MIRROR_AGENT_MIRROR__STORE", store.as_str()),
            ("MIRROR_AGENT_MIRROR__WORKERS", "3"),
            ("M2_TOKEN", TOKEN),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let _guard = Killer(child.id());
    // m2 is not registered at the primary: the agent says so (refused), from its status.
    let a = integration::mirror::Agent::attach(&admin, &dir.path().join("env-agent.log"));
    let t0 = Instant::now();
    while a.try_status().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", a.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = status_until(&a, Duration::from_secs(30), |st| !st["refused"].is_null()).await;
    assert_eq!(st["name"], "m2");
    let _ = child.kill();
    let _ = child.wait();
    // Registered under that name (the primary's mirrors from its environment too), it
    // replicates, once the harness's own mirror m1 has stepped aside and its slot, which
    // names that mirror's metadata, is dropped (another copy under the name is refused).
    let (primary_cfg, primary_meta) = (pair.primary.cfg.clone(), vol.meta_url.clone());
    drop(pair.mirror);
    let o = run(
        "mirror-agent",
        &[
            "slot",
            "drop",
            "m1",
            "--meta",
            &primary_meta,
            "--config",
            s(&primary_cfg),
        ],
        &[("ADMIN_TOKEN", integration::mirror::ADMIN_TOKEN)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c2 = Command::new(integration::bin("mirror-agent"))
        .arg("run")
        .envs([
            ("MIRROR_AGENT_ROLE", "mirror"),
            ("MIRROR_AGENT_META", meta.as_str()),
            ("MIRROR_AGENT_STATE_DIR", s(&state)),
            ("MIRROR_AGENT_ADMIN", admin.as_str()),
            ("MIRROR_AGENT_MIRROR__NAME", "m1"),
            ("MIRROR_AGENT_MIRROR__PRIMARY", pair.listen.as_str()),
            ("MIRROR_AGENT_MIRROR__TOKEN_ENV", "M2_TOKEN"),
            ("MIRROR_AGENT_MIRROR__STORE", store.as_str()),
            ("M2_TOKEN", TOKEN),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard2 = Killer(c2.id());
    let t0 = Instant::now();
    while a.try_status().is_none_or(|st| st["name"] != "m1") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the second agent did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = wait_converged(&a, &**vol.fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(st["name"], "m1");
    assert!(n(&st, "blocks.copied") >= 3, "{st}");
    assert_same(&vol.fs, &meta, &store).await;
    let _ = c2.kill();
    let _ = c2.wait();
}

/// Two volumes of one name in one store would share block keys: gc of one deletes the
/// other's blocks as leaked, a cutover into the other's prefix skips or overwrites them. A
/// second format into a claimed prefix, a cutover into it or into the volume's own store
/// (however spelled) or into its metadata directory, are refused with nothing changed; gc
/// deletes nothing leaked in a prefix another volume claims.
#[test]
fn a_store_prefix_belongs_to_one_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let meta = format!("rocksdb://{}/meta", t.display());
    let a = format!("file://{}/a", t.display());
    let jfs = |args: &[&str]| run("jfs", args, &[]);
    assert!(jfs(&["format", &meta, "vol", "--storage", &a])
        .status
        .success());
    let f = t.join("f");
    std::fs::write(&f, data(3, 5 << 20)).unwrap();
    assert!(jfs(&["put", &meta, s(&f), "/f"]).status.success());
    let before = snapshot(&t.join("a"));
    // Another volume of the same name into the same store, and into a store whose prefix a
    // cutover claimed: refused, no metadata created.
    let meta2 = format!("rocksdb://{}/meta2", t.display());
    fails_clearly(
        &jfs(&["format", &meta2, "vol", "--storage", &a]),
        "holds the blocks of another volume named \"vol\"",
    );
    assert!(
        !t.join("meta2").exists(),
        "a refused format created metadata"
    );
    // A cutover to A spelled otherwise, or into the metadata's directory: refused.
    for to in [
        format!("file://{}/./a", t.display()),
        format!("file://{}/x/../a/", t.display()),
        format!("file://{}/meta/blocks", t.display()),
    ] {
        fails_clearly(
            &jfs(&["cutover", "start", &meta, "--to", &to]),
            "nothing was changed",
        );
    }
    assert!(!t.join("meta/blocks").exists());
    // B claimed by another volume named "vol": refused, the phase unchanged.
    let other_meta = format!("rocksdb://{}/other", t.display());
    let b = format!("file://{}/b", t.display());
    assert!(jfs(&["format", &other_meta, "vol", "--storage", &b])
        .status
        .success());
    fails_clearly(
        &jfs(&["cutover", "start", &meta, "--to", &b]),
        "holds the blocks of another volume",
    );
    let st = jfs(&["cutover", "status", &meta, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(v.to_string().contains("single"), "{v}");
    assert_eq!(snapshot(&t.join("a")), before, "the volume's store changed");
    // gc: a block that looks leaked in a prefix claimed by another volume is not deleted.
    let owner = t.join("a/vol/jfs_volume");
    let mine = std::fs::read(&owner).unwrap();
    let mut theirs: serde_json::Value = serde_json::from_slice(&mine).unwrap();
    theirs["uuid"] = "0123456789abcdef0123456789abcdef".into();
    std::fs::write(&owner, theirs.to_string()).unwrap();
    let stray = t.join("a/vol/chunks/0/0/999_0_4");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"abcd").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(7 * 86400);
    std::fs::File::options()
        .write(true)
        .open(&stray)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let o = jfs(&["gc", &meta, "--delete"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another volume"),
        "{err}"
    );
    assert!(stray.exists(), "gc deleted a block another volume claims");
    std::fs::write(&owner, mine).unwrap();
    let o = jfs(&["gc", &meta, "--delete"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stray.exists(), "gc of its own prefix keeps a leaked block");
}

/// Fencing the wrong volume (a typo'd --meta) is undone by the command the refusal names,
/// `mirror-agent detach --meta URL`: writes work again and its mounts no longer follow the
/// recorded move.
#[test]
fn a_mistaken_fence_is_undone_by_the_detach_its_refusal_names() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let meta = format!("rocksdb://{}/meta", t.display());
    let store = format!("file://{}/s", t.display());
    let jfs = |args: &[&str]| run("jfs", args, &[]);
    assert!(jfs(&["format", &meta, "v", "--storage", &store])
        .status
        .success());
    let f = t.join("f");
    std::fs::write(&f, data(5, 70_000)).unwrap();
    assert!(jfs(&["put", &meta, s(&f), "/a"]).status.success());
    let nowhere = format!("rocksdb://{}/nowhere", t.display());
    let o = run(
        "mirror-agent",
        &[
            "fence",
            "--meta",
            &meta,
            "--as",
            "oops",
            "--new-primary",
            "127.0.0.1:9",
            "--moved-to",
            &nowhere,
            // A wrong fence: it checks what it is told unless forced (issue 25, item 5).
            "--force",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = fails_clearly(&jfs(&["put", &meta, s(&f), "/b"]), "mirror \"oops\"");
    assert!(err.contains("mirror-agent detach --meta URL"), "{err}");
    let o = run("mirror-agent", &["detach", "--meta", &meta], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(jfs(&["put", &meta, s(&f), "/b"]).status.success());
    let st: serde_json::Value =
        serde_json::from_slice(&jfs(&["status", &meta, "--json"]).stdout).unwrap();
    assert!(st["moved"].is_null() && st["mirror"].is_null(), "{st}");
    assert_eq!(jfs(&["cat", &meta, "/a"]).stdout, data(5, 70_000));
    assert_eq!(jfs(&["cat", &meta, "/b"]).stdout, data(5, 70_000));
}

/// A volume's block store is not a directory to sync into: jfs-sync refuses a destination
/// that is a store's root, a volume's prefix in it, or a directory inside that (and a source
/// there with --delete-src), before anything is copied or deleted; the volume stays whole.
#[test]
fn a_volume_block_store_is_refused_as_a_plain_destination() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    let meta = format!("rocksdb://{}/meta", root.display());
    let store = root.join("blocks");
    let o = run(
        "jfs",
        &[
            "format",
            &meta,
            "vol1",
            "--storage",
            &format!("file://{}", store.display()),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let src = root.join("src");
    make_tree(&src, 20);
    let o = run("jfs", &["put", &meta, s(&src), "/data"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = snapshot(&store);
    let cache = root.join("cache");
    let env = [("XDG_CACHE_HOME", s(&cache))];
    let st = s(&store);
    let cases: Vec<Vec<String>> = vec![
        vec!["--delete-dst".into(), s(&src).into(), st.into()],
        vec![s(&src).into(), format!("{st}/vol1")],
        vec![
            "--delete-dst".into(),
            s(&src).into(),
            format!("{st}/vol1/chunks"),
        ],
        vec![s(&src).into(), format!("file://{st}/")],
        vec![
            "--delete-src".into(),
            format!("{st}/vol1"),
            s(&root.join("out")).into(),
        ],
    ];
    for args in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = fails_clearly(&run("jfs-sync", &a, &env), "block store");
        assert!(err.contains("nothing was copied or deleted"), "{err}");
    }
    assert_eq!(snapshot(&store), before, "the store changed");
    assert!(!root.join("out").exists());
    let o = run("jfs", &["fsck", &meta], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
