//! Reads at a mirror site through `jfs mount`: real agents (primary and mirror), a real
//! FUSE mount of the mirror's metadata, blocks not yet copied read from the origin store.
//! Every test asserts on bytes, counts and errnos.

use integration::mirror::*;
use integration::mountproc::{flip_bit, metric, store_blocks, wait_store_blocks, Mount};
use integration::{bin, data, volume_with};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The mirror agent's copier held back: 1 byte/s copies nothing in a test's time.
const HELD_BACK: &str = "bwlimit = \"1\"";

/// Block objects in a `file://` store.
fn blocks_in(store_url: &str) -> usize {
    store_blocks(store_url).len()
}

async fn wait_applied(pair: &Pair, primary: &dyn fs_core::Engine) {
    let want = primary.journal_bounds().await.unwrap().last;
    status_until(&pair.mirror, Duration::from_secs(60), |st| {
        st["bootstrap"].is_null() && n(st, "applied_seq") >= want
    })
    .await;
}

/// With the copier held back, files written at the primary are read byte-identical at the
/// mirror mount through the origin, land in the mirror store (read-through fills), and new
/// files show up within the window; writes are refused; `--no-fallback` makes a block not
/// yet copied an EIO.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_mount_reads_through_the_origin_while_the_copier_is_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", HELD_BACK).await;
    write_files(&vol.fs, "model-", 3, (9 << 20) + 777).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    assert_eq!(blocks_in(&pair.m_store), 0, "the copier was not held back");
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    for i in 0..3u64 {
        let got = std::fs::read(m.mp.join(format!("model-{i}"))).unwrap();
        assert!(
            got == data(i, (9 << 20) + 777),
            "model-{i} differs at the mirror"
        );
    }
    let s = m.stats();
    assert!(metric(&s, "jfs_fallback_reads_total") >= 9.0, "{s:?}");
    assert_eq!(metric(&s, "jfs_origin_errors_total"), 0.0, "{s:?}");
    // The origin's traffic is metered like every store's, apart (label store="origin").
    let origin_gets: f64 = s
        .iter()
        .filter(|(k, _)| {
            k.starts_with("jfs_blockstore_gets_total{") && k.contains("store=\"origin\"")
        })
        .map(|(_, v)| v)
        .sum();
    assert!(origin_gets >= 9.0, "origin gets not metered: {s:?}");
    // Read-through fills put every block read into the mirror store.
    wait_store_blocks(&pair.m_store, 9);
    // Read-only: the mirror's data is the primary's.
    let e = std::fs::write(m.mp.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30 /* EROFS */), "{e}");
    let e = std::fs::remove_file(m.mp.join("model-0")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30 /* EROFS */), "{e}");
    // Fresh within the window (1 s) + 1 s: a file created at the primary appears, 100 of 100.
    let mut worst = Duration::ZERO;
    for t in 0..100u64 {
        let name = format!("fresh-{t}");
        let t0 = Instant::now();
        write_files(&vol.fs, &name, 1, 1000).await;
        let path = m.mp.join(format!("{name}0"));
        loop {
            // The create and the write are two entries: the mirror may show the file empty
            // for a moment (a consistent prefix of the primary's history), never other bytes.
            if let Ok(b) = std::fs::read(&path) {
                if !b.is_empty() {
                    assert!(b == data(0, 1000), "{name}0 read {} other bytes", b.len());
                    break;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "{name} not visible at the mirror mount after 2 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        worst = worst.max(t0.elapsed());
    }
    let s = m.stats();
    assert!(metric(&s, "jfs_applied_seq") > 0.0, "{s:?}");
    m.stop();
    // --no-fallback: copied (filled) blocks read, a block not at the mirror is EIO.
    write_files(&vol.fs, "late-", 1, 5 << 20).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let m = Mount::start(
        &pair.m_meta,
        dir.path(),
        "mm",
        &["--cache-size", "0", "--no-fallback"],
    );
    assert!(std::fs::read(m.mp.join("model-1")).unwrap() == data(1, (9 << 20) + 777));
    let e = std::fs::read(m.mp.join("late-0")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    assert!(metric(&m.stats(), "jfs_fallback_refused_total") >= 1.0);
    m.stop();
    // jfs warmup at a mirror mount fills the mirror store (not only the local cache) before
    // it returns.
    let before = blocks_in(&pair.m_store);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &[]);
    let o = Command::new(bin("jfs"))
        .args(["warmup", "--json", m.mp.join("late-0").to_str().unwrap()])
        .env("JFS_RUN_DIR", &m.run_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        blocks_in(&pair.m_store),
        before + 2,
        "warmup did not put late-0's 2 blocks in the mirror store"
    );
    assert!(std::fs::read(m.mp.join("late-0")).unwrap() == data(0, 5 << 20));
    m.stop();
    eprintln!("mirror mount: 27 MiB read through the origin, 9 blocks filled, fresh within {worst:?} (worst of 100)");
}

/// kill -9 of a mirror mount while it fills the mirror store from the origin: every block in
/// the mirror store afterwards is whole (a fill is one atomic put), and a new mount reads the
/// files byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_mount_killed_during_fills_leaves_no_torn_block() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "redis", None, "", HELD_BACK).await;
    write_files(&vol.fs, "big-", 2, 40 << 20).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let mut m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let mp = m.mp.clone();
    let reader = std::thread::spawn(move || {
        for i in 0..2 {
            let _ = std::fs::read(mp.join(format!("big-{i}")));
        }
    });
    let t0 = Instant::now();
    while blocks_in(&pair.m_store) < 3 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = m.pid();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let _ = reader.join();
    if let Some(mut c) = m.child.take() {
        let _ = c.wait();
    }
    drop(m);
    // Every object in the mirror store is a whole block: its length is the one its key names.
    let mut checked = 0;
    for (p, len) in store_blocks(&pair.m_store) {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let want: u64 = name
            .rsplit('_')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("a stray object in the mirror store: {}", p.display()));
        assert_eq!(len, want, "torn block {}", p.display());
        checked += 1;
    }
    assert!(checked >= 1, "no fill landed before the kill");
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    for i in 0..2u64 {
        assert!(std::fs::read(m.mp.join(format!("big-{i}"))).unwrap() == data(i, 40 << 20));
    }
    m.stop();
    eprintln!("killed during fills: {checked} blocks in the mirror store, all whole");
}

