//! A small TCP proxy that delays, stalls, corrupts or cuts traffic (this kernel has no
//! netem), and an S3 origin behind one.

use super::*;

/// A TCP proxy on loopback: forwards to `target`, holding every chunk `delay` in each
/// direction; with `stall_per_mille` a chunk waits 200 ms more (a lost segment's
/// retransmission); `cut` drops all connections and refuses new ones while set; `corrupt`
/// flips one byte of primary-to-mirror traffic while above zero (and counts down).
pub struct Proxy {
    pub addr: String,
    pub cut: Arc<AtomicBool>,
    pub corrupt: Arc<AtomicU64>,
    /// Only chunks at least this long are damaged (default 64; raise it to hit bodies only).
    pub corrupt_min: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(target: String, delay: Duration, stall_per_mille: u32) -> Proxy {
        Self::start_on("127.0.0.1", target, delay, stall_per_mille).await
    }

    /// Same, listening on `ip` (e.g. the root side of a namespace's link).
    pub async fn start_on(
        ip: &str,
        target: String,
        delay: Duration,
        stall_per_mille: u32,
    ) -> Proxy {
        let l = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let corrupt = Arc::new(AtomicU64::new(0));
        let corrupt_min = Arc::new(AtomicU64::new(64));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, k2, s2, m2) = (
            cut.clone(),
            corrupt.clone(),
            stop.clone(),
            corrupt_min.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = l.accept().await else {
                    continue;
                };
                if s2.load(Ordering::Relaxed) {
                    return;
                }
                if c2.load(Ordering::Relaxed) {
                    drop(down);
                    continue;
                }
                let Ok(up) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pipe(dr, uw, delay, stall_per_mille, c2.clone(), None));
                tokio::spawn(pipe(
                    ur,
                    dw,
                    delay,
                    stall_per_mille,
                    c2.clone(),
                    Some((k2.clone(), m2.clone())),
                ));
            }
        });
        Proxy {
            addr,
            cut,
            corrupt,
            corrupt_min,
            stop,
            task: Some(task),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    w: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    stall_per_mille: u32,
    cut: Arc<AtomicBool>,
    corrupt: Option<(Arc<AtomicU64>, Arc<AtomicU64>)>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Chunks go through a queue with their due time, so delay adds latency, not a throughput cap.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let cut2 = cut.clone();
    let writer = tokio::spawn(async move {
        let mut w = w;
        while let Some((due, buf)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if cut2.load(Ordering::Relaxed) || w.write_all(&buf).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut last_due = tokio::time::Instant::now();
    loop {
        let n = tokio::select! {
            r = r.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
            _ = wait_cut(&cut) => break,
        };
        let mut chunk = buf[..n].to_vec();
        if let Some((c, min)) = &corrupt {
            if c.load(Ordering::Relaxed) > 0 && n as u64 >= min.load(Ordering::Relaxed) {
                c.fetch_sub(1, Ordering::Relaxed);
                let i = n / 2;
                chunk[i] ^= 0x5a;
            }
        }
        let mut due = tokio::time::Instant::now() + delay;
        if stall_per_mille > 0 && rand::random::<u32>() % 1000 < stall_per_mille {
            due += Duration::from_millis(200);
        }
        // Keep order: a chunk never overtakes the one before it.
        due = due.max(last_due);
        last_due = due;
        if tx.send((due, chunk)).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn wait_cut(cut: &AtomicBool) {
    while !cut.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A volume on the test S3 server (Ceph RGW) and a harness proxy in front of it: the proxy
/// and the store URL through it (an origin whose link a test can cut or damage).
pub async fn s3_volume_behind_proxy() -> (crate::TestVol, Proxy, String) {
    let endpoint = std::env::var("JFS_TEST_S3_ENDPOINT")
        .expect("JFS_TEST_S3_ENDPOINT (run integration/test.sh)");
    let rgw = endpoint.trim_start_matches("http://").to_string();
    let proxy = Proxy::start(rgw, Duration::ZERO, 0).await;
    let vol = crate::volume_with("rocksdb", "s3", |_| {}).await;
    let origin = vol
        .store_url
        .replace(&endpoint, &format!("http://{}", proxy.addr));
    assert_ne!(origin, vol.store_url);
    (vol, proxy, origin)
}
