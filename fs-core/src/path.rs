//! Paths inside a volume, as users give them (CLI arguments, `jfs://` URLs, the control
//! socket): resolved lexically inside the volume before anything looks them up or joins them
//! onto a host path. `.` and empty parts are dropped, `..` takes the parent, and a `..` that
//! would climb above the volume's root is refused: it never means the root again, and never
//! anything outside it.

use crate::error::{Error, ErrorKind, Result};
use std::fmt;

/// A normalized volume path: the names from the root down, none empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VolPath {
    parts: Vec<String>,
}

impl VolPath {
    /// The volume's root.
    pub fn root() -> Self {
        VolPath::default()
    }

    /// Resolve `path` ("/a/b", "a/b", "/a/../b/."; "" and "/" are the root) inside the volume.
    pub fn parse(path: &str) -> Result<Self> {
        if path.contains('\0') {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("volume path {path:?} contains a NUL byte"),
            ));
        }
        let mut parts: Vec<String> = Vec::new();
        for comp in path.split('/') {
            match comp {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(Error::new(
                            ErrorKind::InvalidArgument,
                            format!(
                                "volume path {path:?} climbs above the volume's root with `..`: \
                                 paths are resolved inside the volume; give the path from its root (/...)"
                            ),
                        ));
                    }
                }
                name => parts.push(name.to_string()),
            }
        }
        Ok(VolPath { parts })
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The names from the root down.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The last name, unless this is the root.
    pub fn name(&self) -> Option<&str> {
        self.parts.last().map(String::as_str)
    }

    /// The parent directory and the last name; `None` for the root.
    pub fn split_last(&self) -> Option<(VolPath, &str)> {
        let (last, dir) = self.parts.split_last()?;
        Some((
            VolPath {
                parts: dir.to_vec(),
            },
            last.as_str(),
        ))
    }

    /// This path with `name` appended (a single name: no `/`, not `.` or `..`).
    pub fn join(&self, name: &str) -> Result<VolPath> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{name:?} is not a file name"),
            ));
        }
        let mut parts = self.parts.clone();
        parts.push(name.to_string());
        Ok(VolPath { parts })
    }

    /// Whether `self` is `other` or inside it.
    pub fn starts_with(&self, other: &VolPath) -> bool {
        self.parts.starts_with(&other.parts)
    }
}

impl fmt::Display for VolPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("/");
        }
        for p in &self.parts {
            write!(f, "/{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::VolPath;

    fn check(input: &str, expected: Option<&str>) {
        let got = VolPath::parse(input).ok().map(|p| p.to_string());
        assert_eq!(got.as_deref(), expected, "{input:?}");
    }

    #[test]
    fn paths_resolve_inside_the_volume() {
        check("", Some("/"));
        check("/", Some("/"));
        check("//a//b/", Some("/a/b"));
        check("a/b", Some("/a/b"));
        check("/a/./b/.", Some("/a/b"));
        check("/a/../b", Some("/b"));
        check("/src/..", Some("/"));
        check("/a/b/../../c", Some("/c"));
        check("/..", None);
        check("/../victim", None);
        check("..", None);
        check("/a/../../etc", None);
        check("/../../../etc", None);
        check("/a/b/../../..", None);
        check("/a\0b", None);
    }

    #[test]
    fn split_and_join() {
        let p = VolPath::parse("/a/b").unwrap();
        let (dir, name) = p.split_last().unwrap();
        assert_eq!((dir.to_string().as_str(), name), ("/a", "b"));
        assert!(VolPath::root().split_last().is_none());
        assert_eq!(dir.join("c").unwrap().to_string(), "/a/c");
        assert!(dir.join("..").is_err() && dir.join("x/y").is_err() && dir.join("").is_err());
        assert!(p.starts_with(&dir) && !dir.starts_with(&p));
    }

    proptest::proptest! {
        /// Whatever the input, a parsed path has only plain names: nothing to climb with.
        #[test]
        fn parsed_paths_have_only_plain_names(s in "[a./]{0,24}") {
            if let Ok(p) = VolPath::parse(&s) {
                for n in p.parts() {
                    proptest::prop_assert!(!n.is_empty() && n != "." && n != ".." && !n.contains('/'));
                }
                // Parsing is idempotent.
                proptest::prop_assert_eq!(VolPath::parse(&p.to_string()).unwrap(), p);
            }
        }
    }
}
