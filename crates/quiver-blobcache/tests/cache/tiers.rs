//! The cache's two tiers: raw vectors and payloads go to small row regions, so
//! rescoring fetches 64 KiB ranges, and raw-vector traffic (an exact search over
//! more vectors than the row tier holds) never evicts the codes.

use std::time::Instant;

use quiver_blobcache::{BlobCache, BlobCacheConfig, ReadCounts};
use quiver_index::{
    ByteSource, MemorySource, SearchParams, SearchScratch, SectionEntry, SectionKind, Segment,
};
use quiver_storage::testing::{FaultConfig, FaultProxy};
use quiver_storage::{Storage, StorageOptions};

use crate::search::segment_bytes;
use crate::support::{memory_storage, put, runtime};

/// A cache of `capacity_bytes` over `storage` with hot regions of `region_bytes`
/// and 64 KiB row regions, in a directory removed when the returned guard drops.
fn two_tier_cache(
    storage: Storage,
    runtime: &tokio::runtime::Runtime,
    capacity_bytes: u64,
    region_bytes: u64,
) -> (tempfile::TempDir, BlobCache) {
    let directory = tempfile::tempdir().unwrap();
    let config = BlobCacheConfig {
        directory: directory.path().to_path_buf(),
        capacity_bytes,
        region_bytes,
        row_region_bytes: 64 << 10,
        map_local_files: true,
    };
    let cache = BlobCache::new(&config, storage, runtime.handle().clone()).unwrap();
    (directory, cache)
}

/// The segment's section of `kind`.
fn section<S: ByteSource>(segment: &Segment<S>, kind: SectionKind) -> SectionEntry {
    segment
        .sections()
        .iter()
        .find(|section| section.kind == kind)
        .copied()
        .unwrap()
}

#[test]
fn row_sections_are_cached_in_small_regions_apart_from_the_codes() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    // 40k rows: 10 MB of raw vectors, more than the 6 MiB row tier.
    let (bytes, vectors) = segment_bytes(40_000, dim);
    put(&runtime, &storage, "segments/tiers.qseg", &bytes);
    // 2 MiB of hot regions: the 16 a split needs.
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    assert_eq!(cache.row_region_bytes(), Some(64 << 10));
    let segment = Segment::open(cache.open_blocking("segments/tiers.qseg").unwrap()).unwrap();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let queries: Vec<&[f32]> = vectors.chunks_exact(dim).step_by(4001).collect();
    let before = ReadCounts::of_this_thread();
    let hot_misses_before = cache.stats_by_tier().0.misses;
    for query in &queries {
        let hits = segment.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(
            hits,
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        );
        assert_eq!(
            segment.payload(hits[0].row).unwrap(),
            reference.payload(hits[0].row).unwrap()
        );
    }
    let (hot, rows) = cache.stats_by_tier();
    let rows = rows.expect("a row tier");
    assert!(
        rows.misses > 0,
        "rescoring read through the row tier: {rows:?}"
    );
    assert!(
        rows.bytes_fetched <= rows.misses * (64 << 10),
        "row fills are at most 64 KiB: {rows:?}"
    );
    let hot_after_searches = hot;
    // The searches' own counts: every fill they caused, also those fetched
    // ahead, split by tier, and the time waited.
    let reads = ReadCounts::of_this_thread().since(before);
    assert!(cache.stats().fetched_ahead > 0, "{:?}", cache.stats());
    assert_eq!(reads.row_misses, rows.misses, "{reads:?} {rows:?}");
    assert_eq!(
        reads.region_misses,
        rows.misses + hot.misses - hot_misses_before,
        "{reads:?}"
    );
    assert!(reads.row_hits > 0, "{reads:?}");
    assert!(reads.store_wait_nanos > 0, "{reads:?}");

    // An exact search reads every raw vector: the row tier churns, the codes stay.
    let exact = segment
        .flat_search(queries[0], 10, None, &mut scratch)
        .unwrap();
    assert_eq!(
        exact,
        reference
            .flat_search(queries[0], 10, None, &mut scratch)
            .unwrap()
    );
    let (hot, rows) = cache.stats_by_tier();
    let rows = rows.unwrap();
    assert!(rows.evictions > 0, "{rows:?}");
    assert_eq!(
        hot.evictions, 0,
        "raw-vector traffic evicted codes: {hot:?}"
    );
    assert_eq!(hot.misses, hot_after_searches.misses, "{hot:?}");
    for query in &queries {
        let hits = segment.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(
            hits,
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        );
    }
    let (hot, _) = cache.stats_by_tier();
    assert_eq!(
        hot.misses, hot_after_searches.misses,
        "the codes were still cached: {hot:?}"
    );
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn a_cache_too_small_to_split_keeps_one_tier() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let config = BlobCacheConfig {
        capacity_bytes: 2 << 20,
        region_bytes: 1 << 20,
        ..BlobCacheConfig::new(directory.path(), 0)
    };
    let cache = BlobCache::new(&config, memory_storage(), runtime.handle().clone()).unwrap();
    assert_eq!(cache.row_region_bytes(), None);
    assert_eq!(cache.stats().total_regions, 2);
}

