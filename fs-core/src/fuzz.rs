//! The shared kit of the decoder harnesses ("bad bytes at every door"): damage a valid
//! encoding the ways storage, networks and hostile peers do (flip bits, truncate, extend,
//! splice a lying length, duplicate a range, ...), damage a JSON record structurally (a field
//! of the wrong type, a huge or negative number, a missing or unknown field, another version,
//! deep nesting), and run a harness seeded and counted the same way everywhere.
//!
//! Structure-aware: each harness generates valid values with proptest strategies, encodes
//! them, then damages the encoding with `damaged` / `json_damaged`; random bytes alone rarely
//! get past a checksum or a JSON parser.
//!
//! Runs: `JFS_FUZZ_CASES` cases per harness (default 10,000: the suite), seed `JFS_FUZZ_SEED`
//! (a number; default fixed, so a run is repeatable). A failing case is shrunk and printed
//! with the seed that found it (`integration/fuzz.sh` runs 1,000,000 in release).
//!
//! Compiled for this crate's tests and, with the `fuzz` feature, for other crates' tests.

use crate::error::ErrorKind;
use crate::record::{self, Versioned};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{
    Config, RngAlgorithm, TestCaseError, TestCaseResult, TestRng, TestRunner,
};
use serde_json::Value;

/// Cases per harness: `JFS_FUZZ_CASES`, else 10,000.
pub fn cases() -> u32 {
    std::env::var("JFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(10_000)
}

/// The seed: `JFS_FUZZ_SEED`, else a fixed one.
pub fn seed() -> u64 {
    std::env::var("JFS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x6a66_735f_6675_7a7a)
}

/// Run harness `name`: `cases()` inputs from `strategy`, seeded by `seed()` and the name (each
/// harness its own sequence). Panics (failing the test) with the shrunk input on a failure.
pub fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S::Value: std::fmt::Debug,
{
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed().to_le_bytes());
    key[8..12].copy_from_slice(&crc32c::crc32c(name.as_bytes()).to_le_bytes());
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        // Shrinking a failure of a fast decoder is cheap; keep it bounded all the same.
        max_shrink_iters: 10_000,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let started = std::time::Instant::now();
    if let Err(e) = runner.run(&strategy, test) {
        panic!(
            "fuzz harness {name} (JFS_FUZZ_SEED={}, JFS_FUZZ_CASES={}): {e}",
            seed(),
            cases()
        );
    }
    let secs = started.elapsed().as_secs_f64();
    if std::env::var_os("JFS_FUZZ_REPORT").is_some() {
        println!(
            "fuzz {name}: {} cases in {secs:.2} s, {:.0} cases/s",
            cases(),
            cases() as f64 / secs.max(1e-9)
        );
    }
}

/// Lengths a liar writes: around the truth, the limits of each width, and huge.
fn lying_value(truth: usize) -> impl Strategy<Value = u64> {
    let t = truth as u64;
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(t.saturating_sub(1)),
        Just(t + 1),
        Just(t * 2 + 7),
        Just(0x7f),
        Just(0xff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(u32::MAX as u64),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

/// One damage done to an encoding.
#[derive(Debug, Clone)]
pub enum Damage {
    /// Flip one bit.
    Flip(Index, u8),
    /// Keep only the first part.
    Truncate(Index),
    /// Append bytes.
    Extend(Vec<u8>),
    /// Insert bytes somewhere.
    Insert(Index, Vec<u8>),
    /// Remove up to n bytes somewhere.
    Remove(Index, u8),
    /// Overwrite bytes somewhere with these.
    Overwrite(Index, Vec<u8>),
    /// Write a length (little- or big-endian, 1, 2, 4 or 8 bytes) over the bytes somewhere.
    Length(Index, u8, bool, u64),
    /// Insert a LEB128 varint (postcard's lengths) somewhere.
    Varint(Index, u64),
    /// Copy a range of the encoding to another place (a duplicated record, a repeated field).
    Duplicate(Index, Index, Index),
    /// Set a byte to a boundary value.
    Byte(Index, u8),
    /// Insert text that parsers of names and numbers treat specially.
    Text(Index, &'static str),
}

/// What `Damage::Text` inserts: signs, zeros, separators, dots, escapes.
pub const TEXTS: &[&str] = &[
    "+", "-", "0", "00", "_", "/", ".", "..", "/../", " ", "\0", "\\x:", "%2f", "?", "#", "@", ":",
    "=", "&", "\n", "\u{202e}", "1e3", "0x1",
];

/// 1 to 3 damages, for an encoding of about `len` bytes.
pub fn damages(len: usize) -> impl Strategy<Value = Vec<Damage>> {
    let one = prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Damage::Flip(i, b)),
        2 => any::<Index>().prop_map(Damage::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..16).prop_map(Damage::Extend),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Damage::Insert(i, b)),
        1 => (any::<Index>(), 1u8..16).prop_map(|(i, n)| Damage::Remove(i, n)),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Damage::Overwrite(i, b)),
        2 => (any::<Index>(), prop_oneof![Just(1u8), Just(2), Just(4), Just(8)], any::<bool>(), lying_value(len))
            .prop_map(|(i, w, le, v)| Damage::Length(i, w, le, v)),
        2 => (any::<Index>(), lying_value(len)).prop_map(|(i, v)| Damage::Varint(i, v)),
        1 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(a, b, c)| Damage::Duplicate(a, b, c)),
        1 => (any::<Index>(), prop_oneof![Just(0u8), Just(1), Just(0x7f), Just(0x80), Just(0xff), any::<u8>()])
            .prop_map(|(i, b)| Damage::Byte(i, b)),
        2 => (any::<Index>(), proptest::sample::select(TEXTS)).prop_map(|(i, t)| Damage::Text(i, t)),
    ];
    proptest::collection::vec(one, 1..4)
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// `valid` with `damages` done to it, in order.
pub fn apply(valid: &[u8], damages: &[Damage]) -> Vec<u8> {
    let mut b = valid.to_vec();
    for d in damages {
        // Positions index the bytes as they are now (0..=len for insertions).
        let at = |i: &Index, b: &Vec<u8>| i.index(b.len() + 1);
        match d {
            Damage::Flip(i, bit) if !b.is_empty() => {
                let p = i.index(b.len());
                b[p] ^= 1 << bit;
            }
            Damage::Truncate(i) => {
                let n = i.index(b.len() + 1);
                b.truncate(n);
            }
            Damage::Extend(x) => b.extend_from_slice(x),
            Damage::Insert(i, x) => {
                let p = at(i, &b);
                b.splice(p..p, x.iter().copied());
            }
            Damage::Remove(i, n) if !b.is_empty() => {
                let p = i.index(b.len());
                let end = (p + *n as usize).min(b.len());
                b.drain(p..end);
            }
            Damage::Overwrite(i, x) => {
                let p = at(i, &b);
                for (k, v) in x.iter().enumerate() {
                    match b.get_mut(p + k) {
                        Some(slot) => *slot = *v,
                        None => b.push(*v),
                    }
                }
            }
            Damage::Length(i, w, le, v) => {
                let bytes = if *le {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                let w = *w as usize;
                let part = if *le { &bytes[..w] } else { &bytes[8 - w..] };
                let p = at(i, &b);
                let end = (p + w).min(b.len());
                b.splice(p..end, part.iter().copied());
            }
            Damage::Varint(i, v) => {
                let p = at(i, &b);
                b.splice(p..p, varint(*v));
            }
            Damage::Duplicate(from, len, to) if !b.is_empty() => {
                let s = from.index(b.len());
                let e = s + 1 + len.index(b.len() - s);
                let piece = b[s..e].to_vec();
                let p = at(to, &b);
                b.splice(p..p, piece);
            }
            Damage::Byte(i, v) if !b.is_empty() => {
                let p = i.index(b.len());
                b[p] = *v;
            }
            Damage::Text(i, t) => {
                let p = at(i, &b);
                b.splice(p..p, t.bytes());
            }
            _ => {}
        }
    }
    b
}

/// Bytes that print as an escaped string (a failing case is read by a human).
#[derive(Clone, PartialEq, Eq)]
pub struct Shown(pub Vec<u8>);

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: String = self
            .0
            .iter()
            .flat_map(|b| std::ascii::escape_default(*b))
            .map(char::from)
            .collect();
        write!(f, "b\"{s}\" ({} bytes)", self.0.len())
    }
}

