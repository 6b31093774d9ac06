//! Measurements for the closing note, not assertions (timing is never asserted).
//! Run: `cargo test -p quiver --test meta_processes -- --ignored --nocapture`
//! (test timings: 50 ms heartbeats, 300–600 ms election timeouts); with
//! `QUIVER_MEASURE_RAFT_DEFAULTS=1` the nodes use the default Raft timings instead
//! (250 ms heartbeats, 1–2 s election timeouts).

use std::time::{Duration, Instant};

use quiver_proto::meta as pb;

use quiver_meta::MetaClient;

use crate::support::{FAST_CONFIG, ProcessCluster, client_for, collection_spec, eventually};

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement for the report; run with --ignored --nocapture"]
async fn measure_failover_commit_latency_and_wal_throughput() -> anyhow::Result<()> {
    let config_text = if std::env::var_os("QUIVER_MEASURE_RAFT_DEFAULTS").is_some() {
        FAST_CONFIG
            .lines()
            .filter(|line| {
                !line.starts_with("heartbeat_interval_ms") && !line.starts_with("election_timeout")
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        FAST_CONFIG.to_owned()
    };
    let mut cluster = ProcessCluster::start_with_config(3, &config_text)?;

    // Leader failover: kill -9 the leader, time until a survivor leads; 10 rounds.
    let mut failovers = Vec::new();
    for _round in 0..10 {
        let leader = cluster
            .wait_for_agreed_leader(Duration::from_secs(30))
            .await?;
        let survivors: Vec<u64> = (1..=3).filter(|node_id| *node_id != leader).collect();
        let killed_at = Instant::now();
        cluster.kill_nine(leader)?;
        cluster
            .wait_for_leader_other_than(leader, &survivors, Duration::from_secs(20))
            .await?;
        failovers.push(killed_at.elapsed());
        cluster.spawn(leader)?;
        // The next round starts from a healthy cluster: all logs equal and applied.
        cluster
            .wait_for_agreed_leader(Duration::from_secs(30))
            .await?;
        let probes: Vec<(String, MetaClient)> = (1..=3)
            .map(|node_id| {
                (
                    cluster.address(node_id),
                    client_for(vec![cluster.address(node_id)]),
                )
            })
            .collect();
        eventually(
            "all logs equal and applied",
            Duration::from_secs(30),
            || async {
                let mut positions = Vec::new();
                for (address, probe) in &probes {
                    let status = probe.cluster_status_of(address).await.ok()?;
                    positions.push((status.last_log_index, status.applied_index));
                }
                let first = positions[0];
                positions
                    .iter()
                    .all(|position| *position == first && position.0 == position.1)
                    .then_some(())
            },
        )
        .await?;
    }
    failovers.sort();
    cluster
        .wait_for_agreed_leader(Duration::from_secs(30))
        .await?;

    let client = cluster.client();
    let mut spec = collection_spec("bench");
    spec.shards = 8;
    let collection = client
        .create_collection(spec)
        .await?
        .collection
        .expect("collection");
    client
        .register_node(pb::RegisterNodeRequest {
            node_id: "indexer-bench".into(),
            role: pb::NodeRole::Indexer as i32,
            address: "127.0.0.1:1".into(),
        })
        .await?;
    let mut epochs = Vec::new();
    for shard in 0..8 {
        let lease = client
            .acquire_lease(pb::AcquireLeaseRequest {
                shard: Some(pb::ShardRef {
                    collection_id: collection.collection_id,
                    shard,
                }),
                node_id: "indexer-bench".into(),
                ttl_ms: 600_000,
            })
            .await?;
        epochs.push(lease.epoch);
    }

    // Commit latency of a manifest change (add one segment), sequential.
    let shard0 = pb::ShardRef {
        collection_id: collection.collection_id,
        shard: 0,
    };
    let mut latencies = Vec::new();
    for index in 0..500 {
        let request = pb::CommitManifestChangeRequest {
            shard: Some(shard0),
            epoch: epochs[0],
            add_segments: vec![pb::Segment {
                segment_id: format!("seg-{index}"),
                object_key: format!("segments/seg-{index}.qseg"),
                rows: 1_000,
                size_bytes: 1 << 20,
                deletes_key: String::new(),
                deletes_version: 0,
                ..Default::default()
            }],
            ..Default::default()
        };
        let started = Instant::now();
        client.commit_manifest_change(request).await?;
        latencies.push(started.elapsed());
    }
    latencies.sort();

    // CommitWal throughput: one shard, then eight shards concurrently.
    let measure_for = Duration::from_secs(5);
    let mut throughput = Vec::new();
    for shards in [1u32, 8] {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for shard in 0..shards {
            let client = client.clone();
            let shard_ref = pb::ShardRef {
                collection_id: collection.collection_id,
                shard,
            };
            let epoch = epochs[shard as usize];
            let seq_base = u64::from(shards) * 1_000_000;
            tasks.push(tokio::spawn(async move {
                let mut calls = 0u64;
                while started.elapsed() < measure_for {
                    let seq = seq_base + calls + 1;
                    client
                        .commit_wal(pb::CommitWalRequest {
                            shard: Some(shard_ref),
                            epoch,
                            seq,
                            object_key: format!("wal/{shard}/{seq}"),
                            rows: 100,
                        })
                        .await?;
                    calls += 1;
                }
                anyhow::Ok(calls)
            }));
        }
        let mut total = 0u64;
        for task in tasks {
            total += task.await??;
        }
        throughput.push((shards, total as f64 / started.elapsed().as_secs_f64()));
    }

    println!(
        "failover (kill -9 leader -> survivor leads), 10 rounds: median {:?}, min {:?}, max {:?}",
        percentile(&failovers, 0.5),
        failovers[0],
        failovers[failovers.len() - 1]
    );
    println!("failovers: {failovers:?}");
    println!(
        "manifest change commit latency (500 sequential): p50 {:?}, p99 {:?}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );
    for (shards, calls_per_second) in throughput {
        println!(
            "CommitWal throughput, {shards} shard(s) concurrently: {calls_per_second:.0} calls/s"
        );
    }
    Ok(())
}
