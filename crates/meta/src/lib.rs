//! Metadata engines behind fs-core's `Engine` trait, and META_URL parsing:
//!
//! - `rocksdb:///path/to/dir[?sync=false]` — embedded, the default;
//! - `redis://[user@]host[:port][/db][?prefix=P]`;
//! - `postgres://user@host[:port]/db[?schema=S]`.
//!
//! Passwords never go in the URL (it would show in process lists and logs): they come from the
//! file given by `password_file`, or the variable named by `?password_env=NAME`, or
//! `JFS_META_PASSWORD`.
//!
//! # The commit contract and its three implementations
//!
//! One file per engine plus URL parsing (`lib.rs`). All three implement the same commit
//! contract (fs-core `engine.rs`): validate the read-set, take `seq = head + 1`, materialize the
//! entry (counter adds become puts of the new value, stamps become puts of `"<seq> <time>"`),
//! then apply the write-set, append the frame and set the head, all in one atomic step.
//!
//! | engine | commit section | journal | waiting readers |
//! |---|---|---|---|
//! | RocksDB | process mutex; the mirror marker's file checked; one `WriteBatch` (default CF + `journal` CF + `meta` CF); WAL synced after the mutex is released, so concurrent commits share fsyncs | `journal` CF, big-endian seq | `watch` channel in process; secondaries are woken by inotify on the volume directory (each commit writes the WAL) and catch up then, polling every 100 ms as the fallback |
//! | Redis | Lua script: `HEXISTS` of the marker in the aux hash, check the expected head and the read-set, apply, `XADD <seq>-0`, set head. The frame is built in Rust for the expected head; "head moved" means rebuild and resend, without re-running the transaction | stream `<prefix>_journal` | `XREAD BLOCK` on its own connection |
//! | PostgreSQL | `SELECT … FOR UPDATE` on the head row (reading the marker in the same statement) orders commits; validate, upsert/delete, insert the journal row, update head, `pg_notify`, all in one transaction | table `jfs_journal(seq PK)` | `LISTEN`, plus a 1 s re-check in case the listener connection dies |
//!
//! Why not `bigserial` on PostgreSQL: its values are handed out at insert time, not in commit
//! order, so a concurrent reader can pass a gap that is filled later. JuiceFS's SQL changelog
//! has this bug. The head row lock gives commit order and no gaps.
//!
//! Redis keys are `<prefix><key>`. A sorted set `<prefix>_index` (score 0) holds every key for
//! ordered `ZRANGEBYLEX` range scans (Redis has no ordered key space). That costs the keys twice
//! in memory and an extra O(log n) per write; the alternative, a hash per directory as JuiceFS
//! does, would give the engine its own schema, unlike the other two.
//!
//! RocksDB and several processes: one process opens a RocksDB volume for writing. Read-only
//! commands open a **secondary** instance (`open_cf_as_secondary` plus
//! `try_catch_up_with_primary`), which follows the writer's WAL without its lock. Every commit
//! is one atomic batch, so a secondary sees whole transactions. Tested with a `--follow` process
//! beside a writer process.
//!
//! The journal holds only puts and deletes with final values, so replay (`Engine::apply`) is
//! deterministic, idempotent, and engine-independent: a Redis journal replays into RocksDB.
//!
//! Besides the key space, every engine keeps **aux records** (small named values outside the
//! journal, never replicated, never dumped: the replication slots) and the steps of a
//! **snapshot install** at a mirror: in place (`install_reset`, `install_put`, `install_head`),
//! or beside the live state, whose last step `install_switch` writes the difference of the key
//! spaces (`engine::diff`), the new journal and head in one atomic write (a RocksDB batch, a
//! Redis MULTI/EXEC, a PostgreSQL transaction), so readers see the old state or the new one. RocksDB
//! keeps aux records as files in `<db>/jfs-aux/`, replaced by rename, so the primary agent can
//! write slots while it follows the writer as a read-only secondary.
//!
//! Secrets: passwords in a URL are refused. They come from a file, `?password_env=`, or
//! `JFS_META_PASSWORD`. `display_url()` never contains one.

