//! The object store misbehaving under the workload: every indexer and searcher
//! reaches S3 through its own `quiver_storage::testing::FaultProxy` (its
//! `AWS_ENDPOINT_URL`; meta and the gateway never talk to S3), with short
//! storage timeouts (`[storage]` of the config: 1.5 s per request, 2 retries,
//! 5 s per operation) so a stall costs seconds, not minutes. In
//! rounds with random timing, each fault kind of the proxy hits a share of the
//! requests of all data nodes, the indexer, both searchers or one searcher for
//! a few seconds: 503 answers, stalls (past the request timeout), connection
//! resets, slow bodies (8 pieces with pauses up to 400 ms, past the request
//! timeout for large ones), truncated bodies, flipped bytes. An outage round
//! (every request of every data node answered 503 or reset) is held until a
//! write fails: the gateway retries a write refused `UNAVAILABLE` for 15 s,
//! so shorter faults only delay writes. Then the store heals, and the
//! checker's quiet check with the flat scan must find nothing.
//!
//! Writes and reads may fail while the store misbehaves, but cleanly: every
//! failed request gets an answer (no client timeout) with `UNAVAILABLE` or
//! `INTERNAL` naming the object (`…/shards/N/…`), and no process dies. The
//! summary has per fault kind the proxy's counters, the requests that
//! succeeded and failed during the faults, the failures by message, and the
//! longest time without a successful write or strong read.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context;
use quiver_storage::testing::{Fault, FaultConfig, FaultProxy};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::cluster::{Cluster, ClusterShape, Role, s3_endpoint};
use crate::drive::Run;
use crate::history::Snapshot;
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const COLLECTION: &str = "object_store";
const DIMENSION: usize = 32;

/// Storage timeouts of the data nodes: short, so stalled requests time out
/// and are retried well within the tests' deadlines (gateway 30 s, clients
/// 20 s); and few retries, so a fault of a few seconds also makes operations
/// fail (with the defaults, 5 retries, most of them would only be slow) and
/// the failure paths are exercised.
const STORAGE_SECTION: &str = "
[storage]
request_timeout_ms = 1500
connect_timeout_ms = 1000
operation_timeout_ms = 5000
max_retries = 2
initial_backoff_ms = 50
";

/// How long a stalled request hangs before the proxy closes it: well past the
/// request timeout above, so the client's timeout is what ends it.
const STALL: Duration = Duration::from_secs(10);

/// One kind of object store fault (one [`Fault`] of the proxy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoreFault {
    ServerError,
    Stall,
    Reset,
    SlowBody,
    TruncatedBody,
    CorruptBody,
}

impl StoreFault {
    const ALL: [StoreFault; 6] = [
        StoreFault::ServerError,
        StoreFault::Stall,
        StoreFault::Reset,
        StoreFault::SlowBody,
        StoreFault::TruncatedBody,
        StoreFault::CorruptBody,
    ];

    fn proxy_fault(self) -> Fault {
        match self {
            StoreFault::ServerError => Fault::ServerError,
            StoreFault::Stall => Fault::Stall,
            StoreFault::Reset => Fault::Reset,
            StoreFault::SlowBody => Fault::SlowBody,
            StoreFault::TruncatedBody => Fault::TruncateBody,
            StoreFault::CorruptBody => Fault::CorruptBody,
        }
    }

    /// The fault kind in the history and the summary.
    fn label(self) -> &'static str {
        match self {
            StoreFault::ServerError => "s3 503 answers",
            StoreFault::Stall => "s3 stalled requests",
            StoreFault::Reset => "s3 connection resets",
            StoreFault::SlowBody => "s3 slow bodies",
            StoreFault::TruncatedBody => "s3 truncated bodies",
            StoreFault::CorruptBody => "s3 corrupted bodies",
        }
    }

    /// Body faults need an answer with a body: GETs and LISTs, which the
    /// indexer alone hardly makes, so they always hit a searcher.
    fn needs_body(self) -> bool {
        matches!(
            self,
            StoreFault::SlowBody | StoreFault::TruncatedBody | StoreFault::CorruptBody
        )
    }

    /// Draws the share of requests to break and the fault's parameters.
    fn config(self, rng: &mut StdRng) -> (FaultConfig, String) {
        let fractions: &[f64] = match self {
            // Every stalled attempt costs the request timeout.
            StoreFault::Stall => &[0.1, 0.3, 1.0],
            StoreFault::SlowBody => &[0.5, 1.0],
            _ => &[0.2, 0.5, 1.0],
        };
        let fraction = *fractions.choose(rng).expect("fractions");
        let mut config = FaultConfig::new(fraction, &[self.proxy_fault()]);
        config.stall = STALL;
        config.slow_body_pause = Duration::from_millis(rng.random_range(20..400));
        let detail = match self {
            StoreFault::SlowBody => format!(
                "{}% of requests, pauses of {} ms",
                (fraction * 100.0) as u32,
                config.slow_body_pause.as_millis()
            ),
            _ => format!("{}% of requests", (fraction * 100.0) as u32),
        };
        (config, detail)
    }
}

