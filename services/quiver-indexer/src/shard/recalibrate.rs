//! Recalibrating the shard's codebook over its group. A codebook's default
//! probes are calibrated on the rows that trained it (a shard's first flush:
//! 17k rows, say); every later flush that fits it joins its lists, and a
//! searcher probes the same lists across all of them against one top-k. With
//! more rows under the same lists a query's nearest rows sit in fewer of them,
//! so the first calibration probes far more than the grown group needs: 171 of
//! 265 lists for 200k synthetic 1,024-d rows under a 17k-row codebook, where 59
//! reach the same recall (experiments item 61). Once the group holds
//! [`RECALIBRATE_GROWTH`] times the rows the probes were last calibrated over,
//! they are calibrated again over the whole group
//! ([`quiver_index::calibrate_group`]), in the background, and recorded in one
//! manifest change on every member (`ManifestChange::set_probes`, with the rows
//! they were calibrated over, `SegmentEntry::calibrated_rows`) and on the
//! codebook, so later flushes record them too. Searchers take a group's probes
//! from the members calibrated over the most rows not above the group's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quiver_index::Calibration;

use super::Shared;
use crate::catalog::{ManifestChange, SegmentEntry, SegmentProbes};
use crate::error::{IndexerError, IndexerResult};
use crate::merge::plan_merges;
use crate::segments::{calibrate_probes, download_segment};

/// The group of the shard's codebook is calibrated again once it holds this
/// many times the rows its probes were last calibrated over: at most a
/// doubling of rows between calibrations, each costing about what the last
/// did twice over (its exact answers are one pass over the group's vectors).
pub(crate) const RECALIBRATE_GROWTH: u64 = 2;

/// How long after a failed recalibration (a segment's download, say) the next
/// may start: the merge loop asks every flush interval.
const RECALIBRATE_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The rows a recalibration reads at most, in `max_segment_rows`, outside a
/// local store: it downloads its members to the scratch disk, as a merge of
/// the largest segments does its sources and writes their result. (A local
/// store's segments are mapped in place: the whole group is read.)
pub(crate) const RECALIBRATE_MAX_ROWS_PER_SEGMENT_ROWS: u64 = 2;

/// The members a recalibration reads: the group's largest segments first, as
/// many as fit in `max_rows` rows. A calibration over part of the group is
/// over fewer rows than it holds, so its probe is, if anything, wider than the
/// whole group needs (and records those fewer rows).
fn calibration_members(group: &mut [&SegmentEntry], max_rows: u64) -> Vec<SegmentEntry> {
    group.sort_by(|a, b| {
        b.rows
            .cmp(&a.rows)
            .then_with(|| a.segment_id.cmp(&b.segment_id))
    });
    let mut rows = 0u64;
    let mut chosen = Vec::new();
    for entry in group.iter() {
        if rows + entry.rows as u64 <= max_rows {
            rows += entry.rows as u64;
            chosen.push((*entry).clone());
        }
    }
    chosen
}

/// A calibration of a codebook's group: its probes for ten hits and for a
/// hundred, and the rows it was made over.
struct GroupProbes {
    narrow: Calibration,
    wide: Calibration,
    rows: u64,
}

/// Starts a recalibration of the shard's codebook over its group when the
/// shard holds more than `max_segment_rows` rows, the group has grown
/// [`RECALIBRATE_GROWTH`] times past its last calibration, and neither a
/// recalibration nor a merge is running or due. Called after a
/// flush, and by the merge loop when it finds no merge to run.
pub(super) fn maybe_recalibrate(shared: &Arc<Shared>) {
    if shared.stopping() || shared.recalibrating.load(Ordering::Acquire) {
        return;
    }
    let not_before = *shared
        .recalibrate_not_before
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if not_before.is_some_and(|not_before| Instant::now() < not_before) {
        return;
    }
    // Not while a merge runs or is due: a merge of the group's flushes, or the
    // refresh that retrains an outgrown codebook, reshapes the group it would
    // calibrate (a 200k × 1,024 load's recalibration of 115k rows took 33 s of
    // a core beside the merge of the same rows, and landed 3 s before it;
    // experiments item 62). Below `max_segment_rows` the refresh retrains once
    // the shard doubles, so a group outlives that only in larger shards, where
    // no refresh comes: every flush and merge joins the lists of the last
    // codebook trained on `max_segment_rows` rows.
    if shared.merge_lock.try_lock().is_err() {
        return;
    }
    let (codebook_id, members) = {
        let state = shared.lock_state();
        let Some(current) = state.index.codebook.as_ref() else {
            return;
        };
        // Only past `max_segment_rows`: below, the refresh retrains instead.
        let shard_rows: u64 = state
            .index
            .entries()
            .map(|live| live.entry.rows as u64)
            .sum();
        if shard_rows <= shared.config.max_segment_rows as u64
            || plan_merges(&state.index, &shared.config, false).is_some()
        {
            return;
        }
        let id = current.codebook.id();
        let mut group: Vec<&SegmentEntry> = state
            .index
            .entries()
            .filter(|live| live.codebook_id == Some(id))
            .map(|live| &live.entry)
            .collect();
        // A local store's segments are mapped where they are: nothing to
        // download, so the whole group is read.
        let local = group
            .first()
            .is_some_and(|entry| shared.storage.local_path(&entry.key).is_some());
        let max_rows = if local {
            u64::MAX
        } else {
            RECALIBRATE_MAX_ROWS_PER_SEGMENT_ROWS * shared.config.max_segment_rows as u64
        };
        let members = calibration_members(&mut group, max_rows);
        let rows: u64 = members.iter().map(|entry| entry.rows as u64).sum();
        if members.len() < 2 || rows < current.calibrated_rows.saturating_mul(RECALIBRATE_GROWTH) {
            return;
        }
        (id, members)
    };
    if shared.recalibrating.swap(true, Ordering::AcqRel) {
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let outcome = recalibrate(&shared, members).await;
        let published = match outcome {
            Ok(probes) => publish(&shared, codebook_id, probes, started).await,
            Err(error) => Err(error),
        };
        if let Err(error) = published {
            tracing::warn!(
                shard = %shared.shard,
                %error,
                retry_after_s = RECALIBRATE_RETRY_AFTER.as_secs(),
                "recalibrating the codebook's group failed"
            );
            *shared
                .recalibrate_not_before
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                Some(Instant::now() + RECALIBRATE_RETRY_AFTER);
        }
        shared.recalibrating.store(false, Ordering::Release);
    });
}

