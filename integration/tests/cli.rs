//! The `jfs` binary as a user runs it: separate processes against real engines and stores.

use integration::{bin, data, fails_clearly, meta_url, store_url, unique};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn jfs(args: &[&str]) -> Output {
    jfs_env(args, &[])
}

fn jfs_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin("jfs"));
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run jfs")
}

fn ok_bytes(args: &[&str]) -> Vec<u8> {
    let o = jfs(args);
    assert!(
        o.status.success(),
        "jfs {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn ok(args: &[&str]) -> String {
    String::from_utf8(ok_bytes(args)).expect("UTF-8 output")
}

/// Format volume "v" at `meta` with blocks in `<dir>/s`.
fn format_local(meta: &str, dir: &Path) {
    ok(&[
        "format",
        meta,
        "v",
        "--storage",
        &format!("file://{}/s", dir.display()),
    ]);
}

fn write_tree(root: &Path, small: usize, big: usize) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join("big.bin"), data(42, big)).unwrap();
    for i in 0..small {
        let dir = root.join(format!("d{:02}", i % 10));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("f{i:04}.txt")),
            data(i as u64, (i * 37) % 5000),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("d00/f0000.txt", root.join("link")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("d01"), std::fs::Permissions::from_mode(0o750)).unwrap();
}

/// Compare two local trees: names, kinds, bytes, permission bits and mtimes (seconds).
fn same_tree(a: &Path, b: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let ma = std::fs::symlink_metadata(a).unwrap();
    let mb = std::fs::symlink_metadata(b).unwrap();
    assert_eq!(ma.file_type(), mb.file_type(), "{}", b.display());
    if ma.file_type().is_symlink() {
        assert_eq!(
            std::fs::read_link(a).unwrap(),
            std::fs::read_link(b).unwrap()
        );
        return 1;
    }
    assert_eq!(
        ma.mode() & 0o7777,
        mb.mode() & 0o7777,
        "mode of {}",
        b.display()
    );
    assert_eq!(ma.mtime(), mb.mtime(), "mtime of {}", b.display());
    if ma.is_file() {
        assert!(
            std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
            "bytes of {} differ",
            b.display()
        );
        return 1;
    }
    let mut names: Vec<_> = std::fs::read_dir(a)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let mut other: Vec<_> = std::fs::read_dir(b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    other.sort();
    assert_eq!(names, other, "entries of {}", b.display());
    names
        .iter()
        .map(|n| same_tree(&a.join(n), &b.join(n)))
        .sum::<usize>()
        + 1
}

fn store_files(root: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                if !p.ends_with(".jfs-tmp") {
                    stack.push(p);
                }
            } else if !p.ends_with("jfs_volume") {
                // Blocks only: not the store prefix's owner record.
                out.push((
                    p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                ));
            }
        }
    }
    out
}

