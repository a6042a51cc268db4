//! `jfs trash`, `jfs restore` and `jfs config`: the trash (`fs_core::fs::trash`) seen and
//! undone from the command line, and the settings that rule it. Root only: the trash holds
//! every user's deleted names and data.

use super::{mount, open_fs, vol_path, Outcome};
use crate::cli::Global;
use anyhow::{bail, Context, Result};
use fs_core::fs::trash::{fmt_time, Pick};
use fs_core::Fs;
use std::time::Duration;

/// Refuse anyone but root, naming the command.
pub fn root_only(what: &str) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("{what} is for root only: the trash holds every user's deleted files and names; run it as root (sudo)");
    }
    Ok(())
}

/// The writer a restore or a settings change needs: refused at a mirror (run it at the
/// primary) and beside a RocksDB volume's read-write mount (unmount it first).
async fn writer(g: &Global, meta_url: &str, what: &str) -> Result<Fs> {
    match mount::writer_or_mount(g, meta_url)
        .await
        .with_context(|| format!("{what}: opening the volume to write (at a mirror site, run {what} at the primary: it reaches every mirror through the journal)"))?
    {
        Ok(fs) => Ok(fs),
        Err(mp) => bail!(
            "{what}: the volume is mounted read-write at {} (its one writer): unmount it with `jfs umount {}`, run {what}, and mount it again",
            cli_common::names::quote(mp.as_os_str().as_encoded_bytes()),
            cli_common::names::quote(mp.as_os_str().as_encoded_bytes())
        ),
    }
}

/// `jfs trash META [--path P]`: the entries, oldest first.
pub async fn list(g: &Global, meta_url: &str, path: Option<&str>, json: bool) -> Result<Outcome> {
    root_only("jfs trash")?;
    let top = path.map(vol_path).transpose()?;
    let fs = open_fs(g, meta_url, true).await?;
    let all = fs.trash_list().await?;
    let shown: Vec<_> = all
        .iter()
        .filter(|e| {
            top.as_ref()
                .is_none_or(|t| e.is_under(t.to_string().as_bytes()))
        })
        .collect();
    if json {
        let v: Vec<serde_json::Value> = shown
            .iter()
            .map(|e| {
                serde_json::json!({
                    "time": fmt_time(e.info.at_ns), "at_ns": e.info.at_ns, "seq": e.seq,
                    "ino": e.ino, "kind": e.info.kind, "why": e.info.why, "size": e.info.size,
                    "mode": format!("{:04o}", e.mode),
                    "path": fs_core::maint::encode_name(&e.path),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(Outcome::Done);
    }
    for e in &shown {
        println!(
            "{}  seq {:<8} {:<8} {:<11} {:>14}  {}",
            fmt_time(e.info.at_ns),
            e.seq,
            format!("{:?}", e.info.kind).to_lowercase(),
            e.info.why.as_str(),
            e.info.size,
            cli_common::names::quote(&e.path)
        );
    }
    let bytes: u64 = shown.iter().map(|e| e.info.size).sum();
    eprintln_summary(shown.len(), bytes, fs.settings().trash_secs);
    Ok(Outcome::Done)
}

fn eprintln_summary(n: usize, bytes: u64, secs: u64) {
    cli_common::eprintln!(
        "{n} entries, {bytes} bytes in the trash (trash time {})",
        humantime::format_duration(Duration::from_secs(secs))
    );
}

/// `--at TIME`: RFC 3339 (`2026-11-28T18:00:00Z`, or without the zone as UTC).
pub fn parse_at(s: &str) -> Result<i64> {
    let t = humantime::parse_rfc3339_weak(s).with_context(|| {
        format!(
            "--at {s:?} is not a time: give it as 2026-11-28T18:00:00Z (UTC), as `jfs trash` shows"
        )
    })?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0))
}

pub struct RestoreArgs<'a> {
    pub path: Option<&'a str>,
    pub version: Option<&'a str>,
    pub at: Option<&'a str>,
    pub seq: Option<u64>,
    pub put_back: bool,
    pub json: bool,
}

/// `jfs restore`: exit 0 when everything came back, 1 when something was skipped (named).
pub async fn restore(g: &Global, meta_url: &str, a: RestoreArgs<'_>) -> Result<Outcome> {
    root_only("jfs restore")?;
    let pick = match (a.at, a.seq) {
        (Some(t), _) => Pick::At(parse_at(t)?),
        (None, Some(n)) => Pick::Seq(n),
        (None, None) => Pick::Latest,
    };
    let r = match (a.path, a.version) {
        (Some(p), None) => {
            let p = vol_path(p)?;
            let fs = writer(g, meta_url, "jfs restore").await?;
            fs.restore_path(&p, pick, a.put_back)
                .await
                .with_context(|| format!("restore {p}"))?
        }
        (None, Some(p)) => {
            if a.put_back {
                bail!("--put-back goes with --path: --version always brings the content back at its path");
            }
            let p = vol_path(p)?;
            let fs = writer(g, meta_url, "jfs restore").await?;
            fs.restore_version(&p, pick)
                .await
                .with_context(|| format!("restore --version {p}"))?
        }
        _ => bail!("jfs restore needs --path P (a deleted file or tree) or --version P (the previous content of file P)"),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "restored {} entries to {}",
            r.restored,
            cli_common::names::quote(r.to.as_bytes())
        );
        for (p, why) in &r.skipped {
            println!("skipped {}: {why}", cli_common::names::quote(p.as_bytes()));
        }
    }
    Ok(if r.skipped.is_empty() {
        Outcome::Done
    } else {
        Outcome::Partial
    })
}

/// `--trash-max-bytes`: a size, or `none`.
pub fn parse_cap(s: &str) -> Result<Option<u64>, String> {
    if s == "none" {
        return Ok(None);
    }
    fs_core::parse_size(s)
        .map(Some)
        .map_err(|e| format!("{e} (or `none`: no cap)"))
}

/// `jfs config META [--trash D] [--trash-max-bytes SIZE|none]`: a journaled settings change
/// (mirrors follow). Without a flag it prints the settings.
pub async fn config(
    g: &Global,
    meta_url: &str,
    trash: Option<Duration>,
    cap: Option<Option<u64>>,
) -> Result<Outcome> {
    if trash.is_none() && cap.is_none() {
        let fs = open_fs(g, meta_url, true).await?;
        println!("{}", serde_json::to_string_pretty(fs.settings())?);
        return Ok(Outcome::Done);
    }
    root_only("jfs config")?;
    let mut fs = writer(g, meta_url, "jfs config").await?;
    let mut what = Vec::new();
    if let Some(t) = trash {
        what.push(format!("trash {}", humantime::format_duration(t)));
    }
    if let Some(c) = cap {
        what.push(match c {
            Some(n) => format!("trash-max-bytes {n}"),
            None => "trash-max-bytes none".into(),
        });
    }
    let what = what.join(", ");
    let seq = fs
        .update_settings(&what, |s| {
            if let Some(t) = trash {
                s.trash_secs = t.as_secs();
            }
            if let Some(c) = cap {
                s.trash_max_bytes = c;
            }
        })
        .await?;
    println!("settings changed at seq {seq}: {what}");
    Ok(Outcome::Done)
}
