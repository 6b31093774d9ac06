//! A real multi-process cluster: `quiver meta` (1 or 3), `quiver indexer`,
//! `quiver searcher` and `quiver gateway` processes on loopback ports, objects in
//! a fresh bucket of the S3 test server. Every process can be killed (-9),
//! stopped (SIGTERM), paused (SIGSTOP) and restarted with the same identity,
//! ports and directories; its stderr goes to a log whose tail is printed when a
//! test fails.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use quiver_meta::{MetaClient, MetaClientConfig};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
pub use quiver_test_support::eventually;
use quiver_test_support::process::{Signal, free_address};
use quiver_test_support::{S3TestServer, fresh_bucket_name};
use serde_json::json;

use crate::api::Api;

/// The S3 test server's endpoint, or `None` (a visible skip) without one;
/// under CI a missing server is a failure.
pub fn s3_endpoint() -> Option<String> {
    S3TestServer::from_env("this reliability scenario").map(|server| server.endpoint().to_string())
}

/// What a process runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Meta,
    Indexer,
    Searcher,
    Gateway,
}

/// One `quiver` process, restartable with the same identity, ports and directories.
pub struct Process {
    pub name: String,
    pub role: Role,
    /// The gRPC address (meta: client API and Raft; indexer, searcher, gateway: gRPC API).
    pub address: String,
    /// The HTTP address (`/readyz`, `/metrics`; the gateway's REST API).
    pub http_address: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    log_path: PathBuf,
    child: Option<Child>,
    /// How many times the process was started.
    pub starts: u32,
}

impl Process {
    /// Starts the process (again); its log gets a marker line first.
    pub fn start(&mut self) -> anyhow::Result<()> {
        if !self.is_running() {
            // Reap a process that ended on its own.
            self.kill9();
        }
        anyhow::ensure!(self.child.is_none(), "{} is already running", self.name);
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        writeln!(
            log,
            "===== harness: start #{} of {} (extra env: {:?}) =====",
            self.starts, self.name, self.env
        )?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
        command
            .args(&self.args)
            .envs(&self.env)
            .env("RUST_LOG", "info,openraft=warn,quiver_meta::control=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // Crash-point aborts must not leave core files behind.
        quiver_test_support::process::without_core_dumps(&mut command);
        self.child = Some(
            command
                .spawn()
                .with_context(|| format!("spawning {}", self.name))?,
        );
        Ok(())
    }

    /// Sets (or with `None` removes) an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(value) => self.env.insert(key.to_string(), value.to_string()),
            None => self.env.remove(key),
        };
    }

    /// Returns the value that follows `flag` (`--data-dir`, `--meta`, …) on
    /// the command line.
    pub fn arg(&self, flag: &str) -> Option<&str> {
        let position = self.args.iter().position(|arg| arg == flag)?;
        self.args.get(position + 1).map(String::as_str)
    }

    /// Sets `flag` to `value` for the next start (appended when absent), e.g. to
    /// route a process's connections through a proxy.
    pub fn set_arg(&mut self, flag: &str, value: &str) {
        match self.args.iter().position(|arg| arg == flag) {
            Some(position) if position + 1 < self.args.len() => {
                self.args[position + 1] = value.to_string();
            }
            _ => self.args.extend([flag.to_string(), value.to_string()]),
        }
    }

    /// Returns the operating-system process id while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.is_running()
            .then(|| self.child.as_ref().map(Child::id))
            .flatten()
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child
            && let Err(error) = quiver_test_support::process::send_signal(child, signal)
        {
            eprintln!("{}: {error:#}", self.name);
        }
    }

    /// Freezes the process (SIGSTOP): it holds its sockets but does nothing.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Stops the process with SIGTERM; returns its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("process not running")?;
        quiver_test_support::process::terminate(&mut child, timeout)
            .with_context(|| format!("stopping {}", self.name))
    }

    /// Returns the exit status if the process ended on its own (and reaps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Tells whether the process was started and has not ended (killed, or
    /// exited on its own) since.
    pub fn is_running(&self) -> bool {
        let Some(child) = &self.child else {
            return false;
        };
        // Leaves an ended child to be reaped by `exited`/`kill9`.
        !quiver_test_support::process::has_ended(child)
    }

    /// Returns the whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Returns the last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(
        &self,
        http: &reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let url = format!("http://{}/readyz", self.http_address);
        let ready = eventually(&format!("{} ready", self.name), timeout, || async {
            let answer = http
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .ok()?;
            answer.status().is_success().then_some(())
        })
        .await;
        ready.with_context(|| format!("log of {}:\n{}", self.name, self.log_tail(30)))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A paused process must run again to die of SIGKILL promptly.
        self.resume();
        self.kill9();
    }
}

