//! mirror-agent end to end: real agent processes (primary and mirror) on loopback, real
//! engines and stores, a mixed workload of file-system operations with data. Every test
//! asserts on data: dumps, file bytes, journal frames, sequence numbers, counts.

use integration::mirror::*;
use integration::{bin, meta_url, store_url, volume_with, TestVol};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Site {
    dir: tempfile::TempDir,
    vol: TestVol,
    pair: Pair,
}

impl std::ops::Deref for Site {
    type Target = Pair;
    fn deref(&self) -> &Pair {
        &self.pair
    }
}

impl std::ops::DerefMut for Site {
    fn deref_mut(&mut self) -> &mut Pair {
        &mut self.pair
    }
}

async fn setup(
    p_engine: &'static str,
    m_engine: &'static str,
    primary_extra: &str,
    mirror_extra: &str,
) -> Site {
    setup_with(
        p_engine,
        m_engine,
        primary_extra,
        mirror_extra,
        |_| {},
        None,
    )
    .await
}

async fn setup_with(
    p_engine: &'static str,
    m_engine: &'static str,
    primary_extra: &str,
    mirror_extra: &str,
    settings: impl FnOnce(&mut fs_core::Settings),
    via: Option<(Duration, u32)>,
) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with(p_engine, "file", settings).await;
    let pair = Pair::start(
        dir.path(),
        &vol.meta_url,
        m_engine,
        via,
        primary_extra,
        mirror_extra,
    )
    .await;
    Site { dir, vol, pair }
}

