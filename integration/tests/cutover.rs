//! Storage cutover (`jfs cutover`, runbooks/storage-cutover.md) under continuous writes:
//! real mounts writing and renaming checkpoint files, `jfs put` processes, mirror agents
//! following, each runbook step run as the document writes it. Assertions are on bytes
//! (CRC32C of every file a writer recorded), block presence per store, generations and exit
//! codes.

use integration::mirror::*;
use integration::mountproc::Mount;
use integration::runbook;
use integration::written::{check_files, Written};
use integration::{bin, data, volume_with};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const RB: &str = "storage-cutover";

#[derive(Default)]
struct Log {
    files: Mutex<Vec<Written>>,
    /// How long each checkpoint took (write + fsync + rename), for the pause figures.
    took: Mutex<Vec<(Instant, Duration)>>,
    errors: AtomicU64,
}

/// Write checkpoints through the mount as trainers do: `ckpt.tmp`, fsync, rename over
/// `<prefix>-<i>`; every 5th also replaces `latest`. `tolerate`: errors (a killed mount)
/// are counted, not fatal.
fn mount_writer(
    mp: PathBuf,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
    log: Arc<Log>,
    tolerate: bool,
) -> JoinHandle<()> {
    // Files go under `w/`, which exists only inside the mount: while a killed mount is
    // down, writes fail instead of landing in the bare directory beneath it.
    std::fs::create_dir_all(mp.join("w")).unwrap();
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let len = (1 << 20) + (i as usize % 3) * (3 << 19) + 4099;
            let d = data(i * 7919 + prefix.len() as u64, len);
            let t0 = Instant::now();
            let r = (|| -> std::io::Result<()> {
                use std::io::Write;
                let tmp = mp.join(format!("w/{prefix}.tmp"));
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&d)?;
                f.sync_all()?;
                drop(f);
                let name = if i % 5 == 4 {
                    format!("w/{prefix}-latest")
                } else {
                    format!("w/{prefix}-{i}")
                };
                std::fs::rename(&tmp, mp.join(&name))?;
                let mut files = log.files.lock().unwrap();
                files.retain(|w| w.path != name);
                files.push(Written {
                    path: name,
                    crc: crc32c::crc32c(&d),
                    len,
                });
                Ok(())
            })();
            match r {
                Ok(()) => log.took.lock().unwrap().push((t0, t0.elapsed())),
                Err(e) => {
                    assert!(tolerate, "a checkpoint write through the mount failed: {e}");
                    log.errors.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            i += 1;
        }
    })
}

/// `jfs put` processes, one file each, into `/puts`.
fn put_loop(meta: String, dir: PathBuf, stop: Arc<AtomicBool>, log: Arc<Log>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let len = 300_000 + (i as usize * 7_777) % 900_000;
            let d = data(900_000 + i, len);
            let local = dir.join(format!("p-{i}"));
            std::fs::write(&local, &d).unwrap();
            let o = Command::new(bin("jfs"))
                .args([
                    "put",
                    &meta,
                    local.to_str().unwrap(),
                    &format!("/puts/p-{i}"),
                ])
                .output()
                .unwrap();
            if o.status.success() {
                log.files.lock().unwrap().push(Written {
                    path: format!("puts/p-{i}"),
                    crc: crc32c::crc32c(&d),
                    len,
                });
            } else {
                log.errors.fetch_add(1, Ordering::SeqCst);
                eprintln!("jfs put failed: {}", String::from_utf8_lossy(&o.stderr));
            }
            let _ = std::fs::remove_file(&local);
            i += 1;
        }
    })
}

fn jfs(args: &[&str]) -> std::process::Output {
    Command::new(bin("jfs")).args(args).output().unwrap()
}