/// Process counts of a cluster.
#[derive(Clone, Copy, Debug)]
pub struct ClusterShape {
    pub metas: usize,
    pub indexers: usize,
    pub searchers: usize,
    pub gateways: usize,
}

/// Timings short enough for tests: heartbeats of meta 50 ms; data nodes are
/// dead after 3 s of silence (they heartbeat every second); flushes every
/// 700 ms; merges of 4 segments from 300 rows up.
fn config_text(scratch_dir: &Path) -> String {
    format!(
        r#"log_format = "text"

[meta]
heartbeat_interval_ms = 50
election_timeout_min_ms = 300
election_timeout_max_ms = 600
control_interval_ms = 200
node_timeout_ms = 3000
lease_ttl_ms = 3000
gc_grace_ms = 5000
proposal_timeout_ms = 2000
connect_timeout_ms = 300
snapshot_logs = 500
logs_to_keep = 100

[indexer]
commit_window_ms = 5
flush_interval_ms = 700
flush_rows = 500
max_unflushed_rows = 50000
merge_factor = 4
merge_floor_rows = 300
max_segment_rows = 1000000
scratch_dir = "{}"
"#,
        scratch_dir.display()
    )
}

/// A running cluster with its directory, bucket and processes.
pub struct Cluster {
    directory: Option<tempfile::TempDir>,
    /// Set when the scenario passed; otherwise dropping prints every log tail.
    passed: bool,
    pub store_url: String,
    pub s3: S3Settings,
    pub metas: Vec<Process>,
    pub indexers: Vec<Process>,
    pub searchers: Vec<Process>,
    pub gateways: Vec<Process>,
    pub http: reqwest::Client,
}

impl Cluster {
    /// Starts `shape` over a fresh bucket and waits until every process is ready.
    pub async fn start(endpoint: &str, shape: ClusterShape) -> anyhow::Result<Cluster> {
        let mut cluster = Cluster::prepare(endpoint, shape).await?;
        cluster.start_all().await?;
        Ok(cluster)
    }

