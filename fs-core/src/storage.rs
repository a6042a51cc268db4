//! Where a volume's blocks live, and the cutover that moves them from one store to another
//! while writes go on (design §7).
//!
//! The `storage` record (in the key space, so journaled and replicated like any metadata)
//! says where blocks are written and read first, with a **storage generation** that grows at
//! every change of placement:
//!
//! ```text
//! single(A) --start--> dual(A primary, B secondary) --backfill--> --verify-->
//!   --switch--> switched(B primary, A secondary) --finish--> single(B)
//! abort: dual -> single(A); switched -> dual -> single(A)
//! ```
//!
//! A volume with no record is `single(settings.storage)` at generation 0.
//!
//! **Fencing.** Every commit that references new blocks (a write, a compaction) reads the
//! record in its transaction and is refused (`ErrorKind::Fenced`) unless the generation is the
//! one its blocks were uploaded under (`Placement`). So after a transition commits, no block
//! placed by the old rule can be referenced: a writer that had not seen `dual` cannot add a
//! block to A only once backfill may have passed it. `Fs::commit_slice` then reloads the
//! placement and copies the slice's blocks to the new stores before committing again.
//!
//! **Barrier.** Sessions acknowledge the generation they write by (`session.acks["storage"]`);
//! a transition that depends on every writer having moved (backfill after `start`, `finish`
//! after `switch`) waits until every live session has acknowledged it, naming those it waits
//! for (`waiting_sessions`). Fencing makes the barrier a matter of liveness, not safety.
//!
//! **Repair list.** A write whose copy to the secondary store failed is recorded (aux records
//! `repair.<a|b>.<block>`, beside the metadata, never replicated) before the write returns,
//! and copied later; `verify` and `abort` drain it. Transitions to a store as the only or the
//! primary one require its repair entries drained.

use crate::engine::Engine;
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::keys;
use crate::place;
use crate::session::{self, Session};
use crate::store::BlockStore;
use crate::types::now_ns;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// The record's version: a newer one is refused, never misread.
pub const RECORD_VERSION: u32 = 1;
/// The barrier name under which sessions acknowledge a storage generation.
pub const ACK: &str = "storage";
/// Repair records: `repair.a.<slice>_<index>_<len>` (the block is missing in A) or `.b.`.
pub const REPAIR_PREFIX: &str = "repair.";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Blocks in one store.
    Single { store: String },
    /// A cutover from `from` (A) to `to` (B): writes go to both and wait for A; reads go to A
    /// first. `backfilled` and `verified` record the progress of the copy of older blocks.
    Dual {
        from: String,
        to: String,
        #[serde(default)]
        backfilled: bool,
        #[serde(default)]
        verified: bool,
        /// Set by `abort` from `switched` (A is the primary again): the abort is under way,
        /// and `jfs cutover abort` finishes it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        aborting: bool,
    },
    /// B has every block: reads go to B first (A for anything missing), writes go to both and
    /// wait for B, so that `abort` can still return to A.
    Switched { from: String, to: String },
}

/// A store's role in a cutover, as repair records name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The store the cutover moves from.
    A,
    /// The store the cutover moves to.
    B,
}

