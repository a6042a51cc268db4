//! One file per group of subcommands; `run` dispatches.

mod admin;
mod cutover;
mod fsops;
mod mount;
mod recover;
mod through;
mod transfer;
mod trash;

use crate::cli::{Cli, Command, Global};
use anyhow::{bail, Context, Result};
use fs_core::{Engine, Fs, Ino, VolPath};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set by SIGINT/SIGTERM: long transfers stop starting work, and each file in flight takes its
/// own cleanup path (the temporary entry or local temp file is removed), then `jfs` exits 2.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Commands that finish their pieces in flight and remove partial files when interrupted
/// (they watch `interrupted()`), and the mount (which unmounts): the first signal asks them to
/// stop, a second one ends the process. Every other command ends at the first signal.
pub fn cleans_up_on_signal(c: &Command) -> bool {
    matches!(
        c,
        Command::Put { .. } | Command::Get { .. } | Command::Cutover { .. } | Command::Mount(_)
    )
}

pub async fn watch_signals(cleans_up: bool) {
    if !cleans_up {
        cli_common::shutdown_on_signals("interrupted")
            .cancelled()
            .await;
        std::process::exit(2);
    }
    cli_common::shutdown_on_signals(
        "interrupted: finishing the pieces in flight and removing partial files",
    )
    .cancelled()
    .await;
    INTERRUPTED.store(true, Ordering::SeqCst);
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
            trash_max_bytes,
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
                (trash, trash_max_bytes),
                gc_grace,
            )
            .await
        }
        Command::Put {
            meta_url,
            local,
            volpath,
            threads,
        } => {
            let dest = transfer::Dest::parse(&volpath)?;
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => transfer::put(&fs, &local, &dest, threads, g.quiet).await,
                Err(mp) => through::put(&mp, &local, &dest, threads, g.quiet).await,
            }
        }
        Command::Get {
            meta_url,
            volpath,
            local,
            threads,
            owners,
        } => {
            let volpath = vol_path(&volpath)?;
            let opts = transfer::GetOpts { owners };
            opts.check()?;
            transfer::get(
                Arc::new(open_fs(g, &meta_url, true).await?),
                &volpath,
                &local,
                threads,
                opts,
                g.quiet,
            )
            .await
        }
        Command::Ls {
            meta_url,
            path,
            long,
            recursive,
        } => {
            let path = vol_path(&path)?;
            fsops::ls(&open_fs(g, &meta_url, true).await?, &path, long, recursive).await
        }
        Command::Stat { meta_url, path } => {
            let path = vol_path(&path)?;
            fsops::stat(&open_fs(g, &meta_url, true).await?, &path).await
        }
        Command::Cat { meta_url, path } => {
            let path = vol_path(&path)?;
            fsops::cat(&open_fs(g, &meta_url, true).await?, &path).await
        }
        Command::Mkdir {
            meta_url,
            path,
            parents,
        } => {
            let path = vol_path(&path)?;
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => fsops::mkdir(&fs, &path, parents).await,
                Err(mp) => through::Root::open(&mp)?.mkdir(&path, parents),
            }
        }
        Command::Rm {
            meta_url,
            path,
            recursive,
            skip_trash,
        } => {
            if skip_trash {
                trash::root_only("jfs rm --skip-trash")?;
            }
            let raw = path;
            let path = vol_path(&raw)?;
            if path.is_root() {
                bail!("rm {path}: refusing to remove the volume's root");
            }
            // As rm(1): `x/.` and `x/..` are refused rather than taken for `x` or its parent.
            if matches!(raw.rsplit('/').next(), Some("." | "..")) {
                bail!("rm {raw}: refusing to remove '.' or '..' (as rm does); name the directory itself: {path}");
            }
            // A trailing slash names a directory: never a link or a file under that name.
            let dir_only = raw.ends_with('/');
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(mut fs) => {
                    fs.set_skip_trash(skip_trash);
                    fsops::rm(&fs, &path, recursive, dir_only).await
                }
                Err(mp) if skip_trash => bail!(
                    "rm --skip-trash {path}: the volume is mounted read-write at {} (its one writer), whose deletes go to the trash: unmount it first, or remove without --skip-trash and let the trash time pass",
                    cli_common::names::quote(mp.as_os_str().as_encoded_bytes())
                ),
                Err(mp) => through::Root::open(&mp)?.rm(&path, recursive, dir_only),
            }
        }
        Command::Mv {
            meta_url,
            src,
            dst,
            no_clobber,
        } => {
            let (src, dst) = (vol_path(&src)?, vol_path(&dst)?);
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => fsops::mv(&fs, &src, &dst, no_clobber).await,
                Err(mp) => through::Root::open(&mp)?.mv(&src, &dst, no_clobber),
            }
        }
        Command::Clone {
            meta_url,
            src,
            dst,
            json,
        } => {
            // DST/ (a trailing slash): into that directory, under SRC's name.
            let into = dst.ends_with('/');
            let (src, dst) = (vol_path(&src)?, vol_path(&dst)?);
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => fsops::clone(&fs, &src, &dst, into, json).await,
                Err(mp) => mount::clone_through(&mp, &src, &dst, into, json).await,
            }
        }
        Command::Ln {
            meta_url,
            target,
            link,
            symbolic,
        } => {
            // A symlink's target is text kept as it is (resolved by whoever follows the
            // link); a hard link's target is a volume path.
            let link = vol_path(&link)?;
            let target = if symbolic {
                fsops::LinkTarget::Text(target)
            } else {
                fsops::LinkTarget::Path(vol_path(&target)?)
            };
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => fsops::ln(&fs, &target, &link).await,
                Err(mp) => through::Root::open(&mp)?.ln(&target, &link),
            }
        }
        Command::Truncate {
            meta_url,
            path,
            size,
        } => {
            let path = vol_path(&path)?;
            match mount::writer_or_mount(g, &meta_url).await? {
                Ok(fs) => fsops::truncate(&fs, &path, size).await,
                Err(mp) => through::Root::open(&mp)?.truncate(&path, size),
            }
        }
        Command::Dump { meta_url, file } => {
            admin::dump(&*open_engine(g, &meta_url, true).await?, file.as_deref()).await
        }
        Command::Load {
            meta_url,
            file,
            take_over,
        } => admin::load(g, &meta_url, &file, take_over).await,
        Command::Fsck {
            meta_url,
            deep,
            repair_from,
            json,
        } => {
            // A site's check is of its own store: at a mirror, a missing or damaged block is
            // reported, not read from (or repaired from) the origin.
            let g = Global {
                no_fallback: true,
                ..g.clone()
            };
            let fs = open_fs(&g, &meta_url, true).await?;
            admin::fsck(&g, &fs, deep, repair_from.as_deref(), json).await
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
        Command::Recover {
            store_url,
            new_meta_url,
            name,
            seq,
            at,
            list,
            no_take_over,
            json,
        } => {
            recover::recover(
                g,
                &store_url,
                new_meta_url.as_deref(),
                &name,
                (seq, at.as_deref()),
                list,
                !no_take_over,
                json,
            )
            .await
        }
        Command::Backup {
            meta_url,
            snapshot_every,
            segment_every,
            keep_hourly,
            keep_daily,
            on,
            off,
            now,
            purge,
            json,
        } => {
            recover::backup(
                g,
                &meta_url,
                recover::BackupArgs {
                    snapshot_every,
                    segment_every,
                    keep_hourly,
                    keep_daily,
                    on,
                    off,
                    now,
                    purge,
                    json,
                },
            )
            .await
        }
        Command::Cutover { cmd } => cutover::run(g, cmd).await,
        Command::Trash {
            meta_url,
            path,
            json,
        } => trash::list(g, &meta_url, path.as_deref(), json).await,
        Command::Restore {
            meta_url,
            path,
            version,
            at,
            seq,
            put_back,
            json,
        } => {
            trash::restore(
                g,
                &meta_url,
                trash::RestoreArgs {
                    path: path.as_deref(),
                    version: version.as_deref(),
                    at: at.as_deref(),
                    seq,
                    put_back,
                    json,
                },
            )
            .await
        }
        Command::Config {
            meta_url,
            trash,
            trash_max_bytes,
        } => {
            let cap = trash_max_bytes
                .map(|c| {
                    trash::parse_cap(&c)
                        .map_err(|e| anyhow::anyhow!("--trash-max-bytes {c:?}: {e}"))
                })
                .transpose()?;
            trash::config(g, &meta_url, trash, cap).await
        }
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
        forward: None,
    }
}

