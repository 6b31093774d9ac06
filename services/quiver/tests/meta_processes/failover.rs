use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_meta::MetaClient;
use quiver_proto::meta as pb;

use crate::support::{ProcessCluster, collection_spec, eventually, node_view};

#[derive(Default)]
struct Acknowledged {
    collections: Vec<String>,
    wal_seqs: Vec<u64>,
    segments: Vec<String>,
    errors: Vec<String>,
}

/// Writes collections and WAL commits one after another until `stop`, recording
/// what was acknowledged.
async fn write_stream(
    client: MetaClient,
    shard: pb::ShardRef,
    epoch: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Acknowledged>>,
) {
    let mut index = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("c{index:05}");
        match client.create_collection(collection_spec(&name)).await {
            Ok(_) => acked.lock().expect("lock").collections.push(name),
            Err(error) => acked
                .lock()
                .expect("lock")
                .errors
                .push(format!("create {name}: {error}")),
        }
        let seq = index + 1;
        let commit = pb::CommitWalRequest {
            shard: Some(shard),
            epoch,
            seq,
            object_key: format!("wal/{epoch:010}-{seq:020}.wal"),
            rows: 1,
        };
        match client.commit_wal(commit).await {
            Ok(_) => acked.lock().expect("lock").wal_seqs.push(seq),
            Err(error) => acked
                .lock()
                .expect("lock")
                .errors
                .push(format!("commit_wal {seq}: {error}")),
        }
        if index % 5 == 4 {
            // A flush: one new segment, committed atomically.
            let segment_id = format!("seg-{index:05}");
            let change = pb::CommitManifestChangeRequest {
                shard: Some(shard),
                epoch,
                add_segments: vec![pb::Segment {
                    segment_id: segment_id.clone(),
                    object_key: format!("segments/{segment_id}.qseg"),
                    rows: 5,
                    size_bytes: 4096,
                    deletes_key: String::new(),
                    deletes_version: 0,
                    ..Default::default()
                }],
                ..Default::default()
            };
            match client.commit_manifest_change(change).await {
                Ok(_) => acked.lock().expect("lock").segments.push(segment_id),
                Err(error) => acked
                    .lock()
                    .expect("lock")
                    .errors
                    .push(format!("manifest change {segment_id}: {error}")),
            }
        }
        index += 1;
    }
}

fn acked_count(acked: &Mutex<Acknowledged>) -> usize {
    acked.lock().expect("lock").wal_seqs.len()
}

