//! `jfs mount` through real FUSE: pjdfstest on every engine, a randomized differential test
//! against a local directory, two mounts of one volume, kill -9 during writes, a damaged
//! local cache, warmup, and write commands reaching a RocksDB volume through its mount.
//!
//! These need /dev/fuse and fusermount3 (Debian fuse3): without them they fail, never skip.

use integration::mountproc::{fuse_ready, is_mounted, metric, new_vol, Mount, Vol};
use integration::{bin, data};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run_dir(v: &Vol) -> PathBuf {
    v.dir.path().join("run")
}

fn jfs(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(bin("jfs"));
    c.args(args).stdin(Stdio::null());
    for (k, val) in env {
        c.env(k, val);
    }
    c.output().expect("running jfs")
}

fn jfs_in(v: &Vol, args: &[&str]) -> std::process::Output {
    let rd = run_dir(v);
    jfs(args, &[("JFS_RUN_DIR", rd.to_str().unwrap())])
}

fn mount(v: &Vol, name: &str, extra: &[&str]) -> Mount {
    Mount::start(&v.meta, v.dir.path(), name, extra)
}

// ---------------------------------------------------------------------------------------
// pjdfstest

fn pjdfstest_bin() -> PathBuf {
    let p = std::env::var_os("JFS_PJDFSTEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/jfs-tools/bin/pjdfstest")
        });
    assert!(
        p.exists(),
        "pjdfstest is missing at {}: `bash integration/install-deps.sh` installs it (cargo install pjdfstest --version 0.2.2 --locked)",
        p.display()
    );
    p
}

/// Tests that pass on a local directory and may not on the mount, each with its reason
/// (integration/pjdfstest-exclusions.txt).
fn exclusions() -> Vec<String> {
    let s = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("pjdfstest-exclusions.txt"),
    )
    .unwrap();
    s.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

fn pjd_config(dir: &Path) -> PathBuf {
    let cfg = dir.join("pjd.toml");
    std::fs::write(
        &cfg,
        "[settings]\nnaptime = 0.01\n\n[features]\nposix_fallocate = {}\n\n[dummy_auth]\nentries = [[\"nobody\", \"nogroup\"], [\"daemon\", \"daemon\"]]\n",
    )
    .unwrap();
    cfg
}

/// Run pjdfstest in `dir`: (passed test names, whole output).
fn pjdfstest_in(dir: &Path, cfg: &Path) -> (std::collections::BTreeSet<String>, String) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = Command::new(pjdfstest_bin())
        .args(["-c", cfg.to_str().unwrap(), "-p", dir.to_str().unwrap()])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        out.lines().any(|l| l.starts_with("Summary:")),
        "no pjdfstest summary in {}:\n{out}",
        dir.display()
    );
    let ok = out
        .lines()
        .filter(|l| l.contains("::") && l.trim_end().ends_with(" ok"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    (ok, out)
}

/// What passes on a plain local directory with the same configuration (ext4 here: 356).
fn local_baseline() -> &'static std::collections::BTreeSet<String> {
    static B: std::sync::OnceLock<std::collections::BTreeSet<String>> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let cfg = pjd_config(d.path());
        let root = d.path().join("local");
        std::fs::create_dir(&root).unwrap();
        let (ok, out) = pjdfstest_in(&root, &cfg);
        assert!(
            ok.len() > 300,
            "the local baseline passes only {}:\n{out}",
            ok.len()
        );
        ok
    })
}

fn pjdfstest_on(engine: &str) {
    let v = new_vol(engine);
    let m = mount(&v, "mnt", &["--cache-size", "0", "--allow-other"]);
    let cfg = pjd_config(v.dir.path());
    let (ok, out) = pjdfstest_in(&m.mp, &cfg);
    let base = local_baseline();
    let excl = exclusions();
    assert!(
        excl.len() * 20 <= base.len(),
        "more than 5% of the suite is excluded ({} of {})",
        excl.len(),
        base.len()
    );
    let missing: Vec<&String> = base
        .iter()
        .filter(|t| !ok.contains(*t) && !excl.contains(*t))
        .collect();
    assert!(
        missing.is_empty(),
        "on {engine}, these pass on a local directory but not on the mount: {missing:?}\n{out}"
    );
    assert!(
        ok.len() + excl.len() >= base.len(),
        "on {engine} only {} passed (local: {})",
        ok.len(),
        base.len()
    );
    m.stop();
}

#[test]
fn pjdfstest_passes_on_rocksdb() {
    pjdfstest_on("rocksdb");
}

#[test]
fn pjdfstest_passes_on_redis() {
    pjdfstest_on("redis");
}

#[test]
fn pjdfstest_passes_on_postgres() {
    pjdfstest_on("postgres");
}

// ---------------------------------------------------------------------------------------
// Differential: random operations on the mount and on a local directory.

fn outcome<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

struct Side {
    root: PathBuf,
    open: Vec<(String, std::fs::File)>,
}

