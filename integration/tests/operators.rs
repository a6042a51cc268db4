//! The operator's commands as processes (issue 43, items 16 to 19 and 21): what `format` and a
//! mount check of the metadata disk and leave behind when they fail, what `fsck` says of a
//! broken block and how `--repair-from` mends it (runbooks/repair-damaged-block.md, run as
//! written), `jfs-sync check --download` past an unreadable file, `jfs load` beside a live
//! mount, and the messages of a user who may not write the metadata and of a Redis that needs
//! a password.
//!
//! Small disks are tmpfs mounted (and unmounted on every way out) by the test, as root.

use integration::disk::SmallDisk;
use integration::{bin, data, fails_clearly, runbook, unique};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn jfs_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin("jfs"));
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running jfs")
}

fn jfs(args: &[&str]) -> Output {
    jfs_env(args, &[])
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(args: &[&str]) -> String {
    let o = jfs(args);
    assert!(o.status.success(), "jfs {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Format volume `name` in `meta` with blocks in `store` (a path).
fn format(meta: &str, store: &Path) -> Output {
    jfs(&[
        "format",
        meta,
        &unique("op"),
        "--storage",
        &format!("file://{}", store.display()),
    ])
}

/// A disk too small for what RocksDB preallocates when a writer opens (its 64 MiB log and
/// 4 MiB manifest) plus the 64 MiB kept free: `format` refuses it, naming the disk, what is
/// free and what is needed, and leaves nothing there (before: a 72 MiB disk formatted and
/// mounted, then every write failed; a 40 MiB one left a RocksDB directory behind). A mount
/// of metadata whose disk filled up since is refused the same way; with room, writes work.
#[test]
fn a_metadata_disk_without_room_for_rocksdb_is_refused_at_format_and_mount() {
    let d = tempfile::tempdir().unwrap();
    let need = meta::WRITER_NEED >> 20;
    for mib in [40u64, 72] {
        let disk = SmallDisk::new(&d.path().join(format!("small{mib}")), mib);
        let meta = format!("rocksdb://{}", disk.0.join("meta/db").display());
        let o = format(&meta, &disk.0.join("blocks"));
        let err = fails_clearly(&o, "metadata disk too small");
        assert!(
            err.contains(&format!("{}", disk.0.join("meta/db").display()))
                && err.contains(&format!("mounted at {}", disk.0.display()))
                && err.contains(" MiB free")
                && err.contains(&format!("needs {need} MiB")),
            "{mib} MiB: {err}"
        );
        assert_eq!(
            disk.entries(),
            Vec::<String>::new(),
            "{mib} MiB: a failed format left these behind"
        );
    }
    // A pre-existing directory is kept (only what format made goes).
    let disk = SmallDisk::new(&d.path().join("small-kept"), 40);
    std::fs::create_dir(disk.0.join("mine")).unwrap();
    let meta = format!("rocksdb://{}", disk.0.join("mine/db").display());
    fails_clearly(
        &format(&meta, &disk.0.join("mine/blocks")),
        "metadata disk too small",
    );
    assert_eq!(disk.entries(), vec!["mine".to_string()]);
    assert_eq!(std::fs::read_dir(disk.0.join("mine")).unwrap().count(), 0);

    // Room at format, not at the mount's start: the mount is refused with the same words.
    let disk = SmallDisk::new(&d.path().join("fills"), need + 80);
    let meta = format!("rocksdb://{}", disk.0.join("meta").display());
    let store = d.path().join("store");
    let o = format(&meta, &store);
    assert!(o.status.success(), "{}", text(&o));
    let filler = disk.0.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 1 << 20];
        while disk.free_mib() > need - 30 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let mp = d.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mut child = Command::new(bin("jfs"))
        .args(["mount", &meta, s(&mp), "--cache-size", "0"])
        .env("JFS_RUN_DIR", d.path().join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(status) = status else {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let _ = Command::new("umount").arg("-l").arg(&mp).status();
        panic!(
            "jfs mount came up on a metadata disk with {} MiB free (it needs {need} MiB): its writes would fail",
            disk.free_mib()
        );
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("metadata disk too small") && err.contains(&format!("needs {need} MiB")),
        "{err}"
    );
    // With the room back, writers work.
    std::fs::remove_file(&filler).unwrap();
    ok(&["mkdir", &meta, "/ok"]);
    let local = d.path().join("f");
    std::fs::write(&local, data(3, 300_000)).unwrap();
    ok(&["put", &meta, s(&local), "/ok/f"]);
    let o = jfs(&["cat", &meta, "/ok/f"]);
    assert!(o.stdout == data(3, 300_000), "{}", text(&o));
}

/// The block key of the one-block file `path` (its first block).
fn first_block(meta: &str, path: &str) -> String {
    let st: serde_json::Value = serde_json::from_str(&ok(&["stat", meta, path])).unwrap();
    let ino = st["ino"].as_u64().unwrap();
    let d: serde_json::Value = serde_json::from_str(&ok(&["dump", meta])).unwrap();
    let name = d["setting"]["name"].as_str().unwrap().to_string();
    let bs = d["setting"]["block_size"].as_u64().unwrap() as u32;
    let rec = &d["inodes"][ino.to_string()]["chunks"]["0"][0];
    let (id, size) = (
        rec["id"].as_u64().unwrap(),
        rec["size"].as_u64().unwrap() as u32,
    );
    fs_core::keys::block_key(&name, id, 0, fs_core::keys::block_len(size, bs, 0))
}

/// Copy a directory tree as it is (a second store holding the same blocks).
fn copy_tree(from: &Path, to: &Path) {
    let o = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp -a: {o:?}");
}

/// A damaged block (one bit flipped) is named once per line, as damaged, with what is
/// wrong (before: the key twice, the problem as a raw error); a short one says its length
/// and a removed one "missing". `fsck --deep --repair-from` mends a damaged block from a
/// store holding a good copy, checked against the recorded CRC32C (runbooks/
/// repair-damaged-block.md, run as written: the bytes come back), and refuses a copy that is
/// damaged too, naming it and changing nothing.
#[test]
fn fsck_names_each_broken_block_once_and_repairs_from_a_good_copy() {
    let d = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", d.path().display());
    let store = d.path().join("store");
    assert!(format(&meta, &store).status.success());
    let f1 = d.path().join("f1");
    std::fs::write(&f1, data(11, 700_000)).unwrap();
    ok(&["put", &meta, s(&f1), "/a"]);
    ok(&["put", &meta, s(&f1), "/b"]);
    ok(&["put", &meta, s(&f1), "/c"]);
    let good = d.path().join("good");
    copy_tree(&store, &good);
    let (ka, kb, kc) = (
        first_block(&meta, "/a"),
        first_block(&meta, "/b"),
        first_block(&meta, "/c"),
    );
    let store_url = format!("file://{}", store.display());
    integration::mountproc::flip_bit(&store_url, &ka, 1000);
    let bad = d.path().join("bad");
    copy_tree(&store, &bad); // its copy of /a's block is damaged too

    // Found, each once, in words.
    let env = [
        ("META_URL", meta.as_str()),
        ("GOOD_STORE", &*format!("file://{}", bad.display())),
    ];
    let out = runbook::run_checked("repair-damaged-block", "find", &env);
    let line = out
        .lines()
        .find(|l| l.starts_with("BROKEN /a:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(line.matches(&ka).count(), 1, "{line}");
    assert!(!line.contains("corrupt"), "{line}");

    // A copy that is damaged too is refused and named; nothing changes.
    let before = std::fs::read(store.join(&ka)).unwrap();
    let o = jfs(&["fsck", "--deep", &meta, "--repair-from", env[1].1]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "BROKEN /a: block {ka} damaged: fails its checksum"
        )) && out.contains(&format!(
            "not repaired: the copy in file://{} is refused, damaged: fails its checksum",
            bad.display()
        )) && out.contains("1 broken, 0 repaired"),
        "{out}"
    );
    assert_eq!(std::fs::read(store.join(&ka)).unwrap(), before);

    // From the good copy: repaired, and the bytes come back.
    let good_url = format!("file://{}", good.display());
    let env = [
        ("META_URL", meta.as_str()),
        ("GOOD_STORE", good_url.as_str()),
    ];
    runbook::run_checked("repair-damaged-block", "repair", &env);
    runbook::run_checked("repair-damaged-block", "check", &env);
    assert!(jfs(&["cat", &meta, "/a"]).stdout == data(11, 700_000));

    // A short block and a removed one, shallow and deep.
    let kb_path = store.join(&kb);
    let b = std::fs::read(&kb_path).unwrap();
    std::fs::write(&kb_path, &b[..b.len() - 10]).unwrap();
    std::fs::remove_file(store.join(&kc)).unwrap();
    for deep in [false, true] {
        let mut args = vec!["fsck", &meta];
        if deep {
            args.push("--deep");
        }
        let o = jfs(&args);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!(
                "BROKEN /b: block {kb} damaged: it has {} bytes, its key says {}",
                b.len() - 10,
                b.len()
            )) && out.contains(&format!("BROKEN /c: block {kc} missing")),
            "deep {deep}: {out}"
        );
    }
    // Both mended from the good copy (the block the good store lacks would be named).
    let o = jfs(&["fsck", "--deep", &meta, "--repair-from", &good_url]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("2 broken, 2 repaired"), "{}", text(&o));
    for f in ["/a", "/b", "/c"] {
        assert!(jfs(&["cat", &meta, f]).stdout == data(11, 700_000), "{f}");
    }
}

/// `jfs-sync check --download` of a volume with an unreadable file (a damaged block) lists
/// it as unreadable, naming it and why, and checks the other files (before: it stopped at
/// the first unreadable block with exit 2, naming no file); exit 1 with the count.
#[test]
fn check_download_lists_an_unreadable_file_and_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", d.path().display());
    let store = d.path().join("store");
    assert!(format(&meta, &store).status.success());
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for (i, n) in ["a", "b", "c"].iter().enumerate() {
        std::fs::write(src.join(n), data(i as u64, 300_000)).unwrap();
    }
    ok(&["put", &meta, s(&src), "/t"]);
    integration::mountproc::flip_bit(
        &format!("file://{}", store.display()),
        &first_block(&meta, "/t/b"),
        77,
    );
    let o = Command::new(bin("jfs-sync"))
        .args(["check", "--download", "jfs://VOL/t", s(&src)])
        .env("VOL", &meta)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("jfs-sync check: b: unreadable, reading the source")
            && err.contains("fails its checksum")
            && err.contains("2 same, 0 missing, 0 differing, 0 extra, 1 unreadable"),
        "{err}"
    );
}