#[test]
fn put_get_tree_with_a_100_mib_file_and_1000_small_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, 1000, 100 << 20);
    let meta = format!("rocksdb://{}/meta", tmp.path().display());
    let store = tmp.path().join("store");
    ok(&[
        "format",
        &meta,
        "vol",
        "--storage",
        &format!("file://{}", store.display()),
    ]);
    ok(&["put", &meta, src.to_str().unwrap(), "/data"]);
    let out = tmp.path().join("out");
    ok(&["get", &meta, "/data", out.to_str().unwrap()]);
    assert_eq!(
        same_tree(&src, &out),
        1000 + 10 + 1 + 1 + 1,
        "every file, dir and link compared"
    );
    // Objects have the block key layout, and each object's length is the one in its key.
    let objects = store_files(&store);
    // 999 non-empty small files (one block each) and 25 blocks of the 100 MiB file
    assert_eq!(objects.len(), 999 + 25, "{} objects", objects.len());
    for (key, len) in &objects {
        let (_, _, klen) = fs_core::keys::parse_block_key("vol", key)
            .unwrap_or_else(|| panic!("{key} is not a block key"));
        assert_eq!(*len, klen as u64, "{key}");
        assert!(klen <= 4 << 20);
    }
    assert!(ok(&["fsck", &meta]).contains("0 broken"));
    // Delete one block of the big file by hand: fsck fails and names the file.
    let big_ino: u64 =
        serde_json::from_str::<serde_json::Value>(&ok(&["stat", &meta, "/data/big.bin"])).unwrap()
            ["ino"]
            .as_u64()
            .unwrap();
    assert!(big_ino > 1);
    let victim = objects
        .iter()
        .find(|(_, l)| *l == 4 << 20)
        .expect("a full block")
        .0
        .clone();
    std::fs::remove_file(store.join(&victim)).unwrap();
    let o = jfs(&["fsck", &meta]);
    assert_eq!(o.status.code(), Some(1));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        report.contains("BROKEN /data/big.bin") && report.contains(&victim),
        "{report}"
    );
    // Three small files lose their block too: each is named by its own path (the paths of
    // many broken files are found with one listing of their directory).
    let small: Vec<String> = objects
        .iter()
        .filter(|(_, l)| *l < 4 << 20)
        .take(3)
        .map(|(k, _)| k.clone())
        .collect();
    let kept: Vec<Vec<u8>> = small
        .iter()
        .map(|k| std::fs::read(store.join(k)).unwrap())
        .collect();
    for k in &small {
        std::fs::remove_file(store.join(k)).unwrap();
    }
    let o = jfs(&["fsck", &meta]);
    assert_eq!(o.status.code(), Some(1));
    let report = String::from_utf8_lossy(&o.stdout);
    let named: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("BROKEN") && !l.contains("big.bin"))
        .collect();
    assert_eq!(named.len(), 3, "{report}");
    let mut paths = std::collections::HashSet::new();
    for k in &small {
        assert!(report.contains(k.as_str()), "{k}: {report}");
    }
    for line in &named {
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with("/data/d"))
            .unwrap_or_else(|| panic!("no path in {line}"));
        let path = path.trim_end_matches(':');
        let rel = path.trim_start_matches("/data/");
        assert!(
            src.join(rel).is_file(),
            "{path} is not a file of the tree: {report}"
        );
        assert!(paths.insert(path), "{path} twice: {report}");
    }
    for (k, b) in small.iter().zip(kept) {
        std::fs::write(store.join(k), b).unwrap();
    }
    // ls, cat and the other namespace commands
    assert!(ok(&["ls", &meta, "/data"]).lines().any(|l| l == "big.bin"));
    assert_eq!(
        ok_bytes(&["cat", &meta, "/data/d03/f0003.txt"]),
        data(3, 111)
    );
    ok(&["mkdir", "-p", &meta, "/x/y/z"]);
    ok(&["mv", &meta, "/data/d03/f0003.txt", "/x/y/z"]);
    ok(&["ln", "-s", &meta, "/x/y/z/f0003.txt", "/sl"]);
    ok(&["ln", &meta, "/x/y/z/f0003.txt", "/hard"]);
    ok(&["truncate", &meta, "/hard", "10"]);
    assert_eq!(ok_bytes(&["cat", &meta, "/x/y/z/f0003.txt"]), data(3, 10));
    let long = ok(&["ls", "-l", &meta, "/"]);
    assert!(
        long.contains("sl -> /x/y/z/f0003.txt") && long.contains("   2 "),
        "{long}"
    );
    ok(&["rm", "-r", &meta, "/x"]);
    assert!(ok(&["ls", "-R", &meta, "/"]).contains("/data/d09:"));
    let o = jfs(&["rm", &meta, "/data"]);
    fails_clearly(&o, "not empty");
}

#[test]
fn s3_store_put_get_and_fsck() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, 50, 9 << 20);
    let (meta, _d) = meta_url("rocksdb");
    let (store, _) = store_url("s3");
    ok(&["format", &meta, "s3vol", "--storage", &store]);
    ok(&["put", &meta, src.to_str().unwrap(), "/in"]);
    let out = tmp.path().join("out");
    ok(&["get", &meta, "/in", out.to_str().unwrap()]);
    same_tree(&src, &out);
    assert!(ok(&["fsck", &meta]).contains("0 broken"));
}

