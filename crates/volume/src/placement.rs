//! The stores a volume's `storage` record names (see `fs_core::storage`), composed for the
//! current generation, behind a holder that follows the record as it changes.
//!
//! - `single(X)`: X.
//! - `dual(A, B)` and `switched(B, A)`: a `DualStore` over (primary, secondary). A put goes
//!   to both at once and returns when the primary has it; the secondary gets a little longer
//!   (as long again as the primary took, at least `SECONDARY_GRACE`), and a block it did not
//!   take by then is recorded in the repair list before the put returns, so it is never
//!   dropped (`jfs cutover verify` and `abort` copy it). Reads go to the primary, and to the
//!   secondary for what the primary lacks (NotFound only). Deletes go to both.
//!
//! `StorageHolder` is the block store the volume's layers above (cache, readers) see: it
//! delegates to the current placement, and `reload` swaps in a new one when the record's
//! generation changed. A session's `Follower` (`follower.rs`) keeps its acknowledgement of the
//! generation current (polling the record every `FOLLOW_EVERY`) and its heartbeat.

use crate::follower::Follower;
use crate::metrics::StoreMetrics;
use crate::stack::StoreBuilder;
use async_trait::async_trait;
use bytes::Bytes;
use fs_core::error::{ErrorKind, Result};
use fs_core::session::Degraded;
use fs_core::storage::{self, Phase, Placement, Role, StorageFollow, StorageState};
use fs_core::{BlockCheck, BlockStore, Engine, ObjectMeta};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The least time a secondary store gets after the primary took a block.
pub const SECONDARY_GRACE: Duration = Duration::from_secs(2);
/// How often a session re-reads the storage record (a transition's barrier waits about this
/// long for live writers).
pub const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Whether this writer's puts to a cutover's other store are failing: set by its dual
/// stores, published in its session record by its `Follower` (`jfs cutover status` lists
/// degraded writers) and as the `jfs_dual_write_degraded` gauge.
#[derive(Default)]
pub struct WriterHealth(std::sync::Mutex<Option<Degraded>>);

impl WriterHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Degraded>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, role: Role, store: &str, error: &str) {
        let mut g = self.lock();
        match &mut *g {
            Some(d) if d.store == store => {
                d.failures += 1;
                d.error = error.to_string();
            }
            _ => {
                *g = Some(Degraded {
                    store: store.to_string(),
                    role: role.tag().to_string(),
                    error: error.to_string(),
                    since_ns: fs_core::now_ns(),
                    failures: 1,
                })
            }
        }
    }

    fn ok(&self, store: &str) {
        let mut g = self.lock();
        if g.as_ref().is_some_and(|d| d.store == store) {
            *g = None;
        }
    }

    fn clear(&self) {
        *self.lock() = None;
    }

    /// The current run of failures, if any.
    pub fn current(&self) -> Option<Degraded> {
        self.lock().clone()
    }
}

/// Writes to two stores, reads from the first that has the block.
pub struct DualStore {
    primary: Arc<dyn BlockStore>,
    secondary: Arc<dyn BlockStore>,
    /// The secondary's role, as repair records name it.
    secondary_role: Role,
    engine: Arc<dyn Engine>,
    metrics: Arc<StoreMetrics>,
    health: Arc<WriterHealth>,
}

impl DualStore {
    pub fn new(
        primary: Arc<dyn BlockStore>,
        secondary: Arc<dyn BlockStore>,
        secondary_role: Role,
        engine: Arc<dyn Engine>,
        metrics: Arc<StoreMetrics>,
        health: Arc<WriterHealth>,
    ) -> DualStore {
        DualStore {
            primary,
            secondary,
            secondary_role,
            engine,
            metrics,
            health,
        }
    }
}

