//! One sync job shared by many workers on many hosts, kept in Redis or PostgreSQL (an engine
//! the user already runs).
//!
//! The key space is cut into ranges (units). A worker claims a unit with a lease and a fencing
//! token, lists and copies that range itself (no host lists the whole tree), and saves a
//! resume cursor with the tally of what the keys up to it came to. The lease is renewed at a
//! third of its length; a worker that dies or is cut off loses it, and another worker claims
//! the unit (a new token) and resumes from the cursor. Every save, finish and release names
//! the token: one whose lease passed to another worker is refused, so a late worker cannot
//! record progress over the new holder's.
//!
//! Planning is the first split: the job starts as one unit covering everything, and the
//! worker that claims a fresh unit whose range starts at a directory lists that one level and
//! hands the subtrees back as new units (again, lazily, a level deeper when those are
//! claimed). Deletes (--delete-dst) are one more unit, claimable only once every range is
//! done without errors. The job's bandwidth and request limits are one token bucket in the
//! engine that every worker draws from, changeable while the job runs.

pub mod pg;
mod redis;

use crate::endpoint::{Endpoint, Entry, Kind};
use crate::listing::{KeyRange, MovableEnd};
use crate::run::{self, Options, Shared};
use crate::state::State;
use crate::stats::{Stats, Summary};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What defines a job: workers that join must run the same copy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Spec {
    pub src: String,
    pub dst: String,
    /// What SRC and DST are, beyond their spelling (a volume's uuid, a local directory's
    /// absolute resolved path): the same `jfs://NAME/path` may name another volume on
    /// another host, the same relative path another directory. None for object stores,
    /// which workers may reach by different endpoints, and for jobs of earlier releases.
    #[serde(default)]
    pub src_id: Option<String>,
    #[serde(default)]
    pub dst_id: Option<String>,
    /// The options that decide what is copied and deleted (filters, comparison, deletes), one
    /// `--option=value` per line (`options_identity`).
    pub identity: String,
    pub delete_dst: bool,
    pub max_delete: Option<String>,
    /// Rounds planned from the source volume's journal (`--from-journal`).
    #[serde(default)]
    pub from_journal: bool,
    /// This worker's options as the release before named them (one string): a job that
    /// release created is joined when they match (not stored).
    #[serde(skip)]
    pub legacy_identity: Option<String>,
}

/// Where a `--from-journal` job stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// The journal entry the last round that ended done brought the destination to.
    pub journal_seq: Option<u64>,
    /// The entry this round brings it to (recorded as `journal_seq` when it ends done).
    pub target: Option<u64>,
    /// This round works on the keys the journal named (`keys_in`), not on listings.
    pub keys: bool,
}

/// A round's plan: the keys the journal named (None: list everything), and the journal
/// entry they reach to.
pub struct Plan {
    pub keys: Option<Vec<String>>,
    pub target: u64,
}

/// How long one worker may take to plan a round before another takes over.
const PLANNING_TIME: Duration = Duration::from_secs(300);

/// Keys per unit of a round planned from the journal.
const KEYS_PER_UNIT: usize = 2000;

impl Plan {
    /// Where the sorted keys are cut into units (the first unit starts at the beginning).
    pub fn cuts(&self) -> Vec<String> {
        self.keys.as_deref().map_or_else(Vec::new, |k| {
            k.iter()
                .skip(KEYS_PER_UNIT)
                .step_by(KEYS_PER_UNIT)
                .cloned()
                .collect()
        })
    }
}

impl Spec {
    /// The same work: the same places and options. An object store's `endpoint=` may differ
    /// (workers on other hosts or networks reach the same bucket by other addresses).
    pub fn same_work(&self, o: &Spec) -> bool {
        self.differences(o).is_empty()
    }

    /// How `o` (a joining worker's spec) differs from this job's: one phrase per difference,
    /// naming the option and both values.
    pub fn differences(&self, o: &Spec) -> Vec<String> {
        fn place(spec: &str) -> String {
            let Some((base, q)) = spec.split_once('?') else {
                return spec.to_string();
            };
            let kept: Vec<&str> = q
                .split('&')
                .filter(|p| !p.starts_with("endpoint="))
                .collect();
            if kept.is_empty() {
                base.to_string()
            } else {
                format!("{base}?{}", kept.join("&"))
            }
        }
        let mut out = Vec::new();
        let mut differ = |what: &str, job: &str, this: &str| {
            if job != this {
                out.push(format!(
                    "{what}: the job has {job:?}, this worker has {this:?}"
                ));
            }
        };
        differ("SRC", &place(&self.src), &place(&o.src));
        differ("DST", &place(&self.dst), &place(&o.dst));
        if let (Some(a), Some(b)) = (&self.src_id, &o.src_id) {
            differ(&format!("what SRC {} is", o.src), a, b);
        }
        if let (Some(a), Some(b)) = (&self.dst_id, &o.dst_id) {
            differ(&format!("what DST {} is", o.dst), a, b);
        }
        let (mine, theirs) = (options_of(&self.identity), options_of(&o.identity));
        match (mine, theirs) {
            (Some(a), Some(b)) => {
                let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for n in names {
                    let none = String::from("(not given)");
                    differ(n, a.get(n).unwrap_or(&none), b.get(n).unwrap_or(&none));
                }
            }
            // A job of the release before: its options were one string.
            (None, _) if o.legacy_identity.as_deref() == Some(self.identity.as_str()) => {}
            _ => differ("options", &self.identity, &o.identity),
        }
        let opt = |m: &Option<String>| m.clone().unwrap_or_else(|| "(not given)".into());
        differ(
            "--delete-dst",
            &self.delete_dst.to_string(),
            &o.delete_dst.to_string(),
        );
        differ("--max-delete", &opt(&self.max_delete), &opt(&o.max_delete));
        differ(
            "--from-journal",
            &self.from_journal.to_string(),
            &o.from_journal.to_string(),
        );
        out.dedup();
        out
    }

    /// `spec` (a joining worker's) is this job's work, or a clear refusal naming what differs.
    pub fn check_same_work(&self, spec: &Spec) -> Result<()> {
        let d = self.differences(spec);
        if !d.is_empty() {
            bail!(
                "this job was created for {} -> {} with other options than this worker's: {}; run the job's own command (`jfs-sync job status` shows SRC and DST), or give the job another name",
                self.src,
                self.dst,
                d.join("; ")
            );
        }
        Ok(())
    }
}

/// The options that decide what a sync copies, one `name=value` per line: part of a job's
/// identity and of the local resume state's.
pub fn options_identity(opts: &[(&str, String)]) -> String {
    opts.iter()
        .map(|(k, v)| format!("{k}={}", v.replace('\n', "\\n")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The options of an identity written by `options_identity` (None: an earlier release's
/// form, compared whole).
fn options_of(identity: &str) -> Option<std::collections::BTreeMap<String, String>> {
    let mut m = std::collections::BTreeMap::new();
    for line in identity.lines() {
        let (k, v) = line.split_once('=')?;
        if !k.starts_with("--") && k != "filters" {
            return None;
        }
        m.insert(k.to_string(), v.to_string());
    }
    Some(m)
}

/// The job a worker joined is gone: deleted by `jfs-sync job delete` (or deleted and made
/// again under its name) while the worker ran. Every write of the worker is refused with it.
#[derive(Debug)]
pub struct JobGone(pub String);

impl std::fmt::Display for JobGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the job {} was deleted", self.0)
    }
}

impl std::error::Error for JobGone {}

pub fn is_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<JobGone>())
}

