//! A small disk for full-disk tests: a tmpfs of a few MiB, unmounted when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `mib` MiB at a new directory (0700), unmounted (lazily) when dropped.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    pub fn new(at: &Path, mib: u64) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .expect("running mount");
        assert!(o.status.success(), "mount -t tmpfs: {o:?}");
        SmallDisk(at.to_path_buf())
    }

    /// What unprivileged writers may still use, in MiB.
    pub fn free_mib(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.0).unwrap();
        (st.f_bavail * st.f_frsize) >> 20
    }

    /// The names at its top.
    pub fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
