//! The metadata key schema (byte keys, big-endian numbers so that ranges scan in order) and
//! the object key of a block.
//!
//! | key                          | value                                  |
//! |------------------------------|----------------------------------------|
//! | `setting`                    | JSON `Settings`                        |
//! | `c<name>`                    | counter, ASCII decimal i64             |
//! | `A<ino:8>I`                  | `Attr` (postcard)                      |
//! | `A<ino:8>D<name>`            | dentry: `<ino:8><kind:1>`              |
//! | `A<ino:8>C<index:4>`         | chunk: slice records, 24 bytes each    |
//! | `A<ino:8>S`                  | symlink target                         |
//! | `A<ino:8>X<name>`            | xattr value                            |
//! | `A<ino:8>R`                  | device number of a device node (u32 BE)|
//! | `A<ino:8>T`                  | JSON `trash::TrashInfo`: where a       |
//! |                              | trashed inode was and why it went      |
//! | `T<at_ns:8><ino:8>`          | a trashed inode, in deletion order:    |
//! |                              | `"<seq> <time_ns>"` of its deletion    |
//! | `O<ino:8>`                   | an unlinked inode kept while open: the |
//! |                              | session holding it                     |
//! | `D<slice:8><size:4>`         | pending delete: `"<seq> <time_ns>"`    |
//! | `K<slice:8>`                 | CRC32C of each block of the slice, u32 |
//! |                              | BE each (format version 2 and later)   |
//! | `R<slice:8>`                 | references to the slice beyond the     |
//! |                              | first (clones), ASCII decimal          |
//! | `N<start:8>`                 | JSON `clone::Staging`: a clone being   |
//! |                              | written, its inodes not yet linked     |
//! | `storage`                    | JSON `storage::StorageState`: where    |
//! |                              | blocks go, the cutover, its generation |
//! | `H<at_ns:8><gen:8>`          | JSON `storage::Audit` of a transition  |
//! | `epoch`                      | JSON `site::Epoch`: the primary epoch  |
//!
//! Engines keep their own bookkeeping (journal, head) outside this key space.

use crate::types::{FileKind, Ino};

pub const SETTING: &[u8] = b"setting";
pub const NEXT_INODE: &[u8] = b"cnext_inode";
pub const NEXT_SLICE: &[u8] = b"cnext_slice";
pub const USED_SPACE: &[u8] = b"cused_space";
pub const USED_INODES: &[u8] = b"cused_inodes";
pub const COUNTER_PREFIX: &[u8] = b"c";
pub const PENDING_PREFIX: &[u8] = b"D";
pub const KEPT_PREFIX: &[u8] = b"O";
pub const INODE_PREFIX: &[u8] = b"A";
pub const CHECKSUM_PREFIX: &[u8] = b"K";
pub const STORAGE: &[u8] = b"storage";
/// The primary epoch record (`site::Epoch`).
pub const EPOCH: &[u8] = b"epoch";
pub const EPOCH_NAME: &str = "epoch";
pub const AUDIT_PREFIX: &[u8] = b"H";
pub const REFS_PREFIX: &[u8] = b"R";
pub const CLONING_PREFIX: &[u8] = b"N";

/// How many chunk records reference slice `id` beyond the first: absent (or 0) while one
/// does. A clone adds one per chunk record it copies; freeing a record takes one away, and
/// only the last reference stamps the slice's pending delete.
pub fn refs(id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'R');
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The staging record of a clone whose inodes start at `start` (see `fs::clone`).
pub fn cloning(start: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'N');
    k.extend_from_slice(&start.to_be_bytes());
    k
}

pub const TRASH_PREFIX: &[u8] = b"T";
/// Trashed inodes evicted by the trash's size cap (`trash::purge`), a counter.
pub const TRASH_EVICTED: &[u8] = b"ctrash_evicted";

/// The trash record of inode `ino`, trashed at `at_ns` (keys sort oldest first).
pub fn trash(at_ns: i64, ino: Ino) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'T');
    k.extend_from_slice(&(at_ns.max(0) as u64).to_be_bytes());
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// Where trashed inode `ino` was and why it went (`trash::TrashInfo`).
pub fn trash_info(ino: Ino) -> Vec<u8> {
    inode_key(ino, b'T', &[])
}

