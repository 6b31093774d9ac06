//! A store that fails, stalls, truncates and damages on demand: reads fail
//! cleanly with the object key, later reads succeed, no half-filled region is ever
//! served, and no damaged bytes either — also when a region is fetched again after
//! an eviction.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use quiver_storage::{Storage, StorageOptions};

use quiver_blobcache::{BlobCache, BlobCacheConfig, CachedObject};
use quiver_index::{
    ByteSource, Hit, IndexErrorKind, MemorySource, SearchParams, SearchScratch, Segment,
};

use quiver_test_support::Tmpfs;

use crate::support::{cache, put, random_bytes, runtime};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    Error,
    ShortBody,
    Stall,
    FlipByte,
    /// Damages every ranged read of a range that was read before.
    DamageRefetches,
    /// Damages the next ranged read of a range that was read before, once.
    DamageNextRefetch,
    /// The damage itself: many bytes changed, the length kept.
    Damage,
}

#[derive(Debug)]
struct FaultyStore {
    inner: object_store::memory::InMemory,
    fault: Mutex<Fault>,
    gets: AtomicUsize,
    /// Ranged reads so far, by object and range.
    reads_by_range: Mutex<HashMap<String, usize>>,
    /// Ranged reads damaged so far.
    damaged: AtomicUsize,
    /// How long each ranged read takes (none by default).
    delay: Mutex<Duration>,
    /// Ranged reads in flight now, and the most seen at once.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// Counts a ranged read in flight for as long as it lives.
struct InFlight<'a>(&'a FaultyStore);

