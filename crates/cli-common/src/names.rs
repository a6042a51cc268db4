//! Names as a person reads them: `quote` shell-escapes the bytes of a file name (or a path)
//! as `ls --quoting-style=shell-escape` does, so that a log line or a listing never holds a
//! raw control byte or a byte that is not UTF-8, and pasting it into a shell gives the name
//! back. `jfs ls`, `jfs-sync` and the mount's log lines print names this way.

/// Characters never printed as they are.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{200e}' | '\u{200f}'
        )
}

/// Characters that may stand unquoted in a shell word (`ls`'s set).
fn shell_safe(c: char) -> bool {
    c.is_alphanumeric() && !needs_escape(c) || "%+,-./:=@_^".contains(c)
}

/// Name bytes quoted as `ls --quoting-style=shell-escape` does: as they are when every
/// character is safe in a shell word; in single quotes when all are printable; otherwise
/// printable runs in single quotes and each other byte as `$'\n'`, `$'\033'`, `$'\377'`, so
/// that the output never holds a raw control byte or a byte that is not UTF-8, and pasting
/// it into a shell gives the name back.
pub fn quote(name: &[u8]) -> String {
    let printable = std::str::from_utf8(name)
        .ok()
        .filter(|s| !s.chars().any(needs_escape));
    if let Some(s) = printable {
        if !s.is_empty() && s.chars().all(shell_safe) {
            return s.to_string();
        }
        return format!("'{}'", s.replace('\'', "'\\''"));
    }
    let mut out = String::new();
    let mut run = String::new(); // printable text waiting for its quotes
    let flush = |run: &mut String, out: &mut String| {
        if !run.is_empty() {
            out.push('\'');
            out.push_str(&run.replace('\'', "'\\''"));
            out.push('\'');
            run.clear();
        }
    };
    let escaped = |b: u8| -> String {
        match b {
            b'\n' => "\\n".into(),
            b'\t' => "\\t".into(),
            b'\r' => "\\r".into(),
            0x07 => "\\a".into(),
            0x08 => "\\b".into(),
            0x0b => "\\v".into(),
            0x0c => "\\f".into(),
            b => format!("\\{b:03o}"),
        }
    };
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if needs_escape(c) {
                flush(&mut run, &mut out);
                let mut buf = [0u8; 4];
                let s: String = c.encode_utf8(&mut buf).bytes().map(escaped).collect();
                out.push_str(&format!("$'{s}'"));
            } else {
                run.push(c);
            }
        }
        if !chunk.invalid().is_empty() {
            flush(&mut run, &mut out);
            let s: String = chunk.invalid().iter().copied().map(escaped).collect();
            out.push_str(&format!("$'{s}'"));
        }
    }
    flush(&mut run, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::quote;

    fn check(name: &[u8], shown: &str) {
        assert_eq!(quote(name), shown, "{name:?}");
    }

    #[test]
    fn names_print_shell_escaped() {
        check(b"plain.txt", "plain.txt");
        check(b"/dir/f", "/dir/f");
        check(b"a b", "'a b'");
        check(b"it's", "'it'\\''s'");
        check(b"a\nb", "'a'$'\\n''b'");
        check(b"\x1b[31mred", "$'\\033''[31mred'");
        check(b"caf\xc3\xa9", "caf\u{e9}");
        check(b"/d/bad\xff", "'/d/bad'$'\\377'");
    }
}
