//! `jfs-sync` as a user runs it: separate processes, local directories and a real S3 server.

use integration::{bin, data, store_url};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Job {
    state: tempfile::TempDir,
}

impl Job {
    fn new() -> Self {
        Job {
            state: tempfile::tempdir().unwrap(),
        }
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("jfs-sync"));
        c.args(args)
            .env("XDG_CACHE_HOME", self.state.path())
            .stdin(Stdio::null());
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
    /// Run with --json; the summary from the last stdout line, checked to add up.
    fn sync(&self, args: &[&str], code: i32) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let o = self.run(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "jfs-sync {args:?}: {err}");
        let out = String::from_utf8_lossy(&o.stdout);
        let v: Value = serde_json::from_str(out.lines().last().unwrap_or(""))
            .unwrap_or_else(|_| panic!("no JSON summary: {out}\n{err}"));
        let n = |k: &str| v[k].as_u64().unwrap();
        assert_eq!(
            n("listed"),
            n("copied") + n("updated") + n("skipped") + n("excluded") + n("failed"),
            "summary adds up: {v}"
        );
        v
    }
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap()
}

/// Every file under `root`: relative path -> (bytes, mode).
fn tree(root: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.insert(
                    p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                    (std::fs::read(&p).unwrap(), m.mode() & 0o777),
                );
            }
        }
    }
    out
}

fn bytes_only(t: &BTreeMap<String, (Vec<u8>, u32)>) -> BTreeMap<String, Vec<u8>> {
    t.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

fn make_tree(root: &Path, files: usize, big: usize) {
    for i in 0..files {
        let p = root.join(format!("d{}/sub{}/f{i:05}.dat", i % 7, i % 3));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data(i as u64, 100 + (i * 131) % 20_000)).unwrap();
    }
    if big > 0 {
        std::fs::write(root.join("big.bin"), data(99, big)).unwrap();
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn full_then_no_change_then_incremental_dir_to_dir() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 300, 20 << 20);
    let job = Job::new();
    let v = job.sync(&[s(&src), s(&dst)], 0);
    assert_eq!((n(&v, "listed"), n(&v, "copied")), (301, 301));
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
    // A trailing slash means the same; nothing to do the second time.
    let v = job.sync(&[&format!("{}/", s(&src)), &format!("{}/", s(&dst))], 0);
    assert_eq!(
        (n(&v, "skipped"), n(&v, "copied"), n(&v, "bytes")),
        (301, 0, 0)
    );
    // Change one file's content (new mtime), add one, remove one, add an extra at dst.
    std::fs::write(src.join("d0/sub0/f00000.dat"), b"changed").unwrap();
    std::fs::write(src.join("new.txt"), b"new").unwrap();
    std::fs::remove_file(src.join("d1/sub1/f00001.dat")).unwrap();
    std::fs::write(dst.join("only-at-dst"), b"x").unwrap();
    let v = job.sync(&[s(&src), s(&dst), "--delete-dst"], 0);
    assert_eq!(
        (
            n(&v, "copied"),
            n(&v, "updated"),
            n(&v, "deleted"),
            n(&v, "extra")
        ),
        (1, 1, 2, 2),
        "{v}"
    );
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
}

#[test]
fn dir_to_s3_to_dir_with_check_and_server_side_copy() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src, 120, 20 << 20); // the big file goes up as a multipart upload
    let (s3, _) = store_url("s3");
    let job = Job::new();
    let v = job.sync(&[s(&src), &s3], 0);
    assert_eq!(n(&v, "copied"), 121);
    let v = job.sync(&[s(&src), &s3], 0);
    assert_eq!(
        n(&v, "skipped"),
        121,
        "uploaded after the source changed: same"
    );
    // S3 -> S3 in the same bucket: server-side copy, no bytes through the client.
    let (s3b, _) = store_url("s3");
    let v = job.sync(&[&s3, &s3b], 0);
    assert_eq!((n(&v, "copied"), n(&v, "bytes")), (121, 0));
    let back = t.path().join("back");
    job.sync(&[&s3b, s(&back)], 0);
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&back)));
    // check: same, then one missing, one differing, one extra
    let o = job.run(&["check", s(&src), &s3b, "--json"]);
    assert_eq!(o.status.code(), Some(0));
    std::fs::write(src.join("d0/sub0/f00000.dat"), b"different length").unwrap();
    std::fs::write(src.join("added"), b"a").unwrap();
    std::fs::remove_file(src.join("d1/sub1/f00001.dat")).unwrap();
    let o = job.run(&["check", s(&src), &s3b, "--json", "--list"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    let r: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(
        (n(&r, "missing"), n(&r, "differing"), n(&r, "extra")),
        (1, 1, 1),
        "{out}"
    );
    assert!(
        out.contains("missing added")
            && out.contains("differs d0/sub0/f00000.dat")
            && out.contains("extra d1/sub1/f00001.dat")
    );
}

#[test]
fn checksum_catches_same_size_same_mtime_edits_and_download_check_too() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"aaaa").unwrap();
    let job = Job::new();
    job.sync(&[s(&src), s(&dst)], 0);
    // Same size, mtime put back: size+mtime sees no change, --checksum does.
    let m = std::fs::metadata(src.join("a"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::write(dst.join("a"), b"bbbb").unwrap();
    std::fs::File::options()
        .write(true)
        .open(dst.join("a"))
        .unwrap()
        .set_modified(m)
        .unwrap();
    assert_eq!(n(&job.sync(&[s(&src), s(&dst)], 0), "skipped"), 1);
    let o = job.run(&["check", s(&src), s(&dst), "--download", "--json"]);
    assert_eq!(o.status.code(), Some(1), "--download compares bytes");
    let v = job.sync(&[s(&src), s(&dst), "--checksum"], 0);
    assert_eq!((n(&v, "updated"), n(&v, "checked")), (1, 1));
    assert_eq!(std::fs::read(dst.join("a")).unwrap(), b"aaaa");
    let v = job.sync(&[s(&src), s(&dst), "--check-new", "--force-update"], 0);
    assert_eq!(n(&v, "updated"), 1);
}

#[test]
fn update_existing_ignore_existing_force() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("old"), b"dst version, longer").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(src.join("old"), b"src newer").unwrap();
    std::fs::write(src.join("new"), b"n").unwrap();
    let job = Job::new();
    let v = job.sync(&[s(&src), s(&dst), "--existing"], 0);
    assert_eq!(
        (n(&v, "updated"), n(&v, "copied"), n(&v, "skipped")),
        (1, 0, 1)
    );
    assert!(!dst.join("new").exists());
    std::fs::write(dst.join("old"), b"dst edited later").unwrap();
    let v = job.sync(&[s(&src), s(&dst), "--update"], 0);
    assert_eq!(
        (n(&v, "updated"), n(&v, "copied")),
        (0, 1),
        "dst is newer: --update leaves it"
    );
    let v = job.sync(&[s(&src), s(&dst), "--ignore-existing"], 0);
    assert_eq!(n(&v, "skipped"), 2);
    let v = job.sync(&[s(&src), s(&dst), "--force-update"], 0);
    assert_eq!(n(&v, "updated"), 2);
    assert_eq!(std::fs::read(dst.join("old")).unwrap(), b"src newer");
}

