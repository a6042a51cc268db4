//! The agent's configuration: a TOML file, environment variables over it, flags over those
//! (flag > environment > file). Every key has a variable: `MIRROR_AGENT_<KEY>` at the top,
//! `MIRROR_AGENT_<SECTION>__<KEY>` in `[primary]` or `[mirror]` (values are TOML values or
//! plain strings), so the agent also runs with no file at all (containers).
//!
//! Secrets are never literal values here: `token_env` names an environment variable,
//! `token_file` a file whose first line is the token (mirror tokens and the admin token).
//!
//! `check` is everything `run` verifies before it binds a port or writes anything; both
//! `run` and `check-config` call it, so they cannot disagree.

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Mirror,
}

/// The admin address of each role when none is given: different, so a primary and a mirror
/// on one host do not collide.
pub const PRIMARY_ADMIN: &str = "127.0.0.1:9567";
pub const MIRROR_ADMIN: &str = "127.0.0.1:9568";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub role: Role,
    /// Primary: the volume's metadata URL. Mirror: the mirror's own metadata URL.
    pub meta: String,
    /// The agent's own state (RocksDB: block queue, bootstrap progress).
    pub state_dir: PathBuf,
    /// Where `/metrics` and `/status` are served (default: 127.0.0.1:9567 for a primary,
    /// 127.0.0.1:9568 for a mirror).
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// The credential for changes through the admin address (`PUT /limits`, dropping a
    /// slot): the variable holding it...
    #[serde(default)]
    pub admin_token_env: Option<String>,
    /// ... or a file whose first line is it. Without one, the admin address is read-only.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    #[serde(default)]
    pub primary: Option<PrimaryConfig>,
    #[serde(default)]
    pub mirror: Option<MirrorConfig>,
}

/// Where a token comes from: an environment variable or a file, never the config itself.
#[derive(Debug, Clone, Default)]
pub struct Secret {
    pub token_env: Option<String>,
    pub token_file: Option<PathBuf>,
    /// Refused: present only to give a clear error when someone writes a token inline.
    pub token: Option<toml::Value>,
    /// How the config names these settings: "" (`token_env`, `token_file`) or "admin_"
    /// (`admin_token_env`, ...), for the messages.
    pub setting: &'static str,
}

/// How a good token is made, for the messages that refuse one.
pub const MAKE_TOKEN: &str = "openssl rand -hex 32 > FILE; chmod 600 FILE";

/// The least estimated strength of a token, in bits (`token_bits`).
pub const MIN_TOKEN_BITS: f64 = 112.0;

impl Secret {
    /// The token, refused when it is weak (`token_bits`), and from a file: when group or
    /// others may read or change it, or its owner is neither this user nor root (as ssh
    /// refuses a private key).
    pub fn load(&self, who: &str) -> Result<String> {
        if self.token.is_some() {
            bail!("{who}: a literal `token` is not accepted in the config (it would sit in a file anyone may read and in backups); use token_env = \"VAR\" or token_file = \"/path\"");
        }
        let p = self.setting;
        let (t, from) = match (&self.token_env, &self.token_file) {
            (Some(v), None) => (
                std::env::var(v).map_err(|_| {
                    anyhow!("{who}: the environment variable {v} is not set (the config's {p}token_env = \"{v}\" names it): set {v} in the agent's environment (export it, or Environment= in its systemd unit), or use {p}token_file instead")
                })?,
                format!("the token in {v} ({p}token_env)"),
            ),
            (None, Some(f)) => {
                check_token_file(who, f)?;
                (
                    std::fs::read_to_string(f)
                        .with_context(|| format!("{who}: reading {p}token_file {}", f.display()))?
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string(),
                    format!("the token in {p}token_file {}", f.display()),
                )
            }
            (Some(_), Some(_)) => bail!("{who}: give {p}token_env or {p}token_file, not both"),
            (None, None) => bail!("{who}: no token: set {p}token_env or {p}token_file"),
        };
        let t = t.trim().to_string();
        if t.len() < 16 {
            bail!("{who}: {from} is shorter than 16 characters; use a long random one (`{MAKE_TOKEN}`)");
        }
        let bits = token_bits(&t);
        if bits < MIN_TOKEN_BITS {
            bail!("{who}: {from} is weak: about {bits:.0} bits of entropy, at least {MIN_TOKEN_BITS:.0} are needed (repeated characters, runs like 1234 or abcd, words, and repeated parts count for little); make a random one: `{MAKE_TOKEN}`");
        }
        Ok(t)
    }
}

