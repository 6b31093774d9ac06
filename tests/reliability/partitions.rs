//! Network faults through per-link TCP proxies (`proxy.rs`), under the workload:
//! - the meta leader cut off from both other meta nodes (every Raft link of a
//!   3-node meta goes through its own proxy): the majority elects a new leader
//!   and the workload goes on against it, the old leader commits nothing (its
//!   commit index stays put, a write sent to it fails); healed, every node
//!   holds the same catalog; also a slow leader (delayed links) and a flap
//!   (its connections reset);
//! - an indexer cut off from meta (its `--meta` address is a proxy): its lease
//!   expires, the other indexer takes the shards over at epoch + 1, a write
//!   sent straight to the cut-off indexer is refused and never appears;
//!   healed, it corrupts nothing; also a slow meta link and a flap.
//!
//! A write in flight to an indexer cut off from meta is never acknowledged,
//! but it is not refused quickly either: the indexer's meta client retries
//! the WAL commit for 30 s, then reconciles, so the gateway answers after its
//! own 30 s timeout, and the clients (one write in flight each) stall that long
//! although the takeover takes about 3 s (`takeovers_ms` in the summary).
//!
//! Partitions are made two ways: `cut` (connections reset, new ones refused)
//! and `stall` (nothing moves, connections hang, queued bytes arrive late on
//! heal — stale Raft messages and stale commits reach their target then).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use quiver_meta::{MetaClient, MetaClientConfig};
use quiver_proto::meta as pb;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::cluster::{Cluster, ClusterShape, eventually, s3_endpoint};
use crate::drive::Run;
use crate::proxy::{LinkMode, Links};
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const DIMENSION: usize = 32;

/// One fault of a group of links.
#[derive(Clone, Copy, Debug)]
enum LinkFault {
    /// Connections reset, new ones refused.
    Cut,
    /// Nothing moves; connections hang.
    Stall,
    /// Everything arrives this much later, both ways.
    Slow(Duration),
    /// Open connections reset once.
    Flap,
}

impl LinkFault {
    fn is_partition(self) -> bool {
        matches!(self, LinkFault::Cut | LinkFault::Stall)
    }

    fn name(self) -> String {
        match self {
            LinkFault::Cut => "partition (cut)".into(),
            LinkFault::Stall => "partition (stall)".into(),
            LinkFault::Slow(delay) => format!("slow links (+{} ms each way)", delay.as_millis()),
            LinkFault::Flap => "connections reset".into(),
        }
    }

    /// Applies the fault to every link touching `process`.
    fn apply(self, links: &Links, process: &str) -> usize {
        match self {
            LinkFault::Cut => links.set_touching(process, LinkMode::Cut),
            LinkFault::Stall => links.set_touching(process, LinkMode::Stall),
            LinkFault::Slow(delay) => links.set_touching(process, LinkMode::Delay(delay)),
            LinkFault::Flap => links.reset_touching(process),
        }
    }
}

/// A client of one meta node only (it still follows a leader hint).
pub(crate) fn pinned_meta_client(address: &str, retry_deadline: Duration) -> MetaClient {
    let mut config = MetaClientConfig::new(vec![address.to_string()]);
    config.attempt_timeout = Duration::from_secs(3);
    config.connect_timeout = Duration::from_millis(300);
    config.retry_deadline = retry_deadline;
    MetaClient::new(config).expect("valid meta client config")
}

pub(crate) async fn status_of(address: &str) -> anyhow::Result<pb::ClusterStatusResponse> {
    pinned_meta_client(address, Duration::from_secs(2))
        .cluster_status_of(address)
        .await
        .with_context(|| format!("cluster status of meta node {address}"))
}

pub(crate) fn collection_spec(name: &str) -> pb::CollectionSpec {
    pb::CollectionSpec {
        name: name.to_string(),
        dimension: 4,
        metric: pb::Metric::L2 as i32,
        shards: 1,
        replication: 1,
        ..Default::default()
    }
}

