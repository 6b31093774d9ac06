//! Hostile and malformed requests over REST and gRPC against one real
//! `quiver standalone` with API keys and small limits: each gets a clear 4xx (or
//! gRPC error) naming what is wrong, and afterwards the server still answers and
//! nothing was written (collections and point counts unchanged).

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use prost::Message;
use quiver_proto::client::quiver_client::QuiverClient;
use quiver_proto::client::{self as api};
use quiver_proto::data;
use quiver_proto::meta as pb;
use serde_json::{Value, json};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

use crate::support::{Standalone, StartOptions, vector};

const ADMIN: &str = "admin-key-hostile-0123";
const WRITER: &str = "writer-key-hostile-0123";
const READER: &str = "reader-key-hostile-0123";
const DIM: usize = 4;
const MAX_REQUEST_BYTES: usize = 256 << 10;

/// The gateway section the server starts with: small limits, so the oversized
/// cases stay small.
const CONFIG: &str = r#"
[gateway]
max_request_bytes = "256KiB"
max_batch_points = 100
max_payload_bytes = "1KiB"
max_k = 1000
max_batch_searches = 8
"#;

enum Body {
    None,
    Json(Value),
    Raw(Vec<u8>),
}

/// One hostile REST request and what it must get back.
struct RestCase {
    name: &'static str,
    method: &'static str,
    path: String,
    body: Body,
    /// API key (default: the admin key, so auth is not what fails).
    key: Option<&'static str>,
    content_type: Option<&'static str>,
    status: u16,
    code: &'static str,
    fragment: &'static str,
}

fn case(
    name: &'static str,
    method: &'static str,
    path: impl Into<String>,
    body: Body,
    status: u16,
    code: &'static str,
    fragment: &'static str,
) -> RestCase {
    RestCase {
        name,
        method,
        path: path.into(),
        body,
        key: Some(ADMIN),
        content_type: Some("application/json"),
        status,
        code,
        fragment,
    }
}

impl RestCase {
    fn key(mut self, key: Option<&'static str>) -> Self {
        self.key = key;
        self
    }

    fn content_type(mut self, content_type: Option<&'static str>) -> Self {
        self.content_type = content_type;
        self
    }
}

fn point(id: u64) -> Value {
    json!({"id": id, "vector": vector(id, DIM), "payload": {"lang": "en", "year": 2000 + id}})
}

fn search(extra: Value) -> Body {
    let mut body = json!({"vector": vector(1, DIM)});
    for (key, value) in extra.as_object().expect("object").clone() {
        body[key] = value;
    }
    Body::Json(body)
}

