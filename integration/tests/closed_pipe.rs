//! Every command of the three binaries ends quietly on a closed pipe (`jfs status | head -1`):
//! exit code 0, nothing on stderr, no panic. The pipe's reader is closed before the command
//! starts, so every write to stdout fails, whatever the timing.

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
    let (meta, _d1) = meta_url("rocksdb");
    let (store, _d2) = store_url("file");
    let o = Command::new(bin("jfs"))
        .args(["format", &meta, &unique("cp"), "--storage", &store])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    let (meta, _d1) = meta_url("rocksdb");
    let (store, _d2) = store_url("file");
    let o = Command::new(bin("jfs"))
        .args(["format", &meta, &unique("cp"), "--storage", &store])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
