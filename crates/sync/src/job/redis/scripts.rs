//! The Lua scripts that make each change of a job one atomic step in Redis: every write a
//! holder makes checks its token (`HOLDS`), and every script of a joined worker checks the
//! job's incarnation first (`GUARD`), so a job deleted meanwhile is never written back.

use redis::Script;

/// Lua: the server's time in milliseconds.
pub(super) const NOW: &str = "local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n";

/// Lua, first in every script: ARGV[1] is the job's key prefix, ARGV[2] the incarnation of
/// the job the caller joined ('' for calls that create a job). A job deleted (or deleted and
/// created again under its name) since fails every call of a worker that joined it, in the
/// same atomic step as the write it would have made: nothing is written back.
pub(super) const GUARD: &str = r#"
local P = ARGV[1]
if ARGV[2] ~= '' and redis.call('GET', P..'id') ~= ARGV[2] then
  return redis.error_reply('JFS_JOB_GONE the job was deleted')
end
"#;

/// Lua: make a round's units, pending, cut at ARGV[first..] (none: one unit for every key),
/// and the held deletion step when `delete`.
pub(super) const MAKE_UNITS: &str = r#"
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
pub(super) const CREATE: &str = r#"
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
pub(super) const BIND: &str = r#"
if redis.call('EXISTS', P..'spec') == 0 then return false end
redis.call('SET', P..'id', ARGV[3], 'NX')
return redis.call('GET', P..'id')
"#;

/// Units are claimed only while the job runs (not once it is paused, cancelled or over).
pub(super) const CLAIM: &str = r#"
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

pub(super) const RENEW: &str = r#"
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
pub(super) const HOLDS: &str = r#"
local id, token = ARGV[3], ARGV[4]
local u = P..'u:'..id
local v = redis.call('HMGET', u, 'token', 'state')
if v[1] ~= token or v[2] ~= 'running' then return 0 end
"#;

pub(super) const SAVE: &str = r#"
redis.call('HSET', u, 'cursor', ARGV[5], 'tally', ARGV[6])
for i = 7, #ARGV, 2 do redis.call('HSET', P..'deletes', ARGV[i], ARGV[i + 1]) end
if redis.call('HGET', u, 'steal') == '1' then return 2 end
return 1
"#;

pub(super) const FINISH: &str = r#"
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
pub(super) const SPLIT: &str = r#"
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

pub(super) const ASK_SPLIT: &str = r#"
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
pub(super) const NEW_ROUND: &str = r#"
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
pub(super) const CLAIM_PLANNING: &str = r#"
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
pub(super) const SET_STATE: &str = r#"
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
pub(super) const SET_LIMITS: &str = r#"
redis.call('DEL', P..'limits')
if ARGV[3] ~= '' then redis.call('HSET', P..'limits', 'bwlimit', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', P..'limits', 'tps', ARGV[4]) end
return 1
"#;

/// A worker's report (ARGV[4], a JSON object) under its name ARGV[3], stamped with the
/// server's time.
pub(super) const REPORT: &str = r#"
redis.call('HSET', P..'workers', ARGV[3], '{"seen_ms":'..now..','..string.sub(ARGV[4], 2))
return 1
"#;

pub(super) const RELEASE: &str = r#"
redis.call('HSET', u, 'state', 'pending')
redis.call('HDEL', u, 'owner')
redis.call('ZREM', P..'leases', id)
redis.call('ZADD', P..'pending', id, id)
return 1
"#;

pub(super) const RETRY: &str = r#"
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
pub(super) const TAKE: &str = r#"
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

pub(super) fn script(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{body}"))
}

/// A script that also checks the caller's hold on a unit (`HOLDS`).
pub(super) fn guarded(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{HOLDS}{body}"))
}

/// A script that makes units (`MAKE_UNITS`).
pub(super) fn making(body: &str) -> Script {
    Script::new(&format!("{NOW}{GUARD}{MAKE_UNITS}{body}"))
}