    /// Creates the bucket and the process definitions without starting anything.
    pub async fn prepare(endpoint: &str, shape: ClusterShape) -> anyhow::Result<Cluster> {
        anyhow::ensure!(
            shape.metas == 1 || shape.metas == 3,
            "1 or 3 meta nodes, not {}",
            shape.metas
        );
        let directory = tempfile::Builder::new()
            .prefix("quiver-reliability-")
            .tempdir()?;
        let server = S3TestServer::at(endpoint);
        let s3 = server.settings();
        let bucket = fresh_bucket_name("quiver-reliability");
        quiver_storage::ensure_bucket(&s3, &bucket)
            .await
            .with_context(|| format!("creating bucket {bucket}"))?;
        let store_url = format!("s3://{bucket}/cluster");
        // reqwest is built with rustls but no default crypto provider (the
        // package's TLS tests pick theirs); plain-HTTP clients still need one.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut cluster = Cluster {
            directory: Some(directory),
            passed: false,
            store_url,
            s3,
            metas: Vec::new(),
            indexers: Vec::new(),
            searchers: Vec::new(),
            gateways: Vec::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        };
        let meta_addresses: Vec<String> = (0..shape.metas).map(|_| free_address()).collect();
        let peers = meta_addresses
            .iter()
            .enumerate()
            .map(|(index, address)| format!("{}={address}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        for (index, address) in meta_addresses.iter().enumerate() {
            let node_id = index + 1;
            let name = format!("meta-{node_id}");
            let data_dir = cluster.path(&format!("{name}/data"));
            let mut args = vec![
                "meta".into(),
                "--node-id".into(),
                node_id.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--listen".into(),
                address.clone(),
                "--peers".into(),
                peers.clone(),
            ];
            if node_id == 1 {
                args.push("--init".into());
            }
            let process = cluster.define(&name, Role::Meta, address.clone(), args)?;
            cluster.metas.push(process);
        }
        for _ in 0..shape.indexers {
            cluster.define_indexer()?;
        }
        for _ in 0..shape.searchers {
            cluster.define_searcher()?;
        }
        for _ in 0..shape.gateways {
            cluster.define_gateway()?;
        }
        Ok(cluster)
    }

    fn root(&self) -> &Path {
        self.directory.as_ref().expect("directory kept").path()
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root().join(relative)
    }

    /// Writes the process's config file and returns its definition (not started).
    fn define(
        &self,
        name: &str,
        role: Role,
        address: String,
        mut args: Vec<String>,
    ) -> anyhow::Result<Process> {
        let home = self.path(name);
        std::fs::create_dir_all(home.join("scratch"))?;
        let config_path = home.join("quiver.toml");
        std::fs::write(&config_path, config_text(&home.join("scratch")))?;
        let http_address = free_address();
        args.extend([
            "--config".into(),
            config_path.display().to_string(),
            "--http-listen".into(),
            http_address.clone(),
        ]);
        let server = S3TestServer::at(self.s3.endpoint.as_deref().unwrap_or_default());
        let env: BTreeMap<String, String> = server
            .process_env()
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect();
        Ok(Process {
            name: name.to_string(),
            role,
            address,
            http_address,
            args,
            env,
            log_path: home.join("process.log"),
            child: None,
            starts: 0,
        })
    }

