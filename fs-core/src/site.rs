//! Which site a volume's metadata belongs to. A mirror's metadata carries a *mirror marker*:
//! an aux record (beside the metadata, never replicated, never dumped) naming the mirror, its
//! primary, its own block store and the origin store.
//!
//! Engines enforce the marker inside their commit sections, so no writer can forget it:
//! - `commit` on marked metadata fails with `ReadOnly` (a write there would fork the mirror's
//!   history from the primary's: the next entry from the primary carries the same number);
//! - `apply` and `install_*` on unmarked metadata fail with `ReadOnly` (replaying a primary's
//!   journal, or worse installing a snapshot, into a volume of its own would destroy it).
//!
//! The mirror agent marks empty metadata before its first snapshot. Only a promotion or an
//! explicit `mirror-agent detach` removes the marker; a detached mirror keeps a
//! `mirror.detached` record so that an agent started on it again refuses to resume.

use crate::engine::Engine;
use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::record::{self, Versioned};
use serde::{Deserialize, Serialize};

/// The aux record name of the marker.
pub const MARKER: &str = "mirror";
/// Left by `mirror-agent detach`: this metadata was a mirror and now is a volume of its own.
pub const DETACHED: &str = "mirror.detached";

/// Written by a running mirror agent about twice a second: how fresh the mirror is, for the
/// mounts at its site (their staleness policy and metrics).
pub const PROGRESS: &str = "mirror.progress";

/// Version of the marker record; readers refuse a newer one instead of misreading it.
pub const MARKER_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorMarker {
    pub version: u32,
    /// The mirror's name (its replication slot at the primary).
    pub name: String,
    /// The primary agent's address, `host:port`.
    pub primary: String,
    /// The mirror's own block store.
    pub store: String,
    /// Where blocks not yet copied are read from (None: the volume's storage URL).
    #[serde(default)]
    pub origin_store: Option<String>,
    /// When the agent marked this metadata.
    pub since_ns: i64,
}

/// What `mirror.progress` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub version: u32,
    pub applied_seq: u64,
    pub primary_head_seq: u64,
    /// Seconds the mirror is behind (None: unknown, e.g. never connected).
    pub lag_seconds: Option<f64>,
    pub window_seconds: f64,
    pub within_window: bool,
    /// When the agent wrote this (a record much older than its period means no agent runs).
    pub at_ns: i64,
    /// A resync is being installed beside the metadata: it serves its previous state (stale)
    /// until the agent switches it to the new one.
    #[serde(default)]
    pub resyncing: bool,
    /// The primary lets this mirror write: the agent's forward socket, through which a
    /// mount here sends its changes (`volume::forward`). None: mounts here are read-only.
    #[serde(default)]
    pub forward_socket: Option<String>,
    /// Why mounts here are read-only when the agent knows (the primary refused writes).
    #[serde(default)]
    pub writes_refused: Option<String>,
}

/// How often a mirror agent writes its progress record.
pub const PROGRESS_EVERY_MS: u64 = 500;

/// The progress record of a mirror's metadata, if an agent has written one.
pub async fn progress(engine: &dyn Engine) -> Result<Option<Progress>> {
    read_record(engine, PROGRESS).await
}

pub async fn set_progress(engine: &dyn Engine, p: &Progress) -> Result<()> {
    write_record(engine, PROGRESS, Some(p)).await
}

/// `mirror.want.<session>`: blocks a mount at this site read from the origin (or was asked
/// to warm up and could not), which the agent copies ahead of its background queue. Each
/// mount rewrites its own record with its latest `WANT_MAX` blocks; the agent reads them.
pub const WANT_PREFIX: &str = "mirror.want.";
pub const WANT_MAX: usize = 1024;
/// A record older than this is a dead mount's: ignored.
pub const WANT_TTL_NS: i64 = 600 * 1_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub version: u32,
    /// Block keys, oldest first.
    pub keys: Vec<String>,
    pub at_ns: i64,
}

pub async fn set_want(engine: &dyn Engine, session: &str, w: Option<&Want>) -> Result<()> {
    write_record(engine, &format!("{WANT_PREFIX}{session}"), w).await
}

