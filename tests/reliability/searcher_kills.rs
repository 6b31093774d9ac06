//! Searchers with replication 2 under a steady query load: a searcher killed
//! with -9 costs no query (the other replica answers); a new searcher process
//! warms, takes shards and serves them — shown by killing the other old
//! replica — still without a failed query; the first one killed comes back
//! with the same identity and cache directory.

use std::time::{Duration, Instant};

use crate::cluster::{Cluster, ClusterShape, eventually, s3_endpoint};
use crate::drive::Run;
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const COLLECTION: &str = "replicas";
const DIMENSION: usize = 32;

/// Waits until every shard lists `searcher` as ready.
async fn wait_searcher_ready(cluster: &Cluster, searcher: &str) -> anyhow::Result<()> {
    let api = cluster.api();
    eventually(
        &format!("{searcher} ready on every shard"),
        Duration::from_secs(60),
        || async {
            let body = api
                .call(
                    "GET",
                    &format!("/admin/v1/collections/{COLLECTION}/shards"),
                    None,
                )
                .await
                .ok()?;
            body["shards"]
                .as_array()?
                .iter()
                .all(|shard| {
                    shard["searchers"].as_array().is_some_and(|list| {
                        list.iter()
                            .any(|entry| entry["id"] == searcher && entry["ready"] == true)
                    })
                })
                .then_some(())
        },
    )
    .await
}

/// Lets the workload run for `duration`, failing as soon as a read fails.
async fn run_without_read_errors(run: &Run, duration: Duration, phase: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        let (_, read_errors) = run.workload.as_ref().expect("running").errors();
        if read_errors > 0 {
            run.cluster.dump_logs(40);
            let kinds = run.workload.as_ref().expect("running").error_kinds();
            anyhow::bail!("{read_errors} reads failed {phase}: {kinds:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searcher_kills_and_scale_out_cost_no_query() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("searcher_kills");
    let cluster = Cluster::start(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 1,
            searchers: 2,
            gateways: 1,
        },
    )
    .await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 2)
        .await?;
    let mut config = WorkloadConfig::new(COLLECTION, DIMENSION, 1_500, seed);
    config.writers = 2;
    config.readers = 4;
    let mut run = Run::start(cluster, config, "searcher_kills");
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.checkpoint(true, "before the first kill").await?;

    let rounds = if long_profile() { 4 } else { 1 };
    for round in 0..rounds {
        // Two replicas ready (and no other searcher running); kill one of them.
        let live: Vec<usize> = (0..run.cluster.searchers.len())
            .filter(|index| run.cluster.searchers[*index].is_running())
            .collect();
        anyhow::ensure!(live.len() == 2, "expected two live searchers, not {live:?}");
        let (victim, other) = (live[0], live[1]);
        let victim_name = run.cluster.searchers[victim].name.clone();
        run_without_read_errors(&run, Duration::from_secs(1), "before the kill").await?;
        run.cluster.searchers[victim].kill9();
        run.fault("searcher kill -9");
        // Past the node timeout: meta declares it dead and reassigns.
        run_without_read_errors(
            &run,
            Duration::from_secs(5),
            &format!("after kill -9 of {victim_name}"),
        )
        .await?;

        // A new searcher process joins, warms and takes shards (with one other
        // live searcher and replication 2 it gets every shard).
        let added = run.cluster.define_searcher()?;
        let added_name = run.cluster.searchers[added].name.clone();
        run.cluster.searchers[added].start()?;
        let http = run.cluster.http.clone();
        run.cluster.searchers[added]
            .wait_ready(&http, Duration::from_secs(60))
            .await?;
        wait_searcher_ready(&run.cluster, &added_name).await?;
        run_without_read_errors(
            &run,
            Duration::from_secs(1),
            &format!("while {added_name} joined"),
        )
        .await?;

        // It really serves: kill the other old replica.
        let other_name = run.cluster.searchers[other].name.clone();
        run.cluster.searchers[other].kill9();
        run.fault("searcher kill -9");
        run_without_read_errors(
            &run,
            Duration::from_secs(5),
            &format!("with {added_name} serving alone after kill -9 of {other_name}"),
        )
        .await?;

        // The first one killed comes back with the same identity and cache.
        run.cluster.searchers[victim].start()?;
        let http = run.cluster.http.clone();
        run.cluster.searchers[victim]
            .wait_ready(&http, Duration::from_secs(60))
            .await?;
        wait_searcher_ready(&run.cluster, &victim_name).await?;
        run.cluster
            .wait_served(COLLECTION, 2, Duration::from_secs(60))
            .await?;
        run_without_read_errors(
            &run,
            Duration::from_secs(1),
            &format!("after {victim_name} came back"),
        )
        .await?;
        run.checkpoint(false, &format!("after round {round}"))
            .await?;
        run.summary.iterations += 1;
    }
    let summary = run.finish().await?;
    anyhow::ensure!(
        summary.read_errors == 0,
        "{} reads failed",
        summary.read_errors
    );
    Ok(())
}