fn rest_cases() -> Vec<RestCase> {
    let points = "/v1/collections/hostile/points";
    let search_path = "/v1/collections/hostile/search";
    let nested_json_filter = format!(
        r#"{{"vector": [0.1, 0.2, 0.3, 0.4], "filter": {}"lang = \"en\""{}}}"#,
        r#"{"not": "#.repeat(200),
        "}".repeat(200)
    );
    let nested_string_filter = format!("{}lang = \"en\"{}", "(".repeat(100), ")".repeat(100));
    let big_payload = "x".repeat(2048);
    let big_body = format!(
        r#"{{"points": [{{"id": 1, "vector": [0.1, 0.2, 0.3, 0.4], "payload": {{"blob": "{}"}}}}]}}"#,
        "y".repeat(MAX_REQUEST_BYTES + 1024)
    );
    vec![
        // Wrong JSON types, missing and unknown fields.
        case(
            "dimension as a string",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": "four", "metric": "cosine"})),
            400,
            "INVALID_ARGUMENT",
            "`dimension`",
        ),
        case(
            "vector as a string",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1, "vector": "0.1 0.2"}]})),
            400,
            "INVALID_ARGUMENT",
            "points[0].vector",
        ),
        case(
            "points as an object",
            "POST",
            points,
            Body::Json(json!({"points": {"id": 1}})),
            400,
            "INVALID_ARGUMENT",
            "`points`",
        ),
        case(
            "body is an array",
            "POST",
            search_path,
            Body::Json(json!([[0.1, 0.2, 0.3, 0.4], 3])),
            400,
            "INVALID_ARGUMENT",
            "must be a JSON object",
        ),
        case(
            "missing vector",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1}]})),
            400,
            "INVALID_ARGUMENT",
            "missing field `vector`",
        ),
        case(
            "missing metric",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 4})),
            400,
            "INVALID_ARGUMENT",
            "missing field `metric`",
        ),
        case(
            "unknown search field",
            "POST",
            search_path,
            search(json!({"colour": "red"})),
            400,
            "INVALID_ARGUMENT",
            "unknown field `colour`",
        ),
        case(
            "unknown point field",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1, "vector": vector(1, DIM), "weight": 2}]})),
            400,
            "INVALID_ARGUMENT",
            "unknown field `weight`",
        ),
        // Bytes that are not (whole) JSON.
        case(
            "invalid UTF-8 body",
            "POST",
            search_path,
            Body::Raw(b"{\"vector\": [0.1], \"filter\": \"\xff\xfe\"}".to_vec()),
            400,
            "INVALID_ARGUMENT",
            "request body",
        ),
        case(
            "truncated JSON",
            "POST",
            points,
            Body::Raw(br#"{"points": [{"id": 1, "vector": [0.1, 0.2"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "EOF",
        ),
        case(
            "trailing garbage",
            "POST",
            "/v1/collections/hostile/points/delete",
            Body::Raw(br#"{"ids": [1]} and more"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "trailing characters",
        ),
        case(
            "empty body",
            "POST",
            points,
            Body::Raw(Vec::new()),
            400,
            "INVALID_ARGUMENT",
            "empty",
        ),
        // Numbers out of range.
        case(
            "huge k",
            "POST",
            search_path,
            search(json!({"k": 1_000_000})),
            400,
            "INVALID_ARGUMENT",
            "k must be 1..=1000",
        ),
        case(
            "k = 0",
            "POST",
            search_path,
            search(json!({"k": 0})),
            400,
            "INVALID_ARGUMENT",
            "k must be",
        ),
        case(
            "negative k",
            "POST",
            search_path,
            search(json!({"k": -5})),
            400,
            "INVALID_ARGUMENT",
            "`k`",
        ),
        case(
            "fractional k",
            "POST",
            search_path,
            search(json!({"k": 2.5})),
            400,
            "INVALID_ARGUMENT",
            "`k`",
        ),
        case(
            "nprobe = 0",
            "POST",
            search_path,
            search(json!({"nprobe": 0})),
            400,
            "INVALID_ARGUMENT",
            "nprobe",
        ),
        case(
            "huge rescore",
            "POST",
            search_path,
            search(json!({"rescore": 4_000_000_000u64})),
            400,
            "INVALID_ARGUMENT",
            "rescore must be",
        ),
        case(
            "negative id",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": -1, "vector": vector(1, DIM)}]})),
            400,
            "INVALID_ARGUMENT",
            "not an unsigned 64-bit integer",
        ),
        case(
            "id above u64",
            "POST",
            points,
            Body::Raw(
                br#"{"points": [{"id": 18446744073709551616, "vector": [0.1, 0.2, 0.3, 0.4]}]}"#
                    .to_vec(),
            ),
            400,
            "INVALID_ARGUMENT",
            "points[0]",
        ),
        // Sizes.
        case(
            "batch over the limit",
            "POST",
            points,
            Body::Json(json!({"points": (0..101).map(point).collect::<Vec<_>>()})),
            400,
            "INVALID_ARGUMENT",
            "101 points in one request; the limit is 100",
        ),
        case(
            "too many searches",
            "POST",
            "/v1/collections/hostile/search/batch",
            Body::Json(
                json!({"searches": (0..9).map(|_| json!({"vector": vector(1, DIM)})).collect::<Vec<_>>()}),
            ),
            400,
            "INVALID_ARGUMENT",
            "9 searches in one batch",
        ),
        case(
            "payload over the limit",
            "POST",
            points,
            Body::Json(
                json!({"points": [{"id": 1, "vector": vector(1, DIM), "payload": {"blob": big_payload}}]}),
            ),
            400,
            "INVALID_ARGUMENT",
            "payload is",
        ),
        case(
            "body over the limit",
            "POST",
            points,
            Body::Raw(big_body.into_bytes()),
            400,
            "INVALID_ARGUMENT",
            "larger than 262144 bytes",
        ),
        case(
            "payload not an object",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1, "vector": vector(1, DIM), "payload": [1, 2]}]})),
            400,
            "INVALID_ARGUMENT",
            "JSON object",
        ),
        case(
            "payload field of the wrong type",
            "POST",
            points,
            Body::Json(
                json!({"points": [{"id": 1, "vector": vector(1, DIM), "payload": {"year": "old"}}]}),
            ),
            400,
            "INVALID_ARGUMENT",
            "year",
        ),
        // Vectors.
        case(
            "wrong dimension",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1, "vector": [0.1, 0.2, 0.3]}]})),
            400,
            "INVALID_ARGUMENT",
            "dimension",
        ),
        case(
            "wrong search dimension",
            "POST",
            search_path,
            Body::Json(json!({"vector": vector(1, 5)})),
            400,
            "INVALID_ARGUMENT",
            "vector has dimension 5",
        ),
        case(
            "bare NaN",
            "POST",
            points,
            Body::Raw(br#"{"points": [{"id": 1, "vector": [NaN, 0, 0, 1]}]}"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "NaN",
        ),
        case(
            "NaN as a string",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 1, "vector": ["NaN", 0, 0, 1]}]})),
            400,
            "INVALID_ARGUMENT",
            "points[0].vector[0]",
        ),
        case(
            "Infinity as a string",
            "POST",
            search_path,
            Body::Json(json!({"vector": [0, "Infinity", 0, 1]})),
            400,
            "INVALID_ARGUMENT",
            "vector[1]",
        ),
        case(
            "huge exponent",
            "POST",
            points,
            Body::Raw(br#"{"points": [{"id": 1, "vector": [1e999, 0, 0, 1]}]}"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "out of range",
        ),
        case(
            "overflows f32",
            "POST",
            search_path,
            Body::Raw(br#"{"vector": [1e39, 0, 0, 1]}"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "`vector[0]`: 1e39 is outside the range of a 32-bit float",
        ),
        case(
            "overflows f32 on write",
            "POST",
            points,
            Body::Raw(br#"{"points": [{"id": 1, "vector": [0, -3e38, -3e38, 1e39]}]}"#.to_vec()),
            400,
            "INVALID_ARGUMENT",
            "`points[0].vector[3]`: 1e39 is outside the range of a 32-bit float",
        ),
        // Finite values whose scores would overflow f32, for every metric, and
        // a zero query on a cosine collection (refused on write too).
        case(
            "huge finite vector on write, cosine",
            "POST",
            points,
            Body::Json(
                json!({"points": [point(1), {"id": 20, "vector": [1e38, 1e38, 1e38, 1e38]}]}),
            ),
            400,
            "INVALID_ARGUMENT",
            "points[1]: vector for row 1 has squared length 4.000e76",
        ),
        case(
            "one huge value on write, cosine",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": 21, "vector": [3e38, 0, 0, 0]}]})),
            400,
            "INVALID_ARGUMENT",
            "points[0]: vector for row 0 has squared length",
        ),
        case(
            "huge finite vector on write, l2",
            "POST",
            "/v1/collections/named/points",
            Body::Json(json!({"points": [{"id": "big", "vector": [0, 0, 2e19, 2e19]}]})),
            400,
            "INVALID_ARGUMENT",
            "points[0]: vector for row 0 has squared length",
        ),
        case(
            "huge finite vector on write, dot",
            "POST",
            "/v1/collections/dotted/points",
            Body::Json(json!({"points": [{"id": 1, "vector": [3e38, 3e38, 0, 0]}]})),
            400,
            "INVALID_ARGUMENT",
            "points[0]: vector for row 0 has squared length",
        ),
        case(
            "huge finite query, dot",
            "POST",
            "/v1/collections/dotted/search",
            Body::Json(json!({"vector": [3e38, 3e38, 0, 0], "k": 3})),
            400,
            "INVALID_ARGUMENT",
            "query vector has squared length",
        ),
        case(
            "huge finite query, cosine",
            "POST",
            search_path,
            Body::Json(json!({"vector": [1e38, 1e38, 1e38, 1e38]})),
            400,
            "INVALID_ARGUMENT",
            "query vector has squared length",
        ),
        case(
            "huge finite query in a batch, l2",
            "POST",
            "/v1/collections/named/search/batch",
            Body::Json(
                json!({"searches": [{"vector": [1.0, 0, 0, 0]}, {"vector": [0, 0, 0, 3e38]}]}),
            ),
            400,
            "INVALID_ARGUMENT",
            "searches[1]: query vector has squared length",
        ),
        case(
            "zero query, cosine",
            "POST",
            search_path,
            Body::Json(json!({"vector": [0, 0, 0, 0]})),
            400,
            "INVALID_ARGUMENT",
            "query vector is all zeros, which has no cosine similarity",
        ),
        case(
            "empty batch of searches",
            "POST",
            "/v1/collections/hostile/search/batch",
            Body::Json(json!({"searches": []})),
            400,
            "INVALID_ARGUMENT",
            "searches must not be empty",
        ),
        // Ids.
        case(
            "empty string id",
            "POST",
            "/v1/collections/named/points",
            Body::Json(json!({"points": [{"id": "", "vector": vector(1, DIM)}]})),
            400,
            "INVALID_ARGUMENT",
            "0 bytes",
        ),
        case(
            "string id too long",
            "POST",
            "/v1/collections/named/points",
            Body::Json(json!({"points": [{"id": "i".repeat(200), "vector": vector(1, DIM)}]})),
            400,
            "INVALID_ARGUMENT",
            "200 bytes",
        ),
        case(
            "id as a list",
            "POST",
            points,
            Body::Json(json!({"points": [{"id": [1], "vector": vector(1, DIM)}]})),
            400,
            "INVALID_ARGUMENT",
            "id must be a number or a string",
        ),
        case(
            "string id in a u64 collection",
            "POST",
            "/v1/collections/hostile/points/delete",
            Body::Json(json!({"ids": ["one"]})),
            400,
            "INVALID_ARGUMENT",
            "unsigned integers",
        ),
        case(
            "bool id",
            "POST",
            "/v1/collections/hostile/points/get",
            Body::Json(json!({"ids": [true]})),
            400,
            "INVALID_ARGUMENT",
            "ids[0]",
        ),
        // Filters.
        case(
            "deep JSON filter",
            "POST",
            search_path,
            Body::Raw(nested_json_filter.into_bytes()),
            400,
            "INVALID_ARGUMENT",
            "recursion limit",
        ),
        case(
            "deep string filter",
            "POST",
            search_path,
            search(json!({"filter": nested_string_filter})),
            400,
            "INVALID_ARGUMENT",
            "nested deeper than",
        ),
        case(
            "filter ordering booleans on an undeclared field",
            "POST",
            search_path,
            search(json!({"filter": "colour < true"})),
            400,
            "INVALID_ARGUMENT",
            "colour",
        ),
        case(
            "filter value of the wrong type",
            "POST",
            search_path,
            search(json!({"filter": "year = \"old\""})),
            400,
            "INVALID_ARGUMENT",
            "year",
        ),
        case(
            "filter of the wrong JSON type",
            "POST",
            search_path,
            search(json!({"filter": 42})),
            400,
            "INVALID_ARGUMENT",
            "filter",
        ),
        case(
            "invalid consistency",
            "POST",
            search_path,
            search(json!({"consistency": "sometimes"})),
            400,
            "INVALID_ARGUMENT",
            "consistency",
        ),
        case(
            "invalid consistency on get",
            "POST",
            "/v1/collections/hostile/points/get",
            Body::Json(json!({"ids": [1], "consistency": 1})),
            400,
            "INVALID_ARGUMENT",
            "consistency",
        ),
        // Collections and their names.
        // One message for an unknown collection, whichever endpoint.
        case(
            "unknown collection",
            "POST",
            "/v1/collections/nowhere/search",
            search(json!({})),
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "drop an unknown collection",
            "DELETE",
            "/v1/collections/nowhere",
            Body::None,
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "describe an unknown collection",
            "GET",
            "/v1/collections/nowhere",
            Body::None,
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "upsert into an unknown collection",
            "POST",
            "/v1/collections/nowhere/points",
            Body::Json(json!({"points": [point(1)]})),
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "get from an unknown collection",
            "POST",
            "/v1/collections/nowhere/points/get",
            Body::Json(json!({"ids": [1]})),
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "shards of an unknown collection",
            "GET",
            "/admin/v1/collections/nowhere/shards",
            Body::None,
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "compact an unknown collection",
            "POST",
            "/admin/v1/collections/nowhere/compact",
            Body::None,
            404,
            "NOT_FOUND",
            "collection `nowhere` does not exist",
        ),
        case(
            "path traversal in the name",
            "POST",
            "/v1/collections/..%2F..%2Fetc%2Fpasswd/search",
            search(json!({})),
            400,
            "INVALID_ARGUMENT",
            "collection name",
        ),
        case(
            "very long name",
            "PUT",
            format!("/v1/collections/{}", "n".repeat(300)),
            Body::Json(json!({"dimension": 4, "metric": "cosine"})),
            400,
            "INVALID_ARGUMENT",
            "collection name",
        ),
        case(
            "unicode name",
            "PUT",
            "/v1/collections/caf%C3%A9",
            Body::Json(json!({"dimension": 4, "metric": "cosine"})),
            400,
            "INVALID_ARGUMENT",
            "collection name",
        ),
        case(
            "name not UTF-8",
            "GET",
            "/v1/collections/%FF%FE",
            Body::None,
            400,
            "INVALID_ARGUMENT",
            "request path",
        ),
        case(
            "bad metric",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 4, "metric": "hamming"})),
            400,
            "INVALID_ARGUMENT",
            "metric",
        ),
        case(
            "dimension 0",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 0, "metric": "cosine"})),
            400,
            "INVALID_ARGUMENT",
            "dimension must be 1..=65536",
        ),
        case(
            "huge dimension",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 10_000_000, "metric": "l2"})),
            400,
            "INVALID_ARGUMENT",
            "dimension must be 1..=65536",
        ),
        case(
            "zero shards",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 4, "metric": "cosine", "shards": 0})),
            400,
            "INVALID_ARGUMENT",
            "shards",
        ),
        case(
            "bad field type",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(
                json!({"dimension": 4, "metric": "cosine", "payload_schema": [{"name": "x", "type": "date"}]}),
            ),
            400,
            "INVALID_ARGUMENT",
            "payload_schema",
        ),
        case(
            "redefine an existing collection",
            "PUT",
            "/v1/collections/hostile",
            Body::Json(json!({"dimension": 8, "metric": "cosine"})),
            409,
            "ALREADY_EXISTS",
            "hostile",
        ),
        // HTTP itself.
        case(
            "wrong content-type",
            "POST",
            points,
            Body::Json(json!({"points": [point(1)]})),
            415,
            "INVALID_ARGUMENT",
            "content-type",
        )
        .content_type(Some("text/plain")),
        case(
            "XML content-type",
            "PUT",
            "/v1/collections/fresh",
            Body::Raw(b"<collection/>".to_vec()),
            415,
            "INVALID_ARGUMENT",
            "content-type",
        )
        .content_type(Some("application/xml")),
        case(
            "wrong method on a collection",
            "PATCH",
            "/v1/collections/hostile",
            Body::None,
            405,
            "INVALID_ARGUMENT",
            "PATCH",
        ),
        case(
            "GET on a POST route",
            "GET",
            points,
            Body::None,
            405,
            "INVALID_ARGUMENT",
            "method GET",
        ),
        case(
            "unknown endpoint",
            "GET",
            "/v2/everything",
            Body::None,
            404,
            "NOT_FOUND",
            "no such endpoint",
        ),
        // API keys.
        case(
            "no API key",
            "POST",
            search_path,
            search(json!({})),
            401,
            "UNAUTHENTICATED",
            "API key",
        )
        .key(None),
        case(
            "unknown API key",
            "GET",
            "/v1/collections",
            Body::None,
            401,
            "UNAUTHENTICATED",
            "API key",
        )
        .key(Some("not-a-key-at-all")),
        case(
            "read key writes",
            "POST",
            points,
            Body::Json(json!({"points": [point(1)]})),
            403,
            "PERMISSION_DENIED",
            "write access",
        )
        .key(Some(READER)),
        case(
            "read key deletes",
            "POST",
            "/v1/collections/hostile/points/delete",
            Body::Json(json!({"ids": [1]})),
            403,
            "PERMISSION_DENIED",
            "write access",
        )
        .key(Some(READER)),
        case(
            "write key creates",
            "PUT",
            "/v1/collections/fresh",
            Body::Json(json!({"dimension": 4, "metric": "cosine"})),
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(WRITER)),
        case(
            "write key drops",
            "DELETE",
            "/v1/collections/hostile",
            Body::None,
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(WRITER)),
        case(
            "write key reads the cluster",
            "GET",
            "/admin/v1/cluster",
            Body::None,
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(WRITER)),
        case(
            "read key compacts",
            "POST",
            "/admin/v1/collections/hostile/compact",
            Body::None,
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(READER)),
        case(
            "write key drains a node",
            "POST",
            "/admin/v1/nodes/standalone-searcher/drain",
            Body::None,
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(WRITER)),
        case(
            "write key changes meta members",
            "POST",
            "/admin/v1/meta/members",
            Body::Json(json!({"action": "remove", "id": 1})),
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(WRITER)),
        case(
            "read key lists shards",
            "GET",
            "/admin/v1/collections/hostile/shards",
            Body::None,
            403,
            "PERMISSION_DENIED",
            "admin access",
        )
        .key(Some(READER)),
        case(
            "bad meta member action",
            "POST",
            "/admin/v1/meta/members",
            Body::Json(json!({"action": "explode", "id": 1})),
            400,
            "INVALID_ARGUMENT",
            "action",
        ),
    ]
}

