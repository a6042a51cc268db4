//! Everything `run` checks before it binds or writes, in one function that `check-config`
//! runs too, so the two can never disagree: the configuration (`Config::check`), and with
//! `connect` what it names: the metadata (a primary's must be a formatted volume of its own;
//! a mirror's must be empty or this mirror's), the agent's state directory (not in use by
//! another agent), the block stores; and for `check-config` the primary agent a mirror
//! follows (a handshake with its token, which changes nothing at the primary).
//! Nothing here writes (an existing state directory is opened to see that no other agent
//! holds it, and read).

use crate::config::{Config, Role};
use anyhow::{anyhow, bail, Result};
use std::path::Path;

/// How far the checks reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The configuration only.
    Config,
    /// Also what it names, as `run` does before it starts.
    Run,
    /// `Run`, and at a mirror the primary agent too (`check-config --connect`).
    Everything,
}

/// The checks; their warnings. An error says what `run` would refuse, in its words.
pub async fn check(c: &Config, how_far: Reach) -> Result<Vec<String>> {
    let mut warn = c.check().await?;
    if how_far != Reach::Config {
        warn.extend(reach(c, how_far).await?);
    }
    Ok(warn)
}

/// The checks of what the configuration names (`run` makes them after `Config::check`,
/// whose warnings it has logged by then); their warnings.
pub async fn reach(c: &Config, reach: Reach) -> Result<Vec<String>> {
    let mut warn = Vec::new();
    if reach == Reach::Config {
        return Ok(warn);
    }
    match c.role {
        Role::Primary => {
            let e = volume::open_engine(&c.meta, volume::Access::Read, None, false)
                .await
                .map_err(|e| anyhow!("meta: {e}"))?;
            crate::site::check_primary(&*e).await?;
            if e.get(fs_core::keys::SETTING).await?.is_none() {
                bail!(
                    "{} holds no formatted volume: run `jfs format` first",
                    e.display_url()
                );
            }
        }
        Role::Mirror => {
            let m = c.mirror.as_ref().expect("checked by Config::check");
            // The state directory: another agent's lock, and what it says of the metadata.
            let mut built_here = false;
            // Room on the disks `run` writes: the state and the mirror's metadata (RocksDB
            // sets aside its log and manifest at open), checked before either exists.
            crate::state::State::check_room(&c.state_dir)?;
            if let Some(dir) = meta::local_dir(&c.meta) {
                meta::check_writer_room(&dir).map_err(|m| anyhow!("meta: {m}"))?;
            }
            if c.state_dir.join("agent.db").join("CURRENT").exists() {
                let (queued, boot) = crate::state::State::probe(&c.state_dir)?;
                built_here = queued > 0 || boot;
            }
            let mut mirror_uuid = None;
            let mut identity = String::new();
            if !fresh_rocksdb(&c.meta) {
                let e = volume::open_engine(&c.meta, volume::Access::Read, None, false)
                    .await
                    .map_err(|e| anyhow!("meta: {e}"))?;
                // `run` opens it to write: a read-write mount holding it (the old primary's,
                // at a rejoin) stops it, whatever the metadata says.
                if let Some(s) = volume::writing_mount(&*e).await {
                    bail!("meta: {}", volume::locked_by_mount(&e.display_url(), &s));
                }
                crate::site::plan_claim(&*e, built_here, m).await?;
                mirror_uuid = fs_core::Fs::load_settings(&*e).await.ok().map(|s| s.uuid);
                identity = crate::site::identity(&*e).await?.unwrap_or_default();
            }
            for (what, url) in std::iter::once(("store", &m.store))
                .chain(m.origin_store.as_ref().map(|o| ("origin_store", o)))
            {
                if let Some(p) = url.strip_prefix("file://") {
                    if !Path::new(p).exists() {
                        continue; // created by `run`
                    }
                }
                let s = volume::open_store(url, None)
                    .map_err(|e| anyhow!("[mirror] {what} {url}: {e}"))?;
                s.check()
                    .await
                    .map_err(|e| anyhow!("[mirror] {what} {url}: {e}"))?;
            }
            if reach == Reach::Everything {
                match probe_primary(m, &identity).await? {
                    Some(served) if mirror_uuid.as_ref().is_some_and(|u| *u != served) => bail!(
                        "the primary at {} serves volume {served}, but this mirror's metadata holds volume {}: point [mirror] primary at this volume's primary, or `meta` at empty metadata",
                        m.primary,
                        mirror_uuid.unwrap_or_default()
                    ),
                    Some(_) => {}
                    None => warn.push(format!(
                        "the primary agent at {} proved this mirror's token but did not say which volume it serves",
                        m.primary
                    )),
                }
            }
        }
    }
    Ok(warn)
}

/// A `rocksdb://` metadata directory a mirror agent will create at its first start.
fn fresh_rocksdb(url: &str) -> bool {
    match url.strip_prefix("rocksdb://") {
        Some(p) => !Path::new(p.split('?').next().unwrap_or(p))
            .join("CURRENT")
            .exists(),
        None => false,
    }
}

/// The sentinel volume a probe claims to hold: the primary refuses it (after proving the
/// token both ways), before it registers a connection, touches a slot or streams anything.
const PROBE_VOLUME: &str = "check-config-probe";

/// Greet the primary agent as this mirror, with its token, and leave: an error names what a
/// running mirror would hit (nothing answers, not a primary agent, a wrong name or token).
/// The volume the primary serves, when it says.
/// `identity`: that of the mirror's metadata (empty when it has none yet), so that the
/// primary refuses it as it would refuse the agent if another copy holds the slot.
async fn probe_primary(m: &crate::config::MirrorConfig, identity: &str) -> Result<Option<String>> {
    use crate::handshake::{self, Welcome};
    let tls = crate::mirror::tls_for(m)?;
    let token = m.secret().load("[mirror]")?;
    let mut wire = crate::mirror::dial(&m.primary, &tls)
        .await
        .map_err(|e| anyhow!("[mirror] primary: {e:#} (is the primary agent running, and is this its `listen` address?)"))?;
    let hello = crate::proto::ToPrimary::Hello {
        proto: crate::proto::PROTO_VERSION,
        mirror: m.name.clone(),
        volume_uuid: Some(PROBE_VOLUME.into()),
        nonce: crate::proto::nonce(),
        want: crate::proto::Want::Snapshot,
        prev_crc: None,
        epoch: 0,
        identity: identity.to_string(),
    };
    match handshake::connect(
        &mut wire,
        &m.primary,
        &token,
        hello,
        std::time::Duration::from_secs(10),
    )
    .await
    {
        Ok(Welcome::In { .. }) | Ok(Welcome::Resync(_)) => Ok(None),
        Err(e) => {
            let msg = handshake::describe(&e);
            let marker = format!("the mirror holds volume {PROBE_VOLUME}, this primary serves ");
            match msg.find(&marker) {
                Some(i) => Ok(Some(
                    msg[i + marker.len()..]
                        .split(|c: char| c == ';' || c.is_whitespace())
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                )),
                None => Err(anyhow!("[mirror] primary {}: {msg}", m.primary)),
            }
        }
    }
}
