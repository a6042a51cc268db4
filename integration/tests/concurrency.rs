//! Concurrent writers on every engine: separate clients race on one directory and one file.
//! The journal read back must be gap-free, and replaying it into an empty RocksDB volume must
//! reproduce the same dump (so the journal is in commit order and complete).

use fs_core::{ErrorKind, Fs, Owner, ROOT_INO};
use integration::{data, journal, read_all, TestVol};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const O: Owner = Owner { uid: 0, gid: 0 };
const CLIENTS: usize = 4;
const TASKS: usize = 3;
const ROUNDS: usize = 30;

async fn worker(fs: Arc<Fs>, shared: u64, me: usize, wins: Arc<Vec<AtomicU64>>) {
    for i in 0..ROUNDS {
        // Everyone races to create the same name: exactly one may win.
        match fs
            .create(shared, format!("race{i}").as_bytes(), 0o644, O)
            .await
        {
            Ok((ino, _)) => {
                wins[i].fetch_add(1, Ordering::SeqCst);
                fs.write(ino, 0, format!("won by {me}").as_bytes())
                    .await
                    .unwrap();
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}"),
        }
        let name = format!("w{me}_{i}");
        let (ino, _) = fs.create(shared, name.as_bytes(), 0o644, O).await.unwrap();
        fs.write(ino, 0, &data((me * 1000 + i) as u64, 3000))
            .await
            .unwrap();
        if i % 3 == 0 {
            fs.rename(
                shared,
                name.as_bytes(),
                shared,
                format!("m{me}_{i}").as_bytes(),
                false,
            )
            .await
            .unwrap();
        } else if i % 5 == 0 {
            fs.unlink(shared, name.as_bytes()).await.unwrap();
        }
        // Directory churn in the shared parent.
        let d = format!("d{me}_{i}");
        fs.mkdir(shared, d.as_bytes(), 0o755, O).await.unwrap();
        if i % 2 == 0 {
            fs.rmdir(shared, d.as_bytes()).await.unwrap();
        }
    }
}

async fn concurrent_writers_replay_to_the_same_state(v: TestVol) {
    let (shared, _) = v.fs.mkdir(ROOT_INO, b"shared", 0o755, O).await.unwrap();
    let (common, _) = v.fs.create(ROOT_INO, b"common", 0o644, O).await.unwrap();
    let wins: Arc<Vec<AtomicU64>> = Arc::new((0..ROUNDS).map(|_| AtomicU64::new(0)).collect());
    let mut handles = Vec::new();
    for c in 0..CLIENTS {
        let fs = Arc::new(v.client().await);
        // Every client also writes its own 64 KiB stripe of one shared file.
        let f2 = fs.clone();
        handles.push(tokio::spawn(async move {
            f2.write(common, (c as u64) << 16, &data(c as u64 + 77, 1 << 16))
                .await
                .unwrap();
        }));
        for t in 0..TASKS {
            handles.push(tokio::spawn(worker(
                fs.clone(),
                shared,
                c * TASKS + t,
                wins.clone(),
            )));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    for (i, w) in wins.iter().enumerate() {
        assert_eq!(
            w.load(Ordering::SeqCst),
            1,
            "race{i} was created {} times",
            w.load(Ordering::SeqCst)
        );
    }
    let mut want = Vec::new();
    for c in 0..CLIENTS {
        want.extend(data(c as u64 + 77, 1 << 16));
    }
    assert_eq!(
        read_all(&v.fs, common).await,
        want,
        "no write to the shared file was lost"
    );

    let entries = journal(v.fs.engine().as_ref()).await; // asserts 1..=head with no gap
    assert_eq!(entries[0].seq, 1);
    let head = v.fs.engine().journal_bounds().await.unwrap().last;
    assert_eq!(entries.len() as u64, head);
    let mknods = entries
        .iter()
        .filter(|e| matches!(&e.op, fs_core::Op::Mknod { name, .. } if name.starts_with("race")))
        .count();
    assert_eq!(mknods, ROUNDS, "one journaled create per contested name");

    let original = fs_core::maint::dump(v.fs.engine().as_ref()).await.unwrap();
    let (url, _dir) = integration::meta_url("rocksdb");
    let replica = integration::replica(&url).await;
    for batch in entries.chunks(500) {
        replica.apply(batch).await.unwrap();
    }
    assert_eq!(replica.journal_bounds().await.unwrap().last, head);
    let replayed = fs_core::maint::dump(replica.as_ref()).await.unwrap();
    assert_eq!(
        replayed, original,
        "replaying the journal reproduces the volume"
    );
    // Replay is idempotent: applying the same entries again changes nothing.
    replica.apply(&entries[entries.len() - 10..]).await.unwrap();
    assert_eq!(
        fs_core::maint::dump(replica.as_ref()).await.unwrap(),
        original
    );
    // Counters agree with what is there.
    let inodes = original
        .inodes
        .values()
        .filter(|n| n.attr.is_some())
        .count() as i64;
    assert_eq!(original.counters["used_inodes"], inodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rocksdb_concurrent_writers() {
    concurrent_writers_replay_to_the_same_state(integration::volume("rocksdb", "file").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_concurrent_writers() {
    concurrent_writers_replay_to_the_same_state(integration::volume("redis", "file").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_writers() {
    concurrent_writers_replay_to_the_same_state(integration::volume("postgres", "file").await)
        .await;
}