/// Sends raw protobuf bytes to a client-API method (what a broken client sends).
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buffer: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        buffer.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buffer: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(buffer.copy_to_bytes(buffer.remaining()).to_vec()))
    }
}

async fn raw_call(
    channel: Channel,
    method: &'static str,
    bytes: Vec<u8>,
) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(bytes);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {ADMIN}").parse().unwrap());
    grpc.unary(
        request,
        tonic::codegen::http::uri::PathAndQuery::from_static(method),
        RawCodec,
    )
    .await
    .map(|_| ())
}

fn keyed<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

fn wire_point(id: data::point_id::Kind, vector: Vec<f32>, payload: &[u8]) -> data::Point {
    data::Point {
        id: Some(data::PointId { kind: Some(id) }),
        vector,
        payload_json: payload.to_vec(),
    }
}

type Call = Pin<Box<dyn Future<Output = Result<(), tonic::Status>> + Send>>;

/// One hostile gRPC call: name, the call, the code and a fragment of the message.
fn grpc_cases(channel: &Channel) -> Vec<(&'static str, Call, Code, &'static str)> {
    let client = || QuiverClient::new(channel.clone()).max_encoding_message_size(64 << 20);
    let search = |request: api::SearchRequest, key: Option<&'static str>| -> Call {
        let mut client = client();
        Box::pin(async move { client.search(keyed(request, key)).await.map(|_| ()) })
    };
    let upsert = |collection: &str, points: Vec<data::Point>, key: Option<&'static str>| -> Call {
        let mut client = client();
        let request = api::UpsertRequest {
            collection: collection.into(),
            points,
        };
        Box::pin(async move { client.upsert(keyed(request, key)).await.map(|_| ()) })
    };
    let search_batch = |collection: &str, searches: Vec<api::SearchRequest>| -> Call {
        let mut client = client();
        let request = api::SearchBatchRequest {
            collection: collection.into(),
            searches,
        };
        Box::pin(async move {
            client
                .search_batch(keyed(request, Some(ADMIN)))
                .await
                .map(|_| ())
        })
    };
    let create = |spec: Option<pb::CollectionSpec>, key: Option<&'static str>| -> Call {
        let mut client = client();
        Box::pin(async move {
            client
                .create_collection(keyed(api::CreateCollectionRequest { spec }, key))
                .await
                .map(|_| ())
        })
    };
    let base_search = || api::SearchRequest {
        collection: "hostile".into(),
        vector: vector(1, DIM),
        k: 3,
        ..api::SearchRequest::default()
    };
    let spec = |name: &str, dimension: u32, metric: i32| pb::CollectionSpec {
        name: name.into(),
        dimension,
        metric,
        ..pb::CollectionSpec::default()
    };
    let number = data::point_id::Kind::Num;
    let admin = Some(ADMIN);
    let mut undecodable = api::UpsertRequest {
        collection: "hostile".into(),
        points: Vec::new(),
    }
    .encode_to_vec();
    // Field 1 (the collection name) claims 2 bytes that are not UTF-8.
    undecodable.extend_from_slice(&[0x0a, 0x02, 0xff, 0xfe]);
    let oversized = wire_point(
        number(1),
        vector(1, DIM),
        &vec![b' '; MAX_REQUEST_BYTES + 1024],
    );
    vec![
        (
            "huge finite search vector",
            search(
                api::SearchRequest {
                    vector: vec![1e38; DIM],
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "query vector has squared length",
        ),
        (
            "zero search vector, cosine",
            search(
                api::SearchRequest {
                    vector: vec![0.0; DIM],
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "query vector is all zeros",
        ),
        (
            "huge finite vector on write",
            upsert(
                "hostile",
                vec![wire_point(number(20), vec![3e38, 0.0, 0.0, 0.0], b"")],
                admin,
            ),
            Code::InvalidArgument,
            "points[0]: vector for row 0 has squared length",
        ),
        (
            "empty batch of searches",
            search_batch("hostile", Vec::new()),
            Code::InvalidArgument,
            "searches must not be empty",
        ),
        (
            "a batch's search naming another collection",
            search_batch(
                "hostile",
                vec![
                    api::SearchRequest {
                        collection: String::new(),
                        ..base_search()
                    },
                    api::SearchRequest {
                        collection: "named".into(),
                        ..base_search()
                    },
                ],
            ),
            Code::InvalidArgument,
            "searches[1]: collection \"named\" differs from the batch's collection \"hostile\"",
        ),
        (
            "describe an unknown collection",
            {
                let mut client = client();
                Box::pin(async move {
                    client
                        .describe_collection(keyed(
                            api::DescribeCollectionRequest {
                                name: "nowhere".into(),
                            },
                            Some(ADMIN),
                        ))
                        .await
                        .map(|_| ())
                })
            },
            Code::NotFound,
            "collection `nowhere` does not exist",
        ),
        (
            "NaN in a search vector",
            search(
                api::SearchRequest {
                    vector: vec![f32::NAN, 0.0, 0.0, 1.0],
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "non-finite",
        ),
        (
            "infinity in a search vector",
            search(
                api::SearchRequest {
                    vector: vec![0.0, f32::INFINITY, 0.0, 1.0],
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "non-finite value at position 1",
        ),
        (
            "wrong search dimension",
            search(
                api::SearchRequest {
                    vector: vec![1.0; 7],
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "dimension 7",
        ),
        (
            "huge k",
            search(
                api::SearchRequest {
                    k: u32::MAX,
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "k must be",
        ),
        (
            "huge rescore",
            search(
                api::SearchRequest {
                    rescore: u32::MAX,
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "rescore",
        ),
        (
            "unknown consistency",
            search(
                api::SearchRequest {
                    consistency: 99,
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "consistency 99",
        ),
        (
            "undeclared filter field ordered against a boolean",
            search(
                api::SearchRequest {
                    filter: "colour >= false".into(),
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "colour",
        ),
        (
            "broken JSON filter",
            search(
                api::SearchRequest {
                    filter: "{\"and\": [".into(),
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "filter",
        ),
        (
            "deep filter",
            search(
                api::SearchRequest {
                    filter: format!("{}year > 1{}", "(".repeat(80), ")".repeat(80)),
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "nested deeper",
        ),
        (
            "unknown collection",
            search(
                api::SearchRequest {
                    collection: "nowhere".into(),
                    ..base_search()
                },
                admin,
            ),
            Code::NotFound,
            "nowhere",
        ),
        (
            "path traversal name",
            search(
                api::SearchRequest {
                    collection: "../etc/passwd".into(),
                    ..base_search()
                },
                admin,
            ),
            Code::InvalidArgument,
            "collection name",
        ),
        (
            "NaN in an upsert",
            upsert(
                "hostile",
                vec![wire_point(number(1), vec![0.0, f32::NAN, 0.0, 0.0], b"")],
                admin,
            ),
            Code::InvalidArgument,
            "points[0]",
        ),
        (
            "point without an id",
            upsert(
                "hostile",
                vec![data::Point {
                    id: None,
                    vector: vector(1, DIM),
                    payload_json: Vec::new(),
                }],
                admin,
            ),
            Code::InvalidArgument,
            "points[0] has no id",
        ),
        (
            "payload that is not JSON",
            upsert(
                "hostile",
                vec![wire_point(number(1), vector(1, DIM), b"\xff{not json")],
                admin,
            ),
            Code::InvalidArgument,
            "payload is not JSON",
        ),
        (
            "empty string id",
            upsert(
                "named",
                vec![wire_point(
                    data::point_id::Kind::Text(String::new()),
                    vector(1, DIM),
                    b"",
                )],
                admin,
            ),
            Code::InvalidArgument,
            "0 bytes",
        ),
        (
            "number id in a string collection",
            upsert(
                "named",
                vec![wire_point(number(5), vector(1, DIM), b"")],
                admin,
            ),
            Code::InvalidArgument,
            "strings",
        ),
        (
            "batch over the limit",
            upsert(
                "hostile",
                (0..101)
                    .map(|id| wire_point(number(id), vector(id, DIM), b""))
                    .collect(),
                admin,
            ),
            Code::InvalidArgument,
            "101 points",
        ),
        (
            "message over the limit",
            upsert("hostile", vec![oversized], admin),
            Code::OutOfRange,
            "too large",
        ),
        (
            "create without a spec",
            create(None, admin),
            Code::InvalidArgument,
            "`spec` is required",
        ),
        (
            "create with dimension 0",
            create(Some(spec("fresh", 0, pb::Metric::Cosine as i32)), admin),
            Code::InvalidArgument,
            "dimension",
        ),
        (
            "create with an unknown metric",
            create(Some(spec("fresh", 4, 99)), admin),
            Code::InvalidArgument,
            "metric",
        ),
        (
            "create with a bad name",
            create(Some(spec("no way", 4, pb::Metric::L2 as i32)), admin),
            Code::InvalidArgument,
            "collection name",
        ),
        (
            "delete an empty id",
            {
                let mut client = client();
                Box::pin(async move {
                    client
                        .delete(keyed(
                            api::DeleteRequest {
                                collection: "hostile".into(),
                                ids: vec![data::PointId { kind: None }],
                            },
                            admin,
                        ))
                        .await
                        .map(|_| ())
                })
            },
            Code::InvalidArgument,
            "ids[0] is empty",
        ),
        (
            "undecodable protobuf",
            Box::pin(raw_call(
                channel.clone(),
                "/quiver.v1.client.Quiver/Upsert",
                undecodable,
            )),
            Code::Internal,
            "decode",
        ),
        (
            "unknown method",
            Box::pin(raw_call(
                channel.clone(),
                "/quiver.v1.client.Quiver/Explode",
                Vec::new(),
            )),
            Code::Unimplemented,
            "",
        ),
        (
            "no API key",
            search(base_search(), None),
            Code::Unauthenticated,
            "API key",
        ),
        (
            "unknown API key",
            search(base_search(), Some("who-is-this")),
            Code::Unauthenticated,
            "API key",
        ),
        (
            "read key writes",
            upsert(
                "hostile",
                vec![wire_point(number(1), vector(1, DIM), b"")],
                Some(READER),
            ),
            Code::PermissionDenied,
            "write access",
        ),
        (
            "write key creates",
            create(
                Some(spec("fresh", 4, pb::Metric::Cosine as i32)),
                Some(WRITER),
            ),
            Code::PermissionDenied,
            "admin access",
        ),
        (
            "write key drops",
            {
                let mut client = client();
                Box::pin(async move {
                    client
                        .drop_collection(keyed(
                            api::DropCollectionRequest {
                                name: "hostile".into(),
                            },
                            Some(WRITER),
                        ))
                        .await
                        .map(|_| ())
                })
            },
            Code::PermissionDenied,
            "admin access",
        ),
    ]
}

async fn state_of(server: &Standalone) -> (BTreeSet<String>, Value, Value) {
    let (status, listed) = server
        .call_with_key("GET", "/v1/collections", None, Some(READER))
        .await;
    assert_eq!(status, 200, "{listed}");
    let names = listed["collections"]
        .as_array()
        .expect("collections")
        .iter()
        .map(|collection| collection["name"].as_str().expect("name").to_string())
        .collect();
    let (_, hostile) = server
        .call_with_key("GET", "/v1/collections/hostile", None, Some(READER))
        .await;
    let (_, named) = server
        .call_with_key("GET", "/v1/collections/named", None, Some(READER))
        .await;
    let (_, dotted) = server
        .call_with_key("GET", "/v1/collections/dotted", None, Some(READER))
        .await;
    (
        names,
        hostile["points"].clone(),
        json!([named["points"].clone(), dotted["points"].clone()]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clear_errors_and_change_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("quiver.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let server = Standalone::start_with(
        &directory.path().join("data"),
        StartOptions {
            envs: vec![
                ("QUIVER_API_KEYS_READ", READER),
                ("QUIVER_API_KEYS_WRITE", WRITER),
                ("QUIVER_API_KEYS_ADMIN", ADMIN),
            ],
            args: vec!["--config".into(), config.display().to_string()],
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();
    for (name, body) in [
        (
            "hostile",
            json!({"dimension": DIM, "metric": "cosine",
            "payload_schema": [{"name": "lang", "type": "keyword"}, {"name": "year", "type": "integer"}]}),
        ),
        (
            "named",
            json!({"dimension": DIM, "metric": "l2", "id_type": "string"}),
        ),
        ("dotted", json!({"dimension": DIM, "metric": "dot"})),
    ] {
        let (status, answer) = server
            .call_with_key(
                "PUT",
                &format!("/v1/collections/{name}"),
                Some(body),
                Some(ADMIN),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, answer) = server
        .call_with_key(
            "POST",
            "/v1/collections/hostile/points",
            Some(json!({"points": (0..20).map(point).collect::<Vec<_>>()})),
            Some(WRITER),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = server
        .call_with_key(
            "POST",
            "/v1/collections/named/points",
            Some(json!({"points": (0..5).map(|id| json!({"id": format!("p{id}"), "vector": vector(id, DIM)})).collect::<Vec<_>>()})),
            Some(WRITER),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let before = state_of(&server).await;
    assert_eq!(
        (before.1.clone(), before.2.clone()),
        (json!(20), json!([5, 0]))
    );

    let cases = rest_cases();
    let rest_count = cases.len();
    for case in cases {
        let mut headers = Vec::new();
        let authorization = case.key.map(|key| format!("Bearer {key}"));
        if let Some(value) = &authorization {
            headers.push(("authorization", value.as_str()));
        }
        if let Some(content_type) = case.content_type {
            headers.push(("content-type", content_type));
        }
        let body = match case.body {
            Body::None => None,
            Body::Json(value) => Some(serde_json::to_vec(&value).unwrap()),
            Body::Raw(bytes) => Some(bytes),
        };
        let (status, answer, response_headers) = server
            .send_raw(case.method, &case.path, body, &headers)
            .await;
        let name = case.name;
        assert_eq!(status, case.status, "{name}: {answer}");
        assert_eq!(answer["error"]["code"], case.code, "{name}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(case.fragment),
            "{name}: {message:?} should mention {:?}",
            case.fragment
        );
        assert!(
            response_headers.contains_key("x-request-id"),
            "{name}: every answer carries a request id"
        );
    }

    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let cases = grpc_cases(&channel);
    let grpc_count = cases.len();
    for (name, call, code, fragment) in cases {
        let status = call.await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(
            status.message().contains(fragment),
            "{name}: {:?} should mention {fragment:?}",
            status.message()
        );
    }
    assert!(
        rest_count + grpc_count >= 60,
        "{rest_count} REST and {grpc_count} gRPC cases"
    );

    // Alive, and nothing of any of it was written.
    let (status, _) = server.call("GET", "/healthz", None).await;
    assert_eq!(status, 200);
    let after = state_of(&server).await;
    assert_eq!(before, after, "hostile requests changed the data");
    let (status, answer) = server
        .call_with_key(
            "POST",
            "/v1/collections/hostile/search",
            Some(json!({"vector": vector(7, DIM), "k": 1})),
            Some(READER),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["hits"][0]["id"], 7, "{answer}");
}
