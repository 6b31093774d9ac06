//! The searcher role's lifecycle: start serving (gRPC server, registration with
//! meta, the routing loops), say when it is ready, stop.
//!
//! Shutdown is one [`CancellationToken`]: the server, the registration loop, the
//! routing loops and every shard reload stop on it, and one [`TaskTracker`]
//! holds them all, so stopping waits for each.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use quiver_meta_client::{MetaClient, NodeIdentity, keep_registered};
use quiver_proto::data::searcher_server::SearcherServer;
use quiver_proto::meta as pb;
use quiver_proto::tls::ClusterTls;
use quiver_storage::manifest::ShardRef;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::ReadContext;
use crate::error::SearcherError;
use crate::grpc::SearcherGrpc;
use crate::metrics::METRICS;
use crate::reload::ServedShard;
use crate::routing::{safety_poll_loop, watch_loop};
use crate::search_pool::SearchPool;

const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How long [`SearcherNode::shutdown`] waits for its tasks to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Settings of a searcher node.
#[derive(Clone, Debug)]
pub struct SearcherNodeConfig {
    /// Unique node id (the pod name in Kubernetes).
    pub node_id: String,
    /// Address other roles use to reach this node's gRPC port.
    pub advertise_address: String,
    /// How often the node tells meta it is alive (and which shards are ready).
    pub heartbeat_interval: Duration,
    /// How often the node also reads the whole routing table (a safety net: the
    /// watch stream normally delivers every change at once).
    pub safety_poll_interval: Duration,
    /// Bound of the first pause before reopening a broken watch stream (the
    /// bound doubles per failure; each pause is drawn below it, full jitter).
    pub watch_initial_backoff: Duration,
    /// Largest bound of the pause before reopening a broken watch stream.
    pub watch_max_backoff: Duration,
    /// Threads searches and point reads run on (0: one per core).
    pub search_threads: usize,
    /// Searches that may wait for a search thread before new ones are refused
    /// with a retryable `RESOURCE_EXHAUSTED` (0: 64 per thread).
    pub search_queue: usize,
    /// Mutual TLS with the cluster CA on the gRPC port (none: plaintext).
    pub cluster_tls: Option<ClusterTls>,
}

impl SearcherNodeConfig {
    /// Returns the defaults for `node_id` reachable at `advertise_address`.
    pub fn new(node_id: impl Into<String>, advertise_address: impl Into<String>) -> Self {
        SearcherNodeConfig {
            node_id: node_id.into(),
            advertise_address: advertise_address.into(),
            heartbeat_interval: Duration::from_secs(1),
            safety_poll_interval: Duration::from_secs(15),
            watch_initial_backoff: Duration::from_millis(100),
            watch_max_backoff: Duration::from_secs(5),
            search_threads: 0,
            search_queue: 0,
            cluster_tls: None,
        }
    }
}

/// What every task of a running node shares.
pub(crate) struct NodeState {
    pub(crate) config: SearcherNodeConfig,
    pub(crate) meta: MetaClient,
    pub(crate) context: Arc<ReadContext>,
    pub(crate) shards: RwLock<HashMap<ShardRef, Arc<ServedShard>>>,
    pub(crate) registered: Arc<AtomicBool>,
    /// Set once the assignments were read (from the watch or a poll).
    pub(crate) synced: AtomicBool,
    /// Cancelled when the node stops.
    pub(crate) shutdown: CancellationToken,
    /// Every task the node started (loops, server, reloads).
    pub(crate) tasks: TaskTracker,
    /// The bounded pool searches and point reads run on.
    pub(crate) search_pool: SearchPool,
}

impl NodeState {
    /// Returns the shard being served, if any.
    pub(crate) fn served(&self, shard: &ShardRef) -> Option<Arc<ServedShard>> {
        let shards = self.shards.read().unwrap_or_else(|p| p.into_inner());
        shards.get(shard).cloned()
    }

    /// Waits until meta knows this node; false when the node stops first.
    pub(crate) async fn registered_or_stopped(&self) -> bool {
        while !self.registered.load(Ordering::Acquire) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.shutdown.cancelled() => return false,
            }
        }
        true
    }
}

/// A running searcher node.
pub struct SearcherNode {
    state: Arc<NodeState>,
    local_address: SocketAddr,
}

