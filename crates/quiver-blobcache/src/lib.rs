//! The search node's region cache over an object store.
//!
//! One preallocated file on local disk, mapped once and cut into fixed-size
//! regions (16 MiB by default). A region holds one aligned range of one object
//! (keyed by object key, size and version, so a changed object is never served
//! stale). A miss fills the region with one ranged GET; concurrent readers of the
//! same region wait for that fill; a failed fill leaves nothing behind and its
//! error reaches every waiter. Eviction is LFU with decay over unpinned regions;
//! every read pins its region. Reads inside one region borrow the mapped memory
//! (zero copy); reads across a boundary are copied and counted. [`CachedObject`]
//! implements the index's byte-source trait, so segments are searched straight out
//! of the cache. The cache starts empty on every start.
//!
//! A segment opened on a [`CachedObject`] hands it the segment's chunk checksums;
//! from then on every fill of a region (the first, and each one after an eviction
//! or a discard) is checked against them before any of its bytes reaches a reader
//! — once per fill, not per read — and a fill that fails is dropped and fetched
//! once more before the read fails naming the object.
//!
//! The cache file is preallocated when the cache starts, so a disk that fills up
//! later never fails a region write. If the file cannot be created for lack of
//! space, [`BlobCache::new_or_read_through`] gives a cache that reads every range
//! straight from the object store instead (slow, but answers), and says so in a
//! log line and the `quiver_cache_read_through` gauge. [`ReadCounts`] measures what
//! one query cost the cache (hits, misses, bytes fetched) on its own thread.
//!
//! Where things are:
//!
//! - `cache`: [`BlobCache`] and [`BlobCacheConfig`] — creating the cache (or a
//!   read-through one), opening objects, counters.
//! - `cache_file`: the preallocated, mapped cache file.
//! - `inner`: the state every handle shares.
//! - `slots`: region slots, pins and LFU eviction with decay.
//! - `fill`: single-flight fills and discards.
//! - `verify`: checking each fill against the segment's chunk checksums.
//! - `read_through`: reads straight from the object store when there is no file.
//! - `object`: [`CachedObject`], the index's byte source.
//! - `bytes` and `session`: what readers hold — [`CacheBytes`] (the bytes of one
//!   read, owning their pin) and [`CacheSession`] (a query's reads, pinning each
//!   region once); no slice into the mapping outlives the pin that keeps it.
//! - `error`, `metrics`: [`CacheError`]; [`CacheStats`] and [`ReadCounts`].

mod bytes;
mod cache;
mod cache_file;
mod error;
mod fill;
mod inner;
mod metrics;
mod object;
mod read_through;
mod session;
mod slots;
mod verify;
mod waits;

pub use bytes::CacheBytes;
pub use cache::{BlobCache, BlobCacheConfig};
pub use error::{CacheError, CacheResult};
pub use metrics::{CacheStats, ReadCounts};
pub use object::{CachedObject, held_row_bytes};
pub use session::CacheSession;
pub use waits::{StoreWaitObserver, observe_store_waits, waiting_for_store};
