//! Listing one side as a single ascending stream, optionally in parallel by prefix: the top
//! `depth` directory levels are expanded, each subtree below them is listed by its own task
//! (at most `threads` at once, into a bounded channel), and the subtrees are forwarded in key
//! order. Permits are taken in key order by one spawner, so the earliest unfinished subtree
//! always holds one: the consumer can never wait on a subtree that cannot run.
//!
//! Every listing is of a [`KeyRange`] (the whole key space, what follows a resume cursor, or
//! one range of a shared job); an endpoint that lists by walking directories walks through
//! the one `endpoint::walk`. The module graph runs one way: `entry` and `range` (the
//! vocabulary) <- `endpoint` <- `listing` <- `run`.

use crate::endpoint::{Endpoint, Listing};
use crate::entry::{Entry, Page};
use crate::range::{KeyRange, Step};
use anyhow::Result;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

enum Unit {
    One(Entry),
    Tree(String),
}

pub fn spawn(
    ep: Arc<dyn Endpoint>,
    range: KeyRange,
    dirs: bool,
    threads: usize,
    depth: usize,
) -> mpsc::Receiver<Page> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let r = if threads <= 1 || depth == 0 {
            ep.list(
                Listing {
                    prefix: "",
                    range: &range,
                    dirs,
                },
                tx.clone(),
            )
            .await
        } else {
            parallel(ep, range, dirs, threads, depth, tx.clone()).await
        };
        if let Err(e) = r {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

async fn expand(
    ep: &dyn Endpoint,
    prefix: &str,
    depth: usize,
    dirs: bool,
    range: &KeyRange,
    out: &mut Vec<Unit>,
) -> Result<()> {
    let level = match ep.list_level(prefix).await {
        Ok(l) => l,
        // Too wide to hold: the whole subtree becomes one (spilling) listing.
        Err(e) if e.is::<crate::endpoint::TooWide>() => {
            out.push(Unit::Tree(prefix.to_string()));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for e in level {
        match range.step(&e, dirs) {
            Step::Stop => break,
            Step::Skip => {}
            Step::Keep => out.push(Unit::One(e)),
            Step::Open { keep } => {
                let key = e.key.clone();
                if keep {
                    out.push(Unit::One(e));
                }
                if depth > 1 {
                    Box::pin(expand(ep, &key, depth - 1, dirs, range, out)).await?;
                } else {
                    out.push(Unit::Tree(key));
                }
            }
        }
    }
    Ok(())
}

async fn parallel(
    ep: Arc<dyn Endpoint>,
    range: KeyRange,
    dirs: bool,
    threads: usize,
    depth: usize,
    tx: mpsc::Sender<Page>,
) -> Result<()> {
    let mut units = Vec::new();
    expand(&*ep, "", depth, dirs, &range, &mut units).await?;
    let mut receivers = VecDeque::new();
    let mut senders = Vec::new();
    for u in &units {
        if let Unit::Tree(p) = u {
            let (t, r) = mpsc::channel::<Page>(4);
            receivers.push_back(r);
            senders.push((p.clone(), t));
        }
    }
    // One spawner hands out permits in key order.
    let sem = Arc::new(Semaphore::new(threads));
    let spawner = {
        let ep = ep.clone();
        tokio::spawn(async move {
            for (prefix, t) in senders {
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    return;
                };
                let (ep, range) = (ep.clone(), range.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = ep
                        .list(
                            Listing {
                                prefix: &prefix,
                                range: &range,
                                dirs,
                            },
                            t.clone(),
                        )
                        .await
                    {
                        let _ = t.send(Err(e)).await;
                    }
                });
            }
        })
    };
    let mut page = Vec::with_capacity(1000);
    for u in units {
        match u {
            Unit::One(e) => {
                page.push(e);
                if page.len() >= 1000 && tx.send(Ok(std::mem::take(&mut page))).await.is_err() {
                    spawner.abort();
                    return Ok(());
                }
            }
            Unit::Tree(_) => {
                if !page.is_empty() && tx.send(Ok(std::mem::take(&mut page))).await.is_err() {
                    spawner.abort();
                    return Ok(());
                }
                let mut r = receivers.pop_front().expect("a receiver per subtree");
                while let Some(p) = r.recv().await {
                    let failed = p.is_err();
                    if tx.send(p).await.is_err() || failed {
                        spawner.abort();
                        return Ok(());
                    }
                }
            }
        }
    }
    if !page.is_empty() {
        let _ = tx.send(Ok(page)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::LocalDir;

    async fn keys(ep: Arc<dyn Endpoint>, r: KeyRange, threads: usize) -> Vec<String> {
        let mut rx = spawn(ep, r, true, threads, 2);
        let mut out = Vec::new();
        while let Some(p) = rx.recv().await {
            out.extend(p.unwrap().into_iter().map(|e| e.key));
        }
        out
    }

    /// Ranges that meet end to end list the whole tree between them, each key once, in
    /// order, whether walked sequentially or by subtrees in parallel, and a resumed range
    /// lists only what follows its cursor.
    #[tokio::test]
    async fn adjoining_ranges_partition_the_listing() {
        let d = tempfile::tempdir().unwrap();
        for f in ["a", "a0", "b/x", "b/y/z", "b/y/zz", "b0/q", "c", "c/"] {
            let p = d.path().join(f);
            if f.ends_with('/') {
                continue;
            }
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            if !p.exists() {
                std::fs::write(&p, f).unwrap();
            }
        }
        std::fs::create_dir_all(d.path().join("e/f")).unwrap();
        let ep: Arc<dyn Endpoint> = Arc::new(LocalDir::open(d.path().to_str().unwrap()).unwrap());
        for threads in [1, 4] {
            let all = keys(ep.clone(), KeyRange::all(), threads).await;
            assert_eq!(
                all,
                [
                    "a", "a0", "b/", "b/x", "b/y/", "b/y/z", "b/y/zz", "b0/", "b0/q", "c", "e/",
                    "e/f/"
                ]
            );
            for cuts in [
                vec!["b/"],
                vec!["b/y/", "b0", "d"],
                vec!["a0", "b/x", "b/y/zz", "c"],
            ] {
                let mut bounds: Vec<Option<String>> = vec![None];
                bounds.extend(cuts.iter().map(|c| Some(c.to_string())));
                bounds.push(None);
                let mut got = Vec::new();
                for w in bounds.windows(2) {
                    let r = KeyRange::new(w[0].clone(), w[1].clone());
                    let part = keys(ep.clone(), r.clone(), threads).await;
                    assert!(part.iter().all(|k| r.contains(k)), "{r:?}: {part:?}");
                    got.extend(part);
                }
                assert_eq!(got, all, "cuts {cuts:?}, {threads} threads");
            }
            let r = KeyRange::new(Some("b/".into()), Some("c".into())).resumed(Some("b/y/z"));
            assert_eq!(
                keys(ep.clone(), r, threads).await,
                ["b/y/zz", "b0/", "b0/q"]
            );
        }
    }
}
