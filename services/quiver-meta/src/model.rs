//! The catalog's data model and the commands replicated through the Raft log.
//!
//! Everything here is serialized into the log and into snapshots, so field changes
//! must stay backward compatible (add fields with `#[serde(default)]`). The
//! collection and manifest types are the shared model's (`quiver-model`), whose
//! serde forms are this log's.

use std::collections::BTreeMap;
use std::fmt;

use quiver_model::{Manifest, ManifestChange, WalPosition};
use quiver_proto::ErrorCode;
use serde::{Deserialize, Serialize};

pub use quiver_model::{Collection, CollectionSpec, ShardKey};

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

/// Everything the catalog knows about one shard.
///
/// Serialized as before the manifest carried its WAL positions: `last_wal` and
/// `wal_trimmed_through` beside the manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ShardRecordForm", into = "ShardRecordForm")]
pub struct ShardRecord {
    /// The current writer, if any.
    pub lease: Option<Lease>,
    /// The highest epoch ever granted (0 = never leased).
    pub epoch: u64,
    /// Assigned searchers and whether each reported the shard ready.
    pub searchers: BTreeMap<String, bool>,
    /// The shard's manifest, with its last committed and highest trimmed WAL
    /// positions.
    pub manifest: Manifest,
    /// Catalog version of the last change (lease, assignments or manifest).
    pub changed_at_version: u64,
}

#[derive(Serialize, Deserialize)]
struct ShardRecordForm {
    lease: Option<Lease>,
    epoch: u64,
    last_wal: Option<WalPosition>,
    wal_trimmed_through: Option<WalPosition>,
    searchers: BTreeMap<String, bool>,
    manifest: Manifest,
    changed_at_version: u64,
}

impl From<ShardRecordForm> for ShardRecord {
    fn from(form: ShardRecordForm) -> Self {
        let mut manifest = form.manifest;
        manifest.last_committed = manifest.last_committed.or(form.last_wal);
        manifest.wal_trimmed_through = manifest.wal_trimmed_through.or(form.wal_trimmed_through);
        ShardRecord {
            lease: form.lease,
            epoch: form.epoch,
            searchers: form.searchers,
            manifest,
            changed_at_version: form.changed_at_version,
        }
    }
}

impl From<ShardRecord> for ShardRecordForm {
    fn from(record: ShardRecord) -> Self {
        let mut manifest = record.manifest;
        ShardRecordForm {
            lease: record.lease,
            epoch: record.epoch,
            last_wal: manifest.last_committed.take(),
            wal_trimmed_through: manifest.wal_trimmed_through.take(),
            searchers: record.searchers,
            manifest,
            changed_at_version: record.changed_at_version,
        }
    }
}

/// Changes one shard's manifest atomically: the change, the shard and the
/// writer's lease epoch (serialized flat, as one object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardManifestChange {
    /// The shard.
    pub shard: ShardKey,
    /// The writer's lease epoch (stale epochs are rejected).
    pub epoch: u64,
    /// The change.
    #[serde(flatten)]
    pub change: ManifestChange,
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
        change: ShardManifestChange,
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

impl From<quiver_model::ManifestError> for Rejection {
    fn from(error: quiver_model::ManifestError) -> Self {
        Rejection {
            code: error.code,
            message: error.message,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard record and two commands as the catalog wrote them before the
    /// model was shared (field for field, in declaration order): old logs and
    /// snapshots still read, and are written back byte for byte.
    #[test]
    fn the_log_and_snapshot_format_is_unchanged() {
        let record = r#"{"lease":{"holder":"indexer-a","epoch":2,"expires_at_ms":900},"epoch":2,"last_wal":[2,7],"wal_trimmed_through":[2,5],"searchers":{"searcher-a":true},"manifest":{"version":9,"segments":{"s1":{"segment_id":"s1","object_key":"segments/s1.qseg","rows":20,"size_bytes":320,"deletes":{"object_key":"deletes/s1-1.del","version":1,"deleted_rows":2},"default_nprobe":0},"s2":{"segment_id":"s2","object_key":"segments/s2.qseg","rows":5,"size_bytes":80,"deletes":null,"default_nprobe":12}},"wal_tail":[{"epoch":2,"seq":6,"object_key":"wal/6.wal","rows":3},{"epoch":2,"seq":7,"object_key":"wal/7.wal","rows":1}]},"changed_at_version":14}"#;
        let decoded: ShardRecord = serde_json::from_str(record).expect("old record");
        assert_eq!(
            decoded.manifest.last_committed,
            Some(WalPosition {
                epoch: 2,
                sequence: 7
            })
        );
        assert_eq!(
            decoded.manifest.wal_trimmed_through,
            Some(WalPosition {
                epoch: 2,
                sequence: 5
            })
        );
        assert_eq!(decoded.manifest.segments[0].default_nprobe, None);
        assert_eq!(decoded.manifest.segments[1].default_nprobe, Some(12));
        assert_eq!(decoded.manifest.wal_tail[1].key, "wal/7.wal");
        assert_eq!(serde_json::to_string(&decoded).unwrap(), record);

        let change = r#"{"CommitManifestChange":{"change":{"shard":{"collection_id":3,"shard":1},"epoch":2,"add_segments":[],"remove_segment_ids":["s1"],"set_deletes":[["s2",{"object_key":"deletes/s2-1.del","version":1,"deleted_rows":4}]],"trim_wal_through":[2,6],"gc_keys":["x"]},"gc_grace_ms":1000}}"#;
        let command: Command = serde_json::from_str(change).expect("old command");
        let Command::CommitManifestChange {
            change: shard_change,
            ..
        } = &command
        else {
            panic!("{command:?}");
        };
        assert_eq!(shard_change.change.remove_segments, ["s1"]);
        assert_eq!(shard_change.change.retire_keys, ["x"]);
        assert_eq!(serde_json::to_string(&command).unwrap(), change);

        let create = r#"{"CreateCollection":{"spec":{"name":"docs","dimension":4,"metric":"l2","id_type":"string","shards":2,"replication":1,"index":{"extended_bits":0,"raw_precision":"bf16","target_segment_size_bytes":0},"payload_schema":[{"name":"lang","kind":"keyword"}]}}}"#;
        let command: Command = serde_json::from_str(create).expect("old command");
        assert_eq!(serde_json::to_string(&command).unwrap(), create);
    }
}
