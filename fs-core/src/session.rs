//! Client sessions: every mount registers one in the volume's aux records (beside the
//! metadata, never journaled or replicated) and refreshes its heartbeat while it runs; a clean
//! unmount removes it. A session is *dead* when its heartbeat is older than the timeout, or at
//! once when it ran on this host and its process is gone (same pid and start time).
//!
//! A writing mount at a mirror site registers its session in the mirror's metadata; the
//! mirror agent relays it to the primary, which keeps it (`relayed_by`) while the mirror
//! sends it, so its kept inodes are not reaped there.
//!
//! Sessions are what keeps the inodes a mount unlinked while open (`O<ino>` names the session):
//! `gc` and every read-write mount at start free the kept inodes of dead sessions and drop
//! their records. Barriers of later features (storage generations, promotions) wait for every
//! live session to acknowledge: `acks` holds what each acknowledged.

use crate::engine::Engine;
use crate::error::Result;
use crate::types::now_ns;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub const PREFIX: &str = "session.";
/// How often a mount refreshes its session.
pub const HEARTBEAT: Duration = Duration::from_secs(12);
/// A session whose heartbeat is older than this is dead (`jfs gc --session-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Random, unique: `[0-9a-f]{16}`.
    pub id: String,
    pub host: String,
    pub pid: u32,
    /// The process's start time (clock ticks since boot, from /proc), so that a reused pid is
    /// not taken for the mount that died.
    #[serde(default)]
    pub pid_start: u64,
    pub mountpoint: String,
    /// Version of the mounting binary.
    pub version: String,
    pub read_only: bool,
    pub start_ns: i64,
    pub beat_ns: i64,
    /// What the session acknowledged (e.g. a storage generation), by barrier name.
    #[serde(default)]
    pub acks: BTreeMap<String, u64>,
    /// Set while this writer's puts to a cutover's secondary store fail (its blocks go to the
    /// repair list): shown by `jfs cutover status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<Degraded>,
    /// At the primary: the mirror whose agent relays this session of a writing mount at its
    /// site (so that the inodes it keeps open after an unlink are not reaped here). Such a
    /// session is no writing process of this site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relayed_by: Option<String>,
    /// A mount at a mirror site that writes through its site's agent: it writes, but it is
    /// never this metadata's writing process (nothing may be routed through it as if it were).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forwarded: bool,
}

/// `version` holds the mounting binary's version; the record's format version is kept
/// under `record_version` (absent in records of the first format: 1).
impl crate::record::Versioned for Session {
    const KIND: &'static str = "a session record";
    const VERSION: u32 = 1;
    const VERSION_KEY: &'static str = "record_version";
}

/// A writer whose puts to the cutover's other store fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degraded {
    /// The store that refuses, and its role in the cutover ("a" or "b").
    pub store: String,
    pub role: String,
    /// The latest error.
    pub error: String,
    /// The first failure of this run of failures, and how many blocks failed since.
    pub since_ns: i64,
    pub failures: u64,
}

/// Start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn process_start(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Session {
    /// A new session of this process.
    pub fn new(mountpoint: &str, read_only: bool) -> Session {
        let now = now_ns();
        let pid = std::process::id();
        Session {
            id: format!("{:016x}", rand::random::<u64>()),
            host: crate::retry::hostname(),
            pid,
            pid_start: process_start(pid).unwrap_or(0),
            mountpoint: mountpoint.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            read_only,
            start_ns: now,
            beat_ns: now,
            acks: BTreeMap::new(),
            degraded: None,
            relayed_by: None,
            forwarded: false,
        }
    }

    /// Whether this is a writing process of this metadata on this host, through which
    /// other commands may commit (never a mount at a mirror site, nor a relayed one).
    pub fn is_local_writer(&self) -> bool {
        !self.read_only
            && !self.forwarded
            && self.relayed_by.is_none()
            && self.host == crate::retry::hostname()
    }

    fn record(&self) -> String {
        format!("{PREFIX}{}", self.id)
    }

    /// Whether `id` has a session id's shape (16 lowercase hex digits).
    pub fn valid_id(id: &str) -> bool {
        id.len() == 16
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    /// Whether this session is alive at `now_ns`, given the heartbeat timeout.
    pub fn is_live(&self, now_ns: i64, timeout: Duration) -> bool {
        // A relayed session's process is at the mirror's host, whatever its name: only its
        // heartbeat (stamped by the primary agent at each report) says whether it lives.
        if self.relayed_by.is_none() && self.host == crate::retry::hostname() && self.pid_start != 0
        {
            return process_start(self.pid) == Some(self.pid_start)
                && now_ns - self.beat_ns < timeout.as_nanos() as i64;
        }
        now_ns - self.beat_ns < timeout.as_nanos() as i64
    }
}

