//! The admin API: `/admin/v1/cluster`, `/admin/v1/collections/{name}/shards`,
//! `…/compact`, `/admin/v1/nodes/{id}/drain`, `/admin/v1/meta/members`,
//! `/admin/v1/orphans`.

use serde::{Deserialize, Serialize};

/// A node of the cluster (an entry of the status, the answer to a drain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Node {
    /// Node id.
    pub id: String,
    /// `"indexer"`, `"searcher"`, `"gateway"` (or `"unknown"`).
    pub role: String,
    /// Address it serves on.
    pub address: String,
    /// `"alive"`, `"dead"`, `"draining"` (or `"unknown"`).
    pub state: String,
    /// Its last heartbeat, milliseconds since the Unix epoch.
    pub last_heartbeat_ms: u64,
}

/// A member of the metadata service's Raft group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetaMember {
    /// Raft node id.
    pub id: u64,
    /// Address.
    pub address: String,
    /// `"voter"` or `"learner"`.
    pub role: String,
}

/// The metadata service's part of the cluster status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterMeta {
    /// Raft id of the leader.
    pub leader: u64,
    /// Address of the leader.
    pub leader_address: String,
    /// Raft term.
    pub term: u64,
    /// Raft commit index.
    pub commit_index: u64,
    /// Raft applied index.
    pub applied_index: u64,
    /// The Raft group.
    pub members: Vec<MetaMember>,
}

/// A searcher assigned to a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearcherState {
    /// Node id.
    pub id: String,
    /// Whether it has loaded the shard.
    pub ready: bool,
}

/// A shard in the cluster status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterShard {
    /// The collection's id.
    pub collection_id: u64,
    /// Shard number.
    pub shard: u32,
    /// Node holding the write lease (`null`: none).
    pub indexer: Option<String>,
    /// Lease epoch.
    pub epoch: u64,
    /// Assigned searchers.
    pub searchers: Vec<SearcherState>,
    /// Version of the shard's manifest.
    pub manifest_version: u64,
}

/// `GET /admin/v1/cluster`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterStatus {
    /// The metadata service.
    pub meta: ClusterMeta,
    /// Every node.
    pub nodes: Vec<Node>,
    /// Number of collections.
    pub collections: u64,
    /// Every shard.
    pub shards: Vec<ClusterShard>,
}

/// The write lease of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardLease {
    /// Node holding it.
    pub id: String,
    /// Its epoch.
    pub epoch: u64,
    /// When it runs out unless renewed, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

/// A segment of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SegmentStatus {
    /// Segment id.
    pub segment_id: String,
    /// Rows, deleted ones included.
    pub rows: u64,
    /// Rows deleted since it was written.
    pub deleted_rows: u64,
    /// Size of its object.
    pub size_bytes: u64,
}

/// One shard of `GET /admin/v1/collections/{name}/shards`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardStatus {
    /// Shard number.
    pub shard: u32,
    /// The write lease (`null`: none).
    pub indexer: Option<ShardLease>,
    /// Lease epoch.
    pub epoch: u64,
    /// Assigned searchers.
    pub searchers: Vec<SearcherState>,
    /// Version of the manifest.
    pub manifest_version: u64,
    /// The manifest's segments.
    pub segments: Vec<SegmentStatus>,
    /// Write-ahead-log objects not yet in a segment.
    pub wal_tail: u64,
    /// Rows in them.
    pub wal_tail_rows: u64,
}

/// `GET /admin/v1/collections/{name}/shards`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionShards {
    /// The collection.
    pub collection: String,
    /// Its shards, by number.
    pub shards: Vec<ShardStatus>,
}

/// `POST /admin/v1/collections/{name}/compact`: `200` with `done: true` once every
/// shard is compacted, or `202` with `done: false`, `running_shards` and a
/// `message` when some still were after the gateway's wait (POST again to wait).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompactResponse {
    /// The collection.
    pub collection: String,
    /// Merges done by the shards that finished.
    pub merges: u64,
    /// Whether every shard finished.
    pub done: bool,
    /// Shards still compacting (only when not done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_shards: Option<Vec<u32>>,
    /// What to do next (only when not done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /admin/v1/meta/members`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MetaMembersRequest {
    /// `"add"` (as a learner; needs `address`), `"promote"` (to voter) or `"remove"`.
    pub action: String,
    /// Raft node id.
    pub id: u64,
    /// Address of the node to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// The answer to a membership change: the Raft group after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetaMembersResponse {
    /// The members.
    pub members: Vec<MetaMember>,
}

/// An object in the bucket that nothing references.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Orphan {
    /// Object key.
    pub key: String,
    /// Its size.
    pub size_bytes: u64,
    /// When it was last written, milliseconds since the Unix epoch.
    pub last_modified_ms: u64,
    /// When a sweep first found it unreferenced.
    pub first_seen_ms: u64,
    /// When a sweep will delete it.
    pub delete_after_ms: u64,
}

/// `GET /admin/v1/orphans`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrphansResponse {
    /// The orphans.
    pub orphans: Vec<Orphan>,
    /// How many.
    pub count: u64,
    /// Their total size.
    pub total_bytes: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_shard_without_a_lease_shows_a_null_indexer() {
        let shard = ClusterShard {
            collection_id: 1,
            shard: 0,
            indexer: None,
            epoch: 0,
            searchers: vec![SearcherState {
                id: "s1".into(),
                ready: true,
            }],
            manifest_version: 3,
        };
        assert_eq!(
            serde_json::to_value(&shard).unwrap(),
            json!({"collection_id": 1, "shard": 0, "indexer": null, "epoch": 0,
                   "searchers": [{"id": "s1", "ready": true}], "manifest_version": 3})
        );
    }

    #[test]
    fn a_finished_compaction_has_no_running_shards() {
        let done = CompactResponse {
            collection: "docs".into(),
            merges: 2,
            done: true,
            running_shards: None,
            message: None,
        };
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            json!({"collection": "docs", "merges": 2, "done": true})
        );
    }
}
