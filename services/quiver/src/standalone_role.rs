//! `quiver standalone`: every role in one process over a local directory (the
//! embedded default): meta, indexer, searcher and gateway, stopped front door first.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quiver_blobcache::BlobCacheConfig;
use quiver_meta::{MetaConfig, MetaServer};

use crate::config_sections::{CacheSize, DataFileConfig, parse_cache_size};
use crate::data_node::{NodeArgs, StoreArgs};
use crate::gateway_role::{GatewayArgs, GatewayRole, GatewaySettings, KeyArgs, TlsArgs};
use crate::indexer_role::{IndexerArgs, IndexerRole};
use crate::lifecycle::Role;
use crate::searcher_role::{SearcherArgs, SearcherRole};

/// How long `quiver standalone` keeps an object the shard no longer references
/// (a flushed WAL object, a merged segment) before deleting it: 30 s, not a
/// cluster's 5 minutes. Its only searcher is in this process and maps a segment
/// when it loads the manifest naming it (a file deleted later stays readable
/// through the mapping), so the grace only covers a manifest announced but not
/// loaded yet. Kept 5 minutes, the objects a load of 1M × 768 rows retires (the
/// WAL, the segments merged away) held ~9 GB of disk beside the 3.2 GB of the
/// settled shard, and the disk at the load's peak ~14 GB.
pub const STANDALONE_GC_GRACE_MS: u64 = 30_000;

/// Flags of `quiver standalone`.
#[derive(Debug, Clone, clap::Args)]
pub struct StandaloneArgs {
    /// Directory holding everything: Raft log, objects, cache.
    #[arg(long, env = "QUIVER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// gRPC address of the client API.
    #[arg(long, env = "QUIVER_GRPC_LISTEN", default_value = "127.0.0.1:7701")]
    pub grpc_listen: String,
    /// Size of the search cache file under the data directory: a size or a
    /// share of the free disk space (`10%`). Small by default: standalone reads
    /// its segments straight from their files (mapped, through the kernel's page
    /// cache), so the region cache holds only what is not a local file.
    #[arg(long, env = "QUIVER_CACHE_SIZE", value_parser = parse_cache_size, default_value = "64MiB")]
    pub cache_size: CacheSize,
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
    /// Meta's and the searcher's services, registered for in-process calls.
    _in_process: Vec<quiver_proto::InProcessRegistration>,
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
        let meta = quiver_meta::run_single_node_with(MetaConfig {
            gc_grace_ms: STANDALONE_GC_GRACE_MS,
            fixed_membership: true,
            ..MetaConfig::new(1, data_dir.join("meta"), "127.0.0.1:0")
        })
        .await
        .context("metadata node did not start")?;
        meta.wait_for_leader(Duration::from_secs(30))
            .await
            .context("metadata node elected no leader")?;
        let meta_address = meta.local_address().to_string();
        // Every role's calls to meta, and the gateway's to the searcher, stay in
        // this process: the services are called directly, not over loopback gRPC.
        let mut in_process = vec![
            quiver_proto::serve_in_process(meta_address.clone(), meta.local_service()),
            quiver_proto::serve_meta_in_process(meta_address.clone(), meta.local_meta()),
        ];
        let objects = format!("file://{}", data_dir.join("objects").display());
        // Builds spill their rows to scratch files: under the data directory
        // (a disk), not the system temporary directory (often memory).
        let mut file = file.clone();
        let indexer_config = file.indexer.get_or_insert_with(Default::default);
        if indexer_config.scratch_dir.is_empty() {
            let scratch = data_dir.join("scratch");
            std::fs::create_dir_all(&scratch)
                .with_context(|| format!("cannot create {}", scratch.display()))?;
            indexer_config.scratch_dir = scratch.display().to_string();
        }
        let file = &file;
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
            None,
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
                map_local_files: true,
                row_region_size: BlobCacheConfig::DEFAULT_ROW_REGION_BYTES,
            },
            file,
            None,
        )
        .await?;
        let (searcher_address, searcher_service, searcher_handlers) = searcher.local_searcher();
        in_process.push(quiver_proto::serve_searcher_in_process(
            searcher_address.clone(),
            searcher_handlers,
        ));
        in_process.push(quiver_proto::serve_in_process(
            searcher_address,
            searcher_service,
        ));
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
            None,
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
            _in_process: in_process,
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
