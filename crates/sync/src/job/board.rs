//! The job as kept in an engine (`Board`, implemented for Redis in `redis.rs` and for
//! PostgreSQL in `pg.rs`), what defines it (`Spec`: a joining worker must run the same work),
//! its units, and where a job lives (`open`).
//!
//! Invariant: every call that changes a unit names its fencing token and is refused when the
//! token is stale; once a worker has joined (`bind`), every call fails with `JobGone` when the
//! job was deleted (or deleted and made again) meanwhile.

use super::*;
use crate::range::KeyRange;
use crate::stats::Summary;
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

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

impl fs_core::record::Versioned for Spec {
    const KIND: &'static str = "the sync job's record";
    const VERSION: u32 = 1;
}

impl fs_core::record::Versioned for WorkerReport {
    const KIND: &'static str = "a sync job worker's report";
    const VERSION: u32 = 1;
}

/// A persisted record (`Spec`, `WorkerReport`) as the JSON text the boards store.
pub(crate) fn record_json<T: fs_core::record::Versioned>(r: &T) -> String {
    String::from_utf8(fs_core::record::encode(r)).expect("JSON is UTF-8")
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
pub(super) fn options_of(identity: &str) -> Option<std::collections::BTreeMap<String, String>> {
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
    } else if msg.contains("NOAUTH")
        || (msg.contains("refused to switch database") && !msg.contains("NOPERM"))
    {
        // A Redis that wants a password refuses SELECT (a database other than 0) before it
        // refuses anything else.
        if msg.contains("out of range") {
            return format!("it has no such database (the number after the port is past its `databases` setting): use one it has: {msg}");
        }
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

/// A unit's progress, saved under its lease: where it got to, its tally, the extraneous
/// destination keys it found (deleted once the job's copies are done).
pub struct Progress<'a> {
    pub cursor: &'a str,
    pub tally: &'a Summary,
    pub deletes: &'a [(String, bool)],
}

/// A round to plan: the job's spec and limits, and what the round covers.
pub struct NewRound<'a> {
    pub spec: &'a Spec,
    pub bwlimit: Option<&'a str>,
    pub tps: Option<u32>,
    pub plan: &'a Plan,
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
    async fn save(&self, id: i64, token: i64, p: &Progress<'_>) -> Result<Saved>;
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
    async fn new_round(&self, r: &NewRound<'_>) -> Result<bool>;
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

#[cfg(test)]
mod tests {
    /// A job's Redis on a database other than 0 that wants a password refuses the SELECT
    /// first: said as the missing password, not "refused to switch database".
    #[test]
    fn a_refused_select_says_a_password_is_needed() {
        let e = ::redis::RedisError::from((
            ::redis::ErrorKind::ResponseError,
            "Redis server refused to switch database",
        ));
        let m = super::redis_refusal(&e, "JFS_META_PASSWORD");
        assert!(
            m.contains("needs a password") && m.contains("JFS_META_PASSWORD"),
            "{m}"
        );
    }
}
