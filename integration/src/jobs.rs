//! Shared `jfs-sync --job` runs as users run them: workers as separate processes with their
//! own state directories (as on separate hosts), a network namespace linked to this one for a
//! worker that can be cut off or throttled, and the job's status as JSON.

use crate::bin;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `jfs-sync SRC DST --job URL` process; its stdout and stderr go to files.
pub struct Worker {
    pub name: String,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
    pub code: Option<i32>,
}

impl Worker {
    /// `prefix`: a command to run it under (e.g. `ip netns exec NS`).
    pub fn start(dir: &Path, name: &str, prefix: &[&str], args: &[&str]) -> Worker {
        Self::start_with(dir, name, prefix, args, true)
    }

    /// `start`; without `own_state`, no `--state-dir` (the default one, as a user runs it),
    /// with XDG_CACHE_HOME in `dir` so that tests do not share it.
    pub fn start_with(
        dir: &Path,
        name: &str,
        prefix: &[&str],
        args: &[&str],
        own_state: bool,
    ) -> Worker {
        let (out, err) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.err")),
        );
        let state = dir.join(format!("state-{name}"));
        let mut c = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(bin("jfs-sync"));
                c
            }
            None => Command::new(bin("jfs-sync")),
        };
        c.args(args).args(["--worker", name, "--json"]);
        if own_state {
            c.args(["--state-dir", state.to_str().unwrap()]);
        } else {
            c.env("XDG_CACHE_HOME", dir.join("cache"));
        }
        c.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&err)
                    .unwrap(),
            );
        Worker {
            name: name.into(),
            child: Some(c.spawn().expect("start jfs-sync")),
            out,
            err,
            code: None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.code = Some(-9);
        }
    }

    /// Has it exited (its code recorded)?
    pub fn poll(&mut self) -> bool {
        if let Some(c) = &mut self.child {
            if let Ok(Some(st)) = c.try_wait() {
                self.code = st.code();
                self.child = None;
            }
        }
        self.child.is_none()
    }

    /// Wait up to `limit` for it to exit; killed (and the test failed) past that.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        while !self.poll() {
            if Instant::now() > end {
                self.kill9();
                panic!(
                    "worker {} did not finish within {limit:?}: {}",
                    self.name,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.code
    }

    pub fn stderr(&self) -> String {
        let s = std::fs::read_to_string(&self.err).unwrap_or_default();
        crate::mirror::tail(&s, 30)
    }

    /// The JSON report worker `name` (started in `dir`) printed last.
    pub fn report_of(dir: &Path, name: &str) -> Value {
        let s = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default();
        serde_json::from_str(s.lines().last().unwrap_or(""))
            .unwrap_or_else(|_| panic!("worker {name}: no JSON report: {s}"))
    }

    /// The JSON report it printed last.
    pub fn report(&self) -> Value {
        let s = std::fs::read_to_string(&self.out).unwrap_or_default();
        serde_json::from_str(s.lines().last().unwrap_or("")).unwrap_or_else(|_| {
            panic!(
                "worker {}: no JSON report: {s}\n{}",
                self.name,
                self.stderr()
            )
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `jfs-sync job status URL --json`.
pub fn status(url: &str) -> Value {
    let o = Command::new(bin("jfs-sync"))
        .args(["job", "status", url, "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "job status: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("status JSON")
}

/// `jfs-sync job SUB URL [ARGS]`, which must succeed.
pub fn job(sub: &str, url: &str, args: &[&str]) {
    let o = Command::new(bin("jfs-sync"))
        .args(["job", sub, url])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "job {sub}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (apt: iproute2)");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A network namespace joined to this one by a veth pair: `host_ip` on this side, `ns_ip`
/// inside. Deleted on drop (the pair goes with it), also when a test fails.
pub struct Ns {
    pub name: String,
    pub host_ip: String,
    pub ns_ip: String,
    host_dev: String,
    ns_dev: String,
}

impl Ns {
    /// `tag` keeps namespaces of tests running at once apart (0..=9).
    pub fn new(tag: u32) -> Ns {
        let id = (std::process::id() % 20) * 10 + tag + 20;
        let name = format!("jfsW{id}");
        let (hd, nd) = (format!("jwh{id}"), format!("jwn{id}"));
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let _ = Command::new("ip").args(["link", "del", &hd]).output();
        ip(&["netns", "add", &name]);
        let ns = Ns {
            name: name.clone(),
            host_ip: format!("10.78.{id}.1"),
            ns_ip: format!("10.78.{id}.2"),
            host_dev: hd.clone(),
            ns_dev: nd.clone(),
        };
        ip(&["link", "add", &hd, "type", "veth", "peer", "name", &nd]);
        ip(&["link", "set", &nd, "netns", &name]);
        ip(&["addr", "add", &format!("{}/24", ns.host_ip), "dev", &hd]);
        ip(&["link", "set", &hd, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{}/24", ns.ns_ip),
            "dev",
            &nd,
        ]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        ip(&["-n", &name, "link", "set", &nd, "up"]);
        ns
    }

    pub fn exec(&self) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.name]
    }

    /// Cut (down) or restore (up) the link: a silent partition, as a lost route.
    pub fn link(&self, up: bool) {
        ip(&[
            "link",
            "set",
            &self.host_dev,
            if up { "up" } else { "down" },
        ]);
    }

    /// Limit the link both ways to `mbit` Mbit/s with tbf.
    pub fn limit(&self, mbit: u32) {
        let rate = format!("{mbit}mbit");
        for (ns, dev) in [(None, &self.host_dev), (Some(&self.name), &self.ns_dev)] {
            let mut a: Vec<&str> = Vec::new();
            if let Some(n) = ns {
                a.extend(["-n", n]);
            }
            let o = Command::new("tc")
                .args(&a)
                .args([
                    "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", "32kb",
                    "latency", "50ms",
                ])
                .output()
                .expect("tc (apt: iproute2)");
            assert!(
                o.status.success(),
                "tc: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_dev])
            .output();
    }
}

/// `host:port` of a URL like `postgres://u@127.0.0.1:5432/db` or `http://127.0.0.1:80`.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |x| x.1);
    let rest = rest.split_once('@').map_or(rest, |x| x.1);
    rest.split(['/', '?', '#']).next().unwrap().to_string()
}

/// A tree of `dirs` directories of `per_dir` small files (1-4 KiB, distinct contents) and
/// `top` files at the top.
pub fn small_tree(root: &Path, dirs: usize, per_dir: usize, top: usize) -> usize {
    let mut n = 0;
    for d in 0..dirs {
        let dir = root.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..per_dir {
            let len = 1024 + (d * 131 + f * 17) % 3072;
            std::fs::write(
                dir.join(format!("f{f:05}")),
                crate::data((d * 100_000 + f) as u64, len),
            )
            .unwrap();
            n += 1;
        }
    }
    for f in 0..top {
        std::fs::write(
            root.join(format!("top{f}")),
            crate::data(9_000_000 + f as u64, 100 + f),
        )
        .unwrap();
        n += 1;
    }
    n
}
