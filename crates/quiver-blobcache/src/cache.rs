//! The region cache: one preallocated file mapped once and cut into fixed-size
//! regions; each region holds one aligned range of one object.
//!
//! Concurrency: one mutex guards the region table (index, states, pin counts,
//! frequencies); it is never held across I/O. A miss marks its region `Filling`
//! and fetches outside the lock; other readers of that region wait on the fill's
//! signal (single flight) and see its error if it fails. Region memory is written
//! only while `Filling` (by the one filler) and read only while pinned `Ready`, and
//! a region is recycled only when `Ready` with no pins — so a slice handed to a
//! reader never changes under it.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use quiver_index::{AccessPattern, ByteSource, IndexError, IndexResult};
use quiver_storage::Storage;
use tokio::runtime::Handle;

use crate::error::{CacheError, CacheResult};
use crate::metrics::{CacheStats, Counters, METRICS};

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

enum SlotStatus {
    Free,
    Filling(Arc<FillSignal>),
    Ready,
}

struct Slot {
    key: Option<RegionKey>,
    status: SlotStatus,
    pins: u32,
    frequency: u32,
    /// Valid bytes (the last region of an object is shorter).
    length: usize,
}

impl Slot {
    fn free() -> Self {
        Slot {
            key: None,
            status: SlotStatus::Free,
            pins: 0,
            frequency: 0,
            length: 0,
        }
    }
}

struct State {
    index: HashMap<RegionKey, usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    accesses: u64,
    pinned: u64,
    resident: u64,
}

struct Inner {
    storage: Storage,
    runtime: Handle,
    map: memmap2::MmapRaw,
    file_path: PathBuf,
    region_bytes: usize,
    state: Mutex<State>,
    counters: Counters,
}

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
        return Err(io(std::io::Error::from_raw_os_error(status)));
    }
    Ok(file)
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
            accesses: 0,
            pinned: 0,
            resident: 0,
        };
        tracing::info!(path = %file_path.display(), regions, region_bytes = config.region_bytes, "region cache ready");
        Ok(BlobCache {
            inner: Arc::new(Inner {
                storage,
                runtime,
                map,
                file_path,
                region_bytes: config.region_bytes as usize,
                state: Mutex::new(state),
                counters: Counters::default(),
            }),
        })
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
        Ok(CachedObject {
            inner: self.inner.clone(),
            identity: Arc::new(ObjectIdentity {
                key: info.key,
                size: info.size,
                version: info.version,
            }),
            hints: Mutex::new(Vec::new()),
        })
    }

    /// Opens object `key` from synchronous code (not from inside an async task
    /// on a current-thread runtime).
    pub fn open_blocking(&self, key: &str) -> CacheResult<CachedObject> {
        self.inner.block_on(self.open(key))
    }

    /// Returns the cache's counters.
    pub fn stats(&self) -> CacheStats {
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
            pinned_regions: state.pinned,
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

    fn region_pointer(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < regions, so the offset stays inside the mapping.
        unsafe { self.map.as_mut_ptr().add(slot * self.region_bytes) }
    }

    fn update_gauges(state: &State) {
        METRICS.pinned_regions.set(state.pinned as i64);
        METRICS.resident_regions.set(state.resident as i64);
    }

    /// Counts an access and, every few passes over the table, halves every
    /// frequency (LFU with decay: old popularity fades).
    fn touch(state: &mut State, slot: usize) {
        let entry = &mut state.slots[slot];
        entry.frequency = entry.frequency.saturating_add(1);
        if entry.pins == 0 {
            state.pinned += 1;
        }
        entry.pins += 1;
        state.accesses += 1;
        if state.accesses.is_multiple_of(state.slots.len() as u64 * 4) {
            for slot in state.slots.iter_mut() {
                slot.frequency /= 2;
            }
        }
    }

    /// Picks the least frequently used unpinned ready region and frees it.
    fn evict(&self, state: &mut State) -> CacheResult<usize> {
        let victim = state
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.pins == 0 && matches!(slot.status, SlotStatus::Ready))
            .min_by_key(|(_, slot)| slot.frequency)
            .map(|(index, _)| index)
            .ok_or(CacheError::Full {
                regions: state.slots.len(),
            })?;
        if let Some(key) = state.slots[victim].key.take() {
            state.index.remove(&key);
        }
        state.slots[victim] = Slot::free();
        state.resident -= 1;
        self.counters
            .add(&self.counters.evictions, &METRICS.evictions, 1);
        Ok(victim)
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
                        Self::touch(&mut state, slot);
                        let length = state.slots[slot].length;
                        Self::update_gauges(&state);
                        drop(state);
                        self.counters.add(&self.counters.hits, &METRICS.hits, 1);
                        return Ok(RegionGuard {
                            inner: self,
                            slot,
                            length,
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
                pins: 1,
                frequency: 1,
                length: 0,
            };
            state.pinned += 1;
            state.index.insert(key.clone(), slot);
            Self::update_gauges(&state);
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
        let mut state = self.lock();
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
                signal.finish(Ok(()));
                Ok(RegionGuard {
                    inner: self,
                    slot,
                    length: bytes.len(),
                })
            }
            Err(error) => {
                // Nothing of a failed fill stays: the region goes back to the free list.
                state.index.remove(key);
                state.slots[slot] = Slot::free();
                state.free.push(slot);
                state.pinned -= 1;
                Self::update_gauges(&state);
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

    fn advise_region(&self, slot: usize, pattern: AccessPattern) {
        let advice = match pattern {
            AccessPattern::Sequential => memmap2::Advice::WillNeed,
            AccessPattern::Random => memmap2::Advice::Random,
        };
        // Advice is a hint; failing to give it changes nothing.
        let _ = self
            .map
            .advise_range(advice, slot * self.region_bytes, self.region_bytes);
    }
}

/// A pinned region: its bytes stay put until the guard is dropped.
pub struct RegionGuard<'a> {
    inner: &'a Inner,
    slot: usize,
    length: usize,
}

