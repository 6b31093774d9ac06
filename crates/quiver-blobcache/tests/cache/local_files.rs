//! Objects of a `file://` store: mapped straight from their files (no region of
//! the cache used, nothing copied), searched with the same answers as from
//! memory, and still checked against the segment's checksums.

use quiver_blobcache::{BlobCache, BlobCacheConfig, CachedObject, held_row_bytes};
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

/// Where section `kind` lies in the segment `bytes`.
fn section_of(bytes: &[u8], kind: SectionKind) -> quiver_index::SectionEntry {
    Segment::open(MemorySource::new("reference", bytes))
        .unwrap()
        .sections()
        .iter()
        .find(|section| section.kind == kind)
        .copied()
        .unwrap()
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
    let raw = section_of(&bytes, SectionKind::RawVectors);
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

/// Bytes this process maps with 2 MiB pages from the file at `path`, in its
/// mappings advised `MADV_HUGEPAGE` (`hugepage_advised`) or in all of them
/// (`FilePmdMapped` in `/proc/self/smaps`).
fn huge_mapped_bytes(path: &std::path::Path, hugepage_advised: bool) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let name = path.to_str().unwrap();
    let (mut in_file, mut pmd_kib, mut total) = (false, 0, 0);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            in_file = line.ends_with(name);
        } else if in_file && let Some(value) = line.strip_prefix("FilePmdMapped:") {
            pmd_kib = value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap();
        } else if in_file && let Some(flags) = line.strip_prefix("VmFlags:") {
            // The last line of a mapping's block.
            if !hugepage_advised || flags.split_whitespace().any(|flag| flag == "hg") {
                total += pmd_kib << 10;
            }
            pmd_kib = 0;
        }
    }
    total
}

/// Drops the file's pages from the page cache, as if the machine had
/// restarted or needed the memory for something else.
fn evict(path: &std::path::Path) {
    let file = std::fs::File::open(path).unwrap();
    rustix::fs::fdatasync(&file).unwrap();
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
}

/// A local store in a directory on disk beside the test binary (a tmpfs `/tmp`
/// may not do huge pages) whose files fault in as huge pages, holding
/// segment [`KEY`] of 100,000 rows of 64 dimensions: the directory (kept
/// while it lives), the runtime, the store, the segment's bytes and vectors.
fn huge_page_store() -> (
    tempfile::TempDir,
    tokio::runtime::Runtime,
    Storage,
    Vec<u8>,
    Vec<f32>,
) {
    let exe = std::env::current_exe().unwrap();
    let objects = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
    assert_files_fault_in_huge(objects.path());
    let runtime = runtime();
    let storage = local_storage(objects.path());
    let (bytes, vectors) = segment_bytes(100_000, 64);
    put(&runtime, &storage, KEY, &bytes);
    (objects, runtime, storage, bytes, vectors)
}

#[test]
fn a_local_segment_read_in_cold_maps_its_codes_with_huge_pages() {
    const HUGE: u64 = quiver_index::HUGE_PAGE_BYTES as u64;
    let (_objects, runtime, storage, bytes, vectors) = huge_page_store();
    let dim = 64;
    let path = storage.local_path(KEY).unwrap();
    let codes = section_of(&bytes, SectionKind::Codes);
    let hot_end = (codes.offset + codes.length).div_ceil(HUGE) * HUGE;
    assert!(
        hot_end >= 2 * HUGE,
        "codes end at {} bytes: too few huge pages to tell",
        codes.offset + codes.length
    );
    // Not in the page cache any more (a restart, or memory given to others).
    evict(&path);

    let cache_directory = tempfile::tempdir().unwrap();
    let cache = local_cache(&runtime, storage, cache_directory.path(), true);
    let object = cache.open_blocking(KEY).unwrap();
    assert!(object.is_mapped());
    // What a searcher does with a new segment: ask for its first bytes, open it
    // (the small sections at the file's start are read), warm its codes, search.
    object.prefetch(std::slice::from_ref(&(0..1)));
    let segment = Segment::open(object).unwrap();
    segment
        .source()
        .warm(codes.offset..codes.offset + codes.length)
        .unwrap();
    let mut scratch = SearchScratch::new();
    for query in vectors.chunks_exact(dim).step_by(9_973) {
        segment
            .search(query, &SearchParams::new(10), None, &mut scratch)
            .unwrap();
    }
    // Every huge page from the file's start to the end of the codes (the range
    // the segment advised MADV_HUGEPAGE) is mapped as one: an advice of
    // MADV_WILLNEED, or a read before the mapping was advised, reads them in
    // as small folios, mapped with 4 KiB pages for as long as they stay cached.
    let huge = huge_mapped_bytes(&path, true);
    assert!(
        huge >= hot_end,
        "{huge} bytes of the first {hot_end} (header, centroids, codes) mapped with huge pages"
    );
}

