//! Objects of a `file://` store: mapped straight from their files (no region of
//! the cache used, nothing copied), searched with the same answers as from
//! memory, and still checked against the segment's checksums.

use quiver_blobcache::{BlobCache, BlobCacheConfig, CachedObject};
use quiver_index::{IndexError, MemorySource, SearchParams, SearchScratch, SectionKind, Segment};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

use crate::search::segment_bytes;
use crate::support::{put, runtime};

const KEY: &str = "collections/c/shards/0/segments/s1.qseg";

fn local_storage(root: &std::path::Path) -> Storage {
    Storage::open(
        &StoreUrl::File {
            root: root.to_path_buf(),
        },
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap()
}

fn local_cache(
    runtime: &tokio::runtime::Runtime,
    storage: Storage,
    directory: &std::path::Path,
    map_local_files: bool,
) -> BlobCache {
    let config = BlobCacheConfig {
        directory: directory.to_path_buf(),
        capacity_bytes: 4 << 20,
        region_bytes: 256 << 10,
        map_local_files,
        row_region_bytes: 0,
    };
    BlobCache::new(&config, storage, runtime.handle().clone()).unwrap()
}

#[test]
fn objects_of_a_local_store_are_mapped_and_searched_without_regions() {
    let runtime = runtime();
    let objects = tempfile::tempdir().unwrap();
    let storage = local_storage(objects.path());
    let dim = 64;
    let (bytes, vectors) = segment_bytes(20_000, dim);
    put(&runtime, &storage, KEY, &bytes);
    let cache_directory = tempfile::tempdir().unwrap();
    // Far smaller than the segment: mapped objects do not need the regions.
    let cache = local_cache(&runtime, storage, cache_directory.path(), true);
    assert!(cache.maps_local_files());
    let object: CachedObject = cache.open_blocking(KEY).unwrap();
    assert!(object.is_mapped());
    let read = object.read(4096, 512).unwrap();
    assert!(!read.is_copied(), "a mapped read borrows the file");
    assert_eq!(&read[..], &bytes[4096..4096 + 512]);
    drop(read);
    // Fetching ahead asks the kernel for the pages; ranges past the end are
    // ignored, not an error.
    quiver_index::ByteSource::fetch_ahead(
        &object,
        &[
            (4096, 512),
            (bytes.len() as u64 - 10, 100),
            (u64::MAX - 5, 10),
        ],
    );

    let mapped = Segment::open(object).unwrap();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();
    let params = SearchParams {
        nprobe: Some(8),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    for query in vectors.chunks_exact(dim).step_by(1999) {
        let hits = mapped.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(hits.len(), 10);
        assert_eq!(
            hits,
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        );
        assert_eq!(
            mapped.payload(hits[0].row).unwrap(),
            reference.payload(hits[0].row).unwrap()
        );
    }
    let stats = cache.stats();
    assert_eq!(
        (
            stats.misses,
            stats.resident_regions,
            stats.bytes_fetched,
            stats.fetched_ahead
        ),
        (0, 0, 0, 0),
        "no region was filled: {stats:?}"
    );
}

#[test]
fn with_mapping_off_a_local_store_is_read_through_regions() {
    let runtime = runtime();
    let objects = tempfile::tempdir().unwrap();
    let storage = local_storage(objects.path());
    let (bytes, vectors) = segment_bytes(5_000, 32);
    put(&runtime, &storage, KEY, &bytes);
    let cache_directory = tempfile::tempdir().unwrap();
    let cache = local_cache(&runtime, storage, cache_directory.path(), false);
    assert!(!cache.maps_local_files());
    let object = cache.open_blocking(KEY).unwrap();
    assert!(!object.is_mapped());
    let segment = Segment::open(object).unwrap();
    let mut scratch = SearchScratch::new();
    let hits = segment
        .search(&vectors[..32], &SearchParams::new(5), None, &mut scratch)
        .unwrap();
    assert_eq!(hits.len(), 5);
    assert!(cache.stats().misses > 0, "{:?}", cache.stats());
}

#[test]
fn a_damaged_local_file_is_an_error_naming_the_object() {
    let runtime = runtime();
    let objects = tempfile::tempdir().unwrap();
    let storage = local_storage(objects.path());
    let dim = 32;
    let (bytes, vectors) = segment_bytes(5_000, dim);
    let raw = Segment::open(MemorySource::new("reference", &bytes))
        .unwrap()
        .sections()
        .iter()
        .find(|section| section.kind == SectionKind::RawVectors)
        .copied()
        .unwrap();
    let mut damaged = bytes.clone();
    damaged[(raw.offset + raw.length / 2) as usize] ^= 0x40;
    put(&runtime, &storage, KEY, &damaged);
    let cache_directory = tempfile::tempdir().unwrap();
    let cache = local_cache(&runtime, storage, cache_directory.path(), true);
    let object = cache.open_blocking(KEY).unwrap();
    assert!(object.is_mapped());
    let segment = Segment::open(object).unwrap();
    let mut scratch = SearchScratch::new();
    // An exact search reads every raw vector, the damaged one included.
    let error = segment
        .flat_search(&vectors[..dim], 10, None, &mut scratch)
        .unwrap_err();
    match error {
        IndexError::Corrupted { object, .. } => assert!(object.ends_with(KEY), "{object}"),
        other => panic!("expected a checksum error, got {other}"),
    }
}
