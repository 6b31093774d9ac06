//! The gateway's errors: one code of the shared vocabulary plus a message naming
//! what was wrong. `GatewayError` is a [`ServiceError`], so the one mapping of
//! that trait renders it: as a gRPC status ([`quiver_proto::status_of`]) and as
//! the REST error answer (`rest::error_response`).

use std::time::Duration;

use quiver_proto::{ErrorCode, ServiceError, retry_after_of_status};

/// A failed request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct GatewayError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// What was wrong, naming the input.
    pub message: String,
    /// Suggested wait before a retry (a node's backpressure hint, passed on).
    pub retry_after: Option<Duration>,
}

impl GatewayError {
    /// Returns an error of `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        GatewayError {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Returns an INVALID_ARGUMENT error.
    pub fn invalid(message: impl Into<String>) -> Self {
        GatewayError::new(ErrorCode::InvalidArgument, message)
    }

    /// Returns a NOT_FOUND error.
    pub fn not_found(message: impl Into<String>) -> Self {
        GatewayError::new(ErrorCode::NotFound, message)
    }

    /// Returns an UNAVAILABLE error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        GatewayError::new(ErrorCode::Unavailable, message)
    }

    /// Returns an INTERNAL error.
    pub fn internal(message: impl Into<String>) -> Self {
        GatewayError::new(ErrorCode::Internal, message)
    }

    /// Returns this error with `context` before its message (`searches[2]: …`).
    pub fn with_context(mut self, context: impl std::fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Returns the error a role's gRPC status maps to, with its retry hint.
    pub fn from_status(status: &tonic::Status) -> Self {
        let retry_after = retry_after_of_status(status);
        // A status with a source was made on this side of the connection
        // from a transport failure (connection refused or reset, a broken
        // HTTP/2 stream): tonic gives those `Unknown`. The node may be
        // restarting or gone, so it is `UNAVAILABLE` (retried on another
        // route), not an internal error.
        let from_transport = std::error::Error::source(status).is_some()
            && matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal);
        if from_transport {
            return GatewayError {
                code: ErrorCode::Unavailable,
                message: format!("node unreachable: {}", transport_detail(status)),
                retry_after,
            };
        }
        // tonic answers a call that ran out of the channel's timeout with
        // `CANCELLED: Timeout expired`, which reads as if the client had given
        // up (HTTP 499); it is the node that did not answer in time.
        if timed_out_here(status) {
            return GatewayError {
                code: ErrorCode::DeadlineExceeded,
                message: "no answer within the gateway's request timeout \
                          (`[gateway] request_timeout_ms`)"
                    .to_string(),
                retry_after,
            };
        }
        GatewayError {
            code: ErrorCode::from_grpc_code(status.code()),
            message: status.message().to_string(),
            retry_after,
        }
    }
}

impl ServiceError for GatewayError {
    fn error_code(&self) -> ErrorCode {
        self.code
    }

    fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// Returns whether `status`, the failure of a call over the network, was made
/// on this side of the connection because the node could not be reached
/// (connection refused or reset, no route, TLS failed) rather than sent by the
/// node: tonic makes those with a source, or — a failed connect — as a bare
/// `UNAVAILABLE: tcp connect error` without metadata, while every status a
/// server sends carries at least its response headers (`content-type`).
pub(crate) fn is_unreachable(status: &tonic::Status) -> bool {
    let made_here = std::error::Error::source(status).is_some() || status.metadata().is_empty();
    made_here && ErrorCode::from_grpc_code(status.code()) != ErrorCode::Cancelled
}

/// Returns whether `status` is tonic's own for a call that ran out of the
/// channel's timeout (`CANCELLED: Timeout expired`, made on this side with the
/// timeout as its source), not a cancellation the node sent.
pub(crate) fn timed_out_here(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Cancelled {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        if cause.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The message of a transport failure with its causes ("transport error:
/// connection reset by peer"), so the user sees more than "transport error".
fn transport_detail(status: &tonic::Status) -> String {
    let mut detail = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !detail.contains(&text) {
            detail.push_str(": ");
            detail.push_str(&text);
        }
        source = cause.source();
    }
    detail
}

impl From<quiver_meta_client::MetaClientError> for GatewayError {
    fn from(error: quiver_meta_client::MetaClientError) -> Self {
        // A refusal carries the catalog's own message ("collection `x` not
        // found"); show it without the transport's wording around it.
        let message = match &error {
            quiver_meta_client::MetaClientError::Remote { message, .. } => message.clone(),
            other => other.to_string(),
        };
        GatewayError::new(error.kind(), message)
    }
}

/// Result alias of this crate.
pub type GatewayResult<T> = Result<T, GatewayError>;

#[cfg(test)]
mod tests {
    use quiver_proto::{RETRY_AFTER_MS_HEADER, status_of};

    use super::*;

    #[test]
    fn a_transport_failure_is_unavailable_and_names_its_cause() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let status = tonic::Status::from_error(Box::new(reset));
        let error = GatewayError::from_status(&status);
        assert_eq!(error.code, ErrorCode::Unavailable, "{error:?}");
        assert!(
            error.message.contains("connection reset"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_failed_connect_is_unreachable_and_a_refusal_sent_by_the_node_is_not() {
        // What tonic makes of a refused connection (`ConnectError`).
        assert!(is_unreachable(&tonic::Status::unavailable(
            "tcp connect error"
        )));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        assert!(is_unreachable(&tonic::Status::from_error(Box::new(reset))));
        // A searcher's own UNAVAILABLE comes with its response headers.
        let mut sent = tonic::Status::unavailable("object store unavailable");
        sent.metadata_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        assert!(!is_unreachable(&sent));
    }

    #[test]
    fn a_status_sent_by_the_node_keeps_its_code() {
        for (code, expected) in [
            (tonic::Code::Internal, ErrorCode::Internal),
            (tonic::Code::Unknown, ErrorCode::Internal),
            (tonic::Code::InvalidArgument, ErrorCode::InvalidArgument),
            (tonic::Code::Unavailable, ErrorCode::Unavailable),
            (tonic::Code::DataLoss, ErrorCode::DataLoss),
        ] {
            let error = GatewayError::from_status(&tonic::Status::new(code, "from the node"));
            assert_eq!(error.code, expected);
            assert_eq!(error.message, "from the node");
        }
    }

    #[test]
    fn a_retry_hint_survives_the_round_trip_through_grpc() {
        let mut status = tonic::Status::resource_exhausted("shard 0: 20000 unflushed rows");
        status
            .metadata_mut()
            .insert(RETRY_AFTER_MS_HEADER, "250".parse().unwrap());
        let error = GatewayError::from_status(&status);
        assert_eq!(error.retry_after, Some(Duration::from_millis(250)));
        let again = status_of(&error);
        assert_eq!(again.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            retry_after_of_status(&again),
            Some(Duration::from_millis(250))
        );
    }
}
