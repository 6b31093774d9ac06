//! Real `quiver meta` processes on loopback ports.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use quiver_meta::{MetaClient, MetaClientConfig};
use quiver_proto::meta as pb;
pub use quiver_test_support::eventually;
pub use quiver_test_support::process::free_address;

/// Raft and control-loop timings short enough for tests.
pub const FAST_CONFIG: &str = r#"
log_format = "text"

[meta]
heartbeat_interval_ms = 50
election_timeout_min_ms = 300
election_timeout_max_ms = 600
control_interval_ms = 200
node_timeout_ms = 60000
lease_ttl_ms = 600000
proposal_timeout_ms = 2000
connect_timeout_ms = 300
snapshot_logs = 200
logs_to_keep = 50
"#;

/// A client with short attempt timeouts.
pub fn client_for(addresses: Vec<String>) -> MetaClient {
    let mut config = MetaClientConfig::new(addresses);
    config.attempt_timeout = Duration::from_secs(3);
    config.connect_timeout = Duration::from_millis(300);
    config.retry_deadline = Duration::from_secs(30);
    MetaClient::new(config).expect("valid client config")
}

pub struct MetaProcess {
    pub node_id: u64,
    pub address: String,
    pub http_address: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

/// Three (or more) `quiver meta` processes; node 1 initializes the cluster.
pub struct ProcessCluster {
    /// Keeps the data directories alive as long as the cluster.
    _directory: tempfile::TempDir,
    pub config_path: PathBuf,
    pub peers: String,
    pub nodes: BTreeMap<u64, MetaProcess>,
}

impl ProcessCluster {
    pub fn start(size: u64) -> anyhow::Result<ProcessCluster> {
        ProcessCluster::start_with_config(size, FAST_CONFIG)
    }

    /// Starts `size` nodes with `config_text` as their TOML config file.
    pub fn start_with_config(size: u64, config_text: &str) -> anyhow::Result<ProcessCluster> {
        let directory = tempfile::tempdir()?;
        let config_path = directory.path().join("quiver.toml");
        std::fs::write(&config_path, config_text)?;
        let mut nodes = BTreeMap::new();
        for node_id in 1..=size {
            nodes.insert(
                node_id,
                MetaProcess {
                    node_id,
                    address: free_address(),
                    http_address: free_address(),
                    data_dir: directory.path().join(format!("node-{node_id}")),
                    log_path: directory.path().join(format!("node-{node_id}.log")),
                    child: None,
                },
            );
        }
        let peers = nodes
            .values()
            .map(|node| format!("{}={}", node.node_id, node.address))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = ProcessCluster {
            _directory: directory,
            config_path,
            peers,
            nodes,
        };
        for node_id in 1..=size {
            cluster.spawn(node_id)?;
        }
        Ok(cluster)
    }

    pub fn spawn(&mut self, node_id: u64) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&node_id).context("unknown node")?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command
            .arg("meta")
            .args(["--node-id", &node_id.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--listen", &node.address])
            .args(["--http-listen", &node.http_address])
            .args(["--peers", &self.peers])
            .arg("--config")
            .arg(&self.config_path)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if node_id == 1 {
            command.arg("--init");
        }
        node.child = Some(command.spawn().context("spawning quiver meta")?);
        Ok(())
    }

    /// Sends SIGKILL.
    pub fn kill_nine(&mut self, node_id: u64) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&node_id).context("unknown node")?;
        if let Some(mut child) = node.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn terminate(&mut self, node_id: u64) -> anyhow::Result<ExitStatus> {
        let node = self.nodes.get_mut(&node_id).context("unknown node")?;
        let mut child = node.child.take().context("node not running")?;
        quiver_test_support::process::terminate(&mut child, Duration::from_secs(15))
            .with_context(|| format!("stopping node {node_id}"))
    }

    pub fn is_running(&self, node_id: u64) -> bool {
        self.nodes
            .get(&node_id)
            .is_some_and(|node| node.child.is_some())
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .keys()
            .copied()
            .filter(|node_id| self.is_running(*node_id))
            .collect()
    }

    pub fn address(&self, node_id: u64) -> String {
        self.nodes[&node_id].address.clone()
    }

    pub fn addresses(&self) -> Vec<String> {
        self.nodes
            .values()
            .map(|node| node.address.clone())
            .collect()
    }

    /// A client that knows every node.
    pub fn client(&self) -> MetaClient {
        client_for(self.addresses())
    }

    /// Returns the leader every running node agrees on, waiting for one.
    pub async fn wait_for_agreed_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let running = self.running();
        let probes: Vec<(u64, MetaClient)> = running
            .iter()
            .map(|node_id| (*node_id, client_for(vec![self.address(*node_id)])))
            .collect();
        eventually("an agreed leader among running nodes", timeout, || async {
            let mut leaders = Vec::new();
            for (node_id, probe) in &probes {
                let status = probe
                    .cluster_status_of(&self.address(*node_id))
                    .await
                    .ok()?;
                leaders.push(status.leader_id);
            }
            let first = *leaders.first()?;
            (first != 0
                && running.contains(&first)
                && leaders.iter().all(|leader| *leader == first))
            .then_some(first)
        })
        .await
    }

    /// Returns the leader any of `node_ids` reports that is not `excluded`, waiting for one.
    pub async fn wait_for_leader_other_than(
        &self,
        excluded: u64,
        node_ids: &[u64],
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        let probes: Vec<(String, MetaClient)> = node_ids
            .iter()
            .map(|node_id| {
                (
                    self.address(*node_id),
                    client_for(vec![self.address(*node_id)]),
                )
            })
            .collect();
        eventually("a new leader", timeout, || async {
            for (address, probe) in &probes {
                if let Ok(status) = probe.cluster_status_of(address).await
                    && status.leader_id != 0
                    && status.leader_id != excluded
                    && status.raft_state == "leader"
                {
                    return Some(status.leader_id);
                }
            }
            None
        })
        .await
    }

    /// Prints every node's log (for failures).
    pub fn dump_logs(&self) {
        for node in self.nodes.values() {
            let text = std::fs::read_to_string(&node.log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "----- node {} log (last {} lines) -----",
                node.node_id,
                tail.len()
            );
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Reads everything a node has applied, without redirection (non-linearizable).
pub async fn node_view(
    address: &str,
    shard: pb::ShardRef,
) -> anyhow::Result<(Vec<pb::Collection>, pb::Manifest)> {
    let client = client_for(vec![address.to_owned()]);
    let collections = client.list_collections(false).await?;
    let manifest = client.get_manifest(shard, false).await?;
    Ok((collections, manifest))
}

pub fn collection_spec(name: &str) -> pb::CollectionSpec {
    pb::CollectionSpec {
        name: name.to_owned(),
        dimension: 8,
        metric: pb::Metric::Dot as i32,
        id_type: pb::IdType::U64 as i32,
        shards: 1,
        replication: 1,
        index: None,
        payload_schema: vec![],
    }
}
