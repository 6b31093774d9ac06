//! The cache handle ([`BlobCache`]) and its configuration: creating the cache
//! (or a read-through one when its disk is full), opening objects, counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quiver_storage::Storage;
use tokio::runtime::Handle;

use crate::cache_file::{CACHE_FILE_NAME, CacheFile, ROW_CACHE_FILE_NAME, is_out_of_space};
use crate::error::{CacheError, CacheResult};
use crate::inner::{HOT_TIER, Inner, ObjectIdentity, ROW_TIER};
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
    /// Bytes per region of the row tier (default 64 KiB, a segment's row chunk),
    /// which holds the sections read a row at a time (raw vectors, payloads) in
    /// [`BlobCacheConfig::ROW_TIER_PERCENT`] of the capacity, so rescoring
    /// fetches small ranges and never evicts codes; 0 keeps one tier for all.
    pub row_region_bytes: u64,
    /// Map the objects of a `file://` store straight from their files instead of
    /// copying them into regions (default true): they already sit on local disk,
    /// and the kernel's page cache keeps the hot pages of both in memory.
    pub map_local_files: bool,
}

impl BlobCacheConfig {
    /// Default region size.
    pub const DEFAULT_REGION_BYTES: u64 = 16 << 20;
    /// Default region size of the row tier (a v2 segment's row chunk).
    pub const DEFAULT_ROW_REGION_BYTES: u64 = 64 << 10;
    /// Share of the capacity the row tier takes (the rest holds codes,
    /// centroids, ids: the bytes every query scans, about 1/16 of raw vectors).
    pub const ROW_TIER_PERCENT: u64 = 75;
    /// The fewest hot regions a split leaves: every query pins the hot
    /// regions it scans, so with fewer, concurrent queries find them all
    /// pinned and read their codes uncached (slowly) instead.
    pub const MIN_HOT_REGIONS: u64 = 16;
    /// The fewest row regions worth a row tier.
    pub const MIN_ROW_REGIONS: u64 = 64;

    /// Returns a config with the default region size.
    pub fn new(directory: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        BlobCacheConfig {
            directory: directory.into(),
            capacity_bytes,
            region_bytes: Self::DEFAULT_REGION_BYTES,
            row_region_bytes: Self::DEFAULT_ROW_REGION_BYTES,
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
            row_region_bytes: Self::DEFAULT_ROW_REGION_BYTES,
            map_local_files: true,
        })
    }

    /// The smallest region the hot tier shrinks to so that a cache under
    /// [`Self::MIN_HOT_REGIONS`] × `region_bytes` of hot bytes still splits.
    pub const MIN_HOT_REGION_BYTES: u64 = 1 << 20;

    /// Splits the capacity: (hot bytes, hot region bytes, row-tier bytes). The hot
    /// tier keeps `region_bytes` regions when its share
    /// (100 − [`Self::ROW_TIER_PERCENT`] %) holds [`Self::MIN_HOT_REGIONS`] of
    /// them; a smaller cache shrinks them (halving a power-of-two size, down to
    /// [`Self::MIN_HOT_REGION_BYTES`]) until it does, so a 256 MiB cache still
    /// reads raw vectors in 64 KiB row regions instead of 16 MiB fills. When
    /// even that share is too small, the hot tier takes
    /// [`Self::MIN_HOT_REGIONS`] regions of the smallest size and the row tier
    /// the rest (a 32 MiB cache: 16 MiB of 1 MiB hot regions, 16 MiB of row
    /// regions). One tier when the row tier is off or would hold fewer than
    /// [`Self::MIN_ROW_REGIONS`]; its regions shrink the same way, so a small
    /// cache still has [`Self::MIN_HOT_REGIONS`] of them where it can.
    fn split(&self) -> (u64, u64, u64) {
        let shrunk = |bytes: u64| {
            let mut region = self.region_bytes;
            while bytes < Self::MIN_HOT_REGIONS * region
                && region.is_power_of_two()
                && region / 2 >= Self::MIN_HOT_REGION_BYTES
            {
                region /= 2;
            }
            region
        };
        let one_tier = (self.capacity_bytes, shrunk(self.capacity_bytes), 0);
        if self.row_region_bytes == 0 {
            return one_tier;
        }
        let round_rows = |bytes: u64| bytes / self.row_region_bytes * self.row_region_bytes;
        let mut rows = round_rows(self.capacity_bytes / 100 * Self::ROW_TIER_PERCENT);
        let mut hot = self.capacity_bytes - rows;
        let hot_region = shrunk(hot);
        if hot < Self::MIN_HOT_REGIONS * hot_region {
            rows = round_rows(
                self.capacity_bytes
                    .saturating_sub(Self::MIN_HOT_REGIONS * hot_region),
            );
            hot = self.capacity_bytes - rows;
        }
        if rows < Self::MIN_ROW_REGIONS * self.row_region_bytes {
            one_tier
        } else {
            (hot, hot_region, rows)
        }
    }

    /// Returns the number of regions of `capacity_bytes` in regions of
    /// `region_bytes`, or why the sizes cannot work.
    fn regions(capacity_bytes: u64, region_bytes: u64) -> CacheResult<usize> {
        if region_bytes == 0 || !region_bytes.is_multiple_of(4096) {
            return Err(CacheError::Config(format!(
                "region size {region_bytes} is not a positive multiple of 4096"
            )));
        }
        let regions = capacity_bytes / region_bytes;
        if regions == 0 {
            return Err(CacheError::Config(format!(
                "cache size {capacity_bytes} is smaller than one region of {region_bytes} bytes"
            )));
        }
        if regions > MAX_SLOTS as u64 {
            return Err(CacheError::Config(format!(
                "cache size {capacity_bytes} holds {regions} regions of {region_bytes} bytes, more than the {MAX_SLOTS} a cache can index; use larger regions"
            )));
        }
        Ok(regions as usize)
    }
}

