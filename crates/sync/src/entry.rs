//! What a listing yields: entries (a key, its kind, size, mtime, mode, symlink target) in
//! pages, ascending by key. Keys are relative paths with '/' separators; a directory's key
//! ends in '/'.

use anyhow::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// One listed object. `mtime_ns` is the source's modification time, or for object stores the
/// upload time (`mtime_is_upload` then), which is why change detection needs both flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub kind: Kind,
    pub size: u64,
    pub mtime_ns: i64,
    /// Permission bits, when the endpoint has them.
    pub mode: Option<u32>,
    /// Symlink target.
    pub target: Option<String>,
    /// Numeric owner and group (uid, gid), when the endpoint has them (a local directory, a
    /// volume). A run without `--owners` drops them before copying (`run::ctx::work`): a
    /// sink gives a copy its source's owner exactly when this is set.
    pub owner: Option<(u32, u32)>,
}

pub type Page = Result<Vec<Entry>>;

/// `list_level` of a directory too wide to expand in memory: list it as one subtree instead.
#[derive(Debug)]
pub struct TooWide;

impl std::fmt::Display for TooWide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("directory too wide to expand")
    }
}

impl std::error::Error for TooWide {}
