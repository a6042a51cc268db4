//! `jfs-sync`: thin wiring over the sync library (crates/sync): flags, logging, signals,
//! progress, metrics, exit codes.

mod cli;

use crate::cli::{Cli, Cmd, Common, JobCmd, SyncArgs};
use anyhow::{bail, Context, Result};
use fs_core::place;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;
use sync::endpoint;
use sync::limits::BwSchedule;
use sync::run;
use sync::state::{self, State};
use sync::stats::Stats;
use tokio::sync::watch;

/// Never suggested for a mistyped flag.
const DESTRUCTIVE: &[&str] = &[
    "--delete-dst",
    "--delete-src",
    "--delete",
    "--delete-after",
    "--delete-during",
    "--delete-before",
    "--force-update",
    "--reset-state",
];

fn main() {
    cli_common::quiet_on_closed_pipe();
    let (cli, matches) = cli_common::parse::<Cli>(DESTRUCTIVE);
    // The flags of the command given (each subcommand takes only the flags it uses).
    match &cli.cmd {
        Some(Cmd::Check(a)) => init_logging(&a.common),
        Some(Cmd::Job(JobCmd::Create { common, .. })) => init_logging(common),
        _ => init_logging(&cli.common),
    }
    // A secret in SRC or DST would show in `ps`, every log and error line, a shared job's
    // record, `job status` and the hint for more workers: refused before anything runs.
    let specs: Vec<(&str, &str)> = match &cli.cmd {
        Some(Cmd::Check(a)) => vec![("SRC", a.src.as_str()), ("DST", a.dst.as_str())],
        Some(Cmd::Job(JobCmd::Create { sync: a, .. })) => {
            vec![
                ("SRC", a.src.as_deref().unwrap_or("")),
                ("DST", a.dst.as_deref().unwrap_or("")),
            ]
        }
        Some(Cmd::Job(_)) => Vec::new(),
        None => vec![
            ("SRC", cli.sync.src.as_deref().unwrap_or("")),
            ("DST", cli.sync.dst.as_deref().unwrap_or("")),
        ],
    };
    for (what, spec) in specs {
        if let Err(why) = objstore::secrets::check(spec) {
            cli_common::eprintln!(
                "jfs-sync: error: {what} {}: {why}",
                objstore::secrets::redact(spec)
            );
            std::process::exit(2);
        }
    }
    let rules = match filter_rules(&matches) {
        Ok(r) => r,
        Err(e) => {
            cli_common::eprintln!("jfs-sync: error: {}", cli_common::chain_text(e.chain()));
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = cli_common::on_closed_pipe(|| {
        rt.block_on(async move {
            let r = match cli.cmd {
                Some(Cmd::Check(a)) => check(a).await,
                Some(Cmd::Job(JobCmd::Create { sync: a, common })) => {
                    match matches
                        .subcommand_matches("job")
                        .and_then(|m| m.subcommand_matches("create"))
                        .map(filter_rules)
                        .transpose()
                    {
                        Ok(rules) => sync(*a, common, rules.unwrap_or_default(), true).await,
                        Err(e) => Err(e),
                    }
                }
                Some(Cmd::Job(j)) => job_cmd(j).await,
                None => sync(cli.sync, cli.common, rules, false).await,
            };
            // Volumes (jfs://) opened as writers leave no session behind.
            sync::end_sessions().await;
            match r {
                Ok(code) => code,
                Err(e) if cli_common::closed_pipe(e.chain()) => 0,
                Err(e) => {
                    cli_common::eprintln!("jfs-sync: error: {}", cli_common::chain_text(e.chain()));
                    2
                }
            }
        })
    })
    .unwrap_or(0);
    // Shut the runtime down first: every task is dropped and the state database closed before
    // the process exits (exiting with RocksDB's background threads running can crash).
    drop(rt);
    std::process::exit(code);
}

fn init_logging(c: &Common) {
    let level = match c.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    match &c.log_file {
        Some(path) => {
            let file = match cli_common::open_private_log(path, "--log-file") {
                Ok(f) => f,
                Err(e) => {
                    cli_common::eprintln!("jfs-sync: error: --log-file: {e:#}");
                    std::process::exit(2);
                }
            };
            let filter = tracing_subscriber::EnvFilter::try_from_env("JFS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
            let b = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file));
            if c.log_format == "json" {
                b.json().init();
            } else {
                b.init();
            }
        }
        None => cli_common::init_logging(level, c.log_format == "json", "JFS_LOG"),
    }
}

/// Include/exclude rules from every flag that gives them, in command-line order (a file's
/// rules sit where the file was named).
fn filter_rules(m: &clap::ArgMatches) -> Result<Vec<(bool, String)>> {
    let mut rules: Vec<(usize, usize, bool, String)> = Vec::new();
    let read = |f: &std::path::PathBuf| {
        std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))
    };
    for (id, include) in [("include", true), ("exclude", false)] {
        if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) {
            rules.extend(idx.zip(vals).map(|(i, v)| (i, 0, include, v.clone())));
        }
    }
    if let (Some(idx), Some(vals)) = (m.indices_of("filter"), m.get_many::<String>("filter")) {
        for (i, v) in idx.zip(vals) {
            if let Some((inc, p)) = sync::filter::parse_rule(v).context("--filter")? {
                rules.push((i, 0, inc, p));
            }
        }
    }
    for (id, include) in [("include_from", true), ("exclude_from", false)] {
        if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<std::path::PathBuf>(id)) {
            for (i, f) in idx.zip(vals) {
                for (j, p) in sync::filter::patterns(&read(f)?).into_iter().enumerate() {
                    rules.push((i, j, include, p));
                }
            }
        }
    }
    if let (Some(idx), Some(vals)) = (
        m.indices_of("filter_from"),
        m.get_many::<std::path::PathBuf>("filter_from"),
    ) {
        for (i, f) in idx.zip(vals) {
            for (j, line) in read(f)?.lines().enumerate() {
                if let Some((inc, p)) = sync::filter::parse_rule(line)
                    .with_context(|| format!("{} line {}", f.display(), j + 1))?
                {
                    rules.push((i, j, inc, p));
                }
            }
        }
    }
    rules.sort_by_key(|r| (r.0, r.1));
    Ok(rules.into_iter().map(|(_, _, i, p)| (i, p)).collect())
}