mod localdir;
mod postgres;
mod redis_engine;
mod rocks;

pub use localdir::{check_open_room, open_need};
pub use postgres::{pool_builder as pg_pool_builder, PgEngine};
pub use redis_engine::RedisEngine;
pub use rocks::{
    base_options, check_room, check_writer_room, RocksEngine, RocksMode, DISK_FLOOR, WRITER_NEED,
};

use fs_core::error::{Error, ErrorKind, Result};
use fs_core::Engine;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const PASSWORD_ENV: &str = "JFS_META_PASSWORD";

#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Open for reading only. RocksDB then opens a secondary instance that follows the writing
    /// process without taking its lock; other engines ignore it.
    pub read_only: bool,
    /// Create an empty database where none exists (RocksDB; `format` and `load` only), so
    /// that every other command on a wrong path writes nothing.
    pub create: bool,
    /// Read the password from this file (first line).
    pub password_file: Option<PathBuf>,
}

fn config_err(url: &str, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("metadata URL {:?}: {what}", redact(url)),
    )
}

/// The URL with any password replaced by `***`, for messages. A URL that does not parse
/// (a port out of range, a stray character), or parses with no password where one is
/// spelled, is redacted by its spelling: between the user's `:` and the last `@`.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() || u.query_pairs().any(|(k, _)| secret_param(&k)) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            // A password given as a parameter (refused, but shown in the refusal).
            let pairs: Vec<(String, String)> = u
                .query_pairs()
                .map(|(k, v)| {
                    let v = if secret_param(&k) {
                        "***".to_string()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        // No password where the parser looked: a damaged URL ("redis:redis://u:p@h") may
        // still hold one where a reader would see it.
        _ => redact_spelling(url),
    }
}

fn redact_spelling(url: &str) -> String {
    // From the first ':' after the scheme's "//" (or the start) to the last '@': a password
    // may hold '/', '@' or ':' itself, and a damaged URL may have lost its "://".
    let begin = url.find("//").map_or(0, |i| i + 2);
    let Some(at) = url.rfind('@').filter(|&at| at > begin) else {
        return url.to_string();
    };
    match url[begin..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..begin + colon], &url[at..]),
        None => url.to_string(),
    }
}

