//! Soak: the workload (writes, deletes, strong gets and searches from clients
//! with a fixed pause between requests) against 3 meta nodes, an indexer, a
//! searcher and a gateway for a long time (10 minutes in the long profile, 45 s
//! in the quick one), sampling every process's memory (`/proc/PID/status`:
//! VmRSS, and RssAnon — the heap, without the cache file's mapped pages) and
//! open file descriptors (`/proc/PID/fd`) every few seconds. Nothing may fail,
//! the checker must find nothing, and no process may grow: the average of the
//! last third of the samples is compared with the middle third (the first
//! third is warm-up: caches filling, segments merging).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{Cluster, ClusterShape, s3_endpoint};
use crate::drive::Run;
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const COLLECTION: &str = "soak";
const DIMENSION: usize = 32;

/// One sample of one process.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_kib: u64,
    anon_kib: u64,
    fds: u64,
}

fn sample(pid: u32) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok(Sample {
        rss_kib: field("VmRSS:")?,
        anon_kib: field("RssAnon:")?,
        fds,
    })
}

fn mean(values: impl Iterator<Item = u64>) -> f64 {
    let (sum, count) = values.fold((0u64, 0u64), |(sum, count), value| (sum + value, count + 1));
    sum as f64 / count.max(1) as f64
}

/// Growth limits: the last third may exceed the middle third by at most this.
struct Tolerance {
    anon_ratio: f64,
    anon_slack_kib: f64,
    fd_slack: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_without_growth_or_errors() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("soak");
    let (duration, interval, tolerance) = if long_profile() {
        (
            Duration::from_secs(600),
            Duration::from_secs(5),
            Tolerance {
                anon_ratio: 1.10,
                anon_slack_kib: 2.0 * 1024.0,
                fd_slack: 4.0,
            },
        )
    } else {
        (
            Duration::from_secs(45),
            Duration::from_secs(2),
            Tolerance {
                anon_ratio: 1.25,
                anon_slack_kib: 4.0 * 1024.0,
                fd_slack: 6.0,
            },
        )
    };
    let cluster = Cluster::start(
        &endpoint,
        ClusterShape {
            metas: 3,
            indexers: 1,
            searchers: 1,
            gateways: 1,
        },
    )
    .await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 1)
        .await?;
    let mut config = WorkloadConfig::new(COLLECTION, DIMENSION, 2_000, seed);
    config.writers = 2;
    config.readers = 2;
    config.think_time = Duration::from_millis(20);
    let mut run = Run::start(cluster, config, "soak");

    let names: Vec<String> = run
        .cluster
        .processes()
        .map(|process| process.name.clone())
        .collect();
    let mut samples: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut operations_per_interval: Vec<u64> = Vec::new();
    let started = Instant::now();
    let mut next = started;
    let mut last_operations = 0u64;
    while started.elapsed() < duration {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        for process in run.cluster.processes() {
            let pid = process.pid().ok_or_else(|| {
                anyhow::anyhow!(
                    "{} is not running during the soak; log:\n{}",
                    process.name,
                    process.log_tail(30)
                )
            })?;
            samples
                .entry(process.name.clone())
                .or_default()
                .push(sample(pid)?);
        }
        let operations = run.history.snapshot().attempts.len() as u64;
        operations_per_interval.push(operations - last_operations);
        last_operations = operations;
        let (write_errors, read_errors) = run.workload.as_ref().expect("running").errors();
        if write_errors + read_errors > 0 {
            run.cluster.dump_logs(40);
            anyhow::bail!(
                "{write_errors} writes and {read_errors} reads failed during the soak: {:?}",
                run.workload.as_ref().expect("running").error_kinds()
            );
        }
    }

    // Growth: last third against the middle third, per process.
    let mut report = serde_json::Map::new();
    let mut growing = Vec::new();
    eprintln!(
        "soak: {} samples per process every {interval:?}; RSS and RssAnon in MiB, fds (first / middle third / last third / max)",
        samples.values().next().map_or(0, Vec::len)
    );
    for name in &names {
        let list = &samples[name];
        let third = list.len() / 3;
        anyhow::ensure!(third >= 2, "too few samples ({}) for a trend", list.len());
        let middle = &list[third..2 * third];
        let last = &list[2 * third..];
        let mib = |kib: f64| kib / 1024.0;
        let rss = (
            list[0].rss_kib as f64,
            mean(middle.iter().map(|s| s.rss_kib)),
            mean(last.iter().map(|s| s.rss_kib)),
            list.iter().map(|s| s.rss_kib).max().unwrap_or(0) as f64,
        );
        let anon = (
            list[0].anon_kib as f64,
            mean(middle.iter().map(|s| s.anon_kib)),
            mean(last.iter().map(|s| s.anon_kib)),
            list.iter().map(|s| s.anon_kib).max().unwrap_or(0) as f64,
        );
        let fds = (
            list[0].fds as f64,
            mean(middle.iter().map(|s| s.fds)),
            mean(last.iter().map(|s| s.fds)),
            list.iter().map(|s| s.fds).max().unwrap_or(0) as f64,
        );
        eprintln!(
            "  {name:<11} rss {:6.1} / {:6.1} / {:6.1} / {:6.1}   anon {:6.1} / {:6.1} / {:6.1} / {:6.1}   fds {:4} / {:6.1} / {:6.1} / {:4}",
            mib(rss.0),
            mib(rss.1),
            mib(rss.2),
            mib(rss.3),
            mib(anon.0),
            mib(anon.1),
            mib(anon.2),
            mib(anon.3),
            fds.0,
            fds.1,
            fds.2,
            fds.3
        );
        if anon.2 > anon.1 * tolerance.anon_ratio + tolerance.anon_slack_kib {
            growing.push(format!(
                "{name}: anonymous memory {:.1} MiB in the last third vs {:.1} MiB in the middle third",
                mib(anon.2),
                mib(anon.1)
            ));
        }
        if fds.2 > fds.1 + tolerance.fd_slack {
            growing.push(format!(
                "{name}: {:.1} open fds in the last third vs {:.1} in the middle third",
                fds.2, fds.1
            ));
        }
        report.insert(
            name.clone(),
            json!({
                "rss_mib": [mib(rss.0), mib(rss.1), mib(rss.2), mib(rss.3)],
                "anon_mib": [mib(anon.0), mib(anon.1), mib(anon.2), mib(anon.3)],
                "fds": [fds.0, fds.1, fds.2, fds.3],
            }),
        );
    }
    let third = operations_per_interval.len() / 3;
    let rate = |range: &[u64]| mean(range.iter().copied()) / interval.as_secs_f64();
    let rates = (
        rate(&operations_per_interval[third..2 * third]),
        rate(&operations_per_interval[2 * third..]),
    );
    eprintln!(
        "soak: requests/s middle third {:.0}, last third {:.0}",
        rates.0, rates.1
    );
    if !growing.is_empty() {
        run.cluster.dump_logs(20);
        anyhow::bail!(
            "processes grow during the soak:\n  {}",
            growing.join("\n  ")
        );
    }
    run.summary.iterations = samples.values().next().map_or(0, Vec::len);
    run.summary.extra.insert("samples".into(), report.into());
    run.summary.extra.insert(
        "requests_per_second_middle_last".into(),
        json!([rates.0.round(), rates.1.round()]),
    );
    let summary = run.finish().await?;
    anyhow::ensure!(
        summary.read_errors == 0 && summary.unknown == 0,
        "{} reads failed and {} writes have an unknown outcome",
        summary.read_errors,
        summary.unknown
    );
    Ok(())
}
