//! Whole-volume maintenance, one room each: dump/load, fsck, gc (and the temporary names of
//! unfinished copies it removes), status.

/// Listing page size for scans of the metadata.
const PAGE: usize = 4096;

pub mod backup;
mod dump;
mod fsck;
mod gc;
mod gc_temps;
mod status;

pub use dump::*;
pub use fsck::*;
pub use gc::*;
pub use gc_temps::*;
pub use status::*;
