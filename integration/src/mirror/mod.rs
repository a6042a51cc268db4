//! Harness for mirror-agent tests, by concern: `agent` (agents as separate processes: config
//! files, tokens in the environment, kill -9 / SIGTERM by PID, status), `workload` (a mixed
//! file-system workload and the convergence checks: dumps equal, every file byte-identical
//! through the mirror's store), `proxy` (a small TCP proxy that delays, stalls, corrupts or
//! cuts traffic), `netns` (network namespaces joined by a veth pair), `pair` (a primary and a
//! mirror started together), `certs` (TLS certificates).

mod agent;
mod certs;
mod netns;
mod pair;
mod proxy;
mod workload;

pub use agent::*;
pub use certs::make_certs;
pub use netns::NetPair;
pub use pair::{Pair, Placement};
pub use proxy::{s3_volume_behind_proxy, Proxy};
pub use workload::*;

use fs_core::{Engine, Fs, Owner, SetAttr, ROOT_INO};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "9f4c1e7a2b8d5f0c3e6a9b2d7f1c4e8a5b0d3f6c9e2a7b4d1f8c5e0a3b6d9f2c";
/// The admin token of the agents the harness starts (`admin_token_env = "ADMIN_TOKEN"`).
pub const ADMIN_TOKEN: &str = "0c9a7e5b3d1f24688e2b6d0f4a9c3e7b1d5f8a2c6e0b4d9f3a7c1e5b8d2f6a0c";