/// Which data nodes' S3 traffic a round breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Targets {
    DataNodes,
    Indexer,
    Searchers,
    OneSearcher,
}

impl Targets {
    fn name(self) -> &'static str {
        match self {
            Targets::DataNodes => "indexer and searchers",
            Targets::Indexer => "indexer",
            Targets::Searchers => "both searchers",
            Targets::OneSearcher => "searcher-1",
        }
    }

    fn covers(self, process: &str, role: Role) -> bool {
        match self {
            Targets::DataNodes => true,
            Targets::Indexer => role == Role::Indexer,
            Targets::Searchers => role == Role::Searcher,
            Targets::OneSearcher => process == "searcher-1",
        }
    }
}

/// One fault proxy per data node, in front of the S3 server.
struct StoreProxies {
    proxies: Vec<(String, Role, FaultProxy)>,
}

impl StoreProxies {
    /// Puts a proxy between every indexer and searcher of the (not started)
    /// cluster and S3, and gives them the short storage timeouts.
    async fn install(cluster: &mut Cluster, endpoint: &str) -> anyhow::Result<StoreProxies> {
        let mut proxies = Vec::new();
        for process in cluster
            .indexers
            .iter_mut()
            .chain(cluster.searchers.iter_mut())
        {
            let proxy = FaultProxy::start(endpoint, FaultConfig::none())
                .await
                .context("starting a fault proxy")?;
            process.set_env("AWS_ENDPOINT_URL", Some(&proxy.endpoint()));
            let config = process
                .arg("--config")
                .context("a data node without --config")?;
            std::fs::OpenOptions::new()
                .append(true)
                .open(config)
                .and_then(|mut file| file.write_all(STORAGE_SECTION.as_bytes()))
                .with_context(|| format!("adding [storage] to {config}"))?;
            proxies.push((process.name.clone(), process.role, proxy));
        }
        Ok(StoreProxies { proxies })
    }

    /// Breaks the S3 traffic of `targets` (each proxy its own seed).
    fn break_store(&self, targets: Targets, config: &FaultConfig, rng: &mut StdRng) {
        for (name, role, proxy) in &self.proxies {
            if targets.covers(name, *role) {
                proxy.set_config(FaultConfig {
                    seed: rng.random(),
                    ..config.clone()
                });
            }
        }
    }

    fn heal(&self) {
        for (_, _, proxy) in &self.proxies {
            proxy.set_config(FaultConfig::none());
        }
    }

    /// Faults of `fault` injected so far, over every proxy.
    fn injected(&self, fault: Fault) -> u64 {
        self.proxies
            .iter()
            .flat_map(|(_, _, proxy)| proxy.stats().injected)
            .filter(|(name, _)| *name == fault.name())
            .map(|(_, count)| count)
            .sum()
    }

    fn requests(&self) -> u64 {
        self.proxies
            .iter()
            .map(|(_, _, proxy)| proxy.stats().requests)
            .sum()
    }

