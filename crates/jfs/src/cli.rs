//! Command-line flags (clap derive; help text comes from these doc comments).

use clap::{Args, Parser, Subcommand, ValueEnum};
use fs_core::parse_size;
use std::path::PathBuf;

/// Admin CLI for a JuiceFS-style volume: metadata in RocksDB, Redis or PostgreSQL, data in
/// an object store as immutable blocks.
///
/// META_URL is rocksdb:///dir, redis://host:port/db or postgres://user@host:port/db.
/// Passwords come from JFS_META_PASSWORD or --meta-password-file, never from the URL.
///
/// Exit codes: 0 done; 1 partial failure (fsck found broken files, some files failed);
/// 2 error (bad input, unreachable engine or store, corrupt data).
#[derive(Parser, Debug)]
#[command(name = "jfs", version, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "JFS_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// More logging (-v info, -vv debug, -vvv trace). JFS_LOG=filter overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Read the metadata engine's password from this file (else JFS_META_PASSWORD).
    #[arg(long, global = true, value_name = "FILE")]
    pub meta_password_file: Option<PathBuf>,
    /// S3 endpoint for the volume's store (else from the storage URL or AWS_ENDPOINT_URL).
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Use this block store instead of the volume's own storage URL (at a mirror site the
    /// default is the mirror store its marker records).
    #[arg(
        long = "block-store",
        global = true,
        value_name = "URL",
        env = "JFS_BLOCK_STORE"
    )]
    pub storage: Option<String>,
    /// At a mirror site: read blocks not yet copied from this store (default: the origin
    /// store the mirror's marker records, else the volume's storage URL).
    #[arg(long, global = true, value_name = "URL", env = "JFS_ORIGIN_STORE")]
    pub origin_store: Option<String>,
    /// At a mirror site: a block not yet copied fails the read (EIO at a mount) instead of
    /// being read from the origin store.
    #[arg(long, global = true)]
    pub no_fallback: bool,
    /// At a mirror site: the longest a read waits for a block from the origin store before
    /// it fails (EIO at a mount).
    #[arg(long, global = true, default_value = "60s", value_parser = humantime::parse_duration)]
    pub origin_timeout: std::time::Duration,
    /// Block transfers in flight per file.
    #[arg(long, global = true, default_value_t = 8)]
    pub io_parallel: usize,
}

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    pub meta_url: String,
    pub mountpoint: PathBuf,
    /// Return once the mount answers; the mount process goes on in the background.
    #[arg(short = 'd', long)]
    pub background: bool,
    /// Log file of a background mount (default: beside its control socket).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Mount read-only (writes fail with EROFS). At a mirror site a mount is read-only by
    /// itself unless the primary lets that mirror write (`allow_writes`) and this host can
    /// write the origin store: then its changes go to the primary through the site's agent,
    /// and this flag keeps it read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Directory of the local block cache (default: /var/cache/jfs as root, else
    /// ~/.cache/jfs).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Size of the local block cache (0: no cache).
    #[arg(long, default_value = "100G", value_parser = parse_size)]
    pub cache_size: u64,
    /// Keep at least this share of the cache disk free.
    #[arg(long, default_value_t = 0.1)]
    pub free_space_ratio: f64,
    /// Permission bits of cached files, in octal (directories get search where read is
    /// given). Cached blocks are the volume's bytes whatever their files' modes: 0600 keeps
    /// them to the mount's user.
    #[arg(long, default_value = "0600", value_name = "OCTAL", value_parser = parse_cache_mode)]
    pub cache_mode: u32,
    /// Memory for write buffers and read-ahead.
    #[arg(long, default_value = "300M", value_parser = parse_size)]
    pub buffer_size: u64,
    /// The largest read-ahead window of one file (grows from one block on sequential reads,
    /// as far as the store's latency asks for).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub max_readahead: u64,
    /// At a mirror site, what opens do while the mirror is out of its consistency window:
    /// serve (what has been applied; counted), wait[=DURATION] (for the window, default 10s,
    /// then fail with EIO), or fail (EIO).
    #[arg(long, default_value = "serve", value_name = "POLICY")]
    pub stale: mount::vfs::Stale,
    /// How long the kernel caches file attributes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub attr_cache: std::time::Duration,
    /// How long the kernel caches file entries (names).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub entry_cache: std::time::Duration,
    /// How long the kernel caches directory entries.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub dir_entry_cache: std::time::Duration,
    /// How long an open trusts the previous open's attributes (0s: ask the metadata at
    /// every open).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub open_cache: std::time::Duration,
    /// Serve Prometheus metrics at ADDR/metrics (e.g. 127.0.0.1:9570; off by default; the
    /// agents' admin ports are 9567 and 9568).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Let other users use the mount. Without it the kernel refuses everyone but the
    /// mounting user (root included, as FUSE does by default).
    #[arg(long)]
    pub allow_other: bool,
    /// FUSE request loops.
    #[arg(long, default_value_t = 4)]
    pub fuse_threads: usize,
    /// FUSE passthrough of cached files: auto (on where the kernel offers it and the mount
    /// runs as root; a read-only open of a file held whole in the local cache is handed to
    /// the kernel, which reads the local copy directly) or off (every read goes through the
    /// mount).
    #[arg(long, default_value = "auto", value_name = "auto|off", value_parser = ["auto", "off"])]
    pub passthrough: String,
}

