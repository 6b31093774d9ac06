//! Request ids across hops: the gateway accepts or makes one per client request
//! and sends it to indexers and searchers as `x-request-id` gRPC metadata; each
//! role's gRPC server opens a span carrying it ([`request_span`]), so one id
//! finds every log line of a request in every process.

use tonic::codegen::http;

/// The HTTP header and gRPC metadata key carrying a request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest request id accepted from a client; longer ones are replaced.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Returns `presented` if it is a usable request id: 1 to 128 visible ASCII
/// characters, so it can go into logs and headers unchanged.
pub fn valid_request_id(presented: &str) -> Option<&str> {
    let usable = !presented.is_empty()
        && presented.len() <= MAX_REQUEST_ID_BYTES
        && presented.bytes().all(|byte| byte.is_ascii_graphic());
    usable.then_some(presented)
}

/// Returns the span a gRPC server runs one call in: `rpc` with the caller's
/// request id (empty when it sent none) and the method path; logs a debug line in
/// it, so the hop shows up under the id. For tonic's `Server::builder().trace_fn`.
pub fn request_span(request: &http::Request<()>) -> tracing::Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(valid_request_id)
        .unwrap_or_default();
    let path = request.uri().path();
    let span = tracing::info_span!("rpc", request_id, path);
    tracing::debug!(parent: &span, "rpc received");
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_short_visible_ascii() {
        assert_eq!(valid_request_id("abc-123"), Some("abc-123"));
        assert_eq!(valid_request_id(""), None);
        assert_eq!(valid_request_id("has space"), None);
        assert_eq!(valid_request_id("ünïcode"), None);
        assert_eq!(valid_request_id(&"x".repeat(129)), None);
        assert!(valid_request_id(&"x".repeat(128)).is_some());
    }
}
