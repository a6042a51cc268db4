//! Moving the primary role (runbooks/site-migration.md, failover.md, engine-migration.md):
//! real agents, a real mount writing through the move, each runbook step run as written.
//! Assertions are on bytes (every checkpoint a writer saw acknowledged), epochs, dumps, ids
//! and exit codes.

use integration::mirror::*;
use integration::mountproc::Mount;
use integration::runbook;
use integration::{bin, data, volume_with};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A checkpoint acknowledged to its writer (written, fsynced, renamed), with its CRC.
#[derive(Debug, Clone)]
struct Written {
    path: String,
    crc: u32,
    len: usize,
}

#[derive(Default)]
struct Log {
    files: Mutex<Vec<Written>>,
    took: Mutex<Vec<(Instant, Duration)>>,
    errors: Mutex<Vec<String>>,
}

/// Checkpoints through the mount (under `w/`, which exists only inside it): write, fsync,
/// rename over `ck-<i % 40>`.
fn writer(mp: PathBuf, stop: Arc<AtomicBool>, log: Arc<Log>) -> JoinHandle<()> {
    std::fs::create_dir_all(mp.join("w")).unwrap();
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let len = 200_000 + (i as usize * 3_331) % 600_000;
            let d = data(40_000 + i, len);
            let t0 = Instant::now();
            let name = format!("w/ck-{}", i % 40);
            let r = (|| -> std::io::Result<()> {
                use std::io::Write;
                let tmp = mp.join("w/ck.tmp");
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&d)?;
                f.sync_all()?;
                drop(f);
                std::fs::rename(&tmp, mp.join(&name))
            })();
            match r {
                Ok(()) => {
                    log.took.lock().unwrap().push((t0, t0.elapsed()));
                    let mut files = log.files.lock().unwrap();
                    files.retain(|w| w.path != name);
                    files.push(Written {
                        path: name,
                        crc: crc32c::crc32c(&d),
                        len,
                    });
                }
                Err(e) => {
                    log.errors.lock().unwrap().push(format!("{name}: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            i += 1;
        }
    })
}

fn check_files(root: &Path, files: &[Written]) {
    for w in files {
        let got = std::fs::read(root.join(&w.path))
            .unwrap_or_else(|e| panic!("reading {} back: {e}", w.path));
        assert_eq!(got.len(), w.len, "{} has the wrong length", w.path);
        assert_eq!(
            crc32c::crc32c(&got),
            w.crc,
            "{} differs from what was acknowledged",
            w.path
        );
    }
}

fn longest_pause(log: &Log) -> Duration {
    log.took
        .lock()
        .unwrap()
        .iter()
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default()
}

