use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use quiver_proto::meta as pb;
use quiver_proto::meta::meta_service_client::MetaServiceClient;

use crate::support::{
    TcpProxy, TestCluster, bind_listeners, collection_spec, eventually, init_test_logs,
};

/// A three-node cluster in which every node reaches each peer through its own proxy
/// (`proxies[(from, to)]`), so cutting a node's proxies isolates it in both
/// directions.
struct ProxiedCluster {
    cluster: TestCluster,
    addresses: BTreeMap<u64, String>,
    proxies: BTreeMap<(u64, u64), TcpProxy>,
}

impl ProxiedCluster {
    async fn start() -> anyhow::Result<ProxiedCluster> {
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
        Ok(ProxiedCluster {
            cluster,
            addresses,
            proxies,
        })
    }

    fn isolate(&self, node_id: u64) {
        for ((from, to), proxy) in &self.proxies {
            if *from == node_id || *to == node_id {
                proxy.cut();
            }
        }
    }

    fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.heal();
        }
    }

    fn term(&self, node_id: u64) -> u64 {
        self.cluster.nodes[&node_id].status().term
    }

    /// Returns how many pre-vote rounds `node_id` ran that no quorum granted: one
    /// per election timeout it reached as a follower without hearing from a leader.
    fn refused_pre_votes(&self, node_id: u64) -> u64 {
        self.cluster.nodes[&node_id]
            .metrics()
            .pre_vote_rounds_total
            .with_label_values(&["refused"])
            .get()
    }

    /// Returns how many times `node_id` stepped down as a leader no quorum
    /// acknowledged for two leader leases (two maximal election timeouts).
    fn step_downs(&self, node_id: u64) -> u64 {
        self.cluster.nodes[&node_id]
            .metrics()
            .leader_step_downs_total
            .get()
    }

    /// Waits until `count` of the isolated `node_id` (one of the counters above)
    /// has grown by `rounds` over `before`: proof, from the node's own clock, that
    /// it went through several election timeouts without a leader — each time it
    /// would have campaigned (raised its term) without pre-vote — so what is
    /// checked afterwards held through all of them, however slow the machine.
    async fn wait_for_election_timeouts(
        &self,
        node_id: u64,
        count: fn(&ProxiedCluster, u64) -> u64,
        before: u64,
        rounds: u64,
    ) -> anyhow::Result<()> {
        eventually(
            "the isolated node to go through several election timeouts",
            Duration::from_secs(60),
            || async { (count(self, node_id) >= before + rounds).then_some(()) },
        )
        .await
        .with_context(|| self.cluster.describe())
    }

    /// Waits for a leader among `candidates` and returns it.
    async fn wait_for_leader_among(&self, candidates: &[u64]) -> anyhow::Result<u64> {
        eventually(
            "a leader on the majority side",
            Duration::from_secs(30),
            || async {
                candidates
                    .iter()
                    .find(|node_id| self.cluster.nodes[*node_id].is_leader())
                    .copied()
            },
        )
        .await
        .with_context(|| self.cluster.describe())
    }

    /// Waits until every node follows one leader at one term with one history, and
    /// returns the leader and that history; prints how long it took after `healed_at`.
    async fn wait_for_one_leader_and_history(
        &self,
        healed_at: Instant,
    ) -> anyhow::Result<(u64, quiver_meta::Catalog)> {
        let leader = eventually(
            "one leader at one term on every node",
            Duration::from_secs(30),
            || async {
                let statuses: Vec<pb::ClusterStatusResponse> = self
                    .cluster
                    .nodes
                    .values()
                    .map(quiver_meta::MetaServer::status)
                    .collect();
                let first = statuses.first()?;
                let agreed = statuses
                    .iter()
                    .all(|status| status.leader_id == first.leader_id && status.term == first.term);
                (agreed && first.leader_id != 0 && self.cluster.nodes[&first.leader_id].is_leader())
                    .then_some(first.leader_id)
            },
        )
        .await
        .with_context(|| self.cluster.describe())?;
        let catalog = self.cluster.wait_for_convergence().await?;
        eprintln!(
            "one leader and one history {:?} after healing: {}",
            healed_at.elapsed(),
            self.cluster.describe()
        );
        Ok((leader, catalog))
    }
}

fn collection_names(catalog: &quiver_meta::Catalog) -> Vec<&str> {
    catalog
        .collections()
        .map(|collection| collection.spec.name.as_str())
        .collect()
}

/// How many election timeouts (300–600 ms in tests) an isolated follower runs
/// through before the test checks that it never campaigned.
const SEVERAL_ELECTION_TIMEOUTS: u64 = 4;

