//! `quiver`: runs one Quiver role per process (`quiver meta|indexer|searcher|gateway`)
//! or all of them in one (`quiver standalone --data-dir DIR`), through the
//! [`lifecycle::Role`] trait.
//!
//! - `main.rs`: the command line, the config file, logging, the HTTP port of the
//!   roles that do not serve their own, and shutdown on SIGTERM/SIGINT.
//! - [`lifecycle`]: the `Role` trait every role implements.
//! - one module per role: `meta_role`, `indexer_role`, `searcher_role`,
//!   `gateway_role`, `standalone_role` (all of them in one process).
//! - what the data roles share: `data_node` (flags, object store, listener,
//!   advertised address, node id), `config_sections` (the `[storage]`,
//!   `[indexer]`, `[searcher]` sections), `http_routes` (`/metrics`, `/healthz`,
//!   `/readyz`).
//! - `cluster_tls`: TLS between roles (`--cluster-tls-ca|cert|key`), which every
//!   role but `standalone` takes.

/// jemalloc returns freed memory to the system as it goes; glibc's malloc
/// kept each thread's arena at its high-water mark, gigabytes after a large
/// load (see docs/operations.md, Sizing).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod cluster_tls;
mod config_flags;
mod config_sections;
mod data_node;
mod gateway_role;
mod http_routes;
mod indexer_role;
mod lifecycle;
mod meta_role;
mod searcher_role;
mod standalone_role;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use clap::{Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use tokio_util::sync::CancellationToken;

use crate::cluster_tls::{ClusterTlsArgs, ClusterTlsFileKeys};
use crate::config_sections::{DataFileConfig, SearcherFileConfig, StorageFileConfig};
use crate::gateway_role::{GatewayArgs, GatewayFileConfig, GatewayRole, GatewaySettings};
use crate::indexer_role::{IndexerArgs, IndexerRole};
use crate::lifecycle::{Role, shutdown_signal};
use crate::meta_role::{MetaArgs, MetaRole, meta_config};
use crate::searcher_role::{SearcherArgs, SearcherRole};
use crate::standalone_role::{StandaloneArgs, StandaloneRole};

/// Quiver: a distributed vector search cluster.
#[derive(Debug, Parser)]
#[command(name = "quiver", version, about)]
struct Cli {
    #[command(subcommand)]
    command: RoleCommand,
}

#[derive(Debug, Subcommand)]
enum RoleCommand {
    /// Runs a metadata node (Raft-replicated cluster catalog).
    Meta {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        meta: MetaArgs,
        #[command(flatten)]
        cluster_tls: ClusterTlsArgs,
    },
    /// Runs an indexer (writes: WAL, flushes, merges) for the shards meta leases to it.
    Indexer {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        indexer: IndexerArgs,
        #[command(flatten)]
        cluster_tls: ClusterTlsArgs,
    },
    /// Runs a searcher (reads through a local region cache) for the shards meta assigns to it.
    Searcher {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        searcher: SearcherArgs,
        #[command(flatten)]
        cluster_tls: ClusterTlsArgs,
    },
    /// Runs a gateway: the client API (REST on --http-listen, gRPC on --grpc-listen).
    Gateway {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[command(flatten)]
        cluster_tls: ClusterTlsArgs,
    },
    /// Runs every role in one process over a local directory (the embedded default).
    Standalone {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        standalone: StandaloneArgs,
    },
}

/// Options every role takes.
#[derive(Debug, Clone, clap::Args)]
struct CommonArgs {
    /// TOML configuration file; flags and `QUIVER_*` variables override it.
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = "QUIVER_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// Address of the HTTP port: /metrics, /healthz and /readyz on every role, and
    /// the REST API on the gateway (required there) and standalone (default
    /// 127.0.0.1:7700).
    #[arg(long, env = "QUIVER_HTTP_LISTEN")]
    http_listen: Option<String>,
    /// Time to drain on SIGTERM before exiting.
    #[arg(long, env = "QUIVER_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    shutdown_grace_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LogFormat {
    Json,
    Text,
}

/// The configuration file: process-wide keys plus one section per role.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    log_format: Option<LogFormat>,
    http_listen: Option<String>,
    /// PEM certificate(s) of the cluster CA (as --cluster-tls-ca).
    cluster_tls_ca: Option<PathBuf>,
    /// PEM certificate chain of the role (as --cluster-tls-cert).
    cluster_tls_cert: Option<PathBuf>,
    /// PEM private key of the role (as --cluster-tls-key).
    cluster_tls_key: Option<PathBuf>,
    meta: Option<quiver_meta::MetaConfig>,
    storage: Option<StorageFileConfig>,
    indexer: Option<quiver_indexer::IndexerConfig>,
    searcher: Option<SearcherFileConfig>,
    gateway: Option<GatewayFileConfig>,
}

