//! The cache handle ([`BlobCache`]) and its configuration: creating the cache
//! (or a read-through one when its disk is full), opening objects, counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quiver_storage::Storage;
use tokio::runtime::Handle;

use crate::cache_file::{CACHE_FILE_NAME, CacheFile, is_out_of_space};
use crate::error::{CacheError, CacheResult};
use crate::inner::{Inner, ObjectIdentity};
use crate::metrics::{CacheStats, Counters, METRICS};
use crate::object::CachedObject;
use crate::read_through::checked_chunks;
use crate::slots::{MAX_SLOTS, SlotCounters, State};

/// Sizes of a [`BlobCache`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobCacheConfig {
    /// Directory of the cache file (local disk).
    pub directory: PathBuf,
    /// Bytes of the cache file; rounded down to whole regions (at least one).
    pub capacity_bytes: u64,
    /// Bytes per region (default 16 MiB); a multiple of 4 KiB.
    pub region_bytes: u64,
    /// Map the objects of a `file://` store straight from their files instead of
    /// copying them into regions (default true): they already sit on local disk,
    /// and the kernel's page cache keeps the hot pages of both in memory.
    pub map_local_files: bool,
}

impl BlobCacheConfig {
    /// Default region size.
    pub const DEFAULT_REGION_BYTES: u64 = 16 << 20;

    /// Returns a config with the default region size.
    pub fn new(directory: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        BlobCacheConfig {
            directory: directory.into(),
            capacity_bytes,
            region_bytes: Self::DEFAULT_REGION_BYTES,
            map_local_files: true,
        }
    }

    /// The share of its disk's free space a cache takes when no size is given.
    pub const DEFAULT_DISK_SHARE_PERCENT: u8 = 80;

    /// Returns a config whose size is `percent` of the free space of the file
    /// system holding `directory` (a cache file left there counts as free),
    /// rounded down to whole regions.
    pub fn share_of_free_space(
        directory: impl Into<PathBuf>,
        percent: u8,
        region_bytes: u64,
    ) -> CacheResult<Self> {
        let directory = directory.into();
        if percent == 0 || percent > 100 {
            return Err(CacheError::Config(format!(
                "a cache share of {percent}% of the free disk space is not between 1 and 100"
            )));
        }
        let bytes =
            crate::cache_file::share_of_free_space(&directory, percent).map_err(|source| {
                CacheError::CacheFile {
                    path: directory.clone(),
                    source,
                }
            })?;
        // At least one region: with no space at all, creating the file fails as
        // out of space, and `new_or_read_through` reads through instead.
        let capacity_bytes = (bytes / region_bytes.max(1) * region_bytes).max(region_bytes);
        Ok(BlobCacheConfig {
            directory,
            capacity_bytes,
            region_bytes,
            map_local_files: true,
        })
    }

    /// Returns the number of regions of the cache file, or why the sizes cannot work.
    fn regions(&self) -> CacheResult<usize> {
        if self.region_bytes == 0 || !self.region_bytes.is_multiple_of(4096) {
            return Err(CacheError::Config(format!(
                "region size {} is not a positive multiple of 4096",
                self.region_bytes
            )));
        }
        let regions = self.capacity_bytes / self.region_bytes;
        if regions == 0 {
            return Err(CacheError::Config(format!(
                "cache size {} is smaller than one region of {} bytes",
                self.capacity_bytes, self.region_bytes
            )));
        }
        if regions > MAX_SLOTS as u64 {
            return Err(CacheError::Config(format!(
                "cache size {} holds {regions} regions of {} bytes, more than the {MAX_SLOTS} a cache can index; use larger regions",
                self.capacity_bytes, self.region_bytes
            )));
        }
        Ok(regions as usize)
    }
}

/// A region cache over one object store. Cheap to clone.
#[derive(Clone)]
pub struct BlobCache {
    inner: Arc<Inner>,
}

impl BlobCache {
    /// Creates the cache file under `config.directory` and maps it. `runtime`
    /// drives the object-store fetches of synchronous reads.
    pub fn new(config: &BlobCacheConfig, storage: Storage, runtime: Handle) -> CacheResult<Self> {
        let regions = config.regions()?;
        std::fs::create_dir_all(&config.directory).map_err(|source| CacheError::CacheFile {
            path: config.directory.clone(),
            source,
        })?;
        let file = CacheFile::create(
            config.directory.join(CACHE_FILE_NAME),
            regions as u64 * config.region_bytes,
        )?;
        tracing::info!(path = %file.path().display(), regions, region_bytes = config.region_bytes, "region cache ready");
        METRICS.read_through.set(0);
        Ok(BlobCache {
            inner: Arc::new(Inner {
                storage,
                runtime,
                file: Some(file),
                region_bytes: config.region_bytes as usize,
                region_shift: config
                    .region_bytes
                    .is_power_of_two()
                    .then(|| config.region_bytes.trailing_zeros()),
                state: Mutex::new(State::with_free_slots(regions)),
                slot_counters: (0..regions).map(|_| SlotCounters::default()).collect(),
                fills: AtomicU64::new(0),
                exported_hits: AtomicU64::new(0),
                counters: Counters::default(),
                verified_chunks: checked_chunks(),
                map_local_files: config.map_local_files,
            }),
        })
    }

