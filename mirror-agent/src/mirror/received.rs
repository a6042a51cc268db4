//! The checks of what a mirror receives from its primary in one session, as a pure state
//! machine (no I/O), so that a harness can drive it with every sequence
//! (`fuzz_tests::fuzz_agent_received_sequences`) and the session only acts on its steps:
//!
//! - the primary's epoch (its welcome) is not below the epoch this mirror has seen (a
//!   primary superseded by a promotion is refused);
//! - a session that asked for a snapshot gets `SnapshotBegin`, any number of
//!   `SnapshotPairs`, then `SnapshotEnd` whose seq is not below the beginning's (the primary's
//!   head cannot go back while it streams a snapshot), and nothing else in between;
//! - then journal frames run on from the next expected seq (`proto::check_entries`), with
//!   heartbeats and the primary's refusals between them; a snapshot message there, or
//!   anything else, is refused.
//!
//! Every refusal is an error naming what was wrong; the session ends on it (and asks again).

use crate::proto::{self, ToMirror};
use fs_core::Entry;

/// Where a session is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// A snapshot was asked for: its beginning is due.
    SnapshotDue,
    /// A snapshot that began at `s0` is being received.
    Snapshot { s0: u64 },
    /// Journal frames, the next one `expected` (None: the head was u64::MAX).
    Stream { expected: Option<u64> },
}

/// What the session does with a message that passed the checks.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A snapshot at `seq` begins (its settings, as sent).
    SnapshotBegin {
        seq: u64,
        settings: Vec<u8>,
    },
    /// Pairs of the snapshot to install.
    SnapshotPairs {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// The snapshot began at `s0` and the primary's head was `s_end` at its end: frames
    /// from `s0 + 1` follow.
    SnapshotEnd {
        s0: u64,
        s_end: u64,
    },
    /// Entries to apply, in order, the first the one that was expected.
    Entries(Vec<Entry>),
    Heartbeat {
        head: u64,
    },
    /// The primary ended the stream: a resync is needed (`resync`) or not.
    Refused {
        reason: String,
        resync: bool,
    },
}

