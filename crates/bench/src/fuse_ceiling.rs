//! jfs-fuse-ceiling: the fastest a FUSE file system built on fuser can serve a sequential read
//! on this machine. It mounts a file system with one file whose every read is answered from
//! a buffer already in memory (no store, no metadata, no checksum), with the settings of
//! `jfs mount` (max_read 1 MiB, the same request loops, kernel read-ahead, background
//! limits), then reads that file with 1 MiB `read`s against a local file of the same size,
//! page cache dropped before each read, local and FUSE in turn. What `jfs mount` reads
//! beyond this bound it cannot get by work of its own. It also `stat`s `--stats` distinct
//! names, each LOOKUP answered at once: the least a metadata request costs through FUSE here
//! (add one round trip to Redis or PostgreSQL for a stat through a mount on those). Needs root
//! (drop_caches, mounting).
//! Prints one JSON object; `integration/bench-mount.sh` records it in BENCHMARKS.md.

use anyhow::{bail, Context, Result};
use clap::Parser;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

#[derive(Parser)]
struct Args {
    /// An empty directory to mount the file system on.
    #[arg(long)]
    mountpoint: PathBuf,
    /// A local file to compare with (its size is the size of the FUSE file).
    #[arg(long)]
    local: PathBuf,
    /// Reads of each side; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Answer each read from a tokio task, as `jfs mount` does, instead of on the request
    /// loop's own thread.
    #[arg(long)]
    from_tasks: bool,
    /// Also `stat` this many distinct names (every lookup answered at once, dentries dropped
    /// first): the least a metadata request costs through FUSE here, before any engine call.
    #[arg(long, default_value_t = 2000)]
    stats: u64,
}

const FILE_INO: u64 = 2;
/// The inode of the first name `stat`ed (`s0`); `sN` is `STAT_INO + N`.
const STAT_INO: u64 = 16;
const NAME: &str = "data";
/// The reply buffer: one max_read's worth, served at every offset.
const PIECE: usize = 1 << 20;

struct Null {
    size: u64,
    stats: u64,
    piece: Arc<Vec<u8>>,
    rt: Option<tokio::runtime::Handle>,
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let (kind, perm, nlink) = if ino == 1 {
        (FileType::Directory, 0o755, 2)
    } else {
        (FileType::RegularFile, 0o444, 1)
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PIECE as u32,
        flags: 0,
    }
}

const TTL: Duration = Duration::from_secs(60);

impl Filesystem for Null {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        mount::fuse::negotiate(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let stat_n = name
            .to_str()
            .and_then(|n| n.strip_prefix('s'))
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n < self.stats);
        let answer = match (parent.0, stat_n) {
            (1, _) if name == NAME => Some(attr(FILE_INO, self.size)),
            (1, Some(n)) => Some(attr(STAT_INO + n, 16384)),
            _ => None,
        };
        let reply_now = move || match answer {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        };
        match &self.rt {
            None => reply_now(),
            Some(rt) => drop(rt.spawn(async move { reply_now() })),
        }
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match i.0 {
            1 => reply.attr(&TTL, &attr(1, 0)),
            FILE_INO => reply.attr(&TTL, &attr(FILE_INO, self.size)),
            n if n >= STAT_INO && n - STAT_INO < self.stats => reply.attr(&TTL, &attr(n, 16384)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, _i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: every open reads through FUSE again.
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        let n = n.min(PIECE);
        match &self.rt {
            None => reply.data(&self.piece[..n]),
            Some(rt) => {
                let piece = self.piece.clone();
                rt.spawn(async move { reply.data(&piece[..n]) });
            }
        }
    }
}

fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache (run as root)")
}

