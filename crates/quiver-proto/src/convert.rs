//! Conversions between the wire messages and the model (`quiver-model`):
//! collections and their specs, point ids, shards, segments and manifests.
//! Engine types are built from the model where the engine is (e.g.
//! `quiver_index::SegmentSpec::for_collection`).

use quiver_model::{
    Collection, CollectionSpec, DeletesEntry, FieldKind, IdType, IndexParams, Manifest, Metric,
    PayloadField, PointId, SegmentEntry, SegmentProbes, ShardKey, ShardRef, VectorPrecision,
    WalEntry, WalPosition,
};

use crate::{data, meta};

/// Routing of an id to its shard (the model's; re-exported under its old path).
pub use quiver_model::shard_of;

/// Returns the model form of a wire collection spec, or what is wrong with it
/// (an unknown metric, id type, precision or field kind).
pub fn collection_spec_from_proto(spec: &meta::CollectionSpec) -> Result<CollectionSpec, String> {
    let metric = match meta::Metric::try_from(spec.metric) {
        Ok(meta::Metric::Cosine) => Metric::Cosine,
        Ok(meta::Metric::Dot) => Metric::Dot,
        Ok(meta::Metric::L2) => Metric::L2,
        _ => {
            return Err(format!(
                "metric of collection `{}` must be cosine, dot or l2",
                spec.name
            ));
        }
    };
    let id_type = match meta::IdType::try_from(spec.id_type) {
        Ok(meta::IdType::Unspecified | meta::IdType::U64) => IdType::U64,
        Ok(meta::IdType::String) => IdType::String,
        Err(_) => {
            return Err(format!(
                "id_type {} of collection `{}` is unknown",
                spec.id_type, spec.name
            ));
        }
    };
    let index = match &spec.index {
        None => IndexParams::default(),
        Some(index) => IndexParams {
            extended_bits: index.extended_bits,
            raw_precision: match meta::VectorPrecision::try_from(index.raw_precision) {
                Ok(meta::VectorPrecision::Unspecified | meta::VectorPrecision::F32) => {
                    VectorPrecision::F32
                }
                Ok(meta::VectorPrecision::Bf16) => VectorPrecision::Bf16,
                Err(_) => {
                    return Err(format!(
                        "index.raw_precision of collection `{}` is unknown",
                        spec.name
                    ));
                }
            },
            target_segment_size_bytes: index.target_segment_size_bytes,
        },
    };
    let mut payload_schema = Vec::with_capacity(spec.payload_schema.len());
    for field in &spec.payload_schema {
        let kind = match meta::FieldKind::try_from(field.kind) {
            Ok(meta::FieldKind::Keyword) => FieldKind::Keyword,
            Ok(meta::FieldKind::Integer) => FieldKind::Integer,
            Ok(meta::FieldKind::Float) => FieldKind::Float,
            Ok(meta::FieldKind::Bool) => FieldKind::Bool,
            _ => {
                return Err(format!(
                    "payload field `{}` of collection `{}` needs a kind (keyword, integer, float, bool)",
                    field.name, spec.name
                ));
            }
        };
        payload_schema.push(PayloadField {
            name: field.name.clone(),
            kind,
        });
    }
    Ok(CollectionSpec {
        name: spec.name.clone(),
        dimension: spec.dimension,
        metric,
        id_type,
        shards: spec.shards,
        replication: spec.replication,
        index,
        payload_schema,
    })
}

/// Returns the wire form of a collection spec.
pub fn collection_spec_to_proto(spec: &CollectionSpec) -> meta::CollectionSpec {
    meta::CollectionSpec {
        name: spec.name.clone(),
        dimension: spec.dimension,
        metric: match spec.metric {
            Metric::Cosine => meta::Metric::Cosine,
            Metric::Dot => meta::Metric::Dot,
            Metric::L2 => meta::Metric::L2,
        } as i32,
        id_type: match spec.id_type {
            IdType::U64 => meta::IdType::U64,
            IdType::String => meta::IdType::String,
        } as i32,
        shards: spec.shards,
        replication: spec.replication,
        index: Some(meta::IndexParams {
            extended_bits: spec.index.extended_bits,
            raw_precision: match spec.index.raw_precision {
                VectorPrecision::F32 => meta::VectorPrecision::F32,
                VectorPrecision::Bf16 => meta::VectorPrecision::Bf16,
            } as i32,
            target_segment_size_bytes: spec.index.target_segment_size_bytes,
        }),
        payload_schema: spec
            .payload_schema
            .iter()
            .map(|field| meta::PayloadField {
                name: field.name.clone(),
                kind: match field.kind {
                    FieldKind::Keyword => meta::FieldKind::Keyword,
                    FieldKind::Integer => meta::FieldKind::Integer,
                    FieldKind::Float => meta::FieldKind::Float,
                    FieldKind::Bool => meta::FieldKind::Bool,
                } as i32,
            })
            .collect(),
    }
}

