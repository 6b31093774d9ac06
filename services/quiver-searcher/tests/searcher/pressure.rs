//! A cache far smaller than the shard, with more queries in flight than it has
//! regions: every query answers (reads that find every region pinned are served
//! straight from the store), with the same recall as with a large cache.

use quiver_index::SearchScratch;
use quiver_searcher::ShardView;
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

use crate::{Fixture, brute_force, fixture_with_cache, request, vectors};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_smaller_than_the_queries_in_flight_slows_down_and_never_fails() {
    let storage = Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap();
    // Three regions of 16 KiB for a shard of over a MiB, eight searching threads.
    let Fixture {
        live,
        view,
        context,
        ..
    } = fixture_with_cache(storage, 3 * (16 << 10), 16 << 10).await;
    assert!(
        view.segment_bytes() > 20 * 3 * (16 << 10),
        "{}",
        view.segment_bytes()
    );
    let queries = vectors(160, 3);
    tokio::task::spawn_blocking(move || {
        let (found, wanted) = std::thread::scope(|scope| {
            let threads: Vec<_> = queries
                .chunks(20)
                .map(|chunk| {
                    let (view, context, live): (&ShardView, _, _) = (&view, &context, &live);
                    scope.spawn(move || {
                        let mut scratch = SearchScratch::new();
                        let (mut found, mut wanted) = (0, 0);
                        for query in chunk {
                            let hits = view
                                .search(context, &request(query, 10, None), &mut scratch)
                                .expect("a search under cache pressure answers");
                            let truth = brute_force(live, query, 10, |_| true);
                            found += hits
                                .iter()
                                .filter(|hit| {
                                    matches!(hit.id, quiver_index::PointId::U64(id) if truth.contains(&id))
                                })
                                .count();
                            wanted += truth.len();
                        }
                        (found, wanted)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        let recall = found as f64 / wanted as f64;
        assert!(recall >= 0.95, "recall {recall:.3} under cache pressure");
        let stats = context.cache().stats();
        assert!(
            stats.evictions > 0 && stats.uncached_reads > 0,
            "the cache was under pressure: {stats:?}"
        );
        assert_eq!(stats.pinned_regions, 0, "{stats:?}");
    })
    .await
    .unwrap();
}
