//! The request id of the client request being served: taken from the client's
//! `x-request-id` when usable, made up otherwise, kept in a task-local while the
//! request runs, and attached to every call the gateway makes to an indexer or a
//! searcher for it.

use std::future::Future;

use quiver_proto::{REQUEST_ID_HEADER, valid_request_id};
use tonic::metadata::MetadataValue;

tokio::task_local! {
    static CURRENT_REQUEST_ID: String;
}

/// Returns the client's request id if usable, else a fresh one.
pub fn accept_or_generate(presented: Option<&str>) -> String {
    presented
        .and_then(valid_request_id)
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// Returns `work` run with `request_id` as the current request id. A plain
/// function, not an `async fn`: an `async fn` would keep `work` beside the
/// future it moves `work` into, doubling what every caller's future holds.
pub fn scope<F: Future>(request_id: String, work: F) -> impl Future<Output = F::Output> {
    CURRENT_REQUEST_ID.scope(request_id, work)
}

/// Returns `message` as a tonic request carrying the current request id.
pub fn outgoing<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = CURRENT_REQUEST_ID
        .try_with(|request_id| MetadataValue::try_from(request_id.as_str()).ok())
        .ok()
        .flatten();
    if let Some(value) = value {
        request.metadata_mut().insert(REQUEST_ID_HEADER, value);
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_current_id_travels_as_metadata() {
        assert_eq!(accept_or_generate(Some("abc")), "abc");
        assert_ne!(accept_or_generate(Some("bad id")), "bad id");
        assert_eq!(accept_or_generate(None).len(), 36);
        let request = scope("req-7".into(), async { outgoing(()) }).await;
        assert_eq!(request.metadata().get(REQUEST_ID_HEADER).unwrap(), "req-7");
        assert!(outgoing(()).metadata().get(REQUEST_ID_HEADER).is_none());
    }
}