impl Role {
    pub fn tag(self) -> &'static str {
        match self {
            Role::A => "a",
            Role::B => "b",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageState {
    pub version: u32,
    /// Grows by one at every change of where blocks are written or read first.
    pub gen: u64,
    #[serde(flatten)]
    pub phase: Phase,
    pub changed_ns: i64,
}

/// What an operator asks of the cutover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// Begin moving to `to`.
    Start { to: String },
    /// Every block referenced when the barrier of `start` had passed is in B.
    Backfilled,
    /// Every referenced block is in B with its length and checksum, and B's repair list is
    /// empty.
    Verified,
    /// Make B the primary.
    Switch,
    /// Drop A.
    Finish,
    /// Go back towards A (from switched: to dual first).
    Abort,
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::Start { .. } => "start",
            Event::Backfilled => "backfill",
            Event::Verified => "verify",
            Event::Switch => "switch",
            Event::Finish => "finish",
            Event::Abort => "abort",
        }
    }
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Single { .. } => "single",
            Phase::Dual { .. } => "dual",
            Phase::Switched { .. } => "switched",
        }
    }

    /// The store reads go to first and writes wait for.
    pub fn primary(&self) -> &str {
        match self {
            Phase::Single { store } => store,
            Phase::Dual { from, .. } => from,
            Phase::Switched { to, .. } => to,
        }
    }

    /// The other store written to (and read from when the primary lacks a block).
    pub fn secondary(&self) -> Option<&str> {
        match self {
            Phase::Single { .. } => None,
            Phase::Dual { to, .. } => Some(to),
            Phase::Switched { from, .. } => Some(from),
        }
    }

    /// The roles of (primary, secondary) during a cutover.
    pub fn roles(&self) -> Option<(Role, Role)> {
        match self {
            Phase::Single { .. } => None,
            Phase::Dual { .. } => Some((Role::A, Role::B)),
            Phase::Switched { .. } => Some((Role::B, Role::A)),
        }
    }

    /// (A, B) during a cutover.
    pub fn stores(&self) -> Option<(&str, &str)> {
        match self {
            Phase::Single { .. } => None,
            Phase::Dual { from, to, .. } | Phase::Switched { from, to } => Some((from, to)),
        }
    }

    /// One line: `single(file:///a)`, `dual(A file:///a -> B s3://b, backfilled)`.
    pub fn describe(&self) -> String {
        match self {
            Phase::Single { store } => format!("single({store})"),
            Phase::Dual {
                from,
                to,
                backfilled,
                verified,
                aborting,
            } => format!(
                "dual(A {from} primary, B {to} secondary{}{}{})",
                if *backfilled { ", backfilled" } else { "" },
                if *verified { ", verified" } else { "" },
                if *aborting { ", aborting" } else { "" }
            ),
            Phase::Switched { from, to } => {
                format!("switched(B {to} primary, A {from} secondary)")
            }
        }
    }
}

impl StorageState {
    /// The state of a volume that has no record: its settings' store, generation 0.
    pub fn initial(store: &str) -> StorageState {
        StorageState {
            version: RECORD_VERSION,
            gen: 0,
            phase: Phase::Single {
                store: store.to_string(),
            },
            changed_ns: 0,
        }
    }

    /// The next state, or an error saying why `ev` is refused in this one. Pure: the facts
    /// the caller must establish first (the barrier, drained repair lists, a finished
    /// backfill or verify) are the caller's; this checks the order of steps.
    pub fn step(&self, ev: &Event, now_ns: i64) -> Result<StorageState> {
        let refuse = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        let bump = |phase: Phase| StorageState {
            version: RECORD_VERSION,
            gen: self.gen + 1,
            phase,
            changed_ns: now_ns,
        };
        let same = |phase: Phase| StorageState {
            version: RECORD_VERSION,
            gen: self.gen,
            phase,
            changed_ns: now_ns,
        };
        match (&self.phase, ev) {
            (Phase::Single { store }, Event::Start { to }) => {
                if let Some(why) = overlap(store, to) {
                    return refuse(format!("cannot move the volume's blocks to {to}: {why}"));
                }
                Ok(bump(Phase::Dual {
                    from: store.clone(),
                    to: to.clone(),
                    backfilled: false,
                    verified: false,
                    aborting: false,
                }))
            }
            (Phase::Dual { from, to, .. }, Event::Start { to: want }) if want == to => {
                // Re-running `start`: nothing changes.
                let _ = from;
                Ok(self.clone())
            }
            (p, Event::Start { to }) => refuse(format!(
                "a cutover is already in progress ({}); to move to {to}, finish or abort it first",
                p.describe()
            )),
            (
                Phase::Dual {
                    from,
                    to,
                    verified,
                    aborting,
                    ..
                },
                Event::Backfilled,
            ) => Ok(same(Phase::Dual {
                from: from.clone(),
                to: to.clone(),
                backfilled: true,
                verified: *verified,
                aborting: *aborting,
            })),
            (
                Phase::Dual {
                    from,
                    to,
                    backfilled,
                    aborting,
                    ..
                },
                Event::Verified,
            ) => {
                if !backfilled {
                    return refuse("verify comes after backfill: run `jfs cutover backfill` first".into());
                }
                Ok(same(Phase::Dual {
                    from: from.clone(),
                    to: to.clone(),
                    backfilled: true,
                    verified: true,
                    aborting: *aborting,
                }))
            }
            (Phase::Dual { from, to, verified, .. }, Event::Switch) => {
                if !verified {
                    return refuse(
                        "switch needs a passed verify (every referenced block in B): run `jfs cutover verify` first"
                            .into(),
                    );
                }
                Ok(bump(Phase::Switched {
                    from: from.clone(),
                    to: to.clone(),
                }))
            }
            (Phase::Switched { .. }, Event::Switch) => Ok(self.clone()),
            (Phase::Switched { to, .. }, Event::Finish) => {
                Ok(bump(Phase::Single { store: to.clone() }))
            }
            (Phase::Dual { .. }, Event::Finish) => refuse(
                "finish comes after switch (B must be the primary store first): run `jfs cutover switch`"
                    .into(),
            ),
            (Phase::Dual { from, .. }, Event::Abort) => {
                Ok(bump(Phase::Single {
                    store: from.clone(),
                }))
            }
            (Phase::Switched { from, to }, Event::Abort) => Ok(bump(Phase::Dual {
                from: from.clone(),
                to: to.clone(),
                backfilled: true,
                verified: true,
                aborting: true,
            })),
            (Phase::Single { store }, e) => refuse(format!(
                "no cutover is in progress (the volume's blocks are in {store} alone): `{}` has nothing to do; start one with `jfs cutover start META_URL --to STORE`",
                e.name()
            )),
            (p, e) => refuse(format!("`{}` does not apply in {}", e.name(), p.describe())),
        }
    }
}