/// Starts the prepared cluster with every Raft link of its 3 meta nodes
/// through a proxy of `links` (`meta-A -> meta-B`).
///
/// `--peers` is both the list meta-1 initializes the membership from and each
/// node's routes to its peers; the membership addresses are what clients are
/// sent to as leader hints, so they must be the real ones. So meta-1 first
/// initializes the cluster alone with the real addresses and stops; then every
/// node starts with its proxied routes (meta-1's `--init` is then ignored,
/// which is checked).
async fn start_with_proxied_meta(cluster: &mut Cluster, links: &mut Links) -> anyhow::Result<()> {
    let real: Vec<String> = cluster
        .metas
        .iter()
        .map(|meta| meta.address.clone())
        .collect();
    cluster.metas[0].start()?;
    {
        let first = &cluster.metas[0];
        eventually(
            "meta-1 initializing the membership",
            Duration::from_secs(30),
            || async {
                first
                    .log_text()
                    .contains("metadata node started")
                    .then_some(())
            },
        )
        .await
        .with_context(|| first.log_tail(20))?;
    }
    let status = cluster.metas[0].terminate(Duration::from_secs(20))?;
    anyhow::ensure!(
        status.success(),
        "meta-1 exited with {status} after SIGTERM"
    );
    for from in 0..real.len() {
        let mut routes = Vec::new();
        for (to, address) in real.iter().enumerate() {
            let route = if to == from {
                address.clone()
            } else {
                links
                    .add(&format!("meta-{} -> meta-{}", from + 1, to + 1), address)
                    .await?
            };
            routes.push(format!("{}={route}", to + 1));
        }
        cluster.metas[from].set_arg("--peers", &routes.join(","));
    }
    cluster.start_all().await?;
    anyhow::ensure!(
        cluster.metas[0].log_text().contains("raft state exists"),
        "meta-1 did not keep the membership it initialized with the real addresses; log:\n{}",
        cluster.metas[0].log_tail(30)
    );
    Ok(())
}

/// Waits until every meta node answers the same collections and the same
/// manifest for every shard (non-linearizable reads: each node's own applied
/// state); fails if a collection named `isolated-*` exists anywhere.
async fn one_history(cluster: &Cluster) -> anyhow::Result<usize> {
    let addresses: Vec<String> = cluster
        .metas
        .iter()
        .map(|meta| meta.address.clone())
        .collect();
    let (collections, manifests) = eventually(
        "every meta node holding the same catalog",
        Duration::from_secs(60),
        || async {
            let mut views = Vec::new();
            for address in &addresses {
                let client = pinned_meta_client(address, Duration::from_secs(2));
                let collections = client.list_collections(false).await.ok()?;
                let mut manifests = Vec::new();
                for collection in &collections {
                    let shards = collection
                        .spec
                        .as_ref()
                        .map_or(1, |spec| spec.shards)
                        .max(1);
                    for shard in 0..shards {
                        let reference = pb::ShardRef {
                            collection_id: collection.collection_id,
                            shard,
                        };
                        manifests.push(client.get_manifest(reference, false).await.ok()?);
                    }
                }
                views.push((collections, manifests));
            }
            views
                .windows(2)
                .all(|pair| pair[0] == pair[1])
                .then(|| views.swap_remove(0))
        },
    )
    .await?;
    for collection in &collections {
        let name = collection
            .spec
            .as_ref()
            .map_or("", |spec| spec.name.as_str());
        anyhow::ensure!(
            !name.starts_with("isolated-"),
            "collection {name}, written to a partitioned meta leader, was committed"
        );
    }
    Ok(manifests.len())
}

