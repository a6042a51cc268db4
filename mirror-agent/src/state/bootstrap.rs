//! The bootstrap record (`m/bootstrap`): a snapshot being installed, or installed and
//! catching up, in place or staged beside the live metadata. Present from the start of an
//! install until the mirror is consistent; a restart reads it to resume or start over.

use super::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bootstrap {
    /// A snapshot taken at `s0` is being installed: a restart starts it over.
    Installing {
        s0: u64,
        /// Into the resync staging beside the live metadata (see `staging`), not into it.
        #[serde(default)]
        staged: bool,
    },
    /// Installed; the mirror is consistent once `applied >= s_end` (staged: once the
    /// staging has, and the live metadata has been switched to it).
    CatchingUp {
        s0: u64,
        s_end: u64,
        #[serde(default)]
        staged: bool,
    },
}

impl Bootstrap {
    /// A resync beside the live state, which keeps serving meanwhile.
    pub fn staged(&self) -> bool {
        match self {
            Bootstrap::Installing { staged, .. } | Bootstrap::CatchingUp { staged, .. } => *staged,
        }
    }
}

impl State {
    pub fn bootstrap(&self) -> Result<Option<Bootstrap>> {
        match self.get(BOOT)? {
            None => Ok(None),
            Some(v) => Ok(Some(
                serde_json::from_slice(&v).context("the bootstrap record in the agent state")?,
            )),
        }
    }

    pub fn set_bootstrap(&self, b: Option<&Bootstrap>) -> Result<()> {
        let mut wb = WriteBatch::default();
        match b {
            Some(b) => wb.put(BOOT, serde_json::to_vec(b).expect("serializes")),
            None => wb.delete(BOOT),
        }
        self.write(wb)
    }

    /// Start of a snapshot install: forget pending copies (the snapshot re-queues what it
    /// references); verified copies stay known.
    pub fn begin_install(&self, s0: u64, staged: bool) -> Result<()> {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut wb = WriteBatch::default();
        wb.delete_range(&b"q/"[..], &b"q0"[..]);
        wb.delete_range(&b"t/"[..], &b"t0"[..]);
        wb.put(QUEUED, 0u64.to_be_bytes());
        wb.put(
            BOOT,
            serde_json::to_vec(&Bootstrap::Installing { s0, staged }).expect("serializes"),
        );
        self.write(wb)?;
        *g = Counts::default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_record_of_the_previous_release_reads_as_in_place() {
        let b: Bootstrap = serde_json::from_str(r#"{"CatchingUp":{"s0":3,"s_end":9}}"#).unwrap();
        assert_eq!(
            b,
            Bootstrap::CatchingUp {
                s0: 3,
                s_end: 9,
                staged: false
            }
        );
        let b: Bootstrap = serde_json::from_str(r#"{"Installing":{"s0":3}}"#).unwrap();
        assert!(!b.staged());
        let d = tempfile::tempdir().unwrap();
        let st = State::open(d.path()).unwrap();
        st.begin_install(7, true).unwrap();
        assert!(st.bootstrap().unwrap().unwrap().staged());
    }
}
