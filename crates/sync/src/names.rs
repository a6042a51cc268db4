//! File names are bytes. POSIX names (local directories, volumes) may hold any byte but `/`
//! and NUL, in any encoding; the sync's keys are `String`s (object-store keys, ranges, resume
//! cursors and job records are text). A name is carried in a key losslessly:
//!
//! - valid UTF-8 stays as it is (every key of a UTF-8 tree is its own name, as before);
//! - each byte that is not part of valid UTF-8 becomes one code point of the last 256 of
//!   the last private-use plane, `U+10FF00 + byte`; a name that itself holds a code point of
//!   that range has each of its bytes encoded the same way, so two different names never
//!   share a key (`key_of` is injective) and `bytes_of` gives the name back.
//!
//! A key with such a code point is not a real object-store key: an object store (S3 keys
//! are UTF-8) refuses to write it (`is_text`), and the run skips that entry, names it and
//! exits 1. Keys still sort in byte order of the key: every side of a sync encodes the same
//! way, so both listings agree. Filters (`--include`, `--exclude`) match the key, which is
//! the name itself for UTF-8 names; a byte that is not UTF-8 matches only `?` or `*`.
//!
//! Anything that prints a name (messages, logs, `jfs ls`) prints `show(key)` or
//! `quote(bytes)`: shell-escaped like `ls --quoting-style=shell-escape`, never raw control
//! bytes or bytes that are not UTF-8.

use std::borrow::Cow;

/// The first of the 256 code points standing for one byte each.
const BASE: u32 = 0x10_FF00;

fn byte_char(b: u8) -> char {
    char::from_u32(BASE + b as u32).expect("a valid code point")
}

fn is_byte_char(c: char) -> bool {
    c as u32 >= BASE
}

/// The key of a name (or of a `/`-separated path of names) given as bytes.
pub fn key_of(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.chars().any(is_byte_char) {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if is_byte_char(c) {
                let mut buf = [0u8; 4];
                out.extend(c.encode_utf8(&mut buf).bytes().map(byte_char));
            } else {
                out.push(c);
            }
        }
        out.extend(chunk.invalid().iter().copied().map(byte_char));
    }
    Cow::Owned(out)
}

/// The key of a local name.
pub fn key_of_os(name: &std::ffi::OsStr) -> Cow<'_, str> {
    use std::os::unix::ffi::OsStrExt;
    key_of(name.as_bytes())
}

/// The name (bytes) a key stands for.
pub fn bytes_of(key: &str) -> Cow<'_, [u8]> {
    if is_text(key) {
        return Cow::Borrowed(key.as_bytes());
    }
    let mut out = Vec::with_capacity(key.len());
    for c in key.chars() {
        if is_byte_char(c) {
            out.push((c as u32 - BASE) as u8);
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    Cow::Owned(out)
}

/// The local path a key stands for.
pub fn path_of(key: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&bytes_of(key)))
}

/// Is `key` its name's own text (no byte of it stood for by a private code point)? Only
/// such keys can be written to a store whose keys are UTF-8.
pub fn is_text(key: &str) -> bool {
    !key.chars().any(is_byte_char)
}

/// A key as it is shown: itself when it is plain printable text, otherwise shell-escaped
/// (`quote`) from the bytes it stands for.
pub fn show(key: &str) -> Cow<'_, str> {
    if is_text(key) && !key.chars().any(needs_escape) {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(quote(&bytes_of(key)))
    }
}

/// Name bytes quoted as `ls --quoting-style=shell-escape` does (one definition for every
/// binary: `cli_common::names`).
pub use cli_common::names::{needs_escape, quote};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(name: &[u8], shown: &str) {
        let k = key_of(name);
        assert_eq!(&*bytes_of(&k), name, "{shown}: round trip");
        assert_eq!(quote(name), shown);
    }

    #[test]
    fn names_round_trip_and_print_escaped() {
        check(b"plain.txt", "plain.txt");
        check(b"a b", "'a b'");
        check(b"it's", "'it'\\''s'");
        check(b"a\nb", "'a'$'\\n''b'");
        check(b"\x1b[31mred", "$'\\033''[31mred'");
        check(b"caf\xc3\xa9", "café");
        check(b"bad\xff", "'bad'$'\\377'");
        check(b"\xf4\x8f\xbc\x80", "'\u{10ff00}'");
        assert_eq!(
            key_of(b"caf\xc3\xa9"),
            "café",
            "UTF-8 names are their own keys"
        );
        assert!(matches!(key_of(b"a/b"), Cow::Borrowed(_)));
        assert!(!is_text(&key_of(b"bad\xff")));
        assert!(is_text(&key_of(b"a\nb")));
        assert_eq!(show("a\nb"), "'a'$'\\n''b'");
        assert_eq!(
            show("a b"),
            "a b",
            "messages keep printable keys as they are"
        );
        assert_eq!(show(&key_of(b"d/\xffx")), "'d/'$'\\377''x'");
    }

    proptest! {
        /// Every name has a key, the key gives it back, and different names never share one.
        #[test]
        fn keys_are_lossless(a in proptest::collection::vec(any::<u8>(), 0..12),
                             b in proptest::collection::vec(any::<u8>(), 0..12)) {
            let (ka, kb) = (key_of(&a), key_of(&b));
            prop_assert_eq!(&*bytes_of(&ka), &a[..]);
            prop_assert_eq!(a == b, ka == kb);
            let q = quote(&a);
            prop_assert!(!q.bytes().any(|c| c < 0x20 || c == 0x7f));
            prop_assert!(std::str::from_utf8(q.as_bytes()).is_ok());
        }
    }
}