fn millis(durations: &[Duration]) -> serde_json::Value {
    json!(
        durations
            .iter()
            .map(|duration| duration.as_millis() as u64)
            .collect::<Vec<_>>()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn meta_leader_partition_majority_moves_on() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("meta_partition");
    let mut rng = StdRng::seed_from_u64(seed);
    // Slow links stay below the Raft heartbeat (50 ms here) round trip: see
    // the ignored test below for what happens above it.
    let mut faults = vec![
        LinkFault::Cut,
        LinkFault::Stall,
        LinkFault::Slow(Duration::from_millis(15)),
        LinkFault::Flap,
    ];
    if long_profile() {
        for _ in 0..4 {
            faults.extend([LinkFault::Cut, LinkFault::Stall]);
        }
        faults.extend([
            LinkFault::Slow(Duration::from_millis(20)),
            LinkFault::Flap,
            LinkFault::Flap,
        ]);
        faults.shuffle(&mut rng);
    }
    meta_leader_faults(&endpoint, "meta_partition", seed, faults).await
}

// A meta leader whose round trip to its peers exceeds the Raft heartbeat
// interval (openraft 0.9 gives every AppendEntries exactly one heartbeat
// interval) commits nothing, yet its late appends still reach the followers
// and keep their leader lease alive. Check-quorum (quiver-meta's election
// loop) makes it stop sending once no quorum acknowledged it for two leader
// leases; the two followers then elect a leader between themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_meta_leader_is_replaced() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("slow_meta_leader");
    let faults = vec![LinkFault::Slow(Duration::from_millis(120))];
    meta_leader_faults(&endpoint, "slow_meta_leader", seed, faults).await
}

/// Runs `faults` one after the other against the meta leader of the moment,
/// under the workload, healing and checking after each.
async fn meta_leader_faults(
    endpoint: &str,
    scenario: &str,
    seed: u64,
    faults: Vec<LinkFault>,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut cluster = Cluster::prepare(
        endpoint,
        ClusterShape {
            metas: 3,
            indexers: 1,
            searchers: 1,
            gateways: 2,
        },
    )
    .await?;
    let mut links = Links::default();
    start_with_proxied_meta(&mut cluster, &mut links).await?;
    let collection = scenario;
    cluster
        .create_collection(collection, DIMENSION, 2, 1)
        .await?;
    let config = WorkloadConfig::new(collection, DIMENSION, 1_500, seed);
    let mut run = Run::start(cluster, config, scenario);
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(true, "before the first fault").await?;

    let mut elections = Vec::new();
    let mut rejoins = Vec::new();
    let mut isolated_term_growth = Vec::new();
    let mut refused_writes = BTreeMap::<String, usize>::new();
    for (iteration, fault) in faults.into_iter().enumerate() {
        let leader = run.cluster.meta_leader().await?;
        let leader_name = format!("meta-{leader}");
        let leader_address = run.cluster.metas[leader as usize - 1].address.clone();
        let majority: Vec<String> = run
            .cluster
            .metas
            .iter()
            .filter(|meta| meta.address != leader_address)
            .map(|meta| meta.address.clone())
            .collect();
        let old_term = status_of(&leader_address).await?.term;
        let kind = format!("meta leader {}", fault.name());
        let when = format!("after fault {} ({kind} of {leader_name})", iteration + 1);
        eprintln!("{scenario}: {when}");
        let fault_at = run.fault(&kind);
        let touched = fault.apply(&links, &leader_name);
        anyhow::ensure!(
            touched == 4,
            "{leader_name} has {touched} links, expected 4"
        );

        if fault.is_partition() {
            // The majority elects a leader of a newer term.
            let new_leader = eventually(
                "a new meta leader on the majority side",
                Duration::from_secs(30),
                || async {
                    let mut named = BTreeSet::new();
                    let mut terms = Vec::new();
                    for address in &majority {
                        let status = status_of(address).await.ok()?;
                        named.insert(status.leader_id);
                        terms.push(status.term);
                    }
                    let new_leader = *named.first()?;
                    (named.len() == 1 && new_leader != 0 && new_leader != leader)
                        .then_some((new_leader, terms))
                },
            )
            .await
            .with_context(|| run.cluster.describe_processes())?;
            elections.push(fault_at.elapsed());
            anyhow::ensure!(
                new_leader.1.iter().all(|term| *term > old_term),
                "the new leader meta-{} was elected at terms {:?}, not above the old {old_term}",
                new_leader.0,
                new_leader.1
            );
            // The old leader commits nothing: not what it had in flight, not a
            // write sent to it now.
            let frozen = status_of(&leader_address).await?;
            let isolated = pinned_meta_client(&leader_address, Duration::from_secs(3));
            let probe = format!("isolated-{iteration}");
            match isolated.create_collection(collection_spec(&probe)).await {
                Ok(answer) => {
                    anyhow::bail!("{leader_name}, partitioned, acknowledged a write: {answer:?}")
                }
                Err(error) => {
                    let text: String = error
                        .to_string()
                        .chars()
                        .map(|c| if c.is_ascii_digit() { '#' } else { c })
                        .take(120)
                        .collect();
                    *refused_writes.entry(text).or_default() += 1;
                }
            }
            // The workload goes on against the majority.
            run.wait_recovered(fault_at, &when).await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..2_500))).await;
            let still = status_of(&leader_address).await?;
            anyhow::ensure!(
                still.commit_index == frozen.commit_index,
                "{leader_name}, partitioned, committed: commit index {} became {}",
                frozen.commit_index,
                still.commit_index
            );
            isolated_term_growth.push(still.term.saturating_sub(old_term));
        } else {
            // Slow or flapping links: the cluster keeps going (a leader change
            // is allowed, not required).
            run.wait_recovered(fault_at, &when).await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        }

        links.heal_all();
        let heal_kind = format!("heal after meta leader {}", fault.name());
        let healed_at = run.fault(&heal_kind);
        // One history: one leader named by everyone, every node with the same
        // catalog (the workload paused so manifests settle).
        run.cluster.meta_leader().await?;
        let leader_commit = {
            let leader = run.cluster.meta_leader().await?;
            status_of(&run.cluster.metas[leader as usize - 1].address)
                .await?
                .commit_index
        };
        {
            let old = leader_address.clone();
            eventually(
                "the old leader catching up",
                Duration::from_secs(60),
                || async {
                    let status = status_of(&old).await.ok()?;
                    (status.applied_index >= leader_commit && status.leader_id != 0).then_some(())
                },
            )
            .await?;
        }
        rejoins.push(healed_at.elapsed());
        run.wait_recovered(healed_at, &format!("healing ({when})"))
            .await?;
        run.workload
            .as_ref()
            .context("workload running")?
            .pause()
            .await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        one_history(&run.cluster).await?;
        run.checkpoint(true, &when).await?;
        run.summary.iterations += 1;
    }
    let (accepted, refused, killed, bytes) = links.totals();
    let extra = &mut run.summary.extra;
    extra.insert("elections_ms".into(), millis(&elections));
    extra.insert("rejoin_after_heal_ms".into(), millis(&rejoins));
    extra.insert(
        "isolated_leader_term_growth".into(),
        json!(isolated_term_growth),
    );
    extra.insert(
        "writes_sent_to_the_isolated_leader".into(),
        json!(refused_writes),
    );
    extra.insert(
        "proxy".into(),
        json!({"connections": accepted, "refused": refused, "reset": killed, "bytes": bytes}),
    );
    run.finish().await?;
    Ok(())
}

