//! A searcher node follows meta's watch stream: with its safety poll set to an
//! hour, new shards, new writes and flushes still reach it at once; a flush opens
//! only the new segment; when meta restarts the stream is reopened and updates
//! keep coming.

use std::time::{Duration, Instant};

use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::data::{self, write_record};
use quiver_proto::meta as pb;

use crate::in_process::{
    context, counter, manual_indexer, memory_storage, one_shard_collection, searcher_node,
    single_meta, write_until_accepted,
};

const DIM: usize = 8;

fn point_vector(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|i| ((id * 7 + i as u64 * 13) % 31) as f32 / 31.0 + (id as f32) * 0.01)
        .collect()
}

async fn write(
    indexer: &mut IndexerClient<tonic::transport::Channel>,
    shard: pb::ShardRef,
    ids: std::ops::Range<u64>,
) {
    let records = ids
        .map(|id| data::WriteRecord {
            op: Some(write_record::Op::Upsert(data::Point {
                id: Some(data::PointId {
                    kind: Some(data::point_id::Kind::Num(id)),
                }),
                vector: point_vector(id),
                payload_json: Vec::new(),
            })),
        })
        .collect();
    write_until_accepted(indexer, shard, records).await;
}

/// Waits until an eventual (no manifest wait) search finds point `id`.
async fn wait_visible(
    searcher: &mut SearcherClient<tonic::transport::Channel>,
    shard: pb::ShardRef,
    id: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = searcher
            .search(data::SearchRequest {
                shard: Some(shard),
                min_manifest_version: 0,
                vector: point_vector(id),
                k: 1,
                ..Default::default()
            })
            .await;
        if let Ok(answer) = &answer
            && answer.get_ref().hits.first().and_then(|hit| hit.id.clone())
                == Some(data::PointId {
                    kind: Some(data::point_id::Kind::Num(id)),
                })
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "point {id} not visible through the watch in time: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_searcher_follows_the_watch_stream_and_reopens_it() {
    let meta_dir = tempfile::tempdir().unwrap();
    let (mut meta, client) = single_meta(meta_dir.path()).await;
    let meta_address = meta.local_address().to_string();
    let storage = memory_storage();
    let (indexer, indexer_address) = manual_indexer("indexer-w", &client, &storage).await;

    let cache_dir = tempfile::tempdir().unwrap();
    let read_context = context(&storage, cache_dir.path(), 1 << 20);
    // Only the first poll runs (before the collection exists): everything after
    // must come through the watch stream.
    let (searcher, searcher_address) =
        searcher_node("searcher-w", &client, read_context.clone(), |config| {
            config.safety_poll_interval = Duration::from_secs(3600);
            config.watch_max_backoff = Duration::from_millis(500);
        })
        .await;
    let shard = one_shard_collection(&client, "watched", DIM, pb::Metric::L2).await;
    let mut indexer_client = IndexerClient::connect(format!("http://{indexer_address}"))
        .await
        .unwrap();
    let mut searcher_client = SearcherClient::connect(format!("http://{searcher_address}"))
        .await
        .unwrap();

    // Writes in the WAL tail reach the searcher through the stream.
    write(&mut indexer_client, shard, 0..50).await;
    wait_visible(&mut searcher_client, shard, 42).await;
    assert_eq!(read_context.segment_opens(), 0);

    // Each flush adds one segment, and the searcher opens just that one.
    indexer_client
        .flush(data::ShardRequest {
            shard: Some(shard),
            ..Default::default()
        })
        .await
        .unwrap();
    write(&mut indexer_client, shard, 50..100).await;
    wait_visible(&mut searcher_client, shard, 77).await;
    assert_eq!(read_context.segment_opens(), 1);
    indexer_client
        .flush(data::ShardRequest {
            shard: Some(shard),
            ..Default::default()
        })
        .await
        .unwrap();
    write(&mut indexer_client, shard, 100..150).await;
    wait_visible(&mut searcher_client, shard, 120).await;
    assert_eq!(
        read_context.segment_opens(),
        2,
        "the second flush opened one segment and kept the first open"
    );
    wait_visible(&mut searcher_client, shard, 3).await;
    assert!(searcher.is_ready());

    // Meta restarts on the same port: the stream breaks and is reopened.
    meta.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    meta = loop {
        match quiver_meta::run_single_node(meta_dir.path(), &meta_address).await {
            Ok(meta) => break meta,
            Err(error) if Instant::now() < deadline => {
                tracing::debug!(%error, "meta not restartable yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("meta did not restart: {error}"),
        }
    };
    write(&mut indexer_client, shard, 150..200).await;
    wait_visible(&mut searcher_client, shard, 199).await;
    assert!(
        counter("quiver_searcher_watch_reconnects_total") >= 1.0,
        "the stream was reopened"
    );
    assert!(counter("quiver_searcher_manifest_reloads_total") >= 4.0);

    searcher.shutdown().await;
    indexer.shutdown().await;
    meta.shutdown().await.unwrap();
}