impl<'a> InFlight<'a> {
    fn new(store: &'a FaultyStore) -> Self {
        let now = store.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        store.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(store)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultyStore {
    /// Returns the fault for the next ranged read of `range` of `location`.
    fn fault_for(&self, location: &Path, range: &Option<object_store::GetRange>) -> Fault {
        let Some(range) = range else {
            return *self.fault.lock().unwrap();
        };
        let read_before = {
            let mut reads = self.reads_by_range.lock().unwrap();
            let count = reads.entry(format!("{location} {range:?}")).or_insert(0);
            *count += 1;
            *count > 1
        };
        let mut fault = self.fault.lock().unwrap();
        let chosen = match *fault {
            Fault::DamageRefetches | Fault::DamageNextRefetch if !read_before => Fault::None,
            Fault::DamageRefetches => Fault::Damage,
            Fault::DamageNextRefetch => {
                *fault = Fault::None;
                Fault::Damage
            }
            other => other,
        };
        if chosen == Fault::Damage {
            self.damaged.fetch_add(1, Ordering::SeqCst);
        }
        chosen
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "FaultyStore")
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let fault = self.fault_for(location, &options.range);
        let is_range = options.range.is_some();
        let _in_flight = is_range.then(|| InFlight::new(self));
        if is_range {
            self.gets.fetch_add(1, Ordering::SeqCst);
            let delay = *self.delay.lock().unwrap();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        match fault {
            Fault::Error if is_range => Err(object_store::Error::Generic {
                store: "faulty",
                source: "injected 503 slow down".into(),
            }),
            Fault::Stall if is_range => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                self.inner.get_opts(location, options).await
            }
            Fault::ShortBody | Fault::FlipByte | Fault::Damage if is_range => {
                let result = self.inner.get_opts(location, options).await?;
                let (meta, range, attributes) = (
                    result.meta.clone(),
                    result.range.clone(),
                    result.attributes.clone(),
                );
                let mut bytes = result.bytes().await?;
                if fault == Fault::ShortBody {
                    bytes.truncate(bytes.len() / 2);
                } else if fault == Fault::Damage {
                    let mut damaged = bytes.to_vec();
                    for byte in damaged.iter_mut().step_by(61) {
                        *byte ^= 0xa5;
                    }
                    bytes = Bytes::from(damaged);
                } else {
                    let mut flipped = bytes.to_vec();
                    let middle = flipped.len() / 2;
                    flipped[middle] ^= 0x10;
                    bytes = Bytes::from(flipped);
                }
                let stream =
                    futures_util::stream::once(
                        async move { Ok::<Bytes, object_store::Error>(bytes) },
                    )
                    .boxed();
                Ok(GetResult {
                    payload: GetResultPayload::Stream(stream),
                    meta,
                    range,
                    attributes,
                    extensions: Default::default(),
                })
            }
            _ => self.inner.get_opts(location, options).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Returns a healthy faulty store and a storage over it with `timeout` per operation.
fn faulty_storage(timeout: Duration) -> (Arc<FaultyStore>, Storage) {
    let faulty = Arc::new(FaultyStore {
        inner: object_store::memory::InMemory::new(),
        fault: Mutex::new(Fault::None),
        gets: AtomicUsize::new(0),
        reads_by_range: Mutex::new(HashMap::new()),
        damaged: AtomicUsize::new(0),
        delay: Mutex::new(Duration::ZERO),
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
    });
    let options = StorageOptions {
        operation_timeout: timeout,
        ..Default::default()
    };
    (
        faulty.clone(),
        Storage::from_store(faulty, "faulty://", options),
    )
}

#[test]
fn failed_fills_leave_nothing_behind_and_later_reads_succeed() {
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_millis(500));
    let bytes = random_bytes(400_000, 3);
    put(&runtime, &storage, "segments/s.qseg", &bytes);
    let directory = tempfile::tempdir().unwrap();
    let cache = cache(&runtime, storage, directory.path(), 4, 64 << 10);
    let object = cache.open_blocking("segments/s.qseg").unwrap();
    // Each fault on a region that is not cached yet.
    for (fault, offset) in [
        (Fault::Error, 100_000u64),
        (Fault::ShortBody, 200_000),
        (Fault::Stall, 300_000),
    ] {
        *faulty.fault.lock().unwrap() = fault;
        let error = object
            .read(offset, 5_000)
            .err()
            .unwrap_or_else(|| panic!("{fault:?} must fail the read"));
        let message = error.to_string();
        assert!(message.contains("segments/s.qseg"), "{fault:?}: {message}");
        let stats = cache.stats();
        assert_eq!(stats.pinned_regions, 0, "{fault:?}: {stats:?}");
        *faulty.fault.lock().unwrap() = Fault::None;
        let read = object.read(offset, 5_000).unwrap();
        let start = offset as usize;
        assert!(
            read[..] == bytes[start..start + 5_000],
            "{fault:?}: a retry returns the right bytes"
        );
    }
    assert_eq!(cache.stats().fill_errors, 3);
}

#[test]
fn concurrent_readers_of_one_missing_region_share_one_fill_and_its_error() {
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_millis(400));
    let bytes = random_bytes(200_000, 4);
    put(&runtime, &storage, "one", &bytes);
    let directory = tempfile::tempdir().unwrap();
    let cache = cache(&runtime, storage, directory.path(), 4, 64 << 10);
    let object = cache.open_blocking("one").unwrap();
    // A stalled fill: every reader waits for it and gets its timeout error.
    *faulty.fault.lock().unwrap() = Fault::Stall;
    let before = faulty.gets.load(Ordering::SeqCst);
    let errors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|_| scope.spawn(|| object.read(10, 100).err().map(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("every reader sees the failure"))
            .collect()
    });
    assert!(
        errors
            .iter()
            .all(|e| e.contains("one") && e.contains("timed out")),
        "{errors:?}"
    );
    let stalled_gets = faulty.gets.load(Ordering::SeqCst) - before;
    assert!(
        stalled_gets <= 6,
        "at most one fetch per failed attempt, got {stalled_gets}"
    );
    // Healthy again: concurrent readers share a single fetch.
    *faulty.fault.lock().unwrap() = Fault::None;
    let before = faulty.gets.load(Ordering::SeqCst);
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| assert!(object.read(10, 100).unwrap()[..] == bytes[10..110]));
        }
    });
    assert_eq!(
        faulty.gets.load(Ordering::SeqCst) - before,
        1,
        "single flight"
    );
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn a_changed_object_is_never_served_from_the_old_regions() {
    let runtime = runtime();
    let storage = crate::support::memory_storage();
    let directory = tempfile::tempdir().unwrap();
    put(&runtime, &storage, "mutable", &[1u8; 5000]);
    let cache = cache(&runtime, storage.clone(), directory.path(), 4, 4096);
    let old = cache.open_blocking("mutable").unwrap();
    assert_eq!(old.read(0, 4).unwrap()[..], [1, 1, 1, 1]);
    put(&runtime, &storage, "mutable", &[2u8; 5000]);
    let new = cache.open_blocking("mutable").unwrap();
    assert_eq!(new.read(0, 4).unwrap()[..], [2, 2, 2, 2]);
}