#[async_trait]
impl BlockStore for DualStore {
    fn display_url(&self) -> String {
        format!(
            "{} + {}",
            self.primary.display_url(),
            self.secondary.display_url()
        )
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        let t0 = Instant::now();
        let mut second = Box::pin(self.secondary.put(key, data.clone()));
        let mut first = Box::pin(self.primary.put(key, data));
        // Both at once; the primary decides the outcome.
        let mut second_done = None;
        let first = loop {
            tokio::select! {
                r = &mut first => break r,
                r = &mut second, if second_done.is_none() => second_done = Some(r),
            }
        };
        first?;
        let grace = SECONDARY_GRACE.max(t0.elapsed());
        let second = match second_done {
            Some(r) => Ok(r),
            None => tokio::time::timeout(grace, second).await,
        };
        let err = match second {
            Ok(Ok(())) => {
                self.health.ok(&self.secondary.display_url());
                self.metrics.dual_degraded.set(0);
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {grace:?} after the primary store had it"),
        };
        self.health
            .failed(self.secondary_role, &self.secondary.display_url(), &err);
        self.metrics.dual_degraded.set(1);
        self.metrics.dual_repairs.inc();
        tracing::warn!(block = key, store = %self.secondary.display_url(), error = %err, "writing a block to the cutover's other store failed; recorded for repair");
        storage::repair_add(&*self.engine, self.secondary_role, key, &err)
            .await
            .map_err(|e| e.context(format!("recording block {key} for repair")))
    }

    async fn get(&self, key: &str) -> Result<Bytes> {
        match self.primary.get(key).await {
            Err(e) if e.kind() == ErrorKind::NotFound => self.secondary.get(key).await,
            r => r,
        }
    }

    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        match self.primary.get_block(key, want).await {
            Err(e) if e.kind() == ErrorKind::NotFound => self.secondary.get_block(key, want).await,
            r => r,
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        match self.primary.head(key).await? {
            Some(m) => Ok(Some(m)),
            None => self.secondary.head(key).await,
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let (a, b) = tokio::join!(self.primary.delete(key), self.secondary.delete(key));
        a.and(b)
    }

    async fn check(&self) -> Result<()> {
        self.primary.check().await?;
        self.secondary.check().await
    }

    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        self.primary.list(prefix, f).await
    }
}

impl StoreBuilder {
    /// The stores of `state`, composed.
    pub fn build(
        &self,
        state: &StorageState,
        engine: &Arc<dyn Engine>,
        health: &Arc<WriterHealth>,
    ) -> Result<Arc<dyn BlockStore>> {
        let primary = self.open(state.phase.primary())?;
        Ok(match (state.phase.secondary(), state.phase.roles()) {
            (Some(sec), Some((_, role))) => Arc::new(DualStore::new(
                primary,
                self.open(sec)?,
                role,
                engine.clone(),
                self.metrics.clone(),
                health.clone(),
            )),
            _ => {
                health.clear();
                self.metrics.dual_degraded.set(0);
                primary
            }
        })
    }
}

/// The store a volume's layers see: the current placement's, swapped when the record changes.
pub struct StorageHolder {
    engine: Arc<dyn Engine>,
    opener: StoreBuilder,
    settings_store: String,
    current: RwLock<Arc<Placement>>,
    gen_tx: watch::Sender<u64>,
    reloading: tokio::sync::Mutex<()>,
    /// The session that follows this holder, when the holder outlives its `Volume`.
    kept: std::sync::Mutex<Option<Follower>>,
    health: Arc<WriterHealth>,
}

impl StorageHolder {
    /// Read the record and compose its stores.
    pub async fn open(
        engine: Arc<dyn Engine>,
        opener: StoreBuilder,
        settings_store: &str,
    ) -> Result<Arc<StorageHolder>> {
        let state = storage::current(&*engine, settings_store).await?;
        let health = Arc::new(WriterHealth::default());
        let store = opener.build(&state, &engine, &health)?;
        let (gen_tx, _) = watch::channel(state.gen);
        Ok(Arc::new(StorageHolder {
            engine,
            opener,
            settings_store: settings_store.to_string(),
            current: RwLock::new(Arc::new(Placement {
                gen: state.gen,
                state,
                store,
            })),
            gen_tx,
            reloading: tokio::sync::Mutex::new(()),
            kept: std::sync::Mutex::new(None),
            health,
        }))
    }

    pub fn gen(&self) -> u64 {
        self.current().gen
    }

    /// Turns to the new generation whenever this holder moves to one.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.gen_tx.subscribe()
    }

    fn store(&self) -> Arc<dyn BlockStore> {
        self.current().store.clone()
    }

    /// Whether this writer's puts to a cutover's other store are failing now.
    pub fn degraded(&self) -> Option<Degraded> {
        self.health.current()
    }

    /// Keep `f` running as long as this holder lives.
    pub fn keep(&self, f: Follower) {
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    }
}

#[async_trait]
impl StorageFollow for StorageHolder {
    fn current(&self) -> Arc<Placement> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn reload(&self) -> Result<Arc<Placement>> {
        let _one = self.reloading.lock().await;
        let state = storage::current(&*self.engine, &self.settings_store).await?;
        let cur = self.current();
        if state.gen == cur.gen {
            return Ok(cur);
        }
        let store = self.opener.build(&state, &self.engine, &self.health)?;
        tracing::info!(
            from = cur.gen,
            to = state.gen,
            placement = %state.phase.describe(),
            "following the volume's storage"
        );
        let p = Arc::new(Placement {
            gen: state.gen,
            state,
            store,
        });
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = p.clone();
        self.gen_tx.send_replace(p.gen);
        Ok(p)
    }
}

#[async_trait]
impl BlockStore for StorageHolder {
    fn display_url(&self) -> String {
        self.store().display_url()
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.store().put(key, data).await
    }
    async fn get(&self, key: &str) -> Result<Bytes> {
        self.store().get(key).await
    }
    async fn get_block(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.store().get_block(key, want).await
    }
    async fn get_block_to_keep(&self, key: &str, want: BlockCheck) -> Result<Bytes> {
        self.store().get_block_to_keep(key, want).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>> {
        self.store().head(key).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.store().delete(key).await
    }
    async fn check(&self) -> Result<()> {
        self.store().check().await
    }
    async fn list(
        &self,
        prefix: &str,
        f: &mut (dyn FnMut(Vec<ObjectMeta>) -> Result<()> + Send),
    ) -> Result<()> {
        self.store().list(prefix, f).await
    }
}

/// The phase a placement is in, for status lines.
pub fn describe(p: &Placement) -> String {
    match &p.state.phase {
        Phase::Single { store } => format!("{store} (generation {})", p.gen),
        other => format!("{} (generation {})", other.describe(), p.gen),
    }
}