/// Returns the model form of a wire collection, or what is wrong with it.
pub fn collection_from_proto(collection: &meta::Collection) -> Result<Collection, String> {
    let spec = collection
        .spec
        .as_ref()
        .ok_or_else(|| format!("collection {} has no spec", collection.collection_id))?;
    Ok(Collection {
        collection_id: collection.collection_id,
        spec: collection_spec_from_proto(spec)?,
        created_at_ms: collection.created_at_ms,
    })
}

/// Returns the wire form of a collection.
pub fn collection_to_proto(collection: &Collection) -> meta::Collection {
    meta::Collection {
        collection_id: collection.collection_id,
        spec: Some(collection_spec_to_proto(&collection.spec)),
        created_at_ms: collection.created_at_ms,
    }
}

/// Returns the model's id for a wire id (`None` when the id is unset).
pub fn point_id(id: &data::PointId) -> Option<PointId> {
    match &id.kind {
        Some(data::point_id::Kind::Num(number)) => Some(PointId::U64(*number)),
        Some(data::point_id::Kind::Text(text)) => Some(PointId::String(text.clone())),
        None => None,
    }
}

/// Returns the wire id of a model id.
pub fn wire_point_id(id: &PointId) -> data::PointId {
    data::PointId {
        kind: Some(match id {
            PointId::U64(number) => data::point_id::Kind::Num(*number),
            PointId::String(text) => data::point_id::Kind::Text(text.clone()),
        }),
    }
}

/// Returns the wire form of one search hit: the payload as the JSON text it was
/// stored as (passed on, not parsed and written again; empty when absent), the
/// vector empty when not asked for.
pub fn wire_hit(
    id: &PointId,
    score: f32,
    payload_json: Option<Vec<u8>>,
    vector: Option<Vec<f32>>,
) -> data::Hit {
    data::Hit {
        id: Some(wire_point_id(id)),
        score,
        payload_json: payload_json.unwrap_or_default(),
        vector: vector.unwrap_or_default(),
    }
}

/// Returns the wire form of a shard reference (its collection id must be a number).
pub fn shard_to_proto(shard: &ShardRef) -> Result<meta::ShardRef, String> {
    Ok(shard_key_to_proto(shard.key()?))
}

/// Returns the model form of a wire shard reference.
pub fn shard_from_proto(shard: &meta::ShardRef) -> ShardRef {
    ShardRef::from(shard_key_from_proto(shard))
}

/// Returns the catalog key of a wire shard reference.
pub fn shard_key_from_proto(shard: &meta::ShardRef) -> ShardKey {
    ShardKey {
        collection_id: shard.collection_id,
        shard: shard.shard,
    }
}

/// Returns the wire form of a catalog shard key.
pub fn shard_key_to_proto(shard: ShardKey) -> meta::ShardRef {
    meta::ShardRef {
        collection_id: shard.collection_id,
        shard: shard.shard,
    }
}

/// Returns the model form of a wire segment.
pub fn segment_from_proto(segment: &meta::Segment) -> SegmentEntry {
    SegmentEntry {
        segment_id: segment.segment_id.clone(),
        key: segment.object_key.clone(),
        rows: saturating_u32(segment.rows),
        size_bytes: segment.size_bytes,
        deletes: (!segment.deletes_key.is_empty()).then(|| DeletesEntry {
            key: segment.deletes_key.clone(),
            version: segment.deletes_version,
            deleted_rows: saturating_u32(segment.deleted_rows),
        }),
        default_nprobe: (segment.default_nprobe > 0).then_some(segment.default_nprobe),
        probe_ratio_milli: (segment.probe_ratio_milli > 0).then_some(segment.probe_ratio_milli),
        wide_nprobe: (segment.wide_nprobe > 0).then_some(segment.wide_nprobe),
        wide_probe_ratio_milli: (segment.wide_probe_ratio_milli > 0)
            .then_some(segment.wide_probe_ratio_milli),
        calibrated_rows: (segment.calibrated_rows > 0).then_some(segment.calibrated_rows),
    }
}

