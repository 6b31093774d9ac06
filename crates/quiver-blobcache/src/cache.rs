//! The region cache: one preallocated file mapped once and cut into fixed-size
//! regions; each region holds one aligned range of one object.
//!
//! Concurrency: one mutex guards the region table (index, states, keys); it is
//! never held across I/O. A miss marks its region `Filling` and fetches outside the
//! lock; other readers of that region wait on the fill's signal (single flight) and
//! see its error if it fails. Pin counts, frequencies and generations are atomics
//! beside the table, so a hit takes no lock: an object remembers which region slot
//! (and generation) holds each of its regions, a reader pins that slot and checks
//! the generation is unchanged. Eviction claims a slot by swapping its pin count
//! from 0 to an `EVICTING` mark under the lock, so a reader either pinned first
//! (and the slot is not evicted) or sees the mark and takes the slow path. Region
//! memory is written only while `Filling` (by the one filler) and read only while
//! pinned `Ready` — so a slice handed to a reader never changes under it.
//!
//! Checksums follow the bytes: once a segment is open, its object carries the
//! segment's chunk checksums, and each fill of a region is checked against them
//! (every chunk lying in the region, completed from the neighbouring regions or the
//! store) before the first reader of that object gets any of its bytes — once per
//! fill, so a region fetched again after an eviction is checked again, and the hit
//! path only reads one flag. A fill that fails is dropped and fetched once more;
//! failing again, the read fails naming the object.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use quiver_index::{
    AccessPattern, ByteSource, ChunkChecksums, IndexError, IndexResult, ReadSession, SegmentChunk,
};
use quiver_storage::Storage;
use tokio::runtime::Handle;

use crate::error::{CacheError, CacheResult};
use crate::metrics::{CacheStats, Counters, METRICS, ReadCounts};

/// Name of the cache file inside the cache directory.
const CACHE_FILE_NAME: &str = "quiver-region-cache.bin";

/// Sizes of a [`BlobCache`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobCacheConfig {
    /// Directory of the cache file (local disk).
    pub directory: PathBuf,
    /// Bytes of the cache file; rounded down to whole regions (at least one).
    pub capacity_bytes: u64,
    /// Bytes per region (default 16 MiB); a multiple of 4 KiB.
    pub region_bytes: u64,
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
        }
    }
}

/// What identifies an object's bytes: a changed object (size or version) is a
/// different identity, so it is never served from the old one's regions.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ObjectIdentity {
    key: String,
    size: u64,
    version: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RegionKey {
    object: Arc<ObjectIdentity>,
    region: u64,
}

