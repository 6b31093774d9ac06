//! `quiver-bench`: synthetic datasets and benchmarks of the Quiver engine.

mod cluster;
mod engine;
mod filter;
mod generate;
mod ingest;
mod load;
mod meta;
mod peers;
mod plot;
mod progress;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use quiver_index::{Metric, RawPrecision};

#[derive(Parser)]
#[command(
    name = "quiver-bench",
    version,
    about = "Datasets and benchmarks for Quiver"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum DatasetKind {
    /// Gaussian clusters with anisotropic noise, normalised.
    Clustered,
}

#[derive(Clone, Copy, ValueEnum)]
enum MetricArg {
    Cosine,
    Dot,
    L2,
}

impl MetricArg {
    fn metric(self) -> Metric {
        match self {
            MetricArg::Cosine => Metric::Cosine,
            MetricArg::Dot => Metric::Dot,
            MetricArg::L2 => Metric::L2,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F32,
    Bf16,
}

// Parsed once per run; boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Generates a synthetic dataset with exact ground truth.
    Gen {
        #[arg(long, value_enum, default_value = "clustered")]
        kind: DatasetKind,
        /// Number of base vectors.
        #[arg(long)]
        n: usize,
        /// Dimension.
        #[arg(long)]
        dim: usize,
        /// Number of gaussian clusters.
        #[arg(long, default_value_t = 2000)]
        clusters: usize,
        /// Number of queries (drawn fresh, never copies of base vectors).
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// Norm of the noise added to a unit-norm centre.
        #[arg(long, default_value_t = 0.8)]
        noise: f32,
        /// Noise spectrum decay (0 = isotropic).
        #[arg(long, default_value_t = 1.0)]
        decay: f32,
        /// Cluster weights ∝ 1/rank^zipf.
        #[arg(long, default_value_t = 0.5)]
        zipf: f64,
        /// Ground-truth depth.
        #[arg(long, default_value_t = 100)]
        gt_k: usize,
        #[arg(long, default_value_t = 1234)]
        seed: u64,
        /// Output directory (base.fvecs, queries.fvecs, groundtruth.ivecs).
        #[arg(long)]
        out: PathBuf,
    },
    /// Measures a running Quiver (gateway or standalone) over REST at several concurrencies.
    Cluster {
        /// REST endpoint, e.g. http://127.0.0.1:7700.
        #[arg(long)]
        endpoint: String,
        /// API key (sent as a bearer token).
        #[arg(long, env = "QUIVER_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        #[arg(long)]
        collection: String,
        /// Create the collection and upsert --base first (ids = row numbers).
        #[arg(long, requires = "base")]
        load: bool,
        #[arg(long)]
        base: Option<PathBuf>,
        /// Metric of a collection created by --load.
        #[arg(long, value_enum, default_value = "cosine")]
        metric: MetricArg,
        /// Shards of a collection created by --load.
        #[arg(long, default_value_t = 1)]
        shards: u32,
        #[arg(long)]
        queries: PathBuf,
        #[arg(long)]
        gt: PathBuf,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Client concurrencies to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        concurrency: Vec<usize>,
        /// Lists probed per codebook of a shard (default: the server's calibrated default).
        #[arg(long)]
        nprobe: Option<u32>,
        /// `strong` or `eventual`.
        #[arg(long, default_value = "strong")]
        consistency: String,
        /// Use only the first N queries.
        #[arg(long)]
        max_queries: Option<usize>,
        /// After --load, wait until the WAL tail is flushed and the segment count
        /// has not changed for this many seconds (background merges done), so that
        /// queries measure the steady state; 0 starts querying at once.
        #[arg(long, default_value_t = 20)]
        settle_seconds: u64,
        /// Without --load, also wait for the collection to settle first.
        #[arg(long)]
        wait_settled: bool,
        /// Ask for every hit's payload (what a default search returns).
        #[arg(long)]
        include_payload: bool,
        /// Attach a payload `{"row": i, "bucket": i % 100}` to every point --load writes.
        #[arg(long)]
        load_payloads: bool,
        /// With --load-payloads, also a `text` field of this many bytes in each
        /// payload (documents of a retrieval workload are 1–4 KB).
        #[arg(long, default_value_t = 0)]
        payload_text_bytes: usize,
        /// Process ids of the server (standalone, or gateway + searchers): their CPU
        /// time (user + system, from /proc) per query is reported for each concurrency.
        #[arg(long, value_delimiter = ',')]
        server_pid: Vec<u32>,
        /// Also build one segment of --base in this process and measure the engine
        /// alone at the recall the server delivered, on one thread and with one
        /// thread per core (its CPU per query with every core busy, as a server's
        /// are under concurrent load); with --server-pid, print the server's CPU
        /// per query as a ratio to each.
        #[arg(long, requires = "base")]
        engine: bool,
        /// Send the queries as batch searches of this many (`/search/batch`): QPS
        /// and server CPU are per query, latencies per batch. 1 = single searches.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Measure from the first query: skip the 50 searches otherwise sent before
        /// measuring (a cold cache stays cold for the first concurrency).
        #[arg(long)]
        no_warm_up: bool,
        /// Indexers' Prometheus endpoints (http://HOST:PORT/metrics), comma-separated:
        /// settling also waits until no merge runs there. Default: the endpoint's own
        /// /metrics (quiver standalone serves every role's metrics there).
        #[arg(long, value_delimiter = ',')]
        indexer_metrics: Vec<String>,
        /// Send the measured searches over the gateway's gRPC API at this address
        /// (http://HOST:PORT: `quiver standalone --grpc-listen`, a gateway's
        /// `--grpc-listen`) instead of REST; loading and settling still use REST.
        /// gRPC answers carry no cost block, so the cost columns stay 0.
        #[arg(long)]
        grpc_endpoint: Option<String>,
        /// JSON report path; the latency plot is written beside it as .png.
        #[arg(long)]
        json: PathBuf,
    },
    /// Measures sustained ingest of a running Quiver over REST: rows/s, write-ack latency
    /// and the time from acknowledgement until rows are in segments, per shard count.
    Ingest {
        /// REST endpoint, e.g. http://127.0.0.1:7700.
        #[arg(long)]
        endpoint: String,
        /// API key (sent as a bearer token).
        #[arg(long, env = "QUIVER_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Collections `PREFIX-<shards>s` are created (they must not exist).
        #[arg(long, default_value = "ingest")]
        collection_prefix: String,
        #[arg(long)]
        base: PathBuf,
        #[arg(long, value_enum, default_value = "cosine")]
        metric: MetricArg,
        /// Shard counts to measure, comma-separated (one fresh collection each).
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        shards: Vec<u32>,
        /// Points per upsert request.
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// Concurrent writers.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Use only the first N base vectors.
        #[arg(long)]
        max_rows: Option<usize>,
        /// JSON report path; the timeline plot is written beside it as .png.
        #[arg(long)]
        json: PathBuf,
    },
    /// Measures filtered search (recall against the filter's exact top-k, QPS, latency)
    /// of a running Quiver over REST at several filter selectivities.
    Filter {
        /// REST endpoint, e.g. http://127.0.0.1:7700.
        #[arg(long)]
        endpoint: String,
        /// API key (sent as a bearer token).
        #[arg(long, env = "QUIVER_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        #[arg(long)]
        collection: String,
        /// Create the collection and upsert --base first with payload `tag = row % 1000`.
        #[arg(long)]
        load: bool,
        /// Base vectors (for the exact filtered ground truth, and for --load).
        #[arg(long)]
        base: PathBuf,
        #[arg(long, value_enum, default_value = "cosine")]
        metric: MetricArg,
        /// Shards of a collection created by --load.
        #[arg(long, default_value_t = 1)]
        shards: u32,
        #[arg(long)]
        queries: PathBuf,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Fractions of the rows the filter keeps, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0.5,0.1,0.01,0.001")]
        selectivity: Vec<f64>,
        /// Concurrent clients.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Use only the first N queries.
        #[arg(long)]
        max_queries: Option<usize>,
        /// JSON report path; the plot is written beside it as .png.
        #[arg(long)]
        json: PathBuf,
    },
    /// Times failover, manifest commits and CommitWal throughput of a three-node
    /// metadata cluster of real `quiver meta` processes.
    Meta(MetaArgs),
    /// Builds segments with the real writer and benchmarks search through the real reader.
    Engine {
        #[arg(long)]
        base: PathBuf,
        #[arg(long)]
        queries: PathBuf,
        #[arg(long)]
        gt: PathBuf,
        #[arg(long, value_enum)]
        metric: MetricArg,
        #[arg(long, default_value_t = 10)]
        k: usize,
        /// Lists probed, comma-separated sweep.
        #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128")]
        nprobe: Vec<usize>,
        /// Guard multipliers: besides every row the error bound cannot rule out, the best
        /// k × rescore of the others by estimate are rescored too. Comma-separated sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        rescore: Vec<usize>,
        /// Query threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Build threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        build_threads: usize,
        /// Rows per segment (default: one segment).
        #[arg(long)]
        segment_rows: Option<usize>,
        /// With --segment-rows: build every segment after the first with the
        /// first's codebook (as a shard's flushes are) and search them together,
        /// one top-k over the segments (as a searcher does)
        #[arg(long, requires = "segment_rows")]
        shared_codebook: bool,
        /// IVF lists per segment (default: from the row count).
        #[arg(long)]
        nlist: Option<usize>,
        /// Precision of the stored vectors used for rescoring.
        #[arg(long, value_enum, default_value = "f32")]
        raw_precision: PrecisionArg,
        /// Width of the RaBitQ error bound, in standard deviations.
        #[arg(long, default_value_t = quiver_index::SearchParams::new(10).bound_sigma)]
        bound_sigma: f32,
        /// Use only the first N queries.
        #[arg(long)]
        max_queries: Option<usize>,
        /// Keep the segment files here (default: a temporary directory).
        #[arg(long)]
        segment_dir: Option<PathBuf>,
        /// JSON report path; the plot is written beside it as .png.
        #[arg(long)]
        json: PathBuf,
        /// Peers' results (run_peers.py --out JSON) to compare with in the table and plot.
        #[arg(long)]
        peers: Option<PathBuf>,
        /// Upload the segments to this object store (s3://bucket/prefix, file:///path,
        /// memory://) and search them through the region cache — always through its
        /// regions, also for file:// (which a searcher would map instead). The JSON's
        /// "cache" block: cold_first_query_ms (open + first query on an empty cache);
        /// regions_fetched, the region fills of that cold query, hot and row tier
        /// together (regions_fetched_hot / _rows; a region evicted and fetched again
        /// counts again, see cold_evictions); regions_total, every region of every
        /// segment in the tier that serves its bytes (hot: region_bytes, codes and
        /// the rest; rows: row_region_bytes, raw vectors and payloads) — the same
        /// units, so a cold read of everything fetches regions_total.
        #[arg(long, requires_all = ["cache_dir", "cache_size"])]
        object_store: Option<String>,
        /// Directory of the region cache file.
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Region cache size (e.g. 512MiB, 4GiB).
        #[arg(long, value_parser = parse_size)]
        cache_size: Option<u64>,
        /// Region size of the cache.
        #[arg(long, value_parser = parse_size, default_value = "16MiB")]
        region_size: u64,
    },
}

/// Options of `quiver-bench meta` (see the `meta` module).
#[derive(clap::Args)]
struct MetaArgs {
    /// The `quiver` binary the meta nodes run (default: the one beside
    /// quiver-bench, else `quiver` on PATH).
    #[arg(long)]
    quiver: Option<PathBuf>,
    /// Give the nodes openraft's default timings (250 ms heartbeats, 1–2 s
    /// election timeouts) instead of the test timings (50 ms, 300–600 ms).
    #[arg(long)]
    raft_defaults: bool,
    /// Failover rounds (kill -9 of the leader each).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Sequential manifest commits timed.
    #[arg(long, default_value_t = 500)]
    commits: usize,
    /// Seconds each CommitWal throughput run lasts.
    #[arg(long, default_value_t = 5)]
    wal_seconds: u64,
    /// JSON report path.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Parses a byte size such as `16MiB`, `10GiB` or `4096`.
fn parse_size(text: &str) -> Result<u64, String> {
    text.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|error| format!("size {text:?}: {error}"))
}

impl Command {
    /// Returns the path the command writes its JSON report to, if any.
    fn report_path(&self) -> Option<&Path> {
        match self {
            Command::Gen { .. } => None,
            Command::Cluster { json, .. }
            | Command::Ingest { json, .. }
            | Command::Filter { json, .. }
            | Command::Engine { json, .. } => Some(json),
            Command::Meta(args) => args.json.as_deref(),
        }
    }
}

/// Creates the directory the report `json` goes into and checks that a file
/// can be written there, before a run whose results would otherwise be lost
/// when writing them fails at its end.
fn prepare_report_path(json: &Path) -> Result<()> {
    let directory = json
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(directory).with_context(|| {
        format!(
            "creating {} for the report --json {}",
            directory.display(),
            json.display()
        )
    })?;
    if json.is_dir() {
        bail!("--json {} is a directory", json.display());
    }
    let file_name = json
        .file_name()
        .with_context(|| format!("--json {} names no file", json.display()))?;
    let probe = directory.join(format!(
        ".{}.write-check-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "cannot write in {} (for the report --json {})",
            directory.display(),
            json.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn main() -> Result<()> {
    let command = Cli::parse().command;
    if let Some(json) = command.report_path() {
        prepare_report_path(json)?;
    }
    match command {
        Command::Gen {
            kind: DatasetKind::Clustered,
            n,
            dim,
            clusters,
            queries,
            noise,
            decay,
            zipf,
            gt_k,
            seed,
            out,
        } => generate::generate(
            &generate::GenSpec {
                rows: n,
                dim,
                clusters,
                queries,
                noise,
                decay,
                zipf,
                ground_truth_k: gt_k,
                seed,
            },
            &out,
        ),
        Command::Cluster {
            endpoint,
            api_key,
            collection,
            load,
            base,
            metric,
            shards,
            queries,
            gt,
            k,
            concurrency,
            nprobe,
            consistency,
            max_queries,
            settle_seconds,
            wait_settled,
            include_payload,
            load_payloads,
            payload_text_bytes,
            server_pid,
            engine,
            batch,
            no_warm_up,
            indexer_metrics,
            grpc_endpoint,
            json,
        } => {
            if k == 0 || batch == 0 || concurrency.is_empty() || concurrency.contains(&0) {
                bail!("--k, --batch and --concurrency must be positive");
            }
            if payload_text_bytes > 0 && !(load && load_payloads) {
                bail!("--payload-text-bytes needs --load and --load-payloads");
            }
            let options = cluster::ClusterOptions {
                endpoint,
                api_key,
                collection,
                load,
                base,
                metric: metric.metric().name().to_string(),
                shards,
                queries,
                ground_truth: gt,
                k,
                concurrency,
                nprobe,
                consistency,
                max_queries,
                settle: Duration::from_secs(settle_seconds),
                wait_settled,
                include_payload,
                load_payloads,
                payload_text_bytes,
                server_pids: server_pid,
                engine,
                batch,
                no_warm_up,
                indexer_metrics,
                grpc_endpoint,
                json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(cluster::run(&options))
        }
        Command::Ingest {
            endpoint,
            api_key,
            collection_prefix,
            base,
            metric,
            shards,
            batch,
            concurrency,
            max_rows,
            json,
        } => {
            let options = ingest::IngestOptions {
                endpoint,
                api_key,
                collection_prefix,
                base,
                metric: metric.metric().name().to_string(),
                shards,
                batch,
                concurrency,
                max_rows,
                json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(ingest::run(&options))
        }
        Command::Filter {
            endpoint,
            api_key,
            collection,
            load,
            base,
            metric,
            shards,
            queries,
            k,
            selectivity,
            concurrency,
            max_queries,
            json,
        } => {
            let options = filter::FilterOptions {
                endpoint,
                api_key,
                collection,
                load,
                base,
                metric: metric.metric().name().to_string(),
                shards,
                queries,
                k,
                selectivity,
                concurrency,
                max_queries,
                json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(filter::run(&options))
        }
        Command::Meta(args) => {
            if args.rounds == 0 || args.commits == 0 || args.wal_seconds == 0 {
                bail!("--rounds, --commits and --wal-seconds must be positive");
            }
            let options = meta::MetaOptions {
                quiver: args.quiver.unwrap_or_else(meta::default_quiver_binary),
                raft_defaults: args.raft_defaults,
                rounds: args.rounds,
                commits: args.commits,
                wal_duration: Duration::from_secs(args.wal_seconds),
                json: args.json,
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(meta::run(&options))
        }
        Command::Engine {
            base,
            queries,
            gt,
            metric,
            k,
            nprobe,
            rescore,
            threads,
            build_threads,
            segment_rows,
            shared_codebook,
            nlist,
            raw_precision,
            bound_sigma,
            max_queries,
            segment_dir,
            json,
            peers,
            object_store,
            cache_dir,
            cache_size,
            region_size,
        } => {
            if k == 0
                || nprobe.is_empty()
                || rescore.is_empty()
                || nprobe.contains(&0)
                || rescore.contains(&0)
            {
                bail!("--k, --nprobe and --rescore must be positive");
            }
            engine::run(&engine::EngineOptions {
                base,
                queries,
                ground_truth: gt,
                metric: metric.metric(),
                k,
                nprobes: nprobe,
                rescores: rescore,
                threads,
                build_threads,
                segment_rows,
                shared_codebook,
                nlist,
                raw_precision: match raw_precision {
                    PrecisionArg::F32 => RawPrecision::F32,
                    PrecisionArg::Bf16 => RawPrecision::Bf16,
                },
                bound_sigma,
                max_queries,
                segment_dir,
                json,
                peers,
                object_store,
                cache_dir,
                cache_size,
                region_size,
            })
        }
    }
}