/// One random operation, applied to both sides; the outcomes must match.
fn step(rng: &mut impl rand::Rng, sides: &mut [Side; 2], i: usize) {
    let names = ["a", "b", "c", "d/a", "d/b", "d/e/a", "e", "d/e"];
    let n1 = names[rng.random_range(0..names.len())];
    let n2 = names[rng.random_range(0..names.len())];
    let op = rng.random_range(0..15);
    let off = rng.random_range(0..(3u64 << 20));
    let len = [1usize, 100, 4096, 70_000, 1 << 20][rng.random_range(0..5)];
    let payload = data(i as u64, len);
    let mode = [0o600, 0o644, 0o755, 0o700][rng.random_range(0..4)];
    let mut res: Vec<String> = Vec::new();
    for s in sides.iter_mut() {
        let p1 = s.root.join(n1);
        let p2 = s.root.join(n2);
        let r = match op {
            0 => format!(
                "{:?}",
                outcome(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .open(&p1)
                        .and_then(|f| f.write_all_at(&payload, off))
                )
            ),
            1 => {
                format!(
                    "{:?}",
                    outcome(std::fs::OpenOptions::new().append(true).open(&p1).and_then(
                        |mut f| {
                            use std::io::Write;
                            f.write_all(&payload)
                        }
                    ))
                )
            }
            2 => format!(
                "{:?}",
                outcome(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&p1)
                        .and_then(|f| f.set_len(off / 3))
                )
            ),
            3 => format!("{:?}", outcome(std::fs::rename(&p1, &p2))),
            4 => format!("{:?}", outcome(std::fs::remove_file(&p1))),
            5 => format!("{:?}", outcome(std::fs::hard_link(&p1, &p2))),
            6 => format!("{:?}", outcome(std::os::unix::fs::symlink(n1, &p2))),
            7 => format!(
                "{:?}",
                outcome(std::fs::set_permissions(
                    &p1,
                    std::fs::Permissions::from_mode(mode)
                ))
            ),
            8 => format!(
                "{:?}",
                outcome(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&p1)
                        .and_then(|f| {
                            f.set_modified(
                                std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + i as u64),
                            )
                        })
                )
            ),
            9 => format!("{:?}", outcome(std::fs::create_dir(&p1))),
            10 => format!("{:?}", outcome(std::fs::remove_dir(&p1))),
            11 => {
                // Read a range.
                let r = std::fs::File::open(&p1).and_then(|f| {
                    let mut b = vec![0u8; len];
                    let n = f.read_at(&mut b, off / 2)?;
                    b.truncate(n);
                    Ok(crc32c::crc32c(&b))
                });
                format!("{:?}", outcome(r))
            }
            12 => {
                // Open and keep the handle (then unlink may come).
                match std::fs::OpenOptions::new().read(true).write(true).open(&p1) {
                    Ok(f) => {
                        s.open.push((n1.to_string(), f));
                        "opened".into()
                    }
                    Err(e) => format!("{:?}", e.raw_os_error()),
                }
            }
            13 => {
                // Through a kept handle (maybe of an unlinked file): write, then read all.
                if s.open.is_empty() {
                    "none".into()
                } else {
                    let k = i % s.open.len();
                    let f = &s.open[k].1;
                    let r = f
                        .write_all_at(&payload[..len.min(5000)], off % 100_000)
                        .and_then(|_| {
                            let l = f.metadata()?.len();
                            let mut b = vec![0u8; l as usize];
                            f.read_exact_at(&mut b, 0)?;
                            Ok((l, crc32c::crc32c(&b)))
                        });
                    format!("{:?}", outcome(r))
                }
            }
            _ => {
                // Close the oldest kept handle.
                if s.open.is_empty() {
                    "none".into()
                } else {
                    s.open.remove(0);
                    "closed".into()
                }
            }
        };
        res.push(r);
    }
    assert_eq!(
        res[0], res[1],
        "op {i} (kind {op}, {n1} {n2}, off {off}, len {len}) differs: mount {} vs local {}",
        res[0], res[1]
    );
}

