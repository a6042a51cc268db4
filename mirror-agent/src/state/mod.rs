//! The mirror agent's own state, in RocksDB under `state_dir`:
//!
//! | key                 | value                                                      |
//! |---------------------|------------------------------------------------------------|
//! | `m/queued_through`  | u64: blocks of entries up to here are queued (or done)     |
//! | `m/bootstrap`       | JSON `Bootstrap` while a snapshot is installed/caught up   |
//! | `m/format`          | u32: the format of the records below (absent: 1)           |
//! | `q/<block key>`     | `QItem`: a copy still to do (length, attempts, next try)   |
//! | `t/<next:8><key>`   | index of `q/` by next try time, so finding due copies costs |
//! |                     | what is due, not the queue's length                         |
//! | `d/<block key>`     | the block is at the mirror store, verified                 |
//! | `x/<block key>`     | the mirror copy must be deleted (its slice was purged)     |
//!
//! Every change is one WriteBatch with the WAL synced, so a kill -9 loses no queued copy.
//! Room: the open refuses a disk without room for what RocksDB preallocates plus the floor
//! (`meta::check_open_room`, 77 MiB), each write one below the floor (`meta::check_room`).
//!
//! Versions: `QItem`s are postcard (positional), so each record starts with its version byte
//! (a `VersionedBin` record: 2; format 1, the first release's, had none); the bootstrap record
//! is a `Versioned` JSON record. A state directory of an older format is migrated at open in
//! one atomic batch; a newer one is refused, naming both.
//!
//! By concern: `queue` (the copies to do, their time index and running counts), `bootstrap`
//! (the record of a snapshot install or catch-up), `format` (the versions of the records
//! and the migration of an older state directory). Here: opening the directory, its writes.

mod bootstrap;
mod format;
#[cfg(test)]
mod fuzz_tests;
mod queue;

pub use bootstrap::Bootstrap;
pub use format::STATE_FORMAT;
pub use queue::{Changes, QItem};

use anyhow::{Context, Result};
use queue::Counts;
use rocksdb::{WriteBatch, WriteOptions, DB};
use std::path::Path;
use std::sync::Mutex;

pub struct State {
    db: DB,
    dir: std::path::PathBuf,
    /// Serializes read-modify-write of queue items (enqueue/cancel vs. worker results), and
    /// holds the queue's counts, kept up to date by every change (one scan at open), so
    /// status costs nothing however long the queue is.
    lock: Mutex<Counts>,
}

/// The state RocksDB's write buffer (what its open needs free follows from it).
const STATE_WRITE_BUFFER: u64 = 8 << 20;

const QUEUED: &[u8] = b"m/queued_through";
const BOOT: &[u8] = b"m/bootstrap";
const FORMAT: &[u8] = b"m/format";

impl State {
    pub fn open(dir: &Path) -> Result<State> {
        let st = Self::open_db(dir)?;
        st.migrate(dir)?;
        let c = st.load_queue()?;
        *st.lock.lock().unwrap_or_else(|p| p.into_inner()) = c;
        Ok(st)
    }

    /// What `run` would find in an existing state directory, for its checks: refused when
    /// another agent holds it, or when a newer release wrote it. Its queue is left as it is.
    /// Returns (queued through, a bootstrap record present).
    pub fn probe(dir: &Path) -> Result<(u64, bool)> {
        let st = Self::open_db(dir)?;
        let f = st.format()?;
        if f > STATE_FORMAT {
            anyhow::bail!(
                "the state directory {} was written by a newer mirror-agent (state format {f}; this one reads up to {STATE_FORMAT}): run that release, or see runbooks/lost-agent-state.md to start from an empty state directory",
                dir.display()
            );
        }
        Ok((st.queued_through()?, st.get(BOOT)?.is_some()))
    }

