//! jfs-sync: full and incremental, resumable migrations between local directories, object
//! stores and volumes. `run::sync` is the entry point; `main.rs` is wiring.

pub mod check;
pub mod cli;
pub mod copy;
pub mod endpoint;
pub mod filter;
pub mod job;
pub mod journal;
pub use objstore::limits;
pub mod listing;
pub mod overlap;
pub mod plan;
pub mod progress;
pub mod run;
pub mod state;
pub mod stats;
