//! Namespace commands: ls, stat, cat, mkdir, rm, mv, ln, truncate.

use super::{parent_of, Outcome};
use anyhow::{bail, Context, Result};
use fs_core::{Attr, ErrorKind, FileKind, Fs, Ino, Owner, SetAttr, VolPath};
use std::io::Write;
use sync::names::quote;

fn mode_string(a: &Attr) -> String {
    let k = match a.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDev => 'c',
        FileKind::BlockDev => 'b',
    };
    let mut s = String::from(k);
    for shift in [6, 3, 0] {
        let m = (a.mode >> shift) & 7;
        s.push(if m & 4 != 0 { 'r' } else { '-' });
        s.push(if m & 2 != 0 { 'w' } else { '-' });
        s.push(if m & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn mtime_str(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// List directory `ino` (at volume path `path`, bytes). Names are printed as `ls
/// --quoting-style=shell-escape` does (`sync::names::quote`): never a raw newline, escape
/// sequence or byte that is not UTF-8. Temporary files of unfinished puts and gets
/// (`.NAME.jfs-tmp-*`, exactly the form they make) are not listed.
fn list_dir<'a>(
    fs: &'a Fs,
    path: &'a [u8],
    ino: Ino,
    long: bool,
    recursive: bool,
    out: &'a mut Vec<u8>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    Box::pin(async move {
        if recursive {
            writeln!(out, "{}:", quote(path))?;
        }
        let entries = fs.readdir_all(ino).await?;
        let mut subdirs = Vec::new();
        for e in &entries {
            if super::transfer::is_tmp_entry(&e.name) {
                continue; // an unfinished put or get
            }
            let name = quote(&e.name);
            if long {
                let a = fs.getattr(e.ino).await?;
                let target = if a.kind == FileKind::Symlink {
                    format!(" -> {}", quote(&fs.readlink(e.ino).await?))
                } else {
                    String::new()
                };
                writeln!(
                    out,
                    "{} {:>3} {:>5} {:>5} {:>12} {} {:>8} {name}{target}",
                    mode_string(&a),
                    a.nlink,
                    a.uid,
                    a.gid,
                    a.length,
                    mtime_str(a.mtime),
                    e.ino
                )?;
            } else {
                writeln!(out, "{name}")?;
            }
            if recursive && e.kind == FileKind::Dir {
                let mut p = path.strip_suffix(b"/").unwrap_or(path).to_vec();
                p.push(b'/');
                p.extend_from_slice(&e.name);
                subdirs.push((p, e.ino));
            }
        }
        for (p, i) in subdirs {
            writeln!(out)?;
            list_dir(fs, &p, i, long, recursive, out).await?;
        }
        Ok(())
    })
}

pub async fn ls(fs: &Fs, path: &VolPath, long: bool, recursive: bool) -> Result<Outcome> {
    let (ino, attr) = fs.resolve_path(path).await.map_err(|e| at(path, "ls", e))?;
    let mut out = Vec::new();
    if attr.kind == FileKind::Dir {
        list_dir(
            fs,
            path.to_string().as_bytes(),
            ino,
            long,
            recursive,
            &mut out,
        )
        .await?;
    } else if long {
        writeln!(
            out,
            "{} {:>3} {:>5} {:>5} {:>12} {} {:>8} {}",
            mode_string(&attr),
            attr.nlink,
            attr.uid,
            attr.gid,
            attr.length,
            mtime_str(attr.mtime),
            ino,
            quote(path.to_string().as_bytes())
        )?;
    } else {
        writeln!(out, "{}", quote(path.to_string().as_bytes()))?;
    }
    std::io::stdout().write_all(&out)?;
    Ok(Outcome::Done)
}

pub async fn stat(fs: &Fs, path: &VolPath) -> Result<Outcome> {
    let (ino, a) = fs
        .resolve_path(path)
        .await
        .map_err(|e| at(path, "stat", e))?;
    let mut v = serde_json::to_value(&a)?;
    v["ino"] = ino.into();
    v["path"] = path.to_string().into();
    if a.kind == FileKind::Symlink {
        // Bytes are not lost: a target that is not UTF-8, or holds control bytes, is shown
        // shell-escaped as `jfs ls` shows it (`'tar'$'\377''get'`); other targets as they are.
        let t = fs.readlink(ino).await?;
        v["target"] = match std::str::from_utf8(&t) {
            Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
            _ => quote(&t),
        }
        .into();
    }
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(Outcome::Done)
}

