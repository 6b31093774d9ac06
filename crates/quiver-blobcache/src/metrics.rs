//! Prometheus metrics of the region cache (process-wide), and per-cache counters
//! returned by [`crate::BlobCache::stats`].

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{
    IntCounter, IntGauge, IntGaugeVec, register_int_counter, register_int_gauge,
    register_int_gauge_vec,
};

pub(crate) struct CacheMetrics {
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub bytes_fetched: IntCounter,
    pub evictions: IntCounter,
    pub awaited_evictions: IntCounter,
    pub boundary_copies: IntCounter,
    pub fill_errors: IntCounter,
    pub discards: IntCounter,
    pub check_bytes_fetched: IntCounter,
    pub fills_in_flight: IntGauge,
    pub pinned_regions: IntGaugeVec,
    pub resident_regions: IntGaugeVec,
    pub read_through: IntGauge,
    pub mapped_objects: IntCounter,
    pub uncached_reads: IntCounter,
    pub fetched_ahead: IntCounter,
    pub fetch_ahead_left: IntCounter,
    pub rows_held_bytes: IntGauge,
}

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric registers once")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    register_int_gauge!(name, help).expect("metric registers once")
}

pub(crate) static METRICS: LazyLock<CacheMetrics> = LazyLock::new(|| CacheMetrics {
    hits: counter(
        "quiver_cache_hits_total",
        "Region lookups served from the cache.",
    ),
    misses: counter(
        "quiver_cache_misses_total",
        "Region lookups that had to fetch from the object store.",
    ),
    bytes_fetched: counter(
        "quiver_cache_bytes_fetched_total",
        "Bytes fetched from the object store into regions.",
    ),
    evictions: counter(
        "quiver_cache_evictions_total",
        "Regions evicted to make room.",
    ),
    awaited_evictions: counter(
        "quiver_cache_awaited_evictions_total",
        "Regions evicted before the query that fetched them ahead read them, because nothing else in the tier could go (more cold queries at once than the cache holds).",
    ),
    boundary_copies: counter(
        "quiver_cache_boundary_copies_total",
        "Reads that crossed a region boundary and were copied.",
    ),
    fill_errors: counter(
        "quiver_cache_fill_errors_total",
        "Region fills that failed.",
    ),
    discards: counter(
        "quiver_cache_discarded_regions_total",
        "Region fills (or read-through reads) dropped because their bytes failed the segment's chunk checksums; fetched again.",
    ),
    check_bytes_fetched: counter(
        "quiver_cache_check_bytes_fetched_total",
        "Bytes fetched from the object store only to complete a chunk being checked, whose other part is in a region not cached (not kept).",
    ),
    fills_in_flight: gauge("quiver_cache_fills_in_flight", "Region fills in progress."),
    rows_held_bytes: gauge(
        "quiver_cache_rows_held_bytes",
        "Bytes of rows (raw vectors, payloads) of locally mapped segment files held in memory as huge pages.",
    ),
    pinned_regions: register_int_gauge_vec!(
        "quiver_cache_pinned_regions",
        "Regions pinned by readers (updated when stats are read), by tier (hot, rows).",
        &["tier"]
    )
    .expect("metric registers once"),
    resident_regions: register_int_gauge_vec!(
        "quiver_cache_resident_regions",
        "Regions holding data, by tier (hot, rows).",
        &["tier"]
    )
    .expect("metric registers once"),
    read_through: gauge(
        "quiver_cache_read_through",
        "1 when the cache file could not be created (disk full) and every read goes to the object store.",
    ),
    mapped_objects: counter(
        "quiver_cache_mapped_objects_total",
        "Objects of a file:// store opened by mapping their files (read without copying into regions).",
    ),
    uncached_reads: counter(
        "quiver_cache_uncached_reads_total",
        "Reads answered straight from the object store (checked, not kept in a region) because every region was pinned by other readers.",
    ),
    fetched_ahead: counter(
        "quiver_cache_fetched_ahead_total",
        "Regions filled concurrently ahead of a query's reads (the raw vectors of its rescoring candidates) instead of one after another.",
    ),
    fetch_ahead_left: counter(
        "quiver_cache_fetch_ahead_left_total",
        "Regions a fetch-ahead round left unfetched because every region it could evict was pinned or awaited by another query (their reads fetch them one at a time).",
    ),
});

/// Counters of one cache since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Region lookups served from memory.
    pub hits: u64,
    /// Region lookups that fetched from the object store.
    pub misses: u64,
    /// Bytes fetched from the object store.
    pub bytes_fetched: u64,
    /// Regions evicted.
    pub evictions: u64,
    /// Regions evicted before the query awaiting them read them (nothing else
    /// in the tier could go).
    pub awaited_evictions: u64,
    /// Reads that crossed a region boundary (copied).
    pub boundary_copies: u64,
    /// Failed fills.
    pub fill_errors: u64,
    /// Region fills (or read-through reads) dropped because they failed their
    /// chunk checksums.
    pub discarded_regions: u64,
    /// Bytes fetched only to complete a chunk being checked (not kept).
    pub check_bytes_fetched: u64,
    /// Reads answered straight from the object store because every region was
    /// pinned (the cache is small for the reads in flight): slower, never a failure.
    pub uncached_reads: u64,
    /// Regions filled concurrently ahead of a query's reads.
    pub fetched_ahead: u64,
    /// Regions a fetch-ahead round left because every region it could evict
    /// was pinned or awaited by another query.
    pub fetch_ahead_left: u64,
    /// Regions pinned right now.
    pub pinned_regions: u64,
    /// Regions holding data right now.
    pub resident_regions: u64,
    /// Regions in the cache file.
    pub total_regions: u64,
}

