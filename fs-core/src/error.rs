//! One error type for fs-core and the engines and stores below it: a kind callers can match on,
//! a message for humans, and whether retrying may help.

use std::fmt;

/// What went wrong, coarse enough for callers to decide (retry, map to errno, exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    NotDir,
    IsDir,
    NotEmpty,
    InvalidArgument,
    NameTooLong,
    /// An xattr that does not exist (ENODATA).
    NoData,
    PermissionDenied,
    /// An optimistic transaction lost a race; the caller re-runs it.
    Conflict,
    /// Stored bytes failed a check (checksum, length, version, decoding).
    Corrupt,
    /// A frame or format version this build does not know.
    UnsupportedVersion,
    /// The volume has not been formatted (no settings found).
    NotFormatted,
    /// A journal position that is no longer retained.
    SeqNotRetained,
    /// A backend (engine, object store) failed; see `status`.
    Backend,
    /// Malformed URL or configuration.
    Config,
    /// The volume is in use elsewhere (e.g. a RocksDB lock held by another process).
    Busy,
    ReadOnly,
    /// A writer of an older storage generation or primary epoch: its commit is refused.
    Fenced,
    /// The disk or store that was written is full (ENOSPC, EDQUOT, a database's disk-full
    /// error, the room a RocksDB directory keeps): applications get ENOSPC, not EIO.
    NoSpace,
}

/// Whether retrying may help (OpenDAL's shape): a `Temporary` error may succeed when tried
/// again; one that stayed temporary through every retry becomes `Persistent` (the caller
/// gave up: report, do not retry again at once); a `Permanent` one never succeeds as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorStatus {
    Permanent,
    Temporary,
    Persistent,
}

#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    status: ErrorStatus,
    /// The error this one was made from, for `source()` chains (kept, never only printed).
    source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            status: ErrorStatus::Permanent,
            source: None,
        }
    }
    /// A backend failure that may succeed if retried (timeouts, connection resets, 5xx).
    pub fn temporary(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            status: ErrorStatus::Temporary,
            ..Error::new(kind, message)
        }
    }
    /// Keep `source` as the cause of this error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(std::sync::Arc::new(source));
        self
    }
    /// A temporary error the caller retried for as long as it would: persistent now.
    pub fn persist(mut self) -> Self {
        if self.status == ErrorStatus::Temporary {
            self.status = ErrorStatus::Persistent;
        }
        self
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn status(&self) -> ErrorStatus {
        self.status
    }
    /// Whether retrying may help (only a `Temporary` error).
    pub fn is_temporary(&self) -> bool {
        self.status == ErrorStatus::Temporary
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Prefix the message with what was being done.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
    /// The POSIX errno a file-system front end should return.
    pub fn errno(&self) -> i32 {
        match self.kind {
            ErrorKind::NotFound => 2,          // ENOENT
            ErrorKind::AlreadyExists => 17,    // EEXIST
            ErrorKind::NotDir => 20,           // ENOTDIR
            ErrorKind::IsDir => 21,            // EISDIR
            ErrorKind::NotEmpty => 39,         // ENOTEMPTY
            ErrorKind::InvalidArgument => 22,  // EINVAL
            ErrorKind::NameTooLong => 36,      // ENAMETOOLONG
            ErrorKind::NoData => 61,           // ENODATA
            ErrorKind::PermissionDenied => 13, // EACCES
            ErrorKind::ReadOnly => 30,         // EROFS
            ErrorKind::Busy => 16,             // EBUSY
            ErrorKind::NoSpace => 28,          // ENOSPC
            _ => 5,                            // EIO
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match self.status {
            ErrorStatus::Temporary => f.write_str(" (temporary)"),
            ErrorStatus::Persistent => {
                f.write_str(" (persistent: it stayed temporary through every retry)")
            }
            ErrorStatus::Permanent => Ok(()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl Error {
    /// An operating-system error in fs-core's kinds, in one place for every caller (stores
    /// on local disk, commands that go through a mount): what retrying cannot fix (a
    /// read-only file system, permission denied, a full disk, a missing file) is permanent;
    /// interruptions and timeouts are temporary.
    pub fn from_io(e: &std::io::Error, what: impl fmt::Display) -> Error {
        use std::io::ErrorKind as K;
        let kind = match e.raw_os_error() {
            Some(2) => ErrorKind::NotFound,                    // ENOENT
            Some(17) => ErrorKind::AlreadyExists,              // EEXIST
            Some(20) | Some(40) => ErrorKind::NotDir, // ENOTDIR, ELOOP (a symlink on the way)
            Some(21) => ErrorKind::IsDir,             // EISDIR
            Some(39) => ErrorKind::NotEmpty,          // ENOTEMPTY
            Some(22) => ErrorKind::InvalidArgument,   // EINVAL
            Some(36) => ErrorKind::NameTooLong,       // ENAMETOOLONG
            Some(1) | Some(13) => ErrorKind::PermissionDenied, // EPERM, EACCES
            Some(30) => ErrorKind::ReadOnly,          // EROFS
            Some(16) => ErrorKind::Busy,              // EBUSY
            Some(28) | Some(122) => ErrorKind::NoSpace, // ENOSPC, EDQUOT
            _ => match e.kind() {
                K::NotFound => ErrorKind::NotFound,
                K::AlreadyExists => ErrorKind::AlreadyExists,
                K::PermissionDenied => ErrorKind::PermissionDenied,
                K::InvalidInput => ErrorKind::InvalidArgument,
                _ => ErrorKind::Backend,
            },
        };
        let temporary = matches!(
            e.kind(),
            K::Interrupted
                | K::TimedOut
                | K::WouldBlock
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::ConnectionRefused
                | K::BrokenPipe
                | K::UnexpectedEof
        );
        let status = if temporary {
            ErrorStatus::Temporary
        } else {
            ErrorStatus::Permanent
        };
        Error {
            kind,
            message: format!("{what}: {e}"),
            status,
            source: Some(std::sync::Arc::new(
                e.raw_os_error()
                    .map(std::io::Error::from_raw_os_error)
                    .unwrap_or_else(|| std::io::Error::new(e.kind(), e.to_string())),
            )),
        }
    }
}

/// Shorthands used throughout fs-core.
pub fn not_found(what: impl fmt::Display) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("{what}: no such file or directory"),
    )
}
pub fn corrupt(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, what)
}
pub fn invalid(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, what)
}

#[cfg(test)]
mod tests {
    use super::{Error, ErrorKind};

    fn check(errno: i32, kind: ErrorKind, temporary: bool) {
        let e = Error::from_io(&std::io::Error::from_raw_os_error(errno), "writing x");
        assert_eq!(
            (e.kind(), e.is_temporary()),
            (kind, temporary),
            "errno {errno}: {e}"
        );
    }

    #[test]
    fn operating_system_errors_that_retrying_cannot_fix_are_permanent() {
        check(30, ErrorKind::ReadOnly, false); // EROFS
        check(13, ErrorKind::PermissionDenied, false); // EACCES
        check(1, ErrorKind::PermissionDenied, false); // EPERM
        check(28, ErrorKind::NoSpace, false); // ENOSPC
        check(122, ErrorKind::NoSpace, false); // EDQUOT
        check(2, ErrorKind::NotFound, false);
        check(40, ErrorKind::NotDir, false); // ELOOP: a symlink on the way
        check(4, ErrorKind::Backend, true); // EINTR
        check(110, ErrorKind::Backend, true); // ETIMEDOUT
    }
}
