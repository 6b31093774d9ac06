//! The shapes the REST and gRPC front ends hand the engine: limits, read
//! consistency, points, searches, hits.

use quiver_index::PointId;
use serde_json::Value;

use crate::error::{GatewayError, GatewayResult};

/// What a search cost and a collection's statistics: the same shapes as the REST answer.
pub use quiver_api::{CollectionStats, SearchCost};

/// Request limits; each is enforced with an INVALID_ARGUMENT naming it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Points per upsert, ids per delete or get.
    pub max_batch_points: usize,
    /// Bytes of one point's payload (as JSON).
    pub max_payload_bytes: usize,
    /// Largest `k`.
    pub max_k: usize,
    /// Searches per batch.
    pub max_batch_searches: usize,
    /// Shards per collection.
    pub max_shards: u32,
    /// Largest `rescore` multiple.
    pub max_rescore: u32,
    /// Bytes of one request: a REST body or a gRPC message.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch_points: 10_000,
            max_payload_bytes: 64 << 10,
            max_k: 10_000,
            max_batch_searches: 256,
            max_shards: 1024,
            max_rescore: 1000,
            max_request_bytes: 128 << 20,
        }
    }
}

/// Read consistency of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    /// At least as new as every write acknowledged before the request began.
    #[default]
    Strong,
    /// Whatever the searchers hold now.
    Eventual,
}

impl Consistency {
    /// Parses `strong` or `eventual`.
    pub fn parse(text: &str) -> GatewayResult<Self> {
        match text {
            "strong" => Ok(Consistency::Strong),
            "eventual" => Ok(Consistency::Eventual),
            other => Err(GatewayError::invalid(format!(
                "consistency must be \"strong\" or \"eventual\", got {other:?}"
            ))),
        }
    }
}

/// One point to upsert.
#[derive(Clone, Debug)]
pub struct UpsertPoint {
    pub id: PointId,
    pub vector: Vec<f32>,
    pub payload: Option<Value>,
}

/// One search.
#[derive(Clone, Debug)]
pub struct SearchInput {
    pub vector: Vec<f32>,
    pub k: usize,
    /// A filter: its string form, or its JSON tree.
    pub filter: Option<Value>,
    pub nprobe: Option<u32>,
    pub rescore: Option<u32>,
    pub consistency: Consistency,
    pub include_payload: bool,
    pub include_vector: bool,
}

/// One hit of a collection search.
#[derive(Clone, Debug)]
pub struct Hit {
    pub id: PointId,
    pub score: f32,
    /// The payload as the JSON text it was stored as: what serde_json wrote
    /// when the point was upserted (`validate::prepare_upsert`), passed
    /// through as it is — not parsed into a tree, nor checked again.
    pub payload: Option<Vec<u8>>,
    pub vector: Option<Vec<f32>>,
}

/// A point read by id.
#[derive(Clone, Debug)]
pub struct PointOut {
    pub id: PointId,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

/// The gateway's engine.
/// What an admin compaction did while the caller waited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Merges finished by the shards that are done.
    pub merges: u32,
    /// Shards whose compaction is still running (ask again to wait for them).
    pub running_shards: Vec<u32>,
}