/// The outcome of one fill, shared with every reader waiting for it.
struct FillSignal {
    outcome: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

impl FillSignal {
    fn new() -> Self {
        FillSignal {
            outcome: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    fn finish(&self, outcome: Result<(), String>) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<(), String> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(result) = outcome.as_ref() {
                return result.clone();
            }
            outcome = self.done.wait(outcome).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A chunk that did not match its checksum while a region was checked.
struct ChecksumMismatch {
    chunk: SegmentChunk,
    /// Cached neighbouring fills that held part of the chunk and were not checked
    /// themselves: (region, slot, generation).
    suspects: Vec<(u64, usize, u64)>,
}

enum SlotStatus {
    Free,
    Filling(Arc<FillSignal>),
    Ready,
}

struct Slot {
    key: Option<RegionKey>,
    status: SlotStatus,
    /// Valid bytes (the last region of an object is shorter).
    length: usize,
}

impl Slot {
    fn free() -> Self {
        Slot {
            key: None,
            status: SlotStatus::Free,
            length: 0,
        }
    }
}

/// Bits of a remembered region location that hold the slot index.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// Set in a slot's pin count while the slot is being evicted.
const EVICTING: u32 = 1 << 31;

/// The lock-free part of a slot.
#[derive(Default)]
struct SlotCounters {
    /// Readers holding the region (plus `EVICTING` while it is being recycled).
    pins: std::sync::atomic::AtomicU32,
    /// Accesses, halved every few passes over the table (LFU with decay).
    frequency: std::sync::atomic::AtomicU32,
    /// Bumped whenever the slot changes hands, so a remembered slot can be checked.
    generation: std::sync::atomic::AtomicU64,
    /// Valid bytes while Ready (mirrors the table, for the lock-free path).
    length: std::sync::atomic::AtomicUsize,
    /// Set when a reader found the region's bytes damaged: the slot left the
    /// index, and sessions still holding it refuse to read from it.
    discarded: AtomicBool,
    /// Set once the current fill passed its object's chunk checksums; cleared
    /// whenever the slot changes hands, so every fill is checked anew.
    verified: AtomicBool,
}

struct State {
    index: HashMap<RegionKey, usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    resident: u64,
}

struct Inner {
    storage: Storage,
    runtime: Handle,
    /// The mapped cache file; `None` in read-through mode (no file could be made).
    map: Option<memmap2::MmapRaw>,
    file_path: PathBuf,
    region_bytes: usize,
    state: Mutex<State>,
    slot_counters: Vec<SlotCounters>,
    /// Fills so far (drives the frequency decay).
    accesses: std::sync::atomic::AtomicU64,
    /// Hits already added to the process-wide metric.
    exported_hits: std::sync::atomic::AtomicU64,
    /// `log2(region_bytes)` when it is a power of two (the default is).
    region_shift: Option<u32>,
    counters: Counters,
    /// Read-through mode only: chunks fetched whole and checked, kept in
    /// memory (bounded) so that the many small reads of a query do not each
    /// fetch and check a whole chunk again.
    verified_chunks: Option<CheckedChunks>,
}

/// Checked chunks by (object key, chunk start).
type CheckedChunks = moka::sync::Cache<(String, u64), Arc<Vec<u8>>>;

/// Memory for checked chunks in read-through mode.
const READ_THROUGH_CHUNK_BYTES: u64 = 64 << 20;

/// A region cache over one object store. Cheap to clone.
#[derive(Clone)]
pub struct BlobCache {
    inner: Arc<Inner>,
}

/// Creates the cache file and reserves its blocks, so a full disk is an error now
/// rather than a crash (SIGBUS) when a region is first written.
fn create_cache_file(path: &Path, bytes: u64) -> CacheResult<std::fs::File> {
    let io = |error: std::io::Error| CacheError::CacheFile {
        path: path.to_path_buf(),
        source: error,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    // SAFETY: plain FFI call on a file descriptor we own, with in-range arguments.
    let status = unsafe {
        libc::posix_fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            bytes as libc::off_t,
        )
    };
    if status != 0 {
        drop(file);
        // Nothing half-made stays behind on a full disk.
        let _ = std::fs::remove_file(path);
        return Err(io(std::io::Error::from_raw_os_error(status)));
    }
    Ok(file)
}

/// Tells whether a cache-file error means the disk (or quota) is full.
fn is_out_of_space(error: &CacheError) -> bool {
    let CacheError::CacheFile { source, .. } = error else {
        return false;
    };
    matches!(
        source.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
    ) || source.kind() == std::io::ErrorKind::StorageFull
}

impl BlobCache {
    /// Creates the cache file under `config.directory` and maps it. `runtime`
    /// drives the object-store fetches of synchronous reads.
    pub fn new(config: &BlobCacheConfig, storage: Storage, runtime: Handle) -> CacheResult<Self> {
        if config.region_bytes == 0 || !config.region_bytes.is_multiple_of(4096) {
            return Err(CacheError::Config(format!(
                "region size {} is not a positive multiple of 4096",
                config.region_bytes
            )));
        }
        let regions = (config.capacity_bytes / config.region_bytes) as usize;
        if regions == 0 {
            return Err(CacheError::Config(format!(
                "cache size {} is smaller than one region of {} bytes",
                config.capacity_bytes, config.region_bytes
            )));
        }
        std::fs::create_dir_all(&config.directory).map_err(|source| CacheError::CacheFile {
            path: config.directory.clone(),
            source,
        })?;
        let file_path = config.directory.join(CACHE_FILE_NAME);
        let file = create_cache_file(&file_path, regions as u64 * config.region_bytes)?;
        let map = memmap2::MmapRaw::map_raw(&file).map_err(|source| CacheError::CacheFile {
            path: file_path.clone(),
            source,
        })?;
        let state = State {
            index: HashMap::with_capacity(regions),
            slots: (0..regions).map(|_| Slot::free()).collect(),
            free: (0..regions).rev().collect(),
            resident: 0,
        };
        tracing::info!(path = %file_path.display(), regions, region_bytes = config.region_bytes, "region cache ready");
        METRICS.read_through.set(0);
        Ok(BlobCache {
            inner: Arc::new(Inner {
                storage,
                runtime,
                map: Some(map),
                file_path,
                region_bytes: config.region_bytes as usize,
                state: Mutex::new(state),
                slot_counters: (0..regions).map(|_| SlotCounters::default()).collect(),
                accesses: std::sync::atomic::AtomicU64::new(0),
                exported_hits: std::sync::atomic::AtomicU64::new(0),
                region_shift: config
                    .region_bytes
                    .is_power_of_two()
                    .then(|| config.region_bytes.trailing_zeros()),
                counters: Counters::default(),
                verified_chunks: None,
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
                Ok(BlobCache::read_through(
                    storage,
                    runtime,
                    config.directory.join(CACHE_FILE_NAME),
                    config.region_bytes,
                ))
            }
            other => other,
        }
    }

    /// Returns a cache without a file: every read is a ranged GET of exactly the
    /// bytes asked for, nothing is kept.
    fn read_through(
        storage: Storage,
        runtime: Handle,
        file_path: PathBuf,
        region_bytes: u64,
    ) -> Self {
        METRICS.read_through.set(1);
        BlobCache {
            inner: Arc::new(Inner {
                storage,
                runtime,
                map: None,
                file_path,
                region_bytes: region_bytes.max(4096) as usize,
                state: Mutex::new(State {
                    index: HashMap::new(),
                    slots: Vec::new(),
                    free: Vec::new(),
                    resident: 0,
                }),
                slot_counters: Vec::new(),
                accesses: std::sync::atomic::AtomicU64::new(0),
                exported_hits: std::sync::atomic::AtomicU64::new(0),
                region_shift: None,
                counters: Counters::default(),
                verified_chunks: Some(
                    moka::sync::Cache::builder()
                        .max_capacity(READ_THROUGH_CHUNK_BYTES)
                        .weigher(|_, bytes: &Arc<Vec<u8>>| {
                            u32::try_from(bytes.len()).unwrap_or(u32::MAX)
                        })
                        .build(),
                ),
            }),
        }
    }

    /// Tells whether the cache reads straight from the object store (its file
    /// could not be created).
    pub fn is_read_through(&self) -> bool {
        self.inner.map.is_none()
    }

    /// Opens object `key` for reading through the cache (asks the store for its
    /// size and version).
    pub async fn open(&self, key: &str) -> CacheResult<CachedObject> {
        let info = self
            .inner
            .storage
            .head(key)
            .await
            .map_err(|source| CacheError::Storage { source })?;
        let regions = info.size.div_ceil(self.inner.region_bytes as u64) as usize;
        Ok(CachedObject {
            inner: self.inner.clone(),
            identity: Arc::new(ObjectIdentity {
                key: info.key,
                size: info.size,
                version: info.version,
            }),
            region_slots: (0..regions)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            hints: Mutex::new(Vec::new()),
            checksums: OnceLock::new(),
        })
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
        let load =
            |value: &std::sync::atomic::AtomicU64| value.load(std::sync::atomic::Ordering::Relaxed);
        CacheStats {
            hits: load(&counters.hits),
            misses: load(&counters.misses),
            bytes_fetched: load(&counters.bytes_fetched),
            evictions: load(&counters.evictions),
            boundary_copies: load(&counters.boundary_copies),
            fill_errors: load(&counters.fill_errors),
            discarded_regions: load(&counters.discards),
            check_bytes_fetched: load(&counters.check_bytes_fetched),
            pinned_regions: {
                let pinned = self.inner.pinned_regions();
                METRICS.pinned_regions.set(pinned as i64);
                pinned
            },
            resident_regions: state.resident,
            total_regions: state.slots.len() as u64,
        }
    }

    /// Returns the region size in bytes.
    pub fn region_bytes(&self) -> u64 {
        self.inner.region_bytes as u64
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The cache starts empty on every start: the file is scratch space.
        let _ = std::fs::remove_file(&self.file_path);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        match Handle::try_current() {
            // Inside a multi-thread runtime: let the scheduler move other tasks away.
            Ok(_) => tokio::task::block_in_place(|| self.runtime.block_on(future)),
            Err(_) => self.runtime.block_on(future),
        }
    }

    /// Releases one pin of `slot`.
    #[inline]
    fn unpin(&self, slot: usize) {
        self.slot_counters[slot].pins.fetch_sub(1, Ordering::AcqRel);
    }

    fn region_pointer(&self, slot: usize) -> *mut u8 {
        let map = self
            .map
            .as_ref()
            .expect("slots exist only when the cache file is mapped");
        // SAFETY: slot < regions, so the offset stays inside the mapping.
        unsafe { map.as_mut_ptr().add(slot * self.region_bytes) }
    }

    /// Reads `range` of `key` straight from the object store (read-through mode).
    fn read_direct(&self, key: &str, range: Range<u64>) -> CacheResult<Vec<u8>> {
        let length = range.end - range.start;
        if length == 0 {
            return Ok(Vec::new());
        }
        let bytes = self
            .block_on(self.storage.get_range(key, range.clone()))
            .map_err(|error| {
                self.counters
                    .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
                CacheError::Fill {
                    key: key.to_string(),
                    region: range.start / self.region_bytes as u64,
                    message: error.to_string(),
                }
            })?;
        self.counters.add(&self.counters.misses, &METRICS.misses, 1);
        self.counters
            .add(&self.counters.bytes_fetched, &METRICS.bytes_fetched, length);
        ReadCounts::add_miss(length);
        Ok(bytes.to_vec())
    }

    fn update_gauges(state: &State) {
        METRICS.resident_regions.set(state.resident as i64);
    }

    /// Returns how many regions readers hold right now.
    fn pinned_regions(&self) -> u64 {
        self.slot_counters
            .iter()
            .filter(|counters| {
                let pins = counters.pins.load(Ordering::Acquire);
                pins & !EVICTING > 0
            })
            .count() as u64
    }

    /// Counts an access and, every few passes over the table, halves every
    /// frequency (LFU with decay: old popularity fades).
    #[inline]
    fn touch(&self, slot: usize) {
        // A plain load and store, not a locked add: a lost increment under a race
        // only blurs the popularity estimate, and the hit path stays cheap.
        let frequency = &self.slot_counters[slot].frequency;
        frequency.store(
            frequency.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        ReadCounts::add_hit();
    }

    /// Counts a fill and, every time as many fills as there are regions have
    /// happened, halves every frequency (LFU with decay: old popularity fades).
    fn decay_after_fill(&self) {
        let fills = self.accesses.fetch_add(1, Ordering::Relaxed) + 1;
        if fills.is_multiple_of(self.slot_counters.len() as u64) {
            for counters in &self.slot_counters {
                let frequency = counters.frequency.load(Ordering::Relaxed);
                counters.frequency.store(frequency / 2, Ordering::Relaxed);
            }
        }
        self.export_hits();
    }

    /// Moves the hit count into the process-wide metric (done on fills and on
    /// `stats()`, not on every hit).
    fn export_hits(&self) {
        let hits = self.counters.hits.load(Ordering::Relaxed);
        let exported = self.exported_hits.swap(hits, Ordering::Relaxed);
        METRICS.hits.inc_by(hits.saturating_sub(exported));
    }

    #[inline]
    fn region_of(&self, offset: u64) -> u64 {
        match self.region_shift {
            Some(shift) => offset >> shift,
            None => offset / self.region_bytes as u64,
        }
    }

    /// Pins `slot` if it still holds the fill of `generation`; the lock-free hit path.
    #[inline]
    fn try_pin(&self, slot: usize, generation: u64) -> Option<RegionGuard<'_>> {
        let counters = &self.slot_counters[slot];
        let previous = counters.pins.fetch_add(1, Ordering::AcqRel);
        if previous & EVICTING != 0 || counters.generation.load(Ordering::Acquire) != generation {
            counters.pins.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.touch(slot);
        let length = counters.length.load(Ordering::Acquire);
        Some(RegionGuard {
            inner: self,
            slot,
            length,
            filled: false,
        })
    }

    /// Picks the least frequently used unpinned ready region, claims it and frees it.
    fn evict(&self, state: &mut State) -> CacheResult<usize> {
        let mut candidates: Vec<(u32, usize)> = state
            .slots
            .iter()
            .enumerate()
            .filter(|(index, slot)| {
                matches!(slot.status, SlotStatus::Ready)
                    && self.slot_counters[*index].pins.load(Ordering::Acquire) == 0
            })
            .map(|(index, _)| {
                (
                    self.slot_counters[index].frequency.load(Ordering::Relaxed),
                    index,
                )
            })
            .collect();
        candidates.sort_unstable();
        for (_, victim) in candidates {
            let counters = &self.slot_counters[victim];
            // Claim: fails if a lock-free reader pinned the slot meanwhile.
            if counters
                .pins
                .compare_exchange(0, EVICTING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            counters.generation.fetch_add(1, Ordering::AcqRel);
            counters.frequency.store(0, Ordering::Relaxed);
            counters.discarded.store(false, Ordering::Release);
            counters.verified.store(false, Ordering::Release);
            // A discarded slot left the index already; its key may name a newer fill.
            if let Some(key) = state.slots[victim].key.take()
                && state.index.get(&key) == Some(&victim)
            {
                state.index.remove(&key);
            }
            state.slots[victim] = Slot::free();
            state.resident -= 1;
            // Readers that bumped the count while it was marked undo their own bump.
            counters.pins.fetch_sub(EVICTING, Ordering::AcqRel);
            self.counters
                .add(&self.counters.evictions, &METRICS.evictions, 1);
            return Ok(victim);
        }
        Err(CacheError::Full {
            regions: state.slots.len(),
        })
    }

    /// Returns a pinned guard on region `region` of `object`, filling it on a miss.
    fn acquire(&self, object: &Arc<ObjectIdentity>, region: u64) -> CacheResult<RegionGuard<'_>> {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        loop {
            let mut state = self.lock();
            if let Some(&slot) = state.index.get(&key) {
                match &state.slots[slot].status {
                    SlotStatus::Ready => {
                        // Under the lock nobody evicts, so this pin always holds.
                        let counters = &self.slot_counters[slot];
                        counters.pins.fetch_add(1, Ordering::AcqRel);
                        drop(state);
                        self.touch(slot);
                        let length = counters.length.load(Ordering::Acquire);
                        return Ok(RegionGuard {
                            inner: self,
                            slot,
                            length,
                            filled: false,
                        });
                    }
                    SlotStatus::Filling(signal) => {
                        let signal = signal.clone();
                        drop(state);
                        match signal.wait() {
                            Ok(()) => continue,
                            Err(message) => {
                                return Err(CacheError::Fill {
                                    key: object.key.clone(),
                                    region,
                                    message,
                                });
                            }
                        }
                    }
                    SlotStatus::Free => unreachable!("free regions are not in the index"),
                }
            }
            let slot = match state.free.pop() {
                Some(slot) => slot,
                None => self.evict(&mut state)?,
            };
            let signal = Arc::new(FillSignal::new());
            state.slots[slot] = Slot {
                key: Some(key.clone()),
                status: SlotStatus::Filling(signal.clone()),
                length: 0,
            };
            let counters = &self.slot_counters[slot];
            counters.pins.fetch_add(1, Ordering::AcqRel);
            counters.frequency.store(1, Ordering::Relaxed);
            counters.verified.store(false, Ordering::Release);
            state.index.insert(key.clone(), slot);
            drop(state);
            return self.fill(&key, slot, &signal);
        }
    }

    fn fill<'a>(
        &'a self,
        key: &RegionKey,
        slot: usize,
        signal: &FillSignal,
    ) -> CacheResult<RegionGuard<'a>> {
        self.counters.add(&self.counters.misses, &METRICS.misses, 1);
        METRICS.fills_in_flight.inc();
        let object = &key.object;
        let start = key.region * self.region_bytes as u64;
        let end = (start + self.region_bytes as u64).min(object.size);
        let fetched = self.block_on(self.storage.get_range(&object.key, start..end));
        METRICS.fills_in_flight.dec();
        let counters = &self.slot_counters[slot];
        match fetched {
            Ok(bytes) => {
                debug_assert_eq!(
                    bytes.len() as u64,
                    end - start,
                    "storage checks short reads"
                );
                // SAFETY: this slot is Filling and owned by this call alone: it was
                // free or evicted with no pins, readers of its key wait for the signal,
                // and the copy stays inside the region (len ≤ region size).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        self.region_pointer(slot),
                        bytes.len(),
                    )
                };
                counters.length.store(bytes.len(), Ordering::Release);
                let mut state = self.lock();
                state.slots[slot].status = SlotStatus::Ready;
                state.slots[slot].length = bytes.len();
                state.resident += 1;
                Self::update_gauges(&state);
                drop(state);
                self.counters.add(
                    &self.counters.bytes_fetched,
                    &METRICS.bytes_fetched,
                    bytes.len() as u64,
                );
                ReadCounts::add_miss(bytes.len() as u64);
                signal.finish(Ok(()));
                self.decay_after_fill();
                Ok(RegionGuard {
                    inner: self,
                    slot,
                    length: bytes.len(),
                    filled: true,
                })
            }
            Err(error) => {
                // Nothing of a failed fill stays: the slot changes hands and goes back
                // to the free list.
                let mut state = self.lock();
                state.index.remove(key);
                state.slots[slot] = Slot::free();
                counters.generation.fetch_add(1, Ordering::AcqRel);
                counters.pins.fetch_sub(1, Ordering::AcqRel);
                state.free.push(slot);
                drop(state);
                self.counters
                    .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
                let message = error.to_string();
                signal.finish(Err(message.clone()));
                Err(CacheError::Fill {
                    key: object.key.clone(),
                    region: key.region,
                    message,
                })
            }
        }
    }

    /// Drops region `region` of `object` from the index (its bytes were found
    /// damaged): the next reader fetches it again; the old slot is recycled once
    /// its readers are gone, and sessions still holding it get an error.
    fn discard(&self, object: &Arc<ObjectIdentity>, region: u64) {
        self.discard_fill(object, region, None);
    }

    /// Like [`Inner::discard`], but when `fill` (slot, generation) is given, only if
    /// the region is still that fill (a newer fill was not found damaged).
    fn discard_fill(&self, object: &Arc<ObjectIdentity>, region: u64, fill: Option<(usize, u64)>) {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        let mut state = self.lock();
        let Some(&slot) = state.index.get(&key) else {
            return;
        };
        if !matches!(state.slots[slot].status, SlotStatus::Ready) {
            return;
        }
        let counters = &self.slot_counters[slot];
        if fill.is_some_and(|(expected_slot, generation)| {
            expected_slot != slot || counters.generation.load(Ordering::Acquire) != generation
        }) {
            return;
        }
        state.index.remove(&key);
        counters.discarded.store(true, Ordering::Release);
        counters.generation.fetch_add(1, Ordering::AcqRel);
        counters.frequency.store(0, Ordering::Relaxed);
        drop(state);
        self.counters
            .add(&self.counters.discards, &METRICS.discards, 1);
        tracing::warn!(key = %object.key, region, "cached region failed its checksum; dropped, to be fetched again");
    }

    /// Pins region `region` of `object` if it is cached and ready, without filling
    /// it or counting an access (a look at a neighbour of a region being checked).
    /// Returns the guard and the fill's generation.
    fn pin_resident(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
    ) -> Option<(RegionGuard<'_>, u64)> {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        let state = self.lock();
        let &slot = state.index.get(&key)?;
        if !matches!(state.slots[slot].status, SlotStatus::Ready) {
            return None;
        }
        // Under the lock nobody evicts, so this pin always holds.
        let counters = &self.slot_counters[slot];
        counters.pins.fetch_add(1, Ordering::AcqRel);
        let generation = counters.generation.load(Ordering::Acquire);
        drop(state);
        let guard = RegionGuard {
            inner: self,
            slot,
            length: counters.length.load(Ordering::Acquire),
            filled: false,
        };
        Some((guard, generation))
    }

    /// Returns neighbour region `region` of `object` pinned, for a check that needs
    /// `part_bytes` of it: when it is cached, or when the part is at least half a
    /// region (small regions: the chunk spans several, and they are filled as
    /// reading the chunk would) and a slot is free for it. `None`: fetch the part
    /// alone. With the fill's generation.
    fn neighbour_for_check(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
        part_bytes: u64,
    ) -> CacheResult<Option<(RegionGuard<'_>, u64)>> {
        if let Some(resident) = self.pin_resident(object, region) {
            return Ok(Some(resident));
        }
        if part_bytes * 2 < self.region_bytes as u64 {
            return Ok(None);
        }
        match self.acquire(object, region) {
            Ok(guard) => {
                let generation = self.slot_counters[guard.slot]
                    .generation
                    .load(Ordering::Acquire);
                Ok(Some((guard, generation)))
            }
            Err(CacheError::Full { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Checks every chunk of `checksums` lying (partly) in region `region` of
    /// `object`, whose fill `guard` pins. A chunk's parts outside the region are
    /// read from the neighbouring regions (cached, or filled when they are small
    /// next to the chunk), else fetched from the object store (and not kept).
    /// Returns the first chunk that does not match, with the neighbours it was read
    /// from that are not checked themselves (the damage may be theirs).
    fn check_region(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
        guard: &RegionGuard<'_>,
        checksums: &ChunkChecksums,
    ) -> CacheResult<Option<ChecksumMismatch>> {
        let region_bytes = self.region_bytes as u64;
        let region_start = region * region_bytes;
        let bytes = guard.bytes();
        let region_end = region_start + bytes.len() as u64;
        for chunk in checksums.overlapping(region_start..region_end) {
            let mut crc = 0u32;
            let mut suspects = Vec::new();
            // Consecutive parts that are not cached, fetched in one request.
            let mut to_fetch: Option<Range<u64>> = None;
            let end = chunk.end.min(object.size);
            let mut position = chunk.start;
            while position < end {
                let part_region = self.region_of(position);
                let part_region_start = part_region * region_bytes;
                let part_end = (part_region_start + region_bytes).min(end);
                let local = (position - part_region_start) as usize
                    ..(part_end - part_region_start) as usize;
                let neighbour = if part_region == region {
                    None
                } else {
                    self.neighbour_for_check(object, part_region, part_end - position)?
                };
                if part_region != region && neighbour.is_none() {
                    to_fetch = Some(to_fetch.map_or(position, |range| range.start)..part_end);
                    position = part_end;
                    continue;
                }
                if let Some(range) = to_fetch.take() {
                    crc = self.crc_of_fetched(object, crc, range)?;
                }
                match neighbour {
                    None => crc = crc32c::crc32c_append(crc, &bytes[local]),
                    Some((neighbour, generation)) => {
                        crc = crc32c::crc32c_append(crc, &neighbour.bytes()[local]);
                        if !self.slot_counters[neighbour.slot]
                            .verified
                            .load(Ordering::Acquire)
                        {
                            suspects.push((part_region, neighbour.slot, generation));
                        }
                    }
                }
                position = part_end;
            }
            if let Some(range) = to_fetch.take() {
                crc = self.crc_of_fetched(object, crc, range)?;
            }
            if end != chunk.end || crc != chunk.crc {
                return Ok(Some(ChecksumMismatch {
                    chunk: *chunk,
                    suspects,
                }));
            }
        }
        Ok(None)
    }

    /// Fetches `range` of `object` (part of a chunk being checked, not kept) and
    /// returns `crc` extended with its bytes.
    fn crc_of_fetched(
        &self,
        object: &ObjectIdentity,
        crc: u32,
        range: Range<u64>,
    ) -> CacheResult<u32> {
        let length = range.end - range.start;
        let fetched = self
            .block_on(self.storage.get_range(&object.key, range.clone()))
            .map_err(|error| {
                self.counters
                    .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
                CacheError::Fill {
                    key: object.key.clone(),
                    region: self.region_of(range.start),
                    message: error.to_string(),
                }
            })?;
        self.counters.add(
            &self.counters.check_bytes_fetched,
            &METRICS.check_bytes_fetched,
            length,
        );
        Ok(crc32c::crc32c_append(crc, &fetched))
    }

    fn advise_region(&self, slot: usize, pattern: AccessPattern) {
        let advice = match pattern {
            AccessPattern::Sequential => memmap2::Advice::WillNeed,
            AccessPattern::Random => memmap2::Advice::Random,
        };
        // Advice is a hint; failing to give it changes nothing.
        if let Some(map) = &self.map {
            let _ = map.advise_range(advice, slot * self.region_bytes, self.region_bytes);
        }
    }
}

/// A pinned region: its bytes stay put until the guard is dropped.
pub struct RegionGuard<'a> {
    inner: &'a Inner,
    slot: usize,
    length: usize,
    /// True when this read filled the region (a miss).
    filled: bool,
}

impl<'a> RegionGuard<'a> {
    /// Keeps the pin past the guard: returns the slot, whose pin the caller now
    /// owns and must release with `Inner::unpin`.
    fn into_pinned_slot(self) -> usize {
        let slot = self.slot;
        std::mem::forget(self);
        slot
    }

    fn bytes(&self) -> &[u8] {
        self.bytes_for_cache_lifetime()
    }

    /// The region's bytes, borrowed for as long as the cache lives. Only handed out
    /// inside a [`CacheBytes`] that also owns this guard, so the pin outlives every
    /// use of the slice.
    fn bytes_for_cache_lifetime(&self) -> &'a [u8] {
        // SAFETY: the mapping lives as long as `Inner` ('a); the region is Ready and
        // pinned by this guard, so nothing writes to it until the guard drops, and
        // `length` bytes of it were filled.
        unsafe { std::slice::from_raw_parts(self.inner.region_pointer(self.slot), self.length) }
    }
}

impl Drop for RegionGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.inner.unpin(self.slot);
    }
}

/// Bytes read through the cache: a borrowed slice of a pinned region (zero
/// copy), or an owned copy when the range crossed a region boundary.
pub enum CacheBytes<'a> {
    /// A range inside one region.
    Region {
        /// Keeps the region pinned while `bytes` is in use.
        guard: RegionGuard<'a>,
        bytes: &'a [u8],
    },
    /// A range spanning regions, copied.
    Copied(Vec<u8>),
}

impl Deref for CacheBytes<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            CacheBytes::Region { bytes, .. } => bytes,
            CacheBytes::Copied(bytes) => bytes,
        }
    }
}

