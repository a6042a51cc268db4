//! The PostgreSQL engine: tables `jfs_kv(k bytea primary key, v bytea)`,
//! `jfs_journal(seq bigint primary key, frame bytea)` and `jfs_head(id, seq)`, in the schema
//! named by the URL (`?schema=`, default `public`).
//!
//! Commit section: inside one transaction, `SELECT seq FROM jfs_head ... FOR UPDATE` takes the
//! row lock that orders all commits; under it the read-set is validated, the entry is built for
//! `seq + 1`, the write-set, the journal row and the new head are written, and `pg_notify`
//! wakes readers (delivered at commit). A `bigserial` would not do: its values are handed out
//! at insert time, not in commit order, so a reader could skip an entry committed late.

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use fs_core::engine::{CommitOutcome, Engine, Follow, Followed, JournalBounds, KvPair, Values};
use fs_core::error::{Error, ErrorKind, Result};
use fs_core::journal::{CommitRequest, Entry, Mutation};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

/// The commit section's lock on the head row, with the mirror marker read in the same
/// statement (writers are refused on a mirror's metadata, replay anywhere else).
const HEAD_AND_MARKER: &str = "SELECT h.seq, (SELECT a.v FROM jfs_aux a WHERE a.name = $1) FROM jfs_head h WHERE h.id = 1 FOR UPDATE OF h";

pub struct PgEngine {
    pool: Pool,
    display: String,
    channel: String,
    notified: watch::Receiver<u64>,
    _listener: tokio::task::JoinHandle<()>,
}

pub(crate) fn map_err(e: tokio_postgres::Error, what: &str) -> Error {
    use tokio_postgres::error::SqlState;
    if let Some(code) = e.code() {
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "postgres {what}: authentication failed (check the user and JFS_META_PASSWORD)"
                ),
            );
        }
        if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return Error::temporary(ErrorKind::Backend, format!("postgres {what}: {e}"));
        }
        if *code == SqlState::DISK_FULL {
            return Error::new(
                ErrorKind::NoSpace,
                format!("postgres {what}: disk full: {e}"),
            );
        }
    }
    let msg = match e.as_db_error() {
        Some(db) => format!("postgres {what}: {}", db.message()),
        None => format!("postgres {what}: {e}"),
    };
    if e.is_closed() || e.as_db_error().is_none() {
        Error::temporary(ErrorKind::Backend, msg)
    } else {
        Error::new(ErrorKind::Backend, msg)
    }
}

fn pool_err(e: deadpool_postgres::PoolError, what: &str) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => map_err(e, what),
        other => Error::temporary(ErrorKind::Backend, format!("postgres {what}: {other}")),
    }
}

