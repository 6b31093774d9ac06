//! Errors of the write path.

use crate::catalog::{CatalogError, ShardRef};

/// Coarse classes of [`IndexerError`], one per code of the API's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerErrorKind {
    /// The request is wrong (dimension, value, id); nothing was written.
    InvalidArgument,
    /// The shard or object does not exist.
    NotFound,
    /// Too many unflushed rows; retry after a short wait.
    ResourceExhausted,
    /// This indexer no longer holds the shard's lease.
    FailedPrecondition,
    /// Object storage or the metadata service failed; the write was not
    /// acknowledged and may be retried.
    Unavailable,
    /// Stored data is damaged.
    DataLoss,
    /// A bug or an unexpected state.
    Internal,
}

/// Everything that can go wrong on the write path.
#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    /// A write is invalid.
    #[error("invalid write: {0}")]
    InvalidArgument(String),
    /// Too many rows wait for a flush.
    #[error(
        "shard {shard} has {unflushed_rows} unflushed rows (limit {limit}); retry in about {retry_after_ms} ms"
    )]
    Backpressure {
        shard: ShardRef,
        unflushed_rows: usize,
        limit: usize,
        retry_after_ms: u64,
    },
    /// Another indexer took the shard over.
    #[error("shard {shard}: this indexer's lease (epoch {epoch}) was taken over")]
    Fenced { shard: ShardRef, epoch: u64 },
    /// The shard writer is stopping or stopped.
    #[error("shard {0} is not open on this indexer")]
    ShardClosed(ShardRef),
    /// Object storage failed.
    #[error(transparent)]
    Storage(#[from] quiver_storage::StorageError),
    /// Object storage failed a group commit (the message of the store's error;
    /// every writer of the batch gets its own copy).
    #[error("object storage unavailable: {0}")]
    StorageUnavailable(String),
    /// The metadata service failed or refused.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Building or reading a segment failed.
    #[error(transparent)]
    Index(#[from] quiver_index::IndexError),
    /// Local scratch files failed.
    #[error("local file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A background task died.
    #[error("internal error: {0}")]
    Internal(String),
    /// A compaction running in the background failed (its error, as each
    /// caller that joined it receives it).
    #[error("{message}")]
    Compaction {
        kind: IndexerErrorKind,
        message: String,
    },
}

impl IndexerError {
    /// Returns the class of this error.
    pub fn kind(&self) -> IndexerErrorKind {
        match self {
            IndexerError::InvalidArgument(_) => IndexerErrorKind::InvalidArgument,
            IndexerError::Backpressure { .. } => IndexerErrorKind::ResourceExhausted,
            IndexerError::Fenced { .. } | IndexerError::ShardClosed(_) => {
                IndexerErrorKind::FailedPrecondition
            }
            IndexerError::Storage(error) => match error.kind() {
                quiver_storage::StorageErrorKind::InvalidArgument => IndexerErrorKind::Internal,
                quiver_storage::StorageErrorKind::NotFound => IndexerErrorKind::NotFound,
                quiver_storage::StorageErrorKind::Unavailable => IndexerErrorKind::Unavailable,
                quiver_storage::StorageErrorKind::Corrupted => IndexerErrorKind::DataLoss,
            },
            IndexerError::StorageUnavailable(_) => IndexerErrorKind::Unavailable,
            IndexerError::Catalog(error) => match error {
                CatalogError::Fenced { .. } => IndexerErrorKind::FailedPrecondition,
                CatalogError::NotFound(_) => IndexerErrorKind::NotFound,
                CatalogError::Unavailable(_) => IndexerErrorKind::Unavailable,
                CatalogError::Rejected(_) => IndexerErrorKind::Internal,
            },
            IndexerError::Index(error) => match error.kind() {
                quiver_index::IndexErrorKind::InvalidArgument => IndexerErrorKind::InvalidArgument,
                quiver_index::IndexErrorKind::Corrupted => IndexerErrorKind::DataLoss,
                _ => IndexerErrorKind::Internal,
            },
            IndexerError::Io { .. } | IndexerError::Internal(_) => IndexerErrorKind::Internal,
            IndexerError::Compaction { kind, .. } => *kind,
        }
    }
}

/// Result alias of this crate.
pub type IndexerResult<T> = Result<T, IndexerError>;
