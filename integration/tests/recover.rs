//! Point-in-time metadata recovery (issue 44, part 3), the real binaries as processes: a
//! volume written through a mount under load while the mount's background work takes
//! snapshots and ships the journal into the volume's store; its metadata destroyed
//! (RocksDB directory removed, Redis FLUSHALL, PostgreSQL schema dropped); `jfs recover`
//! from the store alone. Every file acknowledged before the last shipped entry comes back
//! byte-identical and `fsck --deep` passes; an earlier `--seq` gives that instant's tree;
//! recover refuses non-empty metadata; a torn segment or damaged snapshot part is named; gc
//! holds the blocks of a recoverable instant.
//!
//! These need /dev/fuse and fusermount3; the Redis and PostgreSQL cases need
//! `integration/services.sh` (JFS_TEST_REDIS, JFS_TEST_PG): without them they fail, never skip.

use integration::mountproc::Mount;
use integration::{bin, data, meta_url, store_url, unique};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn jfs(args: &[&str]) -> Output {
    Command::new(bin("jfs"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

fn ok(args: &[&str]) -> String {
    let o = jfs(args);
    assert!(o.status.success(), "jfs {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The volume's journal head (its last entry).
fn head(meta: &str) -> u64 {
    head_at(meta).0
}

/// The volume's last journal entry: its seq and commit time (RFC 3339).
fn head_at(meta: &str) -> (u64, String) {
    let out = ok(&["journal", meta, "--json"]);
    let last: serde_json::Value =
        serde_json::from_str(out.lines().last().expect("a journal entry")).unwrap();
    (
        last["seq"].as_u64().unwrap(),
        last["time"].as_str().unwrap().to_string(),
    )
}

/// `jfs recover --list --json`, or None while there is no snapshot yet.
fn listing(store: &str, name: &str) -> Option<serde_json::Value> {
    let o = jfs(&["recover", store, "--name", name, "--list", "--json"]);
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).unwrap())
}

/// Wait (bounded) until the backups reach `seq` and hold at least `snaps` snapshots.
fn wait_shipped(store: &str, name: &str, seq: u64, snaps: usize) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        if let Some(l) = listing(store, name) {
            if l["last_seq"].as_u64().unwrap() >= seq
                && l["snapshots"].as_array().unwrap().len() >= snaps
            {
                return l;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the backups did not reach seq {seq} with {snaps} snapshots in 60 s: {:?}",
            listing(store, name)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The objects under `<store>/<name>/meta-backup/<sub>/`, sorted.
fn backup_files(store: &str, name: &str, sub: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![Path::new(store.trim_start_matches("file://"))
        .join(name)
        .join("meta-backup")
        .join(sub)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Destroy the volume's metadata as its engine's operator would lose it.
fn destroy(engine: &str, meta: &str) {
    match engine {
        "rocksdb" => {
            let dir = meta.trim_start_matches("rocksdb://");
            std::fs::remove_dir_all(dir).unwrap();
        }
        "redis" => {
            let url = meta.split('?').next().unwrap();
            let mut c = Command::new("redis-cli");
            c.args(["-u", url, "FLUSHALL"]);
            if let Ok(pw) = std::env::var("JFS_META_PASSWORD") {
                c.env("REDISCLI_AUTH", pw);
            }
            let o = c.output().unwrap();
            assert!(
                o.status.success() && text(&o).contains("OK"),
                "{}",
                text(&o)
            );
        }
        "postgres" => {
            let (url, q) = meta.split_once('?').unwrap();
            let schema = q.strip_prefix("schema=").unwrap();
            let mut c = Command::new("psql");
            c.args([url, "-qc", &format!("DROP SCHEMA {schema} CASCADE")]);
            if let Ok(pw) = std::env::var("JFS_META_PASSWORD") {
                c.env("PGPASSWORD", pw);
            }
            let o = c.output().unwrap();
            assert!(o.status.success(), "{}", text(&o));
        }
        other => panic!("unknown engine {other}"),
    }
    let o = jfs(&["ls", meta, "/"]);
    assert!(
        !o.status.success(),
        "the metadata is still there: {}",
        text(&o)
    );
}

fn scenario(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _m) = meta_url(engine);
    let (store, _s) = store_url("file");
    let name = unique("rv");
    // Trash off: a delete frees at once, so gc has frees to hold for the backups.
    ok(&["format", &meta, &name, "--storage", &store, "--trash", "0s"]);
    // Short intervals: a snapshot every 3 s, the journal shipped every second.
    let out = ok(&[
        "backup",
        &meta,
        "--snapshot-every",
        "3s",
        "--segment-every",
        "1s",
    ]);
    assert!(
        out.contains("backups on: a snapshot every 3s, the journal shipped every 1s"),
        "{out}"
    );
    // The files the writer copies in, of many sizes.
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..120u64 {
        std::fs::write(
            src.join(format!("f{i:03}")),
            data(i, 1000 + (i as usize * 2311) % 200_000),
        )
        .unwrap();
    }
    let mnt = Mount::start(
        &meta,
        dir.path(),
        "mnt",
        &["--attr-cache", "0s", "--entry-cache", "0s"],
    );
    let keep = data(999, 300_000);
    std::fs::write(mnt.mp.join("keep-me"), &keep).unwrap();
    std::fs::create_dir(mnt.mp.join("w")).unwrap();
    // Instant 1: keep-me exists, w is empty.
    let (h1, t1_time) = head_at(&meta);
    wait_shipped(&store, &name, h1, 1);
    // The writer: one file at a time, each line of `acked` written once its close returned.
    let acked = dir.path().join("acked");
    let script = format!(
        "for f in {src}/*; do cp \"$f\" {mp}/w/ || exit 1; basename \"$f\" >> {acked}; sleep 0.1; done",
        src = src.display(),
        mp = mnt.mp.display(),
        acked = acked.display()
    );
    let mut writer = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        // Its copies fail once the mount is killed below: expected.
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let acked_now = || -> Vec<String> {
        std::fs::read_to_string(&acked)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    };
    let t0 = Instant::now();
    while acked_now().len() < 30 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer is stuck"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // keep-me is deleted while the writer goes on.
    std::fs::remove_file(mnt.mp.join("keep-me")).unwrap();
    while acked_now().len() < 60 {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "the writer is stuck"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Files acknowledged before a shipped entry: those acked before the head read now.
    let a0 = acked_now();
    let h_a = head(&meta);
    let l = wait_shipped(&store, &name, h_a, 2);
    assert!(l["first_seq"].as_u64().unwrap() <= h1, "{l}");
    // The metadata engine is lost under load: the mount killed mid-write, its data gone.
    let pid = mnt.pid();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let _ = writer.wait();
    drop(mnt);
    destroy(engine, &meta);

    // Recover the latest instant from the store alone, into fresh metadata of this engine.
    let (new, _n) = meta_url(engine);
    let out = ok(&["recover", &store, "--name", &name, &new, "--json"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(r["seq"].as_u64().unwrap() >= h_a, "{r}");
    // Every file acknowledged before the shipped point is byte-identical; every other file
    // there is whole or was still being written (empty).
    let got = dir.path().join("got");
    ok(&["get", &new, "/w", got.to_str().unwrap()]);
    for f in &a0 {
        let want = std::fs::read(src.join(f)).unwrap();
        let have = std::fs::read(got.join(f))
            .unwrap_or_else(|e| panic!("{f}, acknowledged before seq {h_a}, is missing: {e}"));
        assert!(have == want, "{f} differs after recovery");
    }
    for e in std::fs::read_dir(&got).unwrap().flatten() {
        let have = std::fs::read(e.path()).unwrap();
        let want = std::fs::read(src.join(e.file_name())).unwrap();
        assert!(
            have == want || have.is_empty(),
            "{:?} is neither whole nor empty after recovery ({} of {} bytes)",
            e.file_name(),
            have.len(),
            want.len()
        );
    }
    let fsck = jfs(&["fsck", &new, "--deep"]);
    assert!(
        fsck.status.success() && text(&fsck).contains(" 0 broken"),
        "{}",
        text(&fsck)
    );
    assert!(
        !jfs(&["ls", &new, "/"])
            .stdout
            .windows(7)
            .any(|w| w == b"keep-me"),
        "keep-me was deleted before the recovered instant"
    );

    // gc of the recovered volume holds what a recoverable instant references: keep-me's
    // blocks, freed after instant 1 (trash time 0), stay.
    let gc: serde_json::Value =
        serde_json::from_str(&ok(&["gc", &new, "--delete", "--json"])).unwrap();
    assert!(
        gc["pending_held_for_backups"].as_u64().unwrap() >= 1,
        "gc held nothing for the backups: {gc}"
    );

    // Instant 1 again, after that gc: keep-me is back byte for byte, w empty.
    let (old, _o) = meta_url(engine);
    ok(&[
        "recover",
        &store,
        "--name",
        &name,
        &old,
        "--seq",
        &h1.to_string(),
    ]);
    let back = jfs(&["cat", &old, "/keep-me"]);
    assert!(back.status.success(), "{}", text(&back));
    assert!(back.stdout == keep, "keep-me differs at seq {h1}");
    assert_eq!(ok(&["ls", &old, "/w"]).trim(), "", "w at seq {h1}");
    let fsck = jfs(&["fsck", &old, "--deep"]);
    assert!(fsck.status.success(), "{}", text(&fsck));

    // The same instant by time, for reading only (the store stays `old`'s).
    let (at, _at) = meta_url(engine);
    let out = ok(&[
        "recover",
        &store,
        "--name",
        &name,
        &at,
        "--at",
        &t1_time,
        "--no-take-over",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["seq"].as_u64(), Some(h1), "--at {t1_time}: {r}");
    assert!(jfs(&["cat", &at, "/keep-me"]).stdout == keep);
    let o = jfs(&["mkdir", &at, "/x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("held by other metadata"), "{}", text(&o));
    ok(&["mkdir", &old, "/x"]);

    // Metadata that holds anything is refused, and left as it was.
    let o = jfs(&["recover", &store, "--name", &name, &old]);
    let msg = integration::fails_clearly(&o, "is not empty");
    assert!(
        msg.contains("recover writes only into empty metadata"),
        "{msg}"
    );
    assert!(jfs(&["cat", &old, "/keep-me"]).stdout == keep);

    // A torn journal segment is named, never skipped: one that lies between two snapshots
    // and is needed to reach its own last entry.
    let l = listing(&store, &name).unwrap();
    let snaps: Vec<u64> = l["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["seq"].as_u64().unwrap())
        .collect();
    let seg = backup_files(&store, &name, "journal")
        .into_iter()
        .find(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            let (a, b) = n.split_once('-').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            a > snaps[0] && !snaps.iter().any(|&s| a <= s && s <= b)
        })
        .expect("a segment between two snapshots");
    let last: u64 = seg.file_name().unwrap().to_str().unwrap()[21..]
        .parse()
        .unwrap();
    let whole = std::fs::read(&seg).unwrap();
    std::fs::write(&seg, &whole[..whole.len() - 5]).unwrap();
    let (t1, _t1) = meta_url(engine);
    let o = jfs(&[
        "recover",
        &store,
        "--name",
        &name,
        &t1,
        "--seq",
        &last.to_string(),
    ]);
    let msg = integration::fails_clearly(&o, "torn or damaged");
    let seg_name = seg.file_name().unwrap().to_str().unwrap();
    assert!(
        msg.contains(seg_name),
        "the torn segment is not named: {msg}"
    );
    std::fs::write(&seg, &whole).unwrap();

    // A damaged snapshot part is named too.
    let part = backup_files(&store, &name, "snap")
        .into_iter()
        .find(|p| p.to_str().unwrap().ends_with("part-000000"))
        .unwrap();
    let whole = std::fs::read(&part).unwrap();
    let mut bad = whole.clone();
    bad[20] ^= 0x40;
    std::fs::write(&part, &bad).unwrap();
    let (t2, _t2) = meta_url(engine);
    let mut any = false;
    for s in &snaps {
        let o = jfs(&[
            "recover",
            &store,
            "--name",
            &name,
            &t2,
            "--seq",
            &s.to_string(),
        ]);
        if !o.status.success() {
            let msg = text(&o);
            assert!(
                msg.contains("part-000000") && msg.contains("damaged"),
                "the damaged part is not named: {msg}"
            );
            any = true;
            break;
        }
        // That snapshot was not the damaged one: start again on empty metadata.
        destroy(engine, &t2);
    }
    assert!(any, "no recovery read the damaged part");
    std::fs::write(&part, &whole).unwrap();

    // A damaged manifest: that snapshot is never used and is named; the others still are.
    let manifests: Vec<PathBuf> = backup_files(&store, &name, "snap")
        .into_iter()
        .filter(|p| p.ends_with("manifest"))
        .collect();
    assert!(manifests.len() >= 2, "{manifests:?}");
    let m0 = &manifests[0];
    let whole = std::fs::read(m0).unwrap();
    std::fs::write(m0, &whole[..whole.len() / 2]).unwrap();
    let (t3, _t3) = meta_url(engine);
    let newest = snaps.last().unwrap().to_string();
    let o = jfs(&["recover", &store, "--name", &name, &t3, "--seq", &newest]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let m0_key = m0
        .to_str()
        .unwrap()
        .split(&format!("/{name}/"))
        .nth(1)
        .unwrap();
    assert!(
        err.contains("is damaged, that snapshot was not used") && err.contains(m0_key),
        "{err}"
    );
    let list = ok(&["recover", &store, "--name", &name, "--list"]);
    assert!(
        list.contains("damaged, never used:") && list.contains(m0_key),
        "{list}"
    );
    std::fs::write(m0, &whole).unwrap();
}

/// `runbooks/recover-metadata.md`, each step as written, its output compared.
#[test]
fn the_recover_metadata_runbook_does_what_it_says() {
    use integration::runbook;
    let dir = tempfile::tempdir().unwrap();
    let (meta, _m) = meta_url("rocksdb");
    let (store, _s) = store_url("file");
    let name = unique("rb");
    ok(&["format", &meta, &name, "--storage", &store]);
    let tree = dir.path().join("run-7");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..5u64 {
        std::fs::write(tree.join(format!("ckpt-{i}")), data(i, 50_000 + i as usize)).unwrap();
    }
    ok(&["mkdir", &meta, "/projects"]);
    ok(&["put", &meta, tree.to_str().unwrap(), "/projects/run-7"]);
    ok(&["backup", &meta, "--now"]);
    let seq = head(&meta).to_string();
    ok(&["rm", "-r", &meta, "/projects/run-7"]);
    ok(&[
        "put",
        &meta,
        tree.join("ckpt-0").to_str().unwrap(),
        "/after",
    ]);
    ok(&["backup", &meta, "--now"]);
    std::fs::remove_dir_all(meta.trim_start_matches("rocksdb://")).unwrap();
    let (new, _n) = meta_url("rocksdb");
    let (other, _o) = meta_url("rocksdb");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let env = [
        ("STORE_URL", store.as_str()),
        ("NAME", name.as_str()),
        ("NEW_META_URL", new.as_str()),
        ("OTHER_META_URL", other.as_str()),
        ("SEQ", seq.as_str()),
        ("SCRATCH", scratch.to_str().unwrap()),
    ];
    runbook::run_checked("recover-metadata", "list", &env);
    runbook::run_checked("recover-metadata", "recover", &env);
    runbook::run_checked("recover-metadata", "check", &env);
    assert!(jfs(&["cat", &new, "/after"]).stdout == data(0, 50_000));
    assert!(!jfs(&["cat", &new, "/projects/run-7/ckpt-0"])
        .status
        .success());
    runbook::run_checked("recover-metadata", "earlier", &env);
    // The deleted tree is back in the volume, byte for byte.
    for i in 0..5u64 {
        let o = jfs(&["cat", &new, &format!("/projects/run-7/ckpt-{i}")]);
        assert!(o.stdout == data(i, 50_000 + i as usize), "ckpt-{i}");
    }
}

#[test]
fn rocksdb_metadata_destroyed_under_load_is_recovered_from_the_store() {
    scenario("rocksdb");
}

#[test]
fn redis_metadata_flushed_under_load_is_recovered_from_the_store() {
    scenario("redis");
}

#[test]
fn postgres_schema_dropped_under_load_is_recovered_from_the_store() {
    scenario("postgres");
}

/// Exactly one process backs up: the primary agent while its lease is alive, otherwise the
/// live writing session with the smallest id; never a read-only one, never at a mirror.
#[tokio::test]
async fn one_backup_writer_the_agent_first_then_the_smallest_writing_session() {
    use fs_core::maint::backup::{my_turn, AGENT_LEASE};
    use fs_core::session::{self, Session};
    let (url, _d) = meta_url("rocksdb");
    let e = integration::open_engine(&url).await;
    let (mut a, mut b, mut ro) = (
        Session::new("/a", false),
        Session::new("/b", false),
        Session::new("/ro", true),
    );
    // Ids decide, whatever order the mounts came in.
    if a.id > b.id {
        std::mem::swap(&mut a, &mut b);
    }
    ro.id = "0000000000000000".into();
    for s in [&a, &b, &ro] {
        session::put(&*e, s).await.unwrap();
    }
    let turns = |e: std::sync::Arc<dyn fs_core::Engine>, a: String, b: String, ro: String| async move {
        (
            my_turn(&*e, Some(&a)).await.unwrap(),
            my_turn(&*e, Some(&b)).await.unwrap(),
            my_turn(&*e, Some(&ro)).await.unwrap(),
            my_turn(&*e, None).await.unwrap(),
        )
    };
    let t = || turns(e.clone(), a.id.clone(), b.id.clone(), ro.id.clone());
    assert_eq!(
        t().await,
        (true, false, false, true),
        "no agent: the smallest writer"
    );
    // A live agent lease: the agent alone.
    let lease = serde_json::json!({"pid": 1, "host": "h", "beat_ns": fs_core::now_ns()});
    e.aux_put(AGENT_LEASE, Some(lease.to_string().as_bytes()))
        .await
        .unwrap();
    assert_eq!(t().await, (false, false, false, true), "a live agent");
    // A stale one: the mounts again.
    let stale = serde_json::json!({"pid": 1, "host": "h", "beat_ns": fs_core::now_ns() - 60_000_000_000i64});
    e.aux_put(AGENT_LEASE, Some(stale.to_string().as_bytes()))
        .await
        .unwrap();
    assert_eq!(t().await, (true, false, false, true), "a stale agent");
    // The smallest writer gone: the next one.
    session::remove(&*e, &a.id).await.unwrap();
    assert_eq!(t().await, (false, true, false, true), "after a's end");
    // At a mirror: nobody.
    let (u2, _d2) = meta_url("rocksdb");
    let e2 = integration::replica(&u2).await;
    assert!(!my_turn(&*e2, None).await.unwrap());
    assert!(!my_turn(&*e2, Some(&b.id)).await.unwrap());
    // And a backup asked for there by hand (`jfs backup --now`) is refused, naming why.
    let store = integration::open_store("memory://");
    let err = fs_core::maint::backup::Runner::default()
        .step(&*e2, &*store, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is a mirror's metadata: metadata backups are taken at the primary"),
        "{err}"
    );
}

/// Snapshots written since a process started: the log lines of its backup worker.
fn snapshots_in(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("metadata snapshot written to the volume's store")
        .count()
}

/// The primary agent takes the backups while it runs, the read-write mount at the primary
/// none; once the agent stops (its lease gone), the mount takes them over.
#[test]
fn the_primary_agent_takes_the_backups_and_the_mount_takes_over_when_it_stops() {
    use integration::mirror::{free_port, primary_toml, Agent, TOKEN};
    let dir = tempfile::tempdir().unwrap();
    let (meta, _m) = meta_url("rocksdb");
    let (store, _s) = store_url("file");
    let name = unique("ag");
    ok(&["format", &meta, &name, "--storage", &store]);
    ok(&[
        "backup",
        &meta,
        "--snapshot-every",
        "1s",
        "--segment-every",
        "1s",
    ]);
    // -v: the mount logs its snapshots (info).
    let mnt = Mount::start(&meta, dir.path(), "mnt", &["-v"]);
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut agent = Agent::start(
        dir.path(),
        "primary",
        &primary_toml(&meta, &dir.path().join("ps"), &admin, &listen, &["m1"], ""),
        &[("MIRROR_TOKEN", TOKEN)],
    );
    // Changes keep coming, so each second has a new state to snapshot.
    let t0 = Instant::now();
    let mut i = 0;
    while snapshots_in(&agent.log) < 3 {
        std::fs::write(mnt.mp.join(format!("f{i}")), data(i, 1000)).unwrap();
        i += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent took no 3 snapshots in 60 s: {}",
            std::fs::read_to_string(&agent.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The mount may have taken one before the agent's lease was there, none since.
    let by_mount = snapshots_in(&mnt.log);
    for _ in 0..15 {
        std::fs::write(mnt.mp.join(format!("f{i}")), data(i, 1000)).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        snapshots_in(&mnt.log),
        by_mount,
        "the mount backed up while the agent did"
    );
    assert_eq!(agent.term(), 0, "the agent's exit");
    let t0 = Instant::now();
    while snapshots_in(&mnt.log) == by_mount {
        std::fs::write(mnt.mp.join(format!("f{i}")), data(i, 1000)).unwrap();
        i += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the mount did not take the backups over in 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    mnt.stop();
}
