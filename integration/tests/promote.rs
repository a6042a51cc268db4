//! Moving the primary role (runbooks/site-migration.md, failover.md, engine-migration.md):
//! real agents, a real mount writing through the move, each runbook step run as written.
//! Assertions are on bytes (every checkpoint a writer saw acknowledged), epochs, dumps, ids
//! and exit codes.

use integration::mirror::*;
use integration::mountproc::Mount;
use integration::runbook;
use integration::written::{check_files, Written};
use integration::{bin, data, volume_with};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What a checkpoint writer saw: the checkpoints acknowledged (the last of each name), how
/// long each took, and the errors.
#[derive(Default)]
struct Log {
    files: Vec<Written>,
    took: Vec<Duration>,
    errors: Vec<String>,
}

/// Checkpoints through the mount (under `w/`, which exists only inside it), written by a
/// `ckpt-writer` process (see there why not a thread of the test).
struct Writer {
    child: std::process::Child,
    log: PathBuf,
    stop: PathBuf,
}

fn writer(mp: &Path, scratch: &Path) -> Writer {
    std::fs::create_dir_all(mp.join("w")).unwrap();
    let log = scratch.join("ckpt-writer.log");
    let stop = scratch.join("ckpt-writer.stop");
    let child = Command::new(env!("CARGO_BIN_EXE_ckpt-writer"))
        .arg(mp.join("w"))
        .arg(&log)
        .arg(&stop)
        .spawn()
        .expect("starting ckpt-writer");
    Writer { child, log, stop }
}

