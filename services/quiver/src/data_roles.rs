//! `quiver indexer`, `quiver searcher`, `quiver gateway`, and `quiver standalone`
//! (every role in one process over a local directory).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_gateway::{ApiKeys, GatewayConfig, GatewayServer, Limits, ServerTls};
use quiver_indexer::{IndexerConfig, IndexerNode, IndexerNodeConfig};
use quiver_meta::MetaServer;
use quiver_meta_client::MetaClient;
use quiver_searcher::{ReadContext, SearcherNode, SearcherNodeConfig};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::lifecycle::Role;

/// Parses sizes like `16MiB`, `10GiB`, `1000000`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|error| format!("`{text}` is not a size like 512MiB or 10GiB: {error}"))
}

/// Object-store options shared by the roles that read or write objects.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Object store: s3://bucket/prefix, file:///abs/path or memory://.
    #[arg(long, env = "QUIVER_OBJECT_STORE")]
    pub object_store: Option<String>,
}

/// Options of the data roles' config file sections.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFileConfig {
    /// `[storage]`: S3 settings (the AWS_* variables override), timeouts and retries.
    #[serde(default)]
    pub storage: Option<StorageFileConfig>,
    /// `[indexer]`: write-path knobs.
    #[serde(default)]
    pub indexer: Option<IndexerConfig>,
    /// `[searcher]`: read-path knobs.
    #[serde(default)]
    pub searcher: Option<SearcherFileConfig>,
}

/// The `[storage]` section of the config file: how to reach S3 (the `AWS_*`
/// variables override these keys) and how long to wait for it. Unset timeouts
/// keep the defaults of [`StorageOptions`].
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageFileConfig {
    /// Endpoint URL of an S3-compatible server.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
    /// Virtual-hosted-style requests instead of path style.
    #[serde(default)]
    pub virtual_hosted_style: bool,
    /// Bound on one HTTP request, body included (ms; default 30000).
    pub request_timeout_ms: Option<u64>,
    /// Bound on connecting (ms; default 5000).
    pub connect_timeout_ms: Option<u64>,
    /// Bound on one operation, retries included (ms; default 120000).
    pub operation_timeout_ms: Option<u64>,
    /// Retries of a failed request (default 5).
    pub max_retries: Option<usize>,
    /// First retry delay, doubling after each retry (ms; default 100).
    pub initial_backoff_ms: Option<u64>,
}

impl std::fmt::Debug for StorageFileConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StorageFileConfig")
            .field("settings", &self.settings())
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("operation_timeout_ms", &self.operation_timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("initial_backoff_ms", &self.initial_backoff_ms)
            .finish()
    }
}

impl StorageFileConfig {
    /// Returns the S3 connection settings of the section.
    pub fn settings(&self) -> S3Settings {
        S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            session_token: self.session_token.clone(),
            virtual_hosted_style: self.virtual_hosted_style,
        }
    }

    /// Returns the timeouts and retries of the section over the defaults;
    /// refuses zero timeouts and a request timeout beyond the operation timeout.
    pub fn options(&self) -> anyhow::Result<StorageOptions> {
        let mut options = StorageOptions::default();
        for (key, value, field) in [
            (
                "request_timeout_ms",
                self.request_timeout_ms,
                &mut options.request_timeout,
            ),
            (
                "connect_timeout_ms",
                self.connect_timeout_ms,
                &mut options.connect_timeout,
            ),
            (
                "operation_timeout_ms",
                self.operation_timeout_ms,
                &mut options.operation_timeout,
            ),
            (
                "initial_backoff_ms",
                self.initial_backoff_ms,
                &mut options.initial_backoff,
            ),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    bail!("[storage] {key} must be positive");
                }
                *field = Duration::from_millis(ms);
            }
        }
        if let Some(retries) = self.max_retries {
            options.max_retries = retries;
        }
        if options.request_timeout > options.operation_timeout {
            bail!(
                "[storage] request_timeout_ms ({} ms) exceeds operation_timeout_ms ({} ms)",
                options.request_timeout.as_millis(),
                options.operation_timeout.as_millis()
            );
        }
        Ok(options)
    }
}

/// The `[searcher]` section of the config file (flags win over the cache keys).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearcherFileConfig {
    /// How often the searcher heartbeats to meta (ms; default 1000).
    pub heartbeat_interval_ms: Option<u64>,
    /// How often it also reads the whole routing table besides the watch stream (ms; default 15000).
    pub safety_poll_interval_ms: Option<u64>,
    /// First pause before reopening a broken watch stream (ms; default 100).
    pub watch_initial_backoff_ms: Option<u64>,
    /// Longest pause before reopening a broken watch stream (ms; default 5000).
    pub watch_max_backoff_ms: Option<u64>,
}

