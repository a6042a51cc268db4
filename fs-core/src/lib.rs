//! fs-core: the volume format (inodes, chunks, slices, block keys), file-system semantics, and
//! the change journal, over two traits: `Engine` (metadata) and `BlockStore` (data).
//! No sockets, no CLI: engines and stores live in other crates.
//!
//! # Invariants (the whole list; ARCHITECTURE.md keeps the short one)
//!
//! - fs-core does no network or disk I/O of its own: only through `Engine` and `BlockStore`.
//! - A volume path a user gives is parsed into a `VolPath` before anything looks it up or joins
//!   it onto a host path: `..` never climbs above the root (such a path is refused, naming it),
//!   and `Fs::resolve` follows no symlink.
//! - Inodes are u64, the root is 1. A file is made of 64 MiB chunks. A chunk is an ordered list
//!   of 24-byte slice records `{pos, id, size, off, len}`, and later records win where they
//!   overlap (`build_view`). Slice id 0 is a hole (it reads as zeros: truncate lays one over the
//!   tail of the boundary chunk).
//! - Format version 2: the CRC32C of each block of a slice is put under `K<slice id>` in the
//!   transaction that first references the slice (write, compaction), and deleted with its
//!   pending delete by gc's purge. Readers load it with the chunk records (`Chunk.sums`) and
//!   every block fetch is a `BlockStore::get_block(key, BlockCheck {len, crc})`. Format 1 has no
//!   records and is checked by length; a newer format is refused at open.
//! - A block's object key comes from (slice id, index, length) alone:
//!   `<volume>/chunks/<id/1e6>/<id/1e3>/<id>_<index>_<len>`. It is written once and never
//!   rewritten.
//!   `<volume>/jfs_volume` (`owner.rs`) names the volume (uuid) that owns the prefix: written
//!   by format and cutover start before anything else, checked by gc before it deletes leaked
//!   objects.
//! - Write order: every block of a slice is in the store before the transaction that references
//!   it commits. So every block the journal references exists at origin, until gc.
//! - Nothing deletes a block synchronously. Freed slices go to `D<slice><size>` with the
//!   `"<seq> <time>"` of the freeing transaction (the `Stamp` mutation). `gc` removes them once
//!   past the trash time and at or below the lowest acknowledged seq of every registered
//!   mirror slot (`slots.rs`). It deletes nothing if any listing failed.
//! - Truncate and unlink touch chunk keys only (one per 64 MiB), never data: a 1 TiB file
//!   truncates in one transaction of a few keys (tested).
//! - Guard rule (phantoms): range reads are not validated at commit, only the values they saw.
//!   So every operation that adds or removes entries of directory D writes D's attributes, and
//!   every operation that depends on a range of D (rmdir's emptiness, the truncate chunk scan)
//!   reads the owning inode's attributes. Two such operations always conflict.
//! - Sites: a mirror's metadata carries the mirror marker (an aux record: name, primary, own
//!   store, origin store). Every engine checks it inside its commit section: `commit` on marked
//!   metadata fails with `ReadOnly` (writers cannot fork a mirror's history, whichever writer
//!   it is), and `apply`/`install_*` on unmarked metadata fail with `ReadOnly` (a primary's
//!   journal never replays into, and a snapshot never wipes, a volume of its own). `detach`
//!   replaces the marker with a `mirror.detached` record.
//! - Storage placement: the `storage` record (absent: `single(settings.storage)`, generation 0)
//!   names the primary and secondary store and a generation that grows at every change of
//!   placement; transitions are journaled with an audit record (`H<at><gen>`) and keep
//!   `settings.storage` equal to the primary. A commit that references new blocks (write,
//!   compaction) reads the record in its transaction and is `Fenced` unless its blocks were
//!   uploaded under the current generation (`NewSlice.placed`); `commit_slice` then reloads the
//!   placement, copies the slice's blocks to where the new generation puts them and commits
//!   again. `Fs::open` over a single store (`Fixed`) cannot follow: fenced from the first
//!   transition on.
//! - Inode and slice ids are handed out in batches (1024 / 256) by a journaled counter
//!   transaction, so ordinary operations never contend on a global counter. Ids lost in a crash
//!   are never reused.
//! - Epochs: the `epoch` key (absent: 0) is journaled like any other; `commit_promotion` sets
//!   epoch e+1, bumps the storage generation (writers re-place, and re-register their sessions
//!   at the new primary) and moves the inode and slice counters up by `ID_MARGIN` (2^20) in one
//!   transaction, so an id the old primary handed out in its lost tail is never reused. A
//!   fenced primary is a mirror's metadata (marker) plus `volume.moved` (written first, so a
//!   refused commit always finds where to wait for).

pub mod engine;
pub mod error;
pub mod fs;
#[cfg(any(test, feature = "fuzz"))]
#[doc(hidden)]
pub mod fuzz;
#[cfg(test)]
mod fuzz_tests;
pub mod journal;
pub mod keys;
pub mod maint;
pub mod owner;
pub mod path;
pub mod place;
pub mod record;
pub mod retry;
pub mod session;
pub mod site;
pub mod slots;
pub mod storage;
pub mod store;
pub mod txn;
pub mod types;

pub use engine::{CommitOutcome, Engine, JournalBounds};
pub use error::{Error, ErrorKind, ErrorStatus, Result};
pub use fs::namespace::Owner;
pub use fs::{
    BlockBuf, BlockPool, Budget, FileReader, FileWriter, Fs, Keeper, NewSlice, ReadAhead,
    MIN_WINDOW_BLOCKS,
};
pub use journal::{CommitRequest, Entry, Mutation, Op};
pub use path::VolPath;
pub use store::{BlockCheck, BlockStore, ObjectMeta, StoreLayer};
pub use types::*;
