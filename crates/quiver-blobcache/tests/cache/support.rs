//! Shared helpers: runtimes, stores, random objects.

use std::sync::Arc;

use bytes::Bytes;
use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
use quiver_test_support::S3TestServer;
use rand::{Rng, SeedableRng};

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn memory_storage() -> Storage {
    Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap()
}

/// The S3 test server's storage (a fresh bucket), or `None` (a visible skip)
/// without a server; under CI a missing server fails.
pub fn s3_storage(runtime: &tokio::runtime::Runtime) -> Option<Storage> {
    let server = S3TestServer::from_env("the S3 part of this test")?;
    Some(runtime.block_on(server.fresh_storage("quiver-cache-test", "cache-tests")))
}

pub fn random_bytes(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..size).map(|_| rng.random()).collect()
}

pub fn put(runtime: &tokio::runtime::Runtime, storage: &Storage, key: &str, bytes: &[u8]) {
    runtime
        .block_on(storage.put(key, Bytes::copy_from_slice(bytes)))
        .unwrap();
}

pub fn cache(
    runtime: &tokio::runtime::Runtime,
    storage: Storage,
    directory: &std::path::Path,
    regions: u64,
    region_bytes: u64,
) -> Arc<BlobCache> {
    let config = BlobCacheConfig {
        directory: directory.to_path_buf(),
        capacity_bytes: regions * region_bytes,
        region_bytes,
        map_local_files: true,
        row_region_bytes: 0,
    };
    Arc::new(BlobCache::new(&config, storage, runtime.handle().clone()).unwrap())
}
