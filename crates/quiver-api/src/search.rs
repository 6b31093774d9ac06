//! Search: `POST /v1/collections/{name}/search` and `…/search/batch`.
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::points::{PointId, read_vector};

/// The `k` of a search that names none.
pub const DEFAULT_K: usize = 10;

fn default_k() -> usize {
    DEFAULT_K
}

fn default_true() -> bool {
    true
}

/// Room a query vector is read into: the common embedding dimensions (384–1024)
/// fit without growing.
const QUERY_VECTOR_CAPACITY: usize = 1024;

/// Reads a query vector into one allocation. serde's `Vec` starts at the
/// format's size hint, which JSON does not give, and doubles from there: eight
/// reallocations and copies for a 384-d query, a few percent of a served search's
/// CPU outside the engine.
fn query_vector<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f32>, D::Error> {
    read_vector(deserializer, QUERY_VECTOR_CAPACITY)
}

/// One search (the body of `…/search`, an entry of a batch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// The query vector, of the collection's dimension: an array of numbers, or
    /// the base64 of its little-endian 32-bit floats.
    #[serde(
        deserialize_with = "query_vector",
        serialize_with = "crate::points::serialize_vector_base64"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::points::VectorInput))]
    pub vector: Vec<f32>,
    /// How many hits (default 10): always k when the collection holds k points the
    /// filter keeps.
    #[serde(default = "default_k")]
    pub k: usize,
    /// A filter on payload fields (those of the payload schema are indexed; any
    /// other is read from the stored payloads): its string form
    /// (`"lang = \"en\" and year >= 2020"`) or its JSON form
    /// (`{"and": [{"field": "lang", "value": "en"}, …]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    /// IVF lists probed per shard codebook (default: for cosine and l2, the lists within a
    /// distance ratio of the nearest, calibrated when the codebook was trained; for dot, a
    /// calibrated count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nprobe: Option<u32>,
    /// Candidates rescored with full vectors, as a multiple of `k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescore: Option<u32>,
    /// `"strong"` (default) or `"eventual"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    /// Returns each hit's payload (default true).
    #[serde(default = "default_true")]
    pub include_payload: bool,
    /// Returns each hit's vector (default false; unit length in a cosine collection).
    #[serde(default)]
    pub include_vector: bool,
}

impl SearchRequest {
    /// Returns a top-`k` search for `vector` with the server's defaults.
    pub fn new(vector: Vec<f32>, k: usize) -> Self {
        SearchRequest {
            vector,
            k,
            filter: None,
            nprobe: None,
            rescore: None,
            consistency: None,
            include_payload: true,
            include_vector: false,
        }
    }
}

/// `POST /v1/collections/{name}/search/batch`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSearchRequest {
    /// The searches, answered in this order.
    pub searches: Vec<SearchRequest>,
}

/// One hit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchHit {
    /// The point's id.
    pub id: PointId,
    /// Cosine similarity (`cosine`), inner product (`dot`) or squared Euclidean
    /// distance (`l2`).
    pub score: f32,
    /// The payload, when asked for and present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// The vector, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
}

/// What a search cost, summed over shards (`search_ms`: the slowest shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchCost {
    /// Shards that answered.
    pub shards: u64,
    /// Segments searched.
    pub segments: u64,
    /// Rows whose 1-bit codes were scanned.
    pub rows_scanned: u64,
    /// Rows rescored with full vectors.
    pub rows_rescored: u64,
    /// Rows not yet in a segment, scored exactly.
    pub tail_rows_scored: u64,
    /// Cache regions found in the searchers' caches.
    pub cache_regions_hit: u64,
    /// Cache regions fetched from object storage.
    pub cache_regions_missed: u64,
    /// Bytes fetched from object storage.
    pub bytes_fetched: u64,
    /// Reads of raw vectors and payloads (rescoring, returned hits) served
    /// from the searchers' local cache files.
    #[serde(default)]
    pub row_reads_local: u64,
    /// Reads of raw vectors and payloads fetched from object storage.
    #[serde(default)]
    pub row_reads_remote: u64,
    /// Time waited for object storage, milliseconds (the slowest shard).
    #[serde(default)]
    pub store_wait_ms: f64,
    /// Times waited for object storage (a fetch, or a round of fetches made
    /// together; the slowest shard's): each is a round trip to the store.
    #[serde(default)]
    pub store_waits: u64,
    /// Time in the searchers, milliseconds (the slowest shard).
    pub search_ms: f64,
}

/// The answer to a search (with `cost`), or one entry of a batch's `results`
/// (without).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResponse {
    /// The hits, best first.
    pub hits: Vec<SearchHit>,
    /// Time at the gateway, milliseconds.
    pub took_ms: f64,
    /// What the search cost (single searches only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<SearchCost>,
}

/// The answer to a batch search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchSearchResponse {
    /// One answer per search, in order.
    pub results: Vec<SearchResponse>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_query_value_beyond_the_f32_range_is_refused_as_such() {
        let error = serde_json::from_str::<SearchRequest>(r#"{"vector": [0.5, 1e39]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("1e39 is outside the range of a 32-bit float (±3.4e38)"),
            "{error}"
        );
        let search: SearchRequest = serde_json::from_str(r#"{"vector": [-3.4e38]}"#).unwrap();
        assert_eq!(search.vector, [-3.4e38]);
    }

    #[test]
    fn a_search_body_takes_the_defaults_and_refuses_typos() {
        let search: SearchRequest = serde_json::from_value(json!({"vector": [1.0]})).unwrap();
        assert_eq!(search, SearchRequest::new(vec![1.0], DEFAULT_K));
        let typo = serde_json::from_value::<SearchRequest>(json!({"vector": [1.0], "topk": 3}));
        assert!(typo.unwrap_err().to_string().contains("topk"));
    }

    #[test]
    fn a_query_vector_is_read_in_one_allocation_and_bad_ones_are_named() {
        let body = format!(
            "{{\"vector\": [{}], \"k\": 3}}",
            vec!["0.25"; 384].join(", ")
        );
        let search: SearchRequest = serde_json::from_str(&body).unwrap();
        assert_eq!(search.vector, vec![0.25; 384]);
        assert_eq!(search.vector.capacity(), QUERY_VECTOR_CAPACITY);
        let long = format!("{{\"vector\": [{}]}}", vec!["1"; 1500].join(","));
        let search: SearchRequest = serde_json::from_str(&long).unwrap();
        assert_eq!(search.vector.len(), 1500);
        // A string is the base64 form; a number in quotes is not that.
        let error = serde_json::from_str::<SearchRequest>(r#"{"vector": "0.5"}"#).unwrap_err();
        assert!(
            error.to_string().contains("must be the standard base64"),
            "{error}"
        );
        let error = serde_json::from_str::<SearchRequest>(r#"{"vector": 0.5}"#).unwrap_err();
        assert!(error.to_string().contains("an array of numbers"), "{error}");
        let error = serde_json::from_str::<SearchRequest>(r#"{"vector": [0.5, "x"]}"#).unwrap_err();
        assert!(error.to_string().contains("f32"), "{error}");
    }

    #[test]
    fn a_batch_entry_has_no_cost_and_hits_leave_out_what_was_not_asked() {
        let answer = SearchResponse {
            hits: vec![SearchHit {
                id: PointId::U64(3),
                score: 0.5,
                payload: None,
                vector: None,
            }],
            took_ms: 1.5,
            cost: None,
        };
        assert_eq!(
            serde_json::to_value(&answer).unwrap(),
            json!({"hits": [{"id": 3, "score": 0.5}], "took_ms": 1.5})
        );
    }
}
