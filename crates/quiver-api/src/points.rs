//! Points: `POST /v1/collections/{name}/points` (upsert), `…/points/delete` and
//! `…/points/get`.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A point id: an unsigned 64-bit integer or a string (1–128 bytes), as the
/// collection's `id_type` says. On the wire a JSON number or string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum PointId {
    /// A numeric id.
    U64(u64),
    /// A string id.
    String(String),
}

impl PointId {
    /// Returns the numeric id, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            PointId::U64(number) => Some(*number),
            PointId::String(_) => None,
        }
    }

    /// Returns the string id, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PointId::U64(_) => None,
            PointId::String(text) => Some(text),
        }
    }
}

impl From<u64> for PointId {
    fn from(number: u64) -> Self {
        PointId::U64(number)
    }
}

impl From<String> for PointId {
    fn from(text: String) -> Self {
        PointId::String(text)
    }
}

impl From<&str> for PointId {
    fn from(text: &str) -> Self {
        PointId::String(text.to_string())
    }
}

/// Compares with the id's JSON form (`PointId::U64(7) == json!(7)`).
impl PartialEq<Value> for PointId {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (PointId::U64(number), Value::Number(other)) => other.as_u64() == Some(*number),
            (PointId::String(text), Value::String(other)) => text == other,
            _ => false,
        }
    }
}

/// Shows the id as in JSON: `7`, `"doc-7"`.
impl fmt::Display for PointId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointId::U64(number) => write!(formatter, "{number}"),
            PointId::String(text) => write!(formatter, "{}", Value::String(text.clone())),
        }
    }
}

/// Decodes by hand rather than `untagged`, so a wrong id says what is wrong
/// (`id -1 is not an unsigned 64-bit integer`) instead of "did not match any variant".
impl<'de> Deserialize<'de> for PointId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;

        impl<'de> Visitor<'de> for IdVisitor {
            type Value = PointId;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("an id (an unsigned 64-bit integer or a string)")
            }

            fn visit_u64<E: de::Error>(self, number: u64) -> Result<PointId, E> {
                Ok(PointId::U64(number))
            }

            fn visit_i64<E: de::Error>(self, number: i64) -> Result<PointId, E> {
                u64::try_from(number).map(PointId::U64).map_err(|_| {
                    E::custom(format!("id {number} is not an unsigned 64-bit integer"))
                })
            }

            fn visit_f64<E: de::Error>(self, number: f64) -> Result<PointId, E> {
                Err(E::custom(format!(
                    "id {} is not an unsigned 64-bit integer",
                    serde_json::Number::from_f64(number)
                        .map_or_else(|| number.to_string(), |number| number.to_string())
                )))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<PointId, E> {
                Ok(PointId::String(text.to_string()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<PointId, E> {
                Ok(PointId::String(text))
            }

            fn visit_bool<E: de::Error>(self, flag: bool) -> Result<PointId, E> {
                Err(E::custom(format!(
                    "id must be a number or a string, got {flag}"
                )))
            }

            fn visit_unit<E: de::Error>(self) -> Result<PointId, E> {
                Err(E::custom("id must be a number or a string, got null"))
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<PointId, A::Error> {
                Err(de::Error::custom(
                    "id must be a number or a string, got a list",
                ))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<PointId, A::Error> {
                Err(de::Error::custom(
                    "id must be a number or a string, got an object",
                ))
            }
        }

        deserializer.deserialize_any(IdVisitor)
    }
}

/// One point to upsert.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// The point's id (an existing point with it is replaced).
    pub id: PointId,
    /// The vector, of the collection's dimension, finite values: an array of
    /// numbers, or the base64 of its little-endian 32-bit floats.
    #[serde(
        deserialize_with = "vector_values",
        serialize_with = "serialize_vector_base64"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = VectorInput))]
    pub vector: Vec<f32>,
    /// A JSON object; filters can use its top-level fields (those of the payload
    /// schema indexed). `null` is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// One value of a vector in a request: a JSON number that fits an `f32`. A finite
/// number beyond the `f32` range (`1e39`) is refused by name here; read as an `f32`
/// it would become infinite and be refused as "non-finite", which the client never
/// sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct VectorValue(pub(crate) f32);

impl<'de> Deserialize<'de> for VectorValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Number;
        impl Visitor<'_> for Number {
            type Value = VectorValue;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("f32")
            }

            // serde reads an `f32` as an `f64` and narrows it too: the check is
            // all this adds.
            fn visit_f64<E: de::Error>(self, wide: f64) -> Result<VectorValue, E> {
                let narrow = wide as f32;
                if narrow.is_infinite() && wide.is_finite() {
                    return Err(E::custom(format_args!(
                        "{wide:e} is outside the range of a 32-bit float (±3.4e38)"
                    )));
                }
                Ok(VectorValue(narrow))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<VectorValue, E> {
                Ok(VectorValue(value as f32))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<VectorValue, E> {
                Ok(VectorValue(value as f32))
            }
        }
        deserializer.deserialize_f32(Number)
    }
}

