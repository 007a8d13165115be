//! The crate's one error type. `bindings` maps each variant to a Python exception.

use std::fmt;

/// Everything that can go wrong in the core.
#[derive(Debug)]
pub enum Error {
    /// A config failed validation; every problem found is listed. The previous snapshot stays.
    Snapshot(Vec<String>),
    /// A shared-memory table has no free entry; callers fail closed.
    ShmFull(&'static str),
    /// A segment file is not a meshfast segment of this layout version.
    ShmLayout(String),
    /// An I/O error on a segment file.
    Io { path: String, source: std::io::Error },
    /// An argument out of its domain (wrong key length, negative amount, ...).
    InvalidArgument(String),
    /// An upstream response lacks what the provider's paths promise (answered as 502).
    UpstreamBody(String),
}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Snapshot(errors) => {
                write!(f, "invalid config ({} problem(s)): {}", errors.len(), errors.join("; "))
            }
            Error::ShmFull(table) => write!(f, "shared-memory {table} is full"),
            Error::ShmLayout(msg) => write!(f, "not a usable meshfast segment: {msg}"),
            Error::Io { path, source } => write!(f, "{path}: {source}"),
            Error::InvalidArgument(msg) => f.write_str(msg),
            Error::UpstreamBody(msg) => write!(f, "unusable upstream response: {msg}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
