//! jfs-bench: metadata operations per second (create + 4 KiB write, lookup, rename) and journal
//! append/read rates, on one engine. Formats a fresh volume at META_URL (must be empty).
//! Prints one JSON object; `integration/bench.sh` turns the runs into BENCHMARKS.md tables.

use anyhow::{Context, Result};
use clap::Parser;
use fs_core::{Fs, Owner, Settings, ROOT_INO};
use futures::future::try_join_all;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// An empty metadata engine (rocksdb:///dir, redis://..., postgres://...).
    #[arg(long)]
    meta: String,
    /// Where blocks go (a local directory keeps the store out of the measurement).
    #[arg(long)]
    storage: String,
    /// Files per task.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Concurrent tasks (each in its own directory, like independent writers).
    #[arg(long, default_value_t = 4)]
    tasks: usize,
}

fn rate(n: usize, t: Instant) -> f64 {
    n as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let engine = meta::open(
        &a.meta,
        &meta::OpenOptions {
            create: true,
            ..Default::default()
        },
    )
    .await
    .context("engine")?;
    let store: Arc<dyn fs_core::BlockStore> = Arc::new(objstore::OpendalStore::open(
        &a.storage,
        &Default::default(),
    )?);
    let fs = Arc::new(
        Fs::format(
            engine.clone(),
            store,
            Settings::new("bench", &a.storage, 4 << 20),
        )
        .await?,
    );
    let mut dirs = Vec::new();
    for t in 0..a.tasks {
        dirs.push(
            fs.mkdir(
                ROOT_INO,
                format!("t{t}").as_bytes(),
                0o755,
                Owner::default(),
            )
            .await?
            .0,
        );
    }
    let n = a.files * a.tasks;
    let payload = vec![7u8; 4096];
    let head0 = engine.journal_bounds().await?.last;

    let t = Instant::now();
    try_join_all(dirs.iter().map(|&d| {
        let (fs, payload) = (fs.clone(), payload.clone());
        async move {
            for i in 0..a.files {
                let (ino, _) = fs
                    .create(d, format!("f{i}").as_bytes(), 0o644, Owner::default())
                    .await?;
                fs.write(ino, 0, &payload).await?;
            }
            Ok::<_, fs_core::Error>(())
        }
    }))
    .await?;
    let create_write = rate(n, t);
    let appended = (engine.journal_bounds().await?.last - head0) as usize;
    let append = rate(appended, t);

    let t = Instant::now();
    try_join_all(dirs.iter().map(|&d| {
        let fs = fs.clone();
        async move {
            for i in 0..a.files {
                fs.lookup(d, format!("f{i}").as_bytes()).await?;
            }
            Ok::<_, fs_core::Error>(())
        }
    }))
    .await?;
    let lookup = rate(n, t);

    let t = Instant::now();
    try_join_all(dirs.iter().map(|&d| {
        let fs = fs.clone();
        async move {
            for i in 0..a.files {
                fs.rename(
                    d,
                    format!("f{i}").as_bytes(),
                    d,
                    format!("r{i}").as_bytes(),
                    false,
                )
                .await?;
            }
            Ok::<_, fs_core::Error>(())
        }
    }))
    .await?;
    let rename = rate(n, t);

    // Journal read: every entry, decoded and checked, in pages of 1000.
    let b = engine.journal_bounds().await?;
    let t = Instant::now();
    let mut next = b.first;
    let mut read = 0usize;
    while next <= b.last {
        let frames = engine.journal_read(next, 1000).await?;
        for (seq, f) in &frames {
            let e = fs_core::Entry::decode(f)?;
            anyhow::ensure!(e.seq == *seq, "journal out of order");
            read += 1;
        }
        next = frames
            .last()
            .map(|(s, _)| s + 1)
            .context("journal ended early")?;
    }
    let journal_read = rate(read, t);

    let out = serde_json::json!({
        "engine": engine.kind(), "tasks": a.tasks, "files": n,
        "create_write_per_s": create_write.round(), "lookup_per_s": lookup.round(), "rename_per_s": rename.round(),
        "journal_append_per_s": append.round(), "journal_read_per_s": journal_read.round(),
        "create_write_ms": (1000.0 * a.tasks as f64 / create_write * 1000.0).round() / 1000.0,
    });
    println!("{out}");
    Ok(())
}
