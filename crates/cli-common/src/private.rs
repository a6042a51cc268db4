//! Directories of this user's alone. What the binaries keep on the host (a job's resume
//! state, an agent's state, run files) names the volume's files and sometimes holds its
//! secrets: it is created owner-only (0700, whatever the umask), and a directory found in
//! its place is used only if it is this user's and no one else may add to it (a shared
//! `/tmp` lets another user plant a directory or a symbolic link at a predictable name).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Create `dir` and its missing parents owner-only (0700); existing ones are left alone.
pub fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What is wrong with `dir` (its lstat `m`) as a directory of this user's alone, if anything.
pub fn private_dir_problem(dir: &Path, m: &std::fs::Metadata) -> Option<String> {
    let me = rustix::process::geteuid().as_raw();
    if m.file_type().is_symlink() {
        return Some(format!("{} is a symbolic link", dir.display()));
    }
    if !m.is_dir() {
        return Some(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != me {
        return Some(format!(
            "{} belongs to uid {}, not to this user (uid {me})",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Some(format!(
            "{} has mode {:04o}: other users may add to it",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// What makes the directories above `dir` unsafe, if anything (ssh's rule): one that
/// belongs to another user (not root), or that others may write without the sticky bit,
/// lets that user replace `dir` with a directory or link of their own.
pub fn ancestors_problem(dir: &Path) -> Option<String> {
    let me = rustix::process::geteuid().as_raw();
    for a in dir.ancestors().skip(1) {
        if a.as_os_str().is_empty() {
            break;
        }
        let Ok(m) = std::fs::symlink_metadata(a) else {
            continue;
        };
        if m.uid() != me && m.uid() != 0 {
            return Some(format!(
                "{} (above it) belongs to uid {}, who could replace it",
                a.display(),
                m.uid()
            ));
        }
        if !m.file_type().is_symlink() && m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Some(format!(
                "{} (above it) has mode {:04o}: other users could replace it",
                a.display(),
                m.mode() & 0o7777
            ));
        }
    }
    None
}

/// The first symbolic link on the way to `path` (itself included) that belongs to another
/// user than this one or root, if any: following it would let that user choose where this
/// process mounts, writes or changes modes (the kernel's `protected_symlinks` rule, kept
/// even where the host turned it off).
pub fn foreign_link(path: &Path) -> Option<String> {
    let me = rustix::process::geteuid().as_raw();
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    for p in abs.ancestors() {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            continue;
        };
        if m.file_type().is_symlink() && m.uid() != me && m.uid() != 0 {
            return Some(format!(
                "{} is a symbolic link that belongs to uid {}, another user: refusing to follow it (give the real path)",
                p.display(),
                m.uid()
            ));
        }
    }
    None
}

/// Make sure `dir` is a directory of this user's that nobody else may use (0700): created
/// so (parents too) if absent; one of this user's that others may read but not change is
/// narrowed to 0700; anything else (a symbolic link, another user's directory, one others
/// may write, or one inside a directory another user could change: `ancestors_problem`) is
/// refused, naming `what` and `elsewhere` (how to choose another place).
pub fn ensure_private_dir(dir: &Path, what: &str, elsewhere: &str) -> anyhow::Result<()> {
    let refuse = |why: String| {
        anyhow::anyhow!(
            "the {what} {}: {why}; it must be a directory of this user's that no one else may use (mode 0700): remove it (a new one is made), or {elsewhere}",
            dir.display(),
        )
    };
    // Before anything is created: nothing is made inside another user's directory.
    if let Some(why) = ancestors_problem(dir) {
        return Err(refuse(why));
    }
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(p) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                create_private_dirs(p)
                    .map_err(|e| anyhow::anyhow!("creating {}: {e}", p.display()))?;
            }
            // Not recursive: one made by someone else in between is an error, then checked.
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "creating the {what} {}: {e}",
                        dir.display()
                    ))
                }
            }
            std::fs::symlink_metadata(dir)
                .map_err(|e| anyhow::anyhow!("the {what} {}: {e}", dir.display()))?
        }
        Err(e) => return Err(anyhow::anyhow!("the {what} {}: {e}", dir.display())),
    };
    if let Some(why) = private_dir_problem(dir, &m) {
        return Err(refuse(why));
    }
    if let Some(why) = ancestors_problem(dir) {
        return Err(refuse(why));
    }
    if m.mode() & 0o077 != 0 {
        // This user's, and no one else could add to it: made by an older version.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(format!("cannot narrow it to 0700: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_owner_only_whatever_the_umask_and_links_refused() {
        let t = tempfile::tempdir().unwrap();
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let d = t.path().join("a/b/state");
        let r = ensure_private_dir(&d, "state directory", "choose another");
        rustix::process::umask(old);
        r.unwrap();
        for p in [t.path().join("a"), t.path().join("a/b"), d.clone()] {
            let m = std::fs::metadata(&p).unwrap().mode() & 0o777;
            assert_eq!(m, 0o700, "{}", p.display());
        }
        // Readable by others, this user's: narrowed.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&d, "state directory", "x").unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Writable by others, or a link: refused, the link never followed.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private_dir(&d, "state directory", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("other users may add to it"), "{e}");
        let l = t.path().join("link");
        std::os::unix::fs::symlink(&d, &l).unwrap();
        let e = ensure_private_dir(&l, "state directory", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }
}
