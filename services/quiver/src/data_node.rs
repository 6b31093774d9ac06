//! What every data node (indexer, searcher) starts from: its flags, its object
//! store (the bucket made if missing), its bound gRPC listener, the address
//! other nodes reach it at, its node id, and its metadata client (over TLS
//! between roles when configured).

use std::net::SocketAddr;

use anyhow::{Context, bail};
use quiver_meta_client::{MetaClient, MetaClientConfig};
use quiver_proto::tls::ClusterTls;
use quiver_storage::{S3Settings, Storage, StoreUrl};
use tokio::net::TcpListener;

use crate::config_sections::DataFileConfig;

/// Object-store options shared by the roles that read or write objects.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Object store: s3://bucket/prefix, file:///abs/path or memory://.
    #[arg(long, env = "QUIVER_OBJECT_STORE")]
    pub object_store: Option<String>,
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
pub(crate) struct NodeStart {
    pub(crate) storage: Storage,
    pub(crate) listener: TcpListener,
    pub(crate) advertise: String,
    pub(crate) node_id: String,
    pub(crate) meta: MetaClient,
}

impl NodeArgs {
    pub(crate) async fn start(
        &self,
        role: &str,
        file: &DataFileConfig,
        cluster_tls: Option<&ClusterTls>,
    ) -> anyhow::Result<NodeStart> {
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
            meta: meta_client(&self.meta, cluster_tls)?,
        })
    }
}

/// Returns the metadata client of a role: the `--meta` addresses, over mutual
/// TLS with `cluster_tls`.
pub(crate) fn meta_client(
    addresses: &str,
    cluster_tls: Option<&ClusterTls>,
) -> anyhow::Result<MetaClient> {
    let addresses: Vec<String> = addresses
        .split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .map(str::to_string)
        .collect();
    if addresses.is_empty() {
        bail!("--meta lists no address");
    }
    let mut config = MetaClientConfig::new(addresses);
    config.tls = cluster_tls.cloned();
    MetaClient::new(config).context("metadata client")
}

pub(crate) async fn open_storage(url: &str, file: &DataFileConfig) -> anyhow::Result<Storage> {
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

pub(crate) async fn bind(address: &str, flag: &str) -> anyhow::Result<TcpListener> {
    let socket: SocketAddr = address
        .parse()
        .with_context(|| format!("{flag} `{address}` is not an ip:port address"))?;
    TcpListener::bind(socket)
        .await
        .with_context(|| format!("cannot listen on {flag} {address}"))
}

/// The address other nodes use: the advertised one, or the bound one unless it
/// is a wildcard.
pub(crate) fn advertised(bound: SocketAddr, advertise: Option<&str>) -> anyhow::Result<String> {
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

pub(crate) fn default_node_id(role: &str, address: &str) -> String {
    match std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
    {
        Some(host) => host,
        None => format!("{role}-{address}"),
    }
}
