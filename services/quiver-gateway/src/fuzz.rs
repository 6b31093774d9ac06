//! Bounded fuzzing of everything a client's bytes go through before a request is
//! routed: REST JSON decoding and validation, protobuf decoding of the client API
//! and its conversion and validation. Random bytes, byte-mutated valid requests,
//! valid JSON requests with values replaced by random JSON trees or keys removed,
//! and random JSON trees; the property is always the same: no panic, and either a
//! value or an INVALID_ARGUMENT naming the problem.

use proptest::prelude::*;
use prost::Message;
use quiver_index::{FieldKind, FieldSpec, IdType, Metric, SegmentSpec};
use quiver_proto::ErrorCode;
use quiver_proto::client as api;
use quiver_proto::data;
use serde_json::{Value, json};

use crate::core::{Limits, prepare_search, prepare_upsert};
use crate::error::GatewayError;
use crate::grpc::{ids_of, search_input, upsert_points};
use crate::rest::{decode_batch, decode_create, decode_ids, decode_search, decode_upsert};

const DIM: usize = 4;

fn specs() -> [SegmentSpec; 2] {
    let mut numbered = SegmentSpec::new(DIM, Metric::Cosine, IdType::U64);
    numbered.fields = vec![
        FieldSpec {
            name: "lang".into(),
            kind: FieldKind::Keyword,
        },
        FieldSpec {
            name: "year".into(),
            kind: FieldKind::Integer,
        },
    ];
    let mut named = SegmentSpec::new(DIM, Metric::L2, IdType::String);
    named.fields = vec![FieldSpec {
        name: "score".into(),
        kind: FieldKind::Float,
    }];
    [numbered, named]
}

fn limits() -> Limits {
    Limits {
        max_batch_points: 64,
        max_payload_bytes: 512,
        max_k: 100,
        max_batch_searches: 8,
        ..Limits::default()
    }
}

/// A refusal must be an INVALID_ARGUMENT with a message.
fn assert_clear(error: &GatewayError) {
    assert_eq!(error.code, ErrorCode::InvalidArgument, "{error:?}");
    assert!(!error.message.trim().is_empty(), "{error:?}");
}

fn settle<T>(outcome: Result<T, GatewayError>) -> Option<T> {
    match outcome {
        Ok(value) => Some(value),
        Err(error) => {
            assert_clear(&error);
            None
        }
    }
}

/// Runs a REST body through every decoder and, when it decodes, the validation
/// against both collection shapes.
fn check_rest_body(body: &[u8]) {
    let limits = limits();
    if let Some(points) = settle(decode_upsert(body)) {
        for spec in specs() {
            settle(prepare_upsert(&spec, &limits, points.clone()));
        }
    }
    if let Some(input) = settle(decode_search(body, &limits)) {
        for spec in specs() {
            settle(prepare_search(&spec, "fuzzed", &input));
        }
    }
    if let Some(inputs) = settle(decode_batch(body, &limits)) {
        assert!(inputs.len() <= limits.max_batch_searches);
        for input in &inputs {
            settle(prepare_search(&specs()[0], "fuzzed", input));
        }
    }
    settle(decode_ids(body));
    settle(decode_create("fuzzed".into(), body));
}

/// Runs protobuf bytes through every client-API message decoder and, when one
/// decodes, the conversion and validation.
fn check_protobuf(bytes: &[u8]) {
    let limits = limits();
    if let Ok(request) = api::UpsertRequest::decode(bytes)
        && let Some(points) = settle(upsert_points(request.points))
    {
        for spec in specs() {
            settle(prepare_upsert(&spec, &limits, points.clone()));
        }
    }
    if let Ok(request) = api::SearchRequest::decode(bytes)
        && let Some(input) = settle(search_input(request, &limits))
    {
        for spec in specs() {
            settle(prepare_search(&spec, "fuzzed", &input));
        }
    }
    if let Ok(request) = api::SearchBatchRequest::decode(bytes) {
        for search in request.searches {
            settle(search_input(search, &limits));
        }
    }
    if let Ok(request) = api::DeleteRequest::decode(bytes) {
        settle(ids_of(&request.ids));
    }
    if let Ok(request) = api::GetPointsRequest::decode(bytes) {
        settle(ids_of(&request.ids));
    }
    let _ = api::CreateCollectionRequest::decode(bytes);
}

fn valid_rest_bodies() -> Vec<Vec<u8>> {
    [
        json!({"points": [
            {"id": 1, "vector": [0.1, 0.2, 0.3, 0.4], "payload": {"lang": "en", "year": 2020}},
            {"id": "a", "vector": [1, 0, 0, 0], "payload": {"score": 0.5}}
        ]}),
        json!({"vector": [0.1, 0.2, 0.3, 0.4], "k": 5, "filter": "lang = \"en\" and year >= 2000",
               "nprobe": 8, "rescore": 2, "consistency": "eventual", "include_vector": true}),
        json!({"vector": [1, 2, 3, 4], "filter": {"and": [{"field": "year", "op": ">=", "value": 1}]}}),
        json!({"searches": [{"vector": [1, 2, 3, 4], "k": 3}, {"vector": [0, 0, 1, 0]}]}),
        json!({"ids": [1, 2, "x"], "include_vector": true, "consistency": "strong"}),
        json!({"dimension": 4, "metric": "cosine", "id_type": "string", "shards": 2,
               "payload_schema": [{"name": "lang", "type": "keyword"}], "index": {"raw_precision": "bf16"}}),
    ]
    .iter()
    .map(|body| serde_json::to_vec(body).expect("json"))
    .collect()
}