#[test]
fn bad_input_gives_one_clear_line_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = format!("rocksdb://{}/meta", tmp.path().display());
    fails_clearly(&jfs(&["status", "nonsense"]), "expected SCHEME://");
    fails_clearly(&jfs(&["status", "mysql://h/db"]), "unsupported scheme");
    // A bad store URL is refused before the metadata engine is even created.
    fails_clearly(
        &jfs(&["format", &m, "v", "--storage", "ftp://x"]),
        "unsupported scheme",
    );
    assert!(!tmp.path().join("meta").exists(), "nothing written");
    // Commands other than format never create a volume.
    fails_clearly(&jfs(&["ls", &m]), "run `jfs format` first");
    fails_clearly(&jfs(&["mkdir", &m, "/a"]), "run `jfs format` first");
    assert!(!tmp.path().join("meta").exists(), "nothing written");
    // Bad names and values
    fails_clearly(
        &jfs(&[
            "format",
            &m,
            "bad/name",
            "--storage",
            &format!("file://{}/s", tmp.path().display()),
        ]),
        "volume name",
    );
    fails_clearly(
        &jfs(&[
            "format",
            &m,
            "v",
            "--storage",
            "file:///tmp/x",
            "--block-size",
            "1K",
        ]),
        "block size",
    );
    // An unreachable engine: fast, and the message says where.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    fails_clearly(
        &jfs(&["status", &format!("redis://127.0.0.1:{port}/0")]),
        &port.to_string(),
    );
    fails_clearly(
        &jfs(&["status", &format!("postgres://u@127.0.0.1:{port}/db")]),
        &port.to_string(),
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    // Wrong credentials: refused, and the secret is not echoed.
    for engine in ["redis", "postgres"] {
        let (url, _) = meta_url(engine);
        let err = fails_clearly(
            &jfs_env(&["status", &url], &[("JFS_META_PASSWORD", "Wr0ngSecret!")]),
            "authentication failed",
        );
        assert!(!err.contains("Wr0ngSecret"), "{err}");
    }
    // Wrong S3 credentials: format refuses before writing metadata.
    let (s3, _) = store_url("s3");
    let err = fails_clearly(
        &jfs_env(
            &["format", &m, "v", "--storage", &s3],
            &[("AWS_SECRET_ACCESS_KEY", "Wr0ngS3cret")],
        ),
        "storage",
    );
    assert!(!err.contains("Wr0ngS3cret"), "{err}");
    assert!(!tmp.path().join("meta").exists(), "nothing written");
    // The password never appears in the URL form we accept.
    fails_clearly(
        &jfs(&["status", "redis://u:Wr0ng@127.0.0.1:1/0"]),
        "do not put the password in the URL",
    );
}

/// Damage the stored frame of entry `seq` so that its checksum no longer matches.
async fn corrupt_frame(engine: &str, url: &str, seq: u64) {
    match engine {
        "rocksdb" => {
            let path = url.strip_prefix("rocksdb://").unwrap();
            let cfs = ["default", "journal", "meta"];
            let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), path, cfs).unwrap();
            let cf = db.cf_handle("journal").unwrap();
            let mut f = db.get_cf(cf, seq.to_be_bytes()).unwrap().unwrap();
            let last = f.len() - 1;
            f[last] ^= 0x40;
            db.put_cf(cf, seq.to_be_bytes(), f).unwrap();
        }
        "redis" => {
            let (base, prefix) = url.split_once("?prefix=").unwrap();
            let pw = std::env::var("JFS_META_PASSWORD").unwrap();
            let c =
                redis::Client::open(base.replace("redis://", &format!("redis://:{pw}@"))).unwrap();
            let mut conn = c.get_multiplexed_async_connection().await.unwrap();
            let key = format!("{prefix}_journal");
            let all: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: () = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            for e in all.ids {
                let mut f: Vec<u8> = redis::from_redis_value(&e.map["f"]).unwrap();
                if e.id == format!("{seq}-0") {
                    let last = f.len() - 1;
                    f[last] ^= 0x40;
                }
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg(&e.id)
                    .arg("f")
                    .arg(f)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
        "postgres" => {
            let (base, schema) = url.split_once("?schema=").unwrap();
            let mut cfg: tokio_postgres::Config = base.parse().unwrap();
            cfg.password(std::env::var("JFS_META_PASSWORD").unwrap());
            let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            let q = format!("UPDATE {schema}.jfs_journal SET frame = overlay(frame placing '\\x00' from length(frame)) WHERE seq = $1");
            assert_eq!(client.execute(&q, &[&(seq as i64)]).await.unwrap(), 1);
        }
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_journal_frame_is_an_error_naming_the_entry() {
    for engine in integration::ENGINES {
        let tmp = tempfile::tempdir().unwrap();
        let (url, _d) = meta_url(engine);
        format_local(&url, tmp.path());
        ok(&["mkdir", &url, "/a"]);
        ok(&["mkdir", &url, "/b"]);
        let lines = ok(&["journal", &url, "--json"]);
        // every process allocates its own batch of inode numbers: format, alloc, mknod, alloc, mknod
        assert_eq!(lines.lines().count(), 5, "{lines}");
        corrupt_frame(engine, &url, 3).await;
        let o = jfs(&["journal", &url, "--json"]);
        let err = fails_clearly(&o, "journal entry 3");
        assert!(err.contains("checksum"), "{engine}: {err}");
        // entries before the bad one were printed, none after it
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).lines().count(),
            2,
            "{engine}"
        );
    }
}

