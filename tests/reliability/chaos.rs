//! kill -9 and restart, in a loop with random timing, of a gateway, a meta
//! follower, the meta leader (3-node meta) and the indexer holding a shard,
//! with the workload running through two gateways; the checker runs after
//! every fault.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, ClusterShape, s3_endpoint};
use crate::drive::Run;
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const COLLECTION: &str = "chaos";
const DIMENSION: usize = 32;

#[derive(Clone, Copy, Debug)]
enum Target {
    Gateway,
    MetaFollower,
    MetaLeader,
    Indexer,
}

impl Target {
    fn kind(self, graceful: bool) -> String {
        let role = match self {
            Target::Gateway => "gateway",
            Target::MetaFollower => "meta follower",
            Target::MetaLeader => "meta leader",
            Target::Indexer => "indexer",
        };
        let stop = if graceful { "SIGTERM" } else { "kill -9" };
        format!("{role} {stop} + restart")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_and_restart_every_role_under_load() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("chaos");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start(
        &endpoint,
        ClusterShape {
            metas: 3,
            indexers: 2,
            searchers: 2,
            gateways: 2,
        },
    )
    .await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, 2, 2)
        .await?;
    let config = WorkloadConfig::new(COLLECTION, DIMENSION, 2_000, seed);
    let mut run = Run::start(cluster, config, "chaos");
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.checkpoint(true, "before the first fault").await?;

    let per_target = if long_profile() { 15 } else { 2 };
    let mut faults = Vec::new();
    for _ in 0..per_target {
        faults.extend([
            Target::Gateway,
            Target::MetaFollower,
            Target::MetaLeader,
            Target::Indexer,
        ]);
    }
    faults.shuffle(&mut rng);
    for (iteration, target) in faults.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..3_000))).await;
        // Mostly kill -9; one stop in five is a graceful SIGTERM, which must
        // drain and exit cleanly.
        let graceful = rng.random_bool(0.2);
        let kind = target.kind(graceful);
        let when = format!("after fault {} ({kind})", iteration + 1);
        eprintln!("chaos: {when}");
        let (role, index) = pick(&run.cluster, target, &mut rng).await?;
        let fault_at = run.fault(&kind);
        let process = process_mut(&mut run.cluster, role, index);
        if graceful {
            let status = process.terminate(Duration::from_secs(30))?;
            anyhow::ensure!(
                status.success(),
                "{} exited with {status} after SIGTERM; log:\n{}",
                process.name,
                process.log_tail(30)
            );
        } else {
            process.kill9();
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..2_000))).await;
        let http = run.cluster.http.clone();
        let process = process_mut(&mut run.cluster, role, index);
        process.start()?;
        process.wait_ready(&http, Duration::from_secs(60)).await?;
        run.wait_recovered(fault_at, &when).await?;
        run.cluster
            .wait_served(COLLECTION, 1, Duration::from_secs(60))
            .await?;
        run.checkpoint(true, &when).await?;
        run.summary.iterations += 1;
    }
    run.finish().await?;
    Ok(())
}

#[derive(Clone, Copy)]
enum RoleList {
    Metas,
    Indexers,
    Gateways,
}

fn process_mut(
    cluster: &mut Cluster,
    role: RoleList,
    index: usize,
) -> &mut crate::cluster::Process {
    match role {
        RoleList::Metas => &mut cluster.metas[index],
        RoleList::Indexers => &mut cluster.indexers[index],
        RoleList::Gateways => &mut cluster.gateways[index],
    }
}

/// Chooses the process to kill: a random gateway, the meta leader or a random
/// follower, or the indexer holding a random shard.
async fn pick(
    cluster: &Cluster,
    target: Target,
    rng: &mut StdRng,
) -> anyhow::Result<(RoleList, usize)> {
    Ok(match target {
        Target::Gateway => (
            RoleList::Gateways,
            rng.random_range(0..cluster.gateways.len()),
        ),
        Target::MetaLeader | Target::MetaFollower => {
            let leader = cluster.meta_leader().await? as usize;
            let index = if matches!(target, Target::MetaLeader) {
                leader - 1
            } else {
                let followers: Vec<usize> = (0..cluster.metas.len())
                    .filter(|index| *index != leader - 1)
                    .collect();
                *followers.choose(rng).expect("two followers")
            };
            (RoleList::Metas, index)
        }
        Target::Indexer => {
            let leases = cluster.leases(COLLECTION).await?;
            let holders: Vec<&String> = leases.values().map(|(holder, _)| holder).collect();
            let holder = holders.choose(rng).expect("a shard");
            let index = cluster
                .indexers
                .iter()
                .position(|indexer| &indexer.name == *holder)
                .ok_or_else(|| anyhow::anyhow!("no indexer named {holder}"))?;
            (RoleList::Indexers, index)
        }
    })
}
