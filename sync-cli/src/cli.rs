//! Command-line flags (clap derive; `jfs-sync --help` is built from these doc comments, in
//! groups by purpose as rclone's are). Flags people type by habit from rclone, rsync and
//! JuiceFS are accepted where the meaning is the same (`--transfers`, `--checkers`, `-P`,
//! `-n`, `--size-only`, `--filter`, `--exclude-from`...), and where it differs the run says so.

use clap::{Args, Parser, Subcommand};
use fs_core::parse_size;
use std::path::PathBuf;

const WHAT: &str = "What to copy";
const COMPARE: &str = "How to compare";
const DELETES: &str = "Deletes";
const SPEED: &str = "Speed";
const OUTPUT: &str = "Output";
const RESUME: &str = "Resume";
const JOB: &str = "Shared job (many workers, many hosts)";

/// Sync the contents of SRC into DST: local directories, S3-compatible stores
/// (s3://bucket/prefix), memory://, and volumes (jfs://NAME/path, where the environment
/// variable NAME holds the volume's META_URL). A trailing slash on either side means the same
/// as none. SRC and DST must not overlap (one inside the other): such a run is refused.
///
/// Change detection: size and modification time, compared at the coarser side's precision;
/// against an object store (where a listed time is the upload time) a copy is current when it
/// was uploaded at or after the source's last change. --checksum compares contents (CRC32C).
///
/// Filters (--include/--exclude/--filter, rsync style, tried in the order given): `*` matches
/// within a path component, `**` across; a pattern without '/' matches a component at any
/// depth, one with '/' is anchored at the top; a trailing '/' matches directories only. A key
/// a/b/c is tested layer by layer (a/, a/b/, a/b/c): at each layer the first matching rule
/// decides, an exclude is final, an include ends the layer. Keys no rule excludes are
/// included. Excluded keys are never deleted from DST.
///
/// Resume: progress is kept in a state directory (default ~/.cache/jfs-sync/<hash of SRC, DST
/// and options>); a run killed at any point and started again with the same command continues
/// where it stopped without copying finished objects again, and its summary counts the work
/// of the earlier attempts too. SIGINT/SIGTERM save progress and exit 2.
///
/// Safety: nothing is deleted after any listing or copy error; --max-delete refuses to delete
/// more; files land under a temporary name and are renamed into place, and local copies are
/// on disk (file and directory synced) before they are recorded as done; object keys that
/// could escape the destination (.., absolute, NUL, backslashes, drive letters, overlong) are
/// refused and named, and the run goes on.
///
/// Exit codes: 0 all done; 1 some objects failed; 2 fatal (bad arguments, overlapping SRC and
/// DST, unreachable endpoint, listing failed, --max-delete refused, interrupted).
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
    /// Compare SRC and DST: report missing, differing and extra objects (exit 0 when the two
    /// sides hold the same objects, 1 when any is missing, differs or is extra, 2 on an error).
    Check(CheckArgs),
    /// A shared job: its progress, and pause, resume, cancel, limits, removal.
    #[command(subcommand)]
    Job(JobCmd),
}

