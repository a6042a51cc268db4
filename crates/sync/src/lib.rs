//! The sync engine: full and incremental, resumable migrations between local directories,
//! object stores and volumes, run alone (`run::sync`) or shared by many workers through a job
//! board (`job::work`). `jfs-sync` (sync-cli/) is its command line; `jfs cutover` runs it
//! over a volume's blocks.
//!
//! # Invariants
//!
//! - Every listing is of a `KeyRange` (everything, what follows a resume cursor, or a shared
//!   job's range) and every endpoint that walks directories walks through `listing::walk`;
//!   adjoining ranges list each key exactly once (tested).
//! - A shared job's unit is changed only under its current fencing token (claims bump it):
//!   saves, finishes, splits and releases with a stale token are refused, so a worker whose
//!   lease passed to another can never record progress. Leases are on the engine's clock.
//! - A running range is cut (to share its back with an idle worker) only past every key its
//!   run has admitted (`listing::MovableEnd`), the run stops at the cut before the job hears of
//!   it, and the unit never ends before the cut is recorded: no key is worked by two holders and
//!   none is dropped. No job call holds a row lock across a round trip to a worker (PostgreSQL
//!   sessions end idle transactions after 3 s), so a worker cut off mid-call stalls nobody.
//! - A `--from-journal` job's round is planned in one step (its keys stored before any unit of it
//!   can be claimed), only from a done round, and its journal position moves only when the round
//!   ends done.
//! - Names are bytes: a key carries a name of any bytes losslessly (`names`), every POSIX
//!   endpoint decodes it back, an object store refuses a key that is not its name's text
//!   (permanent: the entry fails, named), and every printed key is escaped (`names::show`).
//!   A directory the rules exclude is never opened (`range::Prune`).
//! - Every listing is in ascending byte order of the key, with directories as `name/`. The two
//!   sides are merged as streams (pages of 1,000 through a channel of 4). Work goes to at most
//!   `--threads` tasks, and the merge waits for a free one. So memory depends on threads and
//!   directory width, not on the object count. An object-store listing that comes out of order
//!   aborts the run, never skips.
//! - Parallel listing (`--list-threads`, `--list-depth`) splits the top levels into subtrees,
//!   each listed by its own task into a bounded channel. The subtrees are forwarded in key order,
//!   so the merge sees the same stream as a sequential listing (tested). One spawner hands out
//!   permits in key order, so the earliest unfinished subtree always holds one and the pipeline
//!   cannot deadlock.
//! - SRC and DST never overlap: both are reduced to places (a resolved local path, a store
//!   and prefix, a volume by metadata and by uuid, plus what a volume lives in: its RocksDB
//!   directory and its blocks' prefix), checked before anything is opened or created and again
//!   with what the opened endpoints know.
//! - The resume cursor only ever covers resolved keys. Keys handed to workers sit in a window,
//!   and the cursor stops before the first unfinished or failed one, so the next run retries it.
//!   Keys finished beyond the cursor are recorded as done (with size, mtime and what was done),
//!   so a resumed run does not copy them again and counts them as what they were. The window
//!   also carries the outcome of every key decided on the spot, so each checkpoint saves the
//!   cursor with the exact tally of the keys at or before it: a resumed run's summary counts
//!   every key once. Resolved is not settled: the source may change behind the cursor while
//!   no run is going, so a resumed run lists that part again after the rest (`run::sync`),
//!   and a resumed run over a list of keys (`--from-journal`) starts the list over.
//! - A copy is recorded (done, counted, its source deleted with `--delete-src`) only once it
//!   is durable. Stores and volumes are durable when the write returns; a local destination's
//!   finished copies wait in a bounded list flushed by one `syncfs` (data and directory
//!   entries) before each checkpoint; large files are also synced every 64 MiB as they are
//!   written. A failed sync leaves them unrecorded (the next run copies them again).
//! - Nothing is deleted unless the run completed without a listing or copy error, and within
//!   `--max-delete`. Deletions go deepest first.
//! - The merge position (what the cursor may reach when no work is in flight) is published only
//!   after a key was handed out or decided, never while it waits for a worker.
//! - A multipart upload id is written (and synced) to the state before its first part.
//! - A destination object appears under its real name only when complete: temp file + rename
//!   (local, volume), or upload completion (S3). The temporary name is a function of the name
//!   (`endpoint::temp_name`, at most 255 bytes for any legal name), so a resumed attempt writes
//!   over and renames what an interrupted one left; such names are never listed as objects, and
//!   a run removes those it finds on its destination.
//! - Resume state belongs to what SRC and DST are (`fs_core::place::identity`: a volume's uuid, a
//!   directory's resolved path, a store), not to the command's text: the default directory is
//!   a hash of those and the options, and the state records them (`State::claim`); a state
//!   kept for another sync is refused, never resumed. A shared job records the same for
//!   directories and volumes, and a worker whose SRC or DST is something else is refused.
//! - A shared job has an incarnation: every write of a worker (claim, renew, save, report,
//!   draw, end) checks it in the same atomic step (a Lua guard; a `FOR KEY SHARE` of the job's
//!   row, which `job delete` takes first), so a deleted job is never written back and its
//!   workers stop with exit 2.
//! - Keys are untrusted: `check_key` on every write. The local endpoint resolves every path
//!   relative to the destination's directory descriptor (cap-std), which cannot leave it.
//! - `--from-journal` reads the volume's journal from the sequence number recorded by the last
//!   successful run. Keys are resolved through the current volume and the names seen in the
//!   window (for directories deleted since). It falls back to a full listing, loudly, when the
//!   journal was trimmed past that point.

pub mod backfill;
pub mod check;
pub mod copy;
pub mod endpoint;
pub mod entry;
pub mod filter;
pub mod job;
pub mod journal;
pub use objstore::limits;
#[cfg(test)]
mod fuzz_tests;
pub mod listing;
pub mod names;
pub mod options;
pub mod plan;
pub mod progress;
pub mod range;
pub mod run;
pub mod state;
pub mod stats;

/// The command's last step: volumes (`jfs://`) it opened as a writer leave no session record
/// behind (see `volume::end_sessions`).
pub async fn end_sessions() {
    volume::end_sessions(std::time::Duration::from_secs(5)).await;
}
