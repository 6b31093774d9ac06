//! The catalog's data model and the commands replicated through the Raft log.
//!
//! Everything here is serialized into the log and into snapshots, so field changes
//! must stay backward compatible (add fields with `#[serde(default)]`).

use std::collections::BTreeMap;
use std::fmt;

use quiver_proto::ErrorCode;
use serde::{Deserialize, Serialize};

/// Similarity of a collection's vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Cosine similarity.
    Cosine,
    /// Inner product.
    Dot,
    /// Squared Euclidean distance.
    L2,
}

/// The form of a collection's point ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdType {
    /// Unsigned 64-bit integers.
    U64,
    /// Strings of at most 128 bytes.
    String,
}

/// The type of a filterable payload field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    /// Exact-match strings.
    Keyword,
    /// Signed 64-bit integers.
    Integer,
    /// 64-bit floats.
    Float,
    /// Booleans.
    Bool,
}

/// Precision of the raw vectors kept for rescoring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorPrecision {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
}

/// One filterable field of a collection's payload schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadField {
    /// Field name inside the point's payload object.
    pub name: String,
    /// Field type.
    pub kind: FieldKind,
}

/// Index parameters of a collection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexParams {
    /// Extra bits per dimension for extended RaBitQ codes (0 = 1-bit codes only).
    pub extended_bits: u32,
    /// Precision of the stored raw vectors.
    pub raw_precision: VectorPrecision,
    /// Target size of a merged segment in bytes (0 = the indexer's default).
    pub target_segment_size_bytes: u64,
}

impl Default for IndexParams {
    fn default() -> Self {
        IndexParams {
            extended_bits: 0,
            raw_precision: VectorPrecision::F32,
            target_segment_size_bytes: 0,
        }
    }
}

/// What a client asks for when it creates a collection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectionSpec {
    /// Collection name (`[A-Za-z0-9_-]`, 1–255 bytes).
    pub name: String,
    /// Vector dimension.
    pub dimension: u32,
    /// Similarity metric.
    pub metric: Metric,
    /// Point id form.
    pub id_type: IdType,
    /// Shard count, fixed at creation.
    pub shards: u32,
    /// Searchers serving each shard.
    pub replication: u32,
    /// Index parameters.
    pub index: IndexParams,
    /// Filterable payload fields.
    pub payload_schema: Vec<PayloadField>,
}

/// A collection in the catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collection {
    /// Unique for the life of the cluster (a recreated name gets a new id).
    pub collection_id: u64,
    /// The collection's definition.
    pub spec: CollectionSpec,
    /// Creation time (leader clock, ms since the Unix epoch).
    pub created_at_ms: u64,
}

/// The role a data node plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    /// Writes shards.
    Indexer,
    /// Serves shards.
    Searcher,
    /// Routes client requests.
    Gateway,
}

/// Liveness of a data node as judged by the leader's control loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heartbeats arrive in time.
    Alive,
    /// Heartbeats stopped; the node holds no leases or assignments.
    Dead,
    /// Alive but taking no new work.
    Draining,
}

/// A data node (indexer, searcher, gateway) known to the catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's id, chosen by the node.
    pub node_id: String,
    /// Its role.
    pub role: NodeRole,
    /// Where its gRPC API listens.
    pub address: String,
    /// Leader time of the last heartbeat (ms since the Unix epoch).
    pub last_heartbeat_ms: u64,
    /// Liveness.
    pub state: NodeState,
    /// Catalog version of the last change watchers care about.
    #[serde(default)]
    pub changed_at_version: u64,
}

/// Names one shard: the collection's id and the shard number.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ShardKey {
    /// The collection's id (not its name).
    pub collection_id: u64,
    /// Shard number, `0..shards`.
    pub shard: u32,
}

impl fmt::Display for ShardKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.collection_id, self.shard)
    }
}

/// The right of one indexer to write a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Node id of the indexer.
    pub holder: String,
    /// The fencing epoch; every takeover increments it.
    pub epoch: u64,
    /// Leader time after which the lease may be taken over.
    pub expires_at_ms: u64,
}

/// A deletion bitmap object of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletesRef {
    /// Object key of the bitmap.
    pub object_key: String,
    /// Version; each replacement must increase it.
    pub version: u64,
    /// Rows the bitmap marks deleted.
    #[serde(default)]
    pub deleted_rows: u64,
}

/// One live segment of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Segment id (unique within the shard, never reused).
    pub segment_id: String,
    /// Object key of the segment file.
    pub object_key: String,
    /// Rows in the segment (deleted ones included).
    pub rows: u64,
    /// Size of the segment file.
    pub size_bytes: u64,
    /// The segment's deletion bitmap, if any.
    pub deletes: Option<DeletesRef>,
    /// Calibrated default `nprobe` (0 = none recorded).
    #[serde(default)]
    pub default_nprobe: u32,
}

