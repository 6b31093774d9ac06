//! `quiver-bench cluster`: recall, throughput and latency of a running Quiver
//! (a cluster's gateway or `quiver standalone`) over its REST API, at several
//! client concurrencies; optionally loads the base vectors first.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use quiver_client::{Client, CollectionConfig, Search};
use quiver_common::stats::percentile_or_zero;
use quiver_common::vecs::{read_fvecs, read_ivecs};
use serde::Serialize;

/// Options of `quiver-bench cluster`.
pub struct ClusterOptions {
    pub endpoint: String,
    pub api_key: Option<String>,
    pub collection: String,
    pub load: bool,
    pub base: Option<PathBuf>,
    pub metric: String,
    pub shards: u32,
    pub queries: PathBuf,
    pub ground_truth: PathBuf,
    pub k: usize,
    pub concurrency: Vec<usize>,
    pub nprobe: Option<u32>,
    pub consistency: String,
    pub max_queries: Option<usize>,
    /// After a load: how long the collection must stay unchanged (see [`settle`]).
    pub settle: Duration,
    /// Wait for the collection to settle even without a load.
    pub wait_settled: bool,
    /// Searches ask for payloads.
    pub include_payload: bool,
    /// --load writes a small payload on every point.
    pub load_payloads: bool,
    /// Bytes of text in each loaded payload's `text` field (0: no text field).
    pub payload_text_bytes: usize,
    /// Server processes whose CPU time per query is reported.
    pub server_pids: Vec<u32>,
    /// Also measure the engine alone on --base at the recall the server
    /// delivered (one segment, one thread) and print the CPU ratio.
    pub engine: bool,
    /// Queries per request: 1 = single searches, more = `/search/batch`.
    pub batch: usize,
    /// Skip the 50 searches sent before measuring (a cold cache stays cold).
    pub no_warm_up: bool,
    /// Prometheus endpoints of the indexers (default: the endpoint's own
    /// `/metrics`, which `quiver standalone` serves for every role): settling
    /// also waits for `quiver_indexer_merges_running` to be 0 there.
    pub indexer_metrics: Vec<String>,
    /// Measured searches go over the gateway's gRPC API at this address.
    pub grpc_endpoint: Option<String>,
    pub json: PathBuf,
}

/// The gateway's gRPC client API, for the measured searches.
type GrpcClient = quiver_proto::client::quiver_client::QuiverClient<tonic::transport::Channel>;

/// What the measurement keeps of one search's answer, whatever the transport.
struct Answer {
    /// The hits' numeric ids (row numbers of the base), in rank order.
    ids: Vec<Option<u64>>,
    /// The REST answer's cost block (gRPC answers have none).
    cost: Option<quiver_client::SearchCost>,
}

impl From<quiver_client::SearchResponse> for Answer {
    fn from(response: quiver_client::SearchResponse) -> Self {
        Answer {
            ids: response.hits.iter().map(|hit| hit.id.as_u64()).collect(),
            cost: response.cost,
        }
    }
}

impl From<quiver_proto::client::SearchResponse> for Answer {
    fn from(response: quiver_proto::client::SearchResponse) -> Self {
        use quiver_proto::data::point_id::Kind;
        Answer {
            ids: response
                .hits
                .iter()
                .map(
                    |hit| match hit.id.as_ref().and_then(|id| id.kind.as_ref()) {
                        Some(Kind::Num(id)) => Some(*id),
                        _ => None,
                    },
                )
                .collect(),
            cost: None,
        }
    }
}

/// The gRPC form of a search.
fn grpc_search(name: &str, search: &Search) -> quiver_proto::client::SearchRequest {
    use quiver_proto::client::Consistency;
    quiver_proto::client::SearchRequest {
        collection: name.to_string(),
        vector: search.vector.clone(),
        k: search.k as u32,
        nprobe: search.nprobe.unwrap_or(0),
        consistency: match search.consistency.as_deref() {
            Some("eventual") => Consistency::Eventual,
            _ => Consistency::Strong,
        } as i32,
        include_payload: search.include_payload,
        ..Default::default()
    }
}

