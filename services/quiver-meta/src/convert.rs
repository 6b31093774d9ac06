//! Conversions between the protobuf messages and the catalog model.

use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;

use crate::error::{MetaError, MetaResult};
use crate::model::{
    Collection, CollectionSpec, DeletesRef, FieldKind, IdType, IndexParams, Lease, Manifest,
    Metric, NodeRecord, NodeRole, NodeState, PayloadField, SegmentEntry, ShardKey, ShardRecord,
    VectorPrecision, WalEntry,
};

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

pub(crate) fn shard_ref(shard: ShardKey) -> pb::ShardRef {
    pb::ShardRef {
        collection_id: shard.collection_id,
        shard: shard.shard,
    }
}

pub(crate) fn collection_spec_from_proto(
    spec: Option<pb::CollectionSpec>,
) -> MetaResult<CollectionSpec> {
    let spec = spec.ok_or_else(|| invalid("`spec` is required".into()))?;
    let metric = match pb::Metric::try_from(spec.metric) {
        Ok(pb::Metric::Cosine) => Metric::Cosine,
        Ok(pb::Metric::Dot) => Metric::Dot,
        Ok(pb::Metric::L2) => Metric::L2,
        _ => {
            return Err(invalid(format!(
                "metric of collection `{}` must be cosine, dot or l2",
                spec.name
            )));
        }
    };
    let id_type = match pb::IdType::try_from(spec.id_type) {
        Ok(pb::IdType::Unspecified | pb::IdType::U64) => IdType::U64,
        Ok(pb::IdType::String) => IdType::String,
        Err(_) => {
            return Err(invalid(format!(
                "id_type {} of collection `{}` is unknown",
                spec.id_type, spec.name
            )));
        }
    };
    let index = match spec.index {
        None => IndexParams::default(),
        Some(index) => IndexParams {
            extended_bits: index.extended_bits,
            raw_precision: match pb::VectorPrecision::try_from(index.raw_precision) {
                Ok(pb::VectorPrecision::Unspecified | pb::VectorPrecision::F32) => {
                    VectorPrecision::F32
                }
                Ok(pb::VectorPrecision::Bf16) => VectorPrecision::Bf16,
                Err(_) => {
                    return Err(invalid(format!(
                        "index.raw_precision of collection `{}` is unknown",
                        spec.name
                    )));
                }
            },
            target_segment_size_bytes: index.target_segment_size_bytes,
        },
    };
    let mut payload_schema = Vec::with_capacity(spec.payload_schema.len());
    for field in spec.payload_schema {
        let kind = match pb::FieldKind::try_from(field.kind) {
            Ok(pb::FieldKind::Keyword) => FieldKind::Keyword,
            Ok(pb::FieldKind::Integer) => FieldKind::Integer,
            Ok(pb::FieldKind::Float) => FieldKind::Float,
            Ok(pb::FieldKind::Bool) => FieldKind::Bool,
            _ => {
                return Err(invalid(format!(
                    "payload field `{}` of collection `{}` needs a kind (keyword, integer, float, bool)",
                    field.name, spec.name
                )));
            }
        };
        payload_schema.push(PayloadField {
            name: field.name,
            kind,
        });
    }
    Ok(CollectionSpec {
        name: spec.name,
        dimension: spec.dimension,
        metric,
        id_type,
        shards: spec.shards,
        replication: spec.replication,
        index,
        payload_schema,
    })
}

pub(crate) fn collection_spec_to_proto(spec: &CollectionSpec) -> pb::CollectionSpec {
    pb::CollectionSpec {
        name: spec.name.clone(),
        dimension: spec.dimension,
        metric: match spec.metric {
            Metric::Cosine => pb::Metric::Cosine,
            Metric::Dot => pb::Metric::Dot,
            Metric::L2 => pb::Metric::L2,
        } as i32,
        id_type: match spec.id_type {
            IdType::U64 => pb::IdType::U64,
            IdType::String => pb::IdType::String,
        } as i32,
        shards: spec.shards,
        replication: spec.replication,
        index: Some(pb::IndexParams {
            extended_bits: spec.index.extended_bits,
            raw_precision: match spec.index.raw_precision {
                VectorPrecision::F32 => pb::VectorPrecision::F32,
                VectorPrecision::Bf16 => pb::VectorPrecision::Bf16,
            } as i32,
            target_segment_size_bytes: spec.index.target_segment_size_bytes,
        }),
        payload_schema: spec
            .payload_schema
            .iter()
            .map(|field| pb::PayloadField {
                name: field.name.clone(),
                kind: match field.kind {
                    FieldKind::Keyword => pb::FieldKind::Keyword,
                    FieldKind::Integer => pb::FieldKind::Integer,
                    FieldKind::Float => pb::FieldKind::Float,
                    FieldKind::Bool => pb::FieldKind::Bool,
                } as i32,
            })
            .collect(),
    }
}

