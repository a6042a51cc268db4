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
