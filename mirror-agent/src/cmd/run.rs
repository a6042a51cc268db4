//! `mirror-agent run`: configuration (file, environment, flags), the checks, then the role.

use anyhow::{Context, Result};
use mirror_agent::admin::{self, Admin};
use mirror_agent::config::{Config, Role};
use mirror_agent::metrics::Metrics;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct RunArgs {
    /// TOML config (see configs/). Without it, everything comes from MIRROR_AGENT_*
    /// variables (MIRROR_AGENT_<KEY>, MIRROR_AGENT_<SECTION>__<KEY>).
    #[arg(long, env = "MIRROR_AGENT_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// Metadata URL (primary: the volume; mirror: the mirror's own).
    #[arg(long)]
    meta: Option<String>,
    #[arg(long)]
    state_dir: Option<PathBuf>,
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Primary: address to serve mirrors on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Mirror: the primary agent's address.
    #[arg(long)]
    primary: Option<String>,
    /// Mirror: the mirror's block store URL.
    #[arg(long)]
    store: Option<String>,
    /// Mirror: where blocks are copied from (default: the volume's storage).
    #[arg(long)]
    origin_store: Option<String>,
    /// Mirror: block copy bandwidth.
    #[arg(long)]
    bwlimit: Option<String>,
    /// Mirror: block copy requests/s.
    #[arg(long)]
    tps: Option<u32>,
    /// Mirror: parallel block copies.
    #[arg(long)]
    workers: Option<usize>,
    /// Mirror: consistency window ("1s").
    #[arg(long)]
    window: Option<humantime::Duration>,
}

/// The configuration: file, environment over it, flags over both.
pub fn config(a: &RunArgs) -> Result<Config> {
    let mut c = Config::load(a.config.as_deref())?;
    if let Some(r) = a.role {
        c.role = r;
    }
    if let Some(m) = &a.meta {
        c.meta = m.clone();
    }
    if let Some(d) = &a.state_dir {
        c.state_dir = d.clone();
    }
    if a.admin.is_some() {
        c.admin = a.admin;
    }
    if let (Some(l), Some(p)) = (a.listen, c.primary.as_mut()) {
        p.listen = l;
    }
    if let Some(m) = c.mirror.as_mut() {
        if let Some(p) = &a.primary {
            m.primary = p.clone();
        }
        if let Some(s) = &a.store {
            m.store = s.clone();
        }
        if a.origin_store.is_some() {
            m.origin_store = a.origin_store.clone();
        }
        if a.bwlimit.is_some() {
            m.bwlimit = a.bwlimit.clone();
        }
        if let Some(t) = a.tps {
            m.tps = t;
        }
        if let Some(w) = a.workers {
            m.workers = w;
        }
        if let Some(w) = a.window {
            m.window = w.into();
        }
    }
    Ok(c)
}

/// Directories this start created, removed again if the start fails before the agent runs
/// (a failed start leaves nothing behind).
struct Created(Vec<PathBuf>);

impl Created {
    /// `p` is about to be created (with any missing parents): remember the topmost
    /// directory that does not exist yet.
    fn note(&mut self, p: PathBuf) {
        if p.exists() {
            return;
        }
        let mut top = p;
        while let Some(parent) = top.parent().filter(|q| !q.exists()) {
            top = parent.to_path_buf();
        }
        self.0.push(top);
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn rocksdb_dir(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("rocksdb://")?;
    Some(PathBuf::from(rest.split('?').next().unwrap_or(rest)))
}

pub async fn run(a: RunArgs) -> Result<()> {
    let what = a
        .config
        .as_ref()
        .map_or("the configuration".to_string(), |p| {
            format!("config file {}", p.display())
        });
    let c = config(&a)?;
    for w in c.check().await.with_context(|| what.clone())? {
        tracing::warn!("{w}");
    }
    // The checks `check-config --connect` makes too (one function), before anything is
    // created or bound.
    let checks = mirror_agent::preflight::reach(&c, mirror_agent::preflight::Reach::Run)
        .await
        .with_context(|| what.clone())?;
    for w in checks {
        tracing::warn!("{w}");
    }
    let token = c.admin_token()?;
    let admin_addr = c.admin_addr();
    let stop = cli_common::shutdown_on_signals("stopping: draining and persisting");
    let mut created = Created(Vec::new());
    match c.role {
        Role::Primary => {
            let metrics = Arc::new(Metrics::new(true));
            // RocksDB: follow the writer as a secondary (writers keep working).
            let engine = volume::open_engine(&c.meta, volume::Access::Read, None, false).await?;
            mirror_agent::site::check_primary(&*engine).await?;
            let p = mirror_agent::primary::Primary::new(
                c.primary.clone().expect("checked"),
                engine,
                metrics.clone(),
            )
            .await?;
            p.set_admin(admin_addr);
            // One primary agent per volume: refused while another one's lease is alive.
            p.take_lease().await?;
            let app = Admin {
                metrics,
                token,
                limits: None,
                slots: Some(p.clone()),
                resync: None,
                workers: p.workers(),
            };
            let admin = admin::serve(admin_addr, app, stop.clone()).await?;
            tracing::info!(admin = %admin_addr, "admin endpoint: /metrics /status, DELETE /slots/NAME");
            let r = p.run(stop.clone()).await;
            stop.cancel();
            let _ = admin.await;
            r
        }
        Role::Mirror => {
            let metrics = Arc::new(Metrics::new(false));
            created.note(c.state_dir.clone());
            if let Some(d) = rocksdb_dir(&c.meta) {
                created.note(d);
            }
            let state = Arc::new(mirror_agent::state::State::open(&c.state_dir)?);
            let engine = volume::open_engine(&c.meta, volume::Access::Write, None, true).await?;
            let m = mirror_agent::mirror::Mirror::new(
                c.mirror.clone().expect("checked"),
                engine,
                state,
                &c.state_dir,
                metrics.clone(),
            )
            .await?;
            let app = Admin {
                metrics,
                token,
                limits: Some(m.limits_arc()),
                slots: None,
                resync: Some(m.clone()),
                workers: m.workers(),
            };
            let admin = admin::serve(admin_addr, app, stop.clone()).await?;
            // Started: what this start created is the agent's now.
            std::mem::take(&mut created.0);
            tracing::info!(admin = %admin_addr, "admin endpoint: /metrics /status /limits /resync");
            let r = m.run(stop.clone()).await;
            stop.cancel();
            let _ = admin.await;
            r
        }
    }
}
