//! What a call to the metadata service can fail with, seen from the client.

use quiver_proto::{ErrorCode, LEADER_ADDRESS_HEADER, LEADER_ID_HEADER, ServiceError};

/// Result of a metadata client call.
pub type MetaClientResult<T> = Result<T, MetaClientError>;

/// Everything a call to the metadata service can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MetaClientError {
    /// The node asked is not the Raft leader; the leader is attached if known.
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
    /// The client's configuration is invalid (no address, a bad address).
    #[error("invalid metadata client configuration: {0}")]
    Config(String),
    /// A metadata node answered with an error status (a refusal: bad input,
    /// stale epoch, missing object…).
    #[error("metadata rpc failed: {code}: {message}")]
    Remote {
        /// The mapped error code.
        code: ErrorCode,
        /// The remote message, naming the input.
        message: String,
    },
    /// A metadata node answered without the part of the answer it must carry.
    #[error("metadata answer incomplete: {0}")]
    Protocol(String),
}

impl MetaClientError {
    /// Returns the error's code in the shared vocabulary.
    pub fn kind(&self) -> ErrorCode {
        match self {
            MetaClientError::Remote { code, .. } => *code,
            MetaClientError::NotLeader { .. } | MetaClientError::Unavailable(_) => {
                ErrorCode::Unavailable
            }
            MetaClientError::Config(_) => ErrorCode::InvalidArgument,
            MetaClientError::Protocol(_) => ErrorCode::Internal,
        }
    }

    /// Returns the error a received gRPC status stands for: a refusal naming the
    /// leader (`x-quiver-leader`) is [`MetaClientError::NotLeader`], anything else
    /// [`MetaClientError::Remote`].
    pub fn from_status(status: &tonic::Status) -> Self {
        let leader_address = status
            .metadata()
            .get(LEADER_ADDRESS_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        if status.code() == tonic::Code::Unavailable && leader_address.is_some() {
            let leader_id = status
                .metadata()
                .get(LEADER_ID_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok());
            return MetaClientError::NotLeader {
                leader_id,
                leader_address,
            };
        }
        MetaClientError::Remote {
            code: ErrorCode::from_grpc_code(status.code()),
            message: status.message().to_owned(),
        }
    }
}

impl ServiceError for MetaClientError {
    fn error_code(&self) -> ErrorCode {
        self.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_naming_the_leader_is_not_leader() {
        let mut status = tonic::Status::unavailable("not the metadata leader");
        status
            .metadata_mut()
            .insert(LEADER_ADDRESS_HEADER, "127.0.0.1:7002".parse().unwrap());
        status
            .metadata_mut()
            .insert(LEADER_ID_HEADER, "2".parse().unwrap());
        match MetaClientError::from_status(&status) {
            MetaClientError::NotLeader {
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
    fn other_statuses_keep_their_code_and_message() {
        let error = MetaClientError::from_status(&tonic::Status::failed_precondition(
            "stale epoch 1 for shard 1/0: current epoch is 2",
        ));
        assert_eq!(error.kind(), ErrorCode::FailedPrecondition);
        assert!(error.to_string().contains("stale epoch 1"), "{error}");
        let status = quiver_proto::status_of(&error);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    }
}
