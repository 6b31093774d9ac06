//! Object storage for Quiver: stores opened from URLs (`s3://bucket/prefix`,
//! `file:///path`, `memory://`) with timeouts on every operation, retries with
//! exponential backoff and jitter (object_store's client), ranged reads, multipart
//! uploads, Prometheus metrics, the bucket bootstrap, the key layout, and the
//! encodings of the write path's small objects (WAL batches, deletion bitmaps).

mod bootstrap;
mod error;
pub mod keys;
mod location;
pub mod manifest;
mod metrics;
mod settings;
mod storage;
#[cfg(any(test, feature = "testsuite"))]
pub mod testing;
mod wal;

pub use bootstrap::ensure_bucket;
pub use error::{StorageError, StorageErrorKind, StorageResult};
pub use location::StoreUrl;
pub use settings::{S3Settings, StorageOptions};
pub use storage::{ObjectInfo, Storage};
pub use wal::{DELETES_FORMAT_VERSION, DeletionBitmap, WAL_FORMAT_VERSION, WalBatch, WalRecord};
