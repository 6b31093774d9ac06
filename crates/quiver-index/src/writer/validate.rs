//! The checks a point passes before a writer takes it (also run by the
//! gateway and the indexer before anything is written).

use super::SegmentSpec;
use crate::error::{IndexError, IndexResult};
use crate::fields;
use crate::params::{IdType, MAX_STRING_ID_BYTES, Metric};
use quiver_model::PointId;

/// Checks a vector: right dimension, finite values (and non-zero for cosine).
pub fn validate_vector(row: usize, vector: &[f32], dim: usize, metric: Metric) -> IndexResult<()> {
    if vector.len() != dim {
        return Err(IndexError::DimensionMismatch {
            row,
            expected: dim,
            actual: vector.len(),
        });
    }
    if let Some(position) = vector.iter().position(|v| !v.is_finite()) {
        return Err(IndexError::NonFinite {
            row,
            position,
            value: vector[position],
        });
    }
    if metric == Metric::Cosine && vector.iter().all(|&v| v == 0.0) {
        return Err(IndexError::InvalidArgument(format!(
            "vector for row {row} is all zeros, which has no cosine similarity"
        )));
    }
    Ok(())
}

/// Checks an id against `spec`: of the collection's type, and a string id
/// 1..=128 bytes long. `row` only numbers the id in messages.
pub fn validate_id(spec: &SegmentSpec, row: usize, id: &PointId) -> IndexResult<()> {
    match (id, spec.id_type) {
        (PointId::U64(_), IdType::U64) => Ok(()),
        (PointId::String(text), IdType::String) => {
            if text.is_empty() || text.len() > MAX_STRING_ID_BYTES {
                return Err(IndexError::InvalidArgument(format!(
                    "string id of row {row} has {} bytes, expected 1..={MAX_STRING_ID_BYTES}",
                    text.len()
                )));
            }
            Ok(())
        }
        (PointId::String(_), IdType::U64) => Err(IndexError::InvalidArgument(format!(
            "id {id} of row {row} is a string, but the collection's ids are unsigned integers"
        ))),
        (PointId::U64(_), IdType::String) => Err(IndexError::InvalidArgument(format!(
            "id {id} of row {row} is a number, but the collection's ids are strings"
        ))),
    }
}

/// Checks one point against `spec` the way [`SegmentWriter::add`] will: id of the
/// collection's type (string ids 1..=128 bytes), vector of the right dimension with
/// finite values (non-zero for cosine), payload a JSON object whose schema fields
/// have the declared types. `row` only numbers the point in messages.
pub fn validate_point(
    spec: &SegmentSpec,
    row: usize,
    id: &PointId,
    vector: &[f32],
    payload: Option<&serde_json::Value>,
) -> IndexResult<()> {
    validate_id(spec, row, id)?;
    validate_vector(row, vector, spec.dim, spec.metric)?;
    if let Some(payload) = payload.filter(|payload| !payload.is_object()) {
        let kind = match payload {
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::Object(_) => "an object",
        };
        return Err(IndexError::InvalidArgument(format!(
            "payload of row {row} must be a JSON object, got {kind}"
        )));
    }
    fields::extract_values(&spec.fields, row, payload)?;
    Ok(())
}
