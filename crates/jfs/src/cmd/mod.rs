//! One file per group of subcommands; `run` dispatches.

mod admin;
mod cutover;
mod fsops;
mod mount;
mod transfer;

use crate::cli::{Cli, Command, Global};
use anyhow::{bail, Context, Result};
use fs_core::{Engine, Fs, Ino};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set by SIGINT/SIGTERM: long transfers stop starting work, and each file in flight takes its
/// own cleanup path (the temporary entry or local temp file is removed), then `jfs` exits 2.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub async fn watch_signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    INTERRUPTED.store(true, Ordering::SeqCst);
    tracing::warn!("interrupted: finishing the pieces in flight and removing partial files");
    // A second signal means "now".
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    std::process::exit(2);
}

pub enum Outcome {
    Done,
    /// Some items failed (exit code 1).
    Partial,
}

pub async fn run(cli: Cli) -> Result<Outcome> {
    let g = &cli.global;
    match cli.cmd {
        Command::Format {
            meta_url,
            name,
            storage,
            block_size,
            capacity,
            journal_retention,
            trash,
            gc_grace,
        } => {
            admin::format(
                g,
                &meta_url,
                &name,
                &storage,
                block_size,
                capacity,
                journal_retention,
                trash,
                gc_grace,
            )
            .await
        }
        Command::Put {
            meta_url,
            local,
            volpath,
            threads,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => transfer::put(&fs, &local, &volpath, threads, g.quiet).await,
            Err(mp) => mount::through::put(&mp, &local, &volpath),
        },
        Command::Get {
            meta_url,
            volpath,
            local,
            threads,
        } => {
            transfer::get(
                Arc::new(open_fs(g, &meta_url, true).await?),
                &volpath,
                &local,
                threads,
                g.quiet,
            )
            .await
        }
        Command::Ls {
            meta_url,
            path,
            long,
            recursive,
        } => fsops::ls(&open_fs(g, &meta_url, true).await?, &path, long, recursive).await,
        Command::Stat { meta_url, path } => {
            fsops::stat(&open_fs(g, &meta_url, true).await?, &path).await
        }
        Command::Cat { meta_url, path } => {
            fsops::cat(&open_fs(g, &meta_url, true).await?, &path).await
        }
        Command::Mkdir {
            meta_url,
            path,
            parents,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => fsops::mkdir(&fs, &path, parents).await,
            Err(mp) => mount::through::mkdir(&mp, &path, parents),
        },
        Command::Rm {
            meta_url,
            path,
            recursive,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => fsops::rm(&fs, &path, recursive).await,
            Err(mp) => mount::through::rm(&mp, &path, recursive),
        },
        Command::Mv {
            meta_url,
            src,
            dst,
            no_clobber,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => fsops::mv(&fs, &src, &dst, no_clobber).await,
            Err(mp) => mount::through::mv(&mp, &src, &dst, no_clobber),
        },
        Command::Ln {
            meta_url,
            target,
            link,
            symbolic,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => fsops::ln(&fs, &target, &link, symbolic).await,
            Err(mp) => mount::through::ln(&mp, &target, &link, symbolic),
        },
        Command::Truncate {
            meta_url,
            path,
            size,
        } => match mount::writer_or_mount(g, &meta_url).await? {
            Ok(fs) => fsops::truncate(&fs, &path, size).await,
            Err(mp) => mount::through::truncate(&mp, &path, size),
        },
        Command::Dump { meta_url, file } => {
            admin::dump(&*open_engine(g, &meta_url, true).await?, file.as_deref()).await
        }
        Command::Load { meta_url, file } => {
            admin::load(&*open_engine_with(g, &meta_url, false, true).await?, &file).await
        }
        Command::Fsck {
            meta_url,
            deep,
            json,
        } => {
            // A site's check is of its own store: at a mirror, a missing or damaged block is
            // reported, not read from (or repaired from) the origin.
            let g = Global {
                no_fallback: true,
                ..g.clone()
            };
            admin::fsck(&open_fs(&g, &meta_url, true).await?, deep, json).await
        }
        Command::Gc {
            meta_url,
            delete,
            session_timeout,
            json,
        } => mount::gc(g, &meta_url, delete, session_timeout, json).await,
        Command::Mount(m) => mount::mount(g, *m).await,
        Command::Umount { mountpoint, force } => mount::umount(&mountpoint, force).await,
        Command::Warmup {
            paths,
            file,
            threads,
            check,
            evict,
            json,
        } => mount::warmup(g, paths, file, threads, check, evict, json).await,
        Command::Stats {
            mountpoint,
            interval,
            count,
            json,
        } => mount::stats(&mountpoint, interval, count, json).await,
        Command::Journal {
            meta_url,
            from,
            follow,
            json,
        } => admin::journal(&*open_engine(g, &meta_url, true).await?, from, follow, json).await,
        Command::Cutover { cmd } => cutover::run(g, cmd).await,
        Command::Status { meta_url, json } => {
            admin::status(&open_fs(g, &meta_url, true).await?, json).await
        }
    }
}

