//! Moving the primary role: `fence` (at the old primary: no writer there commits any more,
//! and its agent ships nothing; the metadata is marked as a mirror of the new primary, ready
//! to rejoin, with a record of where the volume went for its mounts) and `promote` (at a
//! stopped mirror: its metadata becomes the primary at the next epoch).
//!
//! Planned migration: fence, wait until the mirror has applied the old primary's last entry
//! and copied every block, promote (checked with `--old-meta`): nothing acknowledged is lost.
//! Failover (`--force`, the old primary unreachable): promote at once; the entries the mirror
//! had not applied (from its last known lag) are reported as lost, and blocks not yet copied
//! stay readable from the old store (storage `switched`, the mirror store first) until
//! `jfs cutover verify` + `finish` settle it.

use crate::config::Config;
use crate::state::State;
use anyhow::{bail, Context, Result};
use fs_core::site::{self, Epoch, MirrorMarker, Moved};
use fs_core::storage::Phase;
use fs_core::Engine;
use std::sync::Arc;

async fn open(meta: &str, write: bool) -> Result<Arc<dyn Engine>> {
    let access = if write {
        volume::Access::Write
    } else {
        volume::Access::Read
    };
    volume::open_engine(meta, access, None, false)
        .await
        .with_context(|| format!("opening {}", meta::redact(meta)))
}

/// `mirror-agent fence`: the old primary's metadata becomes mirror `name` of the primary at
/// `new_primary`; `moved_to` (the new primary's META_URL) tells its mounts where to go.
pub async fn fence(
    old_meta: &str,
    name: &str,
    new_primary: &str,
    moved_to: Option<&str>,
) -> Result<String> {
    let e = open(old_meta, false).await?;
    let url = e.display_url();
    let settings = fs_core::Fs::load_settings(&*e).await?;
    let marker = MirrorMarker {
        version: site::MARKER_VERSION,
        name: name.to_string(),
        primary: new_primary.to_string(),
        store: settings.storage.clone(),
        origin_store: None,
        since_ns: fs_core::now_ns(),
    };
    let existing = site::marker(&*e).await?;
    if let Some(m) = &existing {
        if m.name != name || m.primary != new_primary {
            bail!(
                "{url} is already mirror {:?}'s metadata (following {}): it is not a primary to fence",
                m.name,
                m.primary
            );
        }
    }
    let epoch = site::epoch(&*e).await?;
    // Where the volume goes, first: a commit refused by the marker below then always finds
    // it, and waits for the new primary instead of failing.
    if let Some(to) = moved_to {
        let m = Moved {
            version: site::MARKER_VERSION,
            meta_url: meta::redact(to),
            epoch: epoch + 1,
            at_seq: 0,
            at_ns: fs_core::now_ns(),
        };
        site::set_moved(&*e, Some(&m)).await?;
    }
    if existing.is_none() {
        site::set_marker(&*e, &marker).await?;
    }
    // Commits in flight when the marker appeared have ended once this read sees the head.
    let head = e.journal_bounds().await?.last;
    if let Some(mut m) = site::moved(&*e).await? {
        m.at_seq = head;
        site::set_moved(&*e, Some(&m)).await?;
    }
    tracing::warn!(meta = %url, head, "fenced: this metadata refuses every writer and its agent ships nothing");
    Ok(format!(
        "fenced {url} at seq {head} (epoch {epoch}): writers there are refused, its primary agent ships nothing; it is now mirror {name:?} of {new_primary}{}. Next: wait until the mirror has applied seq {head} (mirror-agent status --wait-applied {head}), stop it, then promote it",
        if moved_to.is_some() { "; its mounts move to the new primary by themselves" } else { "" }
    ))
}

