//! One error type for fs-core and the engines and stores below it: a kind callers can match on,
//! a message for humans, and whether retrying may help.

use std::fmt;

/// What went wrong, coarse enough for callers to decide (retry, map to errno, exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// A backend (engine, object store) failed; see `temporary`.
    Backend,
    /// Malformed URL or configuration.
    Config,
    /// The volume is in use elsewhere (e.g. a RocksDB lock held by another process).
    Busy,
    ReadOnly,
    /// A writer of an older storage generation or primary epoch: its commit is refused.
    Fenced,
}

#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    temporary: bool,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            temporary: false,
        }
    }
    /// A backend failure that may succeed if retried (timeouts, connection resets, 5xx).
    pub fn temporary(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            temporary: true,
        }
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn is_temporary(&self) -> bool {
        self.temporary
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
            _ => 5,                            // EIO
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if self.temporary {
            f.write_str(" (temporary)")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

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
