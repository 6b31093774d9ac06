//! A searcher killed (`kill -9`) while it is the only one of its shard
//! (replication 1), on real processes: one meta, an indexer, two searchers and
//! a gateway over a `file://` store. Until meta moves the shard, reads of it
//! answer at once (after one bounded wait) `UNAVAILABLE` naming the shard, the
//! collection and the searcher, with a retry hint sized to the move — they
//! once answered `tcp connect error` with no hint; the gateway warns once (not
//! per request); meta names the dead searcher and the shard it moved; and the
//! Rust SDK with its default retry policy rides the outage out.

use std::time::{Duration, Instant};

use quiver_test_support::eventually;
use serde_json::{Value, json};

use crate::support::{RoleProcess, free_address, vector};

const DIM: usize = 8;
/// Meta's heartbeat silence before a node is dead: long enough that the test
/// sees reads during the outage, short enough to wait for.
const NODE_TIMEOUT_MS: u64 = 8_000;
const CONTROL_INTERVAL_MS: u64 = 200;

async fn search(
    http: &reqwest::Client,
    base: &str,
    id: u64,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let response = http
        .post(format!("{base}/v1/collections/outage/search"))
        .json(&json!({"vector": vector(id, DIM), "k": 3, "consistency": "eventual"}))
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_searcher_is_named_with_a_retry_hint_logged_and_ridden_out() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let config_path = root.join("quiver.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"log_format = "text"
[meta]
heartbeat_interval_ms = 50
election_timeout_min_ms = 300
election_timeout_max_ms = 600
control_interval_ms = {CONTROL_INTERVAL_MS}
node_timeout_ms = {NODE_TIMEOUT_MS}
lease_ttl_ms = 5000
[indexer]
commit_window_ms = 5
flush_interval_ms = 500
flush_rows = 100
[searcher]
heartbeat_interval_ms = 200
"#
        ),
    )
    .expect("config");
    let config = config_path.display().to_string();
    let objects = format!("file://{}", root.join("objects").display());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client");

    let meta_address = free_address();
    let meta = RoleProcess::spawn(
        root,
        "meta",
        vec![
            "meta".into(),
            "--node-id".into(),
            "1".into(),
            "--data-dir".into(),
            root.join("meta").display().to_string(),
            "--listen".into(),
            meta_address.clone(),
            "--init".into(),
            "--config".into(),
            config.clone(),
        ],
        &[],
    );
    meta.wait_ready(&http).await;
    let data_role = |role: &str, node_id: &str| -> RoleProcess {
        let mut args = vec![
            role.to_string(),
            "--meta".into(),
            meta_address.clone(),
            "--object-store".into(),
            objects.clone(),
            "--listen".into(),
            free_address(),
            "--node-id".into(),
            node_id.into(),
            "--config".into(),
            config.clone(),
        ];
        if role == "searcher" {
            args.extend([
                "--cache-dir".into(),
                root.join(format!("{node_id}-cache")).display().to_string(),
                "--cache-size".into(),
                "16MiB".into(),
            ]);
        }
        RoleProcess::spawn(root, node_id, args, &[])
    };
    let indexer = data_role("indexer", "indexer-1");
    let mut searcher_1 = data_role("searcher", "searcher-1");
    let searcher_2 = data_role("searcher", "searcher-2");
    let gateway = RoleProcess::spawn(
        root,
        "gateway",
        vec![
            "gateway".into(),
            "--meta".into(),
            meta_address.clone(),
            "--grpc-listen".into(),
            free_address(),
            "--node-id".into(),
            "gateway-1".into(),
            "--config".into(),
            config.clone(),
        ],
        &[],
    );
    for role in [&indexer, &searcher_1, &searcher_2, &gateway] {
        role.wait_ready(&http).await;
    }
    let base = format!("http://{}", gateway.http);

    // Two shards, one searcher each (replication 1).
    let created = http
        .put(format!("{base}/v1/collections/outage"))
        .json(&json!({"dimension": DIM, "metric": "cosine", "shards": 2, "replication": 1}))
        .send()
        .await
        .expect("create sent");
    assert_eq!(created.status().as_u16(), 200);
    let points: Vec<Value> = (0..40)
        .map(|id| json!({"id": id, "vector": vector(id, DIM)}))
        .collect();
    let written = eventually("upsert accepted", Duration::from_secs(60), || async {
        let response = http
            .post(format!("{base}/v1/collections/outage/points"))
            .json(&json!({"points": points}))
            .send()
            .await
            .ok()?;
        response.status().is_success().then_some(())
    })
    .await;
    written.unwrap_or_else(|error| panic!("{error:#}\n{}", indexer.log()));
    let searchers_of = |shards: &Value, node_id: &str| -> Vec<u64> {
        shards["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|shard| shard.to_string().contains(node_id))
            .filter_map(|shard| shard["shard"].as_u64())
            .collect()
    };
    let placed = eventually("both searchers serve", Duration::from_secs(60), || async {
        let (status, _, _) = search(&http, &base, 3).await;
        let shards: Value = http
            .get(format!("{base}/admin/v1/collections/outage/shards"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let spread = !searchers_of(&shards, "searcher-1").is_empty()
            && !searchers_of(&shards, "searcher-2").is_empty();
        (status == 200 && spread).then_some(shards)
    })
    .await;
    let shards = placed.unwrap_or_else(|error| panic!("{error:#}\n{}", gateway.log()));
    let lost_shard = searchers_of(&shards, "searcher-1")[0];

    // kill -9 of the only searcher of one shard.
    searcher_1.child.kill().expect("kill -9");
    searcher_1.child.wait().expect("reaped");
    let killed_at = Instant::now();

    // The first read waits (bounded) for the shard, then answers; the next at once.
    let mut answers = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let answer = search(&http, &base, 3).await;
        answers.push((started.elapsed(), answer));
    }
    let move_after = Duration::from_millis(NODE_TIMEOUT_MS + CONTROL_INTERVAL_MS);
    for (index, (took, (status, body, headers))) in answers.iter().enumerate() {
        assert_eq!(*status, 503, "read {index} during the outage: {body}");
        assert!(
            *took < Duration::from_secs(4),
            "read {index} took {took:?}: no hang"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(body["error"]["code"], "UNAVAILABLE", "{body}");
        for needle in [
            format!("shard {lost_shard} of collection `outage`"),
            "searcher `searcher-1`".to_string(),
            "is unreachable".to_string(),
            "retried".to_string(),
        ] {
            assert!(
                message.contains(&needle),
                "`{needle}` missing from: {message}"
            );
        }
        let hint_ms: u64 = headers
            .get("retry-after-ms")
            .unwrap_or_else(|| panic!("no retry-after-ms on read {index}: {headers:?}"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            headers.get("retry-after").is_some(),
            "no Retry-After: {headers:?}"
        );
        assert!(
            (1_000..=move_after.as_millis() as u64).contains(&hint_ms),
            "hint {hint_ms} ms for a move due {move_after:?} after the last heartbeat"
        );
    }
    assert!(
        answers[2].0 < Duration::from_secs(1),
        "a read after the bounded wait answers at once, took {:?}",
        answers[2].0
    );

    // The Rust SDK, default retry policy: the search succeeds once the shard moved.
    let client = quiver_client::Client::new(&base, None).expect("client");
    let request: quiver_client::SearchRequest = serde_json::from_value(
        json!({"vector": vector(3, DIM), "k": 3, "consistency": "eventual"}),
    )
    .expect("search request");
    let found = client
        .search("outage", &request)
        .await
        .unwrap_or_else(|error| panic!("the SDK gave up: {error}\n{}", gateway.log()));
    assert!(!found.hits.is_empty());
    assert!(
        killed_at.elapsed() < move_after + Duration::from_secs(15),
        "the SDK took {:?}",
        killed_at.elapsed()
    );

    // The logs say what happened: the gateway once per searcher and cause,
    // meta the dead searcher and the shard's move.
    let gateway_log = gateway.log();
    let warnings: Vec<&str> = gateway_log
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("searcher unreachable"))
        .collect();
    assert!(
        !warnings.is_empty() && warnings.len() <= 2,
        "{} warnings:\n{gateway_log}",
        warnings.len()
    );
    assert!(warnings[0].contains("searcher-1"), "{}", warnings[0]);
    let meta_log = meta.log();
    let dead = meta_log
        .lines()
        .find(|line| line.contains("node considered dead"))
        .unwrap_or_else(|| panic!("meta did not log the dead searcher:\n{meta_log}"));
    assert!(dead.contains("searcher-1"), "{dead}");
    let moved = meta_log
        .lines()
        .find(|line| line.contains("moved shard to searchers"))
        .unwrap_or_else(|| panic!("meta did not log the move:\n{meta_log}"));
    assert!(
        moved.contains("outage") && moved.contains("searcher-1") && moved.contains("searcher-2"),
        "{moved}"
    );
}