/// Every live want record, by name (records that do not decode are skipped with a warning:
/// they only order copies).
pub async fn wants(engine: &dyn Engine) -> Result<Vec<(String, Want)>> {
    let now = crate::types::now_ns();
    let mut out = Vec::new();
    for (name, v) in engine.aux_list(WANT_PREFIX).await? {
        match decode::<Want>(&name, &v) {
            Ok(w) if now - w.at_ns <= WANT_TTL_NS => out.push((name, w)),
            Ok(_) => {}
            Err(e) => tracing::warn!(record = %name, error = %e, "skipping a want record"),
        }
    }
    Ok(out)
}

/// What `mirror.detached` records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detached {
    pub version: u32,
    pub name: String,
    pub primary: String,
    /// The last sequence number applied from the primary.
    pub at_seq: u64,
    pub time_ns: i64,
}

/// The aux record named exactly `name` (aux_list takes a prefix), if present.
pub async fn aux_exact(engine: &dyn Engine, name: &str) -> Result<Option<Vec<u8>>> {
    Ok(engine
        .aux_list(name)
        .await?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v))
}

/// Aux record `name`, decoded (its version checked), if present.
async fn read_record<T: Versioned>(engine: &dyn Engine, name: &str) -> Result<Option<T>> {
    match aux_exact(engine, name).await? {
        Some(v) => decode(name, &v).map(Some),
        None => Ok(None),
    }
}

/// Write aux record `name` (`None` removes it).
async fn write_record<T: Versioned>(engine: &dyn Engine, name: &str, r: Option<&T>) -> Result<()> {
    let v = r.map(record::encode);
    engine.aux_put(name, v.as_deref()).await
}

fn decode<T: Versioned>(name: &str, v: &[u8]) -> Result<T> {
    record::decode_as(&format!("aux record {name}"), v)
}

macro_rules! versioned {
    ($($t:ty => $kind:literal),* $(,)?) => {
        $(impl Versioned for $t {
            const KIND: &'static str = $kind;
            const VERSION: u32 = MARKER_VERSION;
        })*
    };
}
versioned! {
    MirrorMarker => "the mirror marker",
    Progress => "the mirror progress record",
    Want => "a want record",
    Detached => "the detach record",
    Epoch => "the epoch record",
    Moved => "the move record",
    Fenced => "the fence record",
    Rollback => "a rollback record",
}

/// The mirror marker of this metadata, if it is a mirror's.
pub async fn marker(engine: &dyn Engine) -> Result<Option<MirrorMarker>> {
    read_record(engine, MARKER).await
}

/// The record a detach left, if this metadata was once a mirror.
pub async fn detached(engine: &dyn Engine) -> Result<Option<Detached>> {
    read_record(engine, DETACHED).await
}

pub async fn set_marker(engine: &dyn Engine, m: &MirrorMarker) -> Result<()> {
    write_record(engine, MARKER, Some(m)).await
}

/// Make a mirror's metadata a volume of its own: the marker goes, a detach record stays.
pub async fn detach(engine: &dyn Engine, m: &MirrorMarker) -> Result<Detached> {
    let d = Detached {
        version: MARKER_VERSION,
        name: m.name.clone(),
        primary: m.primary.clone(),
        at_seq: engine.journal_bounds().await?.last,
        time_ns: crate::types::now_ns(),
    };
    write_record(engine, DETACHED, Some(&d)).await?;
    engine.aux_put(MARKER, None).await?;
    // A fenced primary detached (a fence undone, or a volume of its own from now on): its
    // mounts must not follow the move it once recorded.
    engine.aux_put(MOVED, None).await?;
    engine.aux_put(FENCED, None).await?;
    Ok(d)
}

/// The error a writer gets on a mirror's metadata: one line saying whose mirror it is and
/// what to do instead.
pub fn writes_refused(url: &str, m: Option<&MirrorMarker>) -> Error {
    let whose = match m {
        Some(m) => format!(
            "the metadata of mirror {:?} (it follows the primary at {})",
            m.name, m.primary
        ),
        None => "a mirror's metadata".to_string(),
    };
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "{url} is {whose}: it is read-only, and a write here would fork its history from the primary's; write at the primary, or, to make it a volume of its own, stop its agent and run `mirror-agent detach --config MIRROR_CONFIG` (runbooks/detach-mirror.md)"
        ),
    )
}

