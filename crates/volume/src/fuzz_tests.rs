//! Decoder harnesses of the local cache's files (see `fs_core::fuzz` for the kit, the case
//! count and the seed): block files (the 16-byte header, magic, version, length and CRC32C,
//! then the block) and whole-file entries' records (JSON: format, content version, a CRC32C
//! per 4 MiB, the file's stamp). A torn, truncated, extended or bit-flipped block file is a
//! miss (the block is refetched), never served; a record whose checksums do not cover its
//! file exactly is not trusted.
//!
//! Allocation: a block file is read whole (its size is the cache's own, at most a block and
//! its header); a record is JSON, which allocates only for what it has parsed.

use super::{decode, header, HEADER};
use crate::whole::{decode_record, FORMAT, SEG};
use fs_core::fuzz::{self, damaged, json_damaged};
use proptest::prelude::*;
use serde_json::json;

fn block() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (0usize..3, any::<u8>()).prop_map(|(k, b)| vec![b; [1, 4096, 65536][k]]),
    ]
}

#[test]
fn fuzz_cache_block_files() {
    fuzz::run(
        "cache_block_files",
        (
            block().prop_flat_map(|data| {
                let mut file = header(data.len(), crc32c::crc32c(&data)).to_vec();
                file.extend_from_slice(&data);
                (Just(data), damaged(Just(file)))
            }),
            prop_oneof![3 => Just(None), 1 => any::<u32>().prop_map(Some)],
        ),
        |((data, (valid, bad)), other_len)| {
            // What `read_summed` sums: the bytes past the header, if any.
            let summed = crc32c::crc32c(bad.get(HEADER..).unwrap_or_default());
            // The length the key says (another key's, sometimes).
            let want_len = other_len.unwrap_or(data.len() as u32);
            match decode(bad.0.clone(), want_len, summed) {
                Some((d, crc)) => {
                    prop_assert_eq!(d.len() as u32, want_len);
                    prop_assert_eq!(crc32c::crc32c(&d), crc);
                    if want_len as usize == data.len() {
                        // Damage that wrote a whole valid file for other bytes (their length
                        // and their CRC, as the 1,000,000-case run found for a 1-byte block)
                        // cannot be told by the file alone: readers then check the block
                        // against its slice's CRC (format 2) and refetch it.
                        let mut own = header(d.len(), crc).to_vec();
                        own.extend_from_slice(&d);
                        prop_assert!(
                            d[..] == data[..] || own == bad.0,
                            "a damaged block file was served"
                        );
                    }
                }
                None => prop_assert!(
                    bad != valid || want_len as usize != data.len(),
                    "a whole block file was taken for damaged"
                ),
            }
            Ok(())
        },
    );
}

#[test]
fn fuzz_cache_whole_records() {
    let record = (
        "[0-9a-f]{0,40}",
        prop_oneof![Just(0u64), 1u64..SEG * 3, Just(SEG), Just(SEG * 2 + 1)],
        any::<(u64, u64, i64, i64)>(),
    )
        .prop_flat_map(|(version, size, (dev, ino, mtime_ns, ctime_ns))| {
            let n = size.div_ceil(SEG) as usize;
            proptest::collection::vec(any::<u32>(), n..=n).prop_map(move |crcs| {
                json!({
                    "format": FORMAT,
                    "version": version.clone(),
                    "crcs": crcs,
                    "stamp": {"dev": dev, "ino": ino, "size": size, "mtime_ns": mtime_ns, "ctime_ns": ctime_ns},
                })
            })
        });
    fuzz::run(
        "cache_whole_records",
        json_damaged(record, "format"),
        |(valid, bad)| {
            match decode_record(&bad) {
                Ok(r) => {
                    if r.format == FORMAT {
                        prop_assert_eq!(
                            r.crcs.len() as u64,
                            r.stamp.size.div_ceil(SEG),
                            "a record whose CRCs do not cover its file was trusted"
                        );
                    }
                }
                Err(why) => {
                    prop_assert!(
                        serde_json::to_vec(&valid).unwrap() != *bad,
                        "a valid record was refused: {why}"
                    );
                }
            }
            Ok(())
        },
    );
}