fn valid_protobufs() -> Vec<Vec<u8>> {
    let point = |id: data::point_id::Kind, vector: Vec<f32>, payload: &str| data::Point {
        id: Some(data::PointId { kind: Some(id) }),
        vector,
        payload_json: payload.as_bytes().to_vec(),
    };
    let search = api::SearchRequest {
        collection: "docs".into(),
        vector: vec![0.1, 0.2, 0.3, 0.4],
        k: 5,
        filter: "lang = \"en\"".into(),
        nprobe: 4,
        rescore: 2,
        consistency: api::Consistency::Eventual as i32,
        include_payload: true,
        include_vector: false,
    };
    vec![
        api::UpsertRequest {
            collection: "docs".into(),
            points: vec![
                point(
                    data::point_id::Kind::Num(7),
                    vec![1.0, 0.0, 0.0, 0.0],
                    r#"{"lang":"en","year":2001}"#,
                ),
                point(
                    data::point_id::Kind::Text("seven".into()),
                    vec![0.0, 1.0, 0.0, 0.0],
                    r#"{"score":1.5}"#,
                ),
            ],
        }
        .encode_to_vec(),
        search.encode_to_vec(),
        api::SearchBatchRequest {
            collection: "docs".into(),
            searches: vec![search.clone(), search],
        }
        .encode_to_vec(),
        api::DeleteRequest {
            collection: "docs".into(),
            ids: vec![data::PointId {
                kind: Some(data::point_id::Kind::Num(3)),
            }],
        }
        .encode_to_vec(),
    ]
}

/// One edit of a byte string: flip, truncate, insert a token, or delete a span.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bits: u8 },
    Truncate { at: usize },
    Insert { at: usize, token: &'static str },
    Remove { at: usize, len: usize },
}

const TOKENS: &[&str] = &[
    "NaN",
    "-Infinity",
    "1e999",
    "-1",
    "1e39",
    "18446744073709551616",
    "0",
    "null",
    "true",
    "\"\"",
    "\"x\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "\"k\":",
    "\"filter\":",
    "[[[[[[[[",
    "\u{ff}",
    "\"\u{0}\"",
    "\\u0000",
    "\"vector\":[]",
    "\"id\":{}",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), prop::sample::select(TOKENS))
            .prop_map(|(at, token)| Mutation::Insert { at, token }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Mutation::Remove { at, len }),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len().max(1);
        match mutation {
            Mutation::Flip { at, bits } => {
                if !bytes.is_empty() {
                    bytes[at % len] ^= bits;
                }
            }
            Mutation::Truncate { at } => bytes.truncate(at % len),
            Mutation::Insert { at, token } => {
                let at = at % (bytes.len() + 1);
                bytes.splice(at..at, token.bytes());
            }
            Mutation::Remove { at, len: count } => {
                let at = at % len;
                let end = (at + count).min(bytes.len());
                if at < end {
                    bytes.drain(at..end);
                }
            }
        }
    }
    bytes
}

/// Random JSON trees whose keys are mostly the API's own, so decoding gets deep.
fn json_tree() -> impl Strategy<Value = Value> {
    let keys = prop::sample::select(vec![
        "points",
        "id",
        "vector",
        "payload",
        "k",
        "filter",
        "nprobe",
        "rescore",
        "consistency",
        "include_payload",
        "include_vector",
        "searches",
        "ids",
        "dimension",
        "metric",
        "id_type",
        "shards",
        "replication",
        "index",
        "raw_precision",
        "payload_schema",
        "name",
        "type",
        "and",
        "or",
        "not",
        "field",
        "op",
        "value",
        "lang",
        "year",
        "score",
        "colour",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|number| json!(number)),
        (-2.0f32..2.0).prop_map(|number| json!(number)),
        prop::sample::select(vec![
            "cosine",
            "l2",
            "hamming",
            "strong",
            "eventual",
            "maybe",
            "keyword",
            "integer",
            "lang = \"en\"",
            "year >",
            "",
            "bf16",
            "((((",
            "en",
        ])
        .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..6).prop_map(|map| Value::Object(
                map.into_iter().map(|(k, v)| (k.into(), v)).collect()
            )),
        ]
    })
}

/// Every JSON pointer into `value` (the root included).
fn pointers(value: &Value, prefix: String, into: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                pointers(child, format!("{prefix}/{key}"), into);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                pointers(child, format!("{prefix}/{index}"), into);
            }
        }
        _ => {}
    }
    into.push(prefix);
}

