use std::time::Duration;

use quiver_meta::MetaClientError as MetaError;
use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;

use crate::support::{TestCluster, collection_spec, eventually};

fn shard(collection_id: u64, shard: u32) -> pb::ShardRef {
    pb::ShardRef {
        collection_id,
        shard,
    }
}

fn segment(segment_id: &str, rows: u64) -> pb::Segment {
    pb::Segment {
        segment_id: segment_id.into(),
        object_key: format!("segments/{segment_id}.qseg"),
        rows,
        size_bytes: rows * 100,
        deletes_key: String::new(),
        deletes_version: 0,
        ..Default::default()
    }
}

fn code_of(error: &MetaError) -> ErrorCode {
    error.kind()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_api_end_to_end() -> anyhow::Result<()> {
    // The control loop is effectively off here: this test grants leases by hand.
    let cluster = TestCluster::start(3, |config| {
        config.control_interval_ms = 3_600_000;
        config.gc_grace_ms = 0;
    })
    .await?;
    cluster.wait_for_leader().await?;
    let client = cluster.client();

    // Collections: create, identical re-create, conflicting create, get, list, drop.
    let created = client
        .create_collection(collection_spec("docs", 2, 1))
        .await?;
    assert!(created.created);
    let docs = created.collection.expect("collection");
    let again = client
        .create_collection(collection_spec("docs", 2, 1))
        .await?;
    assert!(!again.created);
    assert_eq!(
        again.collection.as_ref().map(|c| c.collection_id),
        Some(docs.collection_id)
    );
    let conflict = client
        .create_collection(collection_spec("docs", 3, 1))
        .await
        .unwrap_err();
    assert_eq!(code_of(&conflict), ErrorCode::AlreadyExists);
    let mut bad = collection_spec("bad", 1, 1);
    bad.dimension = 0;
    let invalid = client.create_collection(bad).await.unwrap_err();
    assert_eq!(code_of(&invalid), ErrorCode::InvalidArgument);
    assert!(invalid.to_string().contains("dimension"), "{invalid}");
    assert_eq!(
        client.get_collection("docs", true).await?.collection_id,
        docs.collection_id
    );
    let missing = client.get_collection("nope", false).await.unwrap_err();
    assert_eq!(code_of(&missing), ErrorCode::NotFound);
    client
        .create_collection(collection_spec("scratch", 1, 1))
        .await?;
    assert_eq!(client.list_collections(true).await?.len(), 2);
    let dropped = client.drop_collection("scratch").await?;
    let recreated = client
        .create_collection(collection_spec("scratch", 1, 1))
        .await?;
    assert_ne!(
        recreated.collection.expect("collection").collection_id,
        dropped.collection_id
    );

    // Nodes and leases.
    for (node_id, role) in [
        ("indexer-a", pb::NodeRole::Indexer),
        ("indexer-b", pb::NodeRole::Indexer),
    ] {
        client
            .register_node(pb::RegisterNodeRequest {
                node_id: node_id.into(),
                role: role as i32,
                address: format!("{node_id}:7200"),
            })
            .await?;
    }
    let shard0 = shard(docs.collection_id, 0);
    let lease = client
        .acquire_lease(pb::AcquireLeaseRequest {
            shard: Some(shard0),
            node_id: "indexer-a".into(),
            ttl_ms: 400,
        })
        .await?;
    assert_eq!(lease.epoch, 1);
    let busy = client
        .acquire_lease(pb::AcquireLeaseRequest {
            shard: Some(shard0),
            node_id: "indexer-b".into(),
            ttl_ms: 400,
        })
        .await
        .unwrap_err();
    assert_eq!(code_of(&busy), ErrorCode::FailedPrecondition);

    // WAL commits, idempotent per (epoch, seq), manifest versions strictly increase.
    let mut versions = Vec::new();
    for seq in 1..=3 {
        let committed = client
            .commit_wal(pb::CommitWalRequest {
                shard: Some(shard0),
                epoch: 1,
                seq,
                object_key: format!("wal/{seq}.wal"),
                rows: 10,
            })
            .await?;
        assert!(!committed.duplicate);
        versions.push(committed.manifest_version);
    }
    let repeated = client
        .commit_wal(pb::CommitWalRequest {
            shard: Some(shard0),
            epoch: 1,
            seq: 3,
            object_key: "wal/3.wal".into(),
            rows: 10,
        })
        .await?;
    assert!(repeated.duplicate);
    assert_eq!(repeated.manifest_version, versions[2]);

    // A flush: add a segment, trim the WAL tail through seq 2.
    let flushed = client
        .commit_manifest_change(pb::CommitManifestChangeRequest {
            shard: Some(shard0),
            epoch: 1,
            add_segments: vec![segment("seg-1", 20)],
            remove_segment_ids: vec![],
            set_deletes: vec![],
            trim_wal_through: Some(pb::WalPosition { epoch: 1, seq: 2 }),
            gc_keys: vec![],
            set_probes: vec![],
        })
        .await?;
    versions.push(flushed.manifest_version);
    assert!(
        versions.windows(2).all(|pair| pair[0] < pair[1]),
        "{versions:?}"
    );
    let manifest = client.get_manifest(shard0, true).await?;
    assert_eq!(manifest.version, flushed.manifest_version);
    assert_eq!(manifest.segments.len(), 1);
    assert_eq!(manifest.wal_tail.len(), 1);
    assert_eq!(manifest.wal_tail[0].seq, 3);

    // Takeover after expiry: a new epoch, and the old holder is fenced.
    let takeover = eventually("the lease to expire", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            client
                .acquire_lease(pb::AcquireLeaseRequest {
                    shard: Some(shard0),
                    node_id: "indexer-b".into(),
                    ttl_ms: 60_000,
                })
                .await
                .ok()
        }
    })
    .await?;
    assert_eq!(takeover.epoch, 2);
    let stale = client
        .commit_wal(pb::CommitWalRequest {
            shard: Some(shard0),
            epoch: 1,
            seq: 4,
            object_key: "wal/4.wal".into(),
            rows: 10,
        })
        .await
        .unwrap_err();
    assert_eq!(code_of(&stale), ErrorCode::FailedPrecondition);
    assert!(
        stale.to_string().contains("stale epoch 1")
            && stale.to_string().contains("current epoch is 2"),
        "{stale}"
    );
    let stale_renew = client
        .renew_lease(pb::RenewLeaseRequest {
            shard: Some(shard0),
            node_id: "indexer-a".into(),
            epoch: 1,
            ttl_ms: 1_000,
        })
        .await
        .unwrap_err();
    assert_eq!(code_of(&stale_renew), ErrorCode::FailedPrecondition);
    let stale_change = client
        .commit_manifest_change(pb::CommitManifestChangeRequest {
            shard: Some(shard0),
            epoch: 1,
            add_segments: vec![segment("seg-zombie", 1)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code_of(&stale_change), ErrorCode::FailedPrecondition);

    // Merge by the new holder: replace seg-1 by seg-2; seg-1 goes on the GC list.
    let merged = client
        .commit_manifest_change(pb::CommitManifestChangeRequest {
            shard: Some(shard0),
            epoch: 2,
            add_segments: vec![segment("seg-2", 20)],
            remove_segment_ids: vec!["seg-1".into()],
            set_deletes: vec![pb::DeletesUpdate {
                segment_id: "seg-2".into(),
                deletes_key: "deletes/seg-2-1.del".into(),
                deletes_version: 1,
                deleted_rows: 0,
            }],
            trim_wal_through: None,
            gc_keys: vec![],
            set_probes: vec![],
        })
        .await?;
    assert!(merged.manifest_version > flushed.manifest_version);
    let due = client.take_gc(100).await?;
    let due_keys: Vec<&str> = due.iter().map(|entry| entry.object_key.as_str()).collect();
    assert!(due_keys.contains(&"segments/seg-1.qseg"), "{due_keys:?}");
    assert!(
        due_keys.contains(&"wal/1.wal") && due_keys.contains(&"wal/2.wal"),
        "{due_keys:?}"
    );
    let removed = client
        .ack_gc(due.iter().map(|entry| entry.object_key.clone()).collect())
        .await?;
    assert_eq!(removed as usize, due.len());
    assert!(client.take_gc(100).await?.is_empty());

    // Routing shows the lease holder and manifest version.
    let routing = client.get_routing("docs", true).await?;
    let shard0_routing = routing
        .shards
        .iter()
        .find(|routing| routing.shard == Some(shard0))
        .expect("shard 0 routing");
    assert_eq!(
        shard0_routing
            .lease
            .as_ref()
            .map(|lease| lease.holder.as_str()),
        Some("indexer-b")
    );
    assert_eq!(shard0_routing.epoch, 2);
    assert_eq!(shard0_routing.manifest_version, merged.manifest_version);

    // The codebook's group recalibrated: new default probes for seg-2, and
    // none for seg-1, which is no longer live (the change is refused whole).
    let probes = |segment_id: &str| pb::ProbesUpdate {
        segment_id: segment_id.into(),
        default_nprobe: 41,
        probe_ratio_milli: 0,
        wide_nprobe: 90,
        wide_probe_ratio_milli: 0,
        calibrated_rows: 200_000,
    };
    let change = |set_probes: Vec<pb::ProbesUpdate>| pb::CommitManifestChangeRequest {
        shard: Some(shard0),
        epoch: 2,
        add_segments: vec![],
        remove_segment_ids: vec![],
        set_deletes: vec![],
        trim_wal_through: None,
        gc_keys: vec![],
        set_probes,
    };
    let refused = client
        .commit_manifest_change(change(vec![probes("seg-2"), probes("seg-1")]))
        .await
        .unwrap_err();
    assert_eq!(code_of(&refused), ErrorCode::FailedPrecondition);
    let recalibrated = client
        .commit_manifest_change(change(vec![probes("seg-2")]))
        .await?;
    assert!(recalibrated.manifest_version > merged.manifest_version);
    let manifest = client.get_manifest(shard0, true).await?;
    let seg2 = manifest
        .segments
        .iter()
        .find(|segment| segment.segment_id == "seg-2")
        .expect("seg-2 is live");
    assert_eq!(
        (
            seg2.default_nprobe,
            seg2.probe_ratio_milli,
            seg2.wide_nprobe,
            seg2.calibrated_rows
        ),
        (41, 0, 90, 200_000)
    );
    assert_eq!(
        seg2.deletes_key, "deletes/seg-2-1.del",
        "the rest of the entry stays"
    );
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_manifest_changes_from_any_node() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3, |config| config.control_interval_ms = 3_600_000).await?;
    let leader = cluster.wait_for_leader().await?;
    let client = cluster.client();
    let docs = client
        .create_collection(collection_spec("docs", 1, 1))
        .await?
        .collection
        .expect("collection");
    client
        .register_node(pb::RegisterNodeRequest {
            node_id: "indexer-a".into(),
            role: pb::NodeRole::Indexer as i32,
            address: "a:1".into(),
        })
        .await?;
    let shard0 = shard(docs.collection_id, 0);
    client
        .acquire_lease(pb::AcquireLeaseRequest {
            shard: Some(shard0),
            node_id: "indexer-a".into(),
            ttl_ms: 60_000,
        })
        .await?;

    // Watch on a follower: the first event carries everything so far.
    let follower = (1..=3)
        .find(|node_id| *node_id != leader)
        .expect("a follower");
    let mut stream = cluster
        .client_of(follower)
        .watch(pb::WatchRequest {
            collection_id: docs.collection_id,
            from_version: 0,
        })
        .await?;
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await??
        .expect("a first event");
    assert!(
        first
            .collections
            .iter()
            .any(|collection| collection.collection_id == docs.collection_id)
    );
    let mut seen_version = first.catalog_version;

    for seq in 1..=5 {
        let committed = client
            .commit_wal(pb::CommitWalRequest {
                shard: Some(shard0),
                epoch: 1,
                seq,
                object_key: format!("wal/{seq}.wal"),
                rows: 1,
            })
            .await?;
        // Each commit shows up in the stream with its manifest version.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let event = tokio::time::timeout_at(deadline, stream.message())
                .await??
                .expect("the stream stays open");
            assert!(
                event.catalog_version > seen_version,
                "catalog versions increase"
            );
            seen_version = event.catalog_version;
            let manifest_version = event
                .shards
                .iter()
                .filter_map(|update| update.manifest.as_ref())
                .map(|manifest| manifest.version)
                .max();
            if manifest_version == Some(committed.manifest_version) {
                break;
            }
        }
    }
    cluster.shutdown().await
}
