//! The REST answer of a failed request, for any [`ServiceError`]: the HTTP
//! status of its code, the JSON error body, and its retry hint as headers
//! (`retry-after-ms` exact, `Retry-After` in whole seconds for generic clients).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_api::ErrorBody;
use quiver_proto::{RETRY_AFTER_MS_HEADER, ServiceError};

use crate::error::GatewayError;

/// Returns the answer of `error`: status from [`quiver_proto::ErrorCode::http_status`].
pub fn error_response<E: ServiceError + ?Sized>(error: &E) -> Response {
    let status = StatusCode::from_u16(error.error_code().http_status())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_response_with_status(status, error)
}

/// Returns the answer of `error` with `status` instead of its code's (`405`,
/// `415`: HTTP-level refusals the vocabulary has no code of its own for).
pub fn error_response_with_status<E: ServiceError + ?Sized>(
    status: StatusCode,
    error: &E,
) -> Response {
    let body = ErrorBody::new(error.error_code(), error.to_string());
    let mut response = (status, Json(body)).into_response();
    if let Some(retry_after) = error.retry_after() {
        let milliseconds = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        let seconds = milliseconds.div_ceil(1000).max(1);
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&milliseconds.to_string()) {
            headers.insert(RETRY_AFTER_MS_HEADER, value);
        }
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            headers.insert(header::RETRY_AFTER, value);
        }
    }
    response
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quiver_proto::ErrorCode;

    use super::*;

    async fn body_of(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a small body");
        serde_json::from_slice(&bytes).expect("a JSON body")
    }

    #[tokio::test]
    async fn an_error_answers_with_its_status_body_and_retry_hint() {
        let mut error = GatewayError::new(ErrorCode::ResourceExhausted, "shard 0 is behind");
        error.retry_after = Some(Duration::from_millis(1500));
        let response = error_response(&error);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER_MS_HEADER], "1500");
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            body_of(response).await,
            serde_json::json!({"error": {"code": "RESOURCE_EXHAUSTED", "message": "shard 0 is behind"}})
        );
    }

    #[tokio::test]
    async fn every_code_answers_with_its_own_status() {
        for code in ErrorCode::ALL {
            let response = GatewayError::new(code, "m").into_response();
            assert_eq!(response.status().as_u16(), code.http_status(), "{code}");
            assert!(response.headers().get(header::RETRY_AFTER).is_none());
            assert_eq!(body_of(response).await["error"]["code"], code.as_str());
        }
    }
}
