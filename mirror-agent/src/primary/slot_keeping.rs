//! Replication slots at the primary: one per configured mirror, registered at the start;
//! acknowledgements recorded in them; dropped by an operator (through this agent, so no
//! acknowledgement brings one back) or marked for resync past the retention cap.

use super::*;

impl Primary {
    pub(super) async fn register_slots(&self) -> Result<()> {
        let existing = slots::list(&*self.engine).await?;
        let head = self.engine.journal_bounds().await?.last;
        for name in self.tokens.keys() {
            if !existing.iter().any(|s| &s.name == name) {
                let now = fs_core::now_ns();
                slots::put(
                    &*self.engine,
                    &Slot {
                        version: slots::SLOT_VERSION,
                        name: name.clone(),
                        acked: head,
                        acked_ns: now,
                        state: SlotState::Active,
                        reason: None,
                        registered_ns: now,
                        holder: None,
                    },
                )
                .await?;
                tracing::info!(mirror = %name, from = head, "registered a replication slot");
            }
        }
        for s in &existing {
            if !self.tokens.contains_key(&s.name) {
                tracing::warn!(mirror = %s.name, acked = s.acked, "a replication slot exists for a mirror that is not in the config; it still holds gc (drop it with `mirror-agent slot drop`)");
            }
        }
        Ok(())
    }

    /// Drop a slot, here where acknowledgements are written: under the slot lock, so no
    /// acknowledgement persisted concurrently can bring it back; the mirror's connection is
    /// closed and the status shows the slot gone at once.
    pub async fn drop_slot(&self, name: &str) -> Result<String> {
        {
            let _g = self.slot_lock.lock().await;
            if slots::get(&*self.engine, name).await?.is_none() {
                bail!("no replication slot named {name:?} (see `mirror-agent slot list`)");
            }
            slots::remove(&*self.engine, name).await?;
        }
        if let Some((_, t)) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
        {
            t.cancel();
        }
        self.metrics.remove_slot(name);
        let _ = self.refresh_status().await;
        tracing::warn!(mirror = %name, "replication slot dropped by an operator: gc and journal retention no longer wait for it; if it connects again it must resync");
        Ok(format!("dropped slot {name:?}: gc and journal retention no longer wait for it; if the mirror connects again, it resyncs from a snapshot"))
    }

    /// Whether the mirror metadata copy `identity` may use slot `mirror`: Err(why) when
    /// another copy holds it (two agents with one name). Reads only.
    pub(super) async fn check_holder(
        &self,
        mirror: &str,
        identity: &str,
        peer: &str,
    ) -> Result<std::result::Result<(), String>> {
        let slot = slots::get(&*self.engine, mirror).await?;
        Ok(match slot.and_then(|s| s.holder) {
            Some(h) if h.identity != identity => Err(another_copy(mirror, &h, identity, peer)),
            _ => Ok(()),
        })
    }

    /// Record `identity` as the copy whose acknowledgements slot `mirror` holds, unless
    /// another copy holds it: Err(why) then. Under the slot lock.
    pub(super) async fn take_slot(
        &self,
        mirror: &str,
        identity: &str,
        peer: &str,
    ) -> Result<std::result::Result<(), String>> {
        let _g = self.slot_lock.lock().await;
        let Some(mut s) = slots::get(&*self.engine, mirror).await? else {
            return Ok(Ok(()));
        };
        match &s.holder {
            Some(h) if h.identity == identity => Ok(Ok(())),
            Some(h) => Ok(Err(another_copy(mirror, h, identity, peer))),
            None if identity.is_empty() => Ok(Ok(())),
            None => {
                s.holder = Some(slots::SlotHolder {
                    identity: identity.to_string(),
                    peer: peer.to_string(),
                    since_ns: fs_core::now_ns(),
                });
                slots::put(&*self.engine, &s).await?;
                tracing::info!(mirror, %identity, peer, "the replication slot is held by this copy of the mirror's metadata from now on");
                Ok(Ok(()))
            }
        }
    }

    /// Read-modify-write of one slot; None when the slot is gone (dropped by an operator).
    pub(super) async fn update_slot(
        &self,
        name: &str,
        f: impl FnOnce(&mut Slot),
    ) -> Result<Option<Slot>> {
        let _g = self.slot_lock.lock().await;
        let Some(mut s) = slots::get(&*self.engine, name).await? else {
            return Ok(None);
        };
        let before = s.clone();
        f(&mut s);
        if s != before {
            slots::put(&*self.engine, &s).await?;
        }
        Ok(Some(s))
    }