impl SearcherNode {
    /// Starts serving on `listener`, reading through `context`, and joins the
    /// cluster through `meta`.
    pub async fn start(
        config: SearcherNodeConfig,
        listener: TcpListener,
        meta: MetaClient,
        context: Arc<ReadContext>,
    ) -> Result<SearcherNode, SearcherError> {
        let local_address = listener
            .local_addr()
            .map_err(|error| SearcherError::Internal(format!("listener address: {error}")))?;
        let search_pool = SearchPool::new(config.search_threads, config.search_queue)?;
        let state = Arc::new(NodeState {
            search_pool,
            config,
            meta,
            context,
            shards: RwLock::new(HashMap::new()),
            registered: Arc::new(AtomicBool::new(false)),
            synced: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let service = SearcherServer::new(SearcherGrpc::new(state.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        // Answers are small; Nagle would hold their last segment for the peer's
        // delayed ACK (~40 ms): every connection has TCP_NODELAY.
        let incoming = quiver_proto::tls::incoming(listener, state.config.cluster_tls.as_ref())
            .map_err(|error| SearcherError::Internal(format!("grpc listener: {error}")))?;
        let server_shutdown = state.shutdown.clone().cancelled_owned();
        state.tasks.spawn(async move {
            let result = quiver_proto::http2::grpc_server()
                .trace_fn(quiver_proto::request_span)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, server_shutdown)
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "searcher grpc server failed");
            }
        });
        state.tasks.spawn(keep_registered(
            state.meta.clone(),
            NodeIdentity {
                node_id: state.config.node_id.clone(),
                role: pb::NodeRole::Searcher,
                address: state.config.advertise_address.clone(),
            },
            state.config.heartbeat_interval,
            state.registered.clone(),
            {
                let state = state.clone();
                move || {
                    let ready = ready_shards(&state);
                    METRICS.shards_ready.set(ready.len() as i64);
                    ready
                }
            },
            state.shutdown.clone(),
        ));
        state.tasks.spawn(watch_loop(state.clone()));
        state.tasks.spawn(safety_poll_loop(state.clone()));
        tracing::info!(node_id = %state.config.node_id, address = %local_address, cluster_tls = state.config.cluster_tls.is_some(), "searcher started");
        Ok(SearcherNode {
            state,
            local_address,
        })
    }

    /// Returns the node's gRPC service to call in this process, without a
    /// socket (`quiver standalone` registers it with
    /// `quiver_proto::serve_in_process`): the same handlers and limits.
    pub fn local_service(&self) -> quiver_proto::LocalService {
        quiver_proto::local_service(
            SearcherServer::new(SearcherGrpc::new(self.state.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    /// Returns the node's gRPC handlers to call directly in this process, with
    /// the messages as they are (`quiver_proto::serve_searcher_in_process`).
    pub fn local_searcher(&self) -> quiver_proto::LocalSearcher {
        std::sync::Arc::new(SearcherGrpc::new(self.state.clone()))
    }

    /// Returns the address the node registers with meta (what routing tables
    /// name it by).
    pub fn advertise_address(&self) -> &str {
        &self.state.config.advertise_address
    }

    /// Returns the bound gRPC address.
    pub fn local_address(&self) -> SocketAddr {
        self.local_address
    }

    /// Tells whether every assigned shard is warmed and loaded.
    pub fn is_ready(&self) -> bool {
        state_ready(&self.state)
    }

    /// Returns a readiness check that outlives borrows of the node (`/readyz`).
    pub fn ready_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let state = self.state.clone();
        move || state_ready(&state)
    }

    /// Stops serving: cancels every task and waits (a few seconds at most) for
    /// them to end.
    pub async fn shutdown(self) {
        self.state.shutdown.cancel();
        self.state.tasks.close();
        if tokio::time::timeout(SHUTDOWN_WAIT, self.state.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(node_id = %self.state.config.node_id, tasks = self.state.tasks.len(), "searcher tasks still running at shutdown");
        }
        tracing::info!(node_id = %self.state.config.node_id, "searcher stopped");
    }
}

impl Drop for SearcherNode {
    /// A node dropped without [`SearcherNode::shutdown`] stops its tasks too.
    fn drop(&mut self) {
        self.state.shutdown.cancel();
    }
}

fn state_ready(state: &NodeState) -> bool {
    if !state.registered.load(Ordering::Acquire) || !state.synced.load(Ordering::Acquire) {
        return false;
    }
    let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
    shards.values().all(|shard| shard.view().is_some())
}

fn ready_shards(state: &NodeState) -> Vec<pb::ShardRef> {
    let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
    shards
        .iter()
        .filter(|(_, served)| served.view().is_some())
        .filter_map(|(shard, _)| {
            Some(pb::ShardRef {
                collection_id: shard.collection_id.parse().ok()?,
                shard: shard.shard,
            })
        })
        .collect()
}
