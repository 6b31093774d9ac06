//! Single searches joined into batches on their way to a busy searcher (the
//! gateway's `core::join`): a searcher with one search slot, a gateway, an
//! indexer and meta in this process over real sockets and the S3 test server.
//! Many searches at once — two shards, different vectors, `k`, filters and
//! payload choices in one batch — each answer exactly what the same search
//! answers alone, and the gateway did join them (its counter of joined
//! searches moved by at least one round's worth).

use std::time::Duration;

use quiver_indexer::{IndexerNode, IndexerNodeConfig};
use serde_json::{Value, json};

use crate::in_process::{
    context, counter, gateway_node, manual_config, s3_storage, searcher_node, single_meta,
};

const DIM: usize = 16;
const POINTS: u64 = 600;

fn point_vector(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|i| ((id * 2_654_435_761 + i as u64 * 40_503) % 10_007) as f32 / 10_007.0 - 0.5)
        .collect()
}

/// The searches sent at once: each its own vector, `k`, payload choice and
/// (every third) filter.
fn searches() -> Vec<Value> {
    // 32 searches of two shards on one searcher: 64 calls, one in flight and
    // 63 waiting, within the 64 a one-slot searcher lets wait (more are
    // refused, as its own queue would refuse them).
    (0..32u64)
        .map(|index| {
            let mut search = json!({
                "vector": point_vector(index * 5 + 1),
                "k": 1 + index % 10,
                "include_payload": index % 2 == 0,
                "consistency": "eventual",
            });
            if index % 3 == 0 {
                search["filter"] = json!("bucket < 5");
            }
            search
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_joined_for_a_busy_searcher_answer_as_each_alone() {
    let Some(storage) = s3_storage("quiver-joined", "joined").await else {
        return;
    };
    let meta_dir = tempfile::tempdir().unwrap();
    let (_meta, client) = single_meta(meta_dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let indexer_address = listener.local_addr().unwrap().to_string();
    let mut indexer_config = IndexerNodeConfig::new("indexer-joined", &indexer_address);
    indexer_config.indexer = manual_config();
    indexer_config.heartbeat_interval = Duration::from_millis(200);
    let _indexer = IndexerNode::start(indexer_config, listener, client.clone(), storage.clone())
        .await
        .unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    // One search slot: with many searches at once, most wait and are joined.
    let (_searcher, _searcher_address) = searcher_node(
        "searcher-joined",
        &client,
        context(&storage, cache_dir.path(), 1 << 20),
        |config| config.search_threads = 1,
    )
    .await;
    let (_gateway, rest) = gateway_node("gateway-joined", &client).await;

    let (status, body) = rest
        .call(
            "PUT",
            "/v1/collections/joined",
            Some(json!({"dimension": DIM, "metric": "l2", "shards": 2})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let points: Vec<Value> = (0..POINTS)
        .map(|id| {
            json!({"id": id, "vector": point_vector(id),
                   "payload": {"bucket": id % 10, "name": format!("p{id}")}})
        })
        .collect();
    let written = quiver_test_support::eventually(
        "the points are accepted",
        Duration::from_secs(60),
        || async {
            let (status, _) = rest
                .call(
                    "POST",
                    "/v1/collections/joined/points",
                    Some(json!({"points": points})),
                )
                .await;
            (status == 200).then_some(())
        },
    )
    .await;
    written.expect("upsert");
    // Segments (one per shard, trained and calibrated) instead of the tail,
    // and a layout that no longer changes between the two rounds below.
    let compacted = quiver_test_support::eventually(
        "the collection is compacted",
        Duration::from_secs(120),
        || async {
            let (status, body) = rest
                .call(
                    "POST",
                    "/admin/v1/collections/joined/compact",
                    Some(json!({})),
                )
                .await;
            (status == 200 && body["done"] == json!(true)).then_some(())
        },
    )
    .await;
    compacted.expect("compact");
    // A strong search waits until the searcher serves every acknowledged row.
    let (status, body) = rest
        .call(
            "POST",
            "/v1/collections/joined/search",
            Some(json!({"vector": point_vector(7), "k": 1})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hits"][0]["id"], json!(7), "{body}");

    // Each search alone, one after another: no search waits, none is joined.
    let searches = searches();
    let mut alone = Vec::new();
    for search in &searches {
        let (status, body) = rest
            .call(
                "POST",
                "/v1/collections/joined/search",
                Some(search.clone()),
            )
            .await;
        assert_eq!(status, 200, "{search}: {body}");
        alone.push(body["hits"].clone());
    }
    // All of them at once, several times: most wait for the one slot and
    // leave together.
    let joined_before = counter("quiver_gateway_searches_joined_total");
    for round in 0..3 {
        let tasks: Vec<_> = searches
            .iter()
            .map(|search| {
                let (rest, search) = (rest.clone(), search.clone());
                tokio::spawn(async move {
                    rest.call("POST", "/v1/collections/joined/search", Some(search))
                        .await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("search task"));
        }
        for ((search, (status, body)), hits) in searches.iter().zip(answers).zip(&alone) {
            assert_eq!(status, 200, "round {round}, {search}: {body}");
            assert_eq!(&body["hits"], hits, "round {round}, {search}");
        }
    }
    let joined = counter("quiver_gateway_searches_joined_total") - joined_before;
    assert!(
        joined >= searches.len() as f64,
        "3 rounds of {} searches at once to a searcher with one slot joined only {joined}",
        searches.len()
    );
    // The answers are real: the nearest row to a point's own vector is itself.
    assert_eq!(alone[0][0]["id"], json!(1), "{}", alone[0]);
}