#[test]
fn filters_select_what_the_docs_say() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for (p, size) in [
        ("a.txt", 10),
        ("a.bin", 10),
        ("logs/x.gz", 10),
        ("logs/deep/y.gz", 10),
        ("cache/z.txt", 10),
        ("big.txt", 5000),
        ("m/keep.txt", 10),
    ] {
        std::fs::create_dir_all(src.join(p).parent().unwrap()).unwrap();
        std::fs::write(src.join(p), data(1, size)).unwrap();
    }
    let run = |args: &[&str]| -> Vec<String> {
        let dst = tempfile::tempdir().unwrap();
        let d = dst.path().join("d");
        let mut a = vec![s(&src), s(&d)];
        a.extend_from_slice(args);
        Job::new().sync(&a, 0);
        tree(&d).into_keys().collect()
    };
    assert_eq!(
        run(&["--exclude", "*.bin", "--exclude", "cache/"]),
        [
            "a.txt",
            "big.txt",
            "logs/deep/y.gz",
            "logs/x.gz",
            "m/keep.txt"
        ]
    );
    assert_eq!(
        run(&["--exclude", "logs/*.gz"])
            .iter()
            .filter(|k| k.starts_with("logs"))
            .collect::<Vec<_>>(),
        ["logs/deep/y.gz"]
    );
    // rsync layers: include directories and *.txt, exclude everything else
    assert_eq!(
        run(&["--include", "*/", "--include", "*.txt", "--exclude", "*"]),
        ["a.txt", "big.txt", "cache/z.txt", "m/keep.txt"]
    );
    assert_eq!(run(&["--max-size", "100"]).len(), 6);
    assert_eq!(run(&["--min-size", "100"]), ["big.txt"]);
    assert_eq!(
        run(&["--start", "b", "--end", "logs/x.gz"]),
        ["big.txt", "cache/z.txt", "logs/deep/y.gz", "logs/x.gz"]
    );
    assert_eq!(
        run(&["--min-age", "1h"]),
        Vec::<String>::new(),
        "everything is younger than an hour"
    );
    assert_eq!(run(&["--max-age", "1h"]).len(), 7);
    // --files-from takes lines as `find` writes them; a listed entry the source lacks is
    // named and counts as failed (exit 1), the rest is copied.
    let list = t.path().join("list");
    std::fs::write(&list, "./m/keep.txt\n/a.bin\n# comment\nmissing\n").unwrap();
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path().join("d");
    let job = Job::new();
    let o = job.run(&[s(&src), s(&d), "--files-from", s(&list), "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"missing\" (from --files-from) does not exist in the source"),
        "{err}"
    );
    assert_eq!(
        tree(&d).into_keys().collect::<Vec<_>>(),
        ["a.bin", "m/keep.txt"]
    );
    let v: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        (n(&v, "listed"), n(&v, "copied"), n(&v, "failed")),
        (3, 2, 1)
    );
}

#[test]
fn dry_run_changes_nothing_and_max_delete_refuses() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 20, 0);
    make_tree(&dst, 40, 0);
    std::fs::write(dst.join("d0/sub0/f00000.dat"), b"stale").unwrap();
    let before = tree(&dst);
    let job = Job::new();
    let o = job.run(&[s(&src), s(&dst), "--delete-dst", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0));
    let plan = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        plan.lines()
            .filter(|l| l.starts_with("would delete "))
            .count(),
        20,
        "{plan}"
    );
    assert!(plan.contains("would update d0/sub0/f00000.dat"));
    // The summary says what would happen and counts the deletes it listed.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("dry run: ")
            && err.contains("would delete 20")
            && err.contains("would update"),
        "{err}"
    );
    assert_eq!(tree(&dst), before, "dry run changed nothing");
    assert!(
        !job.state.path().join("jfs-sync").exists(),
        "dry run keeps no state"
    );
    // 20 of 40 destination objects would go: 10 or 40% is too many.
    let v = job.sync(&[s(&src), s(&dst), "--delete-dst", "--max-delete", "10"], 2);
    assert_eq!(n(&v, "deleted"), 0);
    let v = job.sync(
        &[s(&src), s(&dst), "--delete-dst", "--max-delete", "40%"],
        2,
    );
    assert_eq!(n(&v, "deleted"), 0);
    assert_eq!(tree(&dst).len(), 40, "nothing deleted");
    let v = job.sync(
        &[s(&src), s(&dst), "--delete-dst", "--max-delete", "60%"],
        0,
    );
    assert_eq!(n(&v, "deleted"), 20);
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
}

#[test]
fn hostile_keys_and_planted_symlinks_never_write_outside() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst, outside) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("outside"),
    );
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(src.join("sub/victim"), b"payload").unwrap();
    std::fs::write(src.join("ok"), b"fine").unwrap();
    std::fs::write(src.join("back\\slash"), b"x").unwrap();
    std::fs::write(src.join("ctl\u{7}bell"), b"x").unwrap();
    // The destination holds a planted symlink pointing outside it.
    std::os::unix::fs::symlink(&outside, dst.join("sub")).unwrap();
    let job = Job::new();
    let o = job.run(&[s(&src), s(&dst), "--json", "--retries", "0", "--delete-dst"]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        o.status.code(),
        Some(1),
        "signal {:?}: {}",
        o.status.signal(),
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    // Names are bytes (issue 43, item 11): a backslash or a control character is a legal
    // local name, copied as it is and never printed raw.
    assert_eq!(std::fs::read(dst.join("back\\slash")).unwrap(), b"x");
    assert_eq!(std::fs::read(dst.join("ctl\u{7}bell")).unwrap(), b"x");
    assert!(!err.contains('\u{7}'), "{err}");
    assert!(
        err.contains("sub/victim") && err.contains("sub is a symbolic link"),
        "the planted symlink makes that key fail: {err}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside the destination"
    );
    assert_eq!(
        std::fs::read(dst.join("ok")).unwrap(),
        b"fine",
        "the rest of the run went on"
    );
    assert!(
        dst.join("sub")
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink(),
        "no deletion after errors"
    );
    // Keys named in --files-from are checked the same way.
    let list = t.path().join("list");
    std::fs::write(&list, "../escape\n/etc/passwd\nok\n").unwrap();
    let v = job.sync(&[s(&src), s(&dst), "--files-from", s(&list)], 1);
    assert_eq!((n(&v, "failed"), n(&v, "skipped")), (2, 1));
    assert!(!t.path().join("escape").exists());
}

#[test]
fn symlinks_dirs_and_perms() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    std::fs::set_permissions(src.join("f"), std::fs::Permissions::from_mode(0o751)).unwrap();
    std::os::unix::fs::symlink("f", src.join("ln")).unwrap();
    let job = Job::new();
    let v = job.sync(&[s(&src), s(&dst)], 0);
    assert_eq!(
        n(&v, "skipped"),
        1,
        "symlinks are not followed without --links"
    );
    assert!(!dst.join("ln").exists() && !dst.join("empty").exists());
    job.sync(
        &[
            s(&src),
            s(&dst),
            "--links",
            "--dirs",
            "--perms",
            "--force-update",
        ],
        0,
    );
    assert_eq!(
        std::fs::read_link(dst.join("ln")).unwrap(),
        PathBuf::from("f")
    );
    assert!(dst.join("empty").is_dir());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(dst.join("f")).unwrap().mode() & 0o777,
        0o751
    );
}

#[test]
fn delete_src_moves() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 30, 0);
    let want = bytes_only(&tree(&src));
    let v = Job::new().sync(&[s(&src), s(&dst), "--delete-src", "--check-new"], 0);
    assert_eq!(n(&v, "copied"), 30);
    assert!(
        tree(&src).is_empty(),
        "sources deleted after a verified copy"
    );
    assert_eq!(bytes_only(&tree(&dst)), want);
}

/// kill -9 at 12 random points; each restart with the same command continues; files that were
/// complete before a kill are never copied again (same inode); the final tree is identical.
#[test]
fn kill_9_at_random_points_resumes_without_recopying() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    // ~30 MB at 10 MB/s: about 3 s of copying, cut into many short runs.
    make_tree(&src, 3000, 4 << 20);
    let job = Job::new();
    let args = [s(&src), s(&dst), "--bwlimit", "10M", "--threads", "8"];
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut kills = 0;
    let mut rng = 0x2545F4914F6CDD1Du64;
    for round in 0..60 {
        let mut child = job
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Longer and longer: every object must fit in one run (a part-done upload restarts).
        let wait = Duration::from_millis(50 + rng % 250 + round * 5);
        let t0 = Instant::now();
        let mut finished = None;
        while t0.elapsed() < wait {
            if let Some(st) = child.try_wait().unwrap() {
                finished = Some(st);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match finished {
            Some(st) => {
                assert!(st.success(), "round {round} exited {st:?}");
                break;
            }
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
            }
        }
        // Every complete (non-temporary) file keeps its inode from now on.
        for (k, _) in tree(&dst) {
            if k.contains(".jfs-sync-tmp") {
                continue;
            }
            let ino = std::fs::metadata(dst.join(&k)).unwrap().ino();
            if let Some(old) = seen.insert(k.clone(), ino) {
                assert_eq!(old, ino, "{k} was copied again after a restart");
            }
        }
        assert!(round < 59, "did not finish");
    }
    eprintln!("resumed after {kills} kills");
    assert!(kills >= 10, "only {kills} kills: make the workload bigger");
    let v = job.sync(&args, 0);
    assert_eq!(
        n(&v, "copied") + n(&v, "updated"),
        0,
        "a final run has nothing left to do: {v}"
    );
    let (a, b) = (tree(&src), tree(&dst));
    assert!(
        b.keys().all(|k| !k.contains("jfs-sync-tmp")),
        "no temporary files left"
    );
    assert_eq!(
        bytes_only(&a),
        bytes_only(&b),
        "the destination equals the source"
    );
}

