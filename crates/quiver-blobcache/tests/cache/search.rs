//! A real segment in object storage, searched through the cache with the index's
//! own code: same answers as from memory, only the regions the query touches are
//! fetched, and reads are zero copy.

use quiver_blobcache::CachedObject;
use quiver_index::{
    IdType, MemorySource, Metric, PointId, SearchParams, SearchScratch, Segment, SegmentSpec,
    SegmentWriter,
};
use rand::{Rng, SeedableRng};

use crate::support::{cache, memory_storage, put, runtime, s3_storage};

pub(crate) fn segment_bytes(rows: usize, dim: usize) -> (Vec<u8>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let vectors: Vec<f32> = (0..rows * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let mut writer =
        SegmentWriter::new(SegmentSpec::new(dim, Metric::Cosine, IdType::U64)).unwrap();
    for (row, vector) in vectors.chunks_exact(dim).enumerate() {
        writer
            .add(
                PointId::U64(row as u64),
                vector,
                Some(&serde_json::json!({"row": row})),
            )
            .unwrap();
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
    (bytes, vectors)
}

fn search_through_cache(storage: quiver_storage::Storage, runtime: &tokio::runtime::Runtime) {
    let dim = 64;
    let (bytes, vectors) = segment_bytes(20_000, dim);
    put(
        runtime,
        &storage,
        "collections/c/shards/0/segments/s1.qseg",
        &bytes,
    );
    let directory = tempfile::tempdir().unwrap();
    let region_bytes = 256 << 10;
    let total_regions = (bytes.len() as u64).div_ceil(region_bytes);
    let cache = cache(
        runtime,
        storage,
        directory.path(),
        total_regions + 2,
        region_bytes,
    );
    let object: CachedObject = cache
        .open_blocking("collections/c/shards/0/segments/s1.qseg")
        .unwrap();
    let cached = Segment::open(object).unwrap();
    let reference = Segment::open(MemorySource::new("reference", &bytes)).unwrap();

    let params = SearchParams {
        nprobe: Some(4),
        ..SearchParams::new(10)
    };
    let mut scratch = SearchScratch::new();
    let query = &vectors[..dim];
    let cold = cached.search(query, &params, None, &mut scratch).unwrap();
    let fetched_cold = cache.stats().misses;
    assert!(
        fetched_cold < total_regions,
        "a cold query fetched {fetched_cold} of {total_regions} regions"
    );
    assert_eq!(
        cold,
        reference
            .search(query, &params, None, &mut scratch)
            .unwrap()
    );
    for query in vectors.chunks_exact(dim).step_by(997) {
        let through_cache = cached.search(query, &params, None, &mut scratch).unwrap();
        assert_eq!(
            through_cache,
            reference
                .search(query, &params, None, &mut scratch)
                .unwrap()
        );
        for hit in &through_cache {
            assert_eq!(
                cached.payload(hit.row).unwrap(),
                reference.payload(hit.row).unwrap()
            );
        }
    }
    let stats = cache.stats();
    assert_eq!(stats.pinned_regions, 0, "{stats:?}");
    assert!(
        stats.boundary_copies * 20 <= stats.hits + stats.misses,
        "boundary copies stay rare: {stats:?}"
    );
}

#[test]
fn segment_search_through_the_cache_matches_memory() {
    let runtime = runtime();
    search_through_cache(memory_storage(), &runtime);
}

#[test]
fn segment_search_through_the_cache_from_the_s3_server() {
    let runtime = runtime();
    if let Some(storage) = s3_storage(&runtime) {
        search_through_cache(storage, &runtime);
    }
}