/// One object read through a [`BlobCache`]; implements the index's
/// [`ByteSource`], so a segment in object storage is searched with no change.
pub struct CachedObject {
    inner: Arc<Inner>,
    identity: Arc<ObjectIdentity>,
    /// Per region of the object: where it was last seen, as
    /// `(generation << 24 | slot) + 1` (0 = unknown); checked on use.
    region_slots: Vec<std::sync::atomic::AtomicU64>,
    hints: Mutex<Vec<(Range<u64>, AccessPattern)>>,
    /// The segment's chunk checksums, once a segment is open on this object: from
    /// then on, no byte of an unchecked fill is handed out.
    checksums: OnceLock<Arc<ChunkChecksums>>,
}

impl CachedObject {
    /// Returns the object's key.
    pub fn key(&self) -> &str {
        &self.identity.key
    }

    /// Returns the object's size.
    pub fn size(&self) -> u64 {
        self.identity.size
    }

    /// Reads `length` bytes at `offset`.
    #[inline]
    pub fn read(&self, offset: u64, length: usize) -> CacheResult<CacheBytes<'_>> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.identity.size);
        let Some(end) = end else {
            return Err(self.out_of_range(offset, length));
        };
        if self.inner.map.is_none() {
            return self.read_through(offset..end).map(CacheBytes::Copied);
        }
        let region_bytes = self.inner.region_bytes as u64;
        let first = self.inner.region_of(offset);
        let last = if length == 0 {
            first
        } else {
            self.inner.region_of(end - 1)
        };
        if first == last {
            let guard = self.acquire(first)?;
            let start = (offset - first * region_bytes) as usize;
            let bytes = &guard.bytes_for_cache_lifetime()[start..start + length];
            return Ok(CacheBytes::Region { guard, bytes });
        }
        let counters = &self.inner.counters;
        counters.add(&counters.boundary_copies, &METRICS.boundary_copies, 1);
        let mut copied = Vec::with_capacity(length);
        for region in first..=last {
            let guard = self.acquire(region)?;
            let region_start = region * region_bytes;
            let from = offset.max(region_start) - region_start;
            let to = end.min(region_start + region_bytes) - region_start;
            copied.extend_from_slice(&guard.bytes()[from as usize..to as usize]);
        }
        Ok(CacheBytes::Copied(copied))
    }

    fn out_of_range(&self, offset: u64, length: usize) -> CacheError {
        CacheError::OutOfRange {
            key: self.identity.key.clone(),
            offset,
            length,
            size: self.identity.size,
        }
    }

    fn index_error(&self, error: CacheError) -> IndexError {
        match error {
            CacheError::Damaged { key, region, chunk } => IndexError::Corrupted {
                object: key,
                reason: format!(
                    "checksum mismatch in {chunk} (cache region {region}), also when fetched again"
                ),
            },
            error => IndexError::Io {
                object: self.identity.key.clone(),
                source: std::io::Error::other(error.to_string()),
            },
        }
    }

    /// Reads `range` straight from the object store (read-through mode). Once the
    /// object has checksums, the whole chunks under the range are fetched and
    /// checked, so no read-through byte is unchecked either; checked chunks stay
    /// in a bounded memory cache for the next reads.
    fn read_through(&self, range: Range<u64>) -> CacheResult<Vec<u8>> {
        let key = &self.identity.key;
        let Some(checksums) = self.checksums.get() else {
            return self.inner.read_direct(key, range);
        };
        let chunks = checksums.overlapping(range.clone());
        if chunks.is_empty() {
            return self.inner.read_direct(key, range);
        }
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        let mut at = range.start;
        for chunk in chunks {
            if at < chunk.start {
                // Bytes no checksum covers (none in a well-formed segment).
                out.extend(
                    self.inner
                        .read_direct(key, at..chunk.start.min(range.end))?,
                );
                at = chunk.start.min(range.end);
            }
            let bytes = self.checked_chunk(chunk)?;
            let to = range.end.min(chunk.end);
            if at < to {
                out.extend_from_slice(
                    &bytes[(at - chunk.start) as usize..(to - chunk.start) as usize],
                );
                at = to;
            }
        }
        if at < range.end {
            out.extend(self.inner.read_direct(key, at..range.end)?);
        }
        Ok(out)
    }

    /// One chunk, whole and checked: from memory, or fetched (once more if it
    /// arrives damaged, then an error naming the object).
    fn checked_chunk(&self, chunk: &quiver_index::SegmentChunk) -> CacheResult<Arc<Vec<u8>>> {
        let key = &self.identity.key;
        let cache_key = (key.clone(), chunk.start);
        if let Some(bytes) = self
            .inner
            .verified_chunks
            .as_ref()
            .and_then(|chunks| chunks.get(&cache_key))
        {
            return Ok(bytes);
        }
        let mut attempts = 0;
        loop {
            let fetched = self
                .inner
                .read_direct(key, chunk.start..chunk.end.min(self.identity.size))?;
            if chunk.matches(&fetched) {
                let bytes = Arc::new(fetched);
                if let Some(chunks) = &self.inner.verified_chunks {
                    chunks.insert(cache_key, bytes.clone());
                }
                return Ok(bytes);
            }
            attempts += 1;
            self.inner
                .counters
                .add(&self.inner.counters.discards, &METRICS.discards, 1);
            tracing::warn!(%key, %chunk, attempts, "bytes read through failed their checksum");
            if attempts == 2 {
                return Err(CacheError::Damaged {
                    key: key.clone(),
                    region: self.inner.region_of(chunk.start),
                    chunk: chunk.to_string(),
                });
            }
        }
    }

    /// Starts a read session (see [`CacheSession`]).
    pub fn session(&self) -> CacheSession<'_> {
        CacheSession::new(self)
    }

    /// Reads many ranges at once (a whole posting list, say): one pinned guard per
    /// range, zero copy for every range inside one region.
    pub fn read_many(&self, ranges: &[Range<u64>]) -> CacheResult<Vec<CacheBytes<'_>>> {
        ranges
            .iter()
            .map(|range| self.read(range.start, (range.end - range.start) as usize))
            .collect()
    }

    /// Starts filling the regions under `ranges` in the background.
    pub fn prefetch(&self, ranges: &[Range<u64>]) {
        if self.inner.map.is_none() {
            return;
        }
        let region_bytes = self.inner.region_bytes as u64;
        let mut regions: Vec<u64> = ranges
            .iter()
            .filter(|range| range.end > range.start)
            .flat_map(|range| {
                range.start / region_bytes..=(range.end.min(self.identity.size) - 1) / region_bytes
            })
            .collect();
        regions.sort_unstable();
        regions.dedup();
        let inner = self.inner.clone();
        let identity = self.identity.clone();
        self.inner.runtime.spawn_blocking(move || {
            for region in regions {
                if let Err(error) = inner.acquire(&identity, region) {
                    tracing::debug!(key = %identity.key, region, %error, "prefetch failed");
                }
            }
        });
    }

    #[inline]
    fn acquire(&self, region: u64) -> CacheResult<RegionGuard<'_>> {
        let remembered = &self.region_slots[region as usize];
        let hint = remembered.load(Ordering::Acquire);
        if hint != 0 {
            let (slot, generation) = (((hint - 1) & SLOT_MASK) as usize, (hint - 1) >> SLOT_BITS);
            if let Some(guard) = self.inner.try_pin(slot, generation) {
                // A fill remembered before the checksums came (read while the
                // segment was being opened) is checked like any other first.
                if self.checksums.get().is_none()
                    || self.inner.slot_counters[slot]
                        .verified
                        .load(Ordering::Acquire)
                {
                    return Ok(guard);
                }
            }
        }
        let guard = self.acquire_verified(region)?;
        if guard.filled {
            self.advise_filled(region, guard.slot);
        }
        let generation = self.inner.slot_counters[guard.slot]
            .generation
            .load(Ordering::Acquire);
        remembered.store(
            ((generation << SLOT_BITS) | guard.slot as u64) + 1,
            Ordering::Release,
        );
        Ok(guard)
    }

    /// Returns region `region` pinned, filling it on a miss; once the object has
    /// checksums, only after its current fill has passed them (checked by the first
    /// reader of each fill). A fill that fails is dropped, with the cached
    /// neighbours that may hold the damage, and fetched once more; failing again,
    /// the read fails with [`CacheError::Damaged`].
    fn acquire_verified(&self, region: u64) -> CacheResult<RegionGuard<'_>> {
        let Some(checksums) = self.checksums.get() else {
            return self.inner.acquire(&self.identity, region);
        };
        let mut attempts = 0;
        loop {
            let guard = self.inner.acquire(&self.identity, region)?;
            let counters = &self.inner.slot_counters[guard.slot];
            if counters.verified.load(Ordering::Acquire) {
                return Ok(guard);
            }
            let generation = counters.generation.load(Ordering::Acquire);
            let Some(mismatch) =
                self.inner
                    .check_region(&self.identity, region, &guard, checksums)?
            else {
                counters.verified.store(true, Ordering::Release);
                return Ok(guard);
            };
            // Another reader passed this very fill meanwhile: the damage was in the
            // bytes this check fetched or borrowed, not in the region.
            if counters.verified.load(Ordering::Acquire) {
                return Ok(guard);
            }
            attempts += 1;
            tracing::warn!(key = %self.identity.key, region, chunk = %mismatch.chunk, attempts, "region failed its checksum");
            self.inner
                .discard_fill(&self.identity, region, Some((guard.slot, generation)));
            for (suspect, slot, generation) in mismatch.suspects {
                self.inner
                    .discard_fill(&self.identity, suspect, Some((slot, generation)));
            }
            drop(guard);
            if attempts == 2 {
                return Err(CacheError::Damaged {
                    key: self.identity.key.clone(),
                    region,
                    chunk: mismatch.chunk.to_string(),
                });
            }
        }
    }

    /// Gives a freshly filled region the advice recorded for its range (once per
    /// fill: `madvise` is a system call, not something for every read).
    fn advise_filled(&self, region: u64, slot: usize) {
        let region_bytes = self.inner.region_bytes as u64;
        let region_range = region * region_bytes..(region + 1) * region_bytes;
        let hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, pattern)) = hints
            .iter()
            .find(|(range, _)| range.start < region_range.end && region_range.start < range.end)
        {
            self.inner.advise_region(slot, *pattern);
        }
    }
}

