//! The error-code vocabulary shared by every Quiver service, REST and gRPC.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Response metadata key carrying the Raft leader's address when a metadata follower
/// refuses a request that only the leader can serve.
pub const LEADER_ADDRESS_HEADER: &str = "x-quiver-leader";

/// Response metadata key carrying the Raft leader's node id next to
/// [`LEADER_ADDRESS_HEADER`].
pub const LEADER_ID_HEADER: &str = "x-quiver-leader-id";

/// Names one kind of failure; every service error maps into exactly one code, and
/// each code has one gRPC code and one HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The request itself is wrong (bad field, bad value); retrying will not help.
    InvalidArgument,
    /// The named object (collection, node, shard, segment) does not exist.
    NotFound,
    /// The object to create exists already.
    AlreadyExists,
    /// The system is not in the state the request needs (stale epoch, lease held by
    /// another node).
    FailedPrecondition,
    /// The service cannot answer now (no leader, not the leader, shutting down);
    /// retrying, possibly elsewhere, may succeed.
    Unavailable,
    /// The request did not finish in time.
    DeadlineExceeded,
    /// A quota or size limit was hit.
    ResourceExhausted,
    /// No or invalid credentials.
    Unauthenticated,
    /// Valid credentials without the right to do this.
    PermissionDenied,
    /// The request was cancelled.
    Cancelled,
    /// A bug or an unexpected failure inside the service.
    Internal,
}

impl ErrorCode {
    /// Returns every code, in declaration order.
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::FailedPrecondition,
        ErrorCode::Unavailable,
        ErrorCode::DeadlineExceeded,
        ErrorCode::ResourceExhausted,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::Cancelled,
        ErrorCode::Internal,
    ];

    /// Returns the code's wire name, e.g. `"INVALID_ARGUMENT"` (the REST `error.code`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::AlreadyExists => "ALREADY_EXISTS",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::PermissionDenied => "PERMISSION_DENIED",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    /// Returns the gRPC status code for this error code.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ErrorCode::ResourceExhausted => tonic::Code::ResourceExhausted,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorCode::Cancelled => tonic::Code::Cancelled,
            ErrorCode::Internal => tonic::Code::Internal,
        }
    }

    /// Returns the HTTP status code for this error code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyExists => 409,
            ErrorCode::FailedPrecondition => 412,
            ErrorCode::Unavailable => 503,
            ErrorCode::DeadlineExceeded => 504,
            ErrorCode::ResourceExhausted => 429,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::Cancelled => 499,
            ErrorCode::Internal => 500,
        }
    }

    /// Returns the code a received gRPC status maps to (codes outside the vocabulary
    /// become [`ErrorCode::Internal`], except `ABORTED` which is a failed precondition).
    pub fn from_grpc_code(code: tonic::Code) -> ErrorCode {
        match code {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => ErrorCode::InvalidArgument,
            tonic::Code::NotFound => ErrorCode::NotFound,
            tonic::Code::AlreadyExists => ErrorCode::AlreadyExists,
            tonic::Code::FailedPrecondition | tonic::Code::Aborted => ErrorCode::FailedPrecondition,
            tonic::Code::Unavailable => ErrorCode::Unavailable,
            tonic::Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
            tonic::Code::ResourceExhausted => ErrorCode::ResourceExhausted,
            tonic::Code::Unauthenticated => ErrorCode::Unauthenticated,
            tonic::Code::PermissionDenied => ErrorCode::PermissionDenied,
            tonic::Code::Cancelled => ErrorCode::Cancelled,
            _ => ErrorCode::Internal,
        }
    }

    /// Builds a gRPC status with this code and `message`.
    pub fn to_status(self, message: impl Into<String>) -> tonic::Status {
        tonic::Status::new(self.grpc_code(), message)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl FromStr for ErrorCode {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str() == name)
            .ok_or_else(|| format!("unknown error code `{name}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_grpc_and_its_name() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_grpc_code(code.grpc_code()), code);
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            let json = serde_json::to_string(&code).expect("an error code serializes");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(code.to_string(), code.as_str());
        }
    }

    #[test]
    fn http_statuses_are_client_or_server_errors() {
        for code in ErrorCode::ALL {
            let status = code.http_status();
            assert!((400..600).contains(&status), "{code}: {status}");
        }
        assert_eq!(ErrorCode::NotFound.http_status(), 404);
        assert_eq!(ErrorCode::Unavailable.http_status(), 503);
    }

    #[test]
    fn status_carries_code_and_message() {
        let status = ErrorCode::FailedPrecondition.to_status("stale epoch 3, current epoch 4");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), "stale epoch 3, current epoch 4");
    }
}
