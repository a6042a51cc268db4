//! A shared job in Redis: one hash per unit, a sorted set of pending units and one of lease
//! deadlines (on the server's clock, `TIME`), and Lua scripts so that a claim, a save or a
//! finish is one atomic step that checks the holder's token. All keys share one hash tag,
//! `{jfs-sync:NAME}`, so the scripts touch one slot.

use super::{Board, Control, Finish, Plan, Round, Saved, Spec, Unit, WorkerReport};
use crate::stats::Summary;
use anyhow::{Context, Result};
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use std::time::Duration;

pub struct RedisBoard {
    conn: ConnectionManager,
    /// Key prefix of this job: `{PREFIX}{jfs-sync:NAME}:`.
    p: String,
    display: String,
    /// The incarnation of the job this worker joined ("" before `bind`): every script fails
    /// with `JobGone` once the job's is another (deleted, or deleted and made again).
    bound: std::sync::Mutex<String>,
}

/// Lua: the server's time in milliseconds.
const NOW: &str = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n";

/// Lua, first in every script: ARGV[1] is the job's key prefix, ARGV[2] the incarnation of
/// the job the caller joined ('' for calls that create a job). A job deleted (or deleted and
/// created again under its name) since fails every call of a worker that joined it, in the
/// same atomic step as the write it would have made: nothing is written back.
const GUARD: &str = r#"
local P = ARGV[1]
if ARGV[2] ~= '' and redis.call('GET', P..'id') ~= ARGV[2] then
  return redis.error_reply('JFS_JOB_GONE the job was deleted')
end
"#;

/// Lua: make a round's units, pending, cut at ARGV[first..] (none: one unit for every key),
/// and the held deletion step when `delete`.
const MAKE_UNITS: &str = r#"
local function make_units(P, first, delete)
  local n = #ARGV - first + 2
  for i = 1, n do
    local id = redis.call('INCR', P..'next')
    local u = P..'u:'..id
    redis.call('HSET', u, 'kind', 'copy', 'state', 'pending', 'token', 0, 'attempts', 0, 'reassigned', 0, 'dst_listed', 0)
    if i > 1 then redis.call('HSET', u, 'lo', ARGV[first + i - 2]) end
    if ARGV[first + i - 1] then redis.call('HSET', u, 'hi', ARGV[first + i - 1]) end
    redis.call('ZADD', P..'all', id, id)
    redis.call('ZADD', P..'pending', id, id)
  end
  redis.call('SET', P..'left', n)
  if delete then
    local d = redis.call('INCR', P..'next')
    redis.call('HSET', P..'u:'..d, 'kind', 'delete', 'state', 'held', 'token', 0, 'attempts', 0, 'reassigned', 0, 'dst_listed', 0)
    redis.call('ZADD', P..'all', d, d)
    redis.call('SET', P..'delete_unit', d)
  end
end
"#;

