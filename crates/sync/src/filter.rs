//! Which keys take part: include/exclude rules, size and age limits, a key range.
//!
//! Rule matching (documented in `jfs-sync --help`), the rsync "layer by layer" way:
//! - `*` matches within one path component, `**` across components, `?` one character,
//!   `[...]` a class;
//! - a pattern without `/` (a trailing `/` aside) matches a component at any depth
//!   (`*.tmp`, `cache/`); a pattern with `/` is anchored at the top of the sync
//!   (`logs/*.gz`, a leading `/` is optional);
//! - a trailing `/` matches directories only;
//! - a key `a/b/c` is tested as `a/`, `a/b/`, then `a/b/c`. At each layer the first rule that
//!   matches decides: an exclude is final (everything below an excluded directory is
//!   excluded), an include ends that layer. A key no rule excludes is included.
//!
//! Rules are tried in the order given on the command line, includes and excludes interleaved.

use anyhow::{bail, Context, Result};
use globset::GlobMatcher;

use crate::endpoint::{Entry, Kind};

#[derive(Debug, Clone)]
struct Rule {
    include: bool,
    dir_only: bool,
    m: GlobMatcher,
}

#[derive(Debug, Default, Clone)]
pub struct Filter {
    rules: Vec<Rule>,
    pub min_size: Option<u64>,
    pub max_size: Option<u64>,
    /// Files modified more recently than this (ns since epoch) are skipped (--min-age).
    pub newest_ns: Option<i64>,
    /// Files modified before this are skipped (--max-age).
    pub oldest_ns: Option<i64>,
    pub start: Option<String>,
    pub end: Option<String>,
}

impl Filter {
    /// `rules` are (include?, pattern) in command-line order.
    pub fn new(rules: &[(bool, String)]) -> Result<Self> {
        let mut out = Vec::new();
        for (include, pat) in rules {
            if pat.is_empty() {
                bail!("empty --include/--exclude pattern");
            }
            let dir_only = pat.ends_with('/');
            let p = pat.trim_end_matches('/');
            let anchored = p.contains('/');
            let p = p.trim_start_matches('/');
            let glob = if anchored {
                p.to_string()
            } else {
                format!("**/{p}")
            };
            let m = globset::GlobBuilder::new(&glob)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .with_context(|| format!("bad pattern {pat:?}"))?
                .compile_matcher();
            out.push(Rule {
                include: *include,
                dir_only,
                m,
            });
        }
        Ok(Filter {
            rules: out,
            ..Default::default()
        })
    }

    /// The rules' verdict on a key (`dir/` keys are directories).
    pub fn key_included(&self, key: &str) -> bool {
        if self.rules.is_empty() {
            return true;
        }
        let trimmed = key.trim_end_matches('/');
        let is_dir = key.ends_with('/');
        let mut end = 0;
        loop {
            let next = trimmed[end..].find('/').map(|i| end + i);
            let (layer, layer_is_dir) = match next {
                Some(i) => (&trimmed[..i], true),
                None => (trimmed, is_dir),
            };
            for r in &self.rules {
                if r.dir_only && !layer_is_dir {
                    continue;
                }
                if r.m.is_match(layer) {
                    if !r.include {
                        return false;
                    }
                    break;
                }
            }
            match next {
                Some(i) => end = i + 1,
                None => return true,
            }
        }
    }

    pub fn in_range(&self, key: &str) -> bool {
        self.start.as_deref().is_none_or(|s| key >= s)
            && self.end.as_deref().is_none_or(|e| key <= e)
    }

    /// The whole verdict on a listed entry; size and age apply to files only.
    pub fn allows(&self, e: &Entry) -> bool {
        if !self.in_range(&e.key) || !self.key_included(&e.key) {
            return false;
        }
        if e.kind != Kind::File {
            return true;
        }
        self.min_size.is_none_or(|m| e.size >= m)
            && self.max_size.is_none_or(|m| e.size <= m)
            && self.newest_ns.is_none_or(|t| e.mtime_ns <= t)
            && self.oldest_ns.is_none_or(|t| e.mtime_ns >= t)
    }
}

/// One rsync filter rule: `+ PATTERN` / `include PATTERN` includes, `- PATTERN` /
/// `exclude PATTERN` excludes. Blank lines and `#`/`;` comments are None. Rule kinds this
/// filter does not have (merge files, `!`, protect...) are an error naming the rule.
pub fn parse_rule(line: &str) -> Result<Option<(bool, String)>> {
    let l = line.trim_end_matches(['\r', '\n']);
    let t = l.trim_start();
    if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
        return Ok(None);
    }
    let (kind, pat) = match t.split_once(' ') {
        Some((k, p)) => (k, p),
        None => bail!("filter rule {l:?}: expected \"+ PATTERN\" or \"- PATTERN\""),
    };
    let include = match kind {
        "+" | "include" => true,
        "-" | "exclude" => false,
        other => bail!(
            "filter rule {l:?}: {other:?} rules are not supported (only + and -: include and exclude)"
        ),
    };
    if pat.is_empty() {
        bail!("filter rule {l:?} has no pattern");
    }
    Ok(Some((include, pat.to_string())))
}

