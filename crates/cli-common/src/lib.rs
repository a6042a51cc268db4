//! What `jfs`, `jfs-sync` and `mirror-agent` share on the command line:
//!
//! - `matches`: clap parsing whose "did you mean" never points at a destructive flag or
//!   subcommand the user did not type (`--delete-after` must not suggest `--delete-src`);
//! - `init_logging`: tracing on stderr, human or JSON, with ANSI colour only when stderr is a
//!   terminal and `NO_COLOR` is unset, so log files and pipes stay greppable;
//! - `quiet_on_closed_pipe` / `closed_pipe`: a reader that goes away (`jfs status | head -1`)
//!   ends the command quietly with exit code 0, as it ends `cat`, instead of a panic or an
//!   error line.
//! - A closed **stderr** ends nothing: `cli_common::eprintln!` / `eprint!` (used instead of
//!   std's, which panic when the write fails) and the log writer drop what cannot be written,
//!   so a daemon or a copy whose log reader went away goes on with its work.
//! - `private`: directories of this user's alone (created 0700, planted ones refused), and
//!   `open_private_log`: a log file opened 0600 without following a link.

pub mod names;
pub mod private;

/// Open (append, create) a log file the process was told to write, `what` naming it and
/// the option that gives it (e.g. "--log-file"): 0600 when created (a log names the
/// volume's files), never through a symbolic link, and never a file another user owns (they
/// would read it); one of this user's that others may read is narrowed to 0600.
pub fn open_private_log(path: &std::path::Path, what: &str) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                anyhow::anyhow!("the log file {} is a symbolic link: refusing to write through it (give the file itself with {what}, or remove the link)", path.display())
            } else {
                anyhow::anyhow!("opening the log file {}: {e}", path.display())
            }
        })?;
    let m = f.metadata()?;
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != me {
        anyhow::bail!(
            "the log file {} belongs to uid {}, not to this user (uid {me}): they could read what is logged; give a file of your own with {what} (or remove that one)",
            path.display(),
            m.uid()
        );
    }
    if m.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
}

use clap::error::{ContextKind, ContextValue, ErrorKind};
use std::io::IsTerminal;

/// Names (long flags with their dashes, or subcommands) whose suggestion must never be made.
pub type Destructive<'a> = &'a [&'a str];

fn names_destructive(v: &ContextValue, destructive: Destructive<'_>) -> bool {
    // Anywhere in the text, not only at its start: clap suggests a subcommand's flag with the
    // subcommand in front ("tip: 'check --delete-src' exists").
    let hit = |s: &str| {
        s.split_whitespace().any(|w| {
            let w = w.trim_matches(['\'', '"', '[', ']', ',', '`']);
            destructive
                .iter()
                .any(|d| w == *d || w.starts_with(&format!("{d}=")))
        })
    };
    match v {
        ContextValue::String(s) => hit(s),
        ContextValue::Strings(v) => v.iter().any(|s| hit(s)),
        ContextValue::StyledStr(s) => hit(&s.to_string()),
        ContextValue::StyledStrs(v) => v.iter().any(|s| hit(&s.to_string())),
        _ => false,
    }
}

/// Drop suggestions that name a destructive flag or subcommand. clap also writes the
/// suggested flag into the usage line it shows; that line becomes `cmd`'s plain usage.
pub fn sanitize(
    mut e: clap::Error,
    cmd: &mut clap::Command,
    destructive: Destructive<'_>,
) -> clap::Error {
    for kind in [
        ContextKind::SuggestedArg,
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedCommand,
        ContextKind::Suggested,
        ContextKind::Usage,
    ] {
        if e.get(kind)
            .is_some_and(|v| names_destructive_anywhere(v, destructive))
        {
            e.remove(kind);
            if kind == ContextKind::Usage {
                e.insert(kind, ContextValue::StyledStr(cmd.render_usage()));
            }
        }
    }
    e
}

/// A usage line naming a destructive flag anywhere in it ("Usage: x --delete-src <SRC>").
fn names_destructive_anywhere(v: &ContextValue, destructive: Destructive<'_>) -> bool {
    if names_destructive(v, destructive) {
        return true;
    }
    let text = match v {
        ContextValue::StyledStr(s) => s.to_string(),
        ContextValue::String(s) => s.clone(),
        _ => return false,
    };
    text.split_whitespace().any(|w| {
        destructive
            .iter()
            .any(|d| d.starts_with("--") && w.trim_matches(['[', ']', '\'', ',']) == *d)
    })
}

/// Parse the process's arguments; on a parse error print it (without destructive
/// suggestions) and exit 2, as clap does.
pub fn matches(
    cmd: clap::Command,
    args: &[std::ffi::OsString],
    destructive: Destructive<'_>,
) -> clap::ArgMatches {
    let mut plain = cmd.clone();
    match cmd.try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) => sanitize(e, &mut plain, destructive).exit(),
    }
}

