//! Harness for mirror-agent tests: agents as separate processes (config files, tokens in the
//! environment, kill -9 / SIGTERM by PID), a mixed file-system workload, convergence checks
//! (dumps equal, every file byte-identical through the mirror's store), and a small TCP
//! proxy that delays, stalls, corrupts or cuts traffic (this kernel has no netem).

use fs_core::{Engine, Fs, Owner, SetAttr, ROOT_INO};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "test-token-5f1c2a9e8b7d6c3f";
/// The admin token of the agents the harness starts (`admin_token_env = "ADMIN_TOKEN"`).
pub const ADMIN_TOKEN: &str = "admin-token-0c9a7e5b3d1f2468";

/// A port for an agent to listen on, below the kernel's ephemeral range (32768 and up): a
/// port from `bind(:0)` comes from that range, and an outgoing connection of a test running
/// beside could take it before the agent binds it.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let p = 20_000 + rand::random::<u16>() % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in 20000..32000");
}

pub struct Agent {
    pub child: Option<Child>,
    pub admin: String,
    pub cfg: PathBuf,
    pub log: PathBuf,
    envs: Vec<(String, String)>,
    prefix: Vec<String>,
}

impl Agent {
    /// Write `toml` to `dir/<name>.toml` and start `mirror-agent run` on it.
    pub fn start(dir: &Path, name: &str, toml: &str, envs: &[(&str, &str)]) -> Agent {
        Self::start_with(dir, name, toml, envs, &[])
    }

