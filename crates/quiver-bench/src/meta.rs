//! `quiver-bench meta`: how fast a three-node metadata cluster of real
//! `quiver meta` processes (loopback ports, a temporary directory) fails over and
//! commits — numbers for reports, never assertions:
//! - failover: `kill -9` of the leader until a survivor leads (`--rounds` rounds,
//!   the killed node restarted and caught up between rounds);
//! - commit latency of a manifest change (one segment added), sequential;
//! - `CommitWal` calls per second on one shard, then on eight concurrently.
//!
//! ```text
//! cargo build --release -p quiver --bin quiver
//! cargo run --release -p quiver-bench -- meta --quiver target/release/quiver [--json meta.json]
//! ```
//!
//! The nodes run with test timings (50 ms heartbeats, 300–600 ms election
//! timeouts); `--raft-defaults` gives them the default Raft timings instead
//! (250 ms heartbeats, 1–2 s election timeouts).

use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quiver_common::stats::percentile;
use quiver_meta_client::{MetaClient, MetaClientConfig};
use quiver_proto::meta as pb;
use quiver_test_support::process::free_address;
use serde::Serialize;

/// Options of `quiver-bench meta`.
pub struct MetaOptions {
    /// The `quiver` binary to run the nodes with.
    pub quiver: PathBuf,
    /// Use openraft's default timings instead of the test timings.
    pub raft_defaults: bool,
    /// Failover rounds.
    pub rounds: usize,
    /// Sequential manifest commits to time.
    pub commits: usize,
    /// How long each `CommitWal` throughput run lasts.
    pub wal_duration: Duration,
    /// Where to write the JSON report, if anywhere.
    pub json: Option<PathBuf>,
}

/// Raft and control-loop timings short enough for quick failovers.
const TEST_TIMINGS: &str = r#"
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

const NODES: u64 = 3;
const WAL_SHARDS: u32 = 8;

