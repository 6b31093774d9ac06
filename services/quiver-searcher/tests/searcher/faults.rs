//! The read path through a fault-injecting proxy in front of the S3 server: with
//! a share of reads answered 503, reset, stalled, sent slowly, cut off midway or
//! with a byte flipped, a shard view loads (after retries) and every query either
//! gives exactly the answer of a fault-free view or fails with an error naming
//! the object — never a different answer.

use std::sync::Arc;
use std::time::Duration;

use quiver_index::SearchScratch;
use quiver_indexer::{Catalog, MemoryCatalog, ShardRef, ShardWriter};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_searcher::ShardView;
use quiver_storage::testing::{Fault, FaultConfig, FaultProxy};
use quiver_storage::{Storage, StorageOptions, WalRecord};
use quiver_test_support::S3TestServer;

use crate::reload::{context, manual_config};
use crate::{request, spec, upsert, vectors};

/// Storage through `proxy` (short timeouts, few retries) and straight to the
/// server, on one fresh bucket.
pub(crate) async fn stores() -> Option<(FaultProxy, Storage, Storage)> {
    let server = S3TestServer::from_env("this S3 fault test")?;
    let bucket = server.create_bucket("quiver-read-faults").await;
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let options = StorageOptions {
        operation_timeout: Duration::from_secs(4),
        request_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(500),
        max_retries: 3,
        initial_backoff: Duration::from_millis(20),
        ..StorageOptions::default()
    };
    let faulty = server.storage_via(&proxy.endpoint(), &bucket, "reads", options);
    let direct = server.storage(&bucket, "reads", StorageOptions::default());
    Some((proxy, faulty, direct))
}

/// Writes a shard: two segments, then a tail with replacements and deletes (so
/// a view reads segments, deletion bitmaps and WAL objects).
pub(crate) async fn write_shard(storage: &Storage, shard: &ShardRef) -> quiver_indexer::Manifest {
    let catalog = Arc::new(MemoryCatalog::default());
    catalog.set_epoch(shard, 1);
    let writer = ShardWriter::open(
        shard.clone(),
        1,
        spec(),
        manual_config(),
        storage.clone(),
        catalog.clone(),
    )
    .await
    .unwrap();
    let all = vectors(3000, 11);
    for chunk in 0..2u64 {
        writer
            .write(
                (chunk * 1200..(chunk + 1) * 1200)
                    .map(|id| upsert(id, &all[id as usize]))
                    .collect(),
            )
            .await
            .unwrap();
        writer.flush().await.unwrap();
    }
    // Replace some points of the first segment (a deletion bitmap at the next flush).
    writer
        .write(
            (0..100u64)
                .map(|id| upsert(id, &all[(id + 2400) as usize]))
                .collect(),
        )
        .await
        .unwrap();
    writer.flush().await.unwrap();
    writer
        .write(
            (2400..2600u64)
                .map(|id| upsert(id, &all[id as usize]))
                .chain((200..260u64).map(|id| WalRecord::Delete {
                    id: quiver_index::PointId::U64(id),
                }))
                .collect(),
        )
        .await
        .unwrap();
    let manifest = catalog.manifest(shard).await.unwrap();
    writer.close().await;
    manifest
}

