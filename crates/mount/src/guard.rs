//! The mount guard: a small process that removes the mount when `jfs mount` dies without
//! unmounting (kill -9, the OOM killer), so the mount point never stays "Transport endpoint
//! is not connected".
//!
//! fusermount3's auto_unmount does the same, but it looks once, the moment the dead process's
//! socket closes; when the kernel has not yet aborted the FUSE connection by then (the dead
//! process's /dev/fuse descriptors are released after the socket), its probe does not see
//! ENOTCONN and it leaves the dead mount behind. Under load that race is common. The guard
//! probes for up to `PATIENCE` and unmounts only the mount it was told about (by device
//! number), only once that mount's connection is dead: a live mount or a newer mount at the
//! same path is never touched.
//!
//! Protocol on the guard's stdin (a pipe whose write end only the mount process holds):
//! one line "dev MAJOR:MINOR" once mounted; end of file when the mount process exits,
//! however it exits.

use crate::mounts;
use anyhow::{Context, Result};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The hidden first argument that makes `jfs` run as a guard.
pub const ARG: &str = "__mount-guard";

/// How long a guard waits for a dead mount's connection to be aborted.
const PATIENCE: Duration = Duration::from_secs(20);

pub struct Guard {
    stdin: ChildStdin,
    _child: Child,
}

/// Start a guard for `mp`. Call it before mounting: the guard must not inherit the FUSE
/// descriptors (it would keep a dead connection alive).
pub fn spawn(mp: &Path) -> Result<Guard> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding this program to start the mount guard")?;
    let mut child = Command::new(exe)
        .arg(ARG)
        .arg(mp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Its own process group: a Ctrl-C at the terminal stops the mount, not the guard.
        .process_group(0)
        .spawn()
        .context("starting the mount guard")?;
    let stdin = child.stdin.take().expect("stdin was piped");
    Ok(Guard {
        stdin,
        _child: child,
    })
}

impl Guard {
    /// Tell the guard which mount to watch (its device), once mounted.
    pub fn arm(&mut self, dev: &str) {
        if let Err(e) = writeln!(self.stdin, "dev {dev}").and_then(|_| self.stdin.flush()) {
            tracing::warn!(error = %e, "the mount guard is gone; a killed mount may stay stale until the next `jfs mount` or `jfs umount`");
        }
    }
}

/// The guard's whole life (runs in its own process; returns its exit code).
pub fn main(mp: PathBuf) -> i32 {
    let mut dev = None;
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) => {
                if let Some(d) = l.strip_prefix("dev ") {
                    dev = Some(d.trim().to_string());
                }
            }
            Err(_) => break,
        }
    }
    let Some(dev) = dev else { return 0 };
    let t0 = Instant::now();
    loop {
        let ours = mounts::find(&mp)
            .ok()
            .flatten()
            .is_some_and(|m| m.dev == dev && m.is_jfs());
        if !ours {
            return 0; // unmounted cleanly, or someone else's mount now
        }
        if connection_dead(&mp) {
            match mounts::lazy_unmount(&mp) {
                Ok(()) => {
                    cli_common::eprintln!(
                        "jfs mount guard: the mount process died; removed its dead mount at {}",
                        mp.display()
                    );
                    return 0;
                }
                Err(e) => {
                    cli_common::eprintln!("jfs mount guard: {e:#}");
                    return 1;
                }
            }
        }
        if t0.elapsed() > PATIENCE {
            return 0; // the connection is still answering: not ours to remove
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// statfs always reaches the FUSE server (no kernel cache answers it): a dead connection
/// fails with ENOTCONN, or ECONNABORTED while it is being torn down.
fn connection_dead(mp: &Path) -> bool {
    match rustix::fs::statfs(mp) {
        Ok(_) => false,
        Err(e) => e == rustix::io::Errno::NOTCONN || e == rustix::io::Errno::CONNABORTED,
    }
}
