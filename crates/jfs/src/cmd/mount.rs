//! `jfs mount`, `umount`, `warmup`, `stats`, and the way write commands reach a RocksDB volume
//! that a mount holds open (RocksDB admits one writing process): through that mount.

use super::{open_engine, open_fs, Outcome};
use crate::cli::{Global, MountArgs};
use anyhow::{anyhow, bail, Context, Result};
use mount::control::{self, Request, WarmAction, WarmProgress};
use mount::mounts;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A `--cache-dir` someone else could steer is refused: reached through another user's
/// link, another user's directory, one other users may write (group members too, unless
/// `--cache-mode` shares the cache with the group), or one under a directory another user
/// could change. Each would let them read what the mount caches, or plant a link where it
/// writes.
fn check_cache_dir(d: &Path, cache_mode: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let fix = "choose a directory of your own with --cache-dir (or leave it out for the default)";
    if let Some(why) = cli_common::private::foreign_link(d) {
        bail!("--cache-dir {}: {why}; {fix}", d.display());
    }
    if let Ok(md) = std::fs::metadata(d) {
        let me = rustix::process::geteuid().as_raw();
        if md.uid() != me && md.uid() != 0 {
            bail!(
                "--cache-dir {} belongs to uid {}, another user, who could read what is cached there or plant links in it; {fix}",
                d.display(),
                md.uid()
            );
        }
        let writers = if cache_mode & 0o070 != 0 {
            0o002
        } else {
            0o022
        };
        if md.mode() & writers != 0 {
            bail!(
                "--cache-dir {} has mode {:04o}: other users may add to it or replace what is in it; chmod go-w it, or {fix}",
                d.display(),
                md.mode() & 0o7777
            );
        }
    }
    if let Some(why) = cli_common::private::ancestors_problem(d) {
        bail!("--cache-dir {}: {why}; {fix}", d.display());
    }
    Ok(())
}

/// The default cache directory: /var/cache/jfs as root, else ~/.cache/jfs, else (no home)
/// /tmp/jfs-cache-UID. Each is checked to be this user's alone (`ensure_private_dir`): a
/// shared /tmp/jfs-cache let another user plant or read what a mount cached.
fn default_cache_dir() -> Result<PathBuf> {
    let uid = rustix::process::geteuid();
    let d = if uid.is_root() {
        PathBuf::from("/var/cache/jfs")
    } else {
        std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache/jfs"))
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/jfs-cache-{}", uid.as_raw())))
    };
    control::ensure_private_dir(&d, "cache directory")
        .map_err(|e| anyhow!("{e:#} (or choose one with --cache-dir)"))?;
    Ok(d)
}

/// Permission bits of `path` that let other users in, if any (None: private, or absent).
fn shared_bits(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let bits = m.mode() & 0o077;
    (bits != 0).then_some(m.mode() & 0o7777)
}

/// Warn when `path` (what it is: `what`) lets other users in.
pub(crate) fn warn_if_shared(path: &Path, what: &str) {
    if let Some(mode) = shared_bits(path) {
        cli_common::eprintln!(
            "jfs: warning: {what} {} has mode {mode:04o}: other users of this host may read it, and whoever reads a volume's metadata or blocks reads every file, whatever the files' modes (chmod 700 {})",
            path.display(),
            path.display()
        );
    }
}

/// `warn_if_shared` for a volume's local metadata directory and block store, if it has them.
pub(crate) fn warn_if_shared_volume(meta_url: &str, storage: &str) {
    if let Some(d) = meta::local_dir(meta_url) {
        warn_if_shared(&d, "the metadata directory");
    }
    if let Some(d) = storage.strip_prefix("file://") {
        warn_if_shared(Path::new(d), "the block store");
    }
}

/// Set in the environment of the process a background mount starts.
const CHILD: &str = "JFS_MOUNT_CHILD";