#[test]
fn a_small_cache_shrinks_its_hot_regions_to_keep_a_row_tier() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    // 128 MiB with the default 16 MiB regions: a 32 MiB hot share would hold
    // 2 of them, so the hot tier takes 16 regions of 2 MiB instead and raw
    // vectors keep their 64 KiB row regions.
    let config = BlobCacheConfig::new(directory.path(), 128 << 20);
    assert_eq!(config.region_bytes, 16 << 20);
    let cache = BlobCache::new(&config, memory_storage(), runtime.handle().clone()).unwrap();
    assert_eq!(cache.row_region_bytes(), Some(64 << 10));
    assert_eq!(cache.region_bytes(), 2 << 20);
    let (hot, rows) = cache.stats_by_tier();
    assert_eq!(hot.total_regions, 16, "{hot:?}");
    assert!(rows.unwrap().total_regions >= 1500);
    // Under 64 MiB a quarter would hold fewer than 16 hot regions of even
    // 1 MiB: the hot tier takes 16 of them and the row tier the rest (not one
    // tier of two 16 MiB regions, which a query's rescoring reads filled with
    // a GiB from the store).
    let small = BlobCacheConfig::new(directory.path().join("small"), 32 << 20);
    let cache = BlobCache::new(&small, memory_storage(), runtime.handle().clone()).unwrap();
    assert_eq!(cache.row_region_bytes(), Some(64 << 10));
    assert_eq!(cache.region_bytes(), 1 << 20);
    let (hot, rows) = cache.stats_by_tier();
    assert_eq!(hot.total_regions, 16, "{hot:?}");
    assert_eq!(rows.unwrap().total_regions, 256);
    // Too small for 64 row regions beside that: one tier, still of 16 regions.
    let tiny = BlobCacheConfig::new(directory.path().join("tiny"), 16 << 20);
    let cache = BlobCache::new(&tiny, memory_storage(), runtime.handle().clone()).unwrap();
    assert_eq!(cache.row_region_bytes(), None);
    assert_eq!(cache.region_bytes(), 1 << 20);
    assert_eq!(cache.stats().total_regions, 16);
}

#[test]
fn warming_rows_fills_the_row_tier_so_rescoring_reads_hit() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    // 4k rows: 1 MB of raw vectors, a quarter of the 4 MiB row tier.
    let (bytes, vectors) = segment_bytes(4_000, dim);
    put(&runtime, &storage, "segments/warm.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    assert!(
        cache.row_tier_bytes() >= 4 << 20,
        "{}",
        cache.row_tier_bytes()
    );
    let segment = Segment::open(cache.open_blocking("segments/warm.qseg").unwrap()).unwrap();
    let raw = section(&segment, SectionKind::RawVectors);
    let hot_before = cache.stats_by_tier().0;
    segment
        .source()
        .warm_rows(raw.offset..raw.offset + raw.length);
    let (hot, rows) = cache.stats_by_tier();
    let rows = rows.expect("a row tier");
    assert!(
        rows.bytes_fetched >= raw.length,
        "the raw vectors are in the row tier: {rows:?}"
    );
    assert_eq!(hot.misses, hot_before.misses, "the hot tier is left alone");
    // A search now rescores from the row tier without fetching.
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let before = ReadCounts::of_this_thread();
    let hits = segment
        .search(&vectors[..dim], &params, None, &mut scratch)
        .unwrap();
    assert!(!hits.is_empty());
    let reads = ReadCounts::of_this_thread().since(before);
    assert!(reads.row_hits > 0, "{reads:?}");
    assert_eq!(reads.row_misses, 0, "{reads:?}");
    // A range the row tier does not serve (the codes) is not warmed there.
    let codes = section(&segment, SectionKind::Codes);
    let rows_before = cache.stats_by_tier().1.unwrap();
    segment
        .source()
        .warm_rows(codes.offset..codes.offset + codes.length);
    assert_eq!(cache.stats_by_tier().1.unwrap().misses, rows_before.misses);
}