/// ARGV[3] spec, [4] bwlimit, [5] tps, [6] '1' with a deletion step, [7] the new job's
/// incarnation.
const CREATE: &str = r#"
if redis.call('EXISTS', P..'spec') == 1 then return 0 end
redis.call('SET', P..'spec', ARGV[3])
redis.call('SET', P..'id', ARGV[7])
redis.call('SET', P..'state', 'running')
redis.call('SET', P..'created', now)
if ARGV[4] ~= '' then redis.call('HSET', P..'limits', 'bwlimit', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', P..'limits', 'tps', ARGV[5]) end
make_units(P, 8, ARGV[6] == '1')
return 1
"#;

/// The job's incarnation (one is given to a job of an earlier release that has none), or
/// false when there is no job. ARGV[3]: the incarnation to give.
const BIND: &str = r#"
if redis.call('EXISTS', P..'spec') == 0 then return false end
redis.call('SET', P..'id', ARGV[3], 'NX')
return redis.call('GET', P..'id')
"#;

/// Units are claimed only while the job runs (not once it is paused, cancelled or over).
const CLAIM: &str = r#"
local worker, lease, maxatt = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('GET', P..'state') ~= 'running' then return false end
for _ = 1, 1000 do
  local id, re = nil, 0
  local exp = redis.call('ZRANGEBYSCORE', P..'leases', '-inf', now, 'LIMIT', 0, 1)
  if #exp > 0 then
    id = exp[1]; re = 1
  else
    local p = redis.call('ZRANGE', P..'pending', 0, 0)
    if #p == 0 then return false end
    id = p[1]
  end
  local u = P..'u:'..id
  if re == 1 and tonumber(redis.call('HGET', u, 'attempts')) >= maxatt then
    redis.call('ZREM', P..'leases', id)
    redis.call('HSET', u, 'state', 'failed', 'error',
      'claimed '..redis.call('HGET', u, 'attempts')..' times and never finished: the workers holding it stopped answering')
    redis.call('HDEL', u, 'owner')
  else
    redis.call('ZREM', P..'pending', id)
    redis.call('ZADD', P..'leases', now + lease, id)
    redis.call('HINCRBY', u, 'token', 1)
    redis.call('HINCRBY', u, 'attempts', 1)
    redis.call('HINCRBY', u, 'reassigned', re)
    redis.call('HSET', u, 'state', 'running', 'owner', worker)
    return {id, now, redis.call('HGETALL', u)}
  end
end
return false
"#;

const RENEW: &str = r#"
local worker, lease = ARGV[3], tonumber(ARGV[4])
local kept = {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local u = P..'u:'..id
  local v = redis.call('HMGET', u, 'token', 'state', 'owner')
  if v[1] == token and v[2] == 'running' and v[3] == worker then
    redis.call('ZADD', P..'leases', now + lease, id)
    kept[#kept + 1] = id
  end
end
return kept
"#;

/// Checks that the caller still holds unit ARGV[3] under token ARGV[4].
const HOLDS: &str = r#"
local id, token = ARGV[3], ARGV[4]
local u = P..'u:'..id
local v = redis.call('HMGET', u, 'token', 'state')
if v[1] ~= token or v[2] ~= 'running' then return 0 end
"#;

const SAVE: &str = r#"
redis.call('HSET', u, 'cursor', ARGV[5], 'tally', ARGV[6])
for i = 7, #ARGV, 2 do redis.call('HSET', P..'deletes', ARGV[i], ARGV[i + 1]) end
if redis.call('HGET', u, 'steal') == '1' then return 2 end
return 1
"#;

const FINISH: &str = r#"
local state = ARGV[5]
redis.call('HSET', u, 'state', state, 'dst_listed', ARGV[6])
redis.call('HDEL', u, 'owner')
if ARGV[7] ~= '' then redis.call('HSET', u, 'error', ARGV[7]) else redis.call('HDEL', u, 'error') end
if ARGV[8] ~= '' then redis.call('HSET', u, 'tally', ARGV[8]) end
redis.call('ZREM', P..'leases', id)
if state == 'done' and redis.call('HGET', u, 'kind') == 'copy' then
  if redis.call('DECR', P..'left') == 0 then
    local d = redis.call('GET', P..'delete_unit')
    if d and redis.call('HGET', P..'u:'..d, 'state') == 'held' then
      redis.call('HSET', P..'u:'..d, 'state', 'pending')
      redis.call('ZADD', P..'pending', d, d)
    end
  end
end
return 1
"#;

// The holder cuts only past every key it has worked on (and so past its cursor): keys are
// not compared here, as Lua compares strings by the server's locale.
const SPLIT: &str = r#"
if #ARGV == 4 then
  redis.call('HSET', u, 'steal', 2)
  return 1
end
local hi = redis.call('HGET', u, 'hi')
redis.call('HSET', u, 'hi', ARGV[5], 'steal', 0)
for i = 5, #ARGV do
  local n = redis.call('INCR', P..'next')
  redis.call('HSET', P..'u:'..n, 'kind', 'copy', 'state', 'pending', 'lo', ARGV[i], 'token', 0, 'attempts', 0, 'reassigned', 0, 'dst_listed', 0)
  local e = ARGV[i + 1] or hi
  if e then redis.call('HSET', P..'u:'..n, 'hi', e) end
  redis.call('ZADD', P..'all', n, n)
  redis.call('ZADD', P..'pending', n, n)
end
redis.call('INCRBY', P..'left', #ARGV - 4)
return 1
"#;

const ASK_SPLIT: &str = r#"
local n = tonumber(ARGV[3])
local asked = 0
for _, id in ipairs(redis.call('ZRANGE', P..'leases', 0, -1)) do
  if asked >= n then break end
  local u = P..'u:'..id
  local v = redis.call('HMGET', u, 'kind', 'state', 'steal')
  if v[1] == 'copy' and v[2] == 'running' and (not v[3] or v[3] == '0') then
    redis.call('HSET', u, 'steal', 1)
    asked = asked + 1
  end
end
return asked
"#;

/// A new job, or the next round of a done one: the old round's records go, the planned keys
/// (written first to the staging set ARGV[9]) become the round's, and the units are made.
/// ARGV[3] spec, [4] bwlimit, [5] tps, [6] deletion step, [7] target, [8] keys mode,
/// [9] staging set, [10] the incarnation of a new job, [11..] cuts.
const NEW_ROUND: &str = r#"
local staging = ARGV[9]
local st = redis.call('GET', P..'state')
if st and st ~= 'done' then
  redis.call('DEL', staging)
  return 0
end
if not st then
  redis.call('SET', P..'spec', ARGV[3])
end
redis.call('SET', P..'id', ARGV[10], 'NX')
redis.call('SET', P..'created', now)
redis.call('DEL', P..'finished')
if not redis.call('GET', P..'target') then
  -- The first round: the limits of the command that planned it.
  if ARGV[4] ~= '' then redis.call('HSET', P..'limits', 'bwlimit', ARGV[4]) end
  if ARGV[5] ~= '' then redis.call('HSET', P..'limits', 'tps', ARGV[5]) end
end
for _, id in ipairs(redis.call('ZRANGE', P..'all', 0, -1)) do redis.call('DEL', P..'u:'..id) end
redis.call('DEL', P..'all', P..'pending', P..'leases', P..'deletes', P..'keys', P..'delete_unit')
if redis.call('EXISTS', staging) == 1 then
  redis.call('PERSIST', staging)
  redis.call('RENAME', staging, P..'keys')
end
make_units(P, 11, ARGV[6] == '1')
redis.call('SET', P..'target', ARGV[7])
redis.call('SET', P..'keys_mode', ARGV[8])
redis.call('DEL', P..'planning')
redis.call('SET', P..'state', 'running')
return 1
"#;

/// One planner per round: the job's record is made (done, no units) when there is none.
/// ARGV[3] spec, [4] planning time (ms), [5] the incarnation of a new job.
const CLAIM_PLANNING: &str = r#"
if redis.call('EXISTS', P..'state') == 0 then
  redis.call('SET', P..'spec', ARGV[3])
  redis.call('SET', P..'id', ARGV[5])
  redis.call('SET', P..'state', 'done')
  redis.call('SET', P..'created', now)
  redis.call('SET', P..'finished', now)
end
if redis.call('GET', P..'state') ~= 'done' then return 0 end
if redis.call('SET', P..'planning', '1', 'NX', 'PX', ARGV[4]) then return 1 end
return 0
"#;

/// The job's state ARGV[3], only from state ARGV[4] when given (0 when it was not there);
/// a round that ends done records its target as the journal position. The time it ended
/// is kept, for its duration and average rate.
const SET_STATE: &str = r#"
local to, from = ARGV[3], ARGV[4]
if redis.call('EXISTS', P..'state') == 0 then return redis.error_reply('JFS_JOB_GONE the job does not exist') end
if from ~= '' and redis.call('GET', P..'state') ~= from then return 0 end
redis.call('SET', P..'state', to)
if to == 'done' then
  local t = redis.call('GET', P..'target')
  if t then redis.call('SET', P..'journal_seq', t) end
end
if to == 'done' or to == 'failed' or to == 'cancelled' then
  redis.call('SET', P..'finished', now)
else
  redis.call('DEL', P..'finished')
end
return 1
"#;

/// ARGV[3] bwlimit, [4] tps ('' for none).
const SET_LIMITS: &str = r#"
redis.call('DEL', P..'limits')
if ARGV[3] ~= '' then redis.call('HSET', P..'limits', 'bwlimit', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', P..'limits', 'tps', ARGV[4]) end
return 1
"#;

/// A worker's report (ARGV[4], a JSON object) under its name ARGV[3], stamped with the
/// server's time.
const REPORT: &str = r#"
redis.call('HSET', P..'workers', ARGV[3], '{"seen_ms":'..now..','..string.sub(ARGV[4], 2))
return 1
"#;

const RELEASE: &str = r#"
redis.call('HSET', u, 'state', 'pending')
redis.call('HDEL', u, 'owner')
redis.call('ZREM', P..'leases', id)
redis.call('ZADD', P..'pending', id, id)
return 1
"#;

const RETRY: &str = r#"
local n = 0
for _, id in ipairs(redis.call('ZRANGE', P..'all', 0, -1)) do
  local u = P..'u:'..id
  if redis.call('HGET', u, 'state') == 'failed' and redis.call('HGET', u, 'kind') == 'copy' then
    redis.call('HSET', u, 'state', 'pending', 'attempts', 0)
    redis.call('HDEL', u, 'error')
    redis.call('ZADD', P..'pending', id, id)
    n = n + 1
  end
end
local d = redis.call('GET', P..'delete_unit')
if d and redis.call('HGET', P..'u:'..d, 'state') == 'failed' then
  redis.call('HDEL', P..'u:'..d, 'error')
  redis.call('HSET', P..'u:'..d, 'attempts', 0)
  if tonumber(redis.call('GET', P..'left')) == 0 then
    redis.call('HSET', P..'u:'..d, 'state', 'pending')
    redis.call('ZADD', P..'pending', d, d)
  else
    redis.call('HSET', P..'u:'..d, 'state', 'held')
  end
end
redis.call('SET', P..'state', 'running')
redis.call('DEL', P..'finished')
return n
"#;

/// A token bucket that may run into debt (a grant larger than the burst is not starved; the
/// debt is paid before the next grant).
const TAKE: &str = r#"
local b = P..'bucket:'..ARGV[3]
local rate, n = tonumber(ARGV[4]), tonumber(ARGV[5])
local burst = rate / 20
local v = redis.call('HMGET', b, 'tokens', 'at')
local tokens, at = tonumber(v[1]) or burst, tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) / 1000 * rate)
local wait = 0
if tokens > 0 then tokens = tokens - n else wait = math.ceil(-tokens / rate * 1000) end
redis.call('HSET', b, 'tokens', tostring(tokens), 'at', now)
return wait
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{body}"))
}

/// A script that also checks the caller's hold on a unit (`HOLDS`).
fn guarded(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{HOLDS}{body}"))
}

/// A script that makes units (`MAKE_UNITS`).
fn making(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{MAKE_UNITS}{body}"))
}

/// Every call gives up after this long (a worker cut off from Redis must notice).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisBoard {
    pub async fn connect(
        info: redis::ConnectionInfo,
        prefix: &str,
        job: &str,
        display: String,
        password_from: &str,
    ) -> Result<Self> {
        // The same server without a password: to tell "wrong password" from "this server has
        // none" (the client library keeps no word of why it was refused).
        let bare = info.redis.password.is_some().then(|| {
            let mut b = info.clone();
            b.redis.password = None;
            b.redis.username = None;
            b
        });
        let client = redis::Client::open(info).context("redis client")?;
        // One plain connection and a PING first: a wrong password or a refused connection is
        // reported as what it is here (the connection manager below would retry it into a
        // timeout).
        if let Err(e) = probe(&client).await {
            let mut why = match &e {
                Some(e) => super::redis_refusal(e, password_from),
                None => format!("no answer within {CALL_TIMEOUT:?}"),
            };
            let auth = e
                .as_ref()
                .is_some_and(|e| e.kind() == redis::ErrorKind::AuthenticationFailed);
            if let (true, Some(bare)) = (auth, bare) {
                if let Ok(c) = redis::Client::open(bare) {
                    if probe(&c).await.is_ok() {
                        why = format!("it has no password, but one was sent (from {password_from}): give this URL none (leave JFS_META_PASSWORD unset, and give the URLs that need a password their own ?password_env=VAR)");
                    }
                }
            }
            anyhow::bail!("the job's Redis {display}: {why}");
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(5))
            .set_response_timeout(CALL_TIMEOUT)
            .set_number_of_retries(2);
        let conn =
            tokio::time::timeout(CALL_TIMEOUT, client.get_connection_manager_with_config(cfg))
                .await
                .map_err(|_| anyhow::anyhow!("no answer within {CALL_TIMEOUT:?}"))
                .and_then(|r| r.map_err(anyhow::Error::from))
                .with_context(|| format!("connecting to the job's Redis {display}"))?;
        Ok(RedisBoard {
            conn,
            p: format!("{prefix}{{jfs-sync:{job}}}:"),
            display,
            bound: Default::default(),
        })
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        what: &str,
        s: &Script,
        args: Vec<String>,
    ) -> Result<T> {
        let mut c = self.conn.clone();
        let mut inv = s.prepare_invoke();
        inv.arg(&self.p);
        inv.arg(self.bound.lock().unwrap_or_else(|p| p.into_inner()).clone());
        for a in args {
            inv.arg(a);
        }
        match tokio::time::timeout(CALL_TIMEOUT, inv.invoke_async(&mut c)).await {
            Ok(Err(e)) if e.to_string().contains("JFS_JOB_GONE") => {
                Err(anyhow::Error::new(super::JobGone(self.display.clone())))
            }
            Ok(r) => r.with_context(|| format!("{what} ({})", self.display)),
            Err(_) => {
                anyhow::bail!("{what}: no answer from the job's Redis within {CALL_TIMEOUT:?}")
            }
        }
    }

    async fn cmd<T: redis::FromRedisValue>(&self, what: &str, c: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(CALL_TIMEOUT, c.query_async(&mut conn)).await {
            Ok(r) => r.with_context(|| format!("{what} ({})", self.display)),
            Err(_) => {
                anyhow::bail!("{what}: no answer from the job's Redis within {CALL_TIMEOUT:?}")
            }
        }
    }

    fn unit_of(
        id: i64,
        now: i64,
        lease: Option<i64>,
        h: &std::collections::HashMap<String, String>,
    ) -> Unit {
        let g = |k: &str| h.get(k).cloned();
        let n = |k: &str| h.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let state = g("state").unwrap_or_default();
        Unit {
            id,
            kind: g("kind").unwrap_or_default(),
            lo: g("lo"),
            hi: g("hi"),
            lease_left_ms: lease.filter(|_| state == "running").map(|l| l - now),
            state,
            owner: g("owner"),
            token: n("token"),
            cursor: g("cursor"),
            tally: g("tally")
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default(),
            attempts: n("attempts"),
            reassigned: n("reassigned"),
            dst_listed: n("dst_listed"),
            error: g("error"),
        }
    }

    async fn unit_ids(&self) -> Result<Vec<i64>> {
        self.cmd(
            "reading the units",
            redis::cmd("ZRANGE")
                .arg(format!("{}all", self.p))
                .arg(0)
                .arg(-1),
        )
        .await
    }

    async fn now_ms(&self) -> Result<i64> {
        let (s, us): (i64, i64) = self.cmd("reading the time", &redis::cmd("TIME")).await?;
        Ok(s * 1000 + us / 1000)
    }
}

/// Connect once and PING: the job's Redis answers, and takes the password it was given.
/// Err(None): no answer in time.
async fn probe(client: &redis::Client) -> std::result::Result<(), Option<redis::RedisError>> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Duration::from_secs(5))
        .set_response_timeout(CALL_TIMEOUT);
    let r = async {
        let mut c = client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?;
        redis::cmd("PING").query_async::<String>(&mut c).await
    };
    match tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(5), r).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
    }
}