/// A refusal: what was received that may not be (the session ends on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    OldEpoch {
        primary: u64,
        mine: u64,
    },
    SnapshotEndsBeforeItBegins {
        begin: u64,
        end: u64,
    },
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    Entries(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OldEpoch { primary, mine } => write!(f, "the primary is at epoch {primary} but this mirror has seen epoch {mine}: it was superseded by a promotion; point [mirror] primary at the new primary"),
            Refusal::SnapshotEndsBeforeItBegins { begin, end } => write!(f, "the snapshot ends at seq {end}, below its beginning at seq {begin}: refused (a new snapshot is asked for)"),
            Refusal::Unexpected { expected, got } => write!(f, "expected {expected}, got {got}"),
            Refusal::Entries(why) => write!(f, "journal frames refused: {why}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// The checks of one session (see the module comment).
#[derive(Debug, Clone)]
pub struct Received {
    phase: Phase,
}

impl Received {
    /// A session whose primary welcomed it at `primary_epoch`, this mirror having seen
    /// `my_epoch`; `snapshot`: it asked for one; else frames from `expected` on.
    pub fn new(
        primary_epoch: u64,
        my_epoch: u64,
        snapshot: bool,
        expected: u64,
    ) -> Result<Received, Refusal> {
        if primary_epoch < my_epoch {
            return Err(Refusal::OldEpoch {
                primary: primary_epoch,
                mine: my_epoch,
            });
        }
        Ok(Received {
            phase: if snapshot {
                Phase::SnapshotDue
            } else {
                Phase::Stream {
                    expected: Some(expected),
                }
            },
        })
    }

    /// Whether a snapshot is being received (begun or due).
    pub fn in_snapshot(&self) -> bool {
        !matches!(self.phase, Phase::Stream { .. })
    }

    /// The next journal seq due, once streaming.
    pub fn expected(&self) -> Option<u64> {
        match self.phase {
            Phase::Stream { expected } => expected,
            _ => None,
        }
    }

    /// Check one message and move on; a refusal leaves the state as it was.
    pub fn step(&mut self, msg: ToMirror) -> Result<Step, Refusal> {
        let got = proto::msg_name(&msg);
        let unexpected = |expected| Err(Refusal::Unexpected { expected, got });
        match (&self.phase, msg) {
            (Phase::SnapshotDue, ToMirror::SnapshotBegin { seq, settings }) => {
                self.phase = Phase::Snapshot { s0: seq };
                Ok(Step::SnapshotBegin { seq, settings })
            }
            (Phase::SnapshotDue, _) => unexpected("a snapshot"),
            (Phase::Snapshot { .. }, ToMirror::SnapshotPairs { pairs }) => {
                Ok(Step::SnapshotPairs { pairs })
            }
            (&Phase::Snapshot { s0 }, ToMirror::SnapshotEnd { seq }) => {
                if seq < s0 {
                    return Err(Refusal::SnapshotEndsBeforeItBegins {
                        begin: s0,
                        end: seq,
                    });
                }
                self.phase = Phase::Stream {
                    expected: s0.checked_add(1),
                };
                Ok(Step::SnapshotEnd { s0, s_end: seq })
            }
            (Phase::Snapshot { .. }, _) => unexpected("the snapshot's pairs or its end"),
            (&Phase::Stream { expected }, ToMirror::Entries { frames }) => {
                let Some(x) = expected else {
                    return Err(Refusal::Entries(
                        "entries after seq u64::MAX, the last there can be".into(),
                    ));
                };
                let batch =
                    proto::check_entries(x, frames).map_err(|e| Refusal::Entries(e.to_string()))?;
                self.phase = Phase::Stream {
                    expected: x.checked_add(batch.len() as u64),
                };
                Ok(Step::Entries(batch))
            }
            (Phase::Stream { .. }, ToMirror::Heartbeat { head, .. }) => {
                Ok(Step::Heartbeat { head })
            }
            (Phase::Stream { .. }, ToMirror::Refused { reason, resync }) => {
                Ok(Step::Refused { reason, resync })
            }
            (Phase::Stream { .. }, _) => unexpected("journal entries or a heartbeat"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_session() -> Received {
        let mut r = Received::new(3, 3, true, 1).unwrap();
        r.step(ToMirror::SnapshotBegin {
            seq: 10,
            settings: vec![],
        })
        .unwrap();
        r
    }

    /// Fuzzing found it: `SnapshotEnd` below its `SnapshotBegin` was accepted (and the
    /// snapshot installed as if at the beginning's seq).
    #[test]
    fn a_snapshot_end_below_its_beginning_is_refused() {
        let mut r = snapshot_session();
        let e = r.step(ToMirror::SnapshotEnd { seq: 9 }).unwrap_err();
        assert_eq!(e, Refusal::SnapshotEndsBeforeItBegins { begin: 10, end: 9 });
        assert!(
            e.to_string().contains("below its beginning at seq 10"),
            "{e}"
        );
        assert!(r.in_snapshot(), "a refusal changes nothing");
        assert_eq!(
            r.step(ToMirror::SnapshotEnd { seq: 10 }).unwrap(),
            Step::SnapshotEnd { s0: 10, s_end: 10 }
        );
        assert_eq!(r.expected(), Some(11));
    }

    #[test]
    fn a_primary_of_an_older_epoch_is_refused() {
        let e = Received::new(2, 3, false, 1).unwrap_err();
        assert_eq!(
            e,
            Refusal::OldEpoch {
                primary: 2,
                mine: 3
            }
        );
        assert!(Received::new(4, 3, false, 1).is_ok());
    }

    #[test]
    fn snapshot_messages_out_of_their_place_are_refused() {
        let mut r = Received::new(0, 0, false, 5).unwrap();
        assert!(matches!(
            r.step(ToMirror::SnapshotEnd { seq: 5 }),
            Err(Refusal::Unexpected { .. })
        ));
        let mut r = Received::new(0, 0, true, 5).unwrap();
        assert!(matches!(
            r.step(ToMirror::Heartbeat {
                head: 1,
                head_time_ns: 0
            }),
            Err(Refusal::Unexpected { .. })
        ));
        let mut r = snapshot_session();
        assert!(matches!(
            r.step(ToMirror::Entries { frames: vec![] }),
            Err(Refusal::Unexpected { .. })
        ));
    }
}
