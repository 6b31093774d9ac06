//! Indexer deaths at ≥ 20 kill points under load: precise crash points of the
//! write path (`fail` crash points armed through `FAILPOINTS`: during a WAL PUT, after it but before the
//! commit to meta, after the commit before the answer, during a flush's upload,
//! after it before the manifest commit, during a merge's upload, after it
//! before its commit), kill -9 at random moments, and a frozen (SIGSTOP) lease
//! holder that wakes up as a zombie. Each time the second indexer process takes
//! the shards over (epoch + 1), the dead one comes back as the standby, and the
//! checker verifies every acknowledged write, the live count, and the flat scan
//! of the manifests and S3 objects.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, ClusterShape, eventually, s3_endpoint};
use crate::drive::Run;
use crate::workload::WorkloadConfig;
use crate::{SERIAL, long_profile, seed};

const COLLECTION: &str = "kills";
const DIMENSION: usize = 32;

/// The crash points the indexer knows, and how many arrivals to let pass at most.
const CRASH_POINTS: [(&str, u64); 7] = [
    ("wal-put", 30),
    ("wal-commit", 30),
    ("wal-ack", 30),
    ("flush-upload", 3),
    ("flush-commit", 3),
    ("merge-upload", 2),
    ("merge-commit", 2),
];

#[derive(Clone, Debug)]
enum Kill {
    /// The lease holder aborts itself at `point` the `nth` time it gets there.
    CrashPoint { point: &'static str, nth: u64 },
    /// kill -9 of the lease holder after a random delay.
    Random { after: Duration },
    /// SIGSTOP of the lease holder until the other indexer took over, then SIGCONT.
    Freeze,
}

impl Kill {
    /// Returns the `FAILPOINTS` value that aborts at this kill's crash point:
    /// `nth - 1` arrivals pass (`off`), the next one crashes (`return`).
    fn arming(&self) -> Option<String> {
        match self {
            Kill::CrashPoint { point, nth } => Some(format!("{point}={}*off->return", nth - 1)),
            _ => None,
        }
    }