/// The audit record of a storage transition at `at_ns` to generation `gen`.
pub fn audit(at_ns: i64, gen: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'H');
    k.extend_from_slice(&(at_ns as u64).to_be_bytes());
    k.extend_from_slice(&gen.to_be_bytes());
    k
}

fn inode_key(ino: Ino, tag: u8, extra: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + extra.len());
    k.extend_from_slice(INODE_PREFIX);
    k.extend_from_slice(&ino.to_be_bytes());
    k.push(tag);
    k.extend_from_slice(extra);
    k
}

/// The keys of inode `ino`'s records are `INODE_PREFIX ++ ino (8 bytes, big-endian) ++ tag ...`;
/// its attributes' key ends with `ATTR_SUFFIX` (`Engine::get_many_via` builds them from a
/// directory entry's value, which starts with the same 8 bytes).
pub const ATTR_SUFFIX: &[u8] = b"I";
/// An inode's extended attributes' keys continue with this after the inode number.
pub const XATTR_SUFFIX: &[u8] = b"X";
/// What follows the inode number in the key of its first chunk record.
pub fn first_chunk_suffix() -> Vec<u8> {
    let mut s = vec![b'C'];
    s.extend_from_slice(&0u32.to_be_bytes());
    s
}

pub fn attr(ino: Ino) -> Vec<u8> {
    inode_key(ino, ATTR_SUFFIX[0], &[])
}
pub fn dentry(parent: Ino, name: &[u8]) -> Vec<u8> {
    inode_key(parent, b'D', name)
}
pub fn dentry_prefix(parent: Ino) -> Vec<u8> {
    inode_key(parent, b'D', &[])
}
pub fn chunk(ino: Ino, index: u32) -> Vec<u8> {
    inode_key(ino, b'C', &index.to_be_bytes())
}
pub fn chunk_prefix(ino: Ino) -> Vec<u8> {
    inode_key(ino, b'C', &[])
}
pub fn symlink(ino: Ino) -> Vec<u8> {
    inode_key(ino, b'S', &[])
}
pub fn xattr(ino: Ino, name: &[u8]) -> Vec<u8> {
    inode_key(ino, XATTR_SUFFIX[0], name)
}
pub fn xattr_prefix(ino: Ino) -> Vec<u8> {
    inode_key(ino, XATTR_SUFFIX[0], &[])
}
pub fn rdev(ino: Ino) -> Vec<u8> {
    inode_key(ino, b'R', &[])
}
/// An inode unlinked while a mount had it open: kept (attributes, chunks) until released.
pub fn kept(ino: Ino) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'O');
    k.extend_from_slice(&ino.to_be_bytes());
    k
}
/// Every key of one inode.
pub fn inode_prefix(ino: Ino) -> Vec<u8> {
    let mut k = vec![b'A'];
    k.extend_from_slice(&ino.to_be_bytes());
    k
}
pub fn pending(slice: u64, size: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(13);
    k.push(b'D');
    k.extend_from_slice(&slice.to_be_bytes());
    k.extend_from_slice(&size.to_be_bytes());
    k
}

