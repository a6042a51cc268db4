//! A snapshot for a mirror that starts over: the slot is pinned at the snapshot's start
//! first, so the journal after it is retained while the key space is sent in pages.

use super::*;

impl Primary {
    /// Send a snapshot and return its starting sequence number. The slot is pinned at the
    /// start first, so the journal after it is retained while the pairs are read.
    pub(super) async fn send_snapshot<S: crate::proto::FrameSink>(
        &self,
        mirror: &str,
        sink: &mut S,
    ) -> Result<u64> {
        let s0 = loop {
            let s0 = self.engine.journal_bounds().await?.last;
            self.update_slot(mirror, |s| {
                s.acked = s0;
                s.acked_ns = fs_core::now_ns();
                s.state = SlotState::Active;
                s.reason = None;
            })
            .await?;
            // A trim that raced the pin would show as a first entry past s0 + 1.
            let b = self.engine.journal_bounds().await?;
            if b.first <= s0 + 1 {
                break s0;
            }
        };
        tracing::info!(mirror, seq = s0, "sending a snapshot");
        proto::send(
            sink,
            &ToMirror::SnapshotBegin {
                seq: s0,
                settings: self.settings_now().await?,
            },
        )
        .await?;
        let mut n = 0u64;
        let mut from = Vec::new();
        loop {
            let page = self.engine.scan(&from, &[0xff], 1000).await?;
            let len = page.len();
            n += len as u64;
            if let Some((k, _)) = page.last() {
                from = k.clone();
                from.push(0);
            }
            if len > 0 {
                proto::send(sink, &ToMirror::SnapshotPairs { pairs: page }).await?;
            }
            // Only an empty page ends it: what the snapshot lacks, a mirror never gets.
            if len == 0 {
                break;
            }
        }
        let s_end = self.engine.journal_bounds().await?.last;
        proto::send(sink, &ToMirror::SnapshotEnd { seq: s_end }).await?;
        tracing::info!(mirror, keys = n, s0, s_end, "snapshot sent");
        Ok(s0)
    }

    /// The volume's settings as they are now (they change through the journal).
    pub(super) async fn settings_now(&self) -> Result<Vec<u8>> {
        self.engine
            .get(keys::SETTING)
            .await?
            .context("the volume's settings are gone")
    }
}