pub async fn mount(g: &Global, m: MountArgs) -> Result<Outcome> {
    if !(0.0..1.0).contains(&m.free_space_ratio) {
        bail!(
            "--free-space-ratio {} is out of range: give a share from 0 to 0.99",
            m.free_space_ratio
        );
    }
    if m.buffer_size < (32 << 20) {
        bail!("--buffer-size must be at least 32M (it holds write buffers and read-ahead)");
    }
    if m.background && std::env::var_os(CHILD).is_none() {
        return background(&m).await;
    }
    // Checked before opening anything, so a mistake costs nothing.
    let mp = mount::prepare_mountpoint(&m.mountpoint, true)?;
    let cache = if m.cache_size > 0 {
        let dir = match &m.cache_dir {
            Some(d) => {
                check_cache_dir(d, m.cache_mode)?;
                if m.cache_mode & 0o077 == 0 {
                    warn_if_shared(d, "the cache directory");
                }
                d.clone()
            }
            None => default_cache_dir()?,
        };
        Some(volume::CacheConfig {
            dir,
            capacity: m.cache_size,
            free_ratio: m.free_space_ratio,
            mode: m.cache_mode,
        })
    } else {
        None
    };
    // A mirror's metadata follows its primary: its mounts write through to the primary when
    // the primary lets this mirror write (through the site's agent), else are read-only.
    let mut m = m;
    let mut forward = None;
    if !m.read_only {
        if let Some((mk, writes)) =
            volume::mirror_writes(&m.meta_url, g.meta_password_file.clone()).await?
        {
            // The primary lets it write: its blocks go to the origin's stores, which this
            // host must be able to write (else every close fails).
            let writes = match writes {
                Ok(sock) => volume::origin_writable(
                    &m.meta_url,
                    g.meta_password_file.clone(),
                    g.endpoint.clone(),
                )
                .await?
                .map(|()| sock)
                .map_err(|why| {
                    format!("{why}; give this host write access there (runbooks/mirror-writes.md) and mount again")
                }),
                Err(why) => Err(why),
            };
            match writes {
                Ok(sock) => {
                    cli_common::eprintln!(
                        "jfs: {} is mirror {:?}'s metadata: changes are committed at the primary at {} (through this site's agent)",
                        meta::redact(&m.meta_url),
                        mk.name,
                        mk.primary
                    );
                    forward = Some(sock);
                }
                Err(why) => {
                    cli_common::eprintln!(
                        "jfs: {} is mirror {:?}'s metadata (it follows the primary at {}): mounting read-only ({why})",
                        meta::redact(&m.meta_url),
                        mk.name,
                        mk.primary
                    );
                    m.read_only = true;
                }
            }
        }
    }
    // A mount that writes through its mirror opens the metadata to read: the agent is its
    // only writer.
    let mut opts = super::volume_options(g, m.read_only || forward.is_some(), cache);
    opts.forward = forward;
    opts.session = Some(mp.to_string_lossy().into_owned());
    // A mount outlives a move of the volume's primary (site or engine migration).
    opts.follow_moves = true;
    let vol = volume::open_volume(&m.meta_url, &opts)
        .await
        .with_context(|| format!("opening volume {}", meta::redact(&m.meta_url)))?;
    warn_if_shared_volume(&m.meta_url, &vol.fs.settings().storage);
    let o = mount::MountOptions {
        mountpoint: mp.clone(),
        read_only: m.read_only,
        buffer_size: m.buffer_size,
        max_readahead: m.max_readahead,
        attr_cache: m.attr_cache,
        entry_cache: m.entry_cache,
        dir_entry_cache: m.dir_entry_cache,
        open_cache: m.open_cache,
        metrics: m.metrics,
        allow_other: m.allow_other,
        threads: m.fuse_threads,
        stale: m.stale,
        passthrough: m.passthrough == "auto",
    };
    mount::run(vol, o, || {
        cli_common::eprintln!(
            "jfs: mounted {} at {}",
            meta::redact(&m.meta_url),
            mp.display()
        );
    })
    .await?;
    Ok(Outcome::Done)
}

