//! A checkpoint writer for the tests that move a volume under writes: in DIR (inside a
//! mount) it writes `ck.tmp` (200 KB to 800 KB of seeded bytes), fsyncs it and renames it
//! over `ck-<i % 40>`, again and again, until STOP_FILE exists. Every attempt is one line
//! in LOG, flushed at once:
//!
//!   ok <name> <crc32c> <len> <micros taken>
//!   err <name> <message>
//!
//! It runs as a process of its own, not a thread of the test: a test that spawns commands
//! while one of its threads holds a file open on the mount makes every child's exec close a
//! copy of that descriptor, and that close is a FUSE flush, which commits; during a move a
//! commit waits for the new primary, which waits on those very commands.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [dir, log, stop] = args.as_slice() else {
        eprintln!("usage: ckpt-writer DIR LOG STOP_FILE");
        std::process::exit(2);
    };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    let mut i = 0u64;
    while !stop.exists() {
        let len = 200_000 + (i as usize * 3_331) % 600_000;
        let d = integration::data(40_000 + i, len);
        let name = format!("ck-{}", i % 40);
        let t0 = Instant::now();
        let r = (|| -> std::io::Result<()> {
            let tmp = dir.join("ck.tmp");
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&d)?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, dir.join(&name))
        })();
        let line = match r {
            Ok(()) => format!(
                "ok {name} {} {len} {}\n",
                crc32c::crc32c(&d),
                t0.elapsed().as_micros()
            ),
            Err(e) => {
                std::thread::sleep(Duration::from_millis(100));
                format!("err {name} {e}\n")
            }
        };
        out.write_all(line.as_bytes()).expect("writing the log");
        i += 1;
    }
}
