//! Names are bytes (issue 43, items 11, 14, 17 and 21), as a user meets them: a name holding
//! any byte but `/` and NUL (0xff, a newline, an escape sequence) goes through `jfs put`,
//! `jfs get` and `jfs-sync` byte for byte; a destination that cannot hold it (an object store)
//! skips that entry, names it escaped and exits 1; an excluded directory changes nothing;
//! nothing prints such a name raw. Also what get, put and jfs-sync report when a link is
//! planted in the way or a run is repeated. Real binaries, separate processes.

use integration::{bin, data};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn run(name: &str, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Output {
    let mut c = Command::new(bin(name));
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run")
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A volume "v": RocksDB metadata and a local block store under one temporary directory.
struct Vol {
    dir: tempfile::TempDir,
    meta: String,
}

impl Vol {
    fn new() -> Vol {
        let dir = tempfile::tempdir().unwrap();
        let meta = format!("rocksdb://{}/meta", dir.path().display());
        let store = format!("file://{}/s", dir.path().display());
        let o = run(
            "jfs",
            &[
                os("format"),
                os(&meta),
                os("v"),
                os("--storage"),
                os(&store),
            ],
            &[],
        );
        assert!(o.status.success(), "format: {}", err(&o));
        Vol { dir, meta }
    }
    fn jfs(&self, args: &[&OsStr]) -> Output {
        let mut a: Vec<&OsStr> = vec![args[0], os(&self.meta)];
        a.extend_from_slice(&args[1..]);
        run("jfs", &a, &[])
    }
    /// jfs-sync with this volume as `jfs://VOL/...` and its state in the volume's directory.
    fn sync(&self, args: &[&OsStr]) -> Output {
        run(
            "jfs-sync",
            args,
            &[
                ("VOL", os(&self.meta)),
                ("XDG_CACHE_HOME", self.dir.path().join("cache").as_os_str()),
            ],
        )
    }
}

/// What a tree holds, by relative path as bytes: a file's bytes, a link's target, or a
/// directory.
fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, String> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<Vec<u8>, String>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let ft = e.file_type().unwrap();
            let what = if ft.is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                format!("link {:?}", t.as_os_str().as_bytes())
            } else if ft.is_dir() {
                walk(root, &r, out);
                "dir".to_string()
            } else {
                format!("file {:?}", std::fs::read(e.path()).unwrap())
            };
            out.insert(r.as_os_str().as_bytes().to_vec(), what);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn p(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

/// A tree with names no UTF-8 string holds, a newline, an escape sequence, and a link whose
/// target is not UTF-8.
fn hostile_tree(root: &Path) {
    std::fs::create_dir_all(root.join(p(b"d\xffir"))).unwrap();
    std::fs::write(root.join(p(b"d\xffir/f\xfe")), data(1, 3000)).unwrap();
    std::fs::write(root.join(p(b"new\nline")), b"a newline in the name").unwrap();
    std::fs::write(root.join(p(b"esc\x1b[31mred")), b"an escape sequence").unwrap();
    std::fs::write(root.join("plain"), b"plain").unwrap();
    std::os::unix::fs::symlink(p(b"tar\xffget"), root.join(p(b"link\xff"))).unwrap();
}

#[test]
fn names_of_any_bytes_go_put_volume_get_byte_identical() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out) = (t.path().join("src"), t.path().join("out"));
    hostile_tree(&src);
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "put: {}", err(&o));
    let o = v.jfs(&[os("get"), os("/t"), out.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "get: {}", err(&o));
    assert_eq!(
        snapshot(&out),
        snapshot(&src),
        "names and bytes as they were"
    );
    assert_eq!(snapshot(&src).len(), 6);

    // `jfs ls` quotes names as `ls --quoting-style=shell-escape` does: no raw newline,
    // escape byte or byte that is not UTF-8 inside a name.
    for args in [
        vec![os("ls"), os("/t")],
        vec![os("ls"), os("-l"), os("-R"), os("/t")],
    ] {
        let o = v.jfs(&args);
        assert_eq!(o.status.code(), Some(0), "ls: {}", err(&o));
        let s = String::from_utf8(o.stdout).expect("ls output is UTF-8");
        assert!(!s.contains('\x1b'), "{s:?}");
        assert!(!s.contains("new\nline"), "{s:?}");
        for want in [
            "'new'$'\\n''line'",
            "'esc'$'\\033''[31mred'",
            "'d'$'\\377''ir'",
            "'link'$'\\377'",
        ] {
            assert!(s.contains(want), "{want} in {s}");
        }
        if args.len() > 2 {
            assert!(s.contains("'f'$'\\376'"), "{s}");
            assert!(s.contains("-> 'tar'$'\\377''get'"), "{s}");
        } else {
            assert_eq!(s.lines().count(), 5, "one line a name: {s}");
        }
    }
}

