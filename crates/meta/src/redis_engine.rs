//! The Redis engine. Data keys are stored as plain strings (`<prefix><key>`), with a sorted
//! set `<prefix>_index` of all keys (score 0) for ordered range scans (ZRANGEBYLEX), the
//! journal as a stream `<prefix>_journal` with entry id `<seq>-0`, and the head in
//! `<prefix>_head`.
//!
//! Commit section: one Lua script (atomic on the server) that checks the expected head and
//! the read-set values, applies the write-set, appends the frame and bumps the head. The frame
//! (with its CRC) is built in Rust for `seq = expected head + 1`; when another client
//! committed first the script answers "head moved" and we rebuild for the new head, without
//! re-running the transaction's logic (its reads are still checked by the script).
//! Readers wait with XREAD BLOCK on a connection of their own.

use async_trait::async_trait;
use fs_core::engine::{CommitOutcome, Engine, Follow, Followed, JournalBounds, KvPair, Values};
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::journal::{CommitRequest, Entry, Mutation};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncCommands, Script, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

const COMMIT_LUA: &str = r#"
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
if redis.call('HEXISTS', KEYS[4], ARGV[6]) == 1 then return {3, head} end
if head ~= tonumber(ARGV[1]) then return {1, head} end
local nr = tonumber(ARGV[2])
local nw = tonumber(ARGV[3])
local a = 7
for i = 1, nr do
  local v = redis.call('GET', KEYS[4 + i])
  if ARGV[a] == '0' then
    if v then return {2, head} end
  elseif (not v) or v ~= ARGV[a + 1] then
    return {2, head}
  end
  a = a + 2
end
for i = 1, nw do
  local k = KEYS[4 + nr + i]
  if ARGV[a] == 'p' then
    redis.call('SET', k, ARGV[a + 1])
    redis.call('ZADD', KEYS[3], 0, ARGV[a + 2])
  else
    redis.call('DEL', k)
    redis.call('ZREM', KEYS[3], ARGV[a + 2])
  end
  a = a + 3
end
redis.call('SET', KEYS[1], ARGV[5])
redis.call('XADD', KEYS[2], ARGV[5] .. '-0', 'f', ARGV[4])
return {0, tonumber(ARGV[5])}
"#;

/// Replay: ARGV = [expected head, new head, n frames, marker name, (seq, frame)*,
/// (op, value, member)*]; KEYS = [head, journal, index, aux, written keys...]. Refused (3)
/// unless the metadata carries the mirror marker.
const APPLY_LUA: &str = r#"
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
if redis.call('HEXISTS', KEYS[4], ARGV[4]) == 0 then return {3, head} end
if head ~= tonumber(ARGV[1]) then return {1, head} end
local nf = tonumber(ARGV[3])
local a = 5
for i = 1, nf do
  redis.call('XADD', KEYS[2], ARGV[a] .. '-0', 'f', ARGV[a + 1])
  a = a + 2
end
for i = 5, #KEYS do
  if ARGV[a] == 'p' then
    redis.call('SET', KEYS[i], ARGV[a + 1])
    redis.call('ZADD', KEYS[3], 0, ARGV[a + 2])
  else
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[3], ARGV[a + 2])
  end
  a = a + 3
end
redis.call('SET', KEYS[1], ARGV[2])
return {0, tonumber(ARGV[2])}
"#;

/// `get_many_via`: KEYS = [the index, the keys asked for...]; ARGV = [this volume's key
/// prefix, the inode records' prefix, range from, range to, range limit, suffix...]. When
/// the first key's value has at least 8 bytes (the inode it names), the inode's records named
/// by the suffixes and up to `limit` names of its range (from the index, as `scan` reads
/// them) are read too. Replies {values of the keys then of the suffixes, range names, range
/// values}; missing values are `false` (nil), so every list keeps its length.
const VIA_LUA: &str = r#"
local out = {}
local n = 0
for i = 2, #KEYS do
  n = n + 1
  out[n] = redis.call('GET', KEYS[i])
