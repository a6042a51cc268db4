//! Decoder harness of the command line as the binaries take it (see `fs_core::fuzz` for the
//! kit, the case count and the seed): argument lists, valid ones damaged by dropping,
//! repeating, swapping and mangling tokens. `hoist_options` only ever moves a subcommand's
//! name in front of options that subcommand takes (the arguments are the same, in the same
//! order otherwise), and a parse error, once `sanitize`d, never suggests a destructive flag
//! or subcommand the user did not type. Never a panic.

use crate::{hoist_options, sanitize, Destructive};
use clap::{Arg, ArgAction, Command};
use fs_core::fuzz::{self, apply, damages};
use proptest::prelude::*;
use std::ffi::OsString;

const DESTRUCTIVE: Destructive<'static> = &["--delete-src", "--delete-dst", "purge"];

fn common(c: Command) -> Command {
    c.arg(Arg::new("verbose").short('v').action(ArgAction::Count))
        .arg(Arg::new("limit").long("limit").num_args(1))
}

fn cmd() -> Command {
    let sub = |name: &'static str| {
        common(Command::new(name))
            .arg(
                Arg::new("delete-src")
                    .long("delete-src")
                    .action(ArgAction::SetTrue),
            )
            .arg(
                Arg::new("delete-dst")
                    .long("delete-dst")
                    .action(ArgAction::SetTrue),
            )
            .arg(
                Arg::new("delete-after")
                    .long("delete-after")
                    .action(ArgAction::SetTrue),
            )
            .arg(Arg::new("src").required(true))
            .arg(Arg::new("dst"))
    };
    common(Command::new("jfs-sync"))
        .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
        .arg(Arg::new("src"))
        .arg(Arg::new("dst"))
        .subcommand(sub("check"))
        .subcommand(sub("copy"))
        .subcommand(Command::new("purge").arg(Arg::new("what")))
}

const TOKENS: &[&str] = &[
    "-v",
    "-vv",
    "--limit",
    "5",
    "--limit=5",
    "--json",
    "check",
    "copy",
    "purge",
    "--delete-after",
    "--delete-a",
    "--delete-sr",
    "--delete-ds",
    "--delete",
    "--dry-run",
    "A",
    "B",
    "-",
    "--",
    "-x",
    "chek",
    "purg",
    "--limit=",
];

#[test]
fn fuzz_command_lines() {
    let mut base = cmd();
    base.build();
    fuzz::run(
        "command_lines",
        (
            proptest::collection::vec(proptest::sample::select(TOKENS), 0..7),
            proptest::option::of((0usize..8, damages(12))),
        ),
        |(tokens, mangle)| {
            let mut args: Vec<OsString> = std::iter::once("jfs-sync")
                .chain(tokens.iter().copied())
                .map(OsString::from)
                .collect();
            if let Some((i, d)) = &mangle {
                let i = 1 + i % args.len().max(1);
                if let Some(a) = args.get_mut(i) {
                    let bytes = apply(a.as_encoded_bytes(), d);
                    // Any bytes (not only UTF-8) are an argument on Unix.
                    *a = std::os::unix::ffi::OsStringExt::from_vec(bytes);
                }
            }
            let out = hoist_options(&base, args.clone());
            prop_assert_eq!(out.len(), args.len());
            prop_assert_eq!(&out[0], &args[0]);
            if out != args {
                // Only a subcommand's name moved in front of the options before it.
                let name = out[1].to_str().unwrap_or_default();
                prop_assert!(base.find_subcommand(name).is_some(), "{out:?}");
                let mut rest = out.clone();
                let moved = rest.remove(1);
                let undone = (1..args.len()).any(|at| {
                    let mut back = rest.clone();
                    back.insert(at, moved.clone());
                    back == args
                });
                prop_assert!(undone, "{out:?} is not {args:?} with its subcommand moved");
            }
            // Help and version are what was asked for (they list every flag), not errors.
            let shown_help = |e: &clap::Error| {
                use clap::error::ErrorKind as K;
                matches!(
                    e.kind(),
                    K::DisplayHelp
                        | K::DisplayVersion
                        | K::DisplayHelpOnMissingArgumentOrSubcommand
                )
            };
            if let Some(e) = cmd()
                .try_get_matches_from(&out)
                .err()
                .filter(|e| !shown_help(e))
            {
                let mut plain = cmd();
                let shown = sanitize(e, &mut plain, DESTRUCTIVE).render().to_string();
                for d in DESTRUCTIVE {
                    // What the user typed is named back as typed (clap quotes an unknown
                    // subcommand, dropping control characters), not suggested.
                    let typed = out.iter().any(|a| {
                        let shown: String = a
                            .to_string_lossy()
                            .chars()
                            .filter(|c| !c.is_control())
                            .collect();
                        shown.contains(d)
                    });
                    let named = if d.starts_with("--") {
                        shown.contains(d)
                    } else {
                        shown.contains(&format!("'{d}'"))
                    };
                    prop_assert!(typed || !named, "{d} suggested for {out:?}: {shown}");
                }
            }
            Ok(())
        },
    );
}
