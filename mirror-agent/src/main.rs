//! `mirror-agent`: wiring only (flags, logging, signals, exit codes 0 done / 2 error).

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use mirror_agent::config::{Config, Role};
use mirror_agent::metrics::Metrics;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "mirror-agent",
    version,
    about = "Ships a volume's journal to mirror sites and replicates its blocks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "MIRROR_AGENT_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// More logging (-v info, -vv debug); `JFS_LOG` takes a tracing filter.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (SIGTERM/SIGINT: drain, persist, exit 0).
    Run(RunArgs),
    /// Print a running agent's status (role, sequence numbers, lag, window, blocks, errors).
    Status {
        /// The agent's admin address.
        #[arg(long, default_value = "127.0.0.1:9567", env = "MIRROR_AGENT_ADMIN")]
        admin: SocketAddr,
        #[arg(long)]
        json: bool,
        /// Mirror: first wait until it has applied this seq with no block copy pending.
        #[arg(long, value_name = "SEQ")]
        wait_applied: Option<u64>,
        /// How long --wait-applied may wait.
        #[arg(long, default_value = "120s")]
        timeout: humantime::Duration,
    },
    /// Change a running mirror's block copy limits.
    Limits {
        #[arg(long, default_value = "127.0.0.1:9567", env = "MIRROR_AGENT_ADMIN")]
        admin: SocketAddr,
        /// Bytes/s ("100M", "off", or a timetable "08:00,10M 18:00,off").
        #[arg(long)]
        bwlimit: Option<String>,
        /// Requests/s (0 = unlimited).
        #[arg(long)]
        tps: Option<u32>,
    },
    /// Parse and check a config file (tokens are looked up, never printed).
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
    /// Make a stopped mirror's metadata a volume of its own, writable, with its blocks in the
    /// mirror store. Refused while the agent runs or while blocks are still being copied.
    Detach {
        /// The mirror agent's config (its `meta`, `state_dir` and `[mirror]`).
        #[arg(long, env = "MIRROR_AGENT_CONFIG")]
        config: PathBuf,
    },
    /// Replication slots of a volume (primary side).
    Slot {
        #[command(subcommand)]
        cmd: SlotCmd,
    },
}

