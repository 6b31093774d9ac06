use std::collections::BTreeSet;

use proptest::prelude::*;
use quiver_model::{DeletesEntry, IdType, IndexParams, ManifestChange, Metric, WalPosition};

use super::*;
use crate::model::{CollectionSpec, NodeRole, NodeState, ShardManifestChange};

const LEASE_TTL_MS: u64 = 10_000;
const NODE_TIMEOUT_MS: u64 = 5_000;

fn spec(name: &str, shards: u32, replication: u32) -> CollectionSpec {
    CollectionSpec {
        name: name.to_owned(),
        dimension: 8,
        metric: Metric::Cosine,
        id_type: IdType::U64,
        shards,
        replication,
        index: IndexParams::default(),
        payload_schema: Vec::new(),
    }
}

fn run(catalog: &mut Catalog, now_ms: u64, command: Command) -> ApplyResult {
    catalog.apply(&MetaRequest { now_ms, command })
}

fn create(catalog: &mut Catalog, name: &str, shards: u32) -> Collection {
    match run(
        catalog,
        1,
        Command::CreateCollection {
            spec: spec(name, shards, 1),
        },
    ) {
        Ok(Outcome::Collection { collection, .. }) => collection,
        other => panic!("create failed: {other:?}"),
    }
}

fn register(catalog: &mut Catalog, node_id: &str, role: NodeRole, now_ms: u64) {
    run(
        catalog,
        now_ms,
        Command::RegisterNode {
            node_id: node_id.to_owned(),
            role,
            address: format!("{node_id}:7000"),
        },
    )
    .expect("register");
}

fn acquire(catalog: &mut Catalog, shard: ShardKey, node_id: &str, now_ms: u64) -> ApplyResult {
    run(
        catalog,
        now_ms,
        Command::AcquireLease {
            shard,
            node_id: node_id.to_owned(),
            ttl_ms: LEASE_TTL_MS,
        },
    )
}

fn commit_wal(catalog: &mut Catalog, shard: ShardKey, epoch: u64, seq: u64) -> ApplyResult {
    run(
        catalog,
        1,
        Command::CommitWal {
            shard,
            epoch,
            seq,
            object_key: format!("wal/{epoch:010}-{seq:020}.wal"),
            rows: 10,
        },
    )
}

fn lease_epoch(outcome: ApplyResult) -> u64 {
    match outcome {
        Ok(Outcome::Lease(lease)) => lease.epoch,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn shard0(collection: &Collection) -> ShardKey {
    ShardKey {
        collection_id: collection.collection_id,
        shard: 0,
    }
}

#[test]
fn create_is_idempotent_for_an_identical_spec_and_ids_are_never_reused() {
    let mut catalog = Catalog::default();
    let first = create(&mut catalog, "docs", 2);
    let again = run(
        &mut catalog,
        2,
        Command::CreateCollection {
            spec: spec("docs", 2, 1),
        },
    );
    assert!(
        matches!(again, Ok(Outcome::Collection { created: false, ref collection }) if collection.collection_id == first.collection_id)
    );
    let different = run(
        &mut catalog,
        2,
        Command::CreateCollection {
            spec: spec("docs", 3, 1),
        },
    );
    assert_eq!(different.unwrap_err().code, ErrorCode::AlreadyExists);

    run(
        &mut catalog,
        3,
        Command::DropCollection {
            name: "docs".into(),
            gc_grace_ms: 0,
        },
    )
    .expect("drop");
    assert_eq!(catalog.shards().count(), 0);
    let recreated = create(&mut catalog, "docs", 2);
    assert_ne!(recreated.collection_id, first.collection_id);
    assert_eq!(catalog.dropped_since(0), vec![first.collection_id]);
}

#[test]
fn invalid_specs_are_rejected_with_the_field_named() {
    let mut catalog = Catalog::default();
    let mut bad = spec("bad name!", 1, 1);
    let error = run(
        &mut catalog,
        1,
        Command::CreateCollection { spec: bad.clone() },
    )
    .unwrap_err();
    assert_eq!(error.code, ErrorCode::InvalidArgument);
    assert!(error.message.contains("bad name!"));
    bad.name = "ok".into();
    bad.dimension = 0;
    let error = run(&mut catalog, 1, Command::CreateCollection { spec: bad }).unwrap_err();
    assert!(error.message.contains("dimension"), "{}", error.message);
    assert_eq!(
        catalog,
        Catalog {
            clock_ms: 1,
            ..Catalog::default()
        }
    );
}

#[test]
fn lease_takeover_increments_the_epoch_and_renew_is_holder_only() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    register(&mut catalog, "indexer-b", NodeRole::Indexer, 1);

    assert_eq!(
        lease_epoch(acquire(&mut catalog, shard, "indexer-a", 1_000)),
        1
    );
    // The holder re-acquiring keeps its epoch; another node is refused while it is valid.
    assert_eq!(
        lease_epoch(acquire(&mut catalog, shard, "indexer-a", 2_000)),
        1
    );
    let refused = acquire(&mut catalog, shard, "indexer-b", 3_000).unwrap_err();
    assert_eq!(refused.code, ErrorCode::FailedPrecondition);
    assert!(refused.message.contains("indexer-a"), "{}", refused.message);

    let renew_by_other = run(
        &mut catalog,
        3_000,
        Command::RenewLease {
            shard,
            node_id: "indexer-b".into(),
            epoch: 1,
            ttl_ms: LEASE_TTL_MS,
        },
    )
    .unwrap_err();
    assert_eq!(renew_by_other.code, ErrorCode::FailedPrecondition);
    let renewed = run(
        &mut catalog,
        3_000,
        Command::RenewLease {
            shard,
            node_id: "indexer-a".into(),
            epoch: 1,
            ttl_ms: LEASE_TTL_MS,
        },
    );
    assert!(matches!(renewed, Ok(Outcome::Lease(ref lease)) if lease.expires_at_ms == 13_000));

    // After expiry another indexer takes over at epoch 2.
    assert_eq!(
        lease_epoch(acquire(&mut catalog, shard, "indexer-b", 13_001)),
        2
    );
    let renew_stale = run(
        &mut catalog,
        13_002,
        Command::RenewLease {
            shard,
            node_id: "indexer-a".into(),
            epoch: 1,
            ttl_ms: LEASE_TTL_MS,
        },
    );
    assert_eq!(renew_stale.unwrap_err().code, ErrorCode::FailedPrecondition);
}

#[test]
fn stale_epoch_commits_are_rejected_naming_both_epochs() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    register(&mut catalog, "indexer-b", NodeRole::Indexer, 1);
    acquire(&mut catalog, shard, "indexer-a", 1).expect("lease");
    commit_wal(&mut catalog, shard, 1, 1).expect("wal 1");
    acquire(&mut catalog, shard, "indexer-b", 1 + LEASE_TTL_MS + 1).expect("takeover");

    let stale = commit_wal(&mut catalog, shard, 1, 2).unwrap_err();
    assert_eq!(stale.code, ErrorCode::FailedPrecondition);
    assert!(
        stale.message.contains("stale epoch 1") && stale.message.contains("current epoch is 2"),
        "{}",
        stale.message
    );
    let stale_change = run(
        &mut catalog,
        20_000,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("s1", 10)],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    )
    .unwrap_err();
    assert_eq!(stale_change.code, ErrorCode::FailedPrecondition);
    let future = commit_wal(&mut catalog, shard, 3, 1).unwrap_err();
    assert!(
        future.message.contains("never granted"),
        "{}",
        future.message
    );
    // The new holder continues the WAL.
    commit_wal(&mut catalog, shard, 2, 1).expect("wal at epoch 2");
}

