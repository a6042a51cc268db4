//! `mirror-agent`: wiring only (flags, logging, exit codes 0 done / 2 error); each subcommand
//! lives in `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};
use mirror_agent::config::Role;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mirror-agent",
    version,
    about = "Ships a volume's journal to mirror sites and replicates its blocks",
    max_term_width = 100
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
    /// More logging (-v debug, -vv trace); `JFS_LOG` takes a tracing filter.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

/// How a command finds a running agent: `--admin`, or the `admin` of `--config`, or else the
/// primary's and the mirror's default addresses in turn.
#[derive(clap::Args, Clone)]
pub struct AdminArgs {
    /// The agent's admin address (default: 127.0.0.1:9567, a primary's, then
    /// 127.0.0.1:9568, a mirror's).
    #[arg(long, env = "MIRROR_AGENT_ADMIN")]
    pub admin: Option<SocketAddr>,
    /// Take the admin address (and admin token) from this agent config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The admin token, for changes: a file whose first line it is (else
    /// MIRROR_AGENT_ADMIN_TOKEN, else the config's admin_token_env/admin_token_file).
    #[arg(long, value_name = "FILE", env = "MIRROR_AGENT_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (SIGTERM/SIGINT: drain, persist, exit 0). With no --config, every
    /// setting comes from MIRROR_AGENT_* variables.
    Run(cmd::run::RunArgs),
    /// Print a running agent's status (role, sequence numbers, lag, window, blocks, errors).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
        #[arg(long)]
        json: bool,
        /// Mirror: first wait until it has applied this seq with no block copy pending.
        #[arg(long, value_name = "SEQ")]
        wait_applied: Option<u64>,
        /// How long --wait-applied may wait.
        #[arg(long, default_value = "120s")]
        timeout: humantime::Duration,
    },
    /// Change a running mirror's block copy limits (needs the admin token).
    Limits {
        #[command(flatten)]
        admin: AdminArgs,
        /// Bytes/s ("100M", "off", or a timetable "08:00,10M 18:00,off").
        #[arg(long)]
        bwlimit: Option<String>,
        /// Requests/s (0 = unlimited).
        #[arg(long)]
        tps: Option<u32>,
    },
    /// Make a running mirror bootstrap again from a snapshot (needs the admin token). A mirror
    /// that serves a consistent state installs it beside its metadata and keeps serving the
    /// previous state (stale) until it switches, in one atomic write, once caught up.
    Resync {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Check a config (and the environment over it) with every check `run` makes before it
    /// starts: URLs, secrets, TLS files, the state directory, plaintext across a network.
    CheckConfig {
        #[arg(long, env = "MIRROR_AGENT_CONFIG")]
        config: Option<PathBuf>,
        /// Also reach the metadata engine and the block stores (read-only).
        #[arg(long)]
        connect: bool,
    },
    /// Make a stopped mirror's metadata a volume of its own, writable, with its blocks in the
    /// mirror store. Refused while the agent runs or while blocks are still being copied.
    Detach {
        /// The mirror agent's config (its `meta`, `state_dir` and `[mirror]`).
        #[arg(long, env = "MIRROR_AGENT_CONFIG", conflicts_with = "meta")]
        config: Option<PathBuf>,
        /// Metadata whose mirror marker names the volume's own store (a fenced primary, or a
        /// mirror sharing its primary's store), detached without an agent config: every block
        /// is already where the volume says.
        #[arg(long, value_name = "META_URL")]
        meta: Option<String>,
    },
    /// At the old primary (a planned move, or when a failed primary comes back): refuse every
    /// writer there and stop its agent shipping; the metadata becomes mirror NAME of the new
    /// primary, ready to rejoin it (runbooks/site-migration.md, failover.md).
    Fence {
        /// The old primary's META_URL.
        #[arg(long)]
        meta: String,
        /// The name this site will have as a mirror of the new primary.
        #[arg(long = "as", value_name = "NAME")]
        name: String,
        /// The new primary agent's address (host:port of its `listen`).
        #[arg(long, value_name = "ADDR")]
        new_primary: String,
        /// The new primary's META_URL: the old site's mounts move there by themselves.
        #[arg(long, value_name = "META_URL")]
        moved_to: Option<String>,
        /// Fence without checking what it is told (that --moved-to is this volume's mirror or
        /// its promoted primary, that a primary agent answers at --new-primary).
        #[arg(long)]
        force: bool,
    },
    /// Make a stopped mirror the volume's primary at the next epoch. Planned (--old-meta):
    /// the old primary must be fenced and fully applied here. Failover (--force): at once,
    /// reporting the entries lost.
    Promote {
        #[arg(long, env = "MIRROR_AGENT_CONFIG")]
        config: Option<PathBuf>,
        /// The old primary's META_URL, to check it is fenced and fully applied.
        #[arg(long, value_name = "META_URL")]
        old_meta: Option<String>,
        /// Promote without the old primary's agent (unreachable). With --old-meta, its
        /// metadata is fenced first when it can be reached (the loss window is then exact);
        /// what it had not shipped is saved at the old site when it rejoins.
        #[arg(long)]
        force: bool,
        /// With --force: the old site's name as a mirror of this one, for the fence.
        #[arg(long = "as", value_name = "NAME", requires = "force")]
        fence_as: Option<String>,
        /// With --force: this site's future primary agent address (its `listen`), for the
        /// fence.
        #[arg(long, value_name = "ADDR", requires = "force")]
        new_primary: Option<String>,
    },
    /// Replication slots of a volume (primary side).
    Slot {
        #[command(subcommand)]
        cmd: cmd::slot::SlotCmd,
    },
}