async fn converge_pair(p: &'static str, m: &'static str) {
    let mut s = setup(p, m, "", "").await;
    let committed = workload(&s.vol.fs, 16_000, 7, None).await;
    assert!(committed >= 10_000, "only {committed} operations committed");
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(180)).await;
    let files = assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    let (first, last) = assert_same_journal(&**s.vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    assert!(files > 20, "only {files} files compared");
    assert!(
        last - first >= 10_000,
        "only {} entries replicated",
        last - first
    );
    assert!(n(&st, "blocks.copied") > 0);
    assert_eq!(st["within_window"], true, "{st}");
    assert_eq!(n(&st, "lag_entries"), 0);
    // The primary's slot records the acknowledgement (written every 500 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ps = s.primary.status();
    assert_eq!(n(&ps["mirrors"][0], "acked_seq"), last, "{ps}");
    // The bootstrap fence is lifted: jfs reads the mirror, through the mirror's own store.
    let out = Command::new(bin("jfs"))
        .args(["--block-store", &s.m_store, "ls", &s.m_meta, "/"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "jfs ls at the mirror: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Copy limits change while running.
    s.mirror.set_limits(&["--bwlimit", "50M", "--tps", "200"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = s.mirror.status();
    assert_eq!(n(&st, "limits.bytes_per_s"), 50 << 20, "{st}");
    assert_eq!(n(&st, "limits.requests_per_s"), 200, "{st}");
    // The engines' password (from the environment) shows nowhere.
    let pw = std::env::var("JFS_META_PASSWORD").unwrap_or_default();
    if pw.len() >= 8 {
        for text in [
            s.primary.log_text(),
            s.mirror.log_text(),
            s.primary.status().to_string(),
            s.mirror.status().to_string(),
            s.mirror.metrics(),
        ] {
            assert!(!text.contains(&pw), "the metadata password leaked: {text}");
        }
    }
    // SIGTERM: both drain and exit 0.
    assert_eq!(
        s.mirror.term(),
        0,
        "mirror exit code; log:\n{}",
        tail(&s.mirror.log_text(), 20)
    );
    assert_eq!(s.primary.term(), 0, "primary exit code");
    eprintln!(
        "{p}->{m}: {committed} operations, entries {first}..={last}, {files} files identical"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_rocksdb_to_rocksdb() {
    converge_pair("rocksdb", "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_redis_to_rocksdb() {
    converge_pair("redis", "rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converges_postgres_to_redis() {
    converge_pair("postgres", "redis").await;
}

/// Kill one agent with SIGKILL at 20 random points while a workload runs, restart it each
/// time; afterwards: the mirror's journal is the primary's frame for frame (0 lost,
/// 0 duplicated, 0 out of order), dumps are equal, every file reads back identical.
async fn killed_20_times(which: &str) {
    use rand::Rng;
    let mut s = setup("rocksdb", "rocksdb", "", "").await;
    let stop = Arc::new(AtomicBool::new(false));
    let fs2 = s.vol.client().await;
    let st = stop.clone();
    let w = tokio::spawn(async move { workload(&fs2, 1_000_000, 11, Some(&st)).await });
    let mut rng = rand::rng();
    let mut applied_at_kill = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..700))).await;
        let agent = if which == "mirror" {
            &mut s.mirror
        } else {
            &mut s.primary
        };
        agent.kill9();
        if which == "mirror" {
            applied_at_kill.push(
                open_ro(&s.m_meta)
                    .await
                    .journal_bounds()
                    .await
                    .unwrap()
                    .last,
            );
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        let agent = if which == "mirror" {
            &mut s.mirror
        } else {
            &mut s.primary
        };
        agent.restart();
    }
    stop.store(true, Ordering::SeqCst);
    let committed = w.await.unwrap();
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(180)).await;
    let files = assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    let (first, last) = assert_same_journal(&**s.vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    // The mirror made progress between kills, and never went backwards.
    assert!(
        applied_at_kill.windows(2).all(|w| w[0] <= w[1]),
        "applied seq went backwards: {applied_at_kill:?}"
    );
    assert!(
        committed > 500 && last - first + 1 >= committed,
        "{committed} committed, {first}..={last} replicated"
    );
    // One bootstrap only: a restart resumes from the applied seq, it never re-snapshots.
    let snapshots = s.mirror.log_text().matches("snapshot installed").count();
    assert_eq!(snapshots, 1, "the mirror bootstrapped {snapshots} times");
    eprintln!(
        "{which} killed 20 times: {committed} operations, entries {first}..={last} identical, {files} files identical, {} blocks copied after the last restart, kills at applied seq {applied_at_kill:?}",
        n(&st, "blocks.copied")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_agent_killed_20_times_loses_and_duplicates_nothing() {
    killed_20_times("mirror").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_agent_killed_20_times_loses_and_duplicates_nothing() {
    killed_20_times("primary").await;
}

type Sample = (u64, std::collections::BTreeMap<Vec<u8>, Vec<u8>>);

/// One atomic read of a mirror's metadata: its head and every key, as of one instant.
/// RocksDB: a secondary instance, read between two catch-ups. Redis: one Lua script (atomic
/// on the server). PostgreSQL: one REPEATABLE READ transaction.
enum Sampler {
    Rocks(Arc<dyn fs_core::Engine>),
    Redis(redis::aio::MultiplexedConnection, String),
    Pg(tokio_postgres::Client, String),
}

impl Sampler {
    async fn new(engine: &str, url: &str) -> Sampler {
        let pw = || std::env::var("JFS_META_PASSWORD").unwrap();
        match engine {
            "rocksdb" => Sampler::Rocks(open_ro(url).await),
            "redis" => {
                let (base, prefix) = url.split_once("?prefix=").unwrap();
                let c =
                    redis::Client::open(base.replace("redis://", &format!("redis://:{}@", pw())))
                        .unwrap();
                Sampler::Redis(
                    c.get_multiplexed_async_connection().await.unwrap(),
                    prefix.to_string(),
                )
            }
            _ => {
                let (base, schema) = url.split_once("?schema=").unwrap();
                let mut cfg: tokio_postgres::Config = base.parse().unwrap();
                cfg.password(pw());
                let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                Sampler::Pg(client, schema.to_string())
            }
        }
    }

    async fn sample(&mut self) -> Sample {
        let mut map = std::collections::BTreeMap::new();
        match self {
            Sampler::Rocks(e) => {
                let head = e.journal_bounds().await.unwrap().last; // catches up
                fs_core::engine::scan_all(&**e, b"", &[0xff], 1000, |p| {
                    map.extend(p);
                    Ok(())
                })
                .await
                .unwrap();
                (head, map)
            }
            Sampler::Redis(c, prefix) => {
                const ALL: &str = "local m = redis.call('ZRANGE', KEYS[2], 0, -1) \
                    local out = {redis.call('GET', KEYS[1]) or '0'} \
                    for i = 1, #m do out[#out + 1] = m[i]; out[#out + 1] = redis.call('GET', ARGV[1] .. m[i]) end \
                    return out";
                let v: Vec<Vec<u8>> = redis::Script::new(ALL)
                    .key(format!("{prefix}_head"))
                    .key(format!("{prefix}_index"))
                    .arg(prefix.as_str())
                    .invoke_async(c)
                    .await
                    .unwrap();
                let head = String::from_utf8_lossy(&v[0]).parse().unwrap();
                for kv in v[1..].chunks(2) {
                    map.insert(kv[0].clone(), kv[1].clone());
                }
                (head, map)
            }
            Sampler::Pg(c, schema) => {
                let tx = c
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .start()
                    .await
                    .unwrap();
                let head: i64 = tx
                    .query_one(
                        &format!("SELECT seq FROM {schema}.jfs_head WHERE id = 1"),
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                for r in tx
                    .query(&format!("SELECT k, v FROM {schema}.jfs_kv"), &[])
                    .await
                    .unwrap()
                {
                    map.insert(r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1));
                }
                tx.commit().await.unwrap();
                (head as u64, map)
            }
        }
    }
}

/// Sample the mirror's metadata at random instants while it replicates (each sample one
/// atomic read, see `Sampler`), then replay the primary's journal and check each sample equals
/// the primary's state at the sample's head: no reader sees half a transaction, whatever the
/// mirror's engine.
async fn consistent_prefix(m_engine: &'static str) {
    use rand::Rng;
    use std::collections::BTreeMap;
    let s = setup("rocksdb", m_engine, "", "batch_entries = 64").await;
    // Sampling starts once the bootstrap is complete (a bootstrapping mirror says so).
    let t0 = Instant::now();
    while !s.mirror.status()["bootstrap"].is_null() || n(&s.mirror.status(), "applied_seq") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "bootstrap did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let fs2 = s.vol.client().await;
    let st = stop.clone();
    let w = tokio::spawn(async move { workload(&fs2, 12_000, 21, Some(&st)).await });
    let mut sampler = Sampler::new(m_engine, &s.m_meta).await;
    let mut samples: Vec<Sample> = Vec::new();
    let mut rng = rand::rng();
    while !w.is_finished() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..120))).await;
        samples.push(sampler.sample().await);
    }
    let committed = w.await.unwrap();
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(120)).await;
    let distinct: std::collections::BTreeSet<u64> = samples.iter().map(|s| s.0).collect();
    assert!(
        samples.len() >= 20 && distinct.len() >= 10,
        "{} samples at {} distinct heads",
        samples.len(),
        distinct.len()
    );
    // Replay the primary's journal from the start into a map; compare at each sample's head.
    samples.sort_by_key(|s| s.0);
    let mut state: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut i = 0;
    for e in integration::journal(&**s.vol.fs.engine()).await {
        for m in &e.writes {
            match m {
                fs_core::Mutation::Put { key, value } => {
                    state.insert(key.clone(), value.clone());
                }
                fs_core::Mutation::Delete { key } => {
                    state.remove(key);
                }
                _ => unreachable!(),
            }
        }
        while i < samples.len() && samples[i].0 == e.seq {
            assert!(
                samples[i].1 == state,
                "the mirror sample at seq {} is not the primary's state at that seq",
                e.seq
            );
            i += 1;
        }
    }
    assert_eq!(i, samples.len(), "some samples were never matched");
    eprintln!("consistent prefix ({m_engine} mirror): {} samples at {} distinct sequence numbers, all equal to a primary state ({committed} operations)", samples.len(), distinct.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consistent_prefix_at_random_instants_rocksdb() {
    consistent_prefix("rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consistent_prefix_at_random_instants_redis() {
    consistent_prefix("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consistent_prefix_at_random_instants_postgres() {
    consistent_prefix("postgres").await;
}

/// A mirror held behind (stopped) must keep the primary's gc from deleting blocks it still
/// references; once it catches up, gc purges them and the mirror deletes its copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_never_deletes_blocks_a_lagging_mirror_needs() {
    use fs_core::{Owner, ROOT_INO};
    let o = Owner { uid: 0, gid: 0 };
    let mut s = setup_with(
        "redis",
        "rocksdb",
        "",
        "",
        |st| {
            st.trash_secs = 0;
            // The primary agent's metadata backups would hold the frees too (gc's other
            // rule, tested in recover.rs): this test is about the mirrors' hold.
            st.backup = Some(fs_core::maint::backup::BackupSettings {
                enabled: false,
                ..Default::default()
            });
        },
        None,
    )
    .await;
    let fs = &s.vol.fs;
    let mut inos = Vec::new();
    for i in 0..20u64 {
        let (ino, _) = fs
            .create(ROOT_INO, format!("g{i}").as_bytes(), 0o644, o)
            .await
            .unwrap();
        fs.write(ino, 0, &integration::data(i, 300_000 + i as usize * 1000))
            .await
            .unwrap();
        inos.push(ino);
    }
    wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(s.pair.mirror.term(), 0);
    // Held behind: overwrite 10 files, delete 10.
    for (i, &ino) in inos.iter().enumerate().take(10) {
        let zero = fs_core::SetAttr {
            length: Some(0),
            ..Default::default()
        };
        fs.setattr(ino, &zero).await.unwrap();
        fs.write(ino, 0, &integration::data(100 + i as u64, 300_000))
            .await
            .unwrap();
    }
    for i in 10..20 {
        fs.unlink(ROOT_INO, format!("g{i}").as_bytes())
            .await
            .unwrap();
    }
    let gc = |delete: bool| {
        let mut c = Command::new(bin("jfs"));
        c.arg("gc").arg(&s.vol.meta_url).arg("--json");
        if delete {
            c.arg("--delete");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "jfs gc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let r = gc(true);
    assert_eq!(n(&r, "pending_held_for_mirrors"), 20, "{r}");
    assert_eq!(n(&r, "pending_purged"), 0, "{r}");
    // Every block the mirror's metadata references is still at the origin.
    let needed = referenced_blocks(&s.m_meta).await;
    assert!(
        needed.len() >= 20,
        "{} blocks referenced at the mirror",
        needed.len()
    );
    let origin = integration::open_store(&s.vol.store_url);
    let mut missing = 0;
    for (k, len) in &needed {
        match origin.head(k).await.unwrap() {
            Some(m) if m.size == *len as u64 => {}
            _ => missing += 1,
        }
    }
    assert_eq!(
        missing,
        0,
        "{missing} of {} blocks the mirror needs were deleted at the origin",
        needed.len()
    );
    // The mirror catches up; now gc purges; the mirror applies the purge and drops its copies.
    s.pair.mirror.restart();
    wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // the slot ack is written every 500 ms
    let r = gc(true);
    assert_eq!(n(&r, "pending_held_for_mirrors"), 0, "{r}");
    assert_eq!(n(&r, "pending_purged"), 20, "{r}");
    let t0 = Instant::now();
    loop {
        let st = wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
        if n(&st, "blocks.deleted") >= 20 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "mirror copies not deleted: {st}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let files = assert_same(fs, &s.m_meta, &s.m_store).await;
    assert_eq!(files, 10);
    let _ = &s.dir;
}

async fn referenced_blocks(meta: &str) -> Vec<(String, u32)> {
    let e = open_ro(meta).await;
    let settings: fs_core::Settings =
        serde_json::from_slice(&e.get(fs_core::keys::SETTING).await.unwrap().unwrap()).unwrap();
    let mut out = Vec::new();
    fs_core::engine::scan_all(&*e, b"", &[0xff], 1000, |p| {
        for (k, v) in p {
            if let fs_core::keys::Key::Chunk(..) = fs_core::keys::parse(&k) {
                for r in fs_core::SliceRec::decode_list(&v).unwrap() {
                    if r.id != 0 {
                        out.extend(fs_core::keys::slice_block_keys(
                            &settings.name,
                            r.id,
                            r.size,
                            settings.block_size,
                        ));
                    }
                }
            }
        }
        Ok(())
    })
    .await
    .unwrap();
    out
}

/// Wrong or missing credentials are refused, nothing is applied, and the token never shows in
/// logs, status, metrics or process arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_credentials_are_refused_and_secrets_stay_hidden() {
    let s = setup("rocksdb", "rocksdb", "", "").await;
    workload(&s.vol.fs, 300, 3, None).await;
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(60)).await;
    let bad_token = "77f3e1c0b9a84d2e6f1a5c9b3d7e0f2a8c4b6d1e9f3a5c7b0d2e4f6a8c1b3d5e";
    let cases = [("m1", bad_token), ("m9", TOKEN)]; // wrong token; unregistered name
    for (i, (name, tok)) in cases.iter().enumerate() {
        let (meta, _d) = meta_url("rocksdb");
        let admin = format!("127.0.0.1:{}", free_port());
        let a = Agent::start(
            s.dir.path(),
            &format!("bad{i}"),
            &mirror_toml(
                &meta,
                &s.dir.path().join(format!("bad{i}")),
                &admin,
                name,
                &s.listen,
                &s.m_store,
                "",
            ),
            &[("MIRROR_TOKEN", tok)],
        );
        let st = status_until(&a, Duration::from_secs(20), |st| {
            st["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("authentication failed"))
        })
        .await;
        assert_eq!(st["connected"], false);
        assert_eq!(
            n(&st, "applied_seq"),
            0,
            "a refused mirror applied something"
        );
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", a.pid())).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(tok));
        for text in [a.log_text(), st.to_string(), a.metrics()] {
            assert!(!text.contains(tok), "the token leaked: {text}");
        }
    }
    // The primary's status is refreshed every 500 ms.
    let ps = status_until(&s.primary, Duration::from_secs(10), |ps| {
        n(ps, "auth_failures") >= 2
    })
    .await;
    assert!(n(&ps, "auth_failures") >= 2, "{ps}");
    for text in [
        s.primary.log_text(),
        s.mirror.log_text(),
        ps.to_string(),
        s.mirror.status().to_string(),
        s.primary.metrics(),
        s.mirror.metrics(),
    ] {
        assert!(
            !text.contains(TOKEN) && !text.contains(bad_token),
            "a token leaked: {text}"
        );
    }
    for pid in [s.primary.pid(), s.mirror.pid()] {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));
    }
    // A missing variable, a short token, and an inline token: each a one-line error, exit 2.
    let cfg = s.dir.path().join("mirror.toml");
    let run = |env: &[(&str, &str)], cfg: &std::path::Path| {
        let mut c = Command::new(bin("mirror-agent"));
        c.arg("check-config")
            .arg("--config")
            .arg(cfg)
            .env("ADMIN_TOKEN", integration::mirror::ADMIN_TOKEN)
            .env_remove("MIRROR_TOKEN");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[], &cfg);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("MIRROR_TOKEN") && err.contains("not set"),
        "{err}"
    );
    let (code, err) = run(&[("MIRROR_TOKEN", "short")], &cfg);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("shorter than 16") && !err.contains("short\""),
        "{err}"
    );
    let inline = s.dir.path().join("inline.toml");
    std::fs::write(
        &inline,
        std::fs::read_to_string(&cfg).unwrap().replace(
            "token_env = \"MIRROR_TOKEN\"",
            &format!("token = \"{TOKEN}\""),
        ),
    )
    .unwrap();
    let (code, err) = run(&[], &inline);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("literal `token` is not accepted") && !err.contains(TOKEN),
        "{err}"
    );
}

/// Bytes flipped in transit (by the harness proxy) are detected, never applied, and the
/// mirror re-requests from its applied seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupted_frames_are_detected_and_rerequested() {
    let s = setup_with(
        "rocksdb",
        "rocksdb",
        "",
        "",
        |_| {},
        Some((Duration::ZERO, 0)),
    )
    .await;
    let (vol, m) = (&s.vol, &s.mirror);
    let proxy = s.proxy.as_ref().expect("proxy");
    wait_converged(m, &**vol.fs.engine(), Duration::from_secs(30)).await;
    proxy.corrupt.store(6, Ordering::SeqCst);
    workload(&vol.fs, 3_000, 5, None).await;
    let st = wait_converged(m, &**vol.fs.engine(), Duration::from_secs(120)).await;
    assert_eq!(
        proxy.corrupt.load(Ordering::SeqCst),
        0,
        "the proxy did not corrupt anything"
    );
    assert!(n(&st, "frame_errors") >= 1, "no corruption detected: {st}");
    assert!(n(&st, "reconnects") >= 1, "{st}");
    assert_same(&vol.fs, &s.m_meta, &s.m_store).await;
    assert_same_journal(&**vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    eprintln!(
        "corruption: {} damaged messages detected, {} reconnects, converged",
        n(&st, "frame_errors"),
        n(&st, "reconnects")
    );
}

/// With TLS configured the mirror replicates over it; a mirror trusting another CA, or
/// speaking plaintext, gets nothing (no fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_channel_replicates_and_refuses_untrusted_or_plaintext() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let c = |f: &str| certs.path().join(f).display().to_string();
    let s = setup(
        "rocksdb",
        "rocksdb",
        &format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"",
            c("server.crt"),
            c("server.key")
        ),
        &format!(
            "tls_ca = \"{}\"\ntls_server_name = \"primary.test\"",
            c("ca.crt")
        ),
    )
    .await;
    workload(&s.vol.fs, 1_000, 9, None).await;
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(60)).await;
    let files = assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    assert!(files > 5);
    assert_eq!(s.primary.status()["tls"], true);
    for (i, extra) in [
        format!(
            "tls_ca = \"{}\"\ntls_server_name = \"primary.test\"",
            c("other.crt")
        ),
        String::new(),
    ]
    .iter()
    .enumerate()
    {
        let (meta, _d) = meta_url("rocksdb");
        let admin = format!("127.0.0.1:{}", free_port());
        let a = Agent::start(
            s.dir.path(),
            &format!("untrusted{i}"),
            &mirror_toml(
                &meta,
                &s.dir.path().join(format!("u{i}")),
                &admin,
                "m1",
                &s.listen,
                &s.m_store,
                extra,
            ),
            &[("MIRROR_TOKEN", TOKEN)],
        );
        // A wrong CA fails the TLS handshake (retried); plaintext against a TLS primary is
        // "not a primary agent" (a configuration problem: refused after three such replies,
        // retried seldom). Wait for the refusal itself there: `reconnects` counts a session
        // when it starts, so it reads 2 while the third reply is still on its way.
        let st = status_until(&a, Duration::from_secs(30), |st| {
            !st["refused"].is_null() || (i != 1 && n(st, "reconnects") >= 2)
        })
        .await;
        assert_eq!(st["connected"], false, "{st}");
        if i == 1 {
            assert!(
                st["refused"]
                    .as_str()
                    .unwrap_or("")
                    .contains("is not a primary agent"),
                "{st}"
            );
        }
        assert_eq!(
            n(&st, "applied_seq"),
            0,
            "an untrusted channel delivered entries: {st}"
        );
        if i == 0 {
            assert!(
                st["last_error"].as_str().unwrap_or("").contains("TLS"),
                "{st}"
            );
        }
    }
}

