//! Which volume a store's `<name>/` prefix belongs to. A block key is made of the volume's
//! name and a slice id, so two volumes of the same name in one bucket would share keys: gc
//! of one would delete the other's blocks as leaked, and a cutover into such a prefix would
//! skip (or overwrite) blocks that only look like its own. `jfs format` and `jfs cutover
//! start` therefore claim the prefix with `<name>/jfs_volume` (the volume's uuid), and refuse
//! a prefix claimed by another volume or holding blocks of an unknown one; gc deletes no
//! leaked object in a prefix claimed by another volume.

use crate::error::{Error, ErrorKind, Result};
use crate::store::BlockStore;
use crate::types::Settings;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub const VERSION: u32 = 1;

impl crate::record::Versioned for Owner {
    const KIND: &'static str = "the owner record";
    const VERSION: u32 = VERSION;
}

/// The object that says whose a prefix is.
/// The name of the record under a volume's prefix in its store.
pub const RECORD: &str = "jfs_volume";

pub fn key(volume: &str) -> String {
    format!("{volume}/{RECORD}")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub version: u32,
    pub name: String,
    pub uuid: String,
    pub since_ns: i64,
    /// The metadata that holds the store, when a `jfs load` took it over (see
    /// `Settings::incarnation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
}

impl Owner {
    /// The record that makes `s`'s volume (and metadata incarnation) the owner, now.
    fn of(s: &Settings) -> Owner {
        Owner {
            version: VERSION,
            name: s.name.clone(),
            uuid: s.uuid.clone(),
            since_ns: crate::types::now_ns(),
            incarnation: s.incarnation.clone(),
        }
    }
}

/// The owner record of `settings.name`'s prefix in `store`, if any.
pub async fn read(store: &dyn BlockStore, name: &str) -> Result<Option<Owner>> {
    let k = key(name);
    // Look before reading: a read of a missing key may leave its directory behind (a local
    // store), and a refused format must leave the store as it was.
    if store.head(&k).await?.is_none() {
        return Ok(None);
    }
    match store.get(&k).await {
        Ok(b) => crate::record::decode_as(
            &format!(
                "{k} in {} (it is not jfs's, or it was damaged)",
                store.display_url()
            ),
            &b,
        )
        .map(Some),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What `claim` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The prefix was free; it is this volume's now.
    Claimed,
    /// This volume had claimed it before (a re-run).
    Ours,
}

/// Make `store`'s prefix for this volume its own, or say why it cannot be.
pub async fn claim(store: &dyn BlockStore, s: &Settings) -> Result<Claim> {
    let c = claimable(store, s).await?;
    if c == Claim::Claimed {
        let v = crate::record::encode(&Owner::of(s));
        store.put(&key(&s.name), Bytes::from(v)).await?;
    }
    Ok(c)
}

/// What `claim` would do, writing nothing: `Claimed` when the prefix is free, `Ours` when
/// this volume holds it, an error when it cannot be this volume's.
pub async fn claimable(store: &dyn BlockStore, s: &Settings) -> Result<Claim> {
    let url = store.display_url();
    if let Some(o) = read(store, &s.name).await? {
        if o.uuid == s.uuid {
            holds(&url, &o, s)?;
            return Ok(Claim::Ours);
        }
        return Err(taken(&url, &o));
    }
    // No owner: any block there is an unknown volume's (or one formatted before owner
    // records existed). Mixing with it would lose data either way.
    let mut found = 0u64;
    store
        .list(&crate::keys::blocks_prefix(&s.name), &mut |page| {
            found += page.len() as u64;
            Ok(())
        })
        .await
        .map_err(|e| e.context(format!("listing {url} (nothing was written)")))?;
    if found > 0 {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{url} already holds {found} blocks under {}/ of a volume named {:?} that is not this one (no {} record says whose): another volume's blocks would be mixed with this one's, and gc of either would delete the other's; use another bucket or prefix, or another volume name",
                s.name,
                s.name,
                key(&s.name)
            ),
        ));
    }
    Ok(Claim::Claimed)
}

/// Fail unless the prefix is unclaimed or this volume's (gc's check before deleting).
pub async fn check(store: &dyn BlockStore, s: &Settings) -> Result<()> {
    match read(store, &s.name).await? {
        Some(o) if o.uuid != s.uuid => Err(taken(&store.display_url(), &o)),
        Some(o) => holds(&store.display_url(), &o, s),
        None => Ok(()),
    }
}