impl SearcherFileConfig {
    /// Checks the section without a node (at start, before anything is created).
    pub fn validate(&self) -> anyhow::Result<()> {
        self.apply(&mut SearcherNodeConfig::new("check", "check"))
    }

    /// Applies the section to `config`; refuses zero periods.
    fn apply(&self, config: &mut SearcherNodeConfig) -> anyhow::Result<()> {
        for (key, value, field) in [
            (
                "heartbeat_interval_ms",
                self.heartbeat_interval_ms,
                &mut config.heartbeat_interval,
            ),
            (
                "safety_poll_interval_ms",
                self.safety_poll_interval_ms,
                &mut config.safety_poll_interval,
            ),
            (
                "watch_initial_backoff_ms",
                self.watch_initial_backoff_ms,
                &mut config.watch_initial_backoff,
            ),
            (
                "watch_max_backoff_ms",
                self.watch_max_backoff_ms,
                &mut config.watch_max_backoff,
            ),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    bail!("[searcher] {key} must be positive");
                }
                *field = Duration::from_millis(ms);
            }
        }
        if config.watch_initial_backoff > config.watch_max_backoff {
            bail!("[searcher] watch_initial_backoff_ms exceeds watch_max_backoff_ms");
        }
        Ok(())
    }
}

fn meta_client(addresses: &str) -> anyhow::Result<MetaClient> {
    let addresses: Vec<String> = addresses
        .split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .map(str::to_string)
        .collect();
    if addresses.is_empty() {
        bail!("--meta lists no address");
    }
    MetaClient::connect(addresses).context("metadata client")
}

async fn open_storage(url: &str, file: &DataFileConfig) -> anyhow::Result<Storage> {
    let url: StoreUrl = url
        .parse()
        .with_context(|| format!("--object-store `{url}`"))?;
    let section = file.storage.clone().unwrap_or_default();
    let options = section.options()?;
    let settings = S3Settings::from_env().or(section.settings());
    if let StoreUrl::S3 { bucket, .. } = &url {
        quiver_storage::ensure_bucket(&settings, bucket)
            .await
            .with_context(|| format!("bucket `{bucket}`"))?;
    }
    Ok(Storage::open(&url, &settings, options)?)
}

async fn bind(address: &str, flag: &str) -> anyhow::Result<TcpListener> {
    let socket: SocketAddr = address
        .parse()
        .with_context(|| format!("{flag} `{address}` is not an ip:port address"))?;
    TcpListener::bind(socket)
        .await
        .with_context(|| format!("cannot listen on {flag} {address}"))
}

/// The address other nodes use: the advertised one, or the bound one unless it
/// is a wildcard.
fn advertised(bound: SocketAddr, advertise: Option<&str>) -> anyhow::Result<String> {
    if let Some(address) = advertise {
        return Ok(address.to_string());
    }
    if bound.ip().is_unspecified() {
        bail!(
            "--listen {bound} is a wildcard address; give --advertise-address HOST:PORT so other nodes can reach this one"
        );
    }
    Ok(bound.to_string())
}

fn default_node_id(role: &str, address: &str) -> String {
    match std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
    {
        Some(host) => host,
        None => format!("{role}-{address}"),
    }
}

/// The process's Prometheus registry as text, plus any extra registries.
pub fn metrics_router(extra: Vec<Arc<dyn Fn() -> String + Send + Sync>>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let extra = extra.clone();
            async move {
                let mut text = prometheus::TextEncoder::new()
                    .encode_to_string(&prometheus::gather())
                    .unwrap_or_default();
                for render in &extra {
                    text.push_str(&render());
                }
                text
            }
        }),
    )
}