    fn counters(&self) -> serde_json::Value {
        self.proxies
            .iter()
            .map(|(name, _, proxy)| {
                let stats = proxy.stats();
                (
                    name.clone(),
                    json!({
                        "requests": stats.requests,
                        "forwarded": stats.forwarded,
                        "injected": stats.injected.iter().cloned().collect::<BTreeMap<_, _>>(),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// What the rounds of one fault kind did.
#[derive(Default)]
struct KindReport {
    rounds: Vec<String>,
    injected: u64,
    proxied_requests: u64,
    writes_ok: usize,
    writes_failed: usize,
    reads_ok: usize,
    reads_failed: usize,
    longest_write_gap: Duration,
    longest_read_gap: Duration,
    slowest_failed_request: Duration,
    failed_requests: BTreeMap<String, usize>,
}

impl KindReport {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "rounds": self.rounds,
            "faults_injected": self.injected,
            "proxied_requests": self.proxied_requests,
            "requests_during_faults": {
                "writes_acknowledged": self.writes_ok,
                "writes_failed": self.writes_failed,
                "reads_ok": self.reads_ok,
                "reads_failed": self.reads_failed,
            },
            "longest_gap_without_success_ms": {
                "write": self.longest_write_gap.as_millis() as u64,
                "strong_read": self.longest_read_gap.as_millis() as u64,
            },
            "slowest_failed_request_ms": self.slowest_failed_request.as_millis() as u64,
            "failed_requests": self.failed_requests,
        })
    }

    /// Adds the requests in flight at some time between `from` and `healed`,
    /// and the longest stretch from `from` until the first success after
    /// `healed` without a successful request, of each type.
    fn add_requests(&mut self, snapshot: &Snapshot, from: Instant, healed: Instant) {
        for attempt in &snapshot.attempts {
            if attempt.finished < from || attempt.started >= healed {
                continue;
            }
            match (attempt.is_write, attempt.ok) {
                (true, true) => self.writes_ok += 1,
                (true, false) => self.writes_failed += 1,
                (false, true) => self.reads_ok += 1,
                (false, false) => self.reads_failed += 1,
            }
            if !attempt.ok {
                self.slowest_failed_request = self
                    .slowest_failed_request
                    .max(attempt.finished - attempt.started);
            }
        }
        for is_write in [true, false] {
            let mut successes: Vec<Instant> = snapshot
                .attempts
                .iter()
                .filter(|attempt| {
                    attempt.is_write == is_write && attempt.ok && attempt.finished > from
                })
                .map(|attempt| attempt.finished)
                .collect();
            successes.sort();
            let Some(end) = successes.iter().find(|at| **at >= healed).copied() else {
                continue;
            };
            let mut previous = from;
            let mut longest = Duration::ZERO;
            for at in successes.into_iter().take_while(|at| *at <= end) {
                longest = longest.max(at - previous);
                previous = at;
            }
            let slot = if is_write {
                &mut self.longest_write_gap
            } else {
                &mut self.longest_read_gap
            };
            *slot = (*slot).max(longest);
        }
    }
}

/// Tells why a failed request (`request: error`, digits blanked) is not a
/// clean failure, if it is not: every failure must be an answer (not a client
/// timeout or a broken connection) with `UNAVAILABLE` or `INTERNAL` naming the
/// object that failed.
fn unclean(failure: &str) -> Option<&'static str> {
    let Some((_, error)) = failure.split_once(": ") else {
        return Some("not a recorded failure");
    };
    if error.starts_with("transport:") {
        return Some("no answer");
    }
    let mut words = error.split_whitespace();
    let code = words.nth(2).unwrap_or_default().trim_end_matches(':');
    if code != "UNAVAILABLE" && code != "INTERNAL" && code != "DATA_LOSS" {
        return Some("neither UNAVAILABLE, INTERNAL nor DATA_LOSS");
    }
    if !error.contains("/shards/#") {
        return Some("names no object");
    }
    None
}

/// The failures in `after` that are not in `before`.
fn new_failures(
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    after
        .iter()
        .filter_map(|(failure, count)| {
            let new = count - before.get(failure).copied().unwrap_or(0);
            (new > 0).then(|| (failure.clone(), new))
        })
        .collect()
}

fn ensure_clean(failures: &BTreeMap<String, usize>, when: &str) -> anyhow::Result<()> {
    let bad: Vec<String> = failures
        .iter()
        .filter_map(|(failure, count)| {
            unclean(failure).map(|why| format!("{count} × {failure} ({why})"))
        })
        .collect();
    anyhow::ensure!(
        bad.is_empty(),
        "requests failed uncleanly {when}:\n  {}",
        bad.join("\n  ")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn object_store_faults_lose_no_acknowledged_write() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("object_store");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = Cluster::prepare(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 1,
            searchers: 2,
            gateways: 1,
        },
    )
    .await?;
    let proxies = StoreProxies::install(&mut cluster, &endpoint).await?;
    cluster.start_all().await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 2)
        .await?;
    let config = WorkloadConfig::new(COLLECTION, DIMENSION, 800, seed);
    let mut run = Run::start(cluster, config, "object_store");
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(true, "before the first fault").await?;

    // Each kind for a few seconds; plus outages: every S3 request of every
    // data node answered 503 or reset, held until a write failed (the
    // gateway's retries of a write gave up), so the failure path of writes is
    // exercised too.
    let (per_kind, outages) = if long_profile() { (6, 3) } else { (1, 1) };
    let mut rounds: Vec<(StoreFault, bool)> = Vec::new();
    for _ in 0..per_kind {
        rounds.extend(StoreFault::ALL.map(|fault| (fault, false)));
    }
    for _ in 0..outages {
        let fault = *[StoreFault::ServerError, StoreFault::Reset]
            .choose(&mut rng)
            .expect("faults");
        rounds.push((fault, true));
    }
    rounds.shuffle(&mut rng);
    let mut reports: BTreeMap<String, KindReport> = BTreeMap::new();
    for (iteration, (fault, outage)) in rounds.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
        let targets = if outage {
            Targets::DataNodes
        } else if fault.needs_body() {
            *[Targets::DataNodes, Targets::Searchers, Targets::OneSearcher]
                .choose(&mut rng)
                .expect("targets")
        } else {
            *[
                Targets::DataNodes,
                Targets::Indexer,
                Targets::Searchers,
                Targets::OneSearcher,
            ]
            .choose(&mut rng)
            .expect("targets")
        };
        let (mut fault_config, mut detail) = fault.config(&mut rng);
        let kind = if outage {
            fault_config.fraction = 1.0;
            detail = "100% of requests".into();
            format!("{} (outage)", fault.label())
        } else {
            fault.label().to_string()
        };
        let hold = Duration::from_millis(rng.random_range(1_500..3_500));
        let round = if outage {
            format!("{detail} of {} until a write fails", targets.name())
        } else {
            format!("{detail} of {} for {} ms", targets.name(), hold.as_millis())
        };
        let when = format!("after fault {} ({kind}: {round})", iteration + 1);
        eprintln!("object_store: {when}");
        let failures_before = run.workload.as_ref().context("workload")?.error_kinds();
        let injected_before = proxies.injected(fault.proxy_fault());
        let requests_before = proxies.requests();

        let write_errors_before = run.workload.as_ref().context("workload")?.errors().0;

        let fault_at = run.fault(&kind);
        proxies.break_store(targets, &fault_config, &mut rng);
        tokio::time::sleep(hold).await;
        // The fault must have hit something (and an outage failed a write):
        // held on until it has.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let injected = proxies.injected(fault.proxy_fault()) > injected_before;
            let write_failed =
                run.workload.as_ref().context("workload")?.errors().0 > write_errors_before;
            if injected && (write_failed || !outage) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} in 60 s ({when})",
                if injected {
                    "no write failed"
                } else {
                    "no fault injected"
                }
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        proxies.heal();
        let healed_at = run.fault(&format!("heal after {kind}"));
        let injected = proxies.injected(fault.proxy_fault()) - injected_before;
        let proxied = proxies.requests() - requests_before;

        run.wait_recovered(healed_at, &when).await?;
        for process in run.cluster.processes() {
            anyhow::ensure!(
                process.is_running(),
                "{} exited ({when}); log:\n{}",
                process.name,
                process.log_tail(30)
            );
        }
        run.cluster
            .wait_served(COLLECTION, 2, Duration::from_secs(60))
            .await?;
        let failures = new_failures(
            &failures_before,
            &run.workload.as_ref().context("workload")?.error_kinds(),
        );
        ensure_clean(&failures, &when)?;
        let report = reports.entry(kind).or_default();
        report.rounds.push(format!(
            "{round}: {injected} injected of {proxied} requests"
        ));
        report.injected += injected;
        report.proxied_requests += proxied;
        report.add_requests(&run.history.snapshot(), fault_at, healed_at);
        for (failure, count) in failures {
            *report.failed_requests.entry(failure).or_default() += count;
        }
        run.checkpoint(true, &when).await?;
        run.summary.iterations += 1;
    }
    run.summary.extra.insert(
        "per_fault".into(),
        reports
            .iter()
            .map(|(kind, report)| (kind.clone(), report.to_json()))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    );
    run.summary.extra.insert("proxy".into(), proxies.counters());
    let summary = run.finish().await?;
    // Failures outside the rounds (none expected) must be clean too.
    let all: BTreeMap<String, usize> = summary
        .extra
        .get("failed_requests")
        .and_then(|failures| serde_json::from_value(failures.clone()).ok())
        .unwrap_or_default();
    ensure_clean(&all, "over the whole run")?;
    Ok(())
}
