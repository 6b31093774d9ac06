//! One running metadata node: Raft, its storage, the gRPC port, the control loop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use quiver_proto::meta as pb;
use quiver_proto::meta::meta_service_server::MetaServiceServer;
use quiver_proto::raft::raft_service_server::RaftServiceServer;
use quiver_proto::tls::ClusterTls;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::catalog::Catalog;
use crate::clock::LeaderClock;
use crate::config::MetaConfig;
use crate::context::MetaContext;
use crate::control::run_control_loop;
use crate::election::{Elections, run_elections};
use crate::error::{MetaError, MetaResult};
use crate::log_store::LogStore;
use crate::metrics::MetaMetrics;
use crate::network::{NetworkFactory, RaftGrpc};
use crate::raft_types::typ::Raft;
use crate::raft_types::{MetaNode, MetaNodeId};
use crate::service::MetaGrpc;
use crate::state_machine::StateMachineStore;

const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// A running metadata node. Dropping it without [`MetaServer::shutdown`] tells its
/// own tasks (the gRPC port, elections, the control loop) to stop without
/// waiting for them, and leaves Raft running until the runtime stops.
pub struct MetaServer {
    context: Arc<MetaContext>,
    local_address: SocketAddr,
    shutdown: CancellationToken,
    /// Cancels `shutdown` when the server is dropped.
    _stop_on_drop: DropGuard,
    server_task: JoinHandle<Result<(), tonic::transport::Error>>,
    background_tasks: Vec<JoinHandle<()>>,
}

impl MetaServer {
    /// Starts a node listening on `config.listen` (plaintext).
    pub async fn start(config: MetaConfig) -> MetaResult<MetaServer> {
        MetaServer::start_with_tls(config, None).await
    }

    /// Starts a node listening on `config.listen`; with `tls`, its gRPC port
    /// (client API and Raft) and its Raft calls to peers speak mutual TLS with
    /// the cluster CA.
    pub async fn start_with_tls(
        config: MetaConfig,
        tls: Option<ClusterTls>,
    ) -> MetaResult<MetaServer> {
        config.validate()?;
        let listener = TcpListener::bind(&config.listen).await.map_err(|error| {
            MetaError::Config(format!("cannot listen on `{}`: {error}", config.listen))
        })?;
        MetaServer::start_with_listener(config, listener, None, tls).await
    }

    /// Starts a node on an already bound listener (tests bind port 0 first), with
    /// `metrics` if the caller registers them elsewhere too, and `tls` as
    /// [`MetaServer::start_with_tls`].
    pub async fn start_with_listener(
        mut config: MetaConfig,
        listener: TcpListener,
        metrics: Option<MetaMetrics>,
        tls: Option<ClusterTls>,
    ) -> MetaResult<MetaServer> {
        config.validate()?;
        let metrics = match metrics {
            Some(metrics) => metrics,
            None => MetaMetrics::new()?,
        };
        let local_address = listener.local_addr().map_err(|error| {
            MetaError::Config(format!("listener has no local address: {error}"))
        })?;
        if config.advertise_address.is_none() && config.listen.ends_with(":0") {
            // An ephemeral port: advertise the port actually bound.
            config.advertise_address = Some(local_address.to_string());
        }
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|error| MetaError::storage(config.data_dir.display(), error))?;
        let log_store = open_blocking({
            let path = config.data_dir.join("raft-log.redb");
            move || LogStore::open(&path)
        })
        .await?;
        let state_machine = open_blocking({
            let path = config.data_dir.join("snapshots");
            let metrics = metrics.clone();
            move || StateMachineStore::open(&path, Some(metrics))
        })
        .await?;
        let catalog = state_machine.handle();