/// Past the retention cap the primary drops the slot loudly and trims; the mirror, restarted,
/// is told to resync, bootstraps from a snapshot while writes go on, and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_cap_drops_the_slot_loudly_and_the_mirror_resyncs() {
    let mut s = setup_with(
        "redis",
        "rocksdb",
        "retain_max_entries = 300",
        "",
        |st| st.journal_retention_secs = 0,
        None,
    )
    .await;
    workload(&s.vol.fs, 200, 1, None).await;
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(s.mirror.term(), 0);
    workload(&s.vol.fs, 1_500, 2, None).await;
    let ps = status_until(&s.primary, Duration::from_secs(30), |ps| {
        ps["mirrors"][0]["state"] == "needs_resync"
            && n(ps, "journal_first_seq") > n(&ps["mirrors"][0], "acked_seq") + 1
    })
    .await;
    assert!(
        s.primary.log_text().contains("replication slot dropped"),
        "not loud in the log"
    );
    assert!(
        s.primary
            .metrics()
            .contains("jfs_mirror_slot_needs_resync{mirror=\"m1\"} 1"),
        "not in the metrics"
    );
    let slots = Command::new(bin("mirror-agent"))
        .args(["slot", "list", "--meta", &s.vol.meta_url])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&slots.stdout).contains("needs_resync"),
        "slot list: {}",
        String::from_utf8_lossy(&slots.stdout)
    );
    // Restart the mirror while a workload runs: it is told to resync and bootstraps.
    let stop = Arc::new(AtomicBool::new(false));
    let fs2 = s.vol.client().await;
    let st2 = stop.clone();
    let w = tokio::spawn(async move { workload(&fs2, 3_000, 3, Some(&st2)).await });
    s.mirror.restart();
    let _ = w.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(120)).await;
    assert!(
        s.mirror.log_text().contains("requires a resync"),
        "{}",
        tail(&s.mirror.log_text(), 20)
    );
    assert_eq!(st["needs_resync"], false);
    assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ps2 = s.primary.status();
    assert_eq!(ps2["mirrors"][0]["state"], "active", "{ps2}");
    eprintln!("retention: slot dropped at {ps}; resynced and converged");
}