fn norm(spec: &str) -> String {
    // A trailing slash means the same as none.
    if spec.len() > 1 && !spec.ends_with("://") {
        spec.trim_end_matches('/').to_string()
    } else {
        spec.to_string()
    }
}

fn signals() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let stop = cli_common::shutdown_on_signals(
        "jfs-sync: interrupted: finishing the copies in flight and saving progress",
    );
    tokio::spawn(async move {
        stop.cancelled().await;
        let _ = tx.send(true);
    });
    rx
}

async fn serve_metrics(addr: &str, stats: Arc<Stats>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics {addr}"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let s = stats.clone();
            async move { s.prometheus() }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}

/// Why `--delete-dst` is refused for a source that is one file: it makes the destination
/// hold what the source's tree holds, so everything else there would be deleted.
fn one_file_source(src: &str) -> String {
    format!("--delete-dst with a source that is one file ({}): the destination would keep only that file and every other entry in it would be deleted; nothing was touched. Name the source's directory instead (with --include/--exclude or --files-from to choose files), or leave out --delete-dst", sync::names::show(src))
}

/// The run's options from its flags (`sync::options::Request` turns them into the engine's).
fn request(a: &SyncArgs, c: &Common, rules: Vec<(bool, String)>) -> sync::options::Request {
    sync::options::Request {
        threads: c.threads,
        list_threads: a.list_threads,
        list_depth: a.list_depth,
        rules,
        files_from: a.files_from.clone(),
        min_size: a.min_size,
        max_size: a.max_size,
        min_age: a.min_age,
        max_age: a.max_age,
        start: a.start.clone(),
        end: a.end.clone(),
        dirs: a.dirs,
        perms: a.perms,
        owners: a.owners,
        links: a.links,
        from_journal: a.from_journal,
        checksum: a.checksum,
        size_only: a.size_only,
        update: a.update,
        ignore_existing: a.ignore_existing,
        existing: a.existing,
        force_update: a.force_update,
        check_new: a.check_new,
        delete_dst: a.delete_dst,
        delete_src: a.delete_src,
        max_delete: a.max_delete.clone(),
        max_failure: a.max_failure,
        retries: a.retries,
        dry_run: a.dry_run,
        bwlimit: a.bwlimit.clone(),
        tps: a.tps,
    }
}