/// Returns the wire form of a segment.
pub fn segment_to_proto(segment: &SegmentEntry) -> meta::Segment {
    meta::Segment {
        segment_id: segment.segment_id.clone(),
        object_key: segment.key.clone(),
        rows: u64::from(segment.rows),
        size_bytes: segment.size_bytes,
        deletes_key: segment
            .deletes
            .as_ref()
            .map(|deletes| deletes.key.clone())
            .unwrap_or_default(),
        deletes_version: segment
            .deletes
            .as_ref()
            .map_or(0, |deletes| deletes.version),
        deleted_rows: segment
            .deletes
            .as_ref()
            .map_or(0, |deletes| u64::from(deletes.deleted_rows)),
        default_nprobe: segment.default_nprobe.unwrap_or(0),
        probe_ratio_milli: segment.probe_ratio_milli.unwrap_or(0),
        wide_nprobe: segment.wide_nprobe.unwrap_or(0),
        wide_probe_ratio_milli: segment.wide_probe_ratio_milli.unwrap_or(0),
        calibrated_rows: segment.calibrated_rows.unwrap_or(0),
    }
}

/// Returns the model form of a wire deletion bitmap update `(segment id, bitmap)`.
pub fn deletes_from_proto(update: &meta::DeletesUpdate) -> (String, DeletesEntry) {
    (
        update.segment_id.clone(),
        DeletesEntry {
            key: update.deletes_key.clone(),
            version: update.deletes_version,
            deleted_rows: saturating_u32(update.deleted_rows),
        },
    )
}

/// Reads a segment's new default probes (0 = none).
pub fn probes_from_proto(update: &meta::ProbesUpdate) -> (String, SegmentProbes) {
    let some = |value: u32| (value > 0).then_some(value);
    (
        update.segment_id.clone(),
        SegmentProbes {
            default_nprobe: some(update.default_nprobe),
            probe_ratio_milli: some(update.probe_ratio_milli),
            wide_nprobe: some(update.wide_nprobe),
            wide_probe_ratio_milli: some(update.wide_probe_ratio_milli),
            calibrated_rows: (update.calibrated_rows > 0).then_some(update.calibrated_rows),
        },
    )
}

/// Returns the wire form of a segment's new default probes.
pub fn probes_to_proto(segment_id: &str, probes: &SegmentProbes) -> meta::ProbesUpdate {
    meta::ProbesUpdate {
        segment_id: segment_id.to_string(),
        default_nprobe: probes.default_nprobe.unwrap_or(0),
        probe_ratio_milli: probes.probe_ratio_milli.unwrap_or(0),
        wide_nprobe: probes.wide_nprobe.unwrap_or(0),
        wide_probe_ratio_milli: probes.wide_probe_ratio_milli.unwrap_or(0),
        calibrated_rows: probes.calibrated_rows.unwrap_or(0),
    }
}

/// Returns the wire form of a deletion bitmap update.
pub fn deletes_to_proto(segment_id: &str, deletes: &DeletesEntry) -> meta::DeletesUpdate {
    meta::DeletesUpdate {
        segment_id: segment_id.to_owned(),
        deletes_key: deletes.key.clone(),
        deletes_version: deletes.version,
        deleted_rows: u64::from(deletes.deleted_rows),
    }
}

/// Returns the model form of a wire WAL position.
pub fn wal_position_from_proto(position: &meta::WalPosition) -> WalPosition {
    WalPosition {
        epoch: position.epoch,
        sequence: position.seq,
    }
}

/// Returns the wire form of a WAL position.
pub fn wal_position_to_proto(position: WalPosition) -> meta::WalPosition {
    meta::WalPosition {
        epoch: position.epoch,
        seq: position.sequence,
    }
}

/// Returns the wire form of a WAL tail entry.
pub fn wal_entry_to_proto(entry: &WalEntry) -> meta::WalEntry {
    meta::WalEntry {
        epoch: entry.position.epoch,
        seq: entry.position.sequence,
        object_key: entry.key.clone(),
        rows: u64::from(entry.rows),
    }
}

