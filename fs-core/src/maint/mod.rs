//! Whole-volume maintenance, one room each: dump/load, fsck, gc, status.

/// Listing page size for scans of the metadata.
const PAGE: usize = 4096;

mod dump;
mod fsck;
mod gc;
mod status;

pub use dump::*;
pub use fsck::*;
pub use gc::*;
pub use status::*;