#[test]
fn journal_json_lines_have_seq_time_op() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", tmp.path().display());
    format_local(&meta, tmp.path());
    ok(&["mkdir", &meta, "/a"]);
    ok(&["mv", &meta, "/a", "/b"]);
    let out = ok(&["journal", &meta, "--json"]);
    let vals: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ops: Vec<&str> = vals.iter().map(|v| v["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["format", "alloc_inodes", "mknod", "rename"]);
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(v["seq"].as_u64(), Some(i as u64 + 1));
        assert!(v["time"].as_str().unwrap().starts_with("20"));
    }
    assert_eq!(vals[3]["args"]["new_name"], "b");
    let from = ok(&["journal", &meta, "--from", "3"]);
    assert_eq!(from.lines().count(), 2);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", &meta, "--json"])).unwrap();
    assert_eq!(
        (
            st["journal"]["first"].as_u64(),
            st["journal"]["last"].as_u64()
        ),
        (Some(1), Some(4))
    );
}

/// A follower process (read-only, RocksDB secondary) sees what a writer process commits.
#[test]
fn journal_follow_sees_commits_of_another_process() {
    for engine in ["rocksdb", "postgres", "redis"] {
        let tmp = tempfile::tempdir().unwrap();
        let (meta, _d) = meta_url(engine);
        format_local(&meta, tmp.path());
        let mut child = Command::new(bin("jfs"))
            .args(["journal", &meta, "--follow", "--json", "--from", "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let name = unique("d");
        ok(&["mkdir", &meta, &format!("/{name}")]); // a writer beside the follower
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                if tx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("{engine}: follower saw nothing"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (v["seq"].as_u64(), v["op"].as_str()),
            (Some(3), Some("mknod")),
            "{engine}"
        );
        assert_eq!(v["args"]["name"], name.as_str());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn dump_then_load_into_every_engine_gives_an_identical_dump() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, 40, 1 << 20);
    let (meta, _d) = meta_url("rocksdb");
    format_local(&meta, tmp.path());
    ok(&["put", &meta, src.to_str().unwrap(), "/t"]);
    ok(&["rm", &meta, "/t/big.bin"]);
    let dump_file: PathBuf = tmp.path().join("dump.json");
    ok(&["dump", &meta, dump_file.to_str().unwrap()]);
    let first = std::fs::read_to_string(&dump_file).unwrap();
    for engine in integration::ENGINES {
        let (target, _d2) = meta_url(engine);
        ok(&["load", &target, dump_file.to_str().unwrap()]);
        // The same volume, but held by the loaded metadata (its incarnation) with its ids
        // started past the source's.
        let mut got: serde_json::Value = serde_json::from_str(&ok(&["dump", &target])).unwrap();
        let mut want: serde_json::Value = serde_json::from_str(&first).unwrap();
        // Each dump names the metadata it was taken from (`jfs load` checks its mounts).
        assert_eq!(want["source"], meta.as_str());
        assert!(
            got["source"]
                .as_str()
                .is_some_and(|s| s.starts_with(target.split(':').next().unwrap())),
            "{engine}: {}",
            got["source"]
        );
        got.as_object_mut().unwrap().remove("source");
        want.as_object_mut().unwrap().remove("source");
        assert!(got["setting"]["incarnation"]
            .as_str()
            .is_some_and(|i| i.len() == 32));
        got["setting"]
            .as_object_mut()
            .unwrap()
            .remove("incarnation");
        for c in ["next_inode", "next_slice"] {
            assert_eq!(
                got["counters"][c].as_i64().unwrap(),
                want["counters"][c].as_i64().unwrap() + fs_core::site::ID_MARGIN,
                "{engine}: counter {c}"
            );
            got["counters"][c] = want["counters"][c].clone();
        }
        assert_eq!(got, want, "dump after load into {engine}");
        fails_clearly(
            &jfs(&["load", &target, dump_file.to_str().unwrap()]),
            "already holds a volume",
        );
        assert_eq!(
            ok_bytes(&["cat", &target, "/t/d05/f0005.txt"]),
            data(5, 185)
        );
    }
}

#[test]
fn gc_deletes_freed_blocks_only_with_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", tmp.path().display());
    let store = tmp.path().join("s");
    ok(&[
        "format",
        &meta,
        "v",
        "--storage",
        &format!("file://{}", store.display()),
        "--trash",
        "0s",
    ]);
    let f = tmp.path().join("f");
    std::fs::write(&f, data(1, 6 << 20)).unwrap();
    ok(&["put", &meta, f.to_str().unwrap(), "/f"]);
    ok(&["rm", &meta, "/f"]);
    assert_eq!(store_files(&store).len(), 2);
    let dry: serde_json::Value = serde_json::from_str(&ok(&["gc", &meta, "--json"])).unwrap();
    assert_eq!(
        (dry["pending_due"].as_u64(), dry["pending_purged"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(
        store_files(&store).len(),
        2,
        "gc without --delete deletes nothing"
    );
    let r: serde_json::Value =
        serde_json::from_str(&ok(&["gc", &meta, "--delete", "--json"])).unwrap();
    assert_eq!(r["pending_purged"].as_u64(), Some(1));
    assert_eq!(store_files(&store).len(), 0);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", &meta, "--json"])).unwrap();
    assert_eq!(st["pending_deletes"].as_u64(), Some(0));
}

/// SIGTERM in the middle of a put: exit 2 with a clear line, no temporary entries left in the
/// volume, fsck clean; running the same command again finishes the job.
#[test]
fn sigterm_during_put_leaves_no_partial_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 768 MiB: about 1.7 s to put here, against a signal at 0.5 s.
    let shard = data(1, 64 << 20);
    for i in 0..12 {
        std::fs::write(src.join(format!("shard{i}")), &shard).unwrap();
    }
    let (meta, _d) = meta_url("rocksdb");
    let (store, _) = store_url("s3");
    ok(&["format", &meta, "v", "--storage", &store]);
    let child = Command::new(bin("jfs"))
        .args(["put", &meta, src.to_str().unwrap(), "/in", "--threads", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(
        killed.success(),
        "the put finished before the signal: make the workload bigger"
    );
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("interrupted by a signal"), "{err}");
    let listing = ok(&["ls", "-R", &meta, "/"]);
    assert!(
        !listing.contains("jfs-tmp"),
        "temporary entries left behind:\n{listing}"
    );
    assert!(ok(&["fsck", &meta]).contains("0 broken"));
    ok(&["put", &meta, src.to_str().unwrap(), "/in"]);
    let out = tmp.path().join("out");
    ok(&["get", &meta, "/in", out.to_str().unwrap()]);
    same_tree(&src, &out);
}

/// Volumes formatted before block checksums (format 1) are read as before, checked by length
/// (`fsck --deep` says so); a volume of a newer format than this build is refused, naming
/// the versions, never misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_volume_reads_by_length_and_a_newer_format_is_refused() {
    use fs_core::keys;
    let vol = integration::volume_with("rocksdb", "file", |s| s.format_version = 1).await;
    let (ino, _) = vol
        .fs
        .create(fs_core::ROOT_INO, b"old", 0o644, fs_core::Owner::default())
        .await
        .unwrap();
    vol.fs.write(ino, 0, &data(5, 5 << 20)).await.unwrap();
    let k = keys::CHECKSUM_PREFIX;
    let recs = vol
        .fs
        .engine()
        .scan(k, &keys::prefix_end(k), 10)
        .await
        .unwrap();
    assert!(recs.is_empty(), "a format-1 volume got checksum records");
    let id = vol.fs.chunks(ino).await.unwrap()[0].1[0].id;
    let key1 = keys::block_key(&vol.fs.settings().name, id, 1, 1 << 20);
    let (meta, store) = (vol.meta_url.clone(), vol.store_url.clone());
    drop(vol.fs); // RocksDB: one process at a time
    assert_eq!(ok_bytes(&["cat", &meta, "/old"]), data(5, 5 << 20));
    let o = jfs(&["fsck", "--deep", &meta]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("format-1 volume: lengths only"),
        "{out}"
    );
    // A short block is still caught (by its length).
    let p = Path::new(store.trim_start_matches("file://")).join(&key1);
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 1]).unwrap();
    let o = jfs(&["cat", &meta, "/old"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("its key says"));
    let o = jfs(&["fsck", "--deep", &meta]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("BROKEN /old"));
    // A newer format than this build knows: refused by every command, naming the versions.
    {
        let e = integration::open_engine(&meta).await;
        let mut s = fs_core::Fs::load_settings(&*e).await.unwrap();
        s.format_version = fs_core::FORMAT_VERSION + 1;
        let mut tx = fs_core::txn::Txn::new(&*e);
        tx.put(keys::SETTING.to_vec(), serde_json::to_vec(&s).unwrap());
        tx.set_op(fs_core::Op::Settings {
            what: "format_version (test)".into(),
        });
        tx.commit().await.unwrap();
    }
    let o = jfs(&["ls", &meta, "/"]);
    fails_clearly(
        &o,
        &format!("has format version {}", fs_core::FORMAT_VERSION + 1),
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("use a newer jfs"));
}

/// A format refused because the metadata is formatted already names the volume there and
/// creates nothing (no store directory, no `.jfs-tmp`); running the original format again
/// says the same, never that the volume's own store belongs to "another volume".
#[test]
fn a_refused_format_names_the_volume_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = format!("rocksdb://{}/meta", tmp.path().display());
    let s = format!("file://{}/s", tmp.path().display());
    ok(&["format", &m, "v", "--storage", &s]);
    let uuid = {
        let st: serde_json::Value = serde_json::from_str(&ok(&["status", &m, "--json"])).unwrap();
        st["settings"]["uuid"].as_str().unwrap().to_string()
    };
    let s2 = tmp.path().join("s2");
    for store in [format!("file://{}", s2.display()), s.clone()] {
        let err = fails_clearly(
            &jfs(&["format", &m, "v", "--storage", &store]),
            "already holds volume \"v\"",
        );
        assert!(
            err.contains(&uuid) && !err.contains("another volume"),
            "{err}"
        );
    }
    assert!(!s2.exists(), "a refused format created {}", s2.display());
    // A mistyped META_URL (two slashes) with a store path whose parents do not exist yet:
    // refused, and not one of those parents is left behind.
    let bad = format!("rocksdb:/{}/m9/meta", tmp.path().display());
    let nested = tmp.path().join("s9");
    fails_clearly(
        &jfs(&[
            "format",
            &bad,
            "v9",
            "--storage",
            &format!("file://{}/blocks", nested.display()),
        ]),
        "the path must be absolute",
    );
    assert!(
        !nested.exists(),
        "a refused format created {}",
        nested.display()
    );
    // Other metadata, same name, the store of the first volume: that is another volume.
    let m2 = format!("rocksdb://{}/meta2", tmp.path().display());
    fails_clearly(
        &jfs(&["format", &m2, "v", "--storage", &s]),
        "another volume named \"v\"",
    );
    assert!(
        !tmp.path().join("meta2").exists(),
        "a refused format left metadata behind"
    );
    for engine in ["redis", "postgres"] {
        let (url, _) = meta_url(engine);
        let s3 = tmp.path().join(format!("s-{engine}"));
        let st = format!("file://{}", s3.display());
        ok(&["format", &url, "w", "--storage", &st]);
        fails_clearly(
            &jfs(&["format", &url, "w", "--storage", &st]),
            "already holds volume \"w\"",
        );
        let s4 = tmp.path().join(format!("s4-{engine}"));
        fails_clearly(
            &jfs(&[
                "format",
                &url,
                "w",
                "--storage",
                &format!("file://{}", s4.display()),
            ]),
            "already holds volume \"w\"",
        );
        assert!(!s4.exists());
    }
}

/// Names up to the 255-byte limit go into a volume and come out of it (their temporary
/// names fit too).
#[test]
fn the_longest_legal_names_go_in_and_come_out() {
    let tmp = tempfile::tempdir().unwrap();
    let m = format!("rocksdb://{}/meta", tmp.path().display());
    format_local(&m, tmp.path());
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let names = [
        "n".repeat(255),
        "é".repeat(127),
        "x".repeat(240),
        "y".repeat(226),
    ];
    for (i, n) in names.iter().enumerate() {
        std::fs::write(src.join(n), data(i as u64, 1000 + i)).unwrap();
    }
    ok(&["put", &m, src.to_str().unwrap(), "/t"]);
    let out = tmp.path().join("out");
    ok(&["get", &m, "/t", out.to_str().unwrap()]);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            std::fs::read(out.join(n)).unwrap(),
            data(i as u64, 1000 + i),
            "{n}"
        );
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), names.len());
}