fn assert_clear(error: &quiver_searcher::SearcherError) {
    assert!(
        matches!(
            error.error_code(),
            ErrorCode::Unavailable | ErrorCode::DataLoss
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("collections/"),
        "the error names the object: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_through_a_faulty_store_answer_right_or_fail_clearly() {
    let Some((proxy, faulty, direct)) = stores().await else {
        return;
    };
    let shard = ShardRef {
        collection_id: "c-faults".into(),
        shard: 0,
    };
    let manifest = write_shard(&direct, &shard).await;
    assert!(
        manifest
            .segments
            .iter()
            .any(|segment| segment.deletes.is_some())
    );
    assert!(!manifest.wal_tail.is_empty());
    let reference_dir = tempfile::tempdir().unwrap();
    let reference_context = context(&direct, reference_dir.path(), 64 << 10);

    // Stalls cost a request timeout each, so they come a tenth as often.
    let mut config = FaultConfig::new(
        0.3,
        &[
            Fault::ServerError,
            Fault::Reset,
            Fault::SlowBody,
            Fault::TruncateBody,
            Fault::CorruptBody,
            Fault::ServerError,
            Fault::Reset,
            Fault::TruncateBody,
            Fault::CorruptBody,
            Fault::Stall,
        ],
    );
    config.stall = Duration::from_secs(2);
    proxy.set_config(config);

    let stats = tokio::task::spawn_blocking(move || {
        let reference = ShardView::load(&reference_context, &spec(), manifest.clone()).unwrap();
        let mut scratch = SearchScratch::new();
        let (mut load_failures, mut answered, mut failed) = (0, 0, 0);
        // Every round starts from an empty cache (small regions: many fills).
        for round in 0..3 {
            let cache_dir = tempfile::tempdir().unwrap();
            let faulty_context = context(&faulty, cache_dir.path(), 32 << 10);
            // Loading may fail on a damaged WAL object or bitmap; it is retried.
            let view = loop {
                match ShardView::load(&faulty_context, &spec(), manifest.clone()) {
                    Ok(view) => break view,
                    Err(error) => {
                        assert_clear(&error);
                        load_failures += 1;
                        assert!(load_failures < 60, "the view never loaded: {error}");
                    }
                }
            };
            assert_eq!(view.live_points(), reference.live_points());
            for (index, query) in vectors(12, 77 + round).iter().enumerate() {
                let filter = (index % 4 == 0).then_some(r#"tag = "odd""#);
                let wanted = reference
                    .search(
                        &reference_context,
                        &request(query, 10, filter),
                        &mut scratch,
                    )
                    .unwrap();
                match view.search(&faulty_context, &request(query, 10, filter), &mut scratch) {
                    Ok(hits) => {
                        assert_eq!(
                            hits, wanted,
                            "round {round}, query {index}: a different answer"
                        );
                        answered += 1;
                    }
                    Err(error) => {
                        assert_clear(&error);
                        failed += 1;
                    }
                }
            }
        }
        (load_failures, answered, failed)
    })
    .await
    .unwrap();
    let injected = proxy.stats();
    eprintln!("faults injected: {injected:?}; (load failures, answered, failed) = {stats:?}");
    assert!(stats.1 >= 18, "most queries answered: {stats:?}");
    for fault in [
        Fault::TruncateBody,
        Fault::CorruptBody,
        Fault::Reset,
        Fault::Stall,
    ] {
        assert!(
            injected
                .injected
                .iter()
                .any(|(name, count)| *name == fault.name() && *count > 0),
            "no {} injected: {injected:?}",
            fault.name()
        );
    }
}

/// A searcher given a shard cold (empty cache, nothing open) loads it and warms
/// its codes in three round trips to the store, however many objects the shard
/// has: with 150 ms added to every request, the view of three segments, a
/// deletion bitmap and a WAL object is ready after at most 3 requests one after
/// another — each segment's end (trailer, footer, id lookup) and first region
/// with the bitmap and the WAL object; then its other small sections (header,
/// centroids, list directory: 64 KiB apart here, in one region in production);
/// then its codes. Before (a HEAD and one section after another per segment, then
/// each bitmap and WAL object) all 20 requests came one after another. The
/// first query then fetches its rescoring rows a probed list at a time (each
/// list's candidates together; printed, not bounded here) and answers as a warm
/// view does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_shard_is_ready_after_three_dependent_round_trips() {
    let Some((proxy, slow, direct)) = stores().await else {
        return;
    };
    let shard = ShardRef {
        collection_id: "c-cold".into(),
        shard: 0,
    };
    let manifest = write_shard(&direct, &shard).await;
    assert_eq!(manifest.segments.len(), 3);
    assert!(
        manifest
            .segments
            .iter()
            .any(|segment| segment.deletes.is_some())
    );
    assert!(!manifest.wal_tail.is_empty());
    proxy.set_config(FaultConfig::none().with_latency(Duration::from_millis(150)));
    let reference_dir = tempfile::tempdir().unwrap();
    let reference_context = context(&direct, reference_dir.path(), 64 << 10);
    let cache_dir = tempfile::tempdir().unwrap();
    // Regions of 64 KiB: each segment spans several, its start and its end in
    // different ones.
    let cold = context(&slow, cache_dir.path(), 64 << 10);
    let query = vectors(1, 99).remove(0);
    let started = std::time::Instant::now();
    let (ready, hits, wanted) = tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&cold, &spec(), manifest.clone()).unwrap();
        quiver_searcher::warm_new_segments(&cold, &view, None);
        let ready = std::time::Instant::now();
        let mut scratch = SearchScratch::new();
        let hits = view
            .search(&cold, &request(&query, 10, None), &mut scratch)
            .unwrap();
        let reference = ShardView::load(&reference_context, &spec(), manifest).unwrap();
        let wanted = reference
            .search(&reference_context, &request(&query, 10, None), &mut scratch)
            .unwrap();
        (ready, hits, wanted)
    })
    .await
    .unwrap();
    assert_eq!(hits, wanted, "the cold view answers as a warm one");
    let describe = |chain: &[quiver_storage::testing::RequestSpan]| -> Vec<String> {
        chain
            .iter()
            .map(|span| {
                format!(
                    "{} {} {} at +{} ms",
                    span.method,
                    span.path.rsplit('/').next().unwrap_or_default(),
                    span.range.as_deref().unwrap_or("whole"),
                    span.start.duration_since(started).as_millis()
                )
            })
            .collect()
    };
    let (load_depth, load_chain) = proxy.dependent_round_trips(started..ready);
    let load_requests = proxy.spans(started..ready).len();
    let (query_depth, _) = proxy.dependent_round_trips(ready..std::time::Instant::now());
    for span in proxy.spans(started..ready) {
        eprintln!(
            "  {} {} {} +{}..+{} ms",
            span.method,
            span.path.rsplit('/').next().unwrap_or_default(),
            span.range.as_deref().unwrap_or("whole"),
            span.start.duration_since(started).as_millis(),
            span.end.duration_since(started).as_millis()
        );
    }
    eprintln!(
        "cold load: {load_requests} requests, {load_depth} one after another {:#?}; first query: {query_depth} more",
        describe(&load_chain)
    );
    assert!(
        load_requests >= 5,
        "the shard's objects were read through the proxy"
    );
    assert!(
        load_depth <= 3,
        "{load_depth} round trips one after another before the view was ready: {:#?}",
        describe(&load_chain)
    );
}