/// Primary and mirror in two network namespaces; the link is cut for 30 s during
/// replication: the mirror reports itself out of its window, then resumes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partition_of_30s_is_reported_and_healed() {
    let net = NetPair::new(1);
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let at = Placement::Netns {
        net: &net,
        port: 19_566,
    };
    let pair = Pair::start_at(
        dir.path(),
        &vol.meta_url,
        "rocksdb",
        at,
        "",
        "window = \"1s\"",
    )
    .await;
    let (m, m_meta, m_store) = (&pair.mirror, &pair.m_meta, &pair.m_store);
    workload(&vol.fs, 500, 1, None).await;
    wait_converged(m, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let fs2 = vol.client().await;
    let st2 = stop.clone();
    let w = tokio::spawn(async move { workload(&fs2, 20_000, 2, Some(&st2)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    net.link(false);
    let cut = Instant::now();
    let mut saw_out = None;
    while cut.elapsed() < Duration::from_secs(30) {
        let st = m.status();
        if st["within_window"] == false && saw_out.is_none() {
            saw_out = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = m.status();
    net.link(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let committed = w.await.unwrap();
    let healed = Instant::now();
    let st = wait_converged(m, &**vol.fs.engine(), Duration::from_secs(60)).await;
    let took = healed.elapsed();
    let out_after =
        saw_out.expect("the mirror never reported being out of its window during the cut");
    assert!(
        out_after < Duration::from_secs(5),
        "out of window only reported after {out_after:?}"
    );
    assert_eq!(during["connected"], false, "{during}");
    assert!(
        during["lag_seconds"].as_f64().unwrap_or(f64::INFINITY) > 10.0,
        "lag must grow during a cut: {during}"
    );
    assert!(n(&st, "reconnects") >= 1);
    assert_eq!(st["within_window"], true, "{st}");
    assert_same(&vol.fs, m_meta, m_store).await;
    assert_same_journal(&**vol.fs.engine(), &*open_ro(m_meta).await).await;
    eprintln!("partition: out of window after {out_after:?}; {committed} operations; converged {took:?} after the link came back; lag at the end of the cut: {} s", during["lag_seconds"]);
}

/// Through the harness proxy adding 50 ms each way and a 200 ms stall on 1% of chunks (what a
/// lost segment costs TCP), replication keeps up and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wan_delay_and_loss_converge() {
    let s = setup_with(
        "rocksdb",
        "rocksdb",
        "",
        "",
        |_| {},
        Some((Duration::from_millis(50), 10)),
    )
    .await;
    let t0 = Instant::now();
    let committed = workload(&s.vol.fs, 4_000, 4, None).await;
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(120)).await;
    assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    assert_same_journal(&**s.vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    assert_eq!(st["within_window"], true, "{st}");
    eprintln!("wan: {committed} operations through 50 ms each way + 1% stalls, converged {:?} after start", t0.elapsed());
}

/// Two mirrors follow one primary. One stops; past `retain_max_age` its slot alone is
/// dropped, the other keeps replicating; the stopped one comes back, resyncs, and both end
/// equal to the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_mirrors_and_the_age_cap() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("postgres", "file", |s| s.journal_retention_secs = 0).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let env = [("MIRROR_TOKEN", TOKEN)];
    let p_admin = format!("127.0.0.1:{}", free_port());
    let ptoml = primary_toml(
        &vol.meta_url,
        &dir.path().join("ps"),
        &p_admin,
        &listen,
        &["east", "west"],
        "retain_max_age = \"3s\"",
    );
    let primary = Agent::start(dir.path(), "primary", &ptoml, &env);
    let mut mirrors = Vec::new();
    for (name, engine) in [("east", "rocksdb"), ("west", "redis")] {
        let (meta, d1) = meta_url(engine);
        let (store, d2) = store_url("file");
        let admin = format!("127.0.0.1:{}", free_port());
        let t = mirror_toml(
            &meta,
            &dir.path().join(name),
            &admin,
            name,
            &listen,
            &store,
            "",
        );
        mirrors.push((
            Agent::start(dir.path(), name, &t, &env),
            meta,
            store,
            d1,
            d2,
        ));
    }
    workload(&vol.fs, 500, 1, None).await;
    for (m, meta, store, ..) in &mirrors {
        wait_converged(m, &**vol.fs.engine(), Duration::from_secs(60)).await;
        assert_same(&vol.fs, meta, store).await;
    }
    assert_eq!(mirrors[1].0.term(), 0);
    // Writes go on; west's oldest unacknowledged entry ages past 3 s.
    let t0 = Instant::now();
    let mut i = 0;
    let ps = loop {
        workload(&vol.fs, 50, 100 + i, None).await;
        i += 1;
        let ps = primary.status();
        let state = |name: &str| {
            ps["mirrors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == name)
                .unwrap()["state"]
                .clone()
        };
        if state("west") == "needs_resync" {
            assert_eq!(state("east"), "active", "{ps}");
            break ps;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "west's slot was not dropped by age: {ps}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let west = ps["mirrors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "west")
        .unwrap()
        .clone();
    assert!(
        west["reason"].as_str().unwrap().contains("retain_max_age"),
        "{west}"
    );
    // East kept up all along.
    wait_converged(&mirrors[0].0, &**vol.fs.engine(), Duration::from_secs(60)).await;
    mirrors[1].0.restart();
    workload(&vol.fs, 300, 999, None).await;
    for (m, meta, store, ..) in &mirrors {
        wait_converged(m, &**vol.fs.engine(), Duration::from_secs(120)).await;
        assert_same(&vol.fs, meta, store).await;
    }
    assert!(mirrors[1].0.log_text().contains("requires a resync"));
    assert_eq!(
        mirrors[0]
            .0
            .log_text()
            .matches("snapshot installed")
            .count(),
        1,
        "east never resynced"
    );
}

/// Blocks come from an S3 origin (Ceph RGW) through the harness proxy, which flips bytes in
/// some responses: the blocks' recorded CRC32C (or the HTTP layer) rejects the damaged reads,
/// the copies are retried from the queue, and every block at the mirror is the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_block_reads_from_an_s3_origin_are_rejected_and_retried() {
    let (vol, proxy, origin) = s3_volume_behind_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("origin_store = \"{origin}\"\nworkers = 4");
    let pair = Pair::start(dir.path(), &vol.meta_url, "rocksdb", None, "", &extra).await;
    wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    proxy.corrupt_min.store(16 << 10, Ordering::SeqCst); // response bodies, not headers
    proxy.corrupt.store(8, Ordering::SeqCst);
    write_files(&vol.fs, "b", 6, 3 << 20).await;
    let st = wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(120)).await;
    assert!(
        proxy.corrupt.load(Ordering::SeqCst) < 8,
        "the proxy damaged nothing"
    );
    assert!(
        n(&st, "blocks.copy_errors") >= 1,
        "no damaged read was rejected: {st}"
    );
    assert!(
        n(&st, "blocks.checksummed") >= 6,
        "no checksum checks: {st}"
    );
    let files = assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await;
    assert_eq!(files, 6);
    eprintln!(
        "damaged origin reads: {} rejected, {} checksummed, mismatch logged: {}",
        n(&st, "blocks.copy_errors"),
        n(&st, "blocks.checksummed"),
        pair.mirror.log_text().contains("fails its checksum")
    );
}

/// A `file://` origin has no entity tags: the copier checks each block against the CRC32C its
/// slice recorded. A block damaged at rest (same length) is refused and kept in the queue,
/// never copied; once whole it is copied, and the mirror equals the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_block_at_a_file_origin_is_refused_by_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let pair = Pair::start(
        dir.path(),
        &vol.meta_url,
        "rocksdb",
        None,
        "",
        "bwlimit = \"1\"",
    )
    .await;
    write_files(&vol.fs, "c", 2, 5 << 20).await;
    let (ino, _) = vol.fs.resolve("/c0").await.unwrap();
    let id = vol.fs.chunks(ino).await.unwrap()[0].1[0].id;
    let key = fs_core::keys::block_key(&vol.fs.settings().name, id, 0, 4 << 20);
    integration::mountproc::flip_bit(&vol.store_url, &key, 777);
    pair.mirror.set_limits(&["--bwlimit", "off"]);
    let st = status_until(&pair.mirror, Duration::from_secs(60), |st| {
        n(st, "blocks.pending") == 1 && n(st, "blocks.failing") == 1
    })
    .await;
    assert!(
        st["blocks"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(&key) && e.contains("fails its checksum")),
        "{st}"
    );
    let m_path = std::path::Path::new(pair.m_store.trim_start_matches("file://")).join(&key);
    assert!(!m_path.exists(), "a damaged block was copied");
    integration::mountproc::flip_bit(&vol.store_url, &key, 777);
    let st = wait_converged(&pair.mirror, &**vol.fs.engine(), Duration::from_secs(120)).await;
    assert_eq!(assert_same(&vol.fs, &pair.m_meta, &pair.m_store).await, 2);
    assert!(n(&st, "blocks.checksummed") >= 4, "{st}");
}

/// While a mirror bootstraps its tree is incomplete: `jfs` refuses to read it, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_are_fenced_off_a_bootstrapping_mirror() {
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    workload(&vol.fs, 50, 1, None).await;
    let e = vol.fs.engine();
    // What the agent writes at the mirror's metadata for the time of a snapshot install.
    e.aux_put(
        fs_core::slots::MIRROR_INCOMPLETE,
        Some(b"snapshot at seq 7 being installed"),
    )
    .await
    .unwrap();
    let ls = || {
        Command::new(bin("jfs"))
            .args(["ls", &vol.meta_url, "/"])
            .output()
            .unwrap()
    };
    let out = ls();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bootstrapping") && err.contains("seq 7") && err.lines().count() == 1,
        "{err}"
    );
    e.aux_put(fs_core::slots::MIRROR_INCOMPLETE, None)
        .await
        .unwrap();
    assert!(ls().status.success());
    // Aux records are not part of the volume: a dump does not carry them.
    let d = serde_json::to_string(&fs_core::maint::dump(&**e).await.unwrap()).unwrap();
    assert!(!d.contains("being installed"));
}

