//! The one walk of a tree listed a sorted directory level at a time (a local directory, a
//! volume, an object store without ordered recursive listing): depth first, in ascending key
//! order, pages of 1000, never opening a subtree wholly outside the range.

use super::Listing;
use crate::entry::{Entry, Page};
use crate::range::Step;
use anyhow::{Context, Result};
use async_trait::async_trait;
use tokio::sync::mpsc;

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
pub async fn walk<T: Tree>(t: &T, l: Listing<'_>, tx: &mpsc::Sender<Page>) -> Result<()> {
    let Listing {
        prefix,
        range,
        dirs,
    } = l;
    let mut page = Vec::with_capacity(1000);
    let mut stack = vec![t.level(prefix).await?];
    while let Some(level) = stack.last_mut() {
        let Some(e) = t.next(level).await? else {
            stack.pop();
            continue;
        };
        match range.step(&e, dirs) {
            Step::Stop => break,
            Step::Skip => continue,
            Step::Keep => page.push(e),
            Step::Open { keep } => {
                let l = t
                    .level(&e.key)
                    .await
                    .with_context(|| format!("listing {}", e.key))?;
                stack.push(l);
                if keep {
                    page.push(e);
                }
            }
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
