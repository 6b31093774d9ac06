//! The gateway role: serves REST on its HTTP listener and the client API on its
//! gRPC listener, registers with meta as a gateway node and keeps its routing
//! table fresh.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::serve::ListenerExt;
use quiver_meta_client::{MetaClient, NodeIdentity, keep_registered};
use quiver_proto::client::quiver_server::QuiverServer;
use quiver_proto::meta as pb;
use quiver_proto::tls::{ClusterTls, Incoming};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::ApiKeys;
use crate::core::{Gateway, Limits};
use crate::error::GatewayError;
use crate::grpc::ClientApi;
use crate::rest::{RestState, router};
use crate::routing::Router;
use crate::tls::{ServerTls, TlsListener};

/// Settings of a gateway.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Node id (the pod name in Kubernetes).
    pub node_id: String,
    /// API keys (none: auth off).
    pub keys: ApiKeys,
    /// Request limits.
    pub limits: Limits,
    /// Timeout of a call to an indexer or searcher.
    pub request_timeout: Duration,
    /// How long an admin compaction waits for the indexers before answering
    /// "still running" (`202`); capped at 80 % of `request_timeout`.
    pub compact_wait: Duration,
    /// How often the routing table is re-read in the background.
    pub routing_interval: Duration,
    /// TLS for both ports (none: plaintext).
    pub tls: Option<ServerTls>,
    /// Mutual TLS with the cluster CA on the calls to indexers and searchers
    /// (the meta client has its own; none: plaintext).
    pub cluster_tls: Option<ClusterTls>,
}

impl GatewayConfig {
    /// Returns the defaults for `node_id`.
    pub fn new(node_id: impl Into<String>) -> Self {
        GatewayConfig {
            node_id: node_id.into(),
            keys: ApiKeys::default(),
            limits: Limits::default(),
            request_timeout: Duration::from_secs(30),
            compact_wait: Duration::from_secs(24),
            routing_interval: Duration::from_millis(500),
            tls: None,
            cluster_tls: None,
        }
    }
}

/// A running gateway.
pub struct GatewayServer {
    http_address: SocketAddr,
    grpc_address: SocketAddr,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl GatewayServer {
    /// Starts serving REST on `http` (plus `extra_routes`, e.g. `/metrics`) and
    /// gRPC on `grpc`.
    pub async fn start(
        config: GatewayConfig,
        http: TcpListener,
        grpc: TcpListener,
        meta: MetaClient,
        extra_routes: axum::Router,
    ) -> Result<GatewayServer, GatewayError> {
        let http_address = http
            .local_addr()
            .map_err(|error| GatewayError::unavailable(format!("http listener: {error}")))?;
        let grpc_address = grpc
            .local_addr()
            .map_err(|error| GatewayError::unavailable(format!("grpc listener: {error}")))?;
        let routing = Arc::new(Router::new(
            meta.clone(),
            config.request_timeout,
            config.cluster_tls.clone(),
        ));
        // Gateway::compact caps the wait below the request timeout itself.
        let gateway = Arc::new(
            Gateway::new(routing.clone(), config.limits.clone())
                .with_compact_wait(config.compact_wait),
        );
        let ready = Arc::new(AtomicBool::new(false));
        let ready_probe = ready.clone();
        let rest = router(Arc::new(RestState {
            gateway: gateway.clone(),
            keys: config.keys.clone(),
            ready: Arc::new(move || ready_probe.load(Ordering::Acquire)),
        }))
        .merge(extra_routes);
        let shutdown = CancellationToken::new();
        let stop_http = shutdown.clone().cancelled_owned();
        let http_task = match &config.tls {
            None => tokio::spawn(async move {
                // Small answers must not wait for the client's delayed ACK (Nagle).
                let http = http.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                if let Err(error) = axum::serve(http, rest)
                    .with_graceful_shutdown(stop_http)
                    .await
                {
                    tracing::error!(%error, "gateway http server failed");
                }
            }),
            Some(tls) => {
                let listener = TlsListener::new(http, tls).map_err(|error| {
                    GatewayError::unavailable(format!("https listener: {error}"))
                })?;
                tokio::spawn(async move {
                    if let Err(error) = axum::serve(listener, rest)
                        .with_graceful_shutdown(stop_http)
                        .await
                    {
                        tracing::error!(%error, "gateway https server failed");
                    }
                })
            }
        };
        let max_message_bytes = config.limits.max_request_bytes;
        let service = QuiverServer::new(ClientApi {
            gateway: gateway.clone(),
            keys: config.keys.clone(),
        })
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes.max(128 << 20));
        let stop_grpc = shutdown.clone().cancelled_owned();
        // Every connection has TCP_NODELAY (small answers, see the REST port).
        let incoming = match &config.tls {
            None => Incoming::plain(grpc),
            Some(tls) => tls.grpc_incoming(grpc).map_err(|error| {
                GatewayError::unavailable(format!("grpc tls listener: {error}"))
            })?,
        };
        let grpc_task = tokio::spawn(async move {
            let result = quiver_proto::http2::grpc_server()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, stop_grpc)
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "gateway grpc server failed");
            }
        });
        let membership = tokio::spawn(keep_registered(
            meta,
            NodeIdentity {
                node_id: config.node_id.clone(),
                role: pb::NodeRole::Gateway,
                address: http_address.to_string(),
            },
            config.routing_interval,
            Arc::new(AtomicBool::new(false)),
            Vec::new,
            shutdown.clone(),
        ));
        let background = tokio::spawn(routing_loop(
            config.routing_interval,
            routing,
            ready.clone(),
            shutdown.clone(),
        ));
        let tls = config.tls.is_some();
        let cluster_tls = config.cluster_tls.is_some();
        tracing::info!(%http_address, %grpc_address, tls, cluster_tls, "gateway started");
        Ok(GatewayServer {
            http_address,
            grpc_address,
            ready,
            shutdown,
            tasks: vec![http_task, grpc_task, membership, background],
        })
    }

    /// Returns the bound REST address.
    pub fn http_address(&self) -> SocketAddr {
        self.http_address
    }

    /// Returns the bound gRPC address.
    pub fn grpc_address(&self) -> SocketAddr {
        self.grpc_address
    }

    /// Tells whether the gateway reached meta and knows the routing table.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Stops accepting requests and lets those in flight finish.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        tracing::info!("gateway stopped");
    }
}

/// A gateway dropped without [`GatewayServer::shutdown`] stops its servers and
/// loops too (without waiting for them).
impl Drop for GatewayServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Keeps the routing table fresh; the gateway is ready once it read it.
async fn routing_loop(
    interval: Duration,
    routing: Arc<Router>,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match routing.refresh().await {
            Ok(()) => ready.store(true, Ordering::Release),
            Err(error) => tracing::debug!(%error, "routing refresh failed"),
        }
    }
}
