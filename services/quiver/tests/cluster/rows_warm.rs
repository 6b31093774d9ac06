//! A flush or a merge adds no rows, so no strong read needs its manifest at
//! once: the searcher builds the new view and pulls the new segments' codes and
//! rows into its cache before serving it. Before, the view served first and its
//! rows were warmed behind it, so the first queries after a merge read rows from
//! the store one by one (cluster right after a load, c = 64: p99 191 ms against
//! a p50 of 20). Here the searcher's store is 150 ms away: a query answered by
//! the new view while its rows were still being fetched would wait for them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::data::{self, write_record};
use quiver_proto::meta as pb;
use quiver_searcher::ReadContext;
use quiver_storage::testing::FaultConfig;
use quiver_test_support::S3TestServer;

use crate::in_process::{
    manual_indexer, one_shard_collection, searcher_node, single_meta, store_and_proxied,
    write_until_accepted,
};

const DIM: usize = 64;
const ROWS: u64 = 20_000;
const STORE_LATENCY: Duration = Duration::from_millis(150);

fn point_vector(id: u64) -> Vec<f32> {
    (0..DIM)
        .map(|i| ((id * 31 + i as u64 * 17) % 97) as f32 / 97.0 + (id % 13) as f32 * 0.05)
        .collect()
}

async fn search(
    searcher: &mut SearcherClient<tonic::transport::Channel>,
    shard: pb::ShardRef,
    id: u64,
) -> data::SearchResponse {
    searcher
        .search(data::SearchRequest {
            shard: Some(shard),
            min_manifest_version: 0,
            vector: point_vector(id),
            k: 10,
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_segment_serves_with_its_rows_already_in_the_cache() {
    let Some(server) = S3TestServer::from_env("the rows warm-up test") else {
        return;
    };
    // The indexer writes at full speed; the searcher reads through the proxy.
    let (storage, proxy, searcher_storage) =
        store_and_proxied(&server, "quiver-rows-warm", "rows-warm").await;

    let meta_dir = tempfile::tempdir().unwrap();
    let (meta, client) = single_meta(meta_dir.path()).await;
    let (indexer, indexer_address) = manual_indexer("indexer-rw", &client, &storage).await;

    // A cache with a row tier (what a searcher over S3 has), large enough that
    // the new segment's rows fit the quarter of it one reload may warm.
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = quiver_blobcache::BlobCache::new(
        &quiver_blobcache::BlobCacheConfig {
            directory: cache_dir.path().to_path_buf(),
            capacity_bytes: 64 << 20,
            region_bytes: 1 << 20,
            map_local_files: false,
            row_region_bytes: 64 << 10,
        },
        searcher_storage.clone(),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    let read_context = Arc::new(ReadContext::new(
        Arc::new(cache),
        searcher_storage.clone(),
        tokio::runtime::Handle::current(),
    ));
    // Frequent safety polls too: one that finds the flushed manifest while its
    // view is being prepared must not serve it with cold rows.
    let (searcher, searcher_address) =
        searcher_node("searcher-rw", &client, read_context.clone(), |config| {
            config.safety_poll_interval = Duration::from_millis(100);
        })
        .await;
    let shard = one_shard_collection(&client, "rows_warm", DIM, pb::Metric::L2).await;
    let mut indexer_client = IndexerClient::connect(format!("http://{indexer_address}"))
        .await
        .unwrap();
    let mut searcher_client = SearcherClient::connect(format!("http://{searcher_address}"))
        .await
        .unwrap();

    for start in (0..ROWS).step_by(500) {
        let records: Vec<data::WriteRecord> = (start..start + 500)
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
        write_until_accepted(&mut indexer_client, shard, records).await;
    }
    // Every row in the served WAL tail.
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        let answer = search(&mut searcher_client, shard, ROWS - 1).await;
        let cost = answer.cost.unwrap_or_default();
        if cost.tail_rows_scored == ROWS {
            break answer.manifest_version;
        }
        assert!(
            Instant::now() < deadline,
            "the tail never held every row: {cost:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    proxy.set_config(FaultConfig::none().with_latency(STORE_LATENCY));
    indexer_client
        .flush(data::ShardRequest {
            shard: Some(shard),
            ..Default::default()
        })
        .await
        .unwrap();
    // Query until the segment serves, then a few more: every answer of the new
    // view reads its rows from the cache.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut from_segment = 0;
    let mut id = 0;
    while from_segment < 20 {
        let answer = search(&mut searcher_client, shard, id % ROWS).await;
        id += 97;
        let cost = answer.cost.unwrap_or_default();
        if answer.manifest_version > before && cost.tail_rows_scored == 0 {
            assert_eq!(cost.segments, 1, "{cost:?}");
            assert!(
                cost.row_reads_local > 0,
                "the search rescored no rows: {cost:?}"
            );
            // Neither a fetch of its own nor a wait for the warm-up's fills.
            assert!(
                cost.row_reads_remote == 0
                    && cost.cache_regions_missed == 0
                    && cost.store_wait_ms == 0.0,
                "answer {from_segment} of the flushed segment (version {}) waited for the store: {cost:?}",
                answer.manifest_version
            );
            from_segment += 1;
        } else {
            assert!(
                Instant::now() < deadline,
                "the flushed segment never served"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    searcher.shutdown().await;
    indexer.shutdown().await;
    meta.shutdown().await.unwrap();
}
