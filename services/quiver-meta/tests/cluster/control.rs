use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use quiver_meta::{MetaClient, NodeRole, NodeState};
use quiver_proto::meta as pb;

use crate::support::{TestCluster, collection_spec, eventually};

/// Heartbeats for `node_id` every 100 ms until `alive` turns false; searchers report
/// every shard of the collection as ready.
fn heartbeat_loop(
    client: MetaClient,
    node_id: &'static str,
    collection_id: u64,
    alive: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        while alive.load(Ordering::SeqCst) {
            let ready_shards = (0..4)
                .map(|shard| pb::ShardRef {
                    collection_id,
                    shard,
                })
                .collect();
            let _ = client
                .heartbeat(pb::HeartbeatRequest {
                    node_id: node_id.into(),
                    ready_shards,
                })
                .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_loop_expires_dead_nodes_and_rebalances() -> anyhow::Result<()> {
    let cluster = TestCluster::start(3, |config| {
        config.node_timeout_ms = 800;
        config.lease_ttl_ms = 2_000;
    })
    .await?;
    cluster.wait_for_leader().await?;
    let client = cluster.client();
    let collection = client
        .create_collection(collection_spec("docs", 4, 2))
        .await?
        .collection
        .expect("collection");
    let nodes = [
        ("indexer-a", pb::NodeRole::Indexer),
        ("indexer-b", pb::NodeRole::Indexer),
        ("searcher-1", pb::NodeRole::Searcher),
        ("searcher-2", pb::NodeRole::Searcher),
        ("searcher-3", pb::NodeRole::Searcher),
    ];
    let mut alive_flags = BTreeMap::new();
    for (node_id, role) in nodes {
        client
            .register_node(pb::RegisterNodeRequest {
                node_id: node_id.into(),
                role: role as i32,
                address: format!("{node_id}:7300"),
            })
            .await?;
        let alive = Arc::new(AtomicBool::new(true));
        heartbeat_loop(
            client.clone(),
            node_id,
            collection.collection_id,
            alive.clone(),
        );
        alive_flags.insert(node_id, alive);
    }

    // Every shard gets a writer (2 + 2) and two ready searchers.
    let catalog = eventually(
        "leases and searchers assigned",
        Duration::from_secs(15),
        || async {
            let catalog = cluster.nodes.values().next()?.catalog();
            let mut per_indexer: BTreeMap<String, usize> = BTreeMap::new();
            for (_, record) in catalog.shards() {
                *per_indexer
                    .entry(record.lease.as_ref()?.holder.clone())
                    .or_default() += 1;
                if record.searchers.len() != 2 || !record.searchers.values().all(|ready| *ready) {
                    return None;
                }
            }
            (per_indexer.values().copied().collect::<Vec<_>>() == [2, 2]).then_some(catalog)
        },
    )
    .await?;
    let epochs_before: BTreeMap<u32, u64> = catalog
        .shards()
        .map(|(key, record)| (key.shard, record.epoch))
        .collect();
    let a_shards: Vec<u32> = catalog
        .shards()
        .filter(|(_, record)| {
            record
                .lease
                .as_ref()
                .is_some_and(|lease| lease.holder == "indexer-a")
        })
        .map(|(key, _)| key.shard)
        .collect();

    // indexer-a and searcher-1 go silent.
    alive_flags["indexer-a"].store(false, Ordering::SeqCst);
    alive_flags["searcher-1"].store(false, Ordering::SeqCst);
    let catalog = eventually("dead nodes handled", Duration::from_secs(15), || async {
        let catalog = cluster.nodes.values().next()?.catalog();
        let nodes: BTreeMap<&str, NodeState> = catalog
            .nodes()
            .map(|node| (node.node_id.as_str(), node.state))
            .collect();
        if nodes["indexer-a"] != NodeState::Dead || nodes["searcher-1"] != NodeState::Dead {
            return None;
        }
        let all_on_b = catalog.shards().all(|(_, record)| {
            record
                .lease
                .as_ref()
                .is_some_and(|lease| lease.holder == "indexer-b")
        });
        let searchers_ok = catalog.shards().all(|(_, record)| {
            record.searchers.len() == 2 && !record.searchers.contains_key("searcher-1")
        });
        (all_on_b && searchers_ok).then_some(catalog)
    })
    .await?;
    for (key, record) in catalog.shards() {
        let lease = record.lease.as_ref().expect("leased");
        if a_shards.contains(&key.shard) {
            assert_eq!(
                lease.epoch,
                epochs_before[&key.shard] + 1,
                "takeover increments the epoch"
            );
        } else {
            assert_eq!(
                lease.epoch, epochs_before[&key.shard],
                "untouched shards keep their epoch"
            );
        }
    }
    assert!(
        catalog
            .nodes()
            .any(|node| node.role == NodeRole::Searcher && node.state == NodeState::Alive)
    );

    // A dead node that heartbeats again is alive again.
    alive_flags["searcher-1"].store(true, Ordering::SeqCst);
    heartbeat_loop(
        client.clone(),
        "searcher-1",
        collection.collection_id,
        alive_flags["searcher-1"].clone(),
    );
    eventually(
        "searcher-1 alive again",
        Duration::from_secs(10),
        || async {
            let catalog = cluster.nodes.values().next()?.catalog();
            catalog
                .nodes()
                .any(|node| node.node_id == "searcher-1" && node.state == NodeState::Alive)
                .then_some(())
        },
    )
    .await?;
    for alive in alive_flags.values() {
        alive.store(false, Ordering::SeqCst);
    }
    cluster.shutdown().await
}
