//! `quiver searcher`: the read path, through a local region cache, for the
//! shards the metadata service assigns to this node.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_proto::tls::ClusterTls;
use quiver_searcher::{ReadContext, SearcherNode, SearcherNodeConfig};

use crate::config_sections::{CacheSize, DataFileConfig, parse_cache_size, parse_size};
use crate::data_node::{NodeArgs, NodeStart};
use crate::http_routes::health_router;
use crate::lifecycle::Role;

/// Flags of `quiver searcher`.
#[derive(Debug, Clone, clap::Args)]
pub struct SearcherArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Directory of the region cache file (local disk).
    #[arg(long, env = "QUIVER_CACHE_DIR")]
    pub cache_dir: PathBuf,
    /// Size of the region cache file: a size (`10GiB`) or a share of the free
    /// space of the cache directory's disk, measured at start (`80%`, the default).
    #[arg(long, env = "QUIVER_CACHE_SIZE", value_parser = parse_cache_size, default_value = "80%")]
    pub cache_size: CacheSize,
    /// Region size of the cache.
    #[arg(long, env = "QUIVER_REGION_SIZE", value_parser = parse_size, default_value = "16MiB")]
    pub region_size: u64,
    /// Read the segments of a `file://` object store straight from their files
    /// (mapped) instead of copying them into the cache file.
    #[arg(long, env = "QUIVER_MAP_LOCAL_FILES", default_value_t = true, action = clap::ArgAction::Set)]
    pub map_local_files: bool,
    /// Region size of the cache's row tier (raw vectors and payloads, 75 % of the
    /// cache; a segment's row chunk is 64 KiB); `0` keeps one tier for all.
    #[arg(long, env = "QUIVER_ROW_REGION_SIZE", value_parser = parse_size, default_value = "64KiB")]
    pub row_region_size: u64,
}

/// A running searcher as a [`Role`].
pub struct SearcherRole {
    node: SearcherNode,
}

impl SearcherRole {
    /// Starts the searcher (with `cluster_tls`, its gRPC port and its calls to
    /// meta speak mutual TLS).
    pub async fn start(
        args: &SearcherArgs,
        file: &DataFileConfig,
        cluster_tls: Option<&ClusterTls>,
    ) -> anyhow::Result<SearcherRole> {
        let NodeStart {
            storage,
            listener,
            advertise,
            node_id,
            meta,
        } = args.node.start("searcher", file, cluster_tls).await?;
        let cache_config = match args.cache_size {
            CacheSize::Bytes(capacity_bytes) => BlobCacheConfig {
                directory: args.cache_dir.clone(),
                capacity_bytes,
                region_bytes: args.region_size,
                map_local_files: args.map_local_files,
                row_region_bytes: args.row_region_size,
            },
            CacheSize::ShareOfFreeSpace(percent) => BlobCacheConfig {
                map_local_files: args.map_local_files,
                row_region_bytes: args.row_region_size,
                ..BlobCacheConfig::share_of_free_space(&args.cache_dir, percent, args.region_size)
                    .context("sizing the region cache")?
            },
        };
        tracing::info!(
            directory = %cache_config.directory.display(),
            cache_bytes = cache_config.capacity_bytes,
            cache_size = ?args.cache_size,
            "region cache sized"
        );
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
        config.cluster_tls = cluster_tls.cloned();
        if let Some(section) = &file.searcher {
            section.apply(&mut config)?;
        }
        let node = SearcherNode::start(config, listener, meta, context).await?;
        Ok(SearcherRole { node })
    }
}

impl SearcherRole {
    /// Returns the searcher as the gateway of this process calls it: its
    /// address in meta's routing table, its service (no socket) and its
    /// handlers (called directly, no encoding).
    pub fn local_searcher(
        &self,
    ) -> (
        String,
        quiver_proto::LocalService,
        quiver_proto::LocalSearcher,
    ) {
        (
            self.node.advertise_address().to_string(),
            self.node.local_service(),
            self.node.local_searcher(),
        )
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