/// Why a cutover from `a` to `b` would be wrong, if it would: the same store, or one inside
/// the other (blocks written to one would appear in the other), by `place`'s one overlap
/// check (however each store is spelled).
pub fn overlap(a: &str, b: &str) -> Option<String> {
    let (pa, pb) = (place::of_spec(a, None), place::of_spec(b, None));
    let norm = |u: &str| u.trim_end_matches('/').to_string() + "/";
    if norm(a) == norm(b) || place::same(&pa, &pb) {
        return Some("it is the store the blocks are in already".into());
    }
    // A store `place` cannot name (memory) is compared by its spelling.
    let nested = if pa.is_empty() || pb.is_empty() {
        norm(a).starts_with(&norm(b)) || norm(b).starts_with(&norm(a))
    } else {
        place::find(&pa, &pb).is_some()
    };
    nested.then(|| format!("{a} and {b} overlap (one is inside the other)"))
}

/// The record and its raw bytes (None: no record, the volume was never cut over).
pub async fn load(engine: &dyn Engine) -> Result<Option<(StorageState, Vec<u8>)>> {
    match engine.get(keys::STORAGE).await? {
        None => Ok(None),
        Some(raw) => Ok(Some((decode(&raw)?, raw))),
    }
}

/// The current state: the record, or `initial(settings.storage)`.
pub async fn current(engine: &dyn Engine, settings_store: &str) -> Result<StorageState> {
    Ok(load(engine)
        .await?
        .map(|(s, _)| s)
        .unwrap_or_else(|| StorageState::initial(settings_store)))
}

impl crate::record::Versioned for StorageState {
    const KIND: &'static str = "the storage record";
    const VERSION: u32 = RECORD_VERSION;
}

pub fn decode(raw: &[u8]) -> Result<StorageState> {
    crate::record::decode(raw)
}

pub fn encode(s: &StorageState) -> Vec<u8> {
    crate::record::encode(s)
}

/// The generation a raw record (or its absence) stands for.
pub fn gen_of(raw: Option<&[u8]>) -> Result<u64> {
    Ok(match raw {
        None => 0,
        Some(r) => decode(r)?.gen,
    })
}

/// Commit `ev` as a journaled transaction: the record is re-read in it (a concurrent
/// transition makes this one conflict and re-check), the next state written with its audit
/// record, and `settings.storage` kept equal to the primary store. Returns the state before
/// and after (equal when `ev` changed nothing, e.g. a re-run `start`).
pub async fn transition(engine: &dyn Engine, ev: &Event) -> Result<(StorageState, StorageState)> {
    transition_as(engine, ev, None).await
}

