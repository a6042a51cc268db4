//! Copies out of and into a volume as another local user would attack them (issue 43): owners
//! and setuid bits of a restore, the modes of temporary files while a copy runs, leftovers of
//! killed puts, reruns of `jfs get`, and times before 1970. The real `jfs` and `jfs-sync`
//! binaries as processes; a second user is `nobody` (65534) through `setpriv`.

use integration::{bin, data};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

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
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command run as `nobody`, with no groups.
fn as_nobody(cmd: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A test directory another user can reach (mktemp's are 0700), as on a shared host.
fn shared_tmp() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// A RocksDB volume "v" with file:// blocks under `dir`: its META_URL.
fn volume(dir: &Path) -> String {
    let meta = format!("rocksdb://{}/meta", dir.display());
    ok(&[
        "format",
        &meta,
        "v",
        "--storage",
        &format!("file://{}/blocks", dir.display()),
    ]);
    meta
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

/// `jfs-sync ARGS` with the volume `meta` as `jfs://VOL` and its state under `state`; it
/// must succeed.
fn sync_ok(meta: &str, state: &Path, args: &[&str]) {
    let o = Command::new(bin("jfs-sync"))
        .args(args)
        .env("VOL", meta)
        .env("XDG_CACHE_HOME", state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

/// Issue 43, item 1: a user's `chmod 4755` (or 2755) copy of a program in the volume comes
/// out of a root `jfs get` or `jfs-sync --perms` without its setuid and setgid bits (the
/// copy is root's), so running it gives the user nothing; `jfs get --owners` gives it back
/// to its owner first, and only then keeps the bits; `--owners` is refused to a non-root.
#[test]
fn a_root_restore_never_makes_a_users_program_setuid_root() {
    let t = shared_tmp();
    let meta = volume(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::copy("/usr/bin/id", src.join("x")).unwrap();
    std::fs::copy("/usr/bin/id", src.join("y")).unwrap();
    let sgid_dir = src.join("shared");
    std::fs::create_dir(&sgid_dir).unwrap();
    for (p, m) in [
        (src.join("x"), 0o4755),
        (src.join("y"), 0o2755),
        (sgid_dir.clone(), 0o2775),
    ] {
        chown(&p, NOBODY, NOBODY);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    chown(&src, NOBODY, NOBODY);
    // As a user's files reach the volume through an --allow-other mount: their owner kept.
    ok(&["put", &meta, s(&src), "/u"]);
    let st: serde_json::Value = serde_json::from_str(&ok(&["stat", &meta, "/u/x"])).unwrap();
    assert_eq!(
        (st["mode"].as_u64(), st["uid"].as_u64()),
        (Some(0o4755), Some(NOBODY as u64))
    );

    // A plain get by root: the copies are root's, without setuid or setgid.
    let out = t.path().join("out");
    ok(&["get", &meta, "/u", s(&out)]);
    assert_eq!(
        (mode(&out.join("x")), owner(&out.join("x"))),
        (0o755, (0, 0))
    );
    assert_eq!(mode(&out.join("y")), 0o755);
    assert_eq!(
        mode(&out.join("shared")),
        0o2775,
        "a directory's setgid is harmless and kept"
    );
    assert_eq!(
        std::fs::read(out.join("x")).unwrap(),
        std::fs::read("/usr/bin/id").unwrap()
    );
    let id = as_nobody(&[s(&out.join("x")), "-u"]);
    assert_eq!(
        String::from_utf8_lossy(&id.stdout).trim(),
        NOBODY.to_string(),
        "no euid 0"
    );

    // With --owners: owner first, then the mode, so the bits stay with the real owner.
    let kept = t.path().join("kept");
    ok(&["get", "--owners", &meta, "/u", s(&kept)]);
    assert_eq!(
        (mode(&kept.join("x")), owner(&kept.join("x"))),
        (0o4755, (NOBODY, NOBODY))
    );
    assert_eq!(
        (mode(&kept.join("y")), owner(&kept.join("y"))),
        (0o2755, (NOBODY, NOBODY))
    );
    assert_eq!(owner(&kept.join("shared")), (NOBODY, NOBODY));
    assert_eq!(owner(&kept), (NOBODY, NOBODY));

    // --owners needs root: refused, naming what to do, before anything is written.
    let mine = t.path().join("mine");
    let o = as_nobody(&[s(&bin("jfs")), "get", "--owners", &meta, "/u", s(&mine)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("only root") && err.contains("without --owners"),
        "{err}"
    );
    assert!(!mine.exists());

    // jfs-sync out of the volume with --perms: the same.
    let dst = t.path().join("dst");
    let state = tempfile::tempdir().unwrap();
    sync_ok(
        &meta,
        state.path(),
        &["jfs://VOL/u", s(&dst), "--perms", "--dirs"],
    );
    assert_eq!(
        (mode(&dst.join("x")), owner(&dst.join("x"))),
        (0o755, (0, 0))
    );
    assert_eq!(mode(&dst.join("y")), 0o755);

    // And jfs-sync into a volume (whose copies belong to the volume's default owner).
    sync_ok(&meta, state.path(), &[s(&src), "jfs://VOL/in", "--perms"]);
    let st: serde_json::Value = serde_json::from_str(&ok(&["stat", &meta, "/in/x"])).unwrap();
    assert_eq!(
        (st["mode"].as_u64(), st["uid"].as_u64()),
        (Some(0o755), Some(0))
    );
}

/// Poll `dir` until a file whose name contains `needle` appears (at most `limit`).
fn wait_for_temp(dir: &Path, needle: &str, limit: Duration) -> Option<PathBuf> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().contains(needle) {
                    return Some(e.path());
                }
            }
        }
        std::thread::yield_now();
    }
    None
}

/// The temporary file `tmp` of a copy (its writer stopped): owner-only, and `nobody` cannot
/// open it.
fn assert_private(tmp: &Path) {
    let m = std::fs::symlink_metadata(tmp).unwrap().mode() & 0o7777;
    assert_eq!(
        m & 0o077,
        0,
        "{} is {m:o} while the copy runs",
        tmp.display()
    );
    let o = as_nobody(&["head", "-c", "1", s(tmp)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("Permission denied"),
        "nobody read the temporary file: {err}"
    );
}

/// Issue 43, item 3: `jfs get` and `jfs-sync` write a private file's bytes into a temporary
/// file that is owner-only from its first byte; another user opening it mid-copy gets EACCES.
/// The copy is stopped (SIGSTOP) while its temporary file is looked at.
#[test]
fn temporary_files_of_a_copy_out_are_owner_only_from_the_first_byte() {
    let t = shared_tmp();
    let meta = volume(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let big = 256usize << 20;
    std::fs::write(src.join("secret"), data(7, big)).unwrap();
    std::fs::set_permissions(src.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(&["put", &meta, s(&src), "/p"]);

    // jfs get: caught by polling while it copies 256 MiB, then stopped.
    let mut seen = false;
    for attempt in 0..3 {
        let out = t.path().join(format!("out{attempt}"));
        std::fs::create_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(bin("jfs"))
            .args(["-q", "get", &meta, "/p/secret", s(&out)])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let tmp = wait_for_temp(&out, ".jfs-tmp-", Duration::from_secs(20));
        let pid = child.id().to_string();
        if let Some(tmp) = &tmp {
            Command::new("kill").args(["-STOP", &pid]).status().unwrap();
            if tmp.exists() {
                assert_private(tmp);
                seen = true;
            }
            Command::new("kill").args(["-CONT", &pid]).status().unwrap();
        }
        assert!(child.wait().unwrap().success());
        assert_eq!(mode(&out.join("secret")), 0o600);
        assert_eq!(std::fs::read(out.join("secret")).unwrap().len(), big);
        if seen {
            break;
        }
    }
    assert!(
        seen,
        "the temporary file of jfs get was never seen in 3 copies of 256 MiB"
    );

    // jfs-sync out of the volume, paced at 4 MiB/s: its temporary file is there for seconds.
    let dst = t.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("small"), data(8, 12 << 20)).unwrap();
    std::fs::set_permissions(src.join("small"), std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(&["mkdir", &meta, "/q"]);
    ok(&["put", &meta, s(&src.join("small")), "/q/small"]);
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin("jfs-sync"))
        .args(["jfs://VOL/q", s(&dst), "--perms", "--bwlimit", "4M"])
        .env("VOL", &meta)
        .env("XDG_CACHE_HOME", state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let tmp = wait_for_temp(&dst, ".jfs-sync-tmp", Duration::from_secs(20))
        .expect("jfs-sync's temporary file appears");
    assert_private(&tmp);
    assert!(child.wait().unwrap().success());
    assert_eq!(mode(&dst.join("small")), 0o600);
    assert_eq!(std::fs::read(dst.join("small")).unwrap(), data(8, 12 << 20));

    // A file or link planted at jfs-sync's temporary name is never followed nor reused.
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    std::fs::remove_file(dst.join("small")).unwrap();
    std::os::unix::fs::symlink(&victim, dst.join(".small.jfs-sync-tmp")).unwrap();
    sync_ok(&meta, state.path(), &["jfs://VOL/q", s(&dst), "--perms"]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert_eq!(std::fs::read(dst.join("small")).unwrap(), data(8, 12 << 20));
    assert_eq!(mode(&dst.join("small")), 0o600);
}

/// Every name in volume directory `dir`, a put's temporaries included (which `jfs ls` and
/// the mount no longer list): read from `jfs dump`.
fn ls(meta: &str, dir: &str) -> Vec<String> {
    let o = jfs(&["dump", meta]);
    assert!(
        o.status.success(),
        "dump: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("dump JSON");
    let mut ino = "1".to_string();
    for c in dir.split('/').filter(|c| !c.is_empty()) {
        ino = v["inodes"][&ino]["entries"][c].to_string();
    }
    let mut names: Vec<String> = v["inodes"][&ino]["entries"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Start `jfs put LOCAL VOLPATH` and kill it (-9) once its temporary file is in the volume.
fn kill_put_midway(meta: &str, local: &Path, volpath: &str, dir: &str) {
    let mut child = Command::new(bin("jfs"))
        .args(["-q", "put", meta])
        .arg(local) // any bytes
        .arg(volpath)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no temporary file seen"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the put ended before it was killed"
        );
        if ls(meta, dir).iter().any(|n| n.contains(".jfs-tmp-")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Issue 43, item 14: a killed `jfs put` leaves its temporary file in the volume; jfs-sync
/// and `jfs get` never copy it, `jfs gc` counts it and `--delete` removes it once its writer
/// is dead, and a rerun of the put removes what the killed one left beside its files.
#[test]
fn a_killed_puts_temporary_files_are_skipped_and_removed_by_gc_and_reruns() {
    let t = tempfile::tempdir().unwrap();
    let meta = volume(t.path());
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let big = data(3, 256 << 20);
    std::fs::write(src.join("big"), &big).unwrap();
    ok(&["mkdir", &meta, "/d"]);
    kill_put_midway(&meta, &src.join("big"), "/d/big", "/d");
    let names = ls(&meta, "/d");
    assert!(
        names.len() == 1 && names[0].starts_with(".big.jfs-tmp-"),
        "{names:?}"
    );
    // Readers that copy trees out take it for no file.
    let out = t.path().join("out");
    ok(&["get", &meta, "/d", s(&out)]);
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
    let dst = t.path().join("dst");
    let state = tempfile::tempdir().unwrap();
    sync_ok(&meta, state.path(), &["jfs://VOL/d", s(&dst)]);
    assert_eq!(std::fs::read_dir(&dst).map_or(0, |d| d.count()), 0);
    // gc: counted, then removed (its writer's process is gone).
    let gc = |delete: bool| -> serde_json::Value {
        let mut a = vec!["gc", meta.as_str(), "--json"];
        if delete {
            a.push("--delete");
        }
        serde_json::from_str(ok(&a).lines().last().unwrap()).unwrap()
    };
    assert_eq!(gc(false)["temps_dead"], 1);
    assert_eq!(ls(&meta, "/d").len(), 1, "a dry run removes nothing");
    let r = gc(true);
    assert_eq!(
        (r["temps_dead"].as_u64(), r["temps_removed"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(ls(&meta, "/d").is_empty());
    // A partial copy is nobody's data: freed at once, never kept in the trash.
    assert_eq!(ok(&["trash", &meta, "--json"]).trim(), "[]");

    // A rerun of the put removes the leftover beside the file it copies.
    kill_put_midway(&meta, &src.join("big"), "/d/big", "/d");
    assert_eq!(ls(&meta, "/d").len(), 1);
    ok(&["-q", "put", &meta, s(&src.join("big")), "/d/big"]);
    assert_eq!(ls(&meta, "/d"), vec!["big".to_string()]);
    assert!(ok_bytes_eq(&meta, "/d/big", &big));

    // The temporary of a name that is not UTF-8, left by a put whose session is dead (no
    // such session is live), is counted and removed too (gc skipped it).
    use std::os::unix::ffi::OsStrExt;
    let odd = src.join(std::ffi::OsStr::from_bytes(
        b".b\xffg.jfs-tmp-00000000deadbeef-1-0badc0de",
    ));
    std::fs::write(&odd, b"left behind").unwrap();
    ok(&["mkdir", &meta, "/e"]);
    let o = Command::new(bin("jfs"))
        .args(["-q", "put", meta.as_str()])
        .arg(&odd)
        .arg("/e/")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(ls(&meta, "/e").len(), 1);
    assert_eq!(gc(false)["temps_dead"], 1);
    let r = gc(true);
    assert_eq!(r["temps_removed"].as_u64(), Some(1));
    assert!(ls(&meta, "/e").is_empty(), "{:?}", ls(&meta, "/e"));

    // A rerun of a put removes it too: the same leftover beside `b\xffg`, then a put of a
    // tree holding `b\xffg` into /e (a rerun there) leaves only the file. Before, the rerun
    // looked for the key's text, not the name's bytes, and left it.
    let o = Command::new(bin("jfs"))
        .args(["-q", "put", meta.as_str()])
        .arg(&odd)
        .arg("/e/")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tree = t.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(
        tree.join(std::ffi::OsStr::from_bytes(b"b\xffg")),
        b"the file",
    )
    .unwrap();
    let o = Command::new(bin("jfs"))
        .args(["-q", "put", meta.as_str()])
        .arg(&tree)
        .arg("/e")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let names = ls(&meta, "/e");
    assert!(
        names.len() == 1 && !names[0].contains(".jfs-tmp-"),
        "the leftover stays: {names:?}"
    );
    assert_eq!(gc(false)["temps_dead"], 0);
}

fn ok_bytes_eq(meta: &str, path: &str, want: &[u8]) -> bool {
    let o = jfs(&["cat", meta, path]);
    o.status.success() && o.stdout == want
}

/// Issue 43, item 15: a rerun of `jfs get DIR LOCAL` finishes LOCAL instead of nesting a copy
/// in it (as put's reruns merge); a trailing `/` puts the tree into LOCAL under its name, and
/// a file goes into an existing directory.
#[test]
fn a_rerun_of_get_finishes_the_tree_instead_of_nesting_it() {
    let t = tempfile::tempdir().unwrap();
    let meta = volume(t.path());
    let src = t.path().join("t1");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), data(1, 1000)).unwrap();
    std::fs::write(src.join("sub/b"), data(2, 5000)).unwrap();
    ok(&["put", &meta, s(&src), "/t1"]);
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let out = t.path().join("local");
    ok(&["get", &meta, "/t1", s(&out)]);
    assert_eq!(names(&out), ["a", "sub"]);
    // A partial first run: one file missing. The rerun completes LOCAL itself.
    std::fs::remove_file(out.join("sub/b")).unwrap();
    ok(&["get", &meta, "/t1", s(&out)]);
    assert_eq!(names(&out), ["a", "sub"], "no nested t1");
    assert_eq!(std::fs::read(out.join("sub/b")).unwrap(), data(2, 5000));
    // With a trailing slash: into LOCAL under its own name.
    let into = t.path().join("into");
    std::fs::create_dir(&into).unwrap();
    ok(&["get", &meta, "/t1", &format!("{}/", into.display())]);
    assert_eq!(names(&into), ["t1"]);
    assert_eq!(names(&into.join("t1")), ["a", "sub"]);
    // A file goes into an existing directory, like cp.
    ok(&["get", &meta, "/t1/a", s(&into)]);
    assert_eq!(names(&into), ["a", "t1"]);
    // A trailing slash on something that is not a directory is refused.
    let o = jfs(&[
        "get",
        &meta,
        "/t1",
        &format!("{}/", into.join("a").display()),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a directory"));
}

/// Issue 43, item 13 (the copy side): a time before 1970 comes out of `jfs get` and
/// `jfs-sync` as it is, not as 0.
#[test]
fn times_before_1970_come_out_as_they_are() {
    let t = tempfile::tempdir().unwrap();
    let meta = volume(t.path());
    let src = t.path().join("old");
    std::fs::create_dir(&src).unwrap();
    let f = src.join("f");
    std::fs::write(&f, b"1960").unwrap();
    // 1960-01-01T00:00:00.5Z
    let when = std::time::UNIX_EPOCH - Duration::from_millis(315_619_199_500);
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_times(
            std::fs::FileTimes::new()
                .set_modified(when)
                .set_accessed(when),
        )
        .unwrap();
    let want = std::fs::metadata(&f).unwrap().modified().unwrap();
    assert_eq!(want, when);
    ok(&["put", &meta, s(&src), "/old"]);
    let out = t.path().join("out");
    ok(&["get", &meta, "/old", s(&out)]);
    assert_eq!(
        std::fs::metadata(out.join("f"))
            .unwrap()
            .modified()
            .unwrap(),
        when
    );
    let dst = t.path().join("dst");
    let state = tempfile::tempdir().unwrap();
    sync_ok(&meta, state.path(), &["jfs://VOL/old", s(&dst)]);
    assert_eq!(
        std::fs::metadata(dst.join("f"))
            .unwrap()
            .modified()
            .unwrap(),
        when
    );
}

/// Issue 43, items 1 and 3 on the way in, and 14 through a mount: a root `jfs put` through a
/// live mount of a user's `chmod 4755` program writes it under an owner-only temporary file
/// (never a setuid-root one, even mid-copy), then gives it its owner, then its mode, so the
/// volume holds it setuid *to its owner* (a chown after the mode cleared the bit); a rerun
/// after a killed put removes the temporary file it left. Needs /dev/fuse and fusermount3.
#[test]
fn a_put_through_a_mount_gives_the_owner_before_the_mode_and_a_rerun_cleans_up() {
    use integration::mountproc::Mount;
    let t = shared_tmp();
    let meta = volume(t.path());
    let m = Mount::start(
        &meta,
        t.path(),
        "mnt",
        &["--attr-cache", "0s", "--entry-cache", "0s"],
    );
    let put = |args: &[&str]| {
        let mut c = Command::new(bin("jfs"));
        c.args(args)
            .env("JFS_RUN_DIR", &m.run_dir)
            .stdin(Stdio::null());
        c
    };
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let x = src.join("x");
    let body = data(5, 96 << 20);
    std::fs::write(&x, &body).unwrap();
    chown(&x, NOBODY, NOBODY);
    std::fs::set_permissions(&x, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Stopped while its temporary file is in the mount: owner-only, not setuid.
    let mut child = put(&["-q", "put", &meta, s(&x), "/x"]).spawn().unwrap();
    let tmp = wait_for_temp(&m.mp, ".x.jfs-tmp-", Duration::from_secs(30))
        .expect("the put's temporary file appears in the mount");
    let pid = child.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    if let Ok(md) = std::fs::symlink_metadata(&tmp) {
        assert_eq!(
            md.mode() & 0o6077,
            0,
            "temporary file {:o}",
            md.mode() & 0o7777
        );
    }
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    assert!(child.wait().unwrap().success());
    let v = m.mp.join("x");
    assert_eq!((mode(&v), owner(&v)), (0o4755, (NOBODY, NOBODY)));
    assert_eq!(std::fs::read(&v).unwrap(), body);

    // Killed mid-copy: its temporary file stays; the rerun removes it and finishes.
    let mut child = put(&["-q", "put", &meta, s(&x), "/y"]).spawn().unwrap();
    wait_for_temp(&m.mp, ".y.jfs-tmp-", Duration::from_secs(30)).expect("temporary file");
    child.kill().unwrap();
    child.wait().unwrap();
    let temps = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".jfs-tmp-")
            })
            .count()
    };
    assert_eq!(temps(&m.mp), 1);
    let o = put(&["-q", "put", &meta, s(&x), "/y"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(temps(&m.mp), 0);
    assert_eq!(std::fs::read(m.mp.join("y")).unwrap(), body);
}

/// Issue 43, item 3's root cause in `jfs dump FILE`: its temporary file (`FILE.jfs-tmp`, a
/// fixed name) was created with the umask's mode and through whatever was there, so a link
/// planted at that name made root truncate and write the link's target. It is now a new,
/// owner-only file; the link is removed, its target untouched.
#[test]
fn a_dump_never_writes_through_a_planted_link_and_is_owner_only() {
    let t = shared_tmp();
    let meta = volume(t.path());
    ok(&["mkdir", &meta, "/private-name"]);
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    let out = t.path().join("dump.json");
    std::os::unix::fs::symlink(&victim, t.path().join("dump.jfs-tmp")).unwrap();
    ok(&["dump", &meta, s(&out)]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("private-name"));
    assert_eq!(mode(&out), 0o600);
}
