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
    /// Use this block store instead of the volume's own storage URL (e.g. at a mirror site,
    /// whose blocks live in the mirror store).
    #[arg(
        long = "block-store",
        global = true,
        value_name = "URL",
        env = "JFS_BLOCK_STORE"
    )]
    pub storage: Option<String>,
    /// Block transfers in flight per file.
    #[arg(long, global = true, default_value_t = 8)]
    pub io_parallel: usize,
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
        /// How long freed blocks are kept before gc may delete them.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        trash: std::time::Duration,
        /// Unreferenced objects younger than this are never deleted by gc.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        gc_grace: std::time::Duration,
    },
    /// Copy a local file or tree into the volume (keeps mode and mtime).
    Put {
        meta_url: String,
        local: PathBuf,
        /// Destination path in the volume; into it if it is an existing directory.
        volpath: String,
        /// Files copied at once.
        #[arg(long, default_value_t = 8)]
        threads: usize,
    },
    /// Copy a file or tree out of the volume (keeps mode and mtime).
    Get {
        meta_url: String,
        volpath: String,
        local: PathBuf,
        #[arg(long, default_value_t = 8)]
        threads: usize,
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
    /// Load a JSON dump into an empty metadata engine.
    Load { meta_url: String, file: PathBuf },
    /// Check that every block the metadata references exists with the right length.
    Fsck {
        meta_url: String,
        #[arg(long)]
        json: bool,
    },
    /// Find (and with --delete remove) freed blocks past the trash time, leaked objects past
    /// the grace period, and journal entries past retention. Deletes nothing if any listing fails.
    Gc {
        meta_url: String,
        #[arg(long)]
        delete: bool,
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
    /// Show settings, counters, journal head and retention.
    Status {
        meta_url: String,
        #[arg(long)]
        json: bool,
    },
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
