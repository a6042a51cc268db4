//! Versions of the agent state: the format of the whole directory (`m/format`, absent: 1)
//! and of each queue item. `QItem`s are postcard (positional), so each record starts with the
//! format's version byte (format 2; format 1, the first release's, had none). A state
//! directory of an older format is migrated at open in one atomic batch; a newer one is
//! refused, naming both.

use super::queue::k;
use super::*;

/// The format this release writes.
pub const STATE_FORMAT: u32 = 2;

pub(super) fn encode_item(q: &QItem) -> Vec<u8> {
    let mut v = vec![STATE_FORMAT as u8];
    v.extend(postcard::to_allocvec(q).expect("serializes"));
    v
}

/// A queue record of format `format` (1: bare postcard; 2: version byte, then postcard).
pub(super) fn decode_item(v: &[u8], format: u32) -> Result<QItem> {
    let body = match format {
        1 => v,
        _ => match v.split_first() {
            Some((2, rest)) => rest,
            _ => anyhow::bail!("a queue item of an unknown version ({:?})", v.first()),
        },
    };
    postcard::from_bytes(body).context("a queue item does not decode")
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
}