#[test]
fn commit_wal_is_idempotent_for_a_repeated_position() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    acquire(&mut catalog, shard, "indexer-a", 1).expect("lease");
    let first = commit_wal(&mut catalog, shard, 1, 1).expect("first");
    let repeated = commit_wal(&mut catalog, shard, 1, 1).expect("repeat");
    assert_eq!(
        first,
        Outcome::WalCommitted {
            manifest_version: 1,
            duplicate: false
        }
    );
    assert_eq!(
        repeated,
        Outcome::WalCommitted {
            manifest_version: 1,
            duplicate: true
        }
    );
    let other_key = run(
        &mut catalog,
        1,
        Command::CommitWal {
            shard,
            epoch: 1,
            seq: 1,
            object_key: "another".into(),
            rows: 1,
        },
    );
    assert_eq!(other_key.unwrap_err().code, ErrorCode::FailedPrecondition);
    commit_wal(&mut catalog, shard, 1, 3).expect("a gap forward is allowed");
    // Fold seq 1 into a segment: a late retry of it is still a duplicate, not an error.
    run(
        &mut catalog,
        1,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("s1", 10)],
                    trim_wal_through: Some(WalPosition::from((1, 1))),
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 60_000,
        },
    )
    .expect("flush");
    let late_retry = commit_wal(&mut catalog, shard, 1, 1).expect("late retry");
    assert!(matches!(
        late_retry,
        Outcome::WalCommitted {
            duplicate: true,
            ..
        }
    ));
    let behind = commit_wal(&mut catalog, shard, 1, 2).unwrap_err();
    assert!(behind.message.contains("behind"), "{}", behind.message);
    assert_eq!(catalog.shard(shard).unwrap().manifest.wal_tail.len(), 1);
}

