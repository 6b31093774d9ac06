//! The orphan sweep against the real S3 server: an object no manifest names is
//! reported in `GET /admin/v1/orphans` once it is older than the minimum age,
//! deleted only after it has been listed for the grace period, while the objects
//! of writes going on all the time (WAL objects, flushed and merged segments) and
//! objects outside Quiver's layout are never touched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quiver_indexer::{IndexerConfig, IndexerNode, IndexerNodeConfig};
use quiver_meta::MetaClient;
use quiver_storage::{Storage, StorageErrorKind, keys};
use quiver_test_support::S3TestServer;
use serde_json::{Value, json};

use crate::in_process::{Rest, counter, gateway_node};

const MIN_AGE_MS: u64 = 2_000;
const GRACE_MS: u64 = 1_500;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn s3_storage() -> Option<Storage> {
    let server = S3TestServer::from_env("the orphan sweep test")?;
    Some(server.fresh_storage("quiver-orphans", "cluster").await)
}

/// The orphans the gateway lists now (their count checked against the list).
async fn list_orphans(rest: &Rest) -> Vec<Value> {
    let (status, body) = rest.call("GET", "/admin/v1/orphans", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["count"].as_u64().unwrap() as usize,
        body["orphans"].as_array().unwrap().len()
    );
    body["orphans"].as_array().unwrap().clone()
}

