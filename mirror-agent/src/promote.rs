//! Moving the primary role: `fence` (at the old primary: no writer there commits any more,
//! and its agent ships nothing; the metadata is marked as a mirror of the new primary, ready
//! to rejoin, with a record of where the volume went for its mounts) and `promote` (at a
//! stopped mirror: its metadata becomes the primary at the next epoch).
//!
//! Planned migration: fence, wait until the mirror has applied the old primary's last entry
//! and copied every block, promote (checked with `--old-meta`): nothing acknowledged is lost.
//! Failover (`--force`, the old primary's agent unreachable): the old metadata is fenced
//! first when it can be reached (`--old-meta`), so the loss window is exact and closed;
//! otherwise the promotion says loudly that the old site may go on taking writes. Blocks not
//! yet copied stay readable from the old store (storage `switched`, the mirror store first)
//! until `jfs cutover verify` + `finish` settle it. What the old site committed that this
//! history lacks is saved when it rejoins (`mirror::rollback`).
//!
//! Every check runs before anything is written: a refused fence or promotion changes nothing.

use crate::config::Config;
use crate::state::State;
use anyhow::{anyhow, bail, Context, Result};
use fs_core::site::{self, Epoch, Fenced, MirrorMarker, Moved};
use fs_core::storage::Phase;
use fs_core::Engine;
use std::sync::Arc;
use std::time::Duration;

/// How long reaching another site's metadata may take before it counts as unreachable.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

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

/// Open another site's metadata read-only (a RocksDB secondary: it works beside a process
/// that holds the writer's lock, a mount), within `REACH_TIMEOUT`.
async fn reach(meta: &str) -> Result<Arc<dyn Engine>> {
    match tokio::time::timeout(REACH_TIMEOUT, open(meta, false)).await {
        Ok(r) => r,
        Err(_) => bail!(
            "opening {}: no answer within {REACH_TIMEOUT:?}",
            meta::redact(meta)
        ),
    }
}

/// What `mirror-agent fence` is told.
pub struct FenceArgs<'a> {
    /// The old primary's META_URL.
    pub meta: &'a str,
    /// The name the old site will have as a mirror of the new primary.
    pub name: &'a str,
    /// The new primary agent's address (its `listen`).
    pub new_primary: &'a str,
    /// The new primary's META_URL, where the old site's mounts move.
    pub moved_to: Option<&'a str>,
    /// Skip the checks of what it is told (a new primary not reachable from here, say).
    pub force: bool,
}

/// What the new primary's metadata (`--moved-to`) turned out to be.
enum Target {
    /// A mirror of this volume, not promoted yet: a planned move. Its metadata's identity,
    /// which its agent answers with at its `[mirror] listen` (`mirror::awaiting`).
    Mirror { identity: Option<String> },
    /// Already the primary, at `epoch`: a failover, the old site comes back.
    Promoted(u64),
}