/// Options typed before a subcommand that takes them too (`jfs-sync -v check A B`, where the
/// top level's own positionals would otherwise swallow `check`) are moved after its name;
/// anything else is left for clap to judge.
pub fn hoist_options(
    cmd: &clap::Command,
    args: Vec<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    // Some(whether the next token is its value) for an option `c` defines; None otherwise.
    let find = |c: &clap::Command, tok: &str| -> Option<bool> {
        let (name, inline) = match tok.split_once('=') {
            Some((n, _)) => (n, true),
            None => (tok, false),
        };
        let a = c.get_arguments().find(|a| match name.strip_prefix("--") {
            Some(long) => a.get_long() == Some(long),
            // `-v`, `-vv`: one short flag, maybe repeated.
            None => {
                let mut ch = name.chars().skip(1);
                let first = ch.next();
                first.is_some() && a.get_short() == first && ch.all(|x| Some(x) == first)
            }
        })?;
        Some(!inline && a.get_action().takes_values())
    };
    let mut i = 1;
    while i < args.len() {
        let Some(tok) = args[i].to_str() else {
            return args;
        };
        if !tok.starts_with('-') || tok == "-" {
            break;
        }
        match find(cmd, tok) {
            Some(true) => i += 2,
            Some(false) => i += 1,
            None => return args,
        }
    }
    let (Some(name), true) = (args.get(i).and_then(|a| a.to_str()), i > 1) else {
        return args;
    };
    let Some(sub) = cmd.find_subcommand(name) else {
        return args;
    };
    // Every moved option must be one the subcommand takes.
    let mut j = 1;
    while j < i {
        let tok = args[j].to_str().unwrap_or_default();
        match find(sub, tok) {
            Some(true) => j += 2,
            Some(false) => j += 1,
            None => return args,
        }
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend_from_slice(&args[1..i]);
    out.extend_from_slice(&args[i + 1..]);
    out
}

/// Parse into a clap derive type, with `matches`' care about suggestions and `hoist_options`.
pub fn parse<T: clap::Parser>(destructive: Destructive<'_>) -> (T, clap::ArgMatches) {
    let cmd = <T as clap::CommandFactory>::command();
    let args = hoist_options(&cmd, std::env::args_os().collect());
    let m = matches(cmd, &args, destructive);
    match <T as clap::FromArgMatches>::from_arg_matches(&m) {
        Ok(t) => (t, m),
        Err(e) => e.exit(),
    }
}

/// Whether log lines should carry ANSI colour: only on a terminal, and never with NO_COLOR.
pub fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Set up tracing on stderr. `filter_env` (e.g. `JFS_LOG`) takes a tracing filter that
/// overrides `level`.
pub fn init_logging(level: &str, json: bool, filter_env: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(filter_env)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // A failed write of a log line is dropped, never reported on stderr (that report would be
    // std's `eprintln!`, which panics when stderr is the closed pipe).
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour())
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// std's `eprintln!`, except that a failed write (stderr is a closed pipe: the reader of
/// the command's messages went away) is dropped instead of panicking: a message is never
/// worth the command's work.
#[macro_export]
macro_rules! eprintln {
    () => {
        $crate::eprint!("\n")
    };
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}

/// std's `eprint!` without the panic (see `eprintln!`).
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stderr().lock(), $($arg)*);
    }};
}

/// Make a print to a closed stdout (`println!` panics on a broken pipe, and the binaries
/// print with it throughout) a quiet panic: no message, and `on_closed_pipe` turns it into a
/// normal end. Other panics are reported as before. Call first thing in `main`.
pub fn quiet_on_closed_pipe() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        previous(info)
    }));
}