/// `writes_refused` from the raw marker record, for engines that fetched it in their commit
/// section (a record that does not decode still refuses, with the generic wording).
pub fn refusal_from_record(url: &str, record: Option<&[u8]>) -> Error {
    let m = record.and_then(|v| decode::<MirrorMarker>(MARKER, v).ok());
    writes_refused(url, m.as_ref())
}

/// The error a writer gets on a fenced old primary whose move is recorded: the META_URL to
/// point its commands at, not only the agent that now follows whom.
pub fn moved_refusal(url: &str, m: &Moved, marker: Option<&MirrorMarker>) -> Error {
    let now = match marker {
        Some(k) => format!("mirror {:?} of the primary at {}", k.name, k.primary),
        None => "a mirror".to_string(),
    };
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "{url} was fenced: the volume's primary moved to {} (epoch {}) after seq {}; write there: give that META_URL instead of this one (its password as before). {} This metadata is now {now}; if the fence was a mistake and no mirror was promoted from it, `mirror-agent detach --meta URL` undoes it",
            m.meta_url, m.epoch, m.at_seq,
            // Embedded metadata is opened only at its own site (its one writer's lock).
            if m.meta_url.starts_with("rocksdb:") {
                "Mounts of this metadata do not follow to embedded metadata: they stay here read-only; unmount them and mount that META_URL at its site."
            } else {
                "Mounts of this metadata follow by themselves."
            }
        ),
    )
}

/// Why a writer is refused on marked metadata: where the volume moved if a move is recorded,
/// else whose mirror it is.
pub async fn refusal(engine: &dyn Engine) -> Error {
    let m = marker(engine).await.ok().flatten();
    if let Ok(Some(mv)) = moved(engine).await {
        return moved_refusal(&engine.display_url(), &mv, m.as_ref());
    }
    writes_refused(&engine.display_url(), m.as_ref())
}

/// `writes_refused` with the marker read from the engine (the slow path of a refused commit).
pub async fn refuse_commit(engine: &dyn Engine) -> Error {
    refusal(engine).await
}

/// The error the mirror agent's replay gets on metadata that is not marked as a mirror.
pub fn replay_refused(url: &str) -> Error {
    Error::new(
        ErrorKind::ReadOnly,
        format!(
            "{url} is not marked as a mirror's metadata: replaying a primary's journal (or installing a snapshot) here would overwrite a volume of its own; point the mirror agent at empty metadata"
        ),
    )
}