#[test]
fn names_of_any_bytes_go_dir_volume_dir_through_jfs_sync_byte_identical() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out) = (t.path().join("src"), t.path().join("out"));
    hostile_tree(&src);
    let o = v.sync(&[src.as_os_str(), os("jfs://VOL/s"), os("--links")]);
    assert_eq!(o.status.code(), Some(0), "dir -> volume: {}", err(&o));
    let o = v.sync(&[os("jfs://VOL/s"), out.as_os_str(), os("--links")]);
    assert_eq!(o.status.code(), Some(0), "volume -> dir: {}", err(&o));
    assert_eq!(snapshot(&out), snapshot(&src));
    // A second run finds everything up to date, byte names included.
    let o = v.sync(&[src.as_os_str(), os("jfs://VOL/s"), os("--links")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(err(&o).contains("copied 0, updated 0"), "{}", err(&o));
}

#[test]
fn a_byte_name_in_an_excluded_directory_changes_nothing_and_delete_dst_runs() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(src.join("keep")).unwrap();
    std::fs::write(src.join("keep/a"), b"kept").unwrap();
    std::fs::create_dir_all(src.join(p(b"skip/sub\xff"))).unwrap();
    std::fs::write(src.join(p(b"skip/\xff")), b"x").unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("stale"), b"deleted by --delete-dst").unwrap();
    let o = run(
        "jfs-sync",
        &[
            src.as_os_str(),
            dst.as_os_str(),
            os("--exclude"),
            os("skip/"),
            os("--delete-dst"),
        ],
        &[("XDG_CACHE_HOME", t.path().join("cache").as_os_str())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(std::fs::read(dst.join("keep/a")).unwrap(), b"kept");
    assert!(!dst.join("stale").exists(), "--delete-dst ran");
    assert!(!dst.join("skip").exists());
}

/// Run `bin` as user nobody.
fn as_nobody(name: &str, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin(name))
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("setpriv")
}

#[test]
fn an_excluded_directory_is_never_read() {
    // Another user's backup of a shared tree: a directory it may not read, excluded, is not
    // opened at all (it used to fail the whole run).
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (src, dst, cache) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("cache"),
    );
    std::fs::create_dir_all(src.join("pub")).unwrap();
    std::fs::write(src.join("pub/a"), b"public").unwrap();
    std::fs::create_dir_all(src.join("private")).unwrap();
    std::fs::write(src.join("private/s"), b"secret").unwrap();
    std::fs::set_permissions(src.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    for d in [&dst, &cache] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let args = [src.as_os_str(), dst.as_os_str()];
    let env = [("XDG_CACHE_HOME", cache.as_os_str())];
    let o = as_nobody("jfs-sync", &args, &env);
    assert_ne!(
        o.status.code(),
        Some(0),
        "without --exclude it cannot read private/"
    );
    let o = as_nobody(
        "jfs-sync",
        &[args[0], args[1], os("--exclude"), os("private/")],
        &env,
    );
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(std::fs::read(dst.join("pub/a")).unwrap(), b"public");
    assert!(!dst.join("private").exists());
}