/// One committed WAL object not yet folded into a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalEntry {
    /// Lease epoch of the writer.
    pub epoch: u64,
    /// Sequence number within the epoch.
    pub seq: u64,
    /// Object key of the WAL file.
    pub object_key: String,
    /// Rows in the WAL file.
    pub rows: u64,
}

impl WalEntry {
    /// Returns the entry's position `(epoch, seq)`, the order of the WAL.
    pub fn position(&self) -> (u64, u64) {
        (self.epoch, self.seq)
    }
}

/// Which objects make up a shard right now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Strictly increases with every change.
    pub version: u64,
    /// Live segments by id.
    pub segments: BTreeMap<String, SegmentEntry>,
    /// Committed WAL objects in `(epoch, seq)` order.
    pub wal_tail: Vec<WalEntry>,
}

/// Everything the catalog knows about one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// The current writer, if any.
    pub lease: Option<Lease>,
    /// The highest epoch ever granted (0 = never leased).
    pub epoch: u64,
    /// Position of the last committed WAL object.
    pub last_wal: Option<(u64, u64)>,
    /// Highest position trimmed from the WAL tail.
    pub wal_trimmed_through: Option<(u64, u64)>,
    /// Assigned searchers and whether each reported the shard ready.
    pub searchers: BTreeMap<String, bool>,
    /// The shard's manifest.
    pub manifest: Manifest,
    /// Catalog version of the last change (lease, assignments or manifest).
    pub changed_at_version: u64,
}

/// Changes one shard's manifest atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestChange {
    /// The shard.
    pub shard: ShardKey,
    /// The writer's lease epoch (stale epochs are rejected).
    pub epoch: u64,
    /// Segments to add.
    pub add_segments: Vec<SegmentEntry>,
    /// Ids of live segments to remove (their objects go on the GC list).
    pub remove_segment_ids: Vec<String>,
    /// New deletion bitmaps `(segment id, bitmap)`; the replaced bitmap goes on the GC list.
    pub set_deletes: Vec<(String, DeletesRef)>,
    /// Drop WAL tail entries at or before this position.
    pub trim_wal_through: Option<(u64, u64)>,
    /// More object keys to delete after the grace period.
    pub gc_keys: Vec<String>,
}

/// An object found in object storage that no manifest and no GC entry names (a
/// write that crashed between its PUT and its commit, say), as a sweep saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanCandidate {
    /// Object key.
    pub object_key: String,
    /// Object size.
    pub size_bytes: u64,
    /// When the object was last written (object store clock, ms since the epoch).
    pub last_modified_ms: u64,
}

/// A reported orphan: listed in the admin API, deleted once its grace is over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanRecord {
    /// Object size when last seen.
    pub size_bytes: u64,
    /// When the object was last written (object store clock).
    pub last_modified_ms: u64,
    /// Leader time of the sweep that first reported it.
    pub first_seen_ms: u64,
    /// Leader time from which it may be deleted.
    pub delete_after_ms: u64,
}

