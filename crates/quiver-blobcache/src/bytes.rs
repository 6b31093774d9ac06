//! The bytes a reader gets: a pinned region ([`RegionGuard`]) and the bytes of one
//! read ([`CacheBytes`]), which own the pin that keeps them valid.
//!
//! Soundness rests on one rule: no `&[u8]` into the mapping is ever handed out
//! with a lifetime longer than a borrow of the value that holds its pin. A region
//! is rewritten only once nobody pins it, so a slice that cannot outlive its pin
//! never sees its bytes change.

use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;

use crate::inner::Inner;

/// A pinned region: its bytes stay put until the guard is dropped.
pub(crate) struct RegionGuard<'a> {
    inner: &'a Inner,
    slot: usize,
    /// Filled bytes of the region.
    length: usize,
    /// The fill this guard pins (the slot's generation when it was pinned).
    generation: u64,
    /// True when this read filled the region (a miss).
    filled: bool,
}

impl<'a> RegionGuard<'a> {
    /// Wraps a pin of `slot` the caller has just taken (and now hands over).
    #[inline]
    pub(crate) fn pinned(
        inner: &'a Inner,
        slot: usize,
        length: usize,
        generation: u64,
        filled: bool,
    ) -> Self {
        debug_assert!(length <= inner.region_bytes);
        RegionGuard {
            inner,
            slot,
            length,
            generation,
            filled,
        }
    }

    /// Returns the pinned slot.
    #[inline]
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// Returns the generation of the fill this guard pins.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Tells whether this read filled the region (a miss).
    #[inline]
    pub(crate) fn filled(&self) -> bool {
        self.filled
    }

    /// Keeps the pin past the guard: returns the slot, whose pin the caller now
    /// owns and must release with `Inner::unpin`.
    pub(crate) fn into_pinned_slot(self) -> usize {
        let slot = self.slot;
        std::mem::forget(self);
        slot
    }

    /// Returns the region's filled bytes, borrowed from the guard.
    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `Inner`; the region is Ready and
        // pinned by this guard, so nothing writes to it until the guard drops (and
        // the slice borrows the guard); `length` bytes of it were filled.
        unsafe { std::slice::from_raw_parts(self.inner.region_pointer(self.slot), self.length) }
    }
}

impl Drop for RegionGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.inner.unpin(self.slot);
    }
}

/// Bytes read through the cache: a slice of a pinned region (zero copy), or an
/// owned copy when the range crossed a region boundary (or the cache reads
/// through). Dereferences to the bytes; the region stays pinned until this value
/// is dropped, and no slice of it can outlive it.
///
/// # Examples
///
/// ```
/// use quiver_blobcache::{BlobCache, BlobCacheConfig};
/// use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
///
/// let runtime = tokio::runtime::Runtime::new()?;
/// let storage = Storage::open(&StoreUrl::Memory, &S3Settings::default(), StorageOptions::default())?;
/// runtime.block_on(storage.put("segments/a", bytes::Bytes::from(vec![7u8; 10_000])))?;
/// let directory = tempfile::tempdir()?;
/// let config = BlobCacheConfig {
///     directory: directory.path().to_path_buf(),
///     capacity_bytes: 4 << 20,
///     region_bytes: 1 << 20,
///     map_local_files: true,
///     row_region_bytes: 0,
/// };
/// let cache = BlobCache::new(&config, storage, runtime.handle().clone())?;
/// let object = cache.open_blocking("segments/a")?;
///
/// let bytes = object.read(100, 16)?; // pins region 0
/// assert_eq!(&bytes[..], &[7u8; 16]);
/// assert_eq!(cache.stats().pinned_regions, 1);
/// let copy = bytes.to_vec(); // what must outlive the pin is copied out
/// drop(bytes); // unpins
/// assert_eq!(cache.stats().pinned_regions, 0);
/// assert_eq!(copy.len(), 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// The bytes cannot be kept past the value that pins them: returning a slice of
/// a read that the function drops does not compile,
///
/// ```compile_fail,E0515
/// fn first_bytes(object: &quiver_blobcache::CachedObject) -> &[u8] {
///     let bytes = object.read(0, 16).unwrap();
///     &bytes[..]
/// }
/// ```
///
/// nor does dropping (or moving away) the pin while a slice of it is in use.
///
/// ```compile_fail,E0505
/// fn keep_after_unpin(object: &quiver_blobcache::CachedObject) -> u8 {
///     let bytes = object.read(0, 16).unwrap();
///     let slice: &[u8] = &bytes;
///     drop(bytes);
///     slice[0]
/// }
/// ```
pub struct CacheBytes<'a> {
    repr: Repr<'a>,
}