end
local names = {}
local vals = {}
local v = out[1]
if v and #v >= 8 then
  local ino = string.sub(v, 1, 8)
  local own = ARGV[1] .. ARGV[2] .. ino
  for j = 6, #ARGV do
    n = n + 1
    out[n] = redis.call('GET', own .. ARGV[j])
  end
  local limit = tonumber(ARGV[5])
  if limit > 0 then
    local m = ARGV[2] .. ino
    names = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. m .. ARGV[3], '(' .. m .. ARGV[4], 'LIMIT', 0, limit)
    for i, name in ipairs(names) do
      vals[i] = redis.call('GET', ARGV[1] .. name)
    end
  end
end
return {out, names, vals}
"#;

pub struct RedisEngine {
    client: redis::Client,
    conn: ConnectionManager,
    waiter: Mutex<Option<MultiplexedConnection>>,
    prefix: Vec<u8>,
    display: String,
    head_hint: AtomicU64,
    commit_script: Script,
    apply_script: Script,
    via_script: Script,
    /// The counters' values as of a head, kept from this engine's last commit: a commit that
    /// adds to counters needs their values (the journal records the results), and reading
    /// them took a round trip of its own. Only a hint: the commit script checks every value
    /// used, like the transaction's reads, and a miss reads them again.
    counters: std::sync::Mutex<CounterHint>,
}

#[derive(Default)]
struct CounterHint {
    head: u64,
    values: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

pub(crate) fn map_err(e: redis::RedisError, what: &str) -> Error {
    let temporary =
        e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal();
    let msg = format!("redis {what}: {e}");
    if msg.contains("without any password configured") {
        return no_password_wanted(what);
    }
    // Selecting a database is the first command the client sends: a server that wants a
    // password refuses it ("refused to switch database" is all the client library says).
    if msg.contains("refused to switch database") && !msg.contains("NOPERM") {
        if msg.contains("out of range") {
            return Error::new(
                ErrorKind::Config,
                format!("redis {what}: this Redis has no such database (the number after the port in the META URL is past its `databases` setting): use one it has, e.g. /1"),
            );
        }
        return password_needed(what);
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || msg.contains("NOAUTH")
        || msg.contains("WRONGPASS")
    {
        return Error::new(
            ErrorKind::PermissionDenied,
            format!("redis {what}: authentication failed (check the password: {}, or the variable the URL's ?password_env= names)", crate::PASSWORD_ENV),
        );
    }
    if temporary {
        Error::temporary(ErrorKind::Backend, msg)
    } else {
        Error::new(ErrorKind::Backend, msg)
    }
}

/// A Redis that needs a password, reached without one.
fn password_needed(what: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!("redis {what}: this Redis needs a password and none was given: set {} to it, or give --meta-password-file FILE, or name the variable that holds it in the META URL with ?password_env=VAR (never the password itself)", crate::PASSWORD_ENV),
    )
}

/// A password sent to a Redis that has none.
fn no_password_wanted(what: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!("redis {what}: authentication failed: this Redis has no password, but one was sent (from {}, or the variable the URL's ?password_env= names): leave {} unset for it, and give the URLs that need a password their own ?password_env=VAR", crate::PASSWORD_ENV, crate::PASSWORD_ENV),
    )
}