/// Checks that `address` holds every acknowledged write exactly once.
async fn holds_everything(address: &str, shard: pb::ShardRef, acked: &Acknowledged) -> Option<()> {
    let (collections, wal_seqs) = (&acked.collections, &acked.wal_seqs);
    let (present, manifest) = node_view(address, shard).await.ok()?;
    let names: BTreeSet<&str> = present
        .iter()
        .map(|collection| {
            collection
                .spec
                .as_ref()
                .map_or("", |spec| spec.name.as_str())
        })
        .collect();
    if !collections.iter().all(|name| names.contains(name.as_str())) {
        return None;
    }
    let seqs: Vec<u64> = manifest.wal_tail.iter().map(|entry| entry.seq).collect();
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(
        unique.len(),
        seqs.len(),
        "a wal entry is duplicated on {address}: {seqs:?}"
    );
    assert!(
        seqs.windows(2).all(|pair| pair[0] < pair[1]),
        "wal tail out of order on {address}"
    );
    let ids: BTreeSet<u64> = present
        .iter()
        .map(|collection| collection.collection_id)
        .collect();
    assert_eq!(
        ids.len(),
        present.len(),
        "collection ids repeat on {address}"
    );
    let segment_ids: Vec<&str> = manifest
        .segments
        .iter()
        .map(|segment| segment.segment_id.as_str())
        .collect();
    let unique_segments: BTreeSet<&str> = segment_ids.iter().copied().collect();
    assert_eq!(
        unique_segments.len(),
        segment_ids.len(),
        "a segment is listed twice on {address}"
    );
    let segments_present = acked
        .segments
        .iter()
        .all(|segment_id| unique_segments.contains(segment_id.as_str()));
    (segments_present && wal_seqs.iter().all(|seq| unique.contains(seq))).then_some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_of_the_leader_loses_no_acknowledged_write() -> anyhow::Result<()> {
    let mut cluster = ProcessCluster::start(3)?;
    let leader = cluster
        .wait_for_agreed_leader(Duration::from_secs(20))
        .await?;
    let client = cluster.client();

    let target = client
        .create_collection(collection_spec("wal-target"))
        .await?
        .collection
        .expect("collection");
    client
        .register_node(pb::RegisterNodeRequest {
            node_id: "indexer-1".into(),
            role: pb::NodeRole::Indexer as i32,
            address: "127.0.0.1:1".into(),
        })
        .await?;
    let shard = pb::ShardRef {
        collection_id: target.collection_id,
        shard: 0,
    };
    let lease = client
        .acquire_lease(pb::AcquireLeaseRequest {
            shard: Some(shard),
            node_id: "indexer-1".into(),
            ttl_ms: 600_000,
        })
        .await?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acknowledged::default()));
    let writer = tokio::spawn(write_stream(
        client.clone(),
        shard,
        lease.epoch,
        stop.clone(),
        acked.clone(),
    ));
    eventually(
        "writes before the kill",
        Duration::from_secs(20),
        || async { (acked_count(&acked) >= 30).then_some(()) },
    )
    .await?;

    let killed_at = Instant::now();
    cluster.kill_nine(leader)?;
    let survivors: Vec<u64> = (1..=3).filter(|node_id| *node_id != leader).collect();
    let new_leader = cluster
        .wait_for_leader_other_than(leader, &survivors, Duration::from_secs(10))
        .await?;
    let failover = killed_at.elapsed();
    eprintln!("leader {leader} killed; node {new_leader} leads after {failover:?}");

    let before_resume = acked_count(&acked);
    eventually(
        "writes after the failover",
        Duration::from_secs(30),
        || async { (acked_count(&acked) >= before_resume + 30).then_some(()) },
    )
    .await?;
    stop.store(true, Ordering::SeqCst);
    writer.await?;
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    assert!(
        acked.errors.is_empty(),
        "the leader change surfaced errors: {:?}",
        acked.errors
    );
    assert!(
        !acked.segments.is_empty(),
        "manifest changes were acknowledged"
    );

    for node_id in &survivors {
        let address = cluster.address(*node_id);
        eventually(
            "every acknowledged write on a survivor",
            Duration::from_secs(15),
            || holds_everything(&address, shard, &acked),
        )
        .await?;
    }

    // The killed node comes back and catches up.
    cluster.spawn(leader)?;
    let address = cluster.address(leader);
    eventually(
        "the restarted node to catch up",
        Duration::from_secs(20),
        || holds_everything(&address, shard, &acked),
    )
    .await?;

    // A full-cluster restart (sigterm, clean exit) keeps all state.
    for node_id in 1..=3 {
        let status = cluster.terminate(node_id)?;
        assert!(
            status.success(),
            "node {node_id} exited with {status} on sigterm"
        );
    }
    for node_id in 1..=3 {
        cluster.spawn(node_id)?;
    }
    cluster
        .wait_for_agreed_leader(Duration::from_secs(20))
        .await?;
    let mut views = BTreeMap::new();
    for node_id in 1..=3 {
        let address = cluster.address(node_id);
        eventually(
            "state after a full restart",
            Duration::from_secs(20),
            || holds_everything(&address, shard, &acked),
        )
        .await?;
        views.insert(node_id, node_view(&address, shard).await?);
    }
    let first = &views[&1];
    assert!(
        views.values().all(|view| view == first),
        "nodes disagree after restart"
    );

    // And the cluster still takes writes, fenced by epoch as before.
    let stale = client
        .commit_wal(pb::CommitWalRequest {
            shard: Some(shard),
            epoch: lease.epoch + 1,
            seq: 1_000_000,
            object_key: "wal/never".into(),
            rows: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.kind(), quiver_proto::ErrorCode::FailedPrecondition);
    client
        .create_collection(collection_spec("after-full-restart"))
        .await?;
    Ok(())
}