/// A fresh incarnation for a job being made: 64 random bits in hex.
pub fn new_incarnation() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// What a Redis refusal means, in words an operator can act on. `password_from` says where
/// the password sent came from (a variable, or none).
pub fn redis_refusal(e: &::redis::RedisError, password_from: &str) -> String {
    let msg = e.to_string();
    if msg.contains("without any password configured") {
        format!("it has no password, but one was sent (from {password_from}): give this URL no password (unset it, or give the URLs that need one their own ?password_env=VAR)")
    } else if msg.contains("NOAUTH") {
        format!("it needs a password and none was given: set {password_from}")
    } else if e.kind() == ::redis::ErrorKind::AuthenticationFailed
        || msg.contains("WRONGPASS")
        || msg.contains("invalid password")
    {
        format!("it refused the password (authentication failed): check {password_from}")
    } else if e.is_connection_refusal() {
        format!("connection refused (is Redis running there?): {msg}")
    } else {
        msg
    }
}

/// One range of the key space (or the deletion step) and who holds it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Unit {
    pub id: i64,
    /// "copy", or "delete" for the deletion step.
    pub kind: String,
    /// First key of the range (inclusive); None: from the start.
    pub lo: Option<String>,
    /// End of the range (exclusive); None: to the end.
    pub hi: Option<String>,
    /// pending, running, done, failed (held: the deletion step before every range is done).
    pub state: String,
    pub owner: Option<String>,
    pub token: i64,
    /// Milliseconds until the lease runs out (negative: expired), while running.
    pub lease_left_ms: Option<i64>,
    pub cursor: Option<String>,
    pub tally: Summary,
    pub attempts: i64,
    /// Times the unit was claimed after its holder's lease had run out.
    pub reassigned: i64,
    pub dst_listed: i64,
    pub error: Option<String>,
}

impl Unit {
    pub fn range(&self) -> KeyRange {
        KeyRange::new(self.lo.clone(), self.hi.clone())
    }
}

/// How a unit ended.
pub struct Finish<'a> {
    pub state: &'a str,
    pub dst_listed: u64,
    pub error: Option<String>,
    /// The deletion step's count (copy units' tallies are in their last save).
    pub tally: Option<&'a Summary>,
}

/// A worker's report, kept in the job for `job status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub worker: String,
    pub host: String,
    pub pid: u32,
    /// Totals of what this worker did (all its units, finished and in progress).
    pub totals: Summary,
    /// Bytes per second over the last report interval.
    pub rate: f64,
    pub units: Vec<i64>,
    /// Saves refused because the lease had passed to another worker.
    pub refused: u64,
    /// Milliseconds since the last report (filled in when read).
    #[serde(default)]
    pub age_ms: i64,
}

/// The job's state and limits, as workers poll them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Control {
    /// running, paused, cancelled, done, failed (finished with errors).
    pub state: String,
    pub bwlimit: Option<String>,
    pub tps: Option<u32>,
    /// Seconds since the job (its round) started (the engine's clock).
    pub age_s: f64,
    /// Seconds from the start to the end of the job (its round), or to now while it runs.
    pub elapsed_s: f64,
}

/// What a save came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The lease passed to another worker: nothing was recorded.
    Refused,
    Kept,
    /// Recorded, and an idle worker asks for the back of this range.
    ShareWanted,
}

/// The job as kept in an engine. Every call that changes a unit names its token and is
/// refused (`Ok(false)`) when the token is stale.
#[async_trait]
pub trait Board: Send + Sync {
    /// Create the job with one unit covering everything (and the held deletion step when
    /// `spec.delete_dst`). Ok(false): it exists already.
    async fn create(&self, spec: &Spec, bwlimit: Option<&str>, tps: Option<u32>) -> Result<bool>;
    async fn spec(&self) -> Result<Option<Spec>>;
    async fn control(&self) -> Result<Control>;
    /// The job's URL for messages (no password).
    fn display(&self) -> String;
    /// Join the job as it is now: from here on every call fails with `JobGone` once the job
    /// is deleted (or deleted and made again), in the same atomic step as the write it would
    /// have made. Returns the job's incarnation; `JobGone` when there is no job.
    async fn bind(&self) -> Result<String>;
    /// Set the job's state, only from state `from` when given (Ok(false): it was not there).
    async fn set_state(&self, state: &str, from: Option<&str>) -> Result<bool>;
    async fn set_limits(&self, bwlimit: Option<&str>, tps: Option<u32>) -> Result<()>;
    async fn report(&self, r: &WorkerReport) -> Result<()>;
    /// A pending unit, or one whose lease ran out, now leased to `worker` under a new token.
    /// Units claimed `max_attempts` times without finishing are marked failed instead.
    async fn claim(&self, worker: &str, lease_ms: u64, max_attempts: u32) -> Result<Option<Unit>>;
    /// Extend the leases still held (id, token); returns the ids renewed.
    async fn renew(&self, worker: &str, held: &[(i64, i64)], lease_ms: u64) -> Result<Vec<i64>>;
    async fn save(
        &self,
        id: i64,
        token: i64,
        cursor: &str,
        tally: &Summary,
        deletes: &[(String, bool)],
    ) -> Result<Saved>;
    async fn finish(&self, id: i64, token: i64, f: &Finish<'_>) -> Result<bool>;
    /// Cut a unit at `cuts` (ascending, inside its range, past its cursor): it keeps the
    /// first piece, the others become pending units, and a request to share it is answered.
    /// No cuts: the holder declines to share it (it is not asked again).
    async fn split(&self, id: i64, token: i64, cuts: &[String]) -> Result<bool>;
    /// Ask the holders of up to `n` running ranges to hand the back of each to the idle
    /// (seen by the holder at its next save); returns how many were asked.
    async fn ask_split(&self, n: usize) -> Result<usize>;
    /// Give a unit back (pending again, its cursor kept).
    async fn release(&self, id: i64, token: i64) -> Result<bool>;
    /// Failed units (and a refused deletion step) become pending again; returns how many.
    async fn retry_failed(&self) -> Result<u64>;
    async fn units(&self) -> Result<Vec<Unit>>;
    async fn workers(&self) -> Result<Vec<WorkerReport>>;
    async fn deletes(&self) -> Result<Vec<(String, bool)>>;
    /// Take `n` from the job's bucket of `what` (bytes or requests) refilled at `rate`/s:
    /// None when granted, else how long to wait before asking again.
    async fn take(&self, what: &str, rate: u64, n: u64) -> Result<Option<Duration>>;
    /// Remove every record of the job.
    async fn remove(&self) -> Result<()>;
    /// Where a `--from-journal` job stands (defaults when there is no such job).
    async fn round(&self) -> Result<Round>;
    /// Create the job, or start its next round once the last one is done, as `plan` says
    /// (its keys stored before any unit can be claimed). Ok(false): the job is running (its
    /// round was planned by another worker). A round that ends done records its target as
    /// the job's journal position (`set_state("done")`).
    async fn new_round(
        &self,
        spec: &Spec,
        bwlimit: Option<&str>,
        tps: Option<u32>,
        plan: &Plan,
    ) -> Result<bool>;
    /// Become the one worker that plans the next round (for `ttl`, after which another may
    /// take over); creates the job's record (done, no units) when there is none.
    async fn claim_planning(&self, spec: &Spec, ttl: Duration) -> Result<bool>;
    /// The keys of a round planned from the journal in `[lo, hi)`, in byte order.
    async fn keys_in(&self, lo: Option<&str>, hi: Option<&str>) -> Result<Vec<String>>;
}

/// A job's location: `redis://HOST:PORT/DB#NAME` or `postgres://USER@HOST:PORT/DB#NAME`
/// (passwords from JFS_META_PASSWORD or a file, as for metadata URLs).
pub async fn open(url: &str) -> Result<Arc<dyn Board>> {
    let (base, name) = url.split_once('#').with_context(|| {
        format!(
            "--job {}: name the job after '#', e.g. redis://10.0.0.5:6379/0#move-datasets",
            meta::redact(url)
        )
    })?;
    if name.is_empty()
        || name.len() > 100
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!(
            "--job {}: the job name after '#' must be 1-100 letters, digits, '-', '_' or '.'",
            meta::redact(url)
        );
    }
    let opts = meta::OpenOptions::default();
    let password_from = password_source(base);
    match base.split_once("://").map(|(s, _)| s) {
        Some("redis") => {
            let (info, prefix) = meta::redis_info(base, &opts).context("--job")?;
            Ok(Arc::new(
                redis::RedisBoard::connect(info, &prefix, name, meta::redact(url), &password_from)
                    .await?,
            ))
        }
        Some("postgres" | "postgresql") => {
            let (cfg, schema) = meta::pg_config(base, &opts).context("--job")?;
            Ok(Arc::new(
                pg::PgBoard::connect(cfg, &schema, name, meta::redact(url), &password_from).await?,
            ))
        }
        _ => bail!(
            "--job {}: a shared job lives in Redis or PostgreSQL: redis://HOST:PORT/DB#NAME or postgres://USER@HOST:PORT/DB#NAME",
            meta::redact(url)
        ),
    }
}