impl PgEngine {
    /// Replay and installs: take the commit section's lock on the head row and check the
    /// mirror marker in the same statement (refused, and rolled back, without it). The head.
    async fn lock_head_of_mirror(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<u64> {
        let row = tx
            .query_one(HEAD_AND_MARKER, &[&fs_core::site::MARKER])
            .await
            .map_err(|e| map_err(e, "locking head"))?;
        if row.get::<_, Option<Vec<u8>>>(1).is_none() {
            return Err(fs_core::site::replay_refused(&self.display));
        }
        Ok(row.get::<_, i64>(0) as u64)
    }

    pub async fn connect(
        cfg: tokio_postgres::Config,
        schema: &str,
        display: String,
    ) -> Result<Self> {
        let mut cfg = cfg;
        cfg.connect_timeout(Duration::from_secs(5));
        // Generic plans: every statement here reads or writes by primary key, so one plan
        // per prepared statement serves every call. Left to choose, the server plans each
        // of the first calls of a connection's statements anew and may go on doing so (a
        // lookup statement planned for 0.2-0.5 ms to run for 0.1 ms).
        cfg.options(format!(
            "-c search_path={schema} -c plan_cache_mode=force_generic_plan"
        ));
        // Fail fast with a clear message (and prove the credentials) before building the pool.
        let (client, mut connection) =
            tokio::time::timeout(Duration::from_secs(10), cfg.connect(NoTls))
                .await
                .map_err(|_| {
                    Error::temporary(
                        ErrorKind::Backend,
                        format!("{display}: no answer within 10 s: is PostgreSQL running there?"),
                    )
                })?
                .map_err(|e| map_err(e, &format!("connecting to {display}")))?;
        let channel = format!("jfs_journal_{schema}");
        let (tx, notified) = watch::channel(0u64);
        let listener = tokio::spawn(async move {
            let mut msgs = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(m)) = msgs.next().await {
                if let AsyncMessage::Notification(n) = m {
                    if let Ok(seq) = n.payload().parse::<u64>() {
                        tx.send_if_modified(|cur| {
                            let changed = seq > *cur;
                            *cur = (*cur).max(seq);
                            changed
                        });
                    }
                }
            }
        });
        let setup = format!(
            "SELECT pg_advisory_xact_lock(hashtext('jfs-setup-{schema}'));
             CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.jfs_kv (k bytea PRIMARY KEY, v bytea NOT NULL);
             CREATE TABLE IF NOT EXISTS {schema}.jfs_journal (seq bigint PRIMARY KEY, frame bytea NOT NULL);
             CREATE TABLE IF NOT EXISTS {schema}.jfs_head (id int PRIMARY KEY, seq bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS {schema}.jfs_aux (name text PRIMARY KEY, v bytea NOT NULL);
             INSERT INTO {schema}.jfs_head VALUES (1, 0) ON CONFLICT DO NOTHING;"
        );
        client
            .batch_execute(&format!("BEGIN; {setup} COMMIT;"))
            .await
            .map_err(|e| map_err(e, "creating tables"))?;
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(|e| map_err(e, "LISTEN"))?;
        // The listening client must stay alive: keep it inside the listener's future.
        let listener = tokio::spawn(async move {
            let _keep = client;
            let _ = listener.await;
        });
        let pool = pool_builder(cfg, 16)
            .build()
            .map_err(|e| Error::new(ErrorKind::Config, format!("postgres pool: {e}")))?;
        Ok(PgEngine {
            pool,
            display,
            channel,
            notified,
            _listener: listener,
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| pool_err(e, "connecting"))
    }

    async fn head(&self) -> Result<u64> {
        let c = self.client().await?;
        let row = c
            .query_one("SELECT seq FROM jfs_head WHERE id = 1", &[])
            .await
            .map_err(|e| map_err(e, "reading head"))?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

/// Apply a write-set, append journal frames, advance the head and notify the journal's
/// readers: one statement, so one round trip (the sub-statements of a `WITH` run once each,
/// on one snapshot; the puts and deletes touch distinct keys). Parameters: `split_writes`,
/// the seqs, the frames, the head, the channel, the head as text.
const WRITE_AND_APPEND: &str = "WITH put AS (INSERT INTO jfs_kv (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v), \
     del AS (DELETE FROM jfs_kv WHERE k = ANY($3::bytea[])), \
     jrn AS (INSERT INTO jfs_journal (seq, frame) SELECT * FROM unnest($4::bigint[], $5::bytea[])), \
     hd AS (UPDATE jfs_head SET seq = $6 WHERE id = 1) \
     SELECT pg_notify($7, $8)";

/// A write-set as the keys to put, their values and the keys to delete (the last write of a
/// key wins).
type Split<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>, Vec<&'a [u8]>);

fn split_writes<'a>(writes: &[&'a Mutation]) -> Split<'a> {
    let mut last: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
    for m in writes {
        match m {
            Mutation::Put { key, value } => last.insert(key, Some(value)),
            Mutation::Delete { key } => last.insert(key, None),
            _ => unreachable!("materialized entries hold only puts and deletes"),
        };
    }
    let (mut pk, mut pv, mut dk) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in last {
        match v {
            Some(v) => {
                pk.push(k);
                pv.push(v);
            }
            None => dk.push(k),
        }
    }
    (pk, pv, dk)
}

/// `WRITE_AND_APPEND` inside a transaction.
async fn write_and_append(
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &str,
    writes: &[&Mutation],
    seqs: &[i64],
    frames: &[Vec<u8>],
    head: i64,
) -> Result<()> {
    let (pk, pv, dk) = split_writes(writes);
    let st = tx
        .prepare_cached(WRITE_AND_APPEND)
        .await
        .map_err(|e| map_err(e, "prepare"))?;
    tx.query(
        &st,
        &[
            &pk,
            &pv,
            &dk,
            &seqs,
            &frames,
            &head,
            &channel,
            &head.to_string(),
        ],
    )
    .await
    .map_err(|e| map_err(e, "writing keys and the journal"))?;
    Ok(())
}

/// A pooled connection inside a transaction this code opened: if it is dropped before the
/// transaction ended (the caller's future cancelled half-way), the connection is closed
/// rather than returned to the pool, so the server rolls back and frees the head row.
struct InTx {
    conn: Option<deadpool_postgres::Object>,
    open: bool,
}

impl InTx {
    /// End the transaction without keeping anything.
    async fn rollback(&mut self) -> Result<()> {
        let c = self.conn.as_ref().expect("held");
        c.batch_execute("ROLLBACK")
            .await
            .map_err(|e| map_err(e, "rollback"))?;
        self.open = false;
        Ok(())
    }
}

impl Drop for InTx {
    fn drop(&mut self) {
        if self.open {
            if let Some(c) = self.conn.take() {
                drop(deadpool_postgres::Object::take(c));
            }
        }
    }
}

/// A pool of up to `max_size` plain connections to `cfg`, recycled without a check query:
/// the one way this project pools PostgreSQL connections (the engine, the job boards).
pub fn pool_builder(
    cfg: tokio_postgres::Config,
    max_size: usize,
) -> deadpool_postgres::PoolBuilder {
    let mgr = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr).max_size(max_size)
}