/// Open the metadata engine. `read_only` commands open a RocksDB volume as a secondary, so they
/// work beside the process that writes it and never block it.
pub async fn open_engine(g: &Global, meta_url: &str, read_only: bool) -> Result<Arc<dyn Engine>> {
    open_engine_with(g, meta_url, read_only, false).await
}

pub async fn open_engine_with(
    g: &Global,
    meta_url: &str,
    read_only: bool,
    create: bool,
) -> Result<Arc<dyn Engine>> {
    volume::open_engine(
        meta_url,
        access(read_only),
        g.meta_password_file.clone(),
        create,
    )
    .await
    .with_context(|| format!("opening metadata {}", meta::redact(meta_url)))
}

fn access(read_only: bool) -> volume::Access {
    if read_only {
        volume::Access::Read
    } else {
        volume::Access::Write
    }
}

/// Open the volume through the `volume` crate: a bootstrapping mirror is refused to everyone,
/// a mirror's metadata to writers.
pub async fn open_fs(g: &Global, meta_url: &str, read_only: bool) -> Result<Fs> {
    let opts = volume_options(g, read_only, None);
    let engine = open_engine(g, meta_url, read_only).await?;
    Ok(volume::open_on(engine, &opts).await?)
}

/// How `jfs` opens a volume: the global flags, the access, and a local cache (the mount).
pub fn volume_options(
    g: &Global,
    read_only: bool,
    cache: Option<volume::CacheConfig>,
) -> volume::Options {
    volume::Options {
        access: access(read_only),
        password_file: g.meta_password_file.clone(),
        endpoint: g.endpoint.clone(),
        block_store: g.storage.clone(),
        origin_store: g.origin_store.clone(),
        no_fallback: g.no_fallback,
        origin_timeout: Some(g.origin_timeout),
        allow_incomplete: false,
        io_parallel: g.io_parallel.max(1),
        cache,
        session: None,
        follow_moves: false,
    }
}

/// Split "/a/b/c" into ("/a/b", "c").
pub fn split_path(path: &str) -> Result<(String, String)> {
    let p = path.trim_end_matches('/');
    match p.rsplit_once('/') {
        Some((dir, name)) if !name.is_empty() => Ok((
            if dir.is_empty() {
                "/".into()
            } else {
                dir.into()
            },
            name.into(),
        )),
        None if !p.is_empty() => Ok(("/".into(), p.into())),
        _ => bail!("{path:?} names the root, not an entry"),
    }
}

/// Resolve the parent directory of `path` and return (parent ino, last name).
pub async fn parent_of(fs: &Fs, path: &str) -> Result<(Ino, String)> {
    let (dir, name) = split_path(path)?;
    let (ino, attr) = fs
        .resolve(&dir)
        .await
        .with_context(|| format!("resolving {dir}"))?;
    if attr.kind != fs_core::FileKind::Dir {
        bail!("{dir} is not a directory");
    }
    Ok((ino, name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_path_cases() {
        let s = |p| super::split_path(p).ok();
        assert_eq!(s("/a/b"), Some(("/a".into(), "b".into())));
        assert_eq!(s("/a"), Some(("/".into(), "a".into())));
        assert_eq!(s("a"), Some(("/".into(), "a".into())));
        assert_eq!(s("/a/b/"), Some(("/a".into(), "b".into())));
        assert_eq!(s("/"), None);
    }
}