/// A region cache over one object store. Cheap to clone.
#[derive(Clone)]
pub struct BlobCache {
    /// The hot tier (everything but the row sections; everything with one tier).
    inner: Arc<Inner>,
    /// The row tier: raw vectors and payloads, in small regions.
    rows: Option<Arc<Inner>>,
}

impl BlobCache {
    /// Creates the cache files under `config.directory` and maps them. `runtime`
    /// drives the object-store fetches of synchronous reads.
    pub fn new(config: &BlobCacheConfig, storage: Storage, runtime: Handle) -> CacheResult<Self> {
        let (hot_bytes, hot_region_bytes, row_bytes) = config.split();
        let regions = BlobCacheConfig::regions(hot_bytes, hot_region_bytes)?;
        let row_regions = if row_bytes > 0 {
            Some(BlobCacheConfig::regions(
                row_bytes,
                config.row_region_bytes,
            )?)
        } else {
            None
        };
        std::fs::create_dir_all(&config.directory).map_err(|source| CacheError::CacheFile {
            path: config.directory.clone(),
            source,
        })?;
        let tier = |file_name: &str, tier: &'static str, regions: usize, region_bytes: u64| {
            let file = CacheFile::create(
                config.directory.join(file_name),
                regions as u64 * region_bytes,
            )?;
            tracing::info!(path = %file.path().display(), tier, regions, region_bytes, "region cache ready");
            CacheResult::Ok(Arc::new(Inner {
                storage: storage.clone(),
                runtime: runtime.clone(),
                tier,
                file: Some(file),
                region_bytes: region_bytes as usize,
                region_shift: region_bytes
                    .is_power_of_two()
                    .then(|| region_bytes.trailing_zeros()),
                state: Mutex::new(State::with_free_slots(regions)),
                slot_counters: (0..regions).map(|_| SlotCounters::default()).collect(),
                fills: AtomicU64::new(0),
                exported_hits: AtomicU64::new(0),
                counters: Counters::default(),
                verified_chunks: checked_chunks(),
                map_local_files: config.map_local_files,
            }))
        };
        let inner = tier(CACHE_FILE_NAME, HOT_TIER, regions, hot_region_bytes)?;
        let rows = match row_regions {
            Some(row_regions) => Some(tier(
                ROW_CACHE_FILE_NAME,
                ROW_TIER,
                row_regions,
                config.row_region_bytes,
            )?),
            None => None,
        };
        METRICS.read_through.set(0);
        Ok(BlobCache { inner, rows })
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
            rows: None,
            inner: Arc::new(Inner {
                storage,
                runtime,
                tier: HOT_TIER,
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
        Ok(self.open_identity(ObjectIdentity {
            key: info.key,
            size: info.size,
            version: info.version,
        }))
    }

    /// Opens immutable object `key` whose size the caller already knows (a
    /// segment listed in a manifest, with its size): no request to the store, so
    /// a cold open costs no round trip of its own before the first read. Every
    /// open of one key must go through the same function (an object opened both
    /// ways is two objects to the cache: one identity carries the store's
    /// version, the other none). A wrong size shows at the first read past the
    /// real end (or, for a mapped file, right here).
    pub fn open_sized(&self, key: &str, size: u64) -> CachedObject {
        self.open_identity(ObjectIdentity {
            key: key.to_string(),
            size,
            version: None,
        })
    }

    fn open_identity(&self, identity: ObjectIdentity) -> CachedObject {
        let key = identity.key.as_str();
        if self.inner.map_local_files
            && let Some(path) = self.inner.storage.local_path(key)
        {
            match map_file(&path, identity.size) {
                Ok(map) => {
                    METRICS.mapped_objects.inc();
                    return CachedObject::mapped(self.inner.clone(), identity, map);
                }
                Err(error) => tracing::warn!(
                    key,
                    path = %path.display(),
                    %error,
                    "cannot map the local object; reading it through the region cache"
                ),
            }
        }
        let mut object = CachedObject::new(self.inner.clone(), identity.clone());
        if let Some(rows) = &self.rows {
            object.rows = Some(Box::new(CachedObject::new(rows.clone(), identity)));
        }
        object
    }

    /// Opens object `key` from synchronous code (not from inside an async task
    /// on a current-thread runtime).
    pub fn open_blocking(&self, key: &str) -> CacheResult<CachedObject> {
        self.inner.block_on(self.open(key))
    }

    /// Returns the cache's counters, both tiers together.
    pub fn stats(&self) -> CacheStats {
        let (hot, rows) = self.stats_by_tier();
        rows.map_or(hot, |rows| hot.plus(&rows))
    }

    /// Returns the counters of the hot tier and of the row tier (when there is
    /// one; see [`BlobCacheConfig::row_region_bytes`]).
    pub fn stats_by_tier(&self) -> (CacheStats, Option<CacheStats>) {
        (
            tier_stats(&self.inner),
            self.rows.as_deref().map(tier_stats),
        )
    }

    /// Returns the row tier's region size, when the cache has one.
    pub fn row_region_bytes(&self) -> Option<u64> {
        self.rows.as_ref().map(|rows| rows.region_bytes as u64)
    }

    /// Returns the row tier's capacity in bytes (0 without a row tier).
    pub fn row_tier_bytes(&self) -> u64 {
        self.rows.as_ref().map_or(0, |rows| {
            rows.region_bytes as u64 * rows.slot_counters.len() as u64
        })
    }

    /// Tells whether objects of a `file://` store are mapped from their files.
    pub fn maps_local_files(&self) -> bool {
        self.inner.map_local_files && self.inner.storage.is_local()
    }

    /// Returns the region size in bytes.
    pub fn region_bytes(&self) -> u64 {
        self.inner.region_bytes as u64
    }
}

/// Returns the counters of one tier.
fn tier_stats(inner: &Inner) -> CacheStats {
    inner.export_hits();
    let state = inner.lock();
    let counters = &inner.counters;
    let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
    CacheStats {
        hits: load(&counters.hits),
        misses: load(&counters.misses),
        bytes_fetched: load(&counters.bytes_fetched),
        evictions: load(&counters.evictions),
        awaited_evictions: load(&counters.awaited_evictions),
        boundary_copies: load(&counters.boundary_copies),
        fill_errors: load(&counters.fill_errors),
        discarded_regions: load(&counters.discards),
        check_bytes_fetched: load(&counters.check_bytes_fetched),
        uncached_reads: load(&counters.uncached_reads),
        fetched_ahead: load(&counters.fetched_ahead),
        fetch_ahead_left: load(&counters.fetch_ahead_left),
        pinned_regions: {
            let pinned = inner.pinned_regions();
            METRICS
                .pinned_regions
                .with_label_values(&[inner.tier])
                .set(pinned as i64);
            pinned
        },
        resident_regions: state.resident,
        total_regions: state.slots.len() as u64,
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
