//! What the log says of connections refused before they authenticated: one line at the first
//! refusal, then at most one a minute summing up the rest (how many, why, from how many
//! addresses, the last one's reason), each event itself at debug. A peer without a token
//! cannot make the primary write more than that: what it sent is cut short before it is
//! shown (`handshake::shown`), and a flood of refusals is one line a minute, not one each.

use crate::handshake::Failure;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest gap between the summaries while refusals go on.
pub const LOG_EVERY: Duration = Duration::from_secs(60);
/// Addresses counted in one summary (past that, "at least").
const MAX_ADDRS: usize = 4096;
/// The longest reason quoted in a summary.
const MAX_WHY: usize = 200;

#[derive(Default)]
pub struct Refusals {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// When the last line was written (None: never, or not since a quiet minute).
    last_line: Option<Instant>,
    /// Since that line.
    auth: u64,
    other: u64,
    addrs: HashSet<IpAddr>,
    last: Option<(String, String)>,
}

impl Refusals {
    /// A connection refused before it authenticated: counted, at debug, and written now if
    /// no line was written within `LOG_EVERY`.
    pub fn note(&self, ip: IpAddr, peer: &str, f: &Failure) {
        let why = cut(&f.to_string());
        tracing::debug!(%peer, %why, "unauthenticated connection refused");
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match f {
            Failure::Auth(_) => g.auth += 1,
            _ => g.other += 1,
        }
        if g.addrs.len() < MAX_ADDRS {
            g.addrs.insert(ip);
        }
        g.last = Some((peer.to_string(), why));
        if g.last_line.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            emit(&mut g);
        }
    }

    /// Write the summary of what was refused since the last line, if `LOG_EVERY` has
    /// passed (called every few hundred milliseconds).
    pub fn flush_due(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.last_line {
            Some(t) if t.elapsed() >= LOG_EVERY => {
                if g.auth + g.other > 0 {
                    emit(&mut g);
                } else {
                    // A quiet minute: the next refusal is written at once again.
                    g.last_line = None;
                }
            }
            _ => {}
        }
    }
}

fn emit(g: &mut Inner) {
    let n = g.auth + g.other;
    let since = g.last_line.map_or("now".to_string(), |t| {
        format!("in the last {}s", t.elapsed().as_secs())
    });
    let addrs = if g.addrs.len() >= MAX_ADDRS {
        format!("at least {MAX_ADDRS}")
    } else {
        g.addrs.len().to_string()
    };
    let (peer, why) = g.last.take().unwrap_or_default();
    let line = format!(
        "refused {n} unauthenticated connection{} {since} ({} authentication failed: a wrong token or a name this primary does not list; {} not the mirror protocol, too slow, or over the limits on pending handshakes) from {addrs} address{}; the last from {peer}: {why}; the next summary in a minute at most",
        if n == 1 { "" } else { "s" },
        g.auth,
        g.other,
        if g.addrs.len() == 1 { "" } else { "es" },
    );
    if g.auth > 0 {
        tracing::warn!("{line}");
    } else {
        tracing::info!("{line}");
    }
    g.last_line = Some(Instant::now());
    g.auth = 0;
    g.other = 0;
    g.addrs.clear();
}

/// At most `MAX_WHY` characters of a reason.
fn cut(s: &str) -> String {
    let mut it = s.chars();
    let head: String = it.by_ref().take(MAX_WHY).collect();
    if it.next().is_some() {
        format!("{head}...")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_is_one_line_then_a_summary() {
        let r = Refusals::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        r.note(ip, "10.0.0.1:1", &Failure::Garbage("x".repeat(10_000)));
        for i in 0..500 {
            r.note(ip, "10.0.0.1:2", &Failure::Auth(format!("n{i}")));
        }
        {
            let g = r.inner.lock().unwrap();
            assert_eq!((g.auth, g.other), (500, 0), "summed up, not written");
            assert!(g.last.as_ref().unwrap().1.len() <= MAX_WHY + 3);
        }
        r.flush_due();
        assert_eq!(r.inner.lock().unwrap().auth, 500, "not due yet");
        r.inner.lock().unwrap().last_line = Some(Instant::now() - LOG_EVERY);
        r.flush_due();
        let g = r.inner.lock().unwrap();
        assert_eq!((g.auth, g.other), (0, 0));
        assert!(g.addrs.is_empty());
    }
}
