//! Many threads, random ranges, a cache far smaller than the data.

use std::sync::Arc;

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
fn a_cache_full_of_pinned_regions_answers_uncached_then_caches_again() {
    let runtime = runtime();
    let storage = memory_storage();
    let directory = tempfile::tempdir().unwrap();
    let bytes = random_bytes(1 << 20, 9);
    put(&runtime, &storage, "pinned/object", &bytes);
    let cache = cache(&runtime, storage, directory.path(), 2, 64 << 10);
    let object = cache.open_blocking("pinned/object").unwrap();
    let first = object.read(0, 10).unwrap();
    let second = object.read(70_000, 10).unwrap();
    // No region can be evicted: the read is answered straight from the store.
    let third = object.read(200_000, 10).unwrap();
    assert_eq!(&third[..], &bytes[200_000..200_010]);
    assert!(third.is_copied());
    let session = object.session();
    assert_eq!(
        &session.read(300_000, 10).unwrap()[..],
        &bytes[300_000..300_010]
    );
    drop(session);
    let stats = cache.stats();
    assert_eq!(
        (stats.uncached_reads, stats.pinned_regions),
        (2, 2),
        "{stats:?}"
    );
    drop((first, second, third));
    let again = object.read(200_000, 10).unwrap();
    assert_eq!(&again[..], &bytes[200_000..200_010]);
    assert!(
        !again.is_copied(),
        "with pins released, the region is cached"
    );
    drop(again);
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
        map_local_files: true,
        row_region_bytes: 0,
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

#[test]
fn a_session_pins_each_region_once_and_releases_on_drop() {
    let runtime = runtime();
    let storage = memory_storage();
    let directory = tempfile::tempdir().unwrap();
    let bytes = random_bytes(1 << 20, 11);
    put(&runtime, &storage, "session/object", &bytes);
    let region_bytes = 64 << 10;
    let cache = cache(&runtime, storage, directory.path(), 4, region_bytes);
    let object = cache.open_blocking("session/object").unwrap();
    let hits_before = cache.stats().hits + cache.stats().misses;
    {
        let session = object.session();
        // Twenty reads inside region 1, all borrowed and alive at once.
        let reads: Vec<_> = (0..20u64)
            .map(|index| session.read(region_bytes + index * 1000, 700).unwrap())
            .collect();
        for (index, read) in reads.iter().enumerate() {
            let start = region_bytes as usize + index * 1000;
            assert!(matches!(read, std::borrow::Cow::Borrowed(_)));
            assert_eq!(&read[..], &bytes[start..start + 700]);
        }
        let stats = cache.stats();
        assert_eq!(stats.pinned_regions, 1, "{stats:?}");
        assert_eq!(
            stats.hits + stats.misses - hits_before,
            1,
            "one lookup for twenty reads: {stats:?}"
        );
        // A range across regions 2 and 3 is assembled (a counted copy).
        let across = session.read(3 * region_bytes - 100, 300).unwrap();
        let start = 3 * region_bytes as usize - 100;
        assert_eq!(&across[..], &bytes[start..start + 300]);
        assert!(matches!(across, std::borrow::Cow::Owned(_)));
        assert_eq!(cache.stats().boundary_copies, 1);
        let outside = session.read(bytes.len() as u64 - 10, 20).err().unwrap();
        assert!(outside.to_string().contains("session/object"), "{outside}");
    }
    assert_eq!(
        cache.stats().pinned_regions,
        0,
        "the session's pins are released"
    );
}

#[test]
fn concurrent_sessions_under_heavy_eviction_are_exact() {
    let runtime = runtime();
    let storage = memory_storage();
    let directory = tempfile::tempdir().unwrap();
    let region_bytes: u64 = 64 << 10;
    let bytes = Arc::new(random_bytes(4 << 20, 12));
    put(&runtime, &storage, "sessions/object", &bytes);
    // 12 regions for 64 regions of data, 4 threads pinning up to 3 each.
    let cache = cache(&runtime, storage, directory.path(), 12, region_bytes);
    let object = cache.open_blocking("sessions/object").unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let (object, bytes) = (&object, &bytes);
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + thread);
                let mut sessions = 0;
                while sessions < 300 {
                    let session = object.session();
                    for _ in 0..rng.random_range(1..=3) {
                        let length = rng.random_range(0..20_000usize);
                        let offset = rng.random_range(0..(bytes.len() - length) as u64);
                        match session.read(offset, length) {
                            Ok(read) => assert!(
                                read[..] == bytes[offset as usize..offset as usize + length],
                                "bytes differ at {offset}+{length}"
                            ),
                            Err(other) => panic!("read failed: {other}"),
                        }
                    }
                    drop(session);
                    sessions += 1;
                }
            });
        }
    });
    let stats = cache.stats();
    assert_eq!(stats.pinned_regions, 0, "{stats:?}");
    assert!(stats.evictions > 0, "{stats:?}");
}