fn jfs_ok(args: &[&str]) -> String {
    let o = jfs(args);
    assert!(
        o.status.success(),
        "jfs {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status_json(meta: &str) -> serde_json::Value {
    serde_json::from_str(&jfs_ok(&["cutover", "status", meta, "--json"])).unwrap()
}

/// Block objects of a `file://` store.
fn blocks(store_url: &str) -> usize {
    integration::mountproc::store_blocks(store_url).len()
}

/// Move `file://DIR/store` away (a retired store), so nothing can read it any more.
fn retire(store_url: &str) -> PathBuf {
    let p = PathBuf::from(store_url.strip_prefix("file://").unwrap());
    let gone = p.with_extension("retired");
    std::fs::rename(&p, &gone).unwrap();
    gone
}

fn pauses(log: &Log, from: Instant, to: Instant) -> (Duration, Duration, Duration, usize) {
    let mut v: Vec<Duration> = log
        .took
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, d)| *t + *d >= from && *t <= to)
        .map(|(_, d)| *d)
        .collect();
    v.sort();
    let at = |q: f64| {
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (
        at(0.5),
        at(0.99),
        v.last().copied().unwrap_or_default(),
        v.len(),
    )
}

/// The whole runbook on a PostgreSQL volume from a local directory to S3 (Ceph RGW), with a
/// mount writing checkpoints, a `jfs put` loop and a mirror following throughout: 0
/// referenced blocks missing in B at switch; after finish, with A retired, a deep fsck
/// against B alone passes, every recorded file reads back, the mount was never restarted,
/// and the mirror followed the storage change by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_cutover_under_continuous_writes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    let (b_store, _) = integration::store_url("s3");
    let pair = Pair::start(dir.path(), &meta, "rocksdb", None, "", "").await;
    let m = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let mount_pid = m.pid();
    std::fs::create_dir(m.mp.join("puts")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ckpt, puts) = (Arc::new(Log::default()), Arc::new(Log::default()));
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let w1 = mount_writer(m.mp.clone(), "ckpt", stop.clone(), ckpt.clone(), false);
    let w2 = put_loop(meta.clone(), local.clone(), stop.clone(), puts.clone());
    std::thread::sleep(Duration::from_secs(2));
    let env = [("META_URL", meta.as_str()), ("NEW_STORE", b_store.as_str())];
    runbook::run_checked(RB, "check", &env);
    let out = runbook::run_checked(RB, "start", &env);
    assert!(out.contains("generation 1"), "{out}");
    std::thread::sleep(Duration::from_secs(1));
    runbook::run_checked(RB, "backfill", &env);
    runbook::run_checked(RB, "verify", &env);
    let t_switch = Instant::now();
    runbook::run_checked(RB, "switch", &env);
    let t_switched = Instant::now();
    // At switch: every block the metadata references is in B.
    let out = jfs_ok(&["--block-store", &b_store, "fsck", &meta, "--json"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r["broken"].as_array().unwrap().len(),
        0,
        "blocks missing in B at switch: {r}"
    );
    std::thread::sleep(Duration::from_secs(2));
    runbook::run_checked(RB, "finish", &env);
    // Writes go on after the finish (B alone now), then stop.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    w1.join().unwrap();
    w2.join().unwrap();
    assert_eq!(m.pid(), mount_pid);
    assert!(
        integration::mountproc::is_mounted(&m.mp),
        "the mount went away"
    );
    let st = status_json(&meta);
    assert_eq!(st["state"]["gen"], 3, "{st}");
    assert_eq!(
        st["audit"].as_array().unwrap().len(),
        5,
        "start, backfill, verify, switch, finish: {st}"
    );
    // A retired: nothing needs it.
    retire(&vol.store_url);
    let out = jfs_ok(&["fsck", "--deep", &meta]);
    assert!(out.contains(" 0 broken"), "{out}");
    let (c, p) = (
        ckpt.files.lock().unwrap().clone(),
        puts.files.lock().unwrap().clone(),
    );
    assert!(
        c.len() >= 10 && p.len() >= 5,
        "too little was written: {} checkpoints, {} puts",
        c.len(),
        p.len()
    );
    assert_eq!(
        puts.errors.load(Ordering::SeqCst),
        0,
        "jfs put failed during the cutover"
    );
    let n = check_files(&m.mp, &c) + check_files(&m.mp, &p);
    // The mirror followed: it converges with A gone (blocks written late exist only in B).
    let primary = volume::open(&meta, &volume::Options::default())
        .await
        .unwrap();
    wait_converged(&pair.mirror, &**primary.engine(), Duration::from_secs(120)).await;
    let files = assert_same(&primary, &pair.m_meta, &pair.m_store).await;
    assert!(
        pair.mirror
            .log_text()
            .contains("the primary's storage changed"),
        "{}",
        tail(&pair.mirror.log_text(), 20)
    );
    let (p50, p99, max, k) = pauses(&ckpt, t_switch, t_switched);
    eprintln!(
        "cutover under writes: {n} files checked ({} checkpoints, {} puts), {files} equal at the mirror; checkpoint time during switch: p50 {p50:?} p99 {p99:?} max {max:?} over {k}",
        c.len(),
        p.len()
    );
    m.stop();
}

