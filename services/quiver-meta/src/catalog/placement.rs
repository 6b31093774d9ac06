//! The control loop's rules: dead nodes lose their work, expired leases are
//! cleared, orphaned shards go to the least-loaded live indexer (within their
//! collection first), and each collection's shards spread evenly over the live
//! searchers, least-loaded first (rendezvous hashing breaks ties).

use std::collections::{BTreeMap, BTreeSet};

use quiver_common::hash::{FNV1A64_OFFSET, fnv1a64_extend, mix64};

use super::Catalog;
use crate::model::{Lease, NodeRole, NodeState, ShardKey};

impl Catalog {
    /// Applies the control loop's rules at leader time `now_ms` and returns how many
    /// records changed: nodes silent for `node_timeout_ms` become dead and lose their
    /// work, expired leases are cleared, shards without a lease go to the live indexer
    /// holding the fewest leases of its collection, then overall (new epoch), and
    /// each shard keeps `replication` searchers, spread evenly over the live
    /// searchers per collection (see [`spread_searchers`]).
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

        // Orphaned shards go to the live indexer holding the fewest leases of
        // the shard's collection, then the fewest leases overall.
        if !live_indexers.is_empty() {
            let mut lease_counts: BTreeMap<&str, usize> = live_indexers
                .iter()
                .map(|node_id| (node_id.as_str(), 0))
                .collect();
            let mut collection_lease_counts: BTreeMap<(u64, String), usize> = BTreeMap::new();
            for (shard_key, record) in &self.shards {
                if let Some(lease) = &record.lease
                    && let Some(count) = lease_counts.get_mut(lease.holder.as_str())
                {
                    *count += 1;
                    *collection_lease_counts
                        .entry((shard_key.collection_id, lease.holder.clone()))
                        .or_default() += 1;
                }
            }
            for (shard_key, record) in self.shards.iter_mut() {
                if record.lease.is_some() {
                    continue;
                }
                let in_collection = |node_id: &str| {
                    collection_lease_counts
                        .get(&(shard_key.collection_id, node_id.to_owned()))
                        .copied()
                        .unwrap_or(0)
                };
                let Some(least_loaded) = lease_counts
                    .iter()
                    .min_by(|left, right| {
                        in_collection(left.0)
                            .cmp(&in_collection(right.0))
                            .then_with(|| left.1.cmp(right.1))
                            .then_with(|| left.0.cmp(right.0))
                    })
                    .map(|(node_id, _)| node_id.to_string())
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
                *collection_lease_counts
                    .entry((shard_key.collection_id, least_loaded.clone()))
                    .or_default() += 1;
            }
        }

