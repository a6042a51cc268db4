//! Replication slots: one record per registered mirror, kept in the volume's aux records
//! (beside the metadata, outside the journal). A slot holds the highest sequence number the
//! mirror has durably applied and acknowledged. Two rules follow from it:
//! - journal retention: entries above the lowest `acked` of the *active* slots are kept, up
//!   to the operator's cap; past the cap the primary agent marks the slot `needs_resync`
//!   (loudly) and stops holding the journal for it;
//! - garbage collection: a pending delete freed at seq `s` is purged only when every
//!   registered slot (active or not) has `acked >= s`, so a mirror's fallback reads to the
//!   origin never find a block gone. `mirror-agent slot drop` releases a dead mirror.
//!
//! A slot also records which copy of the mirror's metadata acknowledges into it (`holder`,
//! from version 2): the first copy that connects under the name takes it, another copy under
//! the same name is refused, so acknowledgements never come from two histories. `slot drop`
//! forgets the holder with the slot (a mirror whose metadata was replaced on purpose).

use crate::engine::Engine;
use crate::error::Result;
use serde::{Deserialize, Serialize};

pub const PREFIX: &str = "slot.";
/// The slot record's version: readers refuse a newer one instead of misreading it (new
/// fields come with serde defaults; a record of the first release has none and reads as 1).
/// 2: `holder`, the metadata copy that acknowledges (a version-1 slot has none: the next
/// copy to connect takes it).
pub const SLOT_VERSION: u32 = 2;

fn version_one() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotState {
    Active,
    NeedsResync,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    #[serde(default = "version_one")]
    pub version: u32,
    pub name: String,
    pub acked: u64,
    pub acked_ns: i64,
    pub state: SlotState,
    #[serde(default)]
    pub reason: Option<String>,
    pub registered_ns: i64,
    /// The mirror metadata copy whose acknowledgements this slot holds (None: not taken yet).
    #[serde(default)]
    pub holder: Option<SlotHolder>,
}

/// The copy of a mirror's metadata that holds a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotHolder {
    /// The identity the mirror agent sends in its hello (random, kept in its metadata).
    pub identity: String,
    /// Where it connected from when it took the slot, and when.
    pub peer: String,
    pub since_ns: i64,
}

pub async fn list(engine: &dyn Engine) -> Result<Vec<Slot>> {
    let mut out = Vec::new();
    for (name, v) in engine.aux_list(PREFIX).await? {
        out.push(decode(&name, &v)?);
    }
    Ok(out)
}

impl crate::record::Versioned for Slot {
    const KIND: &'static str = "a replication slot record";
    const VERSION: u32 = SLOT_VERSION;
    /// 1 -> 2 added `holder` (default: none, taken by the next copy that connects).
    fn upgrade(_from: u32, value: serde_json::Value) -> Result<serde_json::Value> {
        Ok(value)
    }
}

/// A slot record, or an error naming it (damaged, or of a newer version).
fn decode(name: &str, v: &[u8]) -> Result<Slot> {
    crate::record::decode_as(&format!("replication slot record {name}"), v)
}

pub async fn get(engine: &dyn Engine, name: &str) -> Result<Option<Slot>> {
    Ok(list(engine).await?.into_iter().find(|s| s.name == name))
}

pub async fn put(engine: &dyn Engine, slot: &Slot) -> Result<()> {
    let v = crate::record::encode(slot);
    engine
        .aux_put(&format!("{PREFIX}{}", slot.name), Some(&v))
        .await
}

pub async fn remove(engine: &dyn Engine, name: &str) -> Result<()> {
    engine.aux_put(&format!("{PREFIX}{name}"), None).await
}

/// Pending deletes freed above this must be kept (`u64::MAX` with no slots).
pub fn gc_safe_seq(slots: &[Slot]) -> u64 {
    slots.iter().map(|s| s.acked).min().unwrap_or(u64::MAX)
}

/// Journal entries above this must be kept (`u64::MAX` with no active slot).
pub fn retain_floor(slots: &[Slot]) -> u64 {
    slots
        .iter()
        .filter(|s| s.state == SlotState::Active)
        .map(|s| s.acked)
        .min()
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str, acked: u64, state: SlotState) -> Slot {
        Slot {
            version: SLOT_VERSION,
            name: name.into(),
            acked,
            acked_ns: 0,
            state,
            reason: None,
            registered_ns: 0,
            holder: None,
        }
    }

    #[test]
    fn a_slot_record_of_the_first_release_reads_and_a_newer_one_is_refused() {
        let old = r#"{"name":"eu","acked":7,"acked_ns":1,"state":"active","registered_ns":1}"#;
        let s = decode("slot.eu", old.as_bytes()).unwrap();
        // Upgraded on reading: the current version, with no holder.
        assert_eq!((s.version, s.acked, s.reason), (SLOT_VERSION, 7, None));
        assert_eq!(s.holder, None);
        let newer = old.replace('{', r#"{"version":9,"#);
        let e = decode("slot.eu", newer.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("version 9") && e.contains("slot.eu"), "{e}");
    }

    /// Version 1 as the release before this one wrote it: no holder; read as version 2
    /// with none, and written back as version 2 with the holder it takes.
    #[test]
    fn a_version_1_slot_reads_with_no_holder_and_keeps_one_once_taken() {
        let v1 = r#"{"version":1,"name":"eu","acked":7,"acked_ns":1,"state":"active","reason":null,"registered_ns":1}"#;
        let mut s = decode("slot.eu", v1.as_bytes()).unwrap();
        assert_eq!((s.version, s.acked, s.holder.clone()), (2, 7, None));
        s.holder = Some(SlotHolder {
            identity: "0123abcd".into(),
            peer: "10.0.0.2:40000".into(),
            since_ns: 5,
        });
        let raw = crate::record::encode(&s);
        let back = decode("slot.eu", &raw).unwrap();
        assert_eq!(back, s);
        assert!(String::from_utf8_lossy(&raw).contains(r#""version":2"#));
    }

    #[test]
    fn floors_follow_the_slowest_mirror() {
        assert_eq!(gc_safe_seq(&[]), u64::MAX);
        assert_eq!(retain_floor(&[]), u64::MAX);
        let s = [
            slot("a", 50, SlotState::Active),
            slot("b", 10, SlotState::NeedsResync),
            slot("c", 70, SlotState::Active),
        ];
        // A mirror marked for resync still holds GC (it may serve stale metadata and fall
        // back to the origin) but no longer holds the journal.
        assert_eq!(gc_safe_seq(&s), 10);
        assert_eq!(retain_floor(&s), 50);
    }
}

/// Set (an aux record at a *mirror's* metadata) while a snapshot is being installed or caught
/// up: the tree is then incomplete and readers must not take it for a volume state.
pub const MIRROR_INCOMPLETE: &str = "mirror.incomplete";

/// The seq range `(s0, s_end)` of a bootstrap in progress at this (mirror) metadata, if any.
pub async fn incomplete(engine: &dyn Engine) -> Result<Option<String>> {
    Ok(engine
        .aux_list(MIRROR_INCOMPLETE)
        .await?
        .into_iter()
        .find(|(n, _)| n == MIRROR_INCOMPLETE)
        .map(|(_, v)| String::from_utf8_lossy(&v).into_owned()))
}