/// Where the password sent with `url` comes from, for messages: the variable its
/// `?password_env=` names, else JFS_META_PASSWORD (or "no password" when that is unset).
pub fn password_source(url: &str) -> String {
    let var = url::Url::parse(url).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "password_env")
            .map(|(_, v)| v.into_owned())
    });
    match var {
        Some(v) => format!("the variable {v} (the URL's ?password_env=)"),
        None if std::env::var_os(meta::PASSWORD_ENV).is_some_and(|v| !v.is_empty()) => format!(
            "{} (one password for every URL without ?password_env=)",
            meta::PASSWORD_ENV
        ),
        None => format!(
            "{} (not set: no password was sent) or ?password_env=VAR in the URL",
            meta::PASSWORD_ENV
        ),
    }
}

/// Where to cut a fresh unit: at each subdirectory of the directory its range starts at, and
/// every `FILES_PER_UNIT` files between them, at most `MAX_CUTS` cuts (evenly thinned).
const FILES_PER_UNIT: usize = 2000;
const MAX_CUTS: usize = 63;
/// Directories deeper than this are not split further.
const MAX_SPLIT_DEPTH: usize = 4;

pub async fn cuts(src: &dyn Endpoint, u: &Unit) -> Result<Vec<String>> {
    let prefix = match &u.lo {
        None => String::new(),
        Some(lo) if lo.ends_with('/') => lo.clone(),
        Some(_) => return Ok(Vec::new()),
    };
    if prefix.matches('/').count() >= MAX_SPLIT_DEPTH {
        return Ok(Vec::new());
    }
    let kids = match src.list_level(&prefix).await {
        Ok(k) => k,
        Err(e) if e.is::<crate::endpoint::TooWide>() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let range = u.range();
    let mut cuts = Vec::new();
    let mut files = 0;
    for (i, k) in kids.iter().enumerate() {
        if !range.contains(&k.key) {
            continue;
        }
        let cut = i > 0 && (k.kind == Kind::Dir || files >= FILES_PER_UNIT);
        if cut && u.lo.as_deref().is_none_or(|lo| k.key.as_str() > lo) {
            cuts.push(k.key.clone());
            files = 0;
        }
        if k.kind != Kind::Dir {
            files += 1;
        }
    }
    if cuts.len() > MAX_CUTS {
        let step = cuts.len().div_ceil(MAX_CUTS);
        cuts = cuts.into_iter().step_by(step).collect();
    }
    Ok(cuts)
}

/// Worker settings beyond the sync's own options.
pub struct WorkerOptions {
    pub worker: String,
    pub lease: Duration,
    pub max_attempts: u32,
    /// Units worked at once (each with its share of the transfer threads).
    pub slots: usize,
    pub threads: usize,
    /// Log the job's progress every this often (stderr, when not a terminal too).
    pub every: Duration,
    pub quiet: bool,
}

/// The end of a worker's run.
#[derive(Debug, Serialize)]
pub struct JobReport {
    /// The job's totals over all units.
    pub summary: Summary,
    /// This worker's share.
    pub worker: Summary,
    pub state: String,
    pub units: usize,
    pub reassigned: i64,
    pub refused: u64,
    #[serde(skip)]
    pub message: Option<String>,
    #[serde(skip)]
    pub code: i32,
}

/// What a worker shares between its units and its lease keeper.
struct Worker {
    board: Arc<dyn Board>,
    o: WorkerOptions,
    /// Units held now: id -> (token, stop signal for the run on it).
    held: Mutex<std::collections::BTreeMap<i64, (i64, watch::Sender<bool>)>>,
    /// Totals of finished units, and the stats of units in progress.
    done: Mutex<Summary>,
    live: Mutex<std::collections::BTreeMap<i64, Arc<Stats>>>,
    refused: AtomicU64,
    /// The last time every held lease was renewed.
    renewed: Mutex<Instant>,
    control: Mutex<Control>,
    limits: Arc<crate::limits::Limits>,
    /// This round works on the keys its plan stored (read from the journal), not listings.
    keys_mode: bool,
    /// The job was deleted while this worker ran: it stops, and writes nothing more (every
    /// write is refused by the engine anyway).
    gone: AtomicBool,
    started: Instant,
}

impl Worker {
    /// Note an error of a call to the job: a deleted job stops every unit at once.
    fn note(&self, e: &anyhow::Error) {
        if is_gone(e) && !self.gone.swap(true, Ordering::SeqCst) {
            self.stop_all();
        }
    }

    fn totals(&self) -> Summary {
        let mut t = self.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for s in self.live.lock().unwrap_or_else(|p| p.into_inner()).values() {
            t.add(&s.summary(0.0));
        }
        t
    }

    fn stop_all(&self) {
        for (_, (_, tx)) in self.held.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = tx.send(true);
        }
    }

    fn refused(&self, what: &str, id: i64, token: i64) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        eprintln!("jfs-sync: unit {id}: {what} refused: the lease passed to another worker (token {token} is stale); that worker resumes the range");
    }
}

