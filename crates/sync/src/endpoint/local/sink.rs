//! Writing one file of a local destination: under a temporary name in the same directory,
//! synced every `SYNC_EVERY` bytes, renamed into place only once complete (`finish`), and
//! removed on `abort`. Small files are made durable by the run's batched `syncfs`.

use super::super::{Entry, Sink};
use anyhow::{anyhow, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use cap_std::fs::Dir;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::{blocking, rel};

pub struct LocalSink {
    pub(super) dir: Arc<Dir>,
    pub(super) tmp: String,
    pub(super) key: String,
    pub(super) file: std::fs::File,
    /// Bytes written since the last data sync: a large file is synced every `SYNC_EVERY` as it
    /// is written, so its durability costs little at the end (small files wait for the run's
    /// batched `syncfs`).
    pub(super) unsynced: u64,
}

const SYNC_EVERY: u64 = 64 << 20;

impl LocalSink {
    pub(super) async fn wrote(&mut self, n: u64) -> Result<()> {
        self.unsynced += n;
        if self.unsynced >= SYNC_EVERY {
            let f = self.file.try_clone()?;
            blocking(move || Ok(f.sync_data()?)).await?;
            self.unsynced = 0;
        }
        Ok(())
    }
}

impl LocalSink {
    pub(super) async fn create(dir: Arc<Dir>, key: &str) -> Result<Self> {
        let key = key.to_string();
        blocking(move || {
            let path = rel(&key);
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| anyhow!("{key}: no file name"))?;
            let tmp = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(p) => {
                    dir.create_dir_all(p)
                        .with_context(|| format!("creating the directory of {key}"))?;
                    format!("{}/{}", p.display(), super::super::temp_name(name))
                }
                None => super::super::temp_name(name),
            };
            let file = dir
                .create(&tmp)
                .with_context(|| format!("creating {tmp}"))?
                .into_std();
            Ok(LocalSink {
                dir,
                tmp,
                key,
                file,
                unsynced: 0,
            })
        })
        .await
    }
}

#[async_trait]
impl Sink for LocalSink {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        let mut f = self.file.try_clone()?;
        let n = data.len() as u64;
        blocking(move || Ok(f.write_all(&data)?)).await?;
        self.wrote(n).await
    }

    async fn finish(self: Box<Self>, src: &Entry, perms: bool) -> Result<()> {
        let (mtime, mode) = (src.mtime_ns, src.mode);
        blocking(move || {
            let s = *self;
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(mtime.max(0) as u64);
            s.file
                .set_times(std::fs::FileTimes::new().set_modified(t))?;
            if let (true, Some(m)) = (perms, mode) {
                s.file.set_permissions(std::fs::Permissions::from_mode(m))?;
            }
            // Not synced here: the run makes finished copies durable in batches (`sync`)
            // before it records them as done.
            s.dir
                .rename(&s.tmp, &s.dir, rel(&s.key))
                .with_context(|| format!("renaming into place: {}", s.key))?;
            Ok(())
        })
        .await
    }

    async fn abort(self: Box<Self>) {
        let _ = blocking(move || Ok(self.dir.remove_file(&self.tmp)?)).await;
    }
}