/// A query's reads of one [`CachedObject`]: each region is pinned on its first
/// read and stays pinned until the session is dropped, so later reads of the same
/// region are plain slices of the mapping — no atomic operation, no lookup.
///
/// A session holds every region it touched for its whole life, so the cache must
/// hold at least one query's regions; otherwise a read fails with "cache full of
/// pinned regions" like any other read.
pub struct CacheSession<'a> {
    object: &'a CachedObject,
    /// Per region of the object: `slot + 1` once this session pinned it, else 0.
    pinned_slots: Vec<Cell<u32>>,
}

impl<'a> CacheSession<'a> {
    fn new(object: &'a CachedObject) -> Self {
        CacheSession {
            object,
            pinned_slots: (0..object.region_slots.len())
                .map(|_| Cell::new(0))
                .collect(),
        }
    }

    /// Returns the slot holding `region`, pinning it on the session's first use.
    #[inline]
    fn pinned_slot(&self, region: u64) -> CacheResult<usize> {
        let remembered = &self.pinned_slots[region as usize];
        match remembered.get() {
            0 => {
                let slot = self.object.acquire(region)?.into_pinned_slot();
                remembered.set(slot as u32 + 1);
                Ok(slot)
            }
            slot_plus_one => Ok(slot_plus_one as usize - 1),
        }
    }