#[test]
fn manifest_change_is_atomic_and_moves_replaced_objects_to_gc() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    acquire(&mut catalog, shard, "indexer-a", 1).expect("lease");
    for seq in 1..=3 {
        commit_wal(&mut catalog, shard, 1, seq).expect("wal");
    }
    let flush = ShardManifestChange {
        shard,
        epoch: 1,
        change: ManifestChange {
            add_segments: vec![segment("s1", 20)],
            trim_wal_through: Some(WalPosition::from((1, 2))),
            ..ManifestChange::default()
        },
    };
    let flushed = run(
        &mut catalog,
        100,
        Command::CommitManifestChange {
            change: flush.clone(),
            gc_grace_ms: 1_000,
        },
    )
    .expect("flush");
    assert_eq!(
        flushed,
        Outcome::ManifestCommitted {
            manifest_version: 4,
            duplicate: false
        }
    );
    let record = catalog.shard(shard).unwrap();
    assert_eq!(record.manifest.wal_tail.len(), 1);
    assert_eq!(
        catalog.gc_due(1_100, 10).len(),
        2,
        "two trimmed wal objects"
    );
    assert!(
        catalog.gc_due(1_099, 10).is_empty(),
        "grace period respected"
    );

    // A retry of the same change is recognised.
    let retried = run(
        &mut catalog,
        101,
        Command::CommitManifestChange {
            change: flush,
            gc_grace_ms: 1_000,
        },
    )
    .expect("retry");
    assert_eq!(
        retried,
        Outcome::ManifestCommitted {
            manifest_version: 4,
            duplicate: true
        }
    );

    // A change with one bad part changes nothing.
    let before = catalog.clone();
    let bad = run(
        &mut catalog,
        102,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("s2", 5)],
                    remove_segments: vec!["missing".into()],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    );
    assert_eq!(bad.unwrap_err().code, ErrorCode::FailedPrecondition);
    assert_eq!(catalog.shards, before.shards);

    // Merge: replace s1 by s2, give s2 a bitmap, then replace the bitmap.
    run(
        &mut catalog,
        103,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("s2", 20)],
                    remove_segments: vec!["s1".into()],
                    set_deletes: vec![(
                        "s2".into(),
                        DeletesEntry {
                            key: "deletes/s2-1.del".into(),
                            version: 1,
                            deleted_rows: 0,
                        },
                    )],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    )
    .expect("merge");
    let older_bitmap = run(
        &mut catalog,
        104,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    set_deletes: vec![(
                        "s2".into(),
                        DeletesEntry {
                            key: "deletes/s2-0.del".into(),
                            version: 1,
                            deleted_rows: 0,
                        },
                    )],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    );
    assert!(older_bitmap.unwrap_err().message.contains("not newer"));
    // A newer bitmap may retire the one it replaces (as the indexer's flushes do).
    run(
        &mut catalog,
        104,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    set_deletes: vec![(
                        "s2".into(),
                        DeletesEntry {
                            key: "deletes/s2-2.del".into(),
                            version: 2,
                            deleted_rows: 1,
                        },
                    )],
                    retire_keys: vec!["deletes/s2-1.del".into()],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    )
    .expect("a replaced bitmap may go on the gc list");
    let still_live = run(
        &mut catalog,
        104,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    retire_keys: vec!["deletes/s2-2.del".into()],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    );
    assert_eq!(still_live.unwrap_err().code, ErrorCode::InvalidArgument);
    let gc_keys: Vec<String> = catalog
        .gc_due(u64::MAX, 100)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert!(
        gc_keys.contains(&"segments/s1.qseg".to_owned())
            && gc_keys.contains(&"deletes/s2-1.del".to_owned()),
        "{gc_keys:?}"
    );
    let live_reference = run(
        &mut catalog,
        105,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    retire_keys: vec!["segments/s2.qseg".into()],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 0,
        },
    );
    assert_eq!(live_reference.unwrap_err().code, ErrorCode::InvalidArgument);
}

#[test]
fn dead_nodes_lose_leases_and_orphaned_shards_are_balanced() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 6);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 0);
    register(&mut catalog, "indexer-b", NodeRole::Indexer, 0);
    register(&mut catalog, "indexer-c", NodeRole::Indexer, 0);
    let changes = catalog.reconcile(1, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    assert!(changes >= 6);
    let holders = |catalog: &Catalog| -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, record) in catalog.shards() {
            *counts
                .entry(record.lease.as_ref().unwrap().holder.clone())
                .or_default() += 1;
        }
        counts
    };
    assert_eq!(
        holders(&catalog).values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2]
    );
    assert_eq!(
        catalog.reconcile(2, NODE_TIMEOUT_MS, LEASE_TTL_MS),
        0,
        "stable"
    );

    // b and c keep heartbeating, a goes silent.
    for node_id in ["indexer-b", "indexer-c"] {
        run(
            &mut catalog,
            4_000,
            Command::Heartbeat {
                node_id: node_id.into(),
                ready_shards: vec![],
            },
        )
        .expect("heartbeat");
    }
    catalog.reconcile(5_500, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    assert_eq!(catalog.nodes["indexer-a"].state, NodeState::Dead);
    let counts = holders(&catalog);
    assert_eq!(counts.get("indexer-a"), None);
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![3, 3]);
    for shard in 0..6 {
        let record = catalog
            .shard(ShardKey {
                collection_id: collection.collection_id,
                shard,
            })
            .unwrap();
        assert!(record.lease.as_ref().unwrap().epoch <= record.epoch);
    }
    let moved_epochs: Vec<u64> = catalog
        .shards()
        .map(|(_, record)| record.epoch)
        .filter(|epoch| *epoch == 2)
        .collect();
    assert_eq!(moved_epochs.len(), 2, "a's two shards moved with epoch 2");
}

