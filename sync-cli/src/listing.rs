//! Listing one side as a single ascending stream, optionally in parallel by prefix: the top
//! `depth` directory levels are expanded, each subtree below them is listed by its own task
//! (at most `threads` at once, into a bounded channel), and the subtrees are forwarded in key
//! order. Permits are taken in key order by one spawner, so the earliest unfinished subtree
//! always holds one: the consumer can never wait on a subtree that cannot run.

use crate::endpoint::{Endpoint, Entry, Kind, Page};
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
    after: Option<String>,
    dirs: bool,
    threads: usize,
    depth: usize,
) -> mpsc::Receiver<Page> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let r = if threads <= 1 || depth == 0 {
            ep.list("", after, dirs, tx.clone()).await
        } else {
            parallel(ep, after, dirs, threads, depth, tx.clone()).await
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
    after: Option<&str>,
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
        if e.kind == Kind::Dir {
            if after.is_some_and(|a| a > e.key.as_str() && !a.starts_with(&e.key)) {
                continue; // wholly before the resume point
            }
            if dirs && after.is_none_or(|a| e.key.as_str() > a) {
                out.push(Unit::One(e.clone()));
            }
            if depth > 1 {
                Box::pin(expand(ep, &e.key, depth - 1, dirs, after, out)).await?;
            } else {
                out.push(Unit::Tree(e.key));
            }
        } else if after.is_none_or(|a| e.key.as_str() > a) {
            out.push(Unit::One(e));
        }
    }
    Ok(())
}

async fn parallel(
    ep: Arc<dyn Endpoint>,
    after: Option<String>,
    dirs: bool,
    threads: usize,
    depth: usize,
    tx: mpsc::Sender<Page>,
) -> Result<()> {
    let mut units = Vec::new();
    expand(&*ep, "", depth, dirs, after.as_deref(), &mut units).await?;
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
        let (ep, after) = (ep.clone(), after.clone());
        tokio::spawn(async move {
            for (prefix, t) in senders {
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    return;
                };
                let (ep, a) = (ep.clone(), after.clone().filter(|a| a.starts_with(&prefix)));
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = ep.list(&prefix, a, dirs, t.clone()).await {
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
