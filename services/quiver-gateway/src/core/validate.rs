//! Validation that needs no network: names, search options, points and filters
//! against a collection's spec. Nothing of a bad request is written.

use quiver_index::{Filter, PointId, SegmentSpec, validate_point, validate_query};
use quiver_proto::convert::wire_point_id;
use quiver_proto::data::{self, write_record};
use serde_json::Value;

use crate::core::{Limits, SearchInput, UpsertPoint};
use crate::error::{GatewayError, GatewayResult};

/// Checks a collection name: 1–255 bytes of `[A-Za-z0-9_-]`.
pub fn validate_name(name: &str) -> GatewayResult<()> {
    if name.is_empty()
        || name.len() > 255
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    {
        return Err(GatewayError::invalid(format!(
            "collection name {name:?} must be 1-255 characters of A-Z, a-z, 0-9, _ and -"
        )));
    }
    Ok(())
}

/// Checks the options of a search that need no collection: `k`, `nprobe`, `rescore`.
pub fn check_search_options(limits: &Limits, input: &SearchInput) -> GatewayResult<()> {
    if input.k == 0 || input.k > limits.max_k {
        return Err(GatewayError::invalid(format!(
            "k must be 1..={}, got {}",
            limits.max_k, input.k
        )));
    }
    if input.nprobe == Some(0) {
        return Err(GatewayError::invalid("nprobe must be at least 1, got 0"));
    }
    if let Some(rescore) = input.rescore
        && (rescore == 0 || rescore > limits.max_rescore)
    {
        return Err(GatewayError::invalid(format!(
            "rescore must be 1..={}, got {rescore}",
            limits.max_rescore
        )));
    }
    Ok(())
}

/// Checks a search against the collection (dimension, finite values, squared
/// length, non-zero for cosine, a filter
/// whose declared fields are compared with values of their types); returns the
/// filter as the searchers read it ([`Filter::to_wire`]).
pub fn prepare_search(
    spec: &SegmentSpec,
    name: &str,
    input: &SearchInput,
) -> GatewayResult<String> {
    if input.vector.len() != spec.dim {
        return Err(GatewayError::invalid(format!(
            "vector has dimension {}, collection `{name}` has dimension {}",
            input.vector.len(),
            spec.dim
        )));
    }
    // The same bounds as a stored vector (finite, not too long to score, not
    // zero for cosine): one check, shared with the searchers and segments.
    validate_query(&input.vector, spec.dim, spec.metric)
        .map_err(|error| GatewayError::invalid(error.message()))?;
    match &input.filter {
        None | Some(Value::Null) => Ok(String::new()),
        Some(value) => {
            let filter = Filter::from_json(value).map_err(|error| filter_error(&error))?;
            filter
                .check(&spec.fields)
                .map_err(|error| filter_error(&error))?;
            Ok(filter.to_wire())
        }
    }
}

/// Checks every point against the collection and the payload limit; returns the
/// write records. Nothing is written when any point is wrong.
pub fn prepare_upsert(
    spec: &SegmentSpec,
    limits: &Limits,
    points: Vec<UpsertPoint>,
) -> GatewayResult<Vec<(PointId, data::WriteRecord)>> {
    let mut records = Vec::with_capacity(points.len());
    for (index, point) in points.into_iter().enumerate() {
        validate_point(
            spec,
            index,
            &point.id,
            &point.vector,
            point.payload.as_ref(),
        )
        .map_err(|error| GatewayError::invalid(format!("points[{index}]: {}", error.message())))?;
        let payload_json = match &point.payload {
            Some(payload) => serde_json::to_vec(payload).unwrap_or_default(),
            None => Vec::new(),
        };
        if payload_json.len() > limits.max_payload_bytes {
            return Err(GatewayError::invalid(format!(
                "points[{index}]: payload is {} bytes; the limit is {}",
                payload_json.len(),
                limits.max_payload_bytes
            )));
        }
        records.push((
            point.id.clone(),
            data::WriteRecord {
                op: Some(write_record::Op::Upsert(data::Point {
                    id: Some(wire_point_id(&point.id)),
                    vector: point.vector,
                    payload_json,
                })),
            },
        ));
    }
    Ok(records)
}