/// For `apply` and `install_*` of engines: fail unless this metadata is a mirror's.
pub async fn require_mirror(engine: &dyn Engine) -> Result<()> {
    if aux_exact(engine, MARKER).await?.is_none() {
        return Err(replay_refused(&engine.display_url()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_mirror_and_the_way_out() {
        let m = MirrorMarker {
            version: 1,
            name: "eu-west".into(),
            primary: "p.example:9566".into(),
            store: "file:///m".into(),
            origin_store: None,
            since_ns: 0,
        };
        let e = writes_refused("rocksdb:///m/meta", Some(&m));
        assert_eq!(e.kind(), ErrorKind::ReadOnly);
        let s = e.to_string();
        assert!(
            s.contains("\"eu-west\"") && s.contains("p.example:9566"),
            "{s}"
        );
        assert!(s.contains("mirror-agent detach"), "{s}");
        assert!(!s.contains('\n'));
    }

    /// The records as the previous release wrote them (field order and all) still open.
    #[test]
    fn the_previous_formats_open() {
        let m: MirrorMarker = decode(MARKER, br#"{"version":1,"name":"eu","primary":"p:9566","store":"file:///m","origin_store":null,"since_ns":5}"#).unwrap();
        assert_eq!(
            (m.name.as_str(), m.primary.as_str(), m.since_ns),
            ("eu", "p:9566", 5)
        );
        // Written before origin_store existed.
        let m: MirrorMarker = decode(
            MARKER,
            br#"{"version":1,"name":"eu","primary":"p:9566","store":"file:///m","since_ns":5}"#,
        )
        .unwrap();
        assert_eq!(m.origin_store, None);
        let p: Progress = decode(PROGRESS, br#"{"version":1,"applied_seq":7,"primary_head_seq":9,"lag_seconds":null,"window_seconds":30.0,"within_window":true,"at_ns":1}"#).unwrap();
        assert_eq!(
            (p.applied_seq, p.primary_head_seq, p.resyncing),
            (7, 9, false)
        );
        let w: Want = decode(
            "mirror.want.s",
            br#"{"version":1,"keys":["a","b"],"at_ns":3}"#,
        )
        .unwrap();
        assert_eq!(w.keys, ["a", "b"]);
        let d: Detached = decode(
            DETACHED,
            br#"{"version":1,"name":"eu","primary":"p:9566","at_seq":11,"time_ns":2}"#,
        )
        .unwrap();
        assert_eq!(d.at_seq, 11);
        let e: Epoch = decode(
            "epoch",
            br#"{"version":1,"epoch":2,"site":"eu","at_seq":40,"at_ns":1,"from":"p:9566"}"#,
        )
        .unwrap();
        assert_eq!((e.epoch, e.at_seq, e.history.len()), (2, 40, 0));
        let e: Epoch = decode("epoch", br#"{"version":1,"epoch":3,"site":"us","at_seq":50,"at_ns":1,"from":"q:9566","history":[{"epoch":2,"at_seq":40,"site":"eu"}]}"#).unwrap();
        assert_eq!(e.parted_from(1), Some(40));
        let mv: Moved = decode(
            MOVED,
            br#"{"version":1,"meta_url":"redis://h/1","epoch":2,"at_seq":9,"at_ns":1}"#,
        )
        .unwrap();
        assert_eq!(mv.meta_url, "redis://h/1");
        let f: Fenced = decode(FENCED, br#"{"version":1,"name":"old","primary":"q:9566","epoch":1,"at_seq":9,"at_ns":1,"by":"mirror-agent fence"}"#).unwrap();
        assert_eq!((f.epoch, f.by.as_str()), (1, "mirror-agent fence"));
        let r: Rollback = decode("volume.rollback.1", br#"{"version":1,"dir":"/d","host":"h","from_epoch":1,"to_epoch":2,"parted_at":5,"first_seq":6,"last_seq":9,"entries":4,"files":2,"bytes":100,"failed":0,"at_ns":1}"#).unwrap();
        assert_eq!((r.first_seq, r.last_seq, r.bytes), (6, 9, 100));
        // What this release writes is what it read (field order kept).
        let raw = br#"{"version":1,"name":"eu","primary":"p:9566","at_seq":11,"time_ns":2}"#;
        assert_eq!(
            record::encode(&decode::<Detached>(DETACHED, raw).unwrap()),
            raw
        );
    }

    #[test]
    fn a_newer_marker_is_refused_not_misread() {
        let v = br#"{"version": 9, "name": "x"}"#;
        let e = decode::<MirrorMarker>(MARKER, v).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
    }
}

/// The volume's primary epoch (key `epoch`, in the key space: journaled and replicated).
/// Every promotion of a mirror raises it in the promoted metadata, in the transaction that
/// starts its own history; an agent or mirror that has seen a newer epoch refuses anything
/// speaking for an older one. Absent: epoch 0 (a volume never moved).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    pub version: u32,
    pub epoch: u64,
    /// The site that became the primary (the promoted mirror's name).
    pub site: String,
    /// The last entry of the history it continues (the old primary's, as applied here).
    pub at_seq: u64,
    pub at_ns: i64,
    /// The primary it took over from (its agent's address).
    pub from: String,
    /// Where every earlier epoch began (oldest first; records written before this field
    /// existed have none): a site that rejoins from an older epoch finds in it the point
    /// where its history and this one parted.
    #[serde(default)]
    pub history: Vec<EpochStart>,
}

/// Where an epoch began: its promotion continued the history before it from `at_seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u64,
    pub at_seq: u64,
    pub site: String,
}

impl Epoch {
    /// The last entry that a site which stayed at epoch `old` (an old primary, fenced or
    /// not) shares with this history: where the promotion to `old + 1` took over. None when
    /// this record does not reach back that far (written before `history` existed).
    pub fn parted_from(&self, old: u64) -> Option<u64> {
        if self.epoch == old + 1 {
            return Some(self.at_seq);
        }
        self.history
            .iter()
            .find(|h| h.epoch == old + 1)
            .map(|h| h.at_seq)
    }
}

/// The epoch record, if the volume was ever promoted.
pub async fn epoch_record(engine: &dyn Engine) -> Result<Option<Epoch>> {
    match engine.get(crate::keys::EPOCH).await? {
        None => Ok(None),
        Some(v) => decode(crate::keys::EPOCH_NAME, &v).map(Some),
    }
}

/// The volume's epoch (0 when never promoted).
pub async fn epoch(engine: &dyn Engine) -> Result<u64> {
    Ok(epoch_record(engine).await?.map_or(0, |e| e.epoch))
}

/// Left by `mirror-agent fence` on a superseded primary's metadata (beside its mirror
/// marker): where the volume went, so that its mounts follow it there.
pub const MOVED: &str = "volume.moved";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub version: u32,
    /// The new primary's META_URL (no password: mounts take it from where they took this
    /// one's).
    pub meta_url: String,
    /// The epoch the new primary holds (or will hold, once promoted).
    pub epoch: u64,
    /// The last sequence number written here.
    pub at_seq: u64,
    pub at_ns: i64,
}

pub async fn moved(engine: &dyn Engine) -> Result<Option<Moved>> {
    read_record(engine, MOVED).await
}

pub async fn set_moved(engine: &dyn Engine, m: Option<&Moved>) -> Result<()> {
    write_record(engine, MOVED, m).await
}

/// Left by `mirror-agent fence` (and by `promote --force` when it fenced the old primary
/// itself) beside the marker: which epoch this metadata held when it was fenced, so that a
/// second fence can tell a site still waiting to rejoin from one that rejoined since.
pub const FENCED: &str = "volume.fenced";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    pub version: u32,
    /// The name it was given as a mirror, and the new primary it is to follow.
    pub name: String,
    pub primary: String,
    /// The epoch it held, and its last entry, when fenced.
    pub epoch: u64,
    pub at_seq: u64,
    pub at_ns: i64,
    /// Who fenced it ("mirror-agent fence", or the forced promotion of a mirror).
    pub by: String,
}

pub async fn fenced(engine: &dyn Engine) -> Result<Option<Fenced>> {
    read_record(engine, FENCED).await
}

pub async fn set_fenced(engine: &dyn Engine, f: Option<&Fenced>) -> Result<()> {
    write_record(engine, FENCED, f).await
}

/// `volume.rollback.<n>`: a diverged tail this site dropped when it rejoined a newer
/// primary (entries it had committed that the new primary never received), saved for the
/// operator before the resync replaced them (MongoDB's rollback files are the model). Shown
/// by `jfs status` until the record is removed (`mirror-agent rollback forget`).
pub const ROLLBACK_PREFIX: &str = "volume.rollback.";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    pub version: u32,
    /// The directory the tail was saved in, on host `host`.
    pub dir: String,
    pub host: String,
    /// The epoch this site held, and the epoch of the primary it rejoined.
    pub from_epoch: u64,
    pub to_epoch: u64,
    /// The last entry both histories share; the saved entries are `first_seq..=last_seq`.
    pub parted_at: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub entries: u64,
    /// Files saved with their bytes, their total size, and files that could not be read.
    pub files: u64,
    pub bytes: u64,
    pub failed: u64,
    pub at_ns: i64,
}

impl Rollback {
    /// The record's name (`volume.rollback.<at_ns>`).
    pub fn name(&self) -> String {
        format!("{ROLLBACK_PREFIX}{}", self.at_ns)
    }
}

/// Every rollback record, oldest first.
pub async fn rollbacks(engine: &dyn Engine) -> Result<Vec<Rollback>> {
    let mut out = Vec::new();
    for (name, v) in engine.aux_list(ROLLBACK_PREFIX).await? {
        out.push(decode::<Rollback>(&name, &v)?);
    }
    out.sort_by_key(|r| r.at_ns);
    Ok(out)
}

pub async fn set_rollback(engine: &dyn Engine, name: &str, r: Option<&Rollback>) -> Result<()> {
    write_record(engine, name, r).await
}

/// Written by `mirror-agent promote` before it removes the marker, removed once the epoch is
/// committed: a promotion killed in between is finished by running it again.
pub const PROMOTING: &str = "mirror.promoting";

pub async fn promoting(engine: &dyn Engine) -> Result<Option<Epoch>> {
    read_record(engine, PROMOTING).await
}

pub async fn set_promoting(engine: &dyn Engine, e: Option<&Epoch>) -> Result<()> {
    write_record(engine, PROMOTING, e).await
}

/// How far a promotion moves the id counters past what this site saw.
pub const ID_MARGIN: i64 = 1 << 20;

/// The promotion's own transaction, the first of the new primary's history: the epoch
/// record, and where blocks go from now on (`storage`, a new generation, with its audit
/// record; `settings.storage` its primary).
pub async fn commit_promotion(
    engine: &dyn Engine,
    e: &Epoch,
    phase: crate::storage::Phase,
) -> Result<u64> {
    use crate::engine::CommitOutcome;
    use crate::keys;
    use crate::storage::{self, StorageState};
    for attempt in 1u32.. {
        let mut tx = crate::txn::Txn::new(engine);
        let setting = tx
            .get(keys::SETTING)
            .await?
            .ok_or_else(|| Error::new(ErrorKind::NotFormatted, "no volume here to promote"))?;
        let mut settings: crate::Settings = serde_json::from_slice(&setting)
            .map_err(|e| corrupt(format!("volume settings do not decode: {e}")))?;
        let cur = match tx.get(keys::STORAGE).await? {
            Some(raw) => storage::decode(&raw)?,
            None => StorageState::initial(&settings.storage),
        };
        let next = StorageState {
            version: storage::RECORD_VERSION,
            gen: cur.gen + 1,
            phase: phase.clone(),
            changed_ns: e.at_ns,
        };
        // The record keeps where every earlier epoch began (see `Epoch::parted_from`).
        let mut e = e.clone();
        if let Some(raw) = tx.get(keys::EPOCH).await? {
            let prev: Epoch = decode(crate::keys::EPOCH_NAME, &raw)?;
            e.history = prev.history.clone();
            e.history.push(EpochStart {
                epoch: prev.epoch,
                at_seq: prev.at_seq,
                site: prev.site.clone(),
            });
        }
        tx.put(keys::EPOCH.to_vec(), record::encode(&e));
        // Ids the old primary handed out in entries this site never received (a failover)
        // must not be handed out again: the counters jump by a margin over any client's
        // batch and any lost tail.
        for key in [keys::NEXT_INODE, keys::NEXT_SLICE] {
            let cur = crate::journal::parse_counter(tx.get(key).await?.as_deref())?;
            tx.put(key.to_vec(), (cur + ID_MARGIN).to_string().into_bytes());
        }
        tx.put(keys::STORAGE.to_vec(), storage::encode(&next));
        let audit = storage::Audit::new(&format!("promote (epoch {})", e.epoch), &cur, &next);
        tx.put(
            keys::audit(audit.at_ns, audit.gen),
            serde_json::to_vec(&audit).expect("audit records serialize"),
        );
        settings.storage = next.phase.primary().to_string();
        tx.put(
            keys::SETTING.to_vec(),
            serde_json::to_vec(&settings).expect("settings serialize"),
        );
        tx.set_op(crate::journal::Op::Settings {
            what: format!("promote: {} is the primary at epoch {}", e.site, e.epoch),
        });
        match tx.commit().await? {
            CommitOutcome::Committed { seq, .. } => return Ok(seq),
            CommitOutcome::Conflict => crate::retry::conflict(attempt).await?,
        }
    }
    unreachable!("the loop returns")
}