fn flat(v: Vec<String>) -> std::collections::HashMap<String, String> {
    v.chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect()
}

#[async_trait]
impl Board for RedisBoard {
    async fn create(&self, spec: &Spec, bwlimit: Option<&str>, tps: Option<u32>) -> Result<bool> {
        let n: i64 = self
            .run(
                "creating the job",
                &making(CREATE),
                vec![
                    serde_json::to_string(spec)?,
                    bwlimit.unwrap_or("").to_string(),
                    tps.map(|t| t.to_string()).unwrap_or_default(),
                    if spec.delete_dst { "1" } else { "0" }.to_string(),
                    super::new_incarnation(),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn spec(&self) -> Result<Option<Spec>> {
        let v: Option<String> = self
            .cmd(
                "reading the job",
                redis::cmd("GET").arg(format!("{}spec", self.p)),
            )
            .await?;
        v.map(|s| serde_json::from_str(&s).context("the job's record is damaged"))
            .transpose()
    }

    async fn control(&self) -> Result<Control> {
        let state: Option<String> = self
            .cmd(
                "reading the job's state",
                redis::cmd("GET").arg(format!("{}state", self.p)),
            )
            .await?;
        let state =
            state.ok_or_else(|| anyhow::Error::new(super::JobGone(self.display.clone())))?;
        let l: std::collections::HashMap<String, String> = self
            .cmd(
                "reading the job's limits",
                redis::cmd("HGETALL").arg(format!("{}limits", self.p)),
            )
            .await?;
        let (created, finished): (Option<i64>, Option<i64>) = self
            .cmd(
                "reading the job",
                redis::cmd("MGET")
                    .arg(format!("{}created", self.p))
                    .arg(format!("{}finished", self.p)),
            )
            .await?;
        let now = self.now_ms().await?;
        Ok(Control {
            state,
            bwlimit: l.get("bwlimit").cloned(),
            tps: l.get("tps").and_then(|t| t.parse().ok()),
            age_s: created.map_or(0.0, |c| (now - c) as f64 / 1000.0),
            elapsed_s: created.map_or(0.0, |c| {
                (finished.unwrap_or(now) - c).max(0) as f64 / 1000.0
            }),
        })
    }

    fn display(&self) -> String {
        self.display.clone()
    }

    async fn bind(&self) -> Result<String> {
        let inc: Option<String> = self
            .run(
                "joining the job",
                &script(BIND),
                vec![super::new_incarnation()],
            )
            .await?;
        let inc = inc.ok_or_else(|| anyhow::Error::new(super::JobGone(self.display.clone())))?;
        *self.bound.lock().unwrap_or_else(|p| p.into_inner()) = inc.clone();
        Ok(inc)
    }

    async fn set_state(&self, state: &str, from: Option<&str>) -> Result<bool> {
        let n: i64 = self
            .run(
                "changing the job's state",
                &script(SET_STATE),
                vec![state.to_string(), from.unwrap_or("").to_string()],
            )
            .await?;
        Ok(n == 1)
    }

    async fn set_limits(&self, bwlimit: Option<&str>, tps: Option<u32>) -> Result<()> {
        let _: i64 = self
            .run(
                "changing the job's limits",
                &script(SET_LIMITS),
                vec![
                    bwlimit.unwrap_or("").to_string(),
                    tps.map(|t| t.to_string()).unwrap_or_default(),
                ],
            )
            .await?;
        Ok(())
    }

    async fn report(&self, r: &WorkerReport) -> Result<()> {
        let _: i64 = self
            .run(
                "reporting to the job",
                &script(REPORT),
                vec![r.worker.clone(), serde_json::to_string(r)?],
            )
            .await?;
        Ok(())
    }

    async fn claim(&self, worker: &str, lease_ms: u64, max_attempts: u32) -> Result<Option<Unit>> {
        let v: Option<(i64, i64, Vec<String>)> = self
            .run(
                "claiming a unit",
                &script(CLAIM),
                vec![
                    worker.into(),
                    lease_ms.to_string(),
                    max_attempts.to_string(),
                ],
            )
            .await?;
        Ok(v.map(|(id, now, h)| Self::unit_of(id, now, Some(now + lease_ms as i64), &flat(h))))
    }

    async fn renew(&self, worker: &str, held: &[(i64, i64)], lease_ms: u64) -> Result<Vec<i64>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec![worker.to_string(), lease_ms.to_string()];
        for (id, t) in held {
            args.push(id.to_string());
            args.push(t.to_string());
        }
        self.run("renewing leases", &script(RENEW), args).await
    }

    async fn save(
        &self,
        id: i64,
        token: i64,
        cursor: &str,
        tally: &Summary,
        deletes: &[(String, bool)],
    ) -> Result<Saved> {
        let mut args = vec![
            id.to_string(),
            token.to_string(),
            cursor.to_string(),
            serde_json::to_string(tally)?,
        ];
        for (k, d) in deletes {
            args.push(k.clone());
            args.push(if *d { "d" } else { "f" }.into());
        }
        let n: i64 = self.run("saving progress", &guarded(SAVE), args).await?;
        Ok(match n {
            0 => Saved::Refused,
            2 => Saved::ShareWanted,
            _ => Saved::Kept,
        })
    }

    async fn finish(&self, id: i64, token: i64, f: &Finish<'_>) -> Result<bool> {
        let args = vec![
            id.to_string(),
            token.to_string(),
            f.state.to_string(),
            f.dst_listed.to_string(),
            f.error.clone().unwrap_or_default(),
            f.tally
                .map(serde_json::to_string)
                .transpose()?
                .unwrap_or_default(),
        ];
        let n: i64 = self
            .run("recording the end of a unit", &guarded(FINISH), args)
            .await?;
        Ok(n == 1)
    }

    async fn split(&self, id: i64, token: i64, cuts: &[String]) -> Result<bool> {
        let mut args = vec![id.to_string(), token.to_string()];
        args.extend(cuts.iter().cloned());
        let n: i64 = self.run("splitting a unit", &guarded(SPLIT), args).await?;
        Ok(n == 1)
    }

    async fn ask_split(&self, n: usize) -> Result<usize> {
        let asked: i64 = self
            .run(
                "asking for a share of a range",
                &script(ASK_SPLIT),
                vec![n.to_string()],
            )
            .await?;
        Ok(asked as usize)
    }

    async fn release(&self, id: i64, token: i64) -> Result<bool> {
        let n: i64 = self
            .run(
                "giving a unit back",
                &guarded(RELEASE),
                vec![id.to_string(), token.to_string()],
            )
            .await?;
        Ok(n == 1)
    }

    async fn retry_failed(&self) -> Result<u64> {
        self.run("retrying failed units", &script(RETRY), vec![])
            .await
    }

    async fn units(&self) -> Result<Vec<Unit>> {
        let ids = self.unit_ids().await?;
        let leases: Vec<(i64, i64)> = self
            .cmd(
                "reading the leases",
                redis::cmd("ZRANGE")
                    .arg(format!("{}leases", self.p))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await?;
        let leases: std::collections::HashMap<i64, i64> = leases.into_iter().collect();
        let now = self.now_ms().await?;
        let mut p = redis::pipe();
        for id in &ids {
            p.hgetall(format!("{}u:{id}", self.p));
        }
        let mut conn = self.conn.clone();
        let hs: Vec<std::collections::HashMap<String, String>> =
            match tokio::time::timeout(CALL_TIMEOUT, p.query_async(&mut conn)).await {
                Ok(r) => r.with_context(|| format!("reading the units ({})", self.display))?,
                Err(_) => anyhow::bail!("reading the units: no answer within {CALL_TIMEOUT:?}"),
            };
        Ok(ids
            .iter()
            .zip(hs.iter())
            .map(|(id, h)| Self::unit_of(*id, now, leases.get(id).copied(), h))
            .collect())
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>> {
        let now = self.now_ms().await?;
        let h: std::collections::BTreeMap<String, String> = self
            .cmd(
                "reading the workers",
                redis::cmd("HGETALL").arg(format!("{}workers", self.p)),
            )
            .await?;
        Ok(h.values()
            .filter_map(|v| {
                let j: serde_json::Value = serde_json::from_str(v).ok()?;
                let mut w: WorkerReport = serde_json::from_value(j.clone()).ok()?;
                w.age_ms = now - j["seen_ms"].as_i64().unwrap_or(now);
                Some(w)
            })
            .collect())
    }

    async fn deletes(&self) -> Result<Vec<(String, bool)>> {
        let h: std::collections::HashMap<String, String> = self
            .cmd(
                "reading the deletes",
                redis::cmd("HGETALL").arg(format!("{}deletes", self.p)),
            )
            .await?;
        Ok(h.into_iter().map(|(k, v)| (k, v == "d")).collect())
    }

    async fn take(&self, what: &str, rate: u64, n: u64) -> Result<Option<Duration>> {
        let wait: i64 = self
            .run(
                "drawing from the job's limit",
                &script(TAKE),
                vec![what.to_string(), rate.to_string(), n.to_string()],
            )
            .await?;
        Ok((wait > 0).then(|| Duration::from_millis(wait.min(1000) as u64)))
    }

    async fn remove(&self) -> Result<()> {
        let ids = self.unit_ids().await?;
        let mut keys: Vec<String> = ids.iter().map(|id| format!("{}u:{id}", self.p)).collect();
        for k in [
            "spec",
            "state",
            "created",
            "limits",
            "next",
            "all",
            "pending",
            "leases",
            "left",
            "delete_unit",
            "workers",
            "deletes",
            "bucket:bytes",
            "bucket:requests",
            "keys",
            "journal_seq",
            "target",
            "keys_mode",
            "planning",
            "id",
            "finished",
        ] {
            keys.push(format!("{}{k}", self.p));
        }
        for chunk in keys.chunks(500) {
            let _: () = self
                .cmd("removing the job", redis::cmd("DEL").arg(chunk))
                .await?;
        }
        Ok(())
    }

    async fn round(&self) -> Result<Round> {
        let v: (Option<u64>, Option<u64>, Option<String>) = self
            .cmd(
                "reading the job's journal position",
                redis::cmd("MGET")
                    .arg(format!("{}journal_seq", self.p))
                    .arg(format!("{}target", self.p))
                    .arg(format!("{}keys_mode", self.p)),
            )
            .await?;
        Ok(Round {
            journal_seq: v.0,
            target: v.1,
            keys: v.2.as_deref() == Some("1"),
        })
    }

    async fn new_round(
        &self,
        spec: &Spec,
        bwlimit: Option<&str>,
        tps: Option<u32>,
        plan: &Plan,
    ) -> Result<bool> {
        // The keys go to a staging set first (gone by itself if this worker dies now); the
        // round's script makes it the round's set in the same step that makes the units.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let staging = format!("{}staging:{}-{nonce}", self.p, std::process::id());
        if let Some(keys) = &plan.keys {
            for chunk in keys.chunks(1000) {
                let mut c = redis::cmd("ZADD");
                c.arg(&staging);
                for k in chunk {
                    c.arg(0).arg(k);
                }
                let _: i64 = self.cmd("storing the round's keys", &c).await?;
            }
            let _: i64 = self
                .cmd(
                    "storing the round's keys",
                    redis::cmd("EXPIRE").arg(&staging).arg(3600),
                )
                .await?;
        }
        let mut args = vec![
            serde_json::to_string(spec)?,
            bwlimit.unwrap_or("").to_string(),
            tps.map(|t| t.to_string()).unwrap_or_default(),
            if spec.delete_dst { "1" } else { "0" }.to_string(),
            plan.target.to_string(),
            if plan.keys.is_some() { "1" } else { "0" }.to_string(),
            staging,
            super::new_incarnation(),
        ];
        args.extend(plan.cuts());
        let n: i64 = self
            .run("planning the job's round", &making(NEW_ROUND), args)
            .await?;
        Ok(n == 1)
    }

    async fn claim_planning(&self, spec: &Spec, ttl: Duration) -> Result<bool> {
        let n: i64 = self
            .run(
                "claiming the planning of a round",
                &script(CLAIM_PLANNING),
                vec![
                    serde_json::to_string(spec)?,
                    ttl.as_millis().to_string(),
                    super::new_incarnation(),
                ],
            )
            .await?;
        Ok(n == 1)
    }

    async fn keys_in(&self, lo: Option<&str>, hi: Option<&str>) -> Result<Vec<String>> {
        let min = lo.map_or("-".to_string(), |l| format!("[{l}"));
        let max = hi.map_or("+".to_string(), |h| format!("({h}"));
        self.cmd(
            "reading the round's keys",
            redis::cmd("ZRANGEBYLEX")
                .arg(format!("{}keys", self.p))
                .arg(min)
                .arg(max),
        )
        .await
    }
}
