//! In-process metadata clusters on loopback ports, and a TCP proxy that can cut links.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use quiver_meta::{Catalog, MetaClient, MetaClientConfig, MetaConfig, MetaServer};
use quiver_proto::meta as pb;
pub use quiver_test_support::eventually;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Installs a log subscriber writing to the test's output, filtered by `RUST_LOG`
/// (nothing is logged when it is unset); later calls do nothing.
pub fn init_test_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
}

/// A collection spec with `shards` shards.
pub fn collection_spec(name: &str, shards: u32, replication: u32) -> pb::CollectionSpec {
    pb::CollectionSpec {
        name: name.to_owned(),
        dimension: 16,
        metric: pb::Metric::Cosine as i32,
        id_type: pb::IdType::U64 as i32,
        shards,
        replication,
        index: None,
        payload_schema: vec![pb::PayloadField {
            name: "lang".into(),
            kind: pb::FieldKind::Keyword as i32,
        }],
    }
}

/// Several metadata nodes in this process.
pub struct TestCluster {
    pub directory: tempfile::TempDir,
    pub configs: BTreeMap<u64, MetaConfig>,
    pub nodes: BTreeMap<u64, MetaServer>,
}

impl TestCluster {
    /// Starts `size` nodes with fast timings; node 1 initializes the cluster.
    pub async fn start(
        size: u64,
        customize: impl Fn(&mut MetaConfig),
    ) -> anyhow::Result<TestCluster> {
        let listeners = bind_listeners(size).await?;
        TestCluster::start_on(listeners, customize).await
    }

    /// Starts nodes on the given listeners; node 1 initializes the cluster.
    pub async fn start_on(
        listeners: BTreeMap<u64, TcpListener>,
        customize: impl Fn(&mut MetaConfig),
    ) -> anyhow::Result<TestCluster> {
        let directory = tempfile::tempdir()?;
        let size = listeners.len() as u64;
        let peers: BTreeMap<u64, String> = listeners
            .iter()
            .map(|(node_id, listener)| Ok((*node_id, listener.local_addr()?.to_string())))
            .collect::<anyhow::Result<_>>()?;
        let mut configs = BTreeMap::new();
        for node_id in 1..=size {
            let mut config = MetaConfig::new(
                node_id,
                directory.path().join(format!("node-{node_id}")),
                peers[&node_id].clone(),
            )
            .with_fast_timings();
            config.peers = peers.clone();
            config.init = node_id == 1;
            customize(&mut config);
            configs.insert(node_id, config);
        }
        let mut cluster = TestCluster {
            directory,
            configs,
            nodes: BTreeMap::new(),
        };
        for (node_id, listener) in listeners {
            let config = cluster.configs[&node_id].clone();
            let server = MetaServer::start_with_listener(config, listener, None, None).await?;
            cluster.nodes.insert(node_id, server);
        }
        Ok(cluster)
    }

    /// Returns the gRPC address of `node_id`.
    pub fn address(&self, node_id: u64) -> String {
        self.configs[&node_id].listen.clone()
    }

    /// Returns a client knowing every node.
    pub fn client(&self) -> MetaClient {
        let addresses = self
            .configs
            .values()
            .map(|config| config.listen.clone())
            .collect();
        test_client(addresses)
    }

    /// Returns a client knowing only `node_id` (it follows leader redirects).
    pub fn client_of(&self, node_id: u64) -> MetaClient {
        test_client(vec![self.address(node_id)])
    }