/// Abort at each state (after start, backfill, verify, switch) under writes through a
/// RocksDB mount (steps go through its control socket): the volume ends on A alone, with B
/// retired every file reads back and a deep fsck passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_at_each_state_returns_to_a_and_loses_nothing() {
    for (k, last) in ["start", "backfill", "verify", "switch"].iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let vol = volume_with("rocksdb", "file", |_| {}).await;
        let meta = vol.meta_url.clone();
        drop(vol.fs);
        let b_store = format!("file://{}/b", dir.path().display());
        let m = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Log::default());
        let w = mount_writer(m.mp.clone(), "ckpt", stop.clone(), log.clone(), false);
        std::thread::sleep(Duration::from_millis(800));
        let run_dir = m.run_dir.display().to_string();
        let env_mount = [
            ("META_URL", meta.as_str()),
            ("NEW_STORE", b_store.as_str()),
            ("JFS_RUN_DIR", run_dir.as_str()),
        ];
        for step in ["start", "backfill", "verify", "switch"].iter().take(k + 1) {
            runbook::run_ok(RB, step, &env_mount);
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(*last == ["start", "backfill", "verify", "switch"][k]);
        let out = runbook::run_checked(RB, "abort", &env_mount);
        assert!(
            out.contains(&format!("cutover aborted: single({})", vol.store_url)),
            "after {last}: {out}"
        );
        std::thread::sleep(Duration::from_millis(800));
        stop.store(true, Ordering::SeqCst);
        w.join().unwrap();
        retire(&b_store);
        let files = log.files.lock().unwrap().clone();
        assert!(
            files.len() >= 3,
            "after {last}: only {} checkpoints",
            files.len()
        );
        check_files(&m.mp, &files);
        m.stop();
        let out = jfs_ok(&["fsck", "--deep", &meta]);
        assert!(out.contains(" 0 broken"), "after {last}: {out}");
        let st = status_json(&meta);
        assert_eq!(st["describe"], format!("single({})", vol.store_url), "{st}");
        eprintln!(
            "abort after {last}: {} checkpoints read back from A alone; generation {}",
            files.len(),
            st["state"]["gen"]
        );
    }
}

