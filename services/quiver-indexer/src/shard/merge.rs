//! Merges: the background loop merges what the tiered policy picks, beside the
//! flushes; the admin compaction flushes and then merges everything it can.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_index::PointId;
use quiver_storage::keys;
use roaring::RoaringBitmap;

use super::Shared;
use super::flush::{RepeatedFailures, flush_once, new_segment_id};
use super::recovery::reconcile;
use crate::catalog::{
    CatalogError, DeletesEntry, Manifest, ManifestChange, SegmentEntry, WalPosition,
};
use crate::error::{IndexerError, IndexerResult};
use crate::failpoints;
use crate::merge::{MergePlan, plan_consolidation, plan_merges};
use crate::metrics::METRICS;
use crate::segments::{
    LiveSegment, RowRef, SegmentBuild, ShardCodebook, download_segment, encode_deletes,
};

/// Merges in the background, beside the flushes: a merge of large segments
/// takes minutes, and flushes waiting behind it would let unflushed rows pile
/// up to the backpressure bound and refuse writes.
pub(super) async fn merge_loop(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.flush_interval_ms);
    let quiet_after = Duration::from_millis(shared.config.consolidate_quiet_ms);
    // The shard is quiet once nothing waits to be flushed and its manifest has
    // not changed for `quiet_after` (every flush, merge and delete changes it).
    let mut last_change = (u64::MAX, Instant::now());
    let mut merge_failures = RepeatedFailures::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.merge_wanted.notified() => {}
        }
        loop {
            if shared.stopping() || shared.lock_state().fenced {
                return;
            }
            if shared.lock_state().poisoned.is_some() {
                break;
            }
            let _merging = shared.merge_lock.lock().await;
            let plan = {
                let state = shared.lock_state();
                if state.manifest_version != last_change.0 {
                    last_change = (state.manifest_version, Instant::now());
                }
                let quiet = !quiet_after.is_zero()
                    && state.active.len() == 0
                    && state.flushing_rows == 0
                    && last_change.1.elapsed() >= quiet_after;
                plan_merges(&state.index, &shared.config, false).or_else(|| {
                    quiet
                        .then(|| plan_consolidation(&state.index, &shared.config))
                        .flatten()
                })
            };
            let Some(plan) = plan else { break };
            let merged = merge_once(&shared, plan).await;
            shared.update_gauges();
            match merged {
                Ok(true) => merge_failures.succeeded(&shared.shard.to_string(), "merge"),
                Ok(false) => break,
                Err(error) => {
                    merge_failures.failed(&shared.shard.to_string(), "merge", &error.to_string());
                    break;
                }
            }
        }
        // No merge due: the codebook's group holds still, and may have grown
        // past its calibration (after a load, no flush comes to notice).
        super::recalibrate::maybe_recalibrate(&shared);
    }
}

/// Flushes, then merges every segment it can, one merge after the other.
pub(super) async fn compact_all(shared: &Shared) -> IndexerResult<usize> {
    flush_once(shared).await?;
    // Waits for a background merge in flight, and holds the others off.
    let _merging = shared.merge_lock.lock().await;
    let mut merges = 0;
    loop {
        let plan = {
            let state = shared.lock_state();
            plan_merges(&state.index, &shared.config, true)
        };
        let Some(plan) = plan else { break };
        if !merge_once(shared, plan).await? {
            break;
        }
        merges += 1;
    }
    tracing::info!(shard = %shared.shard, merges, "compaction done");
    Ok(merges)
}

/// Counts a merge in `quiver_indexer_merges_running` while it lives.
struct MergeRunning;

impl MergeRunning {
    fn start() -> Self {
        METRICS.merges_running.inc();
        MergeRunning
    }
}

impl Drop for MergeRunning {
    fn drop(&mut self) {
        METRICS.merges_running.dec();
    }
}

/// A source segment of a merge as the merge read it: its id, its manifest
/// entry, and its deletions when the merge started.
type MergeSource = (Arc<str>, SegmentEntry, RoaringBitmap);

/// The merged segment before it is uploaded: its bytes and ids (both empty
/// when every source row was deleted), and where each id came from.
struct MergedRows {
    bytes: bytes::Bytes,
    /// The scratch file `bytes` maps (none exactly when it is empty).
    file: Option<std::fs::File>,
    ids: Vec<PointId>,
    /// The codebook it was built with, whose probes it records (none when it
    /// is empty).
    codebook: Option<ShardCodebook>,
    /// For every id: (index of its source, row in that source).
    origins: HashMap<PointId, (usize, u32)>,
}

