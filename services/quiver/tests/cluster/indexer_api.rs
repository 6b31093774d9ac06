//! The indexer's gRPC write API over a real socket, against a real metadata
//! service and the S3 server: every bad write is refused with the right code and
//! a message naming the field and the value or limit, and leaves the bucket and
//! every shard's manifest exactly as they were; a good write afterwards still
//! succeeds and reads back from the bucket. (A lease taken over *while* a write
//! is in flight is fenced by meta: `takeover.rs` covers it at the writer level,
//! the reliability suite with real processes.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use quiver_index::PointId;
use quiver_indexer::{IndexerConfig, IndexerNode, IndexerNodeConfig, ShardRef};
use quiver_meta::{MetaConfig, MetaServer};
use quiver_meta_client::MetaClient;
use quiver_proto::convert::shard_of;
use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::{self, point_id, write_record};
use quiver_proto::meta as pb;
use quiver_storage::{Storage, WalBatch, WalRecord, keys};
use tonic::Code;
use tonic::transport::Channel;

use crate::in_process::s3_storage;

const DIM: usize = 4;
const MAX_PAYLOAD_BYTES: usize = 1024;

fn num(id: u64) -> data::PointId {
    data::PointId {
        kind: Some(point_id::Kind::Num(id)),
    }
}

fn text(id: &str) -> data::PointId {
    data::PointId {
        kind: Some(point_id::Kind::Text(id.into())),
    }
}

fn upsert(id: data::PointId, vector: Vec<f32>, payload: &[u8]) -> data::WriteRecord {
    data::WriteRecord {
        op: Some(write_record::Op::Upsert(data::Point {
            id: Some(id),
            vector,
            payload_json: payload.to_vec(),
        })),
    }
}

fn delete(id: data::PointId) -> data::WriteRecord {
    data::WriteRecord {
        op: Some(write_record::Op::Delete(id)),
    }
}

fn good_vector() -> Vec<f32> {
    vec![0.5, -1.0, 2.0, 0.25]
}

fn with_value(position: usize, value: f32) -> Vec<f32> {
    let mut vector = good_vector();
    vector[position] = value;
    vector
}

fn shard_ref(collection_id: u64, shard: u32) -> pb::ShardRef {
    pb::ShardRef {
        collection_id,
        shard,
    }
}

fn request(shard: pb::ShardRef, records: Vec<data::WriteRecord>) -> data::WriteRequest {
    data::WriteRequest {
        shard: Some(shard),
        records,
    }
}

async fn start_indexer(node_id: &str, meta: &MetaClient, storage: &Storage) -> IndexerNode {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut config = IndexerNodeConfig::new(node_id, &address);
    config.heartbeat_interval = Duration::from_millis(200);
    config.indexer = IndexerConfig {
        max_payload_bytes: MAX_PAYLOAD_BYTES,
        // Nothing moves on its own: the manifests change only through writes.
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        orphan_sweep_interval_ms: 0,
        ..IndexerConfig::default()
    };
    IndexerNode::start(config, listener, meta.clone(), storage.clone())
        .await
        .unwrap()
}

async fn create(meta: &MetaClient, spec: pb::CollectionSpec) -> u64 {
    meta.create_collection(spec)
        .await
        .unwrap()
        .collection
        .unwrap()
        .collection_id
}

