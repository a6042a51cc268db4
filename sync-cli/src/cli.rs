//! Command-line flags (clap derive; `jfs-sync --help` is built from these doc comments).

use clap::{Args, Parser, Subcommand};
use fs_core::parse_size;
use std::path::PathBuf;

/// Sync the contents of SRC into DST: local directories, S3-compatible stores
/// (s3://bucket/prefix), memory://, and volumes (jfs://NAME/path, where the environment
/// variable NAME holds the volume's META_URL). A trailing slash on either side means the same
/// as none.
///
/// Change detection: size and modification time, compared at the coarser side's precision;
/// against an object store (where a listed time is the upload time) a copy is current when it
/// was uploaded at or after the source's last change. --checksum compares contents (CRC32C).
///
/// Filters (--include/--exclude, rsync style, tried in the order given): `*` matches within a
/// path component, `**` across; a pattern without '/' matches a component at any depth, one with
/// '/' is anchored at the top; a trailing '/' matches directories only. A key a/b/c is tested
/// layer by layer (a/, a/b/, a/b/c): at each layer the first matching rule decides, an exclude is
/// final, an include ends the layer. Keys no rule excludes are included. Excluded keys are never
/// deleted from DST.
///
/// Resume: progress is kept in a state directory (default ~/.cache/jfs-sync/<hash of SRC, DST and
/// options>); a run killed at any point and started again with the same command continues where
/// it stopped without copying finished objects again. SIGINT/SIGTERM save progress and exit 2.
///
/// Safety: nothing is deleted after any listing or copy error; --max-delete refuses to delete
/// more; files land under a temporary name and are renamed into place; object keys that could
/// escape the destination (.., absolute, NUL, backslashes, drive letters, overlong) are refused
/// and named, and the run goes on.
///
/// Exit codes: 0 all done; 1 some objects failed; 2 fatal (bad arguments, unreachable endpoint,
/// listing failed, --max-delete refused, interrupted).
#[derive(Parser, Debug)]
#[command(
    name = "jfs-sync",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub sync: SyncArgs,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Compare SRC and DST: report missing, differing and extra objects (exit 1 if any differ).
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    pub src: String,
    pub dst: String,
    /// Compare contents byte for byte (CRC32C of both sides), not just size.
    #[arg(long)]
    pub download: bool,
    /// Print every differing key.
    #[arg(long, short = 'v')]
    pub list: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// S3 endpoint URL (else from the URL's ?endpoint= or AWS_ENDPOINT_URL).
    #[arg(long, global = true)]
    pub endpoint: Option<String>,
    /// Concurrent object transfers.
    #[arg(long, short = 'p', default_value_t = 16, global = true)]
    pub threads: usize,
    /// Final statistics as one JSON object on the last line of stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log format on stderr (human or json).
    #[arg(long, default_value = "human", global = true)]
    pub log_format: String,
    /// More logging (-v, -vv).
    #[arg(long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

#[derive(Args, Debug, Default)]
pub struct SyncArgs {
    /// Source: a directory, s3://bucket/prefix, memory:// or jfs://NAME/path.
    #[arg(required = true)]
    pub src: Option<String>,
    /// Destination, same forms.
    #[arg(required = true)]
    pub dst: Option<String>,
    /// Subtrees listed in parallel on each side (the merged stream stays in key order).
    #[arg(long, default_value_t = 4)]
    pub list_threads: usize,
    /// Directory levels split into separately listed subtrees (with --list-threads > 1).
    #[arg(long, default_value_t = 1)]
    pub list_depth: usize,
    /// Delete destination objects that are not in the source (after a clean run only).
    #[arg(long)]
    pub delete_dst: bool,
    /// Delete each source object once the destination has it (copied and verified, or same).
    #[arg(long)]
    pub delete_src: bool,
    /// Refuse to delete more than N objects, or P% of the destination (e.g. 100, 5%).
    #[arg(long, value_name = "N|P%")]
    pub max_delete: Option<String>,
    /// Compare contents (CRC32C) when size and time agree.
    #[arg(long, short = 'c')]
    pub checksum: bool,
    /// Copy only when the source is newer (size ignored).
    #[arg(long, short = 'u')]
    pub update: bool,
    /// Never touch objects that exist on the destination.
    #[arg(long)]
    pub ignore_existing: bool,
    /// Only update objects that exist on the destination; create nothing new.
    #[arg(long)]
    pub existing: bool,
    /// Copy everything, whatever the destination has.
    #[arg(long, short = 'f')]
    pub force_update: bool,
    /// Re-read what was copied and compare CRC32C with the source.
    #[arg(long)]
    pub check_new: bool,
    /// Stop once more than N objects have failed.
    #[arg(long)]
    pub max_failure: Option<u64>,
    /// Tries after the first failure of an object (backoff 1 s, 2 s, 4 s...).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Bandwidth limit in bytes/s ("50M"), or a timetable "08:00,10M 18:00,off".
    #[arg(long)]
    pub bwlimit: Option<String>,
    /// Requests per second (reads, writes, deletes) across all workers.
    #[arg(long)]
    pub tps: Option<u32>,
    /// Include keys matching PATTERN (see the filter rules above).
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Exclude keys matching PATTERN.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Sync only the keys listed in FILE (one per line), looked up instead of listed.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Skip files smaller than SIZE (e.g. 4K).
    #[arg(long, value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Skip files larger than SIZE.
    #[arg(long, value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Skip files modified more recently than DURATION ago (e.g. 10m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub min_age: Option<std::time::Duration>,
    /// Skip files modified longer than DURATION ago.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_age: Option<std::time::Duration>,
    /// First key of the range to sync.
    #[arg(long)]
    pub start: Option<String>,
    /// Last key of the range to sync.
    #[arg(long)]
    pub end: Option<String>,
    /// Also sync directories, including empty ones.
    #[arg(long)]
    pub dirs: bool,
    /// Keep permission bits (file-system endpoints).
    #[arg(long)]
    pub perms: bool,
    /// Copy symlinks as symlinks (without it they are skipped, never followed).
    #[arg(long, short = 'l')]
    pub links: bool,
    /// Print what would be copied and deleted; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Where progress is kept for resuming (default ~/.cache/jfs-sync/<hash>).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Forget the progress of an earlier interrupted run and start over.
    #[arg(long)]
    pub reset_state: bool,
    /// SRC is a volume: copy only what its journal says changed since the previous run (falls
    /// back to a full listing, loudly, when the journal no longer reaches back that far).
    #[arg(long)]
    pub from_journal: bool,
    /// Serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9567).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Seconds between progress lines when stderr is not a terminal.
    #[arg(long, default_value_t = 5)]
    pub progress_interval: u64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
