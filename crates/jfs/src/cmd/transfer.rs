//! `jfs put` and `jfs get`: trees in and out of a volume, files in parallel, each file's
//! pieces in parallel, mode and mtime kept. A file lands under a temporary name and is renamed
//! into place when complete, in the volume and on local disk alike.

use super::{parent_of, Outcome};
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use fs_core::{ErrorKind, FileKind, Fs, Ino, Owner, SetAttr, VolPath};
use futures::{StreamExt, TryStreamExt};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Bytes per write/read call: two 4 MiB blocks, so pieces of one file move in parallel.
const PIECE: u64 = 8 << 20;
const PIECES_IN_FLIGHT: usize = 4;
/// `jfs get` has the disk write out what it wrote at least this often (see `get_file`).
const FLUSH_EVERY: u64 = 64 << 20;

/// The longest file name (bytes) local file systems and volumes take.
const NAME_MAX: usize = 255;
/// What `tmp_name` adds after the prefix: `-<pid up to 10 digits>-<8 hex>`.
const TMP_SUFFIX_MAX: usize = 1 + 10 + 1 + 8;

/// The part of `name`'s temporary names before the process id: `.NAME.jfs-tmp`, or, for a
/// name too long for that to fit with the suffix, its first bytes and a checksum of the whole
/// (`.NAM~1a2b3c4d.jfs-tmp`), so that every legal name has a legal temporary name.
pub fn tmp_prefix(name: &str) -> String {
    let plain = format!(".{name}.jfs-tmp");
    if plain.len() + TMP_SUFFIX_MAX <= NAME_MAX {
        return plain;
    }
    let sum = format!("~{:08x}", crc32c::crc32c(name.as_bytes()));
    let room = NAME_MAX - TMP_SUFFIX_MAX - ".".len() - sum.len() - ".jfs-tmp".len();
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}{sum}.jfs-tmp", &name[..cut])
}