/// Records `probes` as the shard codebook's (so later builds record them)
/// and, in one manifest change, as every current member's of its group, so
/// searchers use them at once — unless a merge trained the next codebook
/// meanwhile, or a calibration over more rows came first.
async fn publish(
    shared: &Shared,
    codebook_id: u64,
    probes: GroupProbes,
    started: Instant,
) -> IndexerResult<()> {
    let _manifest_guard = shared.manifest_lock.lock().await;
    let (members, segment_probes): (Vec<String>, SegmentProbes) = {
        let mut state = shared.lock_state();
        shared.check_writable(&state)?;
        let Some(current) = state.index.codebook.as_mut() else {
            return Ok(());
        };
        if current.codebook.id() != codebook_id || current.calibrated_rows >= probes.rows {
            return Ok(());
        }
        let (calibrated_rows_before, nprobe_before) = (current.calibrated_rows, current.nprobe);
        current.set_calibrations(&probes.narrow, &probes.wide, probes.rows);
        tracing::info!(
            shard = %shared.shard,
            rows = probes.rows,
            calibrated_rows_before,
            nprobe_before,
            nprobe = current.nprobe,
            probe_ratio_milli = current.probe_ratio_milli,
            wide_nprobe = current.wide_nprobe,
            wide_probe_ratio_milli = current.wide_probe_ratio_milli,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recalibrated the shard's default probes over its codebook's group"
        );
        let segment_probes = current.segment_probes();
        let members = state
            .index
            .entries()
            .filter(|live| live.codebook_id == Some(codebook_id))
            .map(|live| live.entry.segment_id.clone())
            .collect();
        (members, segment_probes)
    };
    let change = ManifestChange {
        set_probes: members
            .iter()
            .map(|segment_id| (segment_id.clone(), segment_probes))
            .collect(),
        ..Default::default()
    };
    let manifest = shared
        .catalog
        .commit_manifest_change(&shared.shard, shared.epoch, change)
        .await
        .inspect_err(|error| shared.note_catalog_error(error))?;
    let mut state = shared.lock_state();
    for segment_id in &members {
        if let Some(live) = state.index.segments.get_mut(segment_id.as_str()) {
            live.entry.set_probes(&segment_probes);
        }
    }
    state.manifest_version = manifest.version;
    Ok(())
}

/// Opens the group's segments (mapped where a local store keeps them,
/// downloaded otherwise) and calibrates both probes over them on the merge's
/// threads.
async fn recalibrate(shared: &Shared, members: Vec<SegmentEntry>) -> IndexerResult<GroupProbes> {
    let mut segments = Vec::with_capacity(members.len());
    for entry in &members {
        segments.push(download_segment(&shared.storage, &entry.key, &shared.scratch_dir).await?);
    }
    let threads = shared.config.merge_threads;
    tokio::task::spawn_blocking(move || -> IndexerResult<GroupProbes> {
        let group: Vec<_> = segments.iter().map(|opened| &opened.segment).collect();
        let (narrow, wide) = calibrate_probes(&group, threads)?;
        Ok(GroupProbes {
            narrow,
            wide,
            rows: group.iter().map(|segment| segment.rows()).sum(),
        })
    })
    .await
    .map_err(|error| IndexerError::Internal(format!("recalibration task: {error}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, rows: u32) -> SegmentEntry {
        SegmentEntry::new(id.into(), format!("k/{id}"), rows, 0, &Default::default())
    }

    #[test]
    fn a_recalibration_reads_the_largest_members_that_fit_its_rows() {
        let (a, b, c, d) = (
            entry("a", 2_000_000),
            entry("b", 1_500_000),
            entry("c", 600_000),
            entry("d", 400_000),
        );
        let mut group = vec![&d, &b, &a, &c];
        let ids = |chosen: Vec<SegmentEntry>| -> Vec<String> {
            chosen.into_iter().map(|entry| entry.segment_id).collect()
        };
        assert_eq!(
            ids(calibration_members(&mut group, 4_000_000)),
            ["a", "b", "d"]
        );
        assert_eq!(
            ids(calibration_members(&mut group, 10_000_000)),
            ["a", "b", "c", "d"]
        );
        assert_eq!(ids(calibration_members(&mut group, 1_000_000)), ["c", "d"]);
    }
}