/// The block checksums of slice `id` (written with the first reference to the slice, removed
/// when its pending delete is purged).
pub fn checksums(id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(b'K');
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The value of a `checksums` key: one CRC32C per block, in block order.
pub fn encode_checksums(crcs: &[u32]) -> Vec<u8> {
    crcs.iter().flat_map(|c| c.to_be_bytes()).collect()
}

pub fn decode_checksums(v: &[u8]) -> Option<Vec<u32>> {
    if v.len() % 4 != 0 {
        return None;
    }
    Some(
        v.chunks_exact(4)
            .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

/// The exclusive end of the range of keys starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; prefix.len() + 1]
}

/// A parsed metadata key, for dump, fsck and gc which walk the whole key space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key<'a> {
    Setting,
    Counter(&'a [u8]),
    Attr(Ino),
    Dentry(Ino, &'a [u8]),
    Chunk(Ino, u32),
    Symlink(Ino),
    Xattr(Ino, &'a [u8]),
    Rdev(Ino),
    Pending(u64, u32),
    Checksums(u64),
    Kept(Ino),
    /// Extra references to a slice (`refs`).
    Refs(u64),
    /// A clone being written (`cloning`).
    Cloning(Ino),
    Storage,
    Epoch,
    Audit(u64, u64),
    /// A trashed inode: (deleted at, ns; inode).
    Trash(u64, Ino),
    TrashInfo(Ino),
    Unknown,
}

pub fn parse(k: &[u8]) -> Key<'_> {
    if k == SETTING {
        return Key::Setting;
    }
    if k == STORAGE {
        return Key::Storage;
    }
    if k == EPOCH {
        return Key::Epoch;
    }
    match k.first() {
        Some(b'H') if k.len() == 17 => Key::Audit(
            u64::from_be_bytes(k[1..9].try_into().unwrap()),
            u64::from_be_bytes(k[9..17].try_into().unwrap()),
        ),
        Some(b'T') if k.len() == 17 => Key::Trash(
            u64::from_be_bytes(k[1..9].try_into().unwrap()),
            u64::from_be_bytes(k[9..17].try_into().unwrap()),
        ),
        Some(b'c') => Key::Counter(&k[1..]),
        Some(b'K') if k.len() == 9 => {
            Key::Checksums(u64::from_be_bytes(k[1..9].try_into().unwrap()))
        }
        Some(b'O') if k.len() == 9 => Key::Kept(u64::from_be_bytes(k[1..9].try_into().unwrap())),
        Some(b'R') if k.len() == 9 => Key::Refs(u64::from_be_bytes(k[1..9].try_into().unwrap())),
        Some(b'N') if k.len() == 9 => Key::Cloning(u64::from_be_bytes(k[1..9].try_into().unwrap())),
        Some(b'D') if k.len() == 13 => Key::Pending(
            u64::from_be_bytes(k[1..9].try_into().unwrap()),
            u32::from_be_bytes(k[9..13].try_into().unwrap()),
        ),
        Some(b'A') if k.len() >= 10 => {
            let ino = u64::from_be_bytes(k[1..9].try_into().unwrap());
            let rest = &k[10..];
            match k[9] {
                b'I' if rest.is_empty() => Key::Attr(ino),
                b'D' => Key::Dentry(ino, rest),
                b'C' if rest.len() == 4 => {
                    Key::Chunk(ino, u32::from_be_bytes(rest.try_into().unwrap()))
                }
                b'S' if rest.is_empty() => Key::Symlink(ino),
                b'X' => Key::Xattr(ino, rest),
                b'R' if rest.is_empty() => Key::Rdev(ino),
                b'T' if rest.is_empty() => Key::TrashInfo(ino),
                _ => Key::Unknown,
            }
        }
        _ => Key::Unknown,
    }
}

pub fn encode_dentry(ino: Ino, kind: FileKind) -> Vec<u8> {
    let mut v = ino.to_be_bytes().to_vec();
    v.push(kind.as_byte());
    v
}

pub fn decode_dentry(v: &[u8]) -> Option<(Ino, FileKind)> {
    if v.len() != 9 {
        return None;
    }
    Some((
        u64::from_be_bytes(v[..8].try_into().unwrap()),
        FileKind::from_byte(v[8])?,
    ))
}

/// The object key of block `index` (of `len` bytes) of slice `id` in volume `volume`.
/// Derived from these three numbers alone: a key is written once and never rewritten.
pub fn block_key(volume: &str, id: u64, index: u32, len: u32) -> String {
    format!(
        "{volume}/chunks/{}/{}/{id}_{index}_{len}",
        id / 1_000_000,
        id / 1000
    )
}

/// The prefix under which all blocks of `volume` live.
pub fn blocks_prefix(volume: &str) -> String {
    format!("{volume}/chunks/")
}

/// Parse a block key back into (slice id, index, len); None for anything else, including keys
/// whose directory part does not match the id (a hand-made or corrupted key).
pub fn parse_block_key(volume: &str, key: &str) -> Option<(u64, u32, u32)> {
    let rest = key.strip_prefix(&blocks_prefix(volume))?;
    let mut parts = rest.split('/');
    let (d1, d2, file) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let mut f = file.split('_');
    let id: u64 = f.next()?.parse().ok()?;
    let index: u32 = f.next()?.parse().ok()?;
    let len: u32 = f.next()?.parse().ok()?;
    if f.next().is_some() || d1 != (id / 1_000_000).to_string() || d2 != (id / 1000).to_string() {
        return None;
    }
    // Only the spelling `block_key` writes: `parse` takes "+1" and "01" for 1, and such a
    // key is another object than the block's (gc would take it for the block, or delete it
    // as the block's).
    (block_key(volume, id, index, len) == key).then_some((id, index, len))
}

/// The blocks of a slice of `size` bytes with block size `bs`: (index, len) pairs.
pub fn slice_blocks(size: u32, bs: u32) -> impl Iterator<Item = (u32, u32)> {
    let n = size.div_ceil(bs);
    (0..n).map(move |i| (i, block_len(size, bs, i)))
}

/// The length of block `index` of a slice of `size` bytes (block size `bs`).
pub fn block_len(size: u32, bs: u32, index: u32) -> u32 {
    (size - index * bs).min(bs)
}

/// The one recipe for a slice's blocks: (object key, length) of each block of slice `id` of
/// `size` bytes in `volume`, block size `bs`. Every reader, writer, copier and checker of
/// blocks goes through this (or `block_key` + `block_len` for one block).
pub fn slice_block_keys(
    volume: &str,
    id: u64,
    size: u32,
    bs: u32,
) -> impl Iterator<Item = (String, u32)> + '_ {
    slice_blocks(size, bs).map(move |(i, l)| (block_key(volume, id, i, l), l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_key_layout_matches_the_design() {
        assert_eq!(
            block_key("vol", 1, 0, 4194304),
            "vol/chunks/0/0/1_0_4194304"
        );
        assert_eq!(
            block_key("vol", 12_345_678, 2, 5),
            "vol/chunks/12/12345/12345678_2_5"
        );
        assert_eq!(
            parse_block_key("vol", "vol/chunks/12/12345/12345678_2_5"),
            Some((12_345_678, 2, 5))
        );
        assert_eq!(parse_block_key("vol", "vol/chunks/0/0/12345678_2_5"), None);
        assert_eq!(parse_block_key("vol", "other/chunks/0/0/1_0_1"), None);
        assert_eq!(parse_block_key("vol", "vol/chunks/0/0/1_0_1_9"), None);
    }

    #[test]
    fn slice_blocks_split_at_block_size() {
        let b: Vec<_> = slice_blocks(10 << 20, 4 << 20).collect();
        assert_eq!(b, vec![(0, 4 << 20), (1, 4 << 20), (2, 2 << 20)]);
        assert_eq!(slice_blocks(0, 4).count(), 0);
    }

    #[test]
    fn keys_parse_back() {
        assert_eq!(parse(&attr(5)), Key::Attr(5));
        assert_eq!(parse(&dentry(5, b"x/y")), Key::Dentry(5, b"x/y"));
        assert_eq!(parse(&chunk(5, 9)), Key::Chunk(5, 9));
        assert_eq!(parse(&pending(7, 3)), Key::Pending(7, 3));
        assert_eq!(parse(&rdev(5)), Key::Rdev(5));
        assert_eq!(parse(&kept(9)), Key::Kept(9));
        assert_eq!(parse(&checksums(7)), Key::Checksums(7));
        assert_eq!(
            decode_checksums(&encode_checksums(&[1, 0xdead_beef])),
            Some(vec![1, 0xdead_beef])
        );
        assert_eq!(decode_checksums(b"abc"), None);
        assert_eq!(parse(SETTING), Key::Setting);
        assert_eq!(parse(STORAGE), Key::Storage);
        assert_eq!(parse(&audit(5, 7)), Key::Audit(5, 7));
        assert_eq!(parse(&trash(5, 7)), Key::Trash(5, 7));
        assert_eq!(parse(&trash_info(7)), Key::TrashInfo(7));
        assert!(trash(5, u64::MAX) < trash(6, 0));
        assert_eq!(prefix_end(b"A\x01\xff"), b"A\x02".to_vec());
        assert!(dentry_prefix(1) < dentry(1, b"") || dentry_prefix(1) == dentry(1, b""));
        assert!(dentry(1, b"\xff\xff") < prefix_end(&dentry_prefix(1)));
    }
}