#[test]
fn a_name_an_object_store_cannot_hold_is_skipped_named_escaped_with_exit_1() {
    let t = tempfile::tempdir().unwrap();
    let (src, store) = (t.path().join("src"), t.path().join("store"));
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join(p(b"d/bad\xff")), b"x").unwrap();
    std::fs::write(src.join("d/ok"), b"ok").unwrap();
    std::fs::create_dir_all(&store).unwrap();
    let url = format!("opendal+fs://?root={}", store.display());
    let o = run(
        "jfs-sync",
        &[src.as_os_str(), os(&url)],
        &[("XDG_CACHE_HOME", t.path().join("cache").as_os_str())],
    );
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(!o.stderr.contains(&0xff), "no raw byte printed");
    assert!(
        std::str::from_utf8(&o.stderr).is_ok(),
        "messages are UTF-8: {}",
        err(&o)
    );
    let e = err(&o);
    assert!(
        e.contains("'d/bad'$'\\377'") && e.contains("not UTF-8"),
        "the entry is named, escaped, with why: {e}"
    );
    assert!(e.contains("failed 1"), "{e}");
    assert_eq!(std::fs::read(store.join("d/ok")).unwrap(), b"ok");
    assert_eq!(std::fs::read_dir(store.join("d")).unwrap().count(), 1);
}

#[test]
fn readers_never_list_a_puts_temporaries_but_a_users_lookalike_stays() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    // What a killed put leaves (exactly `tmp_name`'s form), and a user's own name that
    // only looks like one.
    let tmp = "/t/.f.jfs-tmp-4242-0badc0de";
    let mine = "/t/.f.jfs-tmp-notours";
    let o = v.jfs(&[os("mkdir"), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    for dest in ["/t/f", mine, tmp] {
        let o = v.jfs(&[os("put"), f.as_os_str(), os(dest)]);
        assert_eq!(o.status.code(), Some(0), "put {dest}: {}", err(&o));
    }
    let ls = v.jfs(&[os("ls"), os("/t")]);
    let mut listed: Vec<_> = std::str::from_utf8(&ls.stdout).unwrap().lines().collect();
    listed.sort();
    assert_eq!(listed, [".f.jfs-tmp-notours", "f"], "{}", err(&ls));
    let lsl = String::from_utf8_lossy(&v.jfs(&[os("ls"), os("-l"), os("-R"), os("/")]).stdout)
        .into_owned();
    assert!(
        !lsl.contains("0badc0de") && lsl.contains("notours"),
        "{lsl}"
    );
    // get and a jfs-sync export leave it out as well; the lookalike is copied.
    for (i, how) in ["get", "sync"].iter().enumerate() {
        let out = t.path().join(format!("out{i}"));
        let o = if *how == "get" {
            v.jfs(&[os("get"), os("/t"), out.as_os_str()])
        } else {
            v.sync(&[os("jfs://VOL/t"), out.as_os_str()])
        };
        assert_eq!(o.status.code(), Some(0), "{how}: {}", err(&o));
        let mut names: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".f.jfs-tmp-notours", "f"], "{how}");
    }
}

#[test]
fn get_counts_a_planted_directory_link_as_failed_and_copies_the_rest() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out, elsewhere) = (
        t.path().join("src"),
        t.path().join("out"),
        t.path().join("elsewhere"),
    );
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/f"), b"under the link").unwrap();
    std::fs::write(src.join("g"), b"beside it").unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("sub")).unwrap();
    let o = v.jfs(&[os("get"), os("/t"), out.as_os_str()]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "a partial failure: {e}");
    assert!(e.contains("1 failed"), "{e}");
    assert!(e.contains("sub is a symbolic link"), "named: {e}");
    assert!(
        e.contains("a symbolic link is in the way")
            && e.contains("remove it or choose another LOCAL"),
        "what to do: {e}"
    );
    assert_eq!(std::fs::read(out.join("g")).unwrap(), b"beside it");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "not followed"
    );
}