/// `jfs load` of a dump whose volume is mounted is refused, naming the live mount and what to
/// do (before: it took the store over silently, and the mount's writes were refused from its
/// next start); `--block-store` loads onto a copy of the blocks, leaving the source alone;
/// once the mount is stopped the load goes ahead.
#[test]
fn a_load_beside_a_live_mount_is_refused_unless_another_store_or_take_over() {
    let d = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", d.path().display());
    let store = d.path().join("store");
    assert!(format(&meta, &store).status.success());
    let f = d.path().join("f");
    std::fs::write(&f, data(5, 200_000)).unwrap();
    ok(&["put", &meta, s(&f), "/f"]);
    let m = integration::mountproc::Mount::start(&meta, d.path(), "mnt", &["--cache-size", "0"]);
    let dump = d.path().join("dump.json");
    ok(&["dump", &meta, s(&dump)]);
    let name = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&dump).unwrap())
        .unwrap()["setting"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let owner_record = store.join(&name).join("jfs_volume");
    let owner = std::fs::read(&owner_record).unwrap();

    let target = format!("rocksdb://{}/copy", d.path().display());
    let err = fails_clearly(&jfs(&["load", &target, s(&dump)]), "live mount session");
    assert!(
        err.contains(&format!("pid {}", m.pid()))
            && err.contains("--take-over")
            && err.contains("--block-store"),
        "{err}"
    );
    assert!(
        !d.path().join("copy").exists(),
        "the refused load left its metadata directory"
    );
    // The mount still writes: its store was not taken over.
    std::fs::write(m.mp.join("after"), b"still mine").unwrap();
    assert_eq!(std::fs::read(m.mp.join("after")).unwrap(), b"still mine");
    assert_eq!(
        owner,
        std::fs::read(&owner_record).unwrap(),
        "the store's owner record changed"
    );

    // Onto a copy of the blocks: loaded, readable, the source left alone.
    let copy = d.path().join("copy-store");
    copy_tree(&store, &copy);
    let target2 = format!("rocksdb://{}/copy2", d.path().display());
    let copy_url = format!("file://{}", copy.display());
    let o = jfs(&["--block-store", &copy_url, "load", &target2, s(&dump)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(jfs(&["cat", &target2, "/f"]).stdout == data(5, 200_000));
    let st = ok(&["status", &target2]);
    assert!(st.contains(&copy_url), "{st}");
    std::fs::write(m.mp.join("after2"), b"still").unwrap();
    m.stop();
    ok(&["put", &meta, s(&f), "/after3"]);

    // No live mount: the load takes the store over.
    let target3 = format!("rocksdb://{}/copy3", d.path().display());
    ok(&["load", &target3, s(&dump)]);
    assert!(jfs(&["cat", &target3, "/f"]).stdout == data(5, 200_000));
    fails_clearly(&jfs(&["put", &meta, s(&f), "/x"]), "held by other metadata");
}

/// Another user's write to a volume whose metadata directory they can read but not write
/// says who may write it and how (before: RocksDB's raw "IO error: While open a file for
/// appending: .../LOG: Permission denied").
#[test]
fn a_user_who_may_not_write_the_metadata_is_told_who_may() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let meta_dir = d.path().join("meta");
    let meta = format!("rocksdb://{}", meta_dir.display());
    let store = d.path().join("store");
    assert!(format(&meta, &store).status.success());
    let f = d.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    ok(&["put", &meta, s(&f), "/f"]);
    // Opened up by hand (or made by a jfs before the directory was owner-only).
    let o = Command::new("chmod")
        .args(["-R", "go+rX", s(&meta_dir)])
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin("jfs"))
        .args(["rm", &meta, "/f"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = fails_clearly(&o, "only the owner of a volume's metadata (uid 0");
    assert!(
        err.contains("uid 65534 may not")
            && err.contains("run this as that user or root")
            && !err.contains("While open"),
        "{err}"
    );
    assert!(ok(&["ls", &meta, "/"]).contains('f'), "the file is gone");
}

/// A Redis that wants a password, reached without one, says so and how to give one
/// (before: "refused to switch database" for a database other than 0).
#[test]
fn a_redis_that_needs_a_password_says_so() {
    let d = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            "a-long-test-password-8d3f",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            s(d.path()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting redis-server");
    struct Stop<'a>(&'a mut std::process::Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _stop = Stop(&mut redis);
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "redis did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for db in [1, 0] {
        let url = format!("redis://127.0.0.1:{port}/{db}");
        let mut c = Command::new(bin("jfs"));
        c.args(["status", &url])
            .env_remove("JFS_META_PASSWORD")
            .stdin(Stdio::null());
        let o = c.output().unwrap();
        let err = fails_clearly(&o, "this Redis needs a password and none was given");
        assert!(
            err.contains("JFS_META_PASSWORD")
                && err.contains("?password_env=")
                && !err.contains("refused to switch database"),
            "db {db}: {err}"
        );
    }
}

/// A dump edited to hold names no file could have (an absolute path, `..`, an empty name)
/// or a namespace that is no tree (a directory inside itself, one entered twice, an entry
/// pointing at the root) is refused by `jfs load` before anything is written, naming what is
/// wrong (before: each loaded with exit 0, and `jfs get` of the volume then wrote outside its
/// LOCAL, `ls -R` overflowed its stack).
#[test]
fn a_dump_whose_names_or_tree_no_file_system_could_hold_is_refused_at_load() {
    use serde_json::{json, Value};
    let d = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/meta", d.path().display());
    let store = d.path().join("store");
    assert!(format(&meta, &store).status.success());
    ok(&["mkdir", &meta, "/x"]);
    ok(&["mkdir", &meta, "/x/sub"]);
    let f = d.path().join("f");
    std::fs::write(&f, data(3, 5000)).unwrap();
    ok(&["put", &meta, s(&f), "/x/f"]);
    let dump = d.path().join("dump.json");
    ok(&["dump", &meta, s(&dump)]);
    let good: Value = serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    let ino_of = |dir: &str, name: &str| -> String {
        good["inodes"][dir]["entries"][name]
            .as_u64()
            .unwrap()
            .to_string()
    };
    let x = ino_of("1", "x");
    let sub = ino_of(&x, "sub");
    let file = ino_of(&x, "f");
    let file_n: u64 = file.parse().unwrap();
    let sub_n: u64 = sub.parse().unwrap();
    let x_n: u64 = x.parse().unwrap();
    let sub2 = sub.clone();

    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "absolute",
            Box::new(move |v| v["inodes"]["1"]["entries"]["/etc/PWNED"] = json!(file_n)),
            "is not a file name",
        ),
        (
            "dotdot",
            Box::new(move |v| v["inodes"][&x]["entries"][".."] = json!(file_n)),
            "is not a file name",
        ),
        (
            "dotdot-rel",
            Box::new(move |v| v["inodes"]["1"]["entries"]["../../PWNED"] = json!(file_n)),
            "is not a file name",
        ),
        (
            "empty",
            Box::new(move |v| v["inodes"]["1"]["entries"][""] = json!(file_n)),
            "is not a file name",
        ),
        (
            "root",
            Box::new(move |v| v["inodes"][&sub]["entries"]["loop"] = json!(1)),
            "points at the root",
        ),
        (
            "twice",
            Box::new(move |v| v["inodes"]["1"]["entries"]["again"] = json!(sub_n)),
            "is entered from both",
        ),
        (
            "cycle",
            Box::new(move |v| {
                // x leaves the root and sub holds x: a loop cut off from the root.
                v["inodes"]["1"]["entries"]
                    .as_object_mut()
                    .unwrap()
                    .remove("x");
                v["inodes"][&sub2]["entries"]["x"] = json!(x_n);
            }),
            "is inside itself",
        ),
    ];
    for (what, edit, want) in cases {
        let mut v = good.clone();
        edit(&mut v);
        let bad = d.path().join(format!("bad-{what}.json"));
        std::fs::write(&bad, serde_json::to_vec(&v).unwrap()).unwrap();
        let target = format!("rocksdb://{}/t-{what}", d.path().display());
        let copy = format!("file://{}/copy-{what}", d.path().display());
        let err = fails_clearly(
            &jfs(&["--block-store", &copy, "load", &target, s(&bad)]),
            want,
        );
        assert!(err.contains("nothing was loaded"), "{what}: {err}");
        assert!(
            !d.path().join(format!("t-{what}")).exists(),
            "{what}: the refused load left its metadata"
        );
    }
    // The unedited dump loads.
    let target = format!("rocksdb://{}/t-good", d.path().display());
    let copy = d.path().join("copy-good");
    copy_tree(&store, &copy);
    ok(&[
        "--block-store",
        &format!("file://{}", copy.display()),
        "load",
        &target,
        s(&dump),
    ]);
    assert_eq!(jfs(&["cat", &target, "/x/f"]).stdout, data(3, 5000));
}
