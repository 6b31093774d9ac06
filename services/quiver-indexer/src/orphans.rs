//! The orphan sweep: finds objects in the bucket that no manifest and no GC entry
//! names (a crash between a PUT and its commit, a write whose commit failed, a
//! zombie indexer's late upload), reports them to meta — where the admin API
//! lists them — and deletes them only once they have been reported for a grace
//! period. Objects younger than a minimum age are never candidates, so a write
//! between its PUT and its commit is never touched; and meta refuses to commit an
//! object that is on the orphan list, so a reported object can never come back.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quiver_meta_client::MetaClient;
use quiver_proto::meta as pb;
use quiver_storage::{Storage, keys};

use crate::metrics::METRICS;

/// Keys asked about per `FindUnreferenced` call.
const KEYS_PER_QUERY: usize = 1000;

/// What one sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SweepOutcome {
    /// Objects listed under the collections prefix.
    pub listed: usize,
    /// Objects old enough to be judged.
    pub candidates: usize,
    /// Orphans reported now (new and old).
    pub orphans: usize,
    /// Orphans reported for the first time.
    pub new_orphans: u32,
    /// Orphans deleted (their grace was over).
    pub deleted: Vec<String>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Runs one sweep of `storage`.
pub(crate) async fn sweep(
    meta: &MetaClient,
    storage: &Storage,
    min_age: Duration,
    grace: Duration,
) -> Result<SweepOutcome, String> {
    let started_ms = now_ms();
    let objects = storage
        .list(keys::COLLECTIONS_PREFIX)
        .await
        .map_err(|error| format!("listing the bucket: {error}"))?;
    let mut outcome = SweepOutcome {
        listed: objects.len(),
        ..SweepOutcome::default()
    };
    // Only objects of Quiver's own layout, and only those old enough that no
    // write can still be on its way to committing them.
    let candidates: HashMap<String, (u64, u64)> = objects
        .into_iter()
        .filter(|object| keys::parse_key(&object.key).is_some())
        .filter(|object| {
            object
                .last_modified_ms
                .saturating_add(min_age.as_millis() as u64)
                <= started_ms
        })
        .map(|object| (object.key, (object.size, object.last_modified_ms)))
        .collect();
    outcome.candidates = candidates.len();
    let mut sorted: Vec<&String> = candidates.keys().collect();
    sorted.sort();
    let mut orphans = Vec::new();
    for chunk in sorted.chunks(KEYS_PER_QUERY) {
        let unreferenced = meta
            .find_unreferenced(chunk.iter().map(|key| key.to_string()).collect())
            .await
            .map_err(|error| format!("asking meta which objects are unreferenced: {error}"))?;
        for key in unreferenced {
            if let Some((size_bytes, last_modified_ms)) = candidates.get(&key) {
                orphans.push(pb::OrphanObject {
                    object_key: key,
                    size_bytes: *size_bytes,
                    last_modified_ms: *last_modified_ms,
                    first_seen_ms: 0,
                    delete_after_ms: 0,
                });
            }
        }
    }
    outcome.orphans = orphans.len();
    let report = meta
        .report_orphans(orphans.clone(), grace.as_millis() as u64)
        .await
        .map_err(|error| format!("reporting orphans to meta: {error}"))?;
    outcome.new_orphans = report.new_orphans;
    METRICS.orphans_found.inc_by(u64::from(report.new_orphans));
    if report.new_orphans > 0 {
        for orphan in &orphans {
            tracing::warn!(
                key = %orphan.object_key,
                size_bytes = orphan.size_bytes,
                grace_ms = grace.as_millis() as u64,
                "orphaned object in the bucket (no manifest or GC entry names it); listed in /admin/v1/orphans, deleted after its grace period"
            );
        }
    }
    for key in report.due {
        match storage.delete(&key).await {
            Ok(()) => outcome.deleted.push(key),
            Err(error) => {
                tracing::warn!(%key, %error, "deleting an orphan failed; next sweep retries")
            }
        }
    }
    if !outcome.deleted.is_empty() {
        meta.ack_orphans(outcome.deleted.clone())
            .await
            .map_err(|error| format!("telling meta orphans were deleted: {error}"))?;
        METRICS.orphans_deleted.inc_by(outcome.deleted.len() as u64);
        for key in &outcome.deleted {
            tracing::info!(%key, "orphaned object deleted after its grace period");
        }
    }
    METRICS
        .orphans_pending
        .set((outcome.orphans - outcome.deleted.len()) as i64);
    Ok(outcome)
}

/// Tells whether `node_id` is the indexer that sweeps: the live indexer with the
/// smallest id, so one sweep runs at a time in a cluster.
pub(crate) fn is_sweeper(routing: &pb::GetRoutingResponse, node_id: &str) -> bool {
    routing
        .nodes
        .iter()
        .filter(|node| {
            node.role == pb::NodeRole::Indexer as i32 && node.state == pb::NodeState::Alive as i32
        })
        .map(|node| node.node_id.as_str())
        .min()
        == Some(node_id)
}