#[test]
fn sigterm_checkpoints_and_the_next_run_finishes() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 400, 0);
    let job = Job::new();
    let args = [s(&src), s(&dst), "--tps", "200", "--threads", "4"];
    interrupt(&job, &args, &[], 700);
    let left = tree(&dst);
    assert!(
        left.keys().all(|k| !k.contains("jfs-sync-tmp")),
        "copies in flight finished before the exit: {:?}",
        left.keys()
            .filter(|k| k.contains("tmp"))
            .collect::<Vec<_>>()
    );
    let done_before = left.len();
    assert!(done_before > 0 && done_before < 400, "{done_before}");
    let inodes: Vec<(String, u64)> = left
        .keys()
        .map(|k| {
            use std::os::unix::fs::MetadataExt;
            (k.clone(), std::fs::metadata(dst.join(k)).unwrap().ino())
        })
        .collect();
    let v = job.sync(&[s(&src), s(&dst)], 0);
    // The summary counts every object once: the first attempt's copies (as `resumed`) and
    // this run's; the files the first attempt finished were not copied again.
    assert_eq!(n(&v, "copied"), 400, "{v}");
    assert_eq!(n(&v, "listed"), 400, "{v}");
    let before = n(&v["resumed"], "copied") as usize;
    assert!(before > 0 && before <= done_before, "{v}");
    // Files the first attempt finished were not copied again: same inode (a copy lands under
    // a temporary name and is renamed over, a new inode).
    for (k, ino) in &inodes {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(dst.join(k)).unwrap().ino(),
            *ino,
            "{k} was copied again"
        );
    }
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
}

#[test]
fn bandwidth_and_request_limits_hold_within_5_percent() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), data(5, 80 << 20)).unwrap();
    let v = Job::new().sync(&[s(&src), s(&dst), "--bwlimit", "20M"], 0);
    let rate = n(&v, "bytes") as f64 / v["seconds"].as_f64().unwrap();
    let want = (20 << 20) as f64;
    // Never over the limit by more than 5%. The run's time also holds the start and the
    // destination's final flush (syncfs of 80 MiB, 0.1-0.5 s on this disk), which pacing
    // cannot make up for: below, 12% is allowed (seen: 18.0-19.9 MiB/s).
    assert!(
        rate <= want * 1.05 && rate >= want * 0.88,
        "bwlimit 20M gave {:.2} MiB/s",
        rate / (1 << 20) as f64
    );
    // Requests: one per small file here; 150 files at 50/s take 3 s.
    let src2 = t.path().join("src2");
    make_tree(&src2, 150, 0);
    let v = Job::new().sync(&[s(&src2), s(&t.path().join("dst2")), "--tps", "50"], 0);
    let tps = 150.0 / v["seconds"].as_f64().unwrap();
    assert!((tps - 50.0).abs() / 50.0 < 0.05, "--tps 50 gave {tps:.1}/s");
}