/// Write (register or refresh) a session, with a fresh heartbeat.
pub async fn beat(engine: &dyn Engine, s: &mut Session) -> Result<()> {
    s.beat_ns = now_ns();
    let v = crate::record::encode(&*s);
    engine.aux_put(&s.record(), Some(&v)).await
}

/// Write a session record as it is (the primary agent keeping a mirror's relayed sessions).
pub async fn put(engine: &dyn Engine, s: &Session) -> Result<()> {
    let v = crate::record::encode(s);
    engine.aux_put(&s.record(), Some(&v)).await
}

/// Remove a session's record (clean unmount).
pub async fn remove(engine: &dyn Engine, id: &str) -> Result<()> {
    engine.aux_put(&format!("{PREFIX}{id}"), None).await
}

/// Every session record, live or not, oldest first.
pub async fn list(engine: &dyn Engine) -> Result<Vec<Session>> {
    let mut out = Vec::new();
    for (name, v) in engine.aux_list(PREFIX).await? {
        let s: Session = crate::record::decode_as(&format!("session record {name}"), &v)?;
        out.push(s);
    }
    out.sort_by_key(|s| s.start_ns);
    Ok(out)
}

/// What `Fs::reap_sessions` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reaped {
    /// Dead sessions whose records were removed.
    pub sessions: u64,
    /// Kept inodes of dead sessions that were freed.
    pub inodes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Session records of the first format (no `record_version`, fewer fields) open; the
    /// binary's version under `version` is not taken for the record's format.
    #[test]
    fn the_previous_format_opens_and_a_newer_one_is_refused() {
        let raw = br#"{"id":"00000000000000ab","host":"h","pid":9,"mountpoint":"/mnt","version":"0.1.0","read_only":false,"start_ns":1,"beat_ns":2}"#;
        let s: Session = crate::record::decode(raw).unwrap();
        assert_eq!((s.pid, s.version.as_str(), s.pid_start), (9, "0.1.0", 0));
        assert!(s.acks.is_empty() && s.degraded.is_none());
        let mut v: serde_json::Value = serde_json::from_slice(&crate::record::encode(&s)).unwrap();
        assert_eq!(v["record_version"], 1);
        v["record_version"] = 2.into();
        let e = crate::record::decode_value::<Session>(v).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::UnsupportedVersion);
    }

    #[test]
    fn a_live_process_is_live_and_a_reused_pid_is_not() {
        let mut s = Session::new("/mnt/x", false);
        let now = now_ns();
        assert!(s.pid_start > 0, "this process's start time is readable");
        assert!(s.is_live(now, DEFAULT_TIMEOUT));
        // The same pid with another start time: a pid reused after the mount died.
        s.pid_start += 1;
        assert!(!s.is_live(now, DEFAULT_TIMEOUT));
        // Another host: judged by its heartbeat alone.
        s.host = "elsewhere".into();
        assert!(s.is_live(now, DEFAULT_TIMEOUT));
        assert!(!s.is_live(now + DEFAULT_TIMEOUT.as_nanos() as i64, DEFAULT_TIMEOUT));
    }
}
