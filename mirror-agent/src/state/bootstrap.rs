//! The bootstrap record (`m/bootstrap`): a snapshot being installed, or installed and
//! catching up, in place or staged beside the live metadata. Present from the start of an
//! install until the mirror is consistent; a restart reads it to resume or start over.
//!
//! Stored as JSON with its format version beside the variant (`Record`, a `Versioned`
//! record): `{"version":1,"CatchingUp":{"s0":..,"s_end":..,"staged":..}}`. The first
//! releases wrote the variant alone (no version: version 1), which reads the same.

use super::*;
use fs_core::record::{self, Versioned};
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

/// The bootstrap record as stored: the variant, and the format version beside it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    #[serde(flatten)]
    pub(super) b: Bootstrap,
}

impl Versioned for Record {
    const KIND: &'static str = "the agent state's bootstrap record";
    const VERSION: u32 = 1;
}

pub(super) fn encode(b: &Bootstrap) -> Vec<u8> {
    record::encode(&Record { b: b.clone() })
}

pub(super) fn decode(raw: &[u8]) -> Result<Bootstrap> {
    Ok(record::decode::<Record>(raw)
        .context("the bootstrap record in the agent state")?
        .b)
}

impl State {
    pub fn bootstrap(&self) -> Result<Option<Bootstrap>> {
        self.get(BOOT)?.map(|v| decode(&v)).transpose()
    }

    pub fn set_bootstrap(&self, b: Option<&Bootstrap>) -> Result<()> {
        let mut wb = WriteBatch::default();
        match b {
            Some(b) => wb.put(BOOT, encode(b)),
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
        wb.put(BOOT, encode(&Bootstrap::Installing { s0, staged }));
        self.write(wb)?;
        *g = Counts::default();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Today's records (the variant alone, as every release so far wrote it) read as they
    /// were; what this release writes reads back; a newer version is refused.
    #[test]
    fn bootstrap_records_of_today_read_back_and_a_newer_one_is_refused() {
        for (raw, want) in [
            (
                r#"{"CatchingUp":{"s0":3,"s_end":9,"staged":true}}"#,
                Bootstrap::CatchingUp {
                    s0: 3,
                    s_end: 9,
                    staged: true,
                },
            ),
            (
                r#"{"Installing":{"s0":7,"staged":false}}"#,
                Bootstrap::Installing {
                    s0: 7,
                    staged: false,
                },
            ),
        ] {
            assert_eq!(decode(raw.as_bytes()).unwrap(), want);
            let again = encode(&want);
            let v: serde_json::Value = serde_json::from_slice(&again).unwrap();
            assert_eq!(v["version"], 1, "{v}");
            assert_eq!(decode(&again).unwrap(), want);
        }
        let e = decode(br#"{"version":2,"CatchingUp":{"s0":3,"s_end":9}}"#).unwrap_err();
        let f = e
            .downcast_ref::<fs_core::Error>()
            .expect("an fs_core::Error");
        assert_eq!(f.kind(), fs_core::ErrorKind::UnsupportedVersion);
        assert!(format!("{e:#}").contains("format version 2"), "{e:#}");
    }

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