/// Run the command `f`; `None` when it ended because its stdout was closed (the reader went
/// away, which is not the command's failure: exit 0). The caller then shuts down as after a
/// normal end (runtimes and databases dropped in order). Any other panic goes on.
pub fn on_closed_pipe<T>(f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) if STDOUT_CLOSED.load(std::sync::atomic::Ordering::SeqCst) => None,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Whether an error (given as its chain, e.g. `anyhow::Error::chain`) is a write to a closed
/// pipe: the command's reader went away, which is not the command's failure.
pub fn closed_pipe<'a>(
    mut chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> bool {
    chain.any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// An error and its causes as one line, "outer: inner: root", like anyhow's `{:#}`, except
/// that a cause whose text the line already ends with is not repeated (an error that quotes
/// the OS error it keeps as its source).
pub fn chain_text<'a>(
    chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut out = String::new();
    for e in chain {
        let t = e.to_string();
        if out.is_empty() {
            out = t;
        } else if !out.ends_with(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
    }
    out
}

/// The one signal handler of every binary and the mount: a token cancelled on the first
/// SIGTERM or SIGINT (logging `what`, e.g. "interrupted: saving progress"); a second one exits the process at once
/// (exit code 2), for an operator who does not want to wait for the drain.
///
/// The handlers are registered before this returns (call it inside the runtime): a signal
/// that arrives any time after the call cancels the token. Registered in the spawned task
/// instead, a SIGTERM sent just after a process said it was ready was taken by an earlier
/// listener (`jfs`'s own) and never reached this one: the mount went on serving.
pub fn shutdown_on_signals(what: &'static str) -> tokio_util::sync::CancellationToken {
    use tokio::signal::unix::{signal, SignalKind};
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!(
            "cannot install signal handlers: SIGTERM and SIGINT end the process at once"
        );
        return token;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("{what} (a second signal exits at once)");
        t.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        std::process::exit(2);
    });
    token
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        clap::Command::new("t")
            .arg(
                clap::Arg::new("delete-src")
                    .long("delete-src")
                    .action(clap::ArgAction::SetTrue),
            )
            .arg(
                clap::Arg::new("dry-run")
                    .long("dry-run")
                    .action(clap::ArgAction::SetTrue),
            )
    }

    fn rendered(args: &[&str]) -> String {
        let e = cmd().try_get_matches_from(args).unwrap_err();
        sanitize(e, &mut cmd(), &["--delete-src"])
            .render()
            .to_string()
    }

    #[test]
    fn options_before_a_subcommand_that_takes_them_move_after_it() {
        let common = |c: clap::Command| {
            c.arg(
                clap::Arg::new("verbose")
                    .short('v')
                    .long("verbose")
                    .action(clap::ArgAction::Count),
            )
            .arg(clap::Arg::new("endpoint").long("endpoint"))
        };
        let cmd = common(clap::Command::new("t"))
            .arg(clap::Arg::new("src"))
            .arg(clap::Arg::new("dst"))
            .args_conflicts_with_subcommands(true)
            .subcommand(common(clap::Command::new("check")).arg(clap::Arg::new("a")))
            .subcommand(clap::Command::new("job").arg(clap::Arg::new("j")));
        let h = |a: &[&str]| {
            hoist_options(&cmd, a.iter().map(Into::into).collect())
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(h(&["t", "-vv", "check", "x"]), ["t", "check", "-vv", "x"]);
        assert_eq!(
            h(&["t", "--endpoint", "check", "-v", "check", "x"]),
            ["t", "check", "--endpoint", "check", "-v", "x"]
        );
        assert_eq!(
            h(&["t", "--endpoint=e", "check", "x"]),
            ["t", "check", "--endpoint=e", "x"]
        );
        // Left alone: no subcommand, an option the subcommand lacks, nothing before it.
        for a in [
            &["t", "-v", "a", "b"][..],
            &["t", "-v", "job", "j"],
            &["t", "check", "-v", "x"],
            &["t", "--unknown", "check"],
        ] {
            assert_eq!(h(a), a);
        }
        let m = cmd
            .clone()
            .try_get_matches_from(h(&["t", "-v", "check", "x"]))
            .unwrap();
        assert_eq!(
            m.subcommand_matches("check").unwrap().get_count("verbose"),
            1
        );
    }

    #[test]
    fn a_cause_already_quoted_is_not_repeated() {
        #[derive(Debug)]
        struct Quoting(std::io::Error);
        impl std::fmt::Display for Quoting {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "writing k: {}", self.0)
            }
        }
        impl std::error::Error for Quoting {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Quoting(std::io::Error::from_raw_os_error(30));
        let chain = std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        });
        assert_eq!(
            chain_text(chain),
            "writing k: Read-only file system (os error 30)"
        );
        let io = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            chain_text(std::iter::once(&io as &(dyn std::error::Error + 'static))),
            "No such file or directory (os error 2)"
        );
    }

    #[test]
    fn destructive_flags_are_never_suggested() {
        let plain = cmd()
            .try_get_matches_from(["t", "--delete-srx"])
            .unwrap_err()
            .render()
            .to_string();
        assert!(plain.contains("--delete-src"), "clap suggests it: {plain}");
        let out = rendered(&["t", "--delete-srx"]);
        assert!(!out.contains("--delete-src"), "{out}");
        assert!(
            out.contains("--delete-srx"),
            "the typo is still named: {out}"
        );
        // Harmless suggestions stay.
        assert!(rendered(&["t", "--dry-rn"]).contains("--dry-run"));
    }

    /// A typo of a subcommand's destructive flag typed before the subcommand: clap's tip names
    /// it with the subcommand in front ("'check --delete-src' exists"), which is dropped too.
    #[test]
    fn a_subcommands_destructive_flag_is_never_suggested_with_the_subcommand_in_front() {
        let with_sub =
            || clap::Command::new("t").subcommand(cmd().name("check").arg(clap::Arg::new("src")));
        let args = ["t", "--delete-sr", "check"];
        let plain = with_sub()
            .try_get_matches_from(args)
            .unwrap_err()
            .render()
            .to_string();
        assert!(
            plain.contains("'check --delete-src'"),
            "clap suggests it: {plain}"
        );
        let e = with_sub().try_get_matches_from(args).unwrap_err();
        let out = sanitize(e, &mut with_sub(), &["--delete-src"])
            .render()
            .to_string();
        assert!(!out.contains("--delete-src"), "{out}");
        assert!(
            out.contains("--delete-sr"),
            "the typo is still named: {out}"
        );
    }
}
