//! Read sessions: a query's many reads of one object, each region pinned once.

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::atomic::Ordering;

use quiver_index::{IndexResult, ReadSession};

use crate::error::{CacheError, CacheResult};
use crate::object::CachedObject;

/// A query's reads of one [`CachedObject`]: each region is pinned on its first
/// read and stays pinned until the session is dropped, so later reads of the same
/// region are plain slices of the mapping — no atomic operation, no lookup.
///
/// A session holds every region it touched for its whole life. When the cache
/// is too small for the regions of the queries in flight (every region pinned),
/// a read is answered uncached, straight from the object store and checked:
/// slower, never a failure.
///
/// Every slice a session returns borrows the session, so none outlives its pins:
///
/// ```compile_fail,E0597
/// fn outlive_the_session(object: &quiver_blobcache::CachedObject) -> usize {
///     let bytes = {
///         let session = object.session();
///         session.read(0, 16).unwrap()
///     };
///     bytes.len()
/// }
/// ```
pub struct CacheSession<'a> {
    object: &'a CachedObject,
    /// Per region of the object: `slot + 1` once this session pinned it, else 0.
    pinned_slots: Vec<Cell<u32>>,
}

impl<'a> CacheSession<'a> {
    pub(crate) fn new(object: &'a CachedObject) -> Self {
        CacheSession {
            object,
            pinned_slots: (0..object.regions()).map(|_| Cell::new(0)).collect(),
        }
    }

    /// Returns the slot holding `region`, pinning it on the session's first use.
    #[inline]
    fn pinned_slot(&self, region: u64) -> CacheResult<usize> {
        let remembered = &self.pinned_slots[region as usize];
        match remembered.get() {
            0 => {
                let slot = self.object.acquire(region)?.into_pinned_slot();
                // Slots fit in 24 bits (the cache refuses more), so `slot + 1` fits.
                remembered.set(slot as u32 + 1);
                Ok(slot)
            }
            slot_plus_one => Ok(slot_plus_one as usize - 1),
        }
    }

    /// Reads `length` bytes at `offset`: a slice of the mapping inside one region,
    /// a counted copy across regions. The slice borrows the session.
    pub fn read(&self, offset: u64, length: usize) -> CacheResult<Cow<'_, [u8]>> {
        let object = self.object;
        let end = offset
            .checked_add(length as u64)
            .filter(|&end| end <= object.identity.size);
        let Some(end) = end else {
            return Err(object.out_of_range(offset, length));
        };
        if let Some(map) = &object.mapped {
            return Ok(Cow::Borrowed(&map[offset as usize..end as usize]));
        }
        // Row sections (raw vectors, payloads) live in the row tier, read a row
        // at a time outside sessions; a session read of one is a copy.
        if let Some(rows) = object.row_tier(offset, end) {
            return rows
                .read(offset, length)
                .map(|bytes| Cow::Owned(bytes.into_vec()));
        }
        let inner = &object.inner;
        let first = inner.region_of(offset);
        let last = if length == 0 {
            first
        } else {
            inner.region_of(end - 1)
        };
        if first != last || inner.is_read_through() {
            return object
                .read(offset, length)
                .map(|bytes| Cow::Owned(bytes.into_vec()));
        }
        let slot = match self.pinned_slot(first) {
            Ok(slot) => slot,
            // Every region is pinned by other readers: answered uncached.
            Err(CacheError::Full { .. }) => {
                return object.read_uncached(offset..end).map(Cow::Owned);
            }
            Err(error) => return Err(error),
        };
        let counters = &inner.slot_counters[slot];
        if counters.discarded.load(Ordering::Acquire) {
            return Err(CacheError::Discarded {
                key: object.identity.key.clone(),
                region: first,
            });
        }
        let start = (offset - first * inner.region_bytes as u64) as usize;
        debug_assert!(
            start + length <= counters.length.load(Ordering::Acquire),
            "a range inside the object lies inside its region's filled bytes"
        );
        // SAFETY: this session holds a pin on `slot` until it is dropped, and the
        // returned slice borrows the session, so the region stays Ready and
        // unchanged while the slice lives; `start + length` is inside the region
        // (both ends lie in region `first`), and inside its filled bytes because
        // `end` is inside the object and a fill holds all of its range.
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
