//! Errors of the read path.

/// Coarse classes of [`SearcherError`], one per code of the API's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearcherErrorKind {
    /// The query is wrong (dimension, value, k, filter).
    InvalidArgument,
    /// An object of the manifest is missing.
    NotFound,
    /// Object storage failed or the cache is full; retrying may help.
    Unavailable,
    /// A segment, bitmap or WAL object is damaged: no answer is served from it.
    DataLoss,
    /// A bug or an unexpected state.
    Internal,
}

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
    /// A background task died.
    #[error("internal error: {0}")]
    Internal(String),
}

impl SearcherError {
    /// Returns the class of this error.
    pub fn kind(&self) -> SearcherErrorKind {
        match self {
            SearcherError::InvalidArgument(_) => SearcherErrorKind::InvalidArgument,
            SearcherError::Index(error) => match error.kind() {
                quiver_index::IndexErrorKind::InvalidArgument => SearcherErrorKind::InvalidArgument,
                quiver_index::IndexErrorKind::Corrupted => SearcherErrorKind::DataLoss,
                quiver_index::IndexErrorKind::Io => SearcherErrorKind::Unavailable,
            },
            SearcherError::Storage(error) => match error.kind() {
                quiver_storage::StorageErrorKind::NotFound => SearcherErrorKind::NotFound,
                quiver_storage::StorageErrorKind::Corrupted => SearcherErrorKind::DataLoss,
                quiver_storage::StorageErrorKind::Unavailable => SearcherErrorKind::Unavailable,
                quiver_storage::StorageErrorKind::InvalidArgument => SearcherErrorKind::Internal,
            },
            SearcherError::Cache(quiver_blobcache::CacheError::Damaged { .. }) => {
                SearcherErrorKind::DataLoss
            }
            SearcherError::Cache(_) => SearcherErrorKind::Unavailable,
            SearcherError::Internal(_) => SearcherErrorKind::Internal,
        }
    }
}

/// Result alias of this crate.
pub type SearcherResult<T> = Result<T, SearcherError>;