/// Every shard of the cluster with the node holding its lease and the lease's
/// epoch, once each holder has its writer open.
async fn wait_for_writers(
    meta: &MetaClient,
    indexers: &[(&str, IndexerNode)],
) -> Vec<(pb::ShardRef, String, u64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let routing = meta.get_routing("", true).await.unwrap();
        let leased: Vec<(pb::ShardRef, String, u64)> = routing
            .shards
            .iter()
            .filter_map(|routed| {
                let lease = routed.lease.as_ref()?;
                Some((routed.shard?, lease.holder.clone(), lease.epoch))
            })
            .collect();
        let open = |shard: &pb::ShardRef, holder: &str| {
            let wanted = ShardRef {
                collection_id: shard.collection_id.to_string(),
                shard: shard.shard,
            };
            indexers.iter().any(|(node_id, indexer)| {
                *node_id == holder && indexer.shards().iter().any(|(open, _)| *open == wanted)
            })
        };
        if leased.len() == routing.shards.len()
            && leased.iter().all(|(shard, holder, _)| open(shard, holder))
        {
            return leased;
        }
        assert!(
            Instant::now() < deadline,
            "shard writers not open in time: {:?}",
            routing.shards
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Returns the first u64 id from `from` on that hashes to `shard` of `shards`.
fn id_on(shard: u32, shards: u32, from: u64) -> u64 {
    (from..)
        .find(|id| shard_of(&PointId::U64(*id), shards) == shard)
        .unwrap()
}

/// What the bad writes must leave alone: every object under `collections/`
/// (key, size, entity tag) and every shard's manifest.
async fn snapshot(
    storage: &Storage,
    meta: &MetaClient,
    shards: &[pb::ShardRef],
) -> (Vec<(String, u64, Option<String>)>, Vec<pb::Manifest>) {
    let mut objects: Vec<_> = storage
        .list(keys::COLLECTIONS_PREFIX)
        .await
        .unwrap()
        .into_iter()
        .map(|object| (object.key, object.size, object.version))
        .collect();
    objects.sort();
    let mut manifests = Vec::new();
    for shard in shards {
        manifests.push(meta.get_manifest(*shard, true).await.unwrap());
    }
    (objects, manifests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_at_the_grpc_api_are_refused_and_write_nothing() {
    let Some(storage) = s3_storage("quiver-indexer-test", "indexer-tests").await else {
        return;
    };
    let meta_dir = tempfile::tempdir().unwrap();
    let meta_server = MetaServer::start(MetaConfig {
        init: true,
        ..MetaConfig::new(1, meta_dir.path(), "127.0.0.1:0").with_fast_timings()
    })
    .await
    .unwrap();
    meta_server
        .wait_for_leader(Duration::from_secs(30))
        .await
        .unwrap();
    let meta = MetaClient::connect([meta_server.local_address().to_string()]).unwrap();
    let mut indexers = Vec::new();
    for node_id in ["indexer-api-a", "indexer-api-b"] {
        indexers.push((node_id, start_indexer(node_id, &meta, &storage).await));
    }
    // Both registered before the collections exist, so the leases spread.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !indexers.iter().all(|(_, indexer)| indexer.is_ready()) {
        assert!(Instant::now() < deadline, "indexers did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let numbers_id = create(
        &meta,
        pb::CollectionSpec {
            name: "api_numbers".into(),
            dimension: DIM as u32,
            metric: pb::Metric::L2 as i32,
            id_type: pb::IdType::U64 as i32,
            shards: 2,
            ..Default::default()
        },
    )
    .await;
    let texts_id = create(
        &meta,
        pb::CollectionSpec {
            name: "api_texts".into(),
            dimension: DIM as u32,
            metric: pb::Metric::Cosine as i32,
            id_type: pb::IdType::String as i32,
            shards: 1,
            payload_schema: vec![pb::PayloadField {
                name: "lang".into(),
                kind: pb::FieldKind::Keyword as i32,
            }],
            ..Default::default()
        },
    )
    .await;
    let leases = wait_for_writers(&meta, &indexers).await;
    let mut clients: HashMap<String, IndexerClient<Channel>> = HashMap::new();
    for (node_id, indexer) in &indexers {
        let client = IndexerClient::connect(format!("http://{}", indexer.local_address()))
            .await
            .unwrap();
        clients.insert(node_id.to_string(), client);
    }
    let holder_of = |shard: &pb::ShardRef| -> String {
        leases
            .iter()
            .find(|(leased, _, _)| leased == shard)
            .map(|(_, holder, _)| holder.clone())
            .unwrap_or_else(|| leases[0].1.clone())
    };
    let client_of = |shard: &pb::ShardRef| clients[&holder_of(shard)].clone();
    let numbers = shard_ref(numbers_id, 0);
    let texts = shard_ref(texts_id, 0);
    let all_shards = [numbers, shard_ref(numbers_id, 1), texts];
    // Ids of shard 0 of the two-shard collection (the others belong to shard 1).
    let first = id_on(0, 2, 0);
    let second = id_on(0, 2, first + 1);
    let elsewhere = id_on(1, 2, 0);

    // Some data first, so "unchanged" is about a non-empty bucket and tail.
    for (shard, id) in [(numbers, num(first)), (texts, text("doc-1"))] {
        client_of(&shard)
            .write(request(shard, vec![upsert(id, good_vector(), b"{}")]))
            .await
            .unwrap();
    }
    let before = snapshot(&storage, &meta, &all_shards).await;
    assert_eq!(
        before.0.len(),
        2,
        "one WAL object per write: {:?}",
        before.0
    );

    let oversized = format!(r#"{{"text": "{}"}}"#, "x".repeat(MAX_PAYLOAD_BYTES));
    let long_id = "i".repeat(129);
    let invalid = Code::InvalidArgument;
    let point = num(second);
    let cases: Vec<(&str, pb::ShardRef, Vec<data::WriteRecord>, Code, String)> = vec![
        (
            "wrong dimension",
            numbers,
            vec![upsert(point.clone(), vec![1.0; DIM + 1], b"")],
            invalid,
            format!("dimension {}, expected {DIM}", DIM + 1),
        ),
        (
            "empty vector",
            numbers,
            vec![upsert(point.clone(), Vec::new(), b"")],
            invalid,
            format!("dimension 0, expected {DIM}"),
        ),
        (
            "NaN",
            numbers,
            vec![upsert(point.clone(), with_value(2, f32::NAN), b"")],
            invalid,
            "non-finite value at position 2 (NaN)".into(),
        ),
        (
            "+inf",
            numbers,
            vec![upsert(point.clone(), with_value(0, f32::INFINITY), b"")],
            invalid,
            "non-finite value at position 0 (inf)".into(),
        ),
        (
            "-inf",
            numbers,
            vec![upsert(point.clone(), with_value(3, f32::NEG_INFINITY), b"")],
            invalid,
            "non-finite value at position 3 (-inf)".into(),
        ),
        (
            "a bad point after a good one",
            numbers,
            vec![
                upsert(point.clone(), good_vector(), b""),
                upsert(num(first), with_value(1, f32::NAN), b""),
            ],
            invalid,
            "row 1 has a non-finite value at position 1".into(),
        ),
        (
            "all-zero vector, cosine",
            texts,
            vec![upsert(text("zero"), vec![0.0; DIM], b"")],
            invalid,
            "all zeros".into(),
        ),
        (
            "empty string id",
            texts,
            vec![upsert(text(""), good_vector(), b"")],
            invalid,
            "string id of row 0 has 0 bytes, expected 1..=128".into(),
        ),
        (
            "string id too long",
            texts,
            vec![upsert(text(&long_id), good_vector(), b"")],
            invalid,
            "has 129 bytes, expected 1..=128".into(),
        ),
        (
            "no id",
            numbers,
            vec![data::WriteRecord {
                op: Some(write_record::Op::Upsert(data::Point {
                    id: None,
                    vector: good_vector(),
                    payload_json: Vec::new(),
                })),
            }],
            invalid,
            "records[0].upsert has no id".into(),
        ),
        (
            "id without a kind",
            numbers,
            vec![upsert(data::PointId { kind: None }, good_vector(), b"")],
            invalid,
            "records[0].upsert has no id".into(),
        ),
        (
            "string id on a u64-id collection",
            numbers,
            vec![upsert(text("doc"), good_vector(), b"")],
            invalid,
            r#"id "doc" of row 0 is a string, but the collection's ids are unsigned integers"#
                .into(),
        ),
        (
            "number id on a string-id collection",
            texts,
            vec![upsert(num(7), good_vector(), b"")],
            invalid,
            "id 7 of row 0 is a number, but the collection's ids are strings".into(),
        ),
        (
            "id of another shard",
            numbers,
            vec![upsert(num(elsewhere), good_vector(), b"")],
            invalid,
            format!(
                "records[0]: id {elsewhere} belongs to shard 1 of the collection's 2 shards, not to shard 0"
            ),
        ),
        (
            "empty batch",
            numbers,
            Vec::new(),
            invalid,
            "the request has no records".into(),
        ),
        (
            "record with neither upsert nor delete",
            numbers,
            vec![data::WriteRecord { op: None }],
            invalid,
            "records[0] has neither `upsert` nor `delete`".into(),
        ),
        (
            "oversized payload",
            numbers,
            vec![upsert(point.clone(), good_vector(), oversized.as_bytes())],
            invalid,
            format!(
                "payload of point 0 has {} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes (max_payload_bytes)",
                oversized.len()
            ),
        ),
        (
            "payload not a JSON object",
            numbers,
            vec![upsert(point.clone(), good_vector(), b"[1, 2]")],
            invalid,
            "payload of row 0 must be a JSON object, got an array".into(),
        ),
        (
            "payload a JSON string",
            numbers,
            vec![upsert(point.clone(), good_vector(), br#""text""#)],
            invalid,
            "must be a JSON object, got a string".into(),
        ),
        (
            "payload not JSON",
            numbers,
            vec![upsert(point.clone(), good_vector(), b"{not json")],
            invalid,
            "payload of point 0 is not JSON: key must be a string".into(),
        ),
        (
            "payload field of the wrong type",
            texts,
            vec![upsert(text("doc-2"), good_vector(), br#"{"lang": 5}"#)],
            invalid,
            r#"payload field "lang" of row 0 is 5"#.into(),
        ),
        (
            "delete with no ids",
            texts,
            Vec::new(),
            invalid,
            "a delete at least one id".into(),
        ),
        (
            "delete of an empty string id",
            texts,
            vec![delete(text(""))],
            invalid,
            "string id of row 0 has 0 bytes, expected 1..=128".into(),
        ),
        (
            "delete of an empty id after a good one",
            texts,
            vec![delete(text("doc-1")), delete(text(""))],
            invalid,
            "string id of row 1 has 0 bytes".into(),
        ),
        (
            "delete without an id",
            texts,
            vec![delete(data::PointId { kind: None })],
            invalid,
            "records[0].delete has no id".into(),
        ),
        (
            "delete of a string id on a u64-id collection",
            numbers,
            vec![delete(text("1"))],
            invalid,
            r#"id "1" of row 0 is a string"#.into(),
        ),
        (
            "delete of an id of another shard",
            numbers,
            vec![delete(num(first)), delete(num(elsewhere))],
            invalid,
            format!("records[1]: id {elsewhere} belongs to shard 1"),
        ),
        (
            "unknown collection id",
            shard_ref(987_654, 0),
            vec![upsert(point.clone(), good_vector(), b"")],
            Code::NotFound,
            "collection id 987654 does not exist".into(),
        ),
        (
            "unknown shard number",
            shard_ref(numbers_id, 7),
            vec![upsert(point.clone(), good_vector(), b"")],
            Code::NotFound,
            format!(
                "shard 7 of collection `api_numbers` (id {numbers_id}) does not exist: the collection has 2 shard(s)"
            ),
        ),
    ];
    for (name, shard, records, code, message) in cases {
        let status = client_of(&shard)
            .write(request(shard, records))
            .await
            .expect_err(name);
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert!(
            status.message().contains(&message),
            "{name}: {:?} lacks {message:?}",
            status.message()
        );
    }

    // No shard at all.
    let status = client_of(&numbers)
        .write(data::WriteRequest {
            shard: None,
            records: vec![upsert(point.clone(), good_vector(), b"")],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("`shard` is required"),
        "{status:?}"
    );

    // A shard this indexer does not hold (the other one does): refused naming
    // the holder, so the caller re-routes — what an indexer answers once its
    // lease was taken over, too. Flush and compact say the same.
    for (shard, holder, epoch) in &leases {
        let (other, _) = indexers
            .iter()
            .find(|(node_id, _)| node_id != holder)
            .unwrap();
        let id = if shard.collection_id == texts_id {
            text("doc-3")
        } else {
            num(id_on(shard.shard, 2, 0))
        };
        let status = clients[*other]
            .clone()
            .write(request(*shard, vec![upsert(id, good_vector(), b"")]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        let leased_to =
            format!("is leased to indexer `{holder}` at epoch {epoch}, not to `{other}`");
        assert!(
            status.message().contains(&leased_to),
            "{:?} lacks {leased_to:?}",
            status.message()
        );
        let status = clients[*other]
            .clone()
            .flush(data::ShardRequest {
                shard: Some(*shard),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    }
    let status = client_of(&numbers)
        .compact(data::ShardRequest {
            shard: Some(shard_ref(987_654, 0)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    let after = snapshot(&storage, &meta, &all_shards).await;
    assert_eq!(
        after.0, before.0,
        "a refused write left objects in the bucket"
    );
    assert_eq!(after.1, before.1, "a refused write changed a manifest");

    // A good write still goes through and reads back from the bucket.
    let payload = br#"{"note": "after the refusals"}"#;
    let answer = client_of(&numbers)
        .write(request(
            numbers,
            vec![
                upsert(num(second), good_vector(), payload),
                delete(num(first)),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    let manifest = meta.get_manifest(numbers, true).await.unwrap();
    assert_eq!(manifest.wal_tail.len(), before.1[0].wal_tail.len() + 1);
    let tail = manifest.wal_tail.last().unwrap();
    assert_eq!((tail.epoch, tail.seq), (answer.epoch, answer.seq));
    let bytes = storage.get(&tail.object_key).await.unwrap();
    let batch = WalBatch::decode(&tail.object_key, &bytes).unwrap();
    assert_eq!(
        batch.records,
        vec![
            WalRecord::Upsert {
                id: PointId::U64(second),
                vector: good_vector(),
                payload: payload.to_vec(),
            },
            WalRecord::Delete {
                id: PointId::U64(first),
            },
        ]
    );

    for (_, indexer) in indexers {
        indexer.shutdown().await;
    }
    meta_server.shutdown().await.unwrap();
}
