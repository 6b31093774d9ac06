//! The replicated catalog and the deterministic rules that change it.
//!
//! [`Catalog::apply`] is the whole state machine: it depends only on the catalog and
//! the log entry (including the leader's clock carried in it), never on the replica's
//! own clock or configuration, so every replica reaches the same state. A refused
//! command changes nothing.
//!
//! This module holds the catalog, its reads and the dispatch of commands; the
//! rules live by concept: [`collections`] (create, drop, spec limits), [`nodes`]
//! (registration, heartbeats, draining), [`leases`] (shard leases and their
//! epochs), [`manifests`] (WAL commits and manifest changes), [`gc`] (object
//! references and the orphan list) and [`placement`] (the control loop's
//! reconcile: dead nodes, lease moves, rendezvous searcher assignments).

mod collections;
mod gc;
mod leases;
mod manifests;
mod nodes;
mod placement;

pub(crate) use placement::placement_changes;
#[cfg(test)]
use placement::{PlacementChange, rendezvous_score, rendezvous_top};

use std::collections::BTreeMap;

use quiver_model::manifest::added_keys;
use quiver_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::model::{
    Collection, Command, MetaRequest, NodeRecord, OrphanRecord, Outcome, Rejection, ShardKey,
    ShardRecord,
};

type ApplyResult = Result<Outcome, Rejection>;

/// The cluster catalog: nodes, collections, shards with leases, assignments and
/// manifests, and the GC list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Increases with every change watchers care about.
    pub(crate) version: u64,
    /// The newest leader time seen; time never runs backwards across leaders.
    pub(crate) clock_ms: u64,
    pub(crate) next_collection_id: u64,
    pub(crate) nodes: BTreeMap<String, NodeRecord>,
    pub(crate) collections: BTreeMap<String, Collection>,
    #[serde(with = "shard_map")]
    pub(crate) shards: BTreeMap<ShardKey, ShardRecord>,
    /// Object key → earliest deletion time.
    pub(crate) gc: BTreeMap<String, u64>,
    /// Dropped collection id → catalog version of the drop.
    pub(crate) dropped: BTreeMap<u64, u64>,
    pub(crate) collections_changed_at_version: u64,
    /// Object key → orphan record: objects a sweep found that nothing references.
    #[serde(default)]
    pub(crate) orphans: BTreeMap<String, OrphanRecord>,
}

impl Catalog {
    /// Returns the catalog version (increases with every change watchers care about).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Returns the newest leader time applied.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Returns the collection named `name`.
    pub fn collection(&self, name: &str) -> Option<&Collection> {
        self.collections.get(name)
    }

    /// Returns the collection with id `collection_id`.
    pub fn collection_by_id(&self, collection_id: u64) -> Option<&Collection> {
        self.collections
            .values()
            .find(|collection| collection.collection_id == collection_id)
    }

    /// Returns all collections in name order.
    pub fn collections(&self) -> impl Iterator<Item = &Collection> {
        self.collections.values()
    }

    /// Returns the catalog version of the last collection create or drop.
    pub fn collections_changed_at_version(&self) -> u64 {
        self.collections_changed_at_version
    }

    /// Returns the ids of collections dropped after catalog version `after_version`.
    pub fn dropped_since(&self, after_version: u64) -> Vec<u64> {
        self.dropped
            .iter()
            .filter(|(_, dropped_at)| **dropped_at > after_version)
            .map(|(collection_id, _)| *collection_id)
            .collect()
    }

