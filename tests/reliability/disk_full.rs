//! Local disks that fill up, under the workload. The meta node's `--data-dir`
//! and the searcher's `--cache-dir` are each a small tmpfs mounted for the
//! test (so the test needs root, as CI has; without it the test fails saying
//! so), filled to the last block by a filler file:
//! - meta: writes are refused with an error that says the disk is full, the
//!   process stays up, reads keep working; once space is freed writes work
//!   again; after a restart the log holds everything acknowledged;
//! - searcher, disk filled while it runs: its cache file was reserved at start,
//!   so queries keep answering; restarted on a full disk (no room for a cache
//!   file) it serves by reading through to S3 (`quiver_cache_read_through` 1),
//!   and restarted with room it caches again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use quiver_test_support::Tmpfs;

use crate::cluster::{Cluster, ClusterShape, eventually, s3_endpoint};
use crate::drive::Run;
use crate::history::History;
use crate::partitions::{collection_spec, pinned_meta_client, status_of};
use crate::workload::WorkloadConfig;
use crate::{SERIAL, seed};

const COLLECTION: &str = "disk_full";
const DIMENSION: usize = 32;
/// Meta's `min_free_disk_bytes` in this scenario (its disk is 32 MiB).
const META_RESERVE: u64 = 8 << 20;

/// Tells whether a strong read (get or search) started at or after `since`
/// succeeded.
fn read_succeeded_since(history: &History, since: Instant) -> bool {
    history
        .snapshot()
        .attempts
        .iter()
        .any(|attempt| !attempt.is_write && attempt.ok && attempt.started >= since)
}

async fn wait_reads(run: &Run, since: Instant, what: &str) -> anyhow::Result<()> {
    let history = run.history.clone();
    eventually(
        &format!("a successful strong read {what}"),
        Duration::from_secs(60),
        || {
            let history = history.clone();
            async move { read_succeeded_since(&history, since).then_some(()) }
        },
    )
    .await
}

