//! Another user of the host (user `nobody`, through `setpriv`) against what jfs creates on
//! it: the metadata directory, the block store, the cache, the run directory and its socket
//! and log, and the mount itself. We are root here; the test's directories are opened (0755)
//! as on a shared host, so only the modes jfs gives what it creates keep that user out.
//!
//! These need /dev/fuse and fusermount3 (Debian fuse3): without them they fail, never skip.

use integration::mountproc::{fuse_ready, is_mounted, Mount};
use integration::{bin, data, unique};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups", "--"];

/// Run `cmd args` as user nobody.
fn as_nobody(cmd: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(NOBODY)
        .arg(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running setpriv (util-linux)")
}

/// Run jfs with umask `umask` (octal) and `JFS_RUN_DIR=run`.
fn jfs_umask(umask: &str, run: &Path, args: &[&str]) -> Output {
    Command::new("sh")
        .args(["-c", &format!("umask {umask}; exec \"$@\""), "sh"])
        .arg(bin("jfs"))
        .args(args)
        .env("JFS_RUN_DIR", run)
        .stdin(Stdio::null())
        .output()
        .expect("running jfs")
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Every path under `root` (itself included), not following links.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        i += 1;
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                out.push(e.unwrap().path());
            }
        }
    }
    out
}

/// What user nobody can read or write under `root` (nothing is the answer wanted).
fn open_to_nobody(root: &Path) -> String {
    let o = as_nobody(
        "find",
        &[
            root.to_str().unwrap(),
            "(",
            "-readable",
            "-o",
            "-writable",
            ")",
            "-print",
        ],
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn what_jfs_creates_is_its_users_alone_under_umask_000_and_022() {
    fuse_ready();
    for umask in ["000", "022"] {
        let base = shared_dir();
        let b = base.path();
        // A copy of jfs that nobody can run (the build's own is under root's home).
        let jfs_copy = b.join("jfs");
        std::fs::copy(bin("jfs"), &jfs_copy).unwrap();
        std::fs::set_permissions(&jfs_copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let meta = format!("rocksdb://{}/m/meta", b.display());
        let store = format!("file://{}/s/store", b.display());
        let cache = b.join("c/cache");
        let run = b.join("r/run");
        let mp = b.join("mnt");
        std::fs::create_dir(&mp).unwrap();
        ok(
            &jfs_umask(
                umask,
                &run,
                &["format", &meta, &unique("lu"), "--storage", &store],
            ),
            "format",
        );
        // A root file no one else may read, put into the volume.
        // Over 4 MiB: a warmup makes a whole-file copy of it (passthrough).
        let secret = data(43, 6 << 20);
        let src = b.join("secret");
        std::fs::write(&src, &secret).unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o600)).unwrap();
        ok(
            &jfs_umask(
                umask,
                &run,
                &["put", &meta, src.to_str().unwrap(), "/secret"],
            ),
            "put",
        );
        std::fs::remove_file(&src).unwrap();
        // A background mount (its log in the run directory), its cache filled by a read and
        // a warmup (blocks and a whole-file copy).
        ok(
            &jfs_umask(
                umask,
                &run,
                &[
                    "mount",
                    &meta,
                    mp.to_str().unwrap(),
                    "-d",
                    "--cache-dir",
                    cache.to_str().unwrap(),
                    "--free-space-ratio",
                    "0.01",
                ],
            ),
            "mount",
        );
        let unmount = || {
            let _ = jfs_umask(umask, &run, &["umount", mp.to_str().unwrap()]);
            if is_mounted(&mp) {
                let _ = Command::new("fusermount3").arg("-uz").arg(&mp).status();
            }
        };
        let read = std::fs::read(mp.join("secret"));
        let warm = jfs_umask(
            umask,
            &run,
            &["warmup", mp.join("secret").to_str().unwrap()],
        );
        // Another user, straight at what was created: the metadata (jfs cat), the control
        // socket (jfs stats), every file.
        let cat = as_nobody(jfs_copy.to_str().unwrap(), &["cat", &meta, "/secret"]);
        let stats = Command::new("setpriv")
            .args(NOBODY)
            .arg(&jfs_copy)
            .args(["stats", mp.to_str().unwrap(), "--count", "1"])
            .env("JFS_RUN_DIR", &run)
            .output()
            .unwrap();
        let mut modes = Vec::new();
        let rocks = b.join("m/meta");
        for root in ["m", "s", "c", "r"] {
            for p in walk(&b.join(root)) {
                let m = std::fs::symlink_metadata(&p).unwrap();
                modes.push((p, m.mode() & 0o7777, m.file_type()));
            }
        }
        let nobody_sees: Vec<String> = ["m", "s", "c", "r"]
            .iter()
            .map(|r| open_to_nobody(&b.join(r)))
            .collect();
        unmount();
        assert_eq!(read.unwrap(), secret, "umask {umask}");
        ok(&warm, "warmup");
        assert!(
            !cat.status.success() && !String::from_utf8_lossy(&cat.stdout).contains("secret"),
            "umask {umask}: nobody's jfs cat: {:?} {}",
            cat.status,
            String::from_utf8_lossy(&cat.stderr)
        );
        assert_ne!(cat.stdout, secret);
        let err = String::from_utf8_lossy(&cat.stderr);
        assert!(err.contains("ermission denied"), "umask {umask}: {err}");
        assert!(!stats.status.success(), "umask {umask}: nobody's jfs stats");
        assert_eq!(
            nobody_sees.concat(),
            "",
            "umask {umask}: what user nobody can read or write"
        );
        // Every mode, as jfs made it: directories 0700, files and sockets 0600, whole-file
        // copies 0400; RocksDB's own files are inside the 0700 metadata directory.
        let mut kinds = std::collections::BTreeSet::new();
        for (p, mode, ft) in &modes {
            if p.starts_with(&rocks) && p != &rocks && !p.starts_with(rocks.join("jfs-aux")) {
                continue;
            }
            let whole = p.parent().is_some_and(|d| d.ends_with("whole"))
                && !p.to_string_lossy().ends_with(".rec");
            let want = if ft.is_dir() {
                0o700
            } else if whole {
                0o400
            } else {
                0o600
            };
            assert_eq!(*mode, want, "umask {umask}: {} is {mode:04o}", p.display());
            if ft.is_socket() {
                kinds.insert("socket");
            } else if p.extension().is_some_and(|e| e == "log") {
                kinds.insert("log");
            } else if whole && !ft.is_dir() {
                kinds.insert("whole");
            } else if p.to_string_lossy().contains("/chunks/") && ft.is_file() {
                kinds.insert(if p.starts_with(b.join("c")) {
                    "cached"
                } else {
                    "block"
                });
            }
        }
        // The walk saw each kind (a test that checks nothing passes nothing).
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            ["block", "cached", "log", "socket", "whole"],
            "umask {umask}"
        );
    }
}

