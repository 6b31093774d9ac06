//! Errors of the read path, and the code of the shared vocabulary each one is.

use quiver_proto::{ErrorCode, ServiceError};

/// Everything that can go wrong answering from a shard.
#[derive(Debug, thiserror::Error)]
pub enum SearcherError {
    /// The query is invalid.
    #[error("invalid query: {0}")]
    InvalidArgument(String),
    /// Reading or decoding a segment failed.
    #[error(transparent)]
    Index(#[from] quiver_index::IndexError),
    /// Object storage failed.
    #[error(transparent)]
    Storage(#[from] quiver_storage::StorageError),
    /// The region cache failed.
    #[error(transparent)]
    Cache(#[from] quiver_blobcache::CacheError),
    /// The search queue is full: nothing of the request ran; retry after the hint.
    #[error(
        "searcher overloaded: {queued} searches already queued; retry in about {} ms, when they have drained",
        .retry_after.as_millis()
    )]
    Overloaded {
        /// Searches waiting when this one was refused.
        queued: usize,
        /// How long to wait before retrying.
        retry_after: std::time::Duration,
    },
    /// An object is not the size its manifest entry gives (cut short or
    /// replaced): no answer is served from it.
    #[error("object {key} is {actual} bytes, but the manifest lists {listed}: it is damaged")]
    ObjectSize {
        /// The object's key.
        key: String,
        /// Its size in the store.
        actual: u64,
        /// Its size in the manifest.
        listed: u64,
    },
    /// A background task died.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError for SearcherError {
    /// A damaged segment, bitmap or WAL object is `DataLoss` (no answer is served
    /// from it); a failing store or a busy cache is `Unavailable` (retrying, or
    /// another replica, may help); a missing object is `NotFound`.
    fn error_code(&self) -> ErrorCode {
        match self {
            SearcherError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            SearcherError::Index(error) => match error.kind() {
                quiver_index::IndexErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
                quiver_index::IndexErrorKind::Corrupted => ErrorCode::DataLoss,
                quiver_index::IndexErrorKind::Io => ErrorCode::Unavailable,
            },
            SearcherError::Storage(error) => match error.kind() {
                quiver_storage::StorageErrorKind::NotFound => ErrorCode::NotFound,
                quiver_storage::StorageErrorKind::Corrupted => ErrorCode::DataLoss,
                quiver_storage::StorageErrorKind::Unavailable => ErrorCode::Unavailable,
                // The searcher built the request the store refused: a bug here.
                quiver_storage::StorageErrorKind::InvalidArgument => ErrorCode::Internal,
            },
            SearcherError::Cache(error) => error.error_code(),
            SearcherError::Overloaded { .. } => ErrorCode::ResourceExhausted,
            SearcherError::ObjectSize { .. } => ErrorCode::DataLoss,
            SearcherError::Internal(_) => ErrorCode::Internal,
        }
    }

    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            SearcherError::Overloaded { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Result alias of this crate.
pub type SearcherResult<T> = Result<T, SearcherError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_data_is_data_loss_and_a_busy_cache_is_unavailable() {
        let damaged = SearcherError::Cache(quiver_blobcache::CacheError::Damaged {
            key: "segments/s1".into(),
            region: 3,
            chunk: "chunk 0..4096".into(),
        });
        assert_eq!(damaged.error_code(), ErrorCode::DataLoss);
        let status = quiver_proto::status_of(&damaged);
        assert_eq!(status.code(), tonic::Code::DataLoss);
        assert!(status.message().contains("segments/s1"), "{status:?}");

        let full = SearcherError::Cache(quiver_blobcache::CacheError::Full { regions: 4 });
        assert_eq!(full.error_code(), ErrorCode::Unavailable);
        let corrupted = SearcherError::Index(quiver_index::IndexError::Corrupted {
            object: "segments/s1".into(),
            reason: "bad footer".into(),
        });
        assert_eq!(corrupted.error_code(), ErrorCode::DataLoss);
        assert_eq!(
            SearcherError::InvalidArgument("k must be at least 1".into()).error_code(),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            quiver_proto::status_of(&SearcherError::Internal("task died".into())).code(),
            tonic::Code::Internal
        );
    }
}