/// JOB is `redis://HOST:PORT/DB#NAME` or `postgres://USER@HOST:PORT/DB#NAME` (the password
/// from JFS_META_PASSWORD or `?password_env=VAR`, never in the URL).
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Progress across workers: units done, running, pending; objects, bytes, rate, ETA;
    /// one line per worker; errors.
    Status {
        job: String,
        /// The status as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Workers finish nothing new: each gives its units back (cursor kept) and waits.
    Pause { job: String },
    /// Paused workers go on.
    Resume { job: String },
    /// Workers give their units back and exit (code 2); the job stays, cancelled, until
    /// `job delete`.
    Cancel { job: String },
    /// Change the job's bandwidth and request limits while it runs (all workers together).
    Set {
        job: String,
        /// Bytes per second for the whole job ("50M"), a timetable "08:00,10M 18:00,off",
        /// or "off".
        #[arg(long)]
        bwlimit: Option<String>,
        /// Requests per second for the whole job (0: off).
        #[arg(long)]
        tps: Option<u32>,
    },
    /// Plan the job (one unit covering everything) without copying: workers then join with
    /// `jfs-sync SRC DST --job JOB` and the same options.
    Create {
        #[command(flatten)]
        sync: Box<SyncArgs>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove every record of a job (refused while workers hold units, unless --force).
    Delete {
        job: String,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    pub src: String,
    pub dst: String,
    /// Compare contents byte for byte (CRC32C of both sides), not just size.
    #[arg(long)]
    pub download: bool,
    /// Print every differing key.
    #[arg(long, short = 'L')]
    pub list: bool,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// S3 endpoint URL (else from the URL's ?endpoint= or AWS_ENDPOINT_URL).
    #[arg(long, help_heading = WHAT)]
    pub endpoint: Option<String>,
    /// Concurrent object transfers.
    #[arg(long, short = 'p', visible_alias = "transfers", default_value_t = 16, help_heading = SPEED)]
    pub threads: usize,
    /// Final statistics as one JSON object on the last line of stdout.
    #[arg(long, help_heading = OUTPUT)]
    pub json: bool,
    /// Log format on stderr (human or json).
    #[arg(long, default_value = "human", help_heading = OUTPUT)]
    pub log_format: String,
    /// More logging (-v, -vv).
    #[arg(long, short = 'v', action = clap::ArgAction::Count, help_heading = OUTPUT)]
    pub verbose: u8,
    /// Write logs to FILE (appended) instead of stderr.
    #[arg(long, value_name = "FILE", help_heading = OUTPUT)]
    pub log_file: Option<PathBuf>,
}

#[derive(Args, Debug, Default)]
pub struct SyncArgs {
    /// Source: a directory, s3://bucket/prefix, memory:// or jfs://NAME/path.
    #[arg(required = true)]
    pub src: Option<String>,
    /// Destination, same forms.
    #[arg(required = true)]
    pub dst: Option<String>,

    // What to copy.
    /// Include keys matching PATTERN (see the filter rules above).
    #[arg(long, value_name = "PATTERN", help_heading = WHAT)]
    pub include: Vec<String>,
    /// Exclude keys matching PATTERN.
    #[arg(long, value_name = "PATTERN", help_heading = WHAT)]
    pub exclude: Vec<String>,
    /// Include patterns read from FILE, one per line ('#' comments), at this place in the order.
    #[arg(long, value_name = "FILE", help_heading = WHAT)]
    pub include_from: Vec<PathBuf>,
    /// Exclude patterns read from FILE, one per line ('#' comments), at this place in the order.
    #[arg(long, value_name = "FILE", help_heading = WHAT)]
    pub exclude_from: Vec<PathBuf>,
    /// An rsync filter rule: "+ PATTERN" includes, "- PATTERN" excludes.
    #[arg(long, value_name = "RULE", allow_hyphen_values = true, help_heading = WHAT)]
    pub filter: Vec<String>,
    /// Filter rules read from FILE, one per line ("+ PATTERN" / "- PATTERN", '#' comments).
    #[arg(long, value_name = "FILE", help_heading = WHAT)]
    pub filter_from: Vec<PathBuf>,
    /// Sync only the keys listed in FILE (one per line, relative to SRC; "./x" and "/x" as
    /// `find` writes them are accepted), looked up instead of listed. A listed key the source
    /// does not have is reported and counts as failed.
    #[arg(long, value_name = "FILE", help_heading = WHAT)]
    pub files_from: Option<PathBuf>,
    /// Skip files smaller than SIZE (e.g. 4K).
    #[arg(long, value_parser = parse_size, help_heading = WHAT)]
    pub min_size: Option<u64>,
    /// Skip files larger than SIZE.
    #[arg(long, value_parser = parse_size, help_heading = WHAT)]
    pub max_size: Option<u64>,
    /// Skip files modified more recently than DURATION ago (e.g. 10m).
    #[arg(long, value_parser = humantime::parse_duration, help_heading = WHAT)]
    pub min_age: Option<std::time::Duration>,
    /// Skip files modified longer than DURATION ago.
    #[arg(long, value_parser = humantime::parse_duration, help_heading = WHAT)]
    pub max_age: Option<std::time::Duration>,
    /// First key of the range to sync.
    #[arg(long, help_heading = WHAT)]
    pub start: Option<String>,
    /// Last key of the range to sync.
    #[arg(long, help_heading = WHAT)]
    pub end: Option<String>,
    /// Also sync directories, including empty ones.
    #[arg(long, help_heading = WHAT)]
    pub dirs: bool,
    /// Keep permission bits (file-system endpoints), except setuid and setgid unless
    /// --owners: a copy is never made setuid to someone else.
    #[arg(long, help_heading = WHAT)]
    pub perms: bool,
    /// Give copies their source's numeric owner and group (file-system endpoints and
    /// volumes; root only, like `tar --same-owner`); with --perms, setuid and setgid are then
    /// kept. Refused for a user who is not root.
    #[arg(long, help_heading = WHAT)]
    pub owners: bool,
    /// Copy symlinks as symlinks (without it they are skipped, never followed).
    #[arg(long, short = 'l', help_heading = WHAT)]
    pub links: bool,
    /// SRC is a volume: copy only what its journal says changed since the previous run (falls
    /// back to a full listing, loudly, when the journal no longer reaches back that far).
    #[arg(long, help_heading = WHAT)]
    pub from_journal: bool,

    // How to compare.
    /// Compare contents (CRC32C) when size and time agree.
    #[arg(long, short = 'c', help_heading = COMPARE)]
    pub checksum: bool,
    /// Compare sizes only: a destination object of the same size is current, whatever its time.
    #[arg(long, help_heading = COMPARE)]
    pub size_only: bool,
    /// Copy only when the source is newer (size ignored).
    #[arg(long, short = 'u', help_heading = COMPARE)]
    pub update: bool,
    /// Never touch objects that exist on the destination.
    #[arg(long, help_heading = COMPARE)]
    pub ignore_existing: bool,
    /// Only update objects that exist on the destination; create nothing new.
    #[arg(long, help_heading = COMPARE)]
    pub existing: bool,
    /// Copy everything, whatever the destination has.
    #[arg(long, short = 'f', help_heading = COMPARE)]
    pub force_update: bool,
    /// Re-read what was copied and compare CRC32C with the source.
    #[arg(long, help_heading = COMPARE)]
    pub check_new: bool,

    // Deletes.
    /// Delete destination objects that are not in the source, after the copies, and only when
    /// the run had no error (rsync's and rclone's --delete-after means the same).
    #[arg(long, visible_alias = "delete-after", help_heading = DELETES)]
    pub delete_dst: bool,
    /// Accepted for rsync habit: runs as --delete-dst (deletes come after the copies, never
    /// before or during them), and says so.
    #[arg(long, visible_aliases = ["delete-during", "delete-before"], help_heading = DELETES)]
    pub delete: bool,
    /// Delete each source object once the destination has it (copied and on disk, or same).
    #[arg(long, help_heading = DELETES)]
    pub delete_src: bool,
    /// Refuse to delete more than N objects, or P% of the destination (e.g. 100, 5%).
    #[arg(long, value_name = "N|P%", help_heading = DELETES)]
    pub max_delete: Option<String>,

    // Speed.
    /// Subtrees listed in parallel on each side (the merged stream stays in key order).
    #[arg(long, visible_alias = "checkers", default_value_t = 4, help_heading = SPEED)]
    pub list_threads: usize,
    /// Directory levels split into separately listed subtrees (with --list-threads > 1).
    #[arg(long, default_value_t = 1, help_heading = SPEED)]
    pub list_depth: usize,
    /// Bandwidth limit in bytes/s ("50M"), or a timetable "08:00,10M 18:00,off".
    #[arg(long, help_heading = SPEED)]
    pub bwlimit: Option<String>,
    /// Requests per second (reads, writes, deletes) across all workers.
    #[arg(long, help_heading = SPEED)]
    pub tps: Option<u32>,
    /// Stop once more than N objects have failed.
    #[arg(long, help_heading = SPEED)]
    pub max_failure: Option<u64>,
    /// Tries after the first failure of an object (backoff 1 s, 2 s, 4 s...).
    #[arg(long, default_value_t = 3, help_heading = SPEED)]
    pub retries: u32,

    // Output.
    /// Print what would be copied and deleted; change nothing.
    #[arg(long, short = 'n', help_heading = OUTPUT)]
    pub dry_run: bool,
    /// Show progress even where it would be quiet (with --json on a pipe): a bar on a
    /// terminal, a line every --stats interval otherwise.
    #[arg(long, short = 'P', help_heading = OUTPUT)]
    pub progress: bool,
    /// Time between progress lines when stderr is not a terminal (e.g. 10s, 1m).
    #[arg(long, value_name = "INTERVAL", default_value = "5s", value_parser = humantime::parse_duration, help_heading = OUTPUT)]
    pub stats: std::time::Duration,
    /// Seconds between progress lines (same as --stats).
    #[arg(long, value_name = "SECONDS", hide = true, help_heading = OUTPUT)]
    pub progress_interval: Option<u64>,
    /// Serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9567).
    #[arg(long, value_name = "ADDR", help_heading = OUTPUT)]
    pub metrics: Option<String>,

    // Shared job.
    /// Share this sync with other workers (on any hosts) through Redis or PostgreSQL:
    /// redis://HOST:PORT/DB#NAME or postgres://USER@HOST:PORT/DB#NAME. The first worker
    /// creates the job; every worker runs the same command. Ranges of the key space are
    /// claimed with a lease, listed and copied by their holder, and resumed from their
    /// checkpoint by another worker if the holder dies. --bwlimit and --tps are for the whole
    /// job (set by whoever creates it; `jfs-sync job set` changes them).
    #[arg(long, value_name = "URL#NAME", help_heading = JOB)]
    pub job: Option<String>,
    /// How long a claimed range stays this worker's without a renewal (renewed every third).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, help_heading = JOB)]
    pub lease: std::time::Duration,
    /// This worker's name in `job status` (default HOST-PID).
    #[arg(long, value_name = "NAME", help_heading = JOB)]
    pub worker: Option<String>,
    /// Ranges one worker works on at once (the transfers are shared among them).
    #[arg(long, default_value_t = 2, help_heading = JOB)]
    pub job_slots: usize,

    // Resume.
    /// Where progress is kept for resuming (default ~/.cache/jfs-sync/<hash>).
    #[arg(long, value_name = "DIR", help_heading = RESUME)]
    pub state_dir: Option<PathBuf>,
    /// Forget the progress of an earlier interrupted run and start over.
    #[arg(long, help_heading = RESUME)]
    pub reset_state: bool,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