        // Searcher assignments: each collection's shards spread evenly over the
        // live searchers, least-loaded first, moving as few as it takes.
        let desired_searchers = spread_searchers(&self.shards, &replication_of, &live_searchers);
        for (shard_key, record) in self.shards.iter_mut() {
            let Some(desired) = desired_searchers.get(shard_key) else {
                continue;
            };
            let current: BTreeSet<&str> = record.searchers.keys().map(String::as_str).collect();
            let desired_set: BTreeSet<&str> = desired.iter().map(String::as_str).collect();
            if current == desired_set {
                continue;
            }
            let assignments: BTreeMap<String, bool> = desired
                .iter()
                .map(|node_id| {
                    let ready = record.searchers.get(node_id).copied().unwrap_or(false);
                    (node_id.clone(), ready)
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

/// Returns the `count` nodes with the highest rendezvous scores for `shard`
/// (the order [`spread_searchers`] breaks ties in).
#[cfg(test)]
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

/// Returns each shard's searchers: per collection, every shard keeps
/// `min(replication, live searchers)` of them, spread so that no live searcher
/// holds more than its share (the collection's assignments over the live
/// searchers, rounded up). Assignments to live searchers within their share
/// stay; a searcher over its share gives up assignments (at most one per shard
/// per round, so a shard keeps what it can); the free slots go to the searcher
/// with the fewest assignments in the collection, then overall, then the
/// highest rendezvous score. Deterministic: every replica computes the same.
fn spread_searchers(
    shards: &BTreeMap<ShardKey, super::ShardRecord>,
    replication_of: &BTreeMap<u64, usize>,
    live_searchers: &[String],
) -> BTreeMap<ShardKey, Vec<String>> {
    let live: BTreeSet<&str> = live_searchers.iter().map(String::as_str).collect();
    let mut total_load: BTreeMap<&str, usize> = live.iter().map(|node_id| (*node_id, 0)).collect();
    let mut by_collection: BTreeMap<u64, Vec<ShardKey>> = BTreeMap::new();
    for shard_key in shards.keys() {
        by_collection
            .entry(shard_key.collection_id)
            .or_default()
            .push(*shard_key);
    }
    let mut desired: BTreeMap<ShardKey, Vec<String>> = BTreeMap::new();
    for (collection_id, shard_keys) in by_collection {
        let replication = replication_of
            .get(&collection_id)
            .copied()
            .unwrap_or(1)
            .min(live.len());
        // Kept: the shard's current live searchers, best rendezvous first.
        let mut kept: Vec<Vec<&str>> = shard_keys
            .iter()
            .map(|shard_key| {
                let mut current: Vec<&str> = shards[shard_key]
                    .searchers
                    .keys()
                    .map(String::as_str)
                    .filter(|node_id| live.contains(node_id))
                    .collect();
                current.sort_by_key(|node_id| {
                    std::cmp::Reverse(rendezvous_score(node_id, *shard_key))
                });
                current.truncate(replication);
                current
            })
            .collect();
        let mut load: BTreeMap<&str, usize> = live.iter().map(|node_id| (*node_id, 0)).collect();
        for node_id in kept.iter().flatten() {
            *load.entry(node_id).or_default() += 1;
        }
        if !live.is_empty() {
            let share = (shard_keys.len() * replication).div_ceil(live.len());
            for _round in 0..replication {
                for (index, shard_key) in shard_keys.iter().enumerate() {
                    let over = kept[index]
                        .iter()
                        .enumerate()
                        .filter(|(_, node_id)| load[*node_id] > share)
                        .max_by_key(|(_, node_id)| {
                            (
                                load[*node_id],
                                std::cmp::Reverse(rendezvous_score(node_id, *shard_key)),
                            )
                        })
                        .map(|(position, _)| position);
                    if let Some(position) = over {
                        let node_id = kept[index].remove(position);
                        *load.entry(node_id).or_default() -= 1;
                    }
                }
            }
        }
        for node_id in kept.iter().flatten() {
            *total_load.entry(node_id).or_default() += 1;
        }
        for (index, shard_key) in shard_keys.iter().enumerate() {
            while kept[index].len() < replication {
                let Some(choice) = live
                    .iter()
                    .copied()
                    .filter(|node_id| !kept[index].contains(node_id))
                    .min_by_key(|node_id| {
                        (
                            load[node_id],
                            total_load[node_id],
                            std::cmp::Reverse(rendezvous_score(node_id, *shard_key)),
                        )
                    })
                else {
                    break;
                };
                kept[index].push(choice);
                *load.entry(choice).or_default() += 1;
                *total_load.entry(choice).or_default() += 1;
            }
            desired.insert(
                *shard_key,
                kept[index]
                    .iter()
                    .map(|node_id| (*node_id).to_owned())
                    .collect(),
            );
        }
    }
    desired
}

/// One change of the cluster's placement a reconciliation made, as the leader
/// logs it: operators need to see which node was declared dead and where its
/// shards went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PlacementChange {
    /// A node went silent for the node timeout and is now dead.
    NodeDead {
        node_id: String,
        role: NodeRole,
        address: String,
        /// Leader time of its last heartbeat.
        last_heartbeat_ms: u64,
    },
    /// A shard's searchers changed (a move, an added or removed replica).
    SearchersChanged {
        shard: ShardKey,
        collection: String,
        from: Vec<String>,
        to: Vec<String>,
    },
    /// A shard's write lease went to another indexer (or none).
    LeaseMoved {
        shard: ShardKey,
        collection: String,
        from: Option<String>,
        to: Option<String>,
    },
}

impl PlacementChange {
    /// Logs this change on the leader: a dead node at warn, the rest at info.
    pub(crate) fn log(&self) {
        match self {
            PlacementChange::NodeDead {
                node_id,
                role,
                address,
                last_heartbeat_ms,
            } => tracing::warn!(
                node_id,
                ?role,
                address,
                last_heartbeat_ms,
                "node considered dead: no heartbeat within the node timeout; its shards move to live nodes"
            ),
            PlacementChange::SearchersChanged {
                shard,
                collection,
                from,
                to,
            } => tracing::info!(
                %shard,
                collection,
                from = %from.join(","),
                to = %to.join(","),
                "moved shard to searchers"
            ),
            PlacementChange::LeaseMoved {
                shard,
                collection,
                from,
                to,
            } => tracing::info!(
                %shard,
                collection,
                from = from.as_deref().unwrap_or("none"),
                to = to.as_deref().unwrap_or("none"),
                "moved shard lease"
            ),
        }
    }
}

/// Returns the placement changes between `before` and `after` (the catalog
/// before and after a reconciliation): nodes that became dead, shards whose
/// searchers or lease holder changed. A lease renewed by the same holder is not
/// a change; new shards (a collection just created) are left out.
pub(crate) fn placement_changes(before: &Catalog, after: &Catalog) -> Vec<PlacementChange> {
    let mut changes = Vec::new();
    for (node_id, node) in &after.nodes {
        let was_dead = before
            .nodes
            .get(node_id)
            .is_none_or(|previous| previous.state == NodeState::Dead);
        if node.state == NodeState::Dead && !was_dead {
            changes.push(PlacementChange::NodeDead {
                node_id: node_id.clone(),
                role: node.role,
                address: node.address.clone(),
                last_heartbeat_ms: node.last_heartbeat_ms,
            });
        }
    }
    let collection_names: BTreeMap<u64, &str> = after
        .collections
        .values()
        .map(|collection| (collection.collection_id, collection.spec.name.as_str()))
        .collect();
    for (shard_key, record) in &after.shards {
        let Some(previous) = before.shards.get(shard_key) else {
            continue;
        };
        let collection = collection_names
            .get(&shard_key.collection_id)
            .copied()
            .unwrap_or("")
            .to_owned();
        let from: Vec<String> = previous.searchers.keys().cloned().collect();
        let to: Vec<String> = record.searchers.keys().cloned().collect();
        if from != to {
            changes.push(PlacementChange::SearchersChanged {
                shard: *shard_key,
                collection: collection.clone(),
                from,
                to,
            });
        }
        let holder_before = previous.lease.as_ref().map(|lease| lease.holder.clone());
        let holder_after = record.lease.as_ref().map(|lease| lease.holder.clone());
        if holder_before != holder_after {
            changes.push(PlacementChange::LeaseMoved {
                shard: *shard_key,
                collection,
                from: holder_before,
                to: holder_after,
            });
        }
    }
    changes
}
