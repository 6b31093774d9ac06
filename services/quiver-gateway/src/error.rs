//! The gateway's errors: one code of the shared vocabulary plus a message naming
//! what was wrong, rendered as `{"error": {"code", "message"}}` over REST and as
//! a status over gRPC.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use quiver_proto::ErrorCode;

/// A failed request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct GatewayError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// What was wrong, naming the input.
    pub message: String,
    /// Suggested wait before a retry, for RESOURCE_EXHAUSTED and UNAVAILABLE.
    pub retry_after_ms: Option<u64>,
}

impl GatewayError {
    /// Returns an error of `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        GatewayError {
            code,
            message: message.into(),
            retry_after_ms: None,
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

    /// Returns the error a role's gRPC status maps to.
    pub fn from_status(status: &tonic::Status) -> Self {
        let retry_after_ms = status
            .metadata()
            .get("retry-after-ms")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse().ok());
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
                retry_after_ms,
            };
        }
        GatewayError {
            code: ErrorCode::from_grpc_code(status.code()),
            message: status.message().to_string(),
            retry_after_ms,
        }
    }

    /// Returns the gRPC status of this error.
    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.code.grpc_code(), self.message.clone())
    }
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

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::json!({
            "error": {"code": self.code.as_str(), "message": self.message}
        });
        let mut response = (status, Json(body)).into_response();
        if let Some(retry_after_ms) = self.retry_after_ms {
            let seconds = retry_after_ms.div_ceil(1000).max(1);
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        response
    }
}

/// Result alias of this crate.
pub type GatewayResult<T> = Result<T, GatewayError>;

#[cfg(test)]
mod tests {
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
    fn a_status_sent_by_the_node_keeps_its_code() {
        for (code, expected) in [
            (tonic::Code::Internal, ErrorCode::Internal),
            (tonic::Code::Unknown, ErrorCode::Internal),
            (tonic::Code::InvalidArgument, ErrorCode::InvalidArgument),
            (tonic::Code::Unavailable, ErrorCode::Unavailable),
        ] {
            let error = GatewayError::from_status(&tonic::Status::new(code, "from the node"));
            assert_eq!(error.code, expected);
            assert_eq!(error.message, "from the node");
        }
    }
}
