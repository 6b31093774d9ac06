//! Chunk verification of fills. Once a segment is open, its object carries the
//! segment's chunk checksums, and each fill of a region is checked against them
//! (every chunk lying in the region, completed from the neighbouring regions or
//! the store) before the first reader of that object gets any of its bytes —
//! once per fill, so a region fetched again after an eviction is checked again,
//! and the hit path only reads one flag. A fill that fails is dropped and fetched
//! once more; failing again, the read fails naming the object.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use quiver_index::{ChunkChecksums, SegmentChunk};

use crate::bytes::RegionGuard;
use crate::error::{CacheError, CacheResult};
use crate::inner::{Inner, ObjectIdentity};
use crate::metrics::METRICS;
use crate::object::CachedObject;

/// A chunk that did not match its checksum while a region was checked.
struct ChecksumMismatch {
    chunk: SegmentChunk,
    /// Cached neighbouring fills that held part of the chunk and were not checked
    /// themselves: (region, slot, generation).
    suspects: Vec<(u64, usize, u64)>,
}

impl CachedObject {
    /// Returns region `region` pinned, filling it on a miss; once the object has
    /// checksums, only after its current fill has passed them (checked by the first
    /// reader of each fill). A fill that fails is dropped, with the cached
    /// neighbours that may hold the damage, and fetched once more; failing again,
    /// the read fails with [`CacheError::Damaged`].
    pub(crate) fn acquire_verified(&self, region: u64) -> CacheResult<RegionGuard<'_>> {
        let Some(checksums) = self.checksums.get() else {
            return self.inner.acquire(&self.identity, region);
        };
        let mut attempts = 0;
        loop {
            let guard = self.inner.acquire(&self.identity, region)?;
            let counters = &self.inner.slot_counters[guard.slot()];
            if counters.verified.load(Ordering::Acquire) {
                return Ok(guard);
            }
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
            self.inner.discard_fill(
                &self.identity,
                region,
                Some((guard.slot(), guard.generation())),
            );
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
}

impl Inner {
    /// Returns neighbour region `region` of `object` pinned, for a check that needs
    /// `part_bytes` of it: when it is cached, or when the part is at least half a
    /// region (small regions: the chunk spans several, and they are filled as
    /// reading the chunk would) and a slot is free for it. `None`: fetch the part
    /// alone.
    fn neighbour_for_check(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
        part_bytes: u64,
    ) -> CacheResult<Option<RegionGuard<'_>>> {
        if let Some(resident) = self.pin_resident(object, region) {
            return Ok(Some(resident));
        }
        if part_bytes * 2 < self.region_bytes as u64 {
            return Ok(None);
        }
        match self.acquire(object, region) {
            Ok(guard) => Ok(Some(guard)),
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
                    Some(neighbour) => {
                        crc = crc32c::crc32c_append(crc, &neighbour.bytes()[local]);
                        if !self.slot_counters[neighbour.slot()]
                            .verified
                            .load(Ordering::Acquire)
                        {
                            suspects.push((part_region, neighbour.slot(), neighbour.generation()));
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
            .get_range(&object.key, range.clone())
            .map_err(|error| {
                self.counters
                    .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
                CacheError::Fill {
                    key: object.key.clone(),
                    region: self.region_of(range.start),
                    message: error,
                }
            })?;
        self.counters.add(
            &self.counters.check_bytes_fetched,
            &METRICS.check_bytes_fetched,
            length,
        );
        Ok(crc32c::crc32c_append(crc, &fetched))
    }
}
