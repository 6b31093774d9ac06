//! The client API's operations, shared by the REST and gRPC front ends:
//! validation (nothing of a bad request is written), routing writes to the
//! shard's indexer and searches to one ready replica per shard, merging.
//!
//! - `types`: limits, consistency, and the inputs and outputs of the operations.
//! - `validate`: checks that need no network (names, options, points, filters).
//! - `collections`: create, list, drop, describe, compact.
//! - `write`: upsert and delete, routed to each shard's indexer, retried while a
//!   lease moves.
//! - `read`: get and search, on one searcher per shard, merged.

mod collections;
mod join;
mod read;
mod types;
mod validate;
mod write;

use std::sync::Arc;
use std::time::Duration;

use quiver_index::SegmentSpec;
use quiver_proto::convert::collection_from_proto;

pub use types::{
    CollectionStats, Compaction, Consistency, Hit, Limits, PointOut, SearchCost, SearchInput,
    UpsertPoint,
};
pub use validate::{check_search_options, validate_name};
// The fuzz tests drive the validation directly.
#[cfg(test)]
pub use validate::{prepare_search, prepare_upsert};

use crate::error::{GatewayError, GatewayResult};
use crate::routing::{CollectionRoute, Router};

/// The gateway's engine: the operations of the client API over a [`Router`].
pub struct Gateway {
    router: Arc<Router>,
    limits: Limits,
    write_deadline: Duration,
    compact_wait: Duration,
    /// Single searches to busy searchers, joined into batches.
    search_lanes: Arc<join::SearchLanes>,
}

impl Gateway {
    /// Returns a gateway routing through `router`.
    pub fn new(router: Arc<Router>, limits: Limits) -> Self {
        let search_lanes = Arc::new(join::SearchLanes::new(router.request_timeout()));
        Gateway {
            router,
            limits,
            write_deadline: Duration::from_secs(15),
            compact_wait: Duration::from_secs(24),
            search_lanes,
        }
    }

    /// Sets how long [`Gateway::compact`] waits before reporting the shards
    /// still compacting.
    pub fn with_compact_wait(mut self, wait: Duration) -> Self {
        self.compact_wait = wait;
        self
    }

    /// Returns the router.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Returns the limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn spec_of(route: &CollectionRoute) -> GatewayResult<SegmentSpec> {
        collection_from_proto(&route.collection)
            .map(|collection| SegmentSpec::for_collection(&collection))
            .map_err(GatewayError::internal)
    }
}