/// Draining the last alive indexer or searcher would leave every shard without
/// a node of that role (writes or searches fail): refused, naming the shards and
/// the role, and nothing changes. With another alive node of the role, or with
/// no shard at all, a drain goes through; a gateway may always be drained.
#[test]
fn draining_the_last_alive_node_of_a_role_that_holds_shards_is_refused() {
    let mut catalog = Catalog::default();
    register(&mut catalog, "lonely-searcher", NodeRole::Searcher, 0);
    register(&mut catalog, "gateway-1", NodeRole::Gateway, 0);
    let drain = |catalog: &mut Catalog, node_id: &str| {
        run(
            catalog,
            1,
            Command::DrainNode {
                node_id: node_id.into(),
            },
        )
    };
    drain(&mut catalog, "lonely-searcher").expect("no shard yet: a drain goes through");

    let mut catalog = Catalog::default();
    create(&mut catalog, "docs", 2);
    for (node_id, role) in [
        ("searcher-1", NodeRole::Searcher),
        ("searcher-2", NodeRole::Searcher),
        ("indexer-1", NodeRole::Indexer),
        ("gateway-1", NodeRole::Gateway),
    ] {
        register(&mut catalog, node_id, role, 0);
    }
    catalog.reconcile(1, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    drain(&mut catalog, "searcher-1").expect("searcher-2 can take its shards");
    let version = catalog.version();
    let refused = drain(&mut catalog, "searcher-2").expect_err("the last searcher");
    assert_eq!(
        refused.code,
        ErrorCode::FailedPrecondition,
        "{}",
        refused.message
    );
    for expected in ["searcher-2", "last alive searcher", "docs/0", "docs/1"] {
        assert!(refused.message.contains(expected), "{}", refused.message);
    }
    assert_eq!(catalog.nodes["searcher-2"].state, NodeState::Alive);
    assert_eq!(catalog.version(), version, "nothing changed");

    let refused = drain(&mut catalog, "indexer-1").expect_err("the only indexer");
    assert_eq!(refused.code, ErrorCode::FailedPrecondition);
    assert!(
        refused.message.contains("last alive indexer"),
        "{}",
        refused.message
    );
    assert_eq!(catalog.nodes["indexer-1"].state, NodeState::Alive);

    drain(&mut catalog, "gateway-1").expect("a gateway holds no shards");
    drain(&mut catalog, "searcher-1").expect("draining a draining node again is a no-op");
}

/// A collection's shards spread over the live searchers and indexers, least
/// loaded first: two shards on two searchers and two indexers land one on each,
/// and a second collection does the same whatever the first one holds.
#[test]
fn shards_of_a_collection_spread_over_the_live_searchers_and_indexers() {
    let mut catalog = Catalog::default();
    for node_id in ["searcher-1", "searcher-2"] {
        register(&mut catalog, node_id, NodeRole::Searcher, 0);
    }
    for node_id in ["indexer-1", "indexer-2"] {
        register(&mut catalog, node_id, NodeRole::Indexer, 0);
    }
    for (index, name) in ["docs", "more", "three", "four", "five"]
        .into_iter()
        .enumerate()
    {
        let collection = create(&mut catalog, name, 2);
        catalog.reconcile(1 + index as u64, NODE_TIMEOUT_MS, LEASE_TTL_MS);
        let shard = |shard| {
            catalog
                .shard(ShardKey {
                    collection_id: collection.collection_id,
                    shard,
                })
                .unwrap()
        };
        let searchers: BTreeSet<&String> = (0..2)
            .flat_map(|index| shard(index).searchers.keys())
            .collect();
        assert_eq!(
            searchers.len(),
            2,
            "{name}: one shard on each searcher: {searchers:?}"
        );
        let indexers: BTreeSet<&String> = (0..2)
            .map(|index| &shard(index).lease.as_ref().expect("leased").holder)
            .collect();
        assert_eq!(
            indexers.len(),
            2,
            "{name}: one shard on each indexer: {indexers:?}"
        );
    }
    // Loads stay even overall.
    let mut per_searcher: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, record) in catalog.shards() {
        for node_id in record.searchers.keys() {
            *per_searcher.entry(node_id.as_str()).or_default() += 1;
        }
    }
    assert_eq!(
        per_searcher.values().copied().collect::<Vec<_>>(),
        vec![5, 5]
    );
}

