//! One object read through the cache ([`CachedObject`]): reads, prefetches, and
//! the index's [`ByteSource`] trait, so a segment in object storage is searched
//! straight out of the cache.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use quiver_index::{AccessPattern, ByteSource, ChunkChecksums, IndexError, IndexResult};

use crate::bytes::{CacheBytes, RegionGuard};
use crate::error::{CacheError, CacheResult};
use crate::fill::{FETCH_AHEAD_RUN_BYTES, finish_fills};
use crate::inner::{Inner, ObjectIdentity};
use crate::metrics::{METRICS, ReadCounts};
use crate::session::CacheSession;
use crate::slots::{remembered_fill, remembered_location};

/// Requests one query's fetch-ahead keeps in flight at a time (it claims more
/// regions than that together, see `FetchPlan::query`).
const FETCH_AHEAD_FILLS: usize = 16;

/// Fills at a time when warming a new segment's codes (before its shard serves
/// it): enough in flight that the warm-up runs at the store's bandwidth.
const WARM_CODE_FILLS: usize = 4;

/// Requests in flight when warming rows in the background: few, so that
/// queries' own fetches are not queued behind the warm-up's.
const WARM_ROW_FILLS: usize = 2;

/// The bytes of neighbouring row regions one warm-up request asks for. A row
/// warm-up reads whole sections, so its requests are large: a store answers a
/// request in a round trip plus its bytes, and 64 KiB regions fetched two at a
/// time warmed a merged 100k × 384 segment's rows at ~1 MiB/s (every request
/// paying a round trip for 128 KiB) — queries then fetched those rows cold
/// for minutes after the merge.
const WARM_ROW_RUN_BYTES: usize = 4 << 20;

/// One object read through a [`BlobCache`](crate::BlobCache); implements the
/// index's [`ByteSource`], so a segment in object storage is searched with no
/// change.
pub struct CachedObject {
    pub(crate) inner: Arc<Inner>,
    pub(crate) identity: Arc<ObjectIdentity>,
    /// Per region of the object: where it was last seen, as a remembered location
    /// (see `slots::remembered_location`; 0 = unknown); checked on use.
    region_slots: Vec<AtomicU64>,
    hints: Mutex<Vec<(Range<u64>, AccessPattern)>>,
    /// The segment's chunk checksums, once a segment is open on this object: from
    /// then on, no byte of an unchecked fill is handed out.
    pub(crate) checksums: OnceLock<Arc<ChunkChecksums>>,
    /// The object's own file, mapped, when it is a file of a `file://` store:
    /// reads borrow it, and no region of the cache is used.
    pub(crate) mapped: Option<memmap2::Mmap>,
    /// How the mapped file is advised (huge pages for its codes, fetch-ahead of
    /// its rescoring rows while it misses pages).
    advice: quiver_index::MappedAdvice,
    /// The same object in the cache's row tier, which serves the ranges of
    /// `row_ranges` (raw vectors, payloads) once a segment is open on it.
    pub(crate) rows: Option<Box<CachedObject>>,
    /// The object ranges the row tier serves: the segment's sections read a row
    /// at a time whose chunks fit a row region (set with the checksums).
    row_ranges: OnceLock<Vec<Range<u64>>>,
    /// Bytes of this mapped file's rows held in memory as huge pages
    /// ([`CachedObject::hold_rows`]), counted in [`held_row_bytes`] until the
    /// object is dropped.
    held_rows: AtomicU64,
}

/// Bytes of rows that mapped objects of this process hold in memory as huge
/// pages (see [`CachedObject::hold_rows`]).
static HELD_ROW_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of rows the open mapped objects of this process hold in memory as
/// huge pages (see [`CachedObject::hold_rows`]): what a caller deciding
/// whether to hold more weighs against its memory.
pub fn held_row_bytes() -> u64 {
    HELD_ROW_BYTES.load(Ordering::Relaxed)
}