        let address_overrides: BTreeMap<MetaNodeId, String> = config
            .peers
            .iter()
            .filter(|(peer_id, _)| **peer_id != config.node_id)
            .map(|(peer_id, address)| (*peer_id, address.clone()))
            .collect();
        let address_overrides = Arc::new(address_overrides);
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let stepping_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let network = NetworkFactory {
            address_overrides: address_overrides.clone(),
            connect_timeout,
            tls: tls.clone(),
            stepping_down: stepping_down.clone(),
        };
        let raft_config = Arc::new(config.raft_config()?);
        let raft = Raft::new(
            config.node_id,
            raft_config.clone(),
            network,
            log_store.clone(),
            state_machine,
        )
        .await
        .map_err(|error| MetaError::Raft(format!("raft did not start: {error}")))?;
        let elections = Arc::new(Elections {
            node_id: config.node_id,
            raft: raft.clone(),
            raft_config,
            log_store: log_store.clone(),
            metrics: metrics.clone(),
            address_overrides,
            connect_timeout,
            tls: tls.clone(),
            stepping_down,
        });

        let context = Arc::new(MetaContext {
            node_id: config.node_id,
            raft: raft.clone(),
            catalog,
            config: config.clone(),
            metrics: metrics.clone(),
            log_store,
            clock: LeaderClock::system(),
            membership_changing: std::sync::atomic::AtomicBool::new(false),
        });

        let shutdown = CancellationToken::new();
        // Raft heartbeats are tiny: every connection has TCP_NODELAY.
        let incoming = quiver_proto::tls::incoming(listener, tls.as_ref()).map_err(|error| {
            MetaError::Config(format!("cannot accept on `{local_address}`: {error}"))
        })?;
        let router = quiver_proto::http2::grpc_server()
            .add_service(
                RaftServiceServer::new(RaftGrpc {
                    raft: raft.clone(),
                    elections: elections.clone(),
                })
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(MetaServiceServer::new(MetaGrpc {
                context: context.clone(),
                shutdown: shutdown.clone(),
            }));
        let server_task = tokio::spawn(
            router.serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned()),
        );

        if config.init {
            initialize_if_new(&raft, &config).await?;
        }

