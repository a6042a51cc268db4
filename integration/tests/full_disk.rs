//! A full store reaches applications as ENOSPC, with the cause in the commands' messages,
//! and jfs-sync does not retry it (issue 43, items 16 and 17); jfs-sync refuses a resume state
//! on a disk without room for it. The block store is a small
//! tmpfs mounted (and unmounted on every way out) by the test, as root.
//!
//! These need /dev/fuse and fusermount3 (Debian fuse3): without them they fail, never skip.

use integration::data;
use integration::disk::SmallDisk;
use integration::mountproc::{fuse_ready, Mount};
use integration::{bin, unique};
use std::process::Command;

fn jfs(args: &[&str]) -> std::process::Output {
    Command::new(bin("jfs"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running jfs")
}

#[test]
fn a_full_store_is_enospc_to_applications_and_named_by_commands() {
    fuse_ready();
    let d = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&d.path().join("small"), 8);
    let store = disk.0.join("blocks");
    let meta = format!("rocksdb://{}", d.path().join("meta").display());
    let o = jfs(&[
        "format",
        &meta,
        &unique("full"),
        "--storage",
        &format!("file://{}", store.display()),
    ]);
    assert!(o.status.success(), "{o:?}");

    // Through a mount: the write or the close fails with ENOSPC, not EIO.
    let m = Mount::start(&meta, d.path(), "mnt", &["--cache-size", "0"]);
    let r = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(m.mp.join("big"))?;
        f.write_all(&data(1, 24 << 20))?;
        f.sync_all()
    })();
    let e = r.expect_err("24 MiB fit in an 8 MiB store");
    assert_eq!(e.raw_os_error(), Some(28 /* ENOSPC */), "{e}");
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("ENOSPC"), "{log}");
    m.stop();

    // jfs put: the message says the disk is full.
    let local = d.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("big2"), data(2, 24 << 20)).unwrap();
    let o = jfs(&["put", &meta, local.join("big2").to_str().unwrap(), "/big2"]);
    assert_ne!(o.status.code(), Some(0), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("No space left") || err.contains("disk full"),
        "{err}"
    );

    // jfs-sync into the full disk: each file fails at once, not retried.
    let dst = disk.0.join("copy");
    let o = Command::new(bin("jfs-sync"))
        .args([
            local.to_str().unwrap(),
            dst.to_str().unwrap(),
            "--retries",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no space left") && err.contains("not retried"),
        "{err}"
    );
    assert!(err.contains("failed after 1 attempt(s)"), "{err}");
    drop(disk);
}

/// jfs-sync's resume state (RocksDB) on a disk without the room RocksDB sets aside at open
/// and the floor every write keeps is refused before anything is copied, naming the
/// directory; the same job with its state elsewhere then runs.
#[test]
fn a_resume_state_on_a_disk_without_room_is_refused_before_anything_is_copied() {
    let d = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&d.path().join("small"), 40);
    let src = d.path().join("src");
    let dst = d.path().join("dst");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), data(1, 1000)).unwrap();
    std::fs::write(src.join("sub/b"), data(2, 5000)).unwrap();
    std::fs::create_dir(&dst).unwrap();
    let state = disk.0.join("state");
    let run = |state: &std::path::Path| {
        Command::new(bin("jfs-sync"))
            .arg(format!("{}/", src.display()))
            .arg(format!("{}/", dst.display()))
            .arg("--state-dir")
            .arg(state)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running jfs-sync")
    };
    let o = run(&state);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        err.contains("resume state cannot be kept in") && err.contains(&*state.to_string_lossy()),
        "{err}"
    );
    assert!(err.contains("--state-dir"), "{err}");
    assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 0, "{err}");

    let o = run(&d.path().join("state"));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(std::fs::read(dst.join("sub/b")).unwrap(), data(2, 5000));
}
