//! Many threads, random ranges, a cache far smaller than the data.

use std::sync::Arc;

use quiver_blobcache::CacheError;
use rand::{Rng, SeedableRng};

use crate::support::{cache, memory_storage, put, random_bytes, runtime, s3_storage};

fn hammer(
    storage: quiver_storage::Storage,
    runtime: &tokio::runtime::Runtime,
    reads_per_thread: usize,
) {
    let directory = tempfile::tempdir().unwrap();
    let region_bytes = 64 << 10;
    let objects: Vec<(String, Arc<Vec<u8>>)> = (0..4)
        .map(|index| {
            let bytes = random_bytes((3 << 20) + index * 1234, index as u64);
            let key = format!("objects/blob-{index}");
            put(runtime, &storage, &key, &bytes);
            (key, Arc::new(bytes))
        })
        .collect();
    // 8 regions (512 KiB) for 12 MiB of data: constant eviction.
    let cache = cache(runtime, storage, directory.path(), 8, region_bytes);
    let opened: Vec<_> = objects
        .iter()
        .map(|(key, _)| Arc::new(cache.open_blocking(key).unwrap()))
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let opened = &opened;
            let objects = &objects;
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(thread);
                let mut checked = 0;
                while checked < reads_per_thread {
                    let which = rng.random_range(0..objects.len());
                    let expected = &objects[which].1;
                    let length = rng.random_range(0..200_000usize);
                    let offset = rng.random_range(0..(expected.len() - length) as u64);
                    match opened[which].read(offset, length) {
                        Ok(bytes) => {
                            assert!(
                                bytes[..] == expected[offset as usize..offset as usize + length],
                                "bytes differ at {offset}+{length} of object {which}"
                            );
                            checked += 1;
                        }
                        // Eight threads may pin all eight regions for a moment.
                        Err(CacheError::Full { .. }) => std::thread::yield_now(),
                        Err(other) => panic!("read failed: {other}"),
                    }
                }
            });
        }
    });
    let stats = cache.stats();
    assert_eq!(stats.pinned_regions, 0, "every pin released: {stats:?}");
    assert!(
        stats.evictions > 0 && stats.resident_regions <= 8,
        "{stats:?}"
    );
    assert!(
        stats.boundary_copies > 0,
        "reads crossed regions: {stats:?}"
    );
    assert_eq!(stats.fill_errors, 0, "{stats:?}");
}

#[test]
fn concurrent_random_reads_under_heavy_eviction_are_exact() {
    let runtime = runtime();
    hammer(memory_storage(), &runtime, 1500);
}

#[test]
fn concurrent_random_reads_from_the_s3_server_are_exact() {
    let runtime = runtime();
    if let Some(storage) = s3_storage(&runtime) {
        hammer(storage, &runtime, 150);
    }
}

#[test]
fn a_cache_full_of_pinned_regions_fails_clearly_then_recovers() {
    let runtime = runtime();
    let storage = memory_storage();
    let directory = tempfile::tempdir().unwrap();
    let bytes = random_bytes(1 << 20, 9);
    put(&runtime, &storage, "pinned/object", &bytes);
    let cache = cache(&runtime, storage, directory.path(), 2, 64 << 10);
    let object = cache.open_blocking("pinned/object").unwrap();
    let first = object.read(0, 10).unwrap();
    let second = object.read(70_000, 10).unwrap();
    let error = object
        .read(200_000, 10)
        .err()
        .expect("no region can be evicted");
    assert!(
        error.to_string().contains("cache full of pinned regions"),
        "{error}"
    );
    drop((first, second));
    assert_eq!(
        &object.read(200_000, 10).unwrap()[..],
        &bytes[200_000..200_010]
    );
    assert_eq!(cache.stats().pinned_regions, 0);
}

#[test]
fn bad_configuration_and_ranges_are_named() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let config = quiver_blobcache::BlobCacheConfig {
        directory: directory.path().into(),
        capacity_bytes: 1000,
        region_bytes: 4096,
    };
    let error =
        quiver_blobcache::BlobCache::new(&config, memory_storage(), runtime.handle().clone())
            .err()
            .unwrap();
    assert!(
        error.to_string().contains("smaller than one region"),
        "{error}"
    );
    let storage = memory_storage();
    put(&runtime, &storage, "small", b"0123456789");
    let cache = cache(&runtime, storage, directory.path(), 2, 4096);
    let object = cache.open_blocking("small").unwrap();
    let error = object.read(5, 10).err().unwrap();
    assert!(error.to_string().contains("outside small"), "{error}");
    let missing = cache.open_blocking("missing/object").err().unwrap();
    assert!(missing.to_string().contains("missing/object"), "{missing}");
}

#[test]
fn prefetch_fills_regions_in_the_background() {
    let runtime = runtime();
    let storage = memory_storage();
    let directory = tempfile::tempdir().unwrap();
    let bytes = random_bytes(600_000, 12);
    put(&runtime, &storage, "prefetched", &bytes);
    let cache = cache(&runtime, storage, directory.path(), 16, 64 << 10);
    let object = cache.open_blocking("prefetched").unwrap();
    // Regions 0..=4 (0..300_000) and region 8 (530_000..540_000).
    object.prefetch(&[0..300_000, 530_000..540_000]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache.stats().resident_regions < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "prefetch did not finish: {:?}",
            cache.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let misses = cache.stats().misses;
    assert_eq!(misses, 6);
    assert!(object.read(250_000, 1000).unwrap()[..] == bytes[250_000..251_000]);
    assert!(object.read(535_000, 10).unwrap()[..] == bytes[535_000..535_010]);
    assert_eq!(cache.stats().misses, misses, "prefetched regions are hits");
    assert_eq!(cache.stats().pinned_regions, 0);
}
