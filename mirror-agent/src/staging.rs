//! Resync beside the live state. A mirror that already serves a consistent state and must
//! bootstrap again (a dropped slot, a history that differs, `mirror-agent resync`) does not
//! reset its metadata: the snapshot, and the entries after it, go into a *staging* RocksDB in
//! the agent's state directory, while the live metadata keeps serving the previous state to
//! the site's mounts (reported as stale). Once the staging has caught up with the primary's
//! head at the end of the snapshot, the live metadata is made equal to it in one atomic write
//! (`Engine::install_switch`: the difference of the two key spaces, the staging's journal,
//! its head), and the staging is removed.
//!
//! A mirror with nothing consistent yet (new, or a bootstrap interrupted before it caught up)
//! installs straight into its metadata, fenced with `mirror.incomplete` as before.
//!
//! Crash safety: the agent state's `Bootstrap { staged: true }` record says a staging exists.
//! A kill during the install starts it over; during the catch-up, the staging is reopened and
//! replication resumes into it; during the switch, the switch runs again (it is idempotent:
//! the difference is then empty).
//!
//! The staging's directory is removed after the switch while a replication task may still
//! hold the staging open; its close then finds the directory gone and flushes nothing (it
//! warned `flushing at close failed` after every resync, about a database thrown away).

use anyhow::{Context, Result};
use fs_core::engine::Engine;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

pub struct Meta {
    /// The mirror's metadata, which the site's mounts read.
    pub live: Arc<dyn Engine>,
    staging: RwLock<Option<Arc<dyn Engine>>>,
    dir: PathBuf,
}

/// What a switch did.
#[derive(Debug, Clone, Copy)]
pub struct Switched {
    /// Keys written or deleted in the live metadata.
    pub changed: usize,
    pub head: u64,
}

impl Meta {
    pub fn new(live: Arc<dyn Engine>, state_dir: &std::path::Path) -> Arc<Self> {
        Arc::new(Meta {
            live,
            staging: RwLock::new(None),
            dir: state_dir.join("staging"),
        })
    }

    /// Where replication writes: the staging while a resync is staged, else the live metadata.
    pub fn target(&self) -> Arc<dyn Engine> {
        self.staging().unwrap_or_else(|| self.live.clone())
    }

    pub fn staging(&self) -> Option<Arc<dyn Engine>> {
        self.staging
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn open_at(&self, create: bool) -> Result<Arc<dyn Engine>> {
        let e = meta::RocksEngine::open(&self.dir, meta::RocksMode::ReadWrite, create, true)
            .with_context(|| format!("opening the resync staging {}", self.dir.display()))?;
        Ok(Arc::new(e))
    }

    /// A new, empty staging (an earlier one is removed), marked as the live metadata is, so
    /// that it takes a snapshot and journal entries.
    pub async fn begin(&self) -> Result<Arc<dyn Engine>> {
        self.discard()?;
        let e = self.open_at(true)?;
        let marker = fs_core::site::marker(&*self.live)
            .await?
            .context("the mirror's metadata lost its marker")?;
        fs_core::site::set_marker(&*e, &marker).await?;
        *self.staging.write().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        Ok(e)
    }

    /// After a restart during a staged catch-up: open the staging again. False when it is
    /// gone (the resync then starts over).
    pub fn reopen(&self) -> Result<bool> {
        if !self.dir.join("CURRENT").exists() {
            return Ok(false);
        }
        let e = self.open_at(false)?;
        *self.staging.write().unwrap_or_else(|p| p.into_inner()) = Some(e);
        Ok(true)
    }

    /// Make the live metadata equal to the staging, in one atomic write.
    pub async fn switch(&self) -> Result<Switched> {
        let st = self.staging().context("no resync staging to switch to")?;
        let writes = fs_core::engine::diff(&*self.live, &*st)
            .await
            .context("comparing the live metadata with the staging")?;
        let b = st.journal_bounds().await?;
        let mut frames = Vec::new();
        let mut from = b.first;
        while from <= b.last {
            let page = st.journal_read(from, 1000).await?;
            let Some((last, _)) = page.last() else {
                break;
            };
            from = last + 1;
            frames.extend(page);
        }
        self.live
            .install_switch(&writes, &frames, b.last)
            .await
            .context("switching the live metadata to the resynced state")?;
        Ok(Switched {
            changed: writes.len(),
            head: b.last,
        })
    }

    /// Drop the staging and remove its directory.
    pub fn discard(&self) -> Result<()> {
        let old = self
            .staging
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(old);
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", self.dir.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `f` logged (every level), as text.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, f);
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    /// Issue 43, item 26: a resync switch logged `flushing at close failed` for the staging,
    /// which a replication task still held when its directory was removed. The staging is
    /// discarded without a warning, and the live metadata holds what it staged.
    #[tokio::test]
    async fn discarding_a_staging_still_held_after_its_switch_warns_nothing() {
        let d = tempfile::tempdir().unwrap();
        let live: Arc<dyn Engine> = Arc::new(
            meta::RocksEngine::open(
                &d.path().join("live"),
                meta::RocksMode::ReadWrite,
                true,
                true,
            )
            .unwrap(),
        );
        let marker = fs_core::site::MirrorMarker {
            version: fs_core::site::MARKER_VERSION,
            name: "m".into(),
            primary: "127.0.0.1:1".into(),
            store: "file:///nowhere".into(),
            origin_store: None,
            since_ns: 1,
        };
        fs_core::site::set_marker(&*live, &marker).await.unwrap();
        let meta = Meta::new(live.clone(), d.path());
        // The staging holds what it was given in its memtable only, as after a snapshot.
        let staging = meta.begin().await.unwrap();
        staging
            .install_put(&[(b"k".to_vec(), b"v".to_vec())])
            .await
            .unwrap();
        meta.switch().await.unwrap();
        assert_eq!(live.get(b"k").await.unwrap().as_deref(), Some(&b"v"[..]));
        assert_eq!(
            fs_core::site::marker(&*live).await.unwrap(),
            Some(marker.clone())
        );
        let held = meta.staging().unwrap();
        let log = logged(|| {
            meta.discard().unwrap();
            drop(staging);
            drop(held);
        });
        assert!(!d.path().join("staging").exists());
        assert!(!log.contains("flushing at close failed"), "{log}");
    }
}
