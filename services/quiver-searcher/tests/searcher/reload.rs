//! Manifest changes applied to a shard view incrementally: already-open segments
//! are kept, only new ones are opened, a grown WAL tail reads only its new
//! objects — and the result answers exactly like a view built from scratch.
//! Also: what a query cost the cache (cold misses and bytes, warm hits).

use std::sync::Arc;

use quiver_index::{PointId, SearchScratch};
use quiver_indexer::{Catalog, MemoryCatalog, ShardRef, ShardWriter};
use quiver_searcher::{ReadContext, ShardView};
use quiver_storage::manifest::Manifest;
use quiver_storage::{Storage, WalRecord};

use crate::{request, spec, upsert, vectors};

pub(crate) fn manual_config() -> quiver_indexer::IndexerConfig {
    quiver_indexer::IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 1000,
        codebook_refresh: false,
        ..quiver_indexer::IndexerConfig::default()
    }
}

pub(crate) fn context(
    storage: &Storage,
    directory: &std::path::Path,
    region_bytes: u64,
) -> Arc<ReadContext> {
    let cache = quiver_blobcache::BlobCache::new(
        &quiver_blobcache::BlobCacheConfig {
            directory: directory.to_path_buf(),
            capacity_bytes: 256 * region_bytes,
            region_bytes,
            map_local_files: true,
            row_region_bytes: 0,
        },
        storage.clone(),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    Arc::new(ReadContext::new(
        Arc::new(cache),
        storage.clone(),
        tokio::runtime::Handle::current(),
    ))
}

pub(crate) fn memory_storage() -> Storage {
    Storage::open(
        &quiver_storage::StoreUrl::Memory,
        &quiver_storage::S3Settings::default(),
        quiver_storage::StorageOptions::default(),
    )
    .unwrap()
}

async fn writer(storage: &Storage, catalog: &Arc<MemoryCatalog>, shard: &ShardRef) -> ShardWriter {
    catalog.set_epoch(shard, 1);
    ShardWriter::open(
        shard.clone(),
        1,
        spec(),
        manual_config(),
        storage.clone(),
        catalog.clone(),
    )
    .await
    .unwrap()
}

/// Writes `rows` points (vectors of `seed`) to a new shard `collection` of
/// `storage` in batches of 10,000 and flushes them into one segment; returns
/// the shard's manifest.
async fn one_segment(storage: &Storage, collection: &str, rows: usize, seed: u64) -> Manifest {
    let shard = ShardRef {
        collection_id: collection.into(),
        shard: 0,
    };
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = writer(storage, &catalog, &shard).await;
    let all = vectors(rows, seed);
    for batch in (0..rows as u64).collect::<Vec<_>>().chunks(10_000) {
        writer
            .write(
                batch
                    .iter()
                    .map(|&id| upsert(id, &all[id as usize]))
                    .collect(),
            )
            .await
            .unwrap();
    }
    writer.flush().await.unwrap();
    let manifest = catalog.manifest(&shard).await.unwrap();
    assert_eq!(manifest.segments.len(), 1);
    manifest
}

/// Asserts `view` answers like a view of the same manifest built from scratch.
fn assert_same_answers(context: &ReadContext, view: &ShardView, fresh: &ShardView) {
    assert_eq!(view.manifest(), fresh.manifest());
    assert_eq!(view.live_points(), fresh.live_points());
    let mut scratch = SearchScratch::new();
    for (index, query) in vectors(30, 99).iter().enumerate() {
        let filter = (index % 3 == 0).then_some(r#"tag = "even""#);
        let hits = view
            .search(context, &request(query, 10, filter), &mut scratch)
            .unwrap();
        let expected = fresh
            .search(context, &request(query, 10, filter), &mut scratch)
            .unwrap();
        assert_eq!(hits, expected, "query {index}");
    }
    let ids: Vec<PointId> = (0..7000u64).step_by(13).map(PointId::U64).collect();
    assert_eq!(
        view.get(&ids, true).unwrap(),
        fresh.get(&ids, true).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_change_opens_only_the_new_segments() {
    let storage = memory_storage();
    let shard = ShardRef {
        collection_id: "c-reload".into(),
        shard: 0,
    };
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = writer(&storage, &catalog, &shard).await;
    let all = vectors(7000, 1);
    for chunk in 0..2u64 {
        let records: Vec<WalRecord> = (chunk * 2000..(chunk + 1) * 2000)
            .map(|id| upsert(id, &all[id as usize]))
            .collect();
        writer.write(records).await.unwrap();
        writer.flush().await.unwrap();
    }
    writer
        .write(
            (4000..4500)
                .map(|id| upsert(id, &all[id as usize]))
                .collect(),
        )
        .await
        .unwrap();
    let directory = tempfile::tempdir().unwrap();
    let context = context(&storage, directory.path(), 1 << 20);

    let first = catalog.manifest(&shard).await.unwrap();
    let loader = context.clone();
    let view = tokio::task::spawn_blocking(move || ShardView::load(&loader, &spec(), first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(context.segment_opens(), 2);

    // The tail grows: no segment opened, only the new WAL object read.
    writer
        .write(
            (4500..5000)
                .map(|id| upsert(id, &all[id as usize]))
                .chain((0..40u64).map(|id| WalRecord::Delete {
                    id: PointId::U64(id * 3),
                }))
                .collect(),
        )
        .await
        .unwrap();
    let grown = catalog.manifest(&shard).await.unwrap();
    assert_eq!(grown.wal_tail.len(), 2);
    let (context_, view_) = (context.clone(), Arc::new(view));
    let (grown_view, stats) = {
        let previous = view_.clone();
        tokio::task::spawn_blocking(move || ShardView::reload(&previous, &context_, &spec(), grown))
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(stats.segments_opened, 0, "{stats:?}");
    assert_eq!(stats.segments_reused, 2, "{stats:?}");
    assert_eq!(
        stats.wal_batches_applied, 1,
        "only the new WAL object: {stats:?}"
    );
    assert_eq!(context.segment_opens(), 2);
    for (old, new) in view_.segments().zip(grown_view.segments()) {
        assert!(std::ptr::eq(old, new), "the same open segment");
    }

    // A flush: one new segment, deletion bitmaps on the old ones, the tail trimmed;
    // then a replacement of points of the first segment in the new tail.
    writer.flush().await.unwrap();
    writer
        .write(
            (200..250u64)
                .map(|id| upsert(id, &all[(id + 6000) as usize]))
                .collect(),
        )
        .await
        .unwrap();
    let flushed = catalog.manifest(&shard).await.unwrap();
    assert_eq!(flushed.segments.len(), 3);
    assert!(
        flushed
            .segments
            .iter()
            .any(|segment| segment.deletes.is_some())
    );
    let grown_view = Arc::new(grown_view);
    let (context_, previous, manifest) = (context.clone(), grown_view.clone(), flushed.clone());
    let (flushed_view, stats) = tokio::task::spawn_blocking(move || {
        ShardView::reload(&previous, &context_, &spec(), manifest)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(stats.segments_opened, 1, "{stats:?}");
    assert_eq!(stats.segments_reused, 2, "{stats:?}");
    assert_eq!(
        context.segment_opens(),
        3,
        "one open for the one new segment"
    );

    // Both incremental views answer exactly like views built from scratch.
    let fresh_directory = tempfile::tempdir().unwrap();
    let fresh_context = self::context(&storage, fresh_directory.path(), 1 << 20);
    let context_ = context.clone();
    tokio::task::spawn_blocking(move || {
        let fresh = ShardView::load(&fresh_context, &spec(), flushed).unwrap();
        assert_same_answers(&context_, &flushed_view, &fresh);
        assert_eq!(flushed_view.live_points(), 5000 - 40);
        let grown_fresh =
            ShardView::load(&fresh_context, &spec(), grown_view.manifest().clone()).unwrap();
        assert_same_answers(&context_, &grown_view, &grown_fresh);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_query_reports_misses_and_bytes_and_a_repeat_only_hits() {
    let storage = memory_storage();
    let shard = ShardRef {
        collection_id: "c-cost".into(),
        shard: 0,
    };
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = writer(&storage, &catalog, &shard).await;
    let all = vectors(3000, 4);
    writer
        .write(
            (0..3000u64)
                .map(|id| upsert(id, &all[id as usize]))
                .collect(),
        )
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let manifest = catalog.manifest(&shard).await.unwrap();
    let directory = tempfile::tempdir().unwrap();
    // Small regions, so opening the segment does not bring in what a query reads.
    let context = context(&storage, directory.path(), 16 << 10);
    tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&context, &spec(), manifest).unwrap();
        let mut scratch = SearchScratch::new();
        let query = request(&all[17], 10, None);
        let (cold_hits, cold) = view
            .search_with_cost(&context, &query, &mut scratch)
            .unwrap();
        assert!(cold.cache_regions_missed > 0, "{cold:?}");
        assert!(cold.bytes_fetched > 0, "{cold:?}");
        assert!(cold.store_wait_ms > 0.0, "{cold:?}");
        // Counted per wait, several regions a wait when fetched together.
        assert!(
            cold.store_waits > 0 && cold.store_waits <= cold.cache_regions_missed,
            "{cold:?}"
        );
        assert!(
            cold.row_reads_remote <= cold.cache_regions_missed,
            "{cold:?}"
        );
        assert!(
            cold.bytes_fetched <= cold.cache_regions_missed * (16 << 10),
            "{cold:?}"
        );
        let (warm_hits, warm) = view
            .search_with_cost(&context, &query, &mut scratch)
            .unwrap();
        assert_eq!(warm_hits, cold_hits);
        assert_eq!(warm.cache_regions_missed, 0, "{warm:?}");
        assert_eq!(warm.bytes_fetched, 0, "{warm:?}");
        assert_eq!(warm.row_reads_remote, 0, "{warm:?}");
        assert_eq!(warm.store_wait_ms, 0.0, "{warm:?}");
        assert_eq!(warm.store_waits, 0, "{warm:?}");
        assert!(warm.cache_regions_hit > 0, "{warm:?}");
        assert!(context.cache().stats().bytes_fetched >= cold.bytes_fetched);
    })
    .await
    .unwrap();
}

/// The background row warm-up brings a new segment's raw vectors into the
/// row tier, and leaves a segment alone once a newer view no longer serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_warmed_only_while_their_segment_is_served() {
    let storage = memory_storage();
    let manifest = one_segment(&storage, "c-warm-rows", 3000, 7).await;
    let warm = |still_served: bool| {
        let storage = storage.clone();
        let manifest = manifest.clone();
        async move {
            let directory = tempfile::tempdir().unwrap();
            // A cache with a row tier (64 KiB row regions), empty.
            let cache = quiver_blobcache::BlobCache::new(
                &quiver_blobcache::BlobCacheConfig {
                    directory: directory.path().to_path_buf(),
                    capacity_bytes: 64 << 20,
                    region_bytes: 1 << 20,
                    map_local_files: true,
                    row_region_bytes: 64 << 10,
                },
                storage.clone(),
                tokio::runtime::Handle::current(),
            )
            .unwrap();
            let context = Arc::new(ReadContext::new(
                Arc::new(cache),
                storage,
                tokio::runtime::Handle::current(),
            ));
            tokio::task::spawn_blocking(move || {
                let view = ShardView::load(&context, &spec(), manifest).unwrap();
                let fetched =
                    quiver_searcher::warm_new_rows(&context, &view, None, &|_| still_served);
                let rows = context.cache().stats_by_tier().1.expect("a row tier");
                (fetched, rows.bytes_fetched, directory)
            })
            .await
            .unwrap()
        }
    };
    let (fetched, row_bytes, _directory) = warm(true).await;
    // The raw vectors at least: 3000 rows of DIM f32.
    assert!(fetched >= 3000 * crate::DIM as u64 * 4, "fetched {fetched}");
    assert_eq!(
        fetched, row_bytes,
        "what it reports is what the row tier fetched"
    );
    let (fetched, row_bytes, _directory) = warm(false).await;
    assert_eq!(
        (fetched, row_bytes),
        (0, 0),
        "a retired segment is not warmed"
    );
}

/// A segment that is a local file mapped as it is (`quiver standalone`) holds
/// its rows — raw vectors, payloads — in memory as huge pages when they fit
/// a quarter of the memory (these do): advised before the view serves, read in by the
/// row warm-up, which fetches nothing from a store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_mapped_segments_that_fit_the_memory_are_held() {
    let objects = tempfile::tempdir().unwrap();
    let storage = Storage::open(
        &quiver_storage::StoreUrl::File {
            root: objects.path().to_path_buf(),
        },
        &quiver_storage::S3Settings::default(),
        quiver_storage::StorageOptions::default(),
    )
    .unwrap();
    // Raw vectors of 5 MB: whole huge pages to hold.
    let manifest = one_segment(&storage, "c-held-rows", 40_000, 11).await;
    let cache_directory = tempfile::tempdir().unwrap();
    let context = context(&storage, cache_directory.path(), 1 << 20);
    tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&context, &spec(), manifest).unwrap();
        let segment = view.segments().next().unwrap();
        assert!(segment.source().is_mapped(), "a file:// object is mapped");
        assert!(
            !segment.source().holds_rows(),
            "nothing held before warm-up"
        );
        quiver_searcher::warm_new_segments(&context, &view, None);
        assert!(
            segment.source().holds_rows(),
            "rows of a mapped segment that fit the memory are held once warmed"
        );
        let fetched = quiver_searcher::warm_new_rows(&context, &view, None, &|_| true);
        assert_eq!(fetched, 0, "a mapped file fetches nothing from a store");
    })
    .await
    .unwrap();
}