#[derive(Serialize)]
struct Summary {
    p50_ms: f64,
    p99_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

impl Summary {
    fn of(sorted: &[Duration]) -> Summary {
        let ms = |duration: Option<Duration>| duration.unwrap_or_default().as_secs_f64() * 1e3;
        Summary {
            p50_ms: ms(percentile(sorted, 0.5)),
            p99_ms: ms(percentile(sorted, 0.99)),
            min_ms: ms(sorted.first().copied()),
            max_ms: ms(sorted.last().copied()),
        }
    }
}

#[derive(Serialize)]
struct WalThroughput {
    shards: u32,
    calls_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    raft_defaults: bool,
    failover: Summary,
    failovers_ms: Vec<f64>,
    manifest_commit: Summary,
    commit_wal: Vec<WalThroughput>,
}

/// Runs the measurements and prints them (and writes the JSON report).
pub async fn run(options: &MetaOptions) -> Result<()> {
    let config_text = if options.raft_defaults {
        TEST_TIMINGS
            .lines()
            .filter(|line| {
                !line.starts_with("heartbeat_interval_ms") && !line.starts_with("election_timeout")
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        TEST_TIMINGS.to_owned()
    };
    let mut cluster = MetaCluster::start(&options.quiver, &config_text)?;
    let result = measure(&mut cluster, options).await;
    if result.is_err() {
        cluster.print_log_tails();
    }
    let report = result?;
    println!(
        "failover (kill -9 leader -> survivor leads), {} rounds: median {:.0} ms, min {:.0} ms, max {:.0} ms",
        options.rounds, report.failover.p50_ms, report.failover.min_ms, report.failover.max_ms
    );
    println!(
        "manifest change commit latency ({} sequential): p50 {:.2} ms, p99 {:.2} ms",
        options.commits, report.manifest_commit.p50_ms, report.manifest_commit.p99_ms
    );
    for point in &report.commit_wal {
        println!(
            "CommitWal throughput, {} shard(s) concurrently: {:.0} calls/s",
            point.shards, point.calls_per_s
        );
    }
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn measure(cluster: &mut MetaCluster, options: &MetaOptions) -> Result<Report> {
    let mut failovers = Vec::new();
    for _ in 0..options.rounds {
        let leader = cluster.agreed_leader(Duration::from_secs(30)).await?;
        let killed_at = Instant::now();
        cluster.kill(leader);
        cluster
            .leader_other_than(leader, Duration::from_secs(20))
            .await?;
        failovers.push(killed_at.elapsed());
        cluster.spawn(leader)?;
        // The next round starts from a healthy cluster: all logs equal and applied.
        cluster.agreed_leader(Duration::from_secs(30)).await?;
        cluster.caught_up(Duration::from_secs(30)).await?;
    }
    let failovers_ms = failovers
        .iter()
        .map(|duration| duration.as_secs_f64() * 1e3)
        .collect();
    failovers.sort();
    cluster.agreed_leader(Duration::from_secs(30)).await?;

    let client = cluster.client(cluster.addresses());
    let collection = client
        .create_collection(pb::CollectionSpec {
            name: "bench".to_owned(),
            dimension: 8,
            metric: pb::Metric::Dot as i32,
            id_type: pb::IdType::U64 as i32,
            shards: WAL_SHARDS,
            replication: 1,
            index: None,
            payload_schema: vec![],
        })
        .await?
        .collection
        .context("the created collection")?;
    client
        .register_node(pb::RegisterNodeRequest {
            node_id: "indexer-bench".into(),
            role: pb::NodeRole::Indexer as i32,
            address: "127.0.0.1:1".into(),
        })
        .await?;
    let shard = |shard| pb::ShardRef {
        collection_id: collection.collection_id,
        shard,
    };
    let mut epochs = Vec::new();
    for number in 0..WAL_SHARDS {
        let lease = client
            .acquire_lease(pb::AcquireLeaseRequest {
                shard: Some(shard(number)),
                node_id: "indexer-bench".into(),
                ttl_ms: 600_000,
            })
            .await?;
        epochs.push(lease.epoch);
    }

    let mut latencies = Vec::new();
    for index in 0..options.commits {
        let request = pb::CommitManifestChangeRequest {
            shard: Some(shard(0)),
            epoch: epochs[0],
            add_segments: vec![pb::Segment {
                segment_id: format!("seg-{index}"),
                object_key: format!("segments/seg-{index}.qseg"),
                rows: 1_000,
                size_bytes: 1 << 20,
                ..Default::default()
            }],
            ..Default::default()
        };
        let started = Instant::now();
        client.commit_manifest_change(request).await?;
        latencies.push(started.elapsed());
    }
    latencies.sort();

    let mut commit_wal = Vec::new();
    for shards in [1, WAL_SHARDS] {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for number in 0..shards {
            let client = client.clone();
            let shard_ref = shard(number);
            let epoch = epochs[number as usize];
            let seq_base = u64::from(shards) * 1_000_000;
            let duration = options.wal_duration;
            tasks.push(tokio::spawn(async move {
                let mut calls = 0u64;
                while started.elapsed() < duration {
                    let seq = seq_base + calls + 1;
                    client
                        .commit_wal(pb::CommitWalRequest {
                            shard: Some(shard_ref),
                            epoch,
                            seq,
                            object_key: format!("wal/{number}/{seq}"),
                            rows: 100,
                        })
                        .await?;
                    calls += 1;
                }
                anyhow::Ok(calls)
            }));
        }
        let mut total = 0u64;
        for task in tasks {
            total += task.await??;
        }
        commit_wal.push(WalThroughput {
            shards,
            calls_per_s: total as f64 / started.elapsed().as_secs_f64(),
        });
    }
    Ok(Report {
        raft_defaults: options.raft_defaults,
        failover: Summary::of(&failovers),
        failovers_ms,
        manifest_commit: Summary::of(&latencies),
        commit_wal,
    })
}

/// Returns the `quiver` binary beside this one (as installed in the image), or
/// `quiver` from `PATH`.
pub fn default_quiver_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("quiver")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("quiver"))
}

/// Returns the first `Some` of `check`, polled every 20 ms, or an error naming
/// `what` after `timeout`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct MetaNode {
    address: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// Three `quiver meta` processes; node 1 initializes the cluster.
struct MetaCluster {
    binary: PathBuf,
    config_path: PathBuf,
    peers: String,
    /// Node `n` at index `n - 1`.
    nodes: Vec<MetaNode>,
    /// Keeps the data directories and logs as long as the cluster.
    _directory: tempfile::TempDir,
}

impl MetaCluster {
    fn start(binary: &Path, config_text: &str) -> Result<MetaCluster> {
        let directory = tempfile::Builder::new()
            .prefix("quiver-bench-meta-")
            .tempdir()?;
        let config_path = directory.path().join("quiver.toml");
        std::fs::write(&config_path, config_text)?;
        let mut nodes = Vec::new();
        for node_id in 1..=NODES {
            nodes.push(MetaNode {
                address: free_address(),
                data_dir: directory.path().join(format!("node-{node_id}")),
                log_path: directory.path().join(format!("node-{node_id}.log")),
                child: None,
            });
        }
        let peers = nodes
            .iter()
            .zip(1..)
            .map(|(node, node_id)| format!("{node_id}={}", node.address))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = MetaCluster {
            binary: binary.to_path_buf(),
            config_path,
            peers,
            nodes,
            _directory: directory,
        };
        for node_id in 1..=NODES {
            cluster.spawn(node_id)?;
        }
        Ok(cluster)
    }

    fn node(&mut self, node_id: u64) -> &mut MetaNode {
        &mut self.nodes[(node_id - 1) as usize]
    }

    fn spawn(&mut self, node_id: u64) -> Result<()> {
        let binary = self.binary.clone();
        let (config_path, peers) = (self.config_path.clone(), self.peers.clone());
        let node = self.node(node_id);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)?;
        let mut command = Command::new(&binary);
        command
            .arg("meta")
            .args(["--node-id", &node_id.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--listen", &node.address, "--http-listen", &free_address()])
            .args(["--peers", &peers])
            .arg("--config")
            .arg(&config_path)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if node_id == 1 {
            command.arg("--init");
        }
        node.child = Some(
            command
                .spawn()
                .with_context(|| format!("running {} meta", binary.display()))?,
        );
        Ok(())
    }

    /// Kills `node_id` at once (SIGKILL) and reaps it.
    fn kill(&mut self, node_id: u64) {
        if let Some(mut child) = self.node(node_id).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn running(&self) -> Vec<(u64, String)> {
        self.nodes
            .iter()
            .zip(1..)
            .filter(|(node, _)| node.child.is_some())
            .map(|(node, node_id)| (node_id, node.address.clone()))
            .collect()
    }

    fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.address.clone()).collect()
    }

    fn client(&self, addresses: Vec<String>) -> MetaClient {
        let mut config = MetaClientConfig::new(addresses);
        config.attempt_timeout = Duration::from_secs(3);
        config.connect_timeout = Duration::from_millis(300);
        config.retry_deadline = Duration::from_secs(30);
        MetaClient::new(config).expect("a valid client config")
    }

    /// Returns each running node's status, or `None` if one does not answer.
    async fn statuses(&self) -> Option<Vec<(u64, pb::ClusterStatusResponse)>> {
        let mut statuses = Vec::new();
        for (node_id, address) in self.running() {
            let probe = self.client(vec![address.clone()]);
            statuses.push((node_id, probe.cluster_status_of(&address).await.ok()?));
        }
        Some(statuses)
    }

    /// Returns the leader every running node names, waiting for one.
    async fn agreed_leader(&self, timeout: Duration) -> Result<u64> {
        let running: Vec<u64> = self.running().iter().map(|(node_id, _)| *node_id).collect();
        wait_for("a leader every running node agrees on", timeout, || async {
            let statuses = self.statuses().await?;
            let leader = statuses.first()?.1.leader_id;
            (leader != 0
                && running.contains(&leader)
                && statuses
                    .iter()
                    .all(|(_, status)| status.leader_id == leader))
            .then_some(leader)
        })
        .await
    }

    /// Returns a leader other than `excluded` that a running node reports, waiting for one.
    async fn leader_other_than(&self, excluded: u64, timeout: Duration) -> Result<u64> {
        wait_for("a new leader", timeout, || async {
            for (_, address) in self.running() {
                let probe = self.client(vec![address.clone()]);
                if let Ok(status) = probe.cluster_status_of(&address).await
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

    /// Waits until every node's log is the same and applied.
    async fn caught_up(&self, timeout: Duration) -> Result<()> {
        wait_for("all logs equal and applied", timeout, || async {
            let statuses = self.statuses().await?;
            let first = statuses.first()?.1.last_log_index;
            statuses
                .iter()
                .all(|(_, status)| status.last_log_index == first && status.applied_index == first)
                .then_some(())
        })
        .await
    }

    fn print_log_tails(&self) {
        for (node, node_id) in self.nodes.iter().zip(1..) {
            let text = std::fs::read_to_string(&node.log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("----- meta node {node_id} log (last lines) -----");
            for line in &lines[lines.len().saturating_sub(30)..] {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for MetaCluster {
    fn drop(&mut self) {
        for node_id in 1..=NODES {
            self.kill(node_id);
        }
    }
}