#[test]
fn jfs_sync_at_a_planted_directory_link_fails_at_once_naming_it_and_never_follows_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/f"), b"small").unwrap();
    std::fs::write(src.join("sub/big"), data(3, 6 << 20)).unwrap();
    std::fs::write(src.join("g"), b"beside it").unwrap();
    // A link inside the destination, leading to another directory of it.
    std::fs::create_dir_all(dst.join("other")).unwrap();
    std::os::unix::fs::symlink("other", dst.join("sub")).unwrap();
    let t0 = std::time::Instant::now();
    let o = run(
        "jfs-sync",
        &[src.as_os_str(), dst.as_os_str()],
        &[("XDG_CACHE_HOME", t.path().join("cache").as_os_str())],
    );
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("sub is a symbolic link where a directory is needed"),
        "{e}"
    );
    assert!(!e.contains("File exists") && !e.contains("retrying"), "{e}");
    assert!(e.contains("failed 2"), "{e}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "not retried"
    );
    assert_eq!(std::fs::read(dst.join("g")).unwrap(), b"beside it");
    assert_eq!(
        std::fs::read_dir(dst.join("other")).unwrap().count(),
        0,
        "nothing written through the link"
    );
}

#[test]
fn a_put_rerun_skips_complete_files() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), data(1, 100_000)).unwrap();
    std::fs::write(src.join("b"), data(2, 200_000)).unwrap();
    let put = || v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    let o = put();
    assert!(
        err(&o).contains("put: 2 files, 300000 bytes"),
        "{}",
        err(&o)
    );
    let o = put();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(
        err(&o).contains("put: 0 files, 0 bytes"),
        "nothing re-uploaded: {}",
        err(&o)
    );
    std::fs::write(src.join("b"), data(3, 200_001)).unwrap();
    let o = put();
    assert!(
        err(&o).contains("put: 1 files, 200001 bytes"),
        "{}",
        err(&o)
    );
    let out = t.path().join("out");
    let o = v.jfs(&[os("get"), os("/t"), out.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(snapshot(&out), snapshot(&src));
}

/// The block file in `store` holding exactly `bytes`.
fn block_holding(store: &Path, bytes: &[u8]) -> Option<PathBuf> {
    let mut stack = vec![store.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()? {
            let e = e.ok()?;
            if e.file_type().ok()?.is_dir() {
                stack.push(e.path());
            } else if e.metadata().ok()?.len() == bytes.len() as u64
                && std::fs::read(e.path()).ok()? == bytes
            {
                return Some(e.path());
            }
        }
    }
    None
}

#[test]
fn get_counts_only_the_bytes_it_wrote() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let big = data(7, 12 << 20);
    std::fs::write(src.join("big"), &big).unwrap();
    std::fs::write(src.join("small"), b"12345").unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // The last of big's three blocks goes missing: its first 8 MiB are read, then it fails.
    let block = block_holding(&v.dir.path().join("s"), &big[8 << 20..])
        .expect("the block of big's last 4 MiB");
    std::fs::remove_file(block).unwrap();
    let o = v.jfs(&[os("get"), os("/t"), t.path().join("out").as_os_str()]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("get: 1 files, 5 bytes") && e.contains("1 failed"),
        "only what was written: {e}"
    );
    assert!(!t.path().join("out/big").exists());
}

/// The mount lists names of any bytes as they are. (It still lists a put's temporaries: a
/// put through the mount finds the ones a killed put left by listing the directory there.)
#[test]
fn the_mount_lists_byte_names_as_they_are() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    hostile_tree(&src);
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let m = integration::mountproc::Mount::start(&v.meta, t.path(), "mnt", &[]);
    let mut want: Vec<Vec<u8>> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    want.sort();
    let mut listed: Vec<Vec<u8>> = std::fs::read_dir(m.mp.join("t"))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    listed.sort();
    assert_eq!(listed, want);
    assert_eq!(
        std::fs::read(m.mp.join("t").join(p(b"d\xffir/f\xfe"))).unwrap(),
        data(1, 3000)
    );
    m.stop();
}

