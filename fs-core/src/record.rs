//! The contract every persisted record follows, so that the next release can still open what
//! this one wrote and this one never misreads what a newer one wrote:
//!
//! - a record carries its format version (in its JSON, under `Versioned::VERSION_KEY`; a record
//!   that has none is version 1, as first releases wrote them);
//! - a version newer than this build knows is refused with a message naming the record and
//!   both versions, never read as if it were an older one;
//! - an older version is brought up to date by `Versioned::upgrade` before it is decoded;
//! - a version no release writes (0, negative, not a whole number) and a record that is not
//!   a JSON object are damaged records, refused as corrupt.
//!
//! `encode` / `decode` for records kept as JSON (settings-like records, aux records, job
//! rows); `encode_bin` / `decode_bin` for compact records (a version byte, then the body).

use crate::error::{Error, ErrorKind, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A record kept as JSON.
pub trait Versioned: Serialize + DeserializeOwned {
    /// What the record is, for messages ("the storage record").
    const KIND: &'static str;
    /// The format version this release writes.
    const VERSION: u32;
    /// The JSON field that holds the format version.
    const VERSION_KEY: &'static str = "version";

    /// The JSON of version `from` (older than `VERSION`) brought up to `VERSION`. The
    /// default suits versions that only added fields with serde defaults.
    fn upgrade(from: u32, value: serde_json::Value) -> Result<serde_json::Value> {
        let _ = from;
        Ok(value)
    }
}

/// `r` as JSON, with its format version set.
pub fn encode<T: Versioned>(r: &T) -> Vec<u8> {
    let mut v = serde_json::to_value(r).expect("a record serializes");
    if v.get(T::VERSION_KEY) == Some(&T::VERSION.into()) {
        // The record carries its version itself: keep its fields in their declared order.
        return serde_json::to_vec(r).expect("a record serializes");
    }
    if let Some(o) = v.as_object_mut() {
        o.insert(T::VERSION_KEY.to_string(), T::VERSION.into());
    }
    serde_json::to_vec(&v).expect("a record serializes")
}

/// The format version of a record's JSON (absent: 1; a value that is no version any
/// release wrote, 0 or not a whole number, counts as 0).
pub fn version_of<T: Versioned>(v: &serde_json::Value) -> u32 {
    match v.get(T::VERSION_KEY) {
        None => 1,
        Some(n) => n.as_u64().map_or(0, |n| n.min(u32::MAX as u64) as u32),
    }
}

/// Decode a record written by this release or an older one; refuse a newer one.
pub fn decode<T: Versioned>(raw: &[u8]) -> Result<T> {
    decode_as(T::KIND, raw)
}

/// `decode`, with messages naming the record as `what` (e.g. "replication slot record
/// slot.eu") rather than by its kind.
pub fn decode_as<T: Versioned>(what: &str, raw: &[u8]) -> Result<T> {
    let v: serde_json::Value = serde_json::from_slice(raw)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{what} does not decode: {e}")))?;
    decode_value_as(what, v)
}

/// `decode` of JSON already parsed.
pub fn decode_value<T: Versioned>(v: serde_json::Value) -> Result<T> {
    decode_value_as(T::KIND, v)
}

fn decode_value_as<T: Versioned>(what: &str, mut v: serde_json::Value) -> Result<T> {
    if !v.is_object() {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{what} does not decode: it is not a JSON object"),
        ));
    }
    let have = version_of::<T>(&v);
    if have == 0 {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "{what} does not decode: its {} is {}, which no release writes (a damaged record)",
                T::VERSION_KEY,
                v[T::VERSION_KEY]
            ),
        ));
    }
    if have > T::VERSION {
        return Err(newer(what, have, T::VERSION));
    }
    if have < T::VERSION {
        v = T::upgrade(have, v)?;
        if let Some(o) = v.as_object_mut() {
            o.insert(T::VERSION_KEY.to_string(), T::VERSION.into());
        }
    }
    serde_json::from_value(v)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{what} does not decode: {e}")))
}

