//! Agents as separate processes: a config file per agent, tokens in the environment, logs
//! to a file, status polled at the admin address, stopped with SIGTERM or kill -9 by PID.

use super::*;

/// A port for an agent to listen on, below the kernel's ephemeral range (32768 and up): a
/// port from `bind(:0)` comes from that range, and an outgoing connection of a test running
/// beside could take it before the agent binds it. Never the same port twice in a process:
/// a port is free until its agent binds it, so two calls in a row (an agent's admin and
/// listen addresses) could otherwise both get it.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..1000 {
        let p = 20_000 + rand::random::<u16>() % 12_000;
        if !given.contains(&p) && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            given.push(p);
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
    /// Start with stdout and stderr a pipe whose reader is gone (`2>&1 | head -1` after
    /// `head` ended): every log line fails to be written.
    pub closed_output: bool,
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
            closed_output: false,
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
            .stdin(Stdio::null());
        if self.closed_output {
            let (r, w) = std::io::pipe().expect("pipe");
            drop(r);
            cmd.stdout(w.try_clone().expect("dup")).stderr(w);
        } else {
            cmd.stdout(log.try_clone().expect("dup")).stderr(log);
        }
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
            closed_output: false,
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

pub fn n(v: &Value, path: &str) -> u64 {
    let mut cur = v;
    for p in path.split('.') {
        cur = &cur[p];
    }
    cur.as_u64()
        .unwrap_or_else(|| panic!("status field {path} missing in {v}"))
}

/// In a primary's extra lines: let every mirror write (it goes into their entries).
pub const ALLOW_WRITES: &str = "allow_writes = true";

pub fn primary_toml(
    meta: &str,
    state: &Path,
    admin: &str,
    listen: &str,
    mirrors: &[&str],
    extra: &str,
) -> String {
    // `allow_writes = true` among the extra lines goes into every mirror's entry.
    let writes = extra.lines().any(|l| l.trim() == ALLOW_WRITES);
    let extra: String = extra
        .lines()
        .filter(|l| l.trim() != ALLOW_WRITES)
        .map(|l| format!("{l}\n"))
        .collect();
    let mut s = format!(
        "role = \"primary\"\nmeta = \"{meta}\"\nstate_dir = \"{}\"\nadmin = \"{admin}\"\nadmin_token_env = \"ADMIN_TOKEN\"\n[primary]\nlisten = \"{listen}\"\ntrim_interval = \"1s\"\n{extra}\n",
        state.display()
    );
    for m in mirrors {
        s += &format!("[[primary.mirrors]]\nname = \"{m}\"\ntoken_env = \"MIRROR_TOKEN\"\n");
        if writes {
            s += &format!("{ALLOW_WRITES}\n");
        }
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

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