    /// Reads `length` bytes at `offset`: a slice of the mapping inside one region,
    /// a counted copy across regions.
    pub fn read(&self, offset: u64, length: usize) -> CacheResult<Cow<'_, [u8]>> {
        let object = self.object;
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= object.identity.size);
        let Some(end) = end else {
            return Err(object.out_of_range(offset, length));
        };
        let inner = &object.inner;
        let first = inner.region_of(offset);
        let last = if length == 0 {
            first
        } else {
            inner.region_of(end - 1)
        };
        if first != last || inner.map.is_none() {
            return object.read(offset, length).map(|bytes| match bytes {
                CacheBytes::Copied(copied) => Cow::Owned(copied),
                CacheBytes::Region { bytes, .. } => Cow::Owned(bytes.to_vec()),
            });
        }
        let slot = self.pinned_slot(first)?;
        if inner.slot_counters[slot].discarded.load(Ordering::Acquire) {
            return Err(CacheError::Discarded {
                key: object.identity.key.clone(),
                region: first,
            });
        }
        let start = (offset - first * inner.region_bytes as u64) as usize;
        debug_assert!(
            start + length <= inner.slot_counters[slot].length.load(Ordering::Acquire),
            "a range inside the object lies inside its region's filled bytes"
        );
        // SAFETY: this session holds a pin on `slot` until it is dropped, and the
        // returned slice borrows the session, so the region stays Ready and
        // unchanged while the slice lives; `start + length` is inside the region's
        // filled bytes because `end` is inside the object.
        let bytes =
            unsafe { std::slice::from_raw_parts(inner.region_pointer(slot).add(start), length) };
        Ok(Cow::Borrowed(bytes))
    }
}

