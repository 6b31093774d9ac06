//! A standalone answers right after a create: describe and search of the new
//! collection are served (no `UNAVAILABLE` while its shards are being placed),
//! and its fixed metadata membership refuses changes that would stop it.

use serde_json::{Value, json};

use crate::support::{Standalone, vector};

const DIM: usize = 8;

/// Create, then at once describe and search (REST), 20 times: never a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_collection_is_described_and_searched_right_after_its_create() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    for round in 0..20 {
        let name = format!("fresh-{round:02}");
        let (status, body) = server
            .call(
                "PUT",
                &format!("/v1/collections/{name}"),
                Some(json!({"dimension": DIM, "metric": "cosine", "shards": 1 + round % 3})),
            )
            .await;
        assert_eq!(status, 200, "create {name}: {body}");
        let (status, body) = server
            .call("GET", &format!("/v1/collections/{name}"), None)
            .await;
        assert_eq!(
            status, 200,
            "describe {name} right after its create: {body}"
        );
        assert_eq!(body["points"], 0, "{body}");
        let (status, body) = server
            .call(
                "POST",
                &format!("/v1/collections/{name}/search"),
                Some(json!({"vector": vector(round, DIM), "k": 3})),
            )
            .await;
        assert_eq!(status, 200, "search {name} right after its create: {body}");
        assert_eq!(body["hits"], Value::Array(Vec::new()), "{body}");
    }
}

/// `quiver standalone` runs one metadata node in process: adding, promoting or
/// removing a metadata node is refused with `FAILED_PRECONDITION` saying so,
/// and the metadata service keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_refuses_metadata_membership_changes() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    for request in [
        json!({"action": "add", "id": 4, "address": nowhere}),
        json!({"action": "promote", "id": 4}),
        json!({"action": "remove", "id": 1}),
    ] {
        let (status, body) = server
            .call("POST", "/admin/v1/meta/members", Some(request.clone()))
            .await;
        assert_eq!(
            body["error"]["code"], "FAILED_PRECONDITION",
            "{request}: {status} {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("standalone"), "{message}");
    }
    let (status, body) = server.call("GET", "/admin/v1/cluster", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["meta"]["members"].as_array().map(Vec::len),
        Some(1),
        "{body}"
    );
    let (status, body) = server.call("GET", "/v1/collections", None).await;
    assert_eq!(status, 200, "the metadata service still answers: {body}");
}
