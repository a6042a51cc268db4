//! `jfs clone`: a metadata-only copy that shares the source's blocks, is the source as of
//! one journal entry while writers change it, and leaks nothing when it fails or is killed.
//! On every engine (Redis and PostgreSQL from `integration/services.sh`).

use fs_core::{FileKind, Fs, Ino, Owner, SetAttr, ROOT_INO};
use integration::{bin, data, volume, TestVol};
use std::collections::BTreeMap;
use std::process::Command;

/// What a tree holds, by path: kind, mode, owner, times, length, nlink, xattrs, symlink
/// target, device number and a checksum of the bytes.
type Tree = BTreeMap<String, String>;

async fn describe(fs: &Fs, ino: Ino) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![(ino, String::new())];
    while let Some((dir, path)) = todo.pop() {
        for e in fs.readdir_all(dir).await.expect("readdir") {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let p = format!("{path}/{name}");
            let a = fs.getattr(e.ino).await.expect("getattr");
            let mut xs = Vec::new();
            for x in fs.listxattr(e.ino).await.expect("listxattr") {
                let v = fs.getxattr(e.ino, &x).await.expect("getxattr");
                xs.push(format!(
                    "{}={}",
                    String::from_utf8_lossy(&x),
                    crc32c::crc32c(&v)
                ));
            }
            let body = match a.kind {
                FileKind::File => crc32c::crc32c(&integration::read_all(fs, e.ino).await),
                FileKind::Symlink => crc32c::crc32c(&fs.readlink(e.ino).await.expect("readlink")),
                _ => fs.rdev(e.ino).await.expect("rdev"),
            };
            out.insert(
                p.clone(),
                format!(
                    "{:?} {:o} {}:{} a{} m{} len{} n{} x[{}] {body:08x}",
                    a.kind,
                    a.mode,
                    a.uid,
                    a.gid,
                    a.atime,
                    a.mtime,
                    a.length,
                    a.nlink,
                    xs.join(",")
                ),
            );
            if a.kind == FileKind::Dir {
                todo.push((e.ino, p));
            }
        }
    }
    out
}

async fn objects(v: &TestVol) -> usize {
    let mut n = 0;
    v.fs.store()
        .list("", &mut |page| {
            n += page.len();
            Ok(())
        })
        .await
        .expect("list");
    n
}

async fn file(fs: &Fs, parent: Ino, name: &str, seed: u64, len: usize) -> Ino {
    let (ino, _) = fs
        .create(
            parent,
            name.as_bytes(),
            0o640,
            Owner {
                uid: 1000,
                gid: 100,
            },
        )
        .await
        .expect("create");
    if len > 0 {
        fs.write(ino, 0, &data(seed, len)).await.expect("write");
    }
    ino
}