/// A gRPC request carrying the API key, if any, as the gateway expects it.
fn grpc_request<T>(message: T, api_key: Option<&str>) -> Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = api_key {
        let value = format!("Bearer {key}")
            .parse()
            .context("the API key is not valid gRPC metadata")?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// Runs `searches` (one request: single or batch) over REST or gRPC.
async fn send_searches(
    client: &Client,
    grpc: Option<&GrpcClient>,
    api_key: Option<&str>,
    name: &str,
    searches: &[Search],
) -> Result<Vec<Answer>> {
    match grpc {
        None if searches.len() == 1 => Ok(vec![client.search(name, &searches[0]).await?.into()]),
        None => Ok(client
            .search_batch(name, searches)
            .await?
            .into_iter()
            .map(Answer::from)
            .collect()),
        Some(grpc) if searches.len() == 1 => {
            let request = grpc_request(grpc_search(name, &searches[0]), api_key)?;
            Ok(vec![
                grpc.clone().search(request).await?.into_inner().into(),
            ])
        }
        Some(grpc) => {
            let batch = quiver_proto::client::SearchBatchRequest {
                collection: name.to_string(),
                searches: searches
                    .iter()
                    .map(|search| grpc_search(name, search))
                    .collect(),
            };
            let request = grpc_request(batch, api_key)?;
            Ok(grpc
                .clone()
                .search_batch(request)
                .await?
                .into_inner()
                .results
                .into_iter()
                .map(Answer::from)
                .collect())
        }
    }
}

/// Clock ticks per second of `/proc`'s CPU times.
fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

/// The command name and the CPU time (user + system, clock ticks: fields 14
/// and 15) of a `/proc/…/stat` text. The name may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let (name, after) = stat.split_once('(')?.1.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |index: usize| fields.get(index)?.parse::<u64>().ok();
    Some((name, field(11)? + field(12)?))
}

/// CPU time (user + system) of the processes `pids` so far, in milliseconds,
/// from `/proc/PID/stat`.
fn server_cpu_ms(pids: &[u32]) -> Result<f64> {
    let mut ticks = 0u64;
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        ticks += parse_stat(&stat)
            .with_context(|| format!("{path}: no command name or CPU time fields"))?
            .1;
    }
    Ok(ticks as f64 * 1e3 / ticks_per_second())
}

/// The server's thread groups by name, as `quiver` names its threads: search
/// threads (`quiver-search-N`), the async workers (`tokio-rt-worker`), segment
/// builds (`quiver-build-…`: flushes, merges, codebooks). Every other thread —
/// and threads that ended during the point, whose time only the process
/// total keeps — count as `other`.
const THREAD_GROUPS: [(&str, &str); 3] = [
    ("search", "quiver-search-"),
    ("async", "tokio-rt-worker"),
    ("build", "quiver-build-"),
];

/// CPU time so far of the threads of `pids` in each of [`THREAD_GROUPS`],
/// milliseconds, from `/proc/PID/task/TID/stat` (threads that end between
/// two readings drop out of their group: the difference of the process total
/// and the groups is reported as `other`).
fn server_cpu_ms_by_group(pids: &[u32]) -> Result<[f64; THREAD_GROUPS.len()]> {
    let mut ticks = [0u64; THREAD_GROUPS.len()];
    for pid in pids {
        let tasks = format!("/proc/{pid}/task");
        for task in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
            // A thread may end while it is read: skip it.
            let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
                continue;
            };
            let Some((name, spent)) = parse_stat(&stat) else {
                continue;
            };
            if let Some(group) = THREAD_GROUPS
                .iter()
                .position(|(_, prefix)| name.starts_with(prefix))
            {
                ticks[group] += spent;
            }
        }
    }
    Ok(ticks.map(|ticks| ticks as f64 * 1e3 / ticks_per_second()))
}

/// Peak resident memory (`VmHWM`) and current anonymous memory (`RssAnon`)
/// of the processes `pids`, summed, in MiB, from `/proc/PID/status`.
fn server_memory_mib(pids: &[u32]) -> Result<(f64, f64)> {
    let (mut peak_kb, mut anon_kb) = (0u64, 0u64);
    for pid in pids {
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        for line in status.lines() {
            let field = |name: &str| {
                line.strip_prefix(name)
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|kb| kb.parse::<u64>().ok())
            };
            if let Some(kb) = field("VmHWM:") {
                peak_kb += kb;
            }
            if let Some(kb) = field("RssAnon:") {
                anon_kb += kb;
            }
        }
    }
    Ok((peak_kb as f64 / 1024.0, anon_kb as f64 / 1024.0))
}