/// A temporary name beside `name`, with this process's id in it (so that a later run can
/// tell a leftover of a killed process from a copy in flight); never longer than a legal name.
pub fn tmp_name(name: &str) -> String {
    format!(
        "{}-{}-{:08x}",
        tmp_prefix(name),
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Whether `name` is a temporary name `tmp_name` makes (`.<prefix>.jfs-tmp-<pid>-<8 hex>`):
/// a put or get that has not finished. Other names with `.jfs-tmp` in them are the user's.
pub fn is_tmp_name(name: &str) -> bool {
    let Some((head, hex)) = name.rsplit_once('-') else {
        return false;
    };
    let Some((head, pid)) = head.rsplit_once('-') else {
        return false;
    };
    name.starts_with('.')
        && head.ends_with(".jfs-tmp")
        && (1..=10).contains(&pid.len())
        && pid.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 8
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Remove temporary files a killed `jfs get` left beside `dest` (their process is gone; one
/// from before pids were in the name counts as gone).
fn remove_stale_temps(dest: &Path) {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let prefix = format!("{}-", tmp_prefix(name));
    let Ok(rd) = std::fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return;
    };
    for e in rd.flatten() {
        let f = e.file_name();
        let Some(rest) = f.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let alive = rest
            .split_once('-')
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            tracing::info!(path = %e.path().display(), "removing a temporary file a killed jfs get left");
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

struct PutJob {
    local: PathBuf,
    parent: Ino,
    name: String,
    meta: std::fs::Metadata,
}

/// Create the directory tree in the volume; collect file jobs; return (dir ino, mtime) pairs to
/// fix up at the end (creating children changes a directory's mtime).
fn plan_put<'a>(
    fs: &'a Fs,
    local: &'a Path,
    parent: Ino,
    name: &'a str,
    jobs: &'a mut Vec<PutJob>,
    dirs: &'a mut Vec<(Ino, std::fs::Metadata)>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        let meta = std::fs::symlink_metadata(local)
            .with_context(|| format!("reading {}", local.display()))?;
        let ft = meta.file_type();
        let owner = Owner {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        if ft.is_dir() {
            let ino = match fs
                .mkdir(parent, name.as_bytes(), meta.mode() & 0o7777, owner)
                .await
            {
                Ok((ino, _)) => ino,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let (ino, a) = fs.lookup(parent, name.as_bytes()).await?;
                    if a.kind != FileKind::Dir {
                        bail!("{name} exists in the volume and is not a directory");
                    }
                    ino
                }
                Err(e) => return Err(e).with_context(|| format!("creating directory {name}")),
            };
            for (path, cname) in super::sorted_children(local)? {
                plan_put(fs, &path, ino, &cname, jobs, dirs).await?;
            }
            dirs.push((ino, meta));
        } else if ft.is_symlink() {
            let target = std::fs::read_link(local)?;
            let t = target
                .to_str()
                .with_context(|| format!("symlink target of {} is not UTF-8", local.display()))?;
            if let Ok((_, a)) = fs.lookup(parent, name.as_bytes()).await {
                if a.kind == FileKind::Dir {
                    bail!("{name} exists in the volume as a directory");
                }
                fs.unlink(parent, name.as_bytes()).await?;
            }
            fs.symlink(parent, name.as_bytes(), t.as_bytes(), owner)
                .await
                .with_context(|| format!("symlink {name}"))?;
        } else if ft.is_file() {
            jobs.push(PutJob {
                local: local.to_path_buf(),
                parent,
                name: name.to_string(),
                meta,
            });
        } else {
            tracing::warn!(path = %local.display(), "skipping: not a file, directory or symlink");
        }
        Ok(())
    })
}

fn check_interrupted() -> Result<()> {
    if super::interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

async fn put_file(fs: &Fs, job: &PutJob, progress: &Progress) -> Result<()> {
    check_interrupted()?;
    let tmp = tmp_name(&job.name);
    let owner = Owner {
        uid: job.meta.uid(),
        gid: job.meta.gid(),
    };
    let (ino, _) = fs
        .create(job.parent, tmp.as_bytes(), job.meta.mode() & 0o7777, owner)
        .await?;
    let file = Arc::new(
        std::fs::File::open(&job.local)
            .with_context(|| format!("opening {}", job.local.display()))?,
    );
    let len = job.meta.len();
    let offsets: Vec<u64> = (0..len.div_ceil(PIECE)).map(|i| i * PIECE).collect();
    let result: Result<()> = futures::stream::iter(offsets.into_iter().map(|off| {
        let file = file.clone();
        async move {
            check_interrupted()?;
            let n = PIECE.min(len - off) as usize;
            let buf = tokio::task::spawn_blocking(move || {
                let mut b = vec![0u8; n];
                file.read_exact_at(&mut b, off).map(|_| b)
            })
            .await??;
            fs.write(ino, off, &buf).await?;
            progress.add_bytes(n as u64);
            Ok::<_, anyhow::Error>(())
        }
    }))
    .buffer_unordered(PIECES_IN_FLIGHT)
    .try_collect::<Vec<()>>()
    .await
    .map(|_| ());
    if let Err(e) = result {
        let _ = fs.unlink(job.parent, tmp.as_bytes()).await;
        return Err(e.context(format!("copying {}", job.local.display())));
    }
    let atime = job.meta.atime() * 1_000_000_000 + job.meta.atime_nsec();
    fs.setattr(
        ino,
        &SetAttr {
            atime: Some(atime),
            mtime: Some(mtime_ns(&job.meta)),
            ..Default::default()
        },
    )
    .await?;
    fs.rename(
        job.parent,
        tmp.as_bytes(),
        job.parent,
        job.name.as_bytes(),
        false,
    )
    .await
    .with_context(|| format!("renaming into place: {}", job.name))?;
    progress.add_file();
    Ok(())
}

/// Where `jfs put` puts: a volume path, and whether it was written with a trailing `/`.
pub struct Dest {
    pub path: VolPath,
    pub dir_slash: bool,
}

impl Dest {
    pub fn parse(volpath: &str) -> Result<Dest> {
        Ok(Dest {
            path: super::vol_path(volpath)?,
            dir_slash: volpath.ends_with('/'),
        })
    }

    /// Whether `local` goes *into* the existing directory `self.path` (under its own name),
    /// rather than becoming `self.path`: a file into a directory (like cp), a directory only
    /// into one named with a trailing `/`; without it, a directory is merged into an existing
    /// one (like `rsync -r src/ dst`), so that running the same put again updates the same
    /// tree instead of nesting a copy inside it.
    pub fn goes_into(&self, local: &Path, is_dir: bool) -> bool {
        is_dir
            && (self.dir_slash
                || std::fs::symlink_metadata(local)
                    .map(|m| !m.is_dir())
                    .unwrap_or(true))
    }
}

/// The name a local path is put under.
pub fn base_name(local: &Path) -> Result<String> {
    local
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .with_context(|| format!("{} has no UTF-8 file name", local.display()))
}

pub async fn put(
    fs: &Fs,
    local: &Path,
    dest: &Dest,
    threads: usize,
    quiet: bool,
) -> Result<Outcome> {
    let base = base_name(local)?;
    let (parent, name) = match fs.resolve_path(&dest.path).await {
        Ok((ino, a)) if dest.goes_into(local, a.kind == FileKind::Dir) => (ino, base),
        Ok(_) if dest.dir_slash => bail!("put: {}/ is not a directory", dest.path),
        _ => parent_of(fs, &dest.path, "put").await?,
    };
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    plan_put(fs, local, parent, &name, &mut jobs, &mut dirs).await?;
    let total: u64 = jobs.iter().map(|j| j.meta.len()).sum();
    let progress = Progress::new("put", total, quiet);
    let t0 = std::time::Instant::now();
    let failures: Vec<anyhow::Error> =
        futures::stream::iter(jobs.iter().map(|j| put_file(fs, j, &progress)))
            .buffer_unordered(threads.max(1))
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
    for (ino, meta) in &dirs {
        fs.setattr(
            *ino,
            &SetAttr {
                mtime: Some(mtime_ns(meta)),
                ..Default::default()
            },
        )
        .await?;
    }
    let (files, bytes) = progress.finish();
    report("put", files, bytes, t0.elapsed(), &failures, quiet)
}

pub fn report(
    what: &str,
    files: u64,
    bytes: u64,
    took: Duration,
    failures: &[anyhow::Error],
    quiet: bool,
) -> Result<Outcome> {
    if super::interrupted() {
        bail!("{what} interrupted by a signal after {files} files ({bytes} bytes); partial files were removed, run it again to finish");
    }
    for f in failures {
        cli_common::eprintln!("jfs {what}: failed: {f:#}");
    }
    if !quiet {
        let mbs = bytes as f64 / took.as_secs_f64().max(1e-9) / (1 << 20) as f64;
        cli_common::eprintln!(
            "{what}: {files} files, {bytes} bytes in {:.2}s ({mbs:.1} MiB/s), {} failed",
            took.as_secs_f64(),
            failures.len()
        );
    }
    Ok(if failures.is_empty() {
        Outcome::Done
    } else {
        Outcome::Partial
    })
}

struct GetJob {
    ino: Ino,
    local: PathBuf,
    attr: fs_core::Attr,
}

fn plan_get<'a>(
    fs: &'a Fs,
    ino: Ino,
    attr: fs_core::Attr,
    local: PathBuf,
    jobs: &'a mut Vec<GetJob>,
    dirs: &'a mut Vec<(PathBuf, fs_core::Attr)>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        match attr.kind {
            FileKind::Dir => {
                // A directory under LOCAL is made or must be one: a symlink there is never
                // followed (a link left by an earlier get, from the volume, could lead out
                // of LOCAL). Only LOCAL itself, as given, may be a link.
                match std::fs::symlink_metadata(&local) {
                    Ok(m) if m.is_dir() => {}
                    Ok(m) if m.file_type().is_symlink() => bail!(
                        "get: {} is a symbolic link where the volume has a directory: jfs get does not write through links; remove it, or get into another directory",
                        local.display()
                    ),
                    Ok(_) => bail!(
                        "get: {} exists and is not a directory, where the volume has one; remove it, or get into another directory",
                        local.display()
                    ),
                    Err(_) => std::fs::create_dir_all(&local)
                        .with_context(|| format!("creating {}", local.display()))?,
                }
                for e in fs.readdir_all(ino).await? {
                    let name = String::from_utf8(e.name.clone())
                        .with_context(|| format!("a name in inode {ino} is not UTF-8"))?;
                    if is_tmp_name(&name) {
                        continue; // an unfinished put
                    }
                    let a = fs.getattr(e.ino).await?;
                    plan_get(fs, e.ino, a, local.join(&name), jobs, dirs).await?;
                }
                dirs.push((local, attr));
            }
            FileKind::Symlink => {
                let t = fs.readlink(ino).await?;
                let _ = std::fs::remove_file(&local);
                std::os::unix::fs::symlink(String::from_utf8_lossy(&t).as_ref(), &local)
                    .with_context(|| format!("creating symlink {}", local.display()))?;
            }
            FileKind::File => jobs.push(GetJob { ino, local, attr }),
            kind => {
                tracing::warn!(path = %local.display(), ?kind, "skipped: not a file, directory or symlink");
            }
        }
        Ok(())
    })
}

