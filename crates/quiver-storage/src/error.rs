//! Errors of the storage crate.

/// Coarse classes of [`StorageError`] for callers that branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageErrorKind {
    /// A URL or setting is wrong; retrying will not help.
    InvalidArgument,
    /// The object does not exist.
    NotFound,
    /// The store failed or timed out; a retry may succeed.
    Unavailable,
    /// An object's bytes are damaged or not in a format this build reads.
    Corrupted,
}

/// Everything that can go wrong talking to object storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The object store URL cannot be used.
    #[error("invalid object store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A setting is missing or wrong.
    #[error("object store configuration: {0}")]
    Config(String),
    /// The object does not exist.
    #[error("object {key} not found")]
    NotFound { key: String },
    /// The operation took longer than its timeout.
    #[error("{operation} {key} timed out after {timeout_ms} ms")]
    Timeout {
        operation: &'static str,
        key: String,
        timeout_ms: u64,
    },
    /// The store returned an error (after its retries).
    #[error("{operation} {key}: {source}")]
    Store {
        operation: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// The store returned fewer bytes than asked for.
    #[error("{operation} {key}: expected {expected} bytes, got {actual}")]
    ShortRead {
        operation: &'static str,
        key: String,
        expected: u64,
        actual: u64,
    },
    /// Creating the bucket failed.
    #[error("creating bucket {bucket}: {reason}")]
    Bootstrap { bucket: String, reason: String },
    /// An object (WAL, deletion bitmap) failed its checksum or does not decode.
    #[error("object {key} is corrupted: {reason}")]
    Corrupted { key: String, reason: String },
}

impl StorageError {
    /// Returns the class of this error.
    pub fn kind(&self) -> StorageErrorKind {
        match self {
            StorageError::InvalidUrl { .. } | StorageError::Config(_) => {
                StorageErrorKind::InvalidArgument
            }
            StorageError::NotFound { .. } => StorageErrorKind::NotFound,
            StorageError::Timeout { .. }
            | StorageError::Store { .. }
            | StorageError::ShortRead { .. }
            | StorageError::Bootstrap { .. } => StorageErrorKind::Unavailable,
            StorageError::Corrupted { .. } => StorageErrorKind::Corrupted,
        }
    }

    pub(crate) fn from_store(
        operation: &'static str,
        key: &str,
        source: object_store::Error,
    ) -> Self {
        match source {
            object_store::Error::NotFound { .. } => StorageError::NotFound {
                key: key.to_string(),
            },
            source => StorageError::Store {
                operation,
                key: key.to_string(),
                source,
            },
        }
    }
}

/// Result alias of this crate.
pub type StorageResult<T> = Result<T, StorageError>;