/// Start this same command without -d in a new process group, its output to the log file,
/// and return once the mount answers on its control socket (or report why it did not).
async fn background(m: &MountArgs) -> Result<Outcome> {
    // What the mount point hides is said by the mount process (relayed below), once.
    let mp = mount::prepare_mountpoint(&m.mountpoint, false)?;
    let log = match &m.log {
        Some(l) => {
            if let Some(d) = l.parent().filter(|d| !d.as_os_str().is_empty()) {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(d)
                    .with_context(|| format!("creating {}", d.display()))?;
            }
            l.clone()
        }
        // In the run directory, checked to be this user's alone.
        None => control::socket_path_in(&control::private_run_dir()?, &mp).with_extension("log"),
    };
    // The log names files: 0600 from its first byte, and never through a symbolic link (one
    // planted there would have the mount append to whatever it points at), never another
    // user's file (`cli_common::open_private_log`).
    let logf = cli_common::open_private_log(&log, "--log")?;
    // The log is appended to by every mount of this mount point: what this attempt says
    // starts here.
    let start = logf.metadata().map(|m| m.len()).unwrap_or(0);
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "-d" && a != "--background")
        .collect();
    let exe = std::env::current_exe().context("finding the jfs binary")?;
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(exe)
        .args(&args)
        .env(CHILD, "1")
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .process_group(0)
        .spawn()
        .context("starting the mount process")?;
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            let tail = this_attempt(&log, start);
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "the mount process exited ({st}) before mounting:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let up = mounts::find(&mp)?.is_some_and(|e| e.is_jfs())
            && control::call(&mp, &Request::Stats, |_| {}).await.is_ok();
        if up {
            // The mount process's stderr is the log: its warnings (a store or cache other
            // users may read, files hidden under the mount point, ...) are said here too.
            for w in warnings_of(&this_attempt(&log, start)) {
                cli_common::eprintln!("{w}");
            }
            cli_common::eprintln!(
                "jfs: mounted at {} (pid {}, log {})",
                mp.display(),
                child.id(),
                log.display()
            );
            return Ok(Outcome::Done);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            bail!(
                "the mount did not answer within 60 s; see {}",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The warning and error lines of a mount log's text, as the terminal shows them: the
/// process's own `jfs: warning: ...` lines as they are, and its log's WARN and ERROR records
/// (plain or JSON) as `jfs: warning: MESSAGE FIELDS` / `jfs: error: ...`.
fn warnings_of(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("jfs: warning:") || l.starts_with("jfs: error:") {
            out.push(l.to_string());
        } else if l.starts_with('{') {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
                continue;
            };
            let word = match v["level"].as_str() {
                Some("WARN") => "warning",
                Some("ERROR") => "error",
                _ => continue,
            };
            let f = &v["fields"];
            let mut s = format!("jfs: {word}: {}", f["message"].as_str().unwrap_or_default());
            if let Some(o) = f.as_object() {
                for (k, val) in o.iter().filter(|(k, _)| *k != "message") {
                    match val.as_str() {
                        Some(t) => s.push_str(&format!(" {k}={t}")),
                        None => s.push_str(&format!(" {k}={val}")),
                    }
                }
            }
            out.push(s);
        } else {
            // `2026-01-02T03:04:05.678Z  WARN target: message fields`
            let mut words = l.split_whitespace();
            let _time = words.next();
            let word = match words.next() {
                Some("WARN") => "warning",
                Some("ERROR") => "error",
                _ => continue,
            };
            let Some((_, rest)) = l.split_once(if word == "warning" {
                " WARN "
            } else {
                " ERROR "
            }) else {
                continue;
            };
            let msg = rest.split_once(": ").map_or(rest, |(_, m)| m);
            out.push(format!("jfs: {word}: {msg}"));
        }
    }
    out
}

/// What a mount log holds from byte `start` on (this attempt's lines).
fn this_attempt(log: &Path, start: u64) -> String {
    use std::io::{Read, Seek};
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        if f.seek(std::io::SeekFrom::Start(start)).is_ok() {
            let _ = f.read_to_string(&mut s);
        }
    }
    s
}