/// A writer's check at open: this metadata still holds the store (no `jfs load` of a dump of
/// this volume took it over since), and the store is the volume's at all: one with no owner
/// record and none of the volume's blocks while the metadata says it holds `used` bytes is
/// another directory or bucket (a disk not mounted, a mistyped or swapped path), where
/// writes would land apart from every block the volume has.
pub async fn check_holder(store: &dyn BlockStore, s: &Settings, used: u64) -> Result<()> {
    match read(store, &s.name).await? {
        Some(o) if o.uuid == s.uuid => holds(&store.display_url(), &o, s),
        Some(_) => Ok(()),
        None if used == 0 => Ok(()),
        None => {
            // A volume formatted before owner records has blocks here and no record.
            let mut found = false;
            let stop = || Error::new(ErrorKind::Conflict, "found a block");
            let r = store
                .list(&crate::keys::blocks_prefix(&s.name), &mut |page| {
                    if page.is_empty() {
                        Ok(())
                    } else {
                        found = true;
                        Err(stop())
                    }
                })
                .await;
            match r {
                Ok(()) if !found => Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "{} is not the store of volume {:?}: it holds no {} record and none of its blocks, while the volume's metadata counts {} bytes stored. Is the store's disk mounted, or its URL mistyped? Nothing was written; mount the disk (or give the right URL) and run this again",
                        store.display_url(),
                        s.name,
                        key(&s.name),
                        used
                    ),
                )),
                Ok(()) => Ok(()),
                Err(_) if found => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

/// Make the store's prefix held by this metadata (`jfs load`, after the load committed): the
/// metadata the dump came from is refused as a writer from then on.
pub async fn take_over(store: &dyn BlockStore, s: &Settings) -> Result<()> {
    if let Some(o) = read(store, &s.name).await? {
        if o.uuid != s.uuid {
            return Err(taken(&store.display_url(), &o));
        }
    }
    store
        .put(
            &key(&s.name),
            Bytes::from(crate::record::encode(&Owner::of(s))),
        )
        .await
}

/// A time of a record (nanoseconds since the epoch) as a person reads it: RFC 3339, UTC.
pub(crate) fn rfc3339(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn holds(url: &str, o: &Owner, s: &Settings) -> Result<()> {
    if o.incarnation == s.incarnation {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::ReadOnly,
        format!(
            "the blocks of volume {:?} in {url} are held by other metadata: a `jfs load` of a dump of this volume (or a `jfs recover` of its backups) took the store over at {}. This metadata is retired: writing here would overwrite the loaded volume's blocks, and its gc would delete them. Use the metadata the dump was loaded (or recovered) into",
            o.name,
            rfc3339(o.since_ns)
        ),
    ))
}

fn taken(url: &str, o: &Owner) -> Error {
    Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "{url} holds the blocks of another volume named {:?} (uuid {}, per {}): two volumes of one name cannot share a store prefix (their block keys collide); use another bucket or prefix, or another volume name",
            o.name,
            o.uuid,
            key(&o.name)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_format_opens_and_a_newer_one_is_refused() {
        let raw = br#"{"version":1,"name":"v","uuid":"u-1","since_ns":7}"#;
        let o: Owner = crate::record::decode(raw).unwrap();
        assert_eq!(
            (o.name.as_str(), o.uuid.as_str(), o.since_ns),
            ("v", "u-1", 7)
        );
        assert_eq!(crate::record::encode(&o), raw);
        let e =
            crate::record::decode::<Owner>(br#"{"version":2,"name":"v","uuid":"u","since_ns":7}"#)
                .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
    }

    #[test]
    fn a_retired_metadatas_refusal_says_when_as_a_date() {
        let o = Owner {
            version: 1,
            name: "v".into(),
            uuid: "u".into(),
            since_ns: 1_795_877_889_123_456_789,
            incarnation: Some("loaded".into()),
        };
        let s = Settings::new("v", "file:///s", 4 << 20);
        let e = holds("file:///s", &o, &s).unwrap_err().to_string();
        assert!(
            e.contains("took the store over at 2026-11-28T14:58:09Z."),
            "{e}"
        );
        assert!(!e.contains("1795877889"), "{e}");
    }

    #[test]
    fn the_owner_key_is_outside_the_blocks() {
        assert_eq!(key("vol"), "vol/jfs_volume");
        assert!(!key("vol").starts_with(&crate::keys::blocks_prefix("vol")));
        assert!(crate::keys::parse_block_key("vol", &key("vol")).is_none());
    }
}
