//! A shared job in PostgreSQL: units claimed with `FOR UPDATE SKIP LOCKED`, leases on the
//! server's clock, every holder's write conditional on its token.

use super::{Board, Control, Finish, Plan, Round, Saved, Spec, Unit, WorkerReport};
use crate::stats::Summary;
use anyhow::{Context, Result};
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::time::Duration;
use tokio_postgres::NoTls;

pub struct PgBoard {
    pool: Pool,
    s: String,
    job: String,
    display: String,
    /// Where the password sent came from, for messages.
    password_from: String,
    /// The incarnation of the job this worker joined ("" before `bind`): every write holds
    /// the job's row with it (FOR KEY SHARE) in its transaction, so a `job delete` (which
    /// takes the row first) either waits for the write or the write sees the job gone.
    bound: std::sync::Mutex<String>,
}

/// Every call gives up after this long (a worker cut off from the database must notice).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ends a transaction whose client has said nothing for this long, freeing its locks.
const SERVER_IDLE_TX: Duration = Duration::from_secs(3);
/// A statement waiting this long for a lock fails (and is retried by the caller).
const SERVER_LOCK_WAIT: Duration = Duration::from_secs(5);
/// No statement of ours runs longer than this on the server.
const SERVER_STATEMENT: Duration = Duration::from_secs(8);

/// A unit's columns, from the units table named `u`.
const UNIT_COLS: &str = "u.id, u.kind, u.lo, u.hi, u.state, u.owner, u.token, \
     (EXTRACT(EPOCH FROM u.lease_until - clock_timestamp()) * 1000)::bigint, u.cursor, u.tally::text, \
     u.attempts, u.reassigned, u.dst_listed, u.error";

fn unit(r: &tokio_postgres::Row) -> Unit {
    let tally: Option<String> = r.get(9);
    Unit {
        id: r.get(0),
        kind: r.get(1),
        lo: r.get(2),
        hi: r.get(3),
        state: r.get(4),
        owner: r.get(5),
        token: r.get(6),
        lease_left_ms: r.get(7),
        cursor: r.get(8),
        tally: tally
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default(),
        attempts: r.get::<_, i32>(10) as i64,
        reassigned: r.get::<_, i32>(11) as i64,
        dst_listed: r.get(12),
        error: r.get(13),
    }
}

/// How every connection of a job is set up. The server must not wait on a worker that went
/// quiet: a transaction left open by a worker cut off mid-call would hold its row locks (the
/// job's bucket, a unit) and stall every other worker until the server noticed the dead
/// connection, hours later behind a proxy. Every call is short, so each is bounded on the
/// server's side too.
pub fn session(cfg: &mut tokio_postgres::Config) {
    cfg.connect_timeout(Duration::from_secs(5))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .tcp_user_timeout(Duration::from_secs(10))
        .application_name("jfs-sync");
    let mut options = cfg.get_options().unwrap_or_default().to_string();
    options.push_str(&format!(
        " -c idle_in_transaction_session_timeout={} -c lock_timeout={} -c statement_timeout={}",
        SERVER_IDLE_TX.as_millis(),
        SERVER_LOCK_WAIT.as_millis(),
        SERVER_STATEMENT.as_millis()
    ));
    cfg.options(options.trim());
}

impl PgBoard {
    pub async fn connect(
        mut cfg: tokio_postgres::Config,
        schema: &str,
        job: &str,
        display: String,
        password_from: &str,
    ) -> Result<Self> {
        session(&mut cfg);
        let mgr = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(8)
            .wait_timeout(Some(CALL_TIMEOUT))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .context("postgres pool")?;
        let b = PgBoard {
            pool,
            s: schema.to_string(),
            job: job.to_string(),
            display,
            password_from: password_from.to_string(),
            bound: Default::default(),
        };
        b.migrate().await.map_err(|e| {
            let e = flat(e);
            if e.to_string().starts_with("the job's PostgreSQL") {
                e
            } else {
                e.context(format!(
                    "the job's PostgreSQL {}: setting up its tables",
                    b.display
                ))
            }
        })?;
        Ok(b)
    }

