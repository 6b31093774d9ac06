//! A full cache disk (a small tmpfs mounted for the test) and per-thread read
//! counts: a cache that cannot make its file reads through to the object store
//! and still returns the right bytes; a cache made while there was room keeps
//! working when the disk fills up afterwards.

use quiver_blobcache::{BlobCache, BlobCacheConfig, CacheError, ReadCounts};

use quiver_test_support::Tmpfs;

use crate::support::{memory_storage, put, random_bytes, runtime};

const REGION_BYTES: u64 = 1 << 20;

#[test]
fn cold_reads_count_misses_and_bytes_and_warm_reads_count_hits() {
    let runtime = runtime();
    let storage = memory_storage();
    let data = random_bytes(3 << 20, 5);
    put(&runtime, &storage, "objects/counted", &data);
    let directory = tempfile::tempdir().unwrap();
    let cache = crate::support::cache(&runtime, storage, directory.path(), 8, REGION_BYTES);
    let object = cache.open_blocking("objects/counted").unwrap();

    let before = ReadCounts::of_this_thread();
    let first = object.read(100, 5000).unwrap().to_vec();
    let straddling = object.read(REGION_BYTES - 10, 20).unwrap().to_vec();
    let cold = ReadCounts::of_this_thread().since(before);
    assert_eq!(first, &data[100..5100]);
    assert_eq!(
        straddling,
        &data[REGION_BYTES as usize - 10..REGION_BYTES as usize + 10]
    );
    assert_eq!(cold.region_misses, 2, "{cold:?}");
    assert_eq!(cold.bytes_fetched, 2 * REGION_BYTES, "{cold:?}");
    assert_eq!(
        cold.region_hits, 1,
        "region 0 again for the straddling read: {cold:?}"
    );

    let before = ReadCounts::of_this_thread();
    object.read(200, 10).unwrap();
    object.read(REGION_BYTES + 5, 10).unwrap();
    let warm = ReadCounts::of_this_thread().since(before);
    assert_eq!(warm.region_misses, 0, "{warm:?}");
    assert_eq!(warm.bytes_fetched, 0, "{warm:?}");
    assert_eq!(warm.region_hits, 2, "{warm:?}");

    // Another thread's reads are its own.
    let other = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let before = ReadCounts::of_this_thread();
                object.read(2 * REGION_BYTES + 1, 10).unwrap();
                ReadCounts::of_this_thread().since(before)
            })
            .join()
            .unwrap()
    });
    assert_eq!(other.region_misses, 1, "{other:?}");
    assert_eq!(
        ReadCounts::of_this_thread().since(before),
        warm,
        "this thread saw none of it"
    );
}

#[test]
fn a_full_disk_at_start_gives_a_clear_error_or_a_read_through_cache() {
    let Some(mount) = Tmpfs::mount_temporary(4 << 20) else {
        return;
    };
    let runtime = runtime();
    let storage = memory_storage();
    let data = random_bytes((5 << 20) + 123, 9);
    put(&runtime, &storage, "objects/big", &data);
    let config = BlobCacheConfig {
        directory: mount.path().join("cache"),
        capacity_bytes: 16 * REGION_BYTES,
        region_bytes: REGION_BYTES,
        map_local_files: true,
        row_region_bytes: 0,
    };
    let error = match BlobCache::new(&config, storage.clone(), runtime.handle().clone()) {
        Ok(_) => panic!("a 16 MiB cache file fits on a 4 MiB disk?"),
        Err(error) => error,
    };
    assert!(matches!(error, CacheError::CacheFile { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("quiver-region-cache.bin") && message.contains("space"),
        "the error names the file and the cause: {message}"
    );
    assert!(
        !mount.path().join("cache/quiver-region-cache.bin").exists(),
        "nothing half-made is left on the full disk"
    );

    let cache = BlobCache::new_or_read_through(&config, storage, runtime.handle().clone()).unwrap();
    assert!(cache.is_read_through());
    let object = cache.open_blocking("objects/big").unwrap();
    let before = ReadCounts::of_this_thread();
    for (offset, length) in [(0u64, 4096usize), (REGION_BYTES - 7, 100), (5 << 20, 123)] {
        let bytes = object.read(offset, length).unwrap();
        assert_eq!(&bytes[..], &data[offset as usize..offset as usize + length]);
        let session = object.session();
        let again = session.read(offset, length).unwrap();
        assert_eq!(&again[..], &data[offset as usize..offset as usize + length]);
    }
    let counts = ReadCounts::of_this_thread().since(before);
    assert_eq!(counts.region_misses, 6, "every read fetches: {counts:?}");
    assert_eq!(counts.bytes_fetched, 2 * (4096 + 100 + 123), "{counts:?}");
    assert_eq!(counts.region_hits, 0);
    assert_eq!(cache.stats().total_regions, 0);

    // A bad configuration is still an error, not a silent read-through cache.
    let bad = BlobCacheConfig {
        region_bytes: 1000,
        map_local_files: true,
        row_region_bytes: 0,
        ..config.clone()
    };
    assert!(
        BlobCache::new_or_read_through(&bad, memory_storage(), runtime.handle().clone()).is_err()
    );
}

#[test]
fn a_disk_that_fills_up_after_the_cache_started_changes_nothing() {
    let Some(mount) = Tmpfs::mount_temporary(12 << 20) else {
        return;
    };
    let runtime = runtime();
    let storage = memory_storage();
    let data = random_bytes(8 << 20, 13);
    put(&runtime, &storage, "objects/filling", &data);
    let config = BlobCacheConfig {
        directory: mount.path().to_path_buf(),
        capacity_bytes: 8 * REGION_BYTES,
        region_bytes: REGION_BYTES,
        map_local_files: true,
        row_region_bytes: 0,
    };
    let cache = BlobCache::new(&config, storage, runtime.handle().clone()).unwrap();
    // Fill what is left of the disk with another file until it refuses.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(mount.path().join("filler")).unwrap();
        let block = vec![7u8; 256 << 10];
        let full = loop {
            if let Err(error) = filler.write_all(&block).and_then(|()| filler.flush()) {
                break error;
            }
        };
        assert_eq!(
            full.raw_os_error(),
            Some(rustix::io::Errno::NOSPC.raw_os_error()),
            "{full}"
        );
    }
    let object = cache.open_blocking("objects/filling").unwrap();
    for region in 0..8u64 {
        let offset = region * REGION_BYTES + 17;
        let bytes = object.read(offset, 1000).unwrap();
        assert_eq!(&bytes[..], &data[offset as usize..offset as usize + 1000]);
    }
    assert_eq!(cache.stats().resident_regions, 8);
    assert!(!cache.is_read_through());
}

#[test]
fn a_cache_sized_as_a_share_of_the_free_space_fits_the_disk() {
    let directory = tempfile::tempdir().unwrap();
    let region_bytes = 1 << 20;
    let config = BlobCacheConfig::share_of_free_space(directory.path(), 1, region_bytes).unwrap();
    let stats = rustix::fs::statvfs(directory.path()).unwrap();
    let free = stats.f_bavail * stats.f_frsize;
    assert!(config.capacity_bytes >= region_bytes, "{config:?}");
    assert!(
        config.capacity_bytes <= (free / 100).max(region_bytes),
        "{config:?} of {free}"
    );
    assert_eq!(config.capacity_bytes % region_bytes, 0);
    let error =
        BlobCacheConfig::share_of_free_space(directory.path(), 0, region_bytes).unwrap_err();
    assert!(error.to_string().contains("between 1 and 100"), "{error}");
}