async fn sync(a: SyncArgs, c: Common, rules: Vec<(bool, String)>, plan_only: bool) -> Result<i32> {
    let (src_spec, dst_spec) = (
        norm(a.src.as_deref().unwrap_or("")),
        norm(a.dst.as_deref().unwrap_or("")),
    );
    request(&a, &c, Vec::new()).check()?;
    let mut a = a;
    if a.delete {
        cli_common::eprintln!("jfs-sync: note: --delete/--delete-during/--delete-before run as --delete-dst: extraneous destination objects are deleted after the copies, and only if the run had no error");
        a.delete_dst = true;
    }
    if plan_only && a.job.is_none() {
        bail!("jfs-sync job create needs --job URL#NAME: where to keep the job");
    }
    if let Some(j) = &a.job {
        if a.dry_run {
            bail!("--dry-run with --job: a dry run changes nothing and needs no shared job; run it without --job");
        }
        if a.files_from.is_some() {
            bail!("--files-from is not shared through --job: run it on one host (without --job), or run a full sync with --job");
        }
        if a.state_dir.is_none() && a.reset_state {
            bail!("--reset-state with --job: the job's progress is in {}; remove it with `jfs-sync job delete`", meta::redact(j));
        }
        if a.lease < Duration::from_secs(1) {
            bail!(
                "--lease {:?} is too short: at least 1s (30s is the default)",
                a.lease
            );
        }
    }
    if a.max_delete.is_some() && !a.delete_dst {
        bail!("--max-delete limits the deletes of --delete-dst, which was not given: add --delete-dst, or drop --max-delete");
    }
    let req = request(&a, &c, rules);
    let mut opts = req.options()?;
    // SRC and DST must not overlap: checked on the specs before anything is opened or
    // created, and again with what the opened endpoints know (a volume's uuid and store).
    let ep = c.endpoint.as_deref();
    let (mut src_places, mut dst_places) =
        (place::of_spec(&src_spec, ep), place::of_spec(&dst_spec, ep));
    refuse_overlap(&src_places, &dst_places)?;
    // A volume's block store as a plain destination (or a source to delete from): before
    // anything is opened or created, except from a volume, whose own store is refused as an
    // overlap once it is open (the clearer message), and any other store right after.
    let stores = |src_places: &[(String, place::Place)], dst_places: &[(String, place::Place)]| {
        if a.dry_run {
            return Ok(());
        }
        refuse_volume_store(&dst_spec, dst_places, "DST")?;
        if a.delete_src {
            refuse_volume_store(&src_spec, src_places, "SRC (with --delete-src)")?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let from_volume = src_spec.starts_with("jfs://");
    if !from_volume {
        stores(&src_places, &dst_places)?;
    }
    let local_src = src_spec.strip_prefix("file://").unwrap_or(&src_spec);
    let is_local = !src_spec.contains("://") || src_spec.starts_with("file://");
    if a.delete_dst && is_local && std::path::Path::new(local_src).is_file() {
        bail!("{}", one_file_source(&src_spec));
    }
    let src = endpoint::open(&src_spec, ep, a.delete_src && !a.dry_run, false)
        .await
        .with_context(|| format!("source {src_spec}"))?;
    // Before the destination is opened (or made): nothing is touched.
    // (A local directory does not stat its own root, "": that is no file either.)
    if a.delete_dst {
        if let Ok(Some(e)) = src.stat("").await {
            if e.kind == sync::entry::Kind::File {
                bail!("{}", one_file_source(&src_spec));
            }
        }
    }
    if a.delete_src && !a.dry_run {
        refuse_object_volume_store(&src_spec, &*src, ep, "SRC (with --delete-src)").await?;
    }
    let local_dst = dst_spec.strip_prefix("file://").unwrap_or(&dst_spec);
    let dst: Arc<dyn endpoint::Endpoint> =
        if a.dry_run && !dst_spec.contains("://") && !std::path::Path::new(local_dst).exists() {
            Arc::new(endpoint::Missing(dst_spec.clone()))
        } else {
            endpoint::open(&dst_spec, ep, !a.dry_run, !a.dry_run)
                .await
                .with_context(|| format!("destination {dst_spec}"))?
        };
    src_places.extend(src.places());
    dst_places.extend(dst.places());
    refuse_overlap(&src_places, &dst_places)?;
    if from_volume {
        stores(&src_places, &dst_places)?;
    }
    if !a.dry_run {
        refuse_object_volume_store(&dst_spec, &*dst, ep, "DST").await?;
    }
    opts.fit(&*src, &*dst);
    let identity = req.identity();
    // What SRC and DST are, not how they were spelled: a volume by its uuid, a directory by
    // its absolute resolved path, a store by endpoint, bucket and prefix. Resume state is
    // keyed by these, so `jfs://NAME/` naming another volume, or a relative path run from
    // another directory, never picks up another job's progress.
    let (src_id, dst_id) = (
        place::identity(&src_spec, ep, &src.places()),
        place::identity(&dst_spec, ep, &dst.places()),
    );
    let state = if a.dry_run {
        None
    } else {
        let job = a.job.as_deref().map(meta::redact).unwrap_or_default();
        let ident = format!("{src_id}\n{dst_id}\n{identity}\n{job}");
        let st = match &a.state_dir {
            Some(dir) => {
                if a.reset_state {
                    let _ = std::fs::remove_dir_all(dir);
                }
                State::open(dir)?
            }
            None => {
                let dir = state::default_dir(&src_id, &dst_id, &format!("{identity}{job}"));
                if a.reset_state {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                if a.job.is_some() {
                    // Workers of one job on one host: each takes the first slot no other
                    // running worker holds.
                    state::open_free_slot(&dir)?
                } else {
                    State::open(&dir)?
                }
            }
        };
        st.claim(&ident, a.state_dir.is_some())?;
        Some(Arc::new(st))
    };
    let stats = Arc::new(Stats::default());
    // Hostile keys named by --files-from fail one by one; the rest of the run goes on.
    if let Some(keys) = &mut opts.keys {
        keys.retain(|k| match endpoint::check_key(k) {
            Ok(()) => true,
            Err(e) => {
                cli_common::eprintln!("jfs-sync: failed: {e}");
                Stats::add(&stats.listed, 1);
                Stats::add(&stats.failed, 1);
                false
            }
        });
    }
    if let Some(addr) = &a.metrics {
        serve_metrics(addr, stats.clone()).await?;
    }
    if let Some(url) = a.job.clone() {
        let board = sync::job::open(&url).await?;
        // Object stores are compared by their spec (workers may reach one by different
        // endpoints); directories and volumes by what they are on this host.
        let job_id = |id: &str| {
            (id.starts_with("directory ") || id.starts_with("volume path ")).then(|| id.to_string())
        };
        let spec = sync::job::Spec {
            src: src_spec.clone(),
            dst: dst_spec.clone(),
            src_id: job_id(&src_id),
            dst_id: job_id(&dst_id),
            identity: identity.clone(),
            delete_dst: a.delete_dst,
            max_delete: a.max_delete.clone(),
            from_journal: a.from_journal,
            legacy_identity: Some(req.legacy_identity()),
        };
        if plan_only {
            let created = if a.from_journal {
                sync::job::plan_round(&*board, &spec, &*src, &*dst, a.bwlimit.as_deref(), a.tps)
                    .await?
            } else {
                board.create(&spec, a.bwlimit.as_deref(), a.tps).await?
            };
            let have = board.spec().await?;
            if !have.as_ref().is_some_and(|h| h.same_work(&spec)) {
                bail!("a job of this name exists for other work ({:?}): choose another name, or `jfs-sync job delete` it", have.map(|h| (h.src, h.dst)));
            }
            cli_common::eprintln!(
                "jfs-sync: job {} {}; start workers with: jfs-sync {src_spec} {dst_spec} --job '{}' (and the same options)",
                meta::redact(&url),
                if created { "created" } else { "exists already" },
                meta::redact(&url)
            );
            return Ok(0);
        }
        let quiet = c.json && !std::io::stderr().is_terminal() && !a.progress;
        let wo = sync::job::WorkerOptions {
            worker: a
                .worker
                .clone()
                .unwrap_or_else(sync::job::default_worker_name),
            lease: a.lease,
            max_attempts: 10,
            slots: a.job_slots.max(1),
            threads: c.threads,
            every: a
                .progress_interval
                .map(Duration::from_secs)
                .unwrap_or(a.stats),
            quiet,
        };
        let metrics = a.metrics.as_ref().map(|_| stats.clone());
        tracing::info!(job = %meta::redact(&url), worker = %wo.worker, "joining the shared job");
        let r = sync::job::work(
            board,
            spec,
            src,
            dst,
            opts,
            state.clone(),
            wo,
            metrics,
            signals(),
            a.bwlimit.as_deref(),
        )
        .await?;
        if let Some(m) = &r.message {
            cli_common::eprintln!("jfs-sync: {m}");
        }
        if r.state != "deleted" {
            cli_common::eprintln!(
                "jfs-sync: job {}: {}; {} units, {} reassigned after a lost lease",
                r.state,
                r.summary.line(),
                r.units,
                r.reassigned
            );
        }
        cli_common::eprintln!(
            "jfs-sync: this worker: {}; {} saves refused (lease lost)",
            r.worker.line(),
            r.refused
        );
        if c.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        return Ok(r.code);
    }
    let journal_head = if a.from_journal {
        sync::journal::prepare(&*src, &*dst, state.as_deref(), &mut opts).await?
    } else {
        None
    };
    let quiet = c.json && !std::io::stderr().is_terminal() && !a.progress;
    if std::io::stderr().is_terminal() && !quiet {
        sync::progress::count_ahead(&src, &opts, state.as_deref(), &stats)?;
    }
    let every = a
        .progress_interval
        .map(Duration::from_secs)
        .unwrap_or(a.stats);
    let ticker = sync::progress::progress(stats.clone(), every, quiet);
    tracing::info!(src = %src_spec, dst = %dst_spec, "sync starting");
    let report = run::sync(src, dst, opts, state.clone(), stats, signals()).await?;
    tracing::info!(summary = %report.summary.line(), "sync finished");
    ticker.abort();
    if let (Some(head), Some(st)) = (journal_head, &state) {
        if report.exit_code() == 0 {
            st.set_journal_seq(head)?;
        }
    }
    if let Some(f) = &report.fatal {
        cli_common::eprintln!("jfs-sync: error: {f}");
    }
    if report.interrupted {
        cli_common::eprintln!(
            "jfs-sync: interrupted; progress saved, run the same command again to resume"
        );
    }
    cli_common::eprintln!("jfs-sync: {}", report.summary.line());
    if c.json {
        println!("{}", serde_json::to_string(&report.summary)?);
    }
    Ok(report.exit_code())
}

async fn job_cmd(j: JobCmd) -> Result<i32> {
    use sync::job;
    match j {
        JobCmd::Status { job: url, json } => {
            let b = job::open(&url).await?;
            let st = job::status(&*b, &url).await?;
            if json {
                println!("{}", serde_json::to_string(&st)?);
            } else {
                print!("{}", st.text());
            }
            Ok(0)
        }
        JobCmd::Pause { job: url } => job_state(&url, "paused", &["running"]).await,
        JobCmd::Resume { job: url } => job_state(&url, "running", &["paused"]).await,
        JobCmd::Cancel { job: url } => job_state(&url, "cancelled", &["running", "paused"]).await,
        JobCmd::Set {
            job: url,
            bwlimit,
            tps,
        } => {
            if bwlimit.is_none() && tps.is_none() {
                bail!("jfs-sync job set: give --bwlimit and/or --tps");
            }
            if let Some(b) = &bwlimit {
                BwSchedule::parse(b).with_context(|| format!("--bwlimit {b:?}"))?;
            }
            let b = open_job(&url).await?;
            let c = b.control().await?;
            let bw = match bwlimit {
                Some(x) if x == "off" || x == "0" => None,
                Some(x) => Some(x),
                None => c.bwlimit,
            };
            let tps = match tps {
                Some(0) => None,
                Some(t) => Some(t),
                None => c.tps,
            };
            b.set_limits(bw.as_deref(), tps).await?;
            cli_common::eprintln!(
                "jfs-sync: job limits now bwlimit {}, tps {} (workers take them up within a third of their lease)",
                bw.as_deref().unwrap_or("off"),
                tps.map_or("off".into(), |t| t.to_string())
            );
            Ok(0)
        }
        JobCmd::Delete { job: url, force } => {
            let b = job::open(&url).await?;
            let units = b.units().await?;
            let held = units
                .iter()
                .filter(|u| u.state == "running" && u.lease_left_ms.is_some_and(|l| l > 0))
                .count();
            if held > 0 && !force {
                bail!("{held} unit(s) are held by live workers: `jfs-sync job cancel` first (or --force)");
            }
            b.remove().await?;
            cli_common::eprintln!("jfs-sync: job {} removed", meta::redact(&url));
            Ok(0)
        }
        JobCmd::Create { .. } => unreachable!("handled with the sync"),
    }
}

/// Move a job to `want` from one of the states `from`.
async fn job_state(url: &str, want: &str, from: &[&str]) -> Result<i32> {
    let b = open_job(url).await?;
    let c = b.control().await?;
    if c.state == want {
        cli_common::eprintln!("jfs-sync: job {} is {want} already", meta::redact(url));
        return Ok(0);
    }
    if !from.contains(&c.state.as_str()) {
        bail!(
            "job {} is {}: it cannot become {want}",
            meta::redact(url),
            c.state
        );
    }
    if !b.set_state(want, Some(&c.state)).await? {
        let now = b.control().await?.state;
        bail!(
            "job {} became {now} meanwhile: it cannot become {want} from there; look again with `jfs-sync job status`",
            meta::redact(url)
        );
    }
    cli_common::eprintln!(
        "jfs-sync: job {} {want} (workers see it within a third of their lease)",
        meta::redact(url)
    );
    Ok(0)
}

/// An existing job, joined (`Board::bind`), for the commands that change it: a job deleted
/// meanwhile is then never written back.
async fn open_job(url: &str) -> Result<Arc<dyn sync::job::Board>> {
    let b = sync::job::open(url).await?;
    match b.bind().await {
        Ok(_) => Ok(b),
        Err(e) if sync::job::is_gone(&e) => bail!("no job at {}", meta::redact(url)),
        Err(e) => Err(e),
    }
}

fn refuse_overlap(src: &[(String, place::Place)], dst: &[(String, place::Place)]) -> Result<()> {
    if let Some(why) = place::find(src, dst) {
        bail!("SRC and DST overlap: {why}; nothing was copied or deleted (copying a tree into itself, or out of itself with deletes, loses data): choose a destination outside the source");
    }
    Ok(())
}

/// A volume's block store (found by its `<volume>/jfs_volume` record) is the volume's, not a
/// directory to sync into or delete from: a plain sync there overwrites or deletes blocks
/// that committed files name. Refused when `spec` is a local directory that is such a store,
/// inside one, or holds one; `jfs://` endpoints reach their store through the volume.
fn refuse_volume_store(spec: &str, places: &[(String, place::Place)], role: &str) -> Result<()> {
    if spec.starts_with("jfs://") {
        return Ok(());
    }
    for (_, p) in places {
        let place::Place::Local(d) = p else {
            continue;
        };
        let record = fs_core::owner::RECORD;
        let mut found = d.ancestors().map(|a| a.join(record)).find(|r| r.is_file());
        if found.is_none() {
            // A store's root holds one directory per volume (few): a large directory is no
            // store's root, and is not read through.
            if let Ok(rd) = std::fs::read_dir(d) {
                found = rd
                    .flatten()
                    .take(1000)
                    .map(|e| e.path().join(record))
                    .find(|r| r.is_file());
            }
        }
        if let Some(r) = found {
            bail!(
                "{role} {} is, is inside, or holds a volume's block store ({} names the volume that owns it): a plain sync there would overwrite or delete blocks the volume's files are made of; nothing was copied or deleted. Copy a volume with jfs:// endpoints, or choose another directory",
                d.display(),
                r.display()
            );
        }
    }
    Ok(())
}

/// `refuse_volume_store` for an object store: the prefix is a volume's store (a `jfs_volume`
/// record under one of its first-level prefixes, at most 1000 looked at), is one volume's
/// part of it (a record right there), or lies inside one (an `s3://` prefix whose ancestor
/// holds the record).
async fn refuse_object_volume_store(
    spec: &str,
    opened: &dyn endpoint::Endpoint,
    ep: Option<&str>,
    role: &str,
) -> Result<()> {
    use endpoint::Endpoint as _;
    let Some(store) = opened.as_object_store() else {
        return Ok(());
    };
    let record = fs_core::owner::RECORD;
    let refuse = |at: String| {
        anyhow::anyhow!(
            "{role} {} is, is inside, or holds a volume's block store ({at} names the volume that owns it): a plain sync there would overwrite or delete blocks the volume's files are made of; nothing was copied or deleted. Copy a volume with jfs:// endpoints, or choose another prefix",
            objstore::secrets::redact(spec)
        )
    };
    if store.stat(record).await?.is_some() {
        return Err(refuse(record.to_string()));
    }
    for e in store.list_level("").await?.into_iter().take(1000) {
        if e.kind == endpoint::Kind::Dir || e.key.ends_with('/') {
            let k = format!("{}/{record}", e.key.trim_end_matches('/'));
            if store.stat(&k).await?.is_some() {
                return Err(refuse(k));
            }
        }
    }
    // Inside one: each ancestor prefix of an s3:// spec, opened on its own.
    if let Some(rest) = spec.strip_prefix("s3://") {
        let (path, query) = rest
            .split_once('?')
            .map_or((rest, None), |(p, q)| (p, Some(q)));
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        for n in (1..parts.len()).rev() {
            let up = format!(
                "s3://{}{}",
                parts[..n].join("/"),
                query.map(|q| format!("?{q}")).unwrap_or_default()
            );
            let above = endpoint::open(&up, ep, false, false).await?;
            if let Some(o) = above.as_object_store() {
                if o.stat(record).await?.is_some() {
                    return Err(refuse(format!("{up}/{record}")));
                }
            }
        }
    }
    Ok(())
}

async fn check(a: crate::cli::CheckArgs) -> Result<i32> {
    let src = endpoint::open(&norm(&a.src), a.common.endpoint.as_deref(), false, false)
        .await
        .with_context(|| format!("source {}", a.src))?;
    let dst = endpoint::open(&norm(&a.dst), a.common.endpoint.as_deref(), false, false)
        .await
        .with_context(|| format!("destination {}", a.dst))?;
    let r = sync::check::check(src, dst, a.download, a.common.threads).await?;
    if a.list || !a.common.json {
        for (k, what) in &r.keys {
            if a.list {
                println!("{what} {k}");
            }
        }
    }
    if a.common.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        for u in &r.unreadable_files {
            cli_common::eprintln!("jfs-sync check: {}: unreadable, {}", u.key, u.error);
        }
        cli_common::eprintln!(
            "jfs-sync check: {} same, {} missing, {} differing, {} extra{}",
            r.same,
            r.missing,
            r.differing,
            r.extra,
            if r.unreadable > 0 {
                format!(", {} unreadable (named above)", r.unreadable)
            } else {
                String::new()
            }
        );
    }
    // Extra objects are a difference too: the two sides are not the same (rclone's `check`
    // counts them the same way). An unreadable file could not be compared.
    Ok(if r.missing + r.differing + r.extra + r.unreadable > 0 {
        1
    } else {
        0
    })
}