/// `jfs get` enters every directory below LOCAL from its parent's descriptor without
/// following a link, and writes, chmods and stamps through descriptors held since then: a
/// directory swapped for a link to OUTSIDE while the get runs (here while a big file before
/// it is copied, one file at a time) is not written through, and OUTSIDE's mode stays.
/// Before, files were created by path after the check, and the modes set by path at the end:
/// OUTSIDE got `f` and `sub`'s mode.
#[test]
fn get_never_writes_through_a_directory_swapped_for_a_link_while_it_runs() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out, outside) = (
        t.path().join("src"),
        t.path().join("out"),
        t.path().join("outside"),
    );
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), data(3, 96 << 20)).unwrap();
    std::fs::write(src.join("sub/f"), b"under sub").unwrap();
    std::fs::set_permissions(src.join("sub"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let get = Command::new(bin("jfs"))
        .args([
            os("get"),
            os(&v.meta),
            os("/t"),
            out.as_os_str(),
            os("--threads"),
            os("1"),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While `a` is copied (its temporary file is there), `sub` (made, not yet written) is
    // swapped for a link.
    let copying_a = || {
        std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().as_bytes().starts_with(b".a.jfs-tmp"))
    };
    let t0 = std::time::Instant::now();
    while !copying_a() {
        assert!(t0.elapsed().as_secs() < 60, "a's copy never started");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::fs::rename(out.join("sub"), out.join("sub.moved")).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("sub")).unwrap();
    let o = get.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written through the link"
    );
    assert_eq!(
        std::fs::metadata(&outside).unwrap().mode() & 0o7777,
        0o700,
        "chmod through the link"
    );
    // What was copied went into the directory get made (now sub.moved).
    assert_eq!(
        std::fs::read(out.join("sub.moved/f")).unwrap(),
        b"under sub"
    );
    assert_eq!(
        std::fs::metadata(out.join("sub.moved")).unwrap().mode() & 0o7777,
        0o755
    );
}

/// A link where the volume has a file (`LOCAL/f -> OUTSIDE/x`) is replaced by the file (the
/// rename is made in the directory get holds), never written through.
#[test]
fn get_replaces_a_link_where_the_volume_has_a_file_and_never_writes_through_it() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out, outside) = (
        t.path().join("src"),
        t.path().join("out"),
        t.path().join("outside"),
    );
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"volume bytes").unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x"), b"outside").unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(outside.join("x"), out.join("f")).unwrap();
    let o = v.jfs(&[os("get"), os("/t"), out.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(std::fs::read(outside.join("x")).unwrap(), b"outside");
    let m = std::fs::symlink_metadata(out.join("f")).unwrap();
    assert!(m.is_file(), "the link is replaced by the volume's file");
    assert_eq!(std::fs::read(out.join("f")).unwrap(), b"volume bytes");
}

/// A file deleted while `jfs put` runs (after its directory was listed, before its turn: here
/// while a big file before it is uploaded, one file at a time) is named as vanished, the put
/// goes on and exits 1.
#[test]
fn put_names_a_file_that_vanished_while_it_ran_and_goes_on() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), data(5, 96 << 20)).unwrap();
    std::fs::write(src.join("m"), b"deleted meanwhile").unwrap();
    std::fs::write(src.join("z"), b"last").unwrap();
    let put = Command::new(bin("jfs"))
        .args([
            os("put"),
            os(&v.meta),
            src.as_os_str(),
            os("/t"),
            os("--threads"),
            os("1"),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `a` is open (the tree is listed, its upload under way): `m` goes.
    let fds = PathBuf::from(format!("/proc/{}/fd", put.id()));
    let t0 = std::time::Instant::now();
    while !std::fs::read_dir(&fds)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == src.join("a")))
    {
        assert!(t0.elapsed().as_secs() < 60, "a's upload never started");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::fs::remove_file(src.join("m")).unwrap();
    let o = put.wait_with_output().unwrap();
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!("{} vanished", src.join("m").display())) && e.contains("1 failed"),
        "{e}"
    );
    let cat = v.jfs(&[os("cat"), os("/t/z")]);
    assert_eq!(cat.stdout, b"last");
}