/// A command with nothing to clean up (`journal --follow`) ends at the first SIGTERM or
/// SIGINT (exit 2), as a supervisor's stop and `timeout` expect; it does not wait for a
/// second signal.
#[test]
fn a_follow_ends_at_the_first_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let m = format!("rocksdb://{}/meta", tmp.path().display());
    format_local(&m, tmp.path());
    for sig in ["-TERM", "-INT"] {
        let mut child = Command::new(bin("jfs"))
            .args(["journal", &m, "--follow"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(800));
        let killed = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("journal --follow still runs 20 s after kill {sig}");
        };
        assert_eq!(status.code(), Some(2), "after kill {sig}");
    }
}

/// A dump loaded into other metadata takes the volume's store over: the metadata the dump
/// came from is refused as a writer and by gc, so the two never write the same block name
/// or delete each other's blocks (found by a trial: both wrote slice 257, and gc at the
/// source deleted the copy's block).
#[test]
fn a_loaded_dump_takes_the_store_over_and_the_source_is_retired() {
    let tmp = tempfile::tempdir().unwrap();
    let h = format!("rocksdb://{}/meta", tmp.path().display());
    let hc = format!("rocksdb://{}/copy", tmp.path().display());
    format_local(&h, tmp.path());
    let f = |i: u64| {
        let p = tmp.path().join(format!("f{i}"));
        std::fs::write(&p, data(i, 100_000)).unwrap();
        p.to_str().unwrap().to_string()
    };
    ok(&["put", &h, &f(1), "/orig"]);
    let dump_file = tmp.path().join("dump.json");
    ok(&["dump", &h, dump_file.to_str().unwrap()]);
    ok(&["load", &hc, dump_file.to_str().unwrap()]);
    ok(&["put", &hc, &f(2), "/at-copy"]);
    let refused = fails_clearly(
        &jfs(&["put", &h, &f(3), "/at-orig"]),
        "held by other metadata",
    );
    assert!(refused.contains("jfs load"), "{refused}");
    fails_clearly(&jfs(&["gc", &h, "--delete"]), "held by other metadata");
    assert_eq!(ok_bytes(&["cat", &hc, "/at-copy"]), data(2, 100_000));
    assert_eq!(ok_bytes(&["cat", &hc, "/orig"]), data(1, 100_000));
    let fsck = ok(&["fsck", &hc, "--deep"]);
    assert!(fsck.contains(": 0 broken"), "{fsck}");
    // The source still reads what it had.
    assert_eq!(ok_bytes(&["cat", &h, "/orig"]), data(1, 100_000));
}