impl std::ops::Deref for Shown {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

/// (valid encoding, damaged copy) pairs from a strategy of valid encodings.
pub fn damaged(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = (Shown, Shown)> {
    valid.prop_flat_map(|v| {
        let n = v.len();
        (Just(v), damages(n)).prop_map(|(v, d)| {
            let bad = apply(&v, &d);
            (Shown(v), Shown(bad))
        })
    })
}

/// Values a hostile or damaged JSON field holds instead of the right one.
pub fn hostile_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(-1)),
        Just(Value::from(0)),
        Just(Value::from(u64::MAX)),
        Just(Value::from(u32::MAX as u64 + 1)),
        Just(Value::from(i64::MIN)),
        Just(serde_json::json!(1.5)),
        Just(serde_json::json!(1e300)),
        ".{0,12}".prop_map(Value::from),
        Just(Value::from("\u{0}")),
        Just(Value::from("../../etc/passwd")),
        Just(Value::from("x".repeat(5000))),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        Just(serde_json::json!([1, "a", null])),
        (1usize..200).prop_map(|depth| {
            let mut v = Value::from(1);
            for _ in 0..depth {
                v = serde_json::json!([v]);
            }
            v
        }),
    ]
}

/// One structural damage done to a JSON record.
#[derive(Debug, Clone)]
pub enum JsonDamage {
    /// Replace the value at the n-th node (depth-first) with another.
    Replace(Index, Value),
    /// Remove a field of the n-th object.
    RemoveField(Index, Index),
    /// Add a field (a name of its own, or one of the record's, elsewhere) to the n-th object.
    AddField(Index, String, Value),
    /// Set the record's version field.
    Version(String, Value),
    /// Wrap the whole record in an array or an object.
    Wrap(bool),
}

