//! The volume model: inodes, attributes, slices and volume settings.

use serde::{Deserialize, Serialize};

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;
/// A file is split into chunks of this many bytes; a slice never crosses a chunk boundary.
pub const CHUNK_SIZE: u64 = 64 << 20;
pub const DEFAULT_BLOCK_SIZE: u32 = 4 << 20;
pub const MAX_NAME_LEN: usize = 255;
/// Largest file length accepted (2^48 bytes = 256 TiB, far above real checkpoints).
pub const MAX_FILE_LEN: u64 = 1 << 48;

/// What an inode is. New kinds go at the end: `Attr` is postcard-encoded by variant index.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A named pipe (mkfifo).
    Fifo,
    /// A Unix socket node.
    Socket,
    /// A character device node (its device number in `A<ino>R`).
    CharDev,
    /// A block device node (its device number in `A<ino>R`).
    BlockDev,
}

impl FileKind {
    pub fn as_byte(self) -> u8 {
        match self {
            FileKind::File => b'f',
            FileKind::Dir => b'd',
            FileKind::Symlink => b'l',
            FileKind::Fifo => b'p',
            FileKind::Socket => b's',
            FileKind::CharDev => b'c',
            FileKind::BlockDev => b'b',
        }
    }
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'f' => Some(FileKind::File),
            b'd' => Some(FileKind::Dir),
            b'l' => Some(FileKind::Symlink),
            b'p' => Some(FileKind::Fifo),
            b's' => Some(FileKind::Socket),
            b'c' => Some(FileKind::CharDev),
            b'b' => Some(FileKind::BlockDev),
            _ => None,
        }
    }
    /// A node whose content is not stored in the volume (fifo, socket, device).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev
        )
    }
}

/// Inode attributes. Times are nanoseconds since the Unix epoch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits (0o7777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub nlink: u32,
    pub length: u64,
    /// The directory this inode was created in (the first parent of a hard-linked file).
    pub parent: Ino,
}

/// Which attributes a `setattr` changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
    /// Truncate or extend to this length (files only).
    pub length: Option<u64>,
}

/// One slice record in a chunk: bytes `[off, off+len)` of slice `id` appear at `pos` in the
/// chunk. `size` is the slice's full stored size (it names its blocks). Id 0 is a hole (zeros).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceRec {
    pub pos: u32,
    pub id: u64,
    pub size: u32,
    pub off: u32,
    pub len: u32,
}

pub const SLICE_REC_LEN: usize = 24;

impl SliceRec {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pos.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.off.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
    pub fn decode_list(b: &[u8]) -> Option<Vec<SliceRec>> {
        if b.len() % SLICE_REC_LEN != 0 {
            return None;
        }
        let u32_at = |s: &[u8], i: usize| u32::from_be_bytes(s[i..i + 4].try_into().unwrap());
        Some(
            b.chunks_exact(SLICE_REC_LEN)
                .map(|r| SliceRec {
                    pos: u32_at(r, 0),
                    id: u64::from_be_bytes(r[4..12].try_into().unwrap()),
                    size: u32_at(r, 12),
                    off: u32_at(r, 16),
                    len: u32_at(r, 20),
                })
                .collect(),
        )
    }
    pub fn encode_list(recs: &[SliceRec]) -> Vec<u8> {
        let mut out = Vec::with_capacity(recs.len() * SLICE_REC_LEN);
        for r in recs {
            r.encode_into(&mut out);
        }
        out
    }
}

/// Volume settings: stored as metadata (key `setting`), changed through the journal.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub name: String,
    pub uuid: String,
    /// Format version of the volume layout.
    pub format_version: u32,
    pub block_size: u32,
    /// Object store URL (never with credentials in it).
    pub storage: String,
    /// Capacity reported by statfs, bytes (0 = unlimited).
    pub capacity: u64,
    /// Journal entries younger than this are kept (seconds).
    pub journal_retention_secs: u64,
    /// The trash time (seconds; 0: no trash): deleted files and directories, and the data of
    /// overwritten or truncated files, are kept this long in the trash (`fs::trash`) before
    /// the primary's background work purges them; freed slices then wait this long again
    /// before `gc` may delete their blocks.
    pub trash_secs: u64,
    /// The most bytes the trash keeps (None: no cap): past it, the oldest entries are
    /// purged first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trash_max_bytes: Option<u64>,
    /// Objects not referenced by metadata are leaked only once older than this (seconds).
    pub gc_grace_secs: u64,
    /// A chunk with more slice records than this is compacted after a write.
    pub compact_threshold: u32,
    pub created_ns: i64,
    /// Set by `jfs load`: which metadata holds the volume's store (the store's owner record
    /// names it), so that the metadata a dump was taken from can no longer write there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// Metadata backups (see `maint::backup`; absent: on, with its defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::maint::backup::BackupSettings>,
}