/// Merges the segments of `plan` into one (live rows only, index retrained).
/// Returns Ok(false) when the plan no longer applies.
async fn merge_once(shared: &Shared, plan: MergePlan) -> IndexerResult<bool> {
    let started = Instant::now();
    let _running = MergeRunning::start();
    let Some((sources, rewrites_shard)) = snapshot_sources(shared, &plan) else {
        return Ok(false);
    };
    let merged = build_merged(shared, &sources, rewrites_shard).await?;
    let _manifest_guard = shared.manifest_lock.lock().await;
    let Some((late_deleted, through)) = late_deletions(shared, &sources, &merged)? else {
        return Ok(false);
    };
    let segment_id = new_segment_id(through, &format!("m{}", plan.level));
    let key = keys::segment_key(&shared.shard.collection_id, shared.shard.shard, &segment_id);
    let mut entry = SegmentEntry::new(
        segment_id.clone(),
        key.clone(),
        merged.ids.len() as u32,
        merged.bytes.len() as u64,
        &merged
            .codebook
            .as_ref()
            .map(ShardCodebook::segment_probes)
            .unwrap_or_default(),
    );
    let empty_result = merged.ids.is_empty();
    if let Some(file) = &merged.file {
        failpoints::during(
            "merge-upload",
            shared.storage.put_file(&key, file, merged.bytes),
        )
        .await?;
    }
    if !late_deleted.is_empty() {
        let deletes_key = keys::deletes_key(
            &shared.shard.collection_id,
            shared.shard.shard,
            &segment_id,
            1,
        );
        shared
            .storage
            .put(&deletes_key, encode_deletes(entry.rows, &late_deleted))
            .await?;
        entry.deletes = Some(DeletesEntry {
            key: deletes_key,
            version: 1,
            deleted_rows: late_deleted.len() as u32,
        });
    }
    let mut retire_keys = Vec::new();
    for (_, source, _) in &sources {
        retire_keys.push(source.key.clone());
        if let Some(deletes) = &source.deletes {
            retire_keys.push(deletes.key.clone());
        }
    }
    let change = ManifestChange {
        add_segments: if empty_result {
            Vec::new()
        } else {
            vec![entry.clone()]
        },
        remove_segments: sources.iter().map(|(id, _, _)| id.to_string()).collect(),
        retire_keys,
        ..Default::default()
    };
    failpoints::reached("merge-commit");
    let Some(manifest_version) = commit_merge(shared, &sources, change).await? else {
        return Ok(false);
    };
    let rows = merged.ids.len();
    apply_merge(
        shared,
        &sources,
        &merged.ids,
        (entry, late_deleted),
        merged
            .codebook
            .as_ref()
            .map(|codebook| codebook.codebook.id()),
        manifest_version,
    );
    if let Some(codebook) = merged.codebook {
        shared.lock_state().index.offer_codebook(codebook);
    }
    METRICS.merges.inc();
    METRICS
        .merge_seconds
        .observe(started.elapsed().as_secs_f64());
    tracing::info!(
        shard = %shared.shard,
        sources = plan.segment_ids.len(),
        rows,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "segments merged"
    );
    Ok(true)
}

/// Snapshots what the merge reads: the sources and their deletions now; None
/// when a source is gone already.
/// Also tells whether they are every segment of the shard.
fn snapshot_sources(shared: &Shared, plan: &MergePlan) -> Option<(Vec<MergeSource>, bool)> {
    let state = shared.lock_state();
    let mut sources = Vec::new();
    for segment_id in &plan.segment_ids {
        let live = state.index.segments.get(segment_id.as_str())?;
        sources.push((
            Arc::from(segment_id.as_str()),
            live.entry.clone(),
            live.deleted.clone(),
        ));
    }
    let rewrites_shard = sources.len() == state.index.segments.len();
    Some((sources, rewrites_shard))
}

/// Downloads the sources and builds one segment of their live rows (on the
/// blocking pool, with the merge's thread count).
async fn build_merged(
    shared: &Shared,
    sources: &[MergeSource],
    rewrites_shard: bool,
) -> IndexerResult<MergedRows> {
    let mut downloaded = Vec::new();
    for (_, entry, _) in sources {
        downloaded.push(download_segment(&shared.storage, &entry.key, &shared.scratch_dir).await?);
    }
    let mut spec = shared.spec.clone();
    spec.build.threads = shared.config.merge_threads;
    let snapshot: Vec<RoaringBitmap> = sources
        .iter()
        .map(|(_, _, deleted)| deleted.clone())
        .collect();
    let current_codebook = shared.lock_state().index.codebook.clone();
    let scratch_dir = shared.scratch_dir.clone();
    let (built, origins) = tokio::task::spawn_blocking(move || -> IndexerResult<_> {
        // First the live rows' ids (where each comes from), then the rows
        // themselves, streamed from the mapped sources into the build.
        let mut live: Vec<Vec<(u32, PointId)>> = Vec::with_capacity(downloaded.len());
        let mut origins: HashMap<PointId, (usize, u32)> = HashMap::new();
        for (source_index, (source, deleted)) in downloaded.iter().zip(&snapshot).enumerate() {
            let rows: Vec<(u32, PointId)> = source
                .segment
                .ids()?
                .into_iter()
                .enumerate()
                .map(|(row, id)| (row as u32, id))
                .filter(|(row, _)| !deleted.contains(*row))
                .collect();
            for (row, id) in &rows {
                origins.insert(id.clone(), (source_index, *row));
            }
            live.push(rows);
        }
        let rows: usize = live.iter().map(Vec::len).sum();
        if rows == 0 {
            // Every row was deleted: the merge only removes the sources.
            return Ok((None, origins));
        }
        // Rows that fit the shard's codebook join its lists without k-means;
        // a merge that outgrew it trains the next one (sooner when it
        // rewrites the whole shard).
        let codebook = ShardCodebook::for_build(current_codebook.as_ref(), rows, rewrites_shard);
        let mut build = SegmentBuild::new(&spec, codebook, &scratch_dir)?;
        for (source, rows) in downloaded.iter().zip(&live) {
            for (row, id) in rows {
                let vector = source.segment.vector(*row)?;
                let payload = source.segment.payload_bytes(*row)?.unwrap_or_default();
                build.add(id, &vector, &payload)?;
            }
        }
        drop(live);
        Ok((Some(build.finish(&|_, _, _| {})?), origins))
    })
    .await
    .map_err(|error| IndexerError::Internal(format!("merge task: {error}")))??;
    Ok(match built {
        Some(built) => MergedRows {
            bytes: built.bytes,
            file: Some(built.file),
            ids: built.ids,
            codebook: Some(built.codebook),
            origins,
        },
        None => MergedRows {
            bytes: bytes::Bytes::new(),
            file: None,
            ids: Vec::new(),
            codebook: None,
            origins,
        },
    })
}