#[test]
fn a_region_damaged_on_its_way_in_is_dropped_and_fetched_again() {
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_secs(5));
    let dim = 32;
    let (bytes, vectors) = crate::search::segment_bytes(4_000, dim);
    put(&runtime, &storage, "segments/damaged.qseg", &bytes);
    let directory = tempfile::tempdir().unwrap();
    let cache = cache(&runtime, storage, directory.path(), 64, 16 << 10);
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let cached = Segment::open(cache.open_blocking("segments/damaged.qseg").unwrap()).unwrap();
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let query = &vectors[dim * 7..dim * 8];
    let wanted = reference
        .search(query, &params, None, &mut scratch)
        .unwrap();

    // Every fill flips a byte: the search fails naming the segment, and the
    // damaged regions are dropped rather than kept.
    *faulty.fault.lock().unwrap() = Fault::FlipByte;
    let error = cached
        .search(query, &params, None, &mut scratch)
        .unwrap_err();
    assert!(
        error.to_string().contains("segments/damaged.qseg"),
        "{error}"
    );
    assert!(cache.stats().discarded_regions >= 1, "{:?}", cache.stats());

    // The store healthy again: the same search answers, and exactly.
    *faulty.fault.lock().unwrap() = Fault::None;
    let hits = cached.search(query, &params, None, &mut scratch).unwrap();
    assert_eq!(hits, wanted);
    for query in vectors.chunks_exact(dim).step_by(331) {
        assert_eq!(
            cached.search(query, &params, None, &mut scratch).unwrap(),
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        );
    }

    // A session that holds a region when it is dropped refuses to read from it;
    // a new session reads the fresh copy.
    let object = cache.open_blocking("segments/damaged.qseg").unwrap();
    let session = object.session();
    assert_eq!(&session.read(100, 8).unwrap()[..], &bytes[100..108]);
    object.discard(0, 10);
    let error = session.read(100, 8).unwrap_err();
    assert!(error.to_string().contains("fetched again"), "{error}");
    drop(session);
    assert_eq!(
        &object.session().read(100, 8).unwrap()[..],
        &bytes[100..108]
    );
    assert_eq!(cache.stats().pinned_regions, 0);
}

/// The outcome of every query on every segment, in turn: each query's search of
/// one segment evicts the regions the other's search needed.
fn search_in_turn(
    segments: &[(&str, Segment<CachedObject>)],
    queries: &[&[f32]],
    params: &SearchParams,
) -> Vec<(String, quiver_index::IndexResult<Vec<Hit>>)> {
    let mut scratch = SearchScratch::new();
    queries
        .iter()
        .flat_map(|query| segments.iter().map(move |segment| (query, segment)))
        .map(|(query, (key, segment))| {
            (
                key.to_string(),
                segment.search(query, params, None, &mut scratch),
            )
        })
        .collect()
}

/// Checks that every search answered exactly `wanted` (per query, in turn) or
/// failed as a damaged object naming its key; returns how many failed.
fn answered_right_or_refused(
    outcomes: Vec<(String, quiver_index::IndexResult<Vec<Hit>>)>,
    wanted: &[Vec<Hit>],
    per_query: usize,
) -> usize {
    let mut refused = 0;
    for (index, (key, outcome)) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(hits) => assert_eq!(hits, wanted[index / per_query], "{key}, search {index}"),
            Err(error) => {
                assert_eq!(error.kind(), IndexErrorKind::Corrupted, "{key}: {error}");
                assert!(error.to_string().contains(&key), "names {key}: {error}");
                refused += 1;
            }
        }
    }
    refused
}

#[test]
fn a_small_region_fetched_again_after_an_eviction_is_checked_again() {
    // Regions much smaller than the 1 MiB chunks: a check reads the rest of a
    // chunk from the neighbouring regions, filling them.
    fetched_again_after_an_eviction_is_checked_again(2_000, 32, 16 << 10);
}

#[test]
fn a_large_region_fetched_again_after_an_eviction_is_checked_again() {
    // Regions of one chunk's size over sections of several chunks: a chunk's
    // small part in a region not cached is fetched alone for the check.
    fetched_again_after_an_eviction_is_checked_again(3_000, 256, 1 << 20);
}