#[async_trait]
impl Engine for PgEngine {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn display_url(&self) -> String {
        self.display.clone()
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let c = self.client().await?;
        let st = c
            .prepare_cached("SELECT v FROM jfs_kv WHERE k = $1")
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let row = c
            .query_opt(&st, &[&key])
            .await
            .map_err(|e| map_err(e, "get"))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let c = self.client().await?;
        let st = c
            .prepare_cached("SELECT k, v FROM jfs_kv WHERE k = ANY($1)")
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let rows = c
            .query(&st, &[&keys])
            .await
            .map_err(|e| map_err(e, "get"))?;
        let m: HashMap<Vec<u8>, Vec<u8>> = rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
        // `get`, not `remove`: a key asked for twice is answered twice.
        Ok(keys.iter().map(|k| m.get(k).cloned()).collect())
    }

    /// One statement (one snapshot): the keys, the followed keys and the followed range.
    async fn get_many_via(&self, keys: &[Vec<u8>], follow: Follow<'_>) -> Result<Followed> {
        let Some(first) = keys.first() else {
            return Ok(Followed::default());
        };
        let c = self.client().await?;
        let st = c
            .prepare_cached(
                "WITH ino AS (\
                   SELECT $2::bytea || substring(v FROM 1 FOR 8) AS p FROM jfs_kv \
                   WHERE k = $4 AND length(v) >= 8) \
                 SELECT 0, k, v FROM jfs_kv WHERE k = ANY($1) \
                 UNION ALL \
                 SELECT 1, f.k, f.v FROM ino, unnest($3::bytea[]) s, LATERAL (\
                   SELECT k, v FROM jfs_kv WHERE k = ino.p || s) f \
                 UNION ALL \
                 SELECT 2, r.k, r.v FROM ino, LATERAL (\
                   SELECT k, v FROM jfs_kv \
                   WHERE k >= ino.p || $5::bytea AND k < ino.p || $6::bytea \
                   ORDER BY k LIMIT $7) r",
            )
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let (from, to, limit) = follow.range;
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = c
            .query(
                &st,
                &[
                    &keys,
                    &follow.prefix,
                    &follow.suffixes,
                    first,
                    &from,
                    &to,
                    &limit,
                ],
            )
            .await
            .map_err(|e| map_err(e, "get"))?;
        let mut points: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut range = Vec::new();
        for r in rows {
            let tag: i32 = r.get(0);
            if tag == 2 {
                range.push((r.get(1), r.get(2)));
            } else {
                points.insert(r.get(1), r.get(2));
            }
        }
        let range_complete = (range.len() as i64) < limit;
        let values: Values = keys.iter().map(|k| points.get(k).cloned()).collect();
        let followed = match Follow::inode_of(values[0].as_deref()) {
            Some(ino) => follow
                .keys(ino)
                .iter()
                .map(|k| points.get(k).cloned())
                .collect(),
            None => Vec::new(),
        };
        Ok(Followed {
            values,
            followed,
            range,
            range_complete,
        })
    }

