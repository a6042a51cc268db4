//! Writing one file of a local destination: under a temporary name in the same directory,
//! synced every `SYNC_EVERY` bytes, renamed into place only once complete (`finish`), and
//! removed on `abort`. Small files are made durable by the run's batched `syncfs`.
//!
//! The temporary file is made by this process (`O_EXCL`: what an interrupted run, or another
//! user, left at that name is removed first, never followed nor reused) and is owner-only
//! (0600) from its first byte; its owner (with `--owners`: `Entry::owner`, through the
//! descriptor) and then its mode are set at `finish`, before the rename: with `--perms` the
//! source's, without setuid and setgid unless the owner was restored (`copy_mode`),
//! otherwise the source's permission bits less the umask (as `cp`: never more open than the
//! source), or a new file's (0666 less the umask) when the source has no mode (objects).

use super::super::{Entry, Sink};
use anyhow::{anyhow, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use cap_std::fs::Dir;
use cap_std::fs::OpenOptionsExt;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::{blocking, rel};
use crate::names::show;

pub struct LocalSink {
    pub(super) dir: Arc<Dir>,
    pub(super) tmp: String,
    pub(super) key: String,
    pub(super) file: std::fs::File,
    /// Bytes written since the last data sync: a large file is synced every `SYNC_EVERY` as it
    /// is written, so its durability costs little at the end (small files wait for the run's
    /// batched `syncfs`).
    pub(super) unsynced: u64,
}

const SYNC_EVERY: u64 = 64 << 20;

impl LocalSink {
    pub(super) async fn wrote(&mut self, n: u64) -> Result<()> {
        self.unsynced += n;
        if self.unsynced >= SYNC_EVERY {
            let f = self.file.try_clone()?;
            blocking(move || Ok(f.sync_data()?)).await?;
            self.unsynced = 0;
        }
        Ok(())
    }
}

impl LocalSink {
    pub(super) async fn create(dir: Arc<Dir>, key: &str) -> Result<Self> {
        let key = key.to_string();
        blocking(move || {
            let k = key.trim_end_matches('/');
            if k.is_empty() {
                return Err(anyhow!("{}: no file name", show(&key)));
            }
            let tmp = match k.rsplit_once('/') {
                Some((p, name)) => {
                    create_parents(&dir, p, &key)?;
                    format!("{p}/{}", super::super::temp_name(name))
                }
                None => super::super::temp_name(k),
            };
            let file = create_temp(&dir, &tmp)?;
            Ok(LocalSink {
                dir,
                tmp,
                key,
                file,
                unsynced: 0,
            })
        })
        .await
    }
}

/// Create the temporary file `tmp` of `dir`, owner-only, as a new file: whatever is at that
/// name (a leftover of an interrupted run, or a file or link someone planted) is removed
/// first, and never followed or written to.
pub(super) fn create_temp(dir: &Dir, tmp: &str) -> Result<std::fs::File> {
    let tmp_key = tmp;
    let tmp = &rel(tmp);
    match dir.remove_file(tmp) {
        Ok(()) => tracing::debug!(tmp = %show(tmp_key), "removed what an interrupted run left"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => {} // a directory, say: the exclusive create below fails and says so
    }
    let mut o = cap_std::fs::OpenOptions::new();
    o.write(true).create_new(true).mode(0o600);
    Ok(dir
        .open_with(tmp, &o)
        .with_context(|| {
            format!(
                "creating the temporary file {} (it must not exist)",
                show(tmp_key)
            )
        })?
        .into_std())
}

/// Make directory `dir_key` (and those above it) of `dir`, for `key`. A symbolic link where
/// a directory is needed is never followed, not even one leading inside the destination:
/// that is a permanent error naming it (retrying cannot help; someone must remove the
/// link), not a retried "File exists", nor a copy written through the link.
pub(super) fn create_parents(dir: &Dir, dir_key: &str, key: &str) -> Result<()> {
    if let Some(e) = in_the_way(dir, dir_key) {
        return Err(e);
    }
    dir.create_dir_all(rel(dir_key))
        .with_context(|| format!("creating the directory of {}", show(key)))
}

/// A permanent error naming the first component of directory `dir_key` of `dir` that is a
/// symbolic link or something else that is not a directory; None when every component
/// there is a directory (those missing are made by the caller).
pub(super) fn in_the_way(dir: &Dir, dir_key: &str) -> Option<anyhow::Error> {
    let mut at = String::new();
    for c in dir_key.trim_end_matches('/').split('/') {
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(c);
        match dir.symlink_metadata(rel(&at)) {
            Ok(m) if m.is_symlink() => {
                return Some(super::super::permanent(format!(
                    "{} is a symbolic link where a directory is needed: jfs-sync never writes through links; remove it (or exclude that path) and run again",
                    show(&at)
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Some(super::super::permanent(format!(
                    "{} is a file where a directory is needed; remove it (or exclude that path) and run again",
                    show(&at)
                )))
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    None
}

/// Give `f` its source's owner, when the run restores owners (`Entry::owner`): before its
/// mode is set, since a chown clears setuid and setgid.
pub(super) fn restore_owner(
    f: &impl std::os::fd::AsFd,
    owner: Option<(u32, u32)>,
) -> std::io::Result<bool> {
    let Some((uid, gid)) = owner else {
        return Ok(false);
    };
    rustix::fs::fchown(
        f,
        Some(rustix::process::Uid::from_raw(uid)),
        Some(rustix::process::Gid::from_raw(gid)),
    )?;
    Ok(true)
}

/// The mode a finished copy gets (see the module's doc); `owner_kept`: it was given its
/// source's owner (`--owners`), so setuid and setgid may stay.
pub(super) fn final_mode(perms: bool, mode: Option<u32>, owner_kept: bool) -> u32 {
    match (perms, mode) {
        (true, Some(m)) => super::super::copy_mode(m, owner_kept),
        // As `cp` without `-p`: the source's permission bits less the umask, so a copy is
        // never more open than its source (a 0600 file stays 0600, not 0644).
        (false, Some(m)) => m & 0o777 & !umask(),
        (_, None) => 0o666 & !umask(),
    }
}

/// This process's umask (from /proc; 022 where it cannot be read).
pub(super) fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o022)
    })
}

#[async_trait]
impl Sink for LocalSink {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        let mut f = self.file.try_clone()?;
        let n = data.len() as u64;
        blocking(move || Ok(f.write_all(&data)?)).await?;
        self.wrote(n).await
    }

    async fn finish(self: Box<Self>, src: &Entry, perms: bool) -> Result<()> {
        let (mtime, mode, owner) = (src.mtime_ns, src.mode, src.owner);
        blocking(move || {
            let s = *self;
            s.file.set_times(
                std::fs::FileTimes::new().set_modified(super::super::system_time(mtime)),
            )?;
            let kept = restore_owner(&s.file, owner)
                .with_context(|| format!("giving {} to its owner", show(&s.key)))?;
            s.file
                .set_permissions(std::fs::Permissions::from_mode(final_mode(
                    perms, mode, kept,
                )))?;
            // Not synced here: the run makes finished copies durable in batches (`sync`)
            // before it records them as done.
            s.dir
                .rename(rel(&s.tmp), &s.dir, rel(&s.key))
                .with_context(|| format!("renaming into place: {}", show(&s.key)))?;
            Ok(())
        })
        .await
    }

    async fn abort(self: Box<Self>) {
        let _ = blocking(move || Ok(self.dir.remove_file(rel(&self.tmp))?)).await;
    }
}