/// `mirror-agent fence`: the old primary's metadata becomes mirror `name` of the primary at
/// `new_primary`; `moved_to` (the new primary's META_URL) tells its mounts where to go. Checks
/// first (unless `force`) that `moved_to` is this volume's mirror or its promoted primary,
/// and that a primary agent answers at `new_primary` when it should already run.
pub async fn fence(a: &FenceArgs<'_>) -> Result<String> {
    // Read access: a RocksDB secondary, so a mount holding the writer's lock does not stop
    // the fence (it writes only records beside the metadata, which a secondary may).
    let e = open(a.meta, false).await?;
    let url = e.display_url();
    let settings = fs_core::Fs::load_settings(&*e).await?;
    let epoch = site::epoch(&*e).await?;
    let repeat = check_fenceable(&*e, &url, a, epoch).await?;
    let mut notes = Vec::new();
    let target = match a.moved_to {
        Some(to) if !a.force => Some(check_moved_to(to, &url, &settings, epoch).await?),
        _ => None,
    };
    // A primary agent answering at the new address means the new site runs as the primary
    // already (in a planned move its agent starts after the promotion).
    let answered = if a.force {
        false
    } else {
        check_new_primary(a, &target, &mut notes).await?
    };
    let head = fence_now(
        &*e,
        a,
        epoch,
        &settings.storage,
        "mirror-agent fence",
        false,
    )
    .await?;
    tracing::warn!(meta = %url, head, "fenced: this metadata refuses every writer and its agent ships nothing");
    let next = match target {
        Some(Target::Promoted(ep)) => format!(
            "Next: the new primary is already promoted (epoch {ep}): start a mirror agent here named {:?} following {} (runbooks/failover.md, step 4); what this site committed that the new primary never received is saved when it rejoins",
            a.name, a.new_primary
        ),
        Some(Target::Mirror { .. }) => format!(
            "Next: wait until the mirror has applied seq {head} (mirror-agent status --wait-applied {head}), stop it, then promote it (mirror-agent promote --config MIRROR_CONFIG --old-meta {url})"
        ),
        None if answered => format!(
            "Next: a primary agent answers at {} already (a failover): start a mirror agent here named {:?} following it (runbooks/failover.md, step 4); what this site committed that the new primary never received is saved when it rejoins",
            a.new_primary, a.name
        ),
        None => format!(
            "Next: a planned move: wait until the mirror has applied seq {head} (mirror-agent status --wait-applied {head}), stop it, then promote it; after a failover (the new primary promoted already): start a mirror agent here named {:?} following {}",
            a.name, a.new_primary
        ),
    };
    let mut out = format!(
        "{}fenced {url} at seq {head} (epoch {epoch}): writers there are refused, its primary agent ships nothing; it is now mirror {:?} of {}{}.",
        if repeat { "(already fenced, recorded again) " } else { "" },
        a.name,
        a.new_primary,
        match a.moved_to {
            Some(to) if meta::local_dir(to).is_some() => format!(
                "; its mounts do not follow to embedded metadata (they stay, read-only): unmount them and mount {} at its site",
                meta::redact(to)
            ),
            Some(_) => "; its mounts move to the new primary by themselves".to_string(),
            None => String::new(),
        }
    );
    for n in notes {
        out.push_str(&format!(" Note: {n}."));
    }
    out.push(' ');
    out.push_str(&next);
    Ok(out)
}

/// Whether this metadata may be fenced as `a` says: a primary (not fenced yet), or a fence
/// of the same name and new primary repeated before the site rejoined (returns true). A
/// mirror, or a fenced site that has rejoined since, is refused, naming what it is.
async fn check_fenceable(e: &dyn Engine, url: &str, a: &FenceArgs<'_>, epoch: u64) -> Result<bool> {
    let Some(m) = site::marker(e).await? else {
        return Ok(false);
    };
    match site::fenced(e).await? {
        Some(f) if epoch > f.epoch => bail!(
            "{url} is mirror {:?} of the primary at {} (epoch {epoch}): it was fenced at seq {} (epoch {}) and has rejoined as a mirror since; it is not a primary to fence. To move the primary role again, promote a mirror of the current primary (runbooks/site-migration.md)",
            m.name, m.primary, f.at_seq, f.epoch
        ),
        Some(f) if f.name == a.name && f.primary == a.new_primary => Ok(true),
        Some(f) => bail!(
            "{url} was fenced already (by {}, at seq {}) as mirror {:?} of {}: repeat the fence with that --as and --new-primary, or undo it first (`mirror-agent detach --meta {url}`)",
            f.by, f.at_seq, f.name, f.primary
        ),
        None => {
            // Fenced by an earlier release (a move recorded to an epoch not reached yet), or
            // a mirror's metadata.
            let moved = site::moved(e).await?;
            if m.name == a.name
                && m.primary == a.new_primary
                && moved.as_ref().is_some_and(|mv| mv.epoch > epoch)
            {
                return Ok(true);
            }
            bail!(
                "{url} is mirror {:?}'s metadata (it follows the primary at {}, epoch {epoch}): it is not a primary to fence",
                m.name,
                m.primary
            )
        }
    }
}

