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
    let env = [("MIRROR_TOKEN", integration::mirror::TOKEN)];
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