impl FileConfig {
    fn cluster_tls_keys(&self) -> ClusterTlsFileKeys {
        ClusterTlsFileKeys {
            cluster_tls_ca: self.cluster_tls_ca.clone(),
            cluster_tls_cert: self.cluster_tls_cert.clone(),
            cluster_tls_key: self.cluster_tls_key.clone(),
        }
    }

    fn data(&self) -> DataFileConfig {
        DataFileConfig {
            storage: self.storage.clone(),
            indexer: self.indexer.clone(),
            searcher: self.searcher.clone(),
        }
    }
}

/// Reads the config file of `role`: its sections and process-wide keys. Its
/// top-level keys that name flags of the role were applied as their
/// variables before the command line was parsed (`config_flags`), so they are
/// left out here.
fn read_config_file(path: Option<&Path>, role: &str) -> anyhow::Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let mut text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    if let Ok(mut table) = text.parse::<toml::Table>() {
        let flags = config_flags::file_flags(role);
        let before = table.len();
        table.retain(|key, value| {
            config_flags::flag_value(value).is_none() || !flags.iter().any(|(flag, _)| flag == key)
        });
        if table.len() != before {
            text = toml::to_string(&table).context("config file: writing back its sections")?;
        }
    }
    toml::from_str(&text).map_err(|error| {
        let mut reason = error.message().replace('\n', " ");
        if reason.starts_with("unknown field") {
            reason.push_str(&format!(
                ", or a flag of `quiver {role}` (`data_dir = \"…\"` for --data-dir)"
            ));
        }
        // Type errors do not name the key: quote the line they are on.
        let place = error
            .span()
            .map(|span| {
                let start = span.start.min(text.len());
                let line_number = text[..start].matches('\n').count() + 1;
                let line = text.lines().nth(line_number - 1).unwrap_or_default().trim();
                format!(" line {line_number} (`{line}`)")
            })
            .unwrap_or_default();
        anyhow::anyhow!("config file {}{place}: {reason}", path.display())
    })
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Binds the HTTP port before any role starts, so a bad address fails fast.
async fn bind_http(address: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let socket_address: SocketAddr = address
        .parse()
        .with_context(|| format!("--http-listen `{address}` is not an ip:port address"))?;
    tokio::net::TcpListener::bind(socket_address)
        .await
        .with_context(|| format!("cannot listen on http address {address}"))
}