/// Returns the indexer holding every shard of the collection.
fn sole_holder(cluster: &Cluster, leases: &BTreeMap<u64, (String, u64)>) -> anyhow::Result<usize> {
    let holders: BTreeSet<&String> = leases.values().map(|(holder, _)| holder).collect();
    anyhow::ensure!(
        holders.len() == 1,
        "shards held by several indexers: {leases:?}"
    );
    let holder = holders.into_iter().next().expect("one holder");
    cluster
        .indexers
        .iter()
        .position(|indexer| &indexer.name == holder)
        .ok_or_else(|| anyhow::anyhow!("no indexer named `{holder}`"))
}

/// Sends an upsert of `id` straight to the indexer at `address` (not through
/// the gateway); returns the error it must answer with.
async fn write_straight_to(
    address: &str,
    collection_id: u64,
    shards: u32,
    id: u64,
) -> anyhow::Result<Result<quiver_proto::data::WriteResponse, tonic::Status>> {
    use quiver_proto::data as data_pb;
    let point_id = data_pb::PointId {
        kind: Some(data_pb::point_id::Kind::Num(id)),
    };
    let shard = quiver_proto::convert::shard_of(&quiver_index::PointId::U64(id), shards);
    let mut client =
        data_pb::indexer_client::IndexerClient::connect(format!("http://{address}")).await?;
    let request = data_pb::WriteRequest {
        shard: Some(pb::ShardRef {
            collection_id,
            shard,
        }),
        records: vec![data_pb::WriteRecord {
            op: Some(data_pb::write_record::Op::Upsert(data_pb::Point {
                id: Some(point_id),
                vector: crate::history::vector(id, 1, DIMENSION),
                payload_json: Vec::new(),
            })),
        }],
    };
    let mut request = tonic::Request::new(request);
    request.set_timeout(Duration::from_secs(60));
    Ok(client.write(request).await.map(tonic::Response::into_inner))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn indexer_cut_off_from_meta_is_fenced() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("indexer_partition");
    let mut rng = StdRng::seed_from_u64(seed);
    const COLLECTION: &str = "indexer_partition";
    // indexer-1 alone first, so it holds every shard; indexer-2 is the standby.
    // Each reaches meta through its own proxy.
    let mut cluster = Cluster::prepare(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 2,
            searchers: 1,
            gateways: 1,
        },
    )
    .await?;
    let mut links = Links::default();
    let meta_address = cluster.metas[0].address.clone();
    for indexer in &mut cluster.indexers {
        let route = links
            .add(&format!("{} -> meta-1", indexer.name), &meta_address)
            .await?;
        indexer.set_arg("--meta", &route);
    }
    cluster.metas[0].start()?;
    cluster.indexers[0].start()?;
    for process in cluster
        .searchers
        .iter_mut()
        .chain(cluster.gateways.iter_mut())
    {
        process.start()?;
    }
    cluster.start_all_ready().await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 1)
        .await?;
    cluster.indexers[1].start()?;
    cluster.start_all_ready().await?;
    let described = cluster
        .meta_client()
        .get_collection(COLLECTION, true)
        .await?;
    let collection_id = described.collection_id;

    let ids = 1_500;
    let config = WorkloadConfig::new(COLLECTION, DIMENSION, ids, seed);
    let mut run = Run::start(cluster, config, "indexer_partition");
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(true, "before the first fault").await?;

    // Writes in flight to the cut-off indexer hang until the gateway gives up
    // (30 s, see the module doc), so the quick profile makes one partition,
    // cut or stall by the seed.
    let partition = if rng.random_bool(0.5) {
        LinkFault::Cut
    } else {
        LinkFault::Stall
    };
    let mut faults = vec![
        partition,
        LinkFault::Slow(Duration::from_millis(300)),
        LinkFault::Flap,
    ];
    if long_profile() {
        for _ in 0..4 {
            faults.extend([LinkFault::Cut, LinkFault::Stall]);
        }
        faults.extend([
            LinkFault::Slow(Duration::from_millis(1_200)),
            LinkFault::Flap,
            LinkFault::Flap,
        ]);
        faults.shuffle(&mut rng);
    }
    // Ids far past the workload's, written straight to a fenced indexer.
    let mut probes: Vec<u64> = Vec::new();
    let mut probe_errors = BTreeMap::<String, usize>::new();
    let mut takeovers = Vec::new();
    let mut epochs = run.cluster.leases(COLLECTION).await?;
    for (iteration, fault) in faults.into_iter().enumerate() {
        let mut probe_task = None;
        let holder = sole_holder(&run.cluster, &epochs)?;
        let holder_name = run.cluster.indexers[holder].name.clone();
        let holder_address = run.cluster.indexers[holder].address.clone();
        let kind = format!("indexer-meta {}", fault.name());
        let when = format!("after fault {} ({kind} of {holder_name})", iteration + 1);
        eprintln!("indexer_partition: {when}");
        let fault_at = run.fault(&kind);
        let touched = fault.apply(&links, &holder_name);
        anyhow::ensure!(touched == 1, "{holder_name} has {touched} meta links");

        if fault.is_partition() {
            // Its lease expires; the other indexer takes every shard at epoch + 1.
            let previous = epochs.clone();
            let cluster = &run.cluster;
            epochs = eventually(
                &format!("the shards of {holder_name} taken over"),
                Duration::from_secs(60),
                || async {
                    let leases = cluster.leases(COLLECTION).await.ok()?;
                    leases
                        .iter()
                        .all(|(shard, (owner, epoch))| {
                            *owner != holder_name && !owner.is_empty() && *epoch > previous[shard].1
                        })
                        .then_some(leases)
                },
            )
            .await?;
            takeovers.push(fault_at.elapsed());
            for (shard, (owner, epoch)) in &epochs {
                let before = previous[shard].1;
                anyhow::ensure!(
                    *epoch == before + 1,
                    "shard {shard}: epoch {before} became {epoch} on takeover by {owner}, expected {}",
                    before + 1
                );
            }
            // The cut-off indexer does not know yet, but cannot commit: a write
            // sent straight to it now must fail, before or after the heal (its
            // commit reaches meta late with the old epoch, if at all).
            let probe = 10_000_000 + iteration as u64;
            probes.push(probe);
            let address = holder_address.clone();
            probe_task = Some(tokio::spawn(async move {
                write_straight_to(&address, collection_id, 2, probe).await
            }));
            run.wait_recovered(fault_at, &when).await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..1_500))).await;
        } else {
            run.wait_recovered(fault_at, &when).await?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        }

        links.heal_all();
        let healed_at = run.fault(&format!("heal after indexer-meta {}", fault.name()));
        if let Some(task) = probe_task.take() {
            let answer = tokio::time::timeout(Duration::from_secs(90), task)
                .await
                .context("a write sent to the fenced indexer got no answer within 90 s")???;
            match answer {
                Ok(answer) => anyhow::bail!(
                    "{holder_name}, cut off from meta after losing its lease, acknowledged a write: {answer:?}"
                ),
                Err(status) => {
                    let text: String = format!("{:?}: {}", status.code(), status.message())
                        .chars()
                        .map(|c| if c.is_ascii_digit() { '#' } else { c })
                        .take(140)
                        .collect();
                    *probe_errors.entry(text).or_default() += 1;
                }
            }
        }
        run.cluster.indexers[holder]
            .wait_ready(&run.cluster.http, Duration::from_secs(60))
            .await?;
        anyhow::ensure!(
            run.cluster.indexers[holder].is_running(),
            "{holder_name} exited after the heal; log:\n{}",
            run.cluster.indexers[holder].log_tail(30)
        );
        run.wait_recovered(healed_at, &format!("healing ({when})"))
            .await?;
        run.cluster
            .wait_served(COLLECTION, 1, Duration::from_secs(60))
            .await?;
        let checkpoint = run.checkpoint(true, &when).await?;
        epochs = run.cluster.leases(COLLECTION).await?;
        if let Some(scan) = checkpoint.scan {
            let newest = epochs.values().map(|(_, epoch)| *epoch).max().unwrap_or(0);
            anyhow::ensure!(
                scan.max_tail_epoch <= newest,
                "the WAL tail holds epoch {} beyond the newest lease epoch {newest}",
                scan.max_tail_epoch
            );
        }
        // No write sent to a fenced indexer ever shows up.
        let api = run.cluster.api();
        let found = api
            .get(COLLECTION, &probes, Duration::from_secs(20))
            .await
            .map_err(|error| anyhow::anyhow!("strong get of the probe ids: {error}"))?;
        anyhow::ensure!(
            found.is_empty(),
            "writes refused by a fenced indexer are visible: {:?}",
            found.iter().map(|(id, _)| *id).collect::<Vec<_>>()
        );
        run.summary.iterations += 1;
    }
    let (accepted, refused, killed, bytes) = links.totals();
    let extra = &mut run.summary.extra;
    extra.insert("takeovers_ms".into(), millis(&takeovers));
    extra.insert(
        "writes_sent_to_the_fenced_indexer".into(),
        json!(probe_errors),
    );
    extra.insert(
        "proxy".into(),
        json!({"connections": accepted, "refused": refused, "reset": killed, "bytes": bytes}),
    );
    run.finish().await?;
    Ok(())
}
