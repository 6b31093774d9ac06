//! Conversions between the protobuf messages and the catalog's own records
//! (nodes, leases, routing); the shared model's conversions are
//! `quiver_proto::convert`'s.

use quiver_proto::ErrorCode;
use quiver_proto::convert::{collection_spec_from_proto, shard_key_to_proto};
use quiver_proto::meta as pb;

pub(crate) use quiver_proto::convert::{
    collection_to_proto, deletes_from_proto, manifest_to_proto, probes_from_proto,
    segment_from_proto, wal_position_from_proto,
};

use crate::error::{MetaError, MetaResult};
use crate::model::{CollectionSpec, Lease, NodeRecord, NodeRole, NodeState, ShardKey, ShardRecord};

fn invalid(message: String) -> MetaError {
    MetaError::Rejected {
        code: ErrorCode::InvalidArgument,
        message,
    }
}

/// Returns the shard a request names, or an error naming the missing field.
pub(crate) fn shard_key(shard: Option<&pb::ShardRef>, field: &str) -> MetaResult<ShardKey> {
    let shard = shard.ok_or_else(|| invalid(format!("`{field}` is required")))?;
    Ok(ShardKey {
        collection_id: shard.collection_id,
        shard: shard.shard,
    })
}

/// Returns the spec a create request carries, or an error naming what is wrong.
pub(crate) fn collection_spec(spec: Option<pb::CollectionSpec>) -> MetaResult<CollectionSpec> {
    let spec = spec.ok_or_else(|| invalid("`spec` is required".into()))?;
    collection_spec_from_proto(&spec).map_err(invalid)
}

pub(crate) fn node_role_from_proto(role: i32, node_id: &str) -> MetaResult<NodeRole> {
    match pb::NodeRole::try_from(role) {
        Ok(pb::NodeRole::Indexer) => Ok(NodeRole::Indexer),
        Ok(pb::NodeRole::Searcher) => Ok(NodeRole::Searcher),
        Ok(pb::NodeRole::Gateway) => Ok(NodeRole::Gateway),
        _ => Err(invalid(format!(
            "role of node `{node_id}` must be indexer, searcher or gateway"
        ))),
    }
}

pub(crate) fn node_to_proto(node: &NodeRecord) -> pb::NodeInfo {
    pb::NodeInfo {
        node_id: node.node_id.clone(),
        role: match node.role {
            NodeRole::Indexer => pb::NodeRole::Indexer,
            NodeRole::Searcher => pb::NodeRole::Searcher,
            NodeRole::Gateway => pb::NodeRole::Gateway,
        } as i32,
        address: node.address.clone(),
        last_heartbeat_ms: node.last_heartbeat_ms,
        state: match node.state {
            NodeState::Alive => pb::NodeState::Alive,
            NodeState::Dead => pb::NodeState::Dead,
            NodeState::Draining => pb::NodeState::Draining,
        } as i32,
    }
}

pub(crate) fn lease_to_proto(lease: &Lease) -> pb::Lease {
    pb::Lease {
        holder: lease.holder.clone(),
        epoch: lease.epoch,
        expires_at_ms: lease.expires_at_ms,
    }
}

pub(crate) fn routing_to_proto(shard: ShardKey, record: &ShardRecord) -> pb::ShardRouting {
    pb::ShardRouting {
        shard: Some(shard_key_to_proto(shard)),
        lease: record.lease.as_ref().map(lease_to_proto),
        epoch: record.epoch,
        searchers: record
            .searchers
            .iter()
            .map(|(node_id, ready)| pb::SearcherAssignment {
                node_id: node_id.clone(),
                ready: *ready,
            })
            .collect(),
        manifest_version: record.manifest.version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_request_needs_a_valid_spec() {
        assert!(
            collection_spec(None)
                .unwrap_err()
                .to_string()
                .contains("spec")
        );
        let spec = pb::CollectionSpec {
            name: "docs".into(),
            dimension: 4,
            ..Default::default()
        };
        let error = collection_spec(Some(spec)).unwrap_err();
        assert_eq!(error.kind(), ErrorCode::InvalidArgument);
        assert!(error.to_string().contains("metric"), "{error}");
    }
}
