//! The agent's TOML configuration. Flags and environment variables override the file (see
//! `main.rs`); secrets (mirror tokens) are never literal values here: `token_env` names an
//! environment variable, `token_file` a file whose first line is the token.

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub role: Role,
    /// Primary: the volume's metadata URL. Mirror: the mirror's own metadata URL.
    pub meta: String,
    /// The agent's own state (RocksDB: block queue, bootstrap progress).
    pub state_dir: PathBuf,
    /// Where `/metrics` and `/status` are served.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    #[serde(default)]
    pub primary: Option<PrimaryConfig>,
    #[serde(default)]
    pub mirror: Option<MirrorConfig>,
}

fn default_admin() -> SocketAddr {
    "127.0.0.1:9567".parse().expect("valid")
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Refused: present only to give a clear error when someone writes a token inline.
    #[serde(default)]
    pub token: Option<toml::Value>,
}

impl Secret {
    pub fn load(&self, who: &str) -> Result<String> {
        if self.token.is_some() {
            bail!("{who}: a literal `token` is not accepted in the config (it would sit in a file anyone may read and in backups); use token_env = \"VAR\" or token_file = \"/path\"");
        }
        let t = match (&self.token_env, &self.token_file) {
            (Some(v), None) => std::env::var(v).map_err(|_| {
                anyhow!("{who}: the environment variable {v} (token_env) is not set")
            })?,
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("{who}: reading token_file {}", f.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
            (Some(_), Some(_)) => bail!("{who}: give token_env or token_file, not both"),
            (None, None) => bail!("{who}: no token: set token_env or token_file"),
        };
        let t = t.trim().to_string();
        if t.len() < 16 {
            bail!("{who}: the token is shorter than 16 characters; use a long random one (e.g. `openssl rand -hex 32`)");
        }
        Ok(t)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorEntry {
    pub name: String,
    #[serde(flatten)]
    pub secret: Secret,
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
    #[serde(flatten)]
    pub secret: Secret,
    /// CA certificate (PEM) to verify the primary with; TLS is used when set.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// The name in the primary's certificate (default: the host part of `primary`).
    #[serde(default)]
    pub tls_server_name: Option<String>,
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

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| anyhow!("{e}"))?;
        Ok(c)
    }

    /// Checks that need the whole picture (after flags were applied).
    pub fn validate(&self) -> Result<()> {
        match self.role {
            Role::Primary => {
                let p = self
                    .primary
                    .as_ref()
                    .ok_or_else(|| anyhow!("role = \"primary\" needs a [primary] section"))?;
                let mut names = std::collections::HashSet::new();
                for m in &p.mirrors {
                    check_name(&m.name)?;
                    if !names.insert(&m.name) {
                        bail!("mirror {:?} is listed twice in [[primary.mirrors]]", m.name);
                    }
                    m.secret.load(&format!("mirror {:?}", m.name))?;
                }
                if p.tls_cert.is_some() != p.tls_key.is_some() {
                    bail!("[primary] tls_cert and tls_key go together");
                }
            }
            Role::Mirror => {
                let m = self
                    .mirror
                    .as_ref()
                    .ok_or_else(|| anyhow!("role = \"mirror\" needs a [mirror] section"))?;
                check_name(&m.name)?;
                m.secret.load("[mirror]")?;
                if m.workers == 0 || m.workers > 1024 {
                    bail!("[mirror] workers = {}: use 1..=1024", m.workers);
                }
                if m.batch_entries == 0 {
                    bail!("[mirror] batch_entries must be at least 1");
                }
                if let Some(b) = &m.bwlimit {
                    objstore::limits::BwSchedule::parse(b)
                        .with_context(|| format!("[mirror] bwlimit = {b:?}"))?;
                }
            }
        }
        Ok(())
    }
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
