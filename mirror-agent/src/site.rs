//! Which metadata an agent may work on. A mirror agent only ever replays into metadata that
//! carries its mirror marker (see `fs_core::site`): it marks empty metadata before its first
//! snapshot, and refuses metadata holding a volume of its own (a primary's, or a detached
//! mirror's), which a snapshot install would wipe. A primary agent refuses a mirror's
//! metadata. `detach` turns a stopped mirror into a volume of its own.
//!
//! Each mirror metadata copy carries an identity (`metadata.identity`, random, made when the
//! agent first claims it and kept for the life of the metadata store: a staged resync, a
//! promotion, a fence and a rejoin keep it; only empty metadata gets a new one). The hello
//! carries it and the primary's slot records it, so two agents with one name are told apart.

use crate::config::MirrorConfig;
use crate::state::State;
use anyhow::{bail, Context, Result};
use fs_core::site::{self, MirrorMarker};
use fs_core::{keys, Engine};

/// What `claim` does to metadata it accepts.
pub enum Claim {
    /// Marked as this mirror's already.
    Ours,
    /// Marked as this mirror's, with an older description (primary, stores): rewritten.
    Update(MirrorMarker),
    /// Empty, or this agent's state shows it built it before markers existed: marked now.
    Mark(MirrorMarker, &'static str),
}

/// Whether `engine` may be this mirror's metadata, without writing anything (`run` and
/// `check-config --connect` both ask this). `built_here`: this agent's state shows it has
/// been applying to it (metadata from a release before markers). Refuses anything else with
/// a line saying what it is and what to do.
pub async fn plan_claim(
    engine: &dyn Engine,
    built_here: bool,
    cfg: &MirrorConfig,
) -> Result<Claim> {
    let url = engine.display_url();
    let existing = site::marker(engine).await?;
    let has_volume = engine.get(keys::SETTING).await?.is_some();
    let want = |since_ns| MirrorMarker {
        version: site::MARKER_VERSION,
        name: cfg.name.clone(),
        primary: cfg.primary.clone(),
        store: cfg.store.clone(),
        origin_store: cfg.origin_store.clone(),
        since_ns,
    };
    match existing {
        Some(m) => {
            if m.name != cfg.name && has_volume {
                bail!(
                    "{url} is the metadata of mirror {:?}, not {:?}: each mirror has metadata of its own; point `meta` at this mirror's, or fix [mirror] name",
                    m.name,
                    cfg.name
                );
            }
            let new = want(m.since_ns);
            Ok(if new != m {
                Claim::Update(new)
            } else {
                Claim::Ours
            })
        }
        None if !has_volume => Ok(Claim::Mark(
            want(fs_core::now_ns()),
            "marked this metadata as this mirror's (empty until its first snapshot)",
        )),
        None => {
            if let Some(d) = site::detached(engine).await? {
                bail!(
                    "{url} was mirror {:?} and was detached at seq {}: it is a volume of its own now and a mirror agent would overwrite it; to mirror again, point `meta` at empty metadata",
                    d.name,
                    d.at_seq
                );
            }
            if built_here {
                return Ok(Claim::Mark(
                    want(fs_core::now_ns()),
                    "marked this mirror's metadata (written by an earlier release)",
                ));
            }
            let s = fs_core::Fs::load_settings(engine).await?;
            bail!(
                "{url} holds volume {:?} (uuid {}) and is not a mirror's metadata: it is a primary's (or a detached mirror's), and a mirror agent would overwrite it; point `meta` at this mirror's own, empty metadata",
                s.name,
                s.uuid
            )
        }
    }
}

/// The aux record holding the identity of this metadata copy.
pub const IDENTITY: &str = "metadata.identity";

/// What `metadata.identity` records.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub version: u32,
    /// 128 random bits, hex.
    pub id: String,
    pub since_ns: i64,
}

impl fs_core::record::Versioned for Identity {
    const KIND: &'static str = "the metadata identity record";
    const VERSION: u32 = 1;
}

/// The identity of this metadata copy, if it has one yet.
pub async fn identity(engine: &dyn Engine) -> Result<Option<String>> {
    let Some(v) = fs_core::site::aux_exact(engine, IDENTITY).await? else {
        return Ok(None);
    };
    let r: Identity = fs_core::record::decode(&v)?;
    Ok(Some(r.id))
}

/// The identity of this metadata copy, made now if it has none.
pub async fn ensure_identity(engine: &dyn Engine) -> Result<String> {
    if let Some(id) = identity(engine).await? {
        return Ok(id);
    }
    let bytes: [u8; 16] = rand::random();
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let r = Identity {
        version: 1,
        id: id.clone(),
        since_ns: fs_core::now_ns(),
    };
    engine
        .aux_put(IDENTITY, Some(&fs_core::record::encode(&r)))
        .await?;
    Ok(id)
}

/// Make sure `engine` is this mirror's metadata (`plan_claim`), marking it when it is empty
/// (or when this agent's own state shows it has been applying to it), and that it has an
/// identity.
pub async fn claim(engine: &dyn Engine, state: &State, cfg: &MirrorConfig) -> Result<()> {
    let built_here = state.queued_through()? > 0 || state.bootstrap()?.is_some();
    match plan_claim(engine, built_here, cfg).await? {
        Claim::Ours => {}
        Claim::Update(m) => site::set_marker(engine, &m).await?,
        Claim::Mark(m, what) => {
            site::set_marker(engine, &m).await?;
            tracing::info!(meta = %engine.display_url(), mirror = %cfg.name, "{what}");
        }
    }
    ensure_identity(engine).await?;
    Ok(())
}