fn query(u: &url::Url) -> HashMap<String, String> {
    u.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// A URL parameter whose value would be a secret (`password`, `secret`, a token or key).
fn secret_param(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    k != "password_env"
        && ["pass", "secret", "token", "key", "credential"]
            .iter()
            .any(|w| k.contains(w))
}

fn check_params(url: &str, q: &HashMap<String, String>, allowed: &[&str]) -> Result<()> {
    for k in q.keys() {
        if secret_param(k) && !allowed.contains(&k.as_str()) {
            return Err(config_err(
                url,
                format!("parameter {k:?} would put a secret in the URL, which shows in `ps`, logs and job records: name the variable that holds it with ?password_env=VAR (jfs also takes --meta-password-file FILE)"),
            ));
        }
        if !allowed.contains(&k.as_str()) {
            return Err(config_err(
                url,
                // A damaged URL's "parameter" may hold its user and password.
                format!(
                    "unknown parameter {:?} (known: {})",
                    redact_spelling(k),
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn password(url: &str, q: &HashMap<String, String>, opts: &OpenOptions) -> Result<Option<String>> {
    if let Some(f) = &opts.password_file {
        let s = std::fs::read_to_string(f).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("reading the password file {}: {e}", f.display()),
            )
        })?;
        return Ok(Some(s.lines().next().unwrap_or("").to_string()));
    }
    let var = q
        .get("password_env")
        .map(String::as_str)
        .unwrap_or(PASSWORD_ENV);
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Ok(Some(p)),
        _ if q.contains_key("password_env") => Err(config_err(
            url,
            format!("password_env names {var}, which is not set"),
        )),
        _ => Ok(None),
    }
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 48
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Check a META_URL as `open` would, without connecting or touching the disk: scheme,
/// parameters, a password in it (refused), the password source, an absolute RocksDB path
/// whose parent exists. For `check-config` and for validating before any I/O.
pub fn check_url(url: &str, opts: &OpenOptions) -> Result<()> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(config_err(url, "expected SCHEME://..., e.g. rocksdb:///var/lib/jfs/meta, redis://127.0.0.1:6379/1, postgres://jfs@127.0.0.1:5432/jfs"));
    };
    match scheme {
        "rocksdb" => rocks_path(url, opts.create).map(|_| ()),
        "redis" | "postgres" | "postgresql" => {
            let u = url::Url::parse(url).map_err(|e| config_err(url, e))?;
            if u.password().is_some() {
                return Err(config_err(url, format!("do not put the password in the URL (it shows in `ps` and logs): set {PASSWORD_ENV}, or name the variable that holds it with ?password_env=VAR (jfs also takes --meta-password-file FILE)")));
            }
            let q = query(&u);
            let known: &[&str] = if scheme == "redis" { &["prefix", "password_env"] } else { &["schema", "password_env"] };
            check_params(url, &q, known)?;
            u.host_str().filter(|h| !h.is_empty()).ok_or_else(|| config_err(url, "no host"))?;
            password(url, &q, opts)?;
            Ok(())
        }
        other => Err(config_err(
            url,
            format!("unsupported scheme {other:?}: use rocksdb:///path, redis://host:port/db or postgres://user@host:port/db"),
        )),
    }
}

/// The local directory a META_URL keeps the volume's metadata in (`rocksdb://`), if any.
pub fn local_dir(url: &str) -> Option<PathBuf> {
    url.starts_with("rocksdb://")
        .then(|| rocks_path(url, true).ok().map(|(p, _)| p))
        .flatten()
}

/// Up to 3 entries of `dir` that neither RocksDB (a creation cut short leaves these) nor
/// this project put there.
fn foreign_entries(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !(matches!(n.as_str(), "LOCK" | "LOG" | "IDENTITY" | "jfs-aux")
                || n.starts_with("LOG.old.")
                || n.starts_with("MANIFEST-")
                || n.starts_with("OPTIONS-")
                || n.ends_with(".log")
                || n.ends_with(".sst")
                || n.ends_with(".dbtmp"))
        })
        .take(3)
        .collect()
}

/// The directory of a `rocksdb://` URL and its `sync` flag; the path must be absolute (a URL
/// with two slashes, `rocksdb://tmp/x`, names the relative path `tmp/x`: refused, with the
/// spelling that was meant).
fn rocks_path(url: &str, create: bool) -> Result<(PathBuf, bool)> {
    let rest = &url["rocksdb://".len()..];
    let (path, q) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(config_err(url, "no path: use rocksdb:///absolute/dir"));
    }
    if !path.starts_with('/') {
        return Err(config_err(
            url,
            format!("the path must be absolute: did you mean rocksdb:///{path}?"),
        ));
    }
    let mut sync = true;
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        match pair {
            "sync=true" => sync = true,
            "sync=false" => sync = false,
            other => {
                return Err(config_err(
                    url,
                    format!("unknown parameter {other:?} (known: sync=true|false)"),
                ))
            }
        }
    }
    let path = PathBuf::from(path);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        // A command that creates the database (format, load, a mirror agent on its own
        // metadata) may create its parents; any other needs them to exist (a typo must not
        // pass for an empty volume).
        if !create && !parent.is_dir() {
            return Err(config_err(
                url,
                format!("directory {} does not exist", parent.display()),
            ));
        }
        if parent.exists() && !parent.is_dir() {
            return Err(config_err(
                url,
                format!("{} is not a directory", parent.display()),
            ));
        }
    }
    if path.exists() && !path.is_dir() {
        return Err(config_err(
            url,
            format!("{} is not a directory", path.display()),
        ));
    }
    if create && !path.join("CURRENT").exists() {
        let foreign = foreign_entries(&path);
        if !foreign.is_empty() {
            return Err(config_err(
                url,
                format!(
                    "{} holds other files ({}) and no RocksDB volume: a volume's metadata goes into a new or empty directory (RocksDB would put its files among these, and rename some); choose another path",
                    path.display(),
                    foreign.join(", ")
                ),
            ));
        }
    }
    Ok((path, sync))
}