/// Takes a hit's stored payload text as it is (nothing for an empty one). The
/// text is what serde_json wrote at upsert ([`prepare_upsert`]); a debug build
/// checks that it still is JSON.
pub(crate) fn stored_payload(bytes: Vec<u8>) -> Option<Vec<u8>> {
    if bytes.is_empty() {
        return None;
    }
    debug_assert!(
        serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok(),
        "a stored payload is JSON text"
    );
    Some(bytes)
}

pub(crate) fn parse_payload(bytes: &[u8]) -> Option<Value> {
    if bytes.is_empty() {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

pub(crate) fn check_id(spec: &SegmentSpec, id: &PointId) -> Result<(), String> {
    match (id, spec.id_type) {
        (PointId::U64(_), quiver_index::IdType::U64) => Ok(()),
        (PointId::String(text), quiver_index::IdType::String) => {
            if text.is_empty() || text.len() > quiver_index::MAX_STRING_ID_BYTES {
                Err(format!(
                    "string id has {} bytes, expected 1..={}",
                    text.len(),
                    quiver_index::MAX_STRING_ID_BYTES
                ))
            } else {
                Ok(())
            }
        }
        (PointId::U64(_), quiver_index::IdType::String) => {
            Err("id is a number, but the collection's ids are strings".into())
        }
        (PointId::String(_), quiver_index::IdType::U64) => {
            Err("id is a string, but the collection's ids are unsigned integers".into())
        }
    }
}

/// Returns a refused filter's error; the message says "filter" once.
fn filter_error(error: &quiver_index::IndexError) -> GatewayError {
    let text = error.message();
    if text.starts_with("filter") {
        GatewayError::invalid(text)
    } else {
        GatewayError::invalid(format!("filter: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use quiver_index::{FieldKind, FieldSpec, IdType, Metric};
    use serde_json::json;

    use super::*;
    use crate::core::Consistency;

    fn spec() -> SegmentSpec {
        let mut spec = SegmentSpec::new(2, Metric::L2, IdType::U64);
        spec.fields = vec![FieldSpec {
            name: "lang".into(),
            kind: FieldKind::Keyword,
        }];
        spec
    }

    fn search(filter: Value) -> SearchInput {
        SearchInput {
            vector: vec![0.5, 0.5],
            k: 10,
            filter: Some(filter),
            nprobe: None,
            rescore: None,
            consistency: Consistency::Strong,
            include_payload: false,
            include_vector: false,
        }
    }

    #[test]
    fn a_json_filter_reaches_the_searchers_as_the_same_filter() {
        for filter in [
            json!({"field": "lang", "in": []}),
            json!({"field": "lang", "not_in": []}),
            json!("lang in []"),
            json!({"or": []}),
            json!({"field": "my-field", "in": ["a"]}),
            json!({"and": [{"field": "not", "value": 1}, {"field": "lang", "value": "a\nb"}]}),
        ] {
            let wire = prepare_search(&spec(), "docs", &search(filter.clone())).unwrap();
            // What the searchers read (`quiver-searcher` `search_of`).
            assert_eq!(
                Filter::from_wire(&wire).unwrap(),
                Filter::from_json(&filter).unwrap(),
                "{filter} as {wire}"
            );
        }
    }

    #[test]
    fn a_refused_filter_says_invalid_argument_only_in_its_code() {
        for filter in [
            json!({"field": "lang", "value": 1}),
            json!({"field": "lang", "op": "~", "value": "en"}),
            json!("lang = en"),
        ] {
            let error = prepare_search(&spec(), "docs", &search(filter.clone())).unwrap_err();
            assert_eq!(error.code, quiver_common::ErrorCode::InvalidArgument);
            assert!(error.message.starts_with("filter"), "{filter}: {error:?}");
            assert!(
                !error.message.contains("invalid argument"),
                "{filter}: {error:?}"
            );
        }
    }
}