/// `--moved-to` must be this volume's mirror (a planned move) or its promoted primary (a
/// failover), never this metadata itself nor another volume.
async fn check_moved_to(
    to: &str,
    url: &str,
    settings: &fs_core::Settings,
    epoch: u64,
) -> Result<Target> {
    let redacted = meta::redact(to);
    if redacted == url {
        bail!(
            "--moved-to {redacted} is the metadata being fenced: give the new primary's META_URL"
        );
    }
    let t = reach(to).await.map_err(|e| {
        anyhow!("--moved-to {redacted} cannot be reached ({e:#}): give the new primary's META_URL as its mounts will open it, or --force to fence without checking")
    })?;
    if t.display_url() == url {
        bail!(
            "--moved-to {redacted} is the metadata being fenced: give the new primary's META_URL"
        );
    }
    let ts = fs_core::Fs::load_settings(&*t).await.map_err(|e| {
        anyhow!("--moved-to {redacted} holds no volume ({e}): give the new primary's META_URL, or --force")
    })?;
    if ts.uuid != settings.uuid {
        bail!(
            "--moved-to {redacted} holds volume {:?} (uuid {}), not this volume {:?} (uuid {}): give the META_URL of this volume's mirror or new primary",
            ts.name,
            ts.uuid,
            settings.name,
            settings.uuid
        );
    }
    if site::marker(&*t).await?.is_some() {
        return Ok(Target::Mirror {
            identity: crate::site::identity(&*t).await?,
        });
    }
    let te = site::epoch(&*t).await?;
    if te > epoch {
        return Ok(Target::Promoted(te));
    }
    bail!(
        "--moved-to {redacted} holds this volume but is neither a mirror of it nor a primary promoted past epoch {epoch} (it is at epoch {te}, with no mirror marker): fencing would send the mounts to a volume that forks this one; check the URL"
    )
}

/// Something must answer at `new_primary` as told: in a planned move (`--moved-to` a mirror
/// not promoted yet) the agent of that mirror, by its `[mirror] listen`, naming that copy of
/// the metadata; otherwise a primary agent. Whether a primary agent answered.
async fn check_new_primary(
    a: &FenceArgs<'_>,
    target: &Option<Target>,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let Some((_, port)) = a.new_primary.rsplit_once(':') else {
        bail!(
            "--new-primary {:?} is not HOST:PORT (the new primary agent's `listen`)",
            a.new_primary
        );
    };
    if port.parse::<u16>().is_err() {
        bail!("--new-primary {:?}: {port:?} is not a port", a.new_primary);
    }
    let to = a.moved_to.map(meta::redact).unwrap_or_default();
    let np = a.new_primary;
    match (probe_agent(np, a.name).await, target) {
        (Probe::Awaiting(d), Some(Target::Mirror { identity })) => {
            if identity.as_deref().map(crate::mirror::awaiting::digest).as_deref() == Some(d.as_str()) {
                notes.push(format!(
                    "the agent of mirror {to} answers at {np} (it serves as the primary there once promoted)"
                ));
                return Ok(false);
            }
            bail!(
                "the agent answering at --new-primary {np} is another mirror's (metadata {d}), not the agent of --moved-to {to}: a planned move goes to the mirror whose agent serves at --new-primary once promoted; check both (the `listen` of that mirror agent's [mirror] section), or --force to fence without checking"
            )
        }
        (Probe::Awaiting(_), _) => bail!(
            "--new-primary {np} is a mirror's agent awaiting promotion, not a primary: for a planned move to it give --moved-to with that mirror's META_URL; --force fences without checking"
        ),
        (Probe::Answers, Some(Target::Mirror { .. })) => bail!(
            "a primary agent already answers at --new-primary {np}, but --moved-to {to} is a mirror not promoted yet (its primary agent starts after the promotion): check the address (the `listen` of that mirror agent's [mirror] section), or --force to fence without checking"
        ),
        (Probe::Answers, _) => Ok(true),
        (Probe::Nothing(why), target) => match target {
            Some(Target::Mirror { .. }) => bail!(
                "nothing answers at --new-primary {np} ({why}): in a planned move the agent of mirror {to} answers there (set `listen = \"{np}\"` in its [mirror] section, the address its primary agent will listen on once promoted, and restart it), so the fence knows the move goes to that mirror; check the address, or --force to fence without checking"
            ),
            _ => bail!(
                "no primary agent answers at --new-primary {} ({why}): check the address (the new primary agent's `listen`, not its admin port) and that the agent runs; for a planned move give --moved-to NEW_META (the mirror to be promoted); --force fences without checking",
                a.new_primary
            ),
        },
    }
}

