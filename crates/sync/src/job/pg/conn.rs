//! The PostgreSQL side of a job board: the connection pool and session settings, the
//! schema and its migrations, the error messages, and the call timeout.

use super::super::record_json;
use super::super::{NewRound, Unit};
use crate::stats::Tally;
use anyhow::{Context, Result};
use deadpool_postgres::Pool;
use std::time::Duration;

pub struct PgBoard {
    pub(super) pool: Pool,
    pub(super) s: String,
    pub(super) job: String,
    pub(super) display: String,
    /// Where the password sent came from, for messages.
    pub(super) password_from: String,
    /// The incarnation of the job this worker joined ("" before `bind`): every write holds
    /// the job's row with it (FOR KEY SHARE) in its transaction, so a `job delete` (which
    /// takes the row first) either waits for the write or the write sees the job gone.
    pub(super) bound: std::sync::Mutex<String>,
}

/// Every call gives up after this long (a worker cut off from the database must notice).
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ends a transaction whose client has said nothing for this long, freeing its locks.
pub(super) const SERVER_IDLE_TX: Duration = Duration::from_secs(3);
/// A statement waiting this long for a lock fails (and is retried by the caller).
pub(super) const SERVER_LOCK_WAIT: Duration = Duration::from_secs(5);
/// No statement of ours runs longer than this on the server.
pub(super) const SERVER_STATEMENT: Duration = Duration::from_secs(8);

/// A unit's columns, from the units table named `u`.
pub(super) const UNIT_COLS: &str = "u.id, u.kind, u.lo, u.hi, u.state, u.owner, u.token, \
     (EXTRACT(EPOCH FROM u.lease_until - clock_timestamp()) * 1000)::bigint, u.cursor, u.tally::text, \
     u.attempts, u.reassigned, u.dst_listed, u.error";

pub(super) fn unit(r: &tokio_postgres::Row) -> Unit {
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
            .and_then(|t| Tally::decode(&t).ok())
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
        let pool = meta::pg_pool_builder(cfg, 8)
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
    pub(super) async fn make_units(
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

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
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
    pub(super) async fn begin<'a>(
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
                return Err(anyhow::Error::new(super::super::JobGone(
                    self.display.clone(),
                )));
            }
        }
        Ok(tx)
    }

    pub(super) async fn new_round_in(&self, r: &NewRound<'_>) -> Result<bool> {
        let (spec, bwlimit, tps, plan) = (r.spec, r.bwlimit, r.tps, r.plan);
        let mut c = self.client().await?;
        let s = &self.s;
        let tx = c.transaction().await?;
        tx.execute(
            &format!("INSERT INTO {s}.jfs_sync_jobs (name, spec, state, bwlimit, tps, incarnation) VALUES ($1, $2, 'done', $3, $4, $5) ON CONFLICT DO NOTHING"),
            &[&self.job, &record_json(spec), &bwlimit, &tps.map(|t| t as i32), &super::super::new_incarnation()],
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
            &[&self.job, &(plan.target as i64), &plan.keys.is_some(), &super::super::new_incarnation()],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    pub(super) async fn migrate(&self) -> Result<()> {
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
pub(super) fn auth_refused(e: &(dyn std::error::Error + 'static)) -> bool {
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
pub(super) fn flat(e: anyhow::Error) -> anyhow::Error {
    if e.chain().any(|c| c.is::<super::super::JobGone>()) {
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

pub(super) async fn timed<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(flat).with_context(|| what.to_string()),
        Err(_) => {
            anyhow::bail!("{what}: no answer from the job's database within {CALL_TIMEOUT:?}")
        }
    }
}