/// The resume point of a held unit, saved to the job under its token, and the back of its
/// range handed to an idle worker when one asks.
struct UnitProgress {
    me: std::sync::Weak<UnitProgress>,
    w: Arc<Worker>,
    id: i64,
    token: i64,
    start: (Option<String>, Summary),
    src: Arc<dyn Endpoint>,
    /// The range as recorded in the job (its upper end lowered by each confirmed cut).
    range: Mutex<KeyRange>,
    end: Arc<MovableEnd>,
    /// Held while a cut is made; holds a cut applied here but not yet confirmed by the job.
    cutting: tokio::sync::Mutex<Option<String>>,
}

impl UnitProgress {
    /// An idle worker asked for a share: cut the rest of the range where a listing level
    /// along the last key worked on has entries left, and record the cut in the job. The
    /// run here stops at the cut before the job hears of it, so no key is worked twice.
    async fn share(self: Arc<Self>) {
        let Ok(mut pending) = self.cutting.try_lock() else {
            return; // a cut is being made
        };
        if pending.is_some() {
            return; // the last one is not confirmed yet: the end of the run settles it
        }
        let Some(last) = self.end.last() else { return };
        let range = self.range.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // A round of journal keys is cut into small units up front; they are not shared.
        let found = if self.w.keys_mode {
            Ok(None)
        } else {
            share_cut(&*self.src, &range, &last).await
        };
        let cut = match found {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(unit = self.id, error = %format!("{e:#}"), "looking for where to share a range");
                return;
            }
        };
        let Some(cut) = cut else {
            // Nothing left worth handing over: say so, so that nobody asks again.
            if let Ok(false) = self.w.board.split(self.id, self.token, &[]).await {
                self.w.refused("declining to share", self.id, self.token);
            }
            return;
        };
        if !self.end.cut(&cut) {
            return; // the run went past it meanwhile: the next save tries again
        }
        *pending = Some(cut);
        self.confirm_cut(&mut pending).await;
    }

    /// Record the cut held in `pending` in the job: Some(true) once recorded (or when there
    /// is none), Some(false) when the lease passed to another worker, None when unanswered.
    /// Cutting again at the same key is harmless (the second piece would be empty), so an
    /// unanswered call is simply repeated.
    async fn confirm_cut(&self, pending: &mut Option<String>) -> Option<bool> {
        let Some(cut) = pending.clone() else {
            return Some(true);
        };
        match self
            .w
            .board
            .split(self.id, self.token, std::slice::from_ref(&cut))
            .await
        {
            Ok(true) => {
                tracing::info!(unit = self.id, at = %cut, "handed the back of the range to an idle worker");
                eprintln!(
                    "jfs-sync: unit {}: handed the keys from {cut} on to an idle worker",
                    self.id
                );
                self.range.lock().unwrap_or_else(|p| p.into_inner()).hi = Some(cut);
                *pending = None;
                Some(true)
            }
            Ok(false) => {
                self.w.refused("sharing", self.id, self.token);
                Some(false)
            }
            Err(e) if is_gone(&e) => {
                self.w.note(&e);
                Some(false)
            }
            Err(e) => {
                tracing::warn!(unit = self.id, error = %format!("{e:#}"), "recording a cut of the range");
                None
            }
        }
    }
}

/// Where to cut what is left of `range` after `last` (the last key worked on): at the middle
/// of the entries left at the shallowest directory level along `last` that has at least
/// two left (or one directory), so the holder keeps the front and the subtree it is in.
async fn share_cut(src: &dyn Endpoint, range: &KeyRange, last: &str) -> Result<Option<String>> {
    let mut levels = vec![String::new()];
    levels.extend(last.match_indices('/').map(|(i, _)| last[..=i].to_string()));
    for prefix in levels {
        if !prefix.is_empty() && range.skips_tree(&prefix) {
            continue;
        }
        let kids = match src.list_level(&prefix).await {
            Ok(k) => k,
            Err(e) if e.is::<crate::endpoint::TooWide>() => continue,
            Err(e) => return Err(e),
        };
        let left: Vec<&Entry> = kids
            .iter()
            .filter(|k| k.key.as_str() > last && !range.past(&k.key))
            .filter(|k| {
                if k.kind == Kind::Dir {
                    !range.skips_tree(&k.key)
                } else {
                    range.contains(&k.key)
                }
            })
            .collect();
        match left.len() {
            0 => {}
            1 if left[0].kind == Kind::Dir => return Ok(Some(left[0].key.clone())),
            1 => {}
            n => return Ok(Some(left[n / 2].key.clone())),
        }
    }
    Ok(None)
}

#[async_trait]
impl Shared for UnitProgress {
    fn start(&self) -> (Option<String>, Summary) {
        self.start.clone()
    }
    async fn save(
        &self,
        cursor: &str,
        tally: &Summary,
        deletes: Vec<(String, bool)>,
    ) -> Result<()> {
        let saved = self
            .w
            .board
            .save(self.id, self.token, cursor, tally, &deletes)
            .await;
        if let Err(e) = &saved {
            self.w.note(e);
        }
        match saved? {
            Saved::Kept => Ok(()),
            Saved::ShareWanted => {
                if let Some(me) = self.me.upgrade() {
                    tokio::spawn(me.share());
                }
                Ok(())
            }
            Saved::Refused => {
                self.w.refused("saving progress", self.id, self.token);
                bail!("unit {}: the lease passed to another worker", self.id)
            }
        }
    }

    fn end(&self) -> Option<Arc<MovableEnd>> {
        Some(self.end.clone())
    }
}

/// Budget shared through the job: the limits draw from the engine's bucket.
struct JobBudget(std::sync::Weak<Worker>);