    async fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>> {
        let c = self.client().await?;
        let st = c
            .prepare_cached("SELECT k, v FROM jfs_kv WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3")
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = c
            .query(&st, &[&start, &end, &limit])
            .await
            .map_err(|e| map_err(e, "scan"))?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Two round trips: `BEGIN`, the head row locked and the read-set read, pipelined (the
    /// server runs them in order, so the reads see every commit before the lock); then the
    /// write statement and `COMMIT`, pipelined.
    async fn commit(&self, req: &CommitRequest) -> Result<CommitOutcome> {
        let c = self.client().await?;
        let lock = c
            .prepare_cached(HEAD_AND_MARKER)
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let read = c
            .prepare_cached("SELECT k, v FROM jfs_kv WHERE k = ANY($1)")
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let write = c
            .prepare_cached(WRITE_AND_APPEND)
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let mut want: Vec<&[u8]> = req.reads.iter().map(|(k, _)| k.as_slice()).collect();
        let ckeys = req.counter_keys();
        want.extend(ckeys.iter().map(|k| k.as_slice()));
        let mut g = InTx {
            conn: Some(c),
            open: true,
        };
        let c = g.conn.as_ref().expect("held");
        let (begun, locked, rows) = tokio::join!(
            c.batch_execute("BEGIN"),
            c.query_one(&lock, &[&fs_core::site::MARKER]),
            async {
                if want.is_empty() {
                    Ok(Vec::new())
                } else {
                    c.query(&read, &[&want]).await
                }
            }
        );
        let first = (|| {
            begun.map_err(|e| map_err(e, "begin"))?;
            let row = locked.map_err(|e| map_err(e, "locking head"))?;
            let rows = rows.map_err(|e| map_err(e, "validating reads"))?;
            Ok::<_, Error>((row, rows))
        })();
        let (row, rows) = match first {
            Ok(x) => x,
            Err(e) => {
                if c.batch_execute("ROLLBACK").await.is_ok() {
                    g.open = false;
                }
                return Err(e);
            }
        };
        let head: i64 = row.get(0);
        if let Some(marker) = row.get::<_, Option<Vec<u8>>>(1) {
            let _ = g.rollback().await;
            return Err(fs_core::site::refusal_from_record(
                &self.display,
                Some(&marker),
            ));
        }
        let cur: HashMap<Vec<u8>, Vec<u8>> =
            rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
        for (k, v) in &req.reads {
            if cur.get(k) != v.as_ref() {
                g.rollback().await?;
                return Ok(CommitOutcome::Conflict);
            }
        }
        let counters: HashMap<Vec<u8>, Option<Vec<u8>>> = ckeys
            .iter()
            .map(|k| (k.clone(), cur.get(k).cloned()))
            .collect();
        let seq = head as u64 + 1;
        let entry = match req.materialize(seq, fs_core::types::now_ns(), &counters) {
            Ok(e) => e,
            Err(e) => {
                let _ = g.rollback().await;
                return Err(e);
            }
        };
        let refs: Vec<&Mutation> = entry.writes.iter().collect();
        let (pk, pv, dk) = split_writes(&refs);
        let seqs: &[i64] = &[seq as i64];
        let frames: &[Vec<u8>] = &[entry.encode()];
        let h = seq as i64;
        let ht = h.to_string();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
            [&pk, &pv, &dk, &seqs, &frames, &h, &self.channel, &ht];
        let c = g.conn.as_ref().expect("held");
        // A failed write leaves the transaction aborted, and the `COMMIT` after it then
        // rolls back: nothing of it is kept either way.
        let (written, committed) =
            tokio::join!(c.query(&write, &params), c.batch_execute("COMMIT"));
        g.open = false;
        written.map_err(|e| map_err(e, "writing keys and the journal"))?;
        committed.map_err(|e| map_err(e, "commit"))?;
        Ok(CommitOutcome::Committed {
            seq,
            time_ns: entry.time_ns,
        })
    }

    async fn journal_bounds(&self) -> Result<JournalBounds> {
        let c = self.client().await?;
        let row = c
            .query_one("SELECT (SELECT min(seq) FROM jfs_journal), (SELECT seq FROM jfs_head WHERE id = 1)", &[])
            .await
            .map_err(|e| map_err(e, "reading journal bounds"))?;
        let last = row.get::<_, i64>(1) as u64;
        let first = row
            .get::<_, Option<i64>>(0)
            .map(|s| s as u64)
            .unwrap_or(last + 1);
        Ok(JournalBounds { first, last })
    }

    async fn journal_read(&self, from: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let b = self.journal_bounds().await?;
        let from = b.check_from(from)?;
        let c = self.client().await?;
        let st = c
            .prepare_cached(
                "SELECT seq, frame FROM jfs_journal WHERE seq >= $1 ORDER BY seq LIMIT $2",
            )
            .await
            .map_err(|e| map_err(e, "prepare"))?;
        let rows = c
            .query(&st, &[&(from as i64), &(max as i64)])
            .await
            .map_err(|e| map_err(e, "reading the journal"))?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
            .collect())
    }

    async fn journal_wait(&self, after: u64, timeout: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.notified.clone();
        loop {
            rx.borrow_and_update();
            if self.head().await? > after {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            // Notifications wake us; the 1 s cap only guards against a lost listener connection.
            let _ =
                tokio::time::timeout((deadline - now).min(Duration::from_secs(1)), rx.changed())
                    .await;
        }
    }

    async fn journal_trim(&self, before: u64) -> Result<u64> {
        let c = self.client().await?;
        let before = before.min(i64::MAX as u64) as i64;
        let n = c
            .execute("DELETE FROM jfs_journal WHERE seq < $1 AND seq < (SELECT seq FROM jfs_head WHERE id = 1)", &[&before])
            .await
            .map_err(|e| map_err(e, "trimming the journal"))?;
        Ok(n)
    }

    async fn apply(&self, entries: &[Entry]) -> Result<u64> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| map_err(e, "begin"))?;
        let head = self.lock_head_of_mirror(&tx).await?;
        let todo = fs_core::engine::entries_after(head, entries)?;
        if todo.is_empty() {
            return Ok(head);
        }
        let writes: Vec<&Mutation> = todo.iter().flat_map(|e| e.writes.iter()).collect();
        let seqs: Vec<i64> = todo.iter().map(|e| e.seq as i64).collect();
        let frames: Vec<Vec<u8>> = todo.iter().map(|e| e.encode()).collect();
        let head = *seqs.last().expect("non-empty");
        write_and_append(&tx, &self.channel, &writes, &seqs, &frames, head).await?;
        tx.commit().await.map_err(|e| map_err(e, "commit"))?;
        Ok(todo.last().expect("non-empty").seq)
    }

