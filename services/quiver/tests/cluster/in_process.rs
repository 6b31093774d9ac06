//! Helpers of the tests that start roles in this process: object stores (the S3
//! server, memory), a searcher's read context, an indexer that moves only when
//! the test writes.

use std::sync::Arc;

use quiver_searcher::ReadContext;
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

/// The S3 server's storage (a fresh bucket named from `bucket_prefix`, keys under
/// `key_prefix`), or `None` (a visible skip) without one; under CI a missing server fails.
pub async fn s3_storage(bucket_prefix: &str, key_prefix: &str) -> Option<Storage> {
    let server = quiver_test_support::S3TestServer::from_env("this in-process cluster test")?;
    Some(server.fresh_storage(bucket_prefix, key_prefix).await)
}

/// An in-memory object store.
pub fn memory_storage() -> Storage {
    Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap()
}

/// Indexer settings under which nothing flushes or merges on its own.
pub fn manual_config() -> quiver_indexer::IndexerConfig {
    quiver_indexer::IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 1000,
        codebook_refresh: false,
        consolidate_quiet_ms: 0,
        ..quiver_indexer::IndexerConfig::default()
    }
}

/// A searcher's read context over `storage`, its cache in `directory` with
/// 256 regions of `region_bytes`.
pub fn context(
    storage: &Storage,
    directory: &std::path::Path,
    region_bytes: u64,
) -> Arc<ReadContext> {
    let cache = quiver_blobcache::BlobCache::new(
        &quiver_blobcache::BlobCacheConfig {
            directory: directory.to_path_buf(),
            capacity_bytes: 256 * region_bytes,
            region_bytes,
            map_local_files: true,
            row_region_bytes: 0,
        },
        storage.clone(),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    Arc::new(ReadContext::new(
        Arc::new(cache),
        storage.clone(),
        tokio::runtime::Handle::current(),
    ))
}

/// Returns the sum of a counter's series in this process.
pub fn counter(name: &str) -> f64 {
    prometheus::gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value())
        .sum()
}
