//! `mirror-agent check-config`: the checks `run` makes before it starts, and with
//! `--connect` the metadata engine and block stores reached read-only.

use anyhow::{anyhow, Result};
use mirror_agent::config::{Config, Role};
use std::path::Path;

pub async fn check_config(path: Option<&Path>, connect: bool) -> Result<()> {
    let what = path.map_or("the configuration (environment only)".to_string(), |p| {
        p.display().to_string()
    });
    let c = Config::load(path)?;
    let warnings = c.check().await.map_err(|e| anyhow!("{what}: {e:#}"))?;
    if connect {
        reach(&c).await.map_err(|e| anyhow!("{what}: {e:#}"))?;
    }
    for w in &warnings {
        println!("warning: {w}");
    }
    println!(
        "{what}: ok (role {:?}, admin {}{})",
        c.role,
        c.admin_addr(),
        if connect {
            ", metadata and stores reached"
        } else {
            ""
        }
    );
    Ok(())
}

/// Reach what the agent will use, without writing anything.
async fn reach(c: &Config) -> Result<()> {
    let fresh = match c.meta.strip_prefix("rocksdb://") {
        Some(p) => !Path::new(p.split('?').next().unwrap_or(p))
            .join("CURRENT")
            .exists(),
        None => false,
    };
    if c.role == Role::Mirror && fresh {
        // A new mirror's RocksDB directory does not exist yet: `run` creates it.
    } else {
        let e = volume::open_engine(&c.meta, volume::Access::Read, None, false)
            .await
            .map_err(|e| anyhow!("meta: {e}"))?;
        e.journal_bounds().await.map_err(|e| anyhow!("meta: {e}"))?;
    }
    if let Some(m) = &c.mirror {
        if c.role == Role::Mirror {
            for (what, url) in std::iter::once(("store", &m.store))
                .chain(m.origin_store.as_ref().map(|o| ("origin_store", o)))
            {
                if url.starts_with("file://") && !Path::new(&url["file://".len()..]).exists() {
                    continue; // created by `run`
                }
                let s =
                    volume::open_store(url, None).map_err(|e| anyhow!("[mirror] {what}: {e}"))?;
                s.check()
                    .await
                    .map_err(|e| anyhow!("[mirror] {what}: {e}"))?;
            }
        }
    }
    Ok(())
}