/// `jfs stat` of a link whose target holds a byte that is not UTF-8 and a newline prints the
/// target shell-escaped, as `jfs ls` does: no byte lost (before: U+FFFD), no raw newline.
#[test]
fn stat_prints_a_link_target_of_any_bytes_escaped() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::os::unix::fs::symlink(p(b"tar\xff\nget"), src.join("l")).unwrap();
    std::os::unix::fs::symlink("plain target", src.join("m")).unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/t")]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let stat = |path: &str| -> serde_json::Value {
        let o = v.jfs(&[os("stat"), os(path)]);
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    assert_eq!(stat("/t/l")["target"], "'tar'$'\\377'$'\\n''get'");
    assert_eq!(stat("/t/m")["target"], "plain target");
    let o = v.jfs(&[os("ls"), os("-l"), os("/t")]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("-> 'tar'$'\\377'$'\\n''get'"),
        "as ls shows it: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `jfs put` of a RocksDB volume that a mount holds goes through the mount (its one writer):
/// names of any bytes arrive byte for byte there too. It refused the whole put at the first
/// name that was not UTF-8 ("... is not UTF-8", exit 2, nothing copied).
#[test]
fn names_of_any_bytes_go_put_through_a_mount_byte_identical() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    hostile_tree(&src);
    // The mount holds the RocksDB volume: the put can only go through it.
    let m = integration::mountproc::Mount::start(&v.meta, t.path(), "mnt", &[]);
    let o = run(
        "jfs",
        &[os("put"), os(&v.meta), src.as_os_str(), os("/t")],
        &[("JFS_RUN_DIR", m.run_dir.as_os_str())],
    );
    assert_eq!(o.status.code(), Some(0), "put: {}", err(&o));
    assert_eq!(
        snapshot(&m.mp.join("t")),
        snapshot(&src),
        "names and bytes as they were, through the mount"
    );
    m.stop();
    // And in the volume itself, read back without the mount.
    let out = t.path().join("out");
    let o = v.jfs(&[os("get"), os("/t"), out.as_os_str()]);
    assert_eq!(o.status.code(), Some(0), "get: {}", err(&o));
    assert_eq!(snapshot(&out), snapshot(&src));
}

/// `jfs-sync --from-journal` follows changes to names that are not UTF-8: a rewritten,
/// a new, a renamed and a removed one reach the destination (the journal's operations hold
/// names as text, lossily; the keys came out as `k\u{fffd}` and the changes were missed with
/// exit 0).
#[test]
fn from_journal_follows_changes_to_names_of_any_bytes() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let (src, out) = (t.path().join("src"), t.path().join("out"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join(p(b"k\xff")), b"one").unwrap();
    std::fs::write(src.join(p(b"k\xfe")), b"two").unwrap();
    std::fs::write(src.join(p(b"gone\xfd")), b"bye").unwrap();
    std::fs::write(src.join("plain"), b"p").unwrap();
    let o = v.jfs(&[os("put"), src.as_os_str(), os("/fj")]);
    assert_eq!(o.status.code(), Some(0), "put: {}", err(&o));
    let sync = || {
        v.sync(&[
            os("jfs://VOL/fj"),
            out.as_os_str(),
            os("--from-journal"),
            os("--delete-dst"),
        ])
    };
    let o = sync();
    assert_eq!(o.status.code(), Some(0), "first: {}", err(&o));
    assert_eq!(snapshot(&out), snapshot(&src));

    // Rewrite one, add one, rename one, remove one, and bring the volume to match with
    // jfs-sync (which carries bytes): its journal then holds them.
    std::fs::write(src.join(p(b"k\xfe")), b"TWO-CHANGED").unwrap();
    std::fs::write(src.join(p(b"new\xfc")), b"new").unwrap();
    std::fs::rename(src.join(p(b"k\xff")), src.join(p(b"moved\xfb"))).unwrap();
    std::fs::remove_file(src.join(p(b"gone\xfd"))).unwrap();
    let o = v.sync(&[src.as_os_str(), os("jfs://VOL/fj"), os("--delete-dst")]);
    assert_eq!(o.status.code(), Some(0), "dir -> volume: {}", err(&o));

    let o = sync();
    assert_eq!(o.status.code(), Some(0), "second: {}", err(&o));
    assert_eq!(snapshot(&out), snapshot(&src), "{}", err(&o));
}