/// The refusal of a record written by a newer release.
pub fn newer(kind: &str, have: u32, know: u32) -> Error {
    Error::new(
        ErrorKind::UnsupportedVersion,
        format!(
            "{kind} is of format version {have}, written by a newer release (this one reads up to {know}): upgrade this binary before using it; nothing was changed"
        ),
    )
}

/// A compact record: a version byte, then a body of that version.
pub trait VersionedBin: Sized {
    const KIND: &'static str;
    const VERSION: u8;
    fn encode_body(&self, out: &mut Vec<u8>);
    /// Decode a body of `version` (at most `VERSION`; older ones are read as they were).
    fn decode_body(version: u8, body: &[u8]) -> Result<Self>;
}

pub fn encode_bin<T: VersionedBin>(r: &T) -> Vec<u8> {
    let mut out = vec![T::VERSION];
    r.encode_body(&mut out);
    out
}

pub fn decode_bin<T: VersionedBin>(raw: &[u8]) -> Result<T> {
    let (&v, body) = raw
        .split_first()
        .ok_or_else(|| Error::new(ErrorKind::Corrupt, format!("{} is empty", T::KIND)))?;
    if v > T::VERSION {
        return Err(newer(T::KIND, v as u32, T::VERSION as u32));
    }
    T::decode_body(v, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// Version 2 renamed `n` to `count` and added `note`.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thing {
        count: u64,
        #[serde(default)]
        note: String,
    }

    impl Versioned for Thing {
        const KIND: &'static str = "the thing record";
        const VERSION: u32 = 2;
        fn upgrade(from: u32, mut v: serde_json::Value) -> Result<serde_json::Value> {
            if from < 2 {
                let n = v["n"].take();
                v["count"] = n;
            }
            Ok(v)
        }
    }

    #[test]
    fn records_carry_their_version_and_older_ones_are_upgraded() {
        let t = Thing {
            count: 3,
            note: "x".into(),
        };
        let raw = encode(&t);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&raw).unwrap()["version"],
            2
        );
        assert_eq!(decode::<Thing>(&raw).unwrap(), t);
        // As the first release wrote it: no version, the old field name.
        let old = decode::<Thing>(br#"{"n": 7}"#).unwrap();
        assert_eq!((old.count, old.note.as_str()), (7, ""));
        let e = decode::<Thing>(br#"{"version": 3, "count": 1}"#).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
        assert!(
            e.to_string()
                .contains("the thing record is of format version 3"),
            "{e}"
        );
        assert_eq!(
            decode::<Thing>(b"{nope").unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    struct Pair(u8, u8);

    impl VersionedBin for Pair {
        const KIND: &'static str = "a pair";
        const VERSION: u8 = 2;
        fn encode_body(&self, out: &mut Vec<u8>) {
            out.extend([self.0, self.1]);
        }
        fn decode_body(version: u8, body: &[u8]) -> Result<Self> {
            match (version, body) {
                (1, [a]) => Ok(Pair(*a, 0)),
                (2, [a, b]) => Ok(Pair(*a, *b)),
                _ => Err(Error::new(ErrorKind::Corrupt, "a pair of the wrong length")),
            }
        }
    }

    #[test]
    fn compact_records_carry_a_version_byte() {
        let raw = encode_bin(&Pair(1, 2));
        assert_eq!(raw, vec![2, 1, 2]);
        let p = decode_bin::<Pair>(&raw).unwrap();
        assert_eq!((p.0, p.1), (1, 2));
        let p = decode_bin::<Pair>(&[1, 9]).unwrap();
        assert_eq!((p.0, p.1), (9, 0));
        let e = decode_bin::<Pair>(&[3, 1, 2]).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
        assert!(decode_bin::<Pair>(&[]).is_err());
    }
}
