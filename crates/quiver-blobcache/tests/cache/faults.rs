//! A store that fails, stalls and truncates on demand: reads fail cleanly with
//! the object key, later reads succeed, and no half-filled region is ever served.

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

use quiver_index::{ByteSource, MemorySource, SearchParams, SearchScratch, Segment};

use crate::support::{cache, put, random_bytes, runtime};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    Error,
    ShortBody,
    Stall,
    FlipByte,
}

#[derive(Debug)]
struct FaultyStore {
    inner: object_store::memory::InMemory,
    fault: Mutex<Fault>,
    gets: AtomicUsize,
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
        let fault = *self.fault.lock().unwrap();
        let is_range = options.range.is_some();
        if is_range {
            self.gets.fetch_add(1, Ordering::SeqCst);
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
            Fault::ShortBody | Fault::FlipByte if is_range => {
                let result = self.inner.get_opts(location, options).await?;
                let (meta, range, attributes) = (
                    result.meta.clone(),
                    result.range.clone(),
                    result.attributes.clone(),
                );
                let mut bytes = result.bytes().await?;
                if fault == Fault::ShortBody {
                    bytes.truncate(bytes.len() / 2);
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