/// Returns the model form of a wire manifest.
pub fn manifest_from_proto(manifest: &meta::Manifest) -> Manifest {
    Manifest {
        version: manifest.version,
        segments: manifest.segments.iter().map(segment_from_proto).collect(),
        wal_tail: manifest
            .wal_tail
            .iter()
            .map(|entry| WalEntry {
                position: WalPosition {
                    epoch: entry.epoch,
                    sequence: entry.seq,
                },
                key: entry.object_key.clone(),
                rows: saturating_u32(entry.rows),
            })
            .collect(),
        last_committed: manifest
            .last_committed
            .as_ref()
            .map(wal_position_from_proto),
        // Not on the wire: only catalogs need it (to recognise late retries).
        wal_trimmed_through: None,
    }
}

/// Returns the wire form of the manifest of `shard`.
pub fn manifest_to_proto(shard: ShardKey, manifest: &Manifest) -> meta::Manifest {
    meta::Manifest {
        shard: Some(shard_key_to_proto(shard)),
        version: manifest.version,
        segments: manifest.segments.iter().map(segment_to_proto).collect(),
        wal_tail: manifest.wal_tail.iter().map(wal_entry_to_proto).collect(),
        last_committed: manifest.last_committed.map(wal_position_to_proto),
    }
}

fn saturating_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CollectionSpec {
        CollectionSpec {
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
        }
    }

    #[test]
    fn specs_round_trip_and_unknown_metrics_are_rejected() {
        let spec = spec();
        let round_trip = collection_spec_from_proto(&collection_spec_to_proto(&spec)).unwrap();
        assert_eq!(round_trip, spec);
        let mut unknown = collection_spec_to_proto(&spec);
        unknown.metric = 0;
        let error = collection_spec_from_proto(&unknown).unwrap_err();
        assert!(error.contains("metric"), "{error}");
        let collection = Collection {
            collection_id: 7,
            spec,
            created_at_ms: 5,
        };
        assert_eq!(
            collection_from_proto(&collection_to_proto(&collection)),
            Ok(collection)
        );
        let no_spec = meta::Collection {
            collection_id: 9,
            ..Default::default()
        };
        assert!(collection_from_proto(&no_spec).unwrap_err().contains('9'));
    }

    #[test]
    fn ids_round_trip() {
        for id in [PointId::U64(5), PointId::String("a".into())] {
            assert_eq!(point_id(&wire_point_id(&id)), Some(id));
        }
        assert_eq!(point_id(&data::PointId { kind: None }), None);
    }

    #[test]
    fn manifests_round_trip() {
        let segment = SegmentEntry {
            segment_id: "s".into(),
            key: "k".into(),
            rows: 1,
            size_bytes: 2,
            deletes: Some(DeletesEntry {
                key: "d".into(),
                version: 3,
                deleted_rows: 1,
            }),
            default_nprobe: Some(182),
            probe_ratio_milli: Some(680),
            wide_nprobe: Some(40),
            wide_probe_ratio_milli: Some(1250),
            calibrated_rows: Some(240_000),
        };
        assert_eq!(segment_from_proto(&segment_to_proto(&segment)), segment);
        let probes = segment.probes();
        assert_eq!(
            probes_from_proto(&probes_to_proto("s1", &probes)),
            ("s1".to_string(), probes)
        );
        let manifest = Manifest {
            version: 4,
            segments: vec![segment],
            wal_tail: vec![WalEntry {
                position: WalPosition {
                    epoch: 2,
                    sequence: 9,
                },
                key: "w".into(),
                rows: 3,
            }],
            last_committed: Some(WalPosition {
                epoch: 2,
                sequence: 9,
            }),
            wal_trimmed_through: None,
        };
        let shard = ShardKey {
            collection_id: 7,
            shard: 1,
        };
        let wire = manifest_to_proto(shard, &manifest);
        assert_eq!(manifest_from_proto(&wire), manifest);
        assert_eq!(
            shard_from_proto(wire.shard.as_ref().unwrap()),
            ShardRef::from(shard)
        );
        assert_eq!(
            shard_to_proto(&ShardRef::from(shard)),
            Ok(shard_key_to_proto(shard))
        );
        let (segment_id, deletes) = deletes_from_proto(&deletes_to_proto(
            "s",
            manifest.segments[0].deletes.as_ref().unwrap(),
        ));
        assert_eq!(segment_id, "s");
        assert_eq!(Some(&deletes), manifest.segments[0].deletes.as_ref());
    }
}