#[test]
fn warming_codes_fills_every_region_they_span_once_and_says_how_much_it_fetched() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    let (bytes, vectors) = segment_bytes(20_000, dim);
    put(&runtime, &storage, "segments/codes.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    let segment = Segment::open(cache.open_blocking("segments/codes.qseg").unwrap()).unwrap();
    let codes = section(&segment, SectionKind::Codes);
    assert!(
        codes.length > 4 * (128 << 10),
        "the codes span several regions (several fills in flight): {codes:?}"
    );
    let before = cache.stats_by_tier().0;
    let fetched = segment
        .source()
        .warm(codes.offset..codes.offset + codes.length)
        .unwrap();
    let hot = cache.stats_by_tier().0;
    assert_eq!(
        fetched,
        hot.bytes_fetched - before.bytes_fetched,
        "warm reports what it fetched"
    );
    // Every region the codes span is in: whole regions, the first and last
    // possibly shared with a neighbouring section already read at open.
    assert!(
        fetched + (256 << 10) >= codes.length,
        "{fetched} of {}",
        codes.length
    );
    // Warm again: nothing is left to fetch.
    assert_eq!(
        segment
            .source()
            .warm(codes.offset..codes.offset + codes.length)
            .unwrap(),
        0
    );
    // And a search scans the codes without fetching any.
    let params = SearchParams {
        nprobe: Some(16),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let hot_before = cache.stats_by_tier().0.misses;
    segment
        .search(&vectors[..dim], &params, None, &mut scratch)
        .unwrap();
    assert_eq!(
        cache.stats_by_tier().0.misses,
        hot_before,
        "codes were warm"
    );
}

#[test]
fn warming_rows_reads_a_cold_section_in_a_few_large_requests() {
    let runtime = runtime();
    let Some(server) = quiver_test_support::S3TestServer::from_env("the row warm-up request test")
    else {
        return;
    };
    let (bucket, proxy) = runtime.block_on(async {
        let bucket = server.create_bucket("quiver-warm-rows").await;
        let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
            .await
            .unwrap();
        (bucket, proxy)
    });
    let storage = server.storage_via(
        &proxy.endpoint(),
        &bucket,
        "warm-rows",
        StorageOptions::default(),
    );
    let dim = 64;
    // 32k rows: 8 MiB of raw vectors, 128 row regions of 64 KiB.
    let (bytes, _) = segment_bytes(32_000, dim);
    put(&runtime, &storage, "segments/rows.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 64 << 20, 1 << 20);
    let segment = Segment::open(cache.open_blocking("segments/rows.qseg").unwrap()).unwrap();
    let raw = section(&segment, SectionKind::RawVectors);
    assert!(raw.length >= 8_000_000, "{raw:?}");
    let started = Instant::now();
    segment
        .source()
        .warm_rows(raw.offset..raw.offset + raw.length);
    let window = started..Instant::now();
    let rows = cache.stats_by_tier().1.expect("a row tier");
    assert!(
        rows.bytes_fetched >= raw.length,
        "the raw vectors are in the row tier: {rows:?}"
    );
    // Requests of 4 MiB (one more for a region split at each end), not one
    // round trip per 128 KiB: 64 requests one after another before.
    let gets: Vec<_> = proxy
        .spans(window.clone())
        .into_iter()
        .filter(|span| span.method == "GET")
        .collect();
    let most = raw.length.div_ceil(4 << 20) as usize + 2;
    assert!(
        gets.len() <= most,
        "{} GETs for {} bytes of rows (at most {most}): {:?}",
        gets.len(),
        raw.length,
        gets.iter().map(|span| &span.range).collect::<Vec<_>>()
    );
    let (round_trips, _) = proxy.dependent_round_trips(window);
    assert!(
        round_trips <= most.div_ceil(2) + 1,
        "{round_trips} round trips one after another"
    );
}

#[test]
fn a_cold_search_fetches_the_codes_of_its_lists_together() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    let (bytes, vectors) = segment_bytes(20_000, dim);
    put(&runtime, &storage, "segments/scan.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    let segment = Segment::open(cache.open_blocking("segments/scan.qseg").unwrap()).unwrap();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let params = SearchParams {
        nprobe: Some(64),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let before = cache.stats_by_tier().0;
    let hits = segment
        .search(&vectors[..dim], &params, None, &mut scratch)
        .unwrap();
    assert_eq!(
        hits,
        reference
            .search(&vectors[..dim], &params, None, &mut scratch)
            .unwrap()
    );
    let hot = cache.stats_by_tier().0;
    let (misses, ahead) = (
        hot.misses - before.misses,
        hot.fetched_ahead - before.fetched_ahead,
    );
    assert!(
        misses >= 2,
        "the probed codes span several regions: {hot:?}"
    );
    assert_eq!(
        ahead, misses,
        "every code region the scan needed was fetched ahead, together: {hot:?}"
    );
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn the_hits_ids_payloads_and_vectors_come_in_together_from_both_tiers() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    let (bytes, _) = segment_bytes(40_000, dim);
    put(&runtime, &storage, "segments/hits.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    let segment = Segment::open(cache.open_blocking("segments/hits.qseg").unwrap()).unwrap();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    // Ten hits far apart: each in its own row regions.
    let rows: Vec<u32> = (0..10).map(|hit| hit * 3_989 + 7).collect();
    let before = cache.stats();
    segment.fetch_hits_ahead(&rows, true, true);
    let fetched = cache.stats();
    assert!(
        fetched.fetched_ahead - before.fetched_ahead >= 20,
        "the hits' payloads and vectors were fetched ahead: {fetched:?}"
    );
    assert_eq!(
        fetched.fetched_ahead - before.fetched_ahead,
        fetched.misses - before.misses,
        "every region was fetched ahead, none on its own: {fetched:?}"
    );
    let reads = ReadCounts::of_this_thread();
    for &row in &rows {
        assert_eq!(segment.id(row).unwrap(), reference.id(row).unwrap());
        assert_eq!(
            segment.payload(row).unwrap(),
            reference.payload(row).unwrap()
        );
        assert_eq!(segment.vector(row).unwrap(), reference.vector(row).unwrap());
    }
    let reads = ReadCounts::of_this_thread().since(reads);
    assert_eq!(reads.region_misses, 0, "the hits' reads all hit: {reads:?}");
    assert_eq!(cache.stats().pinned_regions, 0);
}

/// Rows a query fetched ahead stay until it reads them, even when reads in
/// between miss and evict: a fresh fill is used once, the least frequent
/// region there is, and was the first pick of the next eviction whose sample
/// reached it — so one miss among a run's reads evicted another of the run's
/// rows, whose read then missed too (the slowest cold queries of a searcher
/// fetched ~40 rows twice that way, one round trip each).
#[test]
fn rows_fetched_ahead_stay_until_read_while_other_reads_miss() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    // 156 row regions of raw vectors; a row tier of 95.
    let (bytes, _) = segment_bytes(40_000, dim);
    put(&runtime, &storage, "segments/awaited.qseg", &bytes);
    let (_directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
    let tier = cache.stats_by_tier().1.unwrap().total_regions;
    let segment = Segment::open(cache.open_blocking("segments/awaited.qseg").unwrap()).unwrap();
    let raw = section(&segment, SectionKind::RawVectors);
    assert!((tier + 60) * (64 << 10) <= raw.length, "{tier} row regions");
    let row_bytes = dim as u64 * 4;
    let region_row = |region: u64| {
        let row = (region * (64 << 10)).div_ceil(row_bytes);
        (raw.offset + row * row_bytes, row_bytes as usize)
    };
    let read = |region: u64| {
        let (offset, length) = region_row(region);
        segment.source().read_at(offset, length).unwrap();
    };
    // The tier full of rows read twice each (the reads of earlier queries).
    for region in 0..tier {
        read(region);
        read(region);
    }
    // A run of 40 rows fetched ahead, then 20 other rows read, each a miss
    // that evicts, before the run's rows are read.
    let run: Vec<(u64, usize)> = (tier..tier + 40).map(region_row).collect();
    let before = ReadCounts::of_this_thread();
    segment.source().fetch_ahead(&run);
    assert_eq!(ReadCounts::of_this_thread().since(before).row_misses, 40);
    for region in tier + 40..tier + 60 {
        read(region);
    }
    let before = ReadCounts::of_this_thread();
    for &(offset, length) in &run {
        segment.source().read_at(offset, length).unwrap();
    }
    let reads = ReadCounts::of_this_thread().since(before);
    assert_eq!(
        reads.row_misses, 0,
        "every row fetched ahead was still in when read: {reads:?}"
    );
    // Read, they are ordinary regions again: enough misses evict them.
    for region in (0..tier).chain(tier + 40..tier + 60) {
        read(region);
    }
    let before = ReadCounts::of_this_thread();
    for &(offset, length) in &run {
        segment.source().read_at(offset, length).unwrap();
    }
    assert!(ReadCounts::of_this_thread().since(before).row_misses > 0);
    assert_eq!(cache.stats().pinned_regions, 0);
}

/// A row tier of 64 KiB regions whose first 25 hold rows read before (by
/// earlier queries) and the rest rows query A fetched ahead and has not read
/// yet (A's last fill, the tier's last, is a decay pass: the marks outlive it).
struct TierAwaitedByA {
    segment: std::sync::Arc<Segment<quiver_blobcache::CachedObject>>,
    cache: BlobCache,
    _directory: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
    /// Regions in the row tier.
    tier: u64,
    raw: SectionEntry,
    row_bytes: u64,
}

impl TierAwaitedByA {
    fn new(key: &str) -> Self {
        let runtime = runtime();
        let storage = memory_storage();
        let dim = 64;
        let (bytes, _) = segment_bytes(40_000, dim);
        put(&runtime, &storage, key, &bytes);
        let (directory, cache) = two_tier_cache(storage, &runtime, 8 << 20, 128 << 10);
        let tier = cache.stats_by_tier().1.unwrap().total_regions;
        let segment =
            std::sync::Arc::new(Segment::open(cache.open_blocking(key).unwrap()).unwrap());
        let raw = section(&segment, SectionKind::RawVectors);
        assert!((tier + 40) * (64 << 10) <= raw.length, "{tier} row regions");
        let tier_awaited = TierAwaitedByA {
            segment,
            cache,
            _directory: directory,
            _runtime: runtime,
            tier,
            raw,
            row_bytes: dim as u64 * 4,
        };
        for region in 0..25 {
            tier_awaited.read(&[tier_awaited.row(region)]);
        }
        tier_awaited
            .segment
            .source()
            .fetch_ahead(&tier_awaited.first());
        tier_awaited
    }

    /// The first row of raw-vector region `region`.
    fn row(&self, region: u64) -> (u64, usize) {
        let row = (region * (64 << 10)).div_ceil(self.row_bytes);
        (
            self.raw.offset + row * self.row_bytes,
            self.row_bytes as usize,
        )
    }

    /// A's rows: one in each region of the tier but the first 25.
    fn first(&self) -> Vec<(u64, usize)> {
        (25..self.tier).map(|region| self.row(region)).collect()
    }

    /// B's run: 40 rows of regions not cached.
    fn second(&self) -> Vec<(u64, usize)> {
        (self.tier..self.tier + 40)
            .map(|region| self.row(region))
            .collect()
    }

    /// Reads `rows`; returns what it took.
    fn read(&self, rows: &[(u64, usize)]) -> ReadCounts {
        let before = ReadCounts::of_this_thread();
        for &(offset, length) in rows {
            self.segment.source().read_at(offset, length).unwrap();
        }
        ReadCounts::of_this_thread().since(before)
    }

    /// Fetches `rows` ahead; returns what it took.
    fn fetch_ahead(&self, rows: &[(u64, usize)]) -> ReadCounts {
        let before = ReadCounts::of_this_thread();
        self.segment.source().fetch_ahead(rows);
        ReadCounts::of_this_thread().since(before)
    }
}

/// A query's round never evicts the rows another query fetched ahead and has
/// not read yet: with the row tier mostly awaited by one query, a second
/// query's round claims what else can go and stops; the first query then reads
/// every row it fetched, and the second fetches the rest of its own as it reads.
#[test]
fn a_round_stops_at_rows_another_query_awaits_instead_of_evicting_them() {
    let tier = TierAwaitedByA::new("segments/rounds.qseg");
    // Query B fetches a run of 40 ahead: only the 25 regions nobody awaits
    // can go.
    let fetched = tier.fetch_ahead(&tier.second());
    assert_eq!(
        fetched.row_misses, 25,
        "B's round took what A does not await: {fetched:?}"
    );
    let reads = tier.read(&tier.first());
    assert_eq!(
        reads.row_misses, 0,
        "A read every row it fetched ahead: {reads:?}"
    );
    // B reads its run: the 25 fetched are in, the other 15 fetched now.
    let reads = tier.read(&tier.second());
    assert_eq!(reads.row_misses, 15, "{reads:?}");
    let stats = tier.cache.stats();
    assert_eq!(stats.awaited_evictions, 0, "{stats:?}");
    assert_eq!(
        stats.fetch_ahead_left, 15,
        "B's second round stopped: {stats:?}"
    );
    assert_eq!(stats.pinned_regions, 0);
}

/// What a round could not take (every region it could evict awaited by
/// another query) goes in its next round, once that query has read its rows:
/// query B's second round stops at A's rows; A reads them while B waits for
/// that round; B's third round takes the rest, and B's reads all hit.
#[test]
fn a_round_left_at_awaited_rows_goes_in_the_next_round_once_they_are_read() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// On the thread's second wait for the store, A reads its rows.
    struct AReadsOnSecondWait {
        waits: AtomicUsize,
        segment: Arc<Segment<quiver_blobcache::CachedObject>>,
        first: Vec<(u64, usize)>,
    }
    impl quiver_blobcache::StoreWaitObserver for AReadsOnSecondWait {
        fn waiting(&self) {
            if self.waits.fetch_add(1, Ordering::SeqCst) == 1 {
                for &(offset, length) in &self.first {
                    self.segment.source().read_at(offset, length).unwrap();
                }
            }
        }
        fn resumed(&self) {}
    }

    let tier = TierAwaitedByA::new("segments/retried.qseg");
    let observer = Arc::new(AReadsOnSecondWait {
        waits: AtomicUsize::new(0),
        segment: tier.segment.clone(),
        first: tier.first(),
    });
    quiver_blobcache::observe_store_waits(Some(observer.clone()));
    let fetched = tier.fetch_ahead(&tier.second());
    quiver_blobcache::observe_store_waits(None);
    assert_eq!(
        observer.waits.load(Ordering::SeqCst),
        3,
        "rounds of 23, 2 (stopped at A's rows) and 15"
    );
    assert_eq!(fetched.row_misses, 40, "{fetched:?}");
    let reads = tier.read(&tier.second());
    assert_eq!(reads.row_misses, 0, "all of B's run came ahead: {reads:?}");
    let stats = tier.cache.stats();
    assert_eq!(stats.fetch_ahead_left, 0, "{stats:?}");
    assert_eq!(stats.awaited_evictions, 0, "{stats:?}");
    assert_eq!(stats.pinned_regions, 0);
}

/// The hits of a search over several segments come in two waits in all (ids,
/// payload offsets and vectors from both tiers; then the payload texts), not
/// two or three per segment.
#[test]
fn the_hits_of_several_segments_come_in_two_waits_in_all() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    let (bytes, _) = segment_bytes(40_000, dim);
    let keys = ["segments/a.qseg", "segments/b.qseg", "segments/c.qseg"];
    for key in keys {
        put(&runtime, &storage, key, &bytes);
    }
    let (_directory, cache) = two_tier_cache(storage, &runtime, 16 << 20, 128 << 10);
    let segments: Vec<_> = keys
        .iter()
        .map(|key| Segment::open(cache.open_blocking(key).unwrap()).unwrap())
        .collect();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    // Four hits far apart in each segment, each in its own row regions.
    let rows: Vec<Vec<u32>> = (0..3u32)
        .map(|of| (0..4).map(|hit| hit * 9_973 + of * 1_999 + 11).collect())
        .collect();
    let hits: Vec<_> = segments
        .iter()
        .zip(&rows)
        .map(|(segment, rows)| (segment, rows.as_slice()))
        .collect();
    let before = ReadCounts::of_this_thread();
    Segment::fetch_hits_ahead_together(&hits, true, true);
    let fetched = ReadCounts::of_this_thread().since(before);
    assert!(fetched.row_misses >= 24, "{fetched:?}");
    assert_eq!(
        fetched.store_waits, 2,
        "two rounds over three segments and both tiers: {fetched:?}"
    );
    let before = ReadCounts::of_this_thread();
    for (segment, rows) in &hits {
        for &row in *rows {
            assert_eq!(segment.id(row).unwrap(), reference.id(row).unwrap());
            assert_eq!(
                segment.payload(row).unwrap(),
                reference.payload(row).unwrap()
            );
            assert_eq!(segment.vector(row).unwrap(), reference.vector(row).unwrap());
        }
    }
    let read = ReadCounts::of_this_thread().since(before);
    assert_eq!(read.store_waits, 0, "the hits' reads all hit: {read:?}");
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn rows_fetched_ahead_together_come_in_one_wait_and_stay_for_their_reads() {
    let runtime = runtime();
    let storage = memory_storage();
    let dim = 64;
    let (bytes, _) = segment_bytes(40_000, dim);
    put(&runtime, &storage, "segments/run.qseg", &bytes);
    // A row tier of 64 KiB regions, more than 320 of them; the segment's raw
    // vectors span 160.
    let (_directory, cache) = two_tier_cache(storage, &runtime, 40 << 20, 128 << 10);
    let row_regions = cache.stats_by_tier().1.unwrap().total_regions;
    assert!(row_regions > 320, "{row_regions} row regions");
    let segment = Segment::open(cache.open_blocking("segments/run.qseg").unwrap()).unwrap();
    let raw = section(&segment, SectionKind::RawVectors);
    let row_bytes = dim as u64 * 4;
    // 80 rows in 80 different row regions: more than one fetch's requests in
    // flight at a time (16), fewer than a quarter of the tier.
    let rows: Vec<u64> = (0..80).map(|i| i * 2 * (64 << 10) / row_bytes).collect();
    let ranges: Vec<(u64, usize)> = rows
        .iter()
        .map(|row| (raw.offset + row * row_bytes, row_bytes as usize))
        .collect();
    let before = ReadCounts::of_this_thread();
    segment.source().fetch_ahead(&ranges);
    let fetched = ReadCounts::of_this_thread().since(before);
    assert_eq!(fetched.row_misses, 80, "{fetched:?}");
    assert_eq!(
        fetched.store_waits, 1,
        "claimed together, fetched 16 requests at a time, waited for once: {fetched:?}"
    );
    let before = ReadCounts::of_this_thread();
    for &(offset, length) in &ranges {
        segment.source().read_at(offset, length).unwrap();
    }
    let read = ReadCounts::of_this_thread().since(before);
    assert_eq!(read.row_misses, 0, "every row was still in: {read:?}");
    assert_eq!(read.store_waits, 0, "{read:?}");
    assert_eq!(cache.stats().pinned_regions, 0);
}