/// A token file must be the owner's alone: refused when group or others have any access, or
/// when its owner is neither this user nor root.
pub fn check_token_file(who: &str, f: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(f).with_context(|| format!("{who}: token_file {}", f.display()))?;
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "{who}: token_file {} has mode {mode:04o}: group or others may read it; make it the owner's alone: `chmod 600 {}`",
            f.display(),
            f.display()
        );
    }
    let me = rustix::process::geteuid().as_raw();
    if md.uid() != me && md.uid() != 0 {
        bail!(
            "{who}: token_file {} belongs to uid {}, not to this user (uid {me}) or root: whoever owns it can change the token; `chown {me} {}`",
            f.display(),
            md.uid(),
            f.display()
        );
    }
    Ok(())
}

/// A cautious estimate of a token's entropy in bits: each character costs what its alphabet
/// allows (hex 4 bits, base64 6, otherwise by the classes it uses), except where it continues
/// a pattern of 4 or more (the same character, a run like 1234 or dcba, a part seen earlier,
/// a common word), which costs a few bits for the whole pattern. Length alone never makes a
/// token strong: 36 times `a` is about 12 bits.
pub fn token_bits(t: &str) -> f64 {
    const WORDS: &[&str] = &[
        "password", "passwd", "secret", "token", "admin", "mirror", "primary", "changeme",
        "letmein", "qwerty", "asdf", "zxcv", "test", "example", "default", "welcome", "master",
        "root", "login", "dragon", "monkey", "iloveyou", "trustno", "hunter",
    ];
    let b = t.as_bytes();
    let per_char = if b.iter().all(|c| c.is_ascii_hexdigit()) {
        4.0
    } else if b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_'))
    {
        let classes = [
            b.iter().any(u8::is_ascii_lowercase),
            b.iter().any(u8::is_ascii_uppercase),
            b.iter().any(u8::is_ascii_digit),
        ];
        let n: u32 = [26, 26, 10]
            .iter()
            .zip(classes)
            .filter(|(_, c)| *c)
            .map(|(n, _)| n)
            .sum::<u32>()
            + if b.iter().any(|c| !c.is_ascii_alphanumeric()) {
                4
            } else {
                0
            };
        f64::from(n.max(2)).log2().min(6.0)
    } else {
        f64::from(95u32).log2()
    };
    let lower = t.to_ascii_lowercase();
    let lb = lower.as_bytes();
    // The longest pattern starting at `i`, in bytes (0: none of 4 or more).
    let pattern_at = |i: usize| -> usize {
        let mut best = 0;
        for step in [0i16, 1, -1] {
            let mut n = 1;
            while i + n < lb.len() && i16::from(lb[i + n]) - i16::from(lb[i + n - 1]) == step {
                n += 1;
            }
            best = best.max(n);
        }
        for w in WORDS {
            if lb[i..].starts_with(w.as_bytes()) {
                best = best.max(w.len());
            }
        }
        // A part already seen.
        for j in 0..i {
            let mut n = 0;
            while i + n < lb.len() && j + n < i && lb[j + n] == lb[i + n] {
                n += 1;
            }
            best = best.max(n);
        }
        if best >= 4 {
            best
        } else {
            0
        }
    };
    let mut bits = 0.0;
    let mut i = 0;
    while i < lb.len() {
        match pattern_at(i) {
            0 => {
                bits += per_char;
                i += 1;
            }
            n => {
                bits += 8.0;
                i += n;
            }
        }
    }
    bits
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorEntry {
    pub name: String,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token: Option<toml::Value>,
    /// Mounts at this mirror may write: their changes come through the mirror's agent and
    /// are committed here (off by default: the mirror's mounts are read-only).
    #[serde(default)]
    pub allow_writes: bool,
}

impl MirrorEntry {
    pub fn secret(&self) -> Secret {
        Secret {
            token_env: self.token_env.clone(),
            token_file: self.token_file.clone(),
            token: self.token.clone(),
            setting: "",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrimaryConfig {
    pub listen: SocketAddr,
    #[serde(default)]
    pub mirrors: Vec<MirrorEntry>,
    /// A mirror more than this many entries behind is marked as needing resync.
    #[serde(default = "default_retain_entries")]
    pub retain_max_entries: u64,
    /// ... or whose oldest unacknowledged entry is older than this.
    #[serde(default = "default_retain_age", with = "humantime_serde_lite")]
    pub retain_max_age: Duration,
    /// How often slots are checked against the caps and the journal trimmed.
    #[serde(default = "default_trim_interval", with = "humantime_serde_lite")]
    pub trim_interval: Duration,
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Serve mirrors in plaintext on a non-loopback address (file names and the whole
    /// metadata cross the network readable): refused unless set.
    #[serde(default)]
    pub insecure_plaintext: bool,
}

fn default_retain_entries() -> u64 {
    50_000_000
}
fn default_retain_age() -> Duration {
    Duration::from_secs(7 * 86400)
}
fn default_trim_interval() -> Duration {
    Duration::from_secs(30)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    pub name: String,
    /// The primary agent's address, `host:port`.
    pub primary: String,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token: Option<toml::Value>,
    /// CA certificate (PEM) to verify the primary with; TLS is used when set.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// The name in the primary's certificate (default: the host part of `primary`).
    #[serde(default)]
    pub tls_server_name: Option<String>,
    /// Connect to a non-loopback primary without TLS (the metadata crosses the network
    /// readable): refused unless set.
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// The mirror's block store.
    pub store: String,
    /// Where blocks are copied from (default: the volume's own storage URL).
    #[serde(default)]
    pub origin_store: Option<String>,
    #[serde(default = "default_window", with = "humantime_serde_lite")]
    pub window: Duration,
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Block copy bandwidth, bytes/s ("100M", a timetable, or "off").
    #[serde(default)]
    pub bwlimit: Option<String>,
    /// Block copy requests/s (0 = unlimited).
    #[serde(default)]
    pub tps: u32,
    /// Most entries applied in one engine transaction.
    #[serde(default = "default_batch")]
    pub batch_entries: usize,
    /// Bootstrap again by itself when the primary says the slot was dropped.
    #[serde(default = "default_true")]
    pub auto_resync: bool,
    /// The address this site's primary agent will listen on once this mirror is promoted
    /// (its `[primary] listen`: the `--new-primary` of a planned move). While a mirror, the
    /// agent answers a greeting there with a refusal naming this copy of the metadata (a
    /// digest of its identity, no names), so that `mirror-agent fence` can check that the
    /// move goes to the mirror whose agent will serve there. Unset: a planned move to this
    /// mirror needs `fence --force`.
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
}

impl MirrorConfig {
    pub fn secret(&self) -> Secret {
        Secret {
            token_env: self.token_env.clone(),
            token_file: self.token_file.clone(),
            token: self.token.clone(),
            setting: "",
        }
    }
}

fn default_window() -> Duration {
    Duration::from_secs(1)
}
fn default_workers() -> usize {
    8
}
fn default_batch() -> usize {
    4096
}
fn default_true() -> bool {
    true
}

/// Durations as strings ("1s", "500ms", "7d").
mod humantime_serde_lite {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!("duration {s:?}: {e} (e.g. \"1s\", \"500ms\")"))
        })
    }
}

/// Environment variables of the agent that are not configuration keys.
const NOT_KEYS: &[&str] = &[
    "MIRROR_AGENT_CONFIG",
    "MIRROR_AGENT_LOG_FORMAT",
    "MIRROR_AGENT_ADMIN_TOKEN",
    "MIRROR_AGENT_ADMIN_TOKEN_FILE",
];

/// A TOML error as one line: where (line, section) and what, with the valid keys of the
/// section when a key is unknown.
fn friendly(text: &str, what: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return format!("{what}: {}", reword(&msg));
    };
    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
    let section = text[..span.start.min(text.len())]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .unwrap_or("the top level (before any [section])");
    format!("{what}, line {line} (in {section}): {}", reword(&msg))
}

