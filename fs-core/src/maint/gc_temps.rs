//! Temporary names of unfinished copies (`jfs put` into a volume, `jfs get` onto local disk),
//! and when one is a leftover of a dead writer that a rerun or `gc` removes.
//!
//! A copy lands under `.NAME.jfs-tmp-<sid>-<pid>-<8 hex>` and is renamed into place once
//! complete. `<sid>` is the writing process's session (`session.rs`) when it has one (a
//! `jfs put` that opened the volume itself): such a temp is stale as soon as no live session
//! has that id, wherever it ran. A writer without a session of its own (a put through a live
//! mount, a get onto local disk, and releases before the session was in the name) writes
//! `.NAME.jfs-tmp-<pid>-<8 hex>`: its process is judged on this host only, so where the
//! writer may have run elsewhere (`gc`, and old temps met by a rerun) it is also required
//! not to have been modified for the session timeout.
//!
//! Readers that copy a tree out (`jfs get`, jfs-sync's volume source) never take such a name
//! for a file; other names with `.jfs-tmp` in them are the user's.

use crate::session::{process_start, Session};
use std::time::Duration;

/// The longest file name (bytes) local file systems and volumes take.
const NAME_MAX: usize = 255;
/// What `tmp_name` adds after the prefix: `-<sid 16 hex>-<pid up to 10 digits>-<8 hex>`.
const TMP_SUFFIX_MAX: usize = 1 + 16 + 1 + 10 + 1 + 8;

/// The part of `name`'s temporary names before the writer's ids: `.NAME.jfs-tmp`, or, for a
/// name too long for that to fit with the suffix, its first bytes and a checksum of the whole
/// (`.NAM~1a2b3c4d.jfs-tmp`), so that every legal name has a legal temporary name.
pub fn tmp_prefix(name: &str) -> String {
    let plain = format!(".{name}.jfs-tmp");
    if plain.len() + TMP_SUFFIX_MAX <= NAME_MAX {
        return plain;
    }
    let sum = format!("~{:08x}", crc32c::crc32c(name.as_bytes()));
    let room = NAME_MAX - TMP_SUFFIX_MAX - ".".len() - sum.len() - ".jfs-tmp".len();
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}{sum}.jfs-tmp", &name[..cut])
}

