//! `jfs`: the admin CLI of a volume. Thin wiring: parse flags, set up logging, run a command,
//! turn the outcome into an exit code (0 done, 1 partial failure, 2 error).

mod cli;
mod cmd;
mod progress;

use std::process::ExitCode;

/// Never suggested for a mistyped flag or subcommand.
const DESTRUCTIVE: &[&str] = &["--delete", "--force", "rm", "truncate"];

fn main() -> ExitCode {
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
            eprintln!("jfs: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    rt.spawn(cmd::watch_signals());
    match rt.block_on(cmd::run(args)) {
        Ok(cmd::Outcome::Done) => ExitCode::SUCCESS,
        Ok(cmd::Outcome::Partial) => ExitCode::from(1),
        Err(e) => {
            eprintln!("jfs: error: {e:#}");
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
