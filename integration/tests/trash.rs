//! The trash (issue 44, part 2), end to end with the real binaries: an `rm -rf` of 10,000
//! files through a mount at the primary while a mirror follows, put back byte-identical
//! (bytes, modes, mtimes) at both sites; a 64 MiB file overwritten and truncated, brought back
//! by `restore --version`; expiry and gc freeing the blocks; the size cap; a restore that
//! meets a newer file; refusals to other users; on RocksDB, Redis and PostgreSQL.

use integration::mirror::*;
use integration::mountproc::Mount;
use integration::{bin, data, meta_url, store_url};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn jfs(args: &[&str]) -> Output {
    Command::new(bin("jfs"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = jfs(args);
    assert!(
        o.status.success(),
        "jfs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A volume formatted by `jfs format` with `extra` flags; (meta, store, the dirs to keep).
fn format(engine: &str, extra: &[&str]) -> (String, String, Vec<tempfile::TempDir>) {
    let (meta, d1) = meta_url(engine);
    let (store, d2) = store_url("file");
    let mut a = vec!["format", &meta, "v", "--storage", &store];
    a.extend_from_slice(extra);
    ok(&a);
    (meta, store, d1.into_iter().chain(d2).collect())
}

fn store_dir(store: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(store.strip_prefix("file://").unwrap())
}

/// The block files under a file:// store.
fn blocks(store: &str) -> usize {
    integration::mountproc::store_blocks(store).len()
}

/// Every entry under `top` of a volume read in-process: path -> (kind, bytes or target,
/// mode, mtime).
type Tree = BTreeMap<String, (String, Vec<u8>, u32, i64)>;

async fn tree(fs: &fs_core::Fs, top: &str) -> Tree {
    let (root, _) = fs.resolve(top).await.expect("resolve");
    let mut out = Tree::new();
    let mut stack = vec![(root, top.to_string())];
    while let Some((d, p)) = stack.pop() {
        for e in fs.readdir_all(d).await.expect("readdir") {
            let path = format!("{p}/{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.ino).await.expect("getattr");
            let body = match e.kind {
                fs_core::FileKind::Dir => {
                    stack.push((e.ino, path.clone()));
                    Vec::new()
                }
                fs_core::FileKind::File => integration::read_all(fs, e.ino).await,
                fs_core::FileKind::Symlink => fs.readlink(e.ino).await.unwrap(),
                _ => Vec::new(),
            };
            out.insert(path, (format!("{:?}", e.kind), body, a.mode, a.mtime));
        }
    }
    out
}

async fn open_fs(meta: &str, store: &str) -> fs_core::Fs {
    fs_core::Fs::open(open_ro(meta).await, integration::open_store(store))
        .await
        .expect("open")
}

/// A local tree of `n` files in directories of 100, of mixed sizes and modes, with old mtimes
/// (`jfs put` keeps both), a symlink per directory.
fn local_tree(root: &Path, n: usize) {
    use std::os::unix::fs::PermissionsExt;
    for i in 0..n {
        let d = root.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::symlink(format!("f{i:05}"), d.join("link")).unwrap();
        }
        let f = d.join(format!("f{i:05}"));
        let len = if i % 1000 == 7 { 300_000 } else { i % 50 };
        std::fs::write(&f, data(i as u64, len)).unwrap();
        let mode = [0o644, 0o600, 0o755, 0o640][i % 4];
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000 + i as u64);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_rm_rf_of_10000_files_at_the_primary_is_put_back_identical_at_the_primary_and_the_mirror(
) {
    let dir = tempfile::tempdir().unwrap();
    let (meta, store, _keep) = format("rocksdb", &[]);
    let src = dir.path().join("src");
    local_tree(&src, 10_000);
    ok(&["put", &meta, s(&src), "/t", "-q"]);
    let before = tree(&open_fs(&meta, &store).await, "/t").await;
    assert_eq!(
        before.values().filter(|v| v.0 == "File").count(),
        10_000,
        "the tree put"
    );
    let pair = Pair::start(dir.path(), &meta, "rocksdb", None, "", "").await;
    wait_converged(
        &pair.mirror,
        &*open_ro(&meta).await,
        Duration::from_secs(300),
    )
    .await;
    let m_blocks = blocks(&pair.m_store);
    assert!(m_blocks >= 10, "{m_blocks} blocks at the mirror");
    let mnt = Mount::start(&meta, dir.path(), "mp", &[]);
    let t0 = Instant::now();
    std::fs::remove_dir_all(mnt.mp.join("t")).unwrap();
    eprintln!(
        "rm -rf of 10,000 files through the mount: {:?}",
        t0.elapsed()
    );
    assert!(!mnt.mp.join("t").exists());
    let primary = open_ro(&meta).await;
    wait_converged(&pair.mirror, &*primary, Duration::from_secs(300)).await;
    // The trash replicated: the mirror lists it too, and refuses to restore there.
    let at_mirror = json(&[
        "--block-store",
        &pair.m_store,
        "trash",
        &pair.m_meta,
        "--path",
        "/t",
        "--json",
    ]);
    assert_eq!(at_mirror.as_array().unwrap().len(), before.len() + 1);
    let o = jfs(&[
        "--block-store",
        &pair.m_store,
        "restore",
        &pair.m_meta,
        "--path",
        "/t",
        "--put-back",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("run jfs restore at the primary"), "{err}");
    // At the primary, beside its mount: the message says what to do.
    let o = jfs(&["restore", &meta, "--path", "/t", "--put-back"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("jfs umount"), "{err}");
    // The mirror keeps every block its trash references.
    assert_eq!(
        blocks(&pair.m_store),
        m_blocks,
        "the mirror deleted blocks of its trash"
    );
    drop(mnt);
    let out = ok(&["restore", &meta, "--path", "/t", "--put-back"]);
    assert!(
        out.contains(&format!("restored {} entries to /t", before.len() + 1)),
        "{out}"
    );
    let after = tree(&open_fs(&meta, &store).await, "/t").await;
    assert!(after == before, "the tree put back differs at the primary");
    wait_converged(
        &pair.mirror,
        &*open_ro(&meta).await,
        Duration::from_secs(300),
    )
    .await;
    let mirrored = tree(&open_fs(&pair.m_meta, &pair.m_store).await, "/t").await;
    assert!(
        mirrored == before,
        "the tree put back differs at the mirror"
    );
    let files = assert_same(&open_fs(&meta, &store).await, &pair.m_meta, &pair.m_store).await;
    assert_eq!(files, 10_000);
    assert_eq!(
        blocks(&pair.m_store),
        m_blocks,
        "the mirror copied no block twice, lost none"
    );
    assert!(json(&["trash", &meta, "--json"])
        .as_array()
        .unwrap()
        .is_empty());
}

fn version_round_trip(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format(engine, &[]);
    let v1 = data(1, 64 << 20);
    let v2 = data(2, 64 << 20);
    let f = t.path().join("ckpt");
    std::fs::write(&f, &v1).unwrap();
    ok(&["put", &meta, s(&f), "/ckpt", "-q"]);
    std::fs::write(&f, &v2).unwrap();
    ok(&["put", &meta, s(&f), "/ckpt", "-q"]);
    let cat = || jfs(&["cat", &meta, "/ckpt"]).stdout;
    assert!(cat() == v2);
    let listed = json(&["trash", &meta, "--path", "/ckpt", "--json"]);
    assert_eq!(listed[0]["why"], "overwritten", "{listed}");
    assert_eq!(listed[0]["size"], 64 << 20, "{listed}");
    let out = ok(&["restore", &meta, "--version", "/ckpt"]);
    assert!(out.contains("restored 1 entries to /ckpt"), "{out}");
    assert!(cat() == v1, "restore --version brought back other bytes");
    // The restore is undone the same way: v2 went to the trash in turn.
    ok(&["restore", &meta, "--version", "/ckpt"]);
    assert!(cat() == v2);
    // A truncate to zero keeps the old data too.
    ok(&["truncate", &meta, "/ckpt", "0"]);
    assert!(cat().is_empty());
    let listed = json(&["trash", &meta, "--path", "/ckpt", "--json"]);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["why"] == "truncated"),
        "{listed}"
    );
    ok(&["restore", &meta, "--version", "/ckpt"]);
    assert!(cat() == v2, "restore --version after a truncate");
    // --seq picks an older one, by the seq `jfs trash` shows.
    let listed = json(&["trash", &meta, "--path", "/ckpt", "--json"]);
    let seqs: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    let o = jfs(&["restore", &meta, "--version", "/ckpt", "--seq", "1"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no entry at /ckpt went to the trash at seq 1"),
        "{err}"
    );
    assert!(err.contains(&format!("seq {}", seqs[0])), "{err}");
}

#[test]
fn a_64mib_file_overwritten_or_truncated_comes_back_with_restore_version() {
    version_round_trip("rocksdb");
}

fn expiry_and_gc(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let (meta, store, _keep) = format(engine, &["--trash", "2s"]);
    let f = t.path().join("f");
    std::fs::write(&f, data(1, 6 << 20)).unwrap();
    ok(&["put", &meta, s(&f), "/f", "-q"]);
    ok(&["rm", &meta, "/f"]);
    let st = json(&["status", &meta, "--json"]);
    assert_eq!(st["trash"]["entries"], 1, "{st}");
    assert_eq!(st["trash"]["bytes"], 6 << 20, "{st}");
    let r = json(&["gc", &meta, "--delete", "--json"]);
    assert_eq!(
        (r["trash_expired"].as_u64(), r["pending"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    assert_eq!(blocks(&store), 2, "the trash keeps the blocks");
    std::thread::sleep(Duration::from_millis(2200));
    let r = json(&["gc", &meta, "--delete", "--json"]);
    assert_eq!(r["trash_expired"], 1, "{r}");
    assert_eq!(
        (r["pending"].as_u64(), r["pending_purged"].as_u64()),
        (Some(1), Some(0)),
        "{r}"
    );
    assert_eq!(blocks(&store), 2, "freed blocks wait the trash time again");
    std::thread::sleep(Duration::from_millis(2200));
    let r = json(&["gc", &meta, "--delete", "--json"]);
    assert_eq!(r["pending_purged"], 1, "{r}");
    assert_eq!(blocks(&store), 0);
    let st = json(&["status", &meta, "--json"]);
    assert_eq!(
        (st["trash"]["entries"].as_u64(), st["used_space"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    let _ = store_dir(&store);
}

#[test]
fn expired_entries_are_purged_and_gc_then_frees_their_blocks() {
    expiry_and_gc("rocksdb");
}

#[test]
fn a_read_write_mount_purges_what_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format("rocksdb", &["--trash", "1s"]);
    let mnt = Mount::start(&meta, dir.path(), "mp", &[]);
    std::fs::write(mnt.mp.join("f"), b"gone soon").unwrap();
    std::fs::remove_file(mnt.mp.join("f")).unwrap();
    let t0 = Instant::now();
    loop {
        let st = json(&["status", &meta, "--json"]);
        if st["trash"]["entries"] == 0 && st["pending_deletes"] == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "not purged: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn cap_evicts(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format(engine, &[]);
    let o = jfs(&["config", &meta, "--trash-max-bytes", "3.5M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for i in 1..=3 {
        let f = t.path().join(format!("f{i}"));
        std::fs::write(&f, data(i, 3 << 19)).unwrap();
        ok(&["put", &meta, s(&f), &format!("/f{i}"), "-q"]);
    }
    for i in 1..=3 {
        ok(&["rm", &meta, &format!("/f{i}")]);
    }
    let o = jfs(&["gc", &meta, "--delete", "--json"]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["trash_evicted"], 1, "{r}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("over its size cap"), "no log line: {err}");
    let names: Vec<String> = json(&["trash", &meta, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["/f2", "/f3"], "the oldest goes first");
    let st = json(&["status", &meta, "--json"]);
    assert_eq!(
        (
            st["trash"]["entries"].as_u64(),
            st["trash"]["evicted"].as_u64()
        ),
        (Some(2), Some(1)),
        "{st}"
    );
    assert_eq!(st["settings"]["trash_max_bytes"], 3 << 20 | 1 << 19, "{st}");
}

#[test]
fn the_size_cap_evicts_the_oldest_first_and_says_so() {
    cap_evicts("rocksdb");
}

fn restore_skips_newer(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format(engine, &[]);
    let d = t.path().join("d");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("a"), b"old a").unwrap();
    std::fs::write(d.join("b"), b"old b").unwrap();
    std::fs::write(d.join("sub/c"), b"old c").unwrap();
    ok(&["put", &meta, s(&d), "/d", "-q"]);
    ok(&["rm", "-r", &meta, "/d"]);
    // Made again since: a newer /d with a newer /d/a.
    ok(&["mkdir", &meta, "/d"]);
    let n = t.path().join("new");
    std::fs::write(&n, b"new a").unwrap();
    ok(&["put", &meta, s(&n), "/d/a", "-q"]);
    let o = jfs(&["restore", &meta, "--path", "/d", "--put-back"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("skipped /d/a: a newer entry has that name"),
        "{out}"
    );
    let cat = |p: &str| jfs(&["cat", &meta, p]).stdout;
    assert_eq!(cat("/d/a"), b"new a");
    assert_eq!(cat("/d/b"), b"old b");
    assert_eq!(cat("/d/sub/c"), b"old c");
    // What was skipped stays in the trash; into /.restored it comes back.
    let out = ok(&["restore", &meta, "--path", "/d/a"]);
    assert!(out.contains("to /.restored/seq-"), "{out}");
    let seq: String = out
        .split("/.restored/seq-")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    assert_eq!(cat(&format!("/.restored/seq-{seq}/d/a")), b"old a");
}

#[test]
fn a_restore_skips_and_names_a_newer_file() {
    restore_skips_newer("rocksdb");
}

#[test]
fn other_users_are_refused_and_skip_trash_frees_at_once() {
    let (meta, _store, _keep) = format("rocksdb", &[]);
    for args in [
        vec!["trash", meta.as_str()],
        vec!["restore", meta.as_str(), "--path", "/x"],
        vec!["rm", meta.as_str(), "/x", "--skip-trash"],
        vec!["config", meta.as_str(), "--trash", "0"],
    ] {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin("jfs"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("is for root only"), "{args:?}: {err}");
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("x")).unwrap();
    std::fs::write(t.path().join("x/f"), data(1, 1000)).unwrap();
    ok(&["put", &meta, s(&t.path().join("x")), "/x", "-q"]);
    ok(&["rm", "-r", &meta, "/x", "--skip-trash"]);
    assert!(json(&["trash", &meta, "--json"])
        .as_array()
        .unwrap()
        .is_empty());
    let st = json(&["status", &meta, "--json"]);
    assert_eq!(
        (st["pending_deletes"].as_u64(), st["used_space"].as_u64()),
        (Some(1), Some(0)),
        "{st}"
    );
}

#[test]
fn dump_and_load_carry_the_trash() {
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format("rocksdb", &[]);
    std::fs::create_dir_all(t.path().join("d/e")).unwrap();
    std::fs::write(t.path().join("d/e/f"), b"kept").unwrap();
    ok(&["put", &meta, s(&t.path().join("d")), "/d", "-q"]);
    ok(&["rm", "-r", &meta, "/d"]);
    let listed = json(&["trash", &meta, "--json"]);
    let file = t.path().join("dump.json");
    ok(&["dump", &meta, s(&file)]);
    let (meta2, _d) = meta_url("rocksdb");
    ok(&["load", &meta2, s(&file)]);
    assert_eq!(json(&["trash", &meta2, "--json"]), listed);
    ok(&["restore", &meta2, "--path", "/d", "--put-back"]);
    assert_eq!(jfs(&["cat", &meta2, "/d/e/f"]).stdout, b"kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_primary_agent_purges_the_trash_and_the_mirror_follows() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format("redis", &["--trash", "3s"]);
    let pair = Pair::start(dir.path(), &meta, "rocksdb", None, "", "").await;
    let f = dir.path().join("f");
    std::fs::write(&f, data(1, 100_000)).unwrap();
    ok(&["put", &meta, s(&f), "/f", "-q"]);
    ok(&["rm", &meta, "/f"]);
    let at_mirror = || {
        json(&[
            "--block-store",
            &pair.m_store,
            "trash",
            &pair.m_meta,
            "--json",
        ])
    };
    wait_converged(
        &pair.mirror,
        &*open_ro(&meta).await,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(at_mirror().as_array().unwrap().len(), 1, "replicated");
    let t0 = Instant::now();
    while !json(&["trash", &meta, "--json"])
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the agent purged nothing"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = json(&["status", &meta, "--json"]);
    assert_eq!(
        st["pending_deletes"], 1,
        "freed through the free path: {st}"
    );
    wait_converged(
        &pair.mirror,
        &*open_ro(&meta).await,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        at_mirror().as_array().unwrap().is_empty(),
        "the purge replicated"
    );
    let log = pair.primary.log_text();
    assert!(log.contains("purged trash entries"), "{}", tail(&log, 20));
}

#[test]
fn the_trash_on_redis() {
    expiry_and_gc("redis");
    cap_evicts("redis");
    restore_skips_newer("redis");
    version_round_trip("redis");
}

#[test]
fn the_trash_on_postgres() {
    expiry_and_gc("postgres");
    cap_evicts("postgres");
    restore_skips_newer("postgres");
    version_round_trip("postgres");
}

/// runbooks/model-versions.md, "Undo a delete" and "Undo an overwrite", step by step, each
/// step's output compared with the runbook's.
#[test]
fn the_model_versions_runbook_undoes_a_delete_and_an_overwrite() {
    use integration::runbook;
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format("rocksdb", &[]);
    let src = t.path().join("llama");
    std::fs::create_dir_all(src.join("v3")).unwrap();
    std::fs::create_dir_all(src.join("v4")).unwrap();
    std::fs::write(src.join("v3/config.json"), b"{\"layers\": 32}").unwrap();
    std::fs::write(src.join("v3/weights"), data(3, 1 << 20)).unwrap();
    let good = data(4, 3 << 20);
    std::fs::write(src.join("v4/model.safetensors"), &good).unwrap();
    ok(&["mkdir", &meta, "/models"]);
    ok(&["put", &meta, s(&src), "/models/llama", "-q"]);
    let before = ok(&["ls", "-lR", &meta, "/models/llama"]);
    // The mistakes: a bad checkpoint over the good one, then the whole tree removed.
    let bad = t.path().join("bad");
    std::fs::write(&bad, data(5, 1 << 20)).unwrap();
    ok(&[
        "put",
        &meta,
        s(&bad),
        "/models/llama/v4/model.safetensors",
        "-q",
    ]);
    ok(&["rm", "-r", &meta, "/models/llama"]);
    let env = [("META_URL", meta.as_str())];
    runbook::run_checked("model-versions", "find-deleted", &env);
    runbook::run_checked("model-versions", "put-back", &env);
    let cat = |p: &str| jfs(&["cat", &meta, p]).stdout;
    assert_eq!(cat("/models/llama/v3/config.json"), b"{\"layers\": 32}");
    assert_eq!(cat("/models/llama/v3/weights"), data(3, 1 << 20));
    assert!(cat("/models/llama/v4/model.safetensors") == data(5, 1 << 20));
    runbook::run_checked("model-versions", "find-version", &env);
    runbook::run_checked("model-versions", "restore-version", &env);
    assert!(cat("/models/llama/v4/model.safetensors") == good);
    // The files' names, modes, sizes and mtimes as they were before the mistakes (the
    // listing, less inode numbers; v4's own mtime records the restore into it).
    let after = ok(&["ls", "-lR", &meta, "/models/llama"]);
    let files = |l: &str| {
        l.lines()
            .filter(|x| x.starts_with('-'))
            .map(|x| x.rsplit_once(' ').map_or(x, |(a, _)| a).to_string())
            .map(|x| {
                let mut w: Vec<&str> = x.split_whitespace().collect();
                w.pop(); // the inode number
                w.join(" ")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(files(&after).len(), 3, "{after}");
    assert_eq!(files(&after), files(&before));
}

/// `jfs-sync --from-journal` follows restores: what `jfs restore` puts back (a tree, a
/// file's previous content) reaches the destination (the restore's journal entries were
/// not read as changes: the destination kept the delete, exit 0).
#[test]
fn jfs_sync_from_journal_follows_a_restore() {
    let t = tempfile::tempdir().unwrap();
    let (meta, _store, _keep) = format("rocksdb", &[]);
    let (src, out) = (t.path().join("src"), t.path().join("out"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), b"first a").unwrap();
    std::fs::write(src.join("sub/b"), b"b").unwrap();
    ok(&["put", &meta, s(&src), "/fj", "-q"]);
    let sync = || {
        let o = Command::new(bin("jfs-sync"))
            .args(["jfs://VOL/fj", s(&out), "--from-journal", "--delete-dst"])
            .env("VOL", &meta)
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    sync();
    assert_eq!(std::fs::read(out.join("sub/b")).unwrap(), b"b");
    ok(&["rm", "-r", &meta, "/fj/sub"]);
    let n = t.path().join("n");
    std::fs::write(&n, b"second a").unwrap();
    ok(&["put", &meta, s(&n), "/fj/a", "-q"]);
    sync();
    assert!(!out.join("sub").exists());
    assert_eq!(std::fs::read(out.join("a")).unwrap(), b"second a");
    ok(&["restore", &meta, "--path", "/fj/sub", "--put-back"]);
    ok(&["restore", &meta, "--version", "/fj/a"]);
    sync();
    assert_eq!(
        std::fs::read(out.join("sub/b")).unwrap(),
        b"b",
        "the restored tree"
    );
    assert_eq!(
        std::fs::read(out.join("a")).unwrap(),
        b"first a",
        "the restored version"
    );
}