/// CPU seconds the whole machine has been busy so far (user, nice, system, irq and softirq
/// of every core, from /proc/stat; idle, I/O wait and time stolen by the host not counted).
fn machine_busy_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|i| ticks.get(*i)).sum();
    Ok(busy as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// Read `p` whole with 1 MiB reads, page cache dropped first: MiB/s, and the machine's busy
/// CPU seconds per GiB read.
fn read_rate(p: &Path) -> Result<(f64, f64)> {
    drop_caches()?;
    let cpu0 = machine_busy_s()?;
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut buf = vec![0u8; PIECE];
    let t = Instant::now();
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let s = t.elapsed().as_secs_f64();
    let gib = total as f64 / (1u64 << 30) as f64;
    let cpu = (machine_busy_s()? - cpu0) / gib;
    Ok((total as f64 / (1 << 20) as f64 / s, cpu))
}

/// `stat` names `s0`..`s{n-1}` under `dir`, dentries dropped first: microseconds per stat.
fn stat_us(dir: &Path, n: u64) -> Result<f64> {
    drop_caches()?;
    let t = Instant::now();
    for i in 0..n {
        let p = dir.join(format!("s{i}"));
        let m = std::fs::metadata(&p).with_context(|| format!("stat {}", p.display()))?;
        if m.len() != 16384 {
            bail!("{} has length {}, not 16384", p.display(), m.len());
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let a = Args::parse();
    let size = std::fs::metadata(&a.local)
        .with_context(|| format!("reading {}", a.local.display()))?
        .len();
    if size == 0 || a.rounds == 0 {
        bail!("--local must name a non-empty file and --rounds must be at least 1");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let piece: Vec<u8> = (0..PIECE).map(|i| (i * 7 + 1) as u8).collect();
    let fs = Null {
        size,
        stats: a.stats,
        piece: Arc::new(piece),
        rt: a.from_tasks.then(|| rt.handle().clone()),
    };
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName("jfs-fuse-ceiling".into()),
        fuser::MountOption::RO,
        fuser::MountOption::AutoUnmount,
    ];
    cfg.acl = fuser::SessionACL::All;
    // `jfs mount`'s default request loops (--fuse-threads 4), each on its own descriptor.
    cfg.n_threads = Some(4);
    cfg.clone_fd = true;
    let session = fuser::Session::new(fs, &a.mountpoint, &cfg)
        .with_context(|| format!("mounting on {}", a.mountpoint.display()))?;
    let bg = session.spawn()?;
    mount::raise_kernel_readahead(&a.mountpoint, mount::KERNEL_READAHEAD_KB);
    let file = a.mountpoint.join(NAME);
    let result = (|| -> Result<[f64; 5]> {
        let (mut local, mut fuse, mut local_cpu, mut fuse_cpu, mut stats) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            let (rate, cpu) = read_rate(&a.local)?;
            local.push(rate);
            local_cpu.push(cpu);
            let (rate, cpu) = read_rate(&file)?;
            fuse.push(rate);
            fuse_cpu.push(cpu);
            if a.stats > 0 {
                stats.push(stat_us(&a.mountpoint, a.stats)?);
            }
        }
        Ok([
            median(local),
            median(fuse),
            median(local_cpu),
            median(fuse_cpu),
            if stats.is_empty() { 0.0 } else { median(stats) },
        ])
    })();
    // AutoUnmount leaves the unmount to fusermount3's watcher; detach now so the request
    // loops end (as `jfs mount` does on SIGTERM).
    mount::mounts::lazy_unmount(&a.mountpoint)?;
    bg.join()?;
    let [local, fuse, local_cpu, fuse_cpu, stat] = result?;
    // The cores /proc/stat counts (what the busy figures are summed over).
    let cores = std::fs::read_to_string("/proc/stat")
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
                .count()
        })
        .unwrap_or(1)
        .max(1) as f64;
    println!(
        "{}",
        serde_json::json!({
            "bytes": size,
            "rounds": a.rounds,
            "replies_from_tasks": a.from_tasks,
            "local_mib_s": (local * 10.0).round() / 10.0,
            "fuse_null_mib_s": (fuse * 10.0).round() / 10.0,
            "ceiling_ratio": (fuse / local * 100.0).round() / 100.0,
            // The machine's busy CPU per GiB of each read: a file system that reads its bytes
            // from local files and serves them through FUSE spends at least the sum, so with
            // every core busy it cannot pass `cores / (local + fuse)` GiB/s.
            "local_cpu_s_per_gib": (local_cpu * 1000.0).round() / 1000.0,
            "fuse_null_cpu_s_per_gib": (fuse_cpu * 1000.0).round() / 1000.0,
            "cpu_bound_mib_s_local_plus_fuse": (cores / (local_cpu + fuse_cpu) * 1024.0).round(),
            // A `stat` of a name not in the dentry cache: one LOOKUP answered with no work.
            "stats": a.stats,
            "stat_us": (stat * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
