//! Runbooks run by tests: each step of `runbooks/<name>.md` is a fenced `sh` block whose
//! first line is `# step: NAME`; a test runs the block as written (bash, `set -euo pipefail`,
//! the workspace's binaries first on PATH), so the document and the test cannot drift.

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