fn fetched_again_after_an_eviction_is_checked_again(rows: usize, dim: usize, region_bytes: u64) {
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_secs(5));
    let (bytes, vectors) = crate::search::segment_bytes(rows, dim);
    let keys = ["segments/first.qseg", "segments/second.qseg"];
    for key in keys {
        put(&runtime, &storage, key, &bytes);
    }
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let queries: Vec<&[f32]> = vectors.chunks_exact(dim).step_by(331).take(4).collect();
    // Room for the regions one segment's searches read and a little more:
    // searching one evicts the other.
    let touched = {
        let directory = tempfile::tempdir().unwrap();
        let regions = (bytes.len() as u64).div_ceil(region_bytes) + 2;
        let probe = cache(
            &runtime,
            storage.clone(),
            directory.path(),
            regions,
            region_bytes,
        );
        let segment = Segment::open(probe.open_blocking(keys[0]).unwrap()).unwrap();
        search_in_turn(&[(keys[0], segment)], &queries, &params);
        probe.stats().misses
    };
    let directory = tempfile::tempdir().unwrap();
    let cache = cache(
        &runtime,
        storage,
        directory.path(),
        touched + 2,
        region_bytes,
    );
    let segments: Vec<(&str, Segment<CachedObject>)> = keys
        .iter()
        .map(|key| {
            (
                *key,
                Segment::open(cache.open_blocking(key).unwrap()).unwrap(),
            )
        })
        .collect();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let mut scratch = SearchScratch::new();
    let wanted: Vec<Vec<Hit>> = queries
        .iter()
        .map(|query| {
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        })
        .collect();

    // Healthy: right answers, and the two segments do evict each other.
    let outcomes = search_in_turn(&segments, &queries, &params);
    assert_eq!(answered_right_or_refused(outcomes, &wanted, 2), 0);
    let healthy = cache.stats();
    assert!(healthy.evictions > 0, "{healthy:?}");
    assert_eq!(healthy.discarded_regions, 0, "{healthy:?}");

    // One fetch-again damaged: that fill fails its check, is dropped and fetched
    // once more, and every answer is still exactly right.
    *faulty.fault.lock().unwrap() = Fault::DamageNextRefetch;
    let outcomes = search_in_turn(&segments, &queries, &params);
    assert_eq!(
        faulty.damaged.load(Ordering::SeqCst),
        1,
        "a region was fetched again"
    );
    assert_eq!(answered_right_or_refused(outcomes, &wanted, 2), 0);
    let healed = cache.stats();
    assert!(
        healed.discarded_regions > healthy.discarded_regions,
        "the damaged fill was dropped: {healed:?}"
    );

    // Every fetch-again damaged: a search needing a region fetched again fails
    // naming the segment (never answers from the damaged bytes).
    *faulty.fault.lock().unwrap() = Fault::DamageRefetches;
    let outcomes = search_in_turn(&segments, &queries, &params);
    assert!(answered_right_or_refused(outcomes, &wanted, 2) > 0);
    let damaged = cache.stats();
    assert!(
        damaged.discarded_regions >= healed.discarded_regions + 2,
        "{damaged:?}"
    );

    // Healthy again: right answers from fresh copies.
    *faulty.fault.lock().unwrap() = Fault::None;
    let outcomes = search_in_turn(&segments, &queries, &params);
    assert_eq!(answered_right_or_refused(outcomes, &wanted, 2), 0);
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn a_read_through_cache_checks_every_read() {
    // A disk too small for the cache file: every read goes to the store.
    let Some(mount) = Tmpfs::mount_temporary(64 << 10) else {
        return;
    };
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_secs(5));
    let dim = 32;
    let (bytes, vectors) = crate::search::segment_bytes(1_000, dim);
    let key = "segments/read-through.qseg";
    put(&runtime, &storage, key, &bytes);
    let config = BlobCacheConfig {
        directory: mount.path().join("cache"),
        capacity_bytes: 1 << 20,
        region_bytes: 16 << 10,
        map_local_files: true,
        row_region_bytes: 0,
    };
    let open = || {
        let cache =
            BlobCache::new_or_read_through(&config, storage.clone(), runtime.handle().clone())
                .unwrap();
        assert!(cache.is_read_through());
        let segment = Segment::open(cache.open_blocking(key).unwrap()).unwrap();
        (cache, segment)
    };
    let (_, segment) = open();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let params = SearchParams {
        nprobe: Some(4),
        ..SearchParams::new(5)
    };
    let query = &vectors[dim * 3..dim * 4];
    let mut scratch = SearchScratch::new();
    let wanted = reference
        .search(query, &params, None, &mut scratch)
        .unwrap();
    assert_eq!(
        segment.search(query, &params, None, &mut scratch).unwrap(),
        wanted
    );

    // Checked chunks stay in memory: searching again fetches nothing, so
    // nothing can be damaged.
    *faulty.fault.lock().unwrap() = Fault::DamageRefetches;
    assert_eq!(
        segment.search(query, &params, None, &mut scratch).unwrap(),
        wanted
    );
    assert_eq!(faulty.damaged.load(Ordering::SeqCst), 0);

    // Another read-through cache fetches the chunks again: damaged once, a
    // chunk is fetched once more.
    *faulty.fault.lock().unwrap() = Fault::None;
    let (cache, segment) = open();
    *faulty.fault.lock().unwrap() = Fault::DamageNextRefetch;
    assert_eq!(
        segment.search(query, &params, None, &mut scratch).unwrap(),
        wanted
    );
    assert_eq!(faulty.damaged.load(Ordering::SeqCst), 1);
    assert_eq!(cache.stats().discarded_regions, 1);

    *faulty.fault.lock().unwrap() = Fault::None;
    let (_, segment) = open();
    *faulty.fault.lock().unwrap() = Fault::DamageRefetches;
    let error = segment
        .search(query, &params, None, &mut scratch)
        .unwrap_err();
    assert_eq!(error.kind(), IndexErrorKind::Corrupted, "{error}");
    assert!(error.to_string().contains(key), "{error}");
}

