use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;

use quiver_proto::meta as pb;
use quiver_proto::meta::meta_service_client::MetaServiceClient;

use crate::support::{TcpProxy, TestCluster, bind_listeners, collection_spec, eventually};

/// Every node reaches each peer through its own proxy (`proxies[(from, to)]`), so
/// cutting a node's proxies isolates it in both directions.
// Ignored until fixed: after the partition heals, the old leader — which kept
// raising its term while isolated — sometimes stays a candidate that neither wins
// (its log is behind) nor rejoins, and the healthy leader does not step down; in
// about half the runs on a loaded 2-core machine the cluster is still split after
// 30 s. Safety holds (the isolated node never commits); liveness of the rejoin does
// not. The cause is upstream: openraft rejects a vote request from a candidate whose
// log is behind *before* adopting its higher term (databendlabs/openraft#2117, see
// also #1429), so terms never reconverge. Run with
// `cargo test -p quiver-meta --test cluster -- --ignored`.
#[ignore = "a healed old leader with a higher term does not always rejoin (liveness bug)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_cannot_commit_and_the_majority_moves_on() -> anyhow::Result<()> {
    let listeners = bind_listeners(3).await?;
    let addresses: BTreeMap<u64, String> = listeners
        .iter()
        .map(|(node_id, listener)| Ok((*node_id, listener.local_addr()?.to_string())))
        .collect::<anyhow::Result<_>>()?;
    let mut proxies: BTreeMap<(u64, u64), TcpProxy> = BTreeMap::new();
    for from in 1..=3u64 {
        for to in (1..=3u64).filter(|to| *to != from) {
            proxies.insert((from, to), TcpProxy::start(addresses[&to].clone()).await?);
        }
    }
    let routes: BTreeMap<u64, BTreeMap<u64, String>> = (1..=3u64)
        .map(|from| {
            let peers = (1..=3u64)
                .map(|to| {
                    let address = if to == from {
                        addresses[&from].clone()
                    } else {
                        proxies[&(from, to)].address.to_string()
                    };
                    (to, address)
                })
                .collect();
            (from, peers)
        })
        .collect();
    let cluster = TestCluster::start_on(listeners, |config| {
        config.peers = routes[&config.node_id].clone();
        config.control_interval_ms = 3_600_000;
    })
    .await?;
    let old_leader = cluster.wait_for_leader().await?;
    let client = cluster.client();
    client
        .create_collection(collection_spec("before", 1, 1))
        .await?;
    cluster.wait_for_convergence().await?;
    let old_term = cluster.nodes[&old_leader].status().term;

    // Isolate the leader.
    for ((from, to), proxy) in &proxies {
        if *from == old_leader || *to == old_leader {
            proxy.cut();
        }
    }
    let majority: Vec<u64> = (1..=3).filter(|node_id| *node_id != old_leader).collect();
    let new_leader = eventually(
        "a new leader on the majority side",
        Duration::from_secs(30),
        || async {
            majority
                .iter()
                .find(|node_id| cluster.nodes[*node_id].is_leader())
                .copied()
        },
    )
    .await
    .with_context(|| cluster.describe())?;
    assert!(cluster.nodes[&new_leader].status().term > old_term);

    // The old leader cannot commit: its write times out or is refused.
    let mut isolated =
        MetaServiceClient::connect(format!("http://{}", addresses[&old_leader])).await?;
    let isolated_write = tokio::time::timeout(
        Duration::from_secs(10),
        isolated.create_collection(pb::CreateCollectionRequest {
            spec: Some(collection_spec("written-to-the-isolated-leader", 1, 1)),
        }),
    )
    .await?;
    let status = isolated_write.expect_err("an isolated leader must not commit");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // A linearizable read on it fails too.
    let isolated_read = isolated
        .get_manifest(pb::GetManifestRequest {
            shard: Some(pb::ShardRef {
                collection_id: 1,
                shard: 0,
            }),
            linearizable: true,
        })
        .await;
    assert!(isolated_read.is_err(), "a read-index round needs a quorum");

    // The majority keeps accepting writes.
    let majority_client = crate::support::test_client(
        majority
            .iter()
            .map(|node_id| addresses[node_id].clone())
            .collect(),
    );
    for index in 0..5 {
        majority_client
            .create_collection(collection_spec(&format!("during-{index}"), 1, 1))
            .await?;
    }

    // Heal: one history, without the isolated leader's write.
    for proxy in proxies.values() {
        proxy.heal();
    }
    let catalog = cluster.wait_for_convergence().await?;
    let names: Vec<&str> = catalog
        .collections()
        .map(|collection| collection.spec.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "before", "during-0", "during-1", "during-2", "during-3", "during-4"
        ]
    );
    let leader = cluster.wait_for_leader().await?;
    assert!(cluster.nodes[&leader].status().term > old_term);
    client
        .create_collection(collection_spec("after-heal", 1, 1))
        .await?;
    let catalog = cluster.wait_for_convergence().await?;
    assert!(catalog.collection("after-heal").is_some());
    cluster.shutdown().await
}