/// serde's "unknown field `x`, expected one of `a`, `b`" in an operator's words.
fn reword(msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("unknown field ") {
        let (key, expected) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let valid = expected.trim_start_matches("one of ").replace('`', "");
        return format!("unknown key {key}; the valid keys here are: {valid}");
    }
    msg.to_string()
}

impl Config {
    /// The file (if any), the environment over it. Flags are applied by the caller.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let (text, what) = match path {
            Some(p) => (
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading the config file {}", p.display()))?,
                format!("config file {}", p.display()),
            ),
            None => (String::new(), "configuration".to_string()),
        };
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("MIRROR_AGENT_") && !NOT_KEYS.contains(&k.as_str()))
            .collect();
        Self::parse_with_env(&text, &what, &env)
    }

    /// Parse `text` (a file's contents) with `env` (MIRROR_AGENT_* pairs) over it.
    pub fn parse_with_env(text: &str, what: &str, env: &[(String, String)]) -> Result<Config> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| anyhow!("{}", friendly(text, what, &e)))?;
        // The file alone first, for errors that point at its lines (keys the environment
        // supplies may be missing from it).
        if let Err(e) = toml::from_str::<Config>(text) {
            if !e.message().contains("missing field") {
                bail!("{}", friendly(text, what, &e));
            }
        }
        let mut from_env = Vec::new();
        for (k, v) in env {
            let path = k["MIRROR_AGENT_".len()..].to_ascii_lowercase();
            let (section, key) = match path.split_once("__") {
                Some((s, k)) => (Some(s.to_string()), k.to_string()),
                None => (None, path),
            };
            let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(v.clone()));
            let target = match &section {
                Some(s) => table
                    .entry(s.clone())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .ok_or_else(|| anyhow!("{k}: [{s}] is not a section"))?,
                None => &mut table,
            };
            target.insert(key, value);
            from_env.push(k.clone());
        }
        toml::Value::Table(table).try_into::<Config>().map_err(|e| {
            let msg = reword(e.message().trim());
            if from_env.is_empty() {
                anyhow!("{what}: {msg}")
            } else {
                anyhow!(
                    "{what} with the environment ({}): {msg} (a variable is MIRROR_AGENT_<KEY>, or MIRROR_AGENT_<SECTION>__<KEY> for [primary] and [mirror])",
                    from_env.join(", ")
                )
            }
        })
    }

    pub fn parse(text: &str) -> Result<Config> {
        Self::parse_with_env(text, "config", &[])
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.unwrap_or_else(|| {
            match self.role {
                Role::Primary => PRIMARY_ADMIN,
                Role::Mirror => MIRROR_ADMIN,
            }
            .parse()
            .expect("valid")
        })
    }

    /// The admin token, when changes through the admin address are enabled.
    pub fn admin_token(&self) -> Result<Option<String>> {
        if self.admin_token_env.is_none() && self.admin_token_file.is_none() {
            return Ok(None);
        }
        Secret {
            token_env: self.admin_token_env.clone(),
            token_file: self.admin_token_file.clone(),
            token: None,
            setting: "admin_",
        }
        .load("admin token")
        .map(Some)
    }

    /// Everything `run` checks before it binds or writes: sections, names, secrets, TLS
    /// files, URLs (without connecting), the state directory, plaintext across a network.
    /// Returns warnings; an error is the first problem found.
    pub async fn check(&self) -> Result<Vec<String>> {
        let mut warn = Vec::new();
        // A mirror agent creates its own metadata (RocksDB: with its parents) at the first
        // start; a primary's must exist.
        let opts = meta::OpenOptions {
            create: self.role == Role::Mirror,
            ..Default::default()
        };
        meta::check_url(&self.meta, &opts).map_err(|e| anyhow!("meta: {e}"))?;
        check_state_dir(&self.state_dir)?;
        self.admin_token()?;
        if self.admin_token_env.is_none() && self.admin_token_file.is_none() {
            warn.push(format!("no admin_token_env or admin_token_file: the admin address {} serves /metrics and /status only; changes (limits, slot drop) are refused", self.admin_addr()));
        }
        match self.role {
            Role::Primary => {
                let p = self
                    .primary
                    .as_ref()
                    .ok_or_else(|| anyhow!("role = \"primary\" needs a [primary] section"))?;
                if self.mirror.is_some() {
                    warn.push("[mirror] is ignored: role is \"primary\"".into());
                }
                let mut names = std::collections::HashSet::new();
                for m in &p.mirrors {
                    check_name(&m.name)?;
                    if !names.insert(&m.name) {
                        bail!("mirror {:?} is listed twice in [[primary.mirrors]]", m.name);
                    }
                    m.secret().load(&format!("mirror {:?}", m.name))?;
                }
                if p.mirrors.is_empty() {
                    warn.push("[primary] has no [[primary.mirrors]]: no mirror can connect".into());
                }
                match (&p.tls_cert, &p.tls_key) {
                    (Some(c), Some(k)) => {
                        crate::tls::acceptor(c, k)?;
                    }
                    (None, None) => {
                        if !p.listen.ip().is_loopback() {
                            if !p.insecure_plaintext {
                                bail!("[primary] listen = {} without TLS would send the volume's file names and metadata across the network in clear: set tls_cert and tls_key, or insecure_plaintext = true to accept that", p.listen);
                            }
                            warn.push(format!("[primary] insecure_plaintext: mirrors are served in clear on {}; anyone on the path reads the volume's metadata", p.listen));
                        }
                    }
                    _ => bail!("[primary] tls_cert and tls_key go together"),
                }
            }
            Role::Mirror => {
                let m = self
                    .mirror
                    .as_ref()
                    .ok_or_else(|| anyhow!("role = \"mirror\" needs a [mirror] section"))?;
                if self.primary.is_some() {
                    warn.push("[primary] is ignored: role is \"mirror\"".into());
                }
                check_name(&m.name)?;
                m.secret().load("[mirror]")?;
                if m.workers == 0 || m.workers > 1024 {
                    bail!("[mirror] workers = {}: use 1..=1024", m.workers);
                }
                if m.batch_entries == 0 {
                    bail!("[mirror] batch_entries must be at least 1");
                }
                if m.window.is_zero() {
                    bail!("[mirror] window must be more than 0 (e.g. \"1s\")");
                }
                if let Some(b) = &m.bwlimit {
                    objstore::limits::BwSchedule::parse(b)
                        .with_context(|| format!("[mirror] bwlimit = {b:?}"))?;
                }
                objstore::check_url(&m.store).map_err(|e| anyhow!("[mirror] store: {e}"))?;
                if let Some(o) = &m.origin_store {
                    objstore::check_url(o).map_err(|e| anyhow!("[mirror] origin_store: {e}"))?;
                }
                let (host, _) = split_host_port(&m.primary)?;
                match &m.tls_ca {
                    Some(ca) => {
                        let name = m.tls_server_name.clone().unwrap_or_else(|| host.clone());
                        crate::tls::connector(ca, &name)?;
                    }
                    None => {
                        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&m.primary)
                            .await
                            .with_context(|| {
                                format!("[mirror] primary = {:?}: cannot resolve it", m.primary)
                            })?
                            .collect();
                        if addrs.iter().any(|a| !a.ip().is_loopback()) {
                            if !m.insecure_plaintext {
                                bail!("[mirror] primary = {:?} is across a network and tls_ca is not set: the volume's metadata would arrive in clear; set tls_ca (and TLS at the primary), or insecure_plaintext = true to accept that", m.primary);
                            }
                            warn.push(format!(
                                "[mirror] insecure_plaintext: replication from {} is in clear",
                                m.primary
                            ));
                        }
                    }
                }
            }
        }
        Ok(warn)
    }
}