/// A temporary name beside `name` for this process, tied to `session` (this process's own
/// session id) when it has one; never longer than a legal name.
pub fn tmp_name(name: &str, session: Option<&str>) -> String {
    let sid = session
        .filter(|s| Session::valid_id(s))
        .map(|s| format!("-{s}"))
        .unwrap_or_default();
    format!(
        "{}{sid}-{}-{:08x}",
        tmp_prefix(name),
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Who wrote a temporary name: its session (if it had one) and process id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpWriter {
    pub session: Option<String>,
    pub pid: u32,
}

/// The writer of temporary name `name` (`tmp_name`'s form, with or without a session), or
/// None for any other name.
pub fn tmp_writer(name: &str) -> Option<TmpWriter> {
    let (head, hex) = name.rsplit_once('-')?;
    let (head, pid) = head.rsplit_once('-')?;
    if !(name.starts_with('.')
        && hex.len() == 8
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && (1..=10).contains(&pid.len())
        && pid.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    if head.ends_with(".jfs-tmp") {
        return Some(TmpWriter { session: None, pid });
    }
    let (head, sid) = head.rsplit_once('-')?;
    (head.ends_with(".jfs-tmp") && Session::valid_id(sid)).then(|| TmpWriter {
        session: Some(sid.to_string()),
        pid,
    })
}

/// Whether `name` is a temporary name `tmp_name` makes: a put or get that has not finished.
pub fn is_tmp_name(name: &str) -> bool {
    tmp_writer(name).is_some()
}

/// What decides whether a temporary entry's writer is dead.
pub struct TmpJudge {
    sessions: Vec<Session>,
    now_ns: i64,
    timeout: Duration,
    /// Every writer without a session ran on this host (a put through a mount of a RocksDB
    /// volume, met by its own rerun): its process alone decides, whatever the age.
    local_only: bool,
}

impl TmpJudge {
    /// `sessions`: every session record of the volume (live or not).
    pub fn new(sessions: Vec<Session>, now_ns: i64, timeout: Duration, local_only: bool) -> Self {
        TmpJudge {
            sessions,
            now_ns,
            timeout,
            local_only,
        }
    }

    /// Whether the temporary entry `name`, last modified at `mtime_ns`, is a leftover of a
    /// dead writer (false for a name that is no temporary name).
    pub fn is_stale(&self, name: &str, mtime_ns: i64) -> bool {
        let Some(w) = tmp_writer(name) else {
            return false;
        };
        match &w.session {
            Some(sid) => !self
                .sessions
                .iter()
                .any(|s| &s.id == sid && s.is_live(self.now_ns, self.timeout)),
            None => {
                let gone_here = process_start(w.pid).is_none();
                gone_here
                    && (self.local_only
                        || self.now_ns.saturating_sub(mtime_ns) >= self.timeout.as_nanos() as i64)
            }
        }
    }
}

impl crate::fs::Fs {
    /// Remove the temporary entries of `name` in directory `parent` whose writer is dead
    /// (a rerun of a killed `jfs put`, before it copies `name` again): one scan of the names
    /// beginning with `name`'s temporary prefix. Returns how many were removed.
    pub async fn remove_dead_temps_of(
        &self,
        parent: crate::types::Ino,
        name: &str,
        judge: &TmpJudge,
    ) -> crate::error::Result<u64> {
        self.remove_dead_temps_by_prefix(parent, tmp_prefix(name).as_bytes(), judge)
            .await
    }

    /// `remove_dead_temps_of` for a name whose temporary prefix (`tmp_prefix`) is given as
    /// the bytes stored in the directory: a name that is not UTF-8 is carried by its callers
    /// as a key (`sync::names`) whose text is not those bytes, so they give the bytes.
    pub async fn remove_dead_temps_by_prefix(
        &self,
        parent: crate::types::Ino,
        prefix: &[u8],
        judge: &TmpJudge,
    ) -> crate::error::Result<u64> {
        let mut with_dash = prefix.to_vec();
        with_dash.push(b'-');
        let start = crate::keys::dentry(parent, &with_dash);
        let end = crate::keys::prefix_end(&start);
        let mut removed = 0;
        for (k, v) in self.engine().scan(&start, &end, 1000).await? {
            let crate::keys::Key::Dentry(_, n) = crate::keys::parse(&k) else {
                continue;
            };
            let Some((ino, crate::types::FileKind::File)) = crate::keys::decode_dentry(&v) else {
                continue;
            };
            // The writer ids are ASCII at the end; the name before them may be any bytes.
            let shown = String::from_utf8_lossy(n);
            if !is_tmp_name(&shown) {
                continue;
            }
            let a = match self.getattr(ino).await {
                Ok(a) => a,
                Err(e) if e.kind() == crate::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if judge.is_stale(&shown, a.mtime.max(a.ctime)) {
                match self.unlink(parent, n).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == crate::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }
}

/// This process's own session id in `engine`'s records (a writer that opened the volume
/// registered one), to tie its temporary names to it.
pub async fn own_session(engine: &dyn crate::engine::Engine) -> Option<String> {
    let pid = std::process::id();
    let start = process_start(pid);
    let host = crate::retry::hostname();
    crate::session::list(engine)
        .await
        .ok()?
        .into_iter()
        .rev()
        .find(|s| s.pid == pid && s.host == host && Some(s.pid_start) == start && !s.read_only)
        .map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::now_ns;

    #[test]
    fn every_legal_name_has_a_legal_temporary_name() {
        let sid = "0123456789abcdef";
        for len in [1, 200, 218, 219, 225, 226, 240, 254, 255] {
            for unit in ["a", "é", "水"] {
                let name: String = unit.repeat(len / unit.len());
                for s in [None, Some(sid)] {
                    let t = tmp_name(&name, s);
                    assert!(t.len() <= NAME_MAX, "{len} x {unit:?}: {} bytes", t.len());
                    assert!(t.starts_with(&format!("{}-", tmp_prefix(&name))));
                    assert_eq!(tmp_writer(&t).unwrap().session.as_deref(), s, "{t}");
                }
            }
        }
        assert!(tmp_name("model.bin", None).starts_with(".model.bin.jfs-tmp-"));
        assert!(is_tmp_name(&tmp_name("model.bin", None)));
        // The form an earlier release wrote is still one.
        assert_eq!(
            tmp_writer(".a.jfs-tmp-123-0123abcd"),
            Some(TmpWriter {
                session: None,
                pid: 123
            })
        );
        for user in [
            ".report.jfs-tmp-final",
            ".a.jfs-tmp-12-xyz",
            "a.jfs-tmp-12-0123abcd",
            ".a.jfs-tmp--0123abcd",
            ".a.jfs-tmp-12345678901-0123abcd",
            ".a.jfs-tmp-0123456789ABCDEF-12-0123abcd",
            ".a.jfs-tmp-x-0123456789abcdef-12-0123abcd",
        ] {
            assert!(!is_tmp_name(user), "{user}");
        }
        // Two long names that share their first bytes have different prefixes.
        let (a, b) = ("x".repeat(250) + "a", "x".repeat(250) + "b");
        assert_ne!(tmp_prefix(&a), tmp_prefix(&b));
    }

    #[test]
    fn a_temp_is_stale_once_its_writer_is_dead() {
        let now = now_ns();
        let t = crate::session::DEFAULT_TIMEOUT;
        let live = Session::new("put", false);
        let mut dead = Session::new("put", false);
        dead.pid_start += 1; // its pid reused: that process is gone
        let judge = TmpJudge::new(vec![live.clone(), dead.clone()], now, t, false);
        let of = |s: &Session| format!(".f.jfs-tmp-{}-{}-0123abcd", s.id, s.pid);
        assert!(!judge.is_stale(&of(&live), now));
        assert!(judge.is_stale(&of(&dead), now));
        assert!(
            judge.is_stale(".f.jfs-tmp-00000000000000aa-1-0123abcd", now),
            "no record"
        );
        // Without a session: this process lives; a pid that is no process is gone, and is
        // judged by age too unless every writer ran here.
        let me = format!(".f.jfs-tmp-{}-0123abcd", std::process::id());
        let gone = format!(".f.jfs-tmp-{}-0123abcd", u32::MAX);
        assert!(!judge.is_stale(&me, 0));
        assert!(!judge.is_stale(&gone, now));
        assert!(judge.is_stale(&gone, now - t.as_nanos() as i64));
        assert!(TmpJudge::new(vec![], now, t, true).is_stale(&gone, now));
        assert!(!judge.is_stale(".f.jfs-tmp-final", 0), "a user's name");
    }
}
