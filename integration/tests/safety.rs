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
    assert_eq!(pair.mirror.term(), 0);
    let m = pair.m_meta.clone();
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
        &run_within(
            "mirror-agent",
            &["run", "--config", s(&cfg)],
            &env,
            Duration::from_secs(30),
        ),
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
    fails_clearly(
        &run_within(
            "mirror-agent",
            &["run", "--config", s(&cfg)],
            &env,
            Duration::from_secs(30),
        ),
        "is not a mirror's metadata",
    );

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
        &run_within(
            "mirror-agent",
            &["run", "--config", s(&pair.mirror.cfg)],
            &env,
            Duration::from_secs(30),
        ),
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
        let start = fails_clearly(
            &run_within(
                "mirror-agent",
                &["run", "--config", s(&f)],
                &env,
                Duration::from_secs(30),
            ),
            want,
        );
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
    fails_clearly(
        &run_within(
            "mirror-agent",
            &["run", "--config", s(&f)],
            &env,
            Duration::from_secs(30),
        ),
        "127.0.0.1:1",
    );
    assert!(
        !d.join("s2").exists(),
        "a failed start left its state directory behind"
    );
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