impl Settings {
    pub fn new(name: &str, storage: &str, block_size: u32) -> Self {
        Settings {
            name: name.to_string(),
            uuid: format!("{:032x}", rand::random::<u128>()),
            format_version: FORMAT_VERSION,
            block_size,
            storage: storage.to_string(),
            capacity: 0,
            journal_retention_secs: 7 * 24 * 3600,
            trash_secs: 0,
            trash_max_bytes: None,
            gc_grace_secs: 3600,
            compact_threshold: 64,
            created_ns: now_ns(),
            incarnation: None,
            backup: None,
        }
    }

    /// The backup settings in force (the defaults when none were set).
    pub fn backup(&self) -> crate::maint::backup::BackupSettings {
        self.backup.clone().unwrap_or_default()
    }
}

/// The volume format this build writes, and the newest it reads.
/// - 1: blocks checked by the length their key names only;
/// - 2: the CRC32C of every block is recorded beside its slice (`keys::checksums`) and
///   checked by every reader, copier and `fsck --deep`.
pub const FORMAT_VERSION: u32 = 2;

impl Settings {
    /// Slices of this volume record block checksums.
    pub fn checksums(&self) -> bool {
        self.format_version >= 2
    }

    /// Refuse a volume this build cannot read correctly (a newer format).
    pub fn check_format(&self) -> crate::error::Result<()> {
        if self.format_version == 0 || self.format_version > FORMAT_VERSION {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Config,
                format!(
                    "volume {:?} has format version {}; this build reads versions 1..={FORMAT_VERSION}: use a newer jfs",
                    self.name, self.format_version
                ),
            ));
        }
        Ok(())
    }

    /// Check the settings before anything is written anywhere.
    pub fn validate(&self) -> crate::error::Result<()> {
        use crate::error::invalid;
        if self.block_size < 64 << 10 || self.block_size > 16 << 20 {
            return Err(invalid(format!(
                "block size {} is outside 64 KiB..16 MiB",
                self.block_size
            )));
        }
        if self.name.is_empty()
            || self.name.len() > 63
            || self.name.starts_with('.')
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(invalid(format!(
                "volume name {:?} must be 1..63 of [A-Za-z0-9-_.], not starting with '.'",
                self.name
            )));
        }
        self.check_format()
    }
}

/// A size in binary units: "4M", "64K", "1GiB", "1.5K", "123" (bytes). Shared by the CLIs.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let m: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G, T)")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let num = num.trim();
    let not_a_size = || format!("{s:?} is not a size (e.g. 4M, 64K, 1G, 1.5T)");
    if num.starts_with('-') {
        return Err(format!("{s:?} is negative"));
    }
    // Digits with at most one decimal point: no sign, exponent, `inf` or `nan`, which f64's
    // parser would take (a size of 1e30 would silently become u64::MAX).
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(not_a_size());
    }
    let too_large = || format!("{s:?} is too large (at most 16 EiB less one byte)");
    if frac.is_empty() {
        let n: u64 = int.parse().map_err(|_| too_large())?;
        return n.checked_mul(mult).ok_or_else(too_large);
    }
    let n: f64 = num.parse().map_err(|_| not_a_size())?;
    let bytes = n * mult as f64;
    // Past 2^53 an f64 no longer holds every whole number: a fraction that large is refused
    // rather than rounded to a neighbour.
    if bytes >= (1u64 << 53) as f64 {
        return Err(format!(
            "{s:?}: give a size this large without a fraction (e.g. in a smaller unit)"
        ));
    }
    Ok(bytes as u64)
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Statistics from `statfs`.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub capacity: u64,
    pub used_space: u64,
    pub used_inodes: u64,
}

/// One directory entry as returned by `readdir`.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        for (s, n) in [
            ("4M", 4 << 20),
            ("64K", 64 << 10),
            ("1GiB", 1 << 30),
            ("123", 123),
            ("1.5K", 1536),
            ("2mb", 2 << 20),
        ] {
            assert_eq!(parse_size(s).unwrap(), n, "{s}");
        }
        assert!(parse_size("4Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("big").is_err());
    }

    #[test]
    fn a_size_past_u64_or_written_as_a_float_is_refused_not_saturated() {
        for bad in [
            "99999999999999999999999T",
            "18446744073709551616",
            "16777216T",
            "inf",
            "nan",
            "1e30",
            "+5",
            ".",
            "",
            "1.5.5K",
            "9007199254740993.5",
        ] {
            let e = parse_size(bad);
            assert!(e.is_err(), "{bad:?} gave {e:?}");
        }
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_size("16777215T").unwrap(), 16777215u64 << 40);
        assert_eq!(parse_size(".5K").unwrap(), 512);
        assert!(parse_size("99999999999999999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn slice_records_round_trip() {
        let recs = vec![
            SliceRec {
                pos: 0,
                id: 7,
                size: 10,
                off: 0,
                len: 10,
            },
            SliceRec {
                pos: 5,
                id: u64::MAX,
                size: u32::MAX,
                off: 3,
                len: 1,
            },
        ];
        let b = SliceRec::encode_list(&recs);
        assert_eq!(b.len(), 48);
        assert_eq!(SliceRec::decode_list(&b).unwrap(), recs);
        assert!(SliceRec::decode_list(&b[..47]).is_none());
    }
}