impl Writer {
    /// Stop after the checkpoint in progress; what it saw.
    fn stop(mut self) -> Log {
        std::fs::write(&self.stop, b"").unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "ckpt-writer: {st}");
        let mut log = Log::default();
        for l in std::fs::read_to_string(&self.log).unwrap().lines() {
            let f: Vec<&str> = l.splitn(3, ' ').collect();
            match f.as_slice() {
                ["ok", name, rest] => {
                    let v: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
                    let path = format!("w/{name}");
                    log.files.retain(|w| w.path != path);
                    log.files.push(Written {
                        path,
                        crc: v[0] as u32,
                        len: v[1] as usize,
                    });
                    log.took.push(Duration::from_micros(v[2]));
                }
                ["err", name, msg] => log.errors.push(format!("w/{name}: {msg}")),
                _ => panic!("ckpt-writer wrote {l:?}"),
            }
        }
        log
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The promoted site's primary agent on `meta`, listening on `listen`, serving the old
/// primary's metadata as mirror `mirror`.
fn start_new_primary(dir: &Path, meta: &str, listen: &str, mirror: &str) -> Agent {
    Agent::start(
        dir,
        "new-primary",
        &primary_toml(
            meta,
            &dir.join("new-primary-state"),
            &format!("127.0.0.1:{}", free_port()),
            listen,
            &[mirror],
            "",
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    )
}

/// The old primary's metadata rejoins the new primary (at `new_listen`, metadata `new_meta`)
/// as mirror `name` over `store`; returns once it has converged, with the new primary opened.
async fn rejoin_as_mirror(
    dir: &Path,
    old_meta: &str,
    name: &str,
    new_listen: &str,
    store: &str,
    new_meta: &str,
) -> (Agent, fs_core::Fs) {
    let rejoin = Agent::start(
        dir,
        name,
        &mirror_toml(
            old_meta,
            &dir.join(format!("{name}-state")),
            &format!("127.0.0.1:{}", free_port()),
            name,
            new_listen,
            store,
            "",
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    let newp = volume::open(new_meta, &volume::Options::default())
        .await
        .unwrap();
    // Until it has taken the new primary's history (by replay or a resync), the old site's
    // own, longer history can already look converged: wait for the promotion to be there.
    let epoch = fs_core::site::epoch(&**newp.engine()).await.unwrap();
    let t0 = Instant::now();
    while fs_core::site::epoch(&*open_ro(old_meta).await)
        .await
        .unwrap()
        != epoch
    {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the old site never took the new primary's epoch {epoch}; log:\n{}",
            tail(&rejoin.log_text(), 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_converged(&rejoin, &**newp.engine(), Duration::from_secs(120)).await;
    (rejoin, newp)
}

fn longest_pause(log: &Log) -> Duration {
    log.took.iter().copied().max().unwrap_or_default()
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
/// primary (PostgreSQL) to a mirror on Redis (metadata the mount reaches as a client; it
/// never follows to another site's RocksDB, see the next test): every acknowledged checkpoint
/// is at the new primary, the mount followed the move with a file held open across it, the
/// old primary cannot write or ship any more, and it rejoins as a mirror and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planned_site_migration_under_writes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    // The mirror's agent answers at the address its site serves once promoted (the fence
    // checks the move goes there).
    let new_listen = format!("127.0.0.1:{}", free_port());
    let mut pair = Pair::start(
        dir.path(),
        &old_meta,
        "redis",
        None,
        "",
        &format!("listen = \"{new_listen}\""),
    )
    .await;
    let m = Mount::start(&old_meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let w = writer(&m.mp, dir.path());
    // A file held open across the move.
    use std::io::Write;
    let mut held = std::fs::File::create(m.mp.join("held")).unwrap();
    held.write_all(&data(7, 3 << 20)).unwrap();
    held.sync_all().unwrap();
    std::thread::sleep(Duration::from_secs(2));
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
    let out = runbook::run_checked("site-migration", "fence", &env);
    assert!(out.contains("fenced"), "{out}");
    // The old primary refuses writers outside the mount too.
    let local = dir.path().join("x");
    std::fs::write(&local, b"late").unwrap();
    let o = Command::new(bin("jfs"))
        .args(["put", &old_meta, local.to_str().unwrap(), "/late"])
        .output()
        .unwrap();
    // A writer refused by the fence is told the META_URL to write at instead.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("was fenced: the volume's primary moved to")
            && err.contains(&meta::redact(&pair.m_meta)),
        "{err}"
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
    let p2 = start_new_primary(dir.path(), &pair.m_meta, &new_listen, "old-site");
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
    let log = w.stop();
    let errors = log.errors.clone();
    assert!(
        errors.is_empty(),
        "writers got errors through the move: {errors:?}"
    );
    let files = log.files.clone();
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
    // The runbook's check: the promoted metadata shows as the primary.
    runbook::run_checked("site-migration", "check", &env);
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
    let (_rejoin, newp) = rejoin_as_mirror(
        dir.path(),
        &old_meta,
        "old-site",
        &new_listen,
        &vol.store_url,
        &pair.m_meta,
    )
    .await;
    let n = assert_same(&newp, &old_meta, &vol.store_url).await;
    assert_same_journal(&**newp.engine(), &*open_ro(&old_meta).await).await;
    assert!(status_json(&old_meta)["epoch"] == 1);
    // Issue 43, item 23: once rejoined, the fence's move record is gone (`jfs status` no
    // longer says fenced), and a mount of the rejoined site logs no advice to unmount.
    let t0 = Instant::now();
    while !status_json(&old_meta)["moved"].is_null() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the rejoined site still records the move: {}",
            status_json(&old_meta)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let m3 = Mount::start(
        &old_meta,
        dir.path(),
        "mnt3",
        &["--cache-size", "0", "--read-only"],
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(std::fs::read(m3.mp.join("held")).unwrap(), want_held);
    let mlog = std::fs::read_to_string(&m3.log).unwrap();
    assert!(!mlog.contains("went on past the point"), "{mlog}");
    m3.stop();
    // Nothing diverged in a planned move: no saved tail.
    assert_eq!(status_json(&old_meta)["rollbacks"], serde_json::json!([]));
    // A second fence of the site that rejoined is refused, saying what it is.
    let o = runbook::run("site-migration", "fence", &env);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("is mirror \"old-site\"")
            && err.contains("has rejoined as a mirror since; it is not a primary to fence"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("epoch 2"),
        "a refused fence recorded a move"
    );
    assert!(fs_core::site::moved(&*open_ro(&old_meta).await)
        .await
        .unwrap()
        .is_none_or(|m| m.epoch == 1));
    let _ = p2;
    eprintln!(
        "site migration: {} checkpoints acknowledged, all at the new primary; longest checkpoint {:?} (fence to promoted {:?}); the old primary rejoined and equals the new one ({n} files)",
        files.len(),
        longest_pause(&log),
        t_promoted - t_fence
    );
}

/// Failover (runbooks/failover.md): the primary site goes down with entries its mirror never
/// received; the mirror is promoted by force and says so; the old site, back, is fenced and
/// rejoins as a mirror: its diverged tail is detected and dropped by a resync, and it ends
/// equal to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_reports_the_loss_window_and_the_old_primary_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    let mut pair = Pair::start(
        dir.path(),
        &old_meta,
        "rocksdb",
        Some((Duration::ZERO, 0)),
        "",
        "",
    )
    .await;
    write_files(&vol.fs, "before-", 5, 300_000).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    // The link to the mirror is cut; the primary goes on committing what it never ships.
    pair.proxy
        .as_ref()
        .unwrap()
        .cut
        .store(true, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    write_files(&vol.fs, "lost-", 4, 100_000).await;
    let old_head = vol.fs.engine().journal_bounds().await.unwrap().last;
    assert_eq!(pair.mirror.term(), 0);
    // While the old primary still answers, a forced promotion is refused: it would fork the
    // volume.
    pair.proxy
        .as_ref()
        .unwrap()
        .cut
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let o = Command::new(bin("mirror-agent"))
        .args(["promote", "--force", "--config"])
        .arg(&pair.mirror.cfg)
        .env("MIRROR_TOKEN", TOKEN)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("fork the volume") && err.contains("its head is"),
        "{err}"
    );
    assert!(open_ro(&pair.m_meta)
        .await
        .get(fs_core::keys::EPOCH)
        .await
        .unwrap()
        .is_none());
    // The site goes down.
    pair.primary.kill9();
    let new_listen = format!("127.0.0.1:{}", free_port());
    let m_cfg = pair.mirror.cfg.display().to_string();
    let env = [
        ("NEW_META", pair.m_meta.as_str()),
        ("MIRROR_CONFIG", m_cfg.as_str()),
        ("OLD_META", old_meta.as_str()),
        ("NEW_PRIMARY", new_listen.as_str()),
        ("OLD_SITE", "old-site"),
    ];
    // Without --force (nor --old-meta) the promotion is refused, saying why.
    let o = Command::new(bin("mirror-agent"))
        .args(["promote", "--config", &m_cfg])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--force"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // --old-meta naming another volume (a mistyped URL) is named as such, not as unfenced.
    let other = tempfile::tempdir().unwrap();
    let other_meta = format!("rocksdb://{}/meta", other.path().display());
    let o = Command::new(bin("jfs"))
        .args(["format", &other_meta, "other"])
        .arg("--storage")
        .arg(format!("file://{}/s", other.path().display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(bin("mirror-agent"))
        .args(["promote", "--config", &m_cfg, "--old-meta", &other_meta])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("holds volume \"other\"")
            && !err.contains("not fenced"),
        "{err}"
    );
    // The old primary's agent is gone but its metadata answers: the promotion fences it
    // first, so the loss window is exact and closed.
    let out = runbook::run_checked("failover", "promote", &env);
    let applied_at_promotion = {
        let e = open_ro(&pair.m_meta).await;
        fs_core::site::epoch_record(&*e)
            .await
            .unwrap()
            .unwrap()
            .at_seq
    };
    assert!(
        applied_at_promotion < old_head,
        "the mirror had everything: no failover to test"
    );
    // A second promote (a repeated runbook step) says it is done already, and changes
    // nothing.
    let o = Command::new(bin("mirror-agent"))
        .args(["promote", "--force", "--config", &m_cfg])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && said.contains("is already the primary at epoch 1"),
        "{said}"
    );
    {
        let e = open_ro(&pair.m_meta).await;
        let ep = fs_core::site::epoch_record(&*e).await.unwrap().unwrap();
        assert_eq!((ep.epoch, ep.at_seq), (1, applied_at_promotion));
    }
    assert!(
        out.contains(&format!(
            "LOSS WINDOW: exactly {} entries (seq {}..={old_head})",
            old_head - applied_at_promotion,
            applied_at_promotion + 1
        )) && !out.contains("WARNING"),
        "{out}"
    );
    {
        let o = open_ro(&old_meta).await;
        let f = fs_core::site::fenced(&*o)
            .await
            .unwrap()
            .expect("fenced by the promotion");
        assert_eq!((f.name.as_str(), f.at_seq), ("old-site", old_head), "{f:?}");
        assert!(fs_core::site::marker(&*o).await.unwrap().is_some());
    }
    // Its writers are refused from now on.
    let late = dir.path().join("late");
    std::fs::write(&late, b"late").unwrap();
    let o = Command::new(bin("jfs"))
        .args(["put", &old_meta, late.to_str().unwrap(), "/late"])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "a write at the fenced old primary went through"
    );
    let p2 = start_new_primary(dir.path(), &pair.m_meta, &new_listen, "old-site");
    // The new primary takes writes (a mount of it); ids never collide with the old site's.
    let m = Mount::start(&pair.m_meta, dir.path(), "mnt", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("after"), data(77, 500_000)).unwrap();
    // More history here than the old site went on with: it rejoins inside this history (its
    // last entry exists here, different), not past its end.
    for i in 0..12u64 {
        std::fs::write(m.mp.join(format!("after-{i}")), data(78 + i, 1000)).unwrap();
    }
    let after_ino = std::fs::metadata(m.mp.join("after")).unwrap();
    use std::os::unix::fs::MetadataExt;
    let old_max_ino = {
        let d = fs_core::maint::dump(&**vol.fs.engine()).await.unwrap();
        *d.inodes.keys().max().unwrap()
    };
    assert!(
        after_ino.ino() > old_max_ino,
        "a new file reused an inode of the old site"
    );
    m.stop();
    // The old site comes back: fence first (the promotion did; repeating it is harmless and
    // says what comes next after a failover), then rejoin as a mirror.
    let out = runbook::run_checked("failover", "fence", &env);
    assert!(out.contains("already fenced"), "{out}");
    // The lost files, as the old site has them (the tail it will save).
    let lost: Vec<(String, Vec<u8>)> = {
        let mut v = Vec::new();
        for i in 0..4u64 {
            let (ino, _) = vol.fs.resolve(&format!("/lost-{i}")).await.unwrap();
            v.push((
                format!("lost-{i}"),
                integration::read_all(&vol.fs, ino).await,
            ));
        }
        v
    };
    drop(vol.fs);
    let (rejoin, newp) = rejoin_as_mirror(
        dir.path(),
        &old_meta,
        "old-site",
        &new_listen,
        &vol.store_url,
        &pair.m_meta,
    )
    .await;
    let n = assert_same(&newp, &old_meta, &vol.store_url).await;
    assert!(
        p2.log_text()
            .contains("history goes on past the promotion point")
            || rejoin.log_text().contains("resync"),
        "{}",
        tail(&rejoin.log_text(), 20)
    );
    // An expected divergence (the old site from before the promotion) is not blamed on
    // something other than its agent (issue 43, item 26).
    for log in [p2.log_text(), rejoin.log_text()] {
        assert!(
            !log.contains("changed by something other than its agent"),
            "{}",
            tail(&log, 20)
        );
    }
    // The old site's diverged tail is saved before the resync dropped it, named in the log and
    // in `jfs status` (the runbook's check), with every lost file's bytes.
    let out = runbook::run_checked("failover", "check", &env);
    assert!(out.contains("epoch       1"), "{out}");
    assert!(
        rejoin.log_text().contains("diverged tail") && rejoin.log_text().contains("SAVED"),
        "{}",
        tail(&rejoin.log_text(), 20)
    );
    // It did not take its own store for the origin it copies from (issue 25, item 17).
    assert!(
        rejoin.log_text().contains("a former primary rejoining"),
        "{}",
        tail(&rejoin.log_text(), 30)
    );
    let st = status_json(&old_meta);
    let r = &st["rollbacks"][0];
    assert_eq!(r["parted_at"], applied_at_promotion, "{st}");
    assert_eq!(r["last_seq"], old_head, "{st}");
    assert_eq!(r["entries"], old_head - applied_at_promotion, "{st}");
    let saved = PathBuf::from(r["dir"].as_str().unwrap());
    for (name, bytes) in &lost {
        let got = std::fs::read(saved.join("files").join(name))
            .unwrap_or_else(|e| panic!("{name} is not in the saved tail {}: {e}", saved.display()));
        assert!(got == *bytes, "{name} differs in the saved tail");
    }
    let entries = std::fs::read_to_string(saved.join("entries.jsonl")).unwrap();
    assert_eq!(
        entries.lines().count() as u64,
        old_head - applied_at_promotion
    );
    // The lost tail is gone from the old site's metadata; what the new primary wrote is there.
    let old = volume::open(&old_meta, &volume::Options::default())
        .await
        .unwrap();
    assert!(old.resolve("/lost-0").await.is_err());
    assert!(old.resolve("/after").await.is_ok());
    // Re-applied as the runbook says: at the new primary, byte for byte.
    let out = runbook::run_ok("failover", "reapply", &env);
    for (name, _) in &lost {
        assert!(out.contains(name), "{out}");
    }
    let newp2 = volume::open(&pair.m_meta, &volume::Options::default())
        .await
        .unwrap();
    for (name, bytes) in &lost {
        let (ino, _) = newp2.resolve(&format!("/recovered/{name}")).await.unwrap();
        assert!(integration::read_all(&newp2, ino).await == *bytes, "{name}");
    }
    eprintln!(
        "failover: promoted at seq {applied_at_promotion} of the old site's {old_head} (fenced by the promotion); the old site rejoined, saved its tail ({} entries, {} files) and equals the new primary ({n} files)",
        r["entries"], r["files"]
    );
}

/// Issue 25, item 4, exactly: only the old primary's agent dies; its metadata and a mount
/// writing through it stay alive on this host. `promote --force` is run as the operator
/// typed it (no `--old-meta`): it cannot fence what it was not told about, so it says so
/// loudly, and the old mount goes on acknowledging writes. The old site is fenced later (its
/// mount moves to the new primary) and rejoins: every checkpoint the writer saw acknowledged
/// is at the new primary or in the saved tail, byte for byte, and the runbook's re-apply
/// step brings the tail's files to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forced_promotion_beside_a_live_old_site_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    drop(vol.fs);
    // The mirror on Redis: a mount looks at a new primary it reaches as a client (to see the
    // fork); another site's RocksDB it never opens (see the embedded-metadata test).
    let mut pair = Pair::start(dir.path(), &old_meta, "redis", None, "", "").await;
    let m = Mount::start(&old_meta, dir.path(), "mnt", &["--cache-size", "0"]);
    let w = writer(&m.mp, dir.path());
    let acks = |n: usize| {
        let log = dir.path().join("ckpt-writer.log");
        let t0 = Instant::now();
        loop {
            let got = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("ok "))
                .count();
            if got >= n {
                return got;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "the writer acknowledged only {got} checkpoints (waiting for {n})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let seen = acks(5);
    // The old primary's agent dies; nothing else at its site does.
    pair.primary.kill9();
    assert_eq!(pair.mirror.term(), 0);
    let new_listen = format!("127.0.0.1:{}", free_port());
    let o = Command::new(bin("mirror-agent"))
        .args(["promote", "--force", "--config"])
        .arg(&pair.mirror.cfg)
        .env("MIRROR_TOKEN", TOKEN)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("LOSS WINDOW: unknown, not closed")
            && out.contains("WARNING: the old primary's metadata was NOT fenced")
            && out.contains("goes on acknowledging writes"),
        "{out}"
    );
    let p2 = start_new_primary(dir.path(), &pair.m_meta, &new_listen, "old-site");
    // The old site keeps acknowledging writes that the new primary never receives.
    let at_promotion = std::fs::read_to_string(dir.path().join("ckpt-writer.log"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("ok "))
        .count();
    assert!(at_promotion >= seen);
    acks(at_promotion + 8);
    // The operator fences it (runbooks/failover.md, step 3).
    let m_cfg = pair.mirror.cfg.display().to_string();
    let env = [
        ("NEW_META", pair.m_meta.as_str()),
        ("MIRROR_CONFIG", m_cfg.as_str()),
        ("OLD_META", old_meta.as_str()),
        ("NEW_PRIMARY", new_listen.as_str()),
        ("OLD_SITE", "old-site"),
    ];
    runbook::run_checked("failover", "fence", &env);
    // Its mount acknowledged writes past the promotion point: it must not follow the move
    // (a checkpoint caught half-way, its data written here and its rename by name sent on,
    // would rename the new primary's own `ck.tmp`, other bytes, under an acknowledged name).
    // It refuses writes at once and says to remount; the writer is told (`err`).
    let t0 = Instant::now();
    while !std::fs::read_to_string(&m.log)
        .unwrap_or_default()
        .contains("went on past the point where the new primary")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the mount did not see the fork: {}",
            std::fs::read_to_string(&m.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let errs = |n: usize| {
        let t0 = Instant::now();
        loop {
            let got = std::fs::read_to_string(dir.path().join("ckpt-writer.log"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("err "))
                .count();
            if got >= n {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the writer saw {got} errors"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    errs(2);
    assert!(
        !std::fs::read_to_string(&m.log)
            .unwrap_or_default()
            .contains("the volume moved to a new primary"),
        "the mount followed a move across the fork"
    );
    let first = w.stop();
    m.stop();
    // Remounted at the new primary, as the line says: a few checkpoints there (fewer than
    // the 40 names, so that some names' last acknowledged version is one the old site
    // alone had).
    let m = Mount::start(&pair.m_meta, dir.path(), "mnt2", &["--cache-size", "0"]);
    std::fs::remove_file(dir.path().join("ckpt-writer.stop")).unwrap();
    let w = writer(&m.mp, dir.path());
    acks(first.took.len() + 3);
    let log = w.stop();
    m.stop();
    // The old site rejoins; what it acknowledged after the promotion is saved.
    let (rejoin, newp) = rejoin_as_mirror(
        dir.path(),
        &old_meta,
        "old-site",
        &new_listen,
        &vol.store_url,
        &pair.m_meta,
    )
    .await;
    let st = status_json(&old_meta);
    let saved = PathBuf::from(st["rollbacks"][0]["dir"].as_str().expect("a saved tail"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(saved.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["failed"].as_array().map_or(0, |f| f.len()),
        0,
        "files of the saved tail could not be read: {:#}\nthe rejoining agent's log:\n{}",
        manifest["failed"],
        tail(&rejoin.log_text(), 60)
    );
    runbook::run_checked("failover", "check", &env);
    let (mut at_new, mut only_saved) = (0, Vec::new());
    for f in &log.files {
        let crc = |b: &[u8]| crc32c::crc32c(b);
        let at_primary = match newp.resolve(&format!("/{}", f.path)).await {
            Ok((ino, _)) => {
                let b = integration::read_all(&newp, ino).await;
                b.len() == f.len && crc(&b) == f.crc
            }
            Err(_) => false,
        };
        if at_primary {
            at_new += 1;
            continue;
        }
        let b = std::fs::read(saved.join("files").join(&f.path)).unwrap_or_else(|e| {
            panic!(
                "{} (acknowledged) is neither at the new primary nor in the saved tail {}: {e}",
                f.path,
                saved.display()
            )
        });
        assert!(
            b.len() == f.len && crc(&b) == f.crc,
            "{}: the saved tail holds other bytes than the writer acknowledged",
            f.path
        );
        only_saved.push(f);
    }
    assert!(
        !only_saved.is_empty(),
        "no acknowledged checkpoint was only at the old site: the tail was not exercised"
    );
    // Re-applied as the runbook says, they are at the new primary too.
    runbook::run_ok("failover", "reapply", &env);
    let newp2 = volume::open(&pair.m_meta, &volume::Options::default())
        .await
        .unwrap();
    for f in &only_saved {
        let (ino, _) = newp2
            .resolve(&format!("/recovered/{}", f.path))
            .await
            .unwrap_or_else(|e| panic!("/recovered/{} after the re-apply step: {e}", f.path));
        let b = integration::read_all(&newp2, ino).await;
        assert!(
            b.len() == f.len && crc32c::crc32c(&b) == f.crc,
            "/recovered/{}",
            f.path
        );
    }
    rejoin_stop(rejoin);
    drop(p2);
    eprintln!(
        "forced promotion beside a live old site: {} checkpoints acknowledged ({} writes failed at the move); {at_new} at the new primary, {} only in the saved tail ({}), re-applied; none lost",
        log.files.len(),
        log.errors.len(),
        only_saved.len(),
        saved.display()
    );
}

/// Issue 25, item 5: `fence` checks what it is told before it writes anything (a
/// `--moved-to` that does not exist, that is another volume or this one; a `--new-primary`
/// where no primary agent answers), and a fence forced anyway is undone by `detach --meta`
/// while a mount holds the RocksDB volume (as `fence` itself works beside it): the mount's
/// writes then go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fence_checks_what_it_is_told_and_its_undo_works_beside_a_mount() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    drop(vol.fs);
    let other = volume_with("rocksdb", "file", |_| {}).await;
    let m = Mount::start(&meta, dir.path(), "mnt", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), b"before").unwrap();
    let nowhere = format!("127.0.0.1:{}", free_port());
    let fence = |moved_to: Option<&str>, extra: &[&str]| {
        let mut c = Command::new(bin("mirror-agent"));
        c.args([
            "fence",
            "--meta",
            &meta,
            "--as",
            "old",
            "--new-primary",
            &nowhere,
        ]);
        if let Some(t) = moved_to {
            c.args(["--moved-to", t]);
        }
        c.args(extra);
        let o = c.output().unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let missing = format!("rocksdb://{}/no-such-meta", dir.path().display());
    for (to, want) in [
        (Some(missing.as_str()), "cannot be reached"),
        (Some(other.meta_url.as_str()), "not this volume"),
        (Some(meta.as_str()), "is the metadata being fenced"),
        (None, "no primary agent answers at --new-primary"),
    ] {
        let (rc, out) = fence(to, &[]);
        assert!(rc == Some(2) && out.contains(want), "{to:?}: {out}");
        // Nothing was written: the volume is no mirror's, and the mount writes on.
        assert!(
            fs_core::site::marker(&*open_ro(&meta).await)
                .await
                .unwrap()
                .is_none(),
            "a refused fence left a marker ({to:?})"
        );
    }
    std::fs::write(m.mp.join("still"), b"still writable").unwrap();
    // Forced: accepted as told (nothing answers, nothing to move to).
    let (rc, out) = fence(Some(&missing), &["--force"]);
    assert_eq!(rc, Some(0), "{out}");
    // The runbook's undo, with the volume still mounted read-write here.
    let o = Command::new(bin("mirror-agent"))
        .args(["detach", "--meta", &meta])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "detach --meta beside the mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("a volume of its own again"));
    // The mount's writes go through again, and another writer's through the mount too.
    std::fs::write(m.mp.join("after"), b"after the undo").unwrap();
    let local = dir.path().join("put-me");
    std::fs::write(&local, b"put").unwrap();
    let o = Command::new(bin("jfs"))
        .args(["put", &meta, local.to_str().unwrap(), "/put-me"])
        .env("JFS_RUN_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read(m.mp.join("after")).unwrap(),
        b"after the undo"
    );
    m.stop();
    let v = volume::open(&meta, &volume::Options::default())
        .await
        .unwrap();
    for (p, want) in [
        ("/before", &b"before"[..]),
        ("/after", b"after the undo"),
        ("/put-me", b"put"),
    ] {
        let (ino, _) = v.resolve(p).await.unwrap();
        assert_eq!(integration::read_all(&v, ino).await, want, "{p}");
    }
}

/// Engine migration (runbooks/engine-migration.md) both ways the issue names, under writes
/// through a mount: to PostgreSQL the mount follows the move; to RocksDB (embedded, never
/// opened by a mount of other metadata) it stays read-only and the writers remount at the new
/// metadata. The final dumps of the new primary and of the old metadata (rejoined as a
/// mirror) are equal, blocks never moved, and no id is reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_migration_rocksdb_to_postgres_and_redis_to_rocksdb() {
    for (from, to) in [("redis", "rocksdb"), ("rocksdb", "postgres")] {
        let dir = tempfile::tempdir().unwrap();
        let vol = volume_with(from, "file", |_| {}).await;
        let old_meta = vol.meta_url.clone();
        let store = vol.store_url.clone();
        write_files(&vol.fs, "seed-", 3, 700_000).await;
        drop(vol.fs);
        let (new_meta, _keep) = integration::meta_url(to);
        let follows = to != "rocksdb";
        let p_admin = format!("127.0.0.1:{}", free_port());
        let listen = format!("127.0.0.1:{}", free_port());
        let new_listen = format!("127.0.0.1:{}", free_port());
        let envs = [("MIRROR_TOKEN", TOKEN)];
        let mut p1 = Agent::start(
            dir.path(),
            "p1",
            &primary_toml(
                &old_meta,
                &dir.path().join("p1s"),
                &p_admin,
                &listen,
                &["engine"],
                "",
            ),
            &envs,
        );
        let m_admin = format!("127.0.0.1:{}", free_port());
        // The mirror on the target engine keeps the volume's own store: no block moves.
        let mut mirror = Agent::start(
            dir.path(),
            "engine",
            &mirror_toml(
                &new_meta,
                &dir.path().join("ms"),
                &m_admin,
                "engine",
                &listen,
                &store,
                &format!("listen = \"{new_listen}\""),
            ),
            &envs,
        );
        let mut m = Mount::start(&old_meta, dir.path(), "mnt", &["--cache-size", "0"]);
        let mut w = Some(writer(&m.mp, dir.path()));
        std::thread::sleep(Duration::from_secs(2));
        // A mount that will not follow: its writers stop before the fence (after it, their
        // writes fail with EROFS, see below).
        let early = (!follows).then(|| w.take().unwrap().stop());
        let m_cfg = mirror.cfg.display().to_string();
        let env = [
            ("OLD_META", old_meta.as_str()),
            ("NEW_META", new_meta.as_str()),
            ("STORE", store.as_str()),
            ("NEW_PRIMARY", new_listen.as_str()),
            ("MIRROR_ADMIN", m_admin.as_str()),
            ("MIRROR_CONFIG", m_cfg.as_str()),
            ("OLD_SITE", "old-engine"),
        ];
        let out = runbook::run_ok("engine-migration", "caught-up", &env);
        assert!(out.contains("mirror"), "{out}");
        let blocks_before = integration::mountproc::store_blocks(&store).len();
        let t_fence = Instant::now();
        runbook::run_ok("engine-migration", "fence", &env);
        let t_wait = Instant::now();
        runbook::run_ok("engine-migration", "wait", &env);
        let t_term = Instant::now();
        assert_eq!(mirror.term(), 0);
        let t_promote = Instant::now();
        let out = runbook::run_ok("engine-migration", "promote", &env);
        let t_promoted = Instant::now();
        let steps = format!(
            "fence {:?}, wait {:?}, agent stop {:?}, promote {:?}",
            t_wait - t_fence,
            t_term - t_wait,
            t_promote - t_term,
            t_promoted - t_promote
        );
        assert!(out.contains("primary at epoch 1"), "{out}");
        runbook::run_checked("engine-migration", "check", &env);
        let p2 = start_new_primary(dir.path(), &new_meta, &new_listen, "old-engine");
        std::thread::sleep(Duration::from_secs(2));
        if !follows {
            // The old mount stays on the fenced metadata: writes refused (EROFS), saying to
            // mount the new metadata; the writers do so.
            let e = std::fs::write(m.mp.join("late"), b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(30), "{e}");
            let mlog = std::fs::read_to_string(&m.log).unwrap();
            assert!(
                mlog.contains("a mount follows a move only to metadata it reaches as a client")
                    && mlog.contains(&new_meta)
                    && !mlog.contains("the volume moved to a new primary"),
                "{mlog}"
            );
            std::mem::replace(
                &mut m,
                Mount::start(&new_meta, dir.path(), "mnt-new", &["--cache-size", "0"]),
            )
            .stop();
        }
        let log = match (w, early) {
            (Some(w), _) => w.stop(),
            (None, Some(l)) => l,
            (None, None) => unreachable!(),
        };
        let errors = log.errors.clone();
        assert!(
            errors.is_empty(),
            "{from} -> {to}: writers got errors: {errors:?} (steps: {steps})"
        );
        // A file created after the switch: a fresh inode.
        std::fs::write(m.mp.join("post-switch"), b"new").unwrap();
        use std::os::unix::fs::MetadataExt;
        let post_ino = std::fs::metadata(m.mp.join("post-switch")).unwrap().ino();
        let files = log.files.clone();
        check_files(&m.mp, &files);
        m.stop();
        p1.term();
        let _ = &mut p1;
        // The old metadata rejoins as a mirror of the new primary (the rollback target).
        let (rejoin, newp) = rejoin_as_mirror(
            dir.path(),
            &old_meta,
            "old-engine",
            &new_listen,
            &store,
            &new_meta,
        )
        .await;
        rejoin_stop(rejoin);
        drop(p2);
        let d_new = fs_core::maint::dump(&**newp.engine()).await.unwrap();
        let d_old = fs_core::maint::dump(&*open_ro(&old_meta).await)
            .await
            .unwrap();
        assert!(d_new == d_old, "{from} -> {to}: the dumps differ");
        let old_inodes: Vec<u64> = d_new
            .inodes
            .keys()
            .copied()
            .filter(|&i| i != post_ino)
            .collect();
        assert!(
            old_inodes.iter().all(|&i| i < post_ino),
            "an inode was reused"
        );
        assert_eq!(d_new.epoch.as_ref().map(|e| e.epoch), Some(1));
        let blocks_after = integration::mountproc::store_blocks(&store).len();
        assert!(
            blocks_after >= blocks_before,
            "blocks went missing from the store"
        );
        eprintln!(
            "engine migration {from} -> {to}: {} checkpoints, none failed; longest {:?} (fence to promoted {:?}: {steps}); dumps equal ({} inodes); post-switch inode {post_ino}",
            files.len(),
            longest_pause(&log),
            t_promoted - t_fence,
            d_new.inodes.len()
        );
    }
}

fn rejoin_stop(mut a: Agent) {
    assert_eq!(a.term(), 0);
}

/// Issue 43, item 22: after a planned move to a mirror on RocksDB, the old site's mount does
/// not open the new primary's embedded metadata (it took its writer's lock, so the new
/// primary's own mount could not mount read-write): it stays on the fenced metadata, reads
/// go on, writes fail with EROFS and its log says to mount the new primary at its site; the
/// new primary's mount comes up read-write and writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_move_to_embedded_metadata_leaves_the_new_primarys_writer_lock_alone() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("redis", "file", |_| {}).await;
    let old_meta = vol.meta_url.clone();
    let new_listen = format!("127.0.0.1:{}", free_port());
    let mut pair = Pair::start(
        dir.path(),
        &old_meta,
        "rocksdb",
        None,
        "",
        &format!("listen = \"{new_listen}\""),
    )
    .await;
    let m = Mount::start(&old_meta, dir.path(), "mnt", &["--cache-size", "0"]);
    std::fs::write(m.mp.join("before"), data(3, 300_000)).unwrap();
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
    let fenced = runbook::run_ok("site-migration", "fence", &env);
    runbook::run_ok("site-migration", "wait", &env);
    assert_eq!(pair.mirror.term(), 0);
    let out = runbook::run_ok("site-migration", "promote", &env);
    assert!(out.contains("primary at epoch 1"), "{out}");
    // Time for a mount that follows to have followed (the session follower looks every
    // 500 ms).
    std::thread::sleep(Duration::from_secs(4));
    // The new primary's own mount mounts read-write and writes.
    let m2 = Mount::start(&pair.m_meta, dir.path(), "mnt2", &["--cache-size", "0"]);
    std::fs::write(m2.mp.join("after"), b"at the new primary").unwrap();
    assert_eq!(
        std::fs::read(m2.mp.join("before")).unwrap(),
        data(3, 300_000)
    );
    // The old mount: reads as before, writes refused, saying what to do.
    assert_eq!(
        std::fs::read(m.mp.join("before")).unwrap(),
        data(3, 300_000)
    );
    let e = std::fs::write(m.mp.join("late"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(30), "{e}");
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.contains("a mount follows a move only to metadata it reaches as a client")
            && log.contains(&format!("mount {} at the site that holds it", pair.m_meta))
            && !log.contains("the volume moved to a new primary"),
        "{log}"
    );
    // One line, not one per look.
    assert_eq!(
        log.matches("a mount follows a move only to metadata")
            .count(),
        1,
        "{log}"
    );
    // The fence said so too (not "its mounts move by themselves").
    assert!(
        fenced.contains("its mounts do not follow to embedded metadata")
            && fenced.contains(&meta::redact(&pair.m_meta)),
        "{fenced}"
    );
    m2.stop();
    m.stop();
}

/// Issue 43, item 24: a planned move's fence checks that `--new-primary` answers as the agent
/// of `--moved-to`'s mirror (its `[mirror] listen`): naming another mirror of the volume, or
/// an address where nothing answers, is refused before anything is written (no writer paused);
/// the right pair is accepted, noting who answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_move_fence_checks_new_primary_is_the_agent_of_the_moved_to_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let meta = vol.meta_url.clone();
    write_files(&vol.fs, "f-", 2, 50_000).await;
    drop(vol.fs);
    let (l1, l2) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    // Two mirrors of the volume, m1 (in the pair) and m2, each answering at its future listen.
    let pair = Pair::start(
        dir.path(),
        &meta,
        "rocksdb",
        None,
        "[[primary.mirrors]]\nname = \"m2\"\ntoken_env = \"MIRROR_TOKEN\"",
        &format!("listen = \"{l1}\""),
    )
    .await;
    let (m2_meta, _k1) = integration::meta_url("rocksdb");
    let (m2_store, _k2) = integration::store_url("file");
    let m2 = Agent::start(
        dir.path(),
        "m2",
        &mirror_toml(
            &m2_meta,
            &dir.path().join("m2s"),
            &format!("127.0.0.1:{}", free_port()),
            "m2",
            &pair.listen,
            &m2_store,
            &format!("listen = \"{l2}\""),
        ),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    let primary = open_ro(&meta).await;
    wait_converged(&pair.mirror, &*primary, Duration::from_secs(120)).await;
    wait_converged(&m2, &*primary, Duration::from_secs(120)).await;
    let fence = |moved_to: &str, new_primary: &str| {
        let o = Command::new(bin("mirror-agent"))
            .args(["fence", "--meta", &meta, "--as", "old", "--new-primary"])
            .args([new_primary, "--moved-to", moved_to])
            .output()
            .unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let nowhere = format!("127.0.0.1:{}", free_port());
    for (to, np, want) in [
        // The wrong mirror: m2's metadata, m1's address.
        (m2_meta.as_str(), l1.as_str(), "is another mirror's"),
        (pair.m_meta.as_str(), l2.as_str(), "is another mirror's"),
        // Nothing answers there.
        (
            pair.m_meta.as_str(),
            nowhere.as_str(),
            "nothing answers at --new-primary",
        ),
    ] {
        let (rc, out) = fence(to, np);
        assert!(
            rc == Some(2) && out.contains(want) && out.contains("--force"),
            "{to} at {np}: {out}"
        );
        let o = open_ro(&meta).await;
        assert!(
            fs_core::site::marker(&*o).await.unwrap().is_none()
                && fs_core::site::moved(&*o).await.unwrap().is_none(),
            "a refused fence wrote something ({to} at {np})"
        );
    }
    // The right pair: accepted.
    let (rc, out) = fence(&m2_meta, &l2);
    assert!(
        rc == Some(0) && out.contains(&format!("answers at {l2}")),
        "{out}"
    );
    drop(m2);
    drop(pair);
}

/// The trial: rejoining the old primary while its read-write mount was up, `check-config
/// --connect` said ok and `run` failed with the fence's text. Both now say that a running
/// read-write mount holds the metadata (its mount point and pid) and to unmount it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_agent_on_metadata_held_by_a_read_write_mount_says_to_unmount_it() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _d1) = integration::meta_url("rocksdb");
    let (store, _d2) = integration::store_url("file");
    let o = integration::run(
        "jfs",
        &[
            "format",
            &meta,
            &integration::unique("v"),
            "--storage",
            &store,
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = Mount::start(&meta, dir.path(), "pm", &[]);
    let pid = m.child.as_ref().unwrap().id();
    let cfg = dir.path().join("mirror.toml");
    std::fs::write(
        &cfg,
        format!(
            "role = \"mirror\"\nmeta = \"{meta}\"\nstate_dir = \"{}\"\n[mirror]\nname = \"m1\"\nprimary = \"127.0.0.1:{}\"\ntoken_env = \"MIRROR_TOKEN\"\nstore = \"file://{}\"\n",
            dir.path().join("mstate").display(),
            free_port(),
            dir.path().join("mstore").display()
        ),
    )
    .unwrap();
    let want = format!(
        "is locked by a running read-write mount at {} (pid {pid})",
        m.mp.display()
    );
    for args in [
        &["check-config", "--connect", "--config"][..],
        &["run", "--config"][..],
    ] {
        let o = Command::new(bin("mirror-agent"))
            .args(args)
            .arg(&cfg)
            .env("MIRROR_TOKEN", TOKEN)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains(&want)
                && err.contains(&format!(
                    "unmount it first (`jfs umount {}`)",
                    m.mp.display()
                ))
                && !err.contains("fenced"),
            "mirror-agent {args:?}: {}{err}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    m.stop();
}
