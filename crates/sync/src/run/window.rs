//! The merge position of a run and its checkpoints: keys in merge order (`Window`), the
//! cursor that never passes a key not yet recorded, and the tally of exactly the keys at or
//! before it; finished copies wait for durability (`Finished`) before they are recorded.

use crate::endpoint::{Entry, Kind, Page};
use crate::stats::{Outcome, Summary};
use anyhow::Result;
use std::collections::VecDeque;
use tokio::sync::mpsc;

/// Completions waiting for the durability flush are bounded: past this many, the flush runs
/// at once instead of at the next tick.
pub(super) const UNSYNCED_MAX: usize = 4096;

/// A merged listing side: pages from a lister task, one entry at a time.
pub(super) struct Side {
    pub(super) rx: mpsc::Receiver<Page>,
    pub(super) buf: VecDeque<Entry>,
}

impl Side {
    pub(super) async fn peek(&mut self) -> Result<Option<&Entry>> {
        while self.buf.is_empty() {
            match self.rx.recv().await {
                Some(page) => self.buf.extend(page?),
                None => return Ok(None),
            }
        }
        Ok(self.buf.front())
    }
}

/// A key handed to a worker: the merge position before it, its outcome once recorded, and the
/// outcomes of keys decided on the spot after it (before the next handed-out key).
pub(super) struct Slot {
    pub(super) prev: Option<String>,
    pub(super) outcome: Option<Outcome>,
    pub(super) trailing: Summary,
}

/// Keys in order of the merge; the cursor never passes one that is not recorded, and the
/// tally holds exactly the outcomes of the keys at or before the cursor.
#[derive(Default)]
pub(super) struct Window {
    pub(super) base: u64,
    pub(super) q: VecDeque<Slot>,
    pub(super) merged_to: Option<String>,
    pub(super) tally: Summary,
}

impl Window {
    /// A key is handed out (`key` is published as the merge position).
    pub(super) fn push(&mut self, key: String) -> u64 {
        let prev = self.merged_to.replace(key);
        self.q.push_back(Slot {
            prev,
            outcome: None,
            trailing: Summary::default(),
        });
        self.base + self.q.len() as u64 - 1
    }
    /// A key was decided on the spot (skipped, excluded, extra...).
    pub(super) fn inline(&mut self, key: String, o: Outcome) {
        match self.q.back_mut() {
            Some(s) => s.trailing.count(o),
            None => self.tally.count(o),
        }
        self.merged_to = Some(key);
    }
    pub(super) fn resolve(&mut self, id: u64, o: Outcome) {
        if let Some(s) = self.q.get_mut((id - self.base) as usize) {
            s.outcome = Some(o);
        }
    }
    /// Everything at or before the returned key is recorded (and in `tally`).
    pub(super) fn cursor(&mut self) -> Option<String> {
        while self.q.front().is_some_and(|s| s.outcome.is_some()) {
            let s = self.q.pop_front().expect("front");
            self.tally.count(s.outcome.expect("resolved"));
            self.tally.add(&s.trailing);
            self.base += 1;
        }
        match self.q.front() {
            Some(s) => s.prev.clone(),
            None => self.merged_to.clone(),
        }
    }
}

/// A finished copy not yet recorded (waiting for durability).
pub(super) struct Finished {
    pub(super) id: u64,
    pub(super) key: String,
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) kind: Kind,
    pub(super) outcome: Outcome,
}