enum Repr<'a> {
    /// A range inside one region: `length` bytes at `start`, valid while
    /// `_region_guard` pins the region (held for its pin, released on drop).
    Pinned {
        start: NonNull<u8>,
        length: usize,
        _region_guard: RegionGuard<'a>,
    },
    /// A range spanning regions (or read through), copied.
    Copied(Vec<u8>),
    /// A range of an object mapped from its own file: a plain borrow of the
    /// mapping, which lives as long as the object.
    Mapped(&'a [u8]),
}

// SAFETY: the only non-Send/Sync part is `start`, a pointer to bytes that nobody
// writes while the region guard pins them; sharing or sending it is like sharing or
// sending a `&[u8]`, which the guard (and so `Inner`) allows.
unsafe impl<'a> Send for CacheBytes<'a> where RegionGuard<'a>: Send {}
// SAFETY: as for `Send`.
unsafe impl<'a> Sync for CacheBytes<'a> where RegionGuard<'a>: Sync {}

impl<'a> CacheBytes<'a> {
    /// Returns `length` bytes at `start` (within the region's filled bytes) of the
    /// region `region_guard` pins.
    #[inline]
    pub(crate) fn pinned(region_guard: RegionGuard<'a>, start: usize, length: usize) -> Self {
        let region = region_guard.bytes();
        assert!(
            start <= region.len() && length <= region.len() - start,
            "a read inside one region lies inside its filled bytes"
        );
        // The pointer is taken once, so a dereference is a plain slice.
        let start = NonNull::from(&region[start..]).cast::<u8>();
        CacheBytes {
            repr: Repr::Pinned {
                start,
                length,
                _region_guard: region_guard,
            },
        }
    }

    /// Returns bytes copied out of the cache (or read through it).
    #[inline]
    pub(crate) fn copied(bytes: Vec<u8>) -> Self {
        CacheBytes {
            repr: Repr::Copied(bytes),
        }
    }

    /// Returns bytes borrowed from an object mapped from its file.
    #[inline]
    pub(crate) fn mapped(bytes: &'a [u8]) -> Self {
        CacheBytes {
            repr: Repr::Mapped(bytes),
        }
    }

    /// Tells whether the bytes were copied (a read across a region boundary, or
    /// read through) rather than borrowed from a pinned region.
    pub fn is_copied(&self) -> bool {
        matches!(self.repr, Repr::Copied(_))
    }

    /// Returns the bytes as an owned vector (releasing the pin).
    pub fn into_vec(self) -> Vec<u8> {
        match self.repr {
            Repr::Copied(bytes) => bytes,
            Repr::Pinned { .. } | Repr::Mapped(_) => self.deref().to_vec(),
        }
    }
}

impl Deref for CacheBytes<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.repr {
            // SAFETY: `start..start + length` lies inside the region's filled bytes
            // (checked in `pinned`); `_region_guard` pins the region for as long as
            // `self` lives, and the slice borrows `self`, so the bytes neither move
            // nor change while it is in use.
            Repr::Pinned { start, length, .. } => unsafe {
                std::slice::from_raw_parts(start.as_ptr(), *length)
            },
            Repr::Copied(bytes) => bytes,
            Repr::Mapped(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for CacheBytes<'_> {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for CacheBytes<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("CacheBytes")
            .field("length", &self.len())
            .field("copied", &self.is_copied())
            .finish()
    }
}
