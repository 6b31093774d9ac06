//! Collections: `PUT/GET/DELETE /v1/collections/{name}`, `GET /v1/collections`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `PUT /v1/collections/{name}`: the collection to create.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateCollectionRequest {
    /// Vector dimension, 1..=65536.
    pub dimension: u32,
    /// `"cosine"`, `"dot"` or `"l2"`.
    pub metric: String,
    /// `"u64"` (default) or `"string"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_type: Option<String>,
    /// Number of shards (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Searchers per shard (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<u32>,
    /// Index options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexOptions>,
    /// The filterable payload fields: a list of [`FieldSchema`]
    /// (`[{"name": "lang", "type": "keyword"}]`) or an object from name to type
    /// (`{"lang": "keyword"}`). Kept as JSON so the gateway can name the entry
    /// that is wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_schema: Option<Value>,
}

/// The index options of a create request (`index`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct IndexOptions {
    /// Precision of the stored full vectors used for rescoring: `"f32"` (default)
    /// or `"bf16"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_precision: Option<String>,
}

/// A collection's index settings, as its definition reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionIndex {
    /// `"f32"` or `"bf16"`.
    pub raw_precision: String,
}

/// One declared (indexed) payload field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldSchema {
    /// The payload key.
    pub name: String,
    /// `"keyword"`, `"integer"`, `"float"` or `"bool"`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// A collection's definition (the answer to create, an entry of list).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Collection {
    /// The collection's name.
    pub name: String,
    /// Its id (names can be reused after a drop; ids are not).
    pub collection_id: u64,
    /// Vector dimension.
    pub dimension: u32,
    /// `"cosine"`, `"dot"` or `"l2"`.
    pub metric: String,
    /// `"u64"` or `"string"`.
    pub id_type: String,
    /// Number of shards.
    pub shards: u32,
    /// Searchers per shard.
    pub replication: u32,
    /// Index settings.
    pub index: CollectionIndex,
    /// The declared payload fields, indexed for filters.
    pub payload_schema: Vec<FieldSchema>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// Live statistics of a collection, deletions applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionStats {
    /// Live points.
    pub points: u64,
    /// Segments over all shards.
    pub segments: u64,
    /// Rows written but not yet in a segment.
    pub wal_tail_rows: u64,
    /// Bytes of the segments.
    pub bytes: u64,
}

/// `GET /v1/collections/{name}`: the definition, the statistics at the top level
/// (`points`, `segments`, `wal_tail_rows`, `bytes`) and again under `stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DescribeCollectionResponse {
    /// The definition (its fields sit at the top level of the JSON).
    #[serde(flatten)]
    pub collection: Collection,
    /// Live points.
    pub points: u64,
    /// Segments over all shards.
    pub segments: u64,
    /// Rows written but not yet in a segment.
    pub wal_tail_rows: u64,
    /// Bytes of the segments.
    pub bytes: u64,
    /// The same statistics, grouped.
    pub stats: CollectionStats,
}

impl DescribeCollectionResponse {
    /// Returns the answer for `collection` with `stats`.
    pub fn new(collection: Collection, stats: CollectionStats) -> Self {
        DescribeCollectionResponse {
            collection,
            points: stats.points,
            segments: stats.segments,
            wal_tail_rows: stats.wal_tail_rows,
            bytes: stats.bytes,
            stats,
        }
    }
}

/// `GET /v1/collections`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ListCollectionsResponse {
    /// Every collection.
    pub collections: Vec<Collection>,
}

/// `DELETE /v1/collections/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DropCollectionResponse {
    /// The dropped collection.
    pub name: String,
    /// Always true.
    pub dropped: bool,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn describe_puts_the_definition_and_the_stats_at_the_top_level() {
        let collection = Collection {
            name: "docs".into(),
            collection_id: 7,
            dimension: 4,
            metric: "cosine".into(),
            id_type: "u64".into(),
            shards: 2,
            replication: 1,
            index: CollectionIndex {
                raw_precision: "f32".into(),
            },
            payload_schema: vec![FieldSchema {
                name: "lang".into(),
                kind: "keyword".into(),
            }],
            created_at_ms: 1,
        };
        let stats = CollectionStats {
            points: 10,
            segments: 1,
            wal_tail_rows: 2,
            bytes: 300,
        };
        let answer = DescribeCollectionResponse::new(collection, stats);
        let value = serde_json::to_value(&answer).unwrap();
        assert_eq!(
            value,
            json!({
                "name": "docs", "collection_id": 7, "dimension": 4, "metric": "cosine",
                "id_type": "u64", "shards": 2, "replication": 1,
                "index": {"raw_precision": "f32"},
                "payload_schema": [{"name": "lang", "type": "keyword"}],
                "created_at_ms": 1,
                "points": 10, "segments": 1, "wal_tail_rows": 2, "bytes": 300,
                "stats": {"points": 10, "segments": 1, "wal_tail_rows": 2, "bytes": 300},
            })
        );
        let back: DescribeCollectionResponse = serde_json::from_value(value).unwrap();
        assert_eq!(back, answer);
    }

    #[test]
    fn a_create_request_sends_only_what_is_set_and_refuses_unknown_fields() {
        let request = CreateCollectionRequest {
            dimension: 4,
            metric: "l2".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"dimension": 4, "metric": "l2"})
        );
        let typo = serde_json::from_value::<CreateCollectionRequest>(
            json!({"dimension": 4, "metric": "l2", "shard": 2}),
        );
        assert!(typo.unwrap_err().to_string().contains("shard"));
    }
}