/// kill -9 of the backfill mid-copy (it resumes), of the mount during writes (remounted;
/// every checkpoint finished before the kill survives), and of a `jfs put` process: re-run,
/// the cutover converges and B alone holds the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_the_steps_and_writers_then_rerun_converges() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    let b_store = format!("file://{}/b", dir.path().display());
    // 40 MiB to copy, so a slow backfill is caught in the middle.
    integration::mirror::write_files(&vol.fs, "old-", 10, 4 << 20).await;
    let mut m = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Log::default());
    let w = mount_writer(m.mp.clone(), "ckpt", stop.clone(), log.clone(), true);
    let env = [("META_URL", meta.as_str()), ("NEW_STORE", b_store.as_str())];
    runbook::run_ok(RB, "start", &env);
    let state = dir.path().join("bf-state");
    let mut bf = Command::new(bin("jfs"))
        .args([
            "cutover",
            "backfill",
            &meta,
            "--bwlimit",
            "8M",
            "--threads",
            "2",
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let _ = bf.kill();
    let _ = bf.wait();
    let copied_before = blocks(&b_store);
    assert!(
        copied_before > 0,
        "the slow backfill copied nothing in 2.5 s"
    );
    // kill -9 the mount during writes, mount again (the writer keeps going and fails while
    // it is down).
    let before_kill = log.files.lock().unwrap().clone();
    Command::new("kill")
        .args(["-9", &m.pid().to_string()])
        .status()
        .unwrap();
    let _ = m.child.take().unwrap().wait();
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("umount").arg("-l").arg(&m.mp).status();
    let m2 = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
    // A `jfs put` killed mid-write.
    let big = dir.path().join("big");
    std::fs::write(&big, data(5, 30 << 20)).unwrap();
    let mut put = Command::new(bin("jfs"))
        .args(["put", &meta, big.to_str().unwrap(), "/big"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let _ = put.kill();
    let _ = put.wait();
    // Re-run: resumes.
    let o = jfs(&[
        "cutover",
        "backfill",
        &meta,
        "--state-dir",
        state.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sum: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        sum["resumed"].is_object(),
        "the second backfill did not resume: {sum}"
    );
    runbook::run_ok(RB, "verify", &env);
    runbook::run_ok(RB, "switch", &env);
    runbook::run_ok(RB, "finish", &env);
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    retire(&vol.store_url);
    let after = log.files.lock().unwrap().clone();
    // What was recorded before the kill, by name, unless replaced later.
    let survived = before_kill
        .iter()
        .filter(|b| after.iter().any(|a| a.path == b.path && a.crc == b.crc))
        .count();
    check_files(&m2.mp, &after);
    for i in 0..10u64 {
        let got = std::fs::read(m2.mp.join(format!("old-{i}"))).unwrap();
        assert!(got == data(i, 4 << 20), "old-{i} differs");
    }
    m2.stop();
    let out = jfs_ok(&["fsck", "--deep", &meta]);
    assert!(out.contains(" 0 broken"), "{out}");
    eprintln!(
        "kill -9: backfill killed after {copied_before} blocks and resumed; mount killed with {} checkpoints done ({survived} unreplaced, all intact); {} checkpoints in all, {} write errors while it was down",
        before_kill.len(),
        after.len(),
        log.errors.load(Ordering::SeqCst)
    );
}

/// A writer that cannot follow (one store opened by hand) is refused after `start`, and one
/// that uploaded under the old generation places its blocks again and commits; a session
/// that stops heartbeating holds a step only until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_generations_are_fenced_and_silent_sessions_expire() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    let b_store = format!("file://{}/b", dir.path().display());
    let o = fs_core::Owner { uid: 0, gid: 0 };
    // (1) A fixed-store writer, and a following writer with a slice uploaded before start.
    let fixed = vol.client().await;
    let (f1, _) = fixed
        .create(fs_core::ROOT_INO, b"fixed", 0o644, o)
        .await
        .unwrap();
    let follower = volume::open(
        &meta,
        &volume::Options {
            access: volume::Access::Write,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (f2, _) = follower
        .create(fs_core::ROOT_INO, b"follows", 0o644, o)
        .await
        .unwrap();
    let slice = follower
        .upload_slice(bytes::Bytes::from(data(3, 5 << 20)))
        .await
        .unwrap();
    assert_eq!(slice.placed.gen, 0);
    // (2) A session of another host that stopped beating: acknowledged generation 0.
    let engine = integration::open_engine(&meta).await;
    let mut ghost = fs_core::session::Session::new("/mnt/elsewhere", false);
    ghost.host = "gone-host".into();
    ghost.acks.insert(fs_core::storage::ACK.into(), 0);
    fs_core::session::beat(&*engine, &mut ghost).await.unwrap();
    let o1 = jfs(&["cutover", "start", &meta, "--to", &b_store, "--wait", "2s"]);
    let err = String::from_utf8_lossy(&o1.stderr);
    assert_eq!(o1.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&ghost.id) && err.contains("have not followed generation 1"),
        "{err}"
    );
    // The step is committed; the live writer followed, the ghost did not.
    assert_eq!(status_json(&meta)["state"]["gen"], 1);
    // The fixed writer is refused, with what to do.
    let e = fixed.write(f1, 0, b"late").await.unwrap_err();
    assert_eq!(e.kind(), fs_core::ErrorKind::Fenced, "{e}");
    assert!(e.to_string().contains("reopen"), "{e}");
    // The follower's slice, uploaded under generation 0 (A only), is placed again.
    follower.commit_slice(f2, 0, 0, &slice).await.unwrap();
    let keys = follower.slice_block_keys(slice.id, slice.len);
    let b = integration::open_store(&b_store);
    for (k, _) in &keys {
        assert!(
            b.head(k).await.unwrap().is_some(),
            "{k} was not placed in B"
        );
    }
    // The ghost holds the next step until its heartbeat is older than the timeout.
    let o2 = jfs(&[
        "cutover",
        "backfill",
        &meta,
        "--wait",
        "1s",
        "--session-timeout",
        "1h",
    ]);
    assert_eq!(o2.status.code(), Some(2));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let o3 = jfs(&["cutover", "backfill", &meta, "--session-timeout", "1s"]);
    assert!(
        o3.status.success(),
        "{}",
        String::from_utf8_lossy(&o3.stderr)
    );
    let out = jfs_ok(&["cutover", "verify", &meta, "--session-timeout", "1s"]);
    assert!(out.contains("0 failed"), "{out}");
    // A re-run start is a no-op; a second cutover is refused while one is in progress.
    let o4 = jfs(&[
        "cutover",
        "start",
        &meta,
        "--to",
        &b_store,
        "--session-timeout",
        "1s",
    ]);
    assert!(
        o4.status.success(),
        "{}",
        String::from_utf8_lossy(&o4.stderr)
    );
    let o5 = jfs(&[
        "cutover",
        "start",
        &meta,
        "--to",
        "file:///tmp/elsewhere-store",
    ]);
    assert!(String::from_utf8_lossy(&o5.stderr).contains("already in progress"));
    // gc deletes nothing during the cutover, and says so.
    let out = jfs_ok(&["gc", &meta, "--delete"]);
    assert!(out.contains("cutover is in progress"), "{out}");
    let got = follower.read(f2, 0, 5 << 20).await.unwrap();
    assert!(got == data(3, 5 << 20));
    fs_core::session::remove(&*engine, &ghost.id).await.unwrap();
}

/// Abort from `switched` with the old store A refusing writes (a read-only bind mount): the
/// abort fails and commits nothing (the volume stays switched, every write through the mount
/// goes on succeeding), and the writer whose puts to A fail is shown as degraded in
/// `cutover status` and its metrics, with the store's own error (EROFS is permanent: no
/// retries, no grace waited per block). Once A is writable, abort finishes on A alone and
/// every checkpoint reads back from A.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_abort_keeps_the_volume_switched_and_names_the_degraded_writer() {
    use integration::mountproc::ReadOnlyBind;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    drop(vol.fs);
    let b_store = format!("file://{}/b", dir.path().display());
    let m = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Log::default());
    // Not tolerant: a single failed checkpoint write fails the test.
    let w = mount_writer(m.mp.clone(), "ckpt", stop.clone(), log.clone(), false);
    let run_dir = m.run_dir.display().to_string();
    let env = [
        ("META_URL", meta.as_str()),
        ("NEW_STORE", b_store.as_str()),
        ("JFS_RUN_DIR", run_dir.as_str()),
    ];
    for step in ["start", "backfill", "verify", "switch"] {
        runbook::run_ok(RB, step, &env);
    }
    let switched = status_json(&meta);
    assert!(
        switched["describe"]
            .as_str()
            .unwrap()
            .starts_with("switched("),
        "{switched}"
    );
    // The steps went through the mount; the audit names the commands, not the mount.
    let mount_pid = format!("pid {}", m.pid());
    for a in switched["audit"].as_array().unwrap() {
        let who = a["who"].as_str().unwrap();
        assert!(who.contains(" pid ") && !who.ends_with(&mount_pid), "{a}");
    }
    let ro = ReadOnlyBind::over_store(&vol.store_url);
    // The writer's puts to A now fail: it shows as degraded, with the store's error.
    let t0 = Instant::now();
    let degraded = loop {
        let st = status_json(&meta);
        if let Some(d) = st["degraded_sessions"].as_array().and_then(|v| v.first()) {
            break d.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no degraded writer shown: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(degraded["degraded"]["role"], "a", "{degraded}");
    assert_eq!(degraded["degraded"]["store"], vol.store_url, "{degraded}");
    let err = degraded["degraded"]["error"].as_str().unwrap();
    assert!(err.contains("Read-only file system"), "{degraded}");
    let text = jfs_ok(&["cutover", "status", &meta]);
    assert!(
        text.lines().any(|l| l.starts_with("DEGRADED writer")
            && l.contains(&vol.store_url)
            && l.contains("Read-only file system")),
        "{text}"
    );
    assert_eq!(
        integration::mountproc::metric(&m.stats(), "jfs_dual_write_degraded"),
        1.0
    );
    // Abort refuses to make A the store written first: nothing changes.
    let o = runbook::run(RB, "abort", &env);
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("nothing was changed") && out.contains("stays switched("),
        "{out}"
    );
    assert_eq!(
        out.matches("Read-only file system").count(),
        1,
        "the cause is said once: {out}"
    );
    let st = status_json(&meta);
    assert_eq!(
        st["state"], switched["state"],
        "abort committed something: {st}"
    );
    // Writes go on (the writer asserts each one); a few more land while A refuses.
    let n = log.files.lock().unwrap().len();
    let t0 = Instant::now();
    while log.files.lock().unwrap().len() < n + 3 {
        assert!(t0.elapsed() < Duration::from_secs(60), "writes stalled");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(ro);
    let out = runbook::run_ok(RB, "abort", &env);
    assert!(
        out.contains(&format!("cutover aborted: single({})", vol.store_url)),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    let st = status_json(&meta);
    assert_eq!(st["degraded_sessions"].as_array().unwrap().len(), 0, "{st}");
    retire(&b_store);
    let files = log.files.lock().unwrap().clone();
    check_files(&m.mp, &files);
    m.stop();
    let out = jfs_ok(&["fsck", "--deep", &meta]);
    assert!(out.contains(" 0 broken"), "{out}");
}

/// An abort interrupted after its first step (switched -> dual, A first again) is named by
/// `cutover status` with the command that finishes it, and that command finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_names_an_interrupted_abort_and_abort_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    let b_store = format!("file://{}/b", dir.path().display());
    let env = [("META_URL", meta.as_str()), ("NEW_STORE", b_store.as_str())];
    for step in ["start", "backfill", "verify", "switch"] {
        runbook::run_ok(RB, step, &env);
    }
    // What a killed `abort` leaves: its first transition only.
    fs_core::storage::transition(&**vol.fs.engine(), &fs_core::storage::Event::Abort)
        .await
        .unwrap();
    let text = jfs_ok(&["cutover", "status", &meta]);
    assert!(
        text.contains("aborting)")
            && text.contains(&format!(
                "next step: finish the interrupted abort: jfs cutover abort {meta}"
            )),
        "{text}"
    );
    let out = runbook::run_ok(RB, "abort", &env);
    assert!(
        out.contains(&format!("cutover aborted: single({})", vol.store_url)),
        "{out}"
    );
}