#[test]
fn metrics_endpoint_reports_progress() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 200, 0);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let job = Job::new();
    let mut child = job
        .cmd(&[s(&src), s(&dst), "--tps", "100", "--metrics", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut body = String::new();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(&addr) {
            c.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .unwrap();
            body.clear();
            c.read_to_string(&mut body).unwrap();
            if body.contains("jfs_sync_copied ") && !body.contains("jfs_sync_copied 0\n") {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(body.contains("# TYPE jfs_sync_copied gauge"), "{body}");
    let copied: u64 = body
        .lines()
        .find(|l| l.starts_with("jfs_sync_copied "))
        .unwrap()[16..]
        .trim()
        .parse()
        .unwrap();
    assert!(copied > 0 && copied < 200, "{copied}");
}

#[test]
fn bad_arguments_fail_clearly() {
    let job = Job::new();
    let t = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (
            vec!["/no/such/dir", s(t.path())],
            "opening directory /no/such/dir",
        ),
        (vec![s(t.path()), "ftp://x/y"], "unsupported scheme"),
        (
            vec![s(t.path()), s(t.path()), "--bwlimit", "lots"],
            "--bwlimit",
        ),
        (
            vec![s(t.path()), s(t.path()), "--max-delete", "many"],
            "--max-delete",
        ),
        (
            vec![s(t.path()), s(t.path()), "--update", "--force-update"],
            "contradict",
        ),
        (
            vec!["jfs://NOPE/x", s(t.path())],
            "set the environment variable NOPE",
        ),
    ] {
        let o = job.run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let help = String::from_utf8_lossy(&job.run(&["--help"]).stdout).into_owned();
    for flag in [
        "--delete-dst",
        "--max-delete",
        "--bwlimit",
        "--tps",
        "--files-from",
        "--from-journal",
        "layer by layer",
        "Exit codes",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

/// A volume source with --from-journal: the second run reads only the journal (creates,
/// overwrites, renames of files and directories, deletes), and gives the same tree as a full
/// listing would; once the journal is trimmed past the recorded point it falls back, loudly.
#[test]
fn from_journal_copies_exactly_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", t.path().display());
    let jfs = |args: &[&str]| {
        let o = Command::new(bin("jfs")).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "jfs {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    jfs(&[
        "format",
        &meta,
        "v",
        "--storage",
        &format!("file://{}/blocks", t.path().display()),
    ]);
    let src = t.path().join("src");
    make_tree(&src, 200, 0);
    jfs(&["put", &meta, s(&src), "/data"]);
    let dst = t.path().join("dst");
    let job = Job::new();
    let run = |extra: &[&str], code| {
        let mut c = job.cmd(&[
            "jfs://VOL/data",
            s(&dst),
            "--from-journal",
            "--delete-dst",
            "--json",
        ]);
        c.args(extra).env("VOL", &meta);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{err}");
        let v: Value =
            serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap())
                .unwrap();
        (v, err)
    };
    let (v, err) = run(&[], 0);
    assert_eq!(n(&v, "copied"), 200);
    assert!(err.contains("full listing this time"), "{err}");
    // Change the volume: overwrite, add, delete, rename a file, rename a directory.
    std::fs::write(t.path().join("new"), b"brand new").unwrap();
    jfs(&["put", &meta, s(&t.path().join("new")), "/data/d0/new"]);
    std::fs::write(t.path().join("over"), b"overwritten").unwrap();
    jfs(&[
        "put",
        &meta,
        s(&t.path().join("over")),
        "/data/d1/sub1/f00001.dat",
    ]);
    jfs(&["rm", &meta, "/data/d2/sub2/f00002.dat"]);
    jfs(&[
        "mv",
        &meta,
        "/data/d3/sub0/f00003.dat",
        "/data/d3/sub0/renamed.dat",
    ]);
    // Files changed in place (their names come from the volume, not from the window): two
    // in one directory, one in the directory moved next.
    jfs(&["truncate", &meta, "/data/d5/sub2/f00005.dat", "10"]);
    jfs(&["truncate", &meta, "/data/d5/sub2/f00026.dat", "20"]);
    jfs(&["truncate", &meta, "/data/d4/sub1/f00004.dat", "30"]);
    jfs(&["mv", &meta, "/data/d4", "/data/d4-moved"]);
    let (v, err) = run(&[], 0);
    let d4 = (0..200).filter(|i| i % 7 == 4).count(); // files under d4
    assert!(err.contains("touch"), "{err}");
    assert!(
        n(&v, "listed") < 80,
        "only changed keys were looked at, not all 200: {v}"
    );
    assert_eq!(
        n(&v, "copied"),
        2 + d4 as u64,
        "new + renamed file + the moved directory: {v}"
    );
    assert_eq!(
        n(&v, "updated"),
        3,
        "the overwritten and the two truncated: {v}"
    );
    assert_eq!(
        n(&v, "deleted"),
        2 + d4 as u64,
        "removed + old name + old directory: {v}"
    );
    let out = t.path().join("out");
    // The volume read out afresh is what the destination holds.
    let same_as_volume = |what: &str| {
        let _ = std::fs::remove_dir_all(&out);
        jfs(&["get", &meta, "/data", s(&out)]);
        assert_eq!(
            bytes_only(&tree(&out)),
            bytes_only(&tree(&dst)),
            "same as the volume{what}"
        );
    };
    same_as_volume("");
    // Nothing changed: nothing to do.
    let (v, _) = run(&[], 0);
    assert_eq!(n(&v, "listed"), 0);
    // A clone of a directory and of a file: their trees are new at their names.
    jfs(&["clone", &meta, "/data/d0", "/data/d0-v1"]);
    jfs(&["clone", &meta, "/data/d1/sub1/f00001.dat", "/data/f1-v1"]);
    let (v, err) = run(&[], 0);
    let d0 = (0..200).filter(|i| i % 7 == 0).count() as u64 + 1; // + d0/new
    assert_eq!(
        n(&v, "copied"),
        d0 + 1,
        "the cloned tree and file: {v} {err}"
    );
    same_as_volume(" after clones");
    // Directories in one window: one made, renamed and removed (the destination never had
    // it); one made, filled and renamed; one that existed, renamed, then removed (the
    // destination's copy of it goes).
    jfs(&["mkdir", &meta, "/data/t1"]);
    jfs(&["mv", &meta, "/data/t1", "/data/t2"]);
    jfs(&["rm", &meta, "/data/t2"]);
    jfs(&["mkdir", &meta, "/data/n1"]);
    jfs(&["put", &meta, s(&t.path().join("new")), "/data/n1/q"]);
    jfs(&["mv", &meta, "/data/n1", "/data/n2"]);
    jfs(&["mv", &meta, "/data/d6", "/data/d6x"]);
    jfs(&["rm", "-r", &meta, "/data/d6x"]);
    let (v, err) = run(&[], 0);
    let d6 = (0..200).filter(|i| i % 7 == 6).count() as u64;
    assert_eq!(n(&v, "copied"), 1, "n2/q: {v} {err}");
    assert!(n(&v, "deleted") >= d6, "d6's files: {v}");
    same_as_volume(" after the directory changes");
    assert!(!dst.join("d6").exists() && !dst.join("t2").exists());
    // Hard links made in one window, the files changed in place in the next: every name of
    // the inode is re-copied, whether it shares the recorded parent or not.
    jfs(&["ln", &meta, "/data/d0/sub0/f00000.dat", "/data/d1/far"]);
    jfs(&[
        "ln",
        &meta,
        "/data/d0/sub1/f00007.dat",
        "/data/d0/sub1/twin",
    ]);
    let (v, err) = run(&[], 0);
    assert_eq!(n(&v, "copied"), 2, "the two new names: {v} {err}");
    // Both names in one directory: found there, no listing.
    jfs(&["truncate", &meta, "/data/d0/sub1/twin", "6"]);
    let (v, err) = run(&[], 0);
    assert_eq!(n(&v, "updated"), 2, "both names: {v} {err}");
    assert_eq!(n(&v, "listed"), 2, "{v} {err}");
    // A name in another directory is found only by listing: a full listing, said loudly.
    jfs(&["truncate", &meta, "/data/d1/far", "5"]);
    let (v, err) = run(&[], 0);
    assert_eq!(n(&v, "updated"), 2, "both names: {v} {err}");
    assert!(
        err.contains("hard links") && err.contains("FULL LISTING"),
        "{err}"
    );
    // Linked and changed in one window: the new name's directory is looked in too.
    jfs(&["ln", &meta, "/data/d0/sub2/f00014.dat", "/data/d2/near"]);
    jfs(&["truncate", &meta, "/data/d2/near", "7"]);
    let (v, err) = run(&[], 0);
    assert!(!err.contains("FULL LISTING"), "{err}");
    assert_eq!(
        n(&v, "copied") + n(&v, "updated"),
        2,
        "both names: {v} {err}"
    );
    same_as_volume(" after changes to hard-linked files");
    assert_eq!(
        std::fs::metadata(dst.join("d0/sub0/f00000.dat"))
            .unwrap()
            .len(),
        5
    );
    // Trim the journal past the recorded point: a full listing, said loudly.
    jfs(&["mkdir", &meta, "/data/late"]);
    let engine_trim = Command::new(bin("jfs"))
        .args(["gc", &meta, "--delete"])
        .output()
        .unwrap();
    assert!(engine_trim.status.success());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let e = meta::open(&meta, &meta::OpenOptions::default())
            .await
            .unwrap();
        let last = e.journal_bounds().await.unwrap().last;
        e.journal_trim(last).await.unwrap();
    });
    let (v, err) = run(&[], 0);
    assert!(err.contains("FULL LISTING"), "{err}");
    assert_eq!(n(&v, "listed") as usize, tree(&out).len());
}

/// Listing in parallel by prefix gives exactly the stream a single listing gives: the dry-run
/// plan (printed in merge order) is identical and sorted, for a local and an S3 source.
#[test]
fn parallel_listing_keeps_key_order() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src, 500, 0);
    std::fs::write(src.join("a-top-file"), b"x").unwrap();
    std::fs::write(
        src.join("d3.txt"),
        b"sorts between d3/ and d4/? no: '.' < '/'",
    )
    .unwrap();
    let (s3, _) = store_url("s3");
    let job = Job::new();
    job.sync(&[s(&src), &s3], 0);
    for source in [s(&src).to_string(), s3.clone()] {
        let plan = |extra: &[&str]| -> Vec<String> {
            let nowhere = t.path().join("nowhere");
            let mut a = vec![source.as_str(), s(&nowhere), "--dry-run"];
            a.extend_from_slice(extra);
            let o = job.run(&a);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        };
        let one = plan(&["--list-threads", "1"]);
        assert_eq!(one.len(), 502);
        let mut sorted = one.clone();
        sorted.sort();
        assert_eq!(one, sorted, "{source}: plan in key order");
        assert_eq!(
            plan(&["--list-threads", "8", "--list-depth", "1"]),
            one,
            "{source}"
        );
        assert_eq!(
            plan(&["--list-threads", "8", "--list-depth", "3"]),
            one,
            "{source}"
        );
    }
}

/// A directory wider than the spill limit is sorted on disk: the same ordered plan and the
/// same copy as the in-memory sort (with parallel listing falling back to one listing).
#[test]
fn huge_flat_directories_are_sorted_on_disk() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("flat")).unwrap();
    for i in 0..3000u64 {
        // names whose order differs from creation order, and a '.' vs '/' pair
        std::fs::write(
            src.join(format!("flat/{:x}", i.wrapping_mul(2654435761) % 100_000)),
            data(i, 10),
        )
        .unwrap();
    }
    std::fs::create_dir_all(src.join("flat.d")).unwrap();
    std::fs::write(src.join("flat.d/x"), b"x").unwrap();
    std::fs::write(src.join("flat.txt"), b"y").unwrap();
    let job = Job::new();
    let plan = |spill: &str, threads: &str| -> Vec<String> {
        let nowhere = t.path().join("nowhere");
        let o = job
            .cmd(&[s(&src), s(&nowhere), "--dry-run", "--list-threads", threads])
            .env("JFS_SYNC_SPILL_AT", spill)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let in_memory = plan("1000000", "1");
    let mut sorted = in_memory.clone();
    sorted.sort();
    assert_eq!(in_memory, sorted);
    assert_eq!(
        plan("500", "1"),
        in_memory,
        "spilled runs merge into the same order"
    );
    assert_eq!(
        plan("500", "4"),
        in_memory,
        "a too-wide level falls back to one listing"
    );
    let dst = t.path().join("dst");
    let o = job
        .cmd(&[s(&src), s(&dst), "--json"])
        .env("JFS_SYNC_SPILL_AT", "500")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
}