impl RedisEngine {
    pub async fn connect(
        info: redis::ConnectionInfo,
        prefix: &str,
        display: String,
    ) -> Result<Self> {
        let sent_password = info.redis.password.is_some();
        let mut bare = info.clone();
        bare.redis.password = None;
        bare.redis.username = None;
        let client = redis::Client::open(info)
            .map_err(|e| Error::new(ErrorKind::Config, format!("redis URL: {e}")))?;
        // Probe with one plain connection first: a refused connection or bad credentials fail
        // at once here (the manager below would retry), and PING proves the AUTH.
        let probe_cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Duration::from_secs(5))
            .set_response_timeout(Duration::from_secs(10));
        let probed = async {
            let mut probe = client
                .get_multiplexed_async_connection_with_config(&probe_cfg)
                .await?;
            redis::cmd("PING").query_async::<String>(&mut probe).await
        }
        .await;
        if let Err(e) = probed {
            let mut err = map_err(e, &format!("connecting to {display}"));
            // The client library keeps no word of why a password was refused: a server with no
            // password at all refuses any (one meant for another URL, e.g. JFS_META_PASSWORD
            // set for a job engine). Say so when that is the case.
            // None sent to one that wants it (NOAUTH at PING): say that, not "check it".
            if !sent_password && err.kind() == ErrorKind::PermissionDenied {
                err = password_needed(&format!("connecting to {display}"));
            }
            if sent_password && err.kind() == ErrorKind::PermissionDenied {
                if let Ok(c) = redis::Client::open(bare) {
                    let open = async {
                        let mut p = c
                            .get_multiplexed_async_connection_with_config(&probe_cfg)
                            .await?;
                        redis::cmd("PING").query_async::<String>(&mut p).await
                    };
                    if open.await.is_ok() {
                        err = no_password_wanted(&format!("connecting to {display}"));
                    }
                }
            }
            return Err(err);
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(5))
            .set_response_timeout(Duration::from_secs(60))
            .set_number_of_retries(3);
        let conn = client
            .get_connection_manager_with_config(cfg)
            .await
            .map_err(|e| map_err(e, &format!("connecting to {display}")))?;
        let e = RedisEngine {
            client,
            conn,
            waiter: Mutex::new(None),
            prefix: prefix.as_bytes().to_vec(),
            display,
            head_hint: AtomicU64::new(0),
            commit_script: Script::new(COMMIT_LUA),
            apply_script: Script::new(APPLY_LUA),
            via_script: Script::new(VIA_LUA),
            counters: Default::default(),
        };
        e.head_hint.store(e.head().await?, Ordering::SeqCst);
        Ok(e)
    }

    /// The values of `ckeys` as of `head`, when this engine's last commit left them all.
    fn known_counters(
        &self,
        head: u64,
        ckeys: &[Vec<u8>],
    ) -> Option<HashMap<Vec<u8>, Option<Vec<u8>>>> {
        if ckeys.is_empty() {
            return Some(HashMap::new());
        }
        let hint = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if hint.head != head {
            return None;
        }
        ckeys
            .iter()
            .map(|k| hint.values.get(k).map(|v| (k.clone(), v.clone())))
            .collect()
    }

    /// After a commit of `entry` on top of `head`: the counters it wrote hold their new
    /// values, and those kept as of `head` still hold (no other commit came between).
    fn note_counters(&self, head: u64, entry: &Entry, ckeys: &[Vec<u8>]) {
        let mut hint = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if hint.head != head {
            hint.values.clear();
        }
        hint.head = entry.seq;
        for m in &entry.writes {
            match m {
                Mutation::Put { key, value }
                    if ckeys.contains(key) || hint.values.contains_key(key) =>
                {
                    hint.values.insert(key.clone(), Some(value.clone()));
                }
                Mutation::Delete { key } if hint.values.contains_key(key) => {
                    hint.values.insert(key.clone(), None);
                }
                _ => {}
            }
        }
    }

    fn forget_counters(&self) {
        *self.counters.lock().unwrap_or_else(|p| p.into_inner()) = CounterHint::default();
    }

    fn k(&self, key: &[u8]) -> Vec<u8> {
        let mut v = self.prefix.clone();
        v.extend_from_slice(key);
        v
    }
    fn head_key(&self) -> Vec<u8> {
        self.k(b"_head")
    }
    fn journal_key(&self) -> Vec<u8> {
        self.k(b"_journal")
    }
    fn index_key(&self) -> Vec<u8> {
        self.k(b"_index")
    }
    fn aux_key(&self) -> Vec<u8> {
        self.k(b"_aux")
    }

    async fn head(&self) -> Result<u64> {
        let mut c = self.conn.clone();
        let v: Option<u64> = c
            .get(self.head_key())
            .await
            .map_err(|e| map_err(e, "reading head"))?;
        Ok(v.unwrap_or(0))
    }

    /// The seq of a journal stream id, which this engine writes as `<seq>-0`: decimal digits
    /// only (Rust's `u64::from_str` also takes a leading `+`, which no id written here has),
    /// then `-0`; anything else is a damaged or foreign stream.
    fn parse_id(id: &str) -> Result<u64> {
        id.strip_suffix("-0")
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                fs_core::error::corrupt(format!(
                    "redis journal id {id:?} is not <seq>-0 (decimal digits, then -0): \
                     the journal stream was written by something other than this engine"
                ))
            })
    }

    fn frames_from(v: Value) -> Result<Vec<(u64, Vec<u8>)>> {
        let reply: redis::streams::StreamRangeReply = redis::from_redis_value(&v)
            .map_err(|e| fs_core::error::corrupt(format!("redis journal reply: {e}")))?;
        reply
            .ids
            .into_iter()
            .map(|se| {
                let seq = Self::parse_id(&se.id)?;
                let f: Vec<u8> = match se.map.get("f") {
                    Some(v) => redis::from_redis_value(v)
                        .map_err(|e| fs_core::error::corrupt(format!("journal {seq}: {e}")))?,
                    None => {
                        return Err(fs_core::error::corrupt(format!(
                            "redis journal entry {seq} has no frame"
                        )))
                    }
                };
                Ok((seq, f))
            })
            .collect()
    }
}