/// Issue 25 trial: one-shot writers (`put`, `mkdir`, `rm`, `jfs-sync` into `jfs://`) remove
/// their session record when they end: `status` lists none, live or dead.
#[test]
fn one_shot_writers_leave_no_session_behind() {
    let (meta, _d) = meta_url("redis");
    let dir = tempfile::tempdir().unwrap();
    format_local(&meta, dir.path());
    let src = dir.path().join("src");
    write_tree(&src, 5, 1000);
    ok(&["put", &meta, src.to_str().unwrap(), "/t"]);
    ok(&["mkdir", &meta, "/d"]);
    ok(&["rm", "-r", &meta, "/t/d00"]);
    let o = Command::new(bin("jfs-sync"))
        .args([src.to_str().unwrap(), "jfs://VOL/s"])
        .env("VOL", &meta)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", &meta, "--json"])).unwrap();
    assert_eq!(st["sessions"], serde_json::json!([]), "{st}");
    // And what they wrote is there.
    assert_eq!(
        ok_bytes(&["cat", &meta, "/s/big.bin"]),
        data(42, 1000),
        "jfs-sync into the volume"
    );
}

/// `jfs get` never writes through a symbolic link below LOCAL: a link where the volume has a
/// directory (left by an earlier get of a volume link, then the volume's link replaced by a
/// directory) is refused with a message naming it, and the directory it points to is
/// unchanged. A volume name that only looks like a temporary one (`.x.jfs-tmp-final`) comes
/// out like any other.
#[test]
fn get_never_writes_through_a_link_below_local() {
    let (meta, _d1) = meta_url("rocksdb");
    let d = tempfile::tempdir().unwrap();
    format_local(&meta, d.path());
    let victim = d.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep"), b"outside LOCAL").unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), data(1, 100)).unwrap();
    std::fs::write(src.join(".x.jfs-tmp-final"), b"a user's file").unwrap();
    std::os::unix::fs::symlink(&victim, src.join("x")).unwrap();
    ok(&["put", &meta, src.to_str().unwrap(), "/data"]);
    let out = d.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Into `out/` (the trailing slash): out/data.
    let into = format!("{}/", out.display());
    ok(&["get", &meta, "/data", &into]);
    assert_eq!(
        std::fs::read_link(out.join("data/x")).unwrap(),
        victim,
        "the volume's link comes out as a link"
    );
    assert_eq!(
        std::fs::read(out.join("data/.x.jfs-tmp-final")).unwrap(),
        b"a user's file"
    );
    // In the volume, the link becomes a directory holding a file named like the victim's.
    ok(&["rm", &meta, "/data/x"]);
    ok(&["mkdir", &meta, "/data/x"]);
    let planted = d.path().join("keep");
    std::fs::write(&planted, b"planted").unwrap();
    ok(&["put", &meta, planted.to_str().unwrap(), "/data/x/keep"]);
    let o = jfs(&["get", &meta, "/data", &into]);
    let t = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "get through a link succeeded: {t}");
    assert!(
        t.contains("is a symbolic link") && t.contains("data/x"),
        "the message does not name the link: {t}"
    );
    assert_eq!(
        std::fs::read(victim.join("keep")).unwrap(),
        b"outside LOCAL"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
}

