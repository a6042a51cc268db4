//! The kernel's mount table (/proc/self/mountinfo) and unmounting.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mount's device, "major:minor" (a FUSE connection's own; a remount gets a new one).
    pub dev: String,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    pub fn is_jfs(&self) -> bool {
        self.fstype == "fuse.jfs"
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `mp` is a mount left by a dead FUSE process ("Transport endpoint is not
/// connected").
pub fn is_stale(mp: &Path) -> bool {
    matches!(std::fs::metadata(mp), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

pub fn table() -> Result<Vec<MountEntry>> {
    let s = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in s.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 2 {
            continue;
        }
        out.push(MountEntry {
            dev: pre[2].to_string(),
            mountpoint: PathBuf::from(unescape(pre[4])),
            fstype: post[0].to_string(),
            source: unescape(post[1]),
        });
    }
    Ok(out)
}

/// The mount at exactly `mp` (the last one, if stacked).
pub fn find(mp: &Path) -> Result<Option<MountEntry>> {
    Ok(table()?.into_iter().rev().find(|m| m.mountpoint == mp))
}

/// The `jfs mount` that holds `path` (absolute), and `path` inside the volume.
pub fn jfs_mount_of(path: &Path) -> Result<Option<(MountEntry, String)>> {
    let t = table()?;
    let mut best: Option<(MountEntry, String)> = None;
    for m in t.into_iter().filter(|m| m.is_jfs()) {
        if let Ok(rest) = path.strip_prefix(&m.mountpoint) {
            let inner = format!("/{}", rest.to_string_lossy());
            if best.as_ref().is_none_or(|(b, _)| {
                m.mountpoint.as_os_str().len() >= b.mountpoint.as_os_str().len()
            }) {
                best = Some((m, inner));
            }
        }
    }
    Ok(best)
}

fn run(cmd: &str, args: &[&std::ffi::OsStr]) -> std::io::Result<std::process::Output> {
    Command::new(cmd).args(args).stdin(Stdio::null()).output()
}

/// Unmount `mp` (fusermount3 -u, else umount). Fails when files are open there.
pub fn unmount(mp: &Path) -> Result<()> {
    unmount_with(mp, false)
}

/// Detach `mp` now; the kernel finishes once nothing uses it (fusermount3 -uz, umount -l).
pub fn lazy_unmount(mp: &Path) -> Result<()> {
    unmount_with(mp, true)
}

fn unmount_with(mp: &Path, lazy: bool) -> Result<()> {
    let p = mp.as_os_str();
    let fm_flag = std::ffi::OsStr::new(if lazy { "-uz" } else { "-u" });
    let mut why = String::new();
    match run("fusermount3", &[fm_flag, p]) {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => why = String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => why.push_str(&format!("fusermount3: {e}")),
    }
    let mut args: Vec<&std::ffi::OsStr> = Vec::new();
    if lazy {
        args.push(std::ffi::OsStr::new("-l"));
    }
    args.push(p);
    match run("umount", &args) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => bail!(
            "unmounting {} failed: {}; {}",
            mp.display(),
            why,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => bail!("unmounting {} failed: {why}; umount: {e}", mp.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/end\"), r"/end\");
    }
}
