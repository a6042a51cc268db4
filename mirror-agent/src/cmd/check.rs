//! `mirror-agent check-config`: the checks `run` makes before it starts
//! (`mirror_agent::preflight`, the same function), and with `--connect` what it names too:
//! the metadata, the state directory, the block stores and, at a mirror, the primary agent.

use anyhow::{anyhow, Result};
use mirror_agent::config::Config;
use mirror_agent::preflight::{self, Reach};
use std::path::Path;

pub async fn check_config(path: Option<&Path>, connect: bool) -> Result<()> {
    let what = path.map_or("the configuration (environment only)".to_string(), |p| {
        p.display().to_string()
    });
    let c = Config::load(path)?;
    let reach = if connect {
        Reach::Everything
    } else {
        Reach::Config
    };
    let warnings = preflight::check(&c, reach)
        .await
        .map_err(|e| anyhow!("{what}: {e:#}"))?;
    for w in &warnings {
        println!("warning: {w}");
    }
    println!(
        "{what}: ok (role {:?}, admin {}{})",
        c.role,
        c.admin_addr(),
        if connect {
            match c.role {
                mirror_agent::config::Role::Primary => ", metadata reached",
                mirror_agent::config::Role::Mirror => {
                    ", metadata, stores and the primary agent reached"
                }
            }
        } else {
            ""
        }
    );
    Ok(())
}
