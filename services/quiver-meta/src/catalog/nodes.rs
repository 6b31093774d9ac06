//! Data nodes: registration, heartbeats (with a searcher's ready shards),
//! draining, and releasing a node's work.

use std::collections::BTreeSet;

use quiver_proto::ErrorCode;

use super::{ApplyResult, Catalog};
use crate::model::{NodeRecord, NodeRole, NodeState, Outcome, Rejection, ShardKey};

impl Catalog {
    pub(super) fn register_node(
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

    pub(super) fn heartbeat(
        &mut self,
        node_id: &str,
        ready_shards: &[ShardKey],
        now_ms: u64,
    ) -> ApplyResult {
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

    pub(super) fn drain_node(&mut self, node_id: &str) -> ApplyResult {
        let Some(node) = self.nodes.get(node_id) else {
            return Err(Rejection::new(
                ErrorCode::NotFound,
                format!("node `{node_id}` is not registered"),
            ));
        };
        if node.state == NodeState::Alive {
            self.refuse_draining_the_last(node_id, node.role)?;
        }
        let version = self.bump_version();
        let record = self.nodes.get_mut(node_id).expect("node checked above");
        if record.state != NodeState::Dead {
            record.state = NodeState::Draining;
        }
        record.changed_at_version = version;
        Ok(Outcome::Node(record.clone()))
    }

    /// Refuses to drain `node_id`, an alive node of `role`, when no other alive
    /// node of that role could take its work: every shard would be left without
    /// an indexer (writes fail) or a searcher (searches fail). A gateway holds no
    /// shards and may always be drained; so may any node while no shard exists.
    fn refuse_draining_the_last(&self, node_id: &str, role: NodeRole) -> Result<(), Rejection> {
        let role_name = match role {
            NodeRole::Indexer => "indexer",
            NodeRole::Searcher => "searcher",
            NodeRole::Gateway => return Ok(()),
        };
        let another_alive = self.nodes.values().any(|other| {
            other.node_id != node_id && other.role == role && other.state == NodeState::Alive
        });
        if another_alive || self.shards.is_empty() {
            return Ok(());
        }
        const NAMED_SHARDS: usize = 8;
        let mut stranded: Vec<String> = Vec::new();
        for collection in self.collections.values() {
            for key in self.shards.keys() {
                if key.collection_id == collection.collection_id {
                    stranded.push(format!("{}/{}", collection.spec.name, key.shard));
                }
            }
        }
        let total = self.shards.len();
        let mut named = stranded
            .iter()
            .take(NAMED_SHARDS)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if total > NAMED_SHARDS {
            named.push_str(&format!(" and {} more", total - NAMED_SHARDS));
        }
        Err(Rejection::new(
            ErrorCode::FailedPrecondition,
            format!(
                "cannot drain {role_name} `{node_id}`: it is the last alive {role_name}, and \
                 {total} shard(s) ({named}) would have no {role_name} to move to; start \
                 another {role_name} first"
            ),
        ))
    }

    /// Drops a node's leases and searcher assignments (its epochs stay).
    pub(super) fn release_node_work(&mut self, node_id: &str, version: u64) -> u32 {
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
}