#[async_trait]
impl crate::limits::SharedBudget for JobBudget {
    async fn take(&self, what: &'static str, rate: u64, n: u64) -> Result<Option<Duration>> {
        let Some(w) = self.0.upgrade() else {
            return Ok(None);
        };
        if w.gone.load(Ordering::SeqCst) {
            return Ok(None); // the copies in flight are stopping: nothing more to pace
        }
        let r = w.board.take(what, rate, n).await;
        if let Err(e) = &r {
            w.note(e);
        }
        r
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

pub fn default_worker_name() -> String {
    format!("{}-{}", host_name(), std::process::id())
}

fn apply_limits(limits: &crate::limits::Limits, c: &Control) {
    let bw = c
        .bwlimit
        .as_deref()
        .and_then(|b| crate::limits::BwSchedule::parse(b).ok());
    limits.set(bw, c.tps);
}

/// `--from-journal`: create the job, or start its next round once the last one is done,
/// from what the source volume's journal says changed since the job's position (a full
/// listing the first time, or when the journal no longer reaches back). The journal is read
/// by the worker that plans; the copying is shared.
pub async fn plan_round(
    board: &dyn Board,
    spec: &Spec,
    src: &dyn Endpoint,
    dst: &dyn Endpoint,
    bwlimit: Option<&str>,
    tps: Option<u32>,
) -> Result<bool> {
    // One worker reads the journal; the others wait for its plan (or take over when it
    // does not come within the planning time).
    let mut waiting = false;
    loop {
        if let Some(have) = board.spec().await? {
            have.check_same_work(spec)?;
            if board.control().await?.state != "done" {
                return Ok(false); // a round is under way: join it
            }
        }
        if board.claim_planning(spec, PLANNING_TIME).await? {
            break;
        }
        if !waiting {
            eprintln!("jfs-sync: another worker is planning the next round from the journal: waiting for its plan");
            waiting = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let since = board.round().await?.journal_seq;
    let (keys, target) = crate::journal::changes(src, dst, since).await?;
    let plan = Plan { keys, target };
    let started = board.new_round(spec, bwlimit, tps, &plan).await?;
    if started {
        eprintln!(
            "jfs-sync: planned a round up to journal entry {target}: {}; other workers join with the same command",
            match &plan.keys {
                Some(k) => format!("{} changed keys in {} units", k.len(), plan.cuts().len() + 1),
                None => "a full listing".to_string(),
            }
        );
    }
    Ok(started)
}

/// Join (or create) the job and work on it until no unit is left, the job is cancelled, or
/// `stop` (SIGTERM) turns true. The sync options are the same as a single-host run's; each
/// unit runs with its range and its progress kept in the job.
#[allow(clippy::too_many_arguments)]
pub async fn work(
    board: Arc<dyn Board>,
    spec: Spec,
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    base: Options,
    local: Option<Arc<State>>,
    o: WorkerOptions,
    metrics: Option<Arc<Stats>>,
    mut stop: watch::Receiver<bool>,
    bwlimit: Option<&str>,
) -> Result<JobReport> {
    let t0 = Instant::now();
    let tps = base.limits.current().1;
    if spec.from_journal {
        plan_round(&*board, &spec, &*src, &*dst, bwlimit, tps).await?;
    } else if board.create(&spec, bwlimit, tps).await? {
        eprintln!("jfs-sync: created the job; other workers join with the same command");
    }
    let keys_mode = spec.from_journal && board.round().await?.keys;
    board
        .bind()
        .await
        .context("joining the job (removed just after it was created?)")?;
    let have = board
        .spec()
        .await?
        .context("the job vanished just after it was created (removed meanwhile?)")?;
    have.check_same_work(&spec)?;
    let mut c = board.control().await?;
    match c.state.as_str() {
        "cancelled" => {
            bail!("the job was cancelled: remove it with `jfs-sync job delete URL` to start over")
        }
        "failed" => {
            let n = board.retry_failed().await?;
            eprintln!("jfs-sync: the job had finished with errors: {n} unit(s) pending again");
            c = board.control().await?;
        }
        _ => {}
    }
    let limits = base.limits.clone();
    apply_limits(&limits, &c);
    let w = Arc::new(Worker {
        board: board.clone(),
        o,
        held: Default::default(),
        done: Default::default(),
        live: Default::default(),
        refused: AtomicU64::new(0),
        renewed: Mutex::new(Instant::now()),
        control: Mutex::new(c),
        limits: limits.clone(),
        keys_mode,
        gone: AtomicBool::new(false),
        started: t0,
    });
    limits.share(Some(Arc::new(JobBudget(Arc::downgrade(&w)))));
    let base = Arc::new(base);
    let keeper = tokio::spawn(keep_leases(w.clone(), metrics));
    let stopping = Arc::new(AtomicBool::new(false));
    // SIGTERM: stop every unit (each saves its cursor and is given back).
    {
        let (w, stopping, mut stop) = (w.clone(), stopping.clone(), stop.clone());
        tokio::spawn(async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    return;
                }
            }
            stopping.store(true, Ordering::SeqCst);
            w.stop_all();
        });
    }
    let mut slots = tokio::task::JoinSet::new();
    let mut idle_logged = false;
    let mut last_ask = Instant::now() - Duration::from_secs(1);
    // Claims that keep failing for this long end the worker (a broken database, not a
    // passing outage).
    let mut failing_since: Option<Instant> = None;
    let result: Result<String> = loop {
        if w.gone.load(Ordering::SeqCst) {
            w.stop_all();
            break Ok("deleted".into());
        }
        if stopping.load(Ordering::SeqCst) {
            break Ok("interrupted".into());
        }
        let state = w
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .clone();
        match state.as_str() {
            "cancelled" => {
                w.stop_all();
                break Ok("cancelled".into());
            }
            "paused" => {
                w.stop_all();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            "done" | "failed" if slots.is_empty() => break Ok(state),
            _ => {}
        }
        while slots.try_join_next().is_some() {}
        if slots.len() >= w.o.slots.max(1) {
            tokio::select! {
                _ = slots.join_next() => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let claimed = match board
            .claim(&w.o.worker, w.o.lease.as_millis() as u64, w.o.max_attempts)
            .await
        {
            Ok(u) => {
                failing_since = None;
                u
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                continue;
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(120) {
                    w.stop_all();
                    while slots.join_next().await.is_some() {}
                    break Err(e.context("claiming units failed for 2 minutes"));
                }
                tracing::warn!(error = %format!("{e:#}"), "claiming a unit");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(u) = claimed else {
            // Nothing to claim: others hold what is left, or the job is over. Ask the
            // holders of running ranges to hand over their backs (each answers at its next
            // save), so that the end of a job is not left to a few busy workers.
            if last_ask.elapsed() >= Duration::from_secs(1) {
                last_ask = Instant::now();
                let free = w.o.slots.max(1).saturating_sub(slots.len());
                if let Err(e) = board.ask_split(free).await {
                    tracing::warn!(error = %format!("{e:#}"), "asking for a share of a range");
                }
            }
            if slots.is_empty() {
                let units = match board.units().await {
                    Ok(u) => u,
                    Err(e) => {
                        w.note(&e);
                        break Err(e);
                    }
                };
                let open = units
                    .iter()
                    .filter(|u| matches!(u.state.as_str(), "pending" | "running"))
                    .count();
                if open == 0 {
                    let failed = units.iter().any(|u| u.state == "failed");
                    let end = if failed { "failed" } else { "done" };
                    // Only a running job ends here: a job paused or cancelled meanwhile stays
                    // so, and one deleted meanwhile is not written back (`JobGone`).
                    match board.set_state(end, Some("running")).await {
                        Ok(true) => break Ok(end.into()),
                        Ok(false) => {
                            let now = board.control().await.map(|c| c.state);
                            if let Ok(st) = &now {
                                w.control.lock().unwrap_or_else(|p| p.into_inner()).state =
                                    st.clone();
                            }
                            continue;
                        }
                        Err(e) => {
                            w.note(&e);
                            if is_gone(&e) {
                                continue;
                            }
                            break Err(e);
                        }
                    }
                }
                if !idle_logged {
                    tracing::info!(open, "waiting: the units left are held by other workers");
                    idle_logged = true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = slots.join_next(), if !slots.is_empty() => {}
                _ = stop.changed() => {}
            }
            continue;
        };
        idle_logged = false;
        let (tx, rx) = watch::channel(false);
        w.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(u.id, (u.token, tx));
        let (w2, src, dst, base, local) = (
            w.clone(),
            src.clone(),
            dst.clone(),
            base.clone(),
            local.clone(),
        );
        slots.spawn(async move {
            let id = u.id;
            if let Err(e) = run_unit(&w2, u, src, dst, &base, local, rx).await {
                eprintln!("jfs-sync: unit {id}: {e:#}");
            }
            w2.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    };
    while slots.join_next().await.is_some() {}
    keeper.abort();
    limits.share(None);
    let seconds = |t: f64| (t * 1000.0).round() / 1000.0;
    let mut mine = w.totals();
    mine.seconds = seconds(t0.elapsed().as_secs_f64());
    let state = match result {
        Ok(s) => s,
        Err(e) if is_gone(&e) || w.gone.load(Ordering::SeqCst) => "deleted".into(),
        Err(e) => return Err(e),
    };
    if state == "deleted" || w.gone.load(Ordering::SeqCst) {
        return Ok(JobReport {
            summary: mine.clone(),
            worker: mine,
            state: "deleted".into(),
            units: 0,
            reassigned: 0,
            refused: w.refused.load(Ordering::Relaxed),
            message: Some(format!(
                "the job {} was deleted while this worker ran (`jfs-sync job delete`): this worker stopped and wrote nothing more to it; what it copied stays at the destination, and a new job (or a plain sync) finds it there",
                board.display()
            )),
            code: 2,
        });
    }
    let units = board.units().await?;
    let mut summary = Summary::default();
    for u in &units {
        summary.add(&u.tally);
        if u.state == "failed" && u.kind == "copy" {
            summary.failed += 1;
        }
    }
    // The job's own duration (from its start, or its round's, to its end), not this
    // worker's: workers join and leave at any time.
    summary.seconds = match board.control().await {
        Ok(c) if c.elapsed_s > 0.0 => seconds(c.elapsed_s),
        _ => mine.seconds,
    };
    let reassigned = units.iter().map(|u| u.reassigned).sum();
    let errors: Vec<String> = units
        .iter()
        .filter_map(|u| {
            u.error
                .as_ref()
                .map(|e| format!("unit {} ({}): {e}", u.id, describe(u)))
        })
        .collect();
    let (code, message) = match state.as_str() {
        "done" => (0, None),
        "failed" => (
            1,
            Some(format!(
                "the job finished with errors (nothing was deleted); run the same command again to retry:\n  {}",
                errors.join("\n  ")
            )),
        ),
        "cancelled" => (2, Some("the job was cancelled".to_string())),
        _ => (
            2,
            Some("interrupted: this worker's units were given back; run the same command again to rejoin".to_string()),
        ),
    };
    Ok(JobReport {
        summary,
        worker: mine,
        state,
        units: units.len(),
        reassigned,
        refused: w.refused.load(Ordering::Relaxed),
        message,
        code,
    })
}

fn describe(u: &Unit) -> String {
    if u.kind == "delete" {
        return "the deletion step".into();
    }
    format!(
        "[{}, {})",
        u.lo.as_deref().unwrap_or("start"),
        u.hi.as_deref().unwrap_or("end")
    )
}

/// Renew the held leases at a third of their length, report this worker, follow the job's
/// state and limits. A worker that could not renew for most of a lease stops its units
/// itself: by then another worker may hold them.
async fn keep_leases(w: Arc<Worker>, metrics: Option<Arc<Stats>>) {
    let every = (w.o.lease / 3).max(Duration::from_millis(100));
    let mut last_bytes = 0u64;
    let mut last_t = Instant::now();
    let mut last_log = Instant::now();
    let host = host_name();
    loop {
        tokio::time::sleep(every).await;
        if w.gone.load(Ordering::SeqCst) {
            return; // nothing more is written to a deleted job
        }
        let held: Vec<(i64, i64)> = w
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, (t, _))| (*id, *t))
            .collect();
        let lease_ms = w.o.lease.as_millis() as u64;
        match w.board.renew(&w.o.worker, &held, lease_ms).await {
            Ok(kept) => {
                *w.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                let h = w.held.lock().unwrap_or_else(|p| p.into_inner());
                for (id, (t, tx)) in h.iter() {
                    if !kept.contains(id) && held.contains(&(*id, *t)) {
                        eprintln!("jfs-sync: unit {id}: the lease was lost (another worker holds it now): stopping work on it");
                        let _ = tx.send(true);
                    }
                }
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                return;
            }
            Err(e) => {
                let since = w
                    .renewed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .elapsed();
                tracing::warn!(error = %format!("{e:#}"), "renewing leases");
                if since > w.o.lease * 2 / 3 && !held.is_empty() {
                    eprintln!(
                        "jfs-sync: no contact with the job for {:.1}s (lease {:.0}s): stopping work on the units held, another worker may take them over",
                        since.as_secs_f64(),
                        w.o.lease.as_secs_f64()
                    );
                    w.stop_all();
                }
                continue;
            }
        }
        let mut totals = w.totals();
        totals.seconds = (w.started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let dt = last_t.elapsed().as_secs_f64().max(1e-3);
        let rate = totals.bytes.saturating_sub(last_bytes) as f64 / dt;
        (last_bytes, last_t) = (totals.bytes, Instant::now());
        if let Some(m) = &metrics {
            m.set_from(&totals);
        }
        let report = WorkerReport {
            worker: w.o.worker.clone(),
            host: host.clone(),
            pid: std::process::id(),
            totals: totals.clone(),
            rate,
            units: held.iter().map(|h| h.0).collect(),
            refused: w.refused.load(Ordering::Relaxed),
            age_ms: 0,
        };
        if let Err(e) = w.board.report(&report).await {
            w.note(&e);
            tracing::warn!(error = %format!("{e:#}"), "reporting to the job");
        }
        match w.board.control().await {
            Ok(c) => {
                let mut cur = w.control.lock().unwrap_or_else(|p| p.into_inner());
                if (cur.bwlimit.as_ref(), cur.tps) != (c.bwlimit.as_ref(), c.tps) {
                    eprintln!(
                        "jfs-sync: the job's limits changed: bwlimit {}, tps {}",
                        c.bwlimit.as_deref().unwrap_or("off"),
                        c.tps.map_or("off".to_string(), |t| t.to_string())
                    );
                    apply_limits(&w.limits, &c);
                }
                *cur = c;
            }
            Err(e) => {
                w.note(&e);
                tracing::warn!(error = %format!("{e:#}"), "reading the job's state")
            }
        }
        if !w.o.quiet && last_log.elapsed() >= w.o.every {
            last_log = Instant::now();
            eprintln!(
                "jfs-sync: worker {}: {} units held, {} copied, {} bytes, {:.1} MiB/s",
                w.o.worker,
                held.len(),
                totals.copied + totals.updated,
                totals.bytes,
                rate / (1 << 20) as f64
            );
        }
    }
}

/// Work one claimed unit: split it if it is fresh and starts at a directory, run the sync
/// over its range, and record how it ended (under its token).
async fn run_unit(
    w: &Arc<Worker>,
    mut u: Unit,
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    base: &Options,
    local: Option<Arc<State>>,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    if u.kind == "delete" {
        return delete_step(w, &u, dst, base).await;
    }
    let keys = if w.keys_mode {
        Some(w.board.keys_in(u.lo.as_deref(), u.hi.as_deref()).await?)
    } else {
        None
    };
    if keys.is_none() && u.cursor.is_none() && u.tally == Summary::default() {
        let cuts = cuts(&*src, &u)
            .await
            .context("listing a level to split the range")?;
        if !cuts.is_empty() {
            if w.board.split(u.id, u.token, &cuts).await? {
                tracing::info!(unit = u.id, pieces = cuts.len() + 1, "split the range");
                u.hi = Some(cuts[0].clone());
            } else {
                w.refused("splitting", u.id, u.token);
                return Ok(());
            }
        }
    }
    let stats = Arc::new(Stats::default());
    w.live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(u.id, stats.clone());
    let end = Arc::new(MovableEnd::default());
    let progress = Arc::new_cyclic(|me| UnitProgress {
        me: me.clone(),
        w: w.clone(),
        id: u.id,
        token: u.token,
        start: (u.cursor.clone(), u.tally.clone()),
        src: src.clone(),
        range: Mutex::new(u.range()),
        end,
        cutting: tokio::sync::Mutex::new(None),
    });
    let opts = Options {
        threads: w.o.threads.div_ceil(w.o.slots.max(1)).max(1),
        list_threads: base.list_threads,
        list_depth: base.list_depth,
        compare: base.compare.clone(),
        filter: base.filter.clone(),
        delete_dst: base.delete_dst,
        delete_src: base.delete_src,
        max_delete: None,
        max_failure: base.max_failure,
        dry_run: false,
        dirs: base.dirs,
        perms: base.perms,
        links: base.links,
        check_new: base.check_new,
        retries: base.retries,
        keys,
        keys_from_user: false,
        limits: base.limits.clone(),
        range: u.range(),
    };
    let stopped = stop.clone();
    let r = run::sync_range(
        src,
        dst,
        opts,
        local,
        Some(progress.clone()),
        stats.clone(),
        stop,
    )
    .await;
    // Stopped from outside (SIGTERM, pause, cancel, a lease lost or out of reach): whatever
    // the run says, the unit is given back, never marked failed.
    let given_back = *stopped.borrow();
    let ran = stats.summary(0.0);
    w.live
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&u.id);
    w.done.lock().unwrap_or_else(|p| p.into_inner()).add(&ran);
    let dst_listed = stats.dst_listed.load(Ordering::Relaxed);
    let (what, fin) = match &r {
        _ if given_back => ("giving back", None),
        Ok(rep) if rep.interrupted => ("giving back", None),
        Ok(rep) if rep.fatal.is_none() && rep.summary.failed == 0 => (
            "finishing",
            Some(Finish {
                state: "done",
                dst_listed,
                error: None,
                tally: None,
            }),
        ),
        Ok(rep) => (
            "finishing",
            Some(Finish {
                state: "failed",
                dst_listed,
                error: Some(
                    rep.fatal
                        .clone()
                        .unwrap_or_else(|| format!("{} object(s) failed", rep.summary.failed)),
                ),
                tally: None,
            }),
        ),
        Err(e) if e.to_string().contains("the lease passed to another worker") => return Ok(()),
        _ if w.gone.load(Ordering::SeqCst) => return Ok(()),
        Err(e) if is_gone(e) => {
            w.note(e);
            return Ok(());
        }
        Err(e) => (
            "finishing",
            Some(Finish {
                state: "failed",
                dst_listed,
                error: Some(format!("{e:#}")),
                tally: None,
            }),
        ),
    };
    // Record the end; the job's engine may be out of reach for a while (a cut-off worker
    // tries until it hears back, then learns whether its token still holds).
    let deadline = Instant::now() + w.o.lease * 4;
    // A cut made here must be in the job before the unit ends: the run stopped at it, and
    // the keys past it belong to the piece the job has not heard of yet.
    let mut pending = progress.cutting.lock().await;
    loop {
        if w.gone.load(Ordering::SeqCst) {
            return Ok(());
        }
        match progress.confirm_cut(&mut pending).await {
            Some(true) => break,
            Some(false) => return Ok(()), // the unit is another worker's now
            None if Instant::now() >= deadline => bail!(
                "unit {}: a cut of the range could not be recorded (its lease will run out and another worker resumes it from its last save)",
                u.id
            ),
            None => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    // `pending` stays held: no cut starts once the unit is ending.
    loop {
        let res = match &fin {
            Some(f) => w.board.finish(u.id, u.token, f).await,
            None => w.board.release(u.id, u.token).await,
        };
        match res {
            Ok(true) => return Ok(()),
            Ok(false) => {
                w.refused(what, u.id, u.token);
                return Ok(());
            }
            Err(e) if is_gone(&e) => {
                w.note(&e);
                return Ok(()); // the job was deleted: nothing to record it in
            }
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(unit = u.id, error = %format!("{e:#}"), "recording the end of a unit; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.context("recording the end of the unit (its lease will run out and another worker resumes it)")),
        }
    }
}

/// The deletion step: once, after every range finished without errors, with the same caps
/// as a single-host run.
async fn delete_step(
    w: &Arc<Worker>,
    u: &Unit,
    dst: Arc<dyn Endpoint>,
    base: &Options,
) -> Result<()> {
    let deletes = w.board.deletes().await?;
    let units = w.board.units().await?;
    let listed: u64 = units
        .iter()
        .map(|u| u.dst_listed.max(0) as u64)
        .sum::<u64>()
        .max(deletes.len() as u64);
    if let Some(why) = run::refused(base.max_delete, deletes.len() as u64, listed) {
        let msg = format!("refusing to delete: {why}; nothing was deleted");
        eprintln!("jfs-sync: {msg}");
        let f = Finish {
            state: "failed",
            dst_listed: 0,
            error: Some(msg),
            tally: None,
        };
        if !w.board.finish(u.id, u.token, &f).await? {
            w.refused("finishing", u.id, u.token);
        }
        return Ok(());
    }
    let mut ordered = deletes;
    ordered.sort();
    ordered.reverse(); // deepest first: `a/x` before `a/`
    let mut tally = Summary::default();
    let mut files = Vec::new();
    for (key, is_dir) in ordered {
        let kind = if is_dir { Kind::Dir } else { Kind::File };
        match crate::copy::with_retries(base.retries, &key, || dst.delete(&key, kind)).await {
            Ok(()) => {
                tally.deleted += 1;
                if !is_dir {
                    files.push(key);
                }
            }
            Err(e) => {
                tally.failed += 1;
                eprintln!("jfs-sync: failed: deleting {key}: {e:#}");
            }
        }
    }
    if !base.dirs {
        crate::endpoint::prune_emptied(&*dst, &files).await;
    }
    let f = Finish {
        state: if tally.failed == 0 { "done" } else { "failed" },
        dst_listed: 0,
        error: (tally.failed > 0).then(|| format!("{} deletes failed", tally.failed)),
        tally: Some(&tally),
    };
    w.done.lock().unwrap_or_else(|p| p.into_inner()).add(&tally);
    if !w.board.finish(u.id, u.token, &f).await? {
        w.refused("finishing", u.id, u.token);
    }
    Ok(())
}

/// `jfs-sync job status`: the job's progress across workers.
#[derive(Debug, Serialize)]
pub struct Status {
    pub job: String,
    pub state: String,
    pub src: String,
    pub dst: String,
    pub bwlimit: Option<String>,
    pub tps: Option<u32>,
    pub units_done: usize,
    pub units_running: usize,
    pub units_pending: usize,
    pub units_failed: usize,
    pub reassigned: i64,
    /// What the units came to; `seconds` is the job's duration (`elapsed_s`).
    pub totals: Summary,
    /// Bytes per second now, summed over the workers heard from in the last minute (0 once
    /// none is).
    pub rate: f64,
    /// Seconds from the job's start (its round's, with --from-journal) to its end, or to now
    /// while it runs.
    pub elapsed_s: f64,
    /// Bytes per second over `elapsed_s`.
    pub average_rate: f64,
    /// Seconds left at the pace of the units done so far (None before any is done).
    pub eta_s: Option<f64>,
    pub workers: Vec<WorkerReport>,
    pub errors: Vec<String>,
    pub running: Vec<Unit>,
}

pub async fn status(board: &dyn Board, url: &str) -> Result<Status> {
    let spec = board
        .spec()
        .await?
        .with_context(|| format!("no job at {}", meta::redact(url)))?;
    let c = board.control().await?;
    let units = board.units().await?;
    let workers = board.workers().await?;
    let count = |s: &str| units.iter().filter(|u| u.state == s).count();
    let mut totals = Summary::default();
    for u in &units {
        totals.add(&u.tally);
    }
    totals.seconds = (c.elapsed_s * 1000.0).round() / 1000.0;
    let live: Vec<WorkerReport> = workers.into_iter().collect();
    // Folded from +0.0: a sum of no f64 is -0.0, which would print as "-0.0 MiB/s".
    let rate: f64 = live
        .iter()
        .filter(|w| w.age_ms < 60_000 && w.rate.is_finite())
        .fold(0.0, |a, w| a + w.rate.max(0.0));
    let average_rate = if c.elapsed_s > 0.0 {
        totals.bytes as f64 / c.elapsed_s
    } else {
        0.0
    };
    let done = count("done");
    let left = count("pending") + count("running");
    let eta_s = (done > 0 && c.state == "running").then(|| c.age_s / done as f64 * left as f64);
    Ok(Status {
        job: meta::redact(url),
        state: c.state,
        src: spec.src,
        dst: spec.dst,
        bwlimit: c.bwlimit,
        tps: c.tps,
        units_done: done,
        units_running: count("running"),
        units_pending: count("pending") + count("held"),
        units_failed: count("failed"),
        reassigned: units.iter().map(|u| u.reassigned).sum(),
        totals,
        rate,
        elapsed_s: c.elapsed_s,
        average_rate,
        eta_s,
        workers: live,
        errors: units
            .iter()
            .filter_map(|u| {
                u.error
                    .as_ref()
                    .map(|e| format!("unit {} {}: {e}", u.id, describe(u)))
            })
            .collect(),
        running: units.into_iter().filter(|u| u.state == "running").collect(),
    })
}

impl Status {
    pub fn text(&self) -> String {
        let mut s = format!(
            "job {} ({} -> {}): {}\n  units: {} done, {} running, {} pending, {} failed; {} reassigned after a lost lease\n  {}\n  rate {:.1} MiB/s now, {:.1} MiB/s on average over {:.1}s, ETA {}; limits: bwlimit {}, tps {}\n",
            self.job,
            self.src,
            self.dst,
            self.state,
            self.units_done,
            self.units_running,
            self.units_pending,
            self.units_failed,
            self.reassigned,
            self.totals.line(),
            self.rate / (1 << 20) as f64,
            self.average_rate / (1 << 20) as f64,
            self.elapsed_s,
            self.eta_s.map_or("unknown".to_string(), |e| format!("{e:.0}s")),
            self.bwlimit.as_deref().unwrap_or("off"),
            self.tps.map_or("off".to_string(), |t| t.to_string()),
        );
        for w in &self.workers {
            s.push_str(&format!(
                "  worker {} (pid {} on {}): last heard {:.1}s ago, {} units held {:?}, copied {}, {} bytes, {:.1} MiB/s, {} refused saves\n",
                w.worker,
                w.pid,
                w.host,
                w.age_ms as f64 / 1000.0,
                w.units.len(),
                w.units,
                w.totals.copied + w.totals.updated,
                w.totals.bytes,
                w.rate / (1 << 20) as f64,
                w.refused
            ));
        }
        for u in &self.running {
            s.push_str(&format!(
                "  unit {} {} held by {} (lease {:.1}s left), at {}\n",
                u.id,
                describe(u),
                u.owner.as_deref().unwrap_or("?"),
                u.lease_left_ms.unwrap_or(0) as f64 / 1000.0,
                u.cursor.as_deref().unwrap_or("its start")
            ));
        }
        for e in &self.errors {
            s.push_str(&format!("  error: {e}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(identity: &str) -> Spec {
        Spec {
            src: "/a".into(),
            dst: "s3://b/p?endpoint=http://x".into(),
            src_id: Some("directory /a".into()),
            dst_id: None,
            identity: identity.into(),
            delete_dst: false,
            max_delete: None,
            from_journal: false,
            legacy_identity: None,
        }
    }

    #[test]
    fn differences_name_the_option_and_both_values() {
        let job = spec(&options_identity(&[
            ("--checksum", "false".into()),
            ("--dirs", "true".into()),
        ]));
        let mut w = spec(&options_identity(&[
            ("--checksum", "true".into()),
            ("--dirs", "true".into()),
        ]));
        w.dst = "s3://b/p?endpoint=http://y".into(); // another endpoint: the same bucket
        assert_eq!(
            job.differences(&w),
            [r#"--checksum: the job has "false", this worker has "true""#]
        );
        w.identity = job.identity.clone();
        assert!(job.same_work(&w));
        w.src_id = Some("directory /elsewhere/a".into());
        assert_eq!(
            job.differences(&w),
            [
                r#"what SRC /a is: the job has "directory /a", this worker has "directory /elsewhere/a""#
            ]
        );
        // A job the release before made: one string of options, joined when it matches.
        let mut old = spec("[]|None|falsefalse");
        old.src_id = None;
        let mut w = spec(&job.identity);
        assert!(!old.same_work(&w));
        w.legacy_identity = Some("[]|None|falsefalse".into());
        assert!(old.same_work(&w));
    }
}
