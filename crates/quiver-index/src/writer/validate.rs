//! The checks a point passes before a writer takes it (also run by the
//! gateway and the indexer before anything is written).

use super::SegmentSpec;
use crate::error::{IndexError, IndexResult};
use crate::fields;
use crate::params::{IdType, MAX_STRING_ID_BYTES, Metric};
use quiver_model::PointId;

/// The largest squared length a stored or query vector may have: with both
/// vectors of a pair at most this long, `‖a − b‖² ≤ (‖a‖ + ‖b‖)² ≤ f32::MAX` and
/// `|a·b| ≤ f32::MAX / 4`, so no l2 distance, inner product or partial sum of
/// either overflows f32 (an overflowed score would be `inf`, or `NaN` after a
/// subtraction, and rank nowhere).
pub const MAX_SQUARED_LENGTH: f32 = f32::MAX / 4.0;

/// Why a vector's values cannot be stored or searched with (dimension aside).
enum VectorProblem {
    NonFinite { position: usize, value: f32 },
    TooLong { squared_length: f64 },
    ZeroForCosine,
}

/// Returns the first problem of `vector`'s values under `metric`, if any;
/// `bounded` also refuses a vector longer than [`MAX_SQUARED_LENGTH`].
fn vector_problem(vector: &[f32], metric: Metric, bounded: bool) -> Option<VectorProblem> {
    if let Some(position) = vector.iter().position(|v| !v.is_finite()) {
        return Some(VectorProblem::NonFinite {
            position,
            value: vector[position],
        });
    }
    // In f64 every finite f32 vector's squared length is finite and exact
    // enough: no overflow at 3e38, no underflow at 1e-45.
    let squared_length = squared_length_f64(vector);
    if bounded && squared_length > f64::from(MAX_SQUARED_LENGTH) {
        return Some(VectorProblem::TooLong { squared_length });
    }
    if metric == Metric::Cosine && squared_length == 0.0 {
        return Some(VectorProblem::ZeroForCosine);
    }
    None
}

/// Returns `‖vector‖²` summed in f64.
fn squared_length_f64(vector: &[f32]) -> f64 {
    vector.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}

/// Writes `vector` scaled to unit length into `out` (replacing its contents),
/// for any finite vector: the length is computed in f64, so neither huge values
/// (whose f32 squares overflow) nor tiny ones (whose squares underflow) lose it.
/// A zero vector stays zero.
pub fn normalize_into(vector: &[f32], out: &mut Vec<f32>) {
    out.clear();
    let length = squared_length_f64(vector).sqrt();
    if length == 0.0 || !length.is_finite() {
        out.extend_from_slice(vector);
        return;
    }
    out.extend(vector.iter().map(|&v| (f64::from(v) / length) as f32));
}

/// Returns `vector` scaled to unit length (see [`normalize_into`]).
pub fn normalized(vector: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(vector.len());
    normalize_into(vector, &mut out);
    out
}

/// Checks a vector: right dimension, finite values, squared length at most
/// [`MAX_SQUARED_LENGTH`] (and non-zero for cosine).
pub fn validate_vector(row: usize, vector: &[f32], dim: usize, metric: Metric) -> IndexResult<()> {
    check_vector(row, vector, dim, metric, true)
}

/// [`validate_vector`], with the length bound only when `bounded`: a writer
/// stores any finite vector it can (rows written before the bound existed must
/// still flush), the API refuses what could overflow a score.
fn check_vector(
    row: usize,
    vector: &[f32],
    dim: usize,
    metric: Metric,
    bounded: bool,
) -> IndexResult<()> {
    if vector.len() != dim {
        return Err(IndexError::DimensionMismatch {
            row,
            expected: dim,
            actual: vector.len(),
        });
    }
    match vector_problem(vector, metric, bounded) {
        None => Ok(()),
        Some(VectorProblem::NonFinite { position, value }) => Err(IndexError::NonFinite {
            row,
            position,
            value,
        }),
        Some(VectorProblem::TooLong { squared_length }) => Err(IndexError::InvalidArgument(
            format!("vector for row {row} {}", too_long(squared_length)),
        )),
        Some(VectorProblem::ZeroForCosine) => Err(IndexError::InvalidArgument(format!(
            "vector for row {row} is all zeros, which has no cosine similarity"
        ))),
    }
}