    /// Record an acknowledgement in an active slot; the slot as it now is (None: dropped).
    pub(super) async fn persist_ack(&self, mirror: &str, acked: u64) -> Result<Option<Slot>> {
        self.update_slot(mirror, |s| {
            if s.state == SlotState::Active && acked > s.acked {
                s.acked = acked;
                s.acked_ns = fs_core::now_ns();
            }
        })
        .await
    }

    /// Mark slots past the retention cap as needing resync: loudly, never silently.
    pub(super) async fn enforce_caps(&self) -> Result<()> {
        let head = self.engine.journal_bounds().await?.last;
        for s in slots::list(&*self.engine).await? {
            if s.state != SlotState::Active || s.acked >= head {
                continue;
            }
            let behind = head - s.acked;
            let mut reason = None;
            if behind > self.cfg.retain_max_entries {
                reason = Some(format!(
                    "{behind} entries behind, over retain_max_entries = {}",
                    self.cfg.retain_max_entries
                ));
            } else if let Some(time_ns) = oldest_unacked_ns(&*self.engine, s.acked).await? {
                let age = Duration::from_nanos((fs_core::now_ns() - time_ns).max(0) as u64);
                if age > self.cfg.retain_max_age {
                    reason = Some(format!(
                        "oldest unacknowledged entry is {} old, over retain_max_age = {}",
                        humantime::format_duration(Duration::from_secs(age.as_secs())),
                        humantime::format_duration(self.cfg.retain_max_age)
                    ));
                }
            }
            if let Some(reason) = reason {
                tracing::error!(mirror = %s.name, acked = s.acked, head, %reason, "replication slot dropped: the journal is no longer held for this mirror; it must resync from a snapshot");
                self.update_slot(&s.name, |s| {
                    s.state = SlotState::NeedsResync;
                    s.reason = Some(reason.clone());
                })
                .await?;
            }
        }
        Ok(())
    }
}

/// The refusal of a second copy of a mirror's metadata under one name.
fn another_copy(mirror: &str, h: &slots::SlotHolder, identity: &str, peer: &str) -> String {
    let since = std::time::UNIX_EPOCH + Duration::from_nanos(h.since_ns.max(0) as u64);
    let this = if identity.is_empty() {
        "metadata that has no identity yet (a mirror agent that never ran)".to_string()
    } else {
        format!("metadata {identity}")
    };
    format!(
        "mirror {mirror:?}: its replication slot is held by another copy of its metadata (identity {}, first connected from {} at {}); this agent at {peer} has {this}. Two mirror agents run with one name: stop one, or give it a name of its own (and an entry in [[primary.mirrors]]). If this mirror's metadata was replaced on purpose (resynced from empty metadata), drop the slot at the primary: `mirror-agent slot drop {mirror} --meta PRIMARY_META_URL`, and the next copy to connect takes it",
        h.identity,
        h.peer,
        humantime::format_rfc3339_seconds(since),
    )
}

/// The commit time of the oldest retained entry after `acked` (None: none, or the journal
/// could not be read). Its frame must be the entry of the seq it is stored under: a
/// misfiled or damaged one is an error naming it (its time would judge the slot's age).
pub(crate) async fn oldest_unacked_ns(engine: &dyn Engine, acked: u64) -> Result<Option<i64>> {
    let Some((seq, f)) = engine
        .journal_read(acked.saturating_add(1), 1)
        .await
        .ok()
        .and_then(|v| v.into_iter().next())
    else {
        return Ok(None);
    };
    let e = Entry::decode_at(seq, &f)
        .with_context(|| format!("journal entry {seq} in {}", engine.display_url()))?;
    Ok(Some(e.time_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43, fuzzing: a slot's age was judged from whatever frame was stored after its
    /// acknowledgement (`Entry::decode` without the seq check); a misfiled one is an error.
    #[tokio::test]
    async fn a_slots_oldest_entry_is_checked_against_its_seq() {
        let d = tempfile::tempdir().unwrap();
        let ok = crate::primary::stream::tests::journal(d.path(), &[(1, 1), (2, 2), (3, 3)]).await;
        assert_eq!(oldest_unacked_ns(&*ok, 1).await.unwrap(), Some(2000));
        assert_eq!(oldest_unacked_ns(&*ok, 3).await.unwrap(), None);
        let d = tempfile::tempdir().unwrap();
        let bad = crate::primary::stream::tests::journal(d.path(), &[(1, 1), (2, 9), (3, 3)]).await;
        let msg = format!("{:#}", oldest_unacked_ns(&*bad, 1).await.unwrap_err());
        assert!(
            msg.contains("journal entry 2") && msg.contains("holds the frame of entry 9"),
            "{msg}"
        );
    }
}