    /// Describes every running node's Raft view, for failure messages.
    pub fn describe(&self) -> String {
        self.nodes
            .values()
            .map(|node| {
                let status = node.status();
                format!(
                    "node {}: {} leader {} term {} last_log {} committed {} applied {} catalog version {}",
                    status.node_id,
                    status.raft_state,
                    status.leader_id,
                    status.term,
                    status.last_log_index,
                    status.commit_index,
                    status.applied_index,
                    status.catalog_version
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Waits until every running node reports the same leader, and returns it.
    pub async fn wait_for_leader(&self) -> anyhow::Result<u64> {
        eventually("an agreed leader", Duration::from_secs(30), || async {
            let leaders: Vec<Option<u64>> = self
                .nodes
                .values()
                .map(MetaServer::current_leader)
                .collect();
            let first = leaders.first().copied().flatten()?;
            let agreed = leaders.iter().all(|leader| *leader == Some(first));
            (agreed && self.nodes.contains_key(&first) && self.nodes[&first].is_leader())
                .then_some(first)
        })
        .await
        .with_context(|| self.describe())
    }

    /// Waits until every running node has applied the same catalog, and returns it.
    pub async fn wait_for_convergence(&self) -> anyhow::Result<Catalog> {
        eventually(
            "identical catalogs on every node",
            Duration::from_secs(30),
            || async {
                let catalogs: Vec<Catalog> = self.nodes.values().map(MetaServer::catalog).collect();
                let first = catalogs.first()?.clone();
                catalogs
                    .iter()
                    .all(|catalog| *catalog == first)
                    .then_some(first)
            },
        )
        .await
        .with_context(|| self.describe())
    }

    /// Stops `node_id` cleanly (its data stays).
    pub async fn stop(&mut self, node_id: u64) -> anyhow::Result<()> {
        let server = self.nodes.remove(&node_id).context("node not running")?;
        server.shutdown().await?;
        Ok(())
    }

    /// Starts `node_id` again on its address and data directory.
    pub async fn restart(&mut self, node_id: u64) -> anyhow::Result<()> {
        let config = self.configs[&node_id].clone();
        let listener = eventually(
            "the node's port to be free",
            Duration::from_secs(10),
            || {
                let address = config.listen.clone();
                async move { TcpListener::bind(&address).await.ok() }
            },
        )
        .await?;
        let server = MetaServer::start_with_listener(config, listener, None, None).await?;
        self.nodes.insert(node_id, server);
        Ok(())
    }

    /// Stops every node.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let node_ids: Vec<u64> = self.nodes.keys().copied().collect();
        for node_id in node_ids {
            self.stop(node_id).await?;
        }
        Ok(())
    }
}

/// Binds `size` loopback listeners for nodes 1..=size.
pub async fn bind_listeners(size: u64) -> anyhow::Result<BTreeMap<u64, TcpListener>> {
    let mut listeners = BTreeMap::new();
    for node_id in 1..=size {
        listeners.insert(node_id, TcpListener::bind("127.0.0.1:0").await?);
    }
    Ok(listeners)
}

/// A client with short timeouts for tests.
pub fn test_client(addresses: Vec<String>) -> MetaClient {
    let mut config = MetaClientConfig::new(addresses);
    config.attempt_timeout = Duration::from_secs(3);
    config.connect_timeout = Duration::from_millis(300);
    config.retry_deadline = Duration::from_secs(20);
    MetaClient::new(config).expect("test client config is valid")
}

/// A TCP proxy whose link can be cut (existing connections are dropped and new ones
/// refused) and healed.
pub struct TcpProxy {
    pub address: SocketAddr,
    cut: Arc<AtomicBool>,
    cut_sender: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy on a loopback port forwarding to `target`.
    pub async fn start(target: String) -> anyhow::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (cut_sender, cut_receiver) = watch::channel(0u64);
        let task = {
            let cut = cut.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((inbound, _)) = listener.accept().await else {
                        break;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let target = target.clone();
                    let mut cut_receiver = cut_receiver.clone();
                    tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(&target).await else {
                            return;
                        };
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let (mut inbound, mut outbound) = (inbound, outbound);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut_receiver.changed() => {}
                        }
                    });
                }
            })
        };
        Ok(TcpProxy {
            address,
            cut,
            cut_sender,
            task,
        })
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cut_sender.send_modify(|generation| *generation += 1);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
