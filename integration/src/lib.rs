//! Test kit: volumes on any engine and store named by the environment that
//! `integration/services.sh` writes, helpers to run the project's binaries, and unique names so
//! tests run in parallel against shared servers.
//!
//! A backend whose URL variable is missing is a test failure with instructions, never a skip.

pub mod disk;
pub mod jobs;
pub mod mirror;
pub mod mountproc;
pub mod runbook;
pub mod written;

use fs_core::{BlockStore, Engine, Fs, Settings};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const ENGINES: [&str; 3] = ["rocksdb", "redis", "postgres"];

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: these tests need the test services. Run them with `bash integration/test.sh`, \
             or start them with `bash integration/services.sh up DIR && source DIR/env`."
        )
    })
}

/// A short name unique across this test run (lowercase, digits, '_').
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}_{:04x}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        rand::random::<u16>()
    )
}

/// A fresh metadata URL of the given engine (and the temp dir holding it, for RocksDB).
pub fn meta_url(engine: &str) -> (String, Option<tempfile::TempDir>) {
    match engine {
        "rocksdb" => {
            let d = tempfile::tempdir().expect("temp dir");
            (format!("rocksdb://{}/meta", d.path().display()), Some(d))
        }
        "redis" => (
            format!("{}?prefix={}", required("JFS_TEST_REDIS"), unique("t")),
            None,
        ),
        "postgres" => (
            format!("{}?schema={}", required("JFS_TEST_PG"), unique("t")),
            None,
        ),
        other => panic!("unknown engine {other}"),
    }
}

/// A fresh store URL of the given kind (and its temp dir, for file://).
pub fn store_url(store: &str) -> (String, Option<tempfile::TempDir>) {
    match store {
        "file" => {
            let d = tempfile::tempdir().expect("temp dir");
            (format!("file://{}/store", d.path().display()), Some(d))
        }
        "memory" => ("memory://".into(), None),
        "s3" => {
            let base = required("JFS_TEST_S3");
            let (bucket, query) = base.split_once('?').unwrap_or((&base, ""));
            (format!("{bucket}/{}?{query}", unique("s")), None)
        }
        other => panic!("unknown store {other}"),
    }
}

pub async fn open_engine(url: &str) -> Arc<dyn Engine> {
    meta::open(
        url,
        &meta::OpenOptions {
            create: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("opening {url}: {e}"))
}

/// Empty metadata to replay a journal into: opened (created) and marked as a mirror's, since
/// engines replay only into a mirror's metadata (see `fs_core::site`).
pub async fn replica(url: &str) -> Arc<dyn Engine> {
    let e = open_engine(url).await;
    fs_core::site::set_marker(
        &*e,
        &fs_core::site::MirrorMarker {
            version: fs_core::site::MARKER_VERSION,
            name: "replica".into(),
            primary: "test".into(),
            store: "memory://".into(),
            origin_store: None,
            since_ns: 0,
        },
    )
    .await
    .expect("marking a replica");
    e
}

pub fn open_store(url: &str) -> Arc<dyn BlockStore> {
    Arc::new(
        objstore::OpendalStore::open(
            url,
            &objstore::StoreOptions {
                create: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("opening {url}: {e}")),
    )
}

/// A formatted volume and what it lives in.
pub struct TestVol {
    pub fs: Fs,
    pub meta_url: String,
    pub store_url: String,
    pub engine: &'static str,
    pub store: &'static str,
    _dirs: Vec<tempfile::TempDir>,
}

impl TestVol {
    /// Another client of the same volume: its own engine connection (RocksDB: the same
    /// engine, since one process opens it once), store handle and id pools.
    pub async fn client(&self) -> Fs {
        let engine = if self.engine == "rocksdb" {
            self.fs.engine().clone()
        } else {
            open_engine(&self.meta_url).await
        };
        let store = if self.store == "memory" {
            self.fs.store().clone()
        } else {
            open_store(&self.store_url)
        };
        Fs::open(engine, store).await.expect("open")
    }
}

pub async fn volume(engine: &'static str, store: &'static str) -> TestVol {
    volume_with(engine, store, |_| {}).await
}

pub async fn volume_with(
    engine: &'static str,
    store: &'static str,
    f: impl FnOnce(&mut Settings),
) -> TestVol {
    let (m, d1) = meta_url(engine);
    let (s, d2) = store_url(store);
    let mut settings = Settings::new(&unique("vol"), &s, fs_core::DEFAULT_BLOCK_SIZE);
    f(&mut settings);
    let fs = Fs::format(open_engine(&m).await, open_store(&s), settings)
        .await
        .expect("format");
    TestVol {
        fs,
        meta_url: m,
        store_url: s,
        engine,
        store,
        _dirs: d1.into_iter().chain(d2).collect(),
    }
}

/// Path of one of this workspace's binaries (built by `cargo build --workspace --bins`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // Tests run from target/<profile>/deps, binaries (benches) from target/<profile>.
    let mut dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target dir");
    }
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first, with the same CARGO_TARGET_DIR as `cargo test`",
        p.display()
    );
    p
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Read a whole file through the volume.
pub async fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let len = fs.getattr(ino).await.expect("getattr").length;
    fs.read(ino, 0, len as usize).await.expect("read")
}

/// Every journal entry currently retained, decoded, checking that sequence numbers are
/// exactly first..=last with no gap.
pub async fn journal(engine: &dyn Engine) -> Vec<fs_core::Entry> {
    let b = engine.journal_bounds().await.expect("bounds");
    let mut out = Vec::new();
    let mut next = b.first;
    while next <= b.last {
        let frames = engine.journal_read(next, 1000).await.expect("journal read");
        assert!(
            !frames.is_empty(),
            "journal ends at {} but head is {}",
            next - 1,
            b.last
        );
        for (seq, f) in frames {
            assert_eq!(seq, next, "journal gap: expected {next}, found {seq}");
            let e = fs_core::Entry::decode(&f).expect("frame decodes");
            assert_eq!(e.seq, seq, "frame seq differs from its key");
            out.push(e);
            next += 1;
        }
    }
    out
}

/// Run one of this workspace's binaries to completion (stdin closed).
pub fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = std::process::Command::new(bin(name));
    c.args(args).stdin(std::process::Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap_or_else(|e| panic!("running {name}: {e}"))
}

/// Exit code 2 with exactly one line on stderr that contains `needle`; that line.
pub fn fails_clearly(o: &std::process::Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected exit 2, got {:?}: {err}",
        o.status.code()
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected, got: {err}"
    );
    assert!(err.contains(needle), "{needle:?} not in: {err}");
    err
}

/// Every file and symlink under `root`, by relative path: its bytes (or link target) and
/// permission bits. Equal snapshots mean nothing under `root` changed.
pub fn snapshot(root: &std::path::Path) -> std::collections::BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).expect("stat");
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if m.is_dir() {
                out.insert(format!("{rel}/"), (Vec::new(), m.mode() & 0o7777));
                stack.push(p);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, (t.display().to_string().into_bytes(), 0));
            } else {
                out.insert(rel, (std::fs::read(&p).expect("read"), m.mode() & 0o7777));
            }
        }
    }
    out
}

/// CRC32C over a snapshot (for messages: equal snapshots are compared whole).
pub fn digest(s: &std::collections::BTreeMap<String, (Vec<u8>, u32)>) -> u32 {
    let mut c = 0u32;
    for (k, (v, m)) in s {
        c = crc32c::crc32c_append(c, k.as_bytes());
        c = crc32c::crc32c_append(c, v);
        c = crc32c::crc32c_append(c, &m.to_le_bytes());
    }
    c
}
