//! The checker: strong reads against the history of writes, and quiet-time
//! checks of the whole collection.
//!
//! Rules, per id (its writes are issued one at a time, so they are totally
//! ordered; write `j` has an effect: "holds vector (id, version)" or "absent"):
//! - A strong read that started after write `a` was acknowledged, and after
//!   another strong read that saw write `m` had finished, must see the effect
//!   of some write `j` with `max(a, m) <= j <= u`, where `u` is the last write
//!   issued before the read finished (the initial state "absent" counts as
//!   write -1). So: every acknowledged write is visible, nothing never written
//!   appears, and strong reads never go backwards. Unknown writes (failed
//!   requests) may be seen or not; once seen they count as applied.
//! - A strong exact-vector search for the vector of `(id, version)` whose write
//!   was acknowledged before the search began, with no later write of the id
//!   issued before it ended, must return the id.
//! - At a quiet checkpoint (no write in flight): a strong get of every id ever
//!   written (plus ids never written) is such a read; the collection's point
//!   count equals the live ids it found; an exact-vector search finds every live
//!   point with its current vector and no deleted one; and optionally the flat
//!   scan of the manifests and objects in S3 holds exactly the same points.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::api::Api;
use crate::cluster::{Cluster, eventually};
use crate::history::{
    History, Observation, Outcome, Seen, Snapshot, Write, WriteKind, same_vector, vector,
};
use crate::scan::{ScanStats, stored_points};

/// Counts of what was checked and what was wrong.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub writes: usize,
    pub acknowledged: usize,
    pub unknown: usize,
    pub observations: usize,
    pub searches: usize,
    pub violations: Vec<String>,
}

fn effect_matches(id: u64, write: Option<&Write>, seen: &Seen, dimension: usize) -> bool {
    match (write.map(|write| write.kind), seen) {
        (None | Some(WriteKind::Delete), Seen::Absent) => true,
        (Some(WriteKind::Upsert { version }), Seen::Vector(stored)) => {
            same_vector(stored, &vector(id, version, dimension))
        }
        _ => false,
    }
}

fn describe_seen(id: u64, writes: &[Write], seen: &Seen, dimension: usize) -> String {
    match seen {
        Seen::Absent => "absent".into(),
        Seen::Vector(stored) => {
            let matching = writes.iter().position(|write| match write.kind {
                WriteKind::Upsert { version } => {
                    same_vector(stored, &vector(id, version, dimension))
                }
                WriteKind::Delete => false,
            });
            match matching {
                Some(index) => format!("write #{index} ({:?})", writes[index].kind),
                None => "a vector that was never written for this id".into(),
            }
        }
    }
}

/// Checks every observation and search of `snapshot`; returns the report and,
/// per id, the newest write index any strong read saw (-1: the initial state).
pub fn check_history(snapshot: &Snapshot, dimension: usize) -> (CheckReport, HashMap<u64, i64>) {
    let mut report = CheckReport::default();
    for writes in snapshot.writes.values() {
        for write in writes {
            report.writes += 1;
            match write.outcome {
                Outcome::Acknowledged => report.acknowledged += 1,
                Outcome::Unknown => report.unknown += 1,
                Outcome::InFlight => {}
            }
        }
    }
    let empty = Vec::new();
    let mut by_id: HashMap<u64, Vec<&Observation>> = HashMap::new();
    for observation in &snapshot.observations {
        by_id.entry(observation.id).or_default().push(observation);
    }
    let mut newest_seen: HashMap<u64, i64> = HashMap::new();
    for (id, mut observations) in by_id {
        observations.sort_by_key(|observation| observation.started);
        let writes = snapshot.writes.get(&id).unwrap_or(&empty);
        // (finished, chosen write index) of the reads checked so far.
        let mut chosen: Vec<(Instant, i64)> = Vec::new();
        for observation in observations {
            report.observations += 1;
            let acknowledged_before = writes
                .iter()
                .rposition(|write| {
                    write.outcome == Outcome::Acknowledged
                        && write.completed.is_some_and(|at| at < observation.started)
                })
                .map_or(-1, |index| index as i64);
            let seen_before = chosen
                .iter()
                .filter(|(finished, _)| *finished < observation.started)
                .map(|(_, index)| *index)
                .max()
                .unwrap_or(-1);
            let lower = acknowledged_before.max(seen_before);
            let upper = writes
                .iter()
                .rposition(|write| write.invoked < observation.finished)
                .map_or(-1, |index| index as i64);
            let candidate = (lower..=upper).find(|index| {
                let write = (*index >= 0).then(|| &writes[*index as usize]);
                effect_matches(id, write, &observation.seen, dimension)
            });
            match candidate {
                Some(index) => {
                    chosen.push((observation.finished, index));
                    let newest = newest_seen.entry(id).or_insert(-1);
                    *newest = (*newest).max(index);
                }
                None => report.violations.push(format!(
                    "id {id}: a strong read ({:?} long) saw {}; allowed: the effect of writes #{lower}..=#{upper} \
                     (#{acknowledged_before} was the newest acknowledged before it began, #{seen_before} the newest seen \
                     by an earlier read); writes of the id: {:?}",
                    observation.finished - observation.started,
                    describe_seen(id, writes, &observation.seen, dimension),
                    writes.iter().map(|write| (write.kind, write.outcome)).collect::<Vec<_>>()
                )),
            }
        }
    }
    for search in &snapshot.searches {
        report.searches += 1;
        let writes = snapshot.writes.get(&search.id).unwrap_or(&empty);
        let Some(acknowledged) = writes.iter().rposition(|write| {
            write.outcome == Outcome::Acknowledged
                && write.completed.is_some_and(|at| at < search.started)
        }) else {
            continue;
        };
        let newest_issued = writes
            .iter()
            .rposition(|write| write.invoked < search.finished);
        let settled = newest_issued == Some(acknowledged)
            && writes[acknowledged].kind
                == (WriteKind::Upsert {
                    version: search.version,
                });
        if settled && !search.hit_ids.contains(&search.id) {
            report.violations.push(format!(
                "id {}: a strong exact-vector search for its acknowledged version {} did not return it (hits {:?})",
                search.id, search.version, search.hit_ids
            ));
        }
    }
    (report, newest_seen)
}