/// One edit of a valid JSON request: a value replaced, or a key removed.
#[derive(Clone, Debug)]
enum JsonEdit {
    Replace { at: usize, with: Value },
    Remove { at: usize },
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    prop_oneof![
        3 => (any::<usize>(), json_tree()).prop_map(|(at, with)| JsonEdit::Replace { at, with }),
        1 => any::<usize>().prop_map(|at| JsonEdit::Remove { at }),
    ]
}

fn edit_json(mut value: Value, edits: &[JsonEdit]) -> Value {
    for edit in edits {
        let mut all = Vec::new();
        pointers(&value, String::new(), &mut all);
        match edit {
            JsonEdit::Replace { at, with } => {
                let pointer = &all[at % all.len()];
                if let Some(target) = value.pointer_mut(pointer) {
                    *target = with.clone();
                }
            }
            JsonEdit::Remove { at } => {
                let pointer = all[at % all.len()].clone();
                let Some((parent, key)) = pointer.rsplit_once('/') else {
                    continue;
                };
                match value.pointer_mut(parent) {
                    Some(Value::Object(map)) => {
                        map.remove(key);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(index) = key.parse::<usize>()
                            && index < items.len()
                        {
                            items.remove(index);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    value
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic_rest(body in prop::collection::vec(any::<u8>(), 0..256)) {
        check_rest_body(&body);
    }

    #[test]
    fn mutated_rest_bodies_never_panic(
        which in 0usize..6,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let body = mutate(valid_rest_bodies()[which].clone(), &mutations);
        check_rest_body(&body);
    }

    #[test]
    fn random_json_trees_never_panic(tree in json_tree()) {
        check_rest_body(&serde_json::to_vec(&tree).expect("json"));
    }

    #[test]
    fn edited_rest_requests_never_panic(
        which in 0usize..6,
        edits in prop::collection::vec(json_edit(), 1..4),
    ) {
        let valid: Value = serde_json::from_slice(&valid_rest_bodies()[which]).expect("json");
        check_rest_body(&serde_json::to_vec(&edit_json(valid, &edits)).expect("json"));
    }

    #[test]
    fn random_bytes_never_panic_protobuf(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_protobuf(&bytes);
    }

    #[test]
    fn mutated_protobufs_never_panic(
        which in 0usize..4,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        check_protobuf(&mutate(valid_protobufs()[which].clone(), &mutations));
    }

    #[test]
    fn protobuf_floats_are_checked(
        values in prop::collection::vec(
            prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY), any::<f32>()],
            0..8,
        ),
        k in prop_oneof![0u32..=120, any::<u32>()],
        rescore in prop_oneof![0u32..=1200, any::<u32>()],
        consistency in -1i32..4,
    ) {
        let request = api::SearchRequest {
            collection: "docs".into(),
            vector: values.clone(),
            k,
            rescore,
            consistency,
            ..api::SearchRequest::default()
        };
        let limits = limits();
        if let Some(input) = settle(search_input(request, &limits)) {
            let accepted = prepare_search(&specs()[0], "docs", &input);
            // A query is scored only when every score stays finite: the right
            // dimension, finite values, a squared length (summed in f64) within
            // MAX_SQUARED_LENGTH, and not zero (the collection is cosine).
            let squared: f64 = values.iter().map(|&value| f64::from(value).powi(2)).sum();
            let scorable = values.len() == DIM
                && values.iter().all(|value| value.is_finite())
                && squared <= f64::from(quiver_index::MAX_SQUARED_LENGTH)
                && squared > 0.0;
            prop_assert_eq!(accepted.is_ok(), scorable, "{:?}", accepted);
        }
    }
}

#[test]
fn the_valid_seeds_are_accepted() {
    // The mutations start from requests that pass, so they probe near the edge.
    let limits = limits();
    let bodies = valid_rest_bodies();
    assert_eq!(decode_upsert(&bodies[0]).expect("upsert").len(), 2);
    let search = decode_search(&bodies[1], &limits).expect("search");
    prepare_search(&specs()[0], "docs", &search).expect("valid search");
    let search = decode_search(&bodies[2], &limits).expect("json filter");
    prepare_search(&specs()[0], "docs", &search).expect("valid json filter");
    assert_eq!(decode_batch(&bodies[3], &limits).expect("batch").len(), 2);
    assert_eq!(decode_ids(&bodies[4]).expect("ids").0.len(), 3);
    decode_create("docs".into(), &bodies[5]).expect("create");
    let protobufs = valid_protobufs();
    let upsert = api::UpsertRequest::decode(protobufs[0].as_slice()).expect("decode");
    let points = upsert_points(upsert.points).expect("points");
    prepare_upsert(&specs()[0], &limits, points[..1].to_vec()).expect("valid point");
    let search = api::SearchRequest::decode(protobufs[1].as_slice()).expect("decode");
    prepare_search(
        &specs()[0],
        "docs",
        &search_input(search, &limits).expect("input"),
    )
    .expect("valid search");
}