    /// Comma-separated meta addresses (the `--meta` flag).
    pub fn meta_list(&self) -> String {
        self.metas
            .iter()
            .map(|meta| meta.address.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn data_node_args(&self, role: &str, name: &str, address: &str) -> Vec<String> {
        vec![
            role.into(),
            "--meta".into(),
            self.meta_list(),
            "--object-store".into(),
            self.store_url.clone(),
            "--listen".into(),
            address.into(),
            "--node-id".into(),
            name.into(),
        ]
    }

    /// Defines one more indexer (`indexer-N`); returns its index.
    pub fn define_indexer(&mut self) -> anyhow::Result<usize> {
        let name = format!("indexer-{}", self.indexers.len() + 1);
        let address = free_address();
        let args = self.data_node_args("indexer", &name, &address);
        let process = self.define(&name, Role::Indexer, address, args)?;
        self.indexers.push(process);
        Ok(self.indexers.len() - 1)
    }

    /// Defines one more searcher (`searcher-N`, its own cache directory); returns its index.
    pub fn define_searcher(&mut self) -> anyhow::Result<usize> {
        let name = format!("searcher-{}", self.searchers.len() + 1);
        let address = free_address();
        let mut args = self.data_node_args("searcher", &name, &address);
        let cache_dir = self.path(&format!("{name}/cache"));
        args.extend([
            "--cache-dir".into(),
            cache_dir.display().to_string(),
            "--cache-size".into(),
            "64MiB".into(),
            "--region-size".into(),
            "1MiB".into(),
        ]);
        let process = self.define(&name, Role::Searcher, address, args)?;
        self.searchers.push(process);
        Ok(self.searchers.len() - 1)
    }

    /// Defines one more gateway (`gateway-N`); returns its index.
    pub fn define_gateway(&mut self) -> anyhow::Result<usize> {
        let name = format!("gateway-{}", self.gateways.len() + 1);
        let address = free_address();
        let args = vec![
            "gateway".into(),
            "--meta".into(),
            self.meta_list(),
            "--grpc-listen".into(),
            address.clone(),
            "--node-id".into(),
            name.clone(),
        ];
        let process = self.define(&name, Role::Gateway, address, args)?;
        self.gateways.push(process);
        Ok(self.gateways.len() - 1)
    }

    /// Starts every defined process that is not running: metas first (waiting
    /// for a leader), then the data nodes and gateways; waits for all to be ready.
    pub async fn start_all(&mut self) -> anyhow::Result<()> {
        for meta in self.metas.iter_mut().filter(|meta| !meta.is_running()) {
            meta.start()?;
        }
        for meta in &self.metas {
            meta.wait_ready(&self.http, Duration::from_secs(60)).await?;
        }
        for process in self
            .indexers
            .iter_mut()
            .chain(self.searchers.iter_mut())
            .chain(self.gateways.iter_mut())
            .filter(|process| !process.is_running())
        {
            process.start()?;
        }
        self.start_all_ready().await
    }

    /// Waits until every running process is ready.
    pub async fn start_all_ready(&self) -> anyhow::Result<()> {
        for meta in self.metas.iter().filter(|meta| meta.is_running()) {
            meta.wait_ready(&self.http, Duration::from_secs(60)).await?;
        }
        let http = self.http.clone();
        for process in self
            .indexers
            .iter()
            .chain(self.searchers.iter())
            .chain(self.gateways.iter())
            .filter(|process| process.is_running())
        {
            process.wait_ready(&http, Duration::from_secs(60)).await?;
        }
        Ok(())
    }

    /// Every process, metas first.
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.metas
            .iter()
            .chain(self.indexers.iter())
            .chain(self.searchers.iter())
            .chain(self.gateways.iter())
    }

    /// The REST base URLs of the gateways.
    pub fn gateway_urls(&self) -> Vec<String> {
        self.gateways
            .iter()
            .map(|gateway| format!("http://{}", gateway.http_address))
            .collect()
    }

    /// A REST client of the first running gateway.
    pub fn api(&self) -> Api {
        let gateway = self
            .gateways
            .iter()
            .find(|gateway| gateway.is_running())
            .expect("a running gateway");
        Api::new(
            self.http.clone(),
            format!("http://{}", gateway.http_address),
        )
    }

    /// A metadata client that knows every meta node.
    pub fn meta_client(&self) -> MetaClient {
        let mut config =
            MetaClientConfig::new(self.metas.iter().map(|meta| meta.address.clone()).collect());
        config.attempt_timeout = Duration::from_secs(3);
        config.connect_timeout = Duration::from_millis(300);
        config.retry_deadline = Duration::from_secs(30);
        MetaClient::new(config).expect("valid meta client config")
    }

    /// Storage over the cluster's bucket (for scans of what is really stored).
    pub fn storage(&self) -> anyhow::Result<Storage> {
        let url: StoreUrl = self.store_url.parse()?;
        Ok(Storage::open(&url, &self.s3, StorageOptions::default())?)
    }

    /// Creates a collection (l2, u64 ids) through the gateway and waits until
    /// every shard has a live indexer and `replication` ready searchers.
    pub async fn create_collection(
        &self,
        name: &str,
        dimension: usize,
        shards: u32,
        replication: u32,
    ) -> anyhow::Result<()> {
        let api = self.api();
        let created = api
            .call(
                "PUT",
                &format!("/v1/collections/{name}"),
                Some(json!({"dimension": dimension, "metric": "l2", "shards": shards, "replication": replication})),
            )
            .await
            .with_context(|| format!("creating collection {name}"))?;
        anyhow::ensure!(created["name"] == name, "unexpected answer {created}");
        self.wait_served(name, replication as usize, Duration::from_secs(60))
            .await
    }

    /// Waits until every shard of `name` has a lease held by a running indexer
    /// and at least `searchers` ready searchers.
    pub async fn wait_served(
        &self,
        name: &str,
        searchers: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let api = self.api();
        let served = eventually(&format!("collection {name} served"), timeout, || async {
            let shards = api
                .call("GET", &format!("/admin/v1/collections/{name}/shards"), None)
                .await
                .ok()?;
            let all = shards["shards"].as_array()?;
            let ok = !all.is_empty()
                && all.iter().all(|shard| {
                    let holder = shard["indexer"]["id"].as_str().unwrap_or_default();
                    let live_holder = self
                        .indexers
                        .iter()
                        .any(|indexer| indexer.name == holder && indexer.is_running());
                    let ready = shard["searchers"]
                        .as_array()
                        .map_or(0, |list| list.iter().filter(|s| s["ready"] == true).count());
                    live_holder && ready >= searchers
                });
            ok.then_some(())
        })
        .await;
        served
            .map_err(|error| anyhow::anyhow!("{error}; processes:\n{}", self.describe_processes()))
    }

    /// Returns the per-shard `(indexer holding the lease, epoch)` of `name`.
    pub async fn leases(&self, name: &str) -> anyhow::Result<BTreeMap<u64, (String, u64)>> {
        let shards = self
            .api()
            .call("GET", &format!("/admin/v1/collections/{name}/shards"), None)
            .await?;
        let mut leases = BTreeMap::new();
        for shard in shards["shards"].as_array().context("shards list")? {
            let number = shard["shard"].as_u64().context("shard number")?;
            let holder = shard["indexer"]["id"].as_str().unwrap_or_default();
            let epoch = shard["indexer"]["epoch"].as_u64().unwrap_or(0);
            leases.insert(number, (holder.to_string(), epoch));
        }
        Ok(leases)
    }

    /// Returns the meta node id every running meta node names as leader.
    pub async fn meta_leader(&self) -> anyhow::Result<u64> {
        let probes: Vec<(String, MetaClient)> = self
            .metas
            .iter()
            .filter(|meta| meta.is_running())
            .map(|meta| {
                let mut config = MetaClientConfig::new(vec![meta.address.clone()]);
                config.attempt_timeout = Duration::from_secs(2);
                config.connect_timeout = Duration::from_millis(300);
                config.retry_deadline = Duration::from_secs(2);
                (
                    meta.address.clone(),
                    MetaClient::new(config).expect("valid meta client config"),
                )
            })
            .collect();
        eventually("an agreed meta leader", Duration::from_secs(30), || async {
            let mut leaders = Vec::new();
            for (address, probe) in &probes {
                leaders.push(probe.cluster_status_of(address).await.ok()?.leader_id);
            }
            let first = *leaders.first()?;
            (first != 0 && leaders.iter().all(|leader| *leader == first)).then_some(first)
        })
        .await
    }

    /// One line per process: name, running, starts.
    pub fn describe_processes(&self) -> String {
        self.processes()
            .map(|process| {
                format!(
                    "  {} ({:?}) running={} starts={}",
                    process.name,
                    process.role,
                    process.is_running(),
                    process.starts
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Marks the scenario as passed: the logs are not printed on drop.
    pub fn mark_passed(&mut self) {
        self.passed = true;
    }

    /// Prints the tail of every process's log.
    pub fn dump_logs(&self, lines: usize) {
        for process in self.processes() {
            eprintln!(
                "----- {} (running={}, starts={}) last {lines} log lines -----\n{}",
                process.name,
                process.is_running(),
                process.starts,
                process.log_tail(lines)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.passed {
            self.dump_logs(40);
            if let Some(directory) = self.directory.take() {
                let kept = directory.keep();
                eprintln!("cluster directory (logs) kept at {}", kept.display());
            }
        }
    }
}
