//! Rate limits: bytes/s (optionally by time of day, like rclone's timetable) and requests/s,
//! both with governor. Bytes are charged exactly: the limiter counts 1 KiB cells (larger for
//! limits over ~100 MB/s, so that a cell lasts 10 µs) replenished at the period the rate
//! gives, rounded up to a nanosecond (never faster than the limit), and the
//! bytes of each call are added to a running total of which only whole cells are charged, so
//! a 2 KiB object costs 2 KiB (not a 64 KiB minimum) and 100K means 100 KiB/s. The burst is
//! a tenth of a second's worth, so a limit holds over seconds, not just over a run.

use anyhow::{bail, Context, Result};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};

const CELL: u64 = 1 << 10;

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
            // One or two digits each: `u32::from_str` alone also takes "+8" and "0008".
            let two_digits =
                |x: &str| (1..=2).contains(&x.len()) && x.bytes().all(|b| b.is_ascii_digit());
            if !two_digits(h) || !two_digits(m) {
                bail!("time {t:?} in timetable entry {part:?}: expected HH:MM (e.g. 08:00)");
            }
            let (h, m): (u32, u32) = (h.parse()?, m.parse()?);
            if h > 23 || m > 59 {
                bail!("time {t:?} in timetable entry {part:?} is out of range (00:00 to 23:59)");
            }
            let rate = parse_rate(r).with_context(|| format!("timetable entry {part:?}"))?;
            v.push((h * 60 + m, rate));
        }
        v.sort_by_key(|e| e.0);
        Ok(BwSchedule(v))
    }

    /// The entries, (minute of the day, bytes/s or None for off), in time order.
    pub fn entries(&self) -> &[(u32, Option<u64>)] {
        &self.0
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

/// A budget shared with other processes (the workers of one shared sync job draw bytes and
/// requests from one bucket kept in the job's engine).
#[async_trait::async_trait]
pub trait SharedBudget: Send + Sync {
    /// Take `n` of `what` ("bytes" or "requests") from a bucket refilled at `rate` per
    /// second: None when granted, else how long to wait before asking again.
    async fn take(
        &self,
        what: &'static str,
        rate: u64,
        n: u64,
    ) -> Result<Option<std::time::Duration>>;
}

/// What a process has drawn from the shared budget and not spent yet ([bytes, requests]).
#[derive(Default)]
struct Drawn {
    left: [u64; 2],
    /// Consecutive failures to reach the budget's engine.
    errors: u32,
}

pub struct Limits {
    shared: RwLock<Option<Arc<dyn SharedBudget>>>,
    drawn: tokio::sync::Mutex<Drawn>,
    bytes: RwLock<Option<(u64, Arc<ByteLimiter>)>>,
    requests: RwLock<Option<(u32, Arc<DefaultDirectRateLimiter>)>>,
    schedule: RwLock<Option<BwSchedule>>,
    /// Woken when a limit changes, so that waiters move to the new limiter (a copy waiting
    /// for a tiny limit must not keep waiting once the limit is lifted).
    changed: tokio::sync::Notify,
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

/// A byte limiter: the cell size (1 KiB, or 1 byte below 10 KiB/s) and governor over it.
struct ByteLimiter {
    cell: u64,
    /// One cell is replenished each period (kept for the tests that check the pace).
    #[cfg_attr(not(test), allow(dead_code))]
    period_ns: u64,
    burst: u32,
    lim: DefaultDirectRateLimiter,
    /// Bytes asked for so far; whole cells of it are charged.
    total: std::sync::atomic::AtomicU64,
}

/// The cells a call of `n` bytes is charged when `before` bytes were asked for already:
/// the whole cells the running total crosses.
fn cells_for(before: u64, n: u64, cell: u64) -> u64 {
    (before + n) / cell - before / cell
}

fn byte_limiter(rate: u64) -> Arc<ByteLimiter> {
    let rate = rate.max(1);
    // A cell of 1 KiB (single bytes under 10 KiB/s), doubled for fast limits until a cell
    // lasts at least 10 µs: the period is rounded up to a whole nanosecond, so the pace is
    // never above the limit and at most 0.01% under it.
    let mut cell = if rate >= 10 * CELL { CELL } else { 1 };
    while (cell as u128) * 1_000_000_000 < 10_000 * rate as u128 {
        cell *= 2;
    }
    let period_ns = (cell as u128 * 1_000_000_000).div_ceil(rate as u128).max(1) as u64;
    let burst = ((rate / 10) / cell).clamp(1, u32::MAX as u64) as u32;
    let q = Quota::with_period(std::time::Duration::from_nanos(period_ns))
        .expect("a period over zero")
        .allow_burst(NonZeroU32::new(burst).expect(">0"));
    Arc::new(ByteLimiter {
        cell,
        period_ns,
        burst,
        lim: RateLimiter::direct(q),
        total: Default::default(),
    })
}

impl Limits {
    pub fn new(bw: Option<BwSchedule>, tps: Option<u32>) -> Result<Self> {
        let l = Limits {
            shared: RwLock::new(None),
            drawn: Default::default(),
            bytes: RwLock::new(None),
            requests: RwLock::new(None),
            schedule: RwLock::new(bw),
            changed: tokio::sync::Notify::new(),
        };
        l.set_tps(tps);
        l.refresh();
        Ok(l)
    }

    /// Draw from a budget shared with other processes too (None: this process alone). The
    /// local limiters keep pacing this process at the same rates; the shared bucket makes the
    /// sum over all processes hold them.
    pub fn share(&self, budget: Option<Arc<dyn SharedBudget>>) {
        *self.shared.write().unwrap_or_else(|p| p.into_inner()) = budget;
    }

    /// Take `n` of kind `k` (0 bytes, 1 requests) from the shared budget, if there is one.
    async fn draw(&self, k: usize, n: u64) {
        let Some(budget) = self
            .shared
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return;
        };
        let what = if k == 0 { "bytes" } else { "requests" };
        let mut d = self.drawn.lock().await;
        while d.left[k] < n {
            // Read each time: a limit changed (or lifted) while waiting applies at once.
            let rate = match k {
                0 => self.current().0,
                _ => self.current().1.map(u64::from),
            };
            let Some(rate) = rate.filter(|r| *r > 0) else {
                return;
            };
            // Grants of a twentieth of a second's worth: few trips to the engine, and no
            // grant large enough to be a burst of its own.
            let ask = (rate / 20).max(1);
            match budget.take(what, rate, ask).await {
                Ok(None) => {
                    d.left[k] += ask;
                    d.errors = 0;
                }
                Ok(Some(wait)) => {
                    d.errors = 0;
                    tokio::time::sleep(wait.min(std::time::Duration::from_secs(1))).await;
                }
                Err(e) => {
                    tracing::debug!(error = %format!("{e:#}"), "drawing from the shared limit");
                    d.errors += 1;
                    if d.errors >= 10 {
                        // The engine is out of reach: this process goes on under its own
                        // limiter (at most the whole rate) rather than stall its copies.
                        tracing::warn!(error = %format!("{e:#}"), "the shared limit's engine is out of reach: pacing this worker alone");
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
        d.left[k] -= n;
    }

    /// Change the limits while running (`None`/0 = unlimited).
    pub fn set(&self, bw: Option<BwSchedule>, tps: Option<u32>) {
        *self.schedule.write().unwrap_or_else(|p| p.into_inner()) = bw;
        self.set_tps(tps);
        self.refresh();
        self.changed.notify_waiters();
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
            self.changed.notify_waiters();
        }
    }

    /// How many bytes to move per `bytes` call for smooth pacing: a quarter second's worth
    /// under a limit (between 256 KiB and `max`), else `max`.
    pub fn piece(&self, max: u64) -> u64 {
        // Shared with other processes: smaller pieces, so that no one grant is a burst.
        let shared = self
            .shared
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let div = if shared { 16 } else { 4 };
        match self.current().0 {
            Some(rate) => (rate / div).clamp(256 << 10, max.max(256 << 10)),
            None => max,
        }
    }

    /// Wait until `n` bytes may pass (under the limit in force; when the limit changes
    /// meanwhile, what is left is charged to the new one).
    pub async fn bytes(&self, n: u64) {
        self.draw(0, n).await;
        let mut left = n;
        while left > 0 {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let lim = self
                .bytes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|c| c.1.clone());
            let Some(l) = lim else { return };
            use std::sync::atomic::Ordering;
            let before = l.total.fetch_add(left, Ordering::Relaxed);
            let mut cells = cells_for(before, left, l.cell);
            left = 0;
            while cells > 0 {
                let take = cells.min(l.burst as u64) as u32;
                tokio::select! {
                    _ = l.lim.until_n_ready(NonZeroU32::new(take).expect(">0")) => {
                        cells -= take as u64;
                    }
                    _ = &mut changed => {
                        left = cells * l.cell;
                        break;
                    }
                }
            }
        }
    }

    /// Wait for one request slot (under the limit in force, as `bytes`).
    pub async fn request(&self) {
        self.draw(1, 1).await;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let lim = self
                .requests
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|c| c.1.clone());
            let Some(l) = lim else { return };
            tokio::select! {
                _ = l.until_ready() => return,
                _ = &mut changed => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes are charged exactly, checked without a clock: the cells a run of calls is
    /// charged are the whole cells of its running total (never a cell minimum a call), and
    /// the quota replenishes one cell at the period that makes the rate exact (100K is
    /// 100 KiB/s, not rounded to 64 KiB cells). A timed check of the same was flaky beside
    /// other load; the limit's accuracy end to end is measured in BENCHMARKS.md.
    #[test]
    fn bytes_are_charged_exactly_small_and_large() {
        for (rate, calls, each) in [
            (10u64 << 20, 4000u64, 2_000u64),
            (10 << 20, 4, 2 << 20),
            (100 << 10, 12, 5_000),
            (5_000, 10, 300),
            (1 << 30, 100_000, 1),
            (100 << 30, 1_000, 3 << 20),
            (10_000_000, 7, 1_234_567),
        ] {
            let l = byte_limiter(rate);
            let mut total = 0u64;
            let mut charged = 0u64;
            for _ in 0..calls {
                charged += cells_for(total, each, l.cell);
                total += each;
            }
            assert_eq!(charged, total / l.cell, "{calls} x {each} B at {rate} B/s");
            assert!(
                (total - charged * l.cell) < l.cell,
                "at most one cell's worth is ever uncharged"
            );
            // One cell a period: never above the rate, and under it by at most the
            // nanosecond the period was rounded up.
            let per_s = 1e9 / l.period_ns as f64 * l.cell as f64;
            assert!(
                per_s <= rate as f64 && (rate as f64 - per_s) / (rate as f64) < 1e-4,
                "{rate} B/s paces at {per_s} B/s"
            );
            assert_eq!(u64::from(l.burst), ((rate / 10) / l.cell).max(1));
        }
    }

    /// On the real clock the limit is never exceeded (the lower side depends on the
    /// scheduler, so it is a benchmark's business, not a test's).
    #[tokio::test]
    async fn bytes_never_pass_faster_than_the_limit() {
        for (rate, calls, each) in [(10u64 << 20, 2000u64, 2_000u64), (5_000, 10, 300)] {
            let l = Limits::new(Some(BwSchedule(vec![(0, Some(rate))])), None).unwrap();
            l.bytes(rate / 10).await; // empty the burst first: measure the steady rate
            let t0 = std::time::Instant::now();
            for _ in 0..calls {
                l.bytes(each).await;
            }
            let secs = t0.elapsed().as_secs_f64();
            let got = (calls * each) as f64 / secs;
            assert!(
                got < rate as f64 * 1.05,
                "{calls} x {each} B at {rate} B/s ran at {got:.0} B/s"
            );
        }
    }

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

    /// A copy waiting under a tiny limit goes as soon as the limit is lifted or raised (it
    /// does not keep waiting on the old limiter), and so does a request slot.
    #[tokio::test]
    async fn waiters_move_to_a_changed_limit() {
        let l = Arc::new(Limits::new(Some(BwSchedule::parse("1").unwrap()), Some(1)).unwrap());
        l.bytes(1).await; // the burst
        l.request().await;
        let (l2, l3) = (l.clone(), l.clone());
        let bytes = tokio::spawn(async move { l2.bytes(4 << 20).await });
        let req = tokio::spawn(async move {
            l3.request().await;
            l3.request().await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!bytes.is_finished(), "4 MiB passed a 1 byte/s limit");
        let t0 = std::time::Instant::now();
        l.set(Some(BwSchedule::parse("off").unwrap()), None);
        tokio::time::timeout(std::time::Duration::from_secs(2), bytes)
            .await
            .expect("the byte waiter kept waiting after the limit was lifted")
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(2), req)
            .await
            .expect("the request waiter kept waiting after the limit was lifted")
            .unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        // Raised, not lifted: the rest is charged to the new limit.
        l.set(Some(BwSchedule::parse("1").unwrap()), None);
        l.bytes(1).await;
        let l4 = l.clone();
        let w = tokio::spawn(async move { l4.bytes(1 << 20).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        l.set(Some(BwSchedule::parse("100M").unwrap()), None);
        tokio::time::timeout(std::time::Duration::from_secs(2), w)
            .await
            .expect("the waiter kept the old limit after a raise")
            .unwrap();
    }
}