fn set_local_times(path: &Path, attr: &fs_core::Attr) -> Result<()> {
    let f = std::fs::File::options().read(true).open(path)?;
    let t = std::fs::FileTimes::new()
        .set_modified(UNIX_EPOCH + Duration::from_nanos(attr.mtime.max(0) as u64))
        .set_accessed(UNIX_EPOCH + Duration::from_nanos(attr.atime.max(0) as u64));
    f.set_times(t)?;
    Ok(())
}

/// Memory for read-ahead of all files `jfs get` copies at once.
const GET_BUDGET: u64 = 512 << 20;

async fn get_file(
    fs: &Arc<Fs>,
    budget: &fs_core::Budget,
    job: &GetJob,
    progress: &Progress,
) -> Result<()> {
    check_interrupted()?;
    let name = job
        .local
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("file");
    remove_stale_temps(&job.local);
    let tmp = job.local.with_file_name(tmp_name(name));
    let file = Arc::new(
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
    );
    let len = job.attr.length;
    file.set_len(len)?;
    // The mount's reader: sequential reads with a growing read-ahead window, blocks fetched
    // in parallel ahead of the writer; one local write in flight while the next piece reads.
    let res: Result<()> = async {
        let reader = fs_core::FileReader::new(
            fs.clone(),
            job.ino,
            fs_core::ReadAhead {
                max_window: 256 << 20,
                budget: Some(budget.clone()),
            },
        )
        .await?;
        let mut off = 0u64;
        let mut pending: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
        // The disk writes what was written so far while later pieces are read, instead of
        // all of it at the final sync (at most one such flush at a time; none is waited for).
        let mut flushing: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
        let mut unflushed = 0u64;
        while off < len {
            check_interrupted()?;
            let buf = reader.read(off, PIECE.min(len - off) as usize).await?;
            if buf.is_empty() {
                anyhow::bail!(
                    "inode {} ended at {off} of {len} bytes while being read",
                    job.ino
                );
            }
            let n = buf.len() as u64;
            if let Some(p) = pending.take() {
                p.await??;
            }
            let f = file.clone();
            let at = off;
            pending = Some(tokio::task::spawn_blocking(move || {
                f.write_all_at(&buf, at)
            }));
            progress.add_bytes(n);
            off += n;
            unflushed += n;
            if unflushed >= FLUSH_EVERY && flushing.as_ref().is_none_or(|f| f.is_finished()) {
                if let Some(f) = flushing.take() {
                    f.await??;
                }
                let f = file.clone();
                flushing = Some(tokio::task::spawn_blocking(move || f.sync_data()));
                unflushed = 0;
            }
        }
        if let Some(p) = pending.take() {
            p.await??;
        }
        if let Some(f) = flushing.take() {
            f.await??;
        }
        Ok(())
    }
    .await;
    let res = res.and_then(|_| {
        file.sync_all()?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(job.attr.mode))?;
        set_local_times(&tmp, &job.attr)?;
        std::fs::rename(&tmp, &job.local)?;
        Ok(())
    });
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("copying to {}", job.local.display())));
    }
    progress.add_file();
    Ok(())
}

