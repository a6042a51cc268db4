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

pub const TOKEN: &str = "test-token-5f1c2a9e8b7d6c3f";
/// The admin token of the agents the harness starts (`admin_token_env = "ADMIN_TOKEN"`).
pub const ADMIN_TOKEN: &str = "admin-token-0c9a7e5b3d1f2468";