fn split_host_port(addr: &str) -> Result<(String, u16)> {
    let (h, p) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("[mirror] primary = {addr:?}: expected host:port"))?;
    let port: u16 = p
        .parse()
        .map_err(|_| anyhow!("[mirror] primary = {addr:?}: {p:?} is not a port"))?;
    Ok((h.trim_matches(['[', ']']).to_string(), port))
}

/// The state directory is a directory (or can be created: an ancestor exists and is one).
fn check_state_dir(dir: &Path) -> Result<()> {
    // What `run` refuses (`cli_common::private::ensure_private_dir`), said here first: a
    // link, another user's directory, one others may write, or one under a directory
    // another user could change.
    let refuse = |why: String| {
        anyhow::anyhow!("state_dir {}: {why}; it must be a directory of this user's that no one else may use (mode 0700): remove it (a new one is made), or set another state_dir", dir.display())
    };
    if let Some(why) = cli_common::private::ancestors_problem(dir) {
        return Err(refuse(why));
    }
    if let Ok(m) = std::fs::symlink_metadata(dir) {
        if m.is_file() {
            bail!("state_dir {} is a file, not a directory", dir.display());
        }
        if let Some(why) = cli_common::private::private_dir_problem(dir, &m) {
            return Err(refuse(why));
        }
        return Ok(());
    }
    if !dir.is_absolute() {
        bail!("state_dir {}: use an absolute path", dir.display());
    }
    let mut a = dir.parent();
    while let Some(p) = a {
        if p.exists() {
            if !p.is_dir() {
                bail!("state_dir {}: {} is a file", dir.display(), p.display());
            }
            return Ok(()); // created at the first start
        }
        a = p.parent();
    }
    Ok(())
}

