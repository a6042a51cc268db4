//! A shared job in PostgreSQL: units claimed with `FOR UPDATE SKIP LOCKED`, leases on the
//! server's clock, every holder's write conditional on its token.

mod conn;

use super::record_json;
use super::{Board, Control, Finish, NewRound, Progress, Round, Saved, Spec, Unit, WorkerReport};
use crate::stats::Tally;
use anyhow::{Context, Result};
use async_trait::async_trait;
use conn::*;
pub use conn::{pg_error, session, PgBoard};
use std::time::Duration;

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
                    &[&self.job, &record_json(spec), &bwlimit, &tps.map(|t| t as i32), &super::new_incarnation()],
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
                Some(r) => Some(fs_core::record::decode::<Spec>(
                    r.get::<_, &str>(0).as_bytes(),
                )?),
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
                &[&self.job, &r.worker, &record_json(r)],
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

    async fn save(&self, id: i64, token: i64, p: &Progress<'_>) -> Result<Saved> {
        let (cursor, tally, deletes) = (p.cursor, p.tally, p.deletes);
        timed("saving progress", async {
            let mut c = self.client().await?;
            let tx = self.begin(&mut c).await?;
            let s = &self.s;
            let row = tx
                .query_opt(
                    &format!("UPDATE {s}.jfs_sync_units SET cursor = $4, tally = $5::text::jsonb
                              WHERE job = $1 AND id = $2 AND token = $3 AND state = 'running' RETURNING steal"),
                    &[&self.job, &id, &token, &cursor, &Tally::encode(tally)],
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
            let tally = f.tally.map(Tally::encode);
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
                    let mut w: WorkerReport =
                        fs_core::record::decode(r.get::<_, &str>(0).as_bytes()).ok()?;
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

    async fn new_round(&self, r: &NewRound<'_>) -> Result<bool> {
        self.new_round_in(r)
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
                &[&self.job, &record_json(spec), &super::new_incarnation()],
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