#[derive(Subcommand)]
enum SlotCmd {
    /// List the slots: acknowledged seq, lag, state.
    List {
        /// The volume's metadata URL.
        #[arg(long, env = "META_URL")]
        meta: String,
        #[arg(long)]
        json: bool,
    },
    /// Drop a mirror's slot: the journal and gc stop waiting for it; it must resync.
    Drop {
        name: String,
        #[arg(long, env = "META_URL")]
        meta: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// TOML config (see configs/).
    #[arg(long, env = "MIRROR_AGENT_CONFIG")]
    config: PathBuf,
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// Metadata URL (primary: the volume; mirror: the mirror's own).
    #[arg(long, env = "MIRROR_AGENT_META")]
    meta: Option<String>,
    #[arg(long, env = "MIRROR_AGENT_STATE_DIR")]
    state_dir: Option<PathBuf>,
    #[arg(long, env = "MIRROR_AGENT_ADMIN")]
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

/// Never suggested for a mistyped flag or subcommand.
const DESTRUCTIVE: &[&str] = &["drop", "detach", "--force"];

fn main() -> ExitCode {
    let (cli, _) = cli_common::parse::<Cli>(DESTRUCTIVE);
    init_logging(cli.log_format, cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mirror-agent: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let res = rt.block_on(run(cli));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mirror-agent: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(f: LogFormat, v: u8) {
    let level = match v {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    cli_common::init_logging(level, matches!(f, LogFormat::Json), "JFS_LOG");
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Run(a) => run_agent(a).await,
        Cmd::Status {
            admin,
            json,
            wait_applied,
            timeout,
        } => {
            if let Some(seq) = wait_applied {
                wait_applied_seq(admin, seq, timeout.into()).await?;
            }
            status(admin, json).await
        }
        Cmd::Limits {
            admin,
            bwlimit,
            tps,
        } => {
            let mut q = Vec::new();
            if let Some(b) = bwlimit {
                q.push(("bwlimit", b));
            }
            if let Some(t) = tps {
                q.push(("tps", t.to_string()));
            }
            if q.is_empty() {
                bail!("give --bwlimit and/or --tps");
            }
            let r = reqwest::Client::new()
                .put(format!("http://{admin}/limits"))
                .query(&q)
                .send()
                .await
                .with_context(|| format!("no agent answers at {admin}"))?;
            let ok = r.status().is_success();
            let body = r.text().await.unwrap_or_default();
            if !ok {
                bail!("{}", body.trim());
            }
            print!("{body}");
            Ok(())
        }
        Cmd::CheckConfig { config } => {
            let c = Config::load(&config)?;
            c.validate()
                .with_context(|| format!("config file {}", config.display()))?;
            println!("{}: ok (role {:?})", config.display(), c.role);
            Ok(())
        }
        Cmd::Slot { cmd } => slot(cmd).await,
        Cmd::Detach { config } => {
            let c = Config::load(&config)?;
            println!("{}", mirror_agent::site::detach(&c).await?);
            Ok(())
        }
    }
}

async fn open_engine(url: &str, read_only: bool, create: bool) -> Result<Arc<dyn fs_core::Engine>> {
    meta::open(
        url,
        &meta::OpenOptions {
            read_only,
            create,
            password_file: None,
        },
    )
    .await
    .map_err(|e| anyhow!("{e}"))
}

async fn slot(cmd: SlotCmd) -> Result<()> {
    match cmd {
        SlotCmd::List { meta, json } => {
            let e = open_engine(&meta, true, false).await?;
            let head = e.journal_bounds().await?.last;
            let slots = fs_core::slots::list(&*e).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"head_seq": head, "slots": slots})
                    )?
                );
            } else {
                println!(
                    "{:<20} {:>12} {:>10} {:<13} reason",
                    "mirror", "acked_seq", "lag", "state"
                );
                for s in slots {
                    let st = match s.state {
                        fs_core::slots::SlotState::Active => "active",
                        fs_core::slots::SlotState::NeedsResync => "needs_resync",
                    };
                    println!(
                        "{:<20} {:>12} {:>10} {:<13} {}",
                        s.name,
                        s.acked,
                        head.saturating_sub(s.acked),
                        st,
                        s.reason.unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
        SlotCmd::Drop { name, meta } => {
            let e = open_engine(&meta, true, false).await?;
            if fs_core::slots::get(&*e, &name).await?.is_none() {
                bail!("no replication slot named {name:?} (see `mirror-agent slot list`)");
            }
            fs_core::slots::remove(&*e, &name).await?;
            println!("dropped slot {name:?}: gc and journal retention no longer wait for it; the mirror must resync");
            Ok(())
        }
    }
}

async fn wait_applied_seq(admin: SocketAddr, seq: u64, limit: std::time::Duration) -> Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(v) = fetch_status(admin).await {
            let applied = v["applied_seq"].as_u64().unwrap_or(0);
            let pending = v["blocks"]["pending"].as_u64().unwrap_or(u64::MAX);
            if applied >= seq && pending == 0 && v["bootstrap"].is_null() {
                return Ok(());
            }
            if t0.elapsed() > limit {
                bail!("the mirror has applied {applied} (waiting for {seq}) with {pending} block copies pending after {}", humantime::format_duration(limit));
            }
        } else if t0.elapsed() > limit {
            bail!("no agent answers at {admin}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn fetch_status(admin: SocketAddr) -> Result<serde_json::Value> {
    reqwest::Client::new()
        .get(format!("http://{admin}/status"))
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .with_context(|| format!("no agent answers at {admin} (is it running? see --admin)"))?
        .json()
        .await
        .context("the status document does not decode")
}

async fn status(admin: SocketAddr, json: bool) -> Result<()> {
    let v: serde_json::Value = reqwest::Client::new()
        .get(format!("http://{admin}/status"))
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await
        .with_context(|| format!("no agent answers at {admin} (is it running? see --admin)"))?
        .json()
        .await
        .context("the status document does not decode")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let g = |k: &str| {
        v.get(k)
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into())
    };
    if v.get("role").and_then(|r| r.as_str()) == Some("primary") {
        println!(
            "role: primary  volume: {}  listen: {}  tls: {}",
            g("volume_uuid"),
            g("listen"),
            g("tls")
        );
        println!(
            "head seq: {}  journal first: {}  auth failures: {}",
            g("head_seq"),
            g("journal_first_seq"),
            g("auth_failures")
        );
        for m in v
            .get("mirrors")
            .and_then(|m| m.as_array())
            .into_iter()
            .flatten()
        {
            println!(
                "  mirror {}: acked {}  lag {} entries  state {}  connected {}",
                m["name"], m["acked_seq"], m["lag_entries"], m["state"], m["connected"]
            );
        }
    } else {
        let b = &v["blocks"];
        println!(
            "role: mirror {}  primary: {}  connected: {}",
            g("name"),
            g("primary"),
            g("connected")
        );
        println!(
            "head seq (primary): {}  applied: {}  acked: {}",
            g("primary_head_seq"),
            g("applied_seq"),
            g("acked_seq")
        );
        println!(
            "lag: {} entries, {} s  window: {} s  within window: {}",
            g("lag_entries"),
            g("lag_seconds"),
            g("window_seconds"),
            g("within_window")
        );
        println!(
            "bootstrap: {}  needs resync: {}",
            g("bootstrap"),
            g("needs_resync")
        );
        println!(
            "blocks: {} pending ({} bytes), {} failing, {} copied ({} bytes), {} skipped, {} deleted",
            b["pending"], b["pending_bytes"], b["failing"], b["copied"], b["copied_bytes"], b["skipped"], b["deleted"]
        );
        println!(
            "errors: {} copy, {} frame, {} reconnects; last: {}",
            b["copy_errors"],
            g("frame_errors"),
            g("reconnects"),
            g("last_error")
        );
    }
    Ok(())
}

async fn run_agent(a: RunArgs) -> Result<()> {
    let mut c = Config::load(&a.config)?;
    if let Some(r) = a.role {
        c.role = r;
    }
    if let Some(m) = a.meta {
        c.meta = m;
    }
    if let Some(d) = a.state_dir {
        c.state_dir = d;
    }
    if let Some(x) = a.admin {
        c.admin = x;
    }
    if let (Some(l), Some(p)) = (a.listen, c.primary.as_mut()) {
        p.listen = l;
    }
    if let Some(m) = c.mirror.as_mut() {
        if let Some(p) = a.primary {
            m.primary = p;
        }
        if let Some(s) = a.store {
            m.store = s;
        }
        if a.origin_store.is_some() {
            m.origin_store = a.origin_store;
        }
        if a.bwlimit.is_some() {
            m.bwlimit = a.bwlimit;
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
    c.validate()
        .with_context(|| format!("config file {}", a.config.display()))?;
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("signal handler");
            let mut int = signal(SignalKind::interrupt()).expect("signal handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("stopping: draining and persisting");
            stop.cancel();
        });
    }
    match c.role {
        Role::Primary => {
            let metrics = Arc::new(Metrics::new(true));
            // RocksDB: follow the writer as a secondary (writers keep working).
            let engine = open_engine(&c.meta, true, false).await?;
            mirror_agent::site::check_primary(&*engine).await?;
            let p = mirror_agent::primary::Primary::new(
                c.primary.clone().expect("validated"),
                engine,
                metrics.clone(),
            )
            .await?;
            let admin = mirror_agent::admin::serve(c.admin, metrics, None, stop.clone()).await?;
            tracing::info!(admin = %c.admin, "admin endpoint: /metrics /status");
            let r = p.run(stop.clone()).await;
            stop.cancel();
            let _ = admin.await;
            r
        }
        Role::Mirror => {
            let metrics = Arc::new(Metrics::new(false));
            let state = Arc::new(mirror_agent::state::State::open(&c.state_dir)?);
            let engine = open_engine(&c.meta, false, true).await?;
            let m = mirror_agent::mirror::Mirror::new(
                c.mirror.clone().expect("validated"),
                engine,
                state,
                metrics.clone(),
            )
            .await?;
            let admin =
                mirror_agent::admin::serve(c.admin, metrics, Some(m.limits_arc()), stop.clone())
                    .await?;
            tracing::info!(admin = %c.admin, "admin endpoint: /metrics /status /limits");
            let r = m.run(stop.clone()).await;
            stop.cancel();
            let _ = admin.await;
            r
        }
    }
}
