//! Conversions between the wire messages and the engine's types: a collection's
//! spec as a segment spec, and point ids.

use quiver_index::{BuildParams, FieldKind, FieldSpec, IdType, Metric, PointId, RawPrecision, SegmentSpec};

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
}
