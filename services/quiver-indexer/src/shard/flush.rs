//! Flushes: every committed write moves into a new L0 segment, older copies of
//! the same ids get deletion bitmaps, and the WAL tail is trimmed — one
//! manifest change. The maintenance loop runs them on a timer or when asked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_storage::keys;
use roaring::RoaringBitmap;

use super::Shared;
use super::recovery::{read_wal, reconcile, resync};
use crate::catalog::{
    CatalogError, DeletesEntry, Manifest, ManifestChange, SegmentEntry, WalPosition,
};
use crate::error::{IndexerError, IndexerResult};
use crate::failpoints;
use crate::memtable::{Memtable, PendingOp};
use crate::metrics::METRICS;
use crate::segments::{BuiltSegment, SegmentBuild, ShardCodebook, encode_deletes};

/// Flushes on a timer or when asked; merges when the policy finds work.
pub(super) async fn maintenance_loop(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.flush_interval_ms);
    let mut flush_failures = RepeatedFailures::default();
    loop {
        // A writer that lost track of a commit's outcome rebuilds itself first,
        // retrying every second until the catalog answers.
        if shared.lock_state().poisoned.is_some() {
            if shared.stopping() {
                return;
            }
            if let Err(error) = resync(&shared).await {
                tracing::warn!(shard = %shared.shard, %error, "resync failed; retrying");
                tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.flush_wanted.notified() => {}
        }
        if shared.stopping() || shared.lock_state().fenced {
            return;
        }
        if shared.lock_state().poisoned.is_some() {
            continue;
        }
        let flushed = flush_once(&shared).await;
        shared.update_gauges();
        match flushed {
            Ok(flushed) => {
                flush_failures.succeeded(&shared.shard.to_string(), "flush");
                if flushed {
                    shared.merge_wanted.notify_one();
                    super::recalibrate::maybe_recalibrate(&shared);
                }
            }
            Err(error) => {
                METRICS.flush_failures.inc();
                flush_failures.failed(&shared.shard.to_string(), "flush", &error.to_string());
            }
        }
    }
}

/// The failures of a retried step in a row: an error is logged once per
/// distinct cause (at error level: the shard's WAL tail is not becoming
/// segments meanwhile), a repeat of it only at debug level, and the recovery
/// once — so a step that fails forever says so, without one line a second.
#[derive(Debug, Default)]
pub(super) struct RepeatedFailures {
    last_cause: Option<String>,
    count: u64,
}

impl RepeatedFailures {
    /// Notes a failure of `step` on `shard`; returns whether it was logged
    /// at error level (a cause not seen just before).
    pub(super) fn failed(&mut self, shard: &str, step: &str, cause: &str) -> bool {
        self.count += 1;
        if self.last_cause.as_deref() == Some(cause) {
            tracing::debug!(
                shard,
                step,
                error = cause,
                failures = self.count,
                "{step} failed again; will retry"
            );
            return false;
        }
        tracing::error!(
            shard,
            step,
            error = cause,
            failures = self.count,
            "{step} failed; retrying until it succeeds (this cause is logged once)"
        );
        self.last_cause = Some(cause.to_string());
        true
    }

    /// Notes a success of `step` on `shard`, logging it when failures came before.
    pub(super) fn succeeded(&mut self, shard: &str, step: &str) {
        if self.count > 0 {
            tracing::info!(
                shard,
                step,
                failures = self.count,
                "{step} succeeded after failures"
            );
        }
        self.last_cause = None;
        self.count = 0;
    }
}

