//! `jfs`: the admin CLI of a volume. Thin wiring: parse flags, set up logging, run a command,
//! turn the outcome into an exit code (0 done, 1 partial failure, 2 error).

mod cli;
mod cmd;
mod progress;

use std::process::ExitCode;

/// Never suggested for a mistyped flag or subcommand.
const DESTRUCTIVE: &[&str] = &[
    "--delete", "--force", "rm", "truncate", "--purge", "recover",
];

/// glibc's malloc serves the 4 MiB blocks of reads with fresh mmaps (page faults on every
/// block) and spreads the rest over up to 8 arenas per core, each keeping what it freed: a
/// mount reading a 1 GiB file with 300 MiB of buffers ran at ~600 MB/s and peaked at 520 MiB.
/// With blocks from the heap (mmap threshold 32 MiB) and two arenas it ran at ~1.1 GB/s and
/// peaked at 365-400 MiB. These are glibc tunables, read at start, so `jfs mount` (and the
/// long copies of `get`/`put`) start themselves again with them set, unless set already.
fn fix_malloc_threshold() {
    use std::os::unix::process::CommandExt;
    const T: &str = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.arena_max=2";
    let long_running = std::env::args_os()
        .skip(1)
        .any(|a| a == "mount" || a == "get" || a == "put");
    let cur = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !long_running || cur.contains("glibc.malloc.") {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let v = if cur.is_empty() {
        T.to_string()
    } else {
        format!("{cur}:{T}")
    };
    let e = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", v)
        .exec();
    cli_common::eprintln!("jfs: could not restart with its malloc settings ({e}); going on");
}

fn main() -> ExitCode {
    cli_common::quiet_on_closed_pipe();
    fix_malloc_threshold();
    // `jfs mount` starts a copy of itself as its mount guard (see mount::guard).
    let mut raw = std::env::args_os().skip(1);
    if raw.next().is_some_and(|a| a == mount::guard::ARG) {
        let mp = raw.next().map(std::path::PathBuf::from).unwrap_or_default();
        return ExitCode::from(mount::guard::main(mp) as u8);
    }
    let (args, _) = cli_common::parse::<cli::Cli>(DESTRUCTIVE);
    init_logging(&args.global);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            cli_common::eprintln!("jfs: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    rt.spawn(cmd::watch_signals(cmd::cleans_up_on_signal(&args.cmd)));
    let run = async {
        let r = cmd::run(args).await;
        // Volumes opened as writers leave no session behind (a mount closes its own).
        volume::end_sessions(std::time::Duration::from_secs(5)).await;
        r
    };
    match cli_common::on_closed_pipe(|| rt.block_on(run)) {
        None => ExitCode::SUCCESS,
        Some(Ok(cmd::Outcome::Done)) => ExitCode::SUCCESS,
        Some(Ok(cmd::Outcome::Partial)) => ExitCode::from(1),
        Some(Err(e)) if cli_common::closed_pipe(e.chain()) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            cli_common::eprintln!("jfs: error: {}", cli_common::chain_text(e.chain()));
            ExitCode::from(2)
        }
    }
}

fn init_logging(g: &cli::Global) {
    let level = match (g.quiet, g.verbose) {
        (true, _) => "error",
        (_, 0) => "warn",
        (_, 1) => "info",
        (_, 2) => "debug",
        _ => "trace",
    };
    cli_common::init_logging(level, g.log_format == cli::LogFormat::Json, "JFS_LOG");
}