fn health_router(ready: Arc<dyn Fn() -> bool + Send + Sync>) -> axum::Router {
    metrics_router(Vec::new())
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ready = ready.clone();
                async move {
                    if ready() {
                        (axum::http::StatusCode::OK, "ready")
                    } else {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
}

/// Flags every data node (indexer, searcher) takes.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Metadata nodes, comma-separated.
    #[arg(long, env = "QUIVER_META")]
    pub meta: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// gRPC address of the node's API.
    #[arg(long, env = "QUIVER_LISTEN")]
    pub listen: String,
    /// Address other nodes reach this one at (default: --listen).
    #[arg(long, env = "QUIVER_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// Node id (default: $HOSTNAME).
    #[arg(long, env = "QUIVER_NODE_ID")]
    pub node_id: Option<String>,
}

/// What a data node starts with: its store, bound listener, advertised address
/// and node id.
struct NodeStart {
    storage: Storage,
    listener: TcpListener,
    advertise: String,
    node_id: String,
    meta: MetaClient,
}

impl NodeArgs {
    async fn start(&self, role: &str, file: &DataFileConfig) -> anyhow::Result<NodeStart> {
        let url = self
            .store
            .object_store
            .as_deref()
            .context("--object-store is required")?;
        let storage = open_storage(url, file).await?;
        let listener = bind(&self.listen, "--listen").await?;
        let advertise = advertised(listener.local_addr()?, self.advertise_address.as_deref())?;
        let node_id = self
            .node_id
            .clone()
            .unwrap_or_else(|| default_node_id(role, &advertise));
        Ok(NodeStart {
            storage,
            listener,
            advertise,
            node_id,
            meta: meta_client(&self.meta)?,
        })
    }
}

/// Flags of `quiver indexer`.
#[derive(Debug, Clone, clap::Args)]
pub struct IndexerArgs {
    #[command(flatten)]
    pub node: NodeArgs,
}

/// A running indexer as a [`Role`].
pub struct IndexerRole {
    node: IndexerNode,
}

impl IndexerRole {
    /// Starts the indexer.
    pub async fn start(args: &IndexerArgs, file: &DataFileConfig) -> anyhow::Result<IndexerRole> {
        let start = args.node.start("indexer", file).await?;
        let mut config = IndexerNodeConfig::new(start.node_id, start.advertise);
        if let Some(indexer) = &file.indexer {
            indexer
                .validate()
                .map_err(|reason| anyhow::anyhow!("[indexer] {reason}"))?;
            config.indexer = indexer.clone();
        }
        let node = IndexerNode::start(config, start.listener, start.meta, start.storage).await?;
        Ok(IndexerRole { node })
    }
}

#[async_trait::async_trait]
impl Role for IndexerRole {
    fn name(&self) -> &'static str {
        "indexer"
    }

    fn is_ready(&self) -> bool {
        self.node.is_ready()
    }

    fn http_router(&self) -> axum::Router {
        let ready = self.node.ready_probe();
        health_router(Arc::new(ready))
    }

    async fn stop(self: Box<Self>, grace: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(grace, self.node.shutdown())
            .await
            .context("indexer did not stop in time")?;
        Ok(())
    }
}

/// Flags of `quiver searcher`.
#[derive(Debug, Clone, clap::Args)]
pub struct SearcherArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Directory of the region cache file (local disk).
    #[arg(long, env = "QUIVER_CACHE_DIR")]
    pub cache_dir: PathBuf,
    /// Size of the region cache file, e.g. 10GiB.
    #[arg(long, env = "QUIVER_CACHE_SIZE", value_parser = parse_size)]
    pub cache_size: u64,
    /// Region size of the cache.
    #[arg(long, env = "QUIVER_REGION_SIZE", value_parser = parse_size, default_value = "16MiB")]
    pub region_size: u64,
}

/// A running searcher as a [`Role`].
pub struct SearcherRole {
    node: SearcherNode,
}

impl SearcherRole {
    /// Starts the searcher.
    pub async fn start(args: &SearcherArgs, file: &DataFileConfig) -> anyhow::Result<SearcherRole> {
        let NodeStart {
            storage,
            listener,
            advertise,
            node_id,
            meta,
        } = args.node.start("searcher", file).await?;
        let cache_config = BlobCacheConfig {
            directory: args.cache_dir.clone(),
            capacity_bytes: args.cache_size,
            region_bytes: args.region_size,
        };
        let runtime = tokio::runtime::Handle::current();
        let cache = tokio::task::spawn_blocking({
            let storage = storage.clone();
            let runtime = runtime.clone();
            // A full cache disk is not fatal: the cache reads through to the
            // object store (slow, logged, `quiver_cache_read_through` = 1).
            move || BlobCache::new_or_read_through(&cache_config, storage, runtime)
        })
        .await?
        .context("region cache")?;
        let context = Arc::new(ReadContext::new(Arc::new(cache), storage, runtime));
        let mut config = SearcherNodeConfig::new(node_id, advertise);
        if let Some(section) = &file.searcher {
            section.apply(&mut config)?;
        }
        let node = SearcherNode::start(config, listener, meta, context).await?;
        Ok(SearcherRole { node })
    }
}

#[async_trait::async_trait]
impl Role for SearcherRole {
    fn name(&self) -> &'static str {
        "searcher"
    }

    fn is_ready(&self) -> bool {
        self.node.is_ready()
    }

    fn http_router(&self) -> axum::Router {
        let ready = self.node.ready_probe();
        health_router(Arc::new(ready))
    }

    async fn stop(self: Box<Self>, grace: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(grace, self.node.shutdown())
            .await
            .context("searcher did not stop in time")?;
        Ok(())
    }
}

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
    server: GatewayServer,
}