/// `mirror-agent promote`.
pub async fn promote(cfg: &Config, old_meta: Option<&str>, force: bool) -> Result<String> {
    let m = cfg
        .mirror
        .as_ref()
        .context("promote needs a mirror's config ([mirror] section)")?;
    let state = State::open(&cfg.state_dir)
        .map_err(|e| anyhow::anyhow!("{e:#}: stop the mirror agent before promoting its mirror"))?;
    let e = open(&cfg.meta, true).await?;
    let url = e.display_url();
    // A promotion killed after the marker went: finish it.
    if let Some(ep) = site::promoting(&*e).await? {
        if site::epoch(&*e).await? < ep.epoch {
            let phase = promoted_phase(&state, m, &fs_core::Fs::load_settings(&*e).await?)?;
            site::commit_promotion(&*e, &ep, phase).await?;
        }
        site::set_promoting(&*e, None).await?;
        return Ok(format!(
            "{url} is the primary at epoch {} (an interrupted promotion was finished)",
            ep.epoch
        ));
    }
    let Some(marker) = site::marker(&*e).await? else {
        bail!("{url} is not a mirror's metadata (no mirror marker): nothing to promote");
    };
    if marker.name != m.name {
        bail!(
            "{url} is mirror {:?}'s metadata, not {:?}'s",
            marker.name,
            m.name
        );
    }
    if fs_core::slots::incomplete(&*e).await?.is_some() || state.bootstrap()?.is_some() {
        bail!("{url} is bootstrapping: its tree is incomplete; it cannot become the primary until it has caught up");
    }
    let applied = e.journal_bounds().await?.last;
    let (pending, _, _) = state.pending()?;
    let mut lost = String::new();
    match (old_meta, force) {
        (Some(old), _) => {
            let o = open(old, false).await?;
            let Some(om) = site::marker(&*o).await? else {
                bail!("the old primary {} is not fenced: run `mirror-agent fence --meta OLD_META --as NAME --new-primary ADDR` there first (its writers could go on committing what this mirror never receives)", o.display_url());
            };
            let head = o.journal_bounds().await?.last;
            if head > applied && !force {
                bail!("the old primary's last entry is {head} and this mirror has applied {applied}: start the agent and wait (`mirror-agent status --wait-applied {head}`), stop it, then promote");
            }
            let _ = om;
        }
        (None, false) => bail!("give --old-meta OLD_META_URL (a planned move: it checks that the old primary is fenced and that this mirror has applied its last entry), or --force (failover: the old primary is unreachable; what it had that this mirror had not applied is lost, and reported)"),
        (None, true) => {
            // A forced promotion beside a primary that still serves forks the volume:
            // two writable histories. Ask the old primary's agent first.
            match probe_old_primary(m, &marker, applied, site::epoch(&*e).await?).await {
                OldPrimary::Serving(why) => bail!(
                    "the old primary at {} answers and is not known to be fenced ({why}): promoting by force now would fork the volume, two primaries taking writes. Fence it (`mirror-agent fence --meta OLD_META --as NAME --new-primary ADDR`) and promote with --old-meta OLD_META (a planned move, nothing lost); if its metadata cannot be reached, stop that agent and its writers first",
                    marker.primary
                ),
                OldPrimary::Fenced => {
                    tracing::info!(primary = %marker.primary, "the old primary answers and is fenced")
                }
                OldPrimary::Gone(why) => {
                    tracing::info!(primary = %marker.primary, %why, "the old primary does not answer")
                }
            }
            let known = site::progress(&*e).await?.map_or(applied, |p| p.primary_head_seq);
            let n = known.saturating_sub(applied);
            lost = format!("; LOSS WINDOW: the old primary had at least {n} entries this mirror had not applied (its last known head was {known}, this mirror applied {applied}): they are lost unless the old site is recovered");
        }
    }
    if pending > 0 && !force {
        bail!("{pending} blocks are not copied to this mirror's store yet: start the agent, wait until `mirror-agent status` shows 0 pending, stop it, then promote");
    }
    let settings = fs_core::Fs::load_settings(&*e).await?;
    let epoch = site::epoch(&*e).await?;
    let ep = Epoch {
        version: site::MARKER_VERSION,
        epoch: epoch + 1,
        site: m.name.clone(),
        at_seq: applied,
        at_ns: fs_core::now_ns(),
        from: marker.primary.clone(),
    };
    let phase = promoted_phase(&state, m, &settings)?;
    site::set_promoting(&*e, Some(&ep)).await?;
    site::detach(&*e, &marker).await?;
    let seq = site::commit_promotion(&*e, &ep, phase.clone()).await?;
    site::set_promoting(&*e, None).await?;
    tracing::warn!(meta = %url, epoch = ep.epoch, seq, "promoted: this metadata is the volume's primary");
    Ok(format!(
        "promoted {url}: the volume's primary at epoch {} from seq {applied} (its first entry as primary is {seq}); blocks: {}{lost}. Next: run a primary agent beside it (mirrors, including the old primary once fenced, follow it), and point clients at it; the old state_dir of this mirror agent is not needed any more",
        ep.epoch,
        phase.describe()
    ))
}

