//! Versions of the agent state: the format of the whole directory (`m/format`, absent: 1)
//! and of each queue item. `QItem`s are postcard (positional), so each record starts with the
//! format's version byte (format 2; format 1, the first release's, had none). A state
//! directory of an older format is migrated at open in one atomic batch; a newer one is
//! refused, naming both.

use super::queue::k;
use super::*;
use fs_core::record::{self, VersionedBin};

/// The format this release writes.
pub const STATE_FORMAT: u32 = 2;

/// A queue item: its version byte (2, the only one written so far), then postcard.
impl VersionedBin for QItem {
    const KIND: &'static str = "a block queue item";
    const VERSION: u8 = 2;

    fn encode_body(&self, out: &mut Vec<u8>) {
        out.extend(postcard::to_allocvec(self).expect("serializes"));
    }

    fn decode_body(version: u8, body: &[u8]) -> fs_core::Result<Self> {
        match version {
            2 => postcard::from_bytes(body)
                .map_err(|e| fs_core::error::corrupt(format!("a queue item does not decode: {e}"))),
            // Format 1 had no version byte: its items are read by the migration only.
            v => Err(fs_core::error::corrupt(format!(
                "a queue item of an unknown version ({v})"
            ))),
        }
    }
}

pub(super) fn encode_item(q: &QItem) -> Vec<u8> {
    record::encode_bin(q)
}

/// A queue record of state format `format` (1: bare postcard; 2: version byte, then postcard).
pub(super) fn decode_item(v: &[u8], format: u32) -> Result<QItem> {
    match format {
        1 => postcard::from_bytes(v).context("a queue item does not decode"),
        _ => Ok(record::decode_bin(v)?),
    }
}

impl State {
    pub(super) fn format(&self) -> Result<u32> {
        Ok(match self.get(FORMAT)? {
            None => 1,
            Some(v) => u32::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("the agent state's format record is damaged"))?,
            ),
        })
    }

    /// Bring a state directory of an older format to this one (one atomic batch, so a kill
    /// leaves it old or new), or refuse one of a newer format.
    pub(super) fn migrate(&self, dir: &Path) -> Result<()> {
        let f = self.format()?;
        if f > STATE_FORMAT {
            anyhow::bail!(
                "the state directory {} was written by a newer mirror-agent (state format {f}; this one reads up to {STATE_FORMAT}): run that release, or see runbooks/lost-agent-state.md to start from an empty state directory",
                dir.display()
            );
        }
        if f == STATE_FORMAT {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        let mut n = 0u64;
        self.each_queued_as(f, |key, q| {
            wb.put(k("q/", key), encode_item(&q));
            n += 1;
            Ok(())
        })?;
        wb.put(FORMAT, STATE_FORMAT.to_be_bytes());
        // A new state directory has nothing to migrate: it is only stamped.
        let fresh = n == 0 && self.get(QUEUED)?.is_none() && self.get(BOOT)?.is_none();
        self.write(wb)?;
        if fresh {
            return Ok(());
        }
        tracing::info!(
            from = f,
            to = STATE_FORMAT,
            items = n,
            "agent state migrated to the current format"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BOOT, FORMAT, QUEUED};
    use super::*;
    use crate::state::QItem;

    /// A state directory as the previous release wrote it (format 1: bare postcard queue
    /// items, no format record) opens, is migrated, and serves its queue; one of a newer
    /// format is refused.
    #[test]
    fn a_state_of_the_previous_release_opens_and_a_newer_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        {
            let mut o = rocksdb::Options::default();
            o.create_if_missing(true);
            let db = DB::open(&o, d.path().join("agent.db")).unwrap();
            let old = QItem {
                len: 4096,
                attempts: 2,
                next_ns: 5,
            };
            db.put(
                b"q/vol/chunks/0/0/7_0_4096",
                postcard::to_allocvec(&old).unwrap(),
            )
            .unwrap();
            db.put(
                b"q/vol/chunks/0/0/8_0_100",
                postcard::to_allocvec(&QItem {
                    len: 100,
                    attempts: 0,
                    next_ns: 0,
                })
                .unwrap(),
            )
            .unwrap();
            db.put(QUEUED, 42u64.to_be_bytes()).unwrap();
            db.put(BOOT, br#"{"CatchingUp":{"s0":40,"s_end":44}}"#)
                .unwrap();
        }
        let st = State::open(d.path()).unwrap();
        assert_eq!(st.format().unwrap(), STATE_FORMAT);
        assert_eq!(st.pending().unwrap(), (2, 4196, 1));
        assert_eq!(st.queued_through().unwrap(), 42);
        assert!(!st.bootstrap().unwrap().unwrap().staged());
        let due = st.due(10, 10, &|_| false).unwrap();
        assert_eq!(due.len(), 2, "{due:?}");
        assert_eq!(
            due.iter().find(|(k, _)| k.ends_with("7_0_4096")).unwrap().1,
            QItem {
                len: 4096,
                attempts: 2,
                next_ns: 5
            }
        );
        drop(st);
        // Opens again (already migrated), then refuses a newer format.
        let st = State::open(d.path()).unwrap();
        assert_eq!(st.pending().unwrap().0, 2);
        st.db.put(FORMAT, 9u32.to_be_bytes()).unwrap();
        drop(st);
        let e = State::open(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("newer mirror-agent") && e.contains("format 9"),
            "{e}"
        );
    }

    /// A queue item as this release and the previous one write it (version byte 2, then
    /// postcard) reads back; a newer version is refused.
    #[test]
    fn queue_items_of_today_read_back_and_a_newer_one_is_refused() {
        let want = QItem {
            len: 4096,
            attempts: 2,
            next_ns: 5,
        };
        let today = [2u8, 0x80, 0x20, 0x02, 0x0a];
        assert_eq!(decode_item(&today, STATE_FORMAT).unwrap(), want);
        assert_eq!(encode_item(&want), today);
        let e = decode_item(&[3, 0x80, 0x20, 0x02, 0x0a], STATE_FORMAT).unwrap_err();
        let f = e
            .downcast_ref::<fs_core::Error>()
            .expect("an fs_core::Error");
        assert_eq!(f.kind(), fs_core::ErrorKind::UnsupportedVersion);
        // Format 1: bare postcard.
        assert_eq!(decode_item(&today[1..], 1).unwrap(), want);
    }
}