/// Makes sure this kernel and file system fault a file advised `MADV_HUGEPAGE`
/// in as 2 MiB folios (else the huge-page tests cannot say anything: they say
/// so, loudly).
fn assert_files_fault_in_huge(directory: &std::path::Path) {
    const HUGE: usize = quiver_index::HUGE_PAGE_BYTES;
    let probe = directory.join("probe");
    std::fs::write(&probe, vec![7u8; 4 * HUGE]).unwrap();
    evict(&probe);
    let file = std::fs::File::open(&probe).unwrap();
    // SAFETY: the test's own file; nothing writes to it while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    map.advise(memmap2::Advice::HugePage).unwrap();
    let touched: u64 = map.iter().step_by(4096).map(|&byte| byte as u64).sum();
    std::hint::black_box(touched);
    assert!(
        huge_mapped_bytes(&probe, true) >= HUGE as u64,
        "this kernel or file system ({}) does not fault files in as huge pages; \
         the test needs large folios (ext4 or xfs on Linux 6.x)",
        directory.display()
    );
}

/// Rows held in memory (what a searcher does with a mapped segment whose rows
/// fit its memory) are read in as 2 MiB folios and mapped with huge pages, even
/// when the file was cold; rows not held are not advised so (read at random, a
/// small page per cold read). The process-wide count of held bytes follows the
/// objects.
#[test]
fn held_rows_of_a_local_segment_read_in_cold_are_mapped_with_huge_pages() {
    const HUGE: u64 = quiver_index::HUGE_PAGE_BYTES as u64;
    let (_objects, runtime, storage, bytes, vectors) = huge_page_store();
    let dim = 64;
    // The same segment twice: one to search with its rows not held, the other
    // with them held (each file cold when first mapped).
    const HELD_KEY: &str = "collections/c/shards/0/segments/s2.qseg";
    put(&runtime, &storage, HELD_KEY, &bytes);
    let path = storage.local_path(KEY).unwrap();
    let held_path = storage.local_path(HELD_KEY).unwrap();
    let raw = section_of(&bytes, SectionKind::RawVectors);
    // The whole huge pages inside the raw vectors: what holding them advises.
    let held_start = raw.offset.div_ceil(HUGE) * HUGE;
    let held_end = (raw.offset + raw.length) / HUGE * HUGE;
    assert!(
        held_end >= held_start + 4 * HUGE,
        "raw vectors {}..{}: too few huge pages to tell",
        raw.offset,
        raw.offset + raw.length
    );
    let cache_directory = tempfile::tempdir().unwrap();
    let cache = local_cache(&runtime, storage, cache_directory.path(), true);
    let search_all = |segment: &Segment<CachedObject>| {
        let mut scratch = SearchScratch::new();
        for query in vectors.chunks_exact(dim).step_by(997) {
            segment
                .search(query, &SearchParams::new(10), None, &mut scratch)
                .unwrap();
        }
    };
    // Not held: the rows a search rescores come in as small folios.
    evict(&path);
    let segment = Segment::open(cache.open_blocking(KEY).unwrap()).unwrap();
    search_all(&segment);
    let codes_only = huge_mapped_bytes(&path, true);
    assert!(
        codes_only <= held_start,
        "{codes_only} bytes of huge-page ranges mapped huge without holding the rows \
         (they start at {held_start})"
    );
    drop(segment);

    // Held, then warmed: every huge page inside the raw vectors is mapped as one.
    evict(&held_path);
    let held_before = held_row_bytes();
    let segment = Segment::open(cache.open_blocking(HELD_KEY).unwrap()).unwrap();
    let source = segment.source();
    assert!(!source.holds_rows());
    let held = source.hold_rows(raw.offset..raw.offset + raw.length);
    assert_eq!(held, held_end - held_start);
    assert!(source.holds_rows());
    assert_eq!(held_row_bytes(), held_before + held);
    source.warm(raw.offset..raw.offset + raw.length).unwrap();
    search_all(&segment);
    let huge = huge_mapped_bytes(&held_path, true);
    assert!(
        huge >= codes_only + held,
        "{huge} bytes mapped huge: the codes' {codes_only} and all {held} held"
    );
    drop(segment);
    assert_eq!(
        held_row_bytes(),
        held_before,
        "a dropped object holds nothing"
    );
}