#[test]
fn searcher_assignments_spread_evenly_with_minimal_movement() {
    let mut catalog = Catalog::default();
    let mut spec = spec("docs", 32, 2);
    spec.replication = 2;
    run(&mut catalog, 0, Command::CreateCollection { spec }).expect("create");
    for index in 0..4 {
        register(
            &mut catalog,
            &format!("searcher-{index}"),
            NodeRole::Searcher,
            0,
        );
    }
    catalog.reconcile(1, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    let before: BTreeMap<ShardKey, BTreeSet<String>> = catalog
        .shards()
        .map(|(key, record)| (*key, record.searchers.keys().cloned().collect()))
        .collect();
    assert!(before.values().all(|searchers| searchers.len() == 2));

    register(&mut catalog, "searcher-4", NodeRole::Searcher, 2);
    catalog.reconcile(3, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    let mut moved = 0;
    for (key, record) in catalog.shards() {
        let after: BTreeSet<String> = record.searchers.keys().cloned().collect();
        let lost: Vec<&String> = before[key].difference(&after).collect();
        let gained: Vec<&String> = after.difference(&before[key]).collect();
        // Only the new node can gain, and each shard loses at most what the new node took.
        assert!(gained.iter().all(|node_id| *node_id == "searcher-4"));
        assert_eq!(lost.len(), gained.len());
        moved += gained.len();
    }
    // 64 assignments over 5 searchers: the new one takes its share (12), no more.
    assert_eq!(moved, 12, "moved {moved} of 64 assignments");
    let mut per_searcher: BTreeMap<String, usize> = BTreeMap::new();
    for (_, record) in catalog.shards() {
        for node_id in record.searchers.keys() {
            *per_searcher.entry(node_id.clone()).or_default() += 1;
        }
    }
    assert!(
        per_searcher.values().all(|count| (12..=13).contains(count)),
        "{per_searcher:?}"
    );
}

#[test]
fn readiness_follows_searcher_heartbeats() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "searcher-a", NodeRole::Searcher, 0);
    catalog.reconcile(1, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    assert!(!catalog.shard(shard).unwrap().searchers["searcher-a"]);
    let version = catalog.version();
    run(
        &mut catalog,
        2,
        Command::Heartbeat {
            node_id: "searcher-a".into(),
            ready_shards: vec![shard],
        },
    )
    .expect("heartbeat");
    assert!(catalog.shard(shard).unwrap().searchers["searcher-a"]);
    assert!(catalog.version() > version);
    let unknown = run(
        &mut catalog,
        3,
        Command::Heartbeat {
            node_id: "nobody".into(),
            ready_shards: vec![],
        },
    );
    assert_eq!(unknown.unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn catalog_time_never_runs_backwards() {
    let mut catalog = Catalog::default();
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 10_000);
    register(&mut catalog, "indexer-b", NodeRole::Indexer, 5_000);
    assert_eq!(catalog.clock_ms(), 10_000);
    assert_eq!(catalog.nodes["indexer-b"].last_heartbeat_ms, 10_000);
}

#[test]
fn rendezvous_scores_are_stable() {
    // Fixed values: a change of the hash would move every assignment in a live cluster.
    let shard = ShardKey {
        collection_id: 1,
        shard: 0,
    };
    assert_eq!(
        rendezvous_score("searcher-0", shard),
        rendezvous_score("searcher-0", shard)
    );
    assert_ne!(
        rendezvous_score("searcher-0", shard),
        rendezvous_score("searcher-1", shard)
    );
    let nodes: Vec<String> = (0..10).map(|index| format!("n{index}")).collect();
    let top3 = rendezvous_top(&nodes, shard, 3);
    let top2 = rendezvous_top(&nodes, shard, 2);
    assert_eq!(&top3[..2], &top2[..]);
    // Pinned values.
    assert_eq!(
        rendezvous_score(
            "searcher-0",
            ShardKey {
                collection_id: 7,
                shard: 3
            }
        ),
        0xd675_b50c_9644_dc0c
    );
    assert_eq!(rendezvous_score("indexer-a", shard), 0x821f_e936_31de_39c4);
}

/// The score as first written (FNV-1a and the splitmix64 finalizer inline), the
/// reference the shared hashes must reproduce bit for bit.
fn reference_rendezvous_score(node_id: &str, shard: ShardKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = node_id
        .as_bytes()
        .iter()
        .copied()
        .chain([0xff])
        .chain(shard.collection_id.to_le_bytes())
        .chain(shard.shard.to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

proptest! {
    #[test]
    fn rendezvous_scores_match_the_reference(node_id in ".{0,40}", collection_id: u64, shard: u32) {
        let shard = ShardKey { collection_id, shard };
        prop_assert_eq!(
            rendezvous_score(&node_id, shard),
            reference_rendezvous_score(&node_id, shard)
        );
    }
}

#[test]
fn snapshot_round_trip_keeps_the_catalog() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 2);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    acquire(&mut catalog, shard0(&collection), "indexer-a", 1).expect("lease");
    commit_wal(&mut catalog, shard0(&collection), 1, 1).expect("wal");
    let json = serde_json::to_vec(&catalog).expect("serialize");
    let restored: Catalog = serde_json::from_slice(&json).expect("deserialize");
    assert_eq!(restored, catalog);
}

fn candidate(key: &str) -> crate::model::OrphanCandidate {
    crate::model::OrphanCandidate {
        object_key: key.to_owned(),
        size_bytes: 10,
        last_modified_ms: 1,
    }
}

fn report(catalog: &mut Catalog, now_ms: u64, keys: &[&str], grace_ms: u64) -> (u32, Vec<String>) {
    match run(
        catalog,
        now_ms,
        Command::ReportOrphans {
            orphans: keys.iter().map(|key| candidate(key)).collect(),
            grace_ms,
        },
    ) {
        Ok(Outcome::OrphansReported { new_orphans, due }) => (new_orphans, due),
        other => panic!("report failed: {other:?}"),
    }
}

#[test]
fn orphans_are_reported_kept_and_due_only_while_nothing_references_them() {
    let mut catalog = Catalog::default();
    let collection = create(&mut catalog, "docs", 1);
    let shard = shard0(&collection);
    register(&mut catalog, "indexer-a", NodeRole::Indexer, 1);
    acquire(&mut catalog, shard, "indexer-a", 1).expect("lease");
    commit_wal(&mut catalog, shard, 1, 1).expect("wal");
    let live_wal = catalog.shard(shard).unwrap().manifest.wal_tail[0]
        .key
        .clone();
    // A flush retires the WAL object to the GC list and adds a segment.
    run(
        &mut catalog,
        2,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("s1", 5)],
                    trim_wal_through: Some(WalPosition::from((1, 1))),
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 1_000,
        },
    )
    .expect("flush");
    assert!(catalog.gc.contains_key(&live_wal));
    let keys = [
        "segments/s1.qseg",
        live_wal.as_str(),
        "segments/lost.qseg",
        "wal/lost.wal",
    ];
    assert_eq!(
        catalog.unreferenced(keys),
        vec!["segments/lost.qseg", "wal/lost.wal"],
        "live and GC-listed objects are never orphans"
    );

    let (new_orphans, due) = report(&mut catalog, 100, &keys, 500);
    assert_eq!(new_orphans, 2);
    assert!(due.is_empty(), "nothing is due before its grace: {due:?}");
    let listed: Vec<(&String, &crate::model::OrphanRecord)> = catalog.orphans().collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].1.first_seen_ms, 100);
    assert_eq!(listed[0].1.delete_after_ms, 600);

    // A later sweep keeps the first-seen time; one orphan is gone from the bucket.
    let (new_orphans, due) = report(&mut catalog, 700, &["segments/lost.qseg"], 500);
    assert_eq!(new_orphans, 0);
    assert_eq!(due, vec!["segments/lost.qseg".to_string()]);
    let record = &catalog.orphans["segments/lost.qseg"];
    assert_eq!((record.first_seen_ms, record.delete_after_ms), (100, 600));
    assert!(
        !catalog.orphans.contains_key("wal/lost.wal"),
        "not seen again: dropped"
    );

    // A reported orphan cannot be committed (it may be deleted any moment).
    let before = catalog.clone();
    let refused = run(
        &mut catalog,
        800,
        Command::CommitManifestChange {
            change: ShardManifestChange {
                shard,
                epoch: 1,
                change: ManifestChange {
                    add_segments: vec![segment("lost", 5)],
                    ..ManifestChange::default()
                },
            },
            gc_grace_ms: 1_000,
        },
    )
    .unwrap_err();
    assert_eq!(refused.code, ErrorCode::FailedPrecondition);
    assert!(
        refused.message.contains("segments/lost.qseg"),
        "{}",
        refused.message
    );
    let mut expected = before.clone();
    expected.clock_ms = catalog.clock_ms;
    assert_eq!(catalog, expected, "a refused commit changes nothing");
    report(
        &mut catalog,
        800,
        &["segments/lost.qseg", "wal/late.wal"],
        500,
    );
    let refused = run(
        &mut catalog,
        801,
        Command::CommitWal {
            shard,
            epoch: 1,
            seq: 2,
            object_key: "wal/late.wal".into(),
            rows: 1,
        },
    )
    .unwrap_err();
    assert_eq!(refused.code, ErrorCode::FailedPrecondition);

    // Deleted orphans leave the list; the list survives a snapshot.
    match run(
        &mut catalog,
        900,
        Command::AckOrphans {
            object_keys: vec!["segments/lost.qseg".into(), "never/listed".into()],
        },
    ) {
        Ok(Outcome::OrphansAcked { removed }) => assert_eq!(removed, 1),
        other => panic!("ack failed: {other:?}"),
    }
    let json = serde_json::to_vec(&catalog).expect("serialize");
    let restored: Catalog = serde_json::from_slice(&json).expect("deserialize");
    assert_eq!(restored, catalog);
    assert_eq!(restored.orphans().count(), 1);
}