/// What a quiet checkpoint found.
#[derive(Debug, Default)]
pub struct Checkpoint {
    pub report: CheckReport,
    pub live_points: usize,
    pub scan: Option<ScanStats>,
}

/// Retries `call` while it fails (a fault may still be healing), up to `timeout`.
async fn with_retries<T, F, Fut>(what: &str, timeout: Duration, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::api::ApiError>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() < deadline => {
                tracing_note(what, &error);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => {
                return Err(anyhow::anyhow!(
                    "{what} still failing after {timeout:?}: {error}"
                ));
            }
        }
    }
}

fn tracing_note(what: &str, error: &crate::api::ApiError) {
    if std::env::var_os("QUIVER_RELIABILITY_VERBOSE").is_some() {
        eprintln!("checker: {what} failed, retrying: {error}");
    }
}

/// Checks the whole collection while no write is in flight (the workload is
/// paused): strong get of every id, the point count, exact-vector searches,
/// and with `scan` the flat scan of what is stored. The reads become part of
/// the history, so later reads may not go back behind them.
pub async fn quiet_check(
    cluster: &Cluster,
    api: &Api,
    history: &Arc<History>,
    collection: &str,
    dimension: usize,
    ids: u64,
    scan: bool,
) -> anyhow::Result<Checkpoint> {
    let timeout = Duration::from_secs(60);
    let before = history.snapshot();
    anyhow::ensure!(
        before
            .writes
            .values()
            .flatten()
            .all(|write| write.outcome != Outcome::InFlight),
        "quiet_check needs a paused workload"
    );
    // 1. Strong get of every id (and some never written).
    let universe: Vec<u64> = (0..ids + 100).collect();
    let mut current: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    for chunk in universe.chunks(500) {
        let started = Instant::now();
        let points = with_retries("strong get", timeout, || {
            api.get(collection, chunk, Duration::from_secs(20))
        })
        .await?;
        let finished = Instant::now();
        let mut found: HashMap<u64, Vec<f32>> = points.into_iter().collect();
        let mut observations = Vec::new();
        for id in chunk {
            let seen = match found.remove(id) {
                Some(vector) => {
                    current.insert(*id, vector.clone());
                    Seen::Vector(vector)
                }
                None => Seen::Absent,
            };
            observations.push(Observation {
                id: *id,
                started,
                finished,
                seen,
            });
        }
        for (id, vector) in found {
            observations.push(Observation {
                id,
                started,
                finished,
                seen: Seen::Vector(vector),
            });
        }
        history.observe(observations);
    }
    let snapshot = history.snapshot();
    let (mut report, _) = check_history(&snapshot, dimension);

    // 2. The live count (deletions applied) equals what the gets found.
    let count = with_retries("describe", timeout, || api.count(collection)).await?;
    if count != current.len() as u64 {
        report.violations.push(format!(
            "describe says {count} live points, strong gets found {}",
            current.len()
        ));
    }

    // 3. Exact-vector searches: every live point is found with its vector; every
    // deleted point's last vector does not find it; no hit differs from the gets.
    let mut queries: Vec<(u64, Vec<f32>, bool)> = current
        .iter()
        .map(|(id, vector)| (*id, vector.clone(), true))
        .collect();
    for (id, writes) in &snapshot.writes {
        if current.contains_key(id) {
            continue;
        }
        let last_upsert = writes.iter().rev().find_map(|write| match write.kind {
            WriteKind::Upsert { version } => Some(version),
            WriteKind::Delete => None,
        });
        if let Some(version) = last_upsert {
            queries.push((*id, vector(*id, version, dimension), false));
        }
    }
    for chunk in queries.chunks(128) {
        let vectors: Vec<Vec<f32>> = chunk.iter().map(|(_, vector, _)| vector.clone()).collect();
        let results = with_retries("exact-vector search", timeout, || {
            api.search_batch(collection, &vectors, 10, Duration::from_secs(30))
        })
        .await?;
        for ((id, _, live), hits) in chunk.iter().zip(results) {
            report.searches += 1;
            let found = hits.iter().any(|(hit, _)| hit == id);
            if *live && !found {
                report.violations.push(format!(
                    "id {id}: live with strong get, but an exact-vector search does not find it (hits {:?})",
                    hits.iter().map(|(hit, _)| *hit).collect::<Vec<_>>()
                ));
            }
            if !*live && found {
                report.violations.push(format!(
                    "id {id}: deleted (strong get finds nothing), but a search for its last vector returns it"
                ));
            }
            for (hit, stored) in &hits {
                match current.get(hit) {
                    Some(expected) if same_vector(expected, stored) => {}
                    Some(_) => report.violations.push(format!(
                        "id {hit}: a search hit has another vector than the strong get (two versions live?)"
                    )),
                    None => report.violations.push(format!(
                        "id {hit}: a search returns it, but a strong get does not"
                    )),
                }
            }
        }
    }

    // 4. The flat scan of the manifests and objects holds exactly these points.
    let mut scan_stats = None;
    if scan {
        let (stored, stats) = eventually("a readable manifest", timeout, || async {
            match stored_points(cluster, collection).await {
                Ok(result) => Some(Ok(result)),
                Err(error) if format!("{error:#}").contains("meta") => None,
                Err(error) => Some(Err(error)),
            }
        })
        .await?
        .context("flat scan of the stored collection")?;
        scan_stats = Some(stats);
        if stored.len() != current.len() {
            report.violations.push(format!(
                "the flat scan holds {} points, strong gets found {}",
                stored.len(),
                current.len()
            ));
        }
        for (id, expected) in &current {
            match stored.get(id) {
                Some(vector) if same_vector(vector, expected) => {}
                Some(_) => report.violations.push(format!(
                    "id {id}: the flat scan has another vector than the strong get"
                )),
                None => report.violations.push(format!(
                    "id {id}: live with strong get, missing from the flat scan"
                )),
            }
        }
        for id in stored.keys() {
            if !current.contains_key(id) {
                report.violations.push(format!(
                    "id {id}: in the flat scan, but strong get finds nothing"
                ));
            }
        }
    }
    Ok(Checkpoint {
        report,
        live_points: current.len(),
        scan: scan_stats,
    })
}