fn second_bucket() -> String {
    let base = std::env::var("JFS_TEST_S3B")
        .expect("JFS_TEST_S3B is not set: start the services with integration/services.sh");
    let (bucket, query) = base.split_once('?').unwrap_or((&base, ""));
    format!("{bucket}/{}?{query}", integration::unique("b"))
}

/// kill -9 in the middle of a large upload to S3: the next run finds the upload id in its
/// state, asks S3 which parts it has, and uploads only the others; the object is whole.
#[test]
fn a_killed_multipart_upload_resumes_from_its_parts() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let size = 96usize << 20; // 12 parts of 8 MiB
    std::fs::write(src.join("model.bin"), data(31, size)).unwrap();
    let (s3, _) = store_url("s3");
    let job = Job::new();
    // Warm up first: a fresh Ceph takes seconds over its first writes and over its first
    // multipart upload (it creates a pool for them), so warm up with a multipart-sized file.
    let warm = t.path().join("warm");
    std::fs::create_dir_all(&warm).unwrap();
    std::fs::write(warm.join("w"), data(7, 17 << 20)).unwrap();
    job.sync(&[s(&warm), &s3], 0);
    // 96 MiB at 16 MiB/s: about 6 s, killed at 3.5 s.
    let args = [s(&src), &s3, "--bwlimit", "16M"];
    let mut child = job
        .cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the upload finished before the kill: make it bigger"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let v = job.sync(&args, 0);
    let moved = n(&v, "bytes") as usize;
    assert_eq!(n(&v, "copied"), 1);
    assert!(
        moved < size * 7 / 8 && moved > 0,
        "the second run uploaded {moved} of {size} bytes"
    );
    assert_eq!(moved % (8 << 20), 0, "whole parts only");
    let back = t.path().join("back");
    job.sync(&[&s3, s(&back)], 0);
    assert!(
        std::fs::read(back.join("model.bin")).unwrap() == data(31, size),
        "the object is whole and right"
    );
}

/// Another bucket on the same endpoint: CopyObject, no bytes through jfs-sync.
#[test]
fn cross_bucket_copies_are_server_side() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src, 40, 9 << 20);
    let (a, _) = store_url("s3");
    let b = second_bucket();
    let job = Job::new();
    job.sync(&[s(&src), &a], 0);
    let v = job.sync(&[&a, &b], 0);
    assert_eq!((n(&v, "copied"), n(&v, "bytes")), (41, 0), "{v}");
    let back = t.path().join("back");
    job.sync(&[&b, s(&back)], 0);
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&back)));
    // Above the single-copy limit (lowered here from 5 GiB to 6 MiB), parts are copied
    // server-side with UploadPartCopy.
    let c = second_bucket();
    let o = job
        .cmd(&[&a, &c, "--json", "--include", "big.bin", "--exclude", "*"])
        .env("JFS_SYNC_SINGLE_COPY_MAX", "6291456")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().last().unwrap()).unwrap();
    assert_eq!((n(&v, "copied"), n(&v, "bytes")), (1, 0), "{v}");
    let back2 = t.path().join("back2");
    job.sync(&[&c, s(&back2)], 0);
    assert!(
        std::fs::read(back2.join("big.bin")).unwrap()
            == std::fs::read(src.join("big.bin")).unwrap()
    );
}

/// Any OpenDAL service through `opendal+SERVICE://?option=value` (here the fs service, whose
/// listing is unordered and is walked level by level); option values `env:NAME` come from the
/// environment.
#[test]
fn other_opendal_services_through_the_generic_form() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src, 150, 0);
    let root = t.path().join("via-opendal");
    std::fs::create_dir_all(&root).unwrap();
    let dst = "opendal+fs://?root=env:JFS_TEST_OPENDAL_ROOT".to_string();
    let job = Job::new();
    let run = |args: &[&str]| {
        let mut a = args.to_vec();
        a.push("--json");
        let o = job
            .cmd(&a)
            .env("JFS_TEST_OPENDAL_ROOT", &root)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_str::<Value>(String::from_utf8_lossy(&o.stdout).lines().last().unwrap())
            .unwrap()
    };
    assert_eq!(n(&run(&[s(&src), &dst]), "copied"), 150);
    assert_eq!(
        n(&run(&[s(&src), &dst]), "skipped"),
        150,
        "the walked listing merges in order"
    );
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&root)));
    let o = job.run(&[s(&src), "opendal+fs://?root=env:JFS_TEST_UNSET_VAR"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("JFS_TEST_UNSET_VAR, which is not set"));
}

/// On a terminal (a pseudo-terminal from `script`), the progress is a bar over the entries
/// counted ahead, with a percentage and an ETA, ending at total/total.
#[test]
fn terminal_progress_is_a_bar_with_total_and_eta() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..600u64 {
        std::fs::write(src.join(format!("f{i:04}")), data(i, 50_000)).unwrap();
    }
    let job = Job::new();
    let cmd = format!(
        "{} {}/ {}/ --bwlimit 10M",
        bin("jfs-sync").display(),
        src.display(),
        d.path().join("dst").display()
    );
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env("XDG_CACHE_HOME", job.state.path())
        .output()
        .expect("script (bsdutils)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Frames of the bar, with the total known (600) before the end and an ETA.
    let frames: Vec<&str> = text
        .split(['\r', '\n'])
        .filter(|l| l.contains("/600 ("))
        .collect();
    assert!(frames.len() >= 5, "too few bar frames:\n{text}");
    assert!(
        frames
            .iter()
            .any(|f| f.contains("ETA ") && !f.contains("(100%)")),
        "no ETA mid-run:\n{text}"
    );
    assert!(text.contains("listed 600, copied 600"), "{text}");
    assert_eq!(
        std::fs::read_dir(d.path().join("dst")).unwrap().count(),
        600
    );
}