/// Moves every committed write into a new L0 segment (and deletion bitmaps for
/// the older copies it replaces), then trims the WAL tail — one manifest change.
pub(super) async fn flush_once(shared: &Shared) -> IndexerResult<bool> {
    let _manifest_guard = shared.manifest_lock.lock().await;
    let (mut frozen, through) = {
        let mut state = shared.lock_state();
        shared.check_writable(&state)?;
        let Some(through) = state.active.last_position() else {
            return Ok(false);
        };
        let frozen = std::mem::take(&mut state.active);
        state.flushing_rows = frozen.len();
        state.flushing_bytes = frozen.bytes();
        (frozen, through)
    };
    let started = Instant::now();
    let result = flush_frozen(shared, &mut frozen, through).await;
    let mut state = shared.lock_state();
    state.flushing_rows = 0;
    state.flushing_bytes = 0;
    match result {
        Ok(true) => {
            METRICS.flushes.inc();
            METRICS
                .flush_seconds
                .observe(started.elapsed().as_secs_f64());
            Ok(true)
        }
        Ok(false) | Err(_) => {
            // Not flushed: the writes go back, under anything newer.
            let newer = std::mem::take(&mut state.active);
            frozen.absorb(newer);
            state.active = frozen;
            result
        }
    }
}

/// The body of a flush; returns Ok(true) once the manifest change committed.
async fn flush_frozen(
    shared: &Shared,
    frozen: &mut Memtable,
    through: WalPosition,
) -> IndexerResult<bool> {
    // Batches committed with an outcome this writer never learned are in the
    // tail but not in memory: fold them in so trimming the tail loses nothing.
    let manifest = shared.catalog.manifest(&shared.shard).await?;
    for entry in &manifest.wal_tail {
        if entry.position <= through && !frozen.contains_position(&entry.position) {
            let batch = read_wal(&shared.storage, entry).await?;
            frozen.apply_batch(entry.position, batch);
        }
    }
    let upserts = frozen
        .iter()
        .filter(|(_, _, op)| matches!(op, PendingOp::Upsert { .. }))
        .count();
    let mut change = ManifestChange {
        trim_wal_through: Some(through),
        retire_keys: manifest
            .wal_tail
            .iter()
            .filter(|entry| entry.position <= through)
            .map(|entry| entry.key.clone())
            .collect(),
        ..Default::default()
    };
    let mut new_segment = None;
    if upserts > 0 {
        let built = build_l0(shared, frozen, upserts).await?;
        let segment_id = new_segment_id(through, "l0");
        let key = keys::segment_key(&shared.shard.collection_id, shared.shard.shard, &segment_id);
        let entry = SegmentEntry::new(
            segment_id,
            key.clone(),
            built.ids.len() as u32,
            built.bytes.len() as u64,
            &built.codebook.segment_probes(),
        );
        failpoints::during(
            "flush-upload",
            shared.storage.put_file(&key, &built.file, built.bytes),
        )
        .await?;
        change.add_segments.push(entry.clone());
        new_segment = Some((entry, built.ids, built.codebook));
    }
    // Older persisted copies of every id written here are deleted.
    let new_deletes = {
        let state = shared.lock_state();
        let mut per_segment: HashMap<Arc<str>, RoaringBitmap> = HashMap::new();
        for (id, _, _) in frozen.iter() {
            if let Some(row_ref) = state.index.primary_keys.get(id) {
                per_segment
                    .entry(row_ref.segment_id.clone())
                    .or_default()
                    .insert(row_ref.row);
            }
        }
        per_segment
            .into_iter()
            .filter_map(|(segment_id, rows)| {
                let live = state.index.segments.get(&segment_id)?;
                let mut deleted = live.deleted.clone();
                deleted |= rows;
                Some((segment_id, live.entry.clone(), deleted))
            })
            .collect::<Vec<_>>()
    };
    let mut staged_deletes = Vec::new();
    for (segment_id, entry, deleted) in new_deletes {
        let version = entry
            .deletes
            .as_ref()
            .map_or(1, |deletes| deletes.version + 1);
        let key = keys::deletes_key(
            &shared.shard.collection_id,
            shared.shard.shard,
            &segment_id,
            version,
        );
        shared
            .storage
            .put(&key, encode_deletes(entry.rows, &deleted))
            .await?;
        if let Some(old) = &entry.deletes {
            change.retire_keys.push(old.key.clone());
        }
        let deletes = DeletesEntry {
            key,
            version,
            deleted_rows: deleted.len() as u32,
        };
        change
            .set_deletes
            .push((segment_id.to_string(), deletes.clone()));
        staged_deletes.push((segment_id, deletes, deleted));
    }
    failpoints::reached("flush-commit");
    let committed = shared
        .catalog
        .commit_manifest_change(&shared.shard, shared.epoch, change)
        .await;
    let manifest = match committed {
        Ok(manifest) => manifest,
        Err(CatalogError::Unavailable(reason)) => {
            let landed = |manifest: &Manifest| {
                manifest
                    .wal_tail
                    .iter()
                    .all(|entry| entry.position > through)
            };
            if !reconcile(shared, landed, &reason).await? {
                return Ok(false);
            }
            shared.catalog.manifest(&shared.shard).await?
        }
        Err(error) => {
            shared.note_catalog_error(&error);
            return Err(error.into());
        }
    };
    // Committed: the persisted side now holds these writes.
    let mut state = shared.lock_state();
    for (segment_id, deletes, deleted) in staged_deletes {
        if let Some(live) = state.index.segments.get_mut(&segment_id) {
            live.entry.deletes = Some(deletes);
            live.deleted = deleted;
        }
    }
    for (id, _, op) in frozen.iter() {
        if matches!(op, PendingOp::Delete) {
            state.index.primary_keys.remove(id);
        }
    }
    if let Some((entry, ids, codebook)) = new_segment {
        let codebook_id = Some(codebook.codebook.id());
        state
            .index
            .add_segment(entry, RoaringBitmap::new(), ids, codebook_id);
        state.index.offer_codebook(codebook);
    }
    state.manifest_version = manifest.version;
    Ok(true)
}

