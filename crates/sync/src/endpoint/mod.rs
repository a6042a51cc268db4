//! Endpoints: where objects are listed from and copied to. Keys are relative paths with '/'
//! separators; every listing is a stream of pages in ascending byte order of the key (a
//! directory sorts as `name/`), which is what lets both sides be merged without holding
//! either in memory.

mod blocks;
mod local;
mod object;
pub mod s3native;
mod volume;
pub mod walk;

pub use blocks::{BlockIndex, BlocksEndpoint};
pub use local::LocalDir;
pub use object::{ObjectStore, PART};
pub use volume::{meta_url_of, VolumeEndpoint};

pub use crate::entry::{Entry, Kind, Page, TooWide};
use crate::range::KeyRange;
use anyhow::{Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What one listing covers: the entries under `prefix` ("" or a directory key ending in
/// '/') within `range`, with directory entries too when `dirs`.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    pub prefix: &'a str,
    pub range: &'a KeyRange,
    pub dirs: bool,
}

/// Where a copy is being written. `write` is called with consecutive pieces in order;
/// `finish` makes the object visible under its real name (never before it is complete).
#[async_trait]
pub trait Sink: Send {
    async fn write(&mut self, data: Bytes) -> Result<()>;
    async fn finish(self: Box<Self>, src: &Entry, perms: bool) -> Result<()>;
    async fn abort(self: Box<Self>);
}

#[async_trait]
pub trait Endpoint: Send + Sync {
    fn describe(&self) -> String;
    /// Modification times kept to this precision (ns): 1 for local files (the default), 1e9
    /// for stores that keep seconds.
    fn mtime_precision_ns(&self) -> i64 {
        1
    }
    /// Does a listed mtime mean "when it was uploaded" (object stores) rather than the
    /// source's mtime carried over (the default)?
    fn mtime_is_upload(&self) -> bool {
        false
    }
    /// Send every entry the listing `l` covers, in ascending order, in pages. Ends with
    /// Ok(()) once all were sent.
    async fn list(&self, l: Listing<'_>, tx: mpsc::Sender<Page>) -> Result<()>;
    /// The entries one level under `prefix`, directories as `name/`, sorted.
    async fn list_level(&self, prefix: &str) -> Result<Vec<Entry>>;
    async fn stat(&self, key: &str) -> Result<Option<Entry>>;
    async fn read(&self, key: &str, offset: u64, len: u64) -> Result<Bytes>;
    async fn sink(&self, key: &str, size: u64) -> Result<Box<dyn Sink>>;
    async fn mkdir(&self, key: &str, src: &Entry, perms: bool) -> Result<()>;
    async fn symlink(&self, key: &str, target: &str) -> Result<()>;
    async fn delete(&self, key: &str, kind: Kind) -> Result<()>;
    /// Same store and endpoint: a server-side copy is possible (object stores).
    async fn server_side_copy(&self, _from: &dyn Endpoint, _key: &str, _size: u64) -> Result<bool> {
        Ok(false)
    }
    fn as_object_store(&self) -> Option<&ObjectStore> {
        None
    }
    fn as_local(&self) -> Option<&LocalDir> {
        None
    }
    fn as_volume(&self) -> Option<&VolumeEndpoint> {
        None
    }
    /// Writes here are durable only after `sync` (a local file system); others are durable
    /// when the write returns.
    fn durable_later(&self) -> bool {
        false
    }
    /// Make every write finished so far durable (files and the directory entries naming them).
    async fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Remove directory `key` (a key ending in '/') if it is empty: Ok(true) when removed,
    /// Ok(false) when it holds something or is not there. Endpoints without directories
    /// (object stores) have nothing to remove.
    async fn remove_empty_dir(&self, _key: &str) -> Result<bool> {
        Ok(false)
    }
    /// Places this endpoint reads or writes that its spec alone does not tell (a volume's
    /// uuid and block store), for the overlap check.
    fn places(&self) -> Vec<(String, fs_core::place::Place)> {
        Vec::new()
    }
}

/// An error that retrying cannot fix (a hostile key, an unsupported object kind): a
/// permanent `fs_core::Error` of kind `InvalidArgument`, which `copy::is_permanent` reads.
pub fn permanent(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(fs_core::Error::new(
        fs_core::ErrorKind::InvalidArgument,
        msg,
    ))
}

/// The mode a copy of a file with permission bits `mode` gets when its modes are kept
/// (`jfs-sync --perms`, `jfs get`): setuid and setgid stay only when the copy is given its
/// source's owner (`owner_kept`: `--owners`, root only); otherwise they are dropped, as `cp`
/// and `tar` do, because a root copy of a user's `chmod 4755` file would be a setuid-root
/// binary.
pub fn copy_mode(mode: u32, owner_kept: bool) -> u32 {
    if owner_kept {
        mode & 0o7777
    } else {
        mode & 0o7777 & !0o6000
    }
}

/// Refuse `--owners` (giving copies their source's numeric owner) to a caller that is not
/// root: only root can give files away. `what` names the command in the message.
pub fn check_owners(what: &str) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!("{what} --owners: only root can give files to their owners; run it as root, or without --owners (the copies are then yours, without setuid and setgid bits)");
    }
    Ok(())
}