    /// A round's units, pending, cut at `cuts` (none: one unit for every key), and the held
    /// deletion step when `delete`.
    async fn make_units(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        cuts: &[String],
        delete: bool,
    ) -> Result<()> {
        let s = &self.s;
        let mut los: Vec<Option<&str>> = vec![None];
        los.extend(cuts.iter().map(|c| Some(c.as_str())));
        let mut his: Vec<Option<&str>> = los[1..].to_vec();
        his.push(None);
        tx.execute(
            &format!("INSERT INTO {s}.jfs_sync_units (job, kind, lo, hi, state)
                      SELECT $1, 'copy', lo, hi, 'pending' FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS t(lo, hi, n) ORDER BY n"),
            &[&self.job, &los, &his],
        )
        .await?;
        if delete {
            tx.execute(
                &format!("INSERT INTO {s}.jfs_sync_units (job, kind, state) VALUES ($1, 'delete', 'held')"),
                &[&self.job],
            )
            .await?;
        }
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| {
            if auth_refused(&e) {
                anyhow::anyhow!(
                    "the job's PostgreSQL {}: it refused the password (authentication failed): check {}",
                    self.display,
                    self.password_from
                )
            } else {
                anyhow::anyhow!("the job's PostgreSQL {}: {}", self.display, pg_error(&e))
            }
        })
    }