fn push_write(inv: &mut redis::ScriptInvocation<'_>, this: &RedisEngine, m: &Mutation) {
    match m {
        Mutation::Put { key, value } => {
            inv.key(this.k(key));
            inv.arg("p").arg(value.as_slice()).arg(key.as_slice());
        }
        Mutation::Delete { key } => {
            inv.key(this.k(key));
            inv.arg("d").arg("").arg(key.as_slice());
        }
        _ => unreachable!("materialized entries hold only puts and deletes"),
    }
}

#[async_trait]
impl Engine for RedisEngine {
    fn kind(&self) -> &'static str {
        "redis"
    }
    fn display_url(&self) -> String {
        self.display.clone()
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut c = self.conn.clone();
        c.get(self.k(key)).await.map_err(|e| map_err(e, "get"))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut c = self.conn.clone();
        let ks: Vec<Vec<u8>> = keys.iter().map(|k| self.k(k)).collect();
        redis::cmd("MGET")
            .arg(ks)
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "mget"))
    }

    async fn get_many_via(&self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<Followed> {
        if keys.is_empty() {
            return Ok(Followed::default());
        }
        let mut c = self.conn.clone();
        let mut inv = self.via_script.prepare_invoke();
        inv.key(self.index_key());
        for k in keys {
            inv.key(self.k(k));
        }
        let (from, to, limit) = follow.range;
        inv.arg(self.prefix.as_slice())
            .arg(follow.prefix)
            .arg(from)
            .arg(to)
            .arg(limit);
        for s in follow.suffixes {
            inv.arg(s.as_slice());
        }
        let (mut values, names, vals): (Values, Vec<Vec<u8>>, Values) = inv
            .invoke_async(&mut c)
            .await
            .map_err(|e| map_err(e, "get (via)"))?;
        let followed_n = Follow::inode_of(values.first().and_then(|v| v.as_deref()))
            .map_or(0, |_| follow.suffixes.len());
        if values.len() != keys.len() + followed_n || names.len() != vals.len() {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redis answered {} values where {} were asked for",
                    values.len(),
                    keys.len() + followed_n
                ),
            ));
        }
        let followed = values.split_off(keys.len());
        // Complete by the names the index gave (a name without a value, which the atomic
        // script cannot see unless the index is damaged, must not make it look complete).
        let range_complete = names.len() < limit;
        let range = names
            .into_iter()
            .zip(vals)
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        Ok(Followed {
            values,
            followed,
            range,
            range_complete,
        })
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        // Names come from the index, values from a second call. A name deleted between the
        // two is skipped (its absence is validated by commit), and the page is topped up from
        // past the last name read: a page shorter than `limit` must mean the range is
        // exhausted, since every caller pages on that (snapshots, resync diffs, dumps). A large
        // limit is read in calls of at most `SCAN_CALL` names.
        const SCAN_CALL: usize = 10_000;
        let mut c = self.conn.clone();
        let mut out: Vec<KvPair> = Vec::new();
        let mut lo = b"[".to_vec();
        lo.extend_from_slice(start);
        let mut hi = b"(".to_vec();
        hi.extend_from_slice(end);
        while out.len() < limit {
            let want = (limit - out.len()).min(SCAN_CALL);
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGEBYLEX")
                .arg(self.index_key())
                .arg(&lo)
                .arg(&hi)
                .arg("LIMIT")
                .arg(0)
                .arg(want)
                .query_async(&mut c)
                .await
                .map_err(|e| map_err(e, "scan"))?;
            let exhausted = members.len() < want;
            if let Some(last) = members.last() {
                // Exclusive from the last name read: no name is read twice.
                lo = b"(".to_vec();
                lo.extend_from_slice(last);
            }
            let vals = self.get_many(&members).await?;
            out.extend(
                members
                    .into_iter()
                    .zip(vals)
                    .filter_map(|(k, v)| v.map(|v| (k, v))),
            );
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        let ckeys = req.counter_keys();
        let mut c = self.conn.clone();
        loop {
            let head = self.head_hint.load(Ordering::SeqCst);
            let mut counters: HashMap<Vec<u8>, Option<Vec<u8>>> =
                match self.known_counters(head, &ckeys) {
                    Some(known) => known,
                    None => ckeys
                        .iter()
                        .cloned()
                        .zip(self.get_many(&ckeys).await?)
                        .collect(),
                };
            // A counter the transaction read is taken as it read it (that value is checked).
            for (k, v) in &req.reads {
                if let Some(c) = counters.get_mut(k) {
                    *c = v.clone();
                }
            }
            let seq = head + 1;
            let entry = req.materialize(seq, fs_core::types::now_ns(), &counters)?;
            let frame = entry.encode();
            // The counters' values used are checked like the transaction's reads.
            let checked: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = req
                .reads
                .iter()
                .map(|(k, v)| (k, v))
                .chain(
                    counters
                        .iter()
                        .filter(|(k, _)| !req.reads.iter().any(|(r, _)| r == *k)),
                )
                .collect();
            let mut inv = self.commit_script.prepare_invoke();
            inv.key(self.head_key())
                .key(self.journal_key())
                .key(self.index_key())
                .key(self.aux_key());
            inv.arg(head)
                .arg(checked.len())
                .arg(entry.writes.len())
                .arg(frame)
                .arg(seq)
                .arg(fs_core::site::MARKER);
            for (k, want) in checked {
                inv.key(self.k(k));
                match want {
                    None => inv.arg("0").arg(""),
                    Some(v) => inv.arg("1").arg(v.as_slice()),
                };
            }
            for m in &entry.writes {
                push_write(&mut inv, self, m);
            }
            let (code, cur): (i64, u64) = inv
                .invoke_async(&mut c)
                .await
                .map_err(|e| map_err(e, "commit"))?;
            if code != 0 {
                self.forget_counters();
            }
            match code {
                0 => {
                    self.head_hint.fetch_max(seq, Ordering::SeqCst);
                    self.note_counters(head, &entry, &ckeys);
                    return Ok(CommitOutcome::Committed {
                        seq,
                        time_ns: entry.time_ns,
                    });
                }
                1 => self.head_hint.store(cur, Ordering::SeqCst),
                3 => return Err(fs_core::site::refuse_commit(self).await),
                _ => {
                    self.head_hint.store(cur, Ordering::SeqCst);
                    return Ok(CommitOutcome::Conflict);
                }
            }
        }
    }

    async fn journal_bounds(&self) -> Result<JournalBounds> {
        let mut c = self.conn.clone();
        let last = self.head().await?;
        let v: Value = redis::cmd("XRANGE")
            .arg(self.journal_key())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "reading the journal"))?;
        let first = Self::frames_from(v)?
            .first()
            .map(|(s, _)| *s)
            .unwrap_or(last + 1);
        Ok(JournalBounds { first, last })
    }

    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let b = self.journal_bounds().await?;
        let from = b.check_from(from)?;
        let mut c = self.conn.clone();
        let v: Value = redis::cmd("XRANGE")
            .arg(self.journal_key())
            .arg(format!("{from}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(max)
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "reading the journal"))?;
        Self::frames_from(v)
    }

    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool> {
        if self.head().await? > after {
            return Ok(true);
        }
        let mut guard = self.waiter.lock().await;
        if guard.is_none() {
            let cfg =
                redis::AsyncConnectionConfig::new().set_connection_timeout(Duration::from_secs(5));
            *guard = Some(
                self.client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
                    .map_err(|e| map_err(e, "connecting a journal reader"))?,
            );
        }
        let conn = guard.as_mut().expect("set above");
        let ms = timeout.as_millis().max(1) as u64;
        let r: redis::RedisResult<Value> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(ms)
            .arg("STREAMS")
            .arg(self.journal_key())
            .arg(format!("{after}-0"))
            .query_async(conn)
            .await;
        match r {
            Ok(Value::Nil) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => {
                *guard = None; // reconnect next time
                Err(map_err(e, "waiting for journal entries"))
            }
        }
    }

    async fn journal_trim(&self, before: u64) -> Result<u64> {
        let b = self.journal_bounds().await?;
        let before = before.min(b.last);
        if before <= b.first {
            return Ok(0);
        }
        let mut c = self.conn.clone();
        let n: u64 = redis::cmd("XTRIM")
            .arg(self.journal_key())
            .arg("MINID")
            .arg(format!("{before}-0"))
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "trimming the journal"))?;
        Ok(n)
    }

    async fn apply(&self, entries: &[Entry]) -> Result<u64> {
        let head = self.head().await?;
        let todo = fs_core::engine::entries_after(head, entries)?;
        let Some(last) = todo.last() else {
            return Ok(head);
        };
        let mut inv = self.apply_script.prepare_invoke();
        inv.key(self.head_key())
            .key(self.journal_key())
            .key(self.index_key())
            .key(self.aux_key());
        inv.arg(head)
            .arg(last.seq)
            .arg(todo.len())
            .arg(fs_core::site::MARKER);
        for e in &todo {
            inv.arg(e.seq).arg(e.encode());
        }
        for e in &todo {
            for m in &e.writes {
                push_write(&mut inv, self, m);
            }
        }
        let mut c = self.conn.clone();
        let (code, cur): (i64, u64) = inv
            .invoke_async(&mut c)
            .await
            .map_err(|e| map_err(e, "apply"))?;
        if code == 3 {
            return Err(fs_core::site::replay_refused(&self.display));
        }
        if code != 0 {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("another writer moved the head to {cur} during replay"),
            ));
        }
        self.head_hint.store(last.seq, Ordering::SeqCst);
        Ok(last.seq)
    }

    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()> {
        fs_core::engine::check_aux_name(name)?;
        let mut c = self.conn.clone();
        let r: redis::RedisResult<()> = match value {
            Some(v) => c.hset(self.aux_key(), name, v).await,
            None => c.hdel(self.aux_key(), name).await,
        };
        r.map_err(|e| map_err(e, "writing an aux record"))
    }

    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut c = self.conn.clone();
        let all: Vec<(String, Vec<u8>)> = c
            .hgetall(self.aux_key())
            .await
            .map_err(|e| map_err(e, "reading aux records"))?;
        let mut out: Vec<_> = all
            .into_iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .collect();
        out.sort();
        Ok(out)
    }

    async fn install_reset(&self) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        let mut c = self.conn.clone();
        loop {
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(self.index_key())
                .arg(0)
                .arg(999)
                .query_async(&mut c)
                .await
                .map_err(|e| map_err(e, "listing keys to reset"))?;
            if members.is_empty() {
                break;
            }
            let mut p = redis::pipe();
            p.atomic();
            let keys: Vec<Vec<u8>> = members.iter().map(|m| self.k(m)).collect();
            p.del(keys).ignore();
            p.zrem(self.index_key(), &members).ignore();
            let _: () = p
                .query_async(&mut c)
                .await
                .map_err(|e| map_err(e, "resetting keys"))?;
        }
        let _: () = c
            .del(&[self.journal_key(), self.head_key()])
            .await
            .map_err(|e| map_err(e, "resetting the journal"))?;
        self.head_hint.store(0, Ordering::SeqCst);
        Ok(())
    }

    async fn install_put(&self, pairs: &[KvPair]) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        if pairs.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        p.atomic();
        for (k, v) in pairs {
            p.set(self.k(k), v).ignore();
            p.zadd(self.index_key(), k, 0).ignore();
        }
        let mut c = self.conn.clone();
        let _: () = p
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "installing snapshot keys"))?;
        Ok(())
    }

    async fn install_head(&self, head: u64) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        let mut c = self.conn.clone();
        let _: () = c
            .set(self.head_key(), head)
            .await
            .map_err(|e| map_err(e, "setting the head"))?;
        self.head_hint.store(head, Ordering::SeqCst);
        Ok(())
    }

    async fn install_switch(
        &self,
        writes: &[Mutation],
        frames: &[(u64, Vec<u8>)],
        head: u64,
    ) -> Result<()> {
        fs_core::engine::check_switch(writes, frames, head)?;
        fs_core::site::require_mirror(self).await?;
        // One MULTI/EXEC: Redis runs it whole, with no other client's command in between.
        let mut p = redis::pipe();
        p.atomic();
        for m in writes {
            match m {
                Mutation::Put { key, value } => {
                    p.set(self.k(key), value.as_slice()).ignore();
                    p.zadd(self.index_key(), key.as_slice(), 0).ignore();
                }
                Mutation::Delete { key } => {
                    p.del(self.k(key)).ignore();
                    p.zrem(self.index_key(), key.as_slice()).ignore();
                }
                _ => unreachable!("checked by check_switch"),
            }
        }
        p.del(self.journal_key()).ignore();
        for (seq, f) in frames {
            p.cmd("XADD")
                .arg(self.journal_key())
                .arg(format!("{seq}-0"))
                .arg("f")
                .arg(f.as_slice())
                .ignore();
        }
        p.set(self.head_key(), head).ignore();
        let mut c = self.conn.clone();
        let _: () = p
            .query_async(&mut c)
            .await
            .map_err(|e| map_err(e, "switching to the installed snapshot"))?;
        self.head_hint.store(head, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::RedisEngine;

    #[test]
    fn journal_ids_are_digits_then_dash_zero() {
        for (id, want) in [
            ("5-0", Some(5)),
            ("0-0", Some(0)),
            ("18446744073709551615-0", Some(u64::MAX)),
            ("+5-0", None),
            ("+5", None),
            ("5", None),
            ("5-1", None),
            ("-5-0", None),
            (" 5-0", None),
            ("5-0-0", None),
            ("-0", None),
            ("18446744073709551616-0", None),
            ("", None),
        ] {
            let got = RedisEngine::parse_id(id);
            match want {
                Some(seq) => assert_eq!(got.unwrap(), seq, "{id:?}"),
                None => {
                    let e = got.expect_err(id);
                    assert_eq!(e.kind(), fs_core::error::ErrorKind::Corrupt, "{id:?}");
                    assert!(e.to_string().contains("<seq>-0"), "{e}");
                }
            }
        }
    }
}
