//! mirror-agent: one long-running process per region. On the primary it serves the volume's
//! journal to registered mirrors and keeps their replication slots; at a mirror it applies
//! the journal within a consistency window and replicates blocks. See ARCHITECTURE.md.
//!
//! Every background loop is a `background::Worker` under one supervisor per role (the
//! primary's `primary status`, `slot lease`, `journal maintenance`; the mirror's
//! `replication`, `block copier`, `status`), stopped by the token of
//! `cli_common::shutdown_on_signals` and drained within a deadline; `status` lists them.
//! Every record the agent persists is an `fs_core::record` record (the agent state's
//! bootstrap record and queue items, the primary's lease, a saved tail's manifest).
//! `proto` (messages, framing) sits below `handshake` (the exchange), which sits below the
//! roles (`primary`, `mirror`).
//!
//! # Invariants
//!
//! - Before a peer has proven its token: messages of at most 64 KiB, at most 16 pending
//!   handshakes per source address and 256 in all (the busiest address's oldest goes first),
//!   10 s for the whole handshake. What an unauthenticated peer can make the primary hold is
//!   bounded (tested with a flood), and so is what it can make it write: its refusals are
//!   summed up in one log line a minute (`primary::refusals`; each at debug) and what it sent
//!   is cut short before it is shown.
//! - A mirror agent replays only into metadata marked as its mirror's (it marks empty metadata
//!   first; the engines refuse replay elsewhere); a primary agent refuses a mirror's metadata.
//! - Epochs at the handshake (protocol 2): the mirror's Hello carries the highest epoch it has
//!   seen, the primary's Welcome its own. A fenced primary refuses every mirror; a primary older
//!   than the mirror's epoch is superseded and refuses; a mirror older than the primary (the old
//!   primary rejoining) is checked at the promotion point and resyncs if its tail diverged.
//!   `promote` runs only with the mirror agent stopped (it opens the agent's state).
//! - Wire: every message is `[len u32][crc32c][postcard]`, at most 64 MiB; journal entries
//!   travel as their journal frames and are decoded (version + CRC) and checked for the next
//!   sequence number before apply. A damaged or out-of-order message ends the connection; the
//!   mirror reconnects from its applied seq. Nothing unauthenticated gets past the handshake:
//!   mirror and primary each prove the per-mirror token with an HMAC over fresh nonces and
//!   the hello, the mirror first (protocol 3), so a peer without the token learns nothing to
//!   test guesses against, and an unknown name is refused as a wrong token is (same bytes,
//!   same delay). Tokens are checked for strength and their files for owner-only modes.
//! - One primary agent per volume (its lease; a second one refuses to start, and of two
//!   started at once the later stops), and one copy of a mirror's metadata per slot: the
//!   hello carries the metadata's identity (`site::IDENTITY`), the slot records the first
//!   copy that streams from it, and another copy under the name is refused at both agents
//!   until `slot drop`.
//! - The mirror's applied seq **is** its engine's head, set by `Engine::apply` in the same atomic
//!   write as the entries (many per call). Acks are sent only after `apply` returns, so a slot
//!   never runs ahead of durable state. Restart = continue from head + 1, after the primary has
//!   checked that the mirror's frame at its head is its own (CRC32C), so a parted history is
//!   resynced, never continued.
//! - A mirror equals the primary at its head whenever it is not bootstrapping (tested by
//!   sampling). During a bootstrap (snapshot read while writes go on, then replay from its start)
//!   it says so (`bootstrap`, `within_window = false`) until it has applied the snapshot's end.
//!   A mirror with no consistent state yet installs in place, and the aux record
//!   `mirror.incomplete` fences readers off (`jfs` refuses to open it) for that time. A mirror
//!   that has one (a resync: dropped slot, parted history, `mirror-agent resync`) installs into
//!   a staging RocksDB in `state_dir` and replays into it until it reaches the snapshot's end;
//!   its live metadata meanwhile serves the previous state (`mirror.progress` says `resyncing`,
//!   mounts count stale opens) and is then switched by one `install_switch`. Purges of blocks
//!   wait for the switch (the live state may still reference them); copies read checksums from
//!   the staging first. A kill restarts the install, reopens the staging in the catch-up, or
//!   repeats the switch (idempotent: the difference is then empty).
//! - The block queue is updated after each apply with `queued_through`; at start the agent
//!   re-reads its own journal after `queued_through`, so a crash between the two loses no copy.
//!   A block is marked done only after its verified PUT (length and the CRC32C its slice
//!   recorded, read from the mirror's applied metadata), and only if still queued (a cancel or
//!   purge meanwhile queues the fresh copy's deletion as a purge, so it too waits for a
//!   staged switch; a block found already there, as a rejoining former primary's own blocks
//!   are, is never deleted by a copy). Status reads the queue's counts after
//!   `queued_through`, so "0 pending" covers every applied entry.
//! - Queue order is the time index (`t/<next try>`): blocks the site's mounts read from the
//!   origin (their `mirror.want.<session>` aux records) are moved to time 0, and workers take
//!   from the queue only as they free up, so those are copied next.
//! - The primary pins a slot at a snapshot's start before reading it, and checks no trim raced
//!   the pin. Slot updates are read-modify-write under a lock. While a primary agent runs (its
//!   lease record beside the volume is fresh), `slot drop` goes through it (admin API, under
//!   that lock), so no acknowledgement can bring a dropped slot back; the stream ends with
//!   "resync".
//! - A lost state directory loses no copy: when the queue does not cover the mirror's journal,
//!   every block the metadata references is queued again (present ones are skipped); a lost
//!   bootstrap record with the readers' fence still up restarts the snapshot.
//! - Persisted records carry versions: the agent state has a format (`m/format`, 2; queue
//!   items start with a version byte; an older state directory is migrated at open in one
//!   batch, a newer one is refused naming both); slot records (absent: 1, as the first release
//!   wrote them) and the mirror marker carry a `version`, and a newer one is refused. Tested
//!   with records as the first release wrote them.
//! - Refusals retrying cannot fix (auth, a foreign volume, not a primary) back off 30 s to
//!   10 min and show in status; network failures retry within seconds.
//! - `fence` and `promote` write nothing before their checks pass (`--moved-to` is this
//!   volume's mirror or promoted primary; at `--new-primary` answers, in a planned move, the
//!   agent of that mirror (`mirror::awaiting`, its `[mirror] listen`, naming a digest of its
//!   metadata identity), after a failover a primary agent; the site is not a rejoined
//!   mirror). The fence record (`volume.fenced`: name, new primary, the epoch held) tells a
//!   repeated fence from one of a site that rejoined since; the move record (`volume.moved`)
//!   is cleared once the site has rejoined (holds the new epoch). The epoch record keeps where every
//!   earlier epoch began (`history`), so a site rejoining from epoch e knows where its history
//!   parted (the start of e+1).
//! - A staged resync never drops a diverged tail silently: when the live metadata holds
//!   entries of an older epoch past that parting point, they and the files they wrote (bytes
//!   read from the blocks, checked) are saved under `state_dir/rollback/` (written as
//!   `*.partial`, renamed when complete) and recorded (`volume.rollback.*`, shown by
//!   `jfs status`) before `install_switch`; a failed save leaves the switch for the next try.
//! - A queued copy leaves the queue when done, cancelled, purged, or when its slice has no
//!   checksum record in the consistent metadata (freed and purged: nothing will reference it
//!   again), so a stale item cannot keep a mirror from converging. Each session first queues
//!   entries applied but not queued (a state write refused after an apply), and an applier
//!   never outlives its session.
//! - Journal trimming by the agent needs a writable engine (Redis, PostgreSQL); with RocksDB the
//!   agent is a secondary and `jfs gc` trims, honouring the same slots.

pub mod admin;
pub mod blocks;
pub mod config;
#[cfg(test)]
mod fuzz_tests;
pub mod handshake;
pub mod metrics;
pub mod mirror;
pub mod preflight;
pub mod primary;
pub mod promote;
pub mod proto;
pub mod rollback;
pub mod site;
pub mod staging;
pub mod state;
pub mod tls;
