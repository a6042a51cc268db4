//! Runbooks run by tests: each step of `runbooks/<name>.md` is a fenced `sh` block whose
//! first line is `# step: NAME`; a test runs the block as written (bash, `set -euo pipefail`,
//! the workspace's binaries first on PATH), so the document and the test cannot drift. What
//! an operator should see is a fenced `text` block whose first line is `# expect: NAME`
//! (`$VAR` stands for the step's variable, `…` for any text): `run_checked` compares it
//! with what the step printed.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The blocks of a runbook, by step name, in document order.
pub fn steps(runbook: &str) -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../runbooks")
        .join(format!("{runbook}.md"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "```sh" {
            continue;
        }
        let mut block = Vec::new();
        for b in lines.by_ref() {
            if b.trim() == "```" {
                break;
            }
            block.push(b);
        }
        if let Some(name) = block.first().and_then(|f| f.trim().strip_prefix("# step:")) {
            out.push((name.trim().to_string(), block[1..].join("\n")));
        }
    }
    out
}

/// Run step `name` of runbook `runbook` with `env`; its output (the caller asserts).
pub fn run(runbook: &str, name: &str, env: &[(&str, &str)]) -> Output {
    let (_, script) = steps(runbook)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("runbooks/{runbook}.md has no `# step: {name}` block"));
    let bin_dir = crate::bin("jfs").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // JFS_RUNBOOK_TRACE=1: every command echoed with a timestamp (to find a slow step).
    let trace = if std::env::var_os("JFS_RUNBOOK_TRACE").is_some() {
        "PS4='+ $(date +%T.%N) '; set -x\n"
    } else {
        ""
    };
    let mut c = Command::new("bash");
    c.args(["-c", &format!("set -euo pipefail\n{trace}{script}")])
        .env("PATH", path);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running bash")
}

/// `run`, which must succeed; its stdout and stderr together.
pub fn run_ok(runbook: &str, name: &str, env: &[(&str, &str)]) -> String {
    let o = run(runbook, name, env);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success(),
        "runbooks/{runbook}.md step {name} failed ({}):\n{text}",
        o.status
    );
    text
}

/// The expected output of step `name`: the ```text block of `runbooks/<runbook>.md` whose
/// first line is `# expect: NAME`, its lines after that one.
pub fn expected(runbook: &str, name: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../runbooks")
        .join(format!("{runbook}.md"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "```text" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|b| b.trim() != "```").collect();
        if block
            .first()
            .and_then(|f| f.trim().strip_prefix("# expect:"))
            .map(str::trim)
            == Some(name)
        {
            return block[1..].iter().map(|s| s.to_string()).collect();
        }
    }
    panic!("runbooks/{runbook}.md has no `# expect: {name}` block")
}

/// Whether output line `got` matches expected line `want`: `want` with `$VAR`s replaced
/// from `env`, where `…` stands for any text (possibly none); surrounding spaces ignored.
pub fn line_matches(want: &str, got: &str, env: &[(&str, &str)]) -> bool {
    let mut w = want.trim().to_string();
    // Longest names first, so that $OLD_SITE is not read as $OLD followed by _SITE.
    let mut vars: Vec<&(&str, &str)> = env.iter().collect();
    vars.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    for (k, v) in vars {
        w = w.replace(&format!("${k}"), v);
    }
    let got = got.trim();
    let parts: Vec<&str> = w.split('…').collect();
    let mut at = 0;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            if !got.starts_with(p) {
                return false;
            }
            at = p.len();
        } else if i == parts.len() - 1 {
            return got.len() >= at + p.len() && got[at..].ends_with(p);
        } else {
            match got[at..].find(p) {
                Some(j) => at += j + p.len(),
                None => return false,
            }
        }
    }
    at == got.len()
}

/// Run step `name` of `runbook`, which must succeed, and compare what it printed with the
/// runbook's `# expect: NAME` block: each expected line matches a line of the output, in
/// order. The output, for further assertions.
pub fn run_checked(runbook: &str, name: &str, env: &[(&str, &str)]) -> String {
    let out = run_ok(runbook, name, env);
    let want = expected(runbook, name);
    let got: Vec<&str> = out.lines().collect();
    let mut i = 0;
    for w in &want {
        match got[i..].iter().position(|g| line_matches(w, g, env)) {
            Some(j) => i += j + 1,
            None => panic!(
                "runbooks/{runbook}.md step {name}: the output has no line like\n  {w}\n(after line {i}); it printed:\n{out}"
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::line_matches;

    #[test]
    fn expected_lines_match_with_variables_and_gaps() {
        let env = [("OLD_SITE", "old-site"), ("OLD", "x")];
        for (want, got, ok) in [
            ("epoch       1", "epoch       1", true),
            ("epoch       1", "epoch       10", false),
            (
                "site        primary …",
                "site        primary (promoted from mirror \"m\")",
                true,
            ),
            (
                "site        primary …",
                "site        mirror \"m\" of …",
                false,
            ),
            (
                "site        mirror \"$OLD_SITE\" of …",
                "site        mirror \"old-site\" of the primary at 1:2",
                true,
            ),
            ("a … c … e", "a b c d e", true),
            ("a … c … e", "a b d e", false),
            ("…", "anything", true),
        ] {
            assert_eq!(line_matches(want, got, &env), ok, "{want:?} vs {got:?}");
        }
    }
}
