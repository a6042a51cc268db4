//! A mixed file-system workload at the primary, and the checks that a mirror converged:
//! applied and copied everything, dumps equal, every file byte-identical through the
//! mirror's own store, the journal the same entry for entry.

use super::*;

/// A random mix of file-system operations on a handful of directories: creates with data,
/// overwrites, appends, truncates, renames (with replace), unlinks, hard links, symlinks,
/// setattr, mkdir. Operations that fail (a name already gone...) commit nothing. Returns
/// how many committed.
pub async fn workload(fs: &Fs, ops: usize, seed: u64, stop: Option<&AtomicBool>) -> u64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let o = Owner { uid: 0, gid: 0 };
    let tag = format!("w{seed}");
    let top = match fs.mkdir(ROOT_INO, tag.as_bytes(), 0o755, o).await {
        Ok((i, _)) => i,
        Err(_) => {
            fs.lookup(ROOT_INO, tag.as_bytes())
                .await
                .expect("workload dir")
                .0
        }
    };
    let mut dirs = vec![top];
    for d in 0..4 {
        dirs.push(
            fs.mkdir(top, format!("d{d}").as_bytes(), 0o755, o)
                .await
                .expect("mkdir")
                .0,
        );
    }
    let mut ok = 0u64;
    for i in 0..ops {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
        let d = dirs[rng.random_range(0..dirs.len())];
        let name = format!("f{}", rng.random_range(0..24));
        let r: fs_core::Result<()> = async {
            match rng.random_range(0..100) {
                0..=24 => {
                    let (ino, _) = match fs.lookup(d, name.as_bytes()).await {
                        Ok(x) => x,
                        Err(_) => fs.create(d, name.as_bytes(), 0o644, o).await?,
                    };
                    let len = if rng.random_range(0..100) == 0 {
                        rng.random_range(1 << 20..5 << 20)
                    } else {
                        rng.random_range(1..20_000)
                    };
                    fs.write(ino, 0, &crate::data(seed * 1_000_003 + i as u64, len))
                        .await
                }
                25..=39 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let off = if rng.random_bool(0.5) {
                        a.length
                    } else {
                        rng.random_range(0..=a.length)
                    };
                    fs.write(
                        ino,
                        off,
                        &crate::data(seed ^ i as u64, rng.random_range(1..10_000)),
                    )
                    .await
                }
                40..=47 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let len = rng.random_range(0..=a.length + 5000);
                    fs.setattr(
                        ino,
                        &SetAttr {
                            length: Some(len),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ())
                }
                48..=59 => {
                    let d2 = dirs[rng.random_range(0..dirs.len())];
                    let n2 = format!("f{}", rng.random_range(0..24));
                    fs.rename(d, name.as_bytes(), d2, n2.as_bytes(), false)
                        .await
                }
                60..=71 => {
                    let (_, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind == fs_core::FileKind::Dir {
                        return Ok(());
                    }
                    fs.unlink(d, name.as_bytes()).await
                }
                72..=79 => {
                    let (ino, a) = fs.lookup(d, name.as_bytes()).await?;
                    if a.kind != fs_core::FileKind::File {
                        return Ok(());
                    }
                    let d2 = dirs[rng.random_range(0..dirs.len())];
                    fs.link(ino, d2, format!("f{}", rng.random_range(0..24)).as_bytes())
                        .await
                        .map(|_| ())
                }
                80..=87 => fs
                    .symlink(d, name.as_bytes(), format!("../t{i}").as_bytes(), o)
                    .await
                    .map(|_| ()),
                _ => {
                    let (ino, _) = fs.lookup(d, name.as_bytes()).await?;
                    let set = SetAttr {
                        mode: Some(0o600 | rng.random_range(0..0o100)),
                        mtime: Some(1_700_000_000_000_000_000 + i as i64),
                        ..Default::default()
                    };
                    fs.setattr(ino, &set).await.map(|_| ())
                }
            }
        }
        .await;
        if r.is_ok() {
            ok += 1;
        }
    }
    ok
}

/// Create `count` files `<prefix><i>` in the root, each holding `len` bytes of `data(i)`.
pub async fn write_files(fs: &Fs, prefix: &str, count: u64, len: usize) -> Vec<fs_core::Ino> {
    let o = Owner { uid: 0, gid: 0 };
    let mut inos = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i}");
        let (ino, _) = fs
            .create(ROOT_INO, name.as_bytes(), 0o644, o)
            .await
            .expect("create");
        fs.write(ino, 0, &crate::data(i, len)).await.expect("write");
        inos.push(ino);
    }
    inos
}