/// The origin behind a harness proxy: with the link cut, blocks already at the mirror read,
/// blocks not yet there fail with EIO within the origin timeout (never hang); after the
/// link returns they read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_origin_cut_missing_blocks_fail_in_bounded_time_then_read_again() {
    let (vol, proxy, origin) = s3_volume_behind_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("origin_store = \"{origin}\"\n{HELD_BACK}");
    let pair = Pair::start(dir.path(), &vol.meta_url, "redis", None, "", &extra).await;
    write_files(&vol.fs, "here-", 2, 3 << 20).await;
    write_files(&vol.fs, "there-", 2, 3 << 20).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let flags = ["--cache-size", "0", "--origin-timeout", "4s"];
    // Read here-* once: the fills bring their blocks to the mirror store.
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &flags);
    for i in 0..2u64 {
        assert!(std::fs::read(m.mp.join(format!("here-{i}"))).unwrap() == data(i, 3 << 20));
    }
    wait_store_blocks(&pair.m_store, 2);
    m.stop();
    // Cut the origin; a new mount (cold kernel cache).
    proxy.cut.store(true, Ordering::SeqCst);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &flags);
    for i in 0..2u64 {
        assert!(
            std::fs::read(m.mp.join(format!("here-{i}"))).unwrap() == data(i, 3 << 20),
            "here-{i} (at the mirror) with the origin cut"
        );
    }
    let t0 = Instant::now();
    let e = std::fs::read(m.mp.join("there-0")).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    assert!(
        took < Duration::from_secs(20),
        "the failed read took {took:?}"
    );
    assert!(metric(&m.stats(), "jfs_origin_errors_total") >= 1.0);
    // The link returns: the same mount reads it.
    proxy.cut.store(false, Ordering::SeqCst);
    let t1 = Instant::now();
    loop {
        match std::fs::read(m.mp.join("there-0")) {
            Ok(b) => {
                assert!(b == data(0, 3 << 20));
                break;
            }
            Err(e) => assert!(
                t1.elapsed() < Duration::from_secs(30),
                "there-0 still fails after the link returned: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    m.stop();
    eprintln!("origin cut: missing block failed with EIO after {took:?}");
}

/// Publish a version as model publishers do: written under a temporary name, renamed over.
async fn publish(fs: &fs_core::Fs, v: u64, b: Vec<u8>) {
    replace(fs, "model.bin", v, &b).await
}

/// Replace `name` in the root by version `v`: `.name.tmpV` written, then renamed over it.
async fn replace(fs: &fs_core::Fs, name: &str, v: u64, b: &[u8]) {
    let owner = fs_core::Owner { uid: 0, gid: 0 };
    let root = fs_core::ROOT_INO;
    let tmp = format!(".{name}.tmp{v}");
    let (ino, _) = fs.create(root, tmp.as_bytes(), 0o644, owner).await.unwrap();
    fs.write(ino, 0, b).await.unwrap();
    fs.rename(root, tmp.as_bytes(), root, name.as_bytes(), false)
        .await
        .unwrap();
}

/// Version `v` of file `i`: (i, v) in 16 bytes, data, then the CRC32C of both.
fn versioned(i: u64, v: u64, len: usize) -> Vec<u8> {
    let mut b = i.to_le_bytes().to_vec();
    b.extend(v.to_le_bytes());
    b.extend(data(i * 1000 + v, len));
    let c = crc32c::crc32c(&b);
    b.extend(c.to_le_bytes());
    b
}

/// A whole version of file `i` (checked by its CRC), or a panic naming what is wrong.
fn check_versioned(i: u64, b: &[u8]) -> u64 {
    assert!(b.len() > 20, "f-{i}: short read: {} bytes", b.len());
    let (body, tail) = b.split_at(b.len() - 4);
    let fi = u64::from_le_bytes(body[..8].try_into().unwrap());
    let v = u64::from_le_bytes(body[8..16].try_into().unwrap());
    assert_eq!(fi, i, "f-{i} holds file {fi}'s data");
    assert_eq!(
        crc32c::crc32c(body).to_le_bytes(),
        tail,
        "f-{i} version {v} read as a mix ({} bytes)",
        b.len()
    );
    v
}

/// A forced resync (`mirror-agent resync`) while readers loop over files at the mirror
/// mount and the primary keeps replacing them and deleting others: the snapshot goes in
/// beside the live metadata, the mount keeps serving the previous state (reported as stale,
/// `jfs_mirror_resyncing`), and the switch is one write. Every read returns a whole version;
/// none fails (no ENOENT for files that exist on both sides); afterwards the mount shows
/// exactly the primary's tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_resync_keeps_serving_the_previous_state_until_the_switch() {
    const FILES: u64 = 12;
    const BULK: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", "").await;
    for i in 0..FILES {
        replace(&vol.fs, &format!("f-{i}"), 0, &versioned(i, 0, 300_000)).await;
    }
    // A big tree, so that the snapshot takes a while to install and catch up.
    let owner = fs_core::Owner { uid: 0, gid: 0 };
    let (bulk, _) = vol
        .fs
        .mkdir(fs_core::ROOT_INO, b"bulk", 0o755, owner)
        .await
        .unwrap();
    let mut makers = Vec::new();
    for w in 0..8u64 {
        let fs = vol.client().await;
        makers.push(tokio::spawn(async move {
            for j in (w..BULK).step_by(8) {
                fs.create(bulk, format!("b-{j}").as_bytes(), 0o644, owner)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in makers {
        t.await.unwrap();
    }
    wait_applied(&pair, &**vol.fs.engine()).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    // When each read completed (wall clock, to compare with the logs' timestamps).
    let done_at = Arc::new(std::sync::Mutex::new(Vec::<std::time::SystemTime>::new()));
    let mut readers = Vec::new();
    for r in 0..3u64 {
        let (mp, stop, reads, done_at) =
            (m.mp.clone(), stop.clone(), reads.clone(), done_at.clone());
        readers.push(std::thread::spawn(move || {
            let mut newest = 0;
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                i = (i + 1) % FILES;
                let p = mp.join(format!("f-{i}"));
                let b = std::fs::read(&p)
                    .unwrap_or_else(|e| panic!("reading {} at the mirror: {e}", p.display()));
                newest = newest.max(check_versioned(i, &b));
                reads.fetch_add(1, Ordering::Relaxed);
                done_at.lock().unwrap().push(std::time::SystemTime::now());
            }
            newest
        }));
    }
    // The primary goes on: files replaced by rename, bulk files deleted.
    let pub_stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (fs, stop) = (vol.client().await, pub_stop.clone());
        tokio::spawn(async move {
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                let i = v % FILES;
                replace(&fs, &format!("f-{i}"), v, &versioned(i, v, 300_000)).await;
                fs.unlink(bulk, format!("b-{v}").as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            v
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = pair.mirror.admin_change("resync", &[]);
    assert!(out.contains("beside the live metadata"), "{out}");
    // The staged phase is judged from what the agent and the mount logged, with their
    // timestamps, not by sampling gauges: a loaded machine can stretch a sampling loop past
    // the whole phase.
    let t0 = Instant::now();
    while !pair
        .mirror
        .log_text()
        .contains("switched the live metadata")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no switch: {}",
            tail(&pair.mirror.log_text(), 15)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let agent_log = pair.mirror.log_text();
    let staged_from = logged_at(
        &agent_log,
        "beside the live metadata (which serves its previous state",
    );
    let switched = logged_at(&agent_log, "switched the live metadata");
    let (staged_at, switched_at) = {
        let d = done_at.lock().unwrap();
        (
            d.iter().filter(|t| **t < staged_from).count() as u64,
            d.iter().filter(|t| **t < switched).count() as u64,
        )
    };
    assert!(
        switched_at > staged_at,
        "no read completed while the resync was staged ({staged_at} -> {switched_at})"
    );
    // The mount heard of the staged resync from the agent's progress record (it logs it
    // when it does).
    let t0 = Instant::now();
    while !std::fs::read_to_string(&m.log)
        .unwrap_or_default()
        .contains("the mirror is resyncing: serving its previous state")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the mount never reported the resync; its log:\n{}",
            tail(&std::fs::read_to_string(&m.log).unwrap_or_default(), 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Reads go on after the switch, then everything converges.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pub_stop.store(true, Ordering::Relaxed);
    let last_v = publisher.await.unwrap();
    wait_applied(&pair, &**vol.fs.engine()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader failed at the mirror");
    }
    let after = reads.load(Ordering::Relaxed);
    assert!(after > switched_at, "reads stopped at the switch");
    // The mount now shows exactly the primary's tree.
    for i in 0..FILES {
        let (ino, _) = vol.fs.resolve(&format!("/f-{i}")).await.unwrap();
        let want = integration::read_all(&vol.fs, ino).await;
        let got = std::fs::read(m.mp.join(format!("f-{i}"))).unwrap();
        assert!(
            got == want,
            "f-{i} differs from the primary's after the resync"
        );
    }
    let listed = std::fs::read_dir(m.mp.join("bulk")).unwrap().count() as u64;
    assert_eq!(
        listed,
        BULK - last_v,
        "bulk files at the mirror after the resync"
    );
    let st = pair.mirror.status();
    assert!(st["resync"].is_null() && st["bootstrap"].is_null(), "{st}");
    assert!(pair
        .mirror
        .metrics()
        .contains("jfs_mirror_resync_switches_total 1"));
    m.stop();
    eprintln!(
        "resync: {} reads before the staged phase, {} during it, {} after the switch; {last_v} replacements at the primary",
        staged_at,
        switched_at - staged_at,
        after - switched_at
    );
}

/// A file replaced by rename at the primary (new version written under a temporary name,
/// renamed over the old) in a loop while readers at the mirror open and read it whole: every
/// read returns one whole version (its embedded checksum matches), never a mix, never an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_at_the_mirror_see_whole_versions_of_a_file_replaced_by_rename() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "redis", None, "", "").await;
    // Version v: 8 bytes of v, then data(v), then the CRC32C of both.
    let version = |v: u64| {
        let mut b = v.to_le_bytes().to_vec();
        b.extend(data(1000 + v, (5 << 20) + (v as usize % 7) * 4096));
        let c = crc32c::crc32c(&b);
        b.extend(c.to_le_bytes());
        b
    };
    publish(&vol.fs, 0, version(0)).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let m = Mount::start(
        &pair.m_meta,
        dir.path(),
        "mm",
        &[
            "--cache-size",
            "0",
            "--attr-cache",
            "0s",
            "--entry-cache",
            "0s",
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (mp, stop, reads) = (m.mp.clone(), stop.clone(), reads.clone());
        readers.push(std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let b = std::fs::read(mp.join("model.bin")).expect("a read at the mirror failed");
                assert!(b.len() > 12, "short read: {} bytes", b.len());
                let (body, tail) = b.split_at(b.len() - 4);
                let v = u64::from_le_bytes(body[..8].try_into().unwrap());
                assert_eq!(
                    crc32c::crc32c(body).to_le_bytes(),
                    tail,
                    "version {v} read as a mix ({} bytes)",
                    b.len()
                );
                seen.insert(v);
                reads.fetch_add(1, Ordering::Relaxed);
            }
            seen
        }));
    }
    for v in 1..=12 {
        publish(&vol.fs, v, version(v)).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_applied(&pair, &**vol.fs.engine()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut versions = std::collections::BTreeSet::new();
    for r in readers {
        versions.extend(r.join().expect("a reader failed"));
    }
    assert!(
        versions.len() >= 3,
        "readers saw too few versions: {versions:?}"
    );
    assert!(
        versions.contains(&12),
        "the last version was never read: {versions:?}"
    );
    m.stop();
    eprintln!(
        "rename loop: {} whole reads of versions {versions:?}",
        reads.load(Ordering::Relaxed)
    );
}

/// Wait until a mount's statistic satisfies `ok` (at most `limit`).
fn stat_until(m: &Mount, name: &str, limit: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let t0 = Instant::now();
    loop {
        let v = metric(&m.stats(), name);
        if ok(v) {
            return v;
        }
        assert!(t0.elapsed() < limit, "{name} stayed at {v} for {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The staleness policy: with the mirror agent stopped (its progress record ages, so the
/// mirror is out of its window), `--stale fail` fails opens with EIO, the default `serve`
/// serves what was applied (counted), `wait=` serves once the agent is back in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_staleness_policy_applies_while_the_mirror_is_out_of_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, "redis", None, "", "").await;
    write_files(&vol.fs, "w-", 1, 100_000).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let fail = Mount::start(&pair.m_meta, dir.path(), "fail", &["--stale", "fail"]);
    let serve = Mount::start(&pair.m_meta, dir.path(), "serve", &[]);
    let wait = Mount::start(&pair.m_meta, dir.path(), "wait", &["--stale", "wait=20s"]);
    for m in [&fail, &serve, &wait] {
        stat_until(
            m,
            "jfs_mirror_within_window",
            Duration::from_secs(10),
            |v| v == 1.0,
        );
        assert!(std::fs::read(m.mp.join("w-0")).unwrap() == data(0, 100_000));
    }
    assert_eq!(pair.mirror.term(), 0, "the mirror agent's exit code");
    for m in [&fail, &serve, &wait] {
        stat_until(
            m,
            "jfs_mirror_within_window",
            Duration::from_secs(15),
            |v| v == 0.0,
        );
    }
    let e = std::fs::read(fail.mp.join("w-0")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    assert!(metric(&fail.stats(), "jfs_stale_refused_total") >= 1.0);
    assert!(std::fs::read(serve.mp.join("w-0")).unwrap() == data(0, 100_000));
    assert!(metric(&serve.stats(), "jfs_stale_opens_total") >= 1.0);
    // A reader at the wait= mount blocks until the agent is back, then reads.
    let mp = wait.mp.clone();
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = std::fs::read(mp.join("w-0"));
        (r.map(|b| b == data(0, 100_000)), t0.elapsed())
    });
    std::thread::sleep(Duration::from_secs(2));
    pair.mirror.restart();
    let (r, took) = waiter.join().unwrap();
    assert!(
        r.expect("the waiting read failed"),
        "the waiting read got other bytes"
    );
    assert!(
        took >= Duration::from_secs(2),
        "the read did not wait ({took:?})"
    );
    stat_until(
        &fail,
        "jfs_mirror_within_window",
        Duration::from_secs(15),
        |v| v == 1.0,
    );
    assert!(std::fs::read(fail.mp.join("w-0")).unwrap() == data(0, 100_000));
    for m in [fail, serve, wait] {
        m.stop();
    }
    eprintln!("stale policy: a read at the wait= mount waited {took:?} for the agent");
}

/// Block checksums end to end: a block damaged at the origin is never served at the mirror
/// (EIO, logged with the block, not filled into the mirror store) and reads again once it is
/// whole; a damaged mirror-store copy is found by `jfs fsck --deep` (naming the file) and a
/// mount reads around it from the origin, replacing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_blocks_are_caught_by_their_checksums_at_the_origin_and_at_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", HELD_BACK).await;
    write_files(&vol.fs, "w-", 2, 5 << 20).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let mut keys = Vec::new();
    for f in ["/w-0", "/w-1"] {
        let (ino, _) = vol.fs.resolve(f).await.unwrap();
        let id = vol.fs.chunks(ino).await.unwrap()[0].1[0].id;
        keys.push(fs_core::keys::block_key(
            &vol.fs.settings().name,
            id,
            0,
            4 << 20,
        ));
    }
    let (ka, kb) = (keys[0].clone(), keys[1].clone());
    // 1. Damaged at the origin: EIO, never the flipped bytes; nothing filled for it.
    flip_bit(&vol.store_url, &ka, 1_000_000);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let e = std::fs::read(m.mp.join("w-0")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5 /* EIO */), "{e}");
    assert!(std::fs::read(m.mp.join("w-1")).unwrap() == data(1, 5 << 20));
    assert!(metric(&m.stats(), "jfs_origin_errors_total") >= 1.0);
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains(&ka) && log.contains("fails its checksum"),
        "the mount's log names the block and the cause:\n{log}"
    );
    m.stop();
    assert!(
        !store_blocks(&pair.m_store)
            .iter()
            .any(|(p, _)| p.ends_with(&ka)),
        "a damaged origin block was filled into the mirror store"
    );
    // Whole again at the origin: it reads (and fills).
    flip_bit(&vol.store_url, &ka, 1_000_000);
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    assert!(std::fs::read(m.mp.join("w-0")).unwrap() == data(0, 5 << 20));
    m.stop();
    wait_store_blocks(&pair.m_store, 4);
    // 2. Damaged in the mirror store: the site's deep check names the file...
    let fsck = |deep: bool| {
        let mut c = Command::new(bin("jfs"));
        c.args(["fsck", &pair.m_meta]);
        if deep {
            c.arg("--deep");
        }
        c.output().unwrap()
    };
    assert!(fsck(true).status.success());
    flip_bit(&pair.m_store, &kb, 4_000_000);
    let o = fsck(false);
    assert!(o.status.success(), "a shallow check sees lengths only");
    let o = fsck(true);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("BROKEN /w-1") && out.contains(&kb) && out.contains("fails its checksum"),
        "{out}"
    );
    assert_eq!(out.matches("BROKEN").count(), 1, "{out}");
    // ...and a mount reads the block from the origin instead, writing it over the bad copy.
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    assert!(std::fs::read(m.mp.join("w-1")).unwrap() == data(1, 5 << 20));
    assert!(metric(&m.stats(), "jfs_mirror_damaged_total") >= 1.0);
    let t0 = Instant::now();
    while !fsck(true).status.success() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the damaged mirror copy was not replaced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    m.stop();
    eprintln!("checksums: origin damage -> EIO (not filled), mirror damage -> named by fsck --deep, re-read from the origin and replaced");
}

/// Blocks a mirror mount reads from the origin are published to the agent
/// (`mirror.want.<session>`), which moves their queued copies ahead of its background queue:
/// with a slow copier (1 MiB/s, one worker, 12 blocks queued in file order), the last file's
/// block is dealt with (found at the mirror store, filled by the read) seconds after the
/// read, not after the 11 blocks queued before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocks_read_at_a_mirror_mount_are_copied_ahead_of_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let extra = "bwlimit = \"1M\"\nworkers = 1";
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", extra).await;
    write_files(&vol.fs, "q-", 12, 4 << 20).await;
    wait_applied(&pair, &**vol.fs.engine()).await;
    let m = Mount::start(&pair.m_meta, dir.path(), "mm", &["--cache-size", "0"]);
    let t0 = Instant::now();
    assert!(std::fs::read(m.mp.join("q-11")).unwrap() == data(11, 4 << 20));
    let st = status_until(&pair.mirror, Duration::from_secs(20), |st| {
        n(st, "blocks.prioritized") >= 1 && n(st, "blocks.skipped") >= 1
    })
    .await;
    assert!(
        n(&st, "blocks.copied") <= 4,
        "the read block waited behind the queue: {st}"
    );
    assert!(n(&st, "blocks.pending") >= 6, "{st}");
    eprintln!(
        "a block read at the mirror was taken off the copy queue {:?} after the read ({} of 11 earlier blocks copied by then)",
        t0.elapsed(),
        n(&st, "blocks.copied")
    );
    m.stop();
}

/// When the first line of `log` containing `what` was logged (its leading RFC 3339 UTC
/// timestamp, as the binaries log).
fn logged_at(log: &str, what: &str) -> std::time::SystemTime {
    let line = log
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("nothing logged {what:?}:\n{}", tail(log, 20)));
    let ts = line.split_whitespace().next().unwrap_or_default();
    parse_utc(ts).unwrap_or_else(|| panic!("no timestamp on {line:?}"))
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` as a time.
fn parse_utc(ts: &str) -> Option<std::time::SystemTime> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, mo, da) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (h, mi, se) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    let nanos: u32 = format!("{frac:0<9}")[..9].parse().ok()?;
    Some(std::time::UNIX_EPOCH + Duration::new(secs as u64, nanos))
}

#[test]
fn log_timestamps_parse() {
    let t = parse_utc("2026-11-25T12:18:28.375076Z").unwrap();
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    assert_eq!(d.as_secs(), 1_795_609_108);
    assert_eq!(d.subsec_nanos(), 375_076_000);
}

/// FUSE passthrough at a mirror mount: a file read whole there gets a whole-file copy, and
/// its next open is read by the kernel from it. The file overwritten in place at the primary
/// (same inode, new content) and applied by the agent is never served from the old copy; a
/// handle opened before keeps the version it opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passthrough_at_a_mirror_never_serves_a_version_the_agent_replaced() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let pair = Pair::start(dir.path(), &vol.meta_url, "redis", None, "", "").await;
    let owner = fs_core::Owner { uid: 0, gid: 0 };
    let (ino, _) = vol
        .fs
        .create(fs_core::ROOT_INO, b"m.bin", 0o644, owner)
        .await
        .unwrap();
    let len = 9 << 20;
    let v1 = data(41, len);
    vol.fs.write(ino, 0, &v1).await.unwrap();
    wait_applied(&pair, &**vol.fs.engine()).await;
    let m = Mount::start(
        &pair.m_meta,
        dir.path(),
        "mm",
        &[
            "--cache-size",
            "1G",
            "--attr-cache",
            "0s",
            "--entry-cache",
            "0s",
        ],
    );
    let f = m.mp.join("m.bin");
    assert!(std::fs::read(&f).unwrap() == v1);
    stat_until(
        &m,
        "jfs_whole_files_made_total",
        Duration::from_secs(60),
        |v| v >= 1.0,
    );
    let p0 = metric(&m.stats(), "jfs_passthrough_opens_total");
    let h = std::fs::File::open(&f).unwrap();
    assert_eq!(metric(&m.stats(), "jfs_passthrough_opens_total"), p0 + 1.0);
    // A new version at the primary, in place.
    let v2 = data(42, len);
    vol.fs.write(ino, 0, &v2).await.unwrap();
    wait_applied(&pair, &**vol.fs.engine()).await;
    assert!(
        std::fs::read(&f).unwrap() == v2,
        "the old copy was served after the agent applied a new version"
    );
    let mut old = vec![0u8; len];
    h.read_exact_at(&mut old, 0).unwrap();
    assert!(old == v1, "a handle opened before the change read a mix");
    drop(h);
    // The new version gets its own copy (the read above went through the mount, whole).
    stat_until(
        &m,
        "jfs_whole_files_made_total",
        Duration::from_secs(60),
        |v| v >= 2.0,
    );
    let p1 = metric(&m.stats(), "jfs_passthrough_opens_total");
    assert!(std::fs::read(&f).unwrap() == v2);
    assert_eq!(metric(&m.stats(), "jfs_passthrough_opens_total"), p1 + 1.0);
    m.stop();
}