/// Checks a query vector the way [`validate_vector`] checks a stored one (a
/// query is searched against stored vectors, so the same bounds apply), with
/// messages that say "query vector".
pub fn validate_query(query: &[f32], dim: usize, metric: Metric) -> IndexResult<()> {
    if query.len() != dim {
        return Err(IndexError::InvalidArgument(format!(
            "query vector has dimension {}, expected {dim}",
            query.len()
        )));
    }
    match vector_problem(query, metric, true) {
        None => Ok(()),
        Some(VectorProblem::NonFinite { position, value }) => Err(IndexError::InvalidArgument(
            format!("query vector has a non-finite value at position {position} ({value})"),
        )),
        Some(VectorProblem::TooLong { squared_length }) => Err(IndexError::InvalidArgument(
            format!("query vector {}", too_long(squared_length)),
        )),
        Some(VectorProblem::ZeroForCosine) => Err(IndexError::InvalidArgument(
            "query vector is all zeros, which has no cosine similarity".to_string(),
        )),
    }
}

fn too_long(squared_length: f64) -> String {
    format!(
        "has squared length {squared_length:.3e}, more than the largest allowed \
         {MAX_SQUARED_LENGTH:.3e} (f32::MAX / 4, so that no score overflows)"
    )
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
/// finite values (non-zero for cosine) and a squared length of at most
/// [`MAX_SQUARED_LENGTH`] (which the writer does not check), payload a JSON object
/// whose schema fields have the declared types. `row` only numbers the point in
/// messages.
pub fn validate_point(
    spec: &SegmentSpec,
    row: usize,
    id: &PointId,
    vector: &[f32],
    payload: Option<&serde_json::Value>,
) -> IndexResult<()> {
    check_point(spec, row, id, vector, payload, true)
}

/// [`validate_point`], with the length bound only when `bounded`.
pub(super) fn check_point(
    spec: &SegmentSpec,
    row: usize,
    id: &PointId,
    vector: &[f32],
    payload: Option<&serde_json::Value>,
    bounded: bool,
) -> IndexResult<()> {
    validate_id(spec, row, id)?;
    check_vector(row, vector, spec.dim, spec.metric, bounded)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn length(vector: &[f32]) -> f64 {
        squared_length_f64(vector).sqrt()
    }

    #[test]
    fn huge_and_tiny_vectors_normalise_to_unit_length() {
        for vector in [
            vec![1e38f32, 1e38, 1e38, 1e38],
            vec![3e38, 0.0, 0.0, 0.0],
            vec![f32::MAX, -f32::MAX, f32::MAX, 0.0],
            vec![1e-45, 0.0, 0.0, 0.0],
            vec![1e-45, -1e-45, 0.0, 1e-45],
            vec![1e-20, 3e-20, 0.0, 0.0],
        ] {
            let unit = normalized(&vector);
            assert!(unit.iter().all(|v| v.is_finite()), "{vector:?} -> {unit:?}");
            let unit_length = length(&unit);
            assert!(
                (unit_length - 1.0).abs() < 1e-6,
                "{vector:?} -> {unit:?} has length {unit_length}"
            );
        }
        assert_eq!(normalized(&[3e38, 0.0, 0.0, 0.0]), vec![1.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            normalized(&[1e-45, 0.0, 0.0, 0.0]),
            vec![1.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(normalized(&[0.0; 4]), vec![0.0; 4]);
    }

    #[test]
    fn vectors_whose_scores_could_overflow_are_refused_for_every_metric() {
        let bound_side = (MAX_SQUARED_LENGTH / 4.0).sqrt();
        for metric in [Metric::Cosine, Metric::Dot, Metric::L2] {
            for vector in [vec![1e38f32; 4], vec![3e38, 0.0, 0.0, 0.0], vec![1e19; 4]] {
                let error = validate_vector(3, &vector, 4, metric).unwrap_err();
                let text = error.to_string();
                assert!(
                    text.contains("vector for row 3 has squared length")
                        && text.contains("no score overflows"),
                    "{metric:?} {vector:?}: {text}"
                );
                let error = validate_query(&vector, 4, metric).unwrap_err().to_string();
                assert!(error.contains("query vector has squared length"), "{error}");
            }
            // Right at the bound: accepted, and every score of two such is finite.
            let largest = vec![bound_side * 0.999; 4];
            validate_vector(0, &largest, 4, metric).unwrap();
            let opposite: Vec<f32> = largest.iter().map(|v| -v).collect();
            assert!(quiver_simd::l2sq_f32(&largest, &opposite).is_finite());
            assert!(quiver_simd::dot_f32(&largest, &largest).is_finite());
        }
        // Tiny vectors are fine for every metric.
        validate_vector(0, &[1e-45, 0.0, 0.0, 0.0], 4, Metric::Cosine).unwrap();
    }

    #[test]
    fn a_zero_query_has_no_cosine_similarity() {
        let error = validate_query(&[0.0; 4], 4, Metric::Cosine)
            .unwrap_err()
            .to_string();
        assert!(error.contains("query vector is all zeros"), "{error}");
        validate_query(&[0.0; 4], 4, Metric::Dot).unwrap();
        validate_query(&[0.0; 4], 4, Metric::L2).unwrap();
    }
}
