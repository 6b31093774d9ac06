//! `quiver standalone` through its REST API: every endpoint, bad input, API
//! keys, and acknowledged writes surviving SIGTERM restarts and kill -9.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Standalone, vector};

const DIM: usize = 16;

async fn create(server: &Standalone, name: &str) {
    let (status, body) = server
        .call(
            "PUT",
            &format!("/v1/collections/{name}"),
            Some(json!({
                "dimension": DIM,
                "metric": "cosine",
                "shards": 2,
                "payload_schema": [{"name": "lang", "type": "keyword"}, {"name": "year", "type": "integer"}]
            })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], name);
    assert_eq!(body["dimension"], DIM);
}

fn point(id: u64) -> Value {
    let lang = if id.is_multiple_of(4) { "de" } else { "en" };
    json!({"id": id, "vector": vector(id, DIM), "payload": {"lang": lang, "year": 2000 + id % 25}})
}

async fn upsert(server: &Standalone, name: &str, ids: impl Iterator<Item = u64>) -> (u16, Value) {
    let points: Vec<Value> = ids.map(point).collect();
    server
        .call(
            "POST",
            &format!("/v1/collections/{name}/points"),
            Some(json!({"points": points})),
        )
        .await
}

async fn top_hit(server: &Standalone, name: &str, id: u64) -> Option<u64> {
    let (status, body) = server
        .call(
            "POST",
            &format!("/v1/collections/{name}/search"),
            Some(json!({"vector": vector(id, DIM), "k": 1, "consistency": "strong"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["hits"][0]["id"].as_u64()
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// Starts a standalone over a fresh data directory in `directory` with the
/// configuration file `toml`.
async fn start_configured(directory: &tempfile::TempDir, toml: &str) -> Standalone {
    let config = directory.path().join("quiver.toml");
    std::fs::write(&config, toml).unwrap();
    Standalone::start_with(
        &directory.path().join("data"),
        crate::support::StartOptions {
            args: vec!["--config".into(), config.display().to_string()],
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// The server's `/metrics` text.
async fn metrics_text(server: &Standalone) -> String {
    server
        .client
        .get(format!("http://{}/metrics", server.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrape_lists_the_indexer_metrics_before_any_write() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    let metrics = metrics_text(&server).await;
    for name in [
        "quiver_indexer_rows_written_total 0",
        "quiver_indexer_flushes_total 0",
        "quiver_indexer_flush_failures_total 0",
        "quiver_indexer_merges_total 0",
    ] {
        assert!(
            metrics.contains(name),
            "/metrics lacks {name:?}:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_end_to_end() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    create(&server, "docs").await;
    // Creating the same collection again answers with it; listing shows it.
    let (status, body) = server.call("GET", "/v1/collections", None).await;
    assert_eq!(status, 200);
    assert_eq!(body["collections"][0]["name"], "docs");

    for batch in 0..4u64 {
        let (status, body) = upsert(&server, "docs", batch * 100..(batch + 1) * 100).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["sequence"].as_u64().unwrap() > 0);
    }
    // Read-after-write: every acknowledged point is found by its own vector.
    for id in (0..400).step_by(37) {
        assert_eq!(top_hit(&server, "docs", id).await, Some(id), "point {id}");
    }
    let (status, body) = server.call("GET", "/v1/collections/docs", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["points"], 400, "{body}");

    // Filters: only matching payloads come back.
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/docs/search",
            Some(json!({"vector": vector(5, DIM), "k": 10, "filter": "lang = \"de\" and year >= 2010"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Every answer says what it cost: both shards searched, rows scored.
    let cost = &body["cost"];
    assert_eq!(cost["shards"], 2, "{body}");
    let scored =
        cost["rows_rescored"].as_u64().unwrap() + cost["tail_rows_scored"].as_u64().unwrap();
    assert!(scored >= 10, "{body}");
    for field in [
        "cache_regions_hit",
        "cache_regions_missed",
        "bytes_fetched",
        "row_reads_local",
        "row_reads_remote",
    ] {
        assert!(cost[field].is_u64(), "cost.{field} is a count: {body}");
    }
    assert!(cost["store_wait_ms"].is_f64(), "{body}");
    let hits = body["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 10);
    for hit in hits {
        assert_eq!(hit["payload"]["lang"], "de", "{hit}");
        assert!(hit["payload"]["year"].as_u64().unwrap() >= 2010, "{hit}");
    }
    // The JSON filter form and a batch of searches.
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/docs/search/batch",
            Some(json!({"searches": [
                {"vector": vector(8, DIM), "k": 3, "filter": {"field": "lang", "value": "de"}},
                {"vector": vector(9, DIM), "k": 2}
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["hits"][0]["id"], 8);
    assert_eq!(body["results"][1]["hits"].as_array().unwrap().len(), 2);
    // A batch (run together on each shard's searcher) answers what its
    // searches answer one by one, with a cost block each.
    let searches: Vec<Value> = (0..12u64)
        .map(|id| {
            let mut search = json!({"vector": vector(id * 3 + 1, DIM), "k": 1 + id % 5});
            if id % 3 == 0 {
                search["filter"] = json!("lang = \"en\"");
            }
            search
        })
        .collect();
    // A flush between the batch and the single searches changes rows scanned
    // (tail rows become segment rows): compare only when the same batch sent
    // before and after the single searches answered the same.
    let run_batch = || async {
        let (status, batch) = server
            .call(
                "POST",
                "/v1/collections/docs/search/batch",
                Some(json!({ "searches": searches })),
            )
            .await;
        assert_eq!(status, 200, "{batch}");
        assert_eq!(batch["results"].as_array().unwrap().len(), searches.len());
        let shape: Vec<(Value, Value, Value)> = batch["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|result| {
                assert_eq!(result["cost"]["shards"], 2, "{result}");
                (
                    result["hits"].clone(),
                    result["cost"]["rows_scanned"].clone(),
                    result["cost"]["tail_rows_scored"].clone(),
                )
            })
            .collect();
        shape
    };
    let mut compared = false;
    for _ in 0..5 {
        let before = run_batch().await;
        let mut singles = Vec::new();
        for search in &searches {
            let (status, single) = server
                .call("POST", "/v1/collections/docs/search", Some(search.clone()))
                .await;
            assert_eq!(status, 200, "{single}");
            singles.push((
                single["hits"].clone(),
                single["cost"]["rows_scanned"].clone(),
                single["cost"]["tail_rows_scored"].clone(),
            ));
        }
        if run_batch().await != before {
            continue;
        }
        for (index, (batched, single)) in before.iter().zip(&singles).enumerate() {
            assert_eq!(
                batched, single,
                "searches[{index}] answered differently in a batch"
            );
        }
        compared = true;
        break;
    }
    assert!(
        compared,
        "the shards changed under every one of 5 batch comparisons"
    );
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/docs/search/batch",
            Some(json!({"searches": [
                {"vector": vector(1, DIM), "k": 3},
                {"vector": vector(2, DIM), "k": 3, "filter": "lang = 3"}
            ]})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("searches[1]: filter compares field \"lang\""),
        "{body}"
    );

    // Get, delete, replace.
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/docs/points/get",
            Some(json!({"ids": [3, 999_999], "include_vector": true})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["points"].as_array().unwrap().len(), 1);
    assert_eq!(body["points"][0]["payload"]["lang"], "en");
    assert_eq!(body["points"][0]["vector"].as_array().unwrap().len(), DIM);
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/docs/points/delete",
            Some(json!({"ids": [3, 4]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(
        top_hit(&server, "docs", 3).await,
        Some(3),
        "deleted point returned"
    );
    let (_, body) = server
        .call(
            "POST",
            "/v1/collections/docs/points/get",
            Some(json!({"ids": [3]})),
        )
        .await;
    assert_eq!(body["points"].as_array().unwrap().len(), 0);
    let (status, _) = server
        .call(
            "POST",
            "/v1/collections/docs/points",
            Some(json!({"points": [{"id": 5, "vector": vector(1234, DIM), "payload": {"lang": "fr"}}]})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        top_hit(&server, "docs", 1234).await,
        Some(5),
        "replacement is visible"
    );
    let (_, body) = server.call("GET", "/v1/collections/docs", None).await;
    assert_eq!(body["points"], 398, "{body}");

    // Bad input: a clear error naming the problem, and nothing written.
    let cases: Vec<(&str, &str, Value, &str, &str)> = vec![
        (
            "POST",
            "/v1/collections/docs/points",
            json!({"points": [{"id": 1, "vector": [1.0, 2.0]}]}),
            "INVALID_ARGUMENT",
            "dimension 2",
        ),
        (
            "POST",
            "/v1/collections/docs/points",
            json!({"points": [{"id": "x", "vector": vector(1, DIM)}]}),
            "INVALID_ARGUMENT",
            "unsigned integers",
        ),
        (
            "POST",
            "/v1/collections/docs/points",
            json!({"points": [{"id": 1, "vector": vector(1, DIM), "payload": {"year": "old"}}]}),
            "INVALID_ARGUMENT",
            "year",
        ),
        (
            "POST",
            "/v1/collections/docs/points",
            json!({"points": []}),
            "INVALID_ARGUMENT",
            "empty",
        ),
        (
            "POST",
            "/v1/collections/docs/points",
            json!({"pints": []}),
            "INVALID_ARGUMENT",
            "unknown field",
        ),
        (
            "POST",
            "/v1/collections/missing/points",
            json!({"points": [point(1)]}),
            "NOT_FOUND",
            "missing",
        ),
        (
            "POST",
            "/v1/collections/docs/search",
            json!({"vector": [1.0]}),
            "INVALID_ARGUMENT",
            "dimension 1",
        ),
        (
            "POST",
            "/v1/collections/docs/search",
            json!({"vector": vector(1, DIM), "k": 0}),
            "INVALID_ARGUMENT",
            "k must be",
        ),
        (
            "POST",
            "/v1/collections/docs/search",
            json!({"vector": vector(1, DIM), "filter": "colour <= true"}),
            "INVALID_ARGUMENT",
            "colour",
        ),
        (
            "POST",
            "/v1/collections/docs/search",
            json!({"vector": vector(1, DIM), "consistency": "maybe"}),
            "INVALID_ARGUMENT",
            "consistency",
        ),
        (
            "PUT",
            "/v1/collections/bad%20name",
            json!({"dimension": 4, "metric": "cosine"}),
            "INVALID_ARGUMENT",
            "collection name",
        ),
        (
            "PUT",
            "/v1/collections/other",
            json!({"dimension": 4, "metric": "hamming"}),
            "INVALID_ARGUMENT",
            "metric",
        ),
        (
            "PUT",
            "/v1/collections/docs",
            json!({"dimension": 8, "metric": "cosine"}),
            "ALREADY_EXISTS",
            "docs",
        ),
    ];
    for (method, path, body, code, fragment) in cases {
        let (status, answer) = server.call(method, path, Some(body.clone())).await;
        assert_eq!(
            error_code(&answer),
            code,
            "{method} {path} {body} → {status} {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(fragment),
            "{message:?} should mention {fragment:?}"
        );
        assert!(status >= 400);
    }
    let (status, body) = server
        .post_raw(
            "/v1/collections/docs/points",
            r#"{"points": [{"id": 1, "vector": [NaN]}]}"#,
        )
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (400, "INVALID_ARGUMENT"),
        "{body}"
    );
    assert!(
        body["error"]["message"].as_str().unwrap().contains("NaN"),
        "{body}"
    );
    let (_, body) = server.call("GET", "/v1/collections/docs", None).await;
    assert_eq!(body["points"], 398, "bad requests wrote nothing: {body}");

    // Admin API and operational endpoints.
    let (status, body) = server.call("GET", "/admin/v1/cluster", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["meta"]["leader"].as_u64().is_some(), "{body}");
    assert_eq!(body["meta"]["members"][0]["role"], "voter");
    let roles: BTreeSet<&str> = body["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, BTreeSet::from(["gateway", "indexer", "searcher"]));
    assert!(
        body["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|node| node["state"] == "alive")
    );
    let (status, body) = server
        .call("GET", "/admin/v1/collections/docs/shards", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["shards"].as_array().unwrap().len(), 2);
    let (status, body) = server
        .call("POST", "/admin/v1/collections/docs/compact", None)
        .await;
    assert_eq!(status, 200, "{body}");
    for id in [0u64, 150, 399] {
        assert_eq!(
            top_hit(&server, "docs", id).await,
            Some(id),
            "after compaction"
        );
    }
    let metrics = metrics_text(&server).await;
    for name in [
        "quiver_gateway_requests_total",
        "quiver_indexer_rows_written_total",
        "quiver_searcher_queries_total",
        "quiver_meta_",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    // The gateway calls the searcher of its own process directly, never over gRPC.
    let calls = |path: &str| -> u64 {
        let prefix = format!("quiver_gateway_searcher_calls_total{{path=\"{path}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map_or(0, |count| count.trim().parse().expect("a count"))
    };
    assert!(calls("local") > 0, "no local searcher call:\n{metrics}");
    assert_eq!(calls("remote"), 0, "searcher calls went over gRPC");
    let (status, _) = server.call("DELETE", "/v1/collections/docs", None).await;
    assert_eq!(status, 200);
    let (_, body) = server
        .call(
            "POST",
            "/v1/collections/docs/search",
            Some(json!({"vector": vector(1, DIM)})),
        )
        .await;
    assert_eq!(error_code(&body), "NOT_FOUND", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigterm_and_kill_9() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let mut server = Standalone::start(&data_dir, &[]).await.unwrap();
    create(&server, "durable").await;
    let (status, _) = upsert(&server, "durable", 0..50).await;
    assert_eq!(status, 200);
    assert!(server.terminate().unwrap(), "SIGTERM exits cleanly");

    let mut server = Standalone::start(&data_dir, &[]).await.unwrap();
    assert_eq!(
        top_hit(&server, "durable", 7).await,
        Some(7),
        "kept across a restart"
    );
    // A stream of writers; the server is killed while they run.
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for writer in 0..4u64 {
        let acknowledged = acknowledged.clone();
        let client = server.client.clone();
        let url = format!("http://{}/v1/collections/durable/points", server.http);
        writers.push(tokio::spawn(async move {
            for round in 0..1000u64 {
                let id = 1000 + writer * 10_000 + round;
                let body = json!({"points": [point(id)]});
                match client.post(&url).json(&body).send().await {
                    Ok(response) if response.status().is_success() => {
                        acknowledged.lock().unwrap().push(id);
                    }
                    _ => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill();
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 10,
        "writes were acknowledged before the kill"
    );

    let server = Standalone::start(&data_dir, &[]).await.unwrap();
    let ids: Vec<Value> = acknowledged.iter().map(|id| json!(id)).collect();
    for chunk in ids.chunks(500) {
        let (status, body) = server
            .call(
                "POST",
                "/v1/collections/durable/points/get",
                Some(json!({"ids": chunk})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["points"].as_array().unwrap().len(),
            chunk.len(),
            "every acknowledged point is back after kill -9; log:\n{}",
            server.log_tail()
        );
    }
    for id in acknowledged.iter().step_by(acknowledged.len() / 10 + 1) {
        assert_eq!(
            top_hit(&server, "durable", *id).await,
            Some(*id),
            "point {id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_enforced_per_access_level() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(
        &directory.path().join("data"),
        &[
            ("QUIVER_API_KEYS_READ", "reader-key"),
            ("QUIVER_API_KEYS_WRITE", "writer-key"),
            ("QUIVER_API_KEYS_ADMIN", "admin-key"),
        ],
    )
    .await
    .unwrap();
    let create_body = json!({"dimension": DIM, "metric": "cosine"});
    let (status, body) = server
        .call("PUT", "/v1/collections/secure", Some(create_body.clone()))
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (401, "UNAUTHENTICATED"),
        "{body}"
    );
    let (status, body) = server
        .call_with_key(
            "PUT",
            "/v1/collections/secure",
            Some(create_body.clone()),
            Some("writer-key"),
        )
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (403, "PERMISSION_DENIED"),
        "{body}"
    );
    let (status, _) = server
        .call_with_key(
            "PUT",
            "/v1/collections/secure",
            Some(create_body),
            Some("admin-key"),
        )
        .await;
    assert_eq!(status, 200);
    let write = json!({"points": [point(1)]});
    let (status, _) = server
        .call_with_key(
            "POST",
            "/v1/collections/secure/points",
            Some(write.clone()),
            Some("reader-key"),
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = server
        .call_with_key(
            "POST",
            "/v1/collections/secure/points",
            Some(write),
            Some("writer-key"),
        )
        .await;
    assert_eq!(status, 200);
    let search = json!({"vector": vector(1, DIM)});
    let (status, body) = server
        .call_with_key(
            "POST",
            "/v1/collections/secure/search",
            Some(search.clone()),
            Some("reader-key"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = server
        .call_with_key(
            "POST",
            "/v1/collections/secure/search",
            Some(search),
            Some("wrong-key"),
        )
        .await;
    assert_eq!(status, 401);
    let (status, _) = server
        .call_with_key("GET", "/admin/v1/cluster", None, Some("writer-key"))
        .await;
    assert_eq!(status, 403, "the admin API refuses non-admin keys");
    // Health and metrics stay open for probes.
    let (status, _) = server.call("GET", "/healthz", None).await;
    assert_eq!(status, 200);
    let log = std::fs::read_to_string(&server.log_path).unwrap_or_default();
    assert!(
        !log.contains("admin-key") && !log.contains("writer-key"),
        "keys never logged"
    );
}

/// A compaction outlasting the gateway's wait answers `202 {"done": false}`
/// and goes on; asking again joins it until `200 {"done": true}`; quiverctl
/// does the asking by itself.
/// A filter on payload fields no schema declares (a collection created with
/// none, as the quick start does) answers from the unflushed rows and, the same,
/// once they are in segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_on_undeclared_fields_read_the_payloads() {
    let directory = tempfile::tempdir().unwrap();
    // No flush before the first searches (a flush every 3 s, or on compaction).
    let server = start_configured(&directory, "[indexer]\nflush_interval_ms = 3000\n").await;
    let (status, body) = server
        .call(
            "PUT",
            "/v1/collections/plain",
            Some(json!({"dimension": DIM, "metric": "cosine"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let points: Vec<Value> = (0..600u64)
        .map(|id| {
            let kind = ["a", "b", "c"][(id % 3) as usize];
            let mut payload =
                json!({"n": id, "kind": kind, "tags": ["x"], "meta": {"even": id % 2 == 0}});
            if id % 10 == 0 {
                payload["kind"] = Value::Null;
            }
            json!({"id": id, "vector": vector(id, DIM), "payload": payload})
        })
        .collect();
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/plain/points",
            Some(json!({"points": points})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let search = |filter: Value| {
        let server = &server;
        async move {
            let (status, body) = server
                .call(
                    "POST",
                    "/v1/collections/plain/search",
                    Some(
                        json!({"vector": vector(42, DIM), "k": 600, "filter": filter,
                                "nprobe": 100000, "consistency": "strong"}),
                    ),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            let mut ids: Vec<u64> = body["hits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|hit| hit["id"].as_u64().unwrap())
                .collect();
            ids.sort_unstable();
            // Where the rows were: segments searched, rows scored in the tail.
            let cost = &body["cost"];
            let place = (
                cost["segments"].as_u64().unwrap(),
                cost["tail_rows_scored"].as_u64().unwrap(),
            );
            (ids, place)
        }
    };
    let expect =
        |keep: &dyn Fn(u64) -> bool| (0..600u64).filter(|&id| keep(id)).collect::<Vec<_>>();
    let cases: Vec<(Value, Vec<u64>)> = vec![
        (
            json!("n >= 40 and n < 45"),
            expect(&|id| (40..45).contains(&id)),
        ),
        (
            json!("kind = \"b\" and n < 100"),
            expect(&|id| id % 3 == 1 && id % 10 != 0 && id < 100),
        ),
        (
            json!("kind != \"a\" and n < 60"),
            expect(&|id| (id % 3 != 0 || id % 10 == 0) && id < 60),
        ),
        (
            json!({"field": "kind", "in": ["a", "c"], }),
            expect(&|id| id % 3 != 1 && id % 10 != 0),
        ),
        (json!("n = \"7\" or tags = \"x\" or missing = 1"), vec![]),
        (
            json!("meta.even = true and n < 10"),
            expect(&|id| id % 2 == 0 && id < 10),
        ),
    ];
    for (filter, expected) in &cases {
        let (ids, (segments, _)) = search(filter.clone()).await;
        assert_eq!(&ids, expected, "unflushed: {filter}");
        assert_eq!(segments, 0, "flushed before the first searches");
    }
    // Into segments: compact (flushes, then merges) and search again.
    settle_into_segments(
        &server,
        "plain",
        json!({"vector": vector(42, DIM), "k": 1, "filter": "n < 1", "consistency": "strong"}),
    )
    .await;
    for (filter, expected) in &cases {
        let (ids, (segments, tail)) = search(filter.clone()).await;
        assert_eq!(&ids, expected, "in segments: {filter}");
        assert!(
            segments > 0 && tail == 0,
            "{segments} segments, {tail} tail rows"
        );
    }
    // A segment's payloads are read once per field: new filters on the same
    // fields read none again.
    let scans = || async {
        metrics_text(&server)
            .await
            .lines()
            .find_map(|line| line.strip_prefix("quiver_searcher_filter_field_scans_total "))
            .map(|count| count.trim().parse::<u64>().expect("a count"))
            .expect("the scan counter is exported")
    };
    let before = scans().await;
    assert!(before > 0, "no payload scan counted");
    assert_eq!(
        search(json!("n >= 100 and n < 103")).await.0,
        vec![100, 101, 102]
    );
    assert_eq!(
        search(json!("kind = \"c\" and n < 9")).await.0,
        expect(&|id| id % 3 == 2 && id < 9)
    );
    assert_eq!(scans().await, before, "a field was read again");
}

/// Compacts `name` and waits until the searcher serves its rows from
/// segments alone (no unflushed tail left).
async fn settle_into_segments(server: &Standalone, name: &str, probe: Value) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = server
            .call(
                "POST",
                &format!("/admin/v1/collections/{name}/compact"),
                None,
            )
            .await;
        let (_, described) = server
            .call("GET", &format!("/v1/collections/{name}"), None)
            .await;
        if status == 200 && described["wal_tail_rows"] == 0 && described["segments"] != 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never compacted: {body} {described}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let (status, body) = server
            .call(
                "POST",
                &format!("/v1/collections/{name}/search"),
                Some(probe.clone()),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        if body["cost"]["segments"].as_u64() > Some(0) && body["cost"]["tail_rows_scored"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the segments were never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_answers_k_hits_whenever_the_collection_holds_them() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    let (status, body) = server
        .call(
            "PUT",
            "/v1/collections/wide",
            Some(json!({"dimension": DIM, "metric": "cosine"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let rows = 4_000u64;
    for start in (0..rows).step_by(1_000) {
        let points: Vec<Value> = (start..start + 1_000)
            .map(|id| json!({"id": id, "vector": vector(id, DIM), "payload": {"bucket": id % 10}}))
            .collect();
        let (status, body) = server
            .call(
                "POST",
                "/v1/collections/wide/points",
                Some(json!({"points": points})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // The rows in segments: the calibrated probe of these 17 tight clusters
    // holds far fewer rows than the k asked for below.
    settle_into_segments(&server, "wide", json!({"vector": vector(0, DIM), "k": 1})).await;
    let search = |body: Value| {
        let server = &server;
        async move {
            let (status, answer) = server
                .call("POST", "/v1/collections/wide/search", Some(body))
                .await;
            assert_eq!(status, 200, "{answer}");
            let hits = answer["hits"].as_array().unwrap().clone();
            let ids: BTreeSet<u64> = hits.iter().map(|hit| hit["id"].as_u64().unwrap()).collect();
            assert_eq!(ids.len(), hits.len(), "an id twice: {answer}");
            hits
        }
    };
    for k in [10u64, 200, 1_000, 3_999] {
        let hits =
            search(json!({"vector": vector(5, DIM), "k": k, "include_payload": false})).await;
        assert_eq!(hits.len() as u64, k, "k = {k}");
    }
    let all =
        search(json!({"vector": vector(5, DIM), "k": 10_000, "include_payload": false})).await;
    assert_eq!(all.len() as u64, rows, "k past the row count");
    // A filter: k of the rows it keeps, however far they lie from the query.
    let hits = search(json!({"vector": vector(5, DIM), "k": 350, "filter": "bucket = 3"})).await;
    assert_eq!(hits.len(), 350);
    assert!(
        hits.iter().all(|hit| hit["payload"]["bucket"] == 3),
        "{hits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_compaction_answers_202_and_goes_on() {
    let directory = tempfile::tempdir().unwrap();
    // Wait 1 ms for the merges (each takes longer: downloads, a build, an
    // upload, a commit); flush every 200 ms; no background merges.
    let server = start_configured(
        &directory,
        "[gateway]\ncompact_wait_ms = 1\n\n[indexer]\nflush_interval_ms = 200\nmerge_factor = 1000\ncodebook_refresh = false\n",
    )
    .await;
    create(&server, "long").await;
    let described = || async {
        let (_, body) = server.call("GET", "/v1/collections/long", None).await;
        (
            body["segments"].as_u64().unwrap(),
            body["wal_tail_rows"].as_u64().unwrap(),
        )
    };
    let wait_flushed = |at_least: u64| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (segments, unflushed) = described().await;
            if segments >= at_least && unflushed == 0 {
                return segments;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not flushed: {segments} segments, {unflushed} rows unflushed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut flushed = 0;
    for round in 0..4u64 {
        let (status, body) = upsert(&server, "long", round * 150..(round + 1) * 150).await;
        assert_eq!(status, 200, "{body}");
        flushed = wait_flushed(flushed + 1).await;
    }
    assert!(flushed >= 4, "{flushed} segments");

    let (status, body) = server
        .call("POST", "/admin/v1/collections/long/compact", None)
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["done"], false);
    assert!(
        !body["running_shards"].as_array().unwrap().is_empty(),
        "{body}"
    );
    let mut merges = body["merges"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = server
            .call("POST", "/admin/v1/collections/long/compact", None)
            .await;
        merges += body["merges"].as_u64().unwrap();
        if status == 200 {
            assert_eq!(body["done"], true, "{body}");
            break;
        }
        assert_eq!(status, 202, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "compaction never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every shard (4 segments each) merged down to one segment.
    assert!(merges >= 2, "merges reported: {merges}");
    assert_eq!(described().await.0, 2);
    for id in [0, 299, 599] {
        assert_eq!(top_hit(&server, "long", id).await, Some(id));
    }

    // quiverctl asks again by itself and prints the final answer.
    let (status, body) = upsert(&server, "long", 600..900).await;
    assert_eq!(status, 200, "{body}");
    wait_flushed(3).await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_quiverctl"))
        .args(["--endpoint", &server.base_url(), "compact", "long"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["done"], true, "{stdout}");
    assert!(answer["merges"].as_u64().unwrap() >= 1, "{stdout}");
    assert_eq!(described().await.0, 2);

    // What the shards no longer reference (WAL objects, merged segments) is
    // deleted once the standalone's 30 s grace is over: the disk then holds
    // the two live segments, no copies of them, and no scratch files.
    let data = directory.path().join("data");
    let files_under = |path: std::path::PathBuf| -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        let mut pending = vec![path];
        while let Some(path) = pending.pop() {
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                if entry.file_type().unwrap().is_dir() {
                    pending.push(entry.path());
                } else {
                    files.push(entry.path());
                }
            }
        }
        files
    };
    // `STANDALONE_GC_GRACE_MS` (30 s), the indexer's GC round (every 10 s), and
    // a margin.
    let deadline = std::time::Instant::now() + Duration::from_secs(30 + 45);
    loop {
        let objects = files_under(data.join("objects"));
        let wal = objects
            .iter()
            .filter(|path| path.to_string_lossy().contains("/wal/"));
        let segments: Vec<_> = objects
            .iter()
            .filter(|path| {
                path.extension()
                    .is_some_and(|extension| extension == "qseg")
            })
            .collect();
        if wal.count() == 0 && segments.len() == 2 {
            for segment in segments {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(
                    std::fs::metadata(segment).unwrap().nlink(),
                    1,
                    "{segment:?}"
                );
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retired objects still on disk: {objects:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        files_under(data.join("scratch")),
        Vec::<std::path::PathBuf>::new()
    );
}

#[test]
fn each_binary_says_what_it_is_in_its_help() {
    for (binary, about) in [
        (
            env!("CARGO_BIN_EXE_quiver"),
            "The quiver binary: runs any Quiver role",
        ),
        (env!("CARGO_BIN_EXE_quiverctl"), "Operate a Quiver cluster"),
    ] {
        let output = std::process::Command::new(binary)
            .arg("--help")
            .output()
            .unwrap();
        assert!(output.status.success(), "{binary} --help");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(
            help.lines().next().unwrap_or("").starts_with(about),
            "{binary} --help begins:\n{help}"
        );
    }
}

/// A vector may come as the base64 of its little-endian 32-bit floats (what a
/// client writes in microseconds): stored and searched as the same floats as
/// the array form, refused by place when a value is not finite, and refused
/// whole — nothing written — when the string is not such floats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_written_in_base64_are_the_same_floats_as_arrays() {
    let directory = tempfile::tempdir().unwrap();
    let server = Standalone::start(&directory.path().join("data"), &[])
        .await
        .unwrap();
    let (status, body) = server
        .call(
            "PUT",
            "/v1/collections/b64",
            Some(json!({"dimension": DIM, "metric": "l2"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let b64 = |id: u64| quiver_api::vector_to_base64(&vector(id, DIM));
    // Even ids as arrays, odd ones in base64.
    let points: Vec<Value> = (0..40u64)
        .map(|id| {
            if id % 2 == 0 {
                json!({"id": id, "vector": vector(id, DIM)})
            } else {
                json!({"id": id, "vector": b64(id)})
            }
        })
        .collect();
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/b64/points",
            Some(json!({"points": points})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for id in [3u64, 8, 21] {
        let mut answers = Vec::new();
        for query in [json!(vector(id, DIM)), json!(b64(id))] {
            let (status, body) = server
                .call(
                    "POST",
                    "/v1/collections/b64/search",
                    Some(json!({"vector": query, "k": 5, "consistency": "strong"})),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            answers.push(body["hits"].clone());
        }
        assert_eq!(
            answers[0], answers[1],
            "id {id}: the two forms answer alike"
        );
        assert_eq!(answers[0][0]["id"], id, "{}", answers[0]);
        assert_eq!(
            answers[0][0]["score"], 0.0,
            "the stored floats are the sent ones"
        );
    }
    let (status, body) = server
        .call(
            "POST",
            "/v1/collections/b64/search/batch",
            Some(json!({"searches": [{"vector": b64(5), "k": 1, "consistency": "strong"}]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["hits"][0]["id"], 5, "{body}");
    let mut with_nan = vector(50, DIM);
    with_nan[3] = f32::NAN;
    let refusals = [
        (json!("AAAAPwAA"), "points[1].vector", "got 6 bytes"),
        (json!("not base64"), "points[1].vector", "standard base64"),
        (
            json!(quiver_api::vector_to_base64(&with_nan)),
            "points[1]",
            "non-finite value at position 3",
        ),
        (
            json!(quiver_api::vector_to_base64(&vector(50, DIM - 1))),
            "points[1]",
            "dimension",
        ),
    ];
    for (bad, place, why) in refusals {
        let points = json!([{"id": 100, "vector": b64(100)}, {"id": 101, "vector": bad}]);
        let (status, body) = server
            .call(
                "POST",
                "/v1/collections/b64/points",
                Some(json!({"points": points})),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error_code(&body), "INVALID_ARGUMENT", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(place) && message.contains(why),
            "{message}"
        );
    }
    let (status, body) = server.call("GET", "/v1/collections/b64", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["points"], 40,
        "nothing of a refused request is written: {body}"
    );
}
