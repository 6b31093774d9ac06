//! Reading request bodies into the wire types of `quiver-api`, and turning those
//! into the engine's inputs. Every refusal is an INVALID_ARGUMENT naming the
//! field (`points[2].vector[0]: invalid type …`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use quiver_api::{
    BatchSearchRequest, CreateCollectionRequest, PointIdsRequest, SearchRequest, UpsertRequest,
};
use quiver_index::PointId;
use quiver_proto::meta as pb;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::core::{Consistency, Limits, SearchInput, UpsertPoint, check_search_options};
use crate::error::{GatewayError, GatewayResult};

pub(super) type BodyResult = Result<Bytes, BytesRejection>;

/// Returns the body's bytes, or an error saying why it could not be read.
pub(super) fn body_bytes<'a>(body: &'a BodyResult, limits: &Limits) -> GatewayResult<&'a [u8]> {
    match body {
        Ok(body) if body.len() > limits.max_request_bytes => Err(body_too_large(limits)),
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(body_too_large(limits))
        }
        Err(rejection) => Err(GatewayError::invalid(format!(
            "request body unreadable: {}",
            rejection.body_text()
        ))),
    }
}

fn body_too_large(limits: &Limits) -> GatewayError {
    // Not RESOURCE_EXHAUSTED: clients retry that, and this would fail again.
    // The body is refused unread, so whether it also holds more points than a
    // request may is not known: both limits are named, the points' first (the
    // one a client sizes its batches by).
    GatewayError::invalid(format!(
        "request body is larger than {} bytes; send smaller batches: at most {} points or ids per request, fewer when vectors are long",
        limits.max_request_bytes, limits.max_batch_points
    ))
}

/// Decodes a JSON body into `T`, naming the problem and where it is
/// (`points[2].vector[0]: invalid type …`).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> GatewayResult<T> {
    match body.iter().find(|byte| !byte.is_ascii_whitespace()) {
        None => {
            return Err(GatewayError::invalid(
                "the request body is empty; a JSON object is expected",
            ));
        }
        // serde would take a JSON array as the fields in order; refuse it.
        Some(first) if *first != b'{' => {
            return Err(GatewayError::invalid(
                "the request body must be a JSON object ({\"field\": value, …})",
            ));
        }
        Some(_) => {}
    }
    // Fast path: a plain decode. Tracking the path of every value (each float
    // of a vector) costs on every request; it is only needed to say where a
    // bad body is wrong, so a body that fails is decoded again with it. Both
    // decoders accept and refuse the same bodies.
    if let Ok(decoded) = serde_json::from_slice(body) {
        return Ok(decoded);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let decoded = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            let place = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("`{path}`: ")
            };
            let mentions = |word: &[u8]| body.windows(word.len()).any(|window| window == word);
            let hint = if inner.is_syntax() && (mentions(b"NaN") || mentions(b"Infinity")) {
                " (vector values must be finite numbers: JSON has no NaN or Infinity)"
            } else {
                ""
            };
            GatewayError::invalid(format!("request body: {place}{inner}{hint}"))
        })
        .and_then(|decoded| {
            deserializer
                .end()
                .map(|()| decoded)
                .map_err(|error| GatewayError::invalid(format!("request body: {error}")))
        })?;
    Ok(decoded)
}

/// Reads and decodes a JSON body.
pub(super) fn parse<T: DeserializeOwned>(body: &BodyResult, limits: &Limits) -> GatewayResult<T> {
    decode(body_bytes(body, limits)?)
}

/// Returns the engine's id of a wire id.
pub(super) fn engine_id(id: quiver_api::PointId) -> PointId {
    match id {
        quiver_api::PointId::U64(number) => PointId::U64(number),
        quiver_api::PointId::String(text) => PointId::String(text),
    }
}

/// Returns the wire id of an engine id.
pub(super) fn wire_id(id: &PointId) -> quiver_api::PointId {
    match id {
        PointId::U64(number) => quiver_api::PointId::U64(*number),
        PointId::String(text) => quiver_api::PointId::String(text.clone()),
    }
}

fn consistency_of(consistency: Option<&str>) -> GatewayResult<Consistency> {
    consistency.map_or(Ok(Consistency::Strong), Consistency::parse)
}

fn parse_field_kind(name: &str, kind: &Value) -> GatewayResult<i32> {
    Ok(match kind.as_str() {
        Some("keyword") => pb::FieldKind::Keyword,
        Some("integer") => pb::FieldKind::Integer,
        Some("float") => pb::FieldKind::Float,
        Some("bool") => pb::FieldKind::Bool,
        _ => {
            return Err(GatewayError::invalid(format!(
                "payload_schema: field {name:?} has type {kind}; expected \"keyword\", \"integer\", \"float\" or \"bool\""
            )));
        }
    } as i32)
}

fn parse_schema(schema: Option<Value>) -> GatewayResult<Vec<pb::PayloadField>> {
    let field = |name: &str, kind: &Value| -> GatewayResult<pb::PayloadField> {
        Ok(pb::PayloadField {
            name: name.to_string(),
            kind: parse_field_kind(name, kind)?,
        })
    };
    match schema {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map.iter().map(|(name, kind)| field(name, kind)).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
                    GatewayError::invalid(format!(
                        "payload_schema[{index}] needs a \"name\" string, got {item}"
                    ))
                })?;
                if let Some(unknown) = item
                    .as_object()
                    .and_then(|entry| entry.keys().find(|key| *key != "name" && *key != "type"))
                {
                    return Err(GatewayError::invalid(format!(
                        "payload_schema[{index}]: unknown key {unknown:?}; entries are {{\"name\", \"type\"}}"
                    )));
                }
                field(name, item.get("type").unwrap_or(&Value::Null))
            })
            .collect(),
        Some(other) => Err(GatewayError::invalid(format!(
            "payload_schema must be a list of {{name, type}} or an object, got {other}"
        ))),
    }
}