/// A server's URL (Redis, PostgreSQL): parsed, refused if it holds a password, its query
/// parameters checked against `known`.
fn server_url(url: &str, known: &[&str]) -> Result<(url::Url, HashMap<String, String>)> {
    let u = url::Url::parse(url).map_err(|e| config_err(url, e))?;
    if u.password().is_some() {
        return Err(config_err(
            url,
            format!(
                "do not put the password in the URL (it shows in `ps` and logs): set {PASSWORD_ENV}, or name the variable that holds it with ?password_env=VAR (jfs also takes --meta-password-file FILE)"
            ),
        ));
    }
    let q = query(&u);
    check_params(url, &q, known)?;
    Ok((u, q))
}

/// The connection a `redis://` URL names (password from the file or variable, never the URL)
/// and its key prefix. Also used by other tools that keep state in the same engines.
pub fn redis_info(url: &str, opts: &OpenOptions) -> Result<(redis::ConnectionInfo, String)> {
    let (u, q) = server_url(url, &["prefix", "password_env"])?;
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| config_err(url, "no host"))?
        .to_string();
    let port = u.port().unwrap_or(6379);
    let db: i64 = match u.path().trim_start_matches('/') {
        "" => 0,
        d => d.parse().map_err(|_| {
            config_err(
                url,
                format!("database {:?} is not a number", redact_spelling(d)),
            )
        })?,
    };
    let prefix = q.get("prefix").cloned().unwrap_or_default();
    if !prefix.is_empty() && !valid_ident(&prefix) {
        return Err(config_err(
            url,
            "prefix must be lowercase letters, digits and '_'",
        ));
    }
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(host, port),
        redis: redis::RedisConnectionInfo {
            db,
            username: (!u.username().is_empty()).then(|| u.username().to_string()),
            password: password(url, &q, opts)?,
            ..Default::default()
        },
    };
    Ok((info, prefix))
}

/// The connection a `postgres://` URL names (password as for Redis) and its schema.
pub fn pg_config(url: &str, opts: &OpenOptions) -> Result<(tokio_postgres::Config, String)> {
    let (u, q) = server_url(url, &["schema", "password_env"])?;
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| config_err(url, "no host"))?;
    let db = u.path().trim_start_matches('/');
    if db.is_empty() {
        return Err(config_err(
            url,
            "no database name: postgres://user@host:port/DB",
        ));
    }
    let user = if u.username().is_empty() {
        "postgres"
    } else {
        u.username()
    };
    let schema = q.get("schema").cloned().unwrap_or_else(|| "public".into());
    if !valid_ident(&schema) {
        return Err(config_err(
            url,
            "schema must be lowercase letters, digits and '_'",
        ));
    }
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(u.port().unwrap_or(5432))
        .user(user)
        .dbname(db)
        .application_name("jfs");
    if let Some(p) = password(url, &q, opts)? {
        cfg.password(p);
    }
    Ok((cfg, schema))
}