    /// A transaction holding the job's row when this board is bound (see `bound`).
    async fn begin<'a>(
        &self,
        c: &'a mut deadpool_postgres::Object,
    ) -> Result<deadpool_postgres::Transaction<'a>> {
        let tx = c.transaction().await?;
        let inc = self.bound.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !inc.is_empty() {
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT 1 FROM {}.jfs_sync_jobs WHERE name = $1 AND incarnation = $2 FOR KEY SHARE",
                        self.s
                    ),
                    &[&self.job, &inc],
                )
                .await?;
            if row.is_none() {
                return Err(anyhow::Error::new(super::JobGone(self.display.clone())));
            }
        }
        Ok(tx)
    }

    async fn new_round_in(
        &self,
        spec: &Spec,
        bwlimit: Option<&str>,
        tps: Option<u32>,
        plan: &Plan,
    ) -> Result<bool> {
        let mut c = self.client().await?;
        let s = &self.s;
        let tx = c.transaction().await?;
        tx.execute(
            &format!("INSERT INTO {s}.jfs_sync_jobs (name, spec, state, bwlimit, tps, incarnation) VALUES ($1, $2, 'done', $3, $4, $5) ON CONFLICT DO NOTHING"),
            &[&self.job, &serde_json::to_string(spec)?, &bwlimit, &tps.map(|t| t as i32), &super::new_incarnation()],
        )
        .await?;
        let state: String = tx
            .query_one(
                &format!("SELECT state FROM {s}.jfs_sync_jobs WHERE name = $1 FOR UPDATE"),
                &[&self.job],
            )
            .await?
            .get(0);
        if state != "done" {
            return Ok(false);
        }
        // The first round: the limits of the command that planned it.
        tx.execute(
            &format!("UPDATE {s}.jfs_sync_jobs SET bwlimit = $2, tps = $3 WHERE name = $1 AND target IS NULL"),
            &[&self.job, &bwlimit, &tps.map(|t| t as i32)],
        )
        .await?;
        for t in ["jfs_sync_keys", "jfs_sync_units", "jfs_sync_deletes"] {
            tx.execute(&format!("DELETE FROM {s}.{t} WHERE job = $1"), &[&self.job])
                .await?;
        }
        if let Some(keys) = &plan.keys {
            for chunk in keys.chunks(10_000) {
                tx.execute(
                    &format!("INSERT INTO {s}.jfs_sync_keys (job, key) SELECT $1, k FROM unnest($2::text[]) AS t(k) ON CONFLICT DO NOTHING"),
                    &[&self.job, &chunk],
                )
                .await?;
            }
        }
        self.make_units(&tx, &plan.cuts(), spec.delete_dst).await?;
        tx.execute(
            &format!("UPDATE {s}.jfs_sync_jobs SET state = 'running', target = $2, keys_mode = $3, planning_until = NULL,
                        created = clock_timestamp(), finished = NULL, incarnation = COALESCE(incarnation, $4) WHERE name = $1"),
            &[&self.job, &(plan.target as i64), &plan.keys.is_some(), &super::new_incarnation()],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn migrate(&self) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Workers starting together: one creates the tables, the others wait for it.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('jfs_sync_schema'))",
            &[],
        )
        .await?;
        let s = &self.s;
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {s}.jfs_sync_jobs (name text PRIMARY KEY, spec text NOT NULL,
               state text NOT NULL, bwlimit text, tps int, created timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE IF NOT EXISTS {s}.jfs_sync_units (job text NOT NULL, id bigserial, kind text NOT NULL,
               lo text, hi text, state text NOT NULL, owner text, token bigint NOT NULL DEFAULT 0,
               lease_until timestamptz, cursor text, tally jsonb, attempts int NOT NULL DEFAULT 0,
               reassigned int NOT NULL DEFAULT 0, dst_listed bigint NOT NULL DEFAULT 0, error text,
               PRIMARY KEY (job, id));
             CREATE TABLE IF NOT EXISTS {s}.jfs_sync_workers (job text NOT NULL, worker text NOT NULL,
               seen timestamptz NOT NULL, report text NOT NULL, PRIMARY KEY (job, worker));
             CREATE TABLE IF NOT EXISTS {s}.jfs_sync_deletes (job text NOT NULL, key text NOT NULL,
               is_dir bool NOT NULL, PRIMARY KEY (job, key));
             CREATE TABLE IF NOT EXISTS {s}.jfs_sync_buckets (job text NOT NULL, what text NOT NULL,
               tokens double precision NOT NULL, at timestamptz NOT NULL, PRIMARY KEY (job, what));
             CREATE TABLE IF NOT EXISTS {s}.jfs_sync_keys (job text NOT NULL, key text COLLATE \"C\" NOT NULL,
               PRIMARY KEY (job, key));"
        ))
        .await?;
        // Columns added since the first version of these tables. ALTER TABLE locks the whole
        // table even when the column exists (and would deadlock with a running job), so it
        // runs only when one is missing.
        let have: i64 = tx
            .query_one(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1
                   AND (table_name, column_name) IN (('jfs_sync_units', 'steal'), ('jfs_sync_jobs', 'journal_seq'),
                        ('jfs_sync_jobs', 'target'), ('jfs_sync_jobs', 'keys_mode'), ('jfs_sync_jobs', 'planning_until'),
                        ('jfs_sync_jobs', 'incarnation'), ('jfs_sync_jobs', 'finished'))",
                &[&s.trim_matches('"')],
            )
            .await?
            .get(0);
        if have < 7 {
            tx.batch_execute(&format!(
                "ALTER TABLE {s}.jfs_sync_units ADD COLUMN IF NOT EXISTS steal int NOT NULL DEFAULT 0;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS journal_seq bigint;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS target bigint;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS keys_mode bool NOT NULL DEFAULT false;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS planning_until timestamptz;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS incarnation text;
                 ALTER TABLE {s}.jfs_sync_jobs ADD COLUMN IF NOT EXISTS finished timestamptz;"
            ))
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// A PostgreSQL error in one line: the server's own message (with its code, detail and
/// hint) when the server answered, else the error and its causes, each said once.
/// tokio-postgres prints "db error" plus its cause in its own text and gives the cause as a
/// source too, so a chain printed whole (`{:#}`) would say it twice.
pub fn pg_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(db) = err
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|p| p.as_db_error())
            .or_else(|| err.downcast_ref::<tokio_postgres::error::DbError>())
        {
            let mut m = format!("PostgreSQL: {} ({})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                m.push_str(&format!("; {d}"));
            }
            if let Some(h) = db.hint() {
                m.push_str(&format!("; hint: {h}"));
            }
            return m;
        }
        cur = err.source();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    // deadpool's wording of "the connection could not be made".
    parts
        .join(": ")
        .replace("Error occurred while creating a new object: ", "")
}

/// Did the server refuse the password?
fn auth_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(db) = err
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|p| p.as_db_error())
        {
            return db.code().code() == "28P01";
        }
        cur = err.source();
    }
    false
}

/// An error of this module with PostgreSQL's own errors said once (see `pg_error`).
fn flat(e: anyhow::Error) -> anyhow::Error {
    if e.chain().any(|c| c.is::<super::JobGone>()) {
        return e;
    }
    let has_pg = e
        .chain()
        .any(|c| c.is::<tokio_postgres::Error>() || c.is::<deadpool_postgres::PoolError>());
    if !has_pg {
        return e;
    }
    let mut outer: Vec<String> = Vec::new();
    for c in e.chain() {
        if c.is::<tokio_postgres::Error>() || c.is::<deadpool_postgres::PoolError>() {
            outer.push(pg_error(c));
            break;
        }
        outer.push(c.to_string());
    }
    anyhow::anyhow!(outer.join(": "))
}

