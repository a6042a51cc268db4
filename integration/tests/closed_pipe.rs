//! Every command of the three binaries ends quietly on a closed pipe (`jfs status | head -1`):
//! exit code 0, nothing on stderr, no panic. The pipe's reader is closed before the command
//! starts, so every write to stdout fails, whatever the timing. A closed stderr (`2>&1 |
//! head -1` once `head` is done) ends no work at all: copies finish, agents keep replicating.

use integration::{bin, data, meta_url, store_url, unique};
use std::process::{Command, Stdio};

/// Run `name args` with stdout a pipe nobody reads (its read end closed already).
fn into_closed_pipe(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    let mut c = Command::new(bin(name));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(w)
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A RocksDB volume with its blocks in a directory: its META_URL (and what keeps it).
fn formatted(tag: &str) -> (String, Vec<tempfile::TempDir>) {
    let (meta, d1) = meta_url("rocksdb");
    let (store, d2) = store_url("file");
    let o = Command::new(bin("jfs"))
        .args(["format", &meta, &unique(tag), "--storage", &store])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (meta, d1.into_iter().chain(d2).collect())
}

fn check(name: &str, args: &[&str], env: &[(&str, &str)]) {
    let (code, err) = into_closed_pipe(name, args, env);
    assert_eq!(code, Some(0), "{name} {args:?} on a closed pipe: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("error"),
        "{name} {args:?} on a closed pipe printed: {err}"
    );
}

#[test]
fn jfs_commands_end_quietly_on_a_closed_pipe() {
    let (meta, _keep) = formatted("cp");
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big");
    std::fs::write(&big, data(1, 3 << 20)).unwrap();
    for i in 0..50 {
        std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
    }
    let o = Command::new(bin("jfs"))
        .args(["put", &meta, dir.path().to_str().unwrap(), "/t"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for args in [
        vec!["status", &meta],
        vec!["status", &meta, "--json"],
        vec!["ls", "-R", "-l", &meta, "/"],
        vec!["stat", &meta, "/t/big"],
        vec!["cat", &meta, "/t/big"],
        vec!["dump", &meta],
        vec!["journal", &meta],
        vec!["journal", &meta, "--json"],
        vec!["fsck", &meta],
        vec!["fsck", &meta, "--json"],
        vec!["gc", &meta],
        vec!["cutover", "status", &meta],
        vec!["--help"],
        vec!["ls", "--help"],
    ] {
        check("jfs", &args, &[]);
    }
}

#[test]
fn jfs_sync_and_mirror_agent_commands_end_quietly_on_a_closed_pipe() {
    let (meta, _keep) = formatted("cp");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..300 {
        std::fs::write(src.join(format!("f{i}")), data(i, 100)).unwrap();
    }
    let (s, dst, other) = (
        src.to_str().unwrap().to_string(),
        dir.path().join("dst").display().to_string(),
        dir.path().join("other").display().to_string(),
    );
    std::fs::create_dir(&other).unwrap();
    let state = dir.path().join("state").display().to_string();
    for args in [
        vec![s.as_str(), dst.as_str(), "--state-dir", state.as_str()],
        vec![s.as_str(), other.as_str(), "--dry-run", "--json"],
        vec!["check", s.as_str(), other.as_str()],
        vec!["check", s.as_str(), other.as_str(), "--json"],
        vec!["--help"],
    ] {
        let (code, err) = into_closed_pipe("jfs-sync", &args, &[]);
        // check finds differences (exit 1) unless the closed pipe cut it short (0).
        let ok = if args[0] == "check" { [0, 1] } else { [0, 0] };
        assert!(
            code.is_some_and(|c| ok.contains(&c)),
            "jfs-sync {args:?} on a closed pipe: {code:?} {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "jfs-sync {args:?} on a closed pipe printed: {err}"
        );
    }
    for args in [
        vec!["slot", "list", "--meta", meta.as_str()],
        vec!["slot", "list", "--meta", meta.as_str(), "--json"],
        vec!["--help"],
        vec!["slot", "--help"],
    ] {
        check("mirror-agent", &args, &[]);
    }
}

/// Run `name args` with stderr a pipe nobody reads and stdout discarded: its exit code.
fn with_closed_stderr(name: &str, args: &[&str]) -> Option<i32> {
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    Command::new(bin(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(w)
        .status()
        .unwrap()
        .code()
}

fn same_tree(a: &std::path::Path, b: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        let other = b.join(e.file_name());
        assert_eq!(
            std::fs::read(e.path()).unwrap(),
            std::fs::read(&other).unwrap_or_else(|err| panic!("{}: {err}", other.display())),
            "{}",
            other.display()
        );
        n += 1;
    }
    n
}

/// Issue 25: `jfs put`, `jfs get` and `jfs-sync` whose stderr reader went away copy every
/// file and exit with their real code (0, or the failure's), never 101 ("failed printing to
/// stderr").
#[test]
fn a_closed_stderr_ends_no_copy() {
    let (meta, _keep) = formatted("cs");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..40u64 {
        std::fs::write(src.join(format!("f{i}")), data(i, 1000 + i as usize * 5000)).unwrap();
    }
    let s = src.to_str().unwrap();
    assert_eq!(with_closed_stderr("jfs", &["put", &meta, s, "/t"]), Some(0));
    let got = dir.path().join("got");
    let g = got.to_str().unwrap();
    assert_eq!(with_closed_stderr("jfs", &["get", &meta, "/t", g]), Some(0));
    assert_eq!(same_tree(&src, &got), 40);
    // A failure says so by its exit code alone.
    let code = with_closed_stderr("jfs", &["get", &meta, "/missing", g]);
    assert!(code.is_some_and(|c| c != 0 && c != 101), "{code:?}");
    let dst = dir.path().join("dst");
    let state = dir.path().join("state");
    assert_eq!(
        with_closed_stderr(
            "jfs-sync",
            &[
                s,
                dst.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap()
            ]
        ),
        Some(0)
    );
    assert_eq!(same_tree(&src, &dst), 40);
}

/// Issue 25: agents whose log reader went away (stdout and stderr a closed pipe) keep
/// replicating: files written after both restarted that way arrive at the mirror byte for
/// byte, and both still stop cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_with_a_closed_log_pipe_keep_replicating() {
    use integration::mirror::*;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let vol = integration::volume_with("rocksdb", "file", |_| {}).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    assert_eq!(pair.mirror.term(), 0);
    assert_eq!(pair.primary.term(), 0);
    for a in [&mut pair.primary, &mut pair.mirror] {
        a.closed_output = true;
        a.restart();
    }
    write_files(&vol.fs, "f", 30, 300_000).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(120)).await;
    for a in [&mut pair.primary, &mut pair.mirror] {
        let st = a.child.as_mut().unwrap().try_wait().unwrap();
        assert!(
            st.is_none(),
            "an agent with a closed log pipe ended: {st:?}"
        );
    }
    assert_eq!(assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await, 30);
    assert_eq!(pair.mirror.term(), 0);
    assert_eq!(pair.primary.term(), 0);
}
