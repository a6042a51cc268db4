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
    let mut warnings = warnings;
    if connect {
        if let Some(w) = origin_not_writable(&c).await {
            warnings.push(w);
        }
    }
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

/// At a mirror holding the volume already: whether this host can write the origin store, as
/// a mount writing through (the primary's `allow_writes`) must; a warning when it cannot.
async fn origin_not_writable(c: &Config) -> Option<String> {
    if c.role != mirror_agent::config::Role::Mirror {
        return None;
    }
    if let Some(p) = meta::local_dir(&c.meta) {
        if !p.join("CURRENT").exists() {
            return None; // created by `run`: nothing replicated yet
        }
    }
    match volume::origin_writable(&c.meta, None, None).await {
        Ok(Ok(())) => None,
        Ok(Err(why)) => Some(format!(
            "{why}: if the primary lets this mirror write (allow_writes), this site's mounts come up read-only until it can (runbooks/mirror-writes.md)"
        )),
        // No volume there yet (bootstrapping), or nothing to tell: the checks above spoke.
        Err(_) => None,
    }
}
