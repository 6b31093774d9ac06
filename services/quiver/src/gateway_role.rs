//! `quiver gateway`: the client API (REST and gRPC), its TLS, API keys and
//! request limits from flags and the `[gateway]` section.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use quiver_gateway::{ApiKeys, GatewayConfig, GatewayServer, Limits, ServerTls};
use quiver_proto::tls::ClusterTls;
use serde::Deserialize;

use crate::data_node::{bind, default_node_id, meta_client};
use crate::http_routes::metrics_router;
use crate::lifecycle::Role;

/// Flags of `quiver gateway` (its REST port is the common --http-listen).
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Metadata nodes, comma-separated.
    #[arg(long, env = "QUIVER_META")]
    pub meta: String,
    /// gRPC address of the client API.
    #[arg(long, env = "QUIVER_GRPC_LISTEN")]
    pub grpc_listen: String,
    /// Node id (default: $HOSTNAME).
    #[arg(long, env = "QUIVER_NODE_ID")]
    pub node_id: Option<String>,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS of the gateway's REST and gRPC ports (both or neither).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain (server certificate first) served on both ports.
    #[arg(long, env = "QUIVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "QUIVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

/// The `[gateway]` section of the config file; flags and `QUIVER_*` variables
/// win over it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFileConfig {
    /// PEM certificate chain (as --tls-cert).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (as --tls-key).
    pub tls_key: Option<PathBuf>,
    /// Points per upsert, ids per delete or get.
    pub max_batch_points: Option<usize>,
    /// Bytes of one point's payload, e.g. `64KiB`.
    pub max_payload_bytes: Option<bytesize::ByteSize>,
    /// Bytes of one request (REST body or gRPC message), e.g. `128MiB`.
    pub max_request_bytes: Option<bytesize::ByteSize>,
    /// Largest `k` of a search.
    pub max_k: Option<usize>,
    /// Searches per batch.
    pub max_batch_searches: Option<usize>,
    /// Timeout of one call to an indexer or searcher.
    pub request_timeout_ms: Option<u64>,
    /// How long an admin compaction request waits before answering `202`
    /// (the compaction goes on); at most 80 % of `request_timeout_ms`.
    pub compact_wait_ms: Option<u64>,
}

/// A gateway's settings from its flags and the config file, checked (TLS files
/// read and matched) before anything starts.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    tls: Option<ServerTls>,
    limits: Limits,
    request_timeout: Option<Duration>,
    compact_wait: Option<Duration>,
}

fn positive<T: PartialOrd + Default + std::fmt::Display>(
    value: Option<T>,
    key: &str,
) -> anyhow::Result<Option<T>> {
    match value {
        Some(value) if value <= T::default() => {
            bail!("[gateway] {key} must be at least 1, got {value}")
        }
        other => Ok(other),
    }
}

impl GatewaySettings {
    /// Combines the TLS flags with the `[gateway]` section.
    pub fn new(tls: &TlsArgs, file: Option<&GatewayFileConfig>) -> anyhow::Result<Self> {
        let file = file.cloned().unwrap_or_default();
        let cert = tls.tls_cert.clone().or(file.tls_cert);
        let key = tls.tls_key.clone().or(file.tls_key);
        let tls = match (cert, key) {
            (None, None) => None,
            (Some(_), None) => bail!("--tls-cert needs --tls-key (the certificate's private key)"),
            (None, Some(_)) => bail!("--tls-key needs --tls-cert (the certificate it belongs to)"),
            (Some(cert), Some(key)) => Some(
                ServerTls::from_pem_files(&cert, &key).map_err(|error| anyhow::anyhow!(error))?,
            ),
        };
        let mut limits = Limits::default();
        if let Some(value) = positive(file.max_batch_points, "max_batch_points")? {
            limits.max_batch_points = value;
        }
        if let Some(value) = positive(
            file.max_payload_bytes.map(|size| size.as_u64()),
            "max_payload_bytes",
        )? {
            limits.max_payload_bytes = usize::try_from(value).unwrap_or(usize::MAX);
        }
        if let Some(value) = positive(
            file.max_request_bytes.map(|size| size.as_u64()),
            "max_request_bytes",
        )? {
            limits.max_request_bytes = usize::try_from(value).unwrap_or(usize::MAX);
        }
        if let Some(value) = positive(file.max_k, "max_k")? {
            limits.max_k = value;
        }
        if let Some(value) = positive(file.max_batch_searches, "max_batch_searches")? {
            limits.max_batch_searches = value;
        }
        let request_timeout =
            positive(file.request_timeout_ms, "request_timeout_ms")?.map(Duration::from_millis);
        let compact_wait =
            positive(file.compact_wait_ms, "compact_wait_ms")?.map(Duration::from_millis);
        Ok(GatewaySettings {
            tls,
            limits,
            request_timeout,
            compact_wait,
        })
    }
}