/// `jfs ARGS` (the admin CLI), which must succeed; its stdout.
fn jfs(args: &[&str]) -> String {
    let o = Command::new(bin("jfs")).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "jfs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A RocksDB volume with file:// blocks under `dir`: its META_URL.
fn rocks_volume(dir: &Path, name: &str) -> String {
    let meta = format!("rocksdb://{}/meta", dir.display());
    jfs(&[
        "format",
        &meta,
        name,
        "--storage",
        &format!("file://{}/blocks", dir.display()),
    ]);
    meta
}

/// Issue 25, item 7: resume state and journal positions are kept per what SRC and DST are,
/// not per the command's text. The same `jfs://SRCVOL/data DIR --from-journal` with SRCVOL
/// pointing at another volume (another uuid, a shorter journal) copies that volume; the same
/// relative DST from another working directory is another destination; a --state-dir that
/// holds another sync's progress is refused, naming both.
#[test]
fn resume_state_belongs_to_what_the_endpoints_are_not_their_spelling() {
    let t = tempfile::tempdir().unwrap();
    let (va, vb) = (t.path().join("va"), t.path().join("vb"));
    std::fs::create_dir_all(&va).unwrap();
    std::fs::create_dir_all(&vb).unwrap();
    let (a, b) = (rocks_volume(&va, "a"), rocks_volume(&vb, "b"));
    let (ta, tb) = (t.path().join("ta"), t.path().join("tb"));
    make_tree(&ta, 60, 0);
    for i in 0..5 {
        std::fs::create_dir_all(tb.join("only-b")).unwrap();
        std::fs::write(tb.join(format!("only-b/f{i}")), data(500 + i, 3000)).unwrap();
    }
    jfs(&["put", &a, s(&ta), "/data"]);
    jfs(&["put", &b, s(&tb), "/data"]);
    let dst = t.path().join("dst");
    let job = Job::new();
    let run = |meta: &str, cwd: &Path, dst: &str, extra: &[&str], code: i32| {
        let mut c = job.cmd(&["jfs://SRCVOL/data", dst, "--from-journal", "--json"]);
        c.args(extra).env("SRCVOL", meta).current_dir(cwd);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{err}");
        let v: Value = serde_json::from_str(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap_or("null"),
        )
        .unwrap();
        (v, err)
    };
    let (v, _) = run(&a, t.path(), s(&dst), &[], 0);
    assert_eq!(n(&v, "copied"), 60, "{v}");
    // SRCVOL now names volume b: its files arrive (it was "listed 0, copied 0" before).
    let (v, err) = run(&b, t.path(), s(&dst), &[], 0);
    assert!(err.contains("full listing this time"), "{err}");
    assert_eq!((n(&v, "listed"), n(&v, "copied")), (5, 5), "{v}");
    for i in 0..5 {
        assert_eq!(
            std::fs::read(dst.join(format!("only-b/f{i}"))).unwrap(),
            data(500 + i, 3000)
        );
    }
    // Back to a: its position is its own (nothing changed there since).
    let (v, _) = run(&a, t.path(), s(&dst), &[], 0);
    assert_eq!(n(&v, "listed"), 0, "{v}");
    // The same relative DST from another working directory is another directory.
    let other = t.path().join("elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    let (v, _) = run(&a, t.path(), "rel-dst", &[], 0);
    assert_eq!(n(&v, "copied"), 60, "{v}");
    let (v, err) = run(&a, &other, "rel-dst", &[], 0);
    assert!(err.contains("full listing this time"), "{err}");
    assert_eq!(n(&v, "copied"), 60, "{v}");
    assert_eq!(
        bytes_only(&tree(&t.path().join("rel-dst"))),
        bytes_only(&tree(&other.join("rel-dst")))
    );
    // A state directory named by hand that holds another sync's progress: refused loudly.
    let sd = t.path().join("state");
    run(&a, t.path(), s(&dst), &["--state-dir", s(&sd)], 0);
    let o = job
        .cmd(&[
            "jfs://SRCVOL/data",
            s(&dst),
            "--from-journal",
            "--state-dir",
            s(&sd),
        ])
        .env("SRCVOL", &b)
        .output()
        .unwrap();
    let e = integration::fails_clearly(&o, "holds the progress of another sync");
    assert!(
        e.contains("another --state-dir") && e.contains("volume uuid"),
        "names both and the way out: {e}"
    );
}

/// Every file under `dir` of a volume, from `jfs ls -R`.
fn volume_names(meta: &str, dir: &str) -> Vec<String> {
    jfs(&["ls", meta, dir, "-R"])
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Issue 25, item 18: a sync into a volume killed with -9 leaves its temporary files; the
/// run that resumes writes over them and renames them into place (the same temporary name at
/// every attempt), and leftovers it finds on its destination (an earlier release's names
/// included) are removed: `check` finds nothing extra and exits 0, and a copy out of the
/// volume carries none of them.
#[test]
fn a_killed_sync_into_a_volume_leaves_no_temporary_files() {
    let t = tempfile::tempdir().unwrap();
    let meta = rocks_volume(t.path(), "k");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("big.bin"), data(1, 24 << 20)).unwrap();
    std::fs::write(src.join("sub/second.bin"), data(2, 16 << 20)).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("sub/s{i:02}")), data(10 + i, 5000)).unwrap();
    }
    // Leftovers as an earlier release's interrupted runs left them.
    let junk = t.path().join("junk");
    std::fs::create_dir_all(junk.join("sub")).unwrap();
    std::fs::write(junk.join(".old.bin.jfs-sync-tmp-9d8247b3"), b"half").unwrap();
    std::fs::write(junk.join("sub/.gone.jfs-sync-tmp"), b"half").unwrap();
    jfs(&["put", &meta, s(&junk), "/k"]);
    let job = Job::new();
    let args = [s(&src), "jfs://V/k", "--bwlimit", "8M", "--threads", "2"];
    let mut child = job
        .cmd(&args)
        .env("VOL", &meta)
        .env("V", &meta)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed while a temporary file of this run is in the volume.
    let t0 = Instant::now();
    loop {
        let names = volume_names(&meta, "/k");
        if names
            .iter()
            .any(|n| n.contains(".big.bin.jfs-sync-tmp") || n.contains(".second.bin.jfs-sync-tmp"))
        {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before a temporary file was seen: make it bigger"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no temporary file: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let o = job.cmd(&args).env("V", &meta).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let names = volume_names(&meta, "/k");
    assert!(
        names.iter().all(|n| !n.contains("jfs-sync-tmp")),
        "temporary files left in the volume: {names:?}"
    );
    let o = job
        .cmd(&["check", s(&src), "jfs://V/k", "--json"])
        .env("V", &meta)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (n(&v, "missing"), n(&v, "differing"), n(&v, "extra")),
        (0, 0, 0),
        "{v}"
    );
    assert_eq!(o.status.code(), Some(0));
    let out = t.path().join("out");
    let o = job
        .cmd(&["jfs://V/k", s(&out)])
        .env("V", &meta)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&out)));
}

/// Issue 25, item 20: names up to the limit (255 bytes) are copied, to a directory and into
/// a volume; the temporary name they are written under fits too.
#[test]
fn the_longest_legal_names_are_copied() {
    let t = tempfile::tempdir().unwrap();
    let meta = rocks_volume(&t.path().join("vol"), "long");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    let names: Vec<String> = [241usize, 242, 250, 255]
        .iter()
        .map(|n| "n".repeat(*n))
        .chain(["é".repeat(127)]) // 254 bytes of two-byte characters
        .collect();
    for (i, name) in names.iter().enumerate() {
        std::fs::write(src.join(name), data(i as u64, 1000 + i)).unwrap();
        // A big one goes through the streamed path (pieces), not the one-call copy.
        std::fs::write(src.join("d").join(name), data(40 + i as u64, 5 << 20)).unwrap();
    }
    let job = Job::new();
    let dst = t.path().join("dst");
    let v = job.sync(&[s(&src), s(&dst)], 0);
    assert_eq!(n(&v, "copied"), 2 * names.len() as u64, "{v}");
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
    let mut c = job.cmd(&[s(&src), "jfs://LV/in", "--json"]);
    let o = c.env("LV", &meta).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Read back by jfs-sync (`jfs get` writes its own temporary names, which do not fit yet).
    let out = t.path().join("out");
    let o = job
        .cmd(&["jfs://LV/in", s(&out)])
        .env("LV", &meta)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(bytes_only(&tree(&src)), bytes_only(&tree(&out)));
}