/// The longest time from a fault until a write, and a strong read, started
/// after it succeeded, per fault kind: `kind → (write, read)`.
pub fn unavailability(snapshot: &Snapshot) -> BTreeMap<String, (Duration, Duration)> {
    let mut windows: BTreeMap<String, (Duration, Duration)> = BTreeMap::new();
    for fault in &snapshot.faults {
        let first_ok = |is_write: bool| {
            snapshot
                .attempts
                .iter()
                .filter(|attempt| {
                    attempt.is_write == is_write && attempt.ok && attempt.started >= fault.at
                })
                .map(|attempt| attempt.finished - fault.at)
                .min()
                .unwrap_or_default()
        };
        let entry = windows.entry(fault.kind.clone()).or_default();
        entry.0 = entry.0.max(first_ok(true));
        entry.1 = entry.1.max(first_ok(false));
    }
    windows
}

/// Asserts a report has no violation (printing at most 20 of them).
pub fn assert_clean(report: &CheckReport, cluster: &Cluster, when: &str) {
    if report.violations.is_empty() {
        return;
    }
    for violation in report.violations.iter().take(20) {
        eprintln!("VIOLATION ({when}): {violation}");
    }
    cluster.dump_logs(40);
    panic!(
        "{} consistency violations {when} (first: {})",
        report.violations.len(),
        report.violations[0]
    );
}
