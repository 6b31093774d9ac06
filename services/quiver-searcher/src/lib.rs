//! Quiver's read path (the searcher role's engine): a shard's manifest is opened
//! through the region cache, every segment searched with its deletion bitmap and
//! the WAL tail's newer copies masked out, the tail's points scored exactly, and
//! payload filters applied (exact scoring of the matches when a filter is
//! selective, wider probing when it is not).

mod error;
mod metrics;
mod node;
mod shard;

pub use error::{SearcherError, SearcherErrorKind, SearcherResult};
pub use node::{SearcherNode, SearcherNodeConfig, status_of};
pub use shard::{
    LoadStats, PointRecord, QueryCost, ReadContext, SearchRequest, ShardHit, ShardView,
};