pub fn json_damages(version_key: &'static str) -> impl Strategy<Value = Vec<JsonDamage>> {
    let one = prop_oneof![
        4 => (any::<Index>(), hostile_json()).prop_map(|(i, v)| JsonDamage::Replace(i, v)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(i, f)| JsonDamage::RemoveField(i, f)),
        1 => (any::<Index>(), "[a-z_]{1,12}", hostile_json())
            .prop_map(|(i, n, v)| JsonDamage::AddField(i, n, v)),
        2 => prop_oneof![
            Just(Value::from(0)), Just(Value::from(1)), Just(Value::from(2)), Just(Value::from(99)),
            Just(Value::from(-1)), Just(Value::from("1")), Just(serde_json::json!(1.0)),
            Just(Value::Null), Just(Value::from(u64::MAX)),
        ].prop_map(move |v| JsonDamage::Version(version_key.to_string(), v)),
        1 => any::<bool>().prop_map(JsonDamage::Wrap),
    ];
    proptest::collection::vec(one, 1..3)
}

fn nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(nodes).sum(),
        Value::Object(o) => o.values().map(nodes).sum(),
        _ => 0,
    }
}

/// The n-th node, depth-first (n < nodes(v)).
fn node_mut(v: &mut Value, n: usize) -> &mut Value {
    if n == 0 {
        return v;
    }
    let mut n = n - 1;
    let children: Vec<&mut Value> = match v {
        Value::Array(a) => a.iter_mut().collect(),
        Value::Object(o) => o.values_mut().collect(),
        _ => unreachable!("n < nodes(v)"),
    };
    for c in children {
        let k = nodes(c);
        if n < k {
            return node_mut(c, n);
        }
        n -= k;
    }
    unreachable!("n < nodes(v)")
}

fn count_objects(v: &Value) -> usize {
    match v {
        Value::Object(o) => 1 + o.values().map(count_objects).sum::<usize>(),
        Value::Array(a) => a.iter().map(count_objects).sum(),
        _ => 0,
    }
}

/// The n-th object, depth-first (n < count_objects(v)).
fn object_mut(v: &mut Value, n: usize) -> Option<&mut serde_json::Map<String, Value>> {
    let is_object = v.is_object();
    if is_object && n == 0 {
        return v.as_object_mut();
    }
    let mut n = n - usize::from(is_object);
    let children: Vec<&mut Value> = match v {
        Value::Object(o) => o.values_mut().collect(),
        Value::Array(a) => a.iter_mut().collect(),
        _ => return None,
    };
    for c in children {
        let k = count_objects(c);
        if n < k {
            return object_mut(c, n);
        }
        n -= k;
    }
    None
}