    /// Returns all data nodes in id order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.values()
    }

    /// Returns one shard's record.
    pub fn shard(&self, shard: ShardKey) -> Option<&ShardRecord> {
        self.shards.get(&shard)
    }

    /// Returns all shards in key order.
    pub fn shards(&self) -> impl Iterator<Item = (&ShardKey, &ShardRecord)> {
        self.shards.iter()
    }

    /// Returns the GC list entries due at `now_ms`, oldest first, at most `limit`.
    pub fn gc_due(&self, now_ms: u64, limit: usize) -> Vec<(String, u64)> {
        let mut due: Vec<(String, u64)> = self
            .gc
            .iter()
            .filter(|(_, delete_after_ms)| **delete_after_ms <= now_ms)
            .map(|(key, delete_after_ms)| (key.clone(), *delete_after_ms))
            .collect();
        due.sort_by(|left, right| left.1.cmp(&right.1).then_with(|| left.0.cmp(&right.0)));
        due.truncate(limit);
        due
    }

    /// Returns the number of keys on the GC list.
    pub fn gc_len(&self) -> usize {
        self.gc.len()
    }

    /// Returns the reported orphans in key order.
    pub fn orphans(&self) -> impl Iterator<Item = (&String, &OrphanRecord)> {
        self.orphans.iter()
    }

    /// Applies one replicated request; a rejection leaves the catalog unchanged.
    pub fn apply(&mut self, request: &MetaRequest) -> ApplyResult {
        // Leaders' clocks differ a little; never let catalog time run backwards.
        self.clock_ms = self.clock_ms.max(request.now_ms);
        let now_ms = self.clock_ms;
        match &request.command {
            Command::CreateCollection { spec } => self.create_collection(spec, now_ms),
            Command::DropCollection { name, gc_grace_ms } => {
                self.drop_collection(name, now_ms.saturating_add(*gc_grace_ms))
            }
            Command::RegisterNode {
                node_id,
                role,
                address,
            } => self.register_node(node_id, *role, address, now_ms),
            Command::Heartbeat {
                node_id,
                ready_shards,
            } => self.heartbeat(node_id, ready_shards, now_ms),
            Command::DrainNode { node_id } => self.drain_node(node_id),
            Command::AcquireLease {
                shard,
                node_id,
                ttl_ms,
            } => self.acquire_lease(*shard, node_id, *ttl_ms, now_ms),
            Command::RenewLease {
                shard,
                node_id,
                epoch,
                ttl_ms,
            } => self.renew_lease(*shard, node_id, *epoch, *ttl_ms, now_ms),
            Command::CommitWal {
                shard,
                epoch,
                seq,
                object_key,
                rows,
            } => {
                self.check_not_orphaned(*shard, [object_key.as_str()])?;
                self.commit_wal(*shard, *epoch, *seq, object_key, *rows)
            }
            Command::CommitManifestChange {
                change,
                gc_grace_ms,
            } => {
                let added = added_keys(&change.change);
                self.check_not_orphaned(change.shard, added)?;
                self.commit_manifest_change(change, now_ms.saturating_add(*gc_grace_ms))
            }
            Command::ReportOrphans { orphans, grace_ms } => {
                self.report_orphans(orphans, *grace_ms, now_ms)
            }
            Command::AckOrphans { object_keys } => {
                let removed = object_keys
                    .iter()
                    .filter(|key| self.orphans.remove(key.as_str()).is_some())
                    .count();
                Ok(Outcome::OrphansAcked {
                    removed: u32::try_from(removed).unwrap_or(u32::MAX),
                })
            }
            Command::AckGc { object_keys } => {
                let removed = object_keys
                    .iter()
                    .filter(|key| self.gc.remove(key.as_str()).is_some())
                    .count();
                Ok(Outcome::GcAcked {
                    removed: u32::try_from(removed).unwrap_or(u32::MAX),
                })
            }
            Command::Reconcile {
                node_timeout_ms,
                lease_ttl_ms,
            } => {
                let changes = self.reconcile(now_ms, *node_timeout_ms, *lease_ttl_ms);
                Ok(Outcome::Reconciled { changes })
            }
        }
    }

    fn bump_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }
}

fn shard_entry(
    shards: &mut BTreeMap<ShardKey, ShardRecord>,
    shard: ShardKey,
) -> Result<&mut ShardRecord, Rejection> {
    shards
        .get_mut(&shard)
        .ok_or_else(|| Rejection::new(ErrorCode::NotFound, format!("shard {shard} not found")))
}

/// Serializes the shard map as a list of pairs (JSON maps need string keys).
mod shard_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::model::{ShardKey, ShardRecord};

    pub(super) fn serialize<S: Serializer>(
        shards: &BTreeMap<ShardKey, ShardRecord>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(&ShardKey, &ShardRecord)> = shards.iter().collect();
        pairs.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<ShardKey, ShardRecord>, D::Error> {
        let pairs: Vec<(ShardKey, ShardRecord)> = Vec::deserialize(deserializer)?;
        Ok(pairs.into_iter().collect())
    }
}

/// Returns a live segment entry; for tests and tools.
#[cfg(test)]
pub(crate) fn segment(segment_id: &str, rows: u32) -> quiver_model::SegmentEntry {
    quiver_model::SegmentEntry::new(
        segment_id.to_owned(),
        format!("segments/{segment_id}.qseg"),
        rows,
        u64::from(rows) * 16,
        &Default::default(),
    )
}

#[cfg(test)]
mod tests;
