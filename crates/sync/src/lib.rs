//! The sync engine: full and incremental, resumable migrations between local directories,
//! object stores and volumes, run alone (`run::sync`) or shared by many workers through a job
//! board (`job::work`). `jfs-sync` (sync-cli/) is its command line; `jfs cutover` runs it
//! over a volume's blocks.

pub mod backfill;
pub mod check;
pub mod copy;
pub mod endpoint;
pub mod entry;
pub mod filter;
pub mod job;
pub mod journal;
pub use objstore::limits;
pub mod listing;
pub mod options;
pub mod plan;
pub mod progress;
pub mod range;
pub mod run;
pub mod state;
pub mod stats;
