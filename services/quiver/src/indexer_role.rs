//! `quiver indexer`: the write path (WAL, flushes, merges) for the shards the
//! metadata service leases to this node.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quiver_indexer::{IndexerNode, IndexerNodeConfig};
use quiver_proto::tls::ClusterTls;

use crate::config_sections::DataFileConfig;
use crate::data_node::NodeArgs;
use crate::http_routes::health_router;
use crate::lifecycle::Role;

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
    /// Starts the indexer (with `cluster_tls`, its gRPC port and its calls to
    /// meta speak mutual TLS).
    pub async fn start(
        args: &IndexerArgs,
        file: &DataFileConfig,
        cluster_tls: Option<&ClusterTls>,
    ) -> anyhow::Result<IndexerRole> {
        let start = args.node.start("indexer", file, cluster_tls).await?;
        let mut config = IndexerNodeConfig::new(start.node_id, start.advertise);
        config.cluster_tls = cluster_tls.cloned();
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