    /// Same, with the command run under `prefix` (e.g. `ip netns exec NS`).
    pub fn start_with(
        dir: &Path,
        name: &str,
        toml: &str,
        envs: &[(&str, &str)],
        prefix: &[&str],
    ) -> Agent {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(&cfg, toml).expect("write config");
        let admin = toml
            .lines()
            .find_map(|l| l.strip_prefix("admin = "))
            .expect("config has admin")
            .trim_matches('"')
            .to_string();
        let mut a = Agent {
            child: None,
            admin,
            cfg,
            log: dir.join(format!("{name}.log")),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
        };
        a.restart();
        a
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "agent already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut cmd = self.beside(crate::bin("mirror-agent").as_os_str());
        cmd.arg("run")
            .arg("--config")
            .arg(&self.cfg)
            .env(
                "JFS_LOG",
                std::env::var("AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log);
        cmd.env("ADMIN_TOKEN", ADMIN_TOKEN);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn mirror-agent"));
        let t0 = Instant::now();
        while self.try_status().is_none() {
            if let Some(st) = self
                .child
                .as_mut()
                .expect("child")
                .try_wait()
                .expect("wait")
            {
                panic!(
                    "mirror-agent exited with {st} at start; log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "agent did not serve /status in 30 s; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An agent started elsewhere (by the test itself), for its status and log only.
    pub fn attach(admin: &str, log: &Path) -> Agent {
        Agent {
            child: None,
            admin: admin.to_string(),
            cfg: PathBuf::new(),
            log: log.to_path_buf(),
            envs: Vec::new(),
            prefix: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (at most 60 s); the exit code.
    pub fn term(&mut self) -> i32 {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                return st.code().unwrap_or(-1);
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = c.kill();
                panic!("agent ignored SIGTERM for 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A command run beside the agent (inside its network namespace, if any).
    fn beside(&self, program: &std::ffi::OsStr) -> Command {
        if self.prefix.is_empty() {
            Command::new(program)
        } else {
            let mut c = Command::new(&self.prefix[0]);
            c.args(&self.prefix[1..]).arg(program);
            c
        }
    }

    pub fn try_status(&self) -> Option<Value> {
        let out = self
            .beside(crate::bin("mirror-agent").as_os_str())
            .args(["status", "--json", "--admin", &self.admin])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.get("role")?;
        Some(v)
    }

    pub fn status(&self) -> Value {
        self.try_status()
            .unwrap_or_else(|| panic!("no status from {}; log:\n{}", self.admin, self.log_text()))
    }

    pub fn metrics(&self) -> String {
        let out = self
            .beside(std::ffi::OsStr::new("curl"))
            .args(["-sf", &format!("http://{}/metrics", self.admin)])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn n(v: &Value, path: &str) -> u64 {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    cur.as_u64()
        .unwrap_or_else(|| panic!("status field {path} missing in {v}"))
}

pub fn primary_toml(
    meta: &str,
    state: &Path,
    admin: &str,
    listen: &str,
    mirrors: &[&str],
    extra: &str,
) -> String {
    let mut s = format!(
        "role = \"primary\"\nmeta = \"{meta}\"\nstate_dir = \"{}\"\nadmin = \"{admin}\"\nadmin_token_env = \"ADMIN_TOKEN\"\n[primary]\nlisten = \"{listen}\"\ntrim_interval = \"1s\"\n{extra}\n",
        state.display()
    );
    for m in mirrors {
        s += &format!("[[primary.mirrors]]\nname = \"{m}\"\ntoken_env = \"MIRROR_TOKEN\"\n");
    }
    s
}

#[allow(clippy::too_many_arguments)]
pub fn mirror_toml(
    meta: &str,
    state: &Path,
    admin: &str,
    name: &str,
    primary: &str,
    store: &str,
    extra: &str,
) -> String {
    format!(
        "role = \"mirror\"\nmeta = \"{meta}\"\nstate_dir = \"{}\"\nadmin = \"{admin}\"\nadmin_token_env = \"ADMIN_TOKEN\"\n[mirror]\nname = \"{name}\"\nprimary = \"{primary}\"\ntoken_env = \"MIRROR_TOKEN\"\nstore = \"{store}\"\n{extra}\n",
        state.display()
    )
}

/// A random mix of file-system operations on a handful of directories: creates with data,
/// overwrites, appends, truncates, renames (with replace), unlinks, hard links, symlinks,
/// setattr, mkdir. Operations that fail (a name already gone...) commit nothing. Returns
/// how many committed.
pub async fn workload(fs: &Fs, ops: usize, seed: u64, stop: Option<&AtomicBool>) -> u64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let o = Owner { uid: 0, gid: 0 };
    let tag = format!("w{seed}");
    let top = match fs.mkdir(ROOT_INO, tag.as_bytes(), 0o755, o).await {
        Ok((i, _)) => i,
        Err(_) => {
            fs.lookup(ROOT_INO, tag.as_bytes())
                .await
                .expect("workload dir")
                .0
        }
    };
    let mut dirs = vec![top];
    for d in 0..4 {
        dirs.push(
            fs.mkdir(top, format!("d{d}").as_bytes(), 0o755, o)
                .await
                .expect("mkdir")
                .0,
        );
    }
    let mut ok = 0u64;
    for i in 0..ops {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
        let d = dirs[rng.random_range(0..dirs.len())];
        let name = format!("f{}", rng.random_range(0..24));
        let r: fs_core::Result<()> = async {
            match rng.random_range(0..100) {
                0..=24 => {
                    let (ino, _) = match fs.lookup(d, name.as_bytes()).await {
                        Ok(x) => x,
                        Err(_) => fs.create(d, name.as_bytes(), 0o644, o).await?,
                    };
                    let len = if rng.random_range(0..100) == 0 {
                        rng.random_range(1 << 20..5 << 20)
                    } else {
                        rng.random_range(1..20_000)
                    };
                    fs.write(ino, 0, &crate::data(seed * 1_000_003 + i as u64, len))
                        .await
                }
                25..=39 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let off = if rng.random_bool(0.5) {
                        a.length
                    } else {
                        rng.random_range(0..=a.length)
                    };
                    fs.write(
                        ino,
                        off,
                        &crate::data(seed ^ i as u64, rng.random_range(1..10_000)),
                    )
                    .await
                }
                40..=47 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let len = rng.random_range(0..=a.length + 5000);
                    fs.setattr(
                        ino,
                        &SetAttr {
                            length: Some(len),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ())
                }
                48..=59 => {
                    let d2 = dirs[rng.random_range(0..dirs.len())];
                    let n2 = format!("f{}", rng.random_range(0..24));
                    fs.rename(d, name.as_bytes(), d2, n2.as_bytes(), false)
                        .await
                }
                60..=71 => {
                    let (_, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind == fs_core::FileKind::Dir {
                        return Ok(());
                    }
                    fs.unlink(d, name.as_bytes()).await
                }
                72..=79 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let d2 = dirs[rng.random_range(0..dirs.len())];
                    fs.link(ino, d2, format!("f{}", rng.random_range(0..24)).as_bytes())
                        .await
                        .map(|_| ())
                }
                80..=87 => fs
                    .symlink(d, name.as_bytes(), format!("../t{i}").as_bytes(), o)
                    .await
                    .map(|_| ()),
                _ => {
                    let (ino, _) = fs.lookup(d, name.as_bytes()).await?;
                    let set = SetAttr {
                        mode: Some(0o600 | rng.random_range(0..0o100)),
                        mtime: Some(1_700_000_000_000_000_000 + i as i64),
                        ..Default::default()
                    };
                    fs.setattr(ino, &set).await.map(|_| ())
                }
            }
        }
        .await;
        if r.is_ok() {
            ok += 1;
        }
    }
    ok
}

/// Wait until the mirror has applied the primary's head and has no block copy pending.
pub async fn wait_converged(mirror: &Agent, primary: &dyn Engine, limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let head = primary.journal_bounds().await.expect("bounds").last;
        if let Some(s) = mirror.try_status() {
            // Every block of every applied entry queued, and the queue empty.
            if n(&s, "applied_seq") >= head
                && n(&s, "blocks.queued_through") >= head
                && n(&s, "blocks.pending") == 0
                && s["bootstrap"].is_null()
            {
                return s;
            }
            assert!(
                t0.elapsed() < limit,
                "no convergence in {limit:?}: primary head {head}, mirror status {s}\nlog:\n{}",
                tail(&mirror.log_text(), 40)
            );
        } else {
            assert!(
                t0.elapsed() < limit,
                "mirror status unavailable; log:\n{}",
                tail(&mirror.log_text(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Agent {
    /// `mirror-agent SUB --admin ADDR ARGS...` with the admin token, which must succeed; its
    /// output.
    pub fn admin_change(&self, sub: &str, args: &[&str]) -> String {
        let out = Command::new(crate::bin("mirror-agent"))
            .args([sub, "--admin", &self.admin])
            .args(args)
            .env("MIRROR_AGENT_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mirror-agent {sub} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `mirror-agent limits ARGS...`.
    pub fn set_limits(&self, args: &[&str]) {
        self.admin_change("limits", args);
    }
}

/// A volume on the test S3 server (Ceph RGW) and a harness proxy in front of it: the proxy
/// and the store URL through it (an origin whose link a test can cut or damage).
pub async fn s3_volume_behind_proxy() -> (crate::TestVol, Proxy, String) {
    let endpoint = std::env::var("JFS_TEST_S3_ENDPOINT")
        .expect("JFS_TEST_S3_ENDPOINT (run integration/test.sh)");
    let rgw = endpoint.trim_start_matches("http://").to_string();
    let proxy = Proxy::start(rgw, Duration::ZERO, 0).await;
    let vol = crate::volume_with("rocksdb", "s3", |_| {}).await;
    let origin = vol
        .store_url
        .replace(&endpoint, &format!("http://{}", proxy.addr));
    assert_ne!(origin, vol.store_url);
    (vol, proxy, origin)
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Open a mirror's metadata for reading (RocksDB: a secondary instance beside the agent).
pub async fn open_ro(url: &str) -> Arc<dyn Engine> {
    meta::open(
        url,
        &meta::OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("opening {url}: {e}"))
}

/// The mirror equals the primary: same dump, and every file reads back byte-identical
/// through the mirror's own store. Returns the number of files compared.
pub async fn assert_same(primary: &Fs, mirror_meta: &str, mirror_store: &str) -> usize {
    let m_engine = open_ro(mirror_meta).await;
    let pd = serde_json::to_value(
        fs_core::maint::dump(&**primary.engine())
            .await
            .expect("dump primary"),
    )
    .unwrap();
    let md =
        serde_json::to_value(fs_core::maint::dump(&*m_engine).await.expect("dump mirror")).unwrap();
    if pd != md {
        let (ps, ms) = (pd.to_string(), md.to_string());
        let at = ps
            .bytes()
            .zip(ms.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "dumps differ at byte {at}: primary …{}… mirror …{}…",
            &ps[at.saturating_sub(200)..(at + 200).min(ps.len())],
            &ms[at.saturating_sub(200)..(at + 200).min(ms.len())]
        );
    }
    let mfs = Fs::open(m_engine, crate::open_store(mirror_store))
        .await
        .expect("open mirror fs");
    let mut files = 0;
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        for e in primary.readdir_all(d).await.expect("readdir") {
            match e.kind {
                fs_core::FileKind::Dir => stack.push(e.ino),
                fs_core::FileKind::File => {
                    let a = crate::read_all(primary, e.ino).await;
                    let b = crate::read_all(&mfs, e.ino).await;
                    assert!(
                        a == b,
                        "file inode {} differs at the mirror ({} vs {} bytes)",
                        e.ino,
                        a.len(),
                        b.len()
                    );
                    files += 1;
                }
                _ => {}
            }
        }
    }
    files
}

/// Every journal entry the mirror holds is the primary's, byte for byte, in order, without a
/// gap (0 lost, 0 duplicated, 0 out of order). Returns (first, last) compared.
pub async fn assert_same_journal(primary: &dyn Engine, mirror: &dyn Engine) -> (u64, u64) {
    let mb = mirror.journal_bounds().await.expect("bounds");
    let pb = primary.journal_bounds().await.expect("bounds");
    assert_eq!(mb.last, pb.last, "mirror head differs from the primary's");
    // From where both hold entries (a promoted mirror's journal starts at its snapshot).
    let mut next = mb.first.max(pb.first);
    while next <= mb.last {
        let m = mirror
            .journal_read(next, 1000)
            .await
            .expect("mirror journal");
        let p = primary
            .journal_read(next, 1000)
            .await
            .expect("primary journal");
        assert!(!m.is_empty(), "mirror journal ends at {}", next - 1);
        for (i, (seq, f)) in m.iter().enumerate() {
            assert_eq!(*seq, next, "mirror journal gap or reorder at {next}");
            assert_eq!(p[i].0, *seq);
            assert!(
                p[i].1 == *f,
                "entry {seq} differs between primary and mirror"
            );
            next += 1;
        }
    }
    (mb.first.max(pb.first), mb.last)
}

/// A TCP proxy on loopback: forwards to `target`, holding every chunk `delay` in each
/// direction; with `stall_per_mille` a chunk waits 200 ms more (a lost segment's
/// retransmission); `cut` drops all connections and refuses new ones while set; `corrupt`
/// flips one byte of primary-to-mirror traffic while above zero (and counts down).
pub struct Proxy {
    pub addr: String,
    pub cut: Arc<AtomicBool>,
    pub corrupt: Arc<AtomicU64>,
    /// Only chunks at least this long are damaged (default 64; raise it to hit bodies only).
    pub corrupt_min: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(target: String, delay: Duration, stall_per_mille: u32) -> Proxy {
        Self::start_on("127.0.0.1", target, delay, stall_per_mille).await
    }

    /// Same, listening on `ip` (e.g. the root side of a namespace's link).
    pub async fn start_on(
        ip: &str,
        target: String,
        delay: Duration,
        stall_per_mille: u32,
    ) -> Proxy {
        let l = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let corrupt = Arc::new(AtomicU64::new(0));
        let corrupt_min = Arc::new(AtomicU64::new(64));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, k2, s2, m2) = (
            cut.clone(),
            corrupt.clone(),
            stop.clone(),
            corrupt_min.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = l.accept().await else {
                    continue;
                };
                if s2.load(Ordering::Relaxed) {
                    return;
                }
                if c2.load(Ordering::Relaxed) {
                    drop(down);
                    continue;
                }
                let Ok(up) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pipe(dr, uw, delay, stall_per_mille, c2.clone(), None));
                tokio::spawn(pipe(
                    ur,
                    dw,
                    delay,
                    stall_per_mille,
                    c2.clone(),
                    Some((k2.clone(), m2.clone())),
                ));
            }
        });
        Proxy {
            addr,
            cut,
            corrupt,
            corrupt_min,
            stop,
            task: Some(task),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    w: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    stall_per_mille: u32,
    cut: Arc<AtomicBool>,
    corrupt: Option<(Arc<AtomicU64>, Arc<AtomicU64>)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Chunks go through a queue with their due time, so delay adds latency, not a throughput cap.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let cut2 = cut.clone();
    let writer = tokio::spawn(async move {
        let mut w = w;
        while let Some((due, buf)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if cut2.load(Ordering::Relaxed) || w.write_all(&buf).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut last_due = tokio::time::Instant::now();
    loop {
        let n = tokio::select! {
            r = r.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
            _ = wait_cut(&cut) => break,
        };
        let mut chunk = buf[..n].to_vec();
        if let Some((c, min)) = &corrupt {
            if c.load(Ordering::Relaxed) > 0 && n as u64 >= min.load(Ordering::Relaxed) {
                c.fetch_sub(1, Ordering::Relaxed);
                let i = n / 2;
                chunk[i] ^= 0x5a;
            }
        }
        let mut due = tokio::time::Instant::now() + delay;
        if stall_per_mille > 0 && rand::random::<u32>() % 1000 < stall_per_mille {
            due += Duration::from_millis(200);
        }
        // Keep order: a chunk never overtakes the one before it.
        due = due.max(last_due);
        last_due = due;
        if tx.send((due, chunk)).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn wait_cut(cut: &AtomicBool) {
    while !cut.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two network namespaces joined by a veth pair (10.77.N.1 in `a`, 10.77.N.2 in `b`),
/// deleted on drop, also when a test fails.
pub struct NetPair {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    pub ip_b: String,
    veth_a: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (apt: iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetPair {
    /// `tag` keeps pairs of tests running at once apart (0..=9).
    pub fn new(tag: u32) -> NetPair {
        let id = (std::process::id() % 20) * 10 + tag + 20;
        let (a, b) = (format!("jfsA{id}"), format!("jfsB{id}"));
        let (va, vb) = (format!("jva{id}"), format!("jvb{id}"));
        let _ = Command::new("ip").args(["netns", "del", &a]).output();
        let _ = Command::new("ip").args(["netns", "del", &b]).output();
        ip(&["netns", "add", &a]);
        let pair = NetPair {
            a: a.clone(),
            b: b.clone(),
            ip_a: format!("10.77.{id}.1"),
            ip_b: format!("10.77.{id}.2"),
            veth_a: va.clone(),
        };
        ip(&["netns", "add", &b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &a]);
        ip(&["link", "set", &vb, "netns", &b]);
        ip(&[
            "-n",
            &a,
            "addr",
            "add",
            &format!("{}/24", pair.ip_a),
            "dev",
            &va,
        ]);
        ip(&[
            "-n",
            &b,
            "addr",
            "add",
            &format!("{}/24", pair.ip_b),
            "dev",
            &vb,
        ]);
        for (ns, dev) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }

    /// `ip netns exec NS` as a command prefix.
    pub fn exec(ns: &str) -> Vec<&str> {
        vec!["ip", "netns", "exec", ns]
    }

    /// Cut (down) or restore (up) the link.
    pub fn link(&self, up: bool) {
        ip(&[
            "-n",
            &self.a,
            "link",
            "set",
            &self.veth_a,
            if up { "up" } else { "down" },
        ]);
    }

    /// Run a command inside namespace `a` (e.g. `tc qdisc ...`).
    pub fn in_a(&self, args: &[&str]) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.a])
            .args(args)
            .output()
            .expect("ip netns exec");
        assert!(
            out.status.success(),
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn veth_a(&self) -> &str {
        &self.veth_a
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

/// A primary agent on a volume and a mirror agent (its own metadata on `m_engine`, its own
/// file store) on loopback, the mirror connecting through a harness [`Proxy`] when asked.
pub struct Pair {
    pub primary: Agent,
    pub mirror: Agent,
    pub proxy: Option<Proxy>,
    pub listen: String,
    pub m_meta: String,
    pub m_store: String,
    _keep: Vec<tempfile::TempDir>,
}

/// Where a [`Pair`] runs: loopback (optionally through a harness [`Proxy`]), or the primary
/// in namespace `a` and the mirror in namespace `b` of a [`NetPair`], on fixed ports.
pub enum Placement<'a> {
    Loopback { proxy: Option<(Duration, u32)> },
    Netns { net: &'a NetPair, port: u16 },
}

impl Pair {
    /// On loopback; `proxy`: (delay each way, stalls per mille). `*_extra`: TOML lines for
    /// the `[primary]` / `[mirror]` sections.
    pub async fn start(
        dir: &Path,
        meta: &str,
        m_engine: &str,
        proxy: Option<(Duration, u32)>,
        primary_extra: &str,
        mirror_extra: &str,
    ) -> Pair {
        Self::start_at(
            dir,
            meta,
            m_engine,
            Placement::Loopback { proxy },
            primary_extra,
            mirror_extra,
        )
        .await
    }

    pub async fn start_at(
        dir: &Path,
        meta: &str,
        m_engine: &str,
        at: Placement<'_>,
        primary_extra: &str,
        mirror_extra: &str,
    ) -> Pair {
        let env = [("MIRROR_TOKEN", TOKEN)];
        // (listen, primary admin, mirror admin, primary prefix, mirror prefix)
        let (listen, p_admin, m_admin, p_pre, m_pre) = match &at {
            Placement::Loopback { .. } => {
                let a = || format!("127.0.0.1:{}", free_port());
                (a(), a(), a(), vec![], vec![])
            }
            Placement::Netns { net, port } => (
                format!("{}:{port}", net.ip_a),
                format!("127.0.0.1:{}", port + 1),
                format!("127.0.0.1:{}", port + 2),
                NetPair::exec(&net.a),
                NetPair::exec(&net.b),
            ),
        };
        // Across namespaces the link is "a network": plaintext there is an explicit choice.
        let plain = if matches!(at, Placement::Netns { .. }) {
            "insecure_plaintext = true\n"
        } else {
            ""
        };
        let ptoml = primary_toml(
            meta,
            &dir.join("pstate"),
            &p_admin,
            &listen,
            &["m1"],
            &format!("{plain}{primary_extra}"),
        );
        let primary = Agent::start_with(dir, "primary", &ptoml, &env, &p_pre);
        let proxy = match at {
            Placement::Loopback {
                proxy: Some((d, stalls)),
            } => Some(Proxy::start(listen.clone(), d, stalls).await),
            _ => None,
        };
        let target = proxy.as_ref().map_or(listen.clone(), |p| p.addr.clone());
        let (m_meta, d1) = crate::meta_url(m_engine);
        let (m_store, d2) = crate::store_url("file");
        let mtoml = mirror_toml(
            &m_meta,
            &dir.join("mstate"),
            &m_admin,
            "m1",
            &target,
            &m_store,
            &format!("{plain}{mirror_extra}"),
        );
        let mirror = Agent::start_with(dir, "mirror", &mtoml, &env, &m_pre);
        Pair {
            primary,
            mirror,
            proxy,
            listen,
            m_meta,
            m_store,
            _keep: d1.into_iter().chain(d2).collect(),
        }
    }
}

/// Create `count` files `<prefix><i>` in the root, each holding `len` bytes of `data(i)`.
pub async fn write_files(fs: &Fs, prefix: &str, count: u64, len: usize) -> Vec<fs_core::Ino> {
    let o = Owner { uid: 0, gid: 0 };
    let mut inos = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i}");
        let (ino, _) = fs
            .create(ROOT_INO, name.as_bytes(), 0o644, o)
            .await
            .expect("create");
        fs.write(ino, 0, &crate::data(i, len)).await.expect("write");
        inos.push(ino);
    }
    inos
}

/// Poll an agent's status (every 100 ms, at most `limit`) until `ok` holds; the status then.
pub async fn status_until(a: &Agent, limit: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let st = a.status();
        if ok(&st) {
            return st;
        }
        assert!(
            t0.elapsed() < limit,
            "status never reached the expected state in {limit:?}: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn openssl(args: &[&str], dir: &std::path::Path) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA `<name>.crt`/`<name>.key`.
fn make_ca(dir: &std::path::Path, name: &str) {
    let (key, crt, subj) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN={name}"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
    openssl(&args, dir);
}

/// A CA (`ca.crt`), another CA (`other.crt`), and a server certificate for
/// `primary.test` signed by the first (`server.crt`, `server.key`), in `dir`.
pub fn make_certs(dir: &std::path::Path) {
    make_ca(dir, "ca");
    make_ca(dir, "other");
    openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=primary.test",
        ],
        dir,
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:primary.test\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
        dir,
    );
}
