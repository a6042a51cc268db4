//! A `jfs mount` process for tests: started in the foreground, waited for, stopped with
//! SIGTERM (asserting a clean exit), and always unmounted when dropped.

use crate::{bin, unique};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// FUSE must be here: these tests fail, never skip, without it.
pub fn fuse_ready() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests need FUSE (a kernel with fuse, or a container with --device /dev/fuse)"
    );
    assert!(
        Command::new("fusermount3")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "fusermount3 is missing: install Debian's fuse3 (bash integration/install-deps.sh)"
    );
}

/// A volume formatted for a mount test: its metadata URL, a scratch dir for its mounts,
/// and the dirs holding its metadata and blocks.
pub struct Vol {
    pub meta: String,
    /// The volume's `file://` store.
    pub store: String,
    pub dir: tempfile::TempDir,
    _keep: Vec<tempfile::TempDir>,
}

/// A volume on `engine` (`rocksdb`, `redis`, `postgres`) with blocks in a local directory.
pub fn new_vol(engine: &str) -> Vol {
    fuse_ready();
    let (meta, d1) = crate::meta_url(engine);
    let (store, d2) = crate::store_url("file");
    let o = Command::new(bin("jfs"))
        // The mount tests pin what a delete frees: no trash (integration/tests/trash.rs
        // tests the trash).
        .args([
            "format",
            &meta,
            &unique("mv"),
            "--storage",
            &store,
            "--trash",
            "0s",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running jfs format");
    assert!(
        o.status.success(),
        "format: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Vol {
        meta,
        store,
        dir: tempfile::tempdir().unwrap(),
        _keep: d1.into_iter().chain(d2).collect(),
    }
}

/// A metric of `Mount::stats`, summed over its labels.
pub fn metric(m: &std::collections::BTreeMap<String, f64>, name: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// The block objects of a `file://` store: path and length.
pub fn store_blocks(store_url: &str) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::from(store_url.trim_start_matches("file://"))];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(p),
                Ok(m) if p.to_string_lossy().contains("/chunks/") => out.push((p, m.len())),
                _ => {}
            }
        }
    }
    out
}