/// Something other than the agent writes to a mirror's metadata (a Redis mirror is reachable
/// by anyone with its password): the histories part at that entry. The primary notices on
/// reconnect (the mirror's frame at its head differs), says so, and the mirror resyncs
/// instead of silently skipping the primary's entry with the same number.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_write_at_the_mirror_is_caught_and_resynced() {
    let mut s = setup("rocksdb", "redis", "", "").await;
    workload(&s.vol.fs, 200, 1, None).await;
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(s.pair.mirror.term(), 0);
    // Writers are refused at a mirror's metadata: its engine fences the commit itself.
    let m_engine = integration::open_engine(&s.m_meta).await;
    let mfs = fs_core::Fs::open(m_engine.clone(), integration::open_store(&s.m_store))
        .await
        .unwrap();
    let o = fs_core::Owner { uid: 0, gid: 0 };
    let e = mfs
        .mkdir(fs_core::ROOT_INO, b"refused", 0o755, o)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), fs_core::ErrorKind::ReadOnly, "{e}");
    assert!(e.to_string().contains("mirror \"m1\""), "{e}");
    // Something that bypasses the fence (raw access to the Redis database: the marker taken
    // away, a commit, the marker put back) still parts the histories: a foreign commit at the
    // mirror, and one at the primary, both at the same next seq.
    let marker = fs_core::site::marker(&*m_engine)
        .await
        .unwrap()
        .expect("marked");
    m_engine.aux_put(fs_core::site::MARKER, None).await.unwrap();
    mfs.mkdir(fs_core::ROOT_INO, b"foreign", 0o755, o)
        .await
        .unwrap();
    s.vol
        .fs
        .mkdir(fs_core::ROOT_INO, b"primary-side", 0o755, o)
        .await
        .unwrap();
    // Bring both heads to the same seq (an id-batch allocation may add an entry on one side).
    let touch = fs_core::SetAttr {
        mtime: Some(1),
        ..Default::default()
    };
    loop {
        let mh = mfs.engine().journal_bounds().await.unwrap().last;
        let ph = s.vol.fs.engine().journal_bounds().await.unwrap().last;
        match mh.cmp(&ph) {
            std::cmp::Ordering::Equal => break,
            std::cmp::Ordering::Less => mfs
                .setattr(fs_core::ROOT_INO, &touch)
                .await
                .map(|_| ())
                .unwrap(),
            std::cmp::Ordering::Greater => s
                .vol
                .fs
                .setattr(fs_core::ROOT_INO, &touch)
                .await
                .map(|_| ())
                .unwrap(),
        }
    }
    fs_core::site::set_marker(&*m_engine, &marker)
        .await
        .unwrap();
    drop(mfs);
    s.pair.mirror.restart();
    let t0 = Instant::now();
    while s.mirror.log_text().matches("snapshot installed").count() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no resync: {}",
            tail(&s.mirror.log_text(), 10)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(60)).await;
    assert!(
        s.primary.log_text().contains("a mirror's history differs"),
        "{}",
        tail(&s.primary.log_text(), 10)
    );
    assert!(s.mirror.log_text().contains("requires a resync"));
    tokio::time::sleep(Duration::from_millis(300)).await; // status is refreshed every 100 ms
    let st = s.mirror.status();
    assert_eq!(st["needs_resync"], false);
    assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
}

