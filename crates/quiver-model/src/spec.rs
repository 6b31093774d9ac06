//! What a collection is: its definition as a client creates it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Similarity measure of a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Cosine similarity; vectors are normalised on the way in, higher is better.
    Cosine,
    /// Inner product, higher is better.
    Dot,
    /// Squared Euclidean distance, lower is better.
    L2,
}

impl Metric {
    /// Returns the lowercase name used in APIs (`cosine`, `dot`, `l2`).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
            Metric::L2 => "l2",
        }
    }

    /// Returns true when a higher score is a better match.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, Metric::L2)
    }
}

/// A metric name that is none of `cosine`, `dot` (`ip`), `l2` (`euclidean`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseMetricError(pub String);

impl fmt::Display for ParseMetricError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "unknown metric {:?}: expected cosine, dot or l2",
            self.0
        )
    }
}

impl std::error::Error for ParseMetricError {}

impl FromStr for Metric {
    type Err = ParseMetricError;

    fn from_str(text: &str) -> Result<Self, ParseMetricError> {
        match text {
            "cosine" => Ok(Metric::Cosine),
            "dot" | "ip" => Ok(Metric::Dot),
            "l2" | "euclidean" => Ok(Metric::L2),
            other => Err(ParseMetricError(other.to_owned())),
        }
    }
}

/// The form of a collection's point ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdType {
    /// Unsigned 64-bit integers.
    U64,
    /// UTF-8 strings of at most 128 bytes.
    String,
}

/// Type of a filterable payload field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// Exact-match strings.
    Keyword,
    /// 64-bit signed integers.
    Integer,
    /// 64-bit floats.
    Float,
    /// Booleans.
    Bool,
}

/// Precision of the raw vectors kept for rescoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VectorPrecision {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
}

/// One filterable field of a collection's payload schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadField {
    /// Field name inside the point's payload object.
    pub name: String,
    /// Field type.
    pub kind: FieldKind,
}

/// Index parameters of a collection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexParams {
    /// Extra bits per dimension for extended RaBitQ codes (0 = 1-bit codes only).
    pub extended_bits: u32,
    /// Precision of the stored raw vectors.
    pub raw_precision: VectorPrecision,
    /// Target size of a merged segment in bytes (0 = the indexer's default).
    pub target_segment_size_bytes: u64,
}

/// What a client asks for when it creates a collection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectionSpec {
    /// Collection name (`[A-Za-z0-9_-]`, 1–255 bytes).
    pub name: String,
    /// Vector dimension.
    pub dimension: u32,
    /// Similarity metric.
    pub metric: Metric,
    /// Point id form.
    pub id_type: IdType,
    /// Shard count, fixed at creation.
    pub shards: u32,
    /// Searchers serving each shard.
    pub replication: u32,
    /// Index parameters.
    pub index: IndexParams,
    /// Filterable payload fields.
    pub payload_schema: Vec<PayloadField>,
}

/// A collection in the catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collection {
    /// Unique for the life of the cluster (a recreated name gets a new id).
    pub collection_id: u64,
    /// The collection's definition.
    pub spec: CollectionSpec,
    /// Creation time (leader clock, ms since the Unix epoch).
    pub created_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_serialize_alike() {
        for metric in [Metric::Cosine, Metric::Dot, Metric::L2] {
            assert_eq!(metric.name().parse::<Metric>(), Ok(metric));
            assert_eq!(
                serde_json::to_string(&metric).unwrap(),
                format!("\"{}\"", metric.name())
            );
        }
        assert_eq!("ip".parse::<Metric>(), Ok(Metric::Dot));
        let error = "hamming".parse::<Metric>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown metric \"hamming\": expected cosine, dot or l2"
        );
        assert_eq!(serde_json::to_string(&IdType::U64).unwrap(), "\"u64\"");
        assert_eq!(
            serde_json::to_string(&VectorPrecision::Bf16).unwrap(),
            "\"bf16\""
        );
        assert_eq!(
            serde_json::to_string(&FieldKind::Keyword).unwrap(),
            "\"keyword\""
        );
    }
}
