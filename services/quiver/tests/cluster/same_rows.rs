//! A strong read needs every acknowledged write, not the newest layout: after a
//! merge (a new manifest version, no new rows) the searcher answers a strong
//! search from the view it serves while the merged segment loads in the
//! background. Here the searcher's object store stalls every GET, so the merged
//! segment cannot load at all: the strong search still answers at once, from
//! the older view; a write after it (new rows) is waited for, as before.

use std::time::Duration;

use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::data::{self, write_record};
use quiver_proto::meta as pb;
use quiver_storage::testing::{Fault, FaultConfig};
use quiver_test_support::S3TestServer;

use crate::in_process::{
    context, counter, manual_indexer, one_shard_collection, searcher_node, single_meta,
    store_and_proxied, write_until_accepted,
};

const DIM: usize = 8;

fn point_vector(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|i| ((id * 7 + i as u64 * 13) % 31) as f32 / 31.0 + (id as f32) * 0.01)
        .collect()
}

fn upserts(ids: std::ops::Range<u64>) -> Vec<data::WriteRecord> {
    ids.map(|id| data::WriteRecord {
        op: Some(write_record::Op::Upsert(data::Point {
            id: Some(data::PointId {
                kind: Some(data::point_id::Kind::Num(id)),
            }),
            vector: point_vector(id),
            payload_json: Vec::new(),
        })),
    })
    .collect()
}

async fn write(
    indexer: &mut IndexerClient<tonic::transport::Channel>,
    shard: pb::ShardRef,
    ids: std::ops::Range<u64>,
) {
    write_until_accepted(indexer, shard, upserts(ids)).await;
}

fn num(id: u64) -> Option<data::PointId> {
    Some(data::PointId {
        kind: Some(data::point_id::Kind::Num(id)),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_read_after_a_merge_is_answered_by_the_served_view() {
    let Some(server) = S3TestServer::from_env("the same-rows strong read test") else {
        return;
    };
    // The indexer writes straight to the server; the searcher reads through a
    // proxy that can stall its GETs.
    let (storage, proxy, searcher_storage) =
        store_and_proxied(&server, "quiver-same-rows", "same-rows").await;
    let meta_dir = tempfile::tempdir().unwrap();
    let (meta, client) = single_meta(meta_dir.path()).await;
    let (indexer, indexer_address) = manual_indexer("indexer-same-rows", &client, &storage).await;
    let cache_dir = tempfile::tempdir().unwrap();
    let read_context = context(&searcher_storage, cache_dir.path(), 1 << 20);
    let (searcher, searcher_address) =
        searcher_node("searcher-same-rows", &client, read_context, |_| {}).await;
    let shard = one_shard_collection(&client, "same_rows", DIM, pb::Metric::L2).await;
    let mut indexer_client = IndexerClient::connect(format!("http://{indexer_address}"))
        .await
        .unwrap();
    let searcher_client = SearcherClient::connect(format!("http://{searcher_address}"))
        .await
        .unwrap();
    let strong_search = |id: u64, min_version: u64| {
        let mut searcher_client = searcher_client.clone();
        async move {
            searcher_client
                .search(data::SearchRequest {
                    shard: Some(shard),
                    min_manifest_version: min_version,
                    vector: point_vector(id),
                    k: 1,
                    ..Default::default()
                })
                .await
                .map(tonic::Response::into_inner)
        }
    };

    // Two flushed segments, served.
    for ids in [0..50, 50..100] {
        write(&mut indexer_client, shard, ids).await;
        indexer_client
            .flush(data::ShardRequest {
                shard: Some(shard),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let before = client.get_manifest(shard, true).await.unwrap();
    // (Answered by the flushed layout or by the view before the second flush,
    // whose WAL tail holds the same rows: either sees every write.)
    let answer = strong_search(77, before.version).await.unwrap();
    assert_eq!(answer.hits[0].id, num(77));

    // The searcher's store stalls every read; a merge commits a new manifest
    // version with the same rows.
    let mut stalled = FaultConfig::new(1.0, &[Fault::Stall]).only_methods(&["GET"]);
    stalled.stall = Duration::from_secs(5);
    proxy.set_config(stalled);
    indexer_client
        .compact(data::ShardRequest {
            shard: Some(shard),
            ..Default::default()
        })
        .await
        .unwrap();
    let merged = client.get_manifest(shard, true).await.unwrap();
    assert!(
        merged.version > before.version,
        "the merge made a new manifest"
    );
    assert_eq!(merged.segments.len(), 1);
    let same_rows_before = counter("quiver_searcher_manifest_same_rows_total");
    let answer = tokio::time::timeout(Duration::from_secs(4), strong_search(42, merged.version))
        .await
        .expect("a strong read after a merge does not wait for the merged segment")
        .unwrap();
    assert_eq!(answer.hits[0].id, num(42));
    assert!(
        answer.manifest_version < merged.version,
        "answered by the view served before the merge ({} < {})",
        answer.manifest_version,
        merged.version
    );
    assert!(counter("quiver_searcher_manifest_same_rows_total") > same_rows_before);

    // New rows: a strong read waits for them (once the store reads again).
    proxy.set_config(FaultConfig::none());
    write(&mut indexer_client, shard, 100..101).await;
    let written = client.get_manifest(shard, true).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(60), strong_search(100, written.version))
        .await
        .expect("the strong read after a write answers")
        .unwrap();
    assert_eq!(answer.hits[0].id, num(100), "an acknowledged write is seen");
    assert!(answer.manifest_version >= written.version);

    searcher.shutdown().await;
    indexer.shutdown().await;
    meta.shutdown().await.unwrap();
}