#[derive(Clone, Debug)]
enum Step {
    Acquire {
        shard: u32,
        node: usize,
    },
    Renew {
        shard: u32,
        node: usize,
        epoch_delta: i8,
    },
    Wal {
        shard: u32,
        epoch_delta: i8,
        seq: u64,
    },
    Flush {
        shard: u32,
        segment: u8,
        remove: Option<u8>,
        trim_seq: Option<u64>,
    },
    Deletes {
        shard: u32,
        segment: u8,
        version: u64,
    },
    Heartbeat {
        node: usize,
    },
    Reconcile,
    Tick {
        advance_ms: u64,
    },
    Ack {
        count: usize,
    },
    Orphans {
        segments: Vec<(u32, u8)>,
        wals: Vec<(u32, u64)>,
    },
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3u32, 0..3usize).prop_map(|(shard, node)| Step::Acquire { shard, node }),
        (0..3u32, 0..3usize, -1..=1i8).prop_map(|(shard, node, epoch_delta)| Step::Renew {
            shard,
            node,
            epoch_delta
        }),
        (0..3u32, -1..=1i8, 0..12u64).prop_map(|(shard, epoch_delta, seq)| Step::Wal {
            shard,
            epoch_delta,
            seq
        }),
        (
            0..3u32,
            0..8u8,
            proptest::option::of(0..8u8),
            proptest::option::of(0..12u64)
        )
            .prop_map(|(shard, segment, remove, trim_seq)| Step::Flush {
                shard,
                segment,
                remove,
                trim_seq
            }),
        (0..3u32, 0..8u8, 0..4u64).prop_map(|(shard, segment, version)| Step::Deletes {
            shard,
            segment,
            version
        }),
        (0..3usize).prop_map(|node| Step::Heartbeat { node }),
        Just(Step::Reconcile),
        (0..8_000u64).prop_map(|advance_ms| Step::Tick { advance_ms }),
        (0..4usize).prop_map(|count| Step::Ack { count }),
        (
            proptest::collection::vec((0..3u32, 0..8u8), 0..4),
            proptest::collection::vec((0..3u32, 0..12u64), 0..4)
        )
            .prop_map(|(segments, wals)| Step::Orphans { segments, wals }),
    ]
}