enum Probe {
    /// A primary agent answered (whether it lists the name, only the token can tell: the
    /// handshake reveals no names).
    Answers,
    /// The agent of a mirror awaiting promotion answered, for the metadata of this digest
    /// (`mirror::awaiting`).
    Awaiting(String),
    /// Nothing (or something else) answers.
    Nothing(String),
}

/// Greet `addr` as mirror `name` without a token: a primary agent answers with its challenge
/// (or, of another protocol version, a refusal); the connection is then dropped.
async fn probe_agent(addr: &str, name: &str) -> Probe {
    match probe_agent_at(addr, name).await {
        // An agent's admin address (HTTP) does not speak the protocol: say so, and which
        // address to give, rather than "nothing answers".
        Probe::Nothing(why) => Probe::Nothing(match admin_port(addr).await {
            Some(what) => format!(
                "{addr} is {what}, not where an agent's replication listens: give the `listen` address of that agent's [mirror] section (where its primary agent will listen once promoted) or of the primary agent's [primary] section, not its `admin`"
            ),
            None => why,
        }),
        p => p,
    }
}

/// When `addr` serves an agent's admin endpoint (`GET /status` answers with its role), what
/// it is, in words ("the admin port of mirror agent \"m1\"").
pub(crate) async fn admin_port(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: agent\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        (&mut s).take(1 << 20).read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf);
        if !text.starts_with("HTTP/1.") {
            return None;
        }
        let body = text.split_once("\r\n\r\n")?.1;
        let v: serde_json::Value = serde_json::from_str(body).ok()?;
        let role = v["role"].as_str()?;
        Some(match v["name"].as_str() {
            Some(n) => format!("the admin port of {role} agent {n:?}"),
            None => format!("the admin port of a {role} agent"),
        })
    };
    tokio::time::timeout(Duration::from_secs(3), ask)
        .await
        .ok()
        .flatten()
}

async fn probe_agent_at(addr: &str, name: &str) -> Probe {
    use crate::proto::{self, ToMirror, ToPrimary};
    let mut wire = match crate::mirror::dial(addr, &None).await {
        Ok(w) => w,
        Err(e) => return Probe::Nothing(format!("{e:#}")),
    };
    let hello = ToPrimary::Hello {
        proto: proto::PROTO_VERSION,
        mirror: name.to_string(),
        volume_uuid: None,
        nonce: proto::nonce(),
        want: proto::Want::Snapshot,
        prev_crc: None,
        epoch: 0,
        identity: String::new(),
    };
    if let Err(e) = proto::send(&mut wire, &hello).await {
        return Probe::Nothing(format!("{e:#}"));
    }
    match crate::handshake::recv_within(&mut wire, Duration::from_secs(5)).await {
        Ok(ToMirror::Refused { reason, .. }) => {
            match crate::mirror::awaiting::answered_digest(&reason) {
                Some(d) => Probe::Awaiting(d.to_string()),
                None => Probe::Answers,
            }
        }
        Ok(ToMirror::Challenge { .. }) => Probe::Answers,
        Ok(other) => Probe::Nothing(format!(
            "it answered {} instead of a challenge",
            proto::msg_name(&other)
        )),
        Err(e) => Probe::Nothing(format!("{e:#}")),
    }
}