/// A mount point is bytes too: a mount at a path that is not UTF-8 (with a newline in it)
/// comes up, serves, is listed quoted by `jfs status` and unmounts with `jfs umount`. Before,
/// the mount's control socket panicked answering its first request, so `jfs mount` said
/// "did not answer" (exit 2) while the kernel mount was up, and `jfs umount` called it
/// "not mounted".
#[test]
fn a_mount_point_of_any_bytes_mounts_serves_and_unmounts() {
    integration::mountproc::fuse_ready();
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let mp = t.path().join(p(b"mp\xff\nx"));
    std::fs::create_dir(&mp).unwrap();
    let run_dir = t.path().join("run");
    let env = [("JFS_RUN_DIR", run_dir.as_os_str())];
    let o = run(
        "jfs",
        &[
            os("mount"),
            os(&v.meta),
            mp.as_os_str(),
            os("-d"),
            os("--cache-size"),
            os("0"),
        ],
        &env,
    );
    assert_eq!(o.status.code(), Some(0), "mount: {}", err(&o));
    let up = integration::mountproc::is_mounted(&mp);
    std::fs::write(mp.join("f"), b"through it").ok();
    let read = std::fs::read(mp.join("f")).ok();
    let st = run("jfs", &[os("status"), os(&v.meta)], &env);
    let o = run("jfs", &[os("umount"), mp.as_os_str()], &env);
    if integration::mountproc::is_mounted(&mp) {
        let _ = Command::new("fusermount3").arg("-u").arg(&mp).status();
    }
    assert!(up, "not mounted");
    assert_eq!(read.as_deref(), Some(&b"through it"[..]));
    let status = String::from_utf8_lossy(&st.stdout);
    // The session record holds the mount point as text (a byte that is not UTF-8 reads as
    // U+FFFD there); the newline is quoted, never printed raw.
    assert!(status.contains(r"$'\n''x'"), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.contains(" live ") && l.contains("pid")),
        "{status}"
    );
    assert_eq!(o.status.code(), Some(0), "umount: {}", err(&o));
    assert!(!integration::mountproc::is_mounted(&mp));
}

/// `jfs fsck` names a broken file quoted as `jfs ls` does: a newline or escape byte in its
/// name never reaches the terminal raw (it printed `BROKEN /odd<newline>name`).
#[test]
fn fsck_quotes_the_names_it_reports() {
    let v = Vol::new();
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    let bytes = data(7, 5000);
    std::fs::write(&f, &bytes).unwrap();
    let o = v.jfs(&[
        os("put"),
        f.as_os_str(),
        OsStr::from_bytes(b"/odd\nname\x1b[2J"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let block = block_holding(&v.dir.path().join("s"), &bytes).expect("the file's block");
    std::fs::remove_file(&block).unwrap();
    let o = v.jfs(&[os("fsck")]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.starts_with("BROKEN "))
        .unwrap_or_else(|| panic!("no BROKEN line: {out}"));
    assert!(
        line.starts_with(r"BROKEN '/odd'$'\n''name'$'\033''[2J': block "),
        "{line}"
    );
    assert!(!out.contains('\x1b'), "{out}");
}