pub async fn cat(fs: &Fs, path: &VolPath) -> Result<Outcome> {
    let (ino, a) = fs
        .resolve_path(path)
        .await
        .map_err(|e| at(path, "cat", e))?;
    if a.kind != FileKind::File {
        bail!("{path} is not a regular file");
    }
    let mut out = std::io::stdout().lock();
    let step = fs.settings().block_size as usize * 4;
    let mut off = 0u64;
    while off < a.length {
        let buf = fs
            .read(ino, off, step)
            .await
            .with_context(|| format!("reading {path} at {off}"))?;
        if buf.is_empty() {
            break;
        }
        if let Err(e) = out.write_all(&buf) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(Outcome::Done);
            }
            return Err(e.into());
        }
        off += buf.len() as u64;
    }
    Ok(Outcome::Done)
}

pub async fn mkdir(fs: &Fs, path: &VolPath, parents: bool) -> Result<Outcome> {
    if !parents {
        let (p, name) = parent_of(fs, path, "mkdir").await?;
        fs.mkdir(p, name.as_bytes(), 0o755, caller())
            .await
            .map_err(|e| at(path, "mkdir", e))?;
        return Ok(Outcome::Done);
    }
    let mut cur = fs_core::ROOT_INO;
    for comp in path.parts() {
        cur = match fs.mkdir(cur, comp.as_bytes(), 0o755, caller()).await {
            Ok((ino, _)) => ino,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let (ino, a) = fs.lookup(cur, comp.as_bytes()).await?;
                if a.kind != FileKind::Dir {
                    bail!("mkdir -p {path}: {comp} exists and is not a directory");
                }
                ino
            }
            Err(e) => return Err(e).with_context(|| format!("mkdir {path}")),
        };
    }
    Ok(Outcome::Done)
}

fn remove_tree(fs: &Fs, dir: Ino) -> futures::future::BoxFuture<'_, Result<()>> {
    Box::pin(async move {
        loop {
            let page = fs.readdir(dir, None, 1000).await?;
            if page.is_empty() {
                return Ok(());
            }
            for e in page {
                if e.kind == FileKind::Dir {
                    remove_tree(fs, e.ino).await?;
                    fs.rmdir(dir, &e.name).await?;
                } else {
                    fs.unlink(dir, &e.name).await?;
                }
            }
        }
    })
}

/// fs-core's error in the words of a path-based command: the path the user typed (not an
/// inode number) and, where there is one, what to do instead. The commands that go through
/// a mount (`through.rs`) give their errors the same words.
pub fn at(path: &VolPath, op: &str, e: fs_core::Error) -> anyhow::Error {
    let what = match e.kind() {
        ErrorKind::NotEmpty if op == "rm" => format!(
            "{path} is a directory that is not empty: `jfs rm -r` removes it with everything under it"
        ),
        ErrorKind::NotEmpty => format!("{path}: directory not empty"),
        ErrorKind::NotFound => format!("{path}: no such file or directory"),
        ErrorKind::AlreadyExists => format!("{path} already exists"),
        ErrorKind::IsDir => format!("{path} is a directory"),
        ErrorKind::NotDir if op == "truncate" => format!(
            "{path}: a component is not a directory, or {path} is a symbolic link (not followed)"
        ),
        ErrorKind::NotDir => format!("{path}: a component is not a directory"),
        ErrorKind::InvalidArgument if op == "mv" => {
            format!("{path}: a directory cannot be moved into itself or below itself")
        }
        ErrorKind::PermissionDenied if op == "ln" => {
            format!("{path}: not permitted (a hard link cannot name a directory)")
        }
        _ => return anyhow::Error::new(e).context(format!("{op} {path}")),
    };
    anyhow::anyhow!("{op}: {what}")
}

/// `dir_only`: the path was given with a trailing slash, which names a directory only.
pub async fn rm(fs: &Fs, path: &VolPath, recursive: bool, dir_only: bool) -> Result<Outcome> {
    let (p, name) = parent_of(fs, path, "rm").await?;
    let (ino, a) = fs
        .lookup(p, name.as_bytes())
        .await
        .map_err(|e| at(path, "rm", e))?;
    if dir_only && a.kind != FileKind::Dir {
        bail!("{}", not_a_dir(path));
    }
    if a.kind == FileKind::Dir {
        if recursive {
            remove_tree(fs, ino)
                .await
                .with_context(|| format!("rm -r {path}"))?;
        }
        fs.rmdir(p, name.as_bytes())
            .await
            .map_err(|e| at(path, "rm", e))?;
    } else {
        fs.unlink(p, name.as_bytes())
            .await
            .map_err(|e| at(path, "rm", e))?;
    }
    Ok(Outcome::Done)
}