/// The mirror's disk fills up (metadata, agent state and block store on a small tmpfs): the
/// mirror stops advancing and says why, loses nothing, and converges once space is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_at_the_mirror_stalls_then_recovers() {
    let mnt = tempfile::tempdir().unwrap();
    let m = mnt.path().display().to_string();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256m", "tmpfs", &m])
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    struct Umount(String);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _u = Umount(m.clone());
    let dir = tempfile::tempdir().unwrap();
    let vol = volume_with("rocksdb", "file", |_| {}).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let env = [("MIRROR_TOKEN", TOKEN)];
    let p_admin = format!("127.0.0.1:{}", free_port());
    let _p = Agent::start(
        dir.path(),
        "primary",
        &primary_toml(
            &vol.meta_url,
            &dir.path().join("ps"),
            &p_admin,
            &listen,
            &["m1"],
            "",
        ),
        &env,
    );
    let (m_meta, m_store) = (format!("rocksdb://{m}/meta"), format!("file://{m}/store"));
    let m_admin = format!("127.0.0.1:{}", free_port());
    let mirror = Agent::start(
        dir.path(),
        "mirror",
        &mirror_toml(
            &m_meta,
            &mnt.path().join("state"),
            &m_admin,
            "m1",
            &listen,
            &m_store,
            "",
        ),
        &env,
    );
    workload(&vol.fs, 300, 1, None).await;
    wait_converged(&mirror, &**vol.fs.engine(), Duration::from_secs(60)).await;
    // Fill the disk, then write at the primary.
    let filler = mnt.path().join("filler");
    let _ = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", filler.display()),
            "bs=1M",
            "count=400",
        ])
        .output();
    let t0 = Instant::now();
    write_files(&vol.fs, "full", 20, 1 << 20).await;
    workload(&vol.fs, 500, 2, None).await;
    let stalled = loop {
        let st = mirror.status();
        let err = format!("{} {}", st["last_error"], st["blocks"]["last_error"]);
        if err.contains("No space left") || err.contains("disk full") || err.contains("ENOSPC") {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no disk-full error reported: {st}\n{}",
            tail(&mirror.log_text(), 20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Whatever hit the full disk (metadata apply or block copies) waits in place: nothing was
    // marked done.
    assert!(
        n(&stalled, "blocks.pending") > 0 || stalled["connected"] == false,
        "{stalled}"
    );
    std::fs::remove_file(&filler).unwrap();
    let st = wait_converged(&mirror, &**vol.fs.engine(), Duration::from_secs(120)).await;
    assert_same(&vol.fs, &m_meta, &m_store).await;
    assert_same_journal(&**vol.fs.engine(), &*open_ro(&m_meta).await).await;
    // Failed writes left no temp files behind (they would keep the disk full).
    let left = std::fs::read_dir(mnt.path().join("store/.jfs-tmp"))
        .unwrap()
        .count();
    assert_eq!(
        left, 0,
        "{left} temp files of failed writes were left in .jfs-tmp"
    );
    eprintln!(
        "full disk: stalled ({} / {}); recovered with {} copy errors retried, {} blocks copied",
        stalled["last_error"],
        stalled["blocks"]["last_error"],
        n(&st, "blocks.copy_errors"),
        n(&st, "blocks.copied")
    );
}

/// `mirror-agent resync` of a mirror that serves a consistent state, killed with -9 during
/// the staged install or catch-up, three times, while the primary keeps writing: the live
/// metadata is never fenced or reset (it keeps its previous state until the switch), and the
/// mirror ends exactly equal to the primary, key space and journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_staged_resync_survives_kill_9_and_never_fences_the_live_metadata() {
    use rand::Rng;
    let mut s = setup("rocksdb", "postgres", "", "").await;
    workload(&s.vol.fs, 1_000, 1, None).await;
    // A larger tree, so that the staged phases last long enough to be killed in.
    let o = fs_core::Owner { uid: 0, gid: 0 };
    let (bulk, _) = s
        .vol
        .fs
        .mkdir(fs_core::ROOT_INO, b"bulk", 0o755, o)
        .await
        .unwrap();
    let mut makers = Vec::new();
    for w in 0..8u64 {
        let fs = s.vol.client().await;
        makers.push(tokio::spawn(async move {
            for j in (w..20_000).step_by(8) {
                fs.create(bulk, format!("b-{j}").as_bytes(), 0o644, o)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in makers {
        t.await.unwrap();
    }
    wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(120)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (fs2, st2) = (s.vol.client().await, stop.clone());
    let w = tokio::spawn(async move { workload(&fs2, 1_000_000, 2, Some(&st2)).await });
    // Fast metadata writers too: entries pile up during a snapshot, so the catch-up after
    // it lasts long enough to be killed in.
    let mut writers = Vec::new();
    for k in 0..6u64 {
        let (fs, stop) = (s.vol.client().await, stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                fs.create(bulk, format!("n-{k}-{n}").as_bytes(), 0o644, o)
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let live = open_ro(&s.m_meta).await;
    // An operator's mistakes: the primary's address, no token, a wrong token.
    let resync = |admin: &str, token: Option<&str>| {
        let mut c = Command::new(bin("mirror-agent"));
        c.args(["resync", "--admin", admin])
            .env_remove("MIRROR_AGENT_ADMIN_TOKEN");
        if let Some(t) = token {
            c.env("MIRROR_AGENT_ADMIN_TOKEN", t);
        }
        c.output().unwrap()
    };
    let o = resync(&s.primary.admin, Some("whatever"));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is a primary agent"),
        "{o:?}"
    );
    let o = resync(&s.mirror.admin, None);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("needs the agent's admin token"),
        "{o:?}"
    );
    let o = resync(&s.mirror.admin, Some("not-the-token"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("wrong admin token"),
        "{o:?}"
    );
    assert!(
        s.mirror.status()["bootstrap"].is_null(),
        "a refused request started a resync"
    );
    let mut kills = Vec::new();
    for round in 0..3 {
        // (After a kill during the install, the restarted agent installs again by itself.)
        let out = s.pair.mirror.admin_change("resync", &[]);
        assert!(
            out.contains("beside the live metadata") || out.contains("staged: true"),
            "{out}"
        );
        // Round 1 is killed in the catch-up (the staging reopened at the restart), the others
        // as soon as the resync is staged (mostly during the install).
        let st = status_until(&s.mirror, Duration::from_secs(60), |st| {
            st["resync"].is_object() && (round != 1 || st["bootstrap"]["CatchingUp"].is_object())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(0..400))).await;
        s.pair.mirror.kill9();
        kills.push(st["bootstrap"].to_string());
        assert_eq!(
            fs_core::slots::incomplete(&*live).await.unwrap(),
            None,
            "round {round}: the live metadata was fenced"
        );
        // The live metadata still holds a whole tree.
        let ls = Command::new(bin("jfs"))
            .args(["--block-store", &s.m_store, "ls", &s.m_meta, "/bulk"])
            .output()
            .unwrap();
        assert!(
            ls.status.success() && String::from_utf8_lossy(&ls.stdout).lines().count() > 19_000,
            "round {round}: jfs ls at the mirror: {}",
            String::from_utf8_lossy(&ls.stderr)
        );
        s.pair.mirror.restart();
    }
    stop.store(true, Ordering::SeqCst);
    let mut ops = w.await.unwrap();
    for t in writers {
        ops += t.await.unwrap();
    }
    let st = wait_converged(&s.mirror, &**s.vol.fs.engine(), Duration::from_secs(180)).await;
    assert!(st["resync"].is_null(), "{st}");
    // The restart after the kill in the catch-up went on with the staging it had.
    assert!(kills[1].contains("CatchingUp"), "{kills:?}");
    assert!(!s.mirror.log_text().contains("the resync staging is gone"));
    let files = assert_same(&s.vol.fs, &s.m_meta, &s.m_store).await;
    assert_same_journal(&**s.vol.fs.engine(), &*open_ro(&s.m_meta).await).await;
    assert!(
        s.mirror.log_text().contains("switched the live metadata"),
        "{}",
        tail(&s.mirror.log_text(), 20)
    );
    assert!(
        !s.mirror.log_text().contains("being installed\""),
        "an install in place happened"
    );
    eprintln!("staged resync killed at {kills:?}; {ops} operations meanwhile; {files} files equal");
}

/// `mirror-agent CMD ARGS` with `env`, stopped by PID if it is still running after 60 s (a
/// start that should have been refused); its output.
fn agent_cmd(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    use std::process::Stdio;
    let mut c = Command::new(bin("mirror-agent"));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The refusal in `o` after the config's name (`run` says "config file PATH: ...",
/// `check-config` "PATH: ..."), which must exist.
fn refusal(o: &std::process::Output, cfg: &std::path::Path) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success() && o.status.code() == Some(2),
        "expected a refusal (exit 2), got {:?}: {err}",
        o.status.code()
    );
    let at = format!("{}: ", cfg.display());
    let i = err
        .find(&at)
        .unwrap_or_else(|| panic!("the refusal does not name {}: {err}", cfg.display()));
    err[i + at.len()..].trim().to_string()
}

/// Issue 25, item 11: every refusal of `run` before it starts is a refusal of
/// `check-config --connect`, in the same words (one function makes both), and at a mirror
/// `check-config --connect` also tries the primary: nothing answering, or a wrong token, is
/// an error there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_refusal_of_run_is_a_refusal_of_check_config_connect() {
    let mut site = setup("rocksdb", "rocksdb", "", "").await;
    let d = site.dir.path().to_path_buf();
    wait_converged(
        &site.mirror,
        &**site.vol.fs.engine(),
        Duration::from_secs(60),
    )
    .await;
    let (m_meta, m_store, listen) = (
        site.m_meta.clone(),
        site.m_store.clone(),
        site.listen.clone(),
    );
    let (p_meta, m_cfg, m_admin) = (
        site.vol.meta_url.clone(),
        site.mirror.cfg.clone(),
        site.mirror.admin.clone(),
    );
    let env = [("MIRROR_TOKEN", TOKEN), ("ADMIN_TOKEN", ADMIN_TOKEN)];
    let port = || format!("127.0.0.1:{}", free_port());
    let (fresh_redis, _) = meta_url("redis");
    fn s(p: &std::path::Path) -> &str {
        p.to_str().unwrap()
    }
    let both = |name: &str, toml: String, want: &str| {
        let cfg = d.join(format!("{name}.toml"));
        std::fs::write(&cfg, toml).unwrap();
        let c = s(&cfg);
        let check = refusal(
            &agent_cmd(&["check-config", "--config", c, "--connect"], &env),
            &cfg,
        );
        let run = refusal(&agent_cmd(&["run", "--config", c], &env), &cfg);
        assert!(check.contains(want), "{name}: check-config said {check:?}");
        assert_eq!(
            check, run,
            "{name}: run and check-config --connect disagree"
        );
    };
    let mirror = |meta: &str, state: &str, name: &str, primary: &str| {
        mirror_toml(meta, &d.join(state), &port(), name, primary, &m_store, "")
    };
    // A primary agent on a mirror's metadata, and on metadata with no volume.
    both(
        "primary-on-mirror",
        primary_toml(&m_meta, &d.join("p2s"), &port(), &port(), &["x"], ""),
        "is the metadata of mirror \"m1\"",
    );
    both(
        "primary-unformatted",
        primary_toml(&fresh_redis, &d.join("p3s"), &port(), &port(), &["x"], ""),
        "holds no formatted volume",
    );
    // A mirror agent on a primary's volume, and on another mirror's metadata.
    both(
        "mirror-on-primary",
        mirror(&p_meta, "m2s", "m2", &listen),
        "is not a mirror's metadata",
    );
    both(
        "mirror-on-other-mirror",
        mirror(&m_meta, "m3s", "m2", &listen),
        "is the metadata of mirror \"m1\", not \"m2\"",
    );
    // A second agent on a state directory in use.
    let mcfg = std::fs::read_to_string(&m_cfg).unwrap();
    both(
        "state-in-use",
        mcfg.replace(&m_admin, &port()),
        "in use by another mirror-agent",
    );
    // A state directory or RocksDB metadata on a disk without the room RocksDB sets aside at
    // open (issue 43: check-config said ok, then run refused).
    let small = integration::disk::SmallDisk::new(&d.join("small"), 40);
    both(
        "state-on-a-small-disk",
        mirror_toml(
            &fresh_redis,
            &small.0.join("st"),
            &port(),
            "m2",
            &listen,
            &m_store,
            "",
        ),
        "disk too small for the mirror agent's state",
    );
    both(
        "meta-on-a-small-disk",
        mirror_toml(
            &format!("rocksdb://{}/meta", small.0.display()),
            &d.join("m9s"),
            &port(),
            "m2",
            &listen,
            &m_store,
            "",
        ),
        "metadata disk too small",
    );
    // A second copy of mirror m1's metadata (a second agent with the name): the primary
    // refuses it, as it refuses that agent (issue 43, item 9).
    let second = d.join("second.toml");
    std::fs::write(&second, mirror(&fresh_redis, "m7s", "m1", &listen)).unwrap();
    let o = agent_cmd(&["check-config", "--config", s(&second), "--connect"], &env);
    assert!(
        refusal(&o, &second).contains("held by another copy of its metadata"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // At a mirror, check-config --connect reaches the primary: a good config (this mirror's
    // own metadata, as a restarted agent would use it) passes...
    let good = d.join("good.toml");
    std::fs::write(&good, mirror(&m_meta, "m4s", "m1", &listen)).unwrap();
    let o = agent_cmd(&["check-config", "--config", s(&good), "--connect"], &env);
    assert!(
        o.status.success()
            && String::from_utf8_lossy(&o.stdout).contains("the primary agent reached"),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // ...a wrong token or a primary that does not answer do not.
    let o = agent_cmd(
        &["check-config", "--config", s(&good), "--connect"],
        &[
            (
                "MIRROR_TOKEN",
                "3e8b1d6f0a4c9e2b7d5f1a8c3e6b0d4f9a2c7e5b1d8f3a6c0e4b9d2f7a5c1e8b",
            ),
            env[1],
        ],
    );
    assert!(
        refusal(&o, &good).contains("authentication failed"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let nowhere = port();
    let bad = d.join("bad-primary.toml");
    std::fs::write(&bad, mirror(&fresh_redis, "m5s", "m1", &nowhere)).unwrap();
    let o = agent_cmd(&["check-config", "--config", s(&bad), "--connect"], &env);
    assert!(
        refusal(&o, &bad).contains(&nowhere),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A detached mirror's metadata.
    assert_eq!(site.pair.mirror.term(), 0);
    let o = Command::new(bin("mirror-agent"))
        .args(["detach", "--config", s(&m_cfg)])
        .env("MIRROR_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    both(
        "mirror-on-detached",
        mirror(&m_meta, "m6s", "m1", &listen),
        "was mirror \"m1\" and was detached",
    );
}

/// Issue 25, item 8: a queued copy whose slice is gone from the mirror's metadata (freed,
/// then purged by gc: nothing references it, nothing ever will) leaves the queue, and the
/// mirror reports converged. Such an item outlives its slice when its cancel never reached
/// the queue, as in a state directory older than the metadata: written here as the agent
/// writes queue items (state format 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_copy_of_a_freed_slice_leaves_the_queue() {
    use fs_core::{Owner, ROOT_INO};
    let mut s = setup_with(
        "redis",
        "rocksdb",
        "",
        "",
        |st| {
            st.trash_secs = 0;
            // The primary agent's metadata backups would hold the frees too (gc's other
            // rule, tested in recover.rs): this test is about the mirrors' hold.
            st.backup = Some(fs_core::maint::backup::BackupSettings {
                enabled: false,
                ..Default::default()
            });
        },
        None,
    )
    .await;
    let fs = &s.vol.fs;
    let o = Owner { uid: 0, gid: 0 };
    let (ino, _) = fs.create(ROOT_INO, b"gone", 0o644, o).await.unwrap();
    fs.write(ino, 0, &integration::data(1, 300_000))
        .await
        .unwrap();
    // Its blocks, as the mirror queues them.
    let settings = fs_core::Fs::load_settings(&**fs.engine()).await.unwrap();
    let chunk = fs
        .engine()
        .get(&fs_core::keys::chunk(ino, 0))
        .await
        .unwrap()
        .unwrap();
    let mut blocks = Vec::new();
    for r in fs_core::SliceRec::decode_list(&chunk).unwrap() {
        blocks.extend(fs_core::keys::slice_block_keys(
            &settings.name,
            r.id,
            r.size,
            settings.block_size,
        ));
    }
    assert!(!blocks.is_empty());
    wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
    // Freed, then purged once the mirror has applied the free.
    fs.unlink(ROOT_INO, b"gone").await.unwrap();
    let t0 = Instant::now();
    loop {
        wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
        let out = Command::new(bin("jfs"))
            .args(["gc", &s.vol.meta_url, "--delete", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if n(&r, "pending_purged") >= 1 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "gc never purged: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
    assert_eq!(s.pair.mirror.term(), 0);
    // The agent's queue holds copies of that slice again (format 2: version byte, then
    // postcard `QItem { len, attempts: 0, next_ns: 0 }`).
    {
        let db = rocksdb::DB::open_default(s.dir.path().join("mstate").join("agent.db")).unwrap();
        for (key, len) in &blocks {
            let mut v = vec![2u8];
            let mut l = *len;
            while l >= 0x80 {
                v.push((l as u8) | 0x80);
                l >>= 7;
            }
            v.push(l as u8);
            v.extend([0, 0]);
            db.put(format!("q/{key}"), v).unwrap();
        }
    }
    s.pair.mirror.restart();
    wait_converged(&s.mirror, &**fs.engine(), Duration::from_secs(60)).await;
    let st = status_until(&s.mirror, Duration::from_secs(60), |st| {
        n(st, "blocks.dropped") == blocks.len() as u64
    })
    .await;
    assert_eq!(n(&st, "blocks.pending"), 0, "{st}");
    assert_eq!(n(&st, "blocks.failing"), 0, "{st}");
    assert!(
        s.mirror.log_text().contains("is not needed any more"),
        "{}",
        tail(&s.mirror.log_text(), 20)
    );
    assert_same(fs, &s.m_meta, &s.m_store).await;
}
