//! A searcher whose cache disk is full (a small tmpfs mounted for the test): the
//! cache cannot make its file, reads through to the object store, and queries
//! answer exactly as from a working cache — every read a miss, counted in the
//! query's cost.

use std::sync::Arc;

use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_index::SearchScratch;
use quiver_searcher::{ReadContext, ShardView};
use quiver_test_support::Tmpfs;

use crate::faults::write_shard;
use crate::reload::{context, memory_storage};
use crate::{request, spec, vectors};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_read_through_when_the_cache_disk_is_full() {
    let Some(mount) = Tmpfs::mount_temporary(2 << 20) else {
        return;
    };
    let storage = memory_storage();
    let shard = quiver_indexer::ShardRef {
        collection_id: "c-full".into(),
        shard: 0,
    };
    let manifest = write_shard(&storage, &shard).await;
    let reference_dir = tempfile::tempdir().unwrap();
    let reference_context = context(&storage, reference_dir.path(), 64 << 10);
    let full = BlobCacheConfig {
        directory: mount.path().join("cache"),
        capacity_bytes: 64 << 20,
        region_bytes: 1 << 20,
        map_local_files: true,
        row_region_bytes: 0,
    };
    let error = match BlobCache::new(&full, storage.clone(), tokio::runtime::Handle::current()) {
        Ok(_) => panic!("a 64 MiB cache file fits on a 2 MiB disk?"),
        Err(error) => error,
    };
    assert!(error.to_string().contains("space"), "{error}");
    let cache =
        BlobCache::new_or_read_through(&full, storage.clone(), tokio::runtime::Handle::current())
            .unwrap();
    assert!(cache.is_read_through());
    let read_through = Arc::new(ReadContext::new(
        Arc::new(cache),
        storage,
        tokio::runtime::Handle::current(),
    ));
    tokio::task::spawn_blocking(move || {
        let reference = ShardView::load(&reference_context, &spec(), manifest.clone()).unwrap();
        let view = ShardView::load(&read_through, &spec(), manifest).unwrap();
        assert_eq!(view.live_points(), reference.live_points());
        let mut scratch = SearchScratch::new();
        for (index, query) in vectors(10, 5).iter().enumerate() {
            let filter = (index % 3 == 0).then_some(r#"tag = "even""#);
            let wanted = reference
                .search(
                    &reference_context,
                    &request(query, 10, filter),
                    &mut scratch,
                )
                .unwrap();
            let (hits, cost) = view
                .search_with_cost(&read_through, &request(query, 10, filter), &mut scratch)
                .unwrap();
            assert_eq!(hits, wanted, "query {index}");
            // No region is cached; the first query fetches from the store, and
            // later ones reuse the checked chunks read-through mode keeps in
            // memory (bounded), so they may fetch nothing.
            if index == 0 {
                assert!(
                    cost.cache_regions_missed > 0 && cost.bytes_fetched > 0,
                    "{cost:?}"
                );
            }
            assert_eq!(cost.cache_regions_hit, 0, "{cost:?}");
        }
    })
    .await
    .unwrap();
}
