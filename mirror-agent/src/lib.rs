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