/// The object a field damage goes to: the record itself half the time (its fields are what
/// the decoder checks first), else any object in it.
fn target<'a>(v: &'a mut Value, i: &Index) -> Option<&'a mut serde_json::Map<String, Value>> {
    let n = count_objects(v);
    if n == 0 {
        return None;
    }
    let pick = i.index(2 * n);
    object_mut(v, if pick >= n { 0 } else { pick })
}

/// `v` with `damages` done to it.
pub fn apply_json(mut v: Value, damages: &[JsonDamage]) -> Value {
    for d in damages {
        match d {
            JsonDamage::Replace(i, x) => {
                let n = i.index(nodes(&v));
                *node_mut(&mut v, n) = x.clone();
            }
            JsonDamage::RemoveField(i, f) => {
                if let Some(o) = target(&mut v, i) {
                    if let Some(k) = (!o.is_empty())
                        .then(|| o.keys().nth(f.index(o.len())).cloned())
                        .flatten()
                    {
                        o.remove(&k);
                    }
                }
            }
            JsonDamage::AddField(i, name, x) => {
                if let Some(o) = target(&mut v, i) {
                    o.insert(name.clone(), x.clone());
                }
            }
            JsonDamage::Version(k, x) => {
                if let Value::Object(o) = &mut v {
                    o.insert(k.clone(), x.clone());
                }
            }
            JsonDamage::Wrap(array) => {
                v = if *array {
                    Value::Array(vec![v])
                } else {
                    serde_json::json!({ "record": v })
                };
            }
        }
    }
    v
}

/// (valid JSON record, damaged bytes): structural damage, then (half the time) byte damage.
pub fn json_damaged(
    valid: impl Strategy<Value = Value>,
    version_key: &'static str,
) -> impl Strategy<Value = (Value, Shown)> {
    valid.prop_flat_map(move |v| {
        let len = serde_json::to_vec(&v).map(|b| b.len()).unwrap_or(0);
        (
            Just(v),
            json_damages(version_key),
            proptest::option::of(damages(len)),
        )
            .prop_map(|(v, jd, bd)| {
                let bad = serde_json::to_vec(&apply_json(v.clone(), &jd)).expect("JSON serializes");
                let bad = match bd {
                    Some(d) => apply(&bad, &d),
                    None => bad,
                };
                (v, Shown(bad))
            })
    })
}

/// Decode `bad` as a `T`; what is accepted must re-encode to a record that decodes to the
/// same value (judged by `same`: serde_json parses floats to within an ulp, not exactly),
/// carry no version this build does not know, and a record claiming a newer version must
/// be refused as such.
pub fn check_record<T: Versioned + std::fmt::Debug>(
    valid: &Value,
    bad: &[u8],
    same: fn(&T, &T) -> bool,
) -> Result<(), TestCaseError> {
    let claimed = serde_json::from_slice::<Value>(bad)
        .ok()
        .and_then(|v| v.get(T::VERSION_KEY).cloned());
    match record::decode::<T>(bad) {
        Ok(r) => {
            let again = record::decode::<T>(&record::encode(&r)).unwrap();
            prop_assert!(same(&again, &r), "{:?} came back as {:?}", r, again);
            if let Some(v) = &claimed {
                let n = v.as_u64();
                prop_assert!(
                    n.is_some_and(|n| n >= 1 && n <= T::VERSION as u64),
                    "{} with version {v} was accepted",
                    T::KIND
                );
            }
        }
        Err(e) => {
            prop_assert!(
                serde_json::to_vec(valid).unwrap() != bad,
                "a valid {} was refused: {e}",
                T::KIND
            );
            if let Some(n) = claimed.as_ref().and_then(Value::as_u64) {
                if n > T::VERSION as u64 {
                    prop_assert_eq!(e.kind(), ErrorKind::UnsupportedVersion);
                }
            }
            prop_assert!(e.to_string().contains(T::KIND) || e.to_string().contains("record"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damages_do_what_they_say() {
        let v = b"abcdef".to_vec();
        assert_eq!(apply(&v, &[Damage::Extend(b"gh".to_vec())]), b"abcdefgh");
        assert_eq!(varint(300), vec![0xac, 0x02]);
        let j = serde_json::json!({"a": 1, "b": {"c": [2, 3]}});
        assert_eq!(nodes(&j), 6);
        let mut k = j.clone();
        *node_mut(&mut k, 4) = Value::Null;
        assert_eq!(k, serde_json::json!({"a": 1, "b": {"c": [null, 3]}}));
    }
}