/// `jfs format` refuses a RocksDB path that is a directory holding other files (RocksDB would
/// mix its files in and rename a `LOG` of the user's), names some of them, and leaves the
/// directory as it was; an empty directory is taken.
#[test]
fn format_refuses_a_rocksdb_directory_that_holds_other_files() {
    let d = tempfile::tempdir().unwrap();
    let user = d.path().join("user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("LOG"), b"the user's log").unwrap();
    std::fs::write(user.join("notes.txt"), b"notes").unwrap();
    let store = format!("file://{}/s", d.path().display());
    let meta = format!("rocksdb://{}", user.display());
    let o = jfs(&["format", &meta, "v", "--storage", &store]);
    let t = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("holds other files") && t.contains("notes.txt"),
        "{t}"
    );
    let mut left: Vec<String> = std::fs::read_dir(&user)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["LOG", "notes.txt"]);
    assert_eq!(std::fs::read(user.join("LOG")).unwrap(), b"the user's log");
    assert!(!d.path().join("s").exists(), "the store was created");
    let empty = d.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    ok(&[
        "format",
        &format!("rocksdb://{}", empty.display()),
        "v",
        "--storage",
        &store,
    ]);
}

/// Operator slips with paths and files: an empty volume path (an unset shell variable) is
/// refused instead of taken for the root (`mv /a ''` moved the file there); a dump into a
/// directory is refused and leaves no temporary copy of the metadata; moving a directory
/// below itself and a hard link to a directory say why.
#[test]
fn empty_paths_and_a_dump_into_a_directory_are_refused_cleanly() {
    let (meta, _d1) = meta_url("rocksdb");
    let d = tempfile::tempdir().unwrap();
    format_local(&meta, d.path());
    ok(&["mkdir", "-p", &meta, "/src/sub"]);
    let f = d.path().join("a.txt");
    std::fs::write(&f, b"a").unwrap();
    ok(&["put", &meta, f.to_str().unwrap(), "/src/a.txt"]);
    for (args, says) in [
        (vec!["mv", &meta, "/src/a.txt", ""], "an empty volume path"),
        (vec!["rm", "-r", &meta, ""], "an empty volume path"),
        (vec!["ls", &meta, ""], "an empty volume path"),
        (vec!["mv", &meta, "/src", "/src/sub/in"], "into itself"),
        (
            vec!["ln", &meta, "/src", "/srclink"],
            "cannot name a directory",
        ),
    ] {
        let o = jfs(&args);
        let t = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {t}");
        assert!(t.contains(says), "{args:?}: {t}");
    }
    assert_eq!(ok(&["cat", &meta, "/src/a.txt"]), "a");
    let out = d.path().join("dumps");
    std::fs::create_dir_all(&out).unwrap();
    let o = jfs(&["dump", &meta, out.to_str().unwrap()]);
    let t = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("is a directory"), "{t}");
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("jfs-tmp"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `jfs put` names a relative LOCAL as it was typed and the absolute path it stands for,
/// and says what to do when it does not exist (exit 2).
#[test]
fn put_names_a_relative_local_as_typed_and_absolute() {
    let (meta, _d1) = meta_url("rocksdb");
    let d = tempfile::tempdir().unwrap();
    format_local(&meta, d.path());
    let run = |args: &[&str]| {
        Command::new(bin("jfs"))
            .args(args)
            .current_dir(d.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = run(&["put", &meta, "nosuch", "/x"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    let abs = d.path().join("nosuch");
    assert!(
        e.contains(&format!("LOCAL nosuch ({}) does not exist", abs.display()))
            && e.contains("name a file or directory to put"),
        "{e}"
    );
    // A relative LOCAL that is there goes in as usual.
    std::fs::write(d.path().join("here"), b"typed relative").unwrap();
    assert_eq!(run(&["put", &meta, "here", "/here"]).status.code(), Some(0));
    assert_eq!(ok_bytes(&["cat", &meta, "/here"]), b"typed relative");
}