/// How long a cutover step waits for the volume's live sessions to follow it.
#[derive(Args, Debug, Clone)]
pub struct BarrierArgs {
    /// Wait this long for every live session (mounts, writers) to acknowledge the new
    /// storage generation, then fail naming those that did not (the step stays done; run
    /// it again to wait again).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub wait: std::time::Duration,
    /// A session silent this long is dead and no longer waited for (fencing refuses its
    /// writes).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub session_timeout: std::time::Duration,
}

#[derive(Subcommand, Debug)]
pub enum CutoverCmd {
    /// Where the blocks are, the cutover's phase and generation, sessions that have not
    /// followed yet, the repair lists, and the audit log.
    Status {
        meta_url: String,
        #[arg(long)]
        json: bool,
    },
    /// Begin moving to STORE: every writer puts new blocks in both stores from now on
    /// (returns once every live session follows).
    Start {
        meta_url: String,
        /// The store to move to (file:///dir, s3://bucket/prefix?endpoint=URL, ...).
        #[arg(long, value_name = "STORE_URL")]
        to: String,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
    /// Copy every block the metadata references into the new store (jfs-sync's engine:
    /// resumable, rate-limited; a killed run resumes where it stopped).
    Backfill {
        meta_url: String,
        /// Blocks copied at once.
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// Bandwidth limit (e.g. 100M = 100 MiB/s).
        #[arg(long)]
        bwlimit: Option<String>,
        /// Requests per second.
        #[arg(long)]
        tps: Option<u32>,
        /// Resume state (default ~/.cache/jfs/cutover/<volume uuid>-<generation>).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
    /// Read every referenced block in the new store and check its length and checksum;
    /// copy what is missing or damaged from the old one, and drain its repair list.
    Verify {
        meta_url: String,
        /// Blocks checked at once.
        #[arg(long, default_value_t = 32)]
        threads: usize,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
    /// Make the new store the primary one (reads go there first; writes still go to both,
    /// so abort stays possible).
    Switch {
        meta_url: String,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
    /// Drop the old store: the volume's blocks are in the new one alone.
    Finish {
        meta_url: String,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
    /// Go back to the old store alone (from dual, or from switched through dual), copying
    /// back what only the new one has.
    Abort {
        meta_url: String,
        #[command(flatten)]
        barrier: BarrierArgs,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a volume: settings and root directory in META_URL, blocks in STORE_URL.
    Format {
        meta_url: String,
        name: String,
        /// file:///dir, s3://bucket/prefix[?endpoint=URL] or memory://
        #[arg(long)]
        storage: String,
        /// Block size (64K..16M).
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        block_size: u64,
        /// Capacity reported by statfs (0 = unlimited).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        capacity: u64,
        /// How long journal entries are kept (e.g. 7d, 12h).
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        journal_retention: std::time::Duration,
        /// The trash time: deleted files and trees, and the previous data of overwritten or
        /// truncated files, are kept this long (restorable with `jfs restore`), then purged;
        /// their blocks wait as long again for gc. 0 turns the trash off.
        #[arg(long, default_value = "1d", value_parser = humantime::parse_duration)]
        trash: std::time::Duration,
        /// The most bytes the trash keeps (default: no cap); past it the oldest entries are
        /// purged first, and logged.
        #[arg(long, value_parser = parse_size)]
        trash_max_bytes: Option<u64>,
        /// Unreferenced objects younger than this are never deleted by gc.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        gc_grace: std::time::Duration,
    },
    /// Copy a local file or tree into the volume (keeps mode and mtime).
    Put {
        meta_url: String,
        local: PathBuf,
        /// Destination path in the volume. A file goes into it if it is an existing
        /// directory. A directory becomes it, merged into an existing one (so a second run
        /// of the same put updates the same tree), and goes into it under its own name only
        /// when written with a trailing `/`.
        volpath: String,
        /// Files copied at once.
        #[arg(long, default_value_t = 8)]
        threads: usize,
    },
    /// Copy a file or tree out of the volume (keeps mode and mtime; the copies are yours
    /// unless --owners).
    Get {
        meta_url: String,
        volpath: String,
        /// Local destination. A file goes into it if it is an existing directory. A
        /// directory becomes it, merged into an existing one (so a rerun after a partial
        /// failure finishes the same tree), and goes into it under its own name only when
        /// written with a trailing `/`.
        local: PathBuf,
        /// Files copied at once.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Give every copy the volume's owner and group (root only, like tar
        /// --same-owner); setuid and setgid bits are kept only then. Without it the copies
        /// belong to you and files lose their setuid and setgid bits.
        #[arg(long)]
        owners: bool,
    },
    /// List a directory.
    Ls {
        meta_url: String,
        #[arg(default_value = "/")]
        path: String,
        /// Long format: kind, mode, links, owner, size, mtime, inode.
        #[arg(short = 'l')]
        long: bool,
        /// Recurse into subdirectories.
        #[arg(short = 'R')]
        recursive: bool,
    },
    /// Show an inode's attributes (JSON).
    Stat { meta_url: String, path: String },
    /// Print a file's contents to stdout.
    Cat { meta_url: String, path: String },
    /// Create a directory.
    Mkdir {
        meta_url: String,
        path: String,
        /// Create missing parents; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
    },
    /// Remove a file, symlink or empty directory.
    Rm {
        meta_url: String,
        path: String,
        /// Remove a directory and everything under it.
        #[arg(short = 'r')]
        recursive: bool,
        /// Free what is removed at once instead of keeping it in the trash (root only; needs
        /// the volume's writer: not through a RocksDB volume's mount).
        #[arg(long)]
        skip_trash: bool,
    },
    /// Rename or move.
    Mv {
        meta_url: String,
        src: String,
        dst: String,
        /// Fail instead of replacing an existing destination.
        #[arg(short = 'n', long)]
        no_clobber: bool,
    },
    /// Create a hard link (or with -s a symlink) LINK pointing at TARGET.
    Ln {
        meta_url: String,
        target: String,
        link: String,
        #[arg(short = 's')]
        symbolic: bool,
    },
    /// Copy a file or a directory tree in metadata only: the copy shares the source's
    /// blocks (nothing is copied in the store), keeps modes, owners, times, xattrs,
    /// symlinks and hard links, and is the source as of one instant even while writers
    /// change it. DST must not exist (an existing directory gets SRC's name inside it).
    Clone {
        meta_url: String,
        src: String,
        dst: String,
        /// One JSON line: entries, files, dirs, bytes shared, the instant (at_seq)...
        #[arg(long)]
        json: bool,
    },
    /// Set a file's length (shrinks or extends with zeros).
    Truncate {
        meta_url: String,
        path: String,
        #[arg(value_parser = parse_size)]
        size: u64,
    },
    /// Write the whole metadata as JSON (to FILE or stdout).
    Dump {
        meta_url: String,
        file: Option<PathBuf>,
    },
    /// Load a JSON dump into an empty metadata engine, which then holds the volume's store:
    /// the metadata the dump came from can no longer write there. Refused while that metadata
    /// has live mounts, unless --take-over; with --block-store URL the loaded volume uses
    /// that store (a copy of the blocks) and the source's store is left alone.
    Load {
        meta_url: String,
        file: PathBuf,
        /// Take the store over even though the volume the dump came from has live mounts
        /// (or cannot be checked): stop them first, their writes are refused from then on.
        #[arg(long)]
        take_over: bool,
    },
    /// Check that every block the metadata references exists with the right length (and,
    /// on a format-2 volume, that its slice records checksums). Exits 1 when any is broken,
    /// naming the files. At a mirror site it checks the mirror's own store (no fallback).
    Fsck {
        meta_url: String,
        /// Read every referenced block and check it against its recorded CRC32C (format 1:
        /// its length): finds blocks damaged at rest, at the cost of reading the volume.
        #[arg(long)]
        deep: bool,
        /// With --deep: mend each missing or damaged block from this store (a mirror's, or a
        /// backup's): its copy there is read, checked against the block's recorded CRC32C and
        /// length, and written to the volume's store only if it checks; a copy that does not
        /// is refused and named.
        #[arg(long, value_name = "STORE_URL", requires = "deep")]
        repair_from: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Find (and with --delete remove) freed blocks past the trash time, leaked objects past
    /// the grace period, and journal entries past retention. Deletes nothing if any listing fails.
    Gc {
        meta_url: String,
        #[arg(long)]
        delete: bool,
        /// Mount sessions silent this long are dead: with --delete, the files they kept open
        /// after unlinking are freed.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        session_timeout: std::time::Duration,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a volume's metadata as of any instant its backups cover (snapshots and the
    /// journal shipped into its store by the primary) into EMPTY metadata of any engine,
    /// from the store alone; the rebuilt metadata then holds the store. --list shows the
    /// recoverable range. Default instant: the last shipped entry.
    Recover {
        /// The volume's store (its URL as at `jfs format --storage`).
        store_url: String,
        /// Empty metadata to rebuild into (refused if it holds anything).
        #[arg(required_unless_present = "list")]
        new_meta_url: Option<String>,
        /// The volume's name (its prefix in the store).
        #[arg(long)]
        name: String,
        /// The metadata as of this journal entry.
        #[arg(long, conflicts_with = "at")]
        seq: Option<u64>,
        /// The metadata as of the last entry committed at or before this time (RFC 3339,
        /// e.g. 2026-11-28T18:00:00Z).
        #[arg(long)]
        at: Option<String>,
        /// Show the snapshots and the recoverable range instead.
        #[arg(long)]
        list: bool,
        /// Leave the store to the metadata that holds it now (a live volume): the
        /// recovered metadata is for reading what an earlier instant held (`jfs get`, `jfs
        /// cat`, a read-only mount); its writers are refused.
        #[arg(long)]
        no_take_over: bool,
        #[arg(long)]
        json: bool,
    },
    /// Metadata backups (on by default): show their settings and range, change them
    /// (journaled like every setting), take a snapshot now, or delete them all.
    Backup {
        meta_url: String,
        /// Take a snapshot when the newest is older than this (default 1h).
        #[arg(long, value_parser = humantime::parse_duration)]
        snapshot_every: Option<std::time::Duration>,
        /// Ship the journal this often: the most a destroyed metadata engine loses (default 10s).
        #[arg(long, value_parser = humantime::parse_duration)]
        segment_every: Option<std::time::Duration>,
        /// Keep the oldest snapshot of each hour for this many hours (default 48).
        #[arg(long)]
        keep_hourly: Option<u32>,
        /// Keep the oldest snapshot of each day for this many days (default 14).
        #[arg(long)]
        keep_daily: Option<u32>,
        #[arg(long, conflicts_with = "off")]
        on: bool,
        /// Stop taking backups (those in the store stay, and keep holding gc, until --purge).
        #[arg(long)]
        off: bool,
        /// Take a snapshot now (and ship the journal).
        #[arg(long)]
        now: bool,
        /// Delete every backup of the volume from its store.
        #[arg(long)]
        purge: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print the change journal.
    Journal {
        meta_url: String,
        /// First sequence number (default: the first retained).
        #[arg(long)]
        from: Option<u64>,
        /// Keep waiting for new entries.
        #[arg(long, short = 'f')]
        follow: bool,
        /// One JSON object per line: seq, time, op, args, writes.
        #[arg(long)]
        json: bool,
    },
    /// Mount the volume at MOUNTPOINT (FUSE). Foreground unless -d; SIGTERM or `jfs umount`
    /// commits every open file's buffer and unmounts.
    Mount(Box<MountArgs>),
    /// Unmount a `jfs mount` (waits for its process to commit and exit).
    Umount {
        mountpoint: PathBuf,
        /// Detach even while files are open (lazy unmount); also clears a stale mount.
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Preload the blocks of files or trees into the local cache of the mount they live in.
    Warmup {
        /// Files or directories inside a `jfs mount`.
        paths: Vec<PathBuf>,
        /// Read more paths from this file, one per line.
        #[arg(long, short = 'f', value_name = "LIST")]
        file: Option<PathBuf>,
        /// Blocks fetched at once.
        #[arg(long, default_value_t = 50)]
        threads: usize,
        /// Only report how much of the data is cached.
        #[arg(long, conflicts_with = "evict")]
        check: bool,
        /// Drop the data from the local cache.
        #[arg(long)]
        evict: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Live statistics of a mount (operations, throughput, cache, store), like `juicefs stats`.
    Stats {
        mountpoint: PathBuf,
        /// Seconds between lines.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
        /// Stop after this many lines (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Print every metric as one JSON object per interval.
        #[arg(long)]
        json: bool,
    },
    /// Move the volume's blocks to another store while it is in use: start (dual write),
    /// backfill, verify, switch, finish; abort goes back. Each step is safe to run again.
    /// See runbooks/storage-cutover.md.
    Cutover {
        #[command(subcommand)]
        cmd: CutoverCmd,
    },
    /// List the trash, oldest first: time, seq, kind, why, size and the path each entry had
    /// (root only).
    Trash {
        meta_url: String,
        /// Only what was at this path or under it.
        #[arg(long)]
        path: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Bring back from the trash (root only): --path P a deleted file or tree as it was
    /// (names, modes, owners, times, xattrs, symlinks), into /.restored/seq-N/P or with
    /// --put-back at P; --version P the previous content of file P (the current one goes
    /// to the trash in turn). Never replaces an entry: what a newer one holds is skipped
    /// and named (exit 1). A restore is a journaled change: every mirror follows.
    Restore {
        meta_url: String,
        /// The path a deleted file or tree had.
        #[arg(long, conflicts_with = "version", value_name = "P")]
        path: Option<String>,
        /// A file whose previous content comes back (overwritten, truncated or deleted).
        #[arg(long, value_name = "P")]
        version: Option<String>,
        /// The latest entry trashed at or before this time (RFC 3339, UTC), not the latest.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        /// The entry trashed by the commit of this seq (as `jfs trash` lists it).
        #[arg(long, conflicts_with = "at", value_name = "N")]
        seq: Option<u64>,
        /// Put it back where it was (its directory must exist) instead of under /.restored.
        #[arg(long)]
        put_back: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show the volume's settings, or change them (root only; journaled: mirrors follow).
    Config {
        meta_url: String,
        /// The trash time (e.g. 1d, 12h; 0 turns the trash off and lets the next purge
        /// free what it holds).
        #[arg(long, value_parser = humantime::parse_duration)]
        trash: Option<std::time::Duration>,
        /// The trash's size cap (e.g. 100G), or `none`.
        #[arg(long, value_name = "SIZE|none")]
        trash_max_bytes: Option<String>,
    },
    /// Show settings, counters, journal head and retention.
    Status {
        meta_url: String,
        #[arg(long)]
        json: bool,
    },
}

/// `--cache-mode`: octal permission bits that let the owner read and write.
fn parse_cache_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s, 8)
        .map_err(|_| format!("{s:?} is not an octal mode: give e.g. 0600 or 0640"))?;
    if m > 0o777 || m & 0o600 != 0o600 {
        return Err(format!(
            "{s} must be permission bits (at most 0777) that let the owner read and write, e.g. 0600 or 0640"
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
