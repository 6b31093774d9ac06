//! Errors of the write path, and the code of the shared vocabulary each maps to
//! ([`ServiceError`]): callers branch on [`ServiceError::error_code`], the gRPC
//! server answers with [`quiver_proto::status_of`].

use std::time::Duration;

use quiver_proto::{ErrorCode, ServiceError};

use crate::catalog::{CatalogError, ShardRef};

/// Everything that can go wrong on the write path.
#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    /// A write is invalid.
    #[error("invalid write: {0}")]
    InvalidArgument(String),
    /// Too many rows (or bytes of rows) wait for a flush.
    #[error("shard {shard} has {what}; retry in about {retry_after_ms} ms")]
    Backpressure {
        shard: ShardRef,
        /// What is over its limit, e.g. "200000 unflushed rows (limit 200000)".
        what: String,
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
    Compaction { code: ErrorCode, message: String },
}

impl ServiceError for IndexerError {
    fn error_code(&self) -> ErrorCode {
        match self {
            IndexerError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            IndexerError::Backpressure { .. } => ErrorCode::ResourceExhausted,
            IndexerError::Fenced { .. } | IndexerError::ShardClosed(_) => {
                ErrorCode::FailedPrecondition
            }
            IndexerError::Storage(error) => match error.kind() {
                // A key this crate built was refused: a bug here, not the caller's.
                quiver_storage::StorageErrorKind::InvalidArgument => ErrorCode::Internal,
                quiver_storage::StorageErrorKind::NotFound => ErrorCode::NotFound,
                quiver_storage::StorageErrorKind::Unavailable => ErrorCode::Unavailable,
                quiver_storage::StorageErrorKind::Corrupted => ErrorCode::DataLoss,
            },
            IndexerError::StorageUnavailable(_) => ErrorCode::Unavailable,
            IndexerError::Catalog(error) => match error {
                CatalogError::Fenced { .. } => ErrorCode::FailedPrecondition,
                CatalogError::NotFound(_) => ErrorCode::NotFound,
                CatalogError::Unavailable(_) => ErrorCode::Unavailable,
                CatalogError::Rejected(_) => ErrorCode::Internal,
            },
            IndexerError::Index(error) => match error.kind() {
                quiver_index::IndexErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
                quiver_index::IndexErrorKind::Corrupted => ErrorCode::DataLoss,
                _ => ErrorCode::Internal,
            },
            IndexerError::Io { .. } | IndexerError::Internal(_) => ErrorCode::Internal,
            IndexerError::Compaction { code, .. } => *code,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            IndexerError::Backpressure { retry_after_ms, .. } => {
                Some(Duration::from_millis(*retry_after_ms))
            }
            _ => None,
        }
    }
}

/// Result alias of this crate.
pub type IndexerResult<T> = Result<T, IndexerError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_data_is_data_loss_and_backpressure_names_its_wait() {
        let corrupted = IndexerError::Storage(quiver_storage::StorageError::Corrupted {
            key: "wal/1".into(),
            reason: "bad checksum".into(),
        });
        assert_eq!(corrupted.error_code(), ErrorCode::DataLoss);
        let shard = ShardRef {
            collection_id: "c".into(),
            shard: 0,
        };
        let backpressure = IndexerError::Backpressure {
            shard: shard.clone(),
            what: "10 unflushed rows (limit 10)".into(),
            retry_after_ms: 250,
        };
        assert_eq!(backpressure.error_code(), ErrorCode::ResourceExhausted);
        assert_eq!(backpressure.retry_after(), Some(Duration::from_millis(250)));
        let status = quiver_proto::status_of(&backpressure);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            quiver_proto::retry_after_of_status(&status),
            Some(Duration::from_millis(250))
        );
        let fenced = IndexerError::Fenced { shard, epoch: 3 };
        assert_eq!(fenced.error_code(), ErrorCode::FailedPrecondition);
        assert_eq!(fenced.retry_after(), None);
    }
}