/// Wait until the mirror has applied the primary's head and has no block copy pending.
pub async fn wait_converged(mirror: &Agent, primary: &dyn Engine, limit: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let head = primary.journal_bounds().await.expect("bounds").last;
        if let Some(s) = mirror.try_status() {
            // Every block of every applied entry queued, and the queue empty.
            if n(&s, "applied_seq") >= head
                && n(&s, "blocks.queued_through") >= head
                && n(&s, "blocks.pending") == 0
                && s["bootstrap"].is_null()
            {
                return s;
            }
            assert!(
                t0.elapsed() < limit,
                "no convergence in {limit:?}: primary head {head}, mirror status {s}\nlog:\n{}",
                tail(&mirror.log_text(), 40)
            );
        } else {
            assert!(
                t0.elapsed() < limit,
                "mirror status unavailable; log:\n{}",
                tail(&mirror.log_text(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Open a mirror's metadata for reading (RocksDB: a secondary instance beside the agent).
pub async fn open_ro(url: &str) -> Arc<dyn Engine> {
    meta::open(
        url,
        &meta::OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("opening {url}: {e}"))
}

/// The mirror equals the primary: same dump, and every file reads back byte-identical
/// through the mirror's own store. Returns the number of files compared.
pub async fn assert_same(primary: &Fs, mirror_meta: &str, mirror_store: &str) -> usize {
    let m_engine = open_ro(mirror_meta).await;
    let pd = serde_json::to_value(
        fs_core::maint::dump(&**primary.engine())
            .await
            .expect("dump primary"),
    )
    .unwrap();
    let md = match fs_core::maint::dump(&*m_engine).await {
        Ok(d) => serde_json::to_value(d).unwrap(),
        Err(e) => {
            // What this reader sees, what a new one sees, and this one 2 s later: tells a
            // reader that missed data from a mirror that lost it (open: seen in CI).
            let all = m_engine.scan(b"", &[0xff], 10_000_000).await.unwrap();
            let jb = m_engine.journal_bounds().await;
            let again = open_ro(mirror_meta).await;
            let all2 = again.scan(b"", &[0xff], 10_000_000).await.unwrap();
            let dump2 = fs_core::maint::dump(&*again).await.map(|_| ());
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            let all3 = m_engine.scan(b"", &[0xff], 10_000_000).await.unwrap();
            panic!(
                "dump mirror: {e}; this reader saw {} keys (journal {jb:?}), a new reader {} \
                 (its dump: {dump2:?}), this reader 2 s later {}",
                all.len(),
                all2.len(),
                all3.len()
            );
        }
    };
    if pd != md {
        let (ps, ms) = (pd.to_string(), md.to_string());
        let at = ps
            .bytes()
            .zip(ms.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "dumps differ at byte {at}: primary …{}… mirror …{}…",
            &ps[at.saturating_sub(200)..(at + 200).min(ps.len())],
            &ms[at.saturating_sub(200)..(at + 200).min(ms.len())]
        );
    }
    let mfs = Fs::open(m_engine, crate::open_store(mirror_store))
        .await
        .expect("open mirror fs");
    let mut files = 0;
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        for e in primary.readdir_all(d).await.expect("readdir") {
            match e.kind {
                fs_core::FileKind::Dir => stack.push(e.ino),
                fs_core::FileKind::File => {
                    let a = crate::read_all(primary, e.ino).await;
                    let b = crate::read_all(&mfs, e.ino).await;
                    assert!(
                        a == b,
                        "file inode {} differs at the mirror ({} vs {} bytes)",
                        e.ino,
                        a.len(),
                        b.len()
                    );
                    files += 1;
                }
                _ => {}
            }
        }
    }
    files
}

/// Every journal entry the mirror holds is the primary's, byte for byte, in order, without a
/// gap (0 lost, 0 duplicated, 0 out of order). Returns (first, last) compared.
pub async fn assert_same_journal(primary: &dyn Engine, mirror: &dyn Engine) -> (u64, u64) {
    let mb = mirror.journal_bounds().await.expect("bounds");
    let pb = primary.journal_bounds().await.expect("bounds");
    assert_eq!(mb.last, pb.last, "mirror head differs from the primary's");
    // From where both hold entries (a promoted mirror's journal starts at its snapshot).
    let mut next = mb.first.max(pb.first);
    while next <= mb.last {
        let m = mirror
            .journal_read(next, 1000)
            .await
            .expect("mirror journal");
        let p = primary
            .journal_read(next, 1000)
            .await
            .expect("primary journal");
        assert!(!m.is_empty(), "mirror journal ends at {}", next - 1);
        for (i, (seq, f)) in m.iter().enumerate() {
            assert_eq!(*seq, next, "mirror journal gap or reorder at {next}");
            assert_eq!(p[i].0, *seq);
            assert!(
                p[i].1 == *f,
                "entry {seq} differs between primary and mirror"
            );
            next += 1;
        }
    }
    (mb.first.max(pb.first), mb.last)
}