        let mut background_tasks = vec![
            tokio::spawn(run_elections(elections, shutdown.clone())),
            tokio::spawn(run_control_loop(context.clone(), shutdown.clone())),
            tokio::spawn(observe_raft_metrics(context.clone(), shutdown.clone())),
        ];
        if config.snapshot_interval_ms > 0 {
            background_tasks.push(tokio::spawn(snapshot_periodically(
                context.clone(),
                Duration::from_millis(config.snapshot_interval_ms),
                shutdown.clone(),
            )));
        }
        tracing::info!(node_id = config.node_id, address = %local_address, data_dir = %config.data_dir.display(), cluster_tls = tls.is_some(), "metadata node started");
        Ok(MetaServer {
            context,
            local_address,
            _stop_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            server_task,
            background_tasks,
        })
    }

    /// Returns the client-facing metadata service to call in this process,
    /// without a socket (`quiver standalone` registers it with
    /// `quiver_proto::serve_in_process`). Raft between nodes stays on the network.
    pub fn local_service(&self) -> quiver_proto::LocalService {
        quiver_proto::local_service(MetaServiceServer::new(MetaGrpc {
            context: self.context.clone(),
            shutdown: self.shutdown.clone(),
        }))
    }

    /// Returns the client-facing metadata handlers to call directly in this
    /// process, with the messages as they are (`quiver standalone` registers
    /// them with `quiver_proto::serve_meta_in_process`, beside
    /// [`MetaServer::local_service`], which still carries `watch` streams).
    pub fn local_meta(&self) -> quiver_proto::LocalMeta {
        std::sync::Arc::new(MetaGrpc {
            context: self.context.clone(),
            shutdown: self.shutdown.clone(),
        })
    }

    /// Returns the address the gRPC port is bound to.
    pub fn local_address(&self) -> SocketAddr {
        self.local_address
    }

    /// Returns this node's Raft id.
    pub fn node_id(&self) -> MetaNodeId {
        self.context.node_id
    }

    /// Returns this node's metrics.
    pub fn metrics(&self) -> &MetaMetrics {
        &self.context.metrics
    }

    /// Returns the known leader's id, if any.
    pub fn current_leader(&self) -> Option<MetaNodeId> {
        self.context.raft.metrics().borrow().current_leader
    }

    /// Tells whether this node is the Raft leader.
    pub fn is_leader(&self) -> bool {
        self.context.is_leader()
    }

    /// Tells whether the node can serve: it knows a leader, and if it leads, a
    /// quorum acknowledged it within the leader lease (a leader that cannot
    /// commit — cut off from its peers, or waiting on a member that does not
    /// answer — is not ready). A follower cannot tell cheaply whether its
    /// leader commits, and answers by knowing one.
    pub fn is_ready(&self) -> bool {
        self.current_leader().is_some() && self.context.cut_off_for_ms().is_none()
    }

    /// Returns this node's view of the cluster (the `ClusterStatus` RPC's answer).
    pub fn status(&self) -> pb::ClusterStatusResponse {
        self.context.cluster_status()
    }

    /// Returns a copy of this node's applied catalog.
    pub fn catalog(&self) -> Catalog {
        self.context.catalog.read(|state| state.catalog.clone())
    }

    /// Waits until a leader is known, returning its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> MetaResult<MetaNodeId> {
        let deadline = Instant::now() + timeout;
        let mut metrics = self.context.raft.metrics();
        loop {
            if let Some(leader) = metrics.borrow().current_leader {
                return Ok(leader);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(MetaError::Unavailable(format!(
                    "no metadata leader elected within {} ms",
                    timeout.as_millis()
                )));
            }
            let _ = tokio::time::timeout(remaining, metrics.changed()).await;
        }
    }

    /// Builds a snapshot now (and compacts the log behind it) and waits for it.
    pub async fn snapshot_now(&self, timeout: Duration) -> MetaResult<u64> {
        let applied = self
            .context
            .raft_metrics()
            .last_applied
            .map_or(0, |log_id| log_id.index);
        self.context
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|error| MetaError::Raft(format!("snapshot not triggered: {error}")))?;
        self.context
            .raft
            .wait(Some(timeout))
            .metrics(
                |metrics| {
                    metrics
                        .snapshot
                        .is_some_and(|log_id| log_id.index >= applied)
                },
                "snapshot built",
            )
            .await
            .map_err(|error| MetaError::Raft(format!("snapshot not built: {error}")))?;
        Ok(applied)
    }

    /// Returns an HTTP router serving `/metrics`, `/healthz` and `/readyz` for this node.
    pub fn http_router(&self) -> axum::Router {
        let metrics_context = self.context.clone();
        let health_context = self.context.clone();
        let ready_context = self.context.clone();
        axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let context = metrics_context.clone();
                    async move { context.metrics.render() }
                }),
            )
            // A node whose Raft stopped (a failed log write) serves nothing
            // useful until restarted: say so, so an orchestrator restarts it.
            .route(
                "/healthz",
                axum::routing::get(move || {
                    let context = health_context.clone();
                    async move {
                        match &context.raft.metrics().borrow().running_state {
                            Ok(()) => (StatusCode::OK, "ok".to_owned()),
                            Err(fatal) => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                format!("raft stopped: {fatal}"),
                            ),
                        }
                    }
                }),
            )
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let context = ready_context.clone();
                    async move {
                        let leader = context.raft.metrics().borrow().current_leader;
                        match leader {
                            Some(leader) => (StatusCode::OK, format!("ready (leader {leader})")),
                            None => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "no metadata leader".to_owned(),
                            ),
                        }
                    }
                }),
            )
    }

    /// Stops serving, stops Raft and waits for the tasks to end. In-flight requests
    /// get a second to finish; connections still open then (watch streams) are
    /// dropped, so the storage is released when this returns.
    pub async fn shutdown(self) -> MetaResult<()> {
        self.shutdown.cancel();
        let raft_result = self.context.raft.shutdown().await;
        let mut server_task = self.server_task;
        match tokio::time::timeout(Duration::from_secs(1), &mut server_task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "grpc server ended with an error"),
            Ok(Err(error)) => tracing::warn!(%error, "grpc server task failed"),
            Err(_elapsed) => {
                tracing::info!("closing grpc connections still open after 1 s");
                server_task.abort();
                let _ = server_task.await;
            }
        }
        for task in self.background_tasks {
            task.abort();
            let _ = task.await;
        }
        // openraft does not join its replication tasks on shutdown: one may still be
        // finishing an RPC or a read holding a log reader (a handle on the database).
        // Wait for them, so the database file is unlocked when this returns.
        let release_deadline = Instant::now() + Duration::from_secs(5);
        while self.context.log_store.other_handles() > 0 {
            if Instant::now() > release_deadline {
                tracing::warn!(
                    handles = self.context.log_store.other_handles(),
                    "raft log still in use 5 s after shutdown"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Err(error) = raft_result {
            return Err(MetaError::Raft(format!("raft shutdown failed: {error}")));
        }
        tracing::info!(node_id = self.context.node_id, "metadata node stopped");
        Ok(())
    }
}

async fn open_blocking<T: Send + 'static>(
    open: impl FnOnce() -> MetaResult<T> + Send + 'static,
) -> MetaResult<T> {
    tokio::task::spawn_blocking(open)
        .await
        .map_err(|error| MetaError::Raft(format!("storage open task failed: {error}")))?
}

