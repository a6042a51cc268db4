//! The layout of a file's bytes: a chunk's slice records resolve into a view (later
//! records overwrite earlier ones; regions no record covers read as zeros), and a read of
//! a byte range is planned into pieces (which bytes of which blocks land where, holes as
//! zeros). Pure functions: the writer (`data`) and the readers (`read`, `prefetch`) use
//! them; they import nothing from either.

use crate::error::{corrupt, Result};
use crate::keys;
use crate::types::{Ino, Settings, SliceRec};
use std::collections::HashMap;

/// A run of the chunk `[start, end)` showing bytes of slice `id` from `slice_off` (id 0: zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    pub start: u32,
    pub end: u32,
    pub id: u64,
    pub size: u32,
    pub slice_off: u32,
}

/// The visible layout of a chunk: later records overwrite earlier ones where they overlap.
/// Regions no record covers are absent (they read as zeros).
pub(crate) fn build_view(recs: &[SliceRec]) -> Vec<Seg> {
    let mut segs: Vec<Seg> = Vec::new();
    for r in recs {
        let (s, e) = (r.pos, r.pos + r.len);
        let mut next = Vec::with_capacity(segs.len() + 2);
        for g in segs.drain(..) {
            if g.end <= s || g.start >= e {
                next.push(g);
                continue;
            }
            if g.start < s {
                next.push(Seg { end: s, ..g });
            }
            if g.end > e {
                next.push(Seg {
                    start: e,
                    slice_off: g.slice_off + (e - g.start),
                    ..g
                });
            }
        }
        next.push(Seg {
            start: s,
            end: e,
            id: r.id,
            size: r.size,
            slice_off: r.off,
        });
        next.sort_by_key(|g| g.start);
        segs = next;
    }
    segs
}

pub(crate) fn decode_chunk(ino: Ino, idx: u32, v: Option<Vec<u8>>) -> Result<Vec<SliceRec>> {
    match v {
        None => Ok(Vec::new()),
        Some(b) => SliceRec::decode_list(&b)
            .ok_or_else(|| corrupt(format!("chunk {idx} of inode {ino} does not decode"))),
    }
}

/// Where some bytes of a read come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A hole: zeros.
    Zeros { dst: usize, len: usize },
    /// `len` bytes of block `key` (what it must be: `check`, its length and the CRC32C its
    /// slice recorded) from `from`, to `dst` in the result.
    Block {
        key: String,
        check: crate::BlockCheck,
        from: usize,
        len: usize,
        dst: usize,
    },
}

/// A planned read of `len` bytes at `offset` (already cut at the end of the file).
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub offset: u64,
    pub len: usize,
    pub pieces: Vec<Piece>,
}

/// One chunk's slice records, with the block checksums of the slices they name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub recs: Vec<SliceRec>,
    /// Slice id to the CRC32C of each of its blocks (empty on a format-1 volume).
    pub sums: HashMap<u64, Vec<u32>>,
}

impl Chunk {
    fn crc(&self, slice: u64, block: u32) -> Option<u32> {
        self.sums.get(&slice)?.get(block as usize).copied()
    }
}

/// Plan chunk bytes `[from, to)` of the view of `c` into `out`, `dst_base` being where
/// chunk byte `from` goes in the result. Regions no slice covers are left out (zeros).
pub(crate) fn plan_chunk(
    s: &Settings,
    c: &Chunk,
    from: u32,
    to: u32,
    dst_base: usize,
    out: &mut Vec<Piece>,
) {
    let bs = s.block_size;
    for g in build_view(&c.recs) {
        let (a, b) = (g.start.max(from), g.end.min(to));
        if a >= b {
            continue;
        }
        let mut d = dst_base + (a - from) as usize;
        if g.id == 0 {
            out.push(Piece::Zeros {
                dst: d,
                len: (b - a) as usize,
            });
            continue;
        }
        let mut soff = g.slice_off + (a - g.start); // offset inside the slice
        let mut left = b - a;
        while left > 0 {
            let bi = soff / bs;
            let blen = keys::block_len(g.size, bs, bi);
            let in_block = soff - bi * bs;
            let n = (blen - in_block).min(left);
            out.push(Piece::Block {
                key: keys::block_key(&s.name, g.id, bi, blen),
                check: crate::BlockCheck {
                    len: blen,
                    crc: c.crc(g.id, bi),
                },
                from: in_block as usize,
                len: n as usize,
                dst: d,
            });
            soff += n;
            d += n as usize;
            left -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pos: u32, id: u64, len: u32) -> SliceRec {
        SliceRec {
            pos,
            id,
            size: len,
            off: 0,
            len,
        }
    }

    #[test]
    fn newer_slices_win_where_they_overlap() {
        let v = build_view(&[rec(0, 1, 100), rec(10, 2, 20), rec(50, 0, 100)]);
        assert_eq!(
            v,
            vec![
                Seg {
                    start: 0,
                    end: 10,
                    id: 1,
                    size: 100,
                    slice_off: 0
                },
                Seg {
                    start: 10,
                    end: 30,
                    id: 2,
                    size: 20,
                    slice_off: 0
                },
                Seg {
                    start: 30,
                    end: 50,
                    id: 1,
                    size: 100,
                    slice_off: 30
                },
                Seg {
                    start: 50,
                    end: 150,
                    id: 0,
                    size: 100,
                    slice_off: 0
                },
            ]
        );
        assert_eq!(
            build_view(&[rec(0, 1, 10), rec(0, 2, 10)]),
            vec![Seg {
                start: 0,
                end: 10,
                id: 2,
                size: 10,
                slice_off: 0
            }]
        );
    }
}
