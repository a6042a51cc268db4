//! Times through a mount (issue 43, items 12 and 13): a time set explicitly before close
//! (`cp -a`, `rsync -t`, `tar`) is kept, not stamped over by the commit at close; every time
//! from 1677 to 2262 (i64 nanoseconds) is kept exactly, before 1970 included; a time outside
//! that range is refused (EOVERFLOW), never wrapped.
//!
//! These need /dev/fuse and fusermount3 (Debian fuse3): without them they fail, never skip.

use integration::data;
use integration::mountproc::{new_vol, Mount};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

fn mtime(p: &std::path::Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

fn touch(date: &str, p: &std::path::Path) -> std::process::Output {
    Command::new("touch")
        .args(["-m", "-d", date])
        .arg(p)
        .output()
        .expect("running touch")
}

#[test]
fn times_set_through_a_mount_are_kept_exactly_or_refused() {
    let v = new_vol("rocksdb");
    let m = Mount::start(&v.meta, v.dir.path(), "mnt", &[]);
    let local = v.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();

    // 1. futimens before close, after buffered writes (what `cp -a` does).
    let set = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(m.mp.join("ckpt")).unwrap();
        f.write_all(&data(1, 3 << 20)).unwrap();
        f.set_modified(set).unwrap();
    }
    assert_eq!(mtime(&m.mp.join("ckpt")), (1_000_000_000, 123_456_789));

    // 2. `cp -a` of a local tree keeps every file's mtime.
    let src = local.join("tree");
    std::fs::create_dir(&src).unwrap();
    for (i, secs) in [(0u64, 946_684_800i64), (1, 1_234_567_890), (2, 86_400)] {
        let p = src.join(format!("f{i}"));
        std::fs::write(&p, data(i, 100_000 + i as usize * 700_000)).unwrap();
        let o = touch(&format!("@{secs}.25"), &p);
        assert!(o.status.success(), "{o:?}");
    }
    let o = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(m.mp.join("tree"))
        .output()
        .unwrap();
    assert!(o.status.success(), "cp -a: {o:?}");
    for i in 0..3 {
        let (a, b) = (src.join(format!("f{i}")), m.mp.join(format!("tree/f{i}")));
        assert_eq!(mtime(&b), mtime(&a), "tree/f{i}");
        assert_eq!(std::fs::read(&b).unwrap(), std::fs::read(&a).unwrap());
    }

    // 3. Before 1970, with a fraction of a second, and the ends of the range.
    let f = m.mp.join("old");
    std::fs::write(&f, b"x").unwrap();
    for (date, want) in [
        ("1969-12-31 23:59:59.5 UTC", (-1, 500_000_000)),
        ("1960-01-01 00:00:00.25 UTC", (-315_619_200, 250_000_000)),
        ("1900-06-15 12:00:00 UTC", (-2_194_689_600, 0)),
        ("2262-04-11 00:00:00 UTC", (9_223_286_400, 0)),
    ] {
        let o = touch(date, &f);
        assert!(o.status.success(), "touch -d {date}: {o:?}");
        assert_eq!(mtime(&f), want, "{date}");
    }
    // 4. Outside it: refused, and the file keeps the time it had.
    for date in ["2300-01-01 00:00:00 UTC", "1600-01-01 00:00:00 UTC"] {
        let o = touch(date, &f);
        assert!(!o.status.success(), "touch -d {date} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("too large"), "touch -d {date}: {err}");
        assert_eq!(mtime(&f), (9_223_286_400, 0), "after {date}");
    }
    // 5. All of it as stored, after a remount.
    m.stop();
    let m = Mount::start(&v.meta, v.dir.path(), "mnt", &[]);
    assert_eq!(mtime(&m.mp.join("ckpt")), (1_000_000_000, 123_456_789));
    assert_eq!(mtime(&m.mp.join("tree/f1")), (1_234_567_890, 250_000_000));
    assert_eq!(mtime(&m.mp.join("old")), (9_223_286_400, 0));
    m.stop();
}