async fn timed<T>(what: &str, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(flat).with_context(|| what.to_string()),
        Err(_) => {
            anyhow::bail!("{what}: no answer from the job's database within {CALL_TIMEOUT:?}")
        }
    }
}

#[async_trait]
impl Board for PgBoard {
    async fn create(&self, spec: &Spec, bwlimit: Option<&str>, tps: Option<u32>) -> Result<bool> {
        timed("creating the job", async {
            let mut c = self.client().await?;
            let tx = c.transaction().await?;
            let s = &self.s;
            let n = tx
                .execute(
                    &format!("INSERT INTO {s}.jfs_sync_jobs (name, spec, state, bwlimit, tps, incarnation) VALUES ($1, $2, 'running', $3, $4, $5) ON CONFLICT DO NOTHING"),
                    &[&self.job, &serde_json::to_string(spec)?, &bwlimit, &tps.map(|t| t as i32), &super::new_incarnation()],
                )
                .await?;
            if n == 0 {
                return Ok(false);
            }
            self.make_units(&tx, &[], spec.delete_dst).await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn spec(&self) -> Result<Option<Spec>> {
        timed("reading the job", async {
            let c = self.client().await?;
            let row = c
                .query_opt(
                    &format!("SELECT spec FROM {}.jfs_sync_jobs WHERE name = $1", self.s),
                    &[&self.job],
                )
                .await?;
            Ok(match row {
                Some(r) => Some(serde_json::from_str(r.get::<_, &str>(0))?),
                None => None,
            })
        })
        .await
    }

    async fn control(&self) -> Result<Control> {
        timed("reading the job's state", async {
            let c = self.client().await?;
            let r = c
                .query_opt(
                    &format!("SELECT state, bwlimit, tps, EXTRACT(EPOCH FROM clock_timestamp() - created)::float8,
                                     GREATEST(EXTRACT(EPOCH FROM COALESCE(finished, clock_timestamp()) - created)::float8, 0)
                              FROM {}.jfs_sync_jobs WHERE name = $1", self.s),
                    &[&self.job],
                )
                .await?
                .ok_or_else(|| anyhow::Error::new(super::JobGone(self.display.clone())))?;
            Ok(Control {
                state: r.get(0),
                bwlimit: r.get(1),
                tps: r.get::<_, Option<i32>>(2).map(|t| t as u32),
                age_s: r.get(3),
                elapsed_s: r.get(4),
            })
        })
        .await
    }

    fn display(&self) -> String {
        self.display.clone()
    }

    async fn bind(&self) -> Result<String> {
        timed("joining the job", async {
            let c = self.client().await?;
            let row = c
                .query_opt(
                    &format!(
                        "UPDATE {}.jfs_sync_jobs SET incarnation = COALESCE(incarnation, $2) WHERE name = $1 RETURNING incarnation",
                        self.s
                    ),
                    &[&self.job, &super::new_incarnation()],
                )
                .await?
                .ok_or_else(|| anyhow::Error::new(super::JobGone(self.display.clone())))?;
            let inc: String = row.get(0);
            *self.bound.lock().unwrap_or_else(|p| p.into_inner()) = inc.clone();
            Ok(inc)
        })
        .await
    }

    async fn set_state(&self, state: &str, from: Option<&str>) -> Result<bool> {
        timed("changing the job's state", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let n = tx
                .execute(
                    &format!(
                        "UPDATE {}.jfs_sync_jobs SET state = $2,
                           journal_seq = CASE WHEN $2 = 'done' THEN COALESCE(target, journal_seq) ELSE journal_seq END,
                           finished = CASE WHEN $2 IN ('done', 'failed', 'cancelled') THEN clock_timestamp() ELSE NULL END
                         WHERE name = $1 AND ($3::text IS NULL OR state = $3)",
                        self.s
                    ),
                    &[&self.job, &state, &from],
                )
                .await?;
            if n == 0 {
                let exists = tx
                    .query_opt(
                        &format!("SELECT 1 FROM {}.jfs_sync_jobs WHERE name = $1", self.s),
                        &[&self.job],
                    )
                    .await?;
                if exists.is_none() {
                    return Err(anyhow::Error::new(super::JobGone(self.display.clone())));
                }
            }
            tx.commit().await?;
            Ok(n == 1)
        })
        .await
    }

    async fn set_limits(&self, bwlimit: Option<&str>, tps: Option<u32>) -> Result<()> {
        timed("changing the job's limits", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            tx.execute(
                &format!(
                    "UPDATE {}.jfs_sync_jobs SET bwlimit = $2, tps = $3 WHERE name = $1",
                    self.s
                ),
                &[&self.job, &bwlimit, &tps.map(|t| t as i32)],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn report(&self, r: &WorkerReport) -> Result<()> {
        timed("reporting to the job", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            tx.execute(
                &format!("INSERT INTO {}.jfs_sync_workers (job, worker, seen, report) VALUES ($1, $2, clock_timestamp(), $3)
                          ON CONFLICT (job, worker) DO UPDATE SET seen = excluded.seen, report = excluded.report", self.s),
                &[&self.job, &r.worker, &serde_json::to_string(r)?],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn claim(&self, worker: &str, lease_ms: u64, max_attempts: u32) -> Result<Option<Unit>> {
        timed("claiming a unit", async {
            let mut c = self.client().await?;
            let c = self.begin(&mut c).await?;
            let s = &self.s;
            let lease = lease_ms as f64;
            let max = max_attempts as i32;
            // Units whose holders kept losing them are given up on, with the reason.
            c.execute(
                &format!("UPDATE {s}.jfs_sync_units SET state = 'failed', owner = NULL,
                            error = 'claimed ' || attempts || ' times and never finished: the workers holding it stopped answering'
                          WHERE job = $1 AND state = 'running' AND lease_until < clock_timestamp() AND attempts >= $2"),
                &[&self.job, &max],
            )
            .await?;
            let row = c
                .query_opt(
                    &format!(
                        "WITH c AS (
                           SELECT id, state AS was FROM {s}.jfs_sync_units
                            WHERE job = $1 AND (state = 'pending' OR (state = 'running' AND lease_until < clock_timestamp()))
                              AND EXISTS (SELECT 1 FROM {s}.jfs_sync_jobs WHERE name = $1 AND state = 'running')
                            ORDER BY state = 'running' DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                         UPDATE {s}.jfs_sync_units u SET state = 'running', owner = $2, token = token + 1,
                                attempts = attempts + 1, reassigned = reassigned + (c.was = 'running')::int,
                                lease_until = clock_timestamp() + $3 * interval '1 millisecond'
                           FROM c WHERE u.job = $1 AND u.id = c.id
                         RETURNING {UNIT_COLS}"
                    ),
                    &[&self.job, &worker, &lease],
                )
                .await?;
            c.commit().await?;
            Ok(row.as_ref().map(unit))
        })
        .await
    }

    async fn renew(&self, worker: &str, held: &[(i64, i64)], lease_ms: u64) -> Result<Vec<i64>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        timed("renewing leases", async {
            let mut c = self.client().await?;
            let c = self.begin(&mut c).await?;
            let ids: Vec<i64> = held.iter().map(|h| h.0).collect();
            let tokens: Vec<i64> = held.iter().map(|h| h.1).collect();
            let rows = c
                .query(
                    &format!(
                        "UPDATE {}.jfs_sync_units SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
                          WHERE job = $1 AND owner = $2 AND state = 'running'
                            AND (id, token) IN (SELECT * FROM unnest($4::bigint[], $5::bigint[]))
                          RETURNING id",
                        self.s
                    ),
                    &[&self.job, &worker, &(lease_ms as f64), &ids, &tokens],
                )
                .await?;
            c.commit().await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    async fn save(
        &self,
        id: i64,
        token: i64,
        cursor: &str,
        tally: &Summary,
        deletes: &[(String, bool)],
    ) -> Result<Saved> {
        timed("saving progress", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let s = &self.s;
            let row = tx
                .query_opt(
                    &format!("UPDATE {s}.jfs_sync_units SET cursor = $4, tally = $5::text::jsonb
                              WHERE job = $1 AND id = $2 AND token = $3 AND state = 'running' RETURNING steal"),
                    &[&self.job, &id, &token, &cursor, &serde_json::to_string(tally)?],
                )
                .await?;
            let Some(row) = row else {
                return Ok(Saved::Refused);
            };
            let saved = if row.get::<_, i32>(0) == 1 {
                Saved::ShareWanted
            } else {
                Saved::Kept
            };
            if !deletes.is_empty() {
                let keys: Vec<&str> = deletes.iter().map(|d| d.0.as_str()).collect();
                let dirs: Vec<bool> = deletes.iter().map(|d| d.1).collect();
                tx.execute(
                    &format!("INSERT INTO {s}.jfs_sync_deletes (job, key, is_dir)
                              SELECT $1, k, d FROM unnest($2::text[], $3::bool[]) AS t(k, d) ON CONFLICT DO NOTHING"),
                    &[&self.job, &keys, &dirs],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(saved)
        })
        .await
    }

    async fn finish(&self, id: i64, token: i64, f: &Finish<'_>) -> Result<bool> {
        timed("recording the end of a unit", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let s = &self.s;
            let tally = f.tally.map(serde_json::to_string).transpose()?;
            let row = tx
                .query_opt(
                    &format!("UPDATE {s}.jfs_sync_units SET state = $4, owner = NULL, lease_until = NULL,
                                     dst_listed = $5, error = $6, tally = COALESCE($7::text::jsonb, tally)
                              WHERE job = $1 AND id = $2 AND token = $3 AND state = 'running' RETURNING kind"),
                    &[&self.job, &id, &token, &f.state, &(f.dst_listed as i64), &f.error, &tally],
                )
                .await?;
            let Some(row) = row else { return Ok(false) };
            if row.get::<_, &str>(0) == "copy" && f.state == "done" {
                // The deletion step may start once every range is done. Ranges finishing at
                // once would each see the other still running (and leave the step held for
                // good): they take the job's row in turn, so the last one sees them all done.
                tx.execute(
                    &format!("SELECT 1 FROM {s}.jfs_sync_jobs WHERE name = $1 FOR NO KEY UPDATE"),
                    &[&self.job],
                )
                .await?;
                tx.execute(
                    &format!("UPDATE {s}.jfs_sync_units SET state = 'pending' WHERE job = $1 AND kind = 'delete' AND state = 'held'
                                AND NOT EXISTS (SELECT 1 FROM {s}.jfs_sync_units WHERE job = $1 AND kind = 'copy' AND state <> 'done')"),
                    &[&self.job],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn split(&self, id: i64, token: i64, cuts: &[String]) -> Result<bool> {
        timed("splitting a unit", async {
            let mut c = self.client().await?;
            let s = &self.s;
            let tx = self.begin(&mut c).await?;
            if cuts.is_empty() {
                let n = tx
                    .execute(
                        &format!("UPDATE {s}.jfs_sync_units SET steal = 2
                                  WHERE job = $1 AND id = $2 AND token = $3 AND state = 'running'"),
                        &[&self.job, &id, &token],
                    )
                    .await?;
                tx.commit().await?;
                return Ok(n == 1);
            }
            // Keys compare byte by byte (COLLATE "C"), as everywhere else in a job.
            let row = tx
                .query_opt(
                    &format!("SELECT hi FROM {s}.jfs_sync_units WHERE job = $1 AND id = $2 AND token = $3
                                AND state = 'running' AND (cursor IS NULL OR cursor < $4 COLLATE \"C\") FOR UPDATE"),
                    &[&self.job, &id, &token, &cuts[0]],
                )
                .await?;
            let Some(row) = row else { return Ok(false) };
            let hi: Option<String> = row.get(0);
            tx.execute(
                &format!("UPDATE {s}.jfs_sync_units SET hi = $3, steal = 0 WHERE job = $1 AND id = $2"),
                &[&self.job, &id, &cuts[0]],
            )
            .await?;
            let his: Vec<Option<String>> = (0..cuts.len())
                .map(|i| cuts.get(i + 1).cloned().or(hi.clone()))
                .collect();
            tx.execute(
                &format!("INSERT INTO {s}.jfs_sync_units (job, kind, lo, hi, state)
                          SELECT $1, 'copy', lo, hi, 'pending' FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS t(lo, hi, n) ORDER BY n"),
                &[&self.job, &cuts, &his],
            )
            .await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn ask_split(&self, n: usize) -> Result<usize> {
        timed("asking for a share of a range", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let s = &self.s;
            let asked = tx
                .execute(
                    &format!(
                        "UPDATE {s}.jfs_sync_units SET steal = 1 WHERE job = $1 AND id IN
                               (SELECT id FROM {s}.jfs_sync_units WHERE job = $1 AND kind = 'copy'
                                  AND state = 'running' AND steal = 0 ORDER BY id LIMIT $2)"
                    ),
                    &[&self.job, &(n as i64)],
                )
                .await?;
            tx.commit().await?;
            Ok(asked as usize)
        })
        .await
    }

    async fn release(&self, id: i64, token: i64) -> Result<bool> {
        timed("giving a unit back", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let n = tx
                .execute(
                    &format!("UPDATE {}.jfs_sync_units SET state = 'pending', owner = NULL, lease_until = NULL
                              WHERE job = $1 AND id = $2 AND token = $3 AND state = 'running'", self.s),
                    &[&self.job, &id, &token],
                )
                .await?;
            tx.commit().await?;
            Ok(n == 1)
        })
        .await
    }

    async fn retry_failed(&self) -> Result<u64> {
        timed("retrying failed units", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let s = &self.s;
            let n = tx
                .execute(
                    &format!("UPDATE {s}.jfs_sync_units SET state = 'pending', error = NULL, attempts = 0
                              WHERE job = $1 AND kind = 'copy' AND state = 'failed'"),
                    &[&self.job],
                )
                .await?;
            let all_done = n == 0;
            tx.execute(
                &format!("UPDATE {s}.jfs_sync_units SET state = $2, error = NULL, attempts = 0
                          WHERE job = $1 AND kind = 'delete' AND state = 'failed'"),
                &[&self.job, &if all_done { "pending" } else { "held" }],
            )
            .await?;
            tx.execute(&format!("UPDATE {s}.jfs_sync_jobs SET state = 'running', finished = NULL WHERE name = $1"), &[&self.job])
                .await?;
            tx.commit().await?;
            Ok(n)
        })
        .await
    }

    async fn units(&self) -> Result<Vec<Unit>> {
        timed("reading the units", async {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT {UNIT_COLS} FROM {}.jfs_sync_units u WHERE job = $1 ORDER BY id",
                        self.s
                    ),
                    &[&self.job],
                )
                .await?;
            Ok(rows.iter().map(unit).collect())
        })
        .await
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>> {
        timed("reading the workers", async {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!("SELECT report, (EXTRACT(EPOCH FROM clock_timestamp() - seen) * 1000)::bigint
                              FROM {}.jfs_sync_workers WHERE job = $1 ORDER BY worker", self.s),
                    &[&self.job],
                )
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let mut w: WorkerReport = serde_json::from_str(r.get::<_, &str>(0)).ok()?;
                    w.age_ms = r.get(1);
                    Some(w)
                })
                .collect())
        })
        .await
    }

    async fn deletes(&self) -> Result<Vec<(String, bool)>> {
        timed("reading the deletes", async {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT key, is_dir FROM {}.jfs_sync_deletes WHERE job = $1",
                        self.s
                    ),
                    &[&self.job],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }

    async fn take(&self, what: &str, rate: u64, n: u64) -> Result<Option<Duration>> {
        timed("drawing from the job's limit", async {
            let mut c = self.client().await?;
            let c = self.begin(&mut c).await?;
            let s = &self.s;
            let (rate, n) = (rate as f64, n as f64);
            let burst = rate / 20.0;
            // One statement, so no lock is held across a round trip to this worker. A bucket
            // may run into debt: a grant larger than the burst is not starved, and the debt
            // is paid before the next one.
            let draw = format!(
                "WITH cur AS (SELECT LEAST(tokens + GREATEST(EXTRACT(EPOCH FROM clock_timestamp() - at)::float8, 0) * $3, $4) AS t
                              FROM {s}.jfs_sync_buckets WHERE job = $1 AND what = $2 FOR UPDATE)
                 UPDATE {s}.jfs_sync_buckets b SET tokens = CASE WHEN cur.t > 0 THEN cur.t - $5 ELSE cur.t END,
                        at = clock_timestamp()
                 FROM cur WHERE b.job = $1 AND b.what = $2 RETURNING cur.t"
            );
            let args: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&self.job, &what, &rate, &burst, &n];
            let mut row = c.query_opt(&draw, &args).await?;
            if row.is_none() {
                c.execute(
                    &format!("INSERT INTO {s}.jfs_sync_buckets (job, what, tokens, at) VALUES ($1, $2, $3, clock_timestamp())
                              ON CONFLICT DO NOTHING"),
                    &[&self.job, &what, &burst],
                )
                .await?;
                row = c.query_opt(&draw, &args).await?;
            }
            let t: f64 = row.context("the job's bucket vanished (was the job deleted?)")?.get(0);
            c.commit().await?;
            Ok(if t > 0.0 {
                None
            } else {
                Some(Duration::from_secs_f64((-t / rate).clamp(0.001, 1.0)))
            })
        })
        .await
    }

    async fn remove(&self) -> Result<()> {
        timed("removing the job", async {
            let mut c = self.client().await?;
            let tx = c.transaction().await?;
            // The job's row first: a worker's write holds it (FOR KEY SHARE) for its whole
            // transaction, so it ends before this starts, or finds the job gone.
            tx.execute(
                &format!(
                    "SELECT 1 FROM {}.jfs_sync_jobs WHERE name = $1 FOR UPDATE",
                    self.s
                ),
                &[&self.job],
            )
            .await?;
            for t in [
                "jfs_sync_keys",
                "jfs_sync_units",
                "jfs_sync_workers",
                "jfs_sync_deletes",
                "jfs_sync_buckets",
            ] {
                tx.execute(
                    &format!("DELETE FROM {}.{t} WHERE job = $1", self.s),
                    &[&self.job],
                )
                .await?;
            }
            tx.execute(
                &format!("DELETE FROM {}.jfs_sync_jobs WHERE name = $1", self.s),
                &[&self.job],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn round(&self) -> Result<Round> {
        timed("reading the job's journal position", async {
            let c = self.client().await?;
            let row = c
                .query_opt(
                    &format!("SELECT journal_seq, target, keys_mode FROM {}.jfs_sync_jobs WHERE name = $1", self.s),
                    &[&self.job],
                )
                .await?;
            Ok(row.map_or_else(Round::default, |r| Round {
                journal_seq: r.get::<_, Option<i64>>(0).map(|v| v as u64),
                target: r.get::<_, Option<i64>>(1).map(|v| v as u64),
                keys: r.get(2),
            }))
        })
        .await
    }

    async fn new_round(
        &self,
        spec: &Spec,
        bwlimit: Option<&str>,
        tps: Option<u32>,
        plan: &Plan,
    ) -> Result<bool> {
        self.new_round_in(spec, bwlimit, tps, plan)
            .await
            .map_err(flat)
            .context("planning the job's round")
    }

    async fn claim_planning(&self, spec: &Spec, ttl: Duration) -> Result<bool> {
        timed("claiming the planning of a round", async {
            let c = self.client().await?;
            let s = &self.s;
            c.execute(
                &format!("INSERT INTO {s}.jfs_sync_jobs (name, spec, state, incarnation, finished) VALUES ($1, $2, 'done', $3, clock_timestamp()) ON CONFLICT DO NOTHING"),
                &[&self.job, &serde_json::to_string(spec)?, &super::new_incarnation()],
            )
            .await?;
            let n = c
                .execute(
                    &format!("UPDATE {s}.jfs_sync_jobs SET planning_until = clock_timestamp() + $2 * interval '1 millisecond'
                              WHERE name = $1 AND state = 'done' AND (planning_until IS NULL OR planning_until < clock_timestamp())"),
                    &[&self.job, &(ttl.as_millis() as f64)],
                )
                .await?;
            Ok(n == 1)
        })
        .await
    }

    async fn keys_in(&self, lo: Option<&str>, hi: Option<&str>) -> Result<Vec<String>> {
        timed("reading the round's keys", async {
            let c = self.client().await?;
            let rows = c
                .query(
                    &format!("SELECT key FROM {}.jfs_sync_keys WHERE job = $1 AND ($2::text IS NULL OR key >= $2)
                                AND ($3::text IS NULL OR key < $3) ORDER BY key", self.s),
                    &[&self.job, &lo, &hi],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }
}
