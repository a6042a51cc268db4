//! Progress for long transfers: an indicatif bar on a terminal, a log line every 5 s otherwise.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Progress {
    bar: Option<ProgressBar>,
    done: Arc<AtomicU64>,
    files: Arc<AtomicU64>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    pub fn new(what: &'static str, total_bytes: u64, quiet: bool) -> Self {
        let done = Arc::new(AtomicU64::new(0));
        let files = Arc::new(AtomicU64::new(0));
        if quiet {
            return Progress {
                bar: None,
                done,
                files,
                ticker: None,
            };
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total_bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_message(what);
            return Progress {
                bar: Some(bar),
                done,
                files,
                ticker: None,
            };
        }
        let (d, f) = (done.clone(), files.clone());
        let ticker = tokio::spawn(async move {
            let mut iv = tokio::time::interval(Duration::from_secs(5));
            iv.tick().await;
            loop {
                iv.tick().await;
                tracing::warn!(target: "progress", what, bytes = d.load(Ordering::Relaxed), total_bytes, files = f.load(Ordering::Relaxed), "progress");
            }
        });
        Progress {
            bar: None,
            done,
            files,
            ticker: Some(ticker),
        }
    }

    pub fn add_bytes(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Take back the bytes of a file that failed: the summary counts what arrived.
    pub fn undo_bytes(&self, n: u64) {
        self.done.fetch_sub(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.set_position(b.position().saturating_sub(n));
        }
    }

    pub fn add_file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finish(self) -> (u64, u64) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if let Some(t) = &self.ticker {
            t.abort();
        }
        (
            self.files.load(Ordering::Relaxed),
            self.done.load(Ordering::Relaxed),
        )
    }
}