    fn kind(&self) -> String {
        match self {
            Kill::CrashPoint { point, .. } => format!("indexer abort at {point}"),
            Kill::Random { .. } => "indexer kill -9 (random moment)".into(),
            Kill::Freeze => "indexer SIGSTOP (zombie)".into(),
        }
    }
}

fn plan(rng: &mut StdRng) -> Vec<Kill> {
    let (rounds, random, freezes) = if long_profile() {
        (8, 30, 6)
    } else {
        (2, 5, 1)
    };
    let mut kills = Vec::new();
    for _ in 0..rounds {
        for (point, most) in CRASH_POINTS {
            // Not the first WAL batches after a takeover: the new holder must
            // serve a little before it dies in turn.
            let least = if point.starts_with("wal") { 5 } else { 1 };
            kills.push(Kill::CrashPoint {
                point,
                nth: rng.random_range(least..=most),
            });
        }
    }
    for _ in 0..random {
        kills.push(Kill::Random {
            after: Duration::from_millis(rng.random_range(200..2_500)),
        });
    }
    for _ in 0..freezes {
        kills.push(Kill::Freeze);
    }
    kills.shuffle(rng);
    kills
}

/// Gives indexer `index` its next fate from `plan` (armed through the
/// environment when it is a crash point) and starts (or restarts) it.
async fn start_with_fate(
    run_cluster: &mut Cluster,
    index: usize,
    plan: &mut Vec<Kill>,
    fates: &mut [Option<Kill>],
) -> anyhow::Result<()> {
    let fate = plan.pop();
    let arming = fate.as_ref().and_then(Kill::arming);
    let process = &mut run_cluster.indexers[index];
    // Reaps an ended earlier run (a no-op on a first start).
    process.kill9();
    process.set_env(quiver_indexer::FAILPOINTS_VARIABLE, arming.as_deref());
    process.start()?;
    let http = run_cluster.http.clone();
    run_cluster.indexers[index]
        .wait_ready(&http, Duration::from_secs(60))
        .await?;
    if arming.is_some() {
        // The binary must have been built with the crash points (feature
        // `failpoints`), or the test would wait for a crash that never comes.
        let log = run_cluster.indexers[index].log_text();
        let this_start = log
            .rsplit("===== harness: start")
            .next()
            .unwrap_or_default();
        anyhow::ensure!(
            this_start.contains("failpoints armed"),
            "{} did not arm {arming:?}: is the quiver binary built with feature `failpoints`? log:\n{}",
            run_cluster.indexers[index].name,
            run_cluster.indexers[index].log_tail(30)
        );
    }
    fates[index] = fate;
    Ok(())
}

/// Waits until `holder` aborts by itself; drives merges for merge points.
async fn wait_for_crash(run: &mut Run, holder: usize, point: &str) -> anyhow::Result<()> {
    let api = run.cluster.api();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next_compact = Instant::now();
    loop {
        if let Some(status) = run.cluster.indexers[holder].exited() {
            let log = run.cluster.indexers[holder].log_text();
            let marker = format!("aborting at crash point {point}");
            anyhow::ensure!(
                log.contains(&marker),
                "indexer exited ({status}) without reaching {point}; log:\n{}",
                run.cluster.indexers[holder].log_tail(30)
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "crash point {point} not reached within 120 s; log:\n{}",
            run.cluster.indexers[holder].log_tail(30)
        );
        if point.starts_with("merge") && Instant::now() >= next_compact {
            // Merges come from the policy too; compaction makes them come sooner.
            let api = api.clone();
            tokio::spawn(async move {
                let _ = api.compact(COLLECTION).await;
            });
            next_compact = Instant::now() + Duration::from_secs(2);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every shard of the collection is leased by an indexer other
/// than `dead` under a newer epoch than in `previous`, and returns the leases.
/// The standby may reach its own crash point while it takes the shards over
/// (its fate can be the 5th WAL commit): once its leases expire nobody would
/// hold them, so it is restarted with its next fate; the second value says so.
async fn wait_for_takeover(
    run: &mut Run,
    dead: usize,
    previous: &BTreeMap<u64, (String, u64)>,
    plan: &mut Vec<Kill>,
    fates: &mut [Option<Kill>],
) -> anyhow::Result<(BTreeMap<u64, (String, u64)>, bool)> {
    let standby = 1 - dead;
    let dead_name = run.cluster.indexers[dead].name.clone();
    let timeout = Duration::from_secs(60);
    let mut deadline = Instant::now() + timeout;
    let mut restarted = false;
    loop {
        if let Ok(leases) = run.cluster.leases(COLLECTION).await
            && leases.iter().all(|(shard, (owner, epoch))| {
                *owner != dead_name
                    && !owner.is_empty()
                    && previous.get(shard).is_none_or(|(_, before)| epoch > before)
            })
        {
            return Ok((leases, restarted));
        }
        if !run.cluster.indexers[standby].is_running() {
            eprintln!(
                "indexer_kills: the standby {} died while taking over; restarting it",
                run.cluster.indexers[standby].name
            );
            start_with_fate(&mut run.cluster, standby, plan, fates).await?;
            restarted = true;
            deadline = Instant::now() + timeout;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the shards of {dead_name} not taken over within {timeout:?}; leases: {:?}; processes:\n{}",
            run.cluster.leases(COLLECTION).await.ok(),
            run.cluster.describe_processes()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn indexer_kill_points_with_takeover_lose_nothing() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let seed = seed("indexer_kills");
    let mut rng = StdRng::seed_from_u64(seed);
    // Fates are taken from the end; the first indexer (holding everything while
    // the first data arrives) is killed at a random moment.
    let mut plan = plan(&mut rng);
    plan.push(Kill::Random {
        after: Duration::from_millis(rng.random_range(200..2_500)),
    });
    let kills = plan.len();

    // indexer-1 alone first, so it holds every shard; indexer-2 is the standby.
    let mut cluster = Cluster::prepare(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 0,
            searchers: 1,
            gateways: 1,
        },
    )
    .await?;
    cluster.define_indexer()?;
    cluster.define_indexer()?;
    let mut fates: Vec<Option<Kill>> = vec![None, None];
    for meta in &mut cluster.metas {
        meta.start()?;
    }
    start_with_fate(&mut cluster, 0, &mut plan, &mut fates).await?;
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
    start_with_fate(&mut cluster, 1, &mut plan, &mut fates).await?;

    let ids = if long_profile() { 4_000 } else { 2_000 };
    let config = WorkloadConfig::new(COLLECTION, DIMENSION, ids, seed);
    let mut run = Run::start(cluster, config, "indexer_kills");
    // Some data first, so takeovers have segments to load.
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.checkpoint(true, "before the first kill").await?;

    let mut epochs = run.cluster.leases(COLLECTION).await?;
    for iteration in 0..kills {
        let holder = sole_holder(&run.cluster, &epochs)?;
        let standby = 1 - holder;
        if !run.cluster.indexers[standby].is_running() {
            // It took the shards over and died at its own crash point already.
            start_with_fate(&mut run.cluster, standby, &mut plan, &mut fates).await?;
        }
        // (A process restarted after the plan ran out is killed at a random moment.)
        let kill = fates[holder].take().unwrap_or(Kill::Random {
            after: Duration::from_secs(1),
        });
        let when = format!("after kill {} ({})", iteration + 1, kill.kind());
        eprintln!("indexer_kills: {when}");
        let fault_at = match &kill {
            Kill::CrashPoint { point, .. } => {
                wait_for_crash(&mut run, holder, point).await?;
                run.fault(&kill.kind())
            }
            Kill::Random { after } => {
                tokio::time::sleep(*after).await;
                run.cluster.indexers[holder].kill9();
                run.fault(&kill.kind())
            }
            Kill::Freeze => {
                run.cluster.indexers[holder].pause();
                run.fault(&kill.kind())
            }
        };
        // Another indexer takes every shard over under a newer epoch.
        let (taken, standby_restarted) =
            wait_for_takeover(&mut run, holder, &epochs, &mut plan, &mut fates).await?;
        let standby_name = run.cluster.indexers[standby].name.clone();
        for (shard, (owner, epoch)) in &taken {
            let (_, before) = &epochs[shard];
            // One takeover is one epoch; a standby that died at its own crash
            // point mid-takeover and came back took the shard twice.
            anyhow::ensure!(
                *owner != standby_name || *epoch == before + 1 || standby_restarted,
                "shard {shard}: epoch {before} became {epoch} on takeover by {owner}, expected {}",
                before + 1
            );
        }
        if matches!(kill, Kill::Freeze) {
            // The zombie wakes up with writes in hand: meta must refuse them.
            run.cluster.indexers[holder].resume();
            let zombie = &run.cluster.indexers[holder];
            eventually(
                "the zombie noticing it lost its lease",
                Duration::from_secs(60),
                || async {
                    let log = zombie.log_text();
                    (log.contains("writer fenced")
                        || log.contains("lease moved")
                        || log.contains("lease lost"))
                    .then_some(())
                },
            )
            .await?;
            // It goes on as the standby, with its next fate (armed by a restart).
            if plan.last().and_then(Kill::arming).is_some() {
                run.cluster.indexers[holder].kill9();
            } else {
                fates[holder] = plan.pop();
            }
        }
        if !run.cluster.indexers[holder].is_running() {
            start_with_fate(&mut run.cluster, holder, &mut plan, &mut fates).await?;
        }
        run.wait_recovered(fault_at, &when).await?;
        let checkpoint = run.checkpoint(true, &when).await?;
        if let Some(scan) = checkpoint.scan {
            // Leases read after the scan: a takeover after the one awaited above
            // (the new holder dying at its own crash point, the other taking the
            // shards back) may have written its epoch into the tail by then, and
            // epochs only grow, so what the tail holds must be at most these.
            // Right after such a death no indexer may hold the shards (the dead
            // holder's lease expired, the other has not taken them yet): no
            // lease is no epoch, so wait for one that covers the tail.
            let cluster = &run.cluster;
            let newest = std::cell::Cell::new(0);
            let covered = eventually(
                "a lease epoch at least the WAL tail's",
                Duration::from_secs(60),
                || async {
                    let leases = cluster.leases(COLLECTION).await.ok()?;
                    newest.set(leases.values().map(|(_, epoch)| *epoch).max().unwrap_or(0));
                    (newest.get() >= scan.max_tail_epoch).then_some(())
                },
            )
            .await;
            anyhow::ensure!(
                covered.is_ok(),
                "the WAL tail holds epoch {} beyond the newest lease epoch {} (60 s of leases)",
                scan.max_tail_epoch,
                newest.get()
            );
        }
        run.summary.iterations += 1;
        epochs = run.cluster.leases(COLLECTION).await?;
    }
    let summary = run.finish().await?;
    anyhow::ensure!(summary.violations == 0);
    anyhow::ensure!(
        summary.iterations >= 20,
        "only {} kill points",
        summary.iterations
    );
    Ok(())
}