/// Where the new primary's blocks are: its own store when every block was copied, else the
/// mirror store first and the old store for what it lacks.
fn promoted_phase(
    state: &State,
    m: &crate::config::MirrorConfig,
    settings: &fs_core::Settings,
) -> Result<Phase> {
    let (pending, _, _) = state.pending()?;
    let origin = m.origin_store.clone().unwrap_or(settings.storage.clone());
    Ok(if pending == 0 || origin == m.store {
        Phase::Single {
            store: m.store.clone(),
        }
    } else {
        Phase::Switched {
            from: origin,
            to: m.store.clone(),
        }
    })
}

/// What the old primary's agent says to a forced promotion.
enum OldPrimary {
    /// It answered this mirror's handshake (or proved it is a primary agent) and is not
    /// fenced.
    Serving(String),
    /// It answered and refuses mirrors because it was fenced.
    Fenced,
    /// No primary agent answers there (stopped, unreachable, something else listening).
    Gone(String),
}

/// Greet the old primary as this mirror would (its token when the config gives one), and
/// leave before anything is streamed.
async fn probe_old_primary(
    m: &crate::config::MirrorConfig,
    marker: &MirrorMarker,
    applied: u64,
    epoch: u64,
) -> OldPrimary {
    use crate::handshake::{self, Permanent, Welcome};
    let tls = match crate::mirror::tls_for(m) {
        Ok(t) => t,
        Err(e) => return OldPrimary::Gone(format!("no TLS connector: {e:#}")),
    };
    // Without the token the handshake still shows whether an agent answers (it proves
    // itself first); then its fence cannot be checked, and it counts as serving.
    let token = m.secret().load("[mirror]").unwrap_or_default();
    let mut wire = match crate::mirror::dial(&marker.primary, &tls).await {
        Ok(w) => w,
        Err(e) => return OldPrimary::Gone(format!("{e:#}")),
    };
    let hello = crate::proto::ToPrimary::Hello {
        proto: crate::proto::PROTO_VERSION,
        mirror: m.name.clone(),
        volume_uuid: None,
        nonce: crate::proto::nonce(),
        want: crate::proto::Want::From(applied + 1),
        prev_crc: None,
        epoch,
    };
    let r = handshake::connect(
        &mut wire,
        &marker.primary,
        &token,
        hello,
        std::time::Duration::from_secs(5),
    )
    .await;
    match r {
        Ok(Welcome::In { head, .. }) => OldPrimary::Serving(format!("its head is {head}")),
        Ok(Welcome::Resync(why)) => OldPrimary::Serving(why),
        Err(e) => match e.downcast_ref::<Permanent>() {
            Some(p) if p.0.contains("this primary was fenced") => OldPrimary::Fenced,
            Some(p) => OldPrimary::Serving(p.0.clone()),
            None => OldPrimary::Gone(format!("{e:#}")),
        },
    }
}
