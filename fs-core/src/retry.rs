//! Waiting between attempts, and naming this machine: one of each for the workspace.
//!
//! `Backoff` is exponential with jitter and a cap; `conflict` is the short, randomized wait
//! between transaction attempts that lost a race (microseconds, a bounded number of times).

use crate::error::{Error, ErrorKind, Result};
use std::time::Duration;

/// Exponential backoff: `base` doubling per attempt up to `cap`, plus up to a quarter of
/// jitter (full jitter when `full_jitter`: a random wait in `0..delay`).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub full_jitter: bool,
}

impl Backoff {
    /// The wait before retrying a failed block or network step: 200 ms doubling to 60 s.
    pub const NETWORK: Backoff = Backoff {
        base: Duration::from_millis(200),
        cap: Duration::from_secs(60),
        full_jitter: false,
    };

    /// The wait before attempt `attempt + 1` (0-based count of failures so far).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base.as_micros().min(u64::MAX as u128) as u64;
        let cap = self.cap.as_micros().min(u64::MAX as u128) as u64;
        let d = base.saturating_mul(1u64 << attempt.min(20)).min(cap);
        let us = if self.full_jitter {
            rand::random::<u64>() % d.max(1)
        } else {
            d + rand::random::<u64>() % (d / 4 + 1)
        };
        Duration::from_micros(us)
    }
}

/// Attempts a transaction may lose to races before it gives up.
pub const MAX_CONFLICTS: u32 = 200;

/// Wait after a transaction lost race number `attempt`; an error once it lost too many.
pub async fn conflict(attempt: u32) -> Result<()> {
    if attempt >= MAX_CONFLICTS {
        return Err(Error::temporary(
            ErrorKind::Conflict,
            format!("transaction lost {attempt} races in a row: too much contention, try again"),
        ));
    }
    let b = Backoff {
        base: Duration::from_micros(200),
        cap: Duration::from_micros(200 << 8),
        full_jitter: true,
    };
    tokio::time::sleep(b.delay(attempt)).await;
    Ok(())
}

/// This machine's host name (from the kernel; "unknown" where it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_backoff_doubles_to_its_cap_with_a_quarter_of_jitter() {
        for (attempt, ms) in [
            (0u32, 200u64),
            (1, 400),
            (3, 1600),
            (9, 60_000),
            (30, 60_000),
        ] {
            let d = Backoff::NETWORK.delay(attempt).as_millis() as u64;
            assert!(d >= ms && d <= ms + ms / 4, "attempt {attempt}: {d} ms");
        }
    }

    #[test]
    fn hostname_is_the_kernels() {
        let k = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(hostname(), k.trim());
    }
}