pub fn check_name(n: &str) -> Result<()> {
    if n.is_empty()
        || n.len() > 64
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!("mirror name {n:?}: use 1-64 letters, digits, '-' or '_'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_tokens_are_told_from_random_ones() {
        for weak in [
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "password1234567890password1234567890",
            "password1234567890abcdefghijklmnopqrstuvwxyz",
            "test-token-5f1c2a9e8b7d6c3f",
            "0123456789abcdef0123456789abcdef0123456789abcdef",
            "abcdabcdabcdabcdabcdabcdabcdabcdabcdabcd",
            "Secret-Token-2024-Secret-Token-2024!",
        ] {
            assert!(
                token_bits(weak) < MIN_TOKEN_BITS,
                "{weak}: {}",
                token_bits(weak)
            );
        }
        for _ in 0..200 {
            let hex: String = (0..32)
                .map(|_| format!("{:02x}", rand::random::<u8>()))
                .collect();
            assert!(token_bits(&hex) >= 200.0, "{hex}: {}", token_bits(&hex));
            let hex24: String = (0..24)
                .map(|_| format!("{:02x}", rand::random::<u8>()))
                .collect();
            assert!(
                token_bits(&hex24) >= MIN_TOKEN_BITS,
                "{hex24}: {}",
                token_bits(&hex24)
            );
        }
        // `openssl rand -base64 32`
        assert!(token_bits("q2vX0b8m1N9f+Yk3/Zr7LwTQe5uH4sJpAcVdGtE6oiM=") >= MIN_TOKEN_BITS);
    }

    #[test]
    fn a_token_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("tok");
        let good: String = (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        std::fs::write(&f, format!("{good}\n")).unwrap();
        let s = Secret {
            token_file: Some(f.clone()),
            ..Default::default()
        };
        for mode in [0o644, 0o640, 0o604, 0o660] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = s.load("[mirror]").unwrap_err().to_string();
            assert!(
                e.contains(&f.display().to_string())
                    && e.contains(&format!("{mode:04o}"))
                    && e.contains("chmod 600"),
                "{e}"
            );
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(s.load("[mirror]").unwrap(), good);
    }

    /// The trial: a missing admin token variable said `(token_env)`, a setting the config
    /// has no such name for. The message names the real setting and the variable.
    #[test]
    fn a_missing_token_variable_names_its_setting_and_the_variable() {
        let text = "role = \"mirror\"\nmeta = \"rocksdb:///m\"\nstate_dir = \"/s\"\nadmin_token_env = \"JFS_TEST_UNSET_ADMIN_TOKEN_43\"\n[mirror]\nname = \"m\"\nprimary = \"p:1\"\nstore = \"file:///b\"\ntoken_env = \"JFS_TEST_UNSET_MIRROR_TOKEN_43\"\n";
        let c = Config::parse(text).unwrap();
        let e = c.admin_token().unwrap_err().to_string();
        assert!(
            e.starts_with("admin token: the environment variable JFS_TEST_UNSET_ADMIN_TOKEN_43 is not set (the config's admin_token_env = \"JFS_TEST_UNSET_ADMIN_TOKEN_43\" names it)")
                && e.contains("or use admin_token_file")
                && !e.contains("(token_env)"),
            "{e}"
        );
        let e = c
            .mirror
            .unwrap()
            .secret()
            .load("[mirror]")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the config's token_env = \"JFS_TEST_UNSET_MIRROR_TOKEN_43\" names it")
                && e.contains("or use token_file"),
            "{e}"
        );
    }

    #[test]
    fn a_typo_is_reported_at_its_line_with_the_keys_of_its_section() {
        let text = "role = \"mirror\"\nmeta = \"rocksdb:///m\"\nstate_dir = \"/s\"\n[mirror]\nname = \"m\"\nprimary = \"p:1\"\nstore = \"file:///b\"\nwrkers = 8\n";
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(e.contains("line 8 (in [mirror])"), "{e}");
        assert!(e.contains("unknown key `wrkers`"), "{e}");
        assert!(e.contains("workers") && e.contains("bwlimit"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }

    #[test]
    fn the_environment_overrides_the_file_and_can_stand_alone() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = Config::parse_with_env(
            "",
            "env",
            &env(&[
                ("MIRROR_AGENT_ROLE", "mirror"),
                ("MIRROR_AGENT_META", "rocksdb:///m"),
                ("MIRROR_AGENT_STATE_DIR", "/s"),
                ("MIRROR_AGENT_MIRROR__NAME", "eu"),
                ("MIRROR_AGENT_MIRROR__PRIMARY", "p.example:9566"),
                ("MIRROR_AGENT_MIRROR__STORE", "file:///b"),
                ("MIRROR_AGENT_MIRROR__WORKERS", "3"),
                ("MIRROR_AGENT_MIRROR__BWLIMIT", "100M"),
            ]),
        )
        .unwrap();
        let m = c.mirror.as_ref().unwrap();
        assert_eq!((m.workers, m.bwlimit.as_deref()), (3, Some("100M")));
        assert_eq!(c.admin_addr().to_string(), MIRROR_ADMIN);
        let c = Config::parse_with_env(
            "role = \"primary\"\nmeta = \"rocksdb:///v\"\nstate_dir = \"/s\"\n[primary]\nlisten = \"127.0.0.1:1\"\n",
            "file",
            &env(&[(
                "MIRROR_AGENT_PRIMARY__MIRRORS",
                "[{name = \"eu\", token_env = \"T\"}]",
            )]),
        )
        .unwrap();
        assert_eq!(c.primary.as_ref().unwrap().mirrors[0].name, "eu");
        assert_eq!(c.admin_addr().to_string(), PRIMARY_ADMIN);
        let e = Config::parse_with_env(
            "",
            "env",
            &env(&[
                ("MIRROR_AGENT_MIRROR__WRKERS", "3"),
                ("MIRROR_AGENT_ROLE", "mirror"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("MIRROR_AGENT_MIRROR__WRKERS"), "{e}");
    }

    /// `check-config` refuses the state directories `run` refuses: another user's (or one
    /// others may write), a link, one under a directory another user could change. It said
    /// "ok" and `run` then refused.
    #[test]
    fn a_state_dir_run_would_refuse_is_refused_by_the_checks() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let theirs = t.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = super::check_state_dir(&theirs).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
        let e = super::check_state_dir(&theirs.join("state"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("who could replace it"), "{e}");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        let e = super::check_state_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(super::check_state_dir(&open).is_err());
        let mine = t.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        super::check_state_dir(&mine).unwrap();
        super::check_state_dir(&t.path().join("new")).unwrap();
    }
}