/// Wait (20 s at most) until a `file://` store holds at least `n` blocks (fills landing).
pub fn wait_store_blocks(store_url: &str, n: usize) {
    let t0 = Instant::now();
    loop {
        let have = store_blocks(store_url).len();
        if have >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{store_url} holds {have} blocks after 20 s, {n} expected"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Flip one bit of block `key` in a `file://` store, keeping its length (damage at rest).
pub fn flip_bit(store_url: &str, key: &str, at: usize) {
    let p = Path::new(store_url.trim_start_matches("file://")).join(key);
    let mut b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b[at] ^= 0x20;
    std::fs::write(&p, b).unwrap();
}

/// A read-only bind mount over a directory (a store that refuses writes with EROFS, as a
/// full or failed disk remounted read-only does), undone when dropped.
pub struct ReadOnlyBind(PathBuf);

impl ReadOnlyBind {
    pub fn over(dir: &Path) -> ReadOnlyBind {
        let d = dir.to_str().unwrap();
        let ok = |args: &[&str]| {
            let s = Command::new("mount").args(args).status().unwrap();
            assert!(s.success(), "mount {args:?}");
        };
        ok(&["--bind", d, d]);
        let r = ReadOnlyBind(dir.to_path_buf());
        // A block being written at that moment holds a file open for writing on the new
        // bind, and the kernel refuses to make it read-only (EBUSY) until it is closed: try
        // again for a few seconds.
        let mut last = String::new();
        for _ in 0..200 {
            let o = Command::new("mount")
                .args(["-o", "remount,ro,bind", d])
                .output()
                .unwrap();
            if o.status.success() {
                return r;
            }
            last = String::from_utf8_lossy(&o.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("mount -o remount,ro,bind {d}: {last}");
    }

    /// Over the directory of a `file://` store.
    pub fn over_store(store_url: &str) -> ReadOnlyBind {
        ReadOnlyBind::over(Path::new(store_url.trim_start_matches("file://")))
    }
}

impl Drop for ReadOnlyBind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Whether a `jfs mount` is mounted at `mp` (compared as bytes: the kernel writes a space,
/// tab, newline or backslash as an octal escape, and any other byte as it is).
pub fn is_mounted(mp: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let t = std::fs::read("/proc/self/mountinfo").unwrap();
    let mut want = Vec::new();
    for &b in mp.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => want.extend(format!("\\{b:03o}").bytes()),
            _ => want.push(b),
        }
    }
    t.split(|&c| c == b'\n').any(|l| {
        let f: Vec<&[u8]> = l.split(|&c| c == b' ').collect();
        f.len() > 4 && f[4] == want.as_slice() && l.windows(12).any(|w| w == b" - fuse.jfs ")
    })
}

/// A foreground `jfs mount` process; dropping it unmounts (SIGTERM, then kill -9 and a lazy
/// unmount if it does not go), whatever the test's outcome.
pub struct Mount {
    pub child: Option<Child>,
    pub mp: PathBuf,
    pub log: PathBuf,
    pub run_dir: PathBuf,
}

impl Mount {
    /// Mount `meta` at `dir/name` (cache `dir/name-cache`, control socket under `dir/run`,
    /// log `dir/name.log`) in the foreground; returns once it answers.
    pub fn start(meta: &str, dir: &Path, name: &str, extra: &[&str]) -> Mount {
        fuse_ready();
        let mp = dir.join(name);
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&mp).unwrap();
        // JFS_TEST_LOG_DIR keeps the mounts' logs past the test (the volume's dir goes).
        let log_path = match std::env::var_os("JFS_TEST_LOG_DIR") {
            Some(d) => PathBuf::from(d).join(format!("{}-{name}.log", unique("mount"))),
            None => dir.join(format!("{name}.log")),
        };
        let log = std::fs::File::create(&log_path).unwrap();
        let cache = dir.join(format!("{name}-cache"));
        let mut args: Vec<String> = vec![
            "mount".into(),
            meta.to_string(),
            mp.display().to_string(),
            "--cache-dir".into(),
            cache.display().to_string(),
            // Test machines' disks may be fuller than the default 10% floor allows.
            "--free-space-ratio".into(),
            "0.01".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(bin("jfs"))
            .args(&args)
            .env("JFS_RUN_DIR", &run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting jfs mount");
        let mut m = Mount {
            child: Some(child),
            mp: mp.clone(),
            log: log_path,
            run_dir,
        };
        let t0 = Instant::now();
        while !(is_mounted(&mp) && m.sock().exists()) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                panic!("jfs mount exited ({st}) before mounting: {log}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "mount took over 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// The mount's control socket.
    pub fn sock(&self) -> PathBuf {
        mount::control::socket_path_in(&self.run_dir, &self.mp)
    }

    /// The mount's statistics (`jfs stats --json`): metric name{labels} -> value.
    pub fn stats(&self) -> std::collections::BTreeMap<String, f64> {
        let o = Command::new(bin("jfs"))
            .args(["stats", self.mp.to_str().unwrap(), "--json", "--count", "1"])
            .env("JFS_RUN_DIR", &self.run_dir)
            .output()
            .expect("running jfs stats");
        assert!(
            o.status.success(),
            "stats: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let line = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(line.lines().last().expect("a stats line")).expect("stats JSON")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) {
        let mut c = self.child.take().unwrap();
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(
                    st.success(),
                    "jfs mount exited with {st} after SIGTERM: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "jfs mount ignored SIGTERM for 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!is_mounted(&self.mp), "still mounted after SIGTERM");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let t0 = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mp) || std::fs::metadata(&self.mp).is_err() {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mp)
                .stderr(Stdio::null())
                .status();
        }
    }
}