/// Issue 25, item 21: `check` exits 1 when anything is missing, differs or is extra, as its
/// help says, and 0 only when both sides hold the same objects.
#[test]
fn check_exits_1_for_extra_objects_too() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 10, 0);
    let job = Job::new();
    job.sync(&[s(&src), s(&dst)], 0);
    let check = || {
        let o = job.run(&["check", s(&src), s(&dst)]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(check().0, Some(0), "{}", check().1);
    std::fs::write(dst.join("only-here"), b"x").unwrap();
    let (code, err) = check();
    assert!(err.contains("1 extra"), "{err}");
    assert_eq!(code, Some(1), "{err}");
    let help = String::from_utf8_lossy(&job.run(&["check", "--help"]).stdout).into_owned();
    assert!(help.contains("extra"), "{help}");
}

/// A read-only tmpfs mounted at `dir` (root), unmounted on drop.
struct RoMount(PathBuf);

impl RoMount {
    fn new(dir: &Path) -> RoMount {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", s(dir)])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "mount (this test needs root): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        RoMount(dir.to_path_buf())
    }
}

impl Drop for RoMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

/// Issue 25, item 24: a read-only destination fails each file once (no retries: they could
/// not help), saying why, and the run ends with exit 1.
#[test]
fn a_read_only_destination_is_not_retried() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for i in 0..12 {
        std::fs::create_dir_all(src.join(format!("d{}", i % 3))).unwrap();
        std::fs::write(src.join(format!("d{}/f{i}", i % 3)), data(i, 100)).unwrap();
    }
    std::fs::write(src.join("top"), data(99, 10)).unwrap();
    let dst = t.path().join("ro");
    let _m = RoMount::new(&dst);
    let job = Job::new();
    let o = job.run(&[s(&src), s(&dst), "--retries", "5", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    let failed: Vec<&str> = err.lines().filter(|l| l.contains("failed:")).collect();
    assert_eq!(failed.len(), 13, "one line per file: {err}");
    for l in &failed {
        assert!(
            l.contains("after 1 attempt(s) (a read-only file system: not retried)"),
            "{l}"
        );
    }
    assert!(!err.contains("retrying"), "{err}");
}

/// Issue 25, item 26: `--delete-dst` without `--dirs` removes the directories its deletes
/// emptied (a directory renamed at the source leaves no empty one behind), to a directory and
/// into a volume; directories that still hold anything (an excluded file) stay.
#[test]
fn delete_dst_removes_the_directories_it_emptied() {
    let t = tempfile::tempdir().unwrap();
    let meta = rocks_volume(&t.path().join("vol"), "dirs");
    let src = t.path().join("src");
    for d in ["a/deep", "keep"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    std::fs::write(src.join("a/deep/x"), b"x").unwrap();
    std::fs::write(src.join("a/y"), b"y").unwrap();
    std::fs::write(src.join("keep/z"), b"z").unwrap();
    let dst = t.path().join("dst");
    let job = Job::new();
    job.sync(&[s(&src), s(&dst)], 0);
    let mut c = job.cmd(&[s(&src), "jfs://DV/t"]);
    assert!(c.env("DV", &meta).output().unwrap().status.success());
    // At dst only, under what will be emptied: an excluded file keeps its directory.
    std::fs::write(dst.join("keep/z.log"), b"excluded").unwrap();
    std::fs::rename(src.join("a"), src.join("b")).unwrap();
    std::fs::remove_file(src.join("keep/z")).unwrap();
    let v = job.sync(&[s(&src), s(&dst), "--delete-dst", "--exclude", "*.log"], 0);
    assert_eq!(n(&v, "deleted"), 3, "{v}");
    let mut dirs: Vec<String> = walk_dirs(&dst);
    dirs.sort();
    assert_eq!(
        dirs,
        ["b", "b/deep", "keep"],
        "no emptied directory is left"
    );
    let mut c = job.cmd(&[s(&src), "jfs://DV/t", "--delete-dst"]);
    let o = c.env("DV", &meta).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let names = volume_names(&meta, "/t");
    assert!(
        !names
            .iter()
            .any(|n| n == "a" || n.ends_with("/a") || n == "keep"),
        "emptied directories left in the volume: {names:?}"
    );
}

/// Directories under `root`, relative.
fn walk_dirs(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
                stack.push(p);
            }
        }
    }
    out
}

/// Issue 25, item 26: two runs of the same sync at once (one state directory) are refused
/// with what to do, not RocksDB's LOCK error.
#[test]
fn a_state_directory_in_use_is_refused_with_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big"), data(3, 8 << 20)).unwrap();
    let (dst, sd) = (t.path().join("dst"), t.path().join("state"));
    let job = Job::new();
    let args = [s(&src), s(&dst), "--bwlimit", "1M", "--state-dir", s(&sd)];
    let mut first = job
        .cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sd.join("LOCK").exists() || !sd.join("CURRENT").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the first run never opened its state"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = job.run(&args);
    let _ = first.kill();
    let _ = first.wait();
    let e = integration::fails_clearly(&o, "is in use by another jfs-sync");
    assert!(e.contains("--state-dir"), "{e}");
    assert!(!e.contains("LOCK"), "{e}");
}

/// Issue 25, item 26: a sync into a volume whose primary moved (a fenced old primary) is told
/// the META_URL to use now, not only the new primary agent's address.
#[test]
fn a_sync_into_a_moved_volume_names_the_meta_url_to_use() {
    let t = tempfile::tempdir().unwrap();
    let meta = rocks_volume(t.path(), "moved");
    let new_meta = "redis://10.9.8.7:6379/3?prefix=vol";
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let e = meta::open(&meta, &meta::OpenOptions::default())
            .await
            .unwrap();
        fs_core::site::set_moved(
            &*e,
            Some(&fs_core::site::Moved {
                version: 1,
                meta_url: new_meta.into(),
                epoch: 1,
                at_seq: 1,
                at_ns: 0,
            }),
        )
        .await
        .unwrap();
        fs_core::site::set_marker(
            &*e,
            &fs_core::site::MirrorMarker {
                version: fs_core::site::MARKER_VERSION,
                name: "region-a".into(),
                primary: "b.internal:9566".into(),
                store: format!("file://{}/blocks", t.path().display()),
                origin_store: None,
                since_ns: 0,
            },
        )
        .await
        .unwrap();
    });
    drop(rt);
    let src = t.path().join("src");
    make_tree(&src, 3, 0);
    let job = Job::new();
    let o = job
        .cmd(&[s(&src), "jfs://MV/x"])
        .env("MV", &meta)
        .output()
        .unwrap();
    let e = integration::fails_clearly(&o, new_meta);
    assert!(e.contains("MV"), "says which variable to change: {e}");
}

/// Issue 25, item 26: each subcommand's help lists only the flags it takes.
#[test]
fn job_status_help_lists_only_its_own_flags() {
    let job = Job::new();
    let help = String::from_utf8_lossy(&job.run(&["job", "status", "--help"]).stdout).into_owned();
    assert!(help.contains("--json"), "{help}");
    for flag in ["--endpoint", "--threads", "--transfers", "--log-file"] {
        assert!(
            !help.contains(flag),
            "job status --help lists {flag}: {help}"
        );
    }
    for sub in ["pause", "resume", "cancel", "delete"] {
        let help = String::from_utf8_lossy(&job.run(&["job", sub, "--help"]).stdout).into_owned();
        assert!(
            !help.contains("--threads") && !help.contains("--json"),
            "{sub}: {help}"
        );
    }
    let o = job.run(&["job", "status", "redis://127.0.0.1:1/0#x", "--threads", "4"]);
    assert_eq!(o.status.code(), Some(2));
    // The sync and check still take theirs.
    let help = String::from_utf8_lossy(&job.run(&["--help"]).stdout).into_owned();
    assert!(
        help.contains("--threads") && help.contains("--endpoint"),
        "{help}"
    );
    let help = String::from_utf8_lossy(&job.run(&["check", "--help"]).stdout).into_owned();
    assert!(
        help.contains("--threads") && help.contains("--json"),
        "{help}"
    );
}

/// A run that found nothing to copy, update or delete.
fn nothing_left(v: &Value) {
    assert_eq!(
        n(v, "copied") + n(v, "updated") + n(v, "deleted"),
        0,
        "a run after it has nothing left to do: {v}"
    );
}

/// The keys whose bytes differ between two trees, or that one of them lacks.
fn differing(a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let mut out: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    out.dedup();
    out
}

/// `jfs ARGS`, which must succeed.
fn jfs_ok(args: &[&str]) {
    let o = Command::new(bin("jfs")).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "jfs {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A RocksDB volume under `dir` (blocks in `dir/blocks`) holding `make_tree(files)` at
/// /data, put from `dir/src`: its META_URL and that local tree.
fn volume_with_tree(dir: &Path, files: usize) -> (String, std::path::PathBuf) {
    let meta = format!("rocksdb://{}/meta", dir.display());
    jfs_ok(&[
        "format",
        &meta,
        "v",
        "--storage",
        &format!("file://{}/blocks", dir.display()),
    ]);
    let src = dir.join("src");
    make_tree(&src, files, 0);
    jfs_ok(&["put", &meta, s(&src), "/data"]);
    (meta, src)
}

/// Start `args` and SIGTERM it once it has saved some progress (after `ms`); it must exit 2
/// ("progress saved").
fn interrupt(job: &Job, args: &[&str], env: &[(&str, &str)], ms: u64) {
    let mut c = job.cmd(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(ms));
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("progress saved"), "{err}");
}

