//! The control loop's rules: dead nodes lose their work, expired leases are
//! cleared, orphaned shards go to the least-loaded live indexer, and each shard
//! keeps its searchers chosen by rendezvous hashing.

use std::collections::{BTreeMap, BTreeSet};

use quiver_common::hash::{FNV1A64_OFFSET, fnv1a64_extend, mix64};

use super::Catalog;
use crate::model::{Lease, NodeRole, NodeState, ShardKey};

impl Catalog {
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

/// Returns the rendezvous (highest random weight) score of `node_id` for `shard`:
/// a stable 64-bit hash, the same on every replica and every build.
pub(crate) fn rendezvous_score(node_id: &str, shard: ShardKey) -> u64 {
    // FNV-1a over the inputs, then a splitmix64 finalizer to spread the bits.
    let mut hash = fnv1a64_extend(FNV1A64_OFFSET, node_id.as_bytes());
    hash = fnv1a64_extend(hash, &[0xff]);
    hash = fnv1a64_extend(hash, &shard.collection_id.to_le_bytes());
    hash = fnv1a64_extend(hash, &shard.shard.to_le_bytes());
    mix64(hash)
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
