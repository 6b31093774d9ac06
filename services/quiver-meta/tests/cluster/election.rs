use std::time::Duration;

use crate::support::{TestCluster, collection_spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_and_accept_writes_through_any_node() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3, |_| {}).await?;
    let leader = cluster.wait_for_leader().await?;
    assert!((1..=3).contains(&leader));

    // A client that knows only one node, leader or follower, still writes.
    for node_id in 1..=3 {
        let client = cluster.client_of(node_id);
        let response = client
            .create_collection(collection_spec(&format!("via-node-{node_id}"), 2, 1))
            .await?;
        assert!(response.created);
    }
    let catalog = cluster.wait_for_convergence().await?;
    let names: Vec<&str> = catalog
        .collections()
        .map(|collection| collection.spec.name.as_str())
        .collect();
    assert_eq!(names, ["via-node-1", "via-node-2", "via-node-3"]);

    // A follower refuses a write itself and names the leader.
    let follower = (1..=3)
        .find(|node_id| *node_id != leader)
        .expect("a follower");
    let mut raw = quiver_proto::meta::meta_service_client::MetaServiceClient::connect(format!(
        "http://{}",
        cluster.address(follower)
    ))
    .await?;
    let refused = raw
        .create_collection(quiver_proto::meta::CreateCollectionRequest {
            spec: Some(collection_spec("refused", 1, 1)),
        })
        .await
        .expect_err("a follower must refuse writes");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let leader_header = refused
        .metadata()
        .get(quiver_proto::LEADER_ADDRESS_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    assert_eq!(leader_header, Some(cluster.address(leader)));

    let status = cluster.client().cluster_status().await?;
    assert_eq!(status.leader_id, leader);
    assert_eq!(status.members.len(), 3);
    assert!(status.commit_index >= status.applied_index.min(1));
    assert!(status.term >= 1);
    tokio::time::timeout(Duration::from_secs(20), cluster.shutdown()).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_full_restart_keeps_all_state() -> anyhow::Result<()> {
    let mut cluster = TestCluster::start(3, |_| {}).await?;
    cluster.wait_for_leader().await?;
    let client = cluster.client();
    for index in 0..10 {
        client
            .create_collection(collection_spec(&format!("c{index}"), 1, 1))
            .await?;
    }
    let before = cluster.wait_for_convergence().await?;
    for node_id in 1..=3 {
        cluster.stop(node_id).await?;
    }
    for node_id in 1..=3 {
        cluster.restart(node_id).await?;
    }
    cluster.wait_for_leader().await?;
    let after = cluster.wait_for_convergence().await?;
    assert_eq!(after.collections().count(), 10);
    assert_eq!(
        after.collections().cloned().collect::<Vec<_>>(),
        before.collections().cloned().collect::<Vec<_>>()
    );
    // And it keeps working.
    cluster
        .client()
        .create_collection(collection_spec("after-restart", 1, 1))
        .await?;
    cluster.shutdown().await
}

/// Check-quorum must not strand a cluster. With both followers down the leader
/// steps down (no quorum acknowledges it) and stops sending. A write proposed
/// meanwhile sits in its log only, so the follower that comes back first cannot
/// win an election without the old leader's vote — and the old leader refuses
/// it, its log being longer. The old leader therefore resumes sending after a
/// while, the returned follower acknowledges, and writes go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_both_followers_recovers_when_one_returns() -> anyhow::Result<()> {
    use crate::support::{eventually, test_client};

    let mut cluster = TestCluster::start(3, |_| {}).await?;
    let leader = cluster.wait_for_leader().await?;
    cluster
        .client()
        .create_collection(collection_spec("before", 1, 1))
        .await?;
    let followers: Vec<u64> = (1..=3).filter(|node_id| *node_id != leader).collect();
    for follower in &followers {
        cluster.stop(*follower).await?;
    }
    // Proposed before the leader knows it is cut off: in its log, uncommitted.
    let leader_only = test_client(vec![cluster.address(leader)]);
    let pending = tokio::spawn(async move {
        leader_only
            .create_collection(collection_spec("pending", 1, 1))
            .await
    });
    eventually(
        "the leader to step down",
        Duration::from_secs(20),
        || async {
            (cluster.nodes[&leader]
                .metrics()
                .leader_step_downs_total
                .get()
                >= 1)
                .then_some(())
        },
    )
    .await?;
    cluster.restart(followers[0]).await?;
    let client = test_client(vec![cluster.address(leader), cluster.address(followers[0])]);
    eventually(
        "a write with one follower back",
        Duration::from_secs(30),
        || async {
            client
                .create_collection(collection_spec("after", 1, 1))
                .await
                .ok()
        },
    )
    .await?;
    let _ = pending.await;
    let status = client.cluster_status().await?;
    assert!(status.leader_id == leader || status.leader_id == followers[0]);
    tokio::time::timeout(Duration::from_secs(20), cluster.shutdown()).await??;
    Ok(())
}