#[test]
fn a_run_directory_or_log_another_user_planted_is_refused() {
    fuse_ready();
    let base = shared_dir();
    let b = base.path();
    // A place every user may write, as /tmp (sticky).
    let tmp = b.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let meta = format!("rocksdb://{}/meta", b.display());
    let store = format!("file://{}/store", b.display());
    let mp = b.join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let good = b.join("run");
    ok(
        &jfs_umask(
            "022",
            &good,
            &["format", &meta, &unique("lu"), "--storage", &store],
        ),
        "format",
    );
    // The other user's run directory, and a link to one of theirs.
    let theirs = tmp.join("jfs-0");
    let o = as_nobody("mkdir", &["-m", "0777", theirs.to_str().unwrap()]);
    ok(&o, "nobody's mkdir");
    let linked = tmp.join("jfs-link");
    let o = as_nobody(
        "ln",
        &["-s", theirs.to_str().unwrap(), linked.to_str().unwrap()],
    );
    ok(&o, "nobody's ln");
    let mnt = |run: &Path, extra: &[&str]| {
        let mut a = vec!["mount", &meta, mp.to_str().unwrap(), "-d"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--cache-size", "0"]);
        jfs_umask("022", run, &a)
    };
    for (run, why) in [
        (&theirs, "belongs to uid 65534"),
        (&linked, "is a symbolic link"),
    ] {
        let o = mnt(run, &[]);
        if is_mounted(&mp) {
            // Not refused: leave nothing mounted behind the failure below.
            let _ = jfs_umask("022", run, &["umount", mp.to_str().unwrap()]);
            let _ = Command::new("fusermount3").arg("-uz").arg(&mp).status();
        }
        let err = integration::fails_clearly(&o, why);
        assert!(err.contains(run.to_str().unwrap()), "{err}");
        assert!(err.contains("JFS_RUN_DIR"), "{err}");
        assert!(!is_mounted(&mp));
        assert_eq!(
            std::fs::read_dir(&theirs).unwrap().count(),
            0,
            "nothing was put into nobody's directory"
        );
    }
    // A log path the other user made a link to a file of root's (its ~/.profile).
    let profile = b.join("profile");
    std::fs::write(&profile, "# root's profile\n").unwrap();
    // In a directory every user may write, not sticky (a team's shared directory; in a sticky
    // one the kernel's protected_symlinks already refuses to follow it).
    let team = b.join("team");
    std::fs::create_dir(&team).unwrap();
    std::fs::set_permissions(&team, std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = team.join("mount.log");
    let o = as_nobody(
        "ln",
        &["-s", profile.to_str().unwrap(), log.to_str().unwrap()],
    );
    ok(&o, "nobody's ln");
    let o = mnt(&good, &["--log", log.to_str().unwrap()]);
    if is_mounted(&mp) {
        let _ = jfs_umask("022", &good, &["umount", mp.to_str().unwrap()]);
        let _ = Command::new("fusermount3").arg("-uz").arg(&mp).status();
    }
    integration::fails_clearly(&o, "is a symbolic link: refusing to write through it");
    assert_eq!(
        std::fs::read_to_string(&profile).unwrap(),
        "# root's profile\n"
    );
    assert!(!is_mounted(&mp));
    // A real mount; `jfs stats` told to look in the other user's directory refuses it.
    ok(&mnt(&good, &[]), "mount");
    let stats = |run: &Path| {
        Command::new(bin("jfs"))
            .args(["stats", mp.to_str().unwrap(), "--count", "1"])
            .env("JFS_RUN_DIR", run)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = stats(&theirs);
    let fine = stats(&good);
    let log_mode = std::fs::metadata(
        mount::control::socket_path_in(&good, &mp.canonicalize().unwrap()).with_extension("log"),
    )
    .map(|m| m.mode() & 0o7777);
    let _ = jfs_umask("022", &good, &["umount", mp.to_str().unwrap()]);
    if is_mounted(&mp) {
        let _ = Command::new("fusermount3").arg("-uz").arg(&mp).status();
    }
    ok(&fine, "stats");
    let err = integration::fails_clearly(&refused, "belongs to uid 65534");
    assert!(err.contains(theirs.to_str().unwrap()), "{err}");
    assert_eq!(log_mode.unwrap(), 0o600, "the background mount's log");
}

#[test]
fn a_mount_without_allow_other_refuses_other_users_even_cached_attributes() {
    fuse_ready();
    let v = integration::mountproc::new_vol("rocksdb");
    std::fs::set_permissions(v.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let caches = ["--attr-cache", "60s", "--entry-cache", "60s"];
    let mut extra = caches.to_vec();
    extra.extend(["--cache-size", "0"]);
    let m = Mount::start(&v.meta, v.dir.path(), "private", &extra);
    std::fs::write(m.mp.join("f"), b"root's").unwrap();
    std::fs::set_permissions(m.mp.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // Root looks first, so the kernel holds the name and its attributes.
    let size = std::fs::metadata(m.mp.join("f")).unwrap().len();
    let stat = as_nobody("stat", &["-c", "%s", m.mp.join("f").to_str().unwrap()]);
    let ls = as_nobody("ls", &[m.mp.to_str().unwrap()]);
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = table
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mp.to_str().unwrap()))
        .unwrap_or_default()
        .to_string();
    // The same with --allow-other: the user gets in (the refusal above is the option's).
    let mut extra = caches.to_vec();
    extra.extend(["--cache-size", "0", "--allow-other"]);
    m.stop();
    let open = Mount::start(&v.meta, v.dir.path(), "shared", &extra);
    let _ = std::fs::metadata(open.mp.join("f")).unwrap();
    let stat_open = as_nobody("stat", &["-c", "%s", open.mp.join("f").to_str().unwrap()]);
    let line_open = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(open.mp.to_str().unwrap()))
        .unwrap_or_default()
        .to_string();
    open.stop();
    assert_eq!(size, 6);
    assert!(
        !stat.status.success(),
        "nobody's stat got {:?}",
        stat.stdout
    );
    let err = String::from_utf8_lossy(&stat.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!ls.status.success());
    assert!(
        String::from_utf8_lossy(&ls.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    assert!(line.contains("fuse.jfs"), "{line}");
    assert!(!line.contains("allow_other"), "the mount table: {line}");
    assert_eq!(String::from_utf8_lossy(&stat_open.stdout).trim(), "6");
    assert!(line_open.contains("allow_other"), "{line_open}");
}

/// Run jfs-sync with umask `umask`, no HOME or XDG_CACHE_HOME, and TMPDIR=`tmp`.
fn sync_umask(umask: &str, tmp: &Path, args: &[&str]) -> Output {
    Command::new("sh")
        .args(["-c", &format!("umask {umask}; exec \"$@\""), "sh"])
        .arg(bin("jfs-sync"))
        .args(args)
        .env_remove("HOME")
        .env_remove("XDG_CACHE_HOME")
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .output()
        .expect("running jfs-sync")
}

/// jfs-sync's resume state (it names every file of the job) and its --log-file are its
/// user's alone whatever the umask; without a home the state goes to a directory of this
/// user's in the shared temporary directory, and one another user planted there (or a
/// symbolic link at the log's name) is refused, never used. Before, the state was made
/// 0755 in `/tmp/jfs-sync` (whoever made that directory first owned every user's state)
/// and the log 0644.
#[test]
fn jfs_sync_state_and_log_are_its_users_alone_and_planted_ones_refused() {
    let d = shared_dir();
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("secret-name.txt"), b"x").unwrap();
    let log = d.path().join("sync.log");
    for umask in ["000", "022"] {
        let _ = std::fs::remove_dir_all(&dst);
        let _ = std::fs::remove_file(&log);
        let o = sync_umask(
            umask,
            &tmp,
            &[
                src.to_str().unwrap(),
                dst.to_str().unwrap(),
                "--log-file",
                log.to_str().unwrap(),
            ],
        );
        ok(&o, &format!("jfs-sync under umask {umask}"));
        assert_eq!(std::fs::read(dst.join("secret-name.txt")).unwrap(), b"x");
        let state = tmp.join("jfs-sync-0");
        assert!(state.is_dir(), "the state is not in {}", state.display());
        for p in walk(&state) {
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                assert_eq!(
                    m.mode() & 0o777,
                    0o700,
                    "{} under umask {umask}",
                    p.display()
                );
            }
        }
        assert_eq!(
            std::fs::metadata(&log).unwrap().mode() & 0o777,
            0o600,
            "the log under umask {umask}"
        );
        assert_eq!(open_to_nobody(&state), "", "under umask {umask}");
        let _ = std::fs::remove_dir_all(&state);
    }
    // Another user's directory at the state's name: refused, nothing written into it.
    let planted = tmp.join("jfs-sync-0");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let o = sync_umask("022", &tmp, &[src.to_str().unwrap(), dst.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("belongs to uid 65534") && err.contains("--state-dir"),
        "{err}"
    );
    assert_eq!(
        walk(&planted).len(),
        1,
        "something was written into the planted directory"
    );
    // A symbolic link at the log's name: refused, its target untouched.
    let target = d.path().join("profile");
    std::fs::write(&target, b"keep\n").unwrap();
    let _ = std::fs::remove_file(&log);
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let o = sync_umask(
        "022",
        &tmp,
        &[
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--state-dir",
            d.path().join("st").to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep\n");
}

/// A jfs-sync copy without --perms is never more open than its source, as `cp`: a 0600
/// file and a 0700 directory stayed private, not 0644/0755 (user nobody read the copy of a
/// root-only file). Into a volume too (its mounts may be --allow-other).
#[test]
fn a_copy_without_perms_is_never_more_open_than_its_source() {
    let d = shared_dir();
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("private")).unwrap();
    std::fs::write(src.join("private/secret"), b"root only").unwrap();
    std::fs::write(src.join("open"), b"anyone").unwrap();
    std::fs::write(src.join("secret"), b"root only").unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(&src.join("private/secret"), 0o600);
    mode(&src.join("private"), 0o700);
    mode(&src.join("secret"), 0o600);
    mode(&src.join("open"), 0o755);
    let dst = d.path().join("dst");
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // --dirs: directories are entries of the copy (else only made as files need them).
    let o = sync_umask(
        "022",
        &tmp,
        &[src.to_str().unwrap(), dst.to_str().unwrap(), "--dirs"],
    );
    ok(&o, "jfs-sync");
    let got = |p: &str| std::fs::metadata(dst.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(
        (
            got("secret"),
            got("private"),
            got("private/secret"),
            got("open")
        ),
        (0o600, 0o700, 0o600, 0o755)
    );
    let o = as_nobody("cat", &[dst.join("secret").to_str().unwrap()]);
    assert!(
        !o.status.success() && o.stdout.is_empty(),
        "nobody read the copy"
    );
}

/// Another user's directory or link never steers what root does: `jfs get` into a
/// directory of theirs (they could swap a subdirectory for a link while it is copied: the
/// trial's race wrote root's files into a 0700 root directory) fails, writing nothing there;
/// `jfs get` to LOCAL through their link (it wrote into the link's target and made it 0755),
/// and `jfs mount`/`umount` at a mount point through their link (it hid the target) are
/// refused; a log file of theirs is not appended to (they would read it).
#[test]
fn another_users_directory_or_link_never_steers_a_get_a_mount_or_a_log() {
    let d = shared_dir();
    let b = d.path();
    let run = b.join("run");
    let meta = format!("rocksdb://{}/meta", b.display());
    let store = format!("file://{}/store", b.display());
    ok(
        &jfs_umask(
            "022",
            &run,
            &["format", &meta, &unique("lu"), "--storage", &store],
        ),
        "format",
    );
    let src = b.join("d");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"volume bytes").unwrap();
    ok(
        &jfs_umask("022", &run, &["put", &meta, src.to_str().unwrap(), "/d"]),
        "put",
    );
    // A directory of nobody's: nothing is written into it, the failure is named.
    let theirs = b.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let o = jfs_umask("022", &run, &["get", &meta, "/d", theirs.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("belongs to uid 65534"), "{err}");
    assert_eq!(
        walk(&theirs).len(),
        1,
        "something was written into another user's directory"
    );
    // Their links, to a root-only directory: refused before anything is touched.
    let secret = b.join("root-only");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = b.join("link");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let o = jfs_umask("022", &run, &["get", &meta, "/d", link.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to uid 65534, another user"), "{err}");
    let o = jfs_umask("022", &run, &["mount", &meta, link.to_str().unwrap(), "-d"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to uid 65534, another user"), "{err}");
    assert!(!is_mounted(&secret));
    assert_eq!(walk(&secret).len(), 1);
    assert_eq!(std::fs::metadata(&secret).unwrap().mode() & 0o7777, 0o700);
    // A log file of theirs: refused, not appended to.
    let log = b.join("their.log");
    std::fs::write(&log, b"").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&log, Some(65534), Some(65534)).unwrap();
    let o = sync_umask(
        "022",
        b,
        &[
            src.to_str().unwrap(),
            b.join("out").to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to uid 65534"), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), b"");
}

/// `jfs-sync --owners` (root): copies get their source's numeric owner and group, and with
/// `--perms` keep setuid and setgid (the rule `jfs get --owners` follows); without it they
/// are root's and lose those bits. Dir to dir, dir to volume, volume to dir. Not root:
/// refused before anything is copied, saying what to do.
#[test]
fn jfs_sync_owners_restores_owners_and_only_then_keeps_setuid() {
    let d = shared_dir();
    let b = d.path();
    let run = b.join("run");
    let meta = format!("rocksdb://{}/meta", b.display());
    let store = format!("file://{}/store", b.display());
    ok(
        &jfs_umask(
            "022",
            &run,
            &["format", &meta, &unique("own"), "--storage", &store],
        ),
        "format",
    );
    let src = b.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("x"), b"a program").unwrap();
    std::fs::set_permissions(src.join("x"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::os::unix::fs::chown(src.join("x"), Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(src.join("x"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::os::unix::fs::chown(src.join("sub"), Some(65534), Some(65534)).unwrap();
    let sync = |args: &[&str]| {
        Command::new(bin("jfs-sync"))
            .args(args)
            .env("VOL", &meta)
            .env("XDG_CACHE_HOME", b.join("cache"))
            .stdin(Stdio::null())
            .output()
            .expect("running jfs-sync")
    };
    let owner_mode = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    let s = src.to_str().unwrap();
    let (o1, o2, o3, o4) = (b.join("o1"), b.join("o2"), b.join("o3"), b.join("o4"));
    ok(
        &sync(&[s, o1.to_str().unwrap(), "--perms", "--owners", "--dirs"]),
        "dir to dir --owners",
    );
    assert_eq!(owner_mode(&o1.join("x")), (65534, 65534, 0o4755));
    assert_eq!(owner_mode(&o1.join("sub")).0, 65534);
    ok(
        &sync(&[s, o2.to_str().unwrap(), "--perms", "--dirs"]),
        "dir to dir",
    );
    assert_eq!(owner_mode(&o2.join("x")), (0, 0, 0o755));
    assert_eq!(owner_mode(&o2.join("sub")).0, 0);
    ok(
        &sync(&[s, "jfs://VOL/v", "--perms", "--owners", "--dirs"]),
        "dir to volume --owners",
    );
    ok(
        &sync(&[
            "jfs://VOL/v",
            o3.to_str().unwrap(),
            "--perms",
            "--owners",
            "--dirs",
        ]),
        "volume to dir --owners",
    );
    assert_eq!(owner_mode(&o3.join("x")), (65534, 65534, 0o4755));
    assert_eq!(owner_mode(&o3.join("sub")).0, 65534);
    ok(
        &sync(&["jfs://VOL/v", o4.to_str().unwrap(), "--perms"]),
        "volume to dir",
    );
    assert_eq!(owner_mode(&o4.join("x")), (0, 0, 0o755));
    // Not root: refused, nothing made.
    let o5 = b.join("o5");
    let o = as_nobody(
        bin("jfs-sync").to_str().unwrap(),
        &[s, o5.to_str().unwrap(), "--perms", "--owners"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("only root can give files to their owners")
            && err.contains("without --owners"),
        "{err}"
    );
    assert!(!o5.exists());
}

/// An entry of a tree that `jfs put` cannot read once it comes to it (a directory it may not
/// list, here another user's 0000 one in a tree put by nobody; a file deleted since the
/// listing) fails that entry, named, and the put goes on: exit 1, the rest copied. Before,
/// the whole put stopped with exit 2.
#[test]
fn put_fails_only_the_entry_it_cannot_read_and_copies_the_rest() {
    let d = shared_dir();
    let nb = d.path().join("nb");
    std::fs::create_dir(&nb).unwrap();
    std::os::unix::fs::chown(&nb, Some(65534), Some(65534)).unwrap();
    let meta = format!("rocksdb://{}/meta", nb.display());
    let store = format!("file://{}/store", nb.display());
    let as_nb = |args: &[&str]| {
        Command::new("setpriv")
            .args(NOBODY)
            .arg(bin("jfs"))
            .args(args)
            .env("JFS_RUN_DIR", nb.join("run"))
            .stdin(Stdio::null())
            .output()
            .expect("setpriv")
    };
    ok(
        &as_nb(&["format", &meta, &unique("vanish"), "--storage", &store]),
        "format",
    );
    let src = nb.join("src");
    std::fs::create_dir_all(src.join("locked")).unwrap();
    std::fs::write(src.join("a"), b"first").unwrap();
    std::fs::write(src.join("locked/s"), b"not readable").unwrap();
    std::fs::write(src.join("z"), b"last").unwrap();
    for p in walk(&src) {
        std::os::unix::fs::lchown(&p, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(src.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let o = as_nb(&["put", &meta, src.to_str().unwrap(), "/t"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("listing {}", src.join("locked").display()))
            && err.contains("nothing under it was copied")
            && err.contains("1 failed"),
        "{err}"
    );
    let cat = |p: &str| as_nb(&["cat", &meta, p]).stdout;
    assert_eq!(cat("/t/a"), b"first");
    assert_eq!(cat("/t/z"), b"last");
}

/// jfs-sync run by root never follows another user's link at SRC or DST, and never writes
/// into a DST that another user owns or may change, or that sits in such a directory (the
/// trial: nobody's `/tmp/x -> root's private dir` made root's `--delete-dst` delete a file
/// there and write the copy in, exit 0). Nothing outside is read, written or deleted.
#[test]
fn jfs_sync_follows_no_other_users_link_and_writes_into_no_directory_of_theirs() {
    let d = shared_dir();
    let victim = d.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(victim.join("authorized_keys"), b"k\n").unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/f"), data(1, 3000)).unwrap();
    // Nobody's corner of the shared directory: a link to the victim, a 0777 directory, and
    // a directory of theirs with a plain subdirectory.
    let theirs = d.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let link = theirs.join("export");
    ok(
        &as_nobody(
            "ln",
            &["-s", victim.to_str().unwrap(), link.to_str().unwrap()],
        ),
        "planting the link",
    );
    let open = theirs.join("open");
    ok(
        &as_nobody("mkdir", &["-m", "777", open.to_str().unwrap()]),
        "mkdir",
    );
    let below = d.path().join("theirs2");
    std::fs::create_dir(&below).unwrap();
    std::os::unix::fs::chown(&below, Some(65534), Some(65534)).unwrap();
    std::fs::create_dir(below.join("mine")).unwrap();

    let sync = |args: &[&str]| {
        Command::new(bin("jfs-sync"))
            .args(args)
            .env("HOME", d.path().join("home"))
            .stdin(Stdio::null())
            .output()
            .expect("running jfs-sync")
    };
    let s = |p: &Path| format!("{}/", p.display());
    for (dst, want) in [
        (
            &link,
            "belongs to uid 65534, another user: refusing to follow it",
        ),
        (&open, "belongs to uid 65534, another user"),
        (&below.join("mine"), "(above it) belongs to uid 65534"),
    ] {
        let o = sync(&["--delete-dst", &s(&src), &s(dst)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", dst.display());
        assert!(
            err.contains(want) && err.contains("DST"),
            "{}: {err}",
            dst.display()
        );
    }
    // A 0777 directory of root's own: others may change it.
    let wide = d.path().join("wide");
    std::fs::create_dir(&wide).unwrap();
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = sync(&[&s(&src), &s(&wide)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("mode 0777"),
        "{err}"
    );
    // Nobody's link as SRC: root would copy the victim's files where nobody could read them.
    let out = d.path().join("out");
    let o = sync(&[&s(&link), &s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("SRC"), "{err}");

    assert_eq!(
        std::fs::read(victim.join("authorized_keys")).unwrap(),
        b"k\n",
        "the victim's file changed"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(below.join("mine")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&wide).unwrap().count(), 0);
    assert!(!out.exists());
    // Root's own directory: the run goes ahead.
    let mine = d.path().join("mine");
    let o = sync(&[&s(&src), &s(&mine)]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(mine.join("sub/f")).unwrap(), data(1, 3000));
}

/// A writer never writes blocks where they would land apart from the volume's or in
/// another user's hands: metadata or store under another user's directory is refused at
/// `format` and at every writer's open; a store directory others may change is refused; a
/// store swapped for an empty directory (a disk not mounted: no owner record, none of the
/// volume's blocks, while the metadata counts bytes stored) is refused naming the likely
/// cause (before: each wrote with exit 0, and the volume's files were then unreadable).
#[test]
fn a_writer_refuses_a_store_that_is_not_the_volumes_or_that_another_user_could_swap() {
    let d = shared_dir();
    let theirs = d.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let jfs = |args: &[&str]| {
        Command::new(bin("jfs"))
            .args(args)
            .env("JFS_RUN_DIR", d.path().join("run"))
            .stdin(Stdio::null())
            .output()
            .expect("running jfs")
    };
    let name = unique("swap");
    let o = jfs(&[
        "format",
        &format!("rocksdb://{}/meta", theirs.display()),
        &name,
        "--storage",
        &format!("file://{}/store", theirs.display()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("(above it) belongs to uid 65534"), "{err}");
    assert_eq!(
        std::fs::read_dir(&theirs).unwrap().count(),
        0,
        "format left {err}"
    );

    let meta = format!("rocksdb://{}/meta", d.path().display());
    let store = d.path().join("store");
    ok(
        &jfs(&[
            "format",
            &meta,
            &name,
            "--storage",
            &format!("file://{}", store.display()),
        ]),
        "format",
    );
    let f = d.path().join("f");
    std::fs::write(&f, data(4, 70_000)).unwrap();
    ok(&jfs(&["put", &meta, f.to_str().unwrap(), "/a"]), "put");

    // Others may change the store directory.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = jfs(&["put", &meta, f.to_str().unwrap(), "/b"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("has mode 0777"),
        "{err}"
    );
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();

    // The store's disk "not mounted": an empty directory in its place.
    let away = d.path().join("store.disk");
    std::fs::rename(&store, &away).unwrap();
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = jfs(&["put", &meta, f.to_str().unwrap(), "/c"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is not the store of volume") && err.contains("disk mounted"),
        "{err}"
    );
    // Nothing but the store's own empty temporary directory.
    let files: Vec<_> = walk(&store)
        .into_iter()
        .filter(|p| !std::fs::symlink_metadata(p).unwrap().is_dir())
        .collect();
    assert!(files.is_empty(), "{files:?} {err}");
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::rename(&away, &store).unwrap();
    ok(
        &jfs(&["put", &meta, f.to_str().unwrap(), "/c"]),
        "put once the disk is back",
    );
    let o = jfs(&["cat", &meta, "/a"]);
    assert_eq!(o.stdout, data(4, 70_000));
}

/// An explicit `--cache-dir` that another user could steer is refused before anything is
/// mounted: their directory (0777), a link of theirs, one of root's that others may write
/// (before: the first two were used, with a warning in the background log only, and a link
/// swapped in later made the cache write into the link's target).
#[test]
fn a_cache_dir_another_user_could_steer_is_refused() {
    let d = shared_dir();
    let meta = format!("rocksdb://{}/meta", d.path().display());
    let name = unique("cdir");
    let jfs = |args: &[&str]| {
        Command::new(bin("jfs"))
            .args(args)
            .env("JFS_RUN_DIR", d.path().join("run"))
            .stdin(Stdio::null())
            .output()
            .expect("running jfs")
    };
    ok(
        &jfs(&[
            "format",
            &meta,
            &name,
            "--storage",
            &format!("file://{}/store", d.path().display()),
        ]),
        "format",
    );
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let theirs = d.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let victim = d.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let link = theirs.join("cache");
    ok(
        &as_nobody(
            "ln",
            &["-s", victim.to_str().unwrap(), link.to_str().unwrap()],
        ),
        "ln",
    );
    let wide = d.path().join("wide");
    std::fs::create_dir(&wide).unwrap();
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (dir, want) in [
        (&theirs, "belongs to uid 65534, another user"),
        (
            &link,
            "belongs to uid 65534, another user: refusing to follow it",
        ),
        (&wide, "has mode 0777"),
    ] {
        let o = jfs(&[
            "mount",
            &meta,
            mnt.to_str().unwrap(),
            "-d",
            "--cache-dir",
            dir.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", dir.display());
        assert!(err.contains(want) && err.contains("--cache-dir"), "{err}");
        assert!(!is_mounted(&mnt), "{}: mounted anyway", dir.display());
    }
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&wide).unwrap().count(), 0);
}

/// `jfs mkdir` and `jfs ln -s` record the user who ran them as the owner (they recorded
/// 0:0 for every user, so a user's own directory was root's in the volume and not theirs to
/// write through a mount).
#[test]
fn the_cli_records_its_user_as_the_owner_of_what_it_makes() {
    let d = shared_dir();
    let home = d.path().join("nb");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let meta = format!("rocksdb://{}/meta", home.display());
    let store = format!("file://{}/store", home.display());
    let name = unique("own");
    let run = home.join("run");
    let env_run = format!("JFS_RUN_DIR={}", run.display());
    // A copy nobody may run (the build's is under root's home).
    let jfs_bin = d.path().join("jfs");
    std::fs::copy(bin("jfs"), &jfs_bin).unwrap();
    std::fs::set_permissions(&jfs_bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nb = |args: &[&str]| {
        let mut a = vec![env_run.as_str(), jfs_bin.to_str().unwrap()];
        a.extend_from_slice(args);
        as_nobody("env", &a)
    };
    ok(
        &nb(&["format", &meta, &name, "--storage", &store]),
        "format as nobody",
    );
    ok(&nb(&["mkdir", &meta, "/mine"]), "mkdir as nobody");
    ok(
        &nb(&["ln", "-s", &meta, "/mine", "/link"]),
        "ln -s as nobody",
    );
    for path in ["/mine", "/link"] {
        let o = nb(&["stat", &meta, path]);
        ok(&o, "stat");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (v["uid"].as_u64(), v["gid"].as_u64()),
            (Some(65534), Some(65534)),
            "{path}: {v}"
        );
    }
}

/// Another user's `jfs umount` of root's mount says whose it is (it said "files open there?
/// close them, or detach with jfs umount --force"), and the mount stays.
#[test]
fn another_users_umount_names_the_mounts_owner() {
    fuse_ready();
    let v = integration::mountproc::new_vol("rocksdb");
    std::fs::set_permissions(v.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = Mount::start(&v.meta, v.dir.path(), "mnt", &["--cache-size", "0"]);
    let jfs_copy = v.dir.path().join("jfs-copy");
    std::fs::copy(bin("jfs"), &jfs_copy).unwrap();
    std::fs::set_permissions(&jfs_copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = as_nobody(
        jfs_copy.to_str().unwrap(),
        &["umount", m.mp.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let still = is_mounted(&m.mp);
    m.stop();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("belongs to uid 0: only that user or root may unmount it"),
        "{err}"
    );
    assert!(still, "the mount went");
}
