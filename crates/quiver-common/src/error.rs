//! The error-code vocabulary shared by every Quiver service, REST and gRPC, and the
//! trait every service error implements to say which code it is.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Response header (HTTP) and metadata key (gRPC) carrying how long, in
/// milliseconds, a client should wait before retrying a refused request.
pub const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";

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
    /// A quota or size limit was hit, or the service is overloaded; retry later.
    ResourceExhausted,
    /// No or invalid credentials.
    Unauthenticated,
    /// Valid credentials without the right to do this.
    PermissionDenied,
    /// The request was cancelled.
    Cancelled,
    /// Stored bytes are damaged or missing (a checksum failed, an object vanished).
    DataLoss,
    /// A bug or an unexpected failure inside the service.
    Internal,
}

impl ErrorCode {
    /// Returns every code, in declaration order.
    pub const ALL: [ErrorCode; 12] = [
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
        ErrorCode::DataLoss,
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
            ErrorCode::DataLoss => "DATA_LOSS",
            ErrorCode::Internal => "INTERNAL",
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
            ErrorCode::DataLoss | ErrorCode::Internal => 500,
        }
    }

    /// Returns whether a request refused with this code may succeed when sent again
    /// (possibly to another node): unavailable, overloaded, timed out.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Unavailable | ErrorCode::ResourceExhausted | ErrorCode::DeadlineExceeded
        )
    }
}

#[cfg(feature = "grpc")]
impl ErrorCode {
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
            ErrorCode::DataLoss => tonic::Code::DataLoss,
            ErrorCode::Internal => tonic::Code::Internal,
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
            tonic::Code::DataLoss => ErrorCode::DataLoss,
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

/// An error a Quiver service can send to its caller: it names its code (and, when
/// the caller should come back later, how much later); its `Display` is the message.
///
/// Every service error implements this one trait, so turning an error into a gRPC
/// status ([`status_of`]) or an HTTP answer (the gateway's) is one generic function,
/// not a hand-written table per service.
pub trait ServiceError: std::error::Error {
    /// Returns the code of the vocabulary this error maps to.
    fn error_code(&self) -> ErrorCode;

    /// Returns how long the caller should wait before retrying, when the error says so
    /// (backpressure, overload).
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// Returns the gRPC status of any service error: its code, its message, and the
/// [`RETRY_AFTER_MS_HEADER`] metadata when it carries a retry hint.
#[cfg(feature = "grpc")]
pub fn status_of<E: ServiceError + ?Sized>(error: &E) -> tonic::Status {
    let mut status = error.error_code().to_status(error.to_string());
    if let Some(retry_after) = error.retry_after()
        && let Ok(value) = retry_after.as_millis().to_string().parse()
    {
        status.metadata_mut().insert(RETRY_AFTER_MS_HEADER, value);
    }
    status
}

/// Returns the retry hint a gRPC status carries in its [`RETRY_AFTER_MS_HEADER`]
/// metadata, if any.
#[cfg(feature = "grpc")]
pub fn retry_after_of_status(status: &tonic::Status) -> Option<Duration> {
    status
        .metadata()
        .get(RETRY_AFTER_MS_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok())
        .map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_name() {
        for code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            let json = serde_json::to_string(&code).expect("an error code serializes");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(code.to_string(), code.as_str());
        }
        assert!("NOT_A_CODE".parse::<ErrorCode>().is_err());
    }

    #[test]
    fn http_statuses_are_client_or_server_errors() {
        for code in ErrorCode::ALL {
            let status = code.http_status();
            assert!((400..600).contains(&status), "{code}: {status}");
        }
        assert_eq!(ErrorCode::NotFound.http_status(), 404);
        assert_eq!(ErrorCode::Unavailable.http_status(), 503);
        assert_eq!(ErrorCode::ResourceExhausted.http_status(), 429);
    }

    #[test]
    fn only_transient_codes_are_retryable() {
        let retryable: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|code| code.is_retryable())
            .collect();
        assert_eq!(
            retryable,
            [
                ErrorCode::Unavailable,
                ErrorCode::DeadlineExceeded,
                ErrorCode::ResourceExhausted
            ]
        );
    }

    #[cfg(feature = "grpc")]
    mod grpc {
        use super::*;

        #[derive(Debug)]
        struct Overloaded;

        impl fmt::Display for Overloaded {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("shard s0: 20000 rows unflushed")
            }
        }

        impl std::error::Error for Overloaded {}

        impl ServiceError for Overloaded {
            fn error_code(&self) -> ErrorCode {
                ErrorCode::ResourceExhausted
            }

            fn retry_after(&self) -> Option<Duration> {
                Some(Duration::from_millis(250))
            }
        }

        #[test]
        fn every_code_round_trips_through_grpc() {
            for code in ErrorCode::ALL {
                assert_eq!(ErrorCode::from_grpc_code(code.grpc_code()), code);
            }
        }

        #[test]
        fn a_service_error_becomes_a_status_with_its_retry_hint() {
            let status = status_of(&Overloaded);
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert_eq!(status.message(), "shard s0: 20000 rows unflushed");
            assert_eq!(
                retry_after_of_status(&status),
                Some(Duration::from_millis(250))
            );
            let plain = ErrorCode::FailedPrecondition.to_status("stale epoch 3, current epoch 4");
            assert_eq!(plain.code(), tonic::Code::FailedPrecondition);
            assert_eq!(retry_after_of_status(&plain), None);
        }
    }
}