fn listed<'o>(orphans: &'o [Value], key: &str) -> Option<&'o Value> {
    orphans.iter().find(|orphan| orphan["key"] == key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reported_then_deleted_and_nothing_referenced_is_touched() {
    let Some(storage) = s3_storage().await else {
        return;
    };
    let meta_dir = tempfile::tempdir().unwrap();
    let meta = quiver_meta::run_single_node(meta_dir.path(), "127.0.0.1:0")
        .await
        .unwrap();
    let client = MetaClient::connect([meta.local_address().to_string()]).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut config = IndexerNodeConfig::new("indexer-o", &address);
    config.heartbeat_interval = Duration::from_millis(200);
    config.indexer = IndexerConfig {
        flush_interval_ms: 3_600_000,
        orphan_sweep_interval_ms: 200,
        orphan_min_age_ms: MIN_AGE_MS,
        orphan_grace_ms: GRACE_MS,
        ..IndexerConfig::default()
    };
    let indexer = IndexerNode::start(config, listener, client.clone(), storage.clone())
        .await
        .unwrap();
    let (gateway, rest) = gateway_node("gateway-o", &client).await;

    let (status, body) = rest
        .call(
            "PUT",
            "/v1/collections/orph",
            Some(json!({"dimension": 4, "metric": "l2"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let collection = client.get_collection("orph", true).await.unwrap();
    let collection_id = collection.collection_id.to_string();

    // Writes, flushes and merges go on during the whole test: their objects are
    // referenced (or on the GC list) and must never be reported or deleted.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn({
        let (stop, written) = (stop.clone(), written.clone());
        let rest = rest.clone();
        async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Acquire) {
                let points: Vec<Value> = (0..20)
                    .map(|i| {
                        let id = round * 20 + i;
                        json!({"id": id, "vector": [id as f32, 1.0, 2.0, 3.0]})
                    })
                    .collect();
                let (status, body) = rest
                    .call(
                        "POST",
                        "/v1/collections/orph/points",
                        Some(json!({"points": points})),
                    )
                    .await;
                if status == 200 {
                    written.fetch_add(20, Ordering::Relaxed);
                } else {
                    // The shard lease may not be granted yet right after the create.
                    assert_eq!(status, 503, "{body}");
                }
                if round % 8 == 7 {
                    let (status, body) = rest
                        .call("POST", "/admin/v1/collections/orph/compact", None)
                        .await;
                    assert!(status == 200 || status == 503, "{body}");
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    // An orphan of the layout, and objects outside it.
    let orphan_a = keys::segment_key(&collection_id, 0, "crashed-before-commit");
    let planted_a_ms = now_ms();
    storage
        .put(&orphan_a, bytes::Bytes::from(vec![7u8; 1000]))
        .await
        .unwrap();
    let stray = format!("{}/{collection_id}/notes.txt", keys::COLLECTIONS_PREFIX);
    storage
        .put(&stray, bytes::Bytes::from_static(b"not ours"))
        .await
        .unwrap();
    storage
        .put("elsewhere/thing.bin", bytes::Bytes::from_static(b"neither"))
        .await
        .unwrap();

    // Every listing: nothing younger than the minimum age, nothing referenced.
    let check = |orphans: &[Value], referenced: &std::collections::HashSet<String>| {
        for orphan in orphans {
            let key = orphan["key"].as_str().unwrap();
            assert!(!referenced.contains(key), "referenced object {key} listed");
            assert!(key != stray && key != "elsewhere/thing.bin", "{key}");
            let first_seen = orphan["first_seen_ms"].as_u64().unwrap();
            let last_modified = orphan["last_modified_ms"].as_u64().unwrap();
            assert!(first_seen >= last_modified + MIN_AGE_MS, "{orphan}");
            assert_eq!(
                orphan["delete_after_ms"].as_u64().unwrap(),
                first_seen + GRACE_MS,
                "{orphan}"
            );
        }
    };
    let referenced = || {
        let client = client.clone();
        let collection_id = collection.collection_id;
        async move {
            let manifest = client
                .get_manifest(
                    quiver_proto::meta::ShardRef {
                        collection_id,
                        shard: 0,
                    },
                    true,
                )
                .await
                .unwrap();
            manifest
                .segments
                .iter()
                .flat_map(|segment| {
                    std::iter::once(segment.object_key.clone()).chain(
                        (!segment.deletes_key.is_empty()).then(|| segment.deletes_key.clone()),
                    )
                })
                .chain(
                    manifest
                        .wal_tail
                        .iter()
                        .map(|entry| entry.object_key.clone()),
                )
                .collect::<std::collections::HashSet<String>>()
        }
    };

    // A is listed once it is old enough — and not before.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut planted_b = None;
    let orphan_b = keys::wal_key(&collection_id, 0, 999, 1);
    loop {
        let live = referenced().await;
        let orphans = list_orphans(&rest).await;
        check(&orphans, &live);
        if let Some(record) = listed(&orphans, &orphan_a) {
            // Object store timestamps have one-second precision.
            assert!(
                record["first_seen_ms"].as_u64().unwrap() + 1_000 >= planted_a_ms + MIN_AGE_MS,
                "{record}"
            );
            assert_eq!(record["size_bytes"], 1000);
            if planted_b.is_none() {
                // quiverctl shows the same list (well inside A's grace period).
                let output = std::process::Command::new(env!("CARGO_BIN_EXE_quiverctl"))
                    .args(["--endpoint", &rest.base, "orphans"])
                    .output()
                    .expect("quiverctl runs");
                let stdout = String::from_utf8_lossy(&output.stdout);
                assert!(
                    output.status.success(),
                    "{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                assert!(stdout.contains(&orphan_a), "quiverctl orphans: {stdout}");
                // A fresh object, as a write between its PUT and its commit leaves.
                planted_b = Some(now_ms());
                storage
                    .put(&orphan_b, bytes::Bytes::from_static(b"in flight"))
                    .await
                    .unwrap();
            }
        }
        if let Some(planted_b_ms) = planted_b
            && let Some(record) = listed(&orphans, &orphan_b)
        {
            assert!(
                record["first_seen_ms"].as_u64().unwrap() + 1_000 >= planted_b_ms + MIN_AGE_MS,
                "a fresh object was reported: {record}"
            );
        }
        // A goes only after its grace, and leaves the list when it goes.
        match storage.head(&orphan_a).await {
            Err(error) if error.kind() == StorageErrorKind::NotFound => {
                assert!(
                    now_ms() + 1_000 >= planted_a_ms + MIN_AGE_MS + GRACE_MS,
                    "deleted before its grace period"
                );
                if listed(&list_orphans(&rest).await, &orphan_a).is_none()
                    && planted_b.is_some_and(|_| listed(&orphans, &orphan_b).is_some())
                {
                    break;
                }
            }
            Err(error) => panic!("head {orphan_a}: {error}"),
            Ok(_) => assert!(listed(&orphans, &orphan_a).is_some() || planted_b.is_none()),
        }
        assert!(
            Instant::now() < deadline,
            "orphan not reported and deleted in time; listed: {orphans:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop.store(true, Ordering::Release);
    writer.await.unwrap();
    assert!(written.load(Ordering::Relaxed) > 0, "writes went through");
    // Everything the manifest references is still there, and so is everything
    // outside Quiver's layout.
    let live = referenced().await;
    assert!(!live.is_empty());
    for key in live
        .iter()
        .chain([&stray, &"elsewhere/thing.bin".to_string()])
    {
        storage
            .head(key)
            .await
            .unwrap_or_else(|error| panic!("{key} is gone: {error}"));
    }
    assert!(counter("quiver_indexer_orphans_found_total") >= 2.0);
    assert!(counter("quiver_indexer_orphans_deleted_total") >= 1.0);

    gateway.shutdown().await;
    indexer.shutdown().await;
    meta.shutdown().await.unwrap();
}