/// Write the fence: where the volume goes first (a commit refused by the marker then always
/// finds it and waits for the new primary instead of failing), the fence record, the marker;
/// then the last entry (`settle`: once no commit is in flight any more, for a loss window
/// that must be exact; a planned move checks the head again before it promotes anyway).
/// Returns that seq.
async fn fence_now(
    e: &dyn Engine,
    a: &FenceArgs<'_>,
    epoch: u64,
    store: &str,
    by: &str,
    settle: bool,
) -> Result<u64> {
    if let Some(to) = a.moved_to {
        let m = Moved {
            version: site::MARKER_VERSION,
            meta_url: meta::redact(to),
            epoch: epoch + 1,
            at_seq: 0,
            at_ns: fs_core::now_ns(),
        };
        site::set_moved(e, Some(&m)).await?;
    }
    let mut f = Fenced {
        version: site::MARKER_VERSION,
        name: a.name.to_string(),
        primary: a.new_primary.to_string(),
        epoch,
        at_seq: 0,
        at_ns: fs_core::now_ns(),
        by: by.to_string(),
    };
    site::set_fenced(e, Some(&f)).await?;
    if site::marker(e).await?.is_none() {
        let marker = MirrorMarker {
            version: site::MARKER_VERSION,
            name: a.name.to_string(),
            primary: a.new_primary.to_string(),
            store: store.to_string(),
            origin_store: None,
            since_ns: fs_core::now_ns(),
        };
        site::set_marker(e, &marker).await?;
    }
    let head = if settle {
        settled_head(e).await?
    } else {
        e.journal_bounds().await?.last
    };
    f.at_seq = head;
    site::set_fenced(e, Some(&f)).await?;
    if let Some(mut m) = site::moved(e).await? {
        m.at_seq = head;
        site::set_moved(e, Some(&m)).await?;
    }
    Ok(head)
}

/// The journal head once it stops moving: a commit that checked the marker just before it
/// appeared ends within its commit section, and a RocksDB secondary sees it at its next
/// catch-up. Read until two reads 300 ms apart agree (at most 5 s).
async fn settled_head(e: &dyn Engine) -> Result<u64> {
    let t0 = std::time::Instant::now();
    let mut head = e.journal_bounds().await?.last;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = e.journal_bounds().await?.last;
        if now == head || t0.elapsed() > Duration::from_secs(5) {
            return Ok(now);
        }
        head = now;
    }
}

/// What `mirror-agent promote` is told.
pub struct PromoteArgs<'a> {
    /// The old primary's META_URL: checked (planned), or fenced first (`force`).
    pub old_meta: Option<&'a str>,
    pub force: bool,
    /// With `force`: the name and the new primary address the old metadata is fenced with
    /// (as `fence --as NAME --new-primary ADDR`).
    pub fence_as: Option<&'a str>,
    pub new_primary: Option<&'a str>,
}

