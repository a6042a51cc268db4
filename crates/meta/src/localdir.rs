//! The files of an embedded volume's directory around RocksDB itself: the free-room check
//! every local writer makes first, the small side files written whole (write, fsync, rename,
//! fsync the directory), and who holds the RocksDB write lock (for the "busy" message).
//! What this project creates there is owner-only (directories 0700, files 0600, whatever the
//! umask); RocksDB's own files sit inside the 0700 volume directory.

use fs_core::error::{Error, ErrorKind, Result};
use std::path::Path;

pub const DISK_FLOOR: u64 = 64 << 20;

/// Err("disk full ...") when the file system of `dir` has less than `DISK_FLOOR` free for
/// unprivileged writers (or `need` more than that); a directory that cannot be examined
/// passes (the write itself then reports).
pub fn check_room(dir: &Path, need: u64) -> std::result::Result<(), String> {
    match rustix::fs::statvfs(dir) {
        Ok(s) => {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            if free < DISK_FLOOR.saturating_add(need) {
                return Err(format!(
                    "disk full: {} has {} MiB free, under the {} MiB kept free; make room there (nothing was written)",
                    dir.display(),
                    free >> 20,
                    (DISK_FLOOR + need) >> 20
                ));
            }
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

/// What RocksDB (7.8) sets aside on disk as a writer opens, from the options this project
/// opens it with (`RocksEngine::open`): the write-ahead log is preallocated (fallocate,
/// keeping its size) a block at a time at its first write, a block being 1.1 x the largest
/// `write_buffer_size` capped by `max_total_wal_size` (`WAL_PREALLOC`); the MANIFEST by
/// `manifest_preallocation_size`. Both come out of the free room `check_room` sees, so a
/// writer that opened with less than this plus `DISK_FLOOR` free found every write after its
/// first refused ("disk full").
pub const WRITE_BUFFER: u64 = 64 << 20;
pub const MANIFEST_PREALLOC: u64 = 4 << 20;
pub const WAL_PREALLOC: u64 = {
    let b = WRITE_BUFFER + WRITE_BUFFER / 10;
    if b < crate::rocks::WAL_BOUND {
        b
    } else {
        crate::rocks::WAL_BOUND
    }
};
/// The free room a RocksDB writer needs when it opens: what it preallocates and the floor.
pub const WRITER_NEED: u64 = WAL_PREALLOC + MANIFEST_PREALLOC + DISK_FLOOR;

/// Err (the message) when the file system that holds, or will hold, the RocksDB directory
/// `dir` has less free room than a writer needs (`WRITER_NEED`). It looks at the nearest
/// directory that exists, so it runs before anything is created; one that cannot be
/// examined passes (the writes then report).
pub fn check_writer_room(dir: &Path) -> std::result::Result<(), String> {
    let Some(at) = dir.ancestors().find(|a| a.is_dir()) else {
        return Ok(());
    };
    let Ok(s) = rustix::fs::statvfs(at) else {
        return Ok(());
    };
    let free = s.f_bavail.saturating_mul(s.f_frsize);
    if free >= WRITER_NEED {
        return Ok(());
    }
    Err(format!(
        "metadata disk too small: {} (the file system mounted at {}) has {} MiB free, and a RocksDB volume's writer needs {} MiB there: {} MiB its write-ahead log preallocates, {} MiB for its manifest, and the {} MiB kept free so that no write meets a full disk. Make room there or put the metadata on a larger disk (nothing was written)",
        dir.display(),
        mount_point(at).display(),
        free >> 20,
        WRITER_NEED >> 20,
        WAL_PREALLOC >> 20,
        MANIFEST_PREALLOC >> 20,
        DISK_FLOOR >> 20,
    ))
}

/// What another RocksDB of this project (opened from `base_options` with `write_buffer` as
/// its write buffer, no WAL bound: the mirror agent's state, jfs-sync's) sets aside as it
/// opens for writing, plus the floor: the same reckoning as `WRITER_NEED`.
pub fn open_need(write_buffer: u64) -> u64 {
    write_buffer + write_buffer / 10 + MANIFEST_PREALLOC + DISK_FLOOR
}

/// Err (the message) when the file system that holds, or will hold, `dir` (the RocksDB
/// directory of `what`, opened with `write_buffer`) has less free room than it needs at open
/// (`open_need`): opened anyway, it would refuse every write after its first. `remedy` says
/// what else the operator may do. As `check_writer_room`, it looks at the nearest directory
/// that exists, and one that cannot be examined passes.
pub fn check_open_room(
    dir: &Path,
    write_buffer: u64,
    what: &str,
    remedy: &str,
) -> std::result::Result<(), String> {
    let Some(at) = dir.ancestors().find(|a| a.is_dir()) else {
        return Ok(());
    };
    let Ok(s) = rustix::fs::statvfs(at) else {
        return Ok(());
    };
    let free = s.f_bavail.saturating_mul(s.f_frsize);
    let need = open_need(write_buffer);
    if free >= need {
        return Ok(());
    }
    Err(format!(
        "disk too small for {what}: {} (the file system mounted at {}) has {} MiB free, and it needs {} MiB there to open: {} MiB its write-ahead log preallocates, {} MiB for its manifest, and the {} MiB kept free so that no write meets a full disk. Make room there or {remedy} (nothing was written)",
        dir.display(),
        mount_point(at).display(),
        free >> 20,
        need.div_ceil(1 << 20),
        (write_buffer + write_buffer / 10).div_ceil(1 << 20),
        MANIFEST_PREALLOC >> 20,
        DISK_FLOOR >> 20,
    ))
}

/// The mount point of the file system holding `dir`: its highest ancestor on the same device.
fn mount_point(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let Ok(dev) = std::fs::metadata(&dir).map(|m| m.dev()) else {
        return dir;
    };
    dir.ancestors()
        .take_while(|a| std::fs::metadata(a).is_ok_and(|m| m.dev() == dev))
        .last()
        .unwrap_or(&dir)
        .to_path_buf()
}

/// Create `dir` and its missing parents owner-only (0700, whatever the umask): whoever can
/// read a volume's metadata can read every name and, with its store, every byte.
pub(crate) fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

pub(crate) fn io_err(e: std::io::Error, path: &Path) -> Error {
    if matches!(e.raw_os_error(), Some(28) | Some(122)) {
        return Error::new(
            ErrorKind::NoSpace,
            format!("{}: disk full: {e}", path.display()),
        );
    }
    Error::new(ErrorKind::Backend, format!("{}: {e}", path.display()))
}

pub(crate) fn aux_write(dir: &Path, name: &str, value: Option<&[u8]>) -> Result<()> {
    use std::io::Write;
    let path = dir.join(name);
    let Some(value) = value else {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(e, &path)),
            _ => Ok(()),
        };
    };
    create_private_dirs(dir).map_err(|e| io_err(e, dir))?;
    let tmp = dir.join(format!("{name}.tmp.{}", std::process::id()));
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_err(e, &tmp))?
    };
    f.write_all(value).map_err(|e| io_err(e, &tmp))?;
    f.sync_all().map_err(|e| io_err(e, &tmp))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err(e, &path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(e, dir))
}

/// Who holds the write lock of the RocksDB directory `path`, as "pid N: its command line",
/// from /proc/locks (RocksDB locks `LOCK` with a POSIX record lock); None when unknown.
pub(crate) fn lock_holder(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path.join("LOCK")).ok()?;
    let (major, minor) = (rustix::fs::major(m.dev()), rustix::fs::minor(m.dev()));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = locks.lines().find_map(|l| {
        // "1: POSIX  ADVISORY  WRITE 2721 fd:01:123456 0 EOF" (a blocked waiter has "->").
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) == Some(&"->") || f.get(1) != Some(&"POSIX") {
            return None;
        }
        let mut id = f.get(5)?.split(':');
        let maj = u32::from_str_radix(id.next()?, 16).ok()?;
        let min = u32::from_str_radix(id.next()?, 16).ok()?;
        let ino: u64 = id.next()?.parse().ok()?;
        (maj == major && min == minor && ino == m.ino())
            .then(|| f.get(4)?.parse::<u32>().ok())
            .flatten()
    })?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut cmd = cmd
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if cmd.chars().count() > 200 {
        cmd = cmd.chars().take(200).collect::<String>() + "...";
    }
    Some(if cmd.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid}: {cmd}")
    })
}