impl Drop for CacheSession<'_> {
    fn drop(&mut self) {
        for remembered in &self.pinned_slots {
            if let Some(slot) = remembered.get().checked_sub(1) {
                self.object.inner.unpin(slot as usize);
            }
        }
    }
}

impl ReadSession for CacheSession<'_> {
    #[inline]
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<Cow<'_, [u8]>> {
        self.read(offset, length)
            .map_err(|error| self.object.index_error(error))
    }
}

impl ByteSource for CachedObject {
    type Bytes<'a> = CacheBytes<'a>;
    type Session<'a> = CacheSession<'a>;

    fn session(&self) -> CacheSession<'_> {
        CacheSession::new(self)
    }

    fn size(&self) -> u64 {
        self.identity.size
    }

    #[inline]
    fn read_at(&self, offset: u64, length: usize) -> IndexResult<CacheBytes<'_>> {
        self.read(offset, length)
            .map_err(|error| self.index_error(error))
    }

    fn name(&self) -> &str {
        &self.identity.key
    }

    fn advise(&self, offset: u64, length: usize, pattern: AccessPattern) {
        self.hints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((offset..offset + length as u64, pattern));
    }

    fn verify_with(&self, checksums: &Arc<ChunkChecksums>) -> bool {
        // One segment opens one object; a second table would be the same one.
        let _ = self.checksums.set(checksums.clone());
        true
    }

    fn discard(&self, offset: u64, length: u64) {
        if self.inner.map.is_none() || length == 0 {
            return;
        }
        let end = offset.saturating_add(length).min(self.identity.size);
        if offset >= end {
            return;
        }
        for region in self.inner.region_of(offset)..=self.inner.region_of(end - 1) {
            self.inner.discard(&self.identity, region);
        }
    }
}