/// A catalog change, as replicated through the Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Creates a collection (identical re-creation is a no-op).
    CreateCollection {
        /// Its definition.
        spec: CollectionSpec,
    },
    /// Drops a collection; all its objects go on the GC list.
    DropCollection {
        /// Collection name.
        name: String,
        /// Grace period before its objects may be deleted.
        gc_grace_ms: u64,
    },
    /// Registers (or re-registers) a data node.
    RegisterNode {
        /// Node id.
        node_id: String,
        /// Role.
        role: NodeRole,
        /// gRPC address.
        address: String,
    },
    /// Records a heartbeat, and a searcher's ready shards.
    Heartbeat {
        /// Node id.
        node_id: String,
        /// Shards the searcher can serve now.
        ready_shards: Vec<ShardKey>,
    },
    /// Marks a node draining: no new work goes to it.
    DrainNode {
        /// Node id.
        node_id: String,
    },
    /// Grants a shard's lease (a new epoch on takeover).
    AcquireLease {
        /// The shard.
        shard: ShardKey,
        /// The indexer asking.
        node_id: String,
        /// Lease time to live.
        ttl_ms: u64,
    },
    /// Extends a lease; only its holder at its epoch may.
    RenewLease {
        /// The shard.
        shard: ShardKey,
        /// The holder.
        node_id: String,
        /// The holder's epoch.
        epoch: u64,
        /// Lease time to live.
        ttl_ms: u64,
    },
    /// Appends a WAL object to a shard's WAL tail.
    CommitWal {
        /// The shard.
        shard: ShardKey,
        /// The writer's epoch.
        epoch: u64,
        /// Sequence number within the epoch.
        seq: u64,
        /// The WAL object's key.
        object_key: String,
        /// Rows it holds.
        rows: u64,
    },
    /// Changes a manifest atomically.
    CommitManifestChange {
        /// The change.
        change: ManifestChange,
        /// Grace period before replaced objects may be deleted.
        gc_grace_ms: u64,
    },
    /// Removes deleted objects from the GC list.
    AckGc {
        /// Keys that are gone from object storage.
        object_keys: Vec<String>,
    },
    /// Replaces the orphan list with what a sweep found: objects still not
    /// referenced keep their first-seen time, new ones are due after `grace_ms`,
    /// entries the sweep did not see again are dropped. Candidates the catalog
    /// references (or has on the GC list) are ignored.
    ReportOrphans {
        /// Every unreferenced object the sweep found.
        orphans: Vec<OrphanCandidate>,
        /// How long a newly reported orphan waits before it may be deleted.
        grace_ms: u64,
    },
    /// Removes deleted orphans from the orphan list.
    AckOrphans {
        /// Keys that are gone from object storage.
        object_keys: Vec<String>,
    },
    /// Runs the control loop's rules: dead nodes, expired leases, assignments.
    Reconcile {
        /// Heartbeat silence after which a node is dead.
        node_timeout_ms: u64,
        /// Lease time to live of leases granted to orphaned shards.
        lease_ttl_ms: u64,
    },
}

impl Command {
    /// Returns the command's name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateCollection { .. } => "create_collection",
            Command::DropCollection { .. } => "drop_collection",
            Command::RegisterNode { .. } => "register_node",
            Command::Heartbeat { .. } => "heartbeat",
            Command::DrainNode { .. } => "drain_node",
            Command::AcquireLease { .. } => "acquire_lease",
            Command::RenewLease { .. } => "renew_lease",
            Command::CommitWal { .. } => "commit_wal",
            Command::CommitManifestChange { .. } => "commit_manifest_change",
            Command::AckGc { .. } => "ack_gc",
            Command::ReportOrphans { .. } => "report_orphans",
            Command::AckOrphans { .. } => "ack_orphans",
            Command::Reconcile { .. } => "reconcile",
        }
    }
}

/// A Raft log entry's application payload: a command plus the proposing leader's
/// clock. Replicas use `now_ms` instead of their own clocks so they stay identical.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRequest {
    /// Leader wall-clock time at proposal, ms since the Unix epoch.
    pub now_ms: u64,
    /// The change.
    pub command: Command,
}

impl fmt::Display for MetaRequest {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}@{}", self.command.name(), self.now_ms)
    }
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A collection was created, or already existed identically.
    Collection {
        /// The collection.
        collection: Collection,
        /// False for an identical re-creation.
        created: bool,
    },
    /// A collection was dropped.
    Dropped {
        /// Its id.
        collection_id: u64,
    },
    /// A node's record after the change.
    Node(NodeRecord),
    /// A lease after the change.
    Lease(Lease),
    /// A WAL object was committed (or had been).
    WalCommitted {
        /// Manifest version after the commit.
        manifest_version: u64,
        /// True when it had been committed before.
        duplicate: bool,
    },
    /// A manifest change was committed (or had been).
    ManifestCommitted {
        /// Manifest version after the change.
        manifest_version: u64,
        /// True when it had been committed before.
        duplicate: bool,
    },
    /// GC entries were removed.
    GcAcked {
        /// How many keys were on the list.
        removed: u32,
    },
    /// A sweep's orphans were recorded.
    OrphansReported {
        /// Orphans newly reported by this sweep.
        new_orphans: u32,
        /// Keys whose grace is over at this entry's time, ready to delete.
        due: Vec<String>,
    },
    /// Orphan entries were removed.
    OrphansAcked {
        /// How many keys were on the list.
        removed: u32,
    },
    /// The control loop's rules ran.
    Reconciled {
        /// How many things changed.
        changes: u32,
    },
    /// Nothing to report (blank and membership entries).
    Nothing,
}

/// Why a command was refused; the catalog is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Error code.
    pub code: ErrorCode,
    /// What was wrong, naming the input.
    pub message: String,
}

impl Rejection {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Rejection {
            code,
            message: message.into(),
        }
    }
}

/// The result of one applied log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaResponse(pub Result<Outcome, Rejection>);

impl Default for MetaResponse {
    fn default() -> Self {
        MetaResponse(Ok(Outcome::Nothing))
    }
}