/// Open the engine a META_URL names. Errors name the URL (redacted) and what to fix.
pub async fn open(url: &str, opts: &OpenOptions) -> Result<Arc<dyn Engine>> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(config_err(url, "expected SCHEME://..., e.g. rocksdb:///var/lib/jfs/meta, redis://127.0.0.1:6379/1, postgres://jfs@127.0.0.1:5432/jfs"));
    };
    match scheme {
        "rocksdb" => {
            let (path, sync) = rocks_path(url, opts.create)?;
            // Before its parents are made: a disk too small for a writer gets nothing.
            if !opts.read_only {
                localdir::check_writer_room(&path)
                    .map_err(|m| Error::new(ErrorKind::NoSpace, m))?;
            }
            if opts.create {
                if let Some(parent) = path.parent() {
                    localdir::create_private_dirs(parent).map_err(|e| {
                        config_err(url, format!("creating {}: {e}", parent.display()))
                    })?;
                }
            }
            let mode = if opts.read_only { RocksMode::ReadOnly } else { RocksMode::ReadWrite };
            Ok(Arc::new(RocksEngine::open(&path, mode, opts.create, sync)?))
        }
        "redis" => {
            let (info, prefix) = redis_info(url, opts)?;
            Ok(Arc::new(RedisEngine::connect(info, &prefix, redact(url)).await?))
        }
        "postgres" | "postgresql" => {
            let (cfg, schema) = pg_config(url, opts)?;
            Ok(Arc::new(PgEngine::connect(cfg, &schema, redact(url)).await?))
        }
        other => Err(config_err(
            url,
            format!("unsupported scheme {other:?}: use rocksdb:///path, redis://host:port/db or postgres://user@host:port/db"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn check_err(url: &str, needle: &str) {
        let e = open(url, &OpenOptions::default())
            .await
            .err()
            .expect("should fail");
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        assert!(e.to_string().contains(needle), "{url}: {e}");
        assert!(!e.to_string().contains("hunter2"), "secret leaked: {e}");
    }

    #[test]
    fn a_url_that_does_not_parse_keeps_its_password_out_of_messages() {
        // Found by the META URL harness: a port out of range made the message show the URL
        // as given, password and all.
        let url = "redis://jfs:s3cr3t@db.example:99999/1";
        assert_eq!(redact(url), "redis://jfs:***@db.example:99999/1");
        let e = check_url(url, &OpenOptions::default())
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t") && e.contains("jfs:***@"), "{e}");
        assert_eq!(
            redact("postgres://u:p@w@h/db?x=1"),
            "postgres://u:***@h/db?x=1"
        );
        assert_eq!(redact("rocksdb:///srv/meta"), "rocksdb:///srv/meta");
        assert_eq!(redact("redis//a:s3cr3t@h:1/1"), "redis//a:***@h:1/1");
        assert_eq!(
            redact("redis:redis://a:s3cr3t@h/1"),
            "redis:redis://a:***@h/1"
        );
        assert_eq!(redact("redis://jfs@h/1"), "redis://jfs@h/1");
        let e = check_url("redis:?//a:s3cr3t@h:6379/1", &OpenOptions::default())
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
        assert_eq!(redact("redis://u:a/b@h:99999"), "redis://u:***@h:99999");
    }

    #[tokio::test]
    async fn malformed_urls_are_refused_with_a_reason() {
        check_err("nonsense", "expected SCHEME://").await;
        check_err("mysql://x/y", "unsupported scheme").await;
        check_err("rocksdb://", "no path").await;
        check_err("rocksdb:///no/such/parent/dir", "does not exist").await;
        check_err("rocksdb:///tmp/x?fast=1", "unknown parameter").await;
        // A password as a parameter: refused with the way to give it, never echoed.
        check_err("redis://127.0.0.1:1/1?password=hunter2", "password_env").await;
        check_err("postgres://h/db?sslpassword=hunter2&x=1", "password_env").await;
        check_err("rocksdb://tmp/x", "did you mean rocksdb:///tmp/x?").await;
        check_err(
            "redis://u:hunter2@127.0.0.1:6379/0",
            "do not put the password",
        )
        .await;
        check_err("redis://127.0.0.1:6379/zero", "not a number").await;
        check_err(
            "postgres://u:hunter2@127.0.0.1/db",
            "do not put the password",
        )
        .await;
        check_err("postgres://u@127.0.0.1", "no database name").await;
        check_err(
            "postgres://u@127.0.0.1/db?schema=Bad;drop",
            "schema must be",
        )
        .await;
    }

    #[tokio::test]
    async fn unreachable_engines_fail_fast_and_say_where() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for url in [
            format!("redis://127.0.0.1:{port}/0"),
            format!("postgres://u@127.0.0.1:{port}/db"),
        ] {
            let e = open(&url, &OpenOptions::default())
                .await
                .err()
                .expect("should fail");
            assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
            assert!(e.to_string().contains(&port.to_string()), "{e}");
        }
    }
}