    /// Whether the disk of `dir` (or of its nearest existing parent) has the room the state
    /// needs to open (`check-config` runs this before the directory exists).
    pub fn check_room(dir: &Path) -> Result<()> {
        meta::check_open_room(
            &dir.join("agent.db"),
            STATE_WRITE_BUFFER,
            "the mirror agent's state",
            "set another state_dir in the configuration",
        )
        .map_err(|m| anyhow::anyhow!("{m}"))
    }

    fn open_db(dir: &Path) -> Result<State> {
        // Owner-only: the queue names the volume's blocks and the bootstrap its metadata.
        cli_common::private::ensure_private_dir(
            dir,
            "state directory",
            "set another state_dir in the configuration",
        )?;
        // Checked at open, as the metadata engine's writer is: RocksDB preallocates its log
        // and manifest at once, and an agent started on a nearly full disk would open, then
        // refuse every write after its first (each `write` checks the floor).
        Self::check_room(dir)?;
        let mut o = meta::base_options();
        o.create_if_missing(true);
        o.set_write_buffer_size(STATE_WRITE_BUFFER as usize);
        let db = DB::open(&o, dir.join("agent.db")).map_err(|e| {
            let m = e.into_string();
            if m.contains("lock") {
                anyhow::anyhow!("the state directory {} is in use by another mirror-agent (one agent per state_dir)", dir.display())
            } else {
                anyhow::anyhow!("opening the agent state in {}: {m}", dir.display())
            }
        })?;
        Ok(State {
            db,
            dir: dir.to_path_buf(),
            lock: Mutex::new(Counts::default()),
        })
    }

    fn write(&self, b: WriteBatch) -> Result<()> {
        // Refused short of a full disk (see `meta::check_room`): nothing written, retried.
        meta::check_room(&self.dir, b.size_in_bytes() as u64)
            .map_err(|m| anyhow::anyhow!("writing the agent state: {m}"))?;
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db
            .write_opt(b, &wo)
            .map_err(|e| anyhow::anyhow!("writing the agent state: {}", e.into_string()))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db
            .get(key)
            .map_err(|e| anyhow::anyhow!("reading the agent state: {}", e.into_string()))
    }

    pub fn queued_through(&self) -> Result<u64> {
        Ok(self
            .get(QUEUED)?
            .and_then(|v| v.try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs of `mib` MiB at `at`, unmounted when dropped (the tests run as root).
    struct SmallDisk(std::path::PathBuf);
    impl SmallDisk {
        fn new(at: &Path, mib: u64) -> SmallDisk {
            std::fs::create_dir_all(at).unwrap();
            let o = std::process::Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={mib}m,mode=0700"),
                    "tmpfs",
                ])
                .arg(at)
                .output()
                .unwrap();
            assert!(o.status.success(), "mount -t tmpfs: {o:?}");
            SmallDisk(at.to_path_buf())
        }
    }
    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }

    /// Issue 43: an agent started on a nearly full disk opened its state, then refused every
    /// write after its first. Its open now refuses, naming the directory and what it needs;
    /// on a disk with room it opens.
    #[test]
    fn the_agent_state_refuses_to_open_on_a_disk_without_room_for_its_log() {
        let t = tempfile::tempdir().unwrap();
        let small = SmallDisk::new(&t.path().join("small"), 70);
        let dir = small.0.join("state");
        let e = State::open(&dir).err().expect("opened on a 70 MiB disk");
        let msg = format!("{e:#}");
        let need = meta::open_need(STATE_WRITE_BUFFER).div_ceil(1 << 20);
        assert!(
            msg.starts_with("disk too small for the mirror agent's state: ")
                && msg.contains(&dir.join("agent.db").display().to_string())
                && msg.contains(&format!("needs {need} MiB there to open"))
                && msg.contains("set another state_dir"),
            "{msg}"
        );
        assert!(!dir.join("agent.db").exists(), "nothing was written");
        let e = State::probe(&dir).expect_err("probed on a 70 MiB disk");
        assert!(format!("{e:#}").contains("disk too small"), "{e:#}");
        let big = SmallDisk::new(&t.path().join("big"), need + 16);
        State::open(&big.0.join("state")).unwrap();
    }
}
