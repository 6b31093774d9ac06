//! `quiver meta`: one metadata node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use quiver_meta::{MetaConfig, MetaServer};
use quiver_proto::tls::ClusterTls;

use crate::lifecycle::Role;

/// Flags of `quiver meta` (each also readable from a `QUIVER_*` variable).
#[derive(Debug, Clone, clap::Args)]
pub struct MetaArgs {
    /// Raft node id of this metadata node (≥ 1).
    #[arg(long, env = "QUIVER_NODE_ID")]
    pub node_id: Option<u64>,
    /// Directory of the Raft log and snapshots.
    #[arg(long, env = "QUIVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC address (client API and Raft), e.g. 127.0.0.1:7100.
    #[arg(long, env = "QUIVER_LISTEN")]
    pub listen: Option<String>,
    /// Address peers and clients use for this node (default: the listen address).
    #[arg(long, env = "QUIVER_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// Metadata nodes: `1=ADDR,2=ADDR,3=ADDR`.
    #[arg(long, env = "QUIVER_PEERS", value_parser = parse_peers)]
    pub peers: Option<BTreeMap<u64, String>>,
    /// Initialize a new cluster from the peers (or this node alone) if there is no Raft state yet.
    #[arg(long, env = "QUIVER_INIT")]
    pub init: bool,
}

/// Parses `1=ADDR,2=ADDR` into a map.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let (id, address) = part
            .split_once('=')
            .ok_or_else(|| format!("peer `{part}` is not ID=ADDR"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("peer id `{id}` is not a number"))?;
        let address = address.trim();
        if address.is_empty() {
            return Err(format!("peer {id} has no address"));
        }
        if peers.insert(id, address.to_owned()).is_some() {
            return Err(format!("peer {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("--peers lists no peer".into());
    }
    Ok(peers)
}

/// Builds the node's configuration: defaults, then the file's `[meta]`, then flags/env.
pub fn meta_config(args: &MetaArgs, from_file: Option<MetaConfig>) -> anyhow::Result<MetaConfig> {
    let file_given = from_file.is_some();
    let mut config = from_file.unwrap_or_default();
    if let Some(node_id) = args.node_id {
        config.node_id = node_id;
    }
    match &args.data_dir {
        Some(data_dir) => config.data_dir = data_dir.clone(),
        None if !file_given => anyhow::bail!("--data-dir is required"),
        None => {}
    }
    match &args.listen {
        Some(listen) => config.listen = listen.clone(),
        None if !file_given => anyhow::bail!("--listen is required"),
        None => {}
    }
    if args.node_id.is_none() && !file_given {
        anyhow::bail!("--node-id is required");
    }
    if let Some(address) = &args.advertise_address {
        config.advertise_address = Some(address.clone());
    }
    if let Some(peers) = &args.peers {
        config.peers = peers.clone();
    }
    config.init |= args.init;
    config.validate()?;
    Ok(config)
}

/// A running metadata node as a [`Role`].
pub struct MetaRole {
    server: MetaServer,
}

impl MetaRole {
    /// Starts the node (with `cluster_tls`, its gRPC port and Raft calls
    /// speak mutual TLS).
    pub async fn start(
        config: MetaConfig,
        cluster_tls: Option<ClusterTls>,
    ) -> anyhow::Result<MetaRole> {
        let server = MetaServer::start_with_tls(config, cluster_tls)
            .await
            .context("metadata node did not start")?;
        Ok(MetaRole { server })
    }
}

#[async_trait::async_trait]
impl Role for MetaRole {
    fn name(&self) -> &'static str {
        "meta"
    }

    fn is_ready(&self) -> bool {
        self.server.is_ready()
    }

    fn http_router(&self) -> axum::Router {
        self.server.http_router()
    }

    async fn stop(self: Box<Self>, grace: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(grace, self.server.shutdown())
            .await
            .context("metadata node did not stop in time")??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_lists_are_named() {
        let peers = parse_peers("1=127.0.0.1:7101, 2=127.0.0.1:7102,3=h:1").expect("parse");
        assert_eq!(peers.len(), 3);
        assert_eq!(peers[&2], "127.0.0.1:7102");
        assert!(parse_peers("1=a,1=b").unwrap_err().contains("twice"));
        assert!(parse_peers("x=a").unwrap_err().contains("`x`"));
        assert!(parse_peers("1").unwrap_err().contains("ID=ADDR"));
    }

    #[test]
    fn flags_override_the_file_and_required_flags_are_named() {
        let args = MetaArgs {
            node_id: Some(2),
            data_dir: None,
            listen: Some("127.0.0.1:9000".into()),
            advertise_address: None,
            peers: None,
            init: false,
        };
        let from_file = MetaConfig {
            snapshot_logs: 7,
            ..MetaConfig::new(1, "/tmp/x", "127.0.0.1:1")
        };
        let config = meta_config(&args, Some(from_file)).expect("config");
        assert_eq!(config.node_id, 2);
        assert_eq!(config.listen, "127.0.0.1:9000");
        assert_eq!(config.snapshot_logs, 7);
        let error = meta_config(&args, None).unwrap_err();
        assert!(error.to_string().contains("--data-dir"), "{error}");
    }
}
