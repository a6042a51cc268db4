//! `jfs status`: the volume's settings, usage, sessions and mirror/cutover state in one record.

use super::PAGE;
use crate::engine::{scan_all, JournalBounds};
use crate::error::Result;
use crate::fs::Fs;
use crate::keys;
use crate::types::{now_ns, Settings};
use serde::Serialize;

#[derive(Serialize, Debug, Clone)]
pub struct Status {
    pub name: String,
    pub uuid: String,
    pub engine: String,
    pub meta_url: String,
    pub storage: String,
    pub block_size: u32,
    pub journal: JournalBounds,
    pub used_space: u64,
    pub used_inodes: u64,
    pub pending_deletes: u64,
    pub settings: Settings,
    /// The mirror marker when this metadata is a mirror's (None: a volume of its own).
    pub mirror: Option<crate::site::MirrorMarker>,
    /// Set when this metadata was a mirror and was detached.
    pub detached: Option<crate::site::Detached>,
    /// Mount sessions (live ones, and dead ones not yet reaped).
    pub sessions: Vec<SessionStatus>,
    /// Inodes unlinked while open, still kept by a session.
    pub kept_inodes: u64,
    /// The primary epoch (0: never promoted) and where the volume moved, if it did.
    pub epoch: u64,
    pub moved: Option<crate::site::Moved>,
    /// Where blocks go (the cutover state).
    pub placement: String,
    /// The trash: entries, bytes, and how many its size cap evicted.
    pub trash: crate::fs::trash::TrashUsage,
}

#[derive(Serialize, Debug, Clone)]
pub struct SessionStatus {
    #[serde(flatten)]
    pub session: crate::session::Session,
    pub live: bool,
}

impl Fs {
    pub async fn status(&self) -> Result<Status> {
        let st = self.statfs().await?;
        let mut pending = 0u64;
        scan_all(
            &*self.engine,
            keys::PENDING_PREFIX,
            &keys::prefix_end(keys::PENDING_PREFIX),
            PAGE,
            |p| {
                pending += p.len() as u64;
                Ok(())
            },
        )
        .await?;
        Ok(Status {
            name: self.settings.name.clone(),
            uuid: self.settings.uuid.clone(),
            engine: self.engine.kind().to_string(),
            meta_url: self.engine.display_url(),
            storage: self.store.display_url(),
            block_size: self.settings.block_size,
            journal: self.engine.journal_bounds().await?,
            used_space: st.used_space,
            used_inodes: st.used_inodes,
            pending_deletes: pending,
            settings: self.settings.clone(),
            mirror: crate::site::marker(&*self.engine).await?,
            detached: crate::site::detached(&*self.engine).await?,
            epoch: crate::site::epoch(&*self.engine).await?,
            moved: crate::site::moved(&*self.engine).await?,
            placement: {
                let st = crate::storage::current(&*self.engine, &self.settings.storage).await?;
                format!("{} (generation {})", st.phase.describe(), st.gen)
            },
            sessions: crate::session::list(&*self.engine)
                .await?
                .into_iter()
                .map(|s| SessionStatus {
                    live: s.is_live(now_ns(), crate::session::DEFAULT_TIMEOUT),
                    session: s,
                })
                .collect(),
            kept_inodes: self.kept_inodes().await?.len() as u64,
            trash: self.trash_usage().await?,
        })
    }
}