/// Reads one gauge or counter from a process's `/metrics`.
async fn metric(http: &reqwest::Client, http_address: &str, name: &str) -> anyhow::Result<f64> {
    let text = http
        .get(format!("http://{http_address}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            rest.starts_with(' ')
                .then(|| rest.trim().parse::<f64>().ok())
                .flatten()
        })
        .with_context(|| format!("no {name} in the metrics of {http_address}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn meta_and_searcher_disks_fill_up() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("disk_full");
    let mut cluster = Cluster::prepare(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 1,
            searchers: 1,
            gateways: 1,
        },
    )
    .await?;
    let meta_dir = PathBuf::from(
        cluster.metas[0]
            .arg("--data-dir")
            .context("meta data dir")?,
    );
    let cache_dir = PathBuf::from(
        cluster.searchers[0]
            .arg("--cache-dir")
            .context("searcher cache dir")?,
    );
    // A 16 MiB cache on a 24 MiB disk; meta refuses writes below 8 MiB free.
    cluster.searchers[0].set_arg("--cache-size", "16MiB");
    let meta_config = PathBuf::from(cluster.metas[0].arg("--config").context("meta config")?);
    let text = std::fs::read_to_string(&meta_config)?;
    anyhow::ensure!(text.contains("[meta]\n"), "no [meta] section in {text}");
    std::fs::write(
        &meta_config,
        text.replace(
            "[meta]\n",
            &format!("[meta]\nmin_free_disk_bytes = {META_RESERVE}\n"),
        ),
    )?;
    let meta_disk = Tmpfs::mount(&meta_dir, 32 << 20)?;
    let cache_disk = Tmpfs::mount(&cache_dir, 24 << 20)?;
    cluster.start_all().await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 1)
        .await?;
    let config = WorkloadConfig::new(COLLECTION, DIMENSION, 1_500, seed);
    let mut run = Run::start(cluster, config, "disk_full");
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(true, "before the disks fill").await?;

    // 1. The meta disk fills up: first to below its reserve (meta's own log
    // growing), then to the last block.
    let meta_address = run.cluster.metas[0].address.clone();
    let before = status_of(&meta_address).await?;
    let filled = meta_disk.fill_leaving(META_RESERVE / 2)?;
    let full_at = run.fault("meta disk full");
    eprintln!(
        "disk_full: meta disk filled with {filled} bytes, {} free",
        meta_disk.free_bytes()?
    );
    // A write is refused, saying why. A collection is created every half
    // second until then: each acknowledged one must survive everything below.
    let probe_client = pinned_meta_client(&meta_address, Duration::from_secs(5));
    let mut acknowledged_probes = Vec::new();
    let refusal = loop {
        anyhow::ensure!(
            full_at.elapsed() < Duration::from_secs(120),
            "meta still accepts writes 120 s after its disk filled up ({} probes acknowledged)",
            acknowledged_probes.len()
        );
        let name = format!("disk-probe-{}", acknowledged_probes.len());
        match probe_client.create_collection(collection_spec(&name)).await {
            Ok(_) => acknowledged_probes.push(name),
            Err(error) => break error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let refused_after = full_at.elapsed();
    eprintln!(
        "disk_full: meta refused a write {refused_after:?} after its disk filled up ({} probes \
         acknowledged before): {refusal}",
        acknowledged_probes.len()
    );
    let lower = refusal.to_lowercase();
    anyhow::ensure!(
        (lower.contains("space") || lower.contains("disk") || lower.contains("full"))
            && !lower.contains("raft stopped"),
        "meta refused a write on a full disk without saying why, or stopped: {refusal}"
    );
    // Nothing writes now: the last blocks go too.
    let filled = meta_disk.fill()?;
    eprintln!(
        "disk_full: meta disk filled with {filled} more bytes, {} free",
        meta_disk.free_bytes()?
    );
    // Reads keep working, the process stays up (no crash, no restart loop).
    wait_reads(&run, full_at, "with the meta disk full").await?;
    let reads_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_reads(&run, reads_from, "with the meta disk full for 3 s").await?;
    let linearizable = pinned_meta_client(&meta_address, Duration::from_secs(5))
        .list_collections(true)
        .await
        .context("a linearizable read of meta with its disk full")?;
    anyhow::ensure!(!linearizable.is_empty(), "meta lists no collection");
    anyhow::ensure!(
        run.cluster.metas[0].is_running(),
        "meta exited with its disk full; log:\n{}",
        run.cluster.metas[0].log_tail(30)
    );
    let health = run
        .cluster
        .http
        .get(format!(
            "http://{}/healthz",
            run.cluster.metas[0].http_address
        ))
        .send()
        .await?;
    anyhow::ensure!(
        health.status().is_success(),
        "meta is unhealthy with its disk full: {}",
        health.text().await.unwrap_or_default()
    );
    // Space again: writes work again, without a restart.
    meta_disk.free()?;
    let freed_at = run.fault("meta disk freed");
    run.wait_recovered(freed_at, "freeing the meta disk")
        .await?;
    run.checkpoint(true, "after freeing the meta disk").await?;
    // A restart finds the log intact.
    let applied = status_of(&meta_address).await?.applied_index;
    anyhow::ensure!(applied > before.applied_index, "meta applied nothing");
    let status = run.cluster.metas[0].terminate(Duration::from_secs(30))?;
    anyhow::ensure!(status.success(), "meta exited with {status} after SIGTERM");
    let restart_at = run.fault("meta restart after disk full");
    run.cluster.metas[0].start()?;
    run.cluster.metas[0]
        .wait_ready(&run.cluster.http, Duration::from_secs(60))
        .await?;
    let reopened = status_of(&meta_address).await?;
    anyhow::ensure!(
        reopened.applied_index >= applied,
        "meta came back at applied index {} below the {applied} it had",
        reopened.applied_index
    );
    let listed: Vec<String> = pinned_meta_client(&meta_address, Duration::from_secs(10))
        .list_collections(true)
        .await?
        .into_iter()
        .filter_map(|collection| collection.spec.map(|spec| spec.name))
        .collect();
    for name in &acknowledged_probes {
        anyhow::ensure!(
            listed.contains(name),
            "collection {name}, acknowledged while the meta disk was full, is gone after the restart"
        );
    }
    run.wait_recovered(restart_at, "the meta restart").await?;
    run.checkpoint(true, "after the meta restart").await?;
    run.summary.iterations += 1;

    // 2. The searcher's cache disk fills while it runs: its file is reserved.
    let filled = cache_disk.fill()?;
    let full_at = run.fault("searcher cache disk full (running)");
    eprintln!("disk_full: cache disk filled with {filled} bytes");
    wait_reads(&run, full_at, "with the cache disk full").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(false, "with the cache disk full").await?;
    anyhow::ensure!(
        run.cluster.searchers[0].is_running(),
        "the searcher exited with its cache disk full; log:\n{}",
        run.cluster.searchers[0].log_tail(30)
    );
    run.summary.iterations += 1;

    // 3. Restarted without room for a cache file: it reads through.
    let status = run.cluster.searchers[0].terminate(Duration::from_secs(30))?;
    anyhow::ensure!(
        status.success(),
        "the searcher exited with {status} after SIGTERM"
    );
    for entry in std::fs::read_dir(&cache_dir)? {
        let path = entry?.path();
        if path != cache_disk.filler() {
            std::fs::remove_file(&path)?;
        }
    }
    cache_disk.fill()?;
    let restart_at = run.fault("searcher restart on a full cache disk");
    run.cluster.searchers[0].start()?;
    run.cluster.searchers[0]
        .wait_ready(&run.cluster.http, Duration::from_secs(60))
        .await?;
    let searcher_http = run.cluster.searchers[0].http_address.clone();
    anyhow::ensure!(
        metric(
            &run.cluster.http,
            &searcher_http,
            "quiver_cache_read_through"
        )
        .await?
            == 1.0,
        "the searcher restarted on a full disk is not in read-through mode"
    );
    run.cluster
        .wait_served(COLLECTION, 1, Duration::from_secs(60))
        .await?;
    // Slow (every range a GET), so no full check here: the workload's strong
    // gets and searches answer, and the history checker judges them at the end.
    wait_reads(&run, restart_at, "through a read-through searcher").await?;
    let history = run.history.clone();
    eventually(
        "a strong search answered by the read-through searcher",
        Duration::from_secs(60),
        || {
            let history = history.clone();
            async move {
                history
                    .snapshot()
                    .searches
                    .iter()
                    .any(|search| search.started >= restart_at)
                    .then_some(())
            }
        },
    )
    .await?;
    // Room again: a restart makes a cache file.
    cache_disk.free()?;
    let status = run.cluster.searchers[0].terminate(Duration::from_secs(30))?;
    anyhow::ensure!(
        status.success(),
        "the searcher exited with {status} after SIGTERM"
    );
    let restart_at = run.fault("searcher restart with room again");
    run.cluster.searchers[0].start()?;
    run.cluster.searchers[0]
        .wait_ready(&run.cluster.http, Duration::from_secs(60))
        .await?;
    anyhow::ensure!(
        metric(
            &run.cluster.http,
            &searcher_http,
            "quiver_cache_read_through"
        )
        .await?
            == 0.0,
        "the searcher restarted with room still reads through"
    );
    run.cluster
        .wait_served(COLLECTION, 1, Duration::from_secs(60))
        .await?;
    wait_reads(&run, restart_at, "after the cache came back").await?;
    run.summary.iterations += 1;

    run.summary
        .extra
        .insert("meta_write_refusal".into(), refusal.into());
    run.summary.extra.insert(
        "meta_refused_writes_after_ms".into(),
        (refused_after.as_millis() as u64).into(),
    );
    run.summary.extra.insert(
        "meta_writes_acknowledged_on_the_full_disk".into(),
        acknowledged_probes.len().into(),
    );
    run.finish().await?;
    drop(cache_disk);
    drop(meta_disk);
    Ok(())
}