pub async fn umount(mp: &Path, force: bool) -> Result<Outcome> {
    if let Some(why) = cli_common::private::foreign_link(mp) {
        bail!("umount: {why}");
    }
    if mounts::is_stale(mp) {
        // Only a jfs mount's: a dead sshfs or another FUSE file system is not ours to clear.
        let abs = std::path::absolute(mp).with_context(|| format!("{}", mp.display()))?;
        match mounts::find(&abs)? {
            Some(e) if e.is_jfs() => {}
            Some(e) => bail!(
                "{} is a stale {} mount, not a jfs mount: refusing to unmount it (`umount -l` does, if you mean to)",
                abs.display(),
                e.fstype
            ),
            None => bail!(
                "{} is a stale mount that the mount table does not list under that path: give the mount point as `mount` shows it",
                abs.display()
            ),
        }
        mounts::lazy_unmount(mp)?;
        cli_common::eprintln!("jfs: cleared a stale mount at {}", mp.display());
        return Ok(Outcome::Done);
    }
    let canon = mp
        .canonicalize()
        .with_context(|| format!("{}", mp.display()))?;
    match mounts::find(&canon)? {
        Some(e) if e.is_jfs() => {
            let me = rustix::process::geteuid();
            if let Some(owner) = e.owner.filter(|o| !me.is_root() && *o != me.as_raw()) {
                bail!(
                    "the mount at {} belongs to uid {owner}: only that user or root may unmount it",
                    canon.display()
                );
            }
        }
        Some(e) => bail!(
            "{} is a {} mount, not a jfs mount: refusing to unmount it",
            canon.display(),
            e.fstype
        ),
        None => bail!("{} is not mounted", canon.display()),
    }
    let sock = control::socket_path(&canon);
    if force {
        return force_unmount(&canon).await;
    } else {
        mounts::unmount(&canon).map_err(|e| {
            anyhow!("{e:#}\n(files open there? close them, or detach with `jfs umount --force`)")
        })?;
    }
    // The mount process commits, removes its session and its socket, and exits.
    let t0 = Instant::now();
    while sock.exists() && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cli_common::eprintln!("jfs: unmounted {}", canon.display());
    Ok(Outcome::Done)
}

