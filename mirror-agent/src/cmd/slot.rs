//! `mirror-agent slot list|drop`: a volume's replication slots. A drop goes through the
//! running primary agent when there is one (it writes the acknowledgements, so only it can
//! drop a slot without a racing acknowledgement bringing it back, and its status then shows
//! the slot gone); with no agent running it is done directly in the volume's metadata.

use crate::AdminArgs;
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use mirror_agent::primary::{Lease, LEASE};

#[derive(Subcommand)]
pub enum SlotCmd {
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
        /// How to reach the running primary agent (its admin token is needed).
        #[command(flatten)]
        admin: AdminArgs,
    },
}

async fn open(meta: &str) -> Result<std::sync::Arc<dyn fs_core::Engine>> {
    volume::open_engine(meta, volume::Access::Read, None, false)
        .await
        .map_err(|e| anyhow!("{e}"))
}

pub async fn run(cmd: SlotCmd) -> Result<()> {
    match cmd {
        SlotCmd::List { meta, json } => {
            let e = open(&meta).await?;
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
        SlotCmd::Drop { name, meta, admin } => {
            let e = open(&meta).await?;
            if fs_core::slots::get(&*e, &name).await?.is_none() {
                bail!("no replication slot named {name:?} (see `mirror-agent slot list`)");
            }
            if let Some((addr, pid)) = running_primary(&*e).await? {
                let (_, token) = super::client::target(&admin)?;
                let Some(token) = token else {
                    bail!("the primary agent (pid {pid}, admin {addr}) keeps this volume's slots: drop it through that agent with its admin token (--admin-token-file FILE, MIRROR_AGENT_ADMIN_TOKEN, or --config with admin_token_env/admin_token_file), or stop the agent first");
                };
                let r = reqwest::Client::new()
                    .delete(format!("http://{addr}/slots/{name}"))
                    .bearer_auth(token)
                    .timeout(std::time::Duration::from_secs(10))
                    .send()
                    .await
                    .with_context(|| format!("the primary agent at {addr} does not answer"))?;
                let ok = r.status().is_success();
                let body = r.text().await.unwrap_or_default();
                if !ok {
                    bail!("the primary agent at {addr}: {}", body.trim());
                }
                println!("{}", body.trim());
                return Ok(());
            }
            fs_core::slots::remove(&*e, &name).await?;
            println!("dropped slot {name:?}: gc and journal retention no longer wait for it; the mirror must resync");
            Ok(())
        }
    }
}

/// The admin address and pid of a primary agent that keeps this volume's slots now, from the
/// lease it refreshes every few seconds.
async fn running_primary(e: &dyn fs_core::Engine) -> Result<Option<(String, u64)>> {
    let Some(v) = fs_core::site::aux_exact(e, LEASE).await? else {
        return Ok(None);
    };
    let lease = match fs_core::record::decode::<Lease>(&v) {
        Ok(l) => l,
        // A newer agent keeps the slots: never go around it.
        Err(e) if e.kind() == fs_core::ErrorKind::UnsupportedVersion => {
            bail!("{e} (the agent that keeps this volume's slots is of a newer release: drop the slot with that release)")
        }
        // Unreadable: as if there were none (a stale lease is ignored the same way).
        Err(_) => return Ok(None),
    };
    Ok(lease
        .live(fs_core::now_ns())
        .and_then(|l| l.admin.map(|a| (a, l.pid))))
}