/// `mirror-agent promote`.
pub async fn promote(cfg: &Config, a: &PromoteArgs<'_>) -> Result<String> {
    let m = cfg
        .mirror
        .as_ref()
        .context("promote needs a mirror's config ([mirror] section)")?;
    let state = State::open(&cfg.state_dir)
        .map_err(|e| anyhow!("{e:#}: stop the mirror agent before promoting its mirror"))?;
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
        // Run a second time (a runbook step repeated, a retry after a lost terminal):
        // this mirror is the primary already, which is what was asked.
        if let Some(ep) = site::epoch_record(&*e).await? {
            if ep.site == m.name {
                return Ok(format!(
                    "{url} is already the primary at epoch {} (mirror {:?} was promoted at seq {}): nothing to do",
                    ep.epoch, m.name, ep.at_seq
                ));
            }
        }
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
    let settings = fs_core::Fs::load_settings(&*e).await?;
    let epoch = site::epoch(&*e).await?;
    let identity = crate::site::identity(&*e).await?.unwrap_or_default();
    let mut lost = String::new();
    match (a.old_meta, a.force) {
        (Some(old), false) => {
            let o = open(old, false).await?;
            // Another volume's metadata (a mistyped URL) is named as such, not as unfenced.
            match fs_core::Fs::load_settings(&*o).await {
                Ok(os) if os.uuid != settings.uuid => bail!(
                    "--old-meta {} holds volume {:?} (uuid {}), not this mirror's volume {:?} (uuid {}): give the old primary's metadata of this volume; nothing was changed",
                    o.display_url(),
                    os.name,
                    os.uuid,
                    settings.name,
                    settings.uuid
                ),
                Err(e) if e.kind() == fs_core::ErrorKind::NotFormatted => bail!(
                    "--old-meta {} holds no volume: give the old primary's metadata of this volume; nothing was changed",
                    o.display_url()
                ),
                _ => {}
            }
            if site::marker(&*o).await?.is_none() {
                bail!("the old primary {} is not fenced: run `mirror-agent fence --meta OLD_META --as NAME --new-primary ADDR` there first (its writers could go on committing what this mirror never receives)", o.display_url());
            }
            let head = o.journal_bounds().await?.last;
            if head > applied {
                bail!("the old primary's last entry is {head} and this mirror has applied {applied}: start the agent and wait (`mirror-agent status --wait-applied {head}`), stop it, then promote");
            }
        }
        (None, false) => bail!("give --old-meta OLD_META_URL (a planned move: it checks that the old primary is fenced and that this mirror has applied its last entry), or --force (failover: the old primary is unreachable; what it had that this mirror had not applied is reported, and saved at the old site when it rejoins)"),
        (_, true) => {
            // A forced promotion beside a primary that still serves forks the volume:
            // two writable histories. Ask the old primary's agent first.
            match probe_old_primary(m, &marker, applied, epoch, &identity).await {
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
            lost = match fence_old(a, &cfg.meta, &url, &settings, epoch).await? {
                OldFence::Closed { head, how } => {
                    let n = head.saturating_sub(applied);
                    format!(
                        "; {how}. LOSS WINDOW: exactly {n} entries{}: the old primary committed them and this mirror never applied them; the old primary is fenced at seq {head}, so nothing more goes there. They are not lost for good: when the old site rejoins as a mirror, they are saved there for review (runbooks/failover.md)",
                        if n > 0 { format!(" (seq {}..={head})", applied + 1) } else { String::new() }
                    )
                }
                OldFence::Open(why) => {
                    let n = known.saturating_sub(applied);
                    let w = format!(
                        "WARNING: the old primary's metadata was NOT fenced ({why}): if its site is alive (a mount, a writer beside its metadata), it goes on acknowledging writes that this primary never receives, for as long as it is not fenced. Fence it as soon as it can be reached: mirror-agent fence --meta OLD_META --as NAME --new-primary ADDR --moved-to {url}"
                    );
                    tracing::error!("{w}");
                    format!(
                        "; LOSS WINDOW: unknown, not closed: at least {n} entries the old primary had that this mirror had not applied (its last known head was {known}, this mirror applied {applied}), and whatever it commits until it is fenced. {w}. When it rejoins as a mirror, what it committed is saved there for review (runbooks/failover.md)"
                    )
                }
            };
        }
    }
    if pending > 0 && !a.force {
        bail!("{pending} blocks are not copied to this mirror's store yet: start the agent, wait until `mirror-agent status` shows 0 pending, stop it, then promote");
    }
    let ep = Epoch {
        version: site::MARKER_VERSION,
        epoch: epoch + 1,
        site: m.name.clone(),
        at_seq: applied,
        at_ns: fs_core::now_ns(),
        from: marker.primary.clone(),
        history: Vec::new(),
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

/// Where a forced promotion leaves the old primary.
enum OldFence {
    /// Fenced (now, or already): nothing commits there after `head`.
    Closed { head: u64, how: String },
    /// Not fenced: why.
    Open(String),
}

/// `promote --force`: fence the old primary's metadata first when it can be reached, so the
/// loss window is exact and closed. Refuses (before anything is written) when it is reached
/// but cannot be fenced as asked, or is not this volume's old primary.
async fn fence_old(
    a: &PromoteArgs<'_>,
    my_meta: &str,
    url: &str,
    settings: &fs_core::Settings,
    epoch: u64,
) -> Result<OldFence> {
    let Some(old) = a.old_meta else {
        return Ok(OldFence::Open(
            "no --old-meta was given, so this promotion does not know where it is".into(),
        ));
    };
    let redacted = meta::redact(old);
    if redacted == url {
        bail!(
            "--old-meta {redacted} is this mirror's own metadata: give the old primary's META_URL"
        );
    }
    let o = match reach(old).await {
        Ok(o) => o,
        Err(e) => return Ok(OldFence::Open(format!("it cannot be reached: {e:#}"))),
    };
    let os = fs_core::Fs::load_settings(&*o)
        .await
        .map_err(|e| anyhow!("--old-meta {redacted} holds no volume ({e}): check the URL"))?;
    if os.uuid != settings.uuid {
        bail!(
            "--old-meta {redacted} holds volume {:?} (uuid {}), not this volume (uuid {}): check the URL",
            os.name,
            os.uuid,
            settings.uuid
        );
    }
    if let Some(om) = site::marker(&*o).await? {
        let fenced = site::fenced(&*o).await?.is_some()
            || site::moved(&*o).await?.is_some_and(|mv| mv.epoch > epoch);
        if !fenced {
            bail!(
                "--old-meta {redacted} is mirror {:?}'s metadata (following {}), not the old primary's: check the URL",
                om.name,
                om.primary
            );
        }
        let head = settled_head(&*o).await?;
        return Ok(OldFence::Closed {
            head,
            how: format!("the old primary {redacted} was fenced already (at seq {head})"),
        });
    }
    let (Some(name), Some(new_primary)) = (a.fence_as, a.new_primary) else {
        bail!(
            "the old primary's metadata {redacted} can be reached and is not fenced: give --as NAME (its name as a mirror of this site) and --new-primary ADDR (this site's future primary agent `listen`) so that the promotion fences it first; nothing was changed"
        );
    };
    let fa = FenceArgs {
        meta: old,
        name,
        new_primary,
        // The old site's mounts move here (they take the password from where they took the
        // old one's: the URL recorded carries none).
        moved_to: Some(my_meta),
        force: true,
    };
    let old_epoch = site::epoch(&*o).await?;
    let head = fence_now(
        &*o,
        &fa,
        old_epoch,
        &os.storage,
        &format!("the forced promotion of {url}"),
        true,
    )
    .await?;
    tracing::warn!(old = %redacted, head, "fenced the old primary's metadata before promoting: its writers are refused, its mounts move here");
    Ok(OldFence::Closed {
        head,
        how: format!("fenced the old primary {redacted} first, at seq {head}: its writers are refused and its mounts move here"),
    })
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
    identity: &str,
) -> OldPrimary {
    use crate::handshake::{self, Welcome};
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
        identity: identity.to_string(),
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
        Err(e) => match handshake::failure(&e).filter(|f| !f.is_temporary()) {
            Some(p) if p.message().contains("this primary was fenced") => OldPrimary::Fenced,
            Some(p) => OldPrimary::Serving(p.message().to_string()),
            None => OldPrimary::Gone(format!("{e:#}")),
        },
    }
}

#[cfg(test)]
mod admin_port_tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    /// The trial: `fence --new-primary ADDR` with ADDR an agent's admin port said only that
    /// nothing answers. The probe now says that it is an admin port, whose, and which
    /// address to give.
    #[tokio::test]
    async fn an_agents_admin_port_given_as_new_primary_is_named_as_such() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let metrics = Arc::new(crate::metrics::Metrics::new(false));
        metrics.set_status(serde_json::json!({"role": "mirror", "name": "m1"}));
        let stop = CancellationToken::new();
        let app = crate::admin::Admin {
            metrics,
            token: None,
            limits: None,
            slots: None,
            resync: None,
            workers: Arc::new(background::Supervisor::new(stop.clone())),
        };
        let _h = crate::admin::serve(addr, app, stop.clone()).await.unwrap();
        let a = addr.to_string();
        match probe_agent(&a, "m1").await {
            Probe::Nothing(why) => assert!(
                why.starts_with(&format!(
                    "{a} is the admin port of mirror agent \"m1\", not where an agent's replication listens"
                )) && why.contains("`listen` address of that agent's [mirror] section"),
                "{why}"
            ),
            _ => panic!("an admin port taken for an agent"),
        }
        // An address where nothing listens keeps its own reason.
        stop.cancel();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let free = l.local_addr().unwrap().to_string();
        drop(l);
        match probe_agent(&free, "m1").await {
            Probe::Nothing(why) => assert!(!why.contains("admin port"), "{why}"),
            _ => panic!("something answered at a free port"),
        }
    }
}