pub async fn get(
    fs: Arc<Fs>,
    volpath: &VolPath,
    local: &Path,
    threads: usize,
    quiet: bool,
) -> Result<Outcome> {
    let (ino, attr) = fs
        .resolve_path(volpath)
        .await
        .map_err(|e| super::fsops::at(volpath, "get", e))?;
    let dest = if local.is_dir() {
        local.join(volpath.name().unwrap_or("root"))
    } else {
        local.to_path_buf()
    };
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    plan_get(&fs, ino, attr, dest, &mut jobs, &mut dirs).await?;
    let budget = fs_core::Budget::new(GET_BUDGET);
    let total = jobs.iter().map(|j| j.attr.length).sum();
    let progress = Progress::new("get", total, quiet);
    let t0 = std::time::Instant::now();
    let failures: Vec<anyhow::Error> =
        futures::stream::iter(jobs.iter().map(|j| get_file(&fs, &budget, j, &progress)))
            .buffer_unordered(threads.max(1))
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
    for (path, attr) in dirs.iter().rev() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(attr.mode))?;
        let t = UNIX_EPOCH + Duration::from_nanos(attr.mtime.max(0) as u64);
        std::fs::File::open(path)?.set_times(std::fs::FileTimes::new().set_modified(t))?;
    }
    let (files, bytes) = progress.finish();
    report("get", files, bytes, t0.elapsed(), &failures, quiet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_legal_name_has_a_legal_temporary_name() {
        for len in [1, 200, 225, 226, 240, 254, 255] {
            for unit in ["a", "é", "水"] {
                let name: String = unit.repeat(len / unit.len());
                let t = tmp_name(&name);
                assert!(t.len() <= NAME_MAX, "{len} x {unit:?}: {} bytes", t.len());
                assert!(t.starts_with(&format!("{}-", tmp_prefix(&name))));
            }
        }
        assert!(tmp_name("model.bin").starts_with(".model.bin.jfs-tmp-"));
        assert!(is_tmp_name(&tmp_name("model.bin")));
        assert!(is_tmp_name(&tmp_name(&"x".repeat(255))));
        for user in [
            ".report.jfs-tmp-final",
            ".a.jfs-tmp-12-xyz",
            "a.jfs-tmp-12-0123abcd",
            ".a.jfs-tmp--0123abcd",
            ".a.jfs-tmp-12345678901-0123abcd",
        ] {
            assert!(!is_tmp_name(user), "{user}");
        }
        // Two long names that share their first bytes have different prefixes.
        let (a, b) = ("x".repeat(250) + "a", "x".repeat(250) + "b");
        assert_ne!(tmp_prefix(&a), tmp_prefix(&b));
    }
}
