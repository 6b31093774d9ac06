//! The wire types of Quiver's REST API: one `Serialize`/`Deserialize` struct per
//! request and answer body, shared by the gateway (which decodes requests and
//! encodes answers with them) and the Rust SDK (which does the opposite), so the
//! two cannot drift apart. The reference of every endpoint is `docs/api.md`.
//!
//! - [`collections`]: create, list, describe, drop.
//! - [`points`]: point ids, upsert, delete, get.
//! - [`search`]: search, batch search, the cost block.
//! - [`admin`]: cluster status, shards, compact, drain, metadata members, orphans.
//! - [`error`]: the error body `{"error": {"code", "message"}}`.
//!
//! Request types refuse unknown fields (a typo is an error, not a silently ignored
//! option); answer types accept them, so an older SDK reads a newer server.
//! Enumerated values (`metric`, `role`, …) are strings on the wire and here: the
//! gateway checks them with messages that list the accepted values, and an SDK
//! keeps working when a server adds one.

pub mod admin;
pub mod collections;
pub mod error;
pub mod points;
pub mod search;

pub use admin::{
    ClusterMeta, ClusterShard, ClusterStatus, CollectionShards, CompactResponse, MetaMember,
    MetaMembersRequest, MetaMembersResponse, Node, Orphan, OrphansResponse, SearcherState,
    SegmentStatus, ShardLease, ShardStatus,
};
pub use collections::{
    Collection, CollectionIndex, CollectionStats, CreateCollectionRequest,
    DescribeCollectionResponse, DropCollectionResponse, FieldSchema, IndexOptions,
    ListCollectionsResponse,
};
pub use error::{ErrorBody, ErrorDetail};
pub use points::{
    GetPointsResponse, Point, PointId, PointIdsRequest, PointRecord, UpsertRequest, WriteResponse,
    vector_from_base64, vector_to_base64,
};
pub use quiver_common::ErrorCode;
pub use search::{
    BatchSearchRequest, BatchSearchResponse, DEFAULT_K, SearchCost, SearchHit, SearchRequest,
    SearchResponse,
};