/// The refusal of `rm PATH/` where PATH is not a directory.
pub fn not_a_dir(path: &VolPath) -> String {
    format!("rm {path}/: not a directory (a trailing slash names a directory; to remove this link or file, give {path} without the slash)")
}

pub async fn mv(fs: &Fs, src: &VolPath, dst: &VolPath, no_clobber: bool) -> Result<Outcome> {
    let (sp, sname) = parent_of(fs, src, "mv").await?;
    // Like mv(1): into an existing directory keeps the name.
    let (dp, dname) = match fs.resolve_path(dst).await {
        Ok((ino, a)) if a.kind == FileKind::Dir => (ino, sname.clone()),
        _ => parent_of(fs, dst, "mv").await?,
    };
    fs.rename(sp, sname.as_bytes(), dp, dname.as_bytes(), no_clobber)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => at(src, "mv", e),
            _ => at(dst, "mv", e),
        })?;
    Ok(Outcome::Done)
}

/// What `ln` links to.
pub enum LinkTarget {
    /// `ln -s`: text kept as it is, resolved by whoever follows the link.
    Text(String),
    /// `ln`: an entry of the volume.
    Path(VolPath),
}

pub async fn ln(fs: &Fs, target: &LinkTarget, link: &VolPath) -> Result<Outcome> {
    let (p, name) = parent_of(fs, link, "ln").await?;
    match target {
        LinkTarget::Text(t) => {
            fs.symlink(p, name.as_bytes(), t.as_bytes(), caller())
                .await
                .map_err(|e| at(link, "ln -s", e))?;
        }
        LinkTarget::Path(t) => {
            let (ino, _) = fs.resolve_path(t).await.map_err(|e| at(t, "ln", e))?;
            fs.link(ino, p, name.as_bytes())
                .await
                .map_err(|e| at(link, "ln", e))?;
        }
    }
    Ok(Outcome::Done)
}

pub async fn truncate(fs: &Fs, path: &VolPath, size: u64) -> Result<Outcome> {
    let (ino, _) = fs
        .resolve_path(path)
        .await
        .map_err(|e| at(path, "truncate", e))?;
    fs.setattr(
        ino,
        &SetAttr {
            length: Some(size),
            ..Default::default()
        },
    )
    .await
    .with_context(|| format!("truncate {path}"))?;
    Ok(Outcome::Done)
}

/// What `mkdir` and `ln -s` record as the owner of what they make: the user who ran them (as
/// a mount records the calling process's), never root for everybody.
fn caller() -> Owner {
    Owner {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

/// `jfs clone`: a metadata-only copy (`fs_core::fs::clone`).
pub async fn clone(
    fs: &Fs,
    src: &VolPath,
    dst: &VolPath,
    into: bool,
    json: bool,
) -> Result<Outcome> {
    let session = fs_core::maint::own_session(&**fs.engine())
        .await
        .context("jfs clone: this process has no session in the volume's metadata (needed so that gc can drop a killed clone's copy)")?;
    let t = std::time::Instant::now();
    let (to, rep) = fs.clone_path(src, dst, into, &session).await.map_err(|e| {
        anyhow::anyhow!(
            "clone {} {}: {e}",
            quote(src.to_string().as_bytes()),
            quote(dst.to_string().as_bytes())
        )
    })?;
    print_clone(src, &to.to_string(), &rep, t.elapsed(), json);
    Ok(Outcome::Done)
}

/// The line (or JSON) a clone reports.
pub fn print_clone(
    src: &VolPath,
    to: &str,
    rep: &fs_core::fs::clone::CloneReport,
    took: std::time::Duration,
    json: bool,
) {
    let secs = took.as_secs_f64().max(1e-6);
    if json {
        let mut v = serde_json::to_value(rep).unwrap_or_default();
        v["src"] = serde_json::Value::from(src.to_string());
        v["dst"] = serde_json::Value::from(to);
        v["seconds"] = serde_json::Value::from(secs);
        v["entries_per_s"] = serde_json::Value::from(rep.entries as f64 / secs);
        println!("{v}");
    } else {
        println!(
            "cloned {} to {}: {} entries ({} files, {} directories), {} bytes shared, no block copied; the source as of journal entry {}; {:.2} s ({:.0} entries/s)",
            quote(src.to_string().as_bytes()),
            quote(to.as_bytes()),
            rep.entries,
            rep.files,
            rep.dirs,
            rep.bytes,
            rep.at_seq,
            secs,
            rep.entries as f64 / secs
        );
    }
}