/// Reads a vector of [`VectorValue`]s.
pub(crate) fn vector_values<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<f32>, D::Error> {
    read_vector(deserializer, 0)
}

/// Reads a vector: an array of [`VectorValue`]s, into room for the format's
/// size hint or for `room` values when it gives none (JSON does not), capped
/// against hostile hints; or a string holding the standard base64 (RFC 4648,
/// padded) of its values as little-endian 32-bit floats — what `numpy`'s
/// `tobytes()` of a `float32` array gives, and OpenAI's `encoding_format:
/// "base64"` returns. A client writes and the server reads that form in
/// microseconds, where 768 decimal numbers cost a Python client ~0.4 ms to
/// write and the server ~20 µs to parse. Its values are checked as the
/// array's are (finite, by the request's validation).
pub(crate) fn read_vector<'de, D: Deserializer<'de>>(
    deserializer: D,
    room: usize,
) -> Result<Vec<f32>, D::Error> {
    struct Values(usize);
    impl<'de> Visitor<'de> for Values {
        type Value = Vec<f32>;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter
                .write_str("an array of numbers, or a base64 string of little-endian 32-bit floats")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<f32>, E> {
            vector_from_base64(text).map_err(E::custom)
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
            let capacity = seq.size_hint().unwrap_or(self.0).min(MAX_VECTOR_ROOM);
            let mut vector = Vec::with_capacity(capacity);
            while let Some(VectorValue(value)) = seq.next_element()? {
                vector.push(value);
            }
            Ok(vector)
        }
    }
    deserializer.deserialize_any(Values(room))
}

/// The values of a base64 vector (see [`read_vector`]), or what is wrong with it.
pub fn vector_from_base64(text: &str) -> Result<Vec<f32>, String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|error| {
            format!(
                "a string vector must be the standard base64 (RFC 4648, padded) of little-endian 32-bit floats: {error}"
            )
        })?;
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "a base64 vector must hold whole little-endian 32-bit floats (4 bytes each), got {} bytes",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|value| f32::from_le_bytes([value[0], value[1], value[2], value[3]]))
        .collect())
}

/// Writes a request's vector in its base64 form (what the Rust SDK sends: the
/// server reads it without parsing numbers).
pub(crate) fn serialize_vector_base64<S: serde::Serializer>(
    vector: &[f32],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&vector_to_base64(vector))
}

/// The base64 form of `vector` that [`read_vector`] reads.
pub fn vector_to_base64(vector: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = vector
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// How a vector may be written in a request (the OpenAPI schema of `vector`).
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum VectorInput {
    /// The values as JSON numbers.
    Values(Vec<f32>),
    /// The standard base64 (RFC 4648, padded) of the values as little-endian
    /// 32-bit floats (`numpy.float32` array `.tobytes()`).
    #[schema(format = Byte)]
    Base64(String),
}

/// The most values [`read_vector`] makes room for before it reads them.
const MAX_VECTOR_ROOM: usize = 64 * 1024;

/// `POST /v1/collections/{name}/points`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UpsertRequest {
    /// The points (at most the gateway's batch limit).
    pub points: Vec<Point>,
}

/// `POST /v1/collections/{name}/points/get` and `…/points/delete`: the ids, and
/// for a get whether to return vectors and how fresh the read must be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PointIdsRequest {
    /// The ids.
    pub ids: Vec<PointId>,
    /// Returns each point's vector too (get; unit length in a cosine collection).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_vector: bool,
    /// `"strong"` (default) or `"eventual"` (get).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
}

/// The answer to an upsert or a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WriteResponse {
    /// The write's sequence: `(epoch << 40) | seq`, the largest over the shards
    /// written; later writes have larger sequences.
    pub sequence: u64,
}

/// A point read by id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PointRecord {
    /// The id.
    pub id: PointId,
    /// The payload, when the point has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// The vector, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
}

