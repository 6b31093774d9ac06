//! Errors of the index crate.

/// Coarse classes of [`IndexError`] for callers that branch (and map to API codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexErrorKind {
    /// The caller passed bad input (dimension, NaN, parameters).
    InvalidArgument,
    /// Stored data is damaged, truncated or of an unknown format.
    Corrupted,
    /// Reading the underlying bytes failed.
    Io,
}

/// Everything that can go wrong while building, opening or searching a segment.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// A vector has the wrong number of values.
    #[error("vector for row {row} has dimension {actual}, expected {expected}")]
    DimensionMismatch {
        row: usize,
        expected: usize,
        actual: usize,
    },
    /// A vector contains NaN or an infinity.
    #[error("vector for row {row} has a non-finite value at position {position} ({value})")]
    NonFinite {
        row: usize,
        position: usize,
        value: f32,
    },
    /// A parameter or input is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A segment is damaged: checksum mismatch, bad layout, truncated.
    #[error("corrupted segment {object}: {reason}")]
    Corrupted { object: String, reason: String },
    /// A segment was written by an unknown format version.
    #[error("segment {object} has format version {found}, this build reads version {supported}")]
    UnsupportedVersion {
        object: String,
        found: u32,
        supported: u32,
    },
    /// Reading bytes from the source failed.
    #[error("reading {object}: {source}")]
    Io {
        object: String,
        #[source]
        source: std::io::Error,
    },
    /// Writing or mapping a build's scratch file failed.
    #[error("build scratch file in {directory}: {source}")]
    Scratch {
        directory: String,
        #[source]
        source: std::io::Error,
    },
}

impl IndexError {
    /// Returns the error's text for a caller that reports its code beside it: an
    /// invalid argument without the "invalid argument: " its code already says.
    pub fn message(&self) -> String {
        match self {
            IndexError::InvalidArgument(message) => message.clone(),
            other => other.to_string(),
        }
    }

    /// Returns the class of this error.
    pub fn kind(&self) -> IndexErrorKind {
        match self {
            IndexError::DimensionMismatch { .. }
            | IndexError::NonFinite { .. }
            | IndexError::InvalidArgument(_) => IndexErrorKind::InvalidArgument,
            IndexError::Corrupted { .. } | IndexError::UnsupportedVersion { .. } => {
                IndexErrorKind::Corrupted
            }
            IndexError::Io { .. } | IndexError::Scratch { .. } => IndexErrorKind::Io,
        }
    }

    pub(crate) fn corrupted(object: &str, reason: impl Into<String>) -> Self {
        IndexError::Corrupted {
            object: object.to_string(),
            reason: reason.into(),
        }
    }
}

/// Result alias of this crate.
pub type IndexResult<T> = Result<T, IndexError>;

impl From<quiver_model::ParseMetricError> for IndexError {
    fn from(error: quiver_model::ParseMetricError) -> Self {
        IndexError::InvalidArgument(error.to_string())
    }
}
