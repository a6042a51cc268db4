//! Volume paths given to commands stay inside the volume, with and without a live mount
//! (`..` never climbs above the volume's root; a symlink in the volume is never followed out
//! of it), and write commands that go through a mount report store errors as they do
//! without one. Canaries sit beside the mount point on the host and inside the volume.
//!
//! These need /dev/fuse and fusermount3 (Debian fuse3): without them they fail, never skip.

use integration::mountproc::{fuse_ready, Mount, ReadOnlyBind};
use integration::{bin, data, meta_url, store_url, unique};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Vol {
    meta: String,
    store: String,
    dir: tempfile::TempDir,
    _keep: Vec<tempfile::TempDir>,
}

fn new_vol() -> Vol {
    fuse_ready();
    let (meta, d1) = meta_url("rocksdb");
    let (store, d2) = store_url("file");
    let v = Vol {
        meta,
        store,
        dir: tempfile::tempdir().unwrap(),
        _keep: d1.into_iter().chain(d2).collect(),
    };
    let o = v.jfs(&["format", &v.meta, &unique("tm"), "--storage", &v.store]);
    assert!(o.status.success(), "format: {}", text(&o));
    v
}

impl Vol {
    fn jfs(&self, args: &[&str]) -> Output {
        Command::new(bin("jfs"))
            .args(args)
            .env("JFS_RUN_DIR", self.dir.path().join("run"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("running jfs")
    }
    fn mount(&self) -> Mount {
        Mount::start(
            &self.meta,
            self.dir.path(),
            "mnt",
            &["--attr-cache", "0s", "--entry-cache", "0s"],
        )
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// Every file under `root` (relative path -> bytes), symlinks as their target.
fn tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                stack.push(p);
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, t.display().to_string().into_bytes());
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The volume's tree as `jfs ls -R -l` prints it (names, sizes, kinds).
fn volume_listing(v: &Vol) -> String {
    let o = v.jfs(&["ls", "-R", &v.meta, "/"]);
    assert!(o.status.success(), "ls: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Run the hostile commands; each must fail (exit 2) and leave both canaries alone.
fn hostile_commands_are_refused(v: &Vol, through_mount: bool) {
    let victim = v.path("victim");
    let host_before = tree(&victim);
    let src = v.path("src.txt");
    std::fs::write(&src, b"payload").unwrap();
    let src = src.to_str().unwrap();
    let meta = v.meta.as_str();
    let get_dest = v.path("got");
    std::fs::create_dir_all(&get_dest).unwrap();
    let gd = get_dest.to_str().unwrap();
    let climbs: Vec<Vec<&str>> = vec![
        vec!["rm", "-r", meta, "/../victim"],
        vec!["rm", "-r", meta, "/../../../victim"],
        vec!["rm", meta, "/../victim/keep"],
        vec!["rm", "-r", meta, "/canary/../../victim"],
        vec!["mkdir", meta, "/../escaped"],
        vec!["mkdir", "-p", meta, "/../escaped/deeper"],
        vec!["put", meta, src, "/../f"],
        vec!["put", meta, src, "/../victim/"],
        vec!["ln", "-s", meta, "x", "/../lnk"],
        vec!["ln", meta, "/canary/data", "/../hard"],
        vec!["ln", meta, "/../victim/keep", "/hard"],
        vec!["truncate", meta, "/../victim/keep", "0"],
        vec!["mv", meta, "/canary/data", "/../moved"],
        vec!["mv", meta, "/../victim/keep", "/stolen"],
        vec!["ls", meta, "/.."],
        vec!["stat", meta, "/../victim"],
        vec!["cat", meta, "/../victim/keep"],
        vec!["get", meta, "/..", gd],
    ];
    for args in &climbs {
        let o = v.jfs(args);
        let t = text(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?} (mount: {through_mount}): {t}"
        );
        assert!(
            t.contains("climbs above the volume's root"),
            "{args:?} (mount: {through_mount}) does not say why: {t}"
        );
    }
    // `..` that stays inside resolves there: /canary/.. is the root, which rm refuses.
    for args in [
        vec!["rm", "-r", meta, "/canary/.."],
        vec!["rm", "-r", meta, "/"],
        vec!["rm", "-r", meta, "/canary/sub/../.."],
    ] {
        let o = v.jfs(&args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        assert!(t.contains("root"), "{args:?}: {t}");
    }
    // Symlinks in the volume that point out of it (relative and absolute) are never
    // followed by a command: through a mount the kernel would follow them onto the host.
    let abs = victim.display().to_string();
    for (name, target) in [("/out-rel", "../victim"), ("/out-abs", abs.as_str())] {
        let o = v.jfs(&["ln", "-s", meta, target, name]);
        assert!(o.status.success(), "ln -s {target} {name}: {}", text(&o));
        let keep = format!("{name}/keep");
        let sub = format!("{name}/sub");
        let slash = format!("{name}/");
        let moved = format!("{name}/moved");
        for args in [
            vec!["rm", "-r", meta, keep.as_str()],
            vec!["rm", meta, keep.as_str()],
            vec!["mkdir", meta, sub.as_str()],
            vec!["mkdir", "-p", meta, sub.as_str()],
            vec!["put", meta, src, slash.as_str()],
            vec!["put", meta, src, keep.as_str()],
            vec!["truncate", meta, keep.as_str(), "0"],
            vec!["mv", meta, keep.as_str(), "/stolen"],
            vec!["mv", meta, "/canary/data", moved.as_str()],
            vec!["ln", "-s", meta, "x", sub.as_str()],
            vec!["ln", meta, keep.as_str(), "/hard2"],
        ] {
            let o = v.jfs(&args);
            assert_ne!(
                o.status.code(),
                Some(0),
                "{args:?} (mount: {through_mount}) followed a symlink out of the volume: {}",
                text(&o)
            );
        }
        // Removing the link itself removes the link only.
        let o = v.jfs(&["rm", meta, name]);
        assert!(o.status.success(), "rm {name}: {}", text(&o));
    }
    assert_eq!(
        tree(&victim),
        host_before,
        "the host canary changed (mount: {through_mount})"
    );
    for p in ["escaped", "f", "lnk", "hard", "moved", "stolen"] {
        assert!(!v.path(p).exists(), "{p} appeared beside the mount point");
    }
    assert!(tree(&get_dest).is_empty(), "get wrote something");
    // The volume canary is whole.
    let o = v.jfs(&["cat", meta, "/canary/data"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout, data(7, 10_000));
    let o = v.jfs(&["cat", meta, "/canary/sub/inner"]);
    assert_eq!(o.stdout, b"inner");
}

fn canaries(v: &Vol) {
    std::fs::create_dir_all(v.path("victim/deep")).unwrap();
    std::fs::write(v.path("victim/keep"), b"host canary").unwrap();
    std::fs::write(v.path("victim/deep/file"), data(3, 5000)).unwrap();
    let c = v.path("canary-src");
    std::fs::create_dir_all(c.join("sub")).unwrap();
    std::fs::write(c.join("data"), data(7, 10_000)).unwrap();
    std::fs::write(c.join("sub/inner"), b"inner").unwrap();
    let o = v.jfs(&["put", &v.meta, c.to_str().unwrap(), "/canary"]);
    assert!(o.status.success(), "put canary: {}", text(&o));
}

#[test]
fn volume_paths_never_leave_the_volume_with_or_without_a_mount() {
    let v = new_vol();
    canaries(&v);
    let listing = volume_listing(&v);
    // Without a mount: the volume is opened by the command itself.
    hostile_commands_are_refused(&v, false);
    assert_eq!(volume_listing(&v), listing);
    // Through a live read-write mount (RocksDB: the commands go through it).
    let m = v.mount();
    assert_eq!(m.mp, v.path("mnt"));
    hostile_commands_are_refused(&v, true);
    // The commands still work inside the volume through the mount, `..` included.
    let src = v.path("src.txt");
    for args in [
        vec!["mkdir", "-p", &v.meta, "/w/x/../y"],
        vec!["put", &v.meta, src.to_str().unwrap(), "/w/y/../f"],
        vec!["mv", &v.meta, "/w/f", "/w/y/"],
        vec!["ln", "-s", &v.meta, "../y/f", "/w/y/../lnk"],
        vec!["truncate", &v.meta, "/w/./y/f", "3"],
        vec!["rm", "-r", &v.meta, "/w/x/../"],
    ] {
        let o = v.jfs(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    assert!(!m.mp.join("w").exists(), "/w/x/../ is /w and was removed");
    assert_eq!(
        std::fs::read(m.mp.join("canary/data")).unwrap(),
        data(7, 10_000)
    );
    m.stop();
    assert_eq!(
        volume_listing(&v)
            .lines()
            .filter(|l| l.contains("canary"))
            .count(),
        listing.lines().filter(|l| l.contains("canary")).count()
    );
}

#[test]
fn put_through_a_mount_reports_a_store_that_refuses_writes_like_put_without_one() {
    let v = new_vol();
    let src = v.path("tree");
    std::fs::create_dir_all(src.join("d")).unwrap();
    let files = [("a.bin", 300_000), ("b.bin", 5 << 20), ("d/c.bin", 7)];
    for (i, (n, len)) in files.iter().enumerate() {
        std::fs::write(src.join(n), data(i as u64, *len)).unwrap();
    }
    let store_dir = PathBuf::from(v.store.trim_start_matches("file://"));
    let put = |v: &Vol| v.jfs(&["put", &v.meta, src.to_str().unwrap(), "/tree"]);
    // Without a mount first: the reference behaviour.
    let reference = {
        let _ro = ReadOnlyBind::over(&store_dir);
        put(&v)
    };
    let m = v.mount();
    let through = {
        let _ro = ReadOnlyBind::over(&store_dir);
        put(&v)
    };
    for (what, o) in [
        ("without a mount", &reference),
        ("through the mount", &through),
    ] {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "put {what}: {t}");
        for (n, _) in &files {
            let local = src.join(n);
            assert!(
                t.lines()
                    .any(|l| l.contains("failed") && l.contains(local.to_str().unwrap())),
                "put {what} does not name {n}: {t}"
            );
        }
        // Each failure says why (the store refuses writes), not only "Input/output error".
        assert_eq!(
            t.lines()
                .filter(|l| l.contains("failed") && l.contains("Read-only file system"))
                .count(),
            3,
            "put {what} does not say why: {t}"
        );
        // The summary counts what arrived: no byte of a failed file.
        assert!(
            t.lines()
                .any(|l| l.starts_with("put: 0 files, 0 bytes") && l.ends_with("3 failed")),
            "put {what}: no summary line: {t}"
        );
    }
    // No file appears with a partial or empty body, under its name or a temporary one.
    let entries: Vec<String> = tree(&m.mp.join("tree")).into_keys().collect();
    assert_eq!(entries, vec!["d/".to_string()], "left behind: {entries:?}");
    // Writable again: put succeeds through the mount, bytes exact, summary line printed.
    let o = put(&v);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.lines()
            .any(|l| l.starts_with("put: 3 files") && l.ends_with("0 failed")),
        "{t}"
    );
    for (i, (n, len)) in files.iter().enumerate() {
        assert_eq!(
            std::fs::read(m.mp.join("tree").join(n)).unwrap(),
            data(i as u64, *len),
            "{n}"
        );
    }
    m.stop();
    let o = v.jfs(&["fsck", &v.meta]);
    assert!(o.status.success(), "fsck: {}", text(&o));
}

/// `jfs umount --force` with a file held open (and written, not yet closed) returns only once
/// the mount process has committed what it buffered and exited: the RocksDB volume can be
/// opened for writing at once afterwards, and the unclosed file's bytes are there.
#[test]
fn umount_force_returns_once_the_mount_process_let_go() {
    use std::io::Write;
    let v = new_vol();
    let mut m = v.mount();
    let held = data(11, 3 << 20);
    let mut f = std::fs::File::create(m.mp.join("held")).unwrap();
    f.write_all(&held).unwrap();
    // Not closed, not synced: the write sits in the mount's buffer.
    let o = v.jfs(&["umount", "--force", m.mp.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("exited"),
        "umount --force does not say the process let go: {}",
        text(&o)
    );
    // The writer lock is free now: a write command opens the volume itself.
    let o = v.jfs(&["mkdir", &v.meta, "/after"]);
    assert!(o.status.success(), "{}", text(&o));
    let st = m.child.take().unwrap().wait().unwrap();
    assert!(st.success(), "mount process exit: {st}");
    drop(f);
    let o = v.jfs(&["cat", &v.meta, "/held"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout.len(), held.len());
    assert!(o.stdout == held, "the unclosed file's bytes differ");
}

/// A command that needs the RocksDB metadata for itself while a mount writes it (`load`)
/// names the process that holds it: its PID and command line (the mount and its point).
#[test]
fn a_busy_rocksdb_volume_names_the_process_that_holds_it() {
    let v = new_vol();
    let m = v.mount();
    let dump = v.path("d.json");
    let o = v.jfs(&["dump", &v.meta, dump.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = v.jfs(&["load", &v.meta, dump.to_str().unwrap()]);
    assert!(!o.status.success());
    let want = format!(
        "locked by a running read-write mount at {} (pid {})",
        m.mp.display(),
        m.pid()
    );
    assert!(
        text(&o).contains(&want) && text(&o).contains(&format!("`jfs umount {}`", m.mp.display())),
        "the refusal does not name the mount ({want}): {}",
        text(&o)
    );
    m.stop();
}

/// `jfs-sync` resolves the path of a `jfs://` URL inside the volume too: one that climbs
/// above the volume's root is refused before anything is opened or copied.
#[test]
fn jfs_sync_volume_urls_stay_inside_the_volume() {
    let v = new_vol();
    canaries(&v);
    let listing = volume_listing(&v);
    let src = v.path("canary-src");
    let out = v.path("out");
    for (s, d) in [
        (
            src.to_str().unwrap().to_string(),
            "jfs://V/../escaped".to_string(),
        ),
        (
            src.to_str().unwrap().to_string(),
            "jfs://V/canary/../../x".to_string(),
        ),
        ("jfs://V/..".to_string(), out.to_str().unwrap().to_string()),
        (
            "jfs://V/../victim".to_string(),
            out.to_str().unwrap().to_string(),
        ),
    ] {
        let o = Command::new(bin("jfs-sync"))
            .args([s.as_str(), d.as_str()])
            .env("V", &v.meta)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{s} -> {d}: {t}");
        assert!(
            t.contains("climbs above the volume's root"),
            "{s} -> {d}: {t}"
        );
    }
    assert!(!out.exists(), "jfs-sync wrote {}", out.display());
    assert_eq!(volume_listing(&v), listing);
}

/// `rm -r X/.` and `X/..` are refused (as rm(1) refuses them) rather than taken for X or its
/// parent, and `rm LINK/` never removes the link (a trailing slash names a directory), with
/// and without a mount; a directory given with a trailing slash is removed as before.
#[test]
fn rm_refuses_dot_names_and_a_trailing_slash_on_a_link() {
    let v = new_vol();
    for (args, what) in [
        (vec!["mkdir", "-p", &v.meta, "/src/sub"], "mkdir"),
        (vec!["ln", "-s", &v.meta, "../elsewhere", "/src/link"], "ln"),
    ] {
        let o = v.jfs(&args);
        assert!(o.status.success(), "{what}: {}", text(&o));
    }
    let ls = |v: &Vol| text(&v.jfs(&["ls", &v.meta, "/src"]));
    for mounted in [false, true] {
        let m = mounted.then(|| v.mount());
        for p in ["/src/.", "/src/sub/..", "/src/link/."] {
            let o = v.jfs(&["rm", "-r", &v.meta, p]);
            assert!(
                !o.status.success(),
                "rm -r {p} (mounted: {mounted}) succeeded"
            );
            assert!(
                text(&o).contains("refusing to remove '.' or '..'"),
                "{}",
                text(&o)
            );
        }
        let o = v.jfs(&["rm", "-r", &v.meta, "/src/link/"]);
        assert!(
            !o.status.success(),
            "rm -r /src/link/ (mounted: {mounted}) succeeded"
        );
        assert!(text(&o).contains("not a directory"), "{}", text(&o));
        let l = ls(&v);
        assert!(
            l.contains("link") && l.contains("sub"),
            "mounted {mounted}: {l}"
        );
        drop(m);
    }
    let o = v.jfs(&["rm", "-r", &v.meta, "/src/sub/"]);
    assert!(o.status.success(), "rm -r /src/sub/: {}", text(&o));
    let l = ls(&v);
    assert!(l.contains("link") && !l.contains("sub"), "{l}");
}

/// A bind mount of `src` at `at`, undone when dropped (lazily if busy).
struct Bind(PathBuf);

impl Bind {
    fn new(src: &Path, at: &Path) -> Bind {
        let s = Command::new("mount")
            .arg("--bind")
            .arg(src)
            .arg(at)
            .status()
            .unwrap();
        assert!(
            s.success(),
            "mount --bind {} {}",
            src.display(),
            at.display()
        );
        Bind(at.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Write commands that go through a mount never cross into another file system mounted
/// below its mount point (here a bind mount of a host directory, as an operator might leave
/// one): each is refused with a message that says so, the host directory is unchanged, and
/// `rm -r` of a directory above it removes nothing at all.
#[test]
fn commands_through_a_mount_never_cross_into_a_mount_below_it() {
    let v = new_vol();
    let host = v.path("host");
    std::fs::create_dir_all(host.join("sub")).unwrap();
    std::fs::write(host.join("h1"), data(5, 3000)).unwrap();
    std::fs::write(host.join("sub/h2"), b"host file").unwrap();
    let before = tree(&host);
    let src = v.path("src.txt");
    std::fs::write(&src, b"from the host").unwrap();
    let m = v.mount();
    std::fs::create_dir_all(m.mp.join("d/bind")).unwrap();
    std::fs::write(m.mp.join("d/kept"), b"volume file").unwrap();
    let bind = Bind::new(&host, &m.mp.join("d/bind"));
    let src = src.to_str().unwrap();
    for args in [
        vec!["rm", &v.meta, "/d/bind/h1"],
        vec!["rm", "-r", &v.meta, "/d/bind/sub"],
        vec!["rm", "-r", &v.meta, "/d/bind"],
        vec!["rm", "-r", &v.meta, "/d"],
        vec!["put", &v.meta, src, "/d/bind/planted"],
        vec!["put", &v.meta, src, "/d/bind/"],
        vec!["mkdir", "-p", &v.meta, "/d/bind/new/dir"],
        vec!["mkdir", &v.meta, "/d/bind/new"],
        vec!["mv", &v.meta, "/d/bind/h1", "/moved"],
        vec!["mv", &v.meta, "/d/kept", "/d/bind/"],
        vec!["truncate", &v.meta, "/d/bind/h1", "0"],
        vec!["ln", "-s", &v.meta, "x", "/d/bind/lnk"],
    ] {
        let o = v.jfs(&args);
        let t = text(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {t}");
        assert!(
            t.contains("another file system mounted inside the mount"),
            "{args:?}: the message does not say why: {t}"
        );
        assert_eq!(tree(&host), before, "{args:?} changed the host directory");
    }
    assert_eq!(std::fs::read(m.mp.join("d/kept")).unwrap(), b"volume file");
    drop(bind);
    // Once unmounted, the same removal goes through and removes only the volume's files.
    let o = v.jfs(&["rm", "-r", &v.meta, "/d"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!m.mp.join("d").exists());
    assert_eq!(tree(&host), before);
    m.stop();
}
