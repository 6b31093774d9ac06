//! The replicated catalog and the deterministic rules that change it.
//!
//! [`Catalog::apply`] is the whole state machine: it depends only on the catalog and
//! the log entry (including the leader's clock carried in it), never on the replica's
//! own clock or configuration, so every replica reaches the same state. A refused
//! command changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use quiver_model::manifest::{ChangeOutcome, WalCommit, added_keys, apply_change};
use quiver_model::{WalEntry, WalPosition};
use quiver_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::model::{
    Collection, CollectionSpec, Command, Lease, MetaRequest, NodeRecord, NodeRole, NodeState,
    OrphanCandidate, OrphanRecord, Outcome, Rejection, ShardKey, ShardManifestChange,
    ShardRecord,
};

/// Dropped collection ids remembered for watchers that lag behind.
const DROPPED_HISTORY: usize = 1024;
/// Largest shard count of a collection.
const MAX_SHARDS: u32 = 1024;
/// Largest search replication factor.
const MAX_REPLICATION: u32 = 64;
/// Largest vector dimension.
const MAX_DIMENSION: u32 = 65_536;

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

    /// Returns the keys of `keys` that no manifest references and the GC list
    /// does not hold (candidates for the orphan list).
    pub fn unreferenced<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<&'k str> {
        let referenced = self.referenced_keys();
        keys.into_iter()
            .filter(|key| !referenced.contains(key) && !self.gc.contains_key(*key))
            .collect()
    }

    /// Returns every object key some manifest references.
    fn referenced_keys(&self) -> BTreeSet<&str> {
        self.shards
            .values()
            .flat_map(|record| record.manifest.referenced_keys())
            .collect()
    }

    fn report_orphans(
        &mut self,
        candidates: &[OrphanCandidate],
        grace_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        let unreferenced: BTreeSet<&str> = self
            .unreferenced(
                candidates
                    .iter()
                    .map(|candidate| candidate.object_key.as_str()),
            )
            .into_iter()
            .collect();
        let mut orphans = BTreeMap::new();
        let mut new_orphans = 0u32;
        for candidate in candidates {
            if !unreferenced.contains(candidate.object_key.as_str()) {
                continue;
            }
            let record = match self.orphans.get(&candidate.object_key) {
                Some(known) => OrphanRecord {
                    size_bytes: candidate.size_bytes,
                    last_modified_ms: candidate.last_modified_ms,
                    ..known.clone()
                },
                None => {
                    new_orphans += 1;
                    OrphanRecord {
                        size_bytes: candidate.size_bytes,
                        last_modified_ms: candidate.last_modified_ms,
                        first_seen_ms: now_ms,
                        delete_after_ms: now_ms.saturating_add(grace_ms),
                    }
                }
            };
            orphans.insert(candidate.object_key.clone(), record);
        }
        self.orphans = orphans;
        let due = self
            .orphans
            .iter()
            .filter(|(_, record)| record.delete_after_ms <= now_ms)
            .map(|(key, _)| key.clone())
            .collect();
        Ok(Outcome::OrphansReported { new_orphans, due })
    }

    /// Rejects a commit that would bring back an object reported as an orphan
    /// (it may be deleted any moment).
    fn check_not_orphaned<'k>(
        &self,
        shard: ShardKey,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(), Rejection> {
        for key in keys {
            if self.orphans.contains_key(key) {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "object `{key}` committed to shard {shard} was reported as an orphan and may be deleted; write it again under a new key"
                    ),
                ));
            }
        }
        Ok(())
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

    fn create_collection(&mut self, spec: &CollectionSpec, now_ms: u64) -> ApplyResult {
        let spec = normalize_spec(spec)?;
        if let Some(existing) = self.collections.get(&spec.name) {
            if existing.spec == spec {
                return Ok(Outcome::Collection {
                    collection: existing.clone(),
                    created: false,
                });
            }
            return Err(Rejection::new(
                ErrorCode::AlreadyExists,
                format!(
                    "collection `{}` already exists with a different definition",
                    spec.name
                ),
            ));
        }
        self.next_collection_id += 1;
        let collection_id = self.next_collection_id;
        let version = self.bump_version();
        for shard in 0..spec.shards {
            let record = ShardRecord {
                changed_at_version: version,
                ..ShardRecord::default()
            };
            self.shards.insert(
                ShardKey {
                    collection_id,
                    shard,
                },
                record,
            );
        }
        let collection = Collection {
            collection_id,
            spec,
            created_at_ms: now_ms,
        };
        self.collections
            .insert(collection.spec.name.clone(), collection.clone());
        self.collections_changed_at_version = version;
        Ok(Outcome::Collection {
            collection,
            created: true,
        })
    }

    fn drop_collection(&mut self, name: &str, delete_after_ms: u64) -> ApplyResult {
        let Some(collection) = self.collections.remove(name) else {
            return Err(Rejection::new(
                ErrorCode::NotFound,
                format!("collection `{name}` not found"),
            ));
        };
        let collection_id = collection.collection_id;
        let shard_keys: Vec<ShardKey> = self
            .shards
            .range(shard_range(collection_id))
            .map(|(key, _)| *key)
            .collect();
        for shard_key in shard_keys {
            if let Some(record) = self.shards.remove(&shard_key) {
                for segment in record.manifest.segments {
                    self.gc.insert(segment.key, delete_after_ms);
                    if let Some(deletes) = segment.deletes {
                        self.gc.insert(deletes.key, delete_after_ms);
                    }
                }
                for wal_entry in record.manifest.wal_tail {
                    self.gc.insert(wal_entry.key, delete_after_ms);
                }
            }
        }
        let version = self.bump_version();
        self.collections_changed_at_version = version;
        self.dropped.insert(collection_id, version);
        while self.dropped.len() > DROPPED_HISTORY {
            self.dropped.pop_first();
        }
        Ok(Outcome::Dropped { collection_id })
    }

    fn register_node(
        &mut self,
        node_id: &str,
        role: NodeRole,
        address: &str,
        now_ms: u64,
    ) -> ApplyResult {
        if node_id.is_empty() || node_id.len() > 255 {
            return Err(Rejection::new(
                ErrorCode::InvalidArgument,
                format!("node id `{node_id}` must be 1 to 255 bytes"),
            ));
        }
        if address.is_empty() {
            return Err(Rejection::new(
                ErrorCode::InvalidArgument,
                format!("node `{node_id}` registered without an address"),
            ));
        }
        let version = self.bump_version();
        let record = self
            .nodes
            .entry(node_id.to_owned())
            .or_insert_with(|| NodeRecord {
                node_id: node_id.to_owned(),
                role,
                address: address.to_owned(),
                last_heartbeat_ms: now_ms,
                state: NodeState::Alive,
                changed_at_version: version,
            });
        if record.role != role {
            // A node id is one process; a role change means a new node reused the id.
            let previous_role = record.role;
            self.release_node_work(node_id, version);
            let record = self.nodes.get_mut(node_id).expect("node inserted above");
            record.role = role;
            tracing::info!(
                node_id,
                ?previous_role,
                ?role,
                "node re-registered with a new role"
            );
        }
        let record = self.nodes.get_mut(node_id).expect("node inserted above");
        record.address = address.to_owned();
        record.last_heartbeat_ms = now_ms;
        if record.state == NodeState::Dead {
            record.state = NodeState::Alive;
        }
        record.changed_at_version = version;
        Ok(Outcome::Node(record.clone()))
    }

    fn heartbeat(&mut self, node_id: &str, ready_shards: &[ShardKey], now_ms: u64) -> ApplyResult {
        let Some(record) = self.nodes.get_mut(node_id) else {
            return Err(Rejection::new(
                ErrorCode::NotFound,
                format!("node `{node_id}` is not registered"),
            ));
        };
        record.last_heartbeat_ms = now_ms;
        let mut node_changed = false;
        if record.state == NodeState::Dead {
            record.state = NodeState::Alive;
            node_changed = true;
        }
        let is_searcher = record.role == NodeRole::Searcher;
        let mut changed_shards = Vec::new();
        if is_searcher {
            let ready: BTreeSet<ShardKey> = ready_shards.iter().copied().collect();
            for (shard_key, shard_record) in &self.shards {
                if let Some(is_ready) = shard_record.searchers.get(node_id)
                    && *is_ready != ready.contains(shard_key)
                {
                    changed_shards.push(*shard_key);
                }
            }
            if !changed_shards.is_empty() {
                let version = self.bump_version();
                for shard_key in &changed_shards {
                    if let Some(shard_record) = self.shards.get_mut(shard_key) {
                        let is_ready = ready.contains(shard_key);
                        shard_record.searchers.insert(node_id.to_owned(), is_ready);
                        shard_record.changed_at_version = version;
                    }
                }
            }
        }
        if node_changed {
            let version = self.bump_version();
            if let Some(record) = self.nodes.get_mut(node_id) {
                record.changed_at_version = version;
            }
        }
        let record = self.nodes.get(node_id).cloned();
        Ok(Outcome::Node(record.expect("node checked above")))
    }

    fn drain_node(&mut self, node_id: &str) -> ApplyResult {
        if !self.nodes.contains_key(node_id) {
            return Err(Rejection::new(
                ErrorCode::NotFound,
                format!("node `{node_id}` is not registered"),
            ));
        }
        let version = self.bump_version();
        let record = self.nodes.get_mut(node_id).expect("node checked above");
        if record.state != NodeState::Dead {
            record.state = NodeState::Draining;
        }
        record.changed_at_version = version;
        Ok(Outcome::Node(record.clone()))
    }

    fn shard_mut(&mut self, shard: ShardKey) -> Result<&mut ShardRecord, Rejection> {
        shard_entry(&mut self.shards, shard)
    }

    fn acquire_lease(
        &mut self,
        shard: ShardKey,
        node_id: &str,
        ttl_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        if ttl_ms == 0 {
            return Err(Rejection::new(
                ErrorCode::InvalidArgument,
                format!("lease ttl for shard {shard} must be positive"),
            ));
        }
        match self.nodes.get(node_id) {
            None => {
                return Err(Rejection::new(
                    ErrorCode::NotFound,
                    format!("node `{node_id}` is not registered"),
                ));
            }
            Some(node) if node.role != NodeRole::Indexer => {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!("node `{node_id}` is not an indexer and cannot lease shard {shard}"),
                ));
            }
            Some(_) => {}
        }
        let version = self.version + 1;
        let record = self.shard_mut(shard)?;
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        if let Some(lease) = &mut record.lease {
            if lease.holder == node_id {
                lease.expires_at_ms = lease.expires_at_ms.max(expires_at_ms);
                return Ok(Outcome::Lease(lease.clone()));
            }
            if lease.expires_at_ms > now_ms {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "shard {shard} is leased to `{}` at epoch {} until {} ms",
                        lease.holder, lease.epoch, lease.expires_at_ms
                    ),
                ));
            }
        }
        record.epoch += 1;
        let lease = Lease {
            holder: node_id.to_owned(),
            epoch: record.epoch,
            expires_at_ms,
        };
        record.lease = Some(lease.clone());
        record.changed_at_version = version;
        self.version = version;
        Ok(Outcome::Lease(lease))
    }

    fn renew_lease(
        &mut self,
        shard: ShardKey,
        node_id: &str,
        epoch: u64,
        ttl_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        let record = self.shard_mut(shard)?;
        let Some(lease) = &mut record.lease else {
            return Err(Rejection::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "shard {shard} has no lease to renew (renewal by `{node_id}` at epoch {epoch}, current epoch {})",
                    record.epoch
                ),
            ));
        };
        if lease.holder != node_id || lease.epoch != epoch {
            return Err(Rejection::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "shard {shard} is leased to `{}` at epoch {}; renewal by `{node_id}` at epoch {epoch} refused",
                    lease.holder, lease.epoch
                ),
            ));
        }
        lease.expires_at_ms = lease.expires_at_ms.max(now_ms.saturating_add(ttl_ms));
        Ok(Outcome::Lease(lease.clone()))
    }

    fn commit_wal(
        &mut self,
        shard: ShardKey,
        epoch: u64,
        seq: u64,
        object_key: &str,
        rows: u64,
    ) -> ApplyResult {
        let version = self.version + 1;
        let gc = &self.gc;
        let record = shard_entry(&mut self.shards, shard)?;
        check_epoch(shard, record, epoch)?;
        let entry = WalEntry {
            position: WalPosition {
                epoch,
                sequence: seq,
            },
            key: object_key.to_owned(),
            rows: u32::try_from(rows).unwrap_or(u32::MAX),
        };
        let commit = record
            .manifest
            .commit_wal(&shard, entry, |key| gc.contains_key(key))?;
        let manifest_version = record.manifest.version;
        if commit == WalCommit::Appended {
            record.changed_at_version = version;
            self.version = version;
        }
        Ok(Outcome::WalCommitted {
            manifest_version,
            duplicate: commit == WalCommit::Duplicate,
        })
    }

    fn commit_manifest_change(
        &mut self,
        change: &ShardManifestChange,
        delete_after_ms: u64,
    ) -> ApplyResult {
        let shard = change.shard;
        let version = self.version + 1;
        let gc = &self.gc;
        let record = shard_entry(&mut self.shards, shard)?;
        check_epoch(shard, record, change.epoch)?;
        let outcome = apply_change(&mut record.manifest, &shard, &change.change, |key| {
            gc.contains_key(key)
        })?;
        let manifest_version = record.manifest.version;
        let ChangeOutcome::Applied { retired_keys } = outcome else {
            return Ok(Outcome::ManifestCommitted {
                manifest_version,
                duplicate: true,
            });
        };
        record.changed_at_version = version;
        self.version = version;
        for key in retired_keys {
            // The GC list owns it now (it has its own grace period).
            self.orphans.remove(&key);
            self.gc.insert(key, delete_after_ms);
        }
        Ok(Outcome::ManifestCommitted {
            manifest_version,
            duplicate: false,
        })
    }

    /// Drops a node's leases and searcher assignments (its epochs stay).
    fn release_node_work(&mut self, node_id: &str, version: u64) -> u32 {
        let mut changes = 0;
        for record in self.shards.values_mut() {
            let mut changed = false;
            if record
                .lease
                .as_ref()
                .is_some_and(|lease| lease.holder == node_id)
            {
                record.lease = None;
                changed = true;
            }
            if record.searchers.remove(node_id).is_some() {
                changed = true;
            }
            if changed {
                record.changed_at_version = version;
                changes += 1;
            }
        }
        changes
    }

    /// Applies the control loop's rules at leader time `now_ms` and returns how many
    /// records changed: nodes silent for `node_timeout_ms` become dead and lose their
    /// work, expired leases are cleared, shards without a lease go to the live indexer
    /// holding the fewest leases (new epoch), and each shard keeps `replication`
    /// searchers chosen by rendezvous hashing.
    pub fn reconcile(&mut self, now_ms: u64, node_timeout_ms: u64, lease_ttl_ms: u64) -> u32 {
        let version = self.version + 1;
        let mut changes = 0u32;

        let newly_dead: Vec<String> = self
            .nodes
            .values()
            .filter(|node| {
                node.state != NodeState::Dead
                    && node.last_heartbeat_ms.saturating_add(node_timeout_ms) < now_ms
            })
            .map(|node| node.node_id.clone())
            .collect();
        for node_id in &newly_dead {
            if let Some(node) = self.nodes.get_mut(node_id) {
                node.state = NodeState::Dead;
                node.changed_at_version = version;
                changes += 1;
            }
            changes += self.release_node_work(node_id, version);
        }

        let live_indexers: Vec<String> = self
            .nodes
            .values()
            .filter(|node| node.role == NodeRole::Indexer && node.state == NodeState::Alive)
            .map(|node| node.node_id.clone())
            .collect();
        let live_searchers: Vec<String> = self
            .nodes
            .values()
            .filter(|node| node.role == NodeRole::Searcher && node.state == NodeState::Alive)
            .map(|node| node.node_id.clone())
            .collect();
        let replication_of: BTreeMap<u64, usize> = self
            .collections
            .values()
            .map(|collection| {
                (
                    collection.collection_id,
                    collection.spec.replication as usize,
                )
            })
            .collect();

        // Expired leases and leases of nodes that are gone.
        for record in self.shards.values_mut() {
            let expired = record.lease.as_ref().is_some_and(|lease| {
                lease.expires_at_ms <= now_ms
                    || self
                        .nodes
                        .get(&lease.holder)
                        .is_none_or(|node| node.state == NodeState::Dead)
            });
            if expired {
                record.lease = None;
                record.changed_at_version = version;
                changes += 1;
            }
        }

        // Orphaned shards go to the live indexer with the fewest leases.
        if !live_indexers.is_empty() {
            let mut lease_counts: BTreeMap<&str, usize> = live_indexers
                .iter()
                .map(|node_id| (node_id.as_str(), 0))
                .collect();
            for record in self.shards.values() {
                if let Some(lease) = &record.lease
                    && let Some(count) = lease_counts.get_mut(lease.holder.as_str())
                {
                    *count += 1;
                }
            }
            for record in self.shards.values_mut() {
                if record.lease.is_some() {
                    continue;
                }
                let Some((least_loaded, _)) = lease_counts
                    .iter()
                    .min_by(|left, right| left.1.cmp(right.1).then_with(|| left.0.cmp(right.0)))
                    .map(|(node_id, count)| (node_id.to_string(), *count))
                else {
                    break;
                };
                record.epoch += 1;
                record.lease = Some(Lease {
                    holder: least_loaded.clone(),
                    epoch: record.epoch,
                    expires_at_ms: now_ms.saturating_add(lease_ttl_ms),
                });
                record.changed_at_version = version;
                changes += 1;
                if let Some(count) = lease_counts.get_mut(least_loaded.as_str()) {
                    *count += 1;
                }
            }
        }

        // Searcher assignments: the top `replication` live searchers by rendezvous score.
        for (shard_key, record) in self.shards.iter_mut() {
            let replication = replication_of
                .get(&shard_key.collection_id)
                .copied()
                .unwrap_or(1);
            let desired = rendezvous_top(&live_searchers, *shard_key, replication);
            let current: BTreeSet<&str> = record.searchers.keys().map(String::as_str).collect();
            let desired_set: BTreeSet<&str> = desired.iter().map(String::as_str).collect();
            if current == desired_set {
                continue;
            }
            let assignments: BTreeMap<String, bool> = desired
                .into_iter()
                .map(|node_id| {
                    let ready = record.searchers.get(&node_id).copied().unwrap_or(false);
                    (node_id, ready)
                })
                .collect();
            record.searchers = assignments;
            record.changed_at_version = version;
            changes += 1;
        }

        if changes > 0 {
            self.version = version;
        }
        changes
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

/// Rejects a write whose epoch is not the shard's current epoch.
fn check_epoch(shard: ShardKey, record: &ShardRecord, epoch: u64) -> Result<(), Rejection> {
    if epoch < record.epoch {
        return Err(Rejection::new(
            ErrorCode::FailedPrecondition,
            format!(
                "stale epoch {epoch} for shard {shard}: current epoch is {}",
                record.epoch
            ),
        ));
    }
    if epoch > record.epoch {
        return Err(Rejection::new(
            ErrorCode::FailedPrecondition,
            format!(
                "epoch {epoch} for shard {shard} was never granted: current epoch is {}",
                record.epoch
            ),
        ));
    }
    Ok(())
}

/// Checks a spec and fills its defaults (0 shards or replication = 1).
fn normalize_spec(spec: &CollectionSpec) -> Result<CollectionSpec, Rejection> {
    let invalid = |message: String| Err(Rejection::new(ErrorCode::InvalidArgument, message));
    let name = &spec.name;
    if name.is_empty()
        || name.len() > 255
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    {
        return invalid(format!(
            "collection name `{name}` must be 1 to 255 characters of [A-Za-z0-9_-]"
        ));
    }
    if spec.dimension == 0 || spec.dimension > MAX_DIMENSION {
        return invalid(format!(
            "dimension {} of collection `{name}` must be between 1 and {MAX_DIMENSION}",
            spec.dimension
        ));
    }
    let mut normalized = spec.clone();
    if normalized.shards == 0 {
        normalized.shards = 1;
    }
    if normalized.replication == 0 {
        normalized.replication = 1;
    }
    if normalized.shards > MAX_SHARDS {
        return invalid(format!(
            "shard count {} of collection `{name}` is above the limit {MAX_SHARDS}",
            spec.shards
        ));
    }
    if normalized.replication > MAX_REPLICATION {
        return invalid(format!(
            "replication {} of collection `{name}` is above the limit {MAX_REPLICATION}",
            spec.replication
        ));
    }
    if normalized.index.extended_bits > 8 {
        return invalid(format!(
            "index.extended_bits {} of collection `{name}` must be at most 8",
            spec.index.extended_bits
        ));
    }
    let mut field_names = BTreeSet::new();
    for field in &spec.payload_schema {
        if field.name.is_empty() || !field_names.insert(field.name.as_str()) {
            return invalid(format!(
                "payload field `{}` of collection `{name}` is empty or declared twice",
                field.name
            ));
        }
    }
    Ok(normalized)
}

fn shard_range(collection_id: u64) -> std::ops::RangeInclusive<ShardKey> {
    ShardKey {
        collection_id,
        shard: 0,
    }..=ShardKey {
        collection_id,
        shard: u32::MAX,
    }
}

/// Returns the rendezvous (highest random weight) score of `node_id` for `shard`:
/// a stable 64-bit hash, the same on every replica and every build.
pub(crate) fn rendezvous_score(node_id: &str, shard: ShardKey) -> u64 {
    // FNV-1a over the inputs, then a splitmix64 finalizer to spread the bits.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = node_id
        .as_bytes()
        .iter()
        .copied()
        .chain([0xff])
        .chain(shard.collection_id.to_le_bytes())
        .chain(shard.shard.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// Returns the `count` nodes with the highest rendezvous scores for `shard`.
pub(crate) fn rendezvous_top(node_ids: &[String], shard: ShardKey, count: usize) -> Vec<String> {
    let mut scored: Vec<(u64, &String)> = node_ids
        .iter()
        .map(|node_id| (rendezvous_score(node_id, shard), node_id))
        .collect();
    scored.sort_by(|left, right| right.0.cmp(&left.0).then_with(|| left.1.cmp(right.1)));
    scored
        .into_iter()
        .take(count)
        .map(|(_, node_id)| node_id.clone())
        .collect()
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
    quiver_model::SegmentEntry {
        segment_id: segment_id.to_owned(),
        key: format!("segments/{segment_id}.qseg"),
        rows,
        size_bytes: u64::from(rows) * 16,
        deletes: None,
        default_nprobe: None,
    }
}

#[cfg(test)]
mod tests;