async fn initialize_if_new(raft: &Raft, config: &MetaConfig) -> MetaResult<()> {
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|error| MetaError::Raft(error.to_string()))?;
    if initialized {
        tracing::info!(
            node_id = config.node_id,
            "raft state exists; --init ignored"
        );
        return Ok(());
    }
    let members: BTreeMap<MetaNodeId, MetaNode> = if config.peers.is_empty() {
        BTreeMap::from([(
            config.node_id,
            MetaNode {
                address: config.advertised(),
            },
        )])
    } else {
        config
            .peers
            .iter()
            .map(|(peer_id, address)| {
                let address = if *peer_id == config.node_id {
                    config.advertised()
                } else {
                    address.clone()
                };
                (*peer_id, MetaNode { address })
            })
            .collect()
    };
    tracing::info!(node_id = config.node_id, members = ?members, "initializing metadata cluster");
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another node initialized first (every node may be started with --init).
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(error),
        )) => {
            tracing::info!(%error, "cluster already initialized elsewhere");
            Ok(())
        }
        Err(error) => Err(MetaError::Raft(format!(
            "cluster initialization failed: {error}"
        ))),
    }
}

/// Triggers a snapshot every `interval` if entries were applied since the last one,
/// so the log is compacted even when few entries arrive.
async fn snapshot_periodically(
    context: Arc<MetaContext>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => break,
        }
        let metrics = context.raft_metrics();
        let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
        let snapshot = metrics.snapshot.map_or(0, |log_id| log_id.index);
        if applied > snapshot
            && let Err(error) = context.raft.trigger().snapshot().await
        {
            tracing::warn!(%error, "periodic snapshot not triggered");
        }
    }
}

async fn observe_raft_metrics(context: Arc<MetaContext>, shutdown: CancellationToken) {
    let mut raft_metrics = context.raft.metrics();
    let mut catalog_versions = context.catalog.subscribe();
    let mut last_leader: Option<MetaNodeId> = None;
    loop {
        {
            let metrics = raft_metrics.borrow().clone();
            if metrics.current_leader != last_leader {
                tracing::info!(node_id = context.node_id, leader = ?metrics.current_leader, term = metrics.current_term, "metadata leader changed");
                last_leader = metrics.current_leader;
            }
            context
                .metrics
                .observe_raft(&metrics, context.log_store.committed_index());
            let version = *catalog_versions.borrow();
            context
                .metrics
                .catalog_version
                .set(i64::try_from(version).unwrap_or(i64::MAX));
        }
        tokio::select! {
            changed = raft_metrics.changed() => if changed.is_err() { break },
            changed = catalog_versions.changed() => if changed.is_err() { break },
            () = shutdown.cancelled() => break,
        }
    }
}

/// Starts a single-node metadata service in this process (the embedded mode of
/// `quiver standalone`): node id 1, data in `data_dir`, initialized on first start,
/// and returns once it is the leader.
pub async fn run_single_node(data_dir: &Path, listen: &str) -> MetaResult<MetaServer> {
    run_single_node_with(MetaConfig::new(1, data_dir, listen)).await
}

/// [`run_single_node`] with `config` (its node id, data directory and address;
/// it is initialized on first start whatever `config.init` says).
pub async fn run_single_node_with(config: MetaConfig) -> MetaResult<MetaServer> {
    let config = MetaConfig {
        init: true,
        ..config
    };
    let server = MetaServer::start(config).await?;
    server.wait_for_leader(Duration::from_secs(30)).await?;
    Ok(server)
}