pub(crate) fn collection_to_proto(collection: &Collection) -> pb::Collection {
    pb::Collection {
        collection_id: collection.collection_id,
        spec: Some(collection_spec_to_proto(&collection.spec)),
        created_at_ms: collection.created_at_ms,
    }
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

pub(crate) fn segment_from_proto(segment: pb::Segment) -> SegmentEntry {
    let deletes = if segment.deletes_key.is_empty() {
        None
    } else {
        Some(DeletesRef {
            object_key: segment.deletes_key,
            version: segment.deletes_version,
            deleted_rows: segment.deleted_rows,
        })
    };
    SegmentEntry {
        segment_id: segment.segment_id,
        object_key: segment.object_key,
        rows: segment.rows,
        size_bytes: segment.size_bytes,
        deletes,
        default_nprobe: segment.default_nprobe,
    }
}

pub(crate) fn segment_to_proto(segment: &SegmentEntry) -> pb::Segment {
    pb::Segment {
        segment_id: segment.segment_id.clone(),
        object_key: segment.object_key.clone(),
        rows: segment.rows,
        size_bytes: segment.size_bytes,
        deletes_key: segment
            .deletes
            .as_ref()
            .map(|deletes| deletes.object_key.clone())
            .unwrap_or_default(),
        deletes_version: segment
            .deletes
            .as_ref()
            .map_or(0, |deletes| deletes.version),
        deleted_rows: segment
            .deletes
            .as_ref()
            .map_or(0, |deletes| deletes.deleted_rows),
        default_nprobe: segment.default_nprobe,
    }
}

pub(crate) fn wal_entry_to_proto(entry: &WalEntry) -> pb::WalEntry {
    pb::WalEntry {
        epoch: entry.epoch,
        seq: entry.seq,
        object_key: entry.object_key.clone(),
        rows: entry.rows,
    }
}

pub(crate) fn manifest_to_proto(
    shard: ShardKey,
    manifest: &Manifest,
    last_wal: Option<(u64, u64)>,
) -> pb::Manifest {
    pb::Manifest {
        shard: Some(shard_ref(shard)),
        version: manifest.version,
        segments: manifest.segments.values().map(segment_to_proto).collect(),
        wal_tail: manifest.wal_tail.iter().map(wal_entry_to_proto).collect(),
        last_committed: last_wal.map(|(epoch, seq)| pb::WalPosition { epoch, seq }),
    }
}

pub(crate) fn routing_to_proto(shard: ShardKey, record: &ShardRecord) -> pb::ShardRouting {
    pb::ShardRouting {
        shard: Some(shard_ref(shard)),
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
    fn specs_round_trip_and_unknown_metrics_are_rejected() {
        let spec = CollectionSpec {
            name: "docs".into(),
            dimension: 384,
            metric: Metric::L2,
            id_type: IdType::String,
            shards: 4,
            replication: 2,
            index: IndexParams {
                extended_bits: 3,
                raw_precision: VectorPrecision::Bf16,
                target_segment_size_bytes: 1 << 30,
            },
            payload_schema: vec![PayloadField {
                name: "lang".into(),
                kind: FieldKind::Keyword,
            }],
        };
        let round_trip =
            collection_spec_from_proto(Some(collection_spec_to_proto(&spec))).expect("convert");
        assert_eq!(round_trip, spec);
        let mut unknown = collection_spec_to_proto(&spec);
        unknown.metric = 0;
        let error = collection_spec_from_proto(Some(unknown)).unwrap_err();
        assert!(error.to_string().contains("metric"), "{error}");
    }

    #[test]
    fn segments_without_a_bitmap_round_trip() {
        let segment = SegmentEntry {
            segment_id: "s".into(),
            object_key: "k".into(),
            rows: 1,
            size_bytes: 2,
            deletes: None,
            default_nprobe: 0,
        };
        assert_eq!(segment_from_proto(segment_to_proto(&segment)), segment);
    }
}
