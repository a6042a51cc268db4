//! FUSE passthrough of files held whole in the local cache (`jfs mount --passthrough auto`,
//! the default): the kernel reads a local copy; a change is never served from an old copy; a
//! damaged copy is never served; eviction while open is safe; a mount that is not root falls
//! back and says so.
//!
//! These need /dev/fuse, fusermount3 and root (the kernel lends backing files to
//! CAP_SYS_ADMIN only), and a kernel with FUSE passthrough (6.9+): they fail, never skip,
//! without them.

use integration::mountproc::{metric, Mount, Vol};
use integration::{bin, data};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LEN: usize = 12 << 20;

fn new_vol(engine: &str) -> Vol {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests need root (FUSE passthrough's backing files need CAP_SYS_ADMIN)"
    );
    integration::mountproc::new_vol(engine)
}

fn jfs_in(m: &Mount, args: &[&str]) -> std::process::Output {
    Command::new(bin("jfs"))
        .args(args)
        .env("JFS_RUN_DIR", &m.run_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Wait for a mount statistic to reach `want`.
fn stat_at_least(m: &Mount, name: &str, want: f64) -> f64 {
    let t0 = Instant::now();
    loop {
        let v = metric(&m.stats(), name);
        if v >= want {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{name} stayed at {v} (wanted {want}); log: {}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Read a file through the mount, whole, and close it.
fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The whole-file copies in a mount's cache directory.
fn whole_copies(m: &Mount) -> Vec<PathBuf> {
    let cache = m.mp.with_file_name(format!(
        "{}-cache",
        m.mp.file_name().unwrap().to_string_lossy()
    ));
    let mut out = Vec::new();
    for vol in std::fs::read_dir(&cache).unwrap().flatten() {
        if let Ok(rd) = std::fs::read_dir(vol.path().join("whole")) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !n.ends_with(".rec") && !n.starts_with('.') {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// Make `f` (written through the mount) served by passthrough: read it whole once, wait
/// for its copy.
fn make_passthrough(m: &Mount, f: &Path, made_before: f64) {
    read(f);
    stat_at_least(m, "jfs_whole_files_made_total", made_before + 1.0);
}

#[test]
fn a_cached_file_is_read_by_the_kernel_and_a_change_is_never_served_from_its_copy() {
    // Redis: a second mount writes too.
    let v = new_vol("redis");
    let m = Mount::start(&v.meta, v.dir.path(), "m", &["--cache-size", "1G"]);
    let f = m.mp.join("model.bin");
    let v1 = data(1, LEN);
    std::fs::write(&f, &v1).unwrap();
    make_passthrough(&m, &f, 0.0);
    assert_eq!(whole_copies(&m).len(), 1);

    // Served by the kernel from the copy: byte-identical, and no byte read through the mount.
    let before = m.stats();
    let mut h1 = std::fs::File::open(&f).unwrap();
    let mut got = Vec::new();
    h1.read_to_end(&mut got).unwrap();
    assert!(got == v1, "passthrough read differs from what was written");
    let after = m.stats();
    assert_eq!(
        metric(&after, "jfs_passthrough_opens_total")
            - metric(&before, "jfs_passthrough_opens_total"),
        1.0
    );
    assert_eq!(
        metric(&after, "jfs_fuse_read_bytes_total"),
        metric(&before, "jfs_fuse_read_bytes_total"),
        "a passthrough read went through the mount"
    );
    // mmap of the same file (as safetensors loads) reads the same bytes.
    assert_eq!(
        mmap_sha256(&f),
        sha256(&v1),
        "mmap of a passthrough file differs"
    );

    // The file changes while h1 is still open: a writer at this mount overwrites 1 MiB.
    let v2 = {
        let mut b = v1.clone();
        b[..1 << 20].copy_from_slice(&data(2, 1 << 20));
        b
    };
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all(&v2[..1 << 20]).unwrap();
    w.sync_all().unwrap();
    drop(w);
    // A new open sees the new bytes (never the old copy)...
    assert!(read(&f) == v2, "an open after the change read the old copy");
    // ...while the handle open since before keeps the version it opened, whole.
    let mut old = vec![0u8; LEN];
    h1.seek(SeekFrom::Start(0)).unwrap();
    h1.read_exact(&mut old).unwrap();
    assert!(old == v1, "an open handle saw a mix of versions");
    drop(h1);

    // Once nothing holds the old copy, a copy of the new version replaces it (made after a
    // whole read through the mount, which may be the one above): opens are passthrough
    // again, with the new bytes.
    let t0 = Instant::now();
    loop {
        let p0 = metric(&m.stats(), "jfs_passthrough_opens_total");
        assert!(
            read(&f) == v2,
            "an open after the change read the old bytes"
        );
        if metric(&m.stats(), "jfs_passthrough_opens_total") > p0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no passthrough of the new version"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        whole_copies(&m).len(),
        1,
        "the stale copy was left beside the new one"
    );

    // A write through another mount (another client) is seen at the next open too.
    let m2 = Mount::start(&v.meta, v.dir.path(), "m2", &[]);
    let v3 = data(3, LEN / 2);
    std::fs::write(m2.mp.join("model.bin"), &v3).unwrap();
    drop(m2);
    let t0 = Instant::now();
    loop {
        // (the first mount's attribute cache may answer the old length for 1 s)
        let b = read(&f);
        if b == v3 {
            break;
        }
        assert!(b == v2, "neither the old nor the new bytes");
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the other client's write is not seen"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    m.stop();
}

/// SHA-256 of a file read through mmap (as safetensors loads), by Python.
fn mmap_sha256(p: &Path) -> String {
    let o = Command::new("python3")
        .args([
            "-c",
            "import hashlib,mmap,sys\nf=open(sys.argv[1],'rb')\nm=mmap.mmap(f.fileno(),0,access=mmap.ACCESS_READ)\nprint(hashlib.sha256(m).hexdigest())",
        ])
        .arg(p)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mmap read: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn sha256(b: &[u8]) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b).unwrap();
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_damaged_copy_is_never_served_and_eviction_while_open_is_safe() {
    let v = new_vol("rocksdb");
    let m = Mount::start(&v.meta, v.dir.path(), "m", &["--cache-size", "1G"]);
    let f = m.mp.join("w.bin");
    let want = data(7, LEN);
    std::fs::write(&f, &want).unwrap();
    make_passthrough(&m, &f, 0.0);
    let copy = whole_copies(&m).pop().expect("a whole-file copy");

    // Alter the copy in place: the next open must not serve it.
    let mut p = std::fs::metadata(&copy).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o644);
    std::fs::set_permissions(&copy, p).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .write_all_at(b"garbage", 4096)
        .unwrap();
    let d0 = metric(&m.stats(), "jfs_cache_damaged_total");
    let p0 = metric(&m.stats(), "jfs_passthrough_opens_total");
    assert!(read(&f) == want, "a damaged copy was served");
    let s = m.stats();
    assert_eq!(
        metric(&s, "jfs_passthrough_opens_total"),
        p0,
        "the damaged copy was handed out"
    );
    assert_eq!(metric(&s, "jfs_cache_damaged_total"), d0 + 1.0);
    // (a new copy may already stand at the same path: the read above was whole)
    assert!(
        std::fs::read(&copy).map_or(true, |b| &b[4096..4103] != b"garbage"),
        "the damaged copy was kept"
    );

    // A new copy (from that read); open it, evict it while open, read on.
    stat_at_least(&m, "jfs_whole_files_made_total", 2.0);
    let h = std::fs::File::open(&f).unwrap();
    let mut head = vec![0u8; 1 << 20];
    h.read_exact_at(&mut head, 0).unwrap();
    let o = jfs_in(&m, &["warmup", "--evict", f.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "evict: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(whole_copies(&m).is_empty(), "evict left the whole copy");
    let mut rest = vec![0u8; LEN];
    h.read_exact_at(&mut rest, 0).unwrap();
    assert!(
        rest == want,
        "a handle open across eviction read wrong bytes"
    );
    drop(h);
    // And the next open reads through the mount (the blocks come from the store).
    assert!(read(&f) == want);

    // jfs warmup makes the copy at once: the very next open is passthrough.
    let o = jfs_in(&m, &["warmup", f.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "warmup: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(whole_copies(&m).len(), 1);
    let p1 = metric(&m.stats(), "jfs_passthrough_opens_total");
    assert!(read(&f) == want);
    assert_eq!(metric(&m.stats(), "jfs_passthrough_opens_total"), p1 + 1.0);
    m.stop();
}

/// A mount in a user namespace (a container's root, which the kernel does not let lend
/// backing files): it says once, at mount time, that passthrough is off, makes no whole-file
/// copies, and reads through the mount.
#[test]
fn a_mount_without_the_hosts_root_reads_through_the_mount_and_says_so() {
    let v = new_vol("rocksdb");
    let top = v.dir.path();
    let want = data(9, LEN);
    let src = top.join("src.bin");
    std::fs::write(&src, &want).unwrap();
    let o = Command::new(bin("jfs"))
        .args(["put", &v.meta, src.to_str().unwrap(), "/f"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "put: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (mp, log, cache) = (top.join("mnt"), top.join("mount.log"), top.join("cache"));
    std::fs::create_dir_all(&mp).unwrap();
    // In the namespace: mount, read the file whole twice (a root mount would copy it whole
    // after the first and pass the second through), print both checksums, unmount.
    let script = format!(
        "set -e; J={jfs}; $J mount {meta} {mp} -d --cache-dir {cache} --cache-size 1G --free-space-ratio 0.01 --log {log} >/dev/null 2>&1; \
         trap '$J umount {mp} >/dev/null 2>&1 || $J umount --force {mp} >/dev/null 2>&1' EXIT; \
         sha256sum {mp}/f; sleep 1; sha256sum {mp}/f",
        jfs = bin("jfs").display(),
        meta = v.meta,
        mp = mp.display(),
        cache = cache.display(),
        log = log.display(),
    );
    let o = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ])
        .env("JFS_RUN_DIR", top.join("run"))
        .output()
        .unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        o.status.success(),
        "in a user namespace: {} {}; log: {said}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let sums: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let expect = sha256(&want);
    assert_eq!(
        sums,
        vec![expect.clone(), expect],
        "bytes read in the namespace differ"
    );
    assert_eq!(
        said.matches("FUSE passthrough is off").count(),
        1,
        "not said once: {said}"
    );
    assert!(said.contains("user namespace"), "{said}");
    let copies = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .filter_map(|d| std::fs::read_dir(d.path().join("whole")).ok())
        .flat_map(|rd| rd.flatten())
        .count();
    assert_eq!(copies, 0, "a whole-file copy was made with passthrough off");
}

/// A warm-up into a whole-file copy that the cache cannot hold fails and says why; nothing
/// is left behind, and the cache keeps its size.
#[test]
fn a_whole_copy_too_big_for_the_cache_is_refused_loudly() {
    let v = new_vol("rocksdb");
    let m = Mount::start(&v.meta, v.dir.path(), "m", &["--cache-size", "9M"]);
    let f = m.mp.join("big.bin");
    let want = data(11, LEN);
    std::fs::write(&f, &want).unwrap();
    let o = jfs_in(&m, &["warmup", f.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the local cache is full"), "{err}");
    assert!(whole_copies(&m).is_empty());
    assert!(metric(&m.stats(), "jfs_cache_bytes") <= (9 << 20) as f64);
    assert!(read(&f) == want);
    m.stop();
}