#[derive(Serialize)]
struct ClusterPoint {
    concurrency: usize,
    /// Queries per request (1: single searches; latencies are per request).
    batch: usize,
    nprobe: u32,
    rescore: u32,
    recall: f64,
    qps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
    /// Server CPU milliseconds per query (0 without --server-pid).
    server_cpu_ms_per_query: f64,
    /// The same by thread group: `search`, `async`, `build` and `other`
    /// (see [`THREAD_GROUPS`]; empty without --server-pid).
    server_cpu_ms_per_query_by_thread: std::collections::BTreeMap<&'static str, f64>,
    /// Mean rows whose codes were scanned per query (from the cost block).
    rows_scanned: f64,
    /// Mean WAL-tail rows scored per query.
    tail_rows_scored: f64,
    /// Mean segments searched per query.
    segments: f64,
    /// Mean time inside the searchers per query, milliseconds.
    search_ms: f64,
    /// Share of the region-cache reads that hit (both tiers; 1 when nothing
    /// was read through the cache, e.g. files mapped directly).
    cache_hit_ratio: f64,
    /// Mean bytes fetched from the object store per query.
    bytes_fetched_per_query: f64,
    /// Mean rescoring (row) reads per query served from local disk and fetched remotely.
    row_reads_local: f64,
    row_reads_remote: f64,
    /// Mean time a query waited on the object store, milliseconds.
    store_wait_ms: f64,
    /// Mean times a query waited on the object store (its round trips).
    store_waits: f64,
    /// Peak resident memory (VmHWM) of the server processes so far, MiB, and
    /// their anonymous memory (RssAnon) after the point (0 without --server-pid).
    server_peak_rss_mib: f64,
    server_rss_anon_mib: f64,
    /// Server CPU per query ÷ the engine alone's at the same recall, one
    /// search thread (--engine with --server-pid).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_vs_engine: Option<f64>,
    /// The same ÷ the engine's CPU per query with one search thread per core
    /// (every core busy, as the server's are under concurrent load).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_vs_engine_all_cores: Option<f64>,
}

/// Region-cache counters of a point's answers (their cost blocks), summed.
#[derive(Default)]
struct CacheTotals {
    regions_hit: u64,
    regions_missed: u64,
    bytes_fetched: u64,
    row_reads_local: u64,
    row_reads_remote: u64,
    store_wait_ms: f64,
    store_waits: u64,
}

impl CacheTotals {
    fn add(&mut self, cost: &quiver_client::SearchCost) {
        self.regions_hit += cost.cache_regions_hit;
        self.regions_missed += cost.cache_regions_missed;
        self.bytes_fetched += cost.bytes_fetched;
        self.row_reads_local += cost.row_reads_local;
        self.row_reads_remote += cost.row_reads_remote;
        self.store_wait_ms += cost.store_wait_ms;
        self.store_waits += cost.store_waits;
    }

    fn hit_ratio(&self) -> f64 {
        let reads = self.regions_hit + self.regions_missed;
        if reads == 0 {
            1.0
        } else {
            self.regions_hit as f64 / reads as f64
        }
    }
}