/// Patterns of an --include-from/--exclude-from file: one per line, `#` comments.
pub fn patterns(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// A --files-from line as a key relative to the source: "./a/b" and "/a/b" (as `find`
/// writes them) are "a/b"; blank lines and comments are None.
pub fn files_from_key(line: &str) -> Option<String> {
    let l = line.trim();
    if l.is_empty() || l.starts_with('#') {
        return None;
    }
    let k = l.trim_start_matches("./").trim_start_matches('/');
    let k = k.strip_prefix("./").unwrap_or(k);
    (!k.is_empty() && k != ".").then(|| k.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rules: &[(bool, &str)], cases: &[(&str, bool)]) {
        let r: Vec<(bool, String)> = rules.iter().map(|(i, p)| (*i, p.to_string())).collect();
        let f = Filter::new(&r).unwrap();
        for (key, want) in cases {
            assert_eq!(f.key_included(key), *want, "rules {rules:?}, key {key}");
        }
    }

    #[test]
    fn rsync_rules_and_pattern_files_parse() {
        assert_eq!(parse_rule("+ *.gz").unwrap(), Some((true, "*.gz".into())));
        assert_eq!(
            parse_rule("- /tmp/").unwrap(),
            Some((false, "/tmp/".into()))
        );
        assert_eq!(
            parse_rule("exclude cache/").unwrap(),
            Some((false, "cache/".into()))
        );
        assert_eq!(parse_rule("# note").unwrap(), None);
        assert_eq!(parse_rule("   ").unwrap(), None);
        assert!(parse_rule(": .rsync-filter").is_err());
        assert!(parse_rule("*.gz").is_err());
        assert_eq!(patterns("a\n# c\n\n*.tmp\r\n"), vec!["a", "*.tmp"]);
        assert_eq!(files_from_key("./a/b").as_deref(), Some("a/b"));
        assert_eq!(files_from_key("/a/b").as_deref(), Some("a/b"));
        assert_eq!(files_from_key("a").as_deref(), Some("a"));
        assert_eq!(files_from_key("."), None);
        assert_eq!(files_from_key("# x"), None);
    }

    #[test]
    fn patterns_without_slash_match_any_component() {
        check(
            &[(false, "*.tmp")],
            &[
                ("a.tmp", false),
                ("d/e/a.tmp", false),
                ("a.tmp.x", true),
                ("x/a.txt", true),
            ],
        );
        check(
            &[(false, "cache/")],
            &[
                ("cache/", false),
                ("cache/x", false),
                ("a/cache/x", false),
                ("cache", true),
            ],
        );
    }

    #[test]
    fn patterns_with_slash_are_anchored_and_star_stays_in_a_component() {
        check(
            &[(false, "logs/*.gz")],
            &[
                ("logs/a.gz", false),
                ("logs/x/a.gz", true),
                ("y/logs/a.gz", true),
            ],
        );
        check(
            &[(false, "/logs/**")],
            &[("logs/x/a.gz", false), ("logsx/a", true)],
        );
    }

    #[test]
    fn layer_by_layer_first_match_wins() {
        // include *.txt, exclude everything else: but "*" excludes directory layers first,
        // exactly as rsync does, unless directories are included explicitly.
        check(
            &[(true, "*.txt"), (false, "*")],
            &[("a.txt", true), ("a.bin", false), ("d/a.txt", false)],
        );
        check(
            &[(true, "*/"), (true, "*.txt"), (false, "*")],
            &[("d/a.txt", true), ("d/a.bin", false), ("d/e/f.txt", true)],
        );
        // an excluded directory excludes all below it, whatever later layers say
        check(
            &[(false, "secret/"), (true, "*.txt")],
            &[("secret/a.txt", false), ("open/a.txt", true)],
        );
        // order matters: the first matching rule of a layer decides
        check(
            &[(true, "keep.log"), (false, "*.log")],
            &[("keep.log", true), ("other.log", false)],
        );
        check(
            &[(false, "*.log"), (true, "keep.log")],
            &[("keep.log", false)],
        );
    }

    #[test]
    fn size_age_and_range() {
        let mut f = Filter::new(&[]).unwrap();
        f.min_size = Some(10);
        f.max_size = Some(100);
        f.start = Some("b".into());
        f.end = Some("m".into());
        let e = |k: &str, size| Entry {
            key: k.into(),
            kind: Kind::File,
            size,
            mtime_ns: 0,
            mode: None,
            target: None,
            owner: None,
        };
        assert!(f.allows(&e("c", 50)));
        assert!(!f.allows(&e("c", 5)));
        assert!(!f.allows(&e("c", 500)));
        assert!(!f.allows(&e("a", 50)));
        assert!(!f.allows(&e("n", 50)));
    }
}