/// Never suggested for a mistyped flag or subcommand.
const DESTRUCTIVE: &[&str] = &["drop", "detach", "--force", "fence", "promote"];

fn main() -> ExitCode {
    cli_common::quiet_on_closed_pipe();
    let (cli, _) = cli_common::parse::<Cli>(DESTRUCTIVE);
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    cli_common::init_logging(level, matches!(cli.log_format, LogFormat::Json), "JFS_LOG");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            cli_common::eprintln!("mirror-agent: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let res = cli_common::on_closed_pipe(|| {
        rt.block_on(async move {
            match cli.cmd {
                Cmd::Run(a) => cmd::run::run(a).await,
                Cmd::Status {
                    admin,
                    json,
                    wait_applied,
                    timeout,
                } => cmd::client::status(&admin, json, wait_applied, timeout.into()).await,
                Cmd::Limits {
                    admin,
                    bwlimit,
                    tps,
                } => cmd::client::limits(&admin, bwlimit, tps).await,
                Cmd::Resync { admin } => cmd::client::resync(&admin).await,
                Cmd::CheckConfig { config, connect } => {
                    cmd::check::check_config(config.as_deref(), connect).await
                }
                Cmd::Detach {
                    meta: Some(meta), ..
                } => {
                    println!("{}", mirror_agent::site::detach_meta(&meta).await?);
                    Ok(())
                }
                Cmd::Detach { config, .. } => {
                    let c = mirror_agent::config::Config::load(config.as_deref())?;
                    if c.role != Role::Mirror {
                        anyhow::bail!(
                            "detach applies to a mirror: this config has role = \"primary\""
                        );
                    }
                    println!("{}", mirror_agent::site::detach(&c).await?);
                    Ok(())
                }
                Cmd::Fence {
                    meta,
                    name,
                    new_primary,
                    moved_to,
                    force,
                } => {
                    let r = mirror_agent::promote::fence(&mirror_agent::promote::FenceArgs {
                        meta: &meta,
                        name: &name,
                        new_primary: &new_primary,
                        moved_to: moved_to.as_deref(),
                        force,
                    })
                    .await?;
                    println!("{r}");
                    Ok(())
                }
                Cmd::Promote {
                    config,
                    old_meta,
                    force,
                    fence_as,
                    new_primary,
                } => {
                    let c = mirror_agent::config::Config::load(config.as_deref())?;
                    if c.role != Role::Mirror {
                        anyhow::bail!(
                            "promote applies to a mirror: this config has role = \"primary\""
                        );
                    }
                    println!(
                        "{}",
                        mirror_agent::promote::promote(
                            &c,
                            &mirror_agent::promote::PromoteArgs {
                                old_meta: old_meta.as_deref(),
                                force,
                                fence_as: fence_as.as_deref(),
                                new_primary: new_primary.as_deref(),
                            }
                        )
                        .await?
                    );
                    Ok(())
                }
                Cmd::Slot { cmd } => cmd::slot::run(cmd).await,
            }
        })
    })
    .unwrap_or(Ok(()));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if cli_common::closed_pipe(e.chain()) => ExitCode::SUCCESS,
        Err(e) => {
            cli_common::eprintln!("mirror-agent: error: {}", cli_common::chain_text(e.chain()));
            ExitCode::from(2)
        }
    }
}
