//! Reads around the regions. In read-through mode (the cache file could not be
//! created for lack of space) every read is a ranged GET straight from the
//! object store (slow, but it answers); with a file, so is a read that finds
//! every region pinned by other readers (the cache is small for the reads in
//! flight): it is answered uncached rather than failed. Once the object has checksums, the whole chunks under a read are
//! fetched and checked, so no read-through byte is unchecked either; checked
//! chunks stay in a bounded memory cache for the next reads of the query.

use std::ops::Range;
use std::sync::Arc;

use quiver_index::SegmentChunk;

use crate::error::{CacheError, CacheResult};
use crate::inner::Inner;
use crate::metrics::{METRICS, ReadCounts};
use crate::object::CachedObject;

/// Checked chunks by (object key, chunk start).
pub(crate) type CheckedChunks = moka::sync::Cache<(String, u64), Arc<Vec<u8>>>;

/// Memory for checked chunks read around the regions.
const READ_THROUGH_CHUNK_BYTES: u64 = 64 << 20;

/// Returns the bounded memory cache of checked chunks read around the regions.
pub(crate) fn checked_chunks() -> CheckedChunks {
    moka::sync::Cache::builder()
        .max_capacity(READ_THROUGH_CHUNK_BYTES)
        .weigher(|_, bytes: &Arc<Vec<u8>>| u32::try_from(bytes.len()).unwrap_or(u32::MAX))
        .build()
}

impl Inner {
    /// Reads `range` of `key` straight from the object store (read-through mode).
    pub(crate) fn read_direct(&self, key: &str, range: Range<u64>) -> CacheResult<Vec<u8>> {
        let length = range.end - range.start;
        if length == 0 {
            return Ok(Vec::new());
        }
        let waiting = std::time::Instant::now();
        let fetched = self.get_range(key, range.clone());
        ReadCounts::add_wait(waiting.elapsed());
        let bytes = fetched.map_err(|error| {
            self.counters
                .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
            CacheError::Fill {
                key: key.to_string(),
                region: range.start / self.region_bytes as u64,
                message: error,
            }
        })?;
        self.counters.add(&self.counters.misses, &METRICS.misses, 1);
        self.counters
            .add(&self.counters.bytes_fetched, &METRICS.bytes_fetched, length);
        ReadCounts::add_miss(length, self.is_row_tier());
        Ok(bytes.to_vec())
    }
}

impl CachedObject {
    /// Reads `range` straight from the object store because every region is
    /// pinned by other readers (counted; checked like any read-through read).
    pub(crate) fn read_uncached(&self, range: Range<u64>) -> CacheResult<Vec<u8>> {
        let counters = &self.inner.counters;
        counters.add(&counters.uncached_reads, &METRICS.uncached_reads, 1);
        self.read_through(range)
    }

    /// Reads `range` straight from the object store (read-through mode). Once the
    /// object has checksums, the whole chunks under the range are fetched and
    /// checked, so no read-through byte is unchecked either; checked chunks stay
    /// in a bounded memory cache for the next reads.
    pub(crate) fn read_through(&self, range: Range<u64>) -> CacheResult<Vec<u8>> {
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
    fn checked_chunk(&self, chunk: &SegmentChunk) -> CacheResult<Arc<Vec<u8>>> {
        let key = &self.identity.key;
        let cache_key = (key.clone(), chunk.start);
        if let Some(bytes) = self.inner.verified_chunks.get(&cache_key) {
            return Ok(bytes);
        }
        let mut attempts = 0;
        loop {
            let fetched = self
                .inner
                .read_direct(key, chunk.start..chunk.end.min(self.identity.size))?;
            if chunk.matches(&fetched) {
                let bytes = Arc::new(fetched);
                self.inner.verified_chunks.insert(cache_key, bytes.clone());
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
}