/// Returns the rows of the result deleted from the sources while the merge
/// ran (they are deleted in the result too) and the newest committed position;
/// None when a source is gone. Called under the manifest lock.
fn late_deletions(
    shared: &Shared,
    sources: &[MergeSource],
    merged: &MergedRows,
) -> IndexerResult<Option<(RoaringBitmap, WalPosition)>> {
    let state = shared.lock_state();
    shared.check_writable(&state)?;
    let mut late = RoaringBitmap::new();
    let new_rows: HashMap<&PointId, u32> = merged
        .ids
        .iter()
        .enumerate()
        .map(|(row, id)| (id, row as u32))
        .collect();
    for (source_index, (segment_id, _, deleted_then)) in sources.iter().enumerate() {
        let Some(live) = state.index.segments.get(segment_id) else {
            return Ok(None);
        };
        let deleted_since = &live.deleted - deleted_then;
        if deleted_since.is_empty() {
            continue;
        }
        for (id, (origin_source, origin_row)) in &merged.origins {
            if *origin_source == source_index
                && deleted_since.contains(*origin_row)
                && let Some(row) = new_rows.get(id)
            {
                late.insert(*row);
            }
        }
    }
    Ok(Some((late, state.last_committed.unwrap_or_default())))
}

/// Commits the merge's manifest change; returns the new manifest version, or
/// None when an ambiguous commit turned out not to have landed.
async fn commit_merge(
    shared: &Shared,
    sources: &[MergeSource],
    change: ManifestChange,
) -> IndexerResult<Option<u64>> {
    let committed = shared
        .catalog
        .commit_manifest_change(&shared.shard, shared.epoch, change)
        .await;
    let manifest = match committed {
        Ok(manifest) => manifest,
        Err(CatalogError::Unavailable(reason)) => {
            let first_source = sources[0].0.clone();
            let landed = |manifest: &Manifest| {
                !manifest
                    .segments
                    .iter()
                    .any(|segment| *segment.segment_id == *first_source)
            };
            if !reconcile(shared, landed, &reason).await? {
                return Ok(None);
            }
            shared.catalog.manifest(&shared.shard).await?
        }
        Err(error) => {
            shared.note_catalog_error(&error);
            return Err(error.into());
        }
    };
    Ok(Some(manifest.version))
}

/// Applies a committed merge to the in-memory index: primary keys that pointed
/// into a source now point into the result, which replaces the sources.
fn apply_merge(
    shared: &Shared,
    sources: &[MergeSource],
    ids: &[PointId],
    (entry, late_deleted): (SegmentEntry, RoaringBitmap),
    codebook_id: Option<u64>,
    manifest_version: u64,
) {
    let mut state = shared.lock_state();
    let source_ids: Vec<Arc<str>> = sources.iter().map(|(id, _, _)| id.clone()).collect();
    let new_id: Arc<str> = Arc::from(entry.segment_id.as_str());
    for (row, id) in ids.iter().enumerate() {
        if late_deleted.contains(row as u32) {
            continue;
        }
        if let Some(row_ref) = state.index.primary_keys.get_mut(id)
            && source_ids.contains(&row_ref.segment_id)
        {
            *row_ref = RowRef {
                segment_id: new_id.clone(),
                row: row as u32,
            };
        }
    }
    for source in &source_ids {
        state.index.segments.remove(source);
    }
    if !ids.is_empty() {
        state.index.segments.insert(
            new_id,
            LiveSegment {
                entry,
                deleted: late_deleted,
                codebook_id,
            },
        );
    }
    state.manifest_version = manifest_version;
}