/// A resumed run does not take what came before its resume point as settled: the source
/// changed there after the interrupted attempt (a file rewritten, one removed, one renamed),
/// and the same command run again gives a destination equal to the source, with the second
/// pass over that part reported (`rechecked`). Before, it exited 0 with the old bytes, the
/// removed file and without the renamed one.
#[test]
fn a_resumed_run_settles_changes_made_before_its_resume_point() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&src, 400, 0);
    let job = Job::new();
    let args = [
        s(&src),
        s(&dst),
        "--delete-dst",
        "--tps",
        "200",
        "--threads",
        "4",
    ];
    interrupt(&job, &args, &[], 700);
    let done = tree(&dst);
    // The first keys in order are settled before any cursor is saved.
    let first: Vec<String> = tree(&src).into_keys().take(3).collect();
    assert!(first.iter().all(|k| done.contains_key(k)), "{first:?}");
    std::fs::write(src.join(&first[0]), b"rewritten after the interruption").unwrap();
    std::fs::remove_file(src.join(&first[1])).unwrap();
    std::fs::rename(src.join(&first[2]), src.join("d0/renamed.dat")).unwrap();
    let v = job.sync(&args, 0);
    let (want, got) = (bytes_only(&tree(&src)), bytes_only(&tree(&dst)));
    let differ = differing(&want, &got);
    assert!(
        differ.is_empty(),
        "the destination differs at {differ:?}: {v}"
    );
    let r = &v["rechecked"];
    assert!(r.is_object(), "{v}");
    assert!(n(r, "copied") + n(r, "updated") >= 1, "{v}");
    assert!(n(r, "deleted") >= 1, "{v}");
    // And a run after it has nothing to do.
    let v = job.sync(&args, 0);
    nothing_left(&v);
}

/// `--from-journal` resumed after an interruption settles every key the journal names since
/// the last finished run, wherever the interrupted attempt stopped: changes made between the
/// two attempts to keys that sort before its resume point reach the destination, and the
/// runs after it (which read only the journal after the recorded position) find nothing
/// left. Before, those keys were skipped and the position recorded past them: lost for good.
#[test]
fn from_journal_resumed_after_an_interruption_loses_no_change() {
    let t = tempfile::tempdir().unwrap();
    let (meta, _) = volume_with_tree(t.path(), 10);
    let dst = t.path().join("dst");
    let job = Job::new();
    let args = [
        "jfs://VOL/data",
        s(&dst),
        "--from-journal",
        "--delete-dst",
        "--tps",
        "200",
        "--threads",
        "4",
    ];
    let env = [("VOL", meta.as_str())];
    let run = |code| {
        let mut c = job.cmd(&args);
        c.arg("--json").env("VOL", &meta);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{err}");
        serde_json::from_str::<Value>(String::from_utf8_lossy(&o.stdout).lines().last().unwrap())
            .unwrap()
    };
    // A first run records the journal position; then 400 more files arrive.
    run(0);
    let more = t.path().join("more");
    make_tree(&more, 400, 0);
    jfs_ok(&["put", &meta, s(&more), "/data/a-more"]);
    interrupt(&job, &args, &env, 700);
    let out = t.path().join("out");
    // Keys early in order, changed between the attempts.
    std::fs::write(t.path().join("x"), b"rewritten between the attempts").unwrap();
    jfs_ok(&[
        "put",
        &meta,
        s(&t.path().join("x")),
        "/data/a-more/d0/sub0/f00000.dat",
    ]);
    jfs_ok(&[
        "mv",
        &meta,
        "/data/a-more/d1/sub1/f00001.dat",
        "/data/a-more/d1/moved.dat",
    ]);
    jfs_ok(&["rm", &meta, "/data/a-more/d2/sub2/f00002.dat"]);
    run(0);
    jfs_ok(&["get", &meta, "/data", s(&out)]);
    let (want, got) = (bytes_only(&tree(&out)), bytes_only(&tree(&dst)));
    assert!(want.len() > 400, "{}", want.len());
    let differ = differing(&want, &got);
    assert!(
        differ.is_empty(),
        "the destination differs from the volume at {differ:?}"
    );
    let v = run(0);
    nothing_left(&v);
}

/// `--delete-dst` from a source that lists nothing (a mistyped, emptied or unmounted one)
/// deletes nothing unless `--max-delete 100%` says so; a delete the destination refuses is a
/// failure named by its key (exit 1), not an internal error.
#[test]
fn delete_dst_from_an_empty_source_and_a_refused_delete() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    make_tree(&dst, 20, 0);
    std::fs::create_dir_all(&src).unwrap();
    let job = Job::new();
    let o = job.run(&[s(&src), s(&dst), "--delete-dst"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("the source listed nothing"), "{err}");
    assert_eq!(tree(&dst).len(), 20, "nothing was deleted");
    let v = job.sync(
        &[s(&src), s(&dst), "--delete-dst", "--max-delete", "100%"],
        0,
    );
    assert_eq!(n(&v, "deleted"), 20, "{v}");
    assert!(tree(&dst).is_empty());

    // A destination directory that refuses deletes (read-only).
    make_tree(&dst, 10, 0);
    std::fs::write(src.join("keep"), b"k").unwrap();
    let ro = integration::mountproc::ReadOnlyBind::over(&dst.join("d1"));
    let o = job.run(&[s(&src), s(&dst), "--delete-dst", "--max-delete", "100%"]);
    drop(ro);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("internal error"), "{err}");
    assert!(
        err.lines().any(|l| l.contains("failed: deleting d1/")),
        "{err}"
    );
}

/// `--from-journal` copies a file the journal says was rewritten even when the new content
/// has the size and modification time of the old (a `jfs put` keeps the local file's mtime):
/// before, the destination kept the old bytes for good.
#[test]
fn from_journal_copies_a_rewrite_of_the_same_size_and_time() {
    let t = tempfile::tempdir().unwrap();
    let (meta, src) = volume_with_tree(t.path(), 10);
    let dst = t.path().join("dst");
    let job = Job::new();
    let run = || {
        let mut c = job.cmd(&["jfs://VOL/data", s(&dst), "--from-journal", "--json"]);
        c.env("VOL", &meta);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{err}");
        serde_json::from_str::<Value>(String::from_utf8_lossy(&o.stdout).lines().last().unwrap())
            .unwrap()
    };
    run();
    // Same length, other bytes, the same mtime as the original.
    let key = "d3/sub0/f00003.dat";
    let old = std::fs::read(src.join(key)).unwrap();
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    let f = t.path().join("new");
    std::fs::write(&f, &new).unwrap();
    let mtime = std::fs::metadata(src.join(key))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    jfs_ok(&["put", &meta, s(&f), &format!("/data/{key}")]);
    let v = run();
    assert_eq!(n(&v, "updated"), 1, "{v}");
    assert_eq!(std::fs::read(dst.join(key)).unwrap(), new);
    let v = run();
    assert_eq!(n(&v, "copied") + n(&v, "updated"), 0, "{v}");
}

/// `--delete-dst` from a source that is one file (a volume's file, a local file) is refused
/// before anything is touched: exit 2, the message says what and what to do, all 52
/// destination files stay, and a missing destination is not made. Before, a volume file
/// listed as an empty tree and `--max-delete 100%` let every destination file go.
#[test]
fn delete_dst_from_a_one_file_source_is_refused_and_touches_nothing() {
    let t = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", t.path().display());
    let jfs = |args: &[&str]| {
        let o = Command::new(bin("jfs")).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "jfs {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    jfs(&[
        "format",
        &meta,
        "v",
        "--storage",
        &format!("file://{}/blocks", t.path().display()),
    ]);
    let one = t.path().join("one");
    std::fs::write(&one, b"one file").unwrap();
    jfs(&["put", &meta, s(&one), "/one"]);
    let dst = t.path().join("dst");
    make_tree(&dst, 52, 0);
    let before = tree(&dst);
    assert_eq!(before.len(), 52);
    let job = Job::new();
    for (src, extra) in [
        ("jfs://VOL/one", &["--max-delete", "100%"][..]),
        ("jfs://VOL/one", &[][..]),
        (s(&one), &[][..]),
    ] {
        for to in [s(&dst), s(&t.path().join("new"))] {
            let mut c = job.cmd(&[src, to, "--delete-dst"]);
            c.args(extra).env("VOL", &meta);
            let o = c.output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{src} {extra:?}: {err}");
            assert!(
                err.contains("--delete-dst with a source that is one file")
                    && err.contains("Name the source's directory instead"),
                "{err}"
            );
        }
    }
    assert_eq!(tree(&dst), before);
    assert!(!t.path().join("new").exists());
}