/// A primary agent serves a volume of its own: refuse a mirror's metadata.
pub async fn check_primary(engine: &dyn Engine) -> Result<()> {
    if let Some(m) = site::marker(engine).await? {
        bail!(
            "{} is the metadata of mirror {:?} (it follows the primary at {}): a primary agent runs beside the primary's metadata; check `meta`",
            engine.display_url(),
            m.name,
            m.primary
        );
    }
    Ok(())
}

/// `mirror-agent detach`: the mirror's metadata becomes a volume of its own, writing to the
/// mirror's store. Needs the agent stopped (its state directory is then free) and every
/// block copied (else the new volume would reference blocks it does not have).
pub async fn detach(cfg: &crate::config::Config) -> Result<String> {
    let m = cfg
        .mirror
        .as_ref()
        .context("detach needs a mirror's config ([mirror] section)")?;
    let state = State::open(&cfg.state_dir)
        .map_err(|e| anyhow::anyhow!("{e:#}: stop the mirror agent before detaching its mirror"))?;
    let (pending, _, _) = state.pending()?;
    if pending > 0 {
        bail!(
            "{pending} blocks are not copied to the mirror store yet: start the agent, wait until `mirror-agent status` shows 0 pending, stop it, then detach"
        );
    }
    let (engine, url, marker) = open_to_detach(&cfg.meta, volume::Access::Write).await?;
    if marker.name != m.name {
        bail!(
            "{url} is mirror {:?}'s metadata, not {:?}'s",
            marker.name,
            m.name
        );
    }
    // The volume's blocks will be those of the mirror store: it must answer before anything
    // changes (a detached volume still pointing at the primary's store would write there).
    let store = volume::open_store(&marker.store, None)?;
    store.check().await.map_err(|e| {
        anyhow::anyhow!(
            "the mirror store {} does not answer ({e}): nothing was changed",
            marker.store
        )
    })?;
    let d = site::detach(&*engine, &marker).await?;
    let store_url = marker.store.clone();
    let pointed = async {
        let mut fs = fs_core::Fs::open(engine.clone(), store).await?;
        fs.update_settings("storage", |s| s.storage = store_url.clone())
            .await
    }
    .await;
    if let Err(e) = pointed {
        // Back to the mirror it was: a volume of its own that writes into the primary's
        // store must never be left behind.
        site::set_marker(&*engine, &marker).await?;
        engine.aux_put(site::DETACHED, None).await?;
        return Err(anyhow::Error::new(e).context(
            "pointing the detached volume at the mirror store failed; it is a mirror again, nothing changed",
        ));
    }
    Ok(format!(
        "detached mirror {:?} at seq {}: {url} is now a volume of its own, writable, with blocks in {}; its replication slot at the primary still holds gc there: drop it with `mirror-agent slot drop {} --meta PRIMARY_META_URL`",
        d.name, d.at_seq, marker.store, d.name
    ))
}

/// `mirror-agent detach --meta URL`: for metadata whose marker names the store the volume's
/// blocks already are in (a fence undone, a fenced old primary made a volume of its own
/// again, an engine-migration mirror on the volume's own store). Anything else needs the
/// agent's state to know every block was copied: `--config`.
pub async fn detach_meta(meta: &str) -> Result<String> {
    // Read access, as `fence` has: a RocksDB secondary, so a mount that holds the writer's
    // lock (the fenced primary's own mount) does not stop the undo; only the records beside
    // the metadata change, which a secondary may write, and the mount's next commit sees
    // them.
    let (engine, url, marker) = open_to_detach(meta, volume::Access::Read).await?;
    let settings = fs_core::Fs::load_settings(&*engine).await?;
    if marker.store != settings.storage {
        bail!(
            "{url} is mirror {:?}, whose blocks are copied into its own store {}: detach it with `mirror-agent detach --config MIRROR_CONFIG` (the agent stopped), which checks that every block was copied",
            marker.name,
            marker.store
        );
    }
    let d = site::detach(&*engine, &marker).await?;
    Ok(format!(
        "detached {url} (it was mirror {:?} of {}) at seq {}: a volume of its own again, writable, blocks in {}; a move it recorded is cleared, so its mounts stay. If a mirror agent still runs on it, it stops; if the other site was promoted meanwhile, the two are separate volumes from now on",
        d.name, marker.primary, d.at_seq, settings.storage
    ))
}

/// A mirror's metadata opened to be detached: not bootstrapping, and marked.
async fn open_to_detach(
    meta: &str,
    access: volume::Access,
) -> Result<(std::sync::Arc<dyn Engine>, String, MirrorMarker)> {
    let engine = volume::open_engine(meta, access, None, false).await?;
    let url = engine.display_url();
    if fs_core::slots::incomplete(&*engine).await?.is_some() {
        bail!("{url} is a mirror that is bootstrapping: its tree is incomplete; let it finish before detaching");
    }
    let Some(marker) = site::marker(&*engine).await? else {
        bail!("{url} is not a mirror's metadata (no mirror marker): nothing to detach");
    };
    Ok((engine, url, marker))
}
