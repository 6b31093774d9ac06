//! Helpers of the tests that start roles in this process: object stores (the S3
//! server, memory), a searcher's read context, an indexer that moves only when
//! the test writes.

use std::sync::Arc;

use quiver_searcher::ReadContext;
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

/// The S3 server's storage (a fresh bucket named from `bucket_prefix`, keys under
/// `key_prefix`), or `None` outside CI without one.
pub async fn s3_storage(bucket_prefix: &str, key_prefix: &str) -> Option<Storage> {
    let endpoint = match std::env::var("QUIVER_TEST_S3_ENDPOINT") {
        Ok(endpoint) => endpoint,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("QUIVER_TEST_S3_ENDPOINT is not set under CI")
        }
        Err(_) => return None,
    };
    let settings = S3Settings {
        endpoint: Some(endpoint),
        region: Some("us-east-1".into()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        ..Default::default()
    };
    let bucket = format!(
        "{bucket_prefix}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    quiver_storage::ensure_bucket(&settings, &bucket)
        .await
        .unwrap();
    let url: StoreUrl = format!("s3://{bucket}/{key_prefix}").parse().unwrap();
    Some(Storage::open(&url, &settings, StorageOptions::default()).unwrap())
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
