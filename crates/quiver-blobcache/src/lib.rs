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

mod cache;
mod error;
mod metrics;

pub use cache::{BlobCache, BlobCacheConfig, CacheBytes, CacheSession, CachedObject, RegionGuard};
pub use error::{CacheError, CacheResult};
pub use metrics::CacheStats;