async fn load(client: &Client, options: &ClusterOptions) -> Result<f64> {
    let path = options
        .base
        .as_ref()
        .context("--load needs --base B.fvecs")?;
    let base = read_fvecs(path, None)?;
    let config = CollectionConfig {
        dimension: base.dim as u32,
        metric: options.metric.clone(),
        id_type: None,
        shards: Some(options.shards),
        replication: None,
        payload_schema: Vec::new(),
    };
    match client.create_collection(&options.collection, &config).await {
        Ok(_) => {}
        Err(error) if error.code() == Some(quiver_client::ErrorCode::AlreadyExists) => {
            bail!(
                "collection {} exists with another definition; drop it or pick another --collection",
                options.collection
            )
        }
        Err(error) => return Err(error.into()),
    }
    let started = Instant::now();
    let (with_payloads, text_bytes) = (options.load_payloads, options.payload_text_bytes);
    let payload = move |row: usize| -> Option<serde_json::Value> {
        if !with_payloads {
            return None;
        }
        let mut payload = serde_json::json!({"row": row, "bucket": row % 100});
        if text_bytes > 0 {
            // Words of a document's size, different per row.
            let text: String = (0..text_bytes)
                .map(|i| {
                    let c = (row * 31 + i * 7) % 27;
                    if c == 26 {
                        ' '
                    } else {
                        (b'a' + c as u8) as char
                    }
                })
                .collect();
            payload["text"] = serde_json::Value::String(text);
        }
        Some(payload)
    };
    crate::load::upsert_rows(client, &options.collection, &Arc::new(base), payload).await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Waits until the loaded collection is at rest: nothing left in the WAL tail
/// and the segment count unchanged for `options.settle` (flushes and
/// background merges done), so that queries measure the steady state, not
/// queries competing with merges for the CPU.
async fn settle(client: &Client, options: &ClusterOptions) -> Result<()> {
    if options.settle.is_zero() {
        return Ok(());
    }
    let started = Instant::now();
    let metrics_urls: Vec<String> = if options.indexer_metrics.is_empty() {
        vec![format!(
            "{}/metrics",
            options.endpoint.trim_end_matches('/')
        )]
    } else {
        options.indexer_metrics.clone()
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut last: Option<(u64, u64)> = None;
    let mut unchanged_since = Instant::now();
    let mut reported = Instant::now();
    loop {
        let described = client.describe(&options.collection).await?;
        let shape = (described.segments, described.bytes);
        let flushed = described.wal_tail_rows == 0;
        // A merge of many rows can run longer than the settle window without
        // changing the segment count: wait for it too, where it can be seen.
        let merging = merges_running(&http, &metrics_urls).await;
        if last.as_ref() != Some(&shape) || !flushed || merging > 0 {
            last = Some(shape);
            unchanged_since = Instant::now();
        } else if unchanged_since.elapsed() >= options.settle {
            println!(
                "settled in {:.1} s: {} segments, nothing unflushed, no merge running, unchanged for {} s",
                started.elapsed().as_secs_f64(),
                described.segments,
                options.settle.as_secs()
            );
            return Ok(());
        }
        if reported.elapsed() >= Duration::from_secs(10) {
            reported = Instant::now();
            println!(
                "settling: {} segments, {} rows in the WAL tail, {} merges running ({:.0} s)",
                described.segments,
                described.wal_tail_rows,
                merging,
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sums `quiver_indexer_merges_running` over `urls` (Prometheus text); an
/// endpoint that does not answer or does not have it counts 0.
async fn merges_running(http: &reqwest::Client, urls: &[String]) -> u64 {
    let mut running = 0;
    for url in urls {
        let Ok(response) = http.get(url).send().await else {
            continue;
        };
        let Ok(text) = response.text().await else {
            continue;
        };
        running += text
            .lines()
            .filter_map(|line| line.strip_prefix("quiver_indexer_merges_running "))
            .filter_map(|value| value.trim().parse::<f64>().ok())
            .map(|value| value as u64)
            .sum::<u64>();
    }
    running
}

/// Runs the benchmark.
pub async fn run(options: &ClusterOptions) -> Result<()> {
    let client = Client::new(&options.endpoint, options.api_key.clone())?;
    let load_seconds = if options.load {
        let seconds = load(&client, options).await?;
        println!("loaded in {seconds:.1} s");
        settle(&client, options).await?;
        Some(seconds)
    } else {
        if options.wait_settled {
            settle(&client, options).await?;
        }
        None
    };
    let grpc = match &options.grpc_endpoint {
        Some(address) => Some(
            GrpcClient::connect(address.clone())
                .await
                .with_context(|| format!("cannot reach the gRPC API at {address}"))?
                .max_decoding_message_size(256 << 20),
        ),
        None => None,
    };
    let queries = Arc::new(read_fvecs(&options.queries, options.max_queries)?);
    let truth = read_ivecs(&options.ground_truth, options.max_queries)?;
    if truth.rows() < queries.rows() {
        bail!("the ground truth has fewer rows than the queries");
    }
    let described = client.describe(&options.collection).await?;
    println!(
        "collection {}: {} points, {} segments, {} bytes; {} queries, k = {}, {} per request",
        options.collection,
        described.points,
        described.segments,
        described.bytes,
        queries.rows(),
        options.k,
        options.batch
    );
    // Warm up: the first 50 queries once (not with --no-warm-up).
    let warm_up = if options.no_warm_up { 0 } else { 50 };
    for row in 0..queries.rows().min(warm_up) {
        let search = Search::new(queries.row(row).to_vec(), options.k);
        client.search(&options.collection, &search).await?;
    }
    println!(
        "{:>11} {:>8} {:>10} {:>8} {:>8} {:>7} {:>10} {:>9} {:>8} {:>6} {:>9} {:>6} {:>7} {:>9}",
        "concurrency",
        "recall",
        "qps",
        "p50_ms",
        "p99_ms",
        "errors",
        "cpu_ms/q",
        "scanned",
        "tail",
        "segs",
        "search_ms",
        "hit%",
        "MB/q",
        "peak_MiB"
    );
    let mut points = Vec::new();
    for &concurrency in &options.concurrency {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let cpu_before = server_cpu_ms(&options.server_pids)?;
        let groups_before = server_cpu_ms_by_group(&options.server_pids)?;
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..concurrency.max(1) {
            let (client, queries, next) = (client.clone(), queries.clone(), next.clone());
            let (grpc, api_key) = (grpc.clone(), options.api_key.clone());
            let name = options.collection.clone();
            let (k, nprobe, consistency) = (options.k, options.nprobe, options.consistency.clone());
            let include_payload = options.include_payload;
            let batch = options.batch;
            workers.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut errors = 0;
                loop {
                    let first = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                    if first >= queries.rows() {
                        break;
                    }
                    let rows = first..(first + batch).min(queries.rows());
                    let searches: Vec<Search> = rows
                        .clone()
                        .map(|row| {
                            let mut search = Search::new(queries.row(row).to_vec(), k);
                            search.nprobe = nprobe;
                            search.include_payload = include_payload;
                            search.consistency = Some(consistency.clone());
                            search
                        })
                        .collect();
                    let begun = Instant::now();
                    let outcome =
                        send_searches(&client, grpc.as_ref(), api_key.as_deref(), &name, &searches)
                            .await;
                    match outcome {
                        Ok(results) => {
                            let latency = begun.elapsed().as_secs_f64() * 1e3;
                            for (index, (row, result)) in rows.zip(results).enumerate() {
                                // One latency per request.
                                answers.push((row, result, (index == 0).then_some(latency)));
                            }
                        }
                        Err(error) => {
                            // Said, not only counted: an error is a finding.
                            if errors < 3 {
                                eprintln!("search failed (concurrency {concurrency}): {error}");
                            }
                            errors += 1
                        }
                    }
                }
                (answers, errors)
            }));
        }
        let mut latencies = Vec::new();
        let mut answered = 0usize;
        let (mut found, mut wanted, mut errors) = (0usize, 0usize, 0usize);
        let mut costs = (0u64, 0u64, 0u64, 0f64, 0usize);
        let mut cache = CacheTotals::default();
        for worker in workers {
            let (answers, worker_errors) = worker.await?;
            errors += worker_errors;
            for (row, result, latency) in answers {
                let expected = &truth.row(row)[..options.k.min(truth.dim)];
                found += result
                    .ids
                    .iter()
                    .filter(|id| id.is_some_and(|id| expected.contains(&(id as i32))))
                    .count();
                wanted += expected.len();
                answered += 1;
                latencies.extend(latency);
                if let Some(cost) = &result.cost {
                    costs.0 += cost.rows_scanned;
                    costs.1 += cost.tail_rows_scored;
                    costs.2 += cost.segments;
                    costs.3 += cost.search_ms;
                    costs.4 += 1;
                    cache.add(cost);
                }
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu_ms = server_cpu_ms(&options.server_pids)? - cpu_before;
        let groups_after = server_cpu_ms_by_group(&options.server_pids)?;
        let per_query = |ms: f64| ms / answered.max(1) as f64;
        let mut by_thread = std::collections::BTreeMap::new();
        if !options.server_pids.is_empty() {
            let mut grouped = 0.0;
            for (((name, _), after), before) in
                THREAD_GROUPS.iter().zip(groups_after).zip(groups_before)
            {
                // Never below 0 (a thread that ended took its ticks along).
                let spent = (after - before).max(0.0);
                grouped += spent;
                by_thread.insert(*name, per_query(spent));
            }
            by_thread.insert("other", per_query((cpu_ms - grouped).max(0.0)));
        }
        latencies.sort_by(f64::total_cmp);
        let costed = costs.4.max(1) as f64;
        let (peak_mib, anon_mib) = server_memory_mib(&options.server_pids)?;
        let point = ClusterPoint {
            concurrency,
            batch: options.batch,
            nprobe: options.nprobe.unwrap_or(0),
            rescore: 0,
            recall: if wanted == 0 {
                0.0
            } else {
                found as f64 / wanted as f64
            },
            qps: answered as f64 / elapsed,
            p50_ms: percentile_or_zero(&latencies, 0.5),
            p99_ms: percentile_or_zero(&latencies, 0.99),
            errors,
            server_cpu_ms_per_query: cpu_ms / answered.max(1) as f64,
            server_cpu_ms_per_query_by_thread: by_thread,
            rows_scanned: costs.0 as f64 / costed,
            tail_rows_scored: costs.1 as f64 / costed,
            segments: costs.2 as f64 / costed,
            search_ms: costs.3 / costed,
            cache_hit_ratio: cache.hit_ratio(),
            bytes_fetched_per_query: cache.bytes_fetched as f64 / costed,
            row_reads_local: cache.row_reads_local as f64 / costed,
            row_reads_remote: cache.row_reads_remote as f64 / costed,
            store_wait_ms: cache.store_wait_ms / costed,
            store_waits: cache.store_waits as f64 / costed,
            server_peak_rss_mib: peak_mib,
            server_rss_anon_mib: anon_mib,
            cpu_vs_engine: None,
            cpu_vs_engine_all_cores: None,
        };
        println!(
            "{:>11} {:>8.4} {:>10.0} {:>8.2} {:>8.2} {:>7} {:>10.3} {:>9.0} {:>8.0} {:>6.1} {:>9.3} {:>6.1} {:>7.2} {:>9.0}",
            point.concurrency,
            point.recall,
            point.qps,
            point.p50_ms,
            point.p99_ms,
            point.errors,
            point.server_cpu_ms_per_query,
            point.rows_scanned,
            point.tail_rows_scored,
            point.segments,
            point.search_ms,
            point.cache_hit_ratio * 100.0,
            point.bytes_fetched_per_query / 1e6,
            point.server_peak_rss_mib
        );
        if !point.server_cpu_ms_per_query_by_thread.is_empty() {
            let groups: Vec<String> = point
                .server_cpu_ms_per_query_by_thread
                .iter()
                .map(|(name, ms)| format!("{name} {ms:.3}"))
                .collect();
            println!(
                "{:>11} server cpu_ms/q by thread: {}",
                "",
                groups.join(", ")
            );
        }
        points.push(point);
    }
    let engine = if options.engine {
        Some(compare_with_engine(options, &queries, &truth, &mut points)?)
    } else {
        None
    };
    let report = serde_json::json!({
        "engine": engine,
        "dataset": {
            "collection": options.collection,
            "queries": options.queries.display().to_string(),
            "points": described.points,
            "k": options.k,
            "endpoint": options.endpoint,
        },
        "build_s": load_seconds.unwrap_or(0.0),
        "index_bytes": described.bytes,
        "points": points,
    });
    std::fs::write(&options.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", options.json.display()))?;
    let png = options.json.with_extension("png");
    plot_latency(&png, &options.collection, &points)?;
    println!("wrote {} and {}", options.json.display(), png.display());
    Ok(())
}

/// Measures the engine alone on the base vectors at the lowest recall the
/// server delivered, and sets each point's CPU ratio.
fn compare_with_engine(
    options: &ClusterOptions,
    queries: &quiver_common::vecs::Matrix<f32>,
    truth: &quiver_common::vecs::Matrix<i32>,
    points: &mut [ClusterPoint],
) -> Result<crate::engine::EngineMatch> {
    let path = options
        .base
        .as_ref()
        .context("--engine needs --base B.fvecs (the collection's vectors)")?;
    let base = read_fvecs(path, None)?;
    let metric: quiver_index::Metric = options
        .metric
        .parse()
        .map_err(|error| anyhow::anyhow!("--metric: {error}"))?;
    let target = points
        .iter()
        .map(|point| point.recall)
        .fold(f64::INFINITY, f64::min);
    println!(
        "engine alone: one segment of {} rows, one thread, at recall ≥ {target:.4}",
        base.rows()
    );
    let engine = crate::engine::at_recall(&base, queries, truth, metric, options.k, target)?;
    println!(
        "engine alone: {} recall {:.4}, {:.3} ms per query on one thread, {:.3} ms of CPU per query on {} threads (every core busy), {:.0} rows scanned (built in {:.1} s)",
        match engine.probe_ratio {
            Some(ratio) => format!("lists within ratio {ratio:.3}"),
            None => format!("nprobe {}", engine.nprobe),
        },
        engine.recall,
        engine.ms_per_query,
        engine.cpu_ms_per_query_all_cores,
        engine.cores,
        engine.rows_scanned,
        engine.build_s
    );
    if !options.server_pids.is_empty() {
        println!(
            "{:>11} {:>10} {:>10} {:>7} {:>14} {:>7}",
            "concurrency", "cpu_ms/q", "engine_ms", "ratio", "engine_cores", "ratio"
        );
        for point in points.iter_mut() {
            let ratio = point.server_cpu_ms_per_query / engine.ms_per_query;
            let ratio_all_cores = point.server_cpu_ms_per_query / engine.cpu_ms_per_query_all_cores;
            point.cpu_vs_engine = Some(ratio);
            point.cpu_vs_engine_all_cores = Some(ratio_all_cores);
            println!(
                "{:>11} {:>10.3} {:>10.3} {:>7.2} {:>14.3} {:>7.2}",
                point.concurrency,
                point.server_cpu_ms_per_query,
                engine.ms_per_query,
                ratio,
                engine.cpu_ms_per_query_all_cores,
                ratio_all_cores
            );
        }
    }
    Ok(engine)
}

fn plot_latency(path: &std::path::Path, title: &str, points: &[ClusterPoint]) -> Result<()> {
    crate::plot::ensure_font();
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let max_concurrency = points.iter().map(|p| p.concurrency).max().unwrap_or(1) as f64;
    let max_latency = points.iter().map(|p| p.p99_ms).fold(1.0f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: latency vs concurrency"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_concurrency * 1.05, 0.0..max_latency)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("client concurrency")
        .y_desc("latency (ms)")
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    for (label, color, pick) in [
        (
            "p50",
            BLUE,
            (|p: &ClusterPoint| p.p50_ms) as fn(&ClusterPoint) -> f64,
        ),
        ("p99", RED, |p: &ClusterPoint| p.p99_ms),
    ] {
        let series: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (p.concurrency as f64, pick(p)))
            .collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_command_name_and_cpu_ticks() {
        // Fields 14 and 15 (utime, stime) are 7 and 5 here.
        let plain = "4242 (quiver-search-3) S 1 2 3 4 5 6 7 8 9 10 7 5 0 0 20 0 1 0";
        assert_eq!(parse_stat(plain), Some(("quiver-search-3", 12)));
        // A name may hold spaces and parentheses: the fields follow the last `)`.
        let odd = "7 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 100 1 0 0 20 0 1 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c", 101)));
        assert_eq!(parse_stat("7 (short) R 1 2"), None);
        assert_eq!(parse_stat("no name at all"), None);
    }

    #[test]
    fn a_thread_named_as_a_search_thread_counts_in_the_search_group() -> Result<()> {
        let pid = std::process::id();
        let before = server_cpu_ms_by_group(&[pid])?;
        let (spun, wait) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        // It spins, then stays alive until read: an ended thread's time leaves
        // its group.
        let worker = std::thread::Builder::new()
            .name("quiver-search-9".into())
            .spawn(move || {
                let started = Instant::now();
                let mut sum = 0u64;
                while started.elapsed() < Duration::from_millis(80) {
                    sum = sum.wrapping_add(std::hint::black_box(sum) ^ 0x9e37);
                }
                spun.0.send(sum).expect("the test waits");
                wait.1.recv().ok();
            })?;
        spun.1.recv()?;
        let after = server_cpu_ms_by_group(&[pid])?;
        wait.0.send(()).ok();
        worker.join().expect("the spinning thread ends");
        assert!(after[0] > before[0], "search {before:?} -> {after:?}");
        // The process total is read as well (each thread's time is rounded
        // to ticks on its own, so the two are not compared).
        assert!(server_cpu_ms(&[pid])? > 0.0);
        Ok(())
    }
}
