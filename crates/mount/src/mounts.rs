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
    /// The user a FUSE mount belongs to (its `user_id=` option), who may unmount it.
    pub owner: Option<u32>,
}

impl MountEntry {
    pub fn is_jfs(&self) -> bool {
        self.fstype == "fuse.jfs"
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space). Mount points are bytes: one that
/// is not UTF-8 comes back as it is.
fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .filter(|d| d.bytes().all(|c| (b'0'..=b'7').contains(&c)))
                .and_then(|d| u8::from_str_radix(d, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Whether `mp` is a mount left by a dead FUSE process ("Transport endpoint is not
/// connected").
pub fn is_stale(mp: &Path) -> bool {
    matches!(std::fs::metadata(mp), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

pub fn table() -> Result<Vec<MountEntry>> {
    use std::os::unix::ffi::OsStringExt;
    // Bytes, not text: any user may mount at a path that is not UTF-8, and that must not
    // make every mount and unmount here fail.
    let s = std::fs::read("/proc/self/mountinfo")?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut out = Vec::new();
    for line in s.split(|&c| c == b'\n') {
        let Some(at) = line.windows(3).position(|w| w == b" - ") else {
            continue;
        };
        let (pre, post) = (&line[..at], &line[at + 3..]);
        let pre: Vec<&[u8]> = pre.split(|&c| c == b' ').collect();
        let post: Vec<&[u8]> = post.split(|&c| c == b' ').collect();
        if pre.len() < 5 || post.len() < 2 {
            continue;
        }
        out.push(MountEntry {
            dev: text(pre[2]),
            mountpoint: PathBuf::from(std::ffi::OsString::from_vec(unescape(pre[4]))),
            fstype: text(post[0]),
            source: text(&unescape(post[1])),
            owner: post.get(2).and_then(|o| {
                o.split(|&c| c == b',')
                    .find_map(|kv| kv.strip_prefix(b"user_id="))
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            }),
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
        assert_eq!(unescape(br"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape(br"/plain"), b"/plain");
        assert_eq!(unescape(br"/end\"), br"/end\");
        // Bytes that are not UTF-8 stay as they are; `\377` is the byte 0xff.
        assert_eq!(unescape(b"/mp\xff"), b"/mp\xff");
        assert_eq!(unescape(br"/mp\377"), b"/mp\xff");
        assert_eq!(unescape(br"/a\08x"), br"/a\08x");
    }
}