impl CacheStats {
    /// Returns the sum of two tiers' counters.
    pub fn plus(&self, other: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            bytes_fetched: self.bytes_fetched + other.bytes_fetched,
            evictions: self.evictions + other.evictions,
            awaited_evictions: self.awaited_evictions + other.awaited_evictions,
            boundary_copies: self.boundary_copies + other.boundary_copies,
            fill_errors: self.fill_errors + other.fill_errors,
            discarded_regions: self.discarded_regions + other.discarded_regions,
            check_bytes_fetched: self.check_bytes_fetched + other.check_bytes_fetched,
            uncached_reads: self.uncached_reads + other.uncached_reads,
            fetched_ahead: self.fetched_ahead + other.fetched_ahead,
            fetch_ahead_left: self.fetch_ahead_left + other.fetch_ahead_left,
            pinned_regions: self.pinned_regions + other.pinned_regions,
            resident_regions: self.resident_regions + other.resident_regions,
            total_regions: self.total_regions + other.total_regions,
        }
    }
}

/// Region reads made by one thread: what a query cost the cache, measured as the
/// difference of two snapshots taken on the thread that ran it
/// ([`ReadCounts::of_this_thread`]). Fills it fetched ahead count as its own
/// (they are finished on its thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Region lookups served from the cache.
    pub region_hits: u64,
    /// Region lookups that fetched from the object store (every read, in
    /// read-through mode).
    pub region_misses: u64,
    /// Bytes fetched from the object store.
    pub bytes_fetched: u64,
    /// Of the hits, those in the row tier (raw vectors and payloads: rescoring
    /// and returned hits), read from the local cache file.
    pub row_hits: u64,
    /// Of the misses, those in the row tier, fetched from the object store.
    pub row_misses: u64,
    /// Time the thread waited for the object store: its fetches, fills by
    /// other readers it waited on, and rounds of fetching ahead (nanoseconds).
    pub store_wait_nanos: u64,
    /// Times the thread waited for the object store: once per fill it made
    /// or waited on, and once per round of fetching ahead (however many
    /// regions the round fetched). Over a store far away, each costs a round
    /// trip.
    pub store_waits: u64,
}

thread_local! {
    static THREAD_READS: std::cell::Cell<ReadCounts> = const {
        std::cell::Cell::new(ReadCounts {
            region_hits: 0,
            region_misses: 0,
            bytes_fetched: 0,
            row_hits: 0,
            row_misses: 0,
            store_wait_nanos: 0,
            store_waits: 0,
        })
    };
}

impl ReadCounts {
    /// Returns the reads made through any cache by the calling thread so far.
    pub fn of_this_thread() -> ReadCounts {
        THREAD_READS.with(std::cell::Cell::get)
    }

    /// Returns the reads made between `earlier` and `self`.
    pub fn since(self, earlier: ReadCounts) -> ReadCounts {
        ReadCounts {
            region_hits: self.region_hits.saturating_sub(earlier.region_hits),
            region_misses: self.region_misses.saturating_sub(earlier.region_misses),
            bytes_fetched: self.bytes_fetched.saturating_sub(earlier.bytes_fetched),
            row_hits: self.row_hits.saturating_sub(earlier.row_hits),
            row_misses: self.row_misses.saturating_sub(earlier.row_misses),
            store_wait_nanos: self
                .store_wait_nanos
                .saturating_sub(earlier.store_wait_nanos),
            store_waits: self.store_waits.saturating_sub(earlier.store_waits),
        }
    }

    fn update(change: impl FnOnce(&mut ReadCounts)) {
        THREAD_READS.with(|counts| {
            let mut value = counts.get();
            change(&mut value);
            counts.set(value);
        });
    }

    #[inline]
    pub(crate) fn add_hit(row_tier: bool) {
        Self::update(|value| {
            value.region_hits += 1;
            value.row_hits += u64::from(row_tier);
        });
    }

    pub(crate) fn add_miss(bytes: u64, row_tier: bool) {
        Self::update(|value| {
            value.region_misses += 1;
            value.row_misses += u64::from(row_tier);
            value.bytes_fetched += bytes;
        });
    }

    /// Counts time the calling thread waited for the object store.
    pub(crate) fn add_wait(waited: std::time::Duration) {
        Self::update(|value| {
            value.store_wait_nanos += u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
            value.store_waits += 1;
        });
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub evictions: AtomicU64,
    pub awaited_evictions: AtomicU64,
    pub boundary_copies: AtomicU64,
    pub fill_errors: AtomicU64,
    pub discards: AtomicU64,
    pub check_bytes_fetched: AtomicU64,
    pub uncached_reads: AtomicU64,
    pub fetched_ahead: AtomicU64,
    pub fetch_ahead_left: AtomicU64,
}

impl Counters {
    pub fn add(&self, counter: &AtomicU64, metric: &IntCounter, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
        metric.inc_by(amount);
    }
}
