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