#[test]
fn a_fetch_ahead_puts_its_fills_in_flight_together_and_a_failed_one_leaves_nothing() {
    let runtime = runtime();
    let (faulty, storage) = faulty_storage(Duration::from_secs(5));
    let region = 64u64 << 10;
    // 21 regions, the last one short.
    let bytes = random_bytes(20 * region as usize + 1_000, 11);
    put(&runtime, &storage, "segments/ahead.qseg", &bytes);
    let directory = tempfile::tempdir().unwrap();
    let cache = cache(&runtime, storage, directory.path(), 32, region);
    let object = cache.open_blocking("segments/ahead.qseg").unwrap();
    *faulty.delay.lock().unwrap() = Duration::from_millis(100);
    // Eight regions, one range each, none cached: one request each, all in flight
    // at once (not one after the other), and the reads that follow are hits.
    let ranges: Vec<(u64, usize)> = (0..8).map(|i| (i * 2 * region + 100, 1_000)).collect();
    let gets_before = faulty.gets.load(Ordering::SeqCst);
    object.fetch_ahead(&ranges);
    assert_eq!(faulty.gets.load(Ordering::SeqCst) - gets_before, 8);
    assert_eq!(faulty.max_in_flight.load(Ordering::SeqCst), 8);
    assert_eq!(cache.stats().fetched_ahead, 8);
    let misses = cache.stats().misses;
    for &(offset, length) in &ranges {
        let read = object.read(offset, length).unwrap();
        assert_eq!(&read[..], &bytes[offset as usize..offset as usize + length]);
    }
    assert_eq!(
        cache.stats().misses,
        misses,
        "fetched ahead: every read hits"
    );
    assert_eq!(cache.stats().pinned_regions, 0);

    // Neighbouring regions, the object's short last one among them: one request.
    let neighbours: Vec<(u64, usize)> = (17..=20).map(|i| (i * region + 10, 900)).collect();
    let gets_before = faulty.gets.load(Ordering::SeqCst);
    object.fetch_ahead(&neighbours);
    assert_eq!(faulty.gets.load(Ordering::SeqCst) - gets_before, 1);
    assert_eq!(cache.stats().pinned_regions, 0);
    let misses = cache.stats().misses;
    for &(offset, length) in &neighbours {
        let read = object.read(offset, length).unwrap();
        assert_eq!(&read[..], &bytes[offset as usize..offset as usize + length]);
    }
    let tail = object.read(20 * region, 1_000).unwrap();
    assert_eq!(&tail[..], &bytes[20 * region as usize..]);
    drop(tail);
    assert_eq!(
        cache.stats().misses,
        misses,
        "fetched ahead: every read hits"
    );
    assert_eq!(cache.stats().pinned_regions, 0);

    // Failing fetches ahead leave no region behind: the reads fetch again, and
    // succeed once the store does.
    *faulty.delay.lock().unwrap() = Duration::ZERO;
    *faulty.fault.lock().unwrap() = Fault::Error;
    let failing: Vec<(u64, usize)> = (0..4).map(|i| ((i * 2 + 1) * region, 10)).collect();
    let resident = cache.stats().resident_regions;
    object.fetch_ahead(&failing);
    assert_eq!(cache.stats().resident_regions, resident);
    assert_eq!(cache.stats().pinned_regions, 0);
    let error = object.read(failing[0].0, 10).unwrap_err();
    assert!(error.to_string().contains("segments/ahead.qseg"), "{error}");
    *faulty.fault.lock().unwrap() = Fault::None;
    for &(offset, length) in &failing {
        let read = object.read(offset, length).unwrap();
        assert_eq!(&read[..], &bytes[offset as usize..offset as usize + length]);
    }
    assert_eq!(cache.stats().pinned_regions, 0);
}