    /// Like [`BlobCache::new`], but when the cache file cannot be created because
    /// its disk is full, returns a read-through cache (every read goes to the
    /// object store) instead of failing; other errors (a bad directory, a bad
    /// size) still fail.
    pub fn new_or_read_through(
        config: &BlobCacheConfig,
        storage: Storage,
        runtime: Handle,
    ) -> CacheResult<Self> {
        match BlobCache::new(config, storage.clone(), runtime.clone()) {
            Err(error) if is_out_of_space(&error) => {
                tracing::error!(
                    %error,
                    directory = %config.directory.display(),
                    capacity_bytes = config.capacity_bytes,
                    "no room for the region cache file: reading every range from the object store (slow) until restarted with space"
                );
                Ok(BlobCache::read_through(storage, runtime, config))
            }
            other => other,
        }
    }

    /// Returns a cache without a file: every read is a ranged GET of exactly the
    /// bytes asked for, nothing is kept.
    fn read_through(storage: Storage, runtime: Handle, config: &BlobCacheConfig) -> Self {
        METRICS.read_through.set(1);
        BlobCache {
            inner: Arc::new(Inner {
                storage,
                runtime,
                file: None,
                region_bytes: config.region_bytes.max(4096) as usize,
                region_shift: None,
                state: Mutex::new(State::with_free_slots(0)),
                slot_counters: Vec::new(),
                fills: AtomicU64::new(0),
                exported_hits: AtomicU64::new(0),
                counters: Counters::default(),
                verified_chunks: checked_chunks(),
                map_local_files: config.map_local_files,
            }),
        }
    }

    /// Tells whether the cache reads straight from the object store (its file
    /// could not be created).
    pub fn is_read_through(&self) -> bool {
        self.inner.is_read_through()
    }

    /// Opens object `key` for reading through the cache (asks the store for its
    /// size and version). An object of a `file://` store is mapped straight from
    /// its file when the config allows it (see [`BlobCacheConfig::map_local_files`]).
    pub async fn open(&self, key: &str) -> CacheResult<CachedObject> {
        let info = self
            .inner
            .storage
            .head(key)
            .await
            .map_err(|source| CacheError::Storage { source })?;
        let identity = ObjectIdentity {
            key: info.key,
            size: info.size,
            version: info.version,
        };
        if self.inner.map_local_files
            && let Some(path) = self.inner.storage.local_path(key)
        {
            match map_file(&path, identity.size) {
                Ok(map) => {
                    METRICS.mapped_objects.inc();
                    return Ok(CachedObject::mapped(self.inner.clone(), identity, map));
                }
                Err(error) => tracing::warn!(
                    key,
                    path = %path.display(),
                    %error,
                    "cannot map the local object; reading it through the region cache"
                ),
            }
        }
        Ok(CachedObject::new(self.inner.clone(), identity))
    }

    /// Opens object `key` from synchronous code (not from inside an async task
    /// on a current-thread runtime).
    pub fn open_blocking(&self, key: &str) -> CacheResult<CachedObject> {
        self.inner.block_on(self.open(key))
    }

    /// Returns the cache's counters.
    pub fn stats(&self) -> CacheStats {
        self.inner.export_hits();
        let state = self.inner.lock();
        let counters = &self.inner.counters;
        let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
        CacheStats {
            hits: load(&counters.hits),
            misses: load(&counters.misses),
            bytes_fetched: load(&counters.bytes_fetched),
            evictions: load(&counters.evictions),
            boundary_copies: load(&counters.boundary_copies),
            fill_errors: load(&counters.fill_errors),
            discarded_regions: load(&counters.discards),
            check_bytes_fetched: load(&counters.check_bytes_fetched),
            uncached_reads: load(&counters.uncached_reads),
            pinned_regions: {
                let pinned = self.inner.pinned_regions();
                METRICS.pinned_regions.set(pinned as i64);
                pinned
            },
            resident_regions: state.resident,
            total_regions: state.slots.len() as u64,
        }
    }

    /// Tells whether objects of a `file://` store are mapped from their files.
    pub fn maps_local_files(&self) -> bool {
        self.inner.map_local_files && self.inner.storage.local_path("probe").is_some()
    }

    /// Returns the region size in bytes.
    pub fn region_bytes(&self) -> u64 {
        self.inner.region_bytes as u64
    }
}

/// Maps the file of an object of `size` bytes read-only. Objects of a `file://`
/// store are written whole and renamed into place, so the file under a key never
/// changes; a deleted file stays readable through the mapping.
fn map_file(path: &std::path::Path, size: u64) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    let length = file.metadata()?.len();
    if length != size {
        return Err(std::io::Error::other(format!(
            "the file has {length} bytes, the store reported {size}"
        )));
    }
    // SAFETY: the file is an immutable object of the store (see above): nobody
    // writes to or truncates it while it is mapped.
    unsafe { memmap2::Mmap::map(&file) }
}
