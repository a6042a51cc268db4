//! mirror-agent: one long-running process per region. On the primary it serves the volume's
//! journal to registered mirrors and keeps their replication slots; at a mirror it applies
//! the journal within a consistency window and replicates blocks. See ARCHITECTURE.md.

pub mod admin;
pub mod blocks;
pub mod config;
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