/// `transition`, audited as done by `who` (the operator's command, when a mount commits the
/// step for it) instead of this process.
pub async fn transition_as(
    engine: &dyn Engine,
    ev: &Event,
    who: Option<&str>,
) -> Result<(StorageState, StorageState)> {
    use crate::engine::CommitOutcome;
    use crate::journal::Op;
    for attempt in 1u32.. {
        let mut tx = crate::txn::Txn::new(engine);
        let setting = tx.get(keys::SETTING).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFormatted,
                "no volume here: run `jfs format` first",
            )
        })?;
        let mut settings: crate::Settings = serde_json::from_slice(&setting)
            .map_err(|e| corrupt(format!("volume settings do not decode: {e}")))?;
        let cur = match tx.get(keys::STORAGE).await? {
            Some(raw) => decode(&raw)?,
            None => StorageState::initial(&settings.storage),
        };
        let next = cur.step(ev, now_ns())?;
        if next.phase == cur.phase && next.gen == cur.gen {
            return Ok((cur.clone(), cur));
        }
        tx.put(keys::STORAGE.to_vec(), encode(&next));
        let mut audit = Audit::new(ev.name(), &cur, &next);
        if let Some(w) = who {
            audit.who = w.to_string();
        }
        tx.put(
            keys::audit(audit.at_ns, audit.gen),
            serde_json::to_vec(&audit).expect("audit records serialize"),
        );
        if settings.storage != next.phase.primary() {
            settings.storage = next.phase.primary().to_string();
            tx.put(
                keys::SETTING.to_vec(),
                serde_json::to_vec(&settings).expect("settings serialize"),
            );
        }
        tx.set_op(Op::Settings {
            what: format!("storage {}: {}", ev.name(), next.phase.describe()),
        });
        match tx.commit().await? {
            CommitOutcome::Committed { .. } => return Ok((cur, next)),
            CommitOutcome::Conflict => crate::retry::conflict(attempt).await?,
        }
    }
    unreachable!("the loop returns")
}

/// One audit record per transition (key `H<at_ns><gen>`, journaled with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    pub at_ns: i64,
    /// `user@host pid N`.
    pub who: String,
    pub action: String,
    pub from: String,
    pub to: String,
    pub gen: u64,
}

impl Audit {
    /// `user@host pid N` of this process.
    pub fn who_am_i() -> String {
        let user = std::env::var("SUDO_USER")
            .or_else(|_| std::env::var("USER"))
            .unwrap_or_else(|_| format!("uid {}", own_uid()));
        format!(
            "{user}@{} pid {}",
            crate::retry::hostname(),
            std::process::id()
        )
    }

    pub fn new(action: &str, from: &StorageState, to: &StorageState) -> Audit {
        Audit {
            at_ns: to.changed_ns,
            who: Audit::who_am_i(),
            action: action.to_string(),
            from: from.phase.describe(),
            to: to.phase.describe(),
            gen: to.gen,
        }
    }
}

/// The real uid, from /proc (no unsafe call needed).
fn own_uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_else(|| "?".into())
}

/// Every audit record, oldest first.
pub async fn audit_log(engine: &dyn Engine) -> Result<Vec<Audit>> {
    let mut out = Vec::new();
    crate::engine::scan_all(
        engine,
        keys::AUDIT_PREFIX,
        &keys::prefix_end(keys::AUDIT_PREFIX),
        1000,
        |page| {
            for (k, v) in page {
                out.push(serde_json::from_slice(&v).map_err(|e| {
                    corrupt(format!(
                        "audit record {:?} does not decode: {e}",
                        String::from_utf8_lossy(&k)
                    ))
                })?);
            }
            Ok(())
        },
    )
    .await?;
    Ok(out)
}

/// What a writer's uploads went by: the generation, and the stores that generation places
/// blocks in (writes) and reads them from.
pub struct Placement {
    pub gen: u64,
    pub state: StorageState,
    /// Writes: to the primary and the secondary; reads: primary, then secondary.
    pub store: Arc<dyn BlockStore>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("gen", &self.gen)
            .field("phase", &self.state.phase.describe())
            .finish()
    }
}

/// How a writer learns where to put blocks, and follows a change (`volume` implements it over
/// real stores; `Fixed` serves tools that cannot follow).
#[async_trait]
pub trait StorageFollow: Send + Sync + 'static {
    /// The placement uploads go by now.
    fn current(&self) -> Arc<Placement>;
    /// The record changed: re-read it, build the stores it names, acknowledge; the new
    /// placement, or an error when this writer cannot follow (it then writes nothing more).
    async fn reload(&self) -> Result<Arc<Placement>>;
}

/// A placement that never changes: uploads go to one store. Fit only while the record says
/// `single` of that store; a writer on it is fenced by any transition, with a message to
/// reopen the volume.
pub struct Fixed {
    placement: Arc<Placement>,
    engine: Arc<dyn Engine>,
}