/// Builds the L0 segment of `frozen`'s `upserts` upserts on the blocking
/// pool. The rows are read where they are: the memtable moves into the build
/// and comes back after it (also when the build fails or panics).
async fn build_l0(
    shared: &Shared,
    frozen: &mut Memtable,
    upserts: usize,
) -> IndexerResult<BuiltSegment> {
    let codebook =
        ShardCodebook::for_build(shared.lock_state().index.codebook.as_ref(), upserts, false);
    let spec = shared.spec.clone();
    let scratch_dir = shared.scratch_dir.clone();
    let table = Arc::new(std::mem::take(frozen));
    let rows = table.clone();
    let built = tokio::task::spawn_blocking(move || {
        let mut build = SegmentBuild::new(&spec, codebook, &scratch_dir)?;
        for (id, _, op) in rows.iter() {
            if let PendingOp::Upsert { vector, payload } = op {
                build.add(id, vector, payload)?;
            }
        }
        build.finish(&|_, _, _| {})
    })
    .await;
    // The task is done (or unwound) and dropped its handle: the table is ours.
    *frozen = Arc::try_unwrap(table).unwrap_or_else(|shared_table| (*shared_table).clone());
    built.map_err(|error| IndexerError::Internal(format!("segment build task: {error}")))?
}

pub(super) fn new_segment_id(through: WalPosition, level: &str) -> String {
    format!(
        "{:010}-{:012}-{level}-{:08x}",
        through.epoch,
        through.sequence,
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::RepeatedFailures;

    #[test]
    fn a_repeated_failure_is_logged_once_per_distinct_cause() {
        let mut failures = RepeatedFailures::default();
        assert!(failures.failed("c/0", "flush", "segment build task: panicked"));
        assert!(!failures.failed("c/0", "flush", "segment build task: panicked"));
        assert!(!failures.failed("c/0", "flush", "segment build task: panicked"));
        assert!(failures.failed("c/0", "flush", "object store: timeout"));
        assert!(failures.failed("c/0", "flush", "segment build task: panicked"));
        failures.succeeded("c/0", "flush");
        assert!(failures.failed("c/0", "flush", "segment build task: panicked"));
    }
}