fn status_json(meta: &str) -> serde_json::Value {
    let o = Command::new(bin("jfs"))
        .args(["status", meta, "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The planned site migration of the runbook, under writes through a mount of the old
/// primary (PostgreSQL) to a mirror on RocksDB: every acknowledged checkpoint is at the new
/// primary, the mount followed the move with a file held open across it, the old primary
/// cannot write or ship any more, and it rejoins as a mirror and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planned_site_migration_under_writes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    let mut pair = Pair::start(dir.path(), &old_meta, "rocksdb", None, "", "").await;
    let m = Mount::start(&old_meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Log::default());
    let w = writer(m.mp.clone(), stop.clone(), log.clone());
    // A file held open across the move.
    use std::io::Write;
    let mut held = std::fs::File::create(m.mp.join("held")).unwrap();
    held.write_all(&data(7, 3 << 20)).unwrap();
    held.sync_all().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let new_listen = format!("127.0.0.1:{}", free_port());
    let (m_admin, m_cfg) = (
        pair.mirror.admin.clone(),
        pair.mirror.cfg.display().to_string(),
    );
    let env = [
        ("OLD_META", old_meta.as_str()),
        ("NEW_META", pair.m_meta.as_str()),
        ("NEW_PRIMARY", new_listen.as_str()),
        ("MIRROR_ADMIN", m_admin.as_str()),
        ("MIRROR_CONFIG", m_cfg.as_str()),
        ("OLD_SITE", "old-site"),
    ];
    let t_fence = Instant::now();
    let out = runbook::run_ok("site-migration", "fence", &env);
    assert!(out.contains("fenced"), "{out}");
    // The old primary refuses writers outside the mount too.
    let local = dir.path().join("x");
    std::fs::write(&local, b"late").unwrap();
    let o = Command::new(bin("jfs"))
        .args(["put", &old_meta, local.to_str().unwrap(), "/late"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("old-site"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    runbook::run_ok("site-migration", "wait", &env);
    assert_eq!(
        pair.mirror.term(),
        0,
        "the mirror agent did not stop cleanly"
    );
    let out = runbook::run_ok("site-migration", "promote", &env);
    let t_promoted = Instant::now();
    assert!(out.contains("primary at epoch 1"), "{out}");
    // The new site's primary agent, serving the old site as a mirror.
    let p2 = Agent::start(
        dir.path(),
        "primary2",
        &primary_toml(
            &pair.m_meta,
            &dir.path().join("p2state"),
            &format!("127.0.0.1:{}", free_port()),
            &new_listen,
            &["old-site"],
            "",
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    // The mount follows by itself; writes go on at the new primary.
    let t0 = Instant::now();
    while !std::fs::read_to_string(&m.log)
        .unwrap_or_default()
        .contains("the volume moved to a new primary")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the mount did not follow the move: {}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    held.write_all(&data(8, 1 << 20)).unwrap();
    held.sync_all().unwrap();
    drop(held);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    let errors = log.errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "writers got errors through the move: {errors:?}"
    );
    let files = log.files.lock().unwrap().clone();
    assert!(files.len() >= 10, "only {} checkpoints", files.len());
    // Every acknowledged checkpoint is at the new primary (read through a fresh mount of it).
    let m2 = Mount::start(
        &pair.m_meta,
        dir.path(),
        "mnt2",
        &["--cache-size", "0", "--read-only"],
    );
    check_files(&m2.mp, &files);
    let mut want_held = data(7, 3 << 20);
    want_held.extend(data(8, 1 << 20));
    assert!(
        std::fs::read(m2.mp.join("held")).unwrap() == want_held,
        "the file held open across the move differs"
    );
    let st = status_json(&pair.m_meta);
    assert_eq!(st["epoch"], 1, "{st}");
    assert!(st["mirror"].is_null(), "{st}");
    // The old primary: its agent refuses to start as a primary; a mirror agent there, named as
    // fenced, rejoins the new primary and converges.
    pair.primary.term();
    let o = Command::new(bin("mirror-agent"))
        .args(["run", "--config", pair.primary.cfg.to_str().unwrap()])
        .env("MIRROR_TOKEN", TOKEN)
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(!o.status.success(), "the old primary's agent started");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("mirror \"old-site\""),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    m2.stop();
    m.stop();
    let rejoin = Agent::start(
        dir.path(),
        "rejoin",
        &mirror_toml(
            &old_meta,
            &dir.path().join("rjstate"),
            &format!("127.0.0.1:{}", free_port()),
            "old-site",
            &new_listen,
            &vol.store_url,
            "",
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    let newp = volume::open(&pair.m_meta, &volume::Options::default())
        .await
        .unwrap();
    wait_converged(&rejoin, &**newp.engine(), Duration::from_secs(120)).await;
    let n = assert_same(&newp, &old_meta, &vol.store_url).await;
    assert_same_journal(&**newp.engine(), &*open_ro(&old_meta).await).await;
    assert!(status_json(&old_meta)["epoch"] == 1);
    let _ = p2;
    eprintln!(
        "site migration: {} checkpoints acknowledged, all at the new primary; longest checkpoint {:?} (fence to promoted {:?}); the old primary rejoined and equals the new one ({n} files)",
        files.len(),
        longest_pause(&log),
        t_promoted - t_fence
    );
}
