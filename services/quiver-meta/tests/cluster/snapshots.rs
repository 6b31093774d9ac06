use std::time::Duration;

use quiver_meta::{MetaConfig, MetaServer};
use tokio::net::TcpListener;

use crate::support::{TestCluster, collection_spec, eventually, init_test_logs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_compact_the_log_and_lagging_or_new_nodes_catch_up() -> anyhow::Result<()> {
    init_test_logs();
    let mut cluster = TestCluster::start(3, |config| {
        config.snapshot_logs = 20;
        config.logs_to_keep = 5;
        config.control_interval_ms = 3_600_000;
    })
    .await?;
    cluster.wait_for_leader().await?;
    let client = cluster.client();

    // Node 3 misses a stretch of writes long enough to be compacted away.
    let lagging = 3;
    cluster.stop(lagging).await?;
    for index in 0..80 {
        client
            .create_collection(collection_spec(&format!("c{index:03}"), 1, 1))
            .await?;
    }
    // The leader keeps log entries a stopped follower still needs; the live
    // follower snapshots and compacts its own log.
    let leader = cluster.wait_for_leader().await?;
    let live_follower = (1..=3)
        .find(|node_id| *node_id != leader && *node_id != lagging)
        .expect("a follower");
    eventually(
        "a follower snapshot and a compacted log",
        Duration::from_secs(10),
        || async {
            let node = &cluster.nodes[&live_follower];
            let entries = node.metrics().raft_log_entries.get();
            (node.status().snapshot_index >= 20 && entries < 40).then_some(())
        },
    )
    .await?;

    cluster.restart(lagging).await?;
    let catalog = cluster.wait_for_convergence().await?;
    assert_eq!(catalog.collections().count(), 80);

    // With every follower caught up, the leader compacts too.
    for index in 80..110 {
        client
            .create_collection(collection_spec(&format!("c{index:03}"), 1, 1))
            .await?;
    }
    let leader = cluster.wait_for_leader().await?;
    eventually(
        "the leader's log compacted",
        Duration::from_secs(10),
        || async {
            let node = &cluster.nodes[&leader];
            let entries = node.metrics().raft_log_entries.get();
            (node.status().snapshot_index >= 80 && entries < 40).then_some(())
        },
    )
    .await?;

    // A new node joins as a learner (it can only catch up from the snapshot), is
    // promoted, then removed again.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    let mut config = MetaConfig::new(4, cluster.directory.path().join("node-4"), address.clone())
        .with_fast_timings();
    config.snapshot_logs = 20;
    config.logs_to_keep = 5;
    let learner = MetaServer::start_with_listener(config, listener, None, None).await?;
    let members = client.add_learner(4, &address).await?;
    assert!(
        members.iter().any(|member| member.id == 4
            && member.role == quiver_proto::meta::MemberRole::Learner as i32)
    );
    eventually(
        "the learner to catch up",
        Duration::from_secs(15),
        || async { (learner.catalog().collections().count() == 110).then_some(()) },
    )
    .await?;
    assert!(
        learner.status().snapshot_index >= 80,
        "the learner was seeded by a snapshot (log behind it was purged)"
    );
    let members = client.promote_voter(4).await?;
    let voters = members
        .iter()
        .filter(|member| member.role == quiver_proto::meta::MemberRole::Voter as i32)
        .count();
    assert_eq!(voters, 4);
    client
        .create_collection(collection_spec("after-promotion", 1, 1))
        .await?;
    eventually(
        "the new voter to apply new writes",
        Duration::from_secs(10),
        || async { learner.catalog().collection("after-promotion").map(|_| ()) },
    )
    .await?;
    let members = client.remove_member(4).await?;
    assert_eq!(members.len(), 3);
    learner.shutdown().await?;

    // A restarted leader rebuilds its catalog from its snapshot plus the log.
    let leader = cluster.wait_for_leader().await?;
    let before = cluster.nodes[&leader].catalog();
    cluster.stop(leader).await?;
    cluster.restart(leader).await?;
    let restarted = eventually(
        "the restarted node's catalog",
        Duration::from_secs(15),
        || async {
            let catalog = cluster.nodes[&leader].catalog();
            (catalog.collections().count() == before.collections().count()).then_some(catalog)
        },
    )
    .await?;
    assert_eq!(
        restarted.collections().cloned().collect::<Vec<_>>(),
        before.collections().cloned().collect::<Vec<_>>()
    );
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_snapshot_covers_a_quiet_log() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1, |config| {
        config.snapshot_logs = 1_000_000;
        config.snapshot_interval_ms = 200;
    })
    .await?;
    cluster.wait_for_leader().await?;
    let client = cluster.client();
    for index in 0..3 {
        client
            .create_collection(collection_spec(&format!("quiet-{index}"), 1, 1))
            .await?;
    }
    let applied = cluster.nodes[&1].status().applied_index;
    eventually("a periodic snapshot", Duration::from_secs(10), || async {
        (cluster.nodes[&1].status().snapshot_index >= applied).then_some(())
    })
    .await?;
    cluster.shutdown().await
}