impl Fixed {
    pub async fn new(
        engine: Arc<dyn Engine>,
        store: Arc<dyn BlockStore>,
        settings_store: &str,
    ) -> Result<Fixed> {
        let state = current(&*engine, settings_store).await?;
        // In a cutover, one store is not where this generation places blocks: such a writer
        // is fenced at its first commit (gen u64::MAX never matches).
        let gen = match state.phase {
            Phase::Single { .. } => state.gen,
            _ => u64::MAX,
        };
        Ok(Fixed {
            placement: Arc::new(Placement { gen, state, store }),
            engine,
        })
    }
}

#[async_trait]
impl StorageFollow for Fixed {
    fn current(&self) -> Arc<Placement> {
        self.placement.clone()
    }
    async fn reload(&self) -> Result<Arc<Placement>> {
        let now = gen_of(self.engine.get(keys::STORAGE).await?.as_deref())?;
        Err(fenced(self.placement.gen, now))
    }
}

/// The error of a commit whose blocks were placed under generation `had` while the volume is
/// at `now`.
pub fn fenced(had: u64, now: u64) -> Error {
    Error::new(
        ErrorKind::Fenced,
        format!(
            "the volume's storage changed (generation {} -> {now}, a cutover step): this writer placed its blocks by the old rule and cannot follow; reopen the volume",
            if had == u64::MAX { "unfit".to_string() } else { had.to_string() }
        ),
    )
}

fn repair_name(role: Role, key: &str) -> Result<String> {
    let file = key.rsplit('/').next().unwrap_or(key);
    let name = format!("{REPAIR_PREFIX}{}.{file}", role.tag());
    crate::engine::check_aux_name(&name)?;
    Ok(name)
}

/// A repair entry: block `key` must still be copied into the store of `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    pub role: Role,
    pub key: String,
    pub error: String,
    pub at_ns: i64,
}

/// Record that block `key` is missing in the store of `role` (before the write that failed
/// to put it there returns).
pub async fn repair_add(engine: &dyn Engine, role: Role, key: &str, error: &str) -> Result<()> {
    let r = Repair {
        role,
        key: key.to_string(),
        error: error.to_string(),
        at_ns: now_ns(),
    };
    engine
        .aux_put(
            &repair_name(role, key)?,
            Some(&serde_json::to_vec(&r).expect("serializes")),
        )
        .await
}

pub async fn repair_done(engine: &dyn Engine, role: Role, key: &str) -> Result<()> {
    engine.aux_put(&repair_name(role, key)?, None).await
}

/// The repair entries for `role`, or all of them.
pub async fn repairs(engine: &dyn Engine, role: Option<Role>) -> Result<Vec<Repair>> {
    let prefix = match role {
        Some(r) => format!("{REPAIR_PREFIX}{}.", r.tag()),
        None => REPAIR_PREFIX.to_string(),
    };
    let mut out = Vec::new();
    for (name, v) in engine.aux_list(&prefix).await? {
        out.push(
            serde_json::from_slice(&v)
                .map_err(|e| corrupt(format!("repair record {name} does not decode: {e}")))?,
        );
    }
    Ok(out)
}