impl Drop for CachedObject {
    fn drop(&mut self) {
        let held = *self.held_rows.get_mut();
        if held > 0 {
            HELD_ROW_BYTES.fetch_sub(held, Ordering::Relaxed);
            METRICS.rows_held_bytes.sub(held as i64);
        }
    }
}

impl CachedObject {
    pub(crate) fn new(inner: Arc<Inner>, identity: ObjectIdentity) -> Self {
        let regions = identity.size.div_ceil(inner.region_bytes as u64) as usize;
        CachedObject {
            inner,
            identity: Arc::new(identity),
            region_slots: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            hints: Mutex::new(Vec::new()),
            checksums: OnceLock::new(),
            mapped: None,
            advice: quiver_index::MappedAdvice::new(),
            rows: None,
            row_ranges: OnceLock::new(),
            held_rows: AtomicU64::new(0),
        }
    }

    /// Returns an object read from `map`, its own file mapped (see
    /// [`crate::BlobCacheConfig::map_local_files`]).
    pub(crate) fn mapped(inner: Arc<Inner>, identity: ObjectIdentity, map: memmap2::Mmap) -> Self {
        debug_assert_eq!(map.len() as u64, identity.size);
        CachedObject {
            inner,
            identity: Arc::new(identity),
            region_slots: Vec::new(),
            hints: Mutex::new(Vec::new()),
            checksums: OnceLock::new(),
            advice: quiver_index::MappedAdvice::of_map(&map),
            mapped: Some(map),
            rows: None,
            row_ranges: OnceLock::new(),
            held_rows: AtomicU64::new(0),
        }
    }

    /// Returns the row tier's view of this object when it serves all of
    /// `offset..end`.
    #[inline]
    pub(crate) fn row_tier(&self, offset: u64, end: u64) -> Option<&CachedObject> {
        let rows = self.rows.as_deref()?;
        self.row_ranges
            .get()?
            .iter()
            .any(|range| range.start <= offset && end <= range.end)
            .then_some(rows)
    }

