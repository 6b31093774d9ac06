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
