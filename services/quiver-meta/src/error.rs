//! The metadata service's error type.

use quiver_proto::{ErrorCode, ServiceError};

use crate::model::Rejection;

/// Result of a metadata service operation.
pub type MetaResult<T> = Result<T, MetaError>;

/// Everything that can go wrong in the metadata service.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The catalog refused the request (bad input, stale epoch, missing object…).
    #[error("{message}")]
    Rejected {
        /// Error code.
        code: ErrorCode,
        /// What was wrong, naming the input.
        message: String,
    },
    /// This node is not the Raft leader; the leader's address is attached if known.
    #[error("not the metadata leader (leader: {})", leader_address.as_deref().unwrap_or("unknown"))]
    NotLeader {
        /// The leader's node id, if known.
        leader_id: Option<u64>,
        /// The leader's address, if known.
        leader_address: Option<String>,
    },
    /// No metadata node answered in time.
    #[error("metadata service unavailable: {0}")]
    Unavailable(String),
    /// The configuration is invalid.
    #[error("invalid metadata configuration: {0}")]
    Config(String),
    /// Local storage (Raft log, snapshots) failed.
    #[error("metadata storage error at {path}: {message}")]
    Storage {
        /// The file or directory involved.
        path: String,
        /// What failed.
        message: String,
    },
    /// Raft failed in a way that is not a leadership question.
    #[error("raft error: {0}")]
    Raft(String),
}

impl MetaError {
    /// Returns the error's code in the shared vocabulary.
    pub fn kind(&self) -> ErrorCode {
        match self {
            MetaError::Rejected { code, .. } => *code,
            MetaError::NotLeader { .. } | MetaError::Unavailable(_) => ErrorCode::Unavailable,
            MetaError::Config(_) => ErrorCode::InvalidArgument,
            MetaError::Storage { .. } | MetaError::Raft(_) => ErrorCode::Internal,
        }
    }

    pub(crate) fn storage(path: impl std::fmt::Display, message: impl std::fmt::Display) -> Self {
        MetaError::Storage {
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// Converts the error into a gRPC status ([`quiver_proto::status_of`]);
    /// `NotLeader` carries the leader in the `x-quiver-leader` /
    /// `x-quiver-leader-id` metadata, where the client finds it.
    pub fn into_status(self) -> tonic::Status {
        let mut status = quiver_proto::status_of(&self);
        if let MetaError::NotLeader {
            leader_id,
            leader_address,
        } = &self
        {
            let metadata = status.metadata_mut();
            if let Some(address) = leader_address
                && let Ok(value) = address.parse()
            {
                metadata.insert(quiver_proto::LEADER_ADDRESS_HEADER, value);
            }
            if let Some(id) = leader_id
                && let Ok(value) = id.to_string().parse()
            {
                metadata.insert(quiver_proto::LEADER_ID_HEADER, value);
            }
        }
        status
    }
}

impl ServiceError for MetaError {
    fn error_code(&self) -> ErrorCode {
        self.kind()
    }
}

impl From<Rejection> for MetaError {
    fn from(rejection: Rejection) -> Self {
        MetaError::Rejected {
            code: rejection.code,
            message: rejection.message,
        }
    }
}

impl From<MetaError> for tonic::Status {
    fn from(error: MetaError) -> Self {
        error.into_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_round_trips_through_a_status() {
        let status = MetaError::NotLeader {
            leader_id: Some(2),
            leader_address: Some("127.0.0.1:7002".into()),
        }
        .into_status();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        match quiver_meta_client::MetaClientError::from_status(&status) {
            quiver_meta_client::MetaClientError::NotLeader {
                leader_id,
                leader_address,
            } => {
                assert_eq!(leader_id, Some(2));
                assert_eq!(leader_address.as_deref(), Some("127.0.0.1:7002"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejections_keep_their_code() {
        let error = MetaError::from(Rejection::new(
            ErrorCode::FailedPrecondition,
            "stale epoch 1 for shard 1/0: current epoch is 2",
        ));
        assert_eq!(error.kind(), ErrorCode::FailedPrecondition);
        let status = error.into_status();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("stale epoch 1"));
    }
}
