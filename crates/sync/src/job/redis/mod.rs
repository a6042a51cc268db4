//! A shared job in Redis: one hash per unit, a sorted set of pending units and one of lease
//! deadlines (on the server's clock, `TIME`), and Lua scripts so that a claim, a save or a
//! finish is one atomic step that checks the holder's token. All keys share one hash tag,
//! `{jfs-sync:NAME}`, so the scripts touch one slot.

mod scripts;

use super::record_json;
use super::{Board, Control, Finish, NewRound, Progress, Round, Saved, Spec, Unit, WorkerReport};
use crate::stats::Tally;
use anyhow::{Context, Result};
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use scripts::*;
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
                .and_then(|t| Tally::decode(&t).ok())
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
                    record_json(spec),
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
        v.map(|s| {
            fs_core::record::decode::<Spec>(s.as_bytes()).context("the job's record is damaged")
        })
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
                vec![r.worker.clone(), record_json(r)],
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

    async fn save(&self, id: i64, token: i64, p: &Progress<'_>) -> Result<Saved> {
        let (cursor, tally, deletes) = (p.cursor, p.tally, p.deletes);
        let mut args = vec![
            id.to_string(),
            token.to_string(),
            cursor.to_string(),
            Tally::encode(tally),
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
            f.tally.map(Tally::encode).unwrap_or_default(),
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
                let mut w: WorkerReport = fs_core::record::decode_value(j.clone()).ok()?;
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

    async fn new_round(&self, r: &NewRound<'_>) -> Result<bool> {
        let (spec, bwlimit, tps, plan) = (r.spec, r.bwlimit, r.tps, r.plan);
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
            record_json(spec),
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
                    record_json(spec),
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
