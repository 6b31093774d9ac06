//! Conversions between the wire messages and the engine's types: a collection's
//! spec as a segment spec, point ids, and shard manifests.

use quiver_index::{
    BuildParams, FieldKind, FieldSpec, IdType, Metric, PointId, RawPrecision, SegmentSpec,
};

use quiver_storage::manifest::{
    DeletesEntry, Manifest, SegmentEntry, ShardRef, WalEntry, WalPosition,
};

use crate::{data, meta};

/// Returns the segment spec every segment of `collection` is built with.
pub fn segment_spec(collection: &meta::Collection) -> Result<SegmentSpec, String> {
    let spec = collection
        .spec
        .as_ref()
        .ok_or_else(|| format!("collection {} has no spec", collection.collection_id))?;
    let metric = match meta::Metric::try_from(spec.metric) {
        Ok(meta::Metric::Cosine) => Metric::Cosine,
        Ok(meta::Metric::Dot) => Metric::Dot,
        Ok(meta::Metric::L2) => Metric::L2,
        _ => return Err(format!("collection `{}` has no valid metric", spec.name)),
    };
    let id_type = match meta::IdType::try_from(spec.id_type) {
        Ok(meta::IdType::String) => IdType::String,
        _ => IdType::U64,
    };
    let mut segment_spec = SegmentSpec::new(spec.dimension as usize, metric, id_type);
    segment_spec.fields = spec
        .payload_schema
        .iter()
        .map(|field| {
            let kind = match meta::FieldKind::try_from(field.kind) {
                Ok(meta::FieldKind::Keyword) => FieldKind::Keyword,
                Ok(meta::FieldKind::Integer) => FieldKind::Integer,
                Ok(meta::FieldKind::Float) => FieldKind::Float,
                Ok(meta::FieldKind::Bool) => FieldKind::Bool,
                _ => return Err(format!("payload field `{}` has no valid type", field.name)),
            };
            Ok(FieldSpec {
                name: field.name.clone(),
                kind,
            })
        })
        .collect::<Result<_, String>>()?;
    let raw_precision = match spec
        .index
        .as_ref()
        .map(|index| meta::VectorPrecision::try_from(index.raw_precision))
    {
        Some(Ok(meta::VectorPrecision::Bf16)) => RawPrecision::Bf16,
        _ => RawPrecision::F32,
    };
    segment_spec.build = BuildParams {
        raw_precision,
        ..BuildParams::default()
    };
    segment_spec.collection = serde_json::json!({
        "name": spec.name,
        "collection_id": collection.collection_id,
    });
    Ok(segment_spec)
}

/// Returns the engine's id for a wire id (`None` when the id is unset).
pub fn point_id(id: &data::PointId) -> Option<PointId> {
    match &id.kind {
        Some(data::point_id::Kind::Num(number)) => Some(PointId::U64(*number)),
        Some(data::point_id::Kind::Text(text)) => Some(PointId::String(text.clone())),
        None => None,
    }
}

/// Returns the wire id of an engine id.
pub fn wire_point_id(id: &PointId) -> data::PointId {
    data::PointId {
        kind: Some(match id {
            PointId::U64(number) => data::point_id::Kind::Num(*number),
            PointId::String(text) => data::point_id::Kind::Text(text.clone()),
        }),
    }
}

/// Returns the wire form of a shard reference.
pub fn shard_to_proto(shard: &ShardRef) -> Result<meta::ShardRef, String> {
    let collection_id = shard
        .collection_id
        .parse()
        .map_err(|_| format!("collection id `{}` is not a number", shard.collection_id))?;
    Ok(meta::ShardRef {
        collection_id,
        shard: shard.shard,
    })
}

/// Returns the model form of a wire shard reference.
pub fn shard_from_proto(shard: &meta::ShardRef) -> ShardRef {
    ShardRef {
        collection_id: shard.collection_id.to_string(),
        shard: shard.shard,
    }
}

/// Returns the model form of a wire segment.
pub fn segment_from_proto(segment: &meta::Segment) -> SegmentEntry {
    SegmentEntry {
        segment_id: segment.segment_id.clone(),
        key: segment.object_key.clone(),
        rows: segment.rows as u32,
        size_bytes: segment.size_bytes,
        deletes: (!segment.deletes_key.is_empty()).then(|| DeletesEntry {
            key: segment.deletes_key.clone(),
            version: segment.deletes_version,
            deleted_rows: segment.deleted_rows as u32,
        }),
        default_nprobe: (segment.default_nprobe > 0).then_some(segment.default_nprobe),
    }
}

pub fn segment_to_proto(segment: &SegmentEntry) -> meta::Segment {
    meta::Segment {
        segment_id: segment.segment_id.clone(),
        object_key: segment.key.clone(),
        rows: segment.rows as u64,
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
            .map_or(0, |deletes| deletes.deleted_rows as u64),
        default_nprobe: segment.default_nprobe.unwrap_or(0),
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
                rows: entry.rows as u32,
            })
            .collect(),
        last_committed: manifest.last_committed.map(|position| WalPosition {
            epoch: position.epoch,
            sequence: position.seq,
        }),
    }
}

/// Returns the shard of `id` among `shards`: a fixed hash (splitmix64 of u64 ids,
/// FNV-1a of string ids) modulo the shard count, so every gateway routes alike.
pub fn shard_of(id: &PointId, shards: u32) -> u32 {
    let hash = match id {
        PointId::U64(number) => {
            let mut z = number.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        PointId::String(text) => text.bytes().fold(0xCBF2_9CE4_8422_2325u64, |hash, byte| {
            (hash ^ byte as u64).wrapping_mul(0x0100_0000_01B3)
        }),
    };
    (hash % shards.max(1) as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_specs_become_segment_specs() {
        let collection = meta::Collection {
            collection_id: 7,
            spec: Some(meta::CollectionSpec {
                name: "docs".into(),
                dimension: 384,
                metric: meta::Metric::Cosine as i32,
                id_type: meta::IdType::String as i32,
                payload_schema: vec![meta::PayloadField {
                    name: "lang".into(),
                    kind: meta::FieldKind::Keyword as i32,
                }],
                index: Some(meta::IndexParams {
                    raw_precision: meta::VectorPrecision::Bf16 as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            created_at_ms: 0,
        };
        let spec = segment_spec(&collection).unwrap();
        assert_eq!(spec.dim, 384);
        assert_eq!(spec.metric, Metric::Cosine);
        assert_eq!(spec.id_type, IdType::String);
        assert_eq!(spec.fields[0].kind, FieldKind::Keyword);
        assert_eq!(spec.build.raw_precision, RawPrecision::Bf16);
        for id in [PointId::U64(5), PointId::String("a".into())] {
            assert_eq!(point_id(&wire_point_id(&id)), Some(id));
        }
        assert_eq!(point_id(&data::PointId { kind: None }), None);
    }

    #[test]
    fn ids_spread_over_shards_and_stay_put() {
        let mut counts = [0u32; 4];
        for id in 0..4000u64 {
            counts[shard_of(&PointId::U64(id), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&count| (800..1200).contains(&count)),
            "{counts:?}"
        );
        assert_eq!(
            shard_of(&PointId::U64(12345), 4),
            shard_of(&PointId::U64(12345), 4)
        );
        assert_eq!(shard_of(&PointId::String("doc".into()), 1), 0);
        // Pinned values: changing the hash would move every stored point.
        assert_eq!(shard_of(&PointId::U64(1), 1000), 465);
        assert_eq!(shard_of(&PointId::U64(42), 7), 5);
        assert_eq!(shard_of(&PointId::String("doc".into()), 1000), 437);
    }
}