impl RegionGuard<'_> {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the region is Ready and pinned by this guard, so nothing writes
        // to it until the guard drops; `length` bytes of it were filled.
        unsafe { std::slice::from_raw_parts(self.inner.region_pointer(self.slot), self.length) }
    }
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        let slot = &mut state.slots[self.slot];
        slot.pins -= 1;
        if slot.pins == 0 {
            state.pinned -= 1;
        }
        Inner::update_gauges(&state);
    }
}

/// Bytes read through the cache: a borrowed slice of a pinned region (zero
/// copy), or an owned copy when the range crossed a region boundary.
pub enum CacheBytes<'a> {
    /// A range inside one region.
    Region {
        guard: RegionGuard<'a>,
        range: Range<usize>,
    },
    /// A range spanning regions, copied.
    Copied(Vec<u8>),
}

impl Deref for CacheBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            CacheBytes::Region { guard, range } => &guard.bytes()[range.clone()],
            CacheBytes::Copied(bytes) => bytes,
        }
    }
}

/// One object read through a [`BlobCache`]; implements the index's
/// [`ByteSource`], so a segment in object storage is searched with no change.
pub struct CachedObject {
    inner: Arc<Inner>,
    identity: Arc<ObjectIdentity>,
    hints: Mutex<Vec<(Range<u64>, AccessPattern)>>,
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
    pub fn read(&self, offset: u64, length: usize) -> CacheResult<CacheBytes<'_>> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.identity.size);
        let Some(end) = end else {
            return Err(CacheError::OutOfRange {
                key: self.identity.key.clone(),
                offset,
                length,
                size: self.identity.size,
            });
        };
        let region_bytes = self.inner.region_bytes as u64;
        let first = offset / region_bytes;
        let last = if length == 0 {
            first
        } else {
            (end - 1) / region_bytes
        };
        if first == last {
            let guard = self.acquire(first)?;
            let start = (offset - first * region_bytes) as usize;
            return Ok(CacheBytes::Region {
                guard,
                range: start..start + length,
            });
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

    fn acquire(&self, region: u64) -> CacheResult<RegionGuard<'_>> {
        let guard = self.inner.acquire(&self.identity, region)?;
        let region_bytes = self.inner.region_bytes as u64;
        let region_range = region * region_bytes..(region + 1) * region_bytes;
        let hints = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, pattern)) = hints
            .iter()
            .find(|(range, _)| range.start < region_range.end && region_range.start < range.end)
        {
            self.inner.advise_region(guard.slot, *pattern);
        }
        Ok(guard)
    }
}

impl ByteSource for CachedObject {
    type Bytes<'a> = CacheBytes<'a>;

    fn size(&self) -> u64 {
        self.identity.size
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<CacheBytes<'_>> {
        self.read(offset, length).map_err(|error| IndexError::Io {
            object: self.identity.key.clone(),
            source: std::io::Error::other(error.to_string()),
        })
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
}