/// A time in ns since 1970 (negative: before) as a `SystemTime`.
pub fn system_time(ns: i64) -> std::time::SystemTime {
    if ns >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_nanos(ns.unsigned_abs())
    }
}

/// What ends the temporary name a file is written under before it is renamed into place.
pub const TMP_SUFFIX: &str = ".jfs-sync-tmp";

/// The temporary name of a file called `name` in the same directory: `.NAME.jfs-sync-tmp`,
/// or, for a name too long for that (a name has at most 255 bytes), the name cut on a
/// character boundary plus its CRC32C: `.PREFIX~CRC.jfs-sync-tmp`. The same for every
/// attempt, so that a resumed run writes over what an interrupted one left and renames it.
pub fn temp_name(name: &str) -> String {
    const MAX: usize = 255;
    if 1 + name.len() + TMP_SUFFIX.len() <= MAX {
        return format!(".{name}{TMP_SUFFIX}");
    }
    let room = MAX - 1 - 9 - TMP_SUFFIX.len(); // '.', '~' and 8 hex digits, the suffix
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        ".{}~{:08x}{TMP_SUFFIX}",
        &name[..cut],
        crc32c::crc32c(name.as_bytes())
    )
}

/// Is `key` a temporary file of jfs-sync: `temp_name`'s form, or the `.NAME.jfs-sync-tmp-HEX`
/// an earlier release wrote in volumes? Such files are never copied, compared or counted;
/// a run that finds one on its destination removes it.
pub fn is_temp(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    if !name.starts_with('.') {
        return false;
    }
    if name.ends_with(TMP_SUFFIX) && name.len() > 1 + TMP_SUFFIX.len() {
        return true;
    }
    match name.rsplit_once("-") {
        Some((head, hex)) => {
            head.ends_with(TMP_SUFFIX)
                && hex.len() == 8
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// Object keys are untrusted. A key is refused when it could name something outside the
/// destination or something other than what it says: empty or `.`/`..` components, an
/// absolute path, NUL or other control characters, backslashes, a drive letter, a component
/// over 255 bytes or a key over 4096.
pub fn check_key(key: &str) -> Result<()> {
    let bad = |why: &str| -> Result<()> {
        Err(permanent(format!(
            "refusing object key {}: {why}",
            crate::names::quote(&crate::names::bytes_of(key))
        )))
    };
    if !crate::names::is_text(key) {
        return bad("its name is not UTF-8, which object-store keys must be; rename it at the source or exclude it");
    }
    if key.is_empty() {
        return bad("empty");
    }
    if key.len() > 4096 {
        return bad("longer than 4096 bytes");
    }
    if key.starts_with('/') {
        return bad("absolute path");
    }
    if key.contains('\\') {
        return bad("contains a backslash");
    }
    if key.chars().any(|c| c.is_control()) {
        return bad("contains NUL or a control character");
    }
    let b = key.as_bytes();
    if b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic() {
        return bad("starts with a drive letter");
    }
    for comp in key.trim_end_matches('/').split('/') {
        match comp {
            "" => return bad("empty path component"),
            "." | ".." => return bad("'.' or '..' component"),
            c if c.len() > 255 => return bad("a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// A key naming a file of a POSIX tree (a local directory, a volume) is refused only when
/// it could name something outside the destination: empty, absolute, an empty, `.` or `..`
/// component, a NUL, a component over 255 bytes or a path over 4096. Any other byte is a
/// legal name there (`crate::names`): newlines, backslashes, bytes that are not UTF-8.
pub fn check_path(key: &str) -> Result<()> {
    let name = crate::names::bytes_of(key);
    let bad = |why: &str| -> Result<()> {
        Err(permanent(format!(
            "refusing path {}: {why}",
            crate::names::quote(&name)
        )))
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 4096 {
        return bad("longer than 4096 bytes");
    }
    if name.starts_with(b"/") {
        return bad("absolute path");
    }
    if name.contains(&0) {
        return bad("contains NUL");
    }
    let trimmed = name.strip_suffix(b"/").unwrap_or(&name);
    for comp in trimmed.split(|b| *b == b'/') {
        match comp {
            b"" => return bad("empty path component"),
            b"." | b".." => return bad("'.' or '..' component"),
            c if c.len() > 255 => return bad("a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// After `--delete-dst` deleted `deleted` (file keys) without `--dirs`: remove the
/// directories those deletes left empty, deepest first (a directory renamed at the source
/// leaves none behind). A directory that still holds anything (an excluded file, a copy)
/// stays; so does the destination's root. Returns how many were removed.
pub async fn prune_emptied(dst: &dyn Endpoint, deleted: &[String]) -> usize {
    let mut dirs = std::collections::BTreeSet::new();
    for k in deleted {
        let mut k = k.trim_end_matches('/');
        while let Some((parent, _)) = k.rsplit_once('/') {
            dirs.insert(format!("{parent}/"));
            k = parent;
        }
    }
    let mut removed = 0;
    // Descending key order puts `a/b/` before `a/`.
    for d in dirs.iter().rev() {
        match dst.remove_empty_dir(d).await {
            Ok(true) => removed += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(dir = %crate::names::show(d), error = %format!("{e:#}"), "removing a directory the deletes emptied")
            }
        }
    }
    removed
}

/// Open an endpoint from its command-line form: a local path (or `file://`), `s3://`,
/// `memory://`, or `jfs://NAME/path`. `write`: this run writes or deletes there (a volume is
/// then opened for writing, which a mirror's metadata refuses); `create` makes a missing
/// local directory.
pub async fn open(
    spec: &str,
    endpoint: Option<&str>,
    write: bool,
    create: bool,
) -> Result<Arc<dyn Endpoint>> {
    if let Some(rest) = spec.strip_prefix("jfs://") {
        return Ok(Arc::new(VolumeEndpoint::open(rest, write).await?));
    }
    if let Some((scheme, _)) = spec.split_once("://") {
        if scheme == "file" {
            let path = &spec["file://".len()..];
            check_local(path, write)?;
            return Ok(Arc::new(LocalDir::open_with(path, create)?));
        }
        return Ok(Arc::new(ObjectStore::open(spec, endpoint).with_context(
            || format!("opening {}", objstore::secrets::redact(spec)),
        )?));
    }
    check_local(spec, write)?;
    Ok(Arc::new(LocalDir::open_with(spec, create)?))
}

/// A local SRC or DST reached through another user's symbolic link is refused (they would
/// choose what this run reads, or where it writes and deletes: the kernel's
/// `protected_symlinks` rule, kept where a host turned it off). A DST must also be this
/// user's (or root's) and closed to other writers, and so must every directory above it
/// (ssh's rule): otherwise another user could swap it for a link or directory of theirs
/// while the run writes. Below DST nothing is followed out of it (cap-std).
fn check_local(path: &str, write: bool) -> Result<()> {
    use cli_common::private::{ancestors_problem, foreign_link};
    use std::os::unix::fs::MetadataExt;
    let p = Path::new(path);
    let side = if write { "DST" } else { "SRC" };
    if let Some(why) = foreign_link(p) {
        anyhow::bail!("{side} {path}: {why}");
    }
    if !write {
        return Ok(());
    }
    let me = rustix::process::geteuid().as_raw();
    if let Ok(m) = std::fs::metadata(p) {
        if m.uid() != me && m.uid() != 0 {
            anyhow::bail!(
                "DST {path} belongs to uid {}, another user, who could swap what is in it for links while this run writes: sync into a directory of your own (or run as that user)",
                m.uid()
            );
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            anyhow::bail!(
                "DST {path} has mode {:04o}: other users may change it while this run writes and deletes there; chmod go-w it, or sync into a directory of your own",
                m.mode() & 0o7777
            );
        }
    }
    if let Some(why) = ancestors_problem(p) {
        anyhow::bail!("DST {path}: {why}: sync into a directory of your own, then move it");
    }
    Ok(())
}

/// A destination that does not exist yet, for `--dry-run`: it lists nothing and refuses
/// writes (a dry run makes none).
pub struct Missing(pub String);

#[async_trait]
impl Endpoint for Missing {
    fn describe(&self) -> String {
        format!("{} (does not exist yet)", self.0)
    }
    async fn list(&self, _l: Listing<'_>, _tx: mpsc::Sender<Page>) -> Result<()> {
        Ok(())
    }
    async fn list_level(&self, _prefix: &str) -> Result<Vec<Entry>> {
        Ok(Vec::new())
    }
    async fn stat(&self, _key: &str) -> Result<Option<Entry>> {
        Ok(None)
    }
    async fn read(&self, key: &str, _offset: u64, _len: u64) -> Result<Bytes> {
        anyhow::bail!("{key}: {} does not exist", self.0)
    }
    async fn sink(&self, key: &str, _size: u64) -> Result<Box<dyn Sink>> {
        anyhow::bail!("{key}: {} does not exist (dry run)", self.0)
    }
    async fn mkdir(&self, key: &str, _src: &Entry, _perms: bool) -> Result<()> {
        anyhow::bail!("{key}: {} does not exist (dry run)", self.0)
    }
    async fn symlink(&self, key: &str, _target: &str) -> Result<()> {
        anyhow::bail!("{key}: {} does not exist (dry run)", self.0)
    }
    async fn delete(&self, _key: &str, _kind: Kind) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check_key;
    use proptest::prelude::*;

    #[test]
    fn temporary_names_fit_every_legal_name_and_are_recognised() {
        use super::{is_temp, temp_name};
        for len in [1, 200, 241, 242, 250, 255] {
            let name = "n".repeat(len);
            let t = temp_name(&name);
            assert!(t.len() <= 255, "{len}: {} bytes", t.len());
            assert!(is_temp(&t) && is_temp(&format!("a/b/{t}")), "{t}");
            assert!(!is_temp(&name));
            assert_eq!(t, temp_name(&name), "the same name each time");
        }
        // Long names that differ only after the cut get different temporary names.
        let (a, b) = (
            format!("{}a", "x".repeat(250)),
            format!("{}b", "x".repeat(250)),
        );
        assert_ne!(temp_name(&a), temp_name(&b));
        // Multi-byte characters are never cut in half.
        let wide = "é".repeat(127); // 254 bytes
        assert!(temp_name(&wide).len() <= 255);
        assert!(
            is_temp("d/.big.bin.jfs-sync-tmp-9d8247b3"),
            "an earlier release's form"
        );
        for k in [
            "x.jfs-sync-tmp",
            ".jfs-sync-tmp",
            "a/.b",
            ".a.jfs-sync-tmp-xyz",
            "a",
        ] {
            assert!(!is_temp(k), "{k}");
        }
    }

    #[test]
    fn hostile_keys_are_refused() {
        for k in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a\\..\\b",
            "C:/x",
            "c:x",
            "a\0b",
            "a\nb",
            &"x".repeat(256),
            &format!("a/{}", "y".repeat(300)),
        ] {
            assert!(check_key(k).is_err(), "{k:?} was accepted");
        }
        for k in ["a", "a/b.txt", "dir/", "..a", "a..", "ü/ñ", "a b/c-d_e"] {
            assert!(check_key(k).is_ok(), "{k:?} was refused");
        }
        let not_utf8 = crate::names::key_of(b"d/\xffx").into_owned();
        let e = check_key(&not_utf8).unwrap_err().to_string();
        assert!(
            e.contains("'d/'$'\\377''x'") && e.contains("not UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn posix_paths_take_any_byte_but_never_leave_the_destination() {
        use super::check_path;
        for k in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a\0b",
        ] {
            assert!(check_path(k).is_err(), "{k:?} was accepted");
        }
        let raw = crate::names::key_of(b"a\xff\x1b/b\nc").into_owned();
        for k in ["a", "a\nb", "a\\b", "c:x", "dir/", raw.as_str()] {
            assert!(check_path(k).is_ok(), "{k:?} was refused");
        }
    }

    proptest! {
        /// Any key that passes never leaves the destination: joined under a root and
        /// normalised, it still starts with that root.
        #[test]
        fn accepted_keys_stay_inside(parts in proptest::collection::vec("[a-z.]{0,4}|\\.\\.|\\.", 1..6)) {
            let key = parts.join("/");
            if check_key(&key).is_ok() {
                let mut depth: i32 = 0;
                for c in key.split('/') {
                    match c {
                        ".." => depth -= 1,
                        "." | "" => {}
                        _ => depth += 1,
                    }
                    prop_assert!(depth >= 0, "{key} escapes");
                }
            }
        }
    }
}
