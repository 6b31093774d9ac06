//! Quiver's read path (the searcher role's engine): a shard's manifest is opened
//! through the region cache, every segment searched with its deletion bitmap and
//! the WAL tail's newer copies masked out (segments of one codebook searched
//! together), the tail's points scored exactly in bulk, and
//! payload filters applied (exact scoring of the matches when a filter is
//! selective, wider probing when it is not).
//!
//! Where things are:
//!
//! - `shard`: [`ShardView`], one shard at one manifest version (load, reload,
//!   search per codebook group of segments, get).
//! - `tail`: the WAL tail's rows, one contiguous chunk per WAL object, scored in
//!   bulk.
//! - `ranking`: the best hits so far of a shard search (segments and tail).
//! - `context`: [`ReadContext`], the cache and decoded objects every shard shares.
//! - `node`: [`SearcherNode`], the role's lifecycle — start, readiness, shutdown.
//! - `routing`: which shards the node serves, from meta's watch stream and a
//!   safety poll.
//! - `reload`: following a shard's manifest (incremental reloads, one at a time).
//! - `warm_up`: pulling new segments' codes into the cache before a shard is ready.
//! - `grpc`: the data-plane service (search, get, shard stats).
//! - `search_pool`: the bounded CPU pool searches and point reads run on (a full
//!   queue refuses with a retryable `RESOURCE_EXHAUSTED`).
//! - `error`: [`SearcherError`], which says its code of the shared vocabulary
//!   (`quiver_proto::ServiceError`); `quiver_proto::status_of` makes it a status.

mod context;
mod error;
mod grpc;
mod metrics;
mod node;
mod ranking;
mod reload;
mod routing;
mod search_pool;
mod shard;
mod tail;
mod warm_up;

pub use context::ReadContext;
pub use error::{SearcherError, SearcherResult};
pub use node::{SearcherNode, SearcherNodeConfig};
pub use shard::{LoadStats, PointRecord, QueryCost, SearchRequest, ShardHit, ShardView};
pub use warm_up::{warm_new_rows, warm_new_segments};
