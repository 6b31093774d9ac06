//! An indexer keeps the lease of a shard whose writer takes longer to open than
//! the lease lives (a shard of millions of rows reads its primary keys for tens of
//! seconds): before, the lease ran out during the open, meta granted the shard
//! again at a newer epoch, the finished writer was refused as stale and closed,
//! and the next open lost the lease the same way — a shard that never took a
//! write again. Here every request to the S3 server is slowed through a proxy so
//! that one open outlasts the lease several times over.

use std::time::{Duration, Instant};

use quiver_indexer::{IndexerConfig, IndexerNode, IndexerNodeConfig, ShardRef};
use quiver_meta::{MetaConfig, MetaServer};
use quiver_meta_client::MetaClient;
use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::{self, point_id, write_record};
use quiver_proto::meta as pb;
use quiver_storage::testing::{FaultConfig, FaultProxy};
use quiver_storage::{Storage, StorageOptions};
use quiver_test_support::S3TestServer;

const LEASE_TTL: Duration = Duration::from_millis(2_000);
const STORE_LATENCY: Duration = Duration::from_millis(3_000);

async fn start_indexer(node_id: &str, meta: &MetaClient, storage: &Storage) -> IndexerNode {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut config = IndexerNodeConfig::new(node_id, &address);
    config.heartbeat_interval = Duration::from_millis(200);
    config.routing_interval = Duration::from_millis(200);
    config.lease_ttl = LEASE_TTL;
    config.indexer = IndexerConfig {
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

fn upsert(id: u64) -> data::WriteRecord {
    data::WriteRecord {
        op: Some(write_record::Op::Upsert(data::Point {
            id: Some(data::PointId {
                kind: Some(point_id::Kind::Num(id)),
            }),
            vector: vec![id as f32, 1.0, -(id as f32), 0.5],
            payload_json: b"{}".to_vec(),
        })),
    }
}

/// The epoch of `indexer`'s open writer of `shard`, if it has one.
fn open_epoch(indexer: &IndexerNode, shard: &ShardRef) -> Option<u64> {
    indexer
        .shards()
        .into_iter()
        .find(|(open, _)| open == shard)
        .map(|(_, epoch)| epoch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_writer_opens_slower_than_its_lease_lives_still_opens_and_takes_writes() {
    let Some(server) = S3TestServer::from_env("the slow shard open test") else {
        return;
    };
    let bucket = server.create_bucket("quiver-slow-open").await;
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let storage = server.storage_via(
        &proxy.endpoint(),
        &bucket,
        "slow-open",
        StorageOptions::default(),
    );
    let meta_dir = tempfile::tempdir().unwrap();
    let meta_server = MetaServer::start(MetaConfig {
        init: true,
        lease_ttl_ms: LEASE_TTL.as_millis() as u64,
        node_timeout_ms: 2_000,
        ..MetaConfig::new(1, meta_dir.path(), "127.0.0.1:0").with_fast_timings()
    })
    .await
    .unwrap();
    meta_server
        .wait_for_leader(Duration::from_secs(30))
        .await
        .unwrap();
    let meta = MetaClient::connect([meta_server.local_address().to_string()]).unwrap();

    // A first indexer writes and flushes a segment, at full speed.
    let first = start_indexer("indexer-slow-a", &meta, &storage).await;
    let collection_id = meta
        .create_collection(pb::CollectionSpec {
            name: "slow_open".into(),
            dimension: 4,
            metric: pb::Metric::L2 as i32,
            id_type: pb::IdType::U64 as i32,
            shards: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .collection
        .unwrap()
        .collection_id;
    let shard = ShardRef {
        collection_id: collection_id.to_string(),
        shard: 0,
    };
    let reference = pb::ShardRef {
        collection_id,
        shard: 0,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_epoch(&first, &shard).is_none() {
        assert!(Instant::now() < deadline, "the first writer never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client = IndexerClient::connect(format!("http://{}", first.local_address()))
        .await
        .unwrap();
    client
        .write(data::WriteRequest {
            shard: Some(reference),
            records: (0..200).map(upsert).collect(),
        })
        .await
        .expect("first write");
    client
        .flush(data::ShardRequest {
            shard: Some(reference),
            ..Default::default()
        })
        .await
        .expect("flush");
    first.shutdown().await;

    // Every request to the store now takes STORE_LATENCY, longer than the lease:
    // a second indexer's open of the shard (at least one read of the segment)
    // outlasts it.
    proxy.set_config(FaultConfig::none().with_latency(STORE_LATENCY));
    let second = start_indexer("indexer-slow-b", &meta, &storage).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (leased_at, leased_epoch) = loop {
        let routing = meta.get_routing("", true).await.unwrap();
        let lease = routing
            .shards
            .iter()
            .find(|routed| routed.shard == Some(reference))
            .and_then(|routed| routed.lease.clone());
        if let Some(lease) = lease
            && lease.holder == "indexer-slow-b"
        {
            break (Instant::now(), lease.epoch);
        }
        assert!(
            Instant::now() < deadline,
            "the shard was never leased to the second indexer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let epoch = loop {
        if let Some(epoch) = open_epoch(&second, &shard) {
            break epoch;
        }
        assert!(
            Instant::now() < deadline,
            "the second indexer never opened the shard's writer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let opening = leased_at.elapsed();
    assert!(
        opening > LEASE_TTL,
        "the open took {opening:?}, not longer than the lease ({LEASE_TTL:?}): the test did not test anything"
    );
    assert_eq!(
        epoch, leased_epoch,
        "the writer opened under the lease it started with"
    );
    // It keeps the shard: no newer epoch, the writer stays open, and it takes writes.
    tokio::time::sleep(LEASE_TTL * 3).await;
    assert_eq!(
        open_epoch(&second, &shard),
        Some(epoch),
        "the writer lost its shard after opening"
    );
    let mut client = IndexerClient::connect(format!("http://{}", second.local_address()))
        .await
        .unwrap();
    client
        .write(data::WriteRequest {
            shard: Some(reference),
            records: vec![upsert(1_000)],
        })
        .await
        .expect("a write after the slow open");
    second.shutdown().await;
    meta_server.shutdown().await.unwrap();
}