/// Files, links and directories under `root` with bytes, modes, mtimes and link counts.
fn tree(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let what = if m.is_dir() {
                stack.push(p);
                format!("dir {:o}", m.mode() & 0o7777)
            } else if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else {
                let b = std::fs::read(&p).unwrap();
                format!(
                    "file {:o} len {} crc {:08x} nlink {}",
                    m.mode() & 0o7777,
                    b.len(),
                    crc32c::crc32c(&b),
                    m.nlink()
                )
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

#[test]
fn random_operations_match_a_local_directory_and_survive_a_remount() {
    use rand::SeedableRng;
    let v = new_vol("rocksdb");
    let local = tempfile::tempdir().unwrap();
    let seed: u64 = std::env::var("JFS_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("differential seed {seed} (JFS_DIFF_SEED={seed} repeats it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let m = mount(
        &v,
        "mnt",
        &[
            "--attr-cache",
            "0s",
            "--entry-cache",
            "0s",
            "--dir-entry-cache",
            "0s",
        ],
    );
    for root in [m.mp.clone(), local.path().to_path_buf()] {
        std::fs::create_dir_all(root.join("d/e")).unwrap();
    }
    let mut sides = [
        Side {
            root: m.mp.clone(),
            open: Vec::new(),
        },
        Side {
            root: local.path().to_path_buf(),
            open: Vec::new(),
        },
    ];
    for i in 0..2500 {
        step(&mut rng, &mut sides, i);
    }
    sides[0].open.clear();
    sides[1].open.clear();
    let (a, b) = (tree(&m.mp), tree(local.path()));
    assert_eq!(a, b, "final trees differ (seed {seed})");
    assert!(a.len() >= 3, "the run made too little: {a:?}");
    m.stop();
    // The same tree after a remount, and the metadata is consistent.
    let m = mount(&v, "mnt", &[]);
    assert_eq!(
        tree(&m.mp),
        b,
        "the tree changed across a remount (seed {seed})"
    );
    m.stop();
    let o = jfs(&["fsck", &v.meta], &[]);
    assert!(
        o.status.success(),
        "fsck: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = jfs(&["status", &v.meta, "--json"], &[]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["kept_inodes"], 0,
        "unlinked files kept after every close: {s}"
    );
    assert_eq!(
        s["sessions"].as_array().unwrap().len(),
        0,
        "sessions left: {s}"
    );
}

// ---------------------------------------------------------------------------------------
// Two mounts of one volume.

fn two_mounts(engine: &str) {
    let v = new_vol(engine);
    let a = mount(&v, "a", &["--attr-cache", "0s", "--entry-cache", "0s"]);
    let b = mount(&v, "b", &["--attr-cache", "0s", "--entry-cache", "0s"]);
    // Close-to-open: closed at A, read whole at B.
    let payload = data(7, 9 << 20 | 12345);
    std::fs::write(a.mp.join("model.bin"), &payload).unwrap();
    assert_eq!(std::fs::read(b.mp.join("model.bin")).unwrap(), payload);
    // Concurrent appends to different files from both mounts lose nothing.
    let mut threads = Vec::new();
    for (k, mp) in [a.mp.clone(), b.mp.clone()].into_iter().enumerate() {
        threads.push(std::thread::spawn(move || {
            for f in 0..3 {
                for r in 0..40 {
                    let mut h = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(mp.join(format!("log-{k}-{f}")))
                        .unwrap();
                    use std::io::Write;
                    h.write_all(format!("{k} {f} {r:04}\n").as_bytes()).unwrap();
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    for k in 0..2 {
        for f in 0..3 {
            let want: String = (0..40).map(|r| format!("{k} {f} {r:04}\n")).collect();
            for m in [&a, &b] {
                let got = std::fs::read_to_string(m.mp.join(format!("log-{k}-{f}"))).unwrap();
                assert_eq!(got, want, "log-{k}-{f} at {}", m.mp.display());
            }
        }
    }
    a.stop();
    b.stop();
}

#[test]
fn two_mounts_of_a_redis_volume_see_each_others_closed_files() {
    two_mounts("redis");
}

#[test]
fn two_mounts_of_a_postgres_volume_see_each_others_closed_files() {
    two_mounts("postgres");
}

// ---------------------------------------------------------------------------------------
// kill -9

#[test]
fn kill_9_during_writes_loses_no_closed_file_and_leaves_no_stale_mount() {
    let v = new_vol("rocksdb");
    let m = mount(&v, "mnt", &[]);
    let mut want = Vec::new();
    for i in 0..12 {
        let d = data(100 + i, 300_000 * (i as usize + 1));
        std::fs::write(m.mp.join(format!("closed-{i}")), &d).unwrap();
        want.push(d);
    }
    // A writer still writing when the mount dies.
    let mp = m.mp.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let Ok(mut f) = std::fs::File::create(mp.join("in-flight")) else {
            return;
        };
        for i in 0..400 {
            if f.write_all(&data(i, 256 << 10)).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let pid = m.pid();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let _ = writer.join();
    // fusermount3's auto-unmount removes the mount once the process is gone.
    let t0 = Instant::now();
    while is_mounted(&m.mp) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!is_mounted(&m.mp), "a stale mount was left after kill -9");
    assert!(
        std::fs::metadata(&m.mp).is_ok(),
        "the mount point is not usable"
    );
    drop(m);
    let m = mount(&v, "mnt", &[]);
    for (i, d) in want.iter().enumerate() {
        assert_eq!(
            &std::fs::read(m.mp.join(format!("closed-{i}"))).unwrap(),
            d,
            "closed-{i} after kill -9"
        );
    }
    m.stop();
    let o = jfs(&["fsck", &v.meta], &[]);
    assert!(
        o.status.success(),
        "fsck after kill -9: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

// ---------------------------------------------------------------------------------------
// Local cache

fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_damaged_cache_is_refetched_never_served_and_the_cache_keeps_its_size() {
    let v = new_vol("rocksdb");
    // The block cache (whole-file copies for passthrough: tests/passthrough.rs).
    let payload = data(5, 20 << 20);
    let m = mount(&v, "mnt", &["--passthrough", "off"]);
    std::fs::write(m.mp.join("f"), &payload).unwrap();
    m.stop();
    // Warm the cache, then damage it while unmounted: a bit flip and a truncation.
    let m = mount(&v, "mnt", &["--passthrough", "off"]);
    let o = jfs_in(&v, &["warmup", m.mp.join("f").to_str().unwrap()]);
    assert!(
        o.status.success(),
        "warmup: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    m.stop();
    let files = cache_files(&v.dir.path().join("mnt-cache"));
    assert!(files.len() >= 5, "the file's blocks are cached: {files:?}");
    let mut b = std::fs::read(&files[0]).unwrap();
    b[1000] ^= 0x01;
    std::fs::write(&files[0], &b).unwrap();
    let b = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &b[..b.len() / 2]).unwrap();
    let m = mount(&v, "mnt", &["--passthrough", "off"]);
    assert_eq!(
        std::fs::read(m.mp.join("f")).unwrap(),
        payload,
        "damaged cache served"
    );
    let mt = m.stats();
    assert!(
        metric(&mt, "jfs_blockstore_gets_total") >= 1.0,
        "the damaged blocks were refetched: {mt:?}"
    );
    m.stop();
    // A small cache stays within its size.
    let m = mount(&v, "small", &["--cache-size", "9M", "--passthrough", "off"]);
    let big = data(6, 40 << 20);
    std::fs::write(m.mp.join("g"), &big).unwrap();
    assert_eq!(std::fs::read(m.mp.join("g")).unwrap(), big);
    // 40 MiB cannot be warmed into 9 MiB: warmup says so (exit 1), the cache keeps its size.
    let o = jfs_in(&v, &["warmup", m.mp.join("g").to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("the local cache is full"));
    let mt = m.stats();
    assert!(metric(&mt, "jfs_cache_bytes") <= (9 << 20) as f64, "{mt:?}");
    let on_disk: u64 = cache_files(&v.dir.path().join("small-cache"))
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(on_disk <= 9 << 20, "cache holds {on_disk} bytes on disk");
    m.stop();
}

#[test]
fn warmed_files_read_without_touching_the_store() {
    let v = new_vol("rocksdb");
    // The block cache's path (with passthrough, files of 4 MiB and more are warmed into
    // whole-file copies instead: tests/passthrough.rs).
    let m = mount(&v, "mnt", &["--passthrough", "off"]);
    std::fs::create_dir(m.mp.join("model")).unwrap();
    let mut want = Vec::new();
    for i in 0..4 {
        let d = data(200 + i, (6 << 20) + i as usize * 1000);
        std::fs::write(m.mp.join(format!("model/shard-{i}")), &d).unwrap();
        want.push(d);
    }
    m.stop();
    let m = mount(&v, "mnt", &["--passthrough", "off"]);
    let check = jfs_in(
        &v,
        &[
            "warmup",
            "--check",
            "--json",
            m.mp.join("model").to_str().unwrap(),
        ],
    );
    let c: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(c["cached"], 0, "{c}");
    let o = jfs_in(
        &v,
        &["warmup", "--json", m.mp.join("model").to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["files"], 4, "{s}");
    // Two blocks per 6 MiB file, or more where a close elsewhere (a process spawned while
    // the file was open closes its inherited copy) committed a file's buffer mid-write.
    let blocks = s["blocks"].as_u64().unwrap();
    assert!(blocks >= 8, "{s}");
    assert_eq!(s["fetched"], blocks, "{s}");
    let check = jfs_in(
        &v,
        &[
            "warmup",
            "--check",
            "--json",
            m.mp.join("model").to_str().unwrap(),
        ],
    );
    let c: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(c["cached"], blocks, "{c}");
    let before = metric(&m.stats(), "jfs_blockstore_gets_total");
    for (i, d) in want.iter().enumerate() {
        assert_eq!(
            &std::fs::read(m.mp.join(format!("model/shard-{i}"))).unwrap(),
            d
        );
    }
    let after = m.stats();
    assert_eq!(
        metric(&after, "jfs_blockstore_gets_total"),
        before,
        "warmed reads went to the store"
    );
    assert!(
        metric(&after, "jfs_cache_hits_total") >= blocks as f64,
        "{after:?}"
    );
    // --evict drops them.
    let o = jfs_in(
        &v,
        &[
            "warmup",
            "--evict",
            "--json",
            m.mp.join("model").to_str().unwrap(),
        ],
    );
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["evicted"], blocks, "{e}");
    m.stop();
}

// ---------------------------------------------------------------------------------------
// RocksDB: one writing process; jfs write commands go through the mount.

#[test]
fn jfs_write_commands_reach_a_mounted_rocksdb_volume_through_the_mount() {
    let v = new_vol("rocksdb");
    let m = mount(&v, "mnt", &["--attr-cache", "0s", "--entry-cache", "0s"]);
    let src = v.dir.path().join("src.txt");
    std::fs::write(&src, b"from jfs put").unwrap();
    for args in [
        vec!["mkdir", "-p", &v.meta, "/a/b"],
        vec!["put", &v.meta, src.to_str().unwrap(), "/a/b"],
        vec!["mv", &v.meta, "/a/b/src.txt", "/a/moved.txt"],
        vec!["ln", "-s", &v.meta, "moved.txt", "/a/link"],
        vec!["truncate", &v.meta, "/a/moved.txt", "4"],
    ] {
        let o = jfs_in(&v, &args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(std::fs::read(m.mp.join("a/moved.txt")).unwrap(), b"from");
    assert_eq!(std::fs::read(m.mp.join("a/link")).unwrap(), b"from");
    let o = jfs_in(&v, &["rm", "-r", &v.meta, "/a"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!m.mp.join("a").exists());
    let o = jfs_in(&v, &["gc", &v.meta, "--delete", "--json"]);
    assert!(
        o.status.success(),
        "gc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["sessions_live"], 1, "{r}");
    m.stop();
}

#[test]
fn unlinked_open_files_stay_readable_until_closed_then_are_freed() {
    let v = new_vol("rocksdb");
    let m = mount(&v, "mnt", &[]);
    let d = data(9, 5 << 20);
    std::fs::write(m.mp.join("tmp"), &d).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mp.join("tmp"))
        .unwrap();
    std::fs::remove_file(m.mp.join("tmp")).unwrap();
    assert!(!m.mp.join("tmp").exists());
    let mut b = vec![0u8; d.len()];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b, d);
    f.write_all_at(b"tail", d.len() as u64).unwrap();
    let mut t = [0u8; 4];
    f.read_exact_at(&mut t, d.len() as u64).unwrap();
    assert_eq!(&t, b"tail");
    let o = jfs(&["status", &v.meta, "--json"], &[]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["kept_inodes"], 1, "{s}");
    drop(f);
    let t0 = Instant::now();
    loop {
        let o = jfs(&["status", &v.meta, "--json"], &[]);
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if s["kept_inodes"] == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still kept after close: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    m.stop();
}

#[test]
fn operator_mistakes_are_refused_without_harm() {
    let v = new_vol("rocksdb");
    // A missing mount point.
    let o = jfs_in(&v, &["mount", &v.meta, "/nonexistent/jfs-mnt"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
    let m = mount(&v, "mnt", &[]);
    std::fs::write(m.mp.join("keep"), b"x").unwrap();
    // Mounting again on a live mount point.
    let o = jfs_in(&v, &["mount", &v.meta, m.mp.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("already mounted"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // umount of something that is not a jfs mount.
    let o = jfs_in(&v, &["umount", v.dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    // A typo'd flag.
    let o = jfs_in(
        &v,
        &[
            "mount",
            &v.meta,
            m.mp.to_str().unwrap(),
            "--cache-szie",
            "1G",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(std::fs::read(m.mp.join("keep")).unwrap(), b"x");
    // jfs umount unmounts and the process exits after committing.
    let o = jfs_in(&v, &["umount", m.mp.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut m = m;
    let st = m.child.take().unwrap().wait().unwrap();
    assert!(st.success(), "mount process exit: {st}");
    assert!(!is_mounted(&m.mp));
}

/// `jfs mount -d` without `--log` appends to one log per mount point; a failed attempt
/// prints its own errors only, not those of earlier attempts, and leaves no control socket.
#[test]
fn a_failed_background_mount_prints_this_attempts_errors_only() {
    fuse_ready();
    let tmp = tempfile::tempdir().unwrap();
    let mp = tmp.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let rd = tmp.path().join("run");
    let env = [("JFS_RUN_DIR", rd.to_str().unwrap())];
    // First attempt: metadata that holds no volume.
    let unformatted = format!("rocksdb://{}/none", tmp.path().display());
    std::fs::create_dir_all(tmp.path().join("none")).unwrap();
    let o = jfs(&["mount", &unformatted, mp.to_str().unwrap(), "-d"], &env);
    let first = String::from_utf8_lossy(&o.stderr).to_string();
    assert_ne!(o.status.code(), Some(0), "{first}");
    // Second attempt: a real volume, but a metrics address that is taken.
    let v = new_vol("rocksdb");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = jfs(
        &[
            "mount",
            &v.meta,
            mp.to_str().unwrap(),
            "-d",
            "--metrics",
            &addr,
        ],
        &env,
    );
    let second = String::from_utf8_lossy(&o.stderr).to_string();
    assert_ne!(o.status.code(), Some(0), "{second}");
    assert!(second.contains("--metrics"), "{second}");
    assert!(
        !second.contains("jfs format") && !second.contains("no RocksDB volume"),
        "the second attempt printed the first one's errors: {second}"
    );
    assert!(!is_mounted(&mp));
    // Nothing of the refused mount is left in the run directory but its log.
    let left: Vec<String> = std::fs::read_dir(&rd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".log"))
        .collect();
    assert!(left.is_empty(), "a refused mount left {left:?} behind");
    assert!(
        !second.contains("Reply not sent"),
        "the refusal came after mounting: {second}"
    );
}

/// The `jfs_fuse_ops_total` count of one operation.
fn ops_of(stats: &std::collections::BTreeMap<String, f64>, op: &str) -> f64 {
    let label = format!("op=\"{op}\"");
    stats
        .iter()
        .filter(|(k, _)| k.starts_with("jfs_fuse_ops_total{") && k.contains(&label))
        .map(|(_, v)| v)
        .sum()
}

/// How many inodes the mount holds kernel lookups on (its control socket's `stats`).
fn known_inodes(m: &Mount) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(m.sock()).expect("control socket");
    s.write_all(b"{\"op\":\"stats\"}\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.lines().next().expect("a reply")).unwrap();
    v["known_inodes"].as_u64().expect("known_inodes")
}

/// Listings carry each entry's attributes (readdirplus, one engine call per page), so `ls -l`
/// and `rm -rf` of a directory the mount has never seen need no lookup per name; and a
/// set-group-ID directory gives its group to what is created in it.
#[test]
fn listings_carry_attributes_and_rm_rf_needs_no_lookup_per_name() {
    let v = new_vol("rocksdb");
    let a = mount(&v, "a", &[]);
    let dir = a.mp.join("many");
    std::fs::create_dir(&dir).unwrap();
    let mut want = Vec::new();
    for i in 0..150u64 {
        let name = format!("f{i:03}");
        let len = i * 37 + 1;
        std::fs::write(dir.join(&name), data(i, len as usize)).unwrap();
        want.push((name, len));
    }
    // set-group-ID inheritance: the directory's group, and its bit on new directories.
    let sg = a.mp.join("shared");
    std::fs::create_dir(&sg).unwrap();
    std::os::unix::fs::chown(&sg, None, Some(4321)).unwrap();
    std::fs::set_permissions(&sg, std::fs::Permissions::from_mode(0o2775)).unwrap();
    std::fs::write(sg.join("file"), b"x").unwrap();
    std::fs::create_dir(sg.join("sub")).unwrap();
    let f = std::fs::metadata(sg.join("file")).unwrap();
    let s = std::fs::metadata(sg.join("sub")).unwrap();
    assert_eq!((f.gid(), f.mode() & 0o2000), (4321, 0));
    assert_eq!((s.gid(), s.mode() & 0o2000), (4321, 0o2000));
    a.stop();

    // A new mount: the kernel knows no name under it yet.
    let b = mount(&v, "b", &[]);
    let dir = b.mp.join("many");
    let s0 = b.stats();
    let mut seen: Vec<(String, u64)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), m.len())
        })
        .collect();
    seen.sort();
    assert_eq!(seen, want);
    let s1 = b.stats();
    let (plus, lookups) = (
        ops_of(&s1, "readdirplus") - ops_of(&s0, "readdirplus"),
        ops_of(&s1, "lookup") - ops_of(&s0, "lookup"),
    );
    assert!(
        plus >= 3.0,
        "150 entries take 3 pages of readdirplus, saw {plus}"
    );
    assert!(
        lookups < 10.0,
        "a lookup per name after readdirplus: {lookups}"
    );
    // Each name the kernel took counts one lookup, no more (a page holds fewer entries than
    // the mount reads attributes for).
    let known = known_inodes(&b);
    assert!(
        (150..160).contains(&known),
        "the mount holds lookups on {known} inodes after listing 150 files"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let s2 = b.stats();
    let lookups = ops_of(&s2, "lookup") - ops_of(&s1, "lookup");
    assert!(lookups < 10.0, "rm -rf looked up {lookups} names");
    assert_eq!(ops_of(&s2, "unlink") - ops_of(&s1, "unlink"), 150.0);
    assert!(!dir.exists());
    // The kernel forgets the unlinked inodes: every lookup counted is given back.
    let t0 = Instant::now();
    while known_inodes(&b) > 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the mount still holds lookups on {} inodes after rm -rf",
            known_inodes(&b)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    b.stop();
    // Every file is gone from the metadata: fsck finds nothing wrong.
    let o = jfs_in(&v, &["fsck", &v.meta]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A mount answers the kernel's question for a directory it just changed from its own commit
/// (the kernel drops its cached attributes of that directory and asks again before the next
/// change in it): its own changes show at once, another mount's within the attribute-cache
/// time, as through the kernel's cache.
#[test]
fn a_directory_changed_here_shows_its_new_attributes_at_once_and_others_changes_in_time() {
    let v = new_vol("redis");
    let a = mount(&v, "a", &["--attr-cache", "1s"]);
    let b = mount(&v, "b", &["--attr-cache", "1s"]);
    let d = a.mp.join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..5 {
        std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    let before = std::fs::metadata(&d).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::remove_file(d.join("f0")).unwrap();
    let after = std::fs::metadata(&d).unwrap();
    assert!(after.mtime_nsec() != before.mtime_nsec() || after.mtime() != before.mtime());
    // Its own mode change, at once.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o750);
    std::fs::write(d.join("g"), b"y").unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o750);
    // Another mount's change, within the attribute-cache time (and some slack).
    std::fs::set_permissions(b.mp.join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let t0 = Instant::now();
    loop {
        let mode = std::fs::metadata(&d).unwrap().mode() & 0o7777;
        if mode == 0o700 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "a's view of d still has mode {mode:o} 3 s after b changed it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And a name b adds is seen by a listing at a.
    std::fs::write(b.mp.join("d").join("from-b"), b"z").unwrap();
    let t0 = Instant::now();
    while !d.join("from-b").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "from-b not seen at a"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    a.stop();
    b.stop();
}

/// A block missing from the store (removed by hand, a lost disk) fails the read with EIO, not
/// ENOENT (read(2) has none: a program would take the file for gone), and the mount's log
/// names the block.
#[test]
fn a_missing_block_reads_as_eio_and_the_log_names_it() {
    let v = new_vol("rocksdb");
    let m = mount(&v, "mnt", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("f"), data(9, 300_000)).unwrap();
    m.stop();
    let blocks = integration::mountproc::store_blocks(&v.store);
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    std::fs::remove_file(&blocks[0].0).unwrap();
    let name = blocks[0]
        .0
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let m = mount(&v, "mnt", &["--cache-size", "0"]);
    let e = std::fs::read(m.mp.join("f")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("read failed: EIO") && l.contains(&name)),
        "the log does not name block {name}: {log}"
    );
    m.stop();
}

/// `jfs umount` clears a jfs mount left stale (its process, guard and fusermount3 watcher
/// all killed: the kernel answers ENOTCONN), and refuses a stale mount of another FUSE file
/// system (an rclone mount whose process died), which is not its to clear.
#[test]
fn umount_clears_a_stale_jfs_mount_and_no_other() {
    let v = new_vol("rocksdb");
    let mut m = mount(&v, "mnt", &[]);
    let mp = m.mp.clone();
    // The mount process and its children (the guard, fusermount3's watcher), all at once.
    let pid = m.pid();
    let mut pids = vec![pid.to_string()];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1));
        if ppid == Some(pid.to_string().as_str()) {
            pids.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    let s = Command::new("kill").arg("-9").args(&pids).status().unwrap();
    assert!(s.success());
    let mut child = m.child.take().unwrap();
    let _ = child.wait();
    let t0 = Instant::now();
    while !matches!(std::fs::metadata(&mp), Err(e) if e.raw_os_error() == Some(107 /* ENOTCONN */))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the mount did not go stale"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = jfs_in(&v, &["umount", mp.to_str().unwrap()]);
    let t = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("cleared a stale mount"), "{t}");
    assert!(!is_mounted(&mp));

    // Another FUSE file system's stale mount: refused, and left mounted.
    let src = v.dir.path().join("rsrc");
    let rmp = v.dir.path().join("rmnt");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&rmp).unwrap();
    /// Lazily unmounts whatever is at its path when dropped (also when the test fails).
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let any_mount_at = |p: &Path| {
        let t = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let want = p.to_string_lossy().replace(' ', "\\040");
        t.lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
    };
    let mut rc = Command::new("rclone")
        .arg("mount")
        .arg(&src)
        .arg(&rmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rclone (bash integration/install-deps.sh test installs it)");
    let _unmount = Unmount(rmp.clone());
    let t0 = Instant::now();
    while !any_mount_at(&rmp) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "rclone did not mount"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    rc.kill().unwrap();
    let _ = rc.wait();
    let o = jfs_in(&v, &["umount", rmp.to_str().unwrap()]);
    let t = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("not a jfs mount"), "{t}");
    assert!(
        any_mount_at(&rmp),
        "jfs umount unmounted another file system's mount"
    );
}

/// Mounting over a directory that holds files says so (what is hidden, that it is not lost),
/// and the files are there again after the unmount (issue 43, item 20).
#[test]
fn mounting_over_files_warns_and_hides_nothing_for_good() {
    let v = new_vol("rocksdb");
    let mp = v.dir.path().join("busy");
    std::fs::create_dir(&mp).unwrap();
    std::fs::write(mp.join("precious.txt"), b"keep me").unwrap();
    let m = mount(&v, "busy", &[]);
    assert!(
        !m.mp.join("precious.txt").exists(),
        "the mount is not over it"
    );
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("the mount point is not empty") && log.contains("precious.txt"),
        "{log}"
    );
    m.stop();
    assert_eq!(std::fs::read(mp.join("precious.txt")).unwrap(), b"keep me");
    // An empty mount point gets no such line.
    let m = mount(&v, "empty", &[]);
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(!log.contains("not empty"), "{log}");
    m.stop();
}

/// A SIGTERM sent the instant the mount answers ends it cleanly. The mount registered its
/// handler only after it said it was ready, and `jfs`'s own listener took a signal that came
/// in between: the mount went on serving ("ignored SIGTERM") until killed.
#[test]
fn a_sigterm_the_instant_the_mount_answers_unmounts_it() {
    fuse_ready();
    let v = new_vol("rocksdb");
    let rd = run_dir(&v);
    for round in 0..6 {
        let mp = v.dir.path().join(format!("quick{round}"));
        std::fs::create_dir(&mp).unwrap();
        let log = v.dir.path().join(format!("quick{round}.log"));
        let mut child = Command::new(bin("jfs"))
            .args([
                "mount",
                &v.meta,
                mp.to_str().unwrap(),
                "--free-space-ratio",
                "0.01",
            ])
            .arg("--cache-dir")
            .arg(v.dir.path().join(format!("quick{round}-cache")))
            .env("JFS_RUN_DIR", &rd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let sock = mount::control::socket_path_in(&rd, &mp);
        let t0 = Instant::now();
        while !sock.exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "round {round}: mount exited early"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "round {round}: no socket in 30 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("fusermount3").arg("-uz").arg(&mp).status();
                panic!(
                    "round {round}: jfs mount went on serving 30 s after a SIGTERM: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            st.success(),
            "round {round}: exit {st}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(!is_mounted(&mp), "round {round}: still mounted");
    }
}

/// A damaged block (a bit flipped at rest) fails the read with EIO, and the mount's log line
/// names the file by its path, shell-escaped as `jfs ls` prints names (a space, a byte that
/// is not UTF-8), beside its inode number: the log named only the inode (issue 43, item 17).
#[test]
fn a_damaged_block_read_logs_the_files_path() {
    use std::os::unix::ffi::OsStrExt;
    let v = new_vol("rocksdb");
    let m = mount(&v, "mnt", &["--cache-size", "0"]);
    std::fs::create_dir(m.mp.join("dir")).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"da mage\xff");
    std::fs::write(m.mp.join("dir").join(name), data(3, 300_000)).unwrap();
    let ino = std::fs::metadata(m.mp.join("dir").join(name))
        .unwrap()
        .ino();
    m.stop();
    let blocks = integration::mountproc::store_blocks(&v.store);
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let key = blocks[0]
        .0
        .strip_prefix(v.store.trim_start_matches("file://"))
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    integration::mountproc::flip_bit(&v.store, &key, 1000);
    let m = mount(&v, "mnt", &["--cache-size", "0"]);
    let e = std::fs::read(m.mp.join("dir").join(name)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    let log = std::fs::read_to_string(&m.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("read failed: EIO"))
        .unwrap_or_else(|| panic!("no read failure logged: {log}"));
    assert!(
        line.contains(r"path='/dir/da mage'$'\377'") && line.contains(&format!("ino={ino}")),
        "the line does not name the file's path and inode {ino}: {line}"
    );
    m.stop();
}

/// `jfs mount -d` says the mount process's warnings on the terminal, not only in the
/// background log: a cache directory other users may read and files hidden under the mount
/// point, each once (issue 43: they went to the log only).
#[test]
fn a_background_mount_says_its_warnings_on_the_terminal_once() {
    fuse_ready();
    let v = new_vol("rocksdb");
    let mp = v.dir.path().join("busy");
    std::fs::create_dir(&mp).unwrap();
    std::fs::write(mp.join("hidden.txt"), b"x").unwrap();
    let cache = v.dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = jfs_in(
        &v,
        &[
            "mount",
            &v.meta,
            mp.to_str().unwrap(),
            "-d",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--free-space-ratio",
            "0.01",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let u = jfs_in(&v, &["umount", mp.to_str().unwrap()]);
    assert!(o.status.success(), "{err}");
    assert!(u.status.success(), "{}", String::from_utf8_lossy(&u.stderr));
    assert_eq!(
        err.matches("the mount point is not empty").count(),
        1,
        "the hidden files are said once on the terminal: {err}"
    );
    assert!(err.contains("hidden.txt"), "{err}");
    assert!(
        err.contains(&format!(
            "the cache directory {} has mode 0755",
            cache.display()
        )),
        "the cache directory's mode is said on the terminal: {err}"
    );
    assert!(err.contains("jfs: mounted at"), "{err}");
}

/// A clean unmount (`jfs umount`) logs nothing at WARN or ERROR: fuser unmounted the mount
/// point a second time as its session ended, after `jfs umount` (or the mount's own unmount
/// at SIGTERM) had done it, and logged `Failed to umount filesystem: Invalid argument` every
/// time (issue 43).
#[test]
fn a_clean_unmount_logs_no_warning() {
    let v = new_vol("rocksdb");
    let mut m = mount(&v, "mnt", &[]);
    std::fs::write(m.mp.join("f"), data(4, 100_000)).unwrap();
    let o = jfs_in(&v, &["umount", m.mp.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = m.child.as_mut().unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "still running");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.success(), "{st}");
    assert!(!is_mounted(&m.mp));
    let log = std::fs::read_to_string(&m.log).unwrap();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("Failed to"))
        .collect();
    assert!(
        bad.is_empty(),
        "a clean unmount logged {bad:?}; the log: {log}"
    );
    m.child = None;
    // The file was committed.
    let m = mount(&v, "mnt", &[]);
    assert_eq!(std::fs::read(m.mp.join("f")).unwrap(), data(4, 100_000));
    m.stop();
}
