//! `jfs-sync check SRC DST`: which keys are missing at DST, which differ, which are extra.
//! With `--download`, a file that cannot be read on either side (a damaged or missing block
//! of a volume, an I/O error) is listed as unreadable, naming it and why, and the check goes
//! on with the others.

use crate::copy::checksum;
use crate::endpoint::{Endpoint, Entry, Kind};
use crate::limits::Limits;
use anyhow::Result;
use futures::StreamExt;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Serialize, Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub same: u64,
    pub missing: u64,
    pub differing: u64,
    pub extra: u64,
    pub checked_bytes: u64,
    /// Files whose bytes could not be read on one side (`--download`).
    pub unreadable: u64,
    #[serde(skip)]
    pub keys: Vec<(String, &'static str)>,
    /// Each unreadable file: its key and why (which side, the error).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable_files: Vec<Unreadable>,
}

#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub key: String,
    pub error: String,
}

async fn next(
    rx: &mut mpsc::Receiver<crate::endpoint::Page>,
    buf: &mut std::collections::VecDeque<Entry>,
) -> Result<Option<Entry>> {
    while buf.is_empty() {
        match rx.recv().await {
            // jfs-sync's temporary files (a copy in progress, or left by an interrupted run)
            // are not objects of either side.
            Some(p) => buf.extend(
                p?.into_iter()
                    .filter(|e| e.kind == Kind::File && !crate::endpoint::is_temp(&e.key)),
            ),
            None => return Ok(None),
        }
    }
    Ok(buf.pop_front())
}

pub async fn check(
    src: Arc<dyn Endpoint>,
    dst: Arc<dyn Endpoint>,
    download: bool,
    threads: usize,
) -> Result<CheckReport> {
    let mut srx = crate::listing::spawn(src.clone(), Default::default(), false, threads.min(8), 1);
    let mut drx = crate::listing::spawn(dst.clone(), Default::default(), false, threads.min(8), 1);
    let (mut sb, mut db) = (Default::default(), Default::default());
    let mut r = CheckReport::default();
    let mut same_size: Vec<Entry> = Vec::new();
    let (mut s, mut d) = (
        next(&mut srx, &mut sb).await?,
        next(&mut drx, &mut db).await?,
    );
    loop {
        match (&s, &d) {
            (None, None) => break,
            (Some(a), Some(b)) if a.key == b.key => {
                if a.size != b.size {
                    r.differing += 1;
                    r.keys.push((a.key.clone(), "differs"));
                } else if download {
                    same_size.push(a.clone());
                } else {
                    r.same += 1;
                }
                s = next(&mut srx, &mut sb).await?;
                d = next(&mut drx, &mut db).await?;
            }
            (Some(a), Some(b)) if a.key < b.key => {
                r.missing += 1;
                r.keys.push((a.key.clone(), "missing"));
                s = next(&mut srx, &mut sb).await?;
            }
            (Some(a), None) => {
                r.missing += 1;
                r.keys.push((a.key.clone(), "missing"));
                s = next(&mut srx, &mut sb).await?;
            }
            (_, Some(b)) => {
                r.extra += 1;
                r.keys.push((b.key.clone(), "extra"));
                d = next(&mut drx, &mut db).await?;
            }
        }
    }
    let limits = Limits::new(None, None)?;
    // Each file's outcome: equal or not, or why one side could not be read.
    let results: Vec<(Entry, std::result::Result<bool, String>)> =
        futures::stream::iter(same_size.into_iter().map(|e| {
            let (src, dst, limits) = (&src, &dst, &limits);
            async move {
                let a = match checksum(&**src, &e.key, e.size, limits).await {
                    Ok(a) => a,
                    Err(err) => return (e, Err(format!("reading the source: {err:#}"))),
                };
                let b = match checksum(&**dst, &e.key, e.size, limits).await {
                    Ok(b) => b,
                    Err(err) => return (e, Err(format!("reading the destination: {err:#}"))),
                };
                (e, Ok(a == b))
            }
        }))
        .buffer_unordered(threads.max(1))
        .collect()
        .await;
    for (e, res) in results {
        let equal = match res {
            Ok(equal) => equal,
            Err(error) => {
                r.unreadable += 1;
                r.keys.push((e.key.clone(), "unreadable"));
                r.unreadable_files.push(Unreadable { key: e.key, error });
                continue;
            }
        };
        r.checked_bytes += 2 * e.size;
        if equal {
            r.same += 1;
        } else {
            r.differing += 1;
            r.keys.push((e.key, "differs"));
        }
    }
    r.keys.sort();
    r.unreadable_files.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(r)
}