/// A tree with every kind of entry, owners, odd modes, set times, xattrs, hard links
/// inside it and one to a file outside it.
async fn build(fs: &Fs) -> (Ino, Ino) {
    let o = Owner { uid: 0, gid: 0 };
    let (src, _) = fs.mkdir(ROOT_INO, b"src", 0o750, o).await.unwrap();
    let (sub, _) = fs.mkdir(src, b"sub", 0o2775, o).await.unwrap();
    let (deep, _) = fs.mkdir(sub, b"deep", 0o700, o).await.unwrap();
    file(fs, src, "empty", 0, 0).await;
    file(fs, src, "small", 1, 100).await;
    let big = file(fs, sub, "big", 2, 9 << 20).await;
    // Several slices in one chunk (an overwrite in the middle).
    fs.write(big, 1 << 20, &data(3, 1000)).await.unwrap();
    let h = file(fs, deep, "linked", 4, 5000).await;
    fs.link(h, src, b"linked-too").await.unwrap();
    let outside = file(fs, ROOT_INO, "outside", 5, 3000).await;
    fs.link(outside, sub, b"from-outside").await.unwrap();
    fs.symlink(src, b"link", b"sub/big", o).await.unwrap();
    fs.mknod(src, b"fifo", FileKind::Fifo, 0o600, 0, o)
        .await
        .unwrap();
    fs.mknod(src, b"dev", FileKind::CharDev, 0o600, (1 << 8) | 3, o)
        .await
        .unwrap();
    fs.setxattr(big, b"user.tag", b"release-7").await.unwrap();
    fs.setxattr(sub, b"user.dir", b"x").await.unwrap();
    fs.setattr(
        big,
        &SetAttr {
            mode: Some(0o4755),
            uid: Some(42),
            gid: Some(43),
            atime: Some(-1_000_000_000),
            mtime: Some(1_234_567_890_123_456_789),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (src, outside)
}

async fn a_clone_is_the_tree_and_shares_every_block(v: TestVol) {
    let fs = &v.fs;
    let (src, _) = build(fs).await;
    let before = describe(fs, src).await;
    let n_objects = objects(&v).await;
    let (_, dst) = fs_core::VolPath::parse("/copy").map(|p| ((), p)).unwrap();
    let session = "0123456789abcdef";
    let (_, rep) = fs
        .clone_path(
            &fs_core::VolPath::parse("/src").unwrap(),
            &dst,
            false,
            session,
        )
        .await
        .expect("clone");
    // Paths, less one for the second name of the linked pair, plus the root.
    assert_eq!(rep.entries, before.len() as u64, "{rep:?}");
    assert_eq!(objects(&v).await, n_objects, "a clone writes no block");
    let (copy, _) = fs.lookup(ROOT_INO, b"copy").await.unwrap();
    let mut want = before.clone();
    // The file linked from outside has one name in the copy; the pair inside keeps two.
    let k = "/sub/from-outside".to_string();
    want.insert(k.clone(), want[&k].replace(" n2 ", " n1 "));
    assert_eq!(describe(fs, copy).await, want);
    // Hard links inside stay one inode.
    let (a, _) = fs.lookup(copy, b"linked-too").await.unwrap();
    let (sub, _) = fs.lookup(copy, b"sub").await.unwrap();
    let (deep, _) = fs.lookup(sub, b"deep").await.unwrap();
    let (b, _) = fs.lookup(deep, b"linked").await.unwrap();
    assert_eq!(a, b);
    // Writing the copy leaves the source alone, and the reverse.
    let (big, _) = fs.lookup(sub, b"big").await.unwrap();
    fs.write(big, 0, b"changed in the copy").await.unwrap();
    fs.compact_chunk(big, 0).await.unwrap();
    assert_eq!(describe(fs, src).await, before);
    // The source removed and gc run: the copy reads the same (blocks it shares are kept).
    let copy_now = describe(fs, copy).await;
    rm_tree(fs, ROOT_INO, b"src").await;
    let opts = || fs_core::maint::GcOptions {
        delete: true,
        ..fs_core::maint::gc_defaults()
    };
    fs.gc(&opts()).await.unwrap();
    fs.gc(&opts()).await.unwrap();
    assert_eq!(describe(fs, copy).await, copy_now);
    let f = fs.fsck(true).await.unwrap();
    assert!(f.broken.is_empty() && f.references.is_empty(), "{f:?}");
    // The copy removed too: every block goes but the outside file's.
    rm_tree(fs, ROOT_INO, b"copy").await;
    let r1 = fs.gc(&opts()).await.unwrap();
    let r2 = fs.gc(&opts()).await.unwrap();
    let left = objects(&v).await;
    assert_eq!(
        left,
        n_objects - 6,
        "only the outside file's block is left (and the volume's owner record): {r1:?} {r2:?}"
    );
    assert!(fs.fsck(true).await.unwrap().broken.is_empty());
}

async fn rm_tree(fs: &Fs, parent: Ino, name: &[u8]) {
    let (ino, a) = fs.lookup(parent, name).await.unwrap();
    if a.kind == FileKind::Dir {
        for e in fs.readdir_all(ino).await.unwrap() {
            Box::pin(rm_tree(fs, ino, &e.name)).await;
        }
        fs.rmdir(parent, name).await.unwrap();
    } else {
        fs.unlink(parent, name).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rocksdb_a_clone_is_the_tree_and_shares_every_block() {
    a_clone_is_the_tree_and_shares_every_block(volume("rocksdb", "file").await).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_a_clone_is_the_tree_and_shares_every_block() {
    a_clone_is_the_tree_and_shares_every_block(volume("redis", "file").await).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_clone_is_the_tree_and_shares_every_block() {
    a_clone_is_the_tree_and_shares_every_block(volume("postgres", "file").await).await;
}

/// While a writer moves one token between two directories and replaces a numbered file
/// (`n-K` created, then `n-(K-1)` removed), three changes every 10 ms, every clone holds exactly one token and one or
/// two consecutive numbers: the source at one instant, never a mix of two.
async fn a_clone_is_one_instant_while_writers_change_the_source(v: TestVol) {
    let fs = &v.fs;
    let o = Owner::default();
    let (src, _) = fs.mkdir(ROOT_INO, b"src", 0o755, o).await.unwrap();
    let (a, _) = fs.mkdir(src, b"a", 0o755, o).await.unwrap();
    let (b, _) = fs.mkdir(src, b"b", 0o755, o).await.unwrap();
    // Bulk, so that a clone takes several batches and the writer gets in between.
    let (bulk, _) = fs.mkdir(src, b"bulk", 0o755, o).await.unwrap();
    for i in 0..3000 {
        fs.create(bulk, format!("f{i}").as_bytes(), 0o644, o)
            .await
            .unwrap();
    }
    file(fs, a, "token", 9, 10).await;
    file(fs, src, "n-0", 0, 1).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let fs = v.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut k = 0u64;
            let mut here = (a, b);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fs.rename(here.0, b"token", here.1, b"token", false)
                    .await
                    .unwrap();
                here = (here.1, here.0);
                k += 1;
                let (ino, _) = fs
                    .create(src, format!("n-{k}").as_bytes(), 0o644, Owner::default())
                    .await
                    .unwrap();
                fs.write(ino, 0, &k.to_be_bytes()).await.unwrap();
                fs.unlink(src, format!("n-{}", k - 1).as_bytes())
                    .await
                    .unwrap();
                // A busy writer (about 300 changes a second), not a tight loop: a source
                // that changes faster than one pass of the clone takes never converges
                // (the clone gives up after 64 passes, creating nothing).
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            k
        })
    };
    let mut recopied = 0;
    for i in 0..12 {
        let name = format!("c{i}");
        let (_, rep) = fs
            .clone_path(
                &fs_core::VolPath::parse("/src").unwrap(),
                &fs_core::VolPath::parse(&format!("/{name}")).unwrap(),
                false,
                "0123456789abcdef",
            )
            .await
            .expect("clone");
        recopied += rep.recopied;
        let (c, _) = fs.lookup(ROOT_INO, name.as_bytes()).await.unwrap();
        let t = describe(fs, c).await;
        let tokens = t.keys().filter(|p| p.ends_with("/token")).count();
        assert_eq!(tokens, 1, "clone {i} ({rep:?}) holds {tokens} tokens");
        let mut ns: Vec<u64> = t
            .keys()
            .filter_map(|p| p.strip_prefix("/n-"))
            .map(|n| n.parse().unwrap())
            .collect();
        ns.sort();
        assert!(
            ns.len() == 1 || (ns.len() == 2 && ns[1] == ns[0] + 1),
            "clone {i} holds numbers {ns:?}"
        );
        assert_eq!(t.keys().filter(|p| p.starts_with("/bulk/")).count(), 3000);
        if recopied > 0 && i >= 3 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let k = writer.await.unwrap();
    assert!(k > 0);
    assert!(
        recopied > 0,
        "the writer never changed the source during a clone: the test proved nothing"
    );
    let f = fs.fsck(false).await.unwrap();
    assert!(f.references.is_empty(), "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rocksdb_a_clone_is_one_instant_while_writers_change_the_source() {
    a_clone_is_one_instant_while_writers_change_the_source(volume("rocksdb", "file").await).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_a_clone_is_one_instant_while_writers_change_the_source() {
    a_clone_is_one_instant_while_writers_change_the_source(volume("redis", "file").await).await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_clone_is_one_instant_while_writers_change_the_source() {
    a_clone_is_one_instant_while_writers_change_the_source(volume("postgres", "file").await).await;
}

/// Two clones to one DST: one wins, the other fails naming it and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clones_to_one_destination_one_wins_and_the_other_leaves_nothing() {
    let v = volume("redis", "file").await;
    let fs = &v.fs;
    let (src, _) = build(fs).await;
    let _ = src;
    let other = v.client().await;
    let s = fs_core::VolPath::parse("/src").unwrap();
    let d = fs_core::VolPath::parse("/dst").unwrap();
    let (r1, r2) = tokio::join!(
        fs.clone_path(&s, &d, false, "0123456789abcdef"),
        other.clone_path(&s, &d, false, "fedcba9876543210")
    );
    let ok = [r1.is_ok(), r2.is_ok()];
    assert_eq!(ok.iter().filter(|x| **x).count(), 1, "{r1:?} {r2:?}");
    let err = r1.err().or(r2.err()).unwrap();
    assert_eq!(err.kind(), fs_core::ErrorKind::AlreadyExists, "{err}");
    assert!(err.to_string().contains("exists"), "{err}");
    assert!(fs.clones_in_progress().await.unwrap().is_empty());
    // Every inode with attributes is counted, and reachable: the loser's copy is gone.
    let d = fs_core::maint::dump(&**fs.engine()).await.unwrap();
    let with_attr = d.inodes.values().filter(|n| n.attr.is_some()).count() as i64;
    assert_eq!(d.counters["used_inodes"], with_attr);
    let f = fs.fsck(false).await.unwrap();
    assert!(f.references.is_empty(), "{f:?}");
}

/// Refused cleanly: into itself, onto an existing file, the root, a missing source.
#[tokio::test]
async fn bad_clones_are_refused_and_create_nothing() {
    let v = volume("rocksdb", "file").await;
    let fs = &v.fs;
    build(fs).await;
    let p = |s: &str| fs_core::VolPath::parse(s).unwrap();
    let sid = "0123456789abcdef";
    for (s, d, want) in [
        ("/src", "/src/sub/x", "inside the source"),
        ("/src", "/outside", "exists"),
        ("/", "/x", "root"),
        ("/nope", "/x", "no such"),
    ] {
        let e = fs.clone_path(&p(s), &p(d), false, sid).await.unwrap_err();
        assert!(e.to_string().contains(want), "{s} -> {d}: {e}");
    }
    assert!(fs.clones_in_progress().await.unwrap().is_empty());
    assert!(fs.lookup(ROOT_INO, b"x").await.is_err());
}

/// A `jfs clone` killed half-way leaves nothing visible; gc drops its copy once its session
/// is dead and releases the references, so removing the source then frees every block.
#[test]
fn a_killed_clone_leaves_nothing_and_gc_drops_its_copy() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let v = rt.block_on(volume("redis", "file"));
    let fs = &v.fs;
    rt.block_on(async {
        let o = Owner::default();
        let (src, _) = fs.mkdir(ROOT_INO, b"src", 0o755, o).await.unwrap();
        for d in 0..20 {
            let (dir, _) = fs
                .mkdir(src, format!("d{d}").as_bytes(), 0o755, o)
                .await
                .unwrap();
            for i in 0..1000 {
                let (ino, _) = fs
                    .create(dir, format!("f{i}").as_bytes(), 0o644, o)
                    .await
                    .unwrap();
                if i % 100 == 0 {
                    fs.write(ino, 0, &data(i, 1000)).await.unwrap();
                }
            }
        }
    });
    let n_objects = rt.block_on(objects(&v));
    let mut child = Command::new(bin("jfs"))
        .args(["clone", &v.meta_url, "/src", "/dst"])
        .spawn()
        .unwrap();
    // Killed once it has staged something.
    let mut staged = false;
    for _ in 0..2000 {
        if !rt.block_on(fs.clones_in_progress()).unwrap().is_empty() {
            staged = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(staged, "the clone finished before it could be killed");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(rt.block_on(fs.lookup(ROOT_INO, b"dst")).is_err());
    let out = Command::new(bin("jfs"))
        .args(["gc", "--delete", &v.meta_url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("clones whose writer died before linking them: 1 (1 dropped)"),
        "{text}"
    );
    assert!(rt.block_on(fs.clones_in_progress()).unwrap().is_empty());
    assert_eq!(rt.block_on(objects(&v)), n_objects);
    rt.block_on(async {
        let d = fs_core::maint::dump(&**fs.engine()).await.unwrap();
        let with_attr = d.inodes.values().filter(|n| n.attr.is_some()).count() as i64;
        assert_eq!(d.counters["used_inodes"], with_attr);
        rm_tree(fs, ROOT_INO, b"src").await;
        let opts = fs_core::maint::GcOptions {
            delete: true,
            ..fs_core::maint::gc_defaults()
        };
        fs.gc(&opts).await.unwrap();
        fs.gc(&opts).await.unwrap();
    });
    // The volume's owner record is left.
    assert_eq!(
        rt.block_on(objects(&v)),
        1,
        "a reference the killed copy held leaked"
    );
}

/// The command line: prints what it did, JSON too, and a second run refuses.
#[test]
fn jfs_clone_on_the_command_line() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let v = rt.block_on(volume("rocksdb", "file"));
    rt.block_on(build(&v.fs));
    let meta = v.meta_url.clone();
    drop(v.fs);
    let run = |args: &[&str]| Command::new(bin("jfs")).args(args).output().unwrap();
    let o = run(&["clone", &meta, "/src", "/v1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.starts_with("cloned /src to /v1: 11 entries (5 files, 3 directories), 9445284 bytes shared, no block copied"),
        "{text}"
    );
    let o = run(&["clone", "--json", &meta, "/src", "/releases-v2"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["entries"], 11);
    assert_eq!(j["dst"], "/releases-v2");
    let o = run(&["clone", &meta, "/src/small", "/releases-v2/sub/"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with("cloned /src/small to /releases-v2/sub/small: 1 entries"),
        "{text}"
    );
    let o = run(&["clone", &meta, "/src", "/v1"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["clone", &meta, "/src/small", "/v1/small"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exists") && err.contains("never replaces"),
        "{err}"
    );
    let o = run(&["cat", &meta, "/releases-v2/sub/big"]);
    let mut want = data(2, 9 << 20);
    want[1 << 20..(1 << 20) + 1000].copy_from_slice(&data(3, 1000));
    assert!(o.stdout == want, "the clone's bytes differ");
}

/// At a mirror: a clone arrives through the journal with no block copied (the mirror's copy
/// of the source's blocks serves it), the mirror's volume equals the primary's, and it
/// still reads every byte from the mirror's own store after the source is removed and gc'd.
async fn a_clone_reaches_the_mirror_with_no_block_copied(p: &'static str, m: &'static str) {
    use integration::mirror::*;
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(p, "file").await;
    let mut pair = Pair::start(dir.path(), &vol.meta_url, m, None, "", "").await;
    let fs = &vol.fs;
    let o = Owner::default();
    let (src, _) = fs.mkdir(ROOT_INO, b"ckpt", 0o755, o).await.unwrap();
    for i in 0..40u64 {
        file(
            fs,
            src,
            &format!("shard-{i}"),
            i,
            (i as usize % 5) * 300_000 + 17,
        )
        .await;
    }
    let engine = fs.engine().clone();
    let st = wait_converged(&pair.mirror, &*engine, std::time::Duration::from_secs(120)).await;
    let copied = n(&st, "blocks.copied");
    assert!(copied >= 32, "{st}");
    let (_, rep) = fs
        .clone_path(
            &fs_core::VolPath::parse("/ckpt").unwrap(),
            &fs_core::VolPath::parse("/release-1").unwrap(),
            false,
            "0123456789abcdef",
        )
        .await
        .unwrap();
    assert_eq!(rep.entries, 41);
    let st = wait_converged(&pair.mirror, &*engine, std::time::Duration::from_secs(120)).await;
    assert_eq!(
        n(&st, "blocks.copied"),
        copied,
        "the mirror copied blocks for a clone: {st}"
    );
    let files = assert_same(fs, &pair.m_meta, &pair.m_store).await;
    assert_eq!(files, 80);
    // The source goes at the primary; gc frees nothing the clone shares, at either site.
    rm_tree(fs, ROOT_INO, b"ckpt").await;
    fs.gc(&fs_core::maint::GcOptions {
        delete: true,
        ..fs_core::maint::gc_defaults()
    })
    .await
    .unwrap();
    wait_converged(&pair.mirror, &*engine, std::time::Duration::from_secs(120)).await;
    assert_eq!(assert_same(fs, &pair.m_meta, &pair.m_store).await, 40);
    assert_eq!(pair.mirror.term(), 0);
    assert_eq!(pair.primary.term(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clone_reaches_a_rocksdb_mirror_of_a_redis_primary_with_no_block_copied() {
    a_clone_reaches_the_mirror_with_no_block_copied("redis", "rocksdb").await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clone_reaches_a_postgres_mirror_of_a_rocksdb_primary_with_no_block_copied() {
    a_clone_reaches_the_mirror_with_no_block_copied("rocksdb", "postgres").await;
}

/// Through a mount: `cp` (copy_file_range) of a file lays the copy's bytes without writing a
/// block, at any offset (a copy into the middle of another file too), and `jfs clone` of a
/// RocksDB volume mounted read-write goes through the mount (its one writer).
#[test]
fn cp_through_a_mount_shares_blocks_and_jfs_clone_goes_through_the_mount() {
    use integration::mountproc::{new_vol, store_blocks, Mount};
    let v = new_vol("rocksdb");
    let m = Mount::start(&v.meta, v.dir.path(), "mnt", &[]);
    let src = m.mp.join("src.bin");
    let body = data(11, (9 << 20) + 12345);
    std::fs::write(&src, &body).unwrap();
    let blocks = store_blocks(&v.store).len();
    let cp = |args: &[&str]| {
        let o = Command::new("cp").args(args).output().unwrap();
        assert!(
            o.status.success(),
            "cp {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let copy = m.mp.join("copy.bin");
    cp(&[
        "--reflink=auto",
        src.to_str().unwrap(),
        copy.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&copy).unwrap() == body,
        "the copy's bytes differ"
    );
    assert_eq!(store_blocks(&v.store).len(), blocks, "cp wrote blocks");
    // A range into the middle of another file, at an offset no block boundary matches.
    let other = m.mp.join("other.bin");
    std::fs::write(&other, data(12, 3 << 20)).unwrap();
    let blocks = store_blocks(&v.store).len();
    {
        let fi = std::fs::File::open(&src).unwrap();
        let fo = std::fs::OpenOptions::new()
            .write(true)
            .open(&other)
            .unwrap();
        let mut off_in: u64 = 4_000_001;
        let mut off_out: u64 = 1_000_003;
        let n =
            rustix::fs::copy_file_range(&fi, Some(&mut off_in), &fo, Some(&mut off_out), 5_000_000)
                .unwrap();
        assert_eq!(n, 5_000_000);
    }
    let mut want = data(12, 3 << 20);
    want.resize(6_000_003, 0);
    want[1_000_003..6_000_003].copy_from_slice(&body[4_000_001..9_000_001]);
    assert!(
        std::fs::read(&other).unwrap() == want,
        "the ranged copy's bytes differ"
    );
    assert_eq!(
        store_blocks(&v.store).len(),
        blocks,
        "copy_file_range wrote blocks"
    );
    // jfs clone while the mount holds the RocksDB writer: through the mount.
    std::fs::create_dir(m.mp.join("dir")).unwrap();
    std::fs::write(m.mp.join("dir/a"), b"aaa").unwrap();
    let o = Command::new(bin("jfs"))
        .args(["clone", &v.meta, "/dir", "/dir-v1"])
        .env("JFS_RUN_DIR", &m.run_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("cloned /dir to /dir-v1: 2 entries"));
    assert_eq!(std::fs::read(m.mp.join("dir-v1/a")).unwrap(), b"aaa");
    // The source's removal leaves every copy whole.
    std::fs::remove_file(&src).unwrap();
    std::fs::remove_dir_all(m.mp.join("dir")).unwrap();
    let o = Command::new(bin("jfs"))
        .args(["gc", "--delete", &v.meta])
        .env("JFS_RUN_DIR", &m.run_dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    m.stop();
    let o = Command::new(bin("jfs"))
        .args(["fsck", "--deep", &v.meta])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let o = Command::new(bin("jfs"))
        .args(["cat", &v.meta, "/copy.bin"])
        .output()
        .unwrap();
    assert!(o.stdout == body);
    let o = Command::new(bin("jfs"))
        .args(["cat", &v.meta, "/other.bin"])
        .output()
        .unwrap();
    assert!(o.stdout == want);
}

/// runbooks/model-versions.md, "Release a version as a clone", each step as written.
#[test]
fn runbook_release_a_version_as_a_clone() {
    use integration::runbook;
    const RB: &str = "model-versions";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let v = rt.block_on(volume("rocksdb", "file"));
    rt.block_on(async {
        let fs = &v.fs;
        let o = Owner::default();
        let (c, _) = fs.mkdir(ROOT_INO, b"checkpoints", 0o755, o).await.unwrap();
        let (r, _) = fs.mkdir(c, b"run-42", 0o755, o).await.unwrap();
        let (s, _) = fs.mkdir(r, b"step-9000", 0o755, o).await.unwrap();
        for i in 0..8 {
            file(fs, s, &format!("shard-{i}.safetensors"), i, 300_000).await;
        }
    });
    let meta = v.meta_url.clone();
    drop(v.fs);
    let env = [
        ("META_URL", meta.as_str()),
        ("CKPT", "/checkpoints/run-42/step-9000"),
        ("RELEASE", "/models/llama-ft/v3"),
    ];
    let out = runbook::run_checked(RB, "release", &env);
    assert!(out.contains("9 entries (8 files, 1 directories)"), "{out}");
    let out = runbook::run_checked(RB, "check-release", &env);
    assert!(out.contains("shard-7.safetensors"), "{out}");
    // A second release to the same name is refused, as the runbook says.
    let o = runbook::run(RB, "release", &env);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("a clone never replaces anything"));
}