/// Decodes a create body into the collection's spec.
pub fn decode_create(name: String, body: &[u8]) -> GatewayResult<pb::CollectionSpec> {
    let body: CreateCollectionRequest = decode(body)?;
    let metric = match body.metric.as_str() {
        "cosine" => pb::Metric::Cosine,
        "dot" => pb::Metric::Dot,
        "l2" => pb::Metric::L2,
        other => {
            return Err(GatewayError::invalid(format!(
                "metric must be \"cosine\", \"dot\" or \"l2\", got {other:?}"
            )));
        }
    };
    let id_type = match body.id_type.as_deref() {
        None | Some("u64") => pb::IdType::U64,
        Some("string") => pb::IdType::String,
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "id_type must be \"u64\" or \"string\", got {other:?}"
            )));
        }
    };
    let raw_precision = match body
        .index
        .as_ref()
        .and_then(|index| index.raw_precision.as_deref())
    {
        None | Some("f32") => pb::VectorPrecision::F32,
        Some("bf16") => pb::VectorPrecision::Bf16,
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "index.raw_precision must be \"f32\" or \"bf16\", got {other:?}"
            )));
        }
    };
    if body.shards == Some(0) || body.replication == Some(0) {
        return Err(GatewayError::invalid(
            "shards and replication must be at least 1",
        ));
    }
    Ok(pb::CollectionSpec {
        name,
        dimension: body.dimension,
        metric: metric as i32,
        id_type: id_type as i32,
        shards: body.shards.unwrap_or(1),
        replication: body.replication.unwrap_or(1),
        index: Some(pb::IndexParams {
            raw_precision: raw_precision as i32,
            ..Default::default()
        }),
        payload_schema: parse_schema(body.payload_schema)?,
    })
}

/// Decodes an upsert body into its points.
pub fn decode_upsert(body: &[u8]) -> GatewayResult<Vec<UpsertPoint>> {
    let body: UpsertRequest = decode(body)?;
    Ok(body
        .points
        .into_iter()
        .map(|point| UpsertPoint {
            id: engine_id(point.id),
            vector: point.vector,
            payload: point.payload.filter(|payload| !payload.is_null()),
        })
        .collect())
}

/// Decodes a delete or get body: the ids, `include_vector` and the consistency.
pub fn decode_ids(body: &[u8]) -> GatewayResult<(Vec<PointId>, bool, Consistency)> {
    let body: PointIdsRequest = decode(body)?;
    let consistency = consistency_of(body.consistency.as_deref())?;
    let ids = body.ids.into_iter().map(engine_id).collect();
    Ok((ids, body.include_vector, consistency))
}

/// Returns the engine's input of one wire search.
fn search_input(search: SearchRequest) -> GatewayResult<SearchInput> {
    Ok(SearchInput {
        consistency: consistency_of(search.consistency.as_deref())?,
        vector: search.vector,
        k: search.k,
        filter: search.filter,
        nprobe: search.nprobe,
        rescore: search.rescore,
        include_payload: search.include_payload,
        include_vector: search.include_vector,
    })
}

/// Decodes a search body and checks its options.
pub fn decode_search(body: &[u8], limits: &Limits) -> GatewayResult<SearchInput> {
    let input = search_input(decode::<SearchRequest>(body)?)?;
    check_search_options(limits, &input)?;
    Ok(input)
}

/// Decodes a batch search body and checks every search's options.
pub fn decode_batch(body: &[u8], limits: &Limits) -> GatewayResult<Vec<SearchInput>> {
    let body: BatchSearchRequest = decode(body)?;
    if body.searches.len() > limits.max_batch_searches {
        return Err(GatewayError::invalid(format!(
            "{} searches in one batch; the limit is {}",
            body.searches.len(),
            limits.max_batch_searches
        )));
    }
    body.searches
        .into_iter()
        .enumerate()
        .map(|(index, search)| {
            search_input(search)
                .and_then(|input| check_search_options(limits, &input).map(|()| input))
                .map_err(|error| error.with_context(format!("searches[{index}]")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_value_beyond_the_f32_range_is_named_with_its_place() {
        let error = decode_upsert(br#"{"points": [{"id": 1, "vector": [0.5, 1e39]}]}"#)
            .unwrap_err()
            .message;
        assert!(
            error.contains(
                "`points[0].vector[1]`: 1e39 is outside the range of a 32-bit float (±3.4e38)"
            ),
            "{error}"
        );
        let limits = Limits::default();
        let error = decode_search(br#"{"vector": [-2e39, 0.5]}"#, &limits)
            .unwrap_err()
            .message;
        assert!(
            error.contains("`vector[0]`: -2e39 is outside the range of a 32-bit float"),
            "{error}"
        );
        let error = decode_batch(
            br#"{"searches": [{"vector": [1]}, {"vector": [1e300]}]}"#,
            &limits,
        )
        .unwrap_err()
        .message;
        assert!(
            error.contains("`searches[1].vector[0]`: 1e300 is outside the range"),
            "{error}"
        );
    }

    #[test]
    fn a_body_too_large_names_the_points_a_request_may_hold() {
        let limits = Limits::default();
        let error = body_too_large(&limits);
        assert_eq!(error.code, quiver_common::ErrorCode::InvalidArgument);
        assert!(
            error.message.contains("larger than 134217728 bytes"),
            "{}",
            error.message
        );
        assert!(
            error.message.contains("at most 10000 points"),
            "{}",
            error.message
        );
    }
}
