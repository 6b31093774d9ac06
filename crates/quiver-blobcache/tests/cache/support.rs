//! Shared helpers: runtimes, stores, random objects.

use std::sync::Arc;

use bytes::Bytes;
use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
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

/// The S3 server's storage (fresh bucket), or `None` outside CI without a server.
pub fn s3_storage(runtime: &tokio::runtime::Runtime) -> Option<Storage> {
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
        "quiver-cache-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    runtime
        .block_on(quiver_storage::ensure_bucket(&settings, &bucket))
        .unwrap();
    let url: StoreUrl = format!("s3://{bucket}/cache-tests").parse().unwrap();
    Some(Storage::open(&url, &settings, StorageOptions::default()).unwrap())
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
    };
    Arc::new(BlobCache::new(&config, storage, runtime.handle().clone()).unwrap())
}

/// A small tmpfs mounted on a temporary directory (a disk that can be filled),
/// unmounted when dropped. `None`, with a note, where mounting is not permitted
/// (not root, or no CAP_SYS_ADMIN); under CI that is a failure.
pub struct TmpfsMount {
    directory: tempfile::TempDir,
}

impl TmpfsMount {
    pub fn new(size_bytes: u64) -> Option<TmpfsMount> {
        let directory = tempfile::tempdir().unwrap();
        let options = std::ffi::CString::new(format!("size={size_bytes},mode=0700")).unwrap();
        let mounted = rustix::mount::mount(
            "tmpfs",
            directory.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            options.as_c_str(),
        );
        if let Err(errno) = mounted {
            let error = std::io::Error::from(errno);
            if std::env::var_os("CI").is_some() {
                panic!("cannot mount a tmpfs for the disk-full test under CI: {error}");
            }
            eprintln!("cannot mount a tmpfs ({error}): skipping this disk-full test");
            return None;
        }
        Some(TmpfsMount { directory })
    }

    pub fn path(&self) -> &std::path::Path {
        self.directory.path()
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        // MNT_DETACH cannot leave it half-done.
        let _ = rustix::mount::unmount(self.directory.path(), rustix::mount::UnmountFlags::DETACH);
    }
}