fn check_invariants(before: &Catalog, after: &Catalog) {
    for (key, record) in after.shards() {
        if let Some(lease) = &record.lease {
            assert!(
                lease.epoch <= record.epoch,
                "lease epoch above the shard epoch"
            );
        }
        let tail_positions: Vec<WalPosition> = record
            .manifest
            .wal_tail
            .iter()
            .map(|entry| entry.position)
            .collect();
        assert!(
            tail_positions.windows(2).all(|pair| pair[0] < pair[1]),
            "wal tail out of order: {tail_positions:?}"
        );
        if let Some(last) = record.manifest.last_committed {
            assert!(tail_positions.iter().all(|position| *position <= last));
        }
        // No object is both live in a manifest and waiting for deletion.
        for segment in record.manifest.segments.iter() {
            assert!(
                !after.gc.contains_key(&segment.key),
                "live segment on gc list"
            );
            if let Some(deletes) = &segment.deletes {
                assert!(
                    !after.gc.contains_key(&deletes.key),
                    "live bitmap on gc list"
                );
            }
        }
        for entry in &record.manifest.wal_tail {
            assert!(
                !after.gc.contains_key(&entry.key),
                "live wal object on gc list"
            );
        }
        // Nothing live or waiting for GC is on the orphan list.
        for segment in record.manifest.segments.iter() {
            assert!(
                !after.orphans.contains_key(&segment.key),
                "live segment reported as an orphan"
            );
            if let Some(deletes) = &segment.deletes {
                assert!(!after.orphans.contains_key(&deletes.key));
            }
        }
        for entry in &record.manifest.wal_tail {
            assert!(
                !after.orphans.contains_key(&entry.key),
                "live wal object reported as an orphan"
            );
        }
        if let Some(previous) = before.shard(*key) {
            assert!(record.epoch >= previous.epoch, "epoch went backwards");
            assert!(
                record.manifest.version >= previous.manifest.version,
                "manifest version went backwards"
            );
            if record.manifest != previous.manifest {
                assert!(record.manifest.version > previous.manifest.version);
            }
        }
    }
    for key in after.orphans.keys() {
        assert!(
            !after.gc.contains_key(key),
            "orphan {key} is on the gc list"
        );
    }
    assert!(after.version() >= before.version());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_command_sequences_keep_the_invariants(
        steps in proptest::collection::vec(step_strategy(), 1..80)
    ) {
        let mut catalog = Catalog::default();
        let collection = create(&mut catalog, "docs", 3);
        let nodes = ["indexer-a", "indexer-b", "indexer-c"];
        for node_id in nodes {
            register(&mut catalog, node_id, NodeRole::Indexer, 1);
        }
        let mut now_ms = 1u64;
        let shard_key = |shard: u32| ShardKey { collection_id: collection.collection_id, shard };
        let current_epoch = |catalog: &Catalog, shard: u32| {
            catalog.shard(shard_key(shard)).map_or(0, |record| record.epoch)
        };
        let with_delta = |epoch: u64, delta: i8| epoch.saturating_add_signed(i64::from(delta));
        for step in steps {
            let command = match step {
                Step::Acquire { shard, node } => Command::AcquireLease {
                    shard: shard_key(shard),
                    node_id: nodes[node].into(),
                    ttl_ms: LEASE_TTL_MS,
                },
                Step::Renew { shard, node, epoch_delta } => Command::RenewLease {
                    shard: shard_key(shard),
                    node_id: nodes[node].into(),
                    epoch: with_delta(current_epoch(&catalog, shard), epoch_delta),
                    ttl_ms: LEASE_TTL_MS,
                },
                Step::Wal { shard, epoch_delta, seq } => {
                    let epoch = with_delta(current_epoch(&catalog, shard), epoch_delta);
                    Command::CommitWal {
                        shard: shard_key(shard),
                        epoch,
                        seq,
                        object_key: format!("wal/{shard}/{epoch}-{seq}"),
                        rows: 1,
                    }
                }
                Step::Flush { shard, segment: segment_number, remove, trim_seq } => {
                    let epoch = current_epoch(&catalog, shard);
                    Command::CommitManifestChange {
                        change: ShardManifestChange {
                            shard: shard_key(shard),
                            epoch,
                            change: ManifestChange {
                            add_segments: vec![segment(&format!("{shard}-{segment_number}"), 5)],
                            remove_segments: remove
                                .map(|number| vec![format!("{shard}-{number}")])
                                .unwrap_or_default(),
                            trim_wal_through: trim_seq.map(|seq| WalPosition::from((epoch, seq))),
                            ..ManifestChange::default()
                            },
                        },
                        gc_grace_ms: 1_000,
                    }
                }
                Step::Deletes { shard, segment: segment_number, version } => {
                    let segment_id = format!("{shard}-{segment_number}");
                    Command::CommitManifestChange {
                        change: ShardManifestChange {
                            shard: shard_key(shard),
                            epoch: current_epoch(&catalog, shard),
                            change: ManifestChange {
                            set_deletes: vec![(segment_id.clone(), DeletesEntry {
                                key: format!("deletes/{segment_id}-{version}"),
                                version,
                                deleted_rows: 0,
                            })],
                            ..ManifestChange::default()
                            },
                        },
                        gc_grace_ms: 1_000,
                    }
                }
                Step::Heartbeat { node } => Command::Heartbeat {
                    node_id: nodes[node].into(),
                    ready_shards: vec![],
                },
                Step::Reconcile => Command::Reconcile {
                    node_timeout_ms: NODE_TIMEOUT_MS,
                    lease_ttl_ms: LEASE_TTL_MS,
                },
                Step::Tick { advance_ms } => {
                    now_ms += advance_ms;
                    continue;
                }
                Step::Ack { count } => Command::AckGc {
                    object_keys: catalog
                        .gc_due(u64::MAX, count)
                        .into_iter()
                        .map(|(key, _)| key)
                        .collect(),
                },
                Step::Orphans { segments, wals } => Command::ReportOrphans {
                    orphans: segments
                        .iter()
                        .map(|(shard, number)| format!("segments/{shard}-{number}.qseg"))
                        .chain(wals.iter().map(|(shard, seq)| {
                            format!("wal/{shard}/{}-{seq}", current_epoch(&catalog, *shard))
                        }))
                        .map(|object_key| crate::model::OrphanCandidate {
                            object_key,
                            size_bytes: 1,
                            last_modified_ms: 0,
                        })
                        .collect(),
                    grace_ms: 2_000,
                },
            };
            let before = catalog.clone();
            let outcome = catalog.apply(&MetaRequest { now_ms, command });
            if outcome.is_err() {
                let mut expected = before.clone();
                expected.clock_ms = catalog.clock_ms;
                prop_assert_eq!(&catalog, &expected, "a rejected command changed the catalog");
            }
            check_invariants(&before, &catalog);
        }
    }
}

