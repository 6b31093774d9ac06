//! Errors of the region cache.

use std::path::PathBuf;

use quiver_common::{ErrorCode, ServiceError};

/// Everything that can go wrong reading through the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache configuration cannot work.
    #[error("cache configuration: {0}")]
    Config(String),
    /// Creating, sizing or mapping the cache file failed (e.g. the disk is full).
    #[error("cache file {path}: {source}")]
    CacheFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every region is pinned by a reader or being filled. Reads never return
    /// it (they are answered uncached instead); only filling a region can.
    #[error("cache full of pinned regions ({regions} regions): nothing can be evicted")]
    Full { regions: usize },
    /// Filling a region from the object store failed.
    #[error("fetching region {region} of {key}: {message}")]
    Fill {
        key: String,
        region: u64,
        message: String,
    },
    /// The region this read holds was found damaged by another reader and is
    /// being fetched again; the query can be retried.
    #[error("region {region} of {key} failed its checksum and is being fetched again; retry")]
    Discarded { key: String, region: u64 },
    /// A region (or a range read through) failed the segment's chunk checksums,
    /// and again when fetched once more: the object, or the way to it, is damaged.
    #[error("region {region} of {key} failed its checksum ({chunk}), also when fetched again")]
    Damaged {
        key: String,
        region: u64,
        chunk: String,
    },
    /// A read outside the object.
    #[error("read of {length} bytes at {offset} is outside {key} ({size} bytes)")]
    OutOfRange {
        key: String,
        offset: u64,
        length: usize,
        size: u64,
    },
    /// Asking the object store about an object failed.
    #[error(transparent)]
    Storage {
        #[from]
        source: quiver_storage::StorageError,
    },
}

impl ServiceError for CacheError {
    /// A region that failed its checksums twice is lost data; every other failure
    /// is transient or local to this node (the store failed, the cache is busy),
    /// so a retry, or another replica, may answer.
    fn error_code(&self) -> ErrorCode {
        match self {
            CacheError::Damaged { .. } => ErrorCode::DataLoss,
            CacheError::Config(_)
            | CacheError::CacheFile { .. }
            | CacheError::Full { .. }
            | CacheError::Fill { .. }
            | CacheError::Discarded { .. }
            | CacheError::OutOfRange { .. }
            | CacheError::Storage { .. } => ErrorCode::Unavailable,
        }
    }
}

/// Result alias of this crate.
pub type CacheResult<T> = Result<T, CacheError>;