    /// Tells whether the object is read from its own mapped file rather than
    /// through the cache's regions.
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Brings `range` into memory ahead of the reads that need it: for a mapped
    /// file, asks the kernel to read it in; through the cache, fills every region
    /// it spans that is not resident, a few at a time (blocking). Returns the
    /// bytes fetched from the store; stops early, without error, once every
    /// region of the cache is pinned.
    pub fn warm(&self, range: Range<u64>) -> CacheResult<u64> {
        let end = range.end.min(self.identity.size);
        if range.start >= end {
            return Ok(0);
        }
        if let Some(map) = &self.mapped {
            self.advice.warm(map, range.start, end);
            return Ok(0);
        }
        if self.inner.is_read_through() {
            return Ok(0);
        }
        let missing: Vec<u64> = (self.inner.region_of(range.start)..=self.inner.region_of(end - 1))
            .filter(|&region| self.resident_slot(region).is_none())
            .collect();
        // Several fills in flight: a warm-up is bounded by the store's
        // bandwidth, not by one request's round trip after another.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let first_error: Mutex<Option<CacheError>> = Mutex::new(None);
        let mut fetched = 0u64;
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (0..missing.len().min(WARM_CODE_FILLS))
                .map(|_| {
                    scope.spawn(|| {
                        let before = ReadCounts::of_this_thread();
                        while !stop.load(Ordering::Relaxed)
                            && let Some(&region) = missing.get(next.fetch_add(1, Ordering::Relaxed))
                        {
                            match self.acquire(region) {
                                Ok(guard) => drop(guard),
                                // Every region is pinned: warming more would
                                // only evict what queries are reading.
                                Err(CacheError::Full { .. }) => stop.store(true, Ordering::Relaxed),
                                Err(error) => {
                                    stop.store(true, Ordering::Relaxed);
                                    first_error
                                        .lock()
                                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                                        .get_or_insert(error);
                                }
                            }
                        }
                        ReadCounts::of_this_thread().since(before)
                    })
                })
                .collect();
            for helper in helpers {
                if let Ok(reads) = helper.join() {
                    fetched += reads.bytes_fetched;
                }
            }
        });
        match first_error
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
        {
            Some(error) => Err(error),
            None => Ok(fetched),
        }
    }

    /// Brings the row-tier ranges under `range` (a segment's raw vectors or
    /// payloads, once the segment is open on this object) into the row tier, two
    /// fills at a time (a background task: queries' fetches come first), and
    /// returns when they are in.
    /// Nothing for a mapped file, a read-through cache, or a range the row tier
    /// does not serve: warming rows into the hot tier would push codes out.
    pub fn warm_rows(&self, range: Range<u64>) {
        let end = range.end.min(self.identity.size);
        if range.start >= end || self.mapped.is_some() {
            return;
        }
        if let Some(rows) = self.row_tier(range.start, end) {
            // Each batch: WARM_ROW_FILLS requests of WARM_ROW_RUN_BYTES when
            // the section is cold throughout.
            let run_regions = (WARM_ROW_RUN_BYTES / rows.inner.region_bytes).max(1);
            rows.fetch_missing_with(
                [(range.start, (end - range.start) as usize)],
                FetchPlan {
                    claim: WARM_ROW_FILLS * run_regions,
                    in_flight: WARM_ROW_FILLS,
                    max_run_bytes: WARM_ROW_RUN_BYTES,
                    first_round_only: false,
                    awaited: false,
                },
            );
        }
    }

    /// Holds `range` of a mapped file — rows read at random: raw vectors,
    /// payloads — in memory as huge pages (see
    /// [`quiver_index::MappedAdvice::hold`]); [`CachedObject::warm`] then reads
    /// them in. For a caller that has the memory to keep them resident (see
    /// [`held_row_bytes`]), before anything reads them. Returns the bytes held:
    /// 0 for an object read through the cache's regions (its row tier decides
    /// what stays).
    pub fn hold_rows(&self, range: Range<u64>) -> u64 {
        let Some(map) = &self.mapped else {
            return 0;
        };
        let end = range.end.min(self.identity.size);
        if range.start >= end {
            return 0;
        }
        let held = self
            .advice
            .hold(map, range.start, (end - range.start) as usize);
        if held > 0 {
            self.held_rows.fetch_add(held, Ordering::Relaxed);
            HELD_ROW_BYTES.fetch_add(held, Ordering::Relaxed);
            METRICS.rows_held_bytes.add(held as i64);
        }
        held
    }

    /// Tells whether [`CachedObject::hold_rows`] holds some of this object's
    /// rows in memory.
    pub fn holds_rows(&self) -> bool {
        self.held_rows.load(Ordering::Relaxed) > 0
    }

    /// Returns the object's key.
    pub fn key(&self) -> &str {
        &self.identity.key
    }

    /// Returns the object's size.
    pub fn size(&self) -> u64 {
        self.identity.size
    }

    /// Returns how many regions of each tier hold this object's bytes, in the
    /// units the cache's `misses` count fills: the hot tier's regions holding a
    /// byte it serves (any byte outside the row tier's ranges), and the row
    /// tier's regions holding a byte of those ranges (0 without a row tier).
    /// The row ranges are known once a segment is open on the object; a mapped
    /// object uses no region and answers `(0, 0)`.
    pub fn regions_by_tier(&self) -> (u64, u64) {
        let size = self.size();
        if self.mapped.is_some() || size == 0 {
            return (0, 0);
        }
        let row_ranges: &[Range<u64>] = match (&self.rows, self.row_ranges.get()) {
            (Some(_), Some(ranges)) => ranges,
            _ => &[],
        };
        let hot_region_bytes = self.inner.region_bytes as u64;
        let hot = (0..size.div_ceil(hot_region_bytes))
            .filter(|region| {
                let start = region * hot_region_bytes;
                let end = (start + hot_region_bytes).min(size);
                let in_row_tier: u64 = row_ranges
                    .iter()
                    .map(|range| range.end.min(end).saturating_sub(range.start.max(start)))
                    .sum();
                in_row_tier < end - start
            })
            .count() as u64;
        let rows = match &self.rows {
            Some(rows) => {
                let row_region_bytes = rows.inner.region_bytes as u64;
                let mut counted: Option<u64> = None;
                let mut regions = 0u64;
                for range in row_ranges.iter().filter(|range| range.start < range.end) {
                    let first = range.start / row_region_bytes;
                    let last = (range.end - 1) / row_region_bytes;
                    // Ranges are in object order: a region shared with the
                    // previous range is counted once.
                    let from = counted.map_or(first, |done| first.max(done + 1));
                    if from <= last {
                        regions += last - from + 1;
                    }
                    counted = Some(counted.map_or(last, |done| done.max(last)));
                }
                regions
            }
            None => 0,
        };
        (hot, rows)
    }

    /// Returns how many regions the object spans.
    pub(crate) fn regions(&self) -> usize {
        self.region_slots.len()
    }

    /// Reads `length` bytes at `offset`: borrowed from the pinned region when the
    /// range lies in one, else copied (and counted).
    #[inline]
    pub fn read(&self, offset: u64, length: usize) -> CacheResult<CacheBytes<'_>> {
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= self.identity.size);
        let Some(end) = end else {
            return Err(self.out_of_range(offset, length));
        };
        if let Some(map) = &self.mapped {
            return Ok(CacheBytes::mapped(&map[offset as usize..end as usize]));
        }
        if let Some(rows) = self.row_tier(offset, end) {
            return rows.read(offset, length);
        }
        if self.inner.is_read_through() {
            return self.read_through(offset..end).map(CacheBytes::copied);
        }
        let region_bytes = self.inner.region_bytes as u64;
        let first = self.inner.region_of(offset);
        let last = if length == 0 {
            first
        } else {
            self.inner.region_of(end - 1)
        };
        if first == last {
            let guard = match self.acquire(first) {
                Ok(guard) => guard,
                Err(CacheError::Full { .. }) => {
                    return self.read_uncached(offset..end).map(CacheBytes::copied);
                }
                Err(error) => return Err(error),
            };
            let start = (offset - first * region_bytes) as usize;
            return Ok(CacheBytes::pinned(guard, start, length));
        }
        let counters = &self.inner.counters;
        counters.add(&counters.boundary_copies, &METRICS.boundary_copies, 1);
        let mut copied = Vec::with_capacity(length);
        for region in first..=last {
            let guard = match self.acquire(region) {
                Ok(guard) => guard,
                Err(CacheError::Full { .. }) => {
                    return self.read_uncached(offset..end).map(CacheBytes::copied);
                }
                Err(error) => return Err(error),
            };
            let region_start = region * region_bytes;
            let from = offset.max(region_start) - region_start;
            let to = end.min(region_start + region_bytes) - region_start;
            copied.extend_from_slice(&guard.bytes()[from as usize..to as usize]);
        }
        Ok(CacheBytes::copied(copied))
    }

    pub(crate) fn out_of_range(&self, offset: u64, length: usize) -> CacheError {
        CacheError::OutOfRange {
            key: self.identity.key.clone(),
            offset,
            length,
            size: self.identity.size,
        }
    }

    pub(crate) fn index_error(&self, error: CacheError) -> IndexError {
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

    /// Starts filling the regions under `ranges` in the background. A mapped
    /// file is left to the faults of its reads: a read-ahead of it here, before
    /// the segment said which of its ranges are scanned, would read them in as
    /// small folios, mapped with 4 KiB pages for as long as they stay cached
    /// (see `quiver_index::MappedAdvice`).
    pub fn prefetch(&self, ranges: &[Range<u64>]) {
        if self.mapped.is_some() {
            return;
        }
        if self.inner.is_read_through() {
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

    /// Returns the slot of region `region` when it is (as far as this object
    /// remembers) in the cache right now; a lock-free look, for deciding what
    /// to fetch ahead.
    fn resident_slot(&self, region: u64) -> Option<usize> {
        let (slot, generation) =
            remembered_fill(self.region_slots[region as usize].load(Ordering::Acquire))?;
        (self.inner.slot_counters[slot]
            .generation
            .load(Ordering::Acquire)
            == generation)
            .then_some(slot)
    }

    /// Fills the regions under `ranges` that are not cached, as `plan` says,
    /// and returns when they are in (or failed: the reads that follow see the
    /// error).
    fn fetch_missing_with(&self, ranges: impl IntoIterator<Item = (u64, usize)>, plan: FetchPlan) {
        fetch_in_rounds(vec![(self, self.missing_regions(ranges))], |_| plan);
    }

    /// The regions of this object's tier under `ranges` that are not resident,
    /// each once, in the order the ranges ask for them.
    fn missing_regions(&self, ranges: impl IntoIterator<Item = (u64, usize)>) -> Vec<u64> {
        let mut missing: Vec<u64> = Vec::new();
        for (offset, length) in ranges {
            let end = offset.saturating_add(length as u64).min(self.identity.size);
            if offset >= end {
                continue;
            }
            for region in self.inner.region_of(offset)..=self.inner.region_of(end - 1) {
                if self.resident_slot(region).is_none() && !missing.contains(&region) {
                    missing.push(region);
                }
            }
        }
        missing
    }

    /// Marks the resident regions of this object's tier under `ranges` awaited
    /// by the reads that follow (see `SlotCounters::awaited`), so that the
    /// fills of the missing ones do not evict them first. Only before a
    /// round is fetched: a query that fetches nothing evicts nothing, and
    /// writes nothing to the slots it shares with other queries.
    fn await_resident(&self, ranges: impl IntoIterator<Item = (u64, usize)>) {
        for (offset, length) in ranges {
            let end = offset.saturating_add(length as u64).min(self.identity.size);
            if offset >= end {
                continue;
            }
            for region in self.inner.region_of(offset)..=self.inner.region_of(end - 1) {
                if let Some(slot) = self.resident_slot(region) {
                    self.inner.slot_counters[slot].await_read();
                }
            }
        }
    }

    /// [`Self::await_resident`] of `ranges`, each in its tier.
    fn await_by_tier(&self, ranges: &[(u64, usize)]) {
        let Some(rows) = self.rows.as_deref() else {
            return self.await_resident(ranges.iter().copied());
        };
        let in_rows = |&(offset, length): &(u64, usize)| {
            self.row_tier(offset, offset.saturating_add(length as u64))
                .is_some()
        };
        rows.await_resident(ranges.iter().copied().filter(in_rows));
        self.await_resident(ranges.iter().copied().filter(|range| !in_rows(range)));
    }

    /// Splits `ranges` by tier and adds each tier's missing regions to `parts`
    /// (see [`fetch_in_rounds`]): a hit's ranges span both tiers (its id in the
    /// hot one, its payload and vector in the row tier).
    fn missing_by_tier<'o>(&'o self, ranges: &[(u64, usize)], parts: &mut Vec<FetchPart<'o>>) {
        let Some(rows) = self.rows.as_deref() else {
            parts.push((self, self.missing_regions(ranges.iter().copied())));
            return;
        };
        let in_rows = |&(offset, length): &(u64, usize)| {
            self.row_tier(offset, offset.saturating_add(length as u64))
                .is_some()
        };
        parts.push((
            rows,
            rows.missing_regions(ranges.iter().copied().filter(in_rows)),
        ));
        if !ranges.iter().all(in_rows) {
            parts.push((
                self,
                self.missing_regions(ranges.iter().copied().filter(|range| !in_rows(range))),
            ));
        }
    }

    /// Returns region `region` pinned (and checked, once the object has
    /// checksums): through the remembered slot without a lock when it still holds
    /// the region's checked fill, else through the table.
    #[inline]
    pub(crate) fn acquire(&self, region: u64) -> CacheResult<RegionGuard<'_>> {
        let remembered = &self.region_slots[region as usize];
        if let Some((slot, generation)) = remembered_fill(remembered.load(Ordering::Acquire))
            && let Some(guard) = self.inner.try_pin(slot, generation)
        {
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
        let guard = self.acquire_verified(region)?;
        if guard.filled() {
            self.advise_filled(region, guard.slot());
        }
        // The generation the guard pinned, not the slot's current one: a discard
        // after the pin must not be remembered as a good fill.
        remembered.store(
            remembered_location(guard.slot(), guard.generation()),
            Ordering::Release,
        );
        Ok(guard)
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
            && let Some(file) = &self.inner.file
        {
            file.advise_region(slot, self.inner.region_bytes, *pattern);
        }
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
        if let Some(map) = &self.mapped {
            self.advice.advise(map, offset, length, pattern);
            return;
        }
        self.hints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((offset..offset + length as u64, pattern));
    }

    fn verify_with(&self, checksums: &Arc<ChunkChecksums>) -> bool {
        // A mapped file's bytes never change: the segment checks each chunk on
        // its first read, like any plain file.
        if self.mapped.is_some() {
            return false;
        }
        // One segment opens one object; a second table would be the same one.
        let _ = self.checksums.set(checksums.clone());
        if let Some(rows) = &self.rows {
            let _ = rows.checksums.set(checksums.clone());
            let _ = self
                .row_ranges
                .set(row_sections(checksums, rows.inner.region_bytes as u64));
        }
        true
    }

    fn fetch_ahead(&self, ranges: &[(u64, usize)]) {
        Self::fetch_ahead_together(&[(self, ranges)]);
    }

    fn fetch_ahead_together(requests: &[(&Self, &[(u64, usize)])]) {
        // Every object's missing regions, in both tiers, in one round: a
        // search over several segments, or a hit's id (hot tier) with its
        // payload (row tier), waits for the store once, not once per object
        // and tier.
        let mut parts = Vec::with_capacity(requests.len() * 2);
        for &(object, ranges) in requests {
            if let Some(map) = &object.mapped {
                object.advice.fetch_ahead(map, ranges);
            } else if !object.inner.is_read_through() {
                object.missing_by_tier(ranges, &mut parts);
            }
        }
        if !worth_a_round(&parts) {
            return;
        }
        for &(object, ranges) in requests {
            if object.mapped.is_none() {
                object.await_by_tier(ranges);
            }
        }
        fetch_in_rounds(parts, |object| FetchPlan::query(object, false));
    }

    fn scans_ahead(&self) -> bool {
        // A mapped file's scanned sections come in as huge folios by faults
        // (read-ahead would split them); a read-through cache keeps nothing.
        self.mapped.is_none() && !self.inner.is_read_through()
    }

    fn fetch_scan_ahead_together(requests: &[(&Self, &[(u64, usize)])]) {
        let mut parts = Vec::with_capacity(requests.len());
        for &(object, ranges) in requests {
            if object.scans_ahead() {
                parts.push((object, object.missing_regions(ranges.iter().copied())));
            }
        }
        if !worth_a_round(&parts) {
            return;
        }
        for &(object, ranges) in requests {
            if object.scans_ahead() {
                object.await_resident(ranges.iter().copied());
            }
        }
        fetch_in_rounds(parts, |object| FetchPlan::query(object, true));
    }

    fn read_ahead(&self, offset: u64, length: usize) {
        match &self.mapped {
            Some(map) => self.advice.read_ahead(map, offset, length),
            None => self.fetch_ahead(&[(offset, length)]),
        }
    }

    fn discard(&self, offset: u64, length: u64) {
        if self.mapped.is_some() || self.inner.is_read_through() || length == 0 {
            return;
        }
        let end = offset.saturating_add(length).min(self.identity.size);
        if offset >= end {
            return;
        }
        if let Some(rows) = self.row_tier(offset, end) {
            return rows.discard(offset, end - offset);
        }
        for region in self.inner.region_of(offset)..=self.inner.region_of(end - 1) {
            self.inner.discard(&self.identity, region);
        }
    }
}

/// How a fetch-ahead claims and fetches the regions it finds missing.
#[derive(Clone, Copy, Debug)]
struct FetchPlan {
    /// Regions claimed (pinned) together in one round.
    claim: usize,
    /// Requests in flight at a time.
    in_flight: usize,
    /// Neighbouring regions go out as one request of up to this many bytes.
    max_run_bytes: usize,
    /// Fetches the first round only and leaves the rest to the reads.
    first_round_only: bool,
    /// For a query's reads that follow: its regions (fetched, or found
    /// resident) are kept from eviction until read (`SlotCounters::awaited`).
    awaited: bool,
}

impl FetchPlan {
    /// A query's fetch-ahead in `object`'s tier: up to a quarter of the tier
    /// (at least [`FETCH_AHEAD_FILLS`] regions) claimed together, so that the
    /// queries in flight still find regions to claim, and
    /// [`FETCH_AHEAD_FILLS`] requests in flight. Claimed 16 at a time instead,
    /// a later batch's claims evicted an earlier batch's fresh fills (the
    /// least used regions) before they were read, and each was fetched again
    /// on its own (a searcher with a 48 MiB cache: ~100 waits for ~200 regions
    /// on its slowest queries). A scan (`first_round_only`) that needs more
    /// than a round would evict its own first round the same way: it fetches
    /// the regions of the lists it probes first, and reads the rest as it goes.
    fn query(object: &CachedObject, first_round_only: bool) -> FetchPlan {
        FetchPlan {
            claim: FETCH_AHEAD_FILLS.max(object.inner.slot_counters.len() / 4),
            in_flight: FETCH_AHEAD_FILLS,
            max_run_bytes: FETCH_AHEAD_RUN_BYTES,
            first_round_only,
            awaited: true,
        }
    }
}

/// Tells whether `parts` miss two regions or more in all: one missing region
/// is left to the read that needs it (fetching ahead pays for more).
fn worth_a_round(parts: &[FetchPart<'_>]) -> bool {
    parts
        .iter()
        .map(|(_, missing)| missing.len())
        .sum::<usize>()
        >= 2
}

/// One object (in its own tier) and the regions of it a fetch-ahead wants.
type FetchPart<'o> = (&'o CachedObject, Vec<u64>);

/// Fetches the missing regions of `parts` in rounds, each part's tier claiming
/// at most its plan's `claim` regions per round (the parts of one tier share
/// it), every part's requests of a round in flight together: the caller waits
/// once per round, whatever the objects and tiers. One region missing in all
/// is left to the read that needs it (fetching ahead pays for more). A
/// `first_round_only` plan fetches one round and leaves the rest to the reads.
/// A round never evicts a region another query awaits: what it could not take
/// goes in the next round (those queries have read some of theirs by then),
/// until a round takes nothing, and then the reads fetch the rest
/// (`quiver_cache_fetch_ahead_left_total`).
fn fetch_in_rounds(mut parts: Vec<FetchPart<'_>>, plan: impl Fn(&CachedObject) -> FetchPlan) {
    if !worth_a_round(&parts) {
        return;
    }
    parts.retain(|(_, missing)| !missing.is_empty());
    let plans: Vec<FetchPlan> = parts.iter().map(|(object, _)| plan(object)).collect();
    let tier_of = |index: usize| Arc::as_ptr(&parts[index].0.inner);
    // A single round is shared evenly by a tier's parts (each member's lists
    // probed first); rounds that go on until all is in take the parts in turn.
    let shares: Vec<usize> = (0..parts.len())
        .map(|index| match plans[index].first_round_only {
            true => {
                let sharing = (0..parts.len())
                    .filter(|&other| tier_of(other) == tier_of(index))
                    .count();
                (plans[index].claim / sharing).max(1)
            }
            false => usize::MAX,
        })
        .collect();
    let mut taken = vec![0; parts.len()];
    // Regions of each part the last round could not take (every region it
    // could evict pinned or awaited by other queries' reads).
    let mut stopped_at = vec![0; parts.len()];
    loop {
        // Whether this round took any region on (claimed it, or found it in).
        let mut progressed = false;
        stopped_at.fill(0);
        // Each tier's claim for this round, shared by its parts in order.
        let mut claims: Vec<(*const Inner, usize)> = Vec::new();
        let mut pending = Vec::new();
        for (index, (object, missing)) in parts.iter().enumerate() {
            let tier = tier_of(index);
            let left = match claims.iter_mut().find(|(of, _)| *of == tier) {
                Some((_, left)) => left,
                None => {
                    claims.push((tier, plans[index].claim.max(1)));
                    &mut claims.last_mut().expect("just pushed").1
                }
            };
            let regions = &missing[taken[index]..];
            let count = regions.len().min(*left).min(shares[index]);
            if count == 0 {
                continue;
            }
            *left -= count;
            // A round's regions are claimed together (pinned until all are
            // in), then released: the reads that follow pin (and check) them.
            let (fills, stopped) = object.inner.start_fills(
                &object.identity,
                &regions[..count],
                plans[index].max_run_bytes,
                plans[index].in_flight,
                plans[index].awaited,
            );
            pending.extend(fills);
            // What a round left (every region it could take awaited by other
            // queries' reads) goes in the next round: by then those queries
            // have read some of theirs.
            taken[index] += count - stopped;
            stopped_at[index] = stopped;
            progressed |= count > stopped;
            let counters = &object.inner.counters;
            counters.add(
                &counters.fetched_ahead,
                &METRICS.fetched_ahead,
                (count - stopped) as u64,
            );
        }
        finish_fills(pending);
        let done = parts
            .iter()
            .zip(&taken)
            .all(|((_, missing), &taken)| taken == missing.len());
        // Nothing could be taken (the reads fetch the rest), all is in, or
        // one round was asked for.
        if !progressed || done || plans.iter().any(|plan| plan.first_round_only) {
            for ((object, _), &stopped) in parts.iter().zip(&stopped_at) {
                let counters = &object.inner.counters;
                counters.add(
                    &counters.fetch_ahead_left,
                    &METRICS.fetch_ahead_left,
                    stopped as u64,
                );
            }
            return;
        }
    }
}

/// Returns the object ranges of the sections read a row at a time (raw vectors,
/// payloads) whose chunks fit in a row region of `region_bytes`: those the row
/// tier serves. Sections of v1 segments (1 MiB chunks) stay in the hot tier.
fn row_sections(checksums: &ChunkChecksums, region_bytes: u64) -> Vec<Range<u64>> {
    let mut sections: Vec<(quiver_index::SectionKind, Range<u64>, u64)> = Vec::new();
    for chunk in checksums.overlapping(0..u64::MAX) {
        if !matches!(
            chunk.section,
            quiver_index::SectionKind::RawVectors | quiver_index::SectionKind::Payloads
        ) {
            continue;
        }
        match sections.last_mut() {
            Some((kind, range, largest)) if *kind == chunk.section && range.end == chunk.start => {
                range.end = chunk.end;
                *largest = (*largest).max(chunk.end - chunk.start);
            }
            _ => sections.push((
                chunk.section,
                chunk.start..chunk.end,
                chunk.end - chunk.start,
            )),
        }
    }
    sections
        .into_iter()
        .filter(|(_, _, largest)| *largest <= region_bytes)
        .map(|(_, range, _)| range)
        .collect()
}