/// What the leader logs after a reconciliation: the searcher that went silent
/// is named dead, and its shard's move names the shard, the collection and
/// both searchers (the log once said only `reconciled catalog changes=3`).
#[test]
fn placement_changes_name_the_dead_node_and_the_shard_it_gave_up() {
    let mut catalog = Catalog::default();
    register(&mut catalog, "searcher-1", NodeRole::Searcher, 0);
    register(&mut catalog, "searcher-2", NodeRole::Searcher, 0);
    let collection = create(&mut catalog, "docs", 2);
    catalog.reconcile(1, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    let holder_of = |catalog: &Catalog, shard: u32| -> String {
        let key = ShardKey {
            collection_id: collection.collection_id,
            shard,
        };
        let record = catalog.shard(key).expect("shard");
        record.searchers.keys().next().expect("a searcher").clone()
    };
    let dead_holder = holder_of(&catalog, 0);
    let survivor = if dead_holder == "searcher-1" {
        "searcher-2"
    } else {
        "searcher-1"
    };
    assert_ne!(holder_of(&catalog, 1), dead_holder, "one shard each");
    run(
        &mut catalog,
        4_000,
        Command::Heartbeat {
            node_id: survivor.into(),
            ready_shards: vec![],
        },
    )
    .expect("heartbeat");

    let before = catalog.clone();
    assert!(catalog.reconcile(6_000, NODE_TIMEOUT_MS, LEASE_TTL_MS) > 0);
    let changes = placement_changes(&before, &catalog);
    assert_eq!(
        changes,
        vec![
            PlacementChange::NodeDead {
                node_id: dead_holder.clone(),
                role: NodeRole::Searcher,
                address: format!("{dead_holder}:7000"),
                last_heartbeat_ms: 0,
            },
            PlacementChange::SearchersChanged {
                shard: ShardKey {
                    collection_id: collection.collection_id,
                    shard: 0,
                },
                collection: "docs".into(),
                from: vec![dead_holder.clone()],
                to: vec![survivor.to_owned()],
            },
        ]
    );
    // Nothing changed since: nothing to log.
    let settled = catalog.clone();
    catalog.reconcile(6_500, NODE_TIMEOUT_MS, LEASE_TTL_MS);
    assert_eq!(placement_changes(&settled, &catalog), vec![]);
}