impl GatewayRole {
    /// Starts the gateway on `http_listen` (REST) and `--grpc-listen`.
    pub async fn start(
        args: &GatewayArgs,
        settings: &GatewaySettings,
        http_listen: &str,
        extra_metrics: Vec<Arc<dyn Fn() -> String + Send + Sync>>,
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
            meta_client(&args.meta)?,
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

/// Flags of `quiver standalone`.
#[derive(Debug, Clone, clap::Args)]
pub struct StandaloneArgs {
    /// Directory holding everything: Raft log, objects, cache.
    #[arg(long, env = "QUIVER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// gRPC address of the client API.
    #[arg(long, env = "QUIVER_GRPC_LISTEN", default_value = "127.0.0.1:7701")]
    pub grpc_listen: String,
    /// Size of the search cache file under the data directory.
    #[arg(long, env = "QUIVER_CACHE_SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub cache_size: u64,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Every role in one process.
pub struct StandaloneRole {
    meta: Option<MetaServer>,
    indexer: IndexerRole,
    searcher: SearcherRole,
    gateway: GatewayRole,
}

impl StandaloneRole {
    /// Starts meta, indexer, searcher and gateway over `--data-dir`.
    pub async fn start(
        args: &StandaloneArgs,
        settings: &GatewaySettings,
        http_listen: &str,
        file: &DataFileConfig,
    ) -> anyhow::Result<StandaloneRole> {
        let data_dir = &args.data_dir;
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create --data-dir {}", data_dir.display()))?;
        let data_dir = data_dir
            .canonicalize()
            .with_context(|| format!("--data-dir {}", data_dir.display()))?;
        let meta = quiver_meta::run_single_node(&data_dir.join("meta"), "127.0.0.1:0")
            .await
            .context("metadata node did not start")?;
        meta.wait_for_leader(Duration::from_secs(30))
            .await
            .context("metadata node elected no leader")?;
        let meta_address = meta.local_address().to_string();
        let objects = format!("file://{}", data_dir.join("objects").display());
        let indexer = IndexerRole::start(
            &IndexerArgs {
                node: NodeArgs {
                    meta: meta_address.clone(),
                    store: StoreArgs {
                        object_store: Some(objects.clone()),
                    },
                    listen: "127.0.0.1:0".into(),
                    advertise_address: None,
                    node_id: Some("standalone-indexer".into()),
                },
            },
            file,
        )
        .await?;
        let searcher = SearcherRole::start(
            &SearcherArgs {
                node: NodeArgs {
                    meta: meta_address.clone(),
                    store: StoreArgs {
                        object_store: Some(objects),
                    },
                    listen: "127.0.0.1:0".into(),
                    advertise_address: None,
                    node_id: Some("standalone-searcher".into()),
                },
                cache_dir: data_dir.join("cache"),
                cache_size: args.cache_size,
                region_size: BlobCacheConfig::DEFAULT_REGION_BYTES,
            },
            file,
        )
        .await?;
        let meta_metrics = meta.metrics().clone();
        let gateway = GatewayRole::start(
            &GatewayArgs {
                meta: meta_address,
                grpc_listen: args.grpc_listen.clone(),
                node_id: Some("standalone-gateway".into()),
                keys: args.keys.clone(),
                tls: args.tls.clone(),
            },
            settings,
            http_listen,
            vec![Arc::new(move || meta_metrics.render())],
        )
        .await?;
        tracing::info!(
            http = %gateway.server.http_address(),
            grpc = %gateway.server.grpc_address(),
            data_dir = %data_dir.display(),
            "standalone quiver ready to serve"
        );
        Ok(StandaloneRole {
            meta: Some(meta),
            indexer,
            searcher,
            gateway,
        })
    }
}

#[async_trait::async_trait]
impl Role for StandaloneRole {
    fn name(&self) -> &'static str {
        "standalone"
    }

    fn is_ready(&self) -> bool {
        self.indexer.is_ready() && self.searcher.is_ready() && self.gateway.is_ready()
    }

    fn http_router(&self) -> axum::Router {
        axum::Router::new()
    }

    async fn stop(mut self: Box<Self>, grace: Duration) -> anyhow::Result<()> {
        // Front door first, meta last: requests drain, then the roles they use stop.
        Box::new(self.gateway).stop(grace).await?;
        Box::new(self.searcher).stop(grace).await?;
        Box::new(self.indexer).stop(grace).await?;
        if let Some(meta) = self.meta.take() {
            tokio::time::timeout(grace, meta.shutdown())
                .await
                .context("metadata node did not stop in time")??;
        }
        Ok(())
    }
}