/// `jfs umount --force`: detach the mount point now, have the mount process commit what it
/// buffers and exit without waiting for open files, and return only once that process is
/// gone (it holds the volume: a RocksDB volume's lock, its session).
async fn force_unmount(mp: &Path) -> Result<Outcome> {
    let pid = match control::call(mp, &Request::Exit { now: true }, |_| {}).await {
        Ok(v) => v["pid"].as_u64().map(|p| p as u32),
        Err(e) => {
            tracing::warn!(error = %e, "the mount process does not answer on its control socket");
            None
        }
    };
    // The process detaches itself when it answered; make sure of it either way.
    if let Err(e) = mounts::lazy_unmount(mp) {
        if mounts::find(mp)?.is_some() {
            return Err(e);
        }
    }
    let Some(pid) = pid else {
        cli_common::eprintln!(
            "jfs: detached {}; no mount process answered on its control socket, so none was asked to exit (a process still serving it holds the volume until it ends)",
            mp.display()
        );
        return Ok(Outcome::Partial);
    };
    let t0 = Instant::now();
    // Gone, or a zombie its parent has not reaped yet: either way it holds nothing.
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    };
    while alive(pid) {
        if t0.elapsed() > Duration::from_secs(120) {
            bail!(
                "detached {}, but the mount process (pid {pid}) has not exited within 120 s: it still holds the volume (see its log; kill it if it hangs)",
                mp.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cli_common::eprintln!(
        "jfs: unmounted {} (the mount process, pid {pid}, committed what it buffered and exited)",
        mp.display()
    );
    Ok(Outcome::Done)
}

/// Group `paths` (absolute, inside jfs mounts) by their mount.
fn by_mount(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Vec<String>)>> {
    let mut out: Vec<(PathBuf, Vec<String>)> = Vec::new();
    for p in paths {
        let c = p
            .canonicalize()
            .with_context(|| format!("{}", p.display()))?;
        let Some((m, inner)) = mounts::jfs_mount_of(&c)? else {
            bail!(
                "{} is not inside a jfs mount (warmup works on the mount that holds the files)",
                p.display()
            );
        };
        match out.iter_mut().find(|(mp, _)| *mp == m.mountpoint) {
            Some((_, v)) => v.push(inner),
            None => out.push((m.mountpoint, vec![inner])),
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
pub async fn warmup(
    g: &Global,
    mut paths: Vec<PathBuf>,
    file: Option<PathBuf>,
    threads: usize,
    check: bool,
    evict: bool,
    json: bool,
) -> Result<Outcome> {
    if let Some(f) = file {
        let s = std::fs::read_to_string(&f).with_context(|| format!("--file {}", f.display()))?;
        paths.extend(
            s.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(PathBuf::from),
        );
    }
    if paths.is_empty() {
        bail!("nothing to warm up: give paths inside a jfs mount, or --file LIST");
    }
    let action = if check {
        WarmAction::Check
    } else if evict {
        WarmAction::Evict
    } else {
        WarmAction::Warm
    };
    let mut partial = false;
    for (mp, inner) in by_mount(&paths)? {
        let t0 = Instant::now();
        let tty = std::io::stderr().is_terminal() && !g.quiet && !json;
        let bar = tty.then(|| {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_message(format!("{:?}", action).to_lowercase());
            b
        });
        let mut last_log = Instant::now();
        let last = control::call(
            &mp,
            &Request::Warmup {
                paths: inner,
                threads,
                action,
            },
            |v| {
                let Some(p) = v.get("progress") else { return };
                let Ok(p) = serde_json::from_value::<WarmProgress>(p.clone()) else {
                    return;
                };
                if let Some(b) = &bar {
                    b.set_length(p.bytes);
                    b.set_position(p.bytes_done);
                } else if !json && !g.quiet && last_log.elapsed() > Duration::from_secs(5) {
                    last_log = Instant::now();
                    cli_common::eprintln!(
                        "warmup: {}/{} blocks, {}/{} bytes",
                        p.blocks_done,
                        p.blocks,
                        p.bytes_done,
                        p.bytes
                    );
                }
            },
        )
        .await?;
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let s: WarmProgress = serde_json::from_value(last["summary"].clone())
            .context("the mount's warmup summary does not decode")?;
        let secs = t0.elapsed().as_secs_f64();
        partial |= s.failed > 0;
        if json {
            let mut v = serde_json::to_value(&s)?;
            v["mountpoint"] = serde_json::json!(mp);
            v["action"] = serde_json::json!(action);
            v["seconds"] = serde_json::json!(secs);
            println!("{v}");
            continue;
        }
        match action {
            WarmAction::Warm => println!(
                "warmed {} files, {} blocks ({} bytes) in {:.1} s ({:.1} MiB/s): {} fetched, {} already cached, {} failed{}",
                s.files, s.blocks, s.bytes, secs,
                s.bytes as f64 / secs.max(1e-9) / 1048576.0,
                s.fetched, s.cached, s.failed,
                whole_note(s.whole_files, "held as whole-file copies for passthrough")
            ),
            WarmAction::Check => println!(
                "{} files, {} blocks ({} bytes): {} blocks cached ({:.1}%){}",
                s.files,
                s.blocks,
                s.bytes,
                s.cached,
                if s.blocks == 0 { 100.0 } else { s.cached as f64 * 100.0 / s.blocks as f64 },
                whole_note(s.whole_files, "held as whole-file copies")
            ),
            WarmAction::Evict => println!(
                "{} files, {} blocks: {} evicted from the local cache{}",
                s.files, s.blocks, s.evicted,
                whole_note(s.whole_files, "whole-file copies dropped")
            ),
        }
        for e in &s.errors {
            cli_common::eprintln!("jfs: warmup: {e}");
        }
    }
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Done
    })
}

/// ", N files WHAT" when N > 0 (the warm-up summary's note on whole-file copies).
fn whole_note(n: u64, what: &str) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("; {n} files {what}")
    }
}

/// Parse Prometheus text into name{labels} -> value (histogram buckets left out).
fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.contains("_bucket{"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn sum_of(m: &std::collections::BTreeMap<String, f64>, prefix: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.as_str() == prefix || k.starts_with(&format!("{prefix}{{")))
        .map(|(_, v)| v)
        .sum()
}

pub async fn stats(mp: &Path, interval: Duration, count: u64, json: bool) -> Result<Outcome> {
    let canon = mp
        .canonicalize()
        .with_context(|| format!("{}", mp.display()))?;
    let mut prev: Option<std::collections::BTreeMap<String, f64>> = None;
    let mut lines = 0u64;
    let mut mirror = None;
    loop {
        let v = control::call(&canon, &Request::Stats, |_| {}).await?;
        let m = parse_metrics(v["metrics"].as_str().unwrap_or(""));
        if !json && mirror.is_none() {
            // At a mirror site: also blocks read from the origin, fills, the applied seq
            // and the agent's view of the window.
            let at_mirror = sum_of(&m, "jfs_mirror_site") > 0.0;
            mirror = Some(at_mirror);
            print!(
                "{:>9} {:>9} {:>10} {:>10} {:>8} {:>8} {:>10} {:>9} {:>10}",
                "ops/s",
                "lat ms",
                "read MB/s",
                "write MB/s",
                "hit/s",
                "miss/s",
                "store MB/s",
                "get ms",
                "buffer MB"
            );
            if at_mirror {
                print!(
                    " {:>9} {:>8} {:>10} {:>8} {:>7}",
                    "origin/s", "fills/s", "applied", "lag s", "window"
                );
            }
            println!();
        }
        if json {
            println!("{}", serde_json::to_string(&m)?);
            lines += 1;
        } else if let Some(p) = &prev {
            lines += 1;
            let d = |k: &str| (sum_of(&m, k) - sum_of(p, k)) / interval.as_secs_f64();
            let ops = d("jfs_fuse_ops_total");
            let lat = if ops > 0.0 {
                d("jfs_fuse_op_seconds_sum") / ops * 1000.0
            } else {
                0.0
            };
            let gets = d("jfs_blockstore_gets_total");
            let get_ms = if gets > 0.0 {
                d("jfs_blockstore_get_seconds_sum") / gets * 1000.0
            } else {
                0.0
            };
            print!(
                "{:>9.0} {:>9.3} {:>10.1} {:>10.1} {:>8.0} {:>8.0} {:>10.1} {:>9.2} {:>10.1}",
                ops,
                lat,
                d("jfs_fuse_read_bytes_total") / 1e6,
                d("jfs_fuse_write_bytes_total") / 1e6,
                d("jfs_cache_hits_total"),
                d("jfs_cache_misses_total"),
                d("jfs_blockstore_get_bytes_total") / 1e6,
                get_ms,
                sum_of(&m, "jfs_buffer_used_bytes") / 1e6,
            );
            if mirror == Some(true) {
                let lag = sum_of(&m, "jfs_mirror_lag_seconds");
                print!(
                    " {:>9.0} {:>8.0} {:>10} {:>8} {:>7}",
                    d("jfs_fallback_reads_total"),
                    d("jfs_fills_total"),
                    sum_of(&m, "jfs_applied_seq") as u64,
                    if lag < 0.0 {
                        "?".to_string()
                    } else {
                        format!("{lag:.2}")
                    },
                    if sum_of(&m, "jfs_mirror_within_window") > 0.0 {
                        "in"
                    } else {
                        "OUT"
                    }
                );
            }
            println!();
        }
        prev = Some(m);
        if count > 0 && lines >= count {
            return Ok(Outcome::Done);
        }
        tokio::time::sleep(interval).await;
    }
}

/// A live read-write `jfs mount` of this RocksDB volume on this host, if any.
pub async fn live_mount(g: &Global, meta_url: &str) -> Result<Option<PathBuf>> {
    if !meta_url.starts_with("rocksdb://") {
        return Ok(None);
    }
    let engine = open_engine(g, meta_url, true).await?;
    let now = fs_core::now_ns();
    for s in fs_core::session::list(&*engine).await? {
        if !s.is_local_writer() || !s.is_live(now, fs_core::session::DEFAULT_TIMEOUT) {
            continue;
        }
        let mp = PathBuf::from(&s.mountpoint);
        if mounts::find(&mp)?.is_some_and(|e| e.is_jfs()) {
            return Ok(Some(mp));
        }
    }
    Ok(None)
}

/// For a write command: Ok(None) when the volume can be opened for writing here; the mount
/// point to go through when a live mount of this host holds the RocksDB volume.
pub async fn writer_or_mount(
    g: &Global,
    meta_url: &str,
) -> Result<std::result::Result<fs_core::Fs, PathBuf>> {
    match open_fs(g, meta_url, false).await {
        Ok(fs) => Ok(Ok(fs)),
        Err(e) => {
            let busy = e.chain().any(|c| {
                c.downcast_ref::<fs_core::Error>()
                    .is_some_and(|x| x.kind() == fs_core::ErrorKind::Busy)
            });
            if busy {
                if let Some(mp) = live_mount(g, meta_url).await? {
                    tracing::info!(mountpoint = %mp.display(), "the volume is mounted read-write here: going through the mount");
                    return Ok(Err(mp));
                }
            }
            Err(e)
        }
    }
}

pub async fn gc(
    g: &Global,
    meta_url: &str,
    delete: bool,
    session_timeout: Duration,
    json: bool,
) -> Result<Outcome> {
    if !delete {
        return super::admin::gc(
            &open_fs(g, meta_url, true).await?,
            false,
            session_timeout,
            json,
        )
        .await;
    }
    match writer_or_mount(g, meta_url).await? {
        Ok(fs) => super::admin::gc(&fs, true, session_timeout, json).await,
        Err(mp) => {
            let v = control::call(
                &mp,
                &Request::Gc {
                    delete: true,
                    session_timeout_secs: session_timeout.as_secs(),
                },
                |_| {},
            )
            .await?;
            let r: fs_core::maint::GcReport = serde_json::from_value(v["report"].clone())
                .context("the mount's gc report does not decode")?;
            super::admin::print_gc(&r, true, json)
        }
    }
}

/// `jfs clone` of a RocksDB volume mounted read-write here: the mount (its one writer)
/// clones.
pub async fn clone_through(
    mp: &Path,
    src: &fs_core::VolPath,
    dst: &fs_core::VolPath,
    into: bool,
    json: bool,
) -> Result<Outcome> {
    let t = std::time::Instant::now();
    let v = control::call(
        mp,
        &Request::Clone {
            src: src.to_string(),
            dst: dst.to_string(),
            into,
        },
        |_| {},
    )
    .await?;
    let r: fs_core::fs::clone::CloneReport = serde_json::from_value(v["report"].clone())
        .context("the mount's clone report does not decode")?;
    let to = v["dst"].as_str().unwrap_or_default().to_string();
    super::fsops::print_clone(src, &to, &r, t.elapsed(), json);
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::warnings_of;

    fn check(log: &str, want: &[&str]) {
        assert_eq!(warnings_of(log), want, "{log}");
    }

    #[test]
    fn a_background_mounts_warnings_are_relayed_as_the_terminal_shows_them() {
        check(
            "jfs: warning: the cache directory /c has mode 0755: ...\n\
             2026-11-28T15:16:16.533211Z  WARN mount: the mount point is not empty: what it holds (x) is hidden mountpoint=/m\n\
             2026-11-28T15:16:16.533211Z  INFO mount: mounted\n\
             jfs: mounted rocksdb:///m at /m\n\
             2026-11-28T15:16:16.533211Z ERROR mount::vfs::files: read failed: EIO path=/f ino=3\n",
            &[
                "jfs: warning: the cache directory /c has mode 0755: ...",
                "jfs: warning: the mount point is not empty: what it holds (x) is hidden mountpoint=/m",
                "jfs: error: read failed: EIO path=/f ino=3",
            ],
        );
        check(
            r#"{"timestamp":"t","level":"WARN","fields":{"message":"the mount point is not empty","mountpoint":"/m"},"target":"mount"}
{"timestamp":"t","level":"INFO","fields":{"message":"mounted"},"target":"mount"}"#,
            &["jfs: warning: the mount point is not empty mountpoint=/m"],
        );
        check("", &[]);
    }
}