/// Live sessions that have not acknowledged generation `gen` yet (the barrier waits for
/// them); dead ones are ignored (fencing refuses their commits).
pub async fn waiting_sessions(
    engine: &dyn Engine,
    gen: u64,
    timeout: Duration,
) -> Result<Vec<Session>> {
    let now = now_ns();
    Ok(session::list(engine)
        .await?
        .into_iter()
        .filter(|s| s.is_live(now, timeout) && s.acks.get(ACK).copied().unwrap_or(0) < gen)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check(state, event, expected)`: the next phase and generation, or part of the refusal.
    fn check(s: &StorageState, ev: Event, want: std::result::Result<(&str, u64), &str>) {
        match (s.step(&ev, 1), want) {
            (Ok(n), Ok((phase, gen))) => {
                assert_eq!((n.phase.describe().as_str(), n.gen), (phase, gen), "{ev:?}")
            }
            (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{ev:?}: {e}"),
            (got, want) => panic!("{ev:?} from {s:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn the_cutover_runs_in_order_and_abort_goes_back_to_a() {
        let a = "file:///a".to_string();
        let b = "s3://b/vol".to_string();
        let s0 = StorageState::initial(&a);
        let to_b = Event::Start { to: b.clone() };
        check(
            &s0,
            to_b.clone(),
            Ok(("dual(A file:///a primary, B s3://b/vol secondary)", 1)),
        );
        check(&s0, Event::Switch, Err("no cutover is in progress"));
        check(&s0, Event::Start { to: a.clone() }, Err("already"));
        check(
            &s0,
            Event::Start {
                to: "file:///a/sub".into(),
            },
            Err("overlap"),
        );
        let d = s0.step(&to_b, 1).unwrap();
        check(
            &d,
            to_b.clone(),
            Ok(("dual(A file:///a primary, B s3://b/vol secondary)", 1)),
        );
        check(
            &d,
            Event::Start {
                to: "s3://c".into(),
            },
            Err("already in progress"),
        );
        check(&d, Event::Verified, Err("after backfill"));
        check(&d, Event::Switch, Err("passed verify"));
        check(&d, Event::Finish, Err("after switch"));
        check(&d, Event::Abort, Ok(("single(file:///a)", 2)));
        let d = d.step(&Event::Backfilled, 1).unwrap();
        assert_eq!(d.gen, 1, "progress is not a change of placement");
        let d = d.step(&Event::Verified, 1).unwrap();
        check(
            &d,
            Event::Switch,
            Ok(("switched(B s3://b/vol primary, A file:///a secondary)", 2)),
        );
        let s = d.step(&Event::Switch, 1).unwrap();
        assert_eq!(
            (s.phase.primary(), s.phase.secondary()),
            (b.as_str(), Some(a.as_str()))
        );
        check(
            &s,
            Event::Switch,
            Ok(("switched(B s3://b/vol primary, A file:///a secondary)", 2)),
        );
        check(&s, Event::Finish, Ok(("single(s3://b/vol)", 3)));
        // Abort from switched returns to dual (A primary again) first.
        check(
            &s,
            Event::Abort,
            Ok((
                "dual(A file:///a primary, B s3://b/vol secondary, backfilled, verified, aborting)",
                3,
            )),
        );
        // An interrupted abort is finished by abort, or undone by switch.
        let ab = s.step(&Event::Abort, 1).unwrap();
        check(&ab, Event::Abort, Ok(("single(file:///a)", 4)));
        check(
            &ab,
            Event::Switch,
            Ok(("switched(B s3://b/vol primary, A file:///a secondary)", 4)),
        );
        // The flag is left out of records that do not have it (as older releases wrote).
        assert!(!String::from_utf8(encode(&d)).unwrap().contains("aborting"));
        assert_eq!(decode(&encode(&ab)).unwrap(), ab);
        let f = s.step(&Event::Finish, 1).unwrap();
        check(&f, Event::Abort, Err("no cutover is in progress"));
        assert_eq!(f.phase.roles(), None);
    }

    #[test]
    fn a_newer_record_is_refused_and_an_absent_one_is_generation_0() {
        let s = StorageState::initial("file:///a");
        assert_eq!(decode(&encode(&s)).unwrap(), s);
        let mut v: serde_json::Value = serde_json::from_slice(&encode(&s)).unwrap();
        v["version"] = 9.into();
        let e = decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 9"), "{e}");
        assert_eq!(gen_of(None).unwrap(), 0);
    }

    /// Each phase as the previous release wrote it still opens (and is written back the same).
    #[test]
    fn the_previous_format_opens() {
        for raw in [
            r#"{"version":1,"gen":0,"phase":"single","store":"file:///a","changed_ns":1}"#,
            r#"{"version":1,"gen":3,"phase":"dual","from":"file:///a","to":"s3://b/p","backfilled":true,"verified":false,"changed_ns":2}"#,
            r#"{"version":1,"gen":4,"phase":"switched","from":"file:///a","to":"s3://b/p","changed_ns":3}"#,
        ] {
            let s = decode(raw.as_bytes()).unwrap();
            assert_eq!(encode(&s), raw.as_bytes());
        }
        // Written before `backfilled`/`verified` existed.
        let s = decode(br#"{"version":1,"gen":2,"phase":"dual","from":"file:///a","to":"file:///b","changed_ns":1}"#).unwrap();
        assert_eq!(s.gen, 2);
        assert!(matches!(
            s.phase,
            Phase::Dual {
                backfilled: false,
                verified: false,
                aborting: false,
                ..
            }
        ));
    }

    #[test]
    fn repair_names_are_valid_aux_names() {
        let k = keys::block_key("vol", 12_345_678, 2, 4096);
        assert_eq!(
            repair_name(Role::B, &k).unwrap(),
            "repair.b.12345678_2_4096"
        );
    }
}