    async fn aux_put(&self, name: &str, value: Option<&[u8]>) -> Result<()> {
        fs_core::engine::check_aux_name(name)?;
        let c = self.client().await?;
        let r = match value {
            Some(v) => {
                c.execute(
                    "INSERT INTO jfs_aux (name, v) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET v = excluded.v",
                    &[&name, &v],
                )
                .await
            }
            None => c.execute("DELETE FROM jfs_aux WHERE name = $1", &[&name]).await,
        };
        r.map_err(|e| map_err(e, "writing an aux record"))?;
        Ok(())
    }

    async fn aux_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let c = self.client().await?;
        let rows = c
            .query("SELECT name, v FROM jfs_aux ORDER BY name", &[])
            .await
            .map_err(|e| map_err(e, "reading aux records"))?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1)))
            .filter(|(n, _)| n.starts_with(prefix))
            .collect())
    }

    async fn install_reset(&self) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        let c = self.client().await?;
        c.batch_execute(
            "BEGIN; DELETE FROM jfs_kv; DELETE FROM jfs_journal; UPDATE jfs_head SET seq = 0 WHERE id = 1; COMMIT;",
        )
        .await
        .map_err(|e| map_err(e, "resetting for a snapshot"))
    }

    async fn install_put(&self, pairs: &[KvPair]) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        if pairs.is_empty() {
            return Ok(());
        }
        let c = self.client().await?;
        let ks: Vec<&[u8]> = pairs.iter().map(|(k, _)| k.as_slice()).collect();
        let vs: Vec<&[u8]> = pairs.iter().map(|(_, v)| v.as_slice()).collect();
        c.execute(
            "INSERT INTO jfs_kv (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
            &[&ks, &vs],
        )
        .await
        .map_err(|e| map_err(e, "installing snapshot keys"))?;
        Ok(())
    }

    async fn install_head(&self, head: u64) -> Result<()> {
        fs_core::site::require_mirror(self).await?;
        let c = self.client().await?;
        c.execute(
            "UPDATE jfs_head SET seq = $1 WHERE id = 1",
            &[&(head as i64)],
        )
        .await
        .map_err(|e| map_err(e, "setting the head"))?;
        Ok(())
    }

    async fn install_switch(
        &self,
        writes: &[Mutation],
        frames: &[(u64, Vec<u8>)],
        head: u64,
    ) -> Result<()> {
        fs_core::engine::check_switch(writes, frames, head)?;
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| map_err(e, "begin"))?;
        self.lock_head_of_mirror(&tx).await?;
        let refs: Vec<&Mutation> = writes.iter().collect();
        tx.execute("DELETE FROM jfs_journal", &[])
            .await
            .map_err(|e| map_err(e, "clearing the journal"))?;
        let seqs: Vec<i64> = frames.iter().map(|(s, _)| *s as i64).collect();
        let fr: Vec<Vec<u8>> = frames.iter().map(|(_, f)| f.clone()).collect();
        write_and_append(&tx, &self.channel, &refs, &seqs, &fr, head as i64).await?;
        tx.commit().await.map_err(|e| map_err(e, "commit"))?;
        Ok(())
    }
}