fn serve_http(
    role: &dyn Role,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let router = role.http_router();
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, role = role.name(), "http endpoints serving");
    }
    tokio::spawn(async move {
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            tracing::warn!(%error, "http server failed");
        }
    })
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let common = match &cli.command {
        RoleCommand::Meta { common, .. }
        | RoleCommand::Indexer { common, .. }
        | RoleCommand::Searcher { common, .. }
        | RoleCommand::Gateway { common, .. }
        | RoleCommand::Standalone { common, .. } => common.clone(),
    };
    let role_name = match &cli.command {
        RoleCommand::Meta { .. } => "meta",
        RoleCommand::Indexer { .. } => "indexer",
        RoleCommand::Searcher { .. } => "searcher",
        RoleCommand::Gateway { .. } => "gateway",
        RoleCommand::Standalone { .. } => "standalone",
    };
    let file = read_config_file(common.config.as_deref(), role_name)?;
    let log_format = common
        .log_format
        .or(file.log_format)
        .unwrap_or(LogFormat::Text);
    let http_listen = common.http_listen.clone().or(file.http_listen.clone());
    let data_file = file.data();
    // Configuration errors surface before logging starts, as one line on stderr.
    if let Some(section) = &file.searcher {
        section.validate()?;
    }
    if let Some(section) = &file.indexer {
        section
            .validate()
            .map_err(|reason| anyhow::anyhow!("[indexer] {reason}"))?;
    }
    if let Some(section) = &file.storage {
        section.options()?;
    }
    let cluster_tls = match &cli.command {
        RoleCommand::Meta { cluster_tls, .. }
        | RoleCommand::Indexer { cluster_tls, .. }
        | RoleCommand::Searcher { cluster_tls, .. }
        | RoleCommand::Gateway { cluster_tls, .. } => {
            cluster_tls::cluster_tls(cluster_tls, &file.cluster_tls_keys())?
        }
        RoleCommand::Standalone { .. } => {
            if file.cluster_tls_keys().any() {
                anyhow::bail!(
                    "the cluster_tls_* keys do not apply to `quiver standalone`: its roles call each other inside the process (--tls-cert/--tls-key cover its client ports)"
                );
            }
            None
        }
    };
    let meta_config = match &cli.command {
        RoleCommand::Meta { meta, .. } => Some(meta_config(meta, file.meta.clone())?),
        _ => None,
    };
    let gateway_settings = match &cli.command {
        RoleCommand::Gateway { gateway, .. } => {
            Some(GatewaySettings::new(&gateway.tls, file.gateway.as_ref())?)
        }
        RoleCommand::Standalone { standalone, .. } => Some(GatewaySettings::new(
            &standalone.tls,
            file.gateway.as_ref(),
        )?),
        _ => None,
    };
    init_logging(log_format);

    // The gateway and standalone serve their own HTTP port (REST + /metrics);
    // the other roles' port is bound before the role starts, so a taken port
    // fails fast.
    let serves_own_http = matches!(
        cli.command,
        RoleCommand::Gateway { .. } | RoleCommand::Standalone { .. }
    );
    let http_listener = match (&http_listen, serves_own_http) {
        (Some(address), false) => Some(bind_http(address).await?),
        _ => None,
    };
    let role: Box<dyn Role> = match &cli.command {
        RoleCommand::Meta { .. } => {
            let config = meta_config.expect("built above");
            Box::new(MetaRole::start(config, cluster_tls).await?)
        }
        RoleCommand::Indexer { indexer, .. } => {
            Box::new(IndexerRole::start(indexer, &data_file, cluster_tls.as_ref()).await?)
        }
        RoleCommand::Searcher { searcher, .. } => {
            Box::new(SearcherRole::start(searcher, &data_file, cluster_tls.as_ref()).await?)
        }
        RoleCommand::Gateway { gateway, .. } => {
            let address = http_listen
                .as_deref()
                .context("--http-listen is required for the gateway (its REST port)")?;
            let settings = gateway_settings.as_ref().expect("built above");
            Box::new(GatewayRole::start(gateway, settings, address, Vec::new(), cluster_tls).await?)
        }
        RoleCommand::Standalone { standalone, .. } => {
            let address = http_listen.as_deref().unwrap_or("127.0.0.1:7700");
            let settings = gateway_settings.as_ref().expect("built above");
            Box::new(StandaloneRole::start(standalone, settings, address, &data_file).await?)
        }
    };
    let shutdown = CancellationToken::new();
    let http_task =
        http_listener.map(|listener| serve_http(role.as_ref(), listener, shutdown.clone()));
    tracing::info!(
        role = role.name(),
        ready = role.is_ready(),
        simd = %quiver_simd::selected_isa(),
        bf16_products = %quiver_simd::product_unit()
            .map_or_else(|| "none".to_string(), |unit| unit.to_string()),
        "role started"
    );
    shutdown_signal().await;
    tracing::info!(role = role.name(), "shutting down");
    shutdown.cancel();
    role.stop(Duration::from_millis(common.shutdown_grace_ms))
        .await?;
    if let Some(task) = http_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    Ok(())
}

fn main() -> ExitCode {
    // Flags the config file sets become their variables first (no thread yet).
    let from_file = config_flags::apply_file_flags();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error)
            if !error.use_stderr()
                || error.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            error.exit()
        }
        Err(error) => {
            // One line, as every other configuration error.
            let text = error.render().to_string();
            let mut reason: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                .collect();
            let applied;
            if !from_file.is_empty() {
                applied = format!("(set in the config file: {})", from_file.join(", "));
                reason.push(&applied);
            }
            eprintln!("{}", reason.join(" "));
            return ExitCode::from(2);
        }
    };
    // A cap on the SIMD kernels that names no instruction set is refused here,
    // before anything is served (the kernels would ignore it).
    if let Err(error) = quiver_simd::simd_max_from_env() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    // One TLS provider for the whole process (every TLS port, S3 clients).
    quiver_proto::tls::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let reason = format!("{error:#}").replace('\n', " ");
            eprintln!("error: {reason}");
            ExitCode::FAILURE
        }
    }
}
