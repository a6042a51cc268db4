//! Rate limits: bytes/s (optionally by time of day, like rclone's timetable) and requests/s,
//! both with governor. Bytes are taken in 64 KiB cells with a burst of 4 cells, so a limit
//! holds within a few percent over seconds, not just on average over a run.

use anyhow::{bail, Context, Result};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};

const CELL: u64 = 64 << 10;

/// "10M" (bytes/s, binary units) or a timetable "08:00,10M 18:00,off" (the entry in force is
/// the last one at or before the local time; before the first, the last of the day applies).
#[derive(Debug, Clone, PartialEq)]
pub struct BwSchedule(Vec<(u32, Option<u64>)>); // (minute of day, bytes/s)

fn parse_rate(s: &str) -> Result<Option<u64>> {
    if s.eq_ignore_ascii_case("off") || s == "0" {
        return Ok(None);
    }
    fs_core::parse_size(s)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("bad rate: {e}"))
}

impl BwSchedule {
    pub fn parse(s: &str) -> Result<Self> {
        if !s.contains(',') {
            return Ok(BwSchedule(vec![(0, parse_rate(s)?)]));
        }
        let mut v = Vec::new();
        for part in s.split_whitespace() {
            let (t, r) = part
                .split_once(',')
                .with_context(|| format!("timetable entry {part:?}: expected HH:MM,RATE"))?;
            let (h, m) = t
                .split_once(':')
                .with_context(|| format!("time {t:?}: expected HH:MM"))?;
            let (h, m): (u32, u32) = (h.parse()?, m.parse()?);
            if h > 23 || m > 59 {
                bail!("time {t:?} out of range");
            }
            v.push((h * 60 + m, parse_rate(r)?));
        }
        v.sort_by_key(|e| e.0);
        Ok(BwSchedule(v))
    }

    /// The limit at `minute` of the day.
    pub fn at(&self, minute: u32) -> Option<u64> {
        self.0
            .iter()
            .rev()
            .find(|e| e.0 <= minute)
            .or(self.0.last())
            .and_then(|e| e.1)
    }
}

pub struct Limits {
    bytes: RwLock<Option<(u64, Arc<DefaultDirectRateLimiter>)>>,
    requests: RwLock<Option<(u32, Arc<DefaultDirectRateLimiter>)>>,
    schedule: RwLock<Option<BwSchedule>>,
}

fn minute_now() -> u32 {
    // Local time without a time-zone crate: the offset comes from TZ-aware `date` at start.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (((secs as i64 + *UTC_OFFSET) / 60).rem_euclid(1440)) as u32
}

static UTC_OFFSET: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
    std::process::Command::new("date")
        .arg("+%z")
        .output()
        .ok()
        .and_then(|o| {
            let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let sign = if s.starts_with('-') { -1 } else { 1 };
            let d = s.trim_start_matches(['+', '-']);
            let (h, m) = (
                d.get(..2)?.parse::<i64>().ok()?,
                d.get(2..4)?.parse::<i64>().ok()?,
            );
            Some(sign * (h * 3600 + m * 60))
        })
        .unwrap_or(0)
});

fn byte_limiter(rate: u64) -> Arc<DefaultDirectRateLimiter> {
    let cells = (rate / CELL).max(1) as u32;
    let q = Quota::per_second(NonZeroU32::new(cells).expect(">0"))
        .allow_burst(NonZeroU32::new(4).expect(">0"));
    Arc::new(RateLimiter::direct(q))
}

impl Limits {
    pub fn new(bw: Option<BwSchedule>, tps: Option<u32>) -> Result<Self> {
        let l = Limits {
            bytes: RwLock::new(None),
            requests: RwLock::new(None),
            schedule: RwLock::new(bw),
        };
        l.set_tps(tps);
        l.refresh();
        Ok(l)
    }

    /// Change the limits while running (`None`/0 = unlimited).
    pub fn set(&self, bw: Option<BwSchedule>, tps: Option<u32>) {
        *self.schedule.write().unwrap_or_else(|p| p.into_inner()) = bw;
        self.set_tps(tps);
        self.refresh();
    }

    fn set_tps(&self, tps: Option<u32>) {
        // Burst 1: requests are spread evenly, not let through n at a time.
        let want = tps.filter(|&n| n > 0).map(|n| {
            let q = Quota::per_second(NonZeroU32::new(n).expect(">0"))
                .allow_burst(NonZeroU32::new(1).expect(">0"));
            (n, Arc::new(RateLimiter::direct(q)))
        });
        *self.requests.write().unwrap_or_else(|p| p.into_inner()) = want;
    }

    /// The limits in force: (bytes/s, requests/s).
    pub fn current(&self) -> (Option<u64>, Option<u32>) {
        let b = self
            .bytes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.0);
        let r = self
            .requests
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.0);
        (b, r)
    }

    /// Re-read the timetable (called every minute by the runner).
    pub fn refresh(&self) {
        let want = self
            .schedule
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|s| s.at(minute_now()));
        let mut cur = self.bytes.write().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().map(|c| c.0) != want {
            *cur = want.map(|r| (r, byte_limiter(r)));
            tracing::info!(bytes_per_s = ?want, "bandwidth limit in force");
        }
    }

    /// Wait until `n` bytes may pass.
    pub async fn bytes(&self, n: u64) {
        let lim = self
            .bytes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.1.clone());
        if let Some(l) = lim {
            let mut cells = n.div_ceil(CELL);
            while cells > 0 {
                let take = cells.min(4) as u32;
                let _ = l.until_n_ready(NonZeroU32::new(take).expect(">0")).await;
                cells -= take as u64;
            }
        }
    }

    /// Wait for one request slot.
    pub async fn request(&self) {
        let lim = self
            .requests
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.1.clone());
        if let Some(l) = lim {
            l.until_ready().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timetables_parse_and_pick_the_entry_in_force() {
        let s = BwSchedule::parse("08:00,10M 18:00,off 23:30,512K").unwrap();
        assert_eq!(
            s.at(7 * 60),
            Some(512 << 10),
            "before the first entry: the last of the day"
        );
        assert_eq!(s.at(8 * 60), Some(10 << 20));
        assert_eq!(s.at(17 * 60 + 59), Some(10 << 20));
        assert_eq!(s.at(18 * 60), None);
        assert_eq!(BwSchedule::parse("1.5M").unwrap().at(0), Some(1572864));
        assert!(BwSchedule::parse("25:00,1M").is_err());
        assert!(BwSchedule::parse("08:00,lots").is_err());
    }
}
