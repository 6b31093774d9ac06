//! The error body every failed REST request answers with.

use quiver_common::ErrorCode;
use serde::{Deserialize, Serialize};

/// `{"error": {"code": "NOT_FOUND", "message": "collection `x` does not exist"}}`,
/// sent with the HTTP status of the code ([`ErrorCode::http_status`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The code and message of a failed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorDetail {
    /// The code's wire name (`"INVALID_ARGUMENT"`, …). A string, not an
    /// [`ErrorCode`], so that a client reads codes newer than itself; see
    /// [`ErrorDetail::error_code`].
    pub code: String,
    /// What was wrong, naming the input.
    pub message: String,
}

impl ErrorBody {
    /// Returns the body of an error of `code` saying `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.as_str().to_string(),
                message: message.into(),
            },
        }
    }
}

impl ErrorDetail {
    /// Returns the code, or `None` when it is not one this version knows.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.code.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_body_has_the_documented_shape() {
        let body = ErrorBody::new(ErrorCode::DataLoss, "segment s1: checksum mismatch");
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"error": {"code": "DATA_LOSS", "message": "segment s1: checksum mismatch"}})
        );
        let decoded: ErrorBody = serde_json::from_str(
            r#"{"error": {"code": "NOT_FOUND", "message": "gone", "extra": 1}}"#,
        )
        .unwrap();
        assert_eq!(decoded.error.error_code(), Some(ErrorCode::NotFound));
        let newer: ErrorBody =
            serde_json::from_str(r#"{"error": {"code": "ABORTED", "message": "m"}}"#).unwrap();
        assert_eq!(newer.error.error_code(), None);
    }
}