/// How many times an isolated leader steps down (each after two leader leases
/// without a quorum, ~4 s for two) before the test checks it never campaigned.
const SEVERAL_STEP_DOWNS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_cannot_commit_and_the_majority_moves_on() -> anyhow::Result<()> {
    init_test_logs();
    let proxied = ProxiedCluster::start().await?;
    let cluster = &proxied.cluster;
    let old_leader = cluster.wait_for_leader().await?;
    let client = cluster.client();
    client
        .create_collection(collection_spec("before", 1, 1))
        .await?;
    cluster.wait_for_convergence().await?;
    let old_term = proxied.term(old_leader);
    let step_downs_before = proxied.step_downs(old_leader);

    proxied.isolate(old_leader);
    let majority: Vec<u64> = (1..=3).filter(|node_id| *node_id != old_leader).collect();
    let new_leader = proxied.wait_for_leader_among(&majority).await?;
    assert!(proxied.term(new_leader) > old_term);

    // The old leader cannot commit: its write times out or is refused.
    let mut isolated =
        MetaServiceClient::connect(format!("http://{}", proxied.addresses[&old_leader])).await?;
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
            .map(|node_id| proxied.addresses[node_id].clone())
            .collect(),
    );
    for index in 0..5 {
        majority_client
            .create_collection(collection_spec(&format!("during-{index}"), 1, 1))
            .await?;
    }
    // The isolated leader lost its quorum for several election timeouts (it
    // stepped down, check-quorum, again and again); without a quorum to pre-vote
    // for it, it never campaigned.
    proxied
        .wait_for_election_timeouts(
            old_leader,
            ProxiedCluster::step_downs,
            step_downs_before,
            SEVERAL_STEP_DOWNS,
        )
        .await?;
    assert!(
        proxied.term(old_leader) <= old_term,
        "the isolated node raised its term: {}",
        cluster.describe()
    );

    // Heal: one leader, one history, without the isolated leader's write.
    proxied.heal();
    let healed_at = Instant::now();
    let (leader, catalog) = proxied.wait_for_one_leader_and_history(healed_at).await?;
    assert_eq!(
        collection_names(&catalog),
        [
            "before", "during-0", "during-1", "during-2", "during-3", "during-4"
        ]
    );
    assert!(proxied.term(leader) > old_term);
    client
        .create_collection(collection_spec("after-heal", 1, 1))
        .await?;
    let catalog = cluster.wait_for_convergence().await?;
    assert!(catalog.collection("after-heal").is_some());
    proxied.cluster.shutdown().await
}

/// An isolated follower keeps timing out. Without pre-vote it raised its term with
/// every timeout, and after healing its vote requests (higher term, shorter log) were
/// refused without the others adopting its term, while its refusals of the leader's
/// appends kept deposing the leader: the cluster could stay split for good
/// (databendlabs/openraft#2117, #1429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_follower_rejoins_without_deposing_the_leader() -> anyhow::Result<()> {
    init_test_logs();
    let proxied = ProxiedCluster::start().await?;
    let cluster = &proxied.cluster;
    let leader = cluster.wait_for_leader().await?;
    let client = cluster.client();
    client
        .create_collection(collection_spec("before", 1, 1))
        .await?;
    cluster.wait_for_convergence().await?;
    let follower = (1..=3)
        .find(|node_id| *node_id != leader)
        .context("a follower")?;
    let refused_before = proxied.refused_pre_votes(follower);

    proxied.isolate(follower);
    let majority: Vec<u64> = (1..=3).filter(|node_id| *node_id != follower).collect();
    let majority_client = crate::support::test_client(
        majority
            .iter()
            .map(|node_id| proxied.addresses[node_id].clone())
            .collect(),
    );
    for index in 0..3 {
        majority_client
            .create_collection(collection_spec(&format!("during-{index}"), 1, 1))
            .await?;
    }
    proxied
        .wait_for_election_timeouts(
            follower,
            ProxiedCluster::refused_pre_votes,
            refused_before,
            SEVERAL_ELECTION_TIMEOUTS,
        )
        .await?;
    let majority_leader = proxied.wait_for_leader_among(&majority).await?;
    let majority_term = proxied.term(majority_leader);
    assert!(
        proxied.term(follower) <= majority_term,
        "the isolated follower raised its term: {}",
        cluster.describe()
    );

    proxied.heal();
    let healed_at = Instant::now();
    let (_, catalog) = proxied.wait_for_one_leader_and_history(healed_at).await?;
    assert_eq!(
        collection_names(&catalog),
        ["before", "during-0", "during-1", "during-2"]
    );
    client
        .create_collection(collection_spec("after-heal", 1, 1))
        .await?;
    let catalog = cluster.wait_for_convergence().await?;
    assert!(catalog.collection("after-heal").is_some());
    proxied.cluster.shutdown().await
}
