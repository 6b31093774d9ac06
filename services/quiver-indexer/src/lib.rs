//! Quiver's write path (the indexer role's engine): per shard, writes are
//! group-committed into WAL objects in object storage and acknowledged only once
//! the metadata service holds them; committed rows are flushed into small L0
//! segments and merged by a tiered policy; deletes and replaced ids become
//! deletion bitmaps; a new lease holder rebuilds everything from the manifest and
//! the WAL tail.

mod catalog;
mod config;
mod error;
mod failpoints;
mod gc;
mod memtable;
mod merge;
mod meta_catalog;
mod metrics;
mod node;
mod orphans;
mod ranged;
mod segments;
mod shard;

pub use catalog::{
    Catalog, CatalogError, DeletesEntry, GcList, Manifest, ManifestChange, SegmentEntry, ShardRef,
    WalEntry, WalPosition, apply_change,
};
#[cfg(any(test, feature = "testsuite"))]
pub use catalog::{MemoryCatalog, manifest_keys};
pub use config::IndexerConfig;
pub use error::{IndexerError, IndexerResult};
pub use failpoints::{CRASH_POINTS, FAILPOINTS_VARIABLE};
pub use gc::collect_garbage;
pub use meta_catalog::MetaCatalog;
pub use node::{IndexerNode, IndexerNodeConfig};
pub use shard::{ShardStats, ShardWriter};