/// The answer to a get: the points found, in the order asked (missing ids are
/// left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GetPointsResponse {
    /// The points found.
    pub points: Vec<PointRecord>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ids_are_numbers_or_strings_and_wrong_ones_say_why() {
        let ids: Vec<PointId> = serde_json::from_value(json!([7, "doc"])).unwrap();
        assert_eq!(ids, [PointId::U64(7), PointId::String("doc".into())]);
        assert_eq!(serde_json::to_value(&ids).unwrap(), json!([7, "doc"]));
        assert_eq!(ids[0], json!(7));
        assert_ne!(ids[1], json!(7));
        for (id, message) in [
            (json!(-1), "id -1 is not an unsigned 64-bit integer"),
            (json!(1.5), "id 1.5 is not an unsigned 64-bit integer"),
            (json!([1]), "id must be a number or a string"),
            (json!(null), "id must be a number or a string"),
        ] {
            let error = serde_json::from_value::<PointId>(id.clone()).unwrap_err();
            assert!(error.to_string().contains(message), "{id}: {error}");
        }
        let huge = serde_json::from_str::<PointId>("18446744073709551616").unwrap_err();
        assert!(huge.to_string().contains("not an unsigned 64-bit integer"));
    }

    #[test]
    fn optional_fields_are_left_out() {
        let record = PointRecord {
            id: PointId::U64(1),
            payload: None,
            vector: None,
        };
        assert_eq!(serde_json::to_value(&record).unwrap(), json!({"id": 1}));
        let get = PointIdsRequest {
            ids: vec![PointId::U64(1)],
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&get).unwrap(), json!({"ids": [1]}));
        let point: Point =
            serde_json::from_value(json!({"id": 1, "vector": [0.5], "payload": null})).unwrap();
        assert_eq!(point.payload, None);
    }

    #[test]
    fn a_vector_value_beyond_the_f32_range_is_refused_as_such() {
        let point: Point =
            serde_json::from_str(r#"{"id": 1, "vector": [3.4e38, -1e-50, 0.5]}"#).unwrap();
        assert_eq!(point.vector, [3.4e38, -0.0, 0.5]);
        for vector in ["[1e39]", "[0.5, -1e39]", "[1.7976931348623157e308]"] {
            let body = format!(r#"{{"id": 1, "vector": {vector}}}"#);
            let error = serde_json::from_str::<Point>(&body)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("is outside the range of a 32-bit float (±3.4e38)"),
                "{vector}: {error}"
            );
            assert!(!error.contains("inf"), "{vector}: {error}");
        }
        let error = serde_json::from_str::<Point>(r#"{"id": 1, "vector": [1e39]}"#).unwrap_err();
        assert!(error.to_string().starts_with("1e39 is outside"), "{error}");
        // Integers are numbers too; anything else is named as before.
        let point: Point = serde_json::from_str(r#"{"id": 1, "vector": [-2, 3]}"#).unwrap();
        assert_eq!(point.vector, [-2.0, 3.0]);
        let error = serde_json::from_str::<Point>(r#"{"id": 1, "vector": ["NaN"]}"#).unwrap_err();
        assert!(error.to_string().contains("expected f32"), "{error}");
    }

    #[test]
    fn a_vector_may_be_the_base64_of_its_little_endian_floats() {
        let values = [0.5f32, -1.25, 3.0e-7, 1234.5];
        // numpy: np.array([0.5, -1.25, 3e-7, 1234.5], dtype="<f4").tobytes(), base64.
        let encoded = vector_to_base64(&values);
        assert_eq!(encoded, "AAAAPwAAoL+wD6E0AFCaRA==");
        let body = format!(r#"{{"id": 1, "vector": "{encoded}"}}"#);
        let point: Point = serde_json::from_str(&body).unwrap();
        assert_eq!(point.vector, values);
        let search: crate::SearchRequest =
            serde_json::from_str(&format!(r#"{{"vector": "{encoded}", "k": 3}}"#)).unwrap();
        assert_eq!(search.vector, values);
        // The Rust SDK writes requests this way, and they read back as sent.
        let written = serde_json::to_value(&point).unwrap();
        assert_eq!(written["vector"], encoded);
        assert_eq!(serde_json::from_value::<Point>(written).unwrap(), point);
        let written = serde_json::to_value(&search).unwrap();
        assert_eq!(written["vector"], encoded);
        // Non-finite bits decode; the request's validation refuses them by place.
        let nan = vector_to_base64(&[f32::NAN]);
        let point: Point =
            serde_json::from_str(&format!(r#"{{"id": 1, "vector": "{nan}"}}"#)).unwrap();
        assert!(point.vector[0].is_nan());
    }

    #[test]
    fn a_string_vector_that_is_not_whole_floats_in_base64_is_refused_saying_why() {
        for (text, expected) in [
            (
                "AAAAPwAA",
                "must hold whole little-endian 32-bit floats (4 bytes each), got 6 bytes",
            ),
            ("", "got 0 bytes"),
            (
                "not base64!",
                "must be the standard base64 (RFC 4648, padded)",
            ),
            ("AAAAPw", "must be the standard base64 (RFC 4648, padded)"),
        ] {
            let body = format!(r#"{{"id": 1, "vector": "{text}"}}"#);
            let error = serde_json::from_str::<Point>(&body)
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        let error = serde_json::from_str::<Point>(r#"{"id": 1, "vector": {"a": 1}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("an array of numbers, or a base64 string"),
            "{error}"
        );
    }
}