/// API keys of the gateway (auth is off when none is given).
#[derive(Debug, Clone, clap::Args)]
pub struct KeyArgs {
    /// Keys with read access, comma-separated.
    #[arg(
        long,
        env = "QUIVER_API_KEYS_READ",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys_read: Vec<String>,
    /// Keys with write (and read) access, comma-separated.
    #[arg(
        long,
        env = "QUIVER_API_KEYS_WRITE",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys_write: Vec<String>,
    /// Keys with admin (and write and read) access, comma-separated.
    #[arg(
        long,
        env = "QUIVER_API_KEYS_ADMIN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys_admin: Vec<String>,
}

impl KeyArgs {
    fn keys(&self) -> ApiKeys {
        ApiKeys::new(
            &self.api_keys_read,
            &self.api_keys_write,
            &self.api_keys_admin,
        )
    }
}

/// A running gateway as a [`Role`] (it serves its own HTTP port).
pub struct GatewayRole {
    pub(crate) server: GatewayServer,
}

impl GatewayRole {
    /// Starts the gateway on `http_listen` (REST) and `--grpc-listen`; with
    /// `cluster_tls`, its calls to meta, indexers and searchers speak mutual TLS.
    pub async fn start(
        args: &GatewayArgs,
        settings: &GatewaySettings,
        http_listen: &str,
        extra_metrics: Vec<Arc<dyn Fn() -> String + Send + Sync>>,
        cluster_tls: Option<ClusterTls>,
    ) -> anyhow::Result<GatewayRole> {
        let http = bind(http_listen, "--http-listen").await?;
        let grpc = bind(&args.grpc_listen, "--grpc-listen").await?;
        let node_id = args
            .node_id
            .clone()
            .unwrap_or_else(|| default_node_id("gateway", http_listen));
        let mut config = GatewayConfig::new(node_id);
        config.keys = args.keys.keys();
        config.tls = settings.tls.clone();
        config.cluster_tls = cluster_tls.clone();
        config.limits = settings.limits.clone();
        if let Some(timeout) = settings.request_timeout {
            config.request_timeout = timeout;
        }
        if let Some(wait) = settings.compact_wait {
            config.compact_wait = wait;
        }
        let server = GatewayServer::start(
            config,
            http,
            grpc,
            meta_client(&args.meta, cluster_tls.as_ref())?,
            metrics_router(extra_metrics),
        )
        .await?;
        Ok(GatewayRole { server })
    }
}

#[async_trait::async_trait]
impl Role for GatewayRole {
    fn name(&self) -> &'static str {
        "gateway"
    }

    fn is_ready(&self) -> bool {
        self.server.is_ready()
    }

    fn http_router(&self) -> axum::Router {
        axum::Router::new()
    }

    async fn stop(self: Box<Self>, grace: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(grace, self.server.shutdown())
            .await
            .context("gateway did not stop in time")?;
        Ok(())
    }
}