/// A volume path from the command line, resolved inside the volume before anything else
/// happens (`..` never climbs above the root: such a path is refused, naming it).
pub fn vol_path(path: &str) -> Result<VolPath> {
    if path.is_empty() {
        // Taken as the root, an empty argument (an unset shell variable) moved a file there.
        bail!("an empty volume path: name one (/ is the volume's root)");
    }
    Ok(VolPath::parse(path)?)
}

/// The parent directory of `path` and its last name, refusing the root (`op` names the
/// command in the message).
pub fn split_last<'a>(path: &'a VolPath, op: &str) -> Result<(VolPath, &'a str)> {
    path.split_last()
        .with_context(|| format!("{op} {path}: that is the volume's root, not an entry in it"))
}

/// Resolve the parent directory of `path` and return (parent ino, last name).
pub async fn parent_of(fs: &Fs, path: &VolPath, op: &str) -> Result<(Ino, String)> {
    let (dir, name) = split_last(path, op)?;
    let (ino, attr) = fs
        .resolve_path(&dir)
        .await
        .with_context(|| format!("{op} {path}: resolving {dir}"))?;
    if attr.kind != fs_core::FileKind::Dir {
        bail!("{op} {path}: {dir} is not a directory");
    }
    Ok((ino, name.to_string()))
}
