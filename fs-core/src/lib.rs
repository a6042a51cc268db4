//! fs-core: the volume format (inodes, chunks, slices, block keys), file-system semantics, and
//! the change journal, over two traits: `Engine` (metadata) and `BlockStore` (data).
//! No sockets, no CLI: engines and stores live in other crates.

pub mod engine;
pub mod error;
pub mod fs;
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
pub use fs::{Budget, FileReader, FileWriter, Fs, Keeper, NewSlice, ReadAhead};
pub use journal::{CommitRequest, Entry, Mutation, Op};
pub use path::VolPath;
pub use store::{BlockCheck, BlockStore, ObjectMeta, StoreLayer};
pub use types::*;
