//! Listing one side as a single ascending stream, optionally in parallel by prefix: the top
//! `depth` directory levels are expanded, each subtree below them is listed by its own task
//! (at most `threads` at once, into a bounded channel), and the subtrees are forwarded in key
//! order. Permits are taken in key order by one spawner, so the earliest unfinished subtree
//! always holds one: the consumer can never wait on a subtree that cannot run.
//!
//! Every listing is of a [`KeyRange`] (the whole key space, what follows a resume cursor, or
//! one range of a shared job), and every endpoint that lists by walking directories walks
//! through the one [`walk`] here.

use crate::endpoint::{Endpoint, Entry, Kind, Page};
use anyhow::{Context, Result};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// A slice of the key space: keys above `lo` and below `hi` (`None`: no upper end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: Bound<String>,
    pub hi: Option<String>,
}

impl Default for KeyRange {
    fn default() -> Self {
        KeyRange::all()
    }
}

impl KeyRange {
    pub fn all() -> Self {
        KeyRange {
            lo: Bound::Unbounded,
            hi: None,
        }
    }

    /// `[from, until)`.
    pub fn new(from: Option<String>, until: Option<String>) -> Self {
        KeyRange {
            lo: from.map_or(Bound::Unbounded, Bound::Included),
            hi: until,
        }
    }

    /// What is left of this range after a resume cursor (every key at or before it resolved).
    pub fn resumed(&self, cursor: Option<&str>) -> Self {
        let mut r = self.clone();
        if let Some(c) = cursor {
            if !self.below(c) {
                r.lo = Bound::Excluded(c.to_string());
            }
        }
        r
    }

    /// The exclusive lower end as a listing's `start_after`: the cursor, or for an inclusive
    /// start a key just before it (a prefix of it; the few keys between are filtered out).
    pub fn start_after(&self) -> Option<String> {
        match &self.lo {
            Bound::Unbounded => None,
            Bound::Excluded(a) => Some(a.clone()),
            Bound::Included(s) => {
                let mut p = s.clone();
                p.pop();
                (!p.is_empty()).then_some(p)
            }
        }
    }

    /// `key` comes before the range.
    pub fn below(&self, key: &str) -> bool {
        match &self.lo {
            Bound::Unbounded => false,
            Bound::Included(s) => key < s.as_str(),
            Bound::Excluded(s) => key <= s.as_str(),
        }
    }

    /// `key` is at or past the upper end (so is everything listed after it).
    pub fn past(&self, key: &str) -> bool {
        self.hi.as_deref().is_some_and(|h| key >= h)
    }

    pub fn contains(&self, key: &str) -> bool {
        !self.below(key) && !self.past(key)
    }

    /// No key under directory `dir` (a key ending in '/') is in the range.
    pub fn skips_tree(&self, dir: &str) -> bool {
        let before = match &self.lo {
            Bound::Unbounded => false,
            Bound::Included(s) | Bound::Excluded(s) => dir < s.as_str() && !s.starts_with(dir),
        };
        before || self.past(dir)
    }
}

/// The upper end of a range being worked, which may be lowered while the run goes (a shared
/// job hands the back of a busy range to an idle worker). The run admits each key in order;
/// a cut is accepted only above every key admitted so far, so no key is worked on both sides.
#[derive(Debug, Default)]
pub struct MovableEnd(std::sync::Mutex<(Option<String>, Option<String>)>);

impl MovableEnd {
    /// The run may work on `key` (it is below the end); from now on no cut at or below it.
    pub fn admit(&self, key: &str) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.1.as_deref().is_some_and(|hi| key >= hi) {
            return false;
        }
        if g.0.as_deref().is_none_or(|last| key > last) {
            g.0 = Some(key.to_string());
        }
        true
    }

    /// The last key admitted.
    pub fn last(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Lower the end to `at`: refused when a key at or past `at` was admitted already, or the
    /// end is already at or below it.
    pub fn cut(&self, at: &str) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.as_deref().is_some_and(|last| last >= at)
            || g.1.as_deref().is_some_and(|hi| hi <= at)
        {
            return false;
        }
        g.1 = Some(at.to_string());
        true
    }
}

/// A tree listed one sorted directory level at a time (a local directory, a volume, an object
/// store without ordered recursive listing).
#[async_trait]
pub trait Tree: Send + Sync {
    type Level: Send;
    /// The children of directory `prefix` ("" or a key ending in '/'), to be taken in key
    /// order with `next`; directories as `name/`.
    async fn level(&self, prefix: &str) -> Result<Self::Level>;
    async fn next(&self, level: &mut Self::Level) -> Result<Option<Entry>>;
}

/// Send every entry under `prefix` within `range`, in ascending key order, in pages of 1000.
/// Subtrees wholly outside the range are not opened; the walk ends at the range's upper end.
pub async fn walk<T: Tree>(
    t: &T,
    prefix: &str,
    range: &KeyRange,
    dirs: bool,
    tx: &mpsc::Sender<Page>,
) -> Result<()> {
    let mut page = Vec::with_capacity(1000);
    let mut stack = vec![t.level(prefix).await?];
    while let Some(level) = stack.last_mut() {
        let Some(e) = t.next(level).await? else {
            stack.pop();
            continue;
        };
        if range.past(&e.key) {
            break;
        }
        if e.kind == Kind::Dir {
            if range.skips_tree(&e.key) {
                continue;
            }
            if dirs && range.contains(&e.key) {
                page.push(e.clone());
            }
            let l = t
                .level(&e.key)
                .await
                .with_context(|| format!("listing {}", e.key))?;
            stack.push(l);
        } else if range.contains(&e.key) {
            page.push(e);
        }
        if page.len() >= 1000 && tx.send(Ok(std::mem::take(&mut page))).await.is_err() {
            return Ok(()); // the receiver stopped
        }
    }
    if !page.is_empty() {
        let _ = tx.send(Ok(page)).await;
    }
    Ok(())
}

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
            ep.list("", &range, dirs, tx.clone()).await
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
        if range.past(&e.key) {
            break;
        }
        if e.kind == Kind::Dir {
            if range.skips_tree(&e.key) {
                continue;
            }
            if dirs && range.contains(&e.key) {
                out.push(Unit::One(e.clone()));
            }
            if depth > 1 {
                Box::pin(expand(ep, &e.key, depth - 1, dirs, range, out)).await?;
            } else {
                out.push(Unit::Tree(e.key));
            }
        } else if range.contains(&e.key) {
            out.push(Unit::One(e));
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
                    if let Err(e) = ep.list(&prefix, &range, dirs, t.clone()).await {
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

    #[test]
    fn a_movable_end_is_cut_only_past_what_was_admitted() {
        let e = MovableEnd::default();
        assert!(e.admit("a/1"));
        assert!(e.admit("a/2"));
        assert_eq!(e.last().as_deref(), Some("a/2"));
        // Not at or below a key already admitted.
        assert!(!e.cut("a/2"));
        assert!(!e.cut("a/1"));
        assert!(e.cut("b/"));
        // Keys past the cut are refused from now on; the end only moves down.
        assert!(!e.admit("b/"));
        assert!(!e.admit("c"));
        assert!(e.admit("a/3"));
        assert!(!e.cut("c/"));
        assert!(e.cut("a/5"));
        assert!(!e.admit("a/5"));
        assert!(e.admit("a/4"));
    }

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
