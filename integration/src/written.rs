//! What writers under test recorded as finished, and the check that it reads back.

use std::path::Path;

/// A file a writer finished (written, fsynced, renamed into place or put), with its CRC.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: String,
    pub crc: u32,
    pub len: usize,
}

/// Every file in `files` reads back under `root` with its length and CRC; how many.
pub fn check_files(root: &Path, files: &[Written]) -> usize {
    for w in files {
        let got = std::fs::read(root.join(&w.path))
            .unwrap_or_else(|e| panic!("reading {} back: {e}", w.path));
        assert_eq!(got.len(), w.len, "{} has the wrong length", w.path);
        assert_eq!(
            crc32c::crc32c(&got),
            w.crc,
            "{} differs from what its writer recorded",
            w.path
        );
    }
    files.len()
}
