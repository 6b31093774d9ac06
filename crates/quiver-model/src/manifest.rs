//! The manifest of a shard — which objects make it up right now (live segments
//! with their deletion bitmaps, and the WAL tail) — and the one set of rules
//! that changes it: committing a WAL object ([`Manifest::commit_wal`]) and
//! applying an atomic [`ManifestChange`] ([`apply_change`]).
//!
//! The metadata service applies these rules in its replicated state machine; the
//! write path's in-memory catalog (for tests) applies the same functions, so the
//! write path is tested against the real rules. Lease epochs are not part of the
//! manifest: each catalog fences writers before it calls these.
//!
//! Every rule is deterministic and all-or-nothing: a refused change leaves the
//! manifest exactly as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Display};

use quiver_common::{ErrorCode, ServiceError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A position in a shard's write history: WAL batches are ordered by
/// `(epoch, sequence)`; the sequence restarts at 1 in every lease epoch.
///
/// Serialized as the pair `[epoch, sequence]`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(from = "(u64, u64)", into = "(u64, u64)")]
pub struct WalPosition {
    /// Lease epoch of the writer.
    pub epoch: u64,
    /// Batch number within the epoch.
    pub sequence: u64,
}

impl From<(u64, u64)> for WalPosition {
    fn from((epoch, sequence): (u64, u64)) -> Self {
        WalPosition { epoch, sequence }
    }
}

impl From<WalPosition> for (u64, u64) {
    fn from(position: WalPosition) -> Self {
        (position.epoch, position.sequence)
    }
}

impl Display for WalPosition {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "(epoch {}, seq {})", self.epoch, self.sequence)
    }
}

/// A committed WAL object whose rows are not in a segment yet.
///
/// Serialized flat: `{epoch, seq, object_key, rows}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WalEntryForm", into = "WalEntryForm")]
pub struct WalEntry {
    /// Where the batch sits in the history.
    pub position: WalPosition,
    /// Object key.
    pub key: String,
    /// Records in the batch.
    pub rows: u32,
}

#[derive(Serialize, Deserialize)]
struct WalEntryForm {
    epoch: u64,
    seq: u64,
    object_key: String,
    rows: u64,
}

impl From<WalEntryForm> for WalEntry {
    fn from(form: WalEntryForm) -> Self {
        WalEntry {
            position: WalPosition {
                epoch: form.epoch,
                sequence: form.seq,
            },
            key: form.object_key,
            rows: u32::try_from(form.rows).unwrap_or(u32::MAX),
        }
    }
}

impl From<WalEntry> for WalEntryForm {
    fn from(entry: WalEntry) -> Self {
        WalEntryForm {
            epoch: entry.position.epoch,
            seq: entry.position.sequence,
            object_key: entry.key,
            rows: u64::from(entry.rows),
        }
    }
}

/// A segment's deletion bitmap at one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletesEntry {
    /// Object key of the bitmap.
    #[serde(rename = "object_key")]
    pub key: String,
    /// Version (increases with every new bitmap of the segment).
    pub version: u64,
    /// Rows deleted.
    #[serde(default)]
    pub deleted_rows: u32,
}

/// The default probes a segment records (see the fields of the same names in
/// [`SegmentEntry`]): set when it is built, and again when its codebook's
/// group is recalibrated ([`ManifestChange::set_probes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentProbes {
    pub default_nprobe: Option<u32>,
    pub probe_ratio_milli: Option<u32>,
    pub wide_nprobe: Option<u32>,
    pub wide_probe_ratio_milli: Option<u32>,
    pub calibrated_rows: Option<u64>,
}

/// A live segment of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Unique id within the shard, never reused.
    pub segment_id: String,
    /// Object key.
    #[serde(rename = "object_key")]
    pub key: String,
    /// Rows in the segment (deleted ones included).
    pub rows: u32,
    /// Object size.
    pub size_bytes: u64,
    /// The current deletion bitmap, if any row is deleted.
    pub deletes: Option<DeletesEntry>,
    /// Lists to probe when a query does not say: calibrated on the segment's own
    /// data when it was built (`None`: the index's size-based default; serialized
    /// as 0).
    #[serde(default, with = "zero_is_none")]
    pub default_nprobe: Option<u32>,
    /// Lists chosen by distance when a query does not say, in thousandths: the
    /// ratio (`quiver_index::SearchParams::probe_ratio`) calibrated with the
    /// segment's codebook; `default_nprobe` is then the mean lists it probed on
    /// the calibration's sample (`None`: lists are counted; not serialized, so
    /// catalogs written before it read and write the same).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "zero_is_none"
    )]
    pub probe_ratio_milli: Option<u32>,
    /// `default_nprobe` calibrated for the hundred nearest rows
    /// (`quiver_index::CALIBRATED_WIDE_K`): a search for more than ten hits
    /// probes between the two (`quiver_index::probe_for_k`). `None`: not
    /// calibrated (segments built before it; not serialized then).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "zero_is_none"
    )]
    pub wide_nprobe: Option<u32>,
    /// `probe_ratio_milli` calibrated for the hundred nearest rows (`None`:
    /// counted, or not calibrated).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "zero_is_none"
    )]
    pub wide_probe_ratio_milli: Option<u32>,
    /// Rows of the segment's codebook group (the live segments sharing its
    /// codebook) the four values above were calibrated over: a codebook's
    /// probes are calibrated on the rows that trained it, and again over its
    /// group as later flushes grow it (`quiver_index::calibrate_group`). A
    /// searcher takes a group's probes from the member calibrated over the
    /// most rows not above the group's. `None`: over the segment's own rows
    /// or unrecorded (segments built before it; not serialized then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated_rows: Option<u64>,
}

impl SegmentEntry {
    /// A segment just written: no row deleted yet, `probes` its default
    /// probes (its codebook's).
    pub fn new(
        segment_id: String,
        key: String,
        rows: u32,
        size_bytes: u64,
        probes: &SegmentProbes,
    ) -> SegmentEntry {
        let mut entry = SegmentEntry {
            segment_id,
            key,
            rows,
            size_bytes,
            deletes: None,
            default_nprobe: None,
            probe_ratio_milli: None,
            wide_nprobe: None,
            wide_probe_ratio_milli: None,
            calibrated_rows: None,
        };
        entry.set_probes(probes);
        entry
    }

    /// Returns the default probes it records.
    pub fn probes(&self) -> SegmentProbes {
        SegmentProbes {
            default_nprobe: self.default_nprobe,
            probe_ratio_milli: self.probe_ratio_milli,
            wide_nprobe: self.wide_nprobe,
            wide_probe_ratio_milli: self.wide_probe_ratio_milli,
            calibrated_rows: self.calibrated_rows,
        }
    }

    /// Records `probes` as its default probes.
    pub fn set_probes(&mut self, probes: &SegmentProbes) {
        self.default_nprobe = probes.default_nprobe;
        self.probe_ratio_milli = probes.probe_ratio_milli;
        self.wide_nprobe = probes.wide_nprobe;
        self.wide_probe_ratio_milli = probes.wide_probe_ratio_milli;
        self.calibrated_rows = probes.calibrated_rows;
    }

    /// Returns the rows not deleted.
    pub fn live_rows(&self) -> u32 {
        self.rows
            - self
                .deletes
                .as_ref()
                .map_or(0, |deletes| deletes.deleted_rows)
    }
}

/// A shard's manifest: what a searcher must read to answer from the shard.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Increases with every change.
    pub version: u64,
    /// Live segments, in segment id order (serialized as a map by id).
    #[serde(with = "segments_by_id")]
    pub segments: Vec<SegmentEntry>,
    /// Committed WAL batches not in any segment yet, in history order.
    pub wal_tail: Vec<WalEntry>,
    /// The last WAL position ever committed (kept after the tail is trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_committed: Option<WalPosition>,
    /// The highest WAL position trimmed from the tail: commits at or before it
    /// are late retries of batches already in segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_trimmed_through: Option<WalPosition>,
}

/// One atomic change of a manifest (a flush or a merge).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestChange {
    /// Segments added.
    pub add_segments: Vec<SegmentEntry>,
    /// Ids of segments removed (their objects are retired).
    #[serde(rename = "remove_segment_ids")]
    pub remove_segments: Vec<String>,
    /// New deletion bitmaps of live segments: `(segment_id, bitmap)`; a replaced
    /// bitmap is retired.
    pub set_deletes: Vec<(String, DeletesEntry)>,
    /// Drop WAL tail entries up to and including this position (they are retired).
    pub trim_wal_through: Option<WalPosition>,
    /// More objects no longer referenced once this change commits (to delete
    /// after a grace period).
    #[serde(rename = "gc_keys")]
    pub retire_keys: Vec<String>,
    /// New default probes of live segments, `(segment_id, probes)`: a
    /// codebook's group recalibrated over its grown rows (not serialized
    /// when empty, so changes written before it read and write the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_probes: Vec<(String, SegmentProbes)>,
}

/// Why a WAL commit or a manifest change was refused; the manifest is unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    /// `InvalidArgument` for a change that is wrong in itself, `FailedPrecondition`
    /// for one that does not fit the manifest as it is.
    pub code: ErrorCode,
    /// What was wrong, naming the shard and the segment, position or object.
    pub message: String,
}

impl ManifestError {
    fn invalid(message: String) -> Self {
        ManifestError {
            code: ErrorCode::InvalidArgument,
            message,
        }
    }

    fn failed(message: String) -> Self {
        ManifestError {
            code: ErrorCode::FailedPrecondition,
            message,
        }
    }
}

impl Display for ManifestError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}

impl std::error::Error for ManifestError {}

impl ServiceError for ManifestError {
    fn error_code(&self) -> ErrorCode {
        self.code
    }
}

/// What committing a WAL object did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalCommit {
    /// The entry was appended to the tail (the manifest version increased).
    Appended,
    /// The entry had been committed before (a retry); nothing changed.
    Duplicate,
}

/// What applying a manifest change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// Every effect of the change was already in the manifest (a retry of a
    /// committed change); nothing changed.
    Duplicate,
    /// The change was applied (the manifest version increased).
    Applied {
        /// Objects the change took out of the manifest or named: the catalog's
        /// GC list takes them.
        retired_keys: Vec<String>,
    },
}

impl Manifest {
    /// Returns the live segment `segment_id`.
    pub fn segment(&self, segment_id: &str) -> Option<&SegmentEntry> {
        self.segment_index(segment_id)
            .ok()
            .map(|index| &self.segments[index])
    }

    fn segment_index(&self, segment_id: &str) -> Result<usize, usize> {
        self.segments
            .binary_search_by(|segment| segment.segment_id.as_str().cmp(segment_id))
    }

    /// Returns every object key the manifest references (segments, their
    /// bitmaps, the WAL tail).
    pub fn referenced_keys(&self) -> BTreeSet<&str> {
        let mut keys = BTreeSet::new();
        for segment in &self.segments {
            keys.insert(segment.key.as_str());
            if let Some(deletes) = &segment.deletes {
                keys.insert(deletes.key.as_str());
            }
        }
        for entry in &self.wal_tail {
            keys.insert(entry.key.as_str());
        }
        keys
    }

    /// Appends a committed WAL object of `shard` to the tail. Idempotent: the
    /// same position with the same key again (or a position already trimmed) is
    /// a [`WalCommit::Duplicate`]; a position at or behind the last committed one
    /// otherwise, another key at a committed position, or a key on the GC list
    /// (`on_gc_list`) is refused.
    pub fn commit_wal(
        &mut self,
        shard: &dyn Display,
        entry: WalEntry,
        on_gc_list: impl Fn(&str) -> bool,
    ) -> Result<WalCommit, ManifestError> {
        let WalPosition { epoch, sequence } = entry.position;
        if entry.key.is_empty() {
            return Err(ManifestError::invalid(format!(
                "wal commit for shard {shard} has an empty object key"
            )));
        }
        if let Some(last) = self.last_committed
            && entry.position <= last
        {
            if let Some(existing) = self
                .wal_tail
                .iter()
                .find(|committed| committed.position == entry.position)
            {
                if existing.key == entry.key {
                    return Ok(WalCommit::Duplicate);
                }
                return Err(ManifestError::failed(format!(
                    "wal position (epoch {epoch}, seq {sequence}) of shard {shard} was committed with object `{}`, not `{}`",
                    existing.key, entry.key
                )));
            }
            if self
                .wal_trimmed_through
                .is_some_and(|trimmed| entry.position <= trimmed)
            {
                // Committed, then folded into a segment: a late retry.
                return Ok(WalCommit::Duplicate);
            }
            return Err(ManifestError::failed(format!(
                "wal position (epoch {epoch}, seq {sequence}) of shard {shard} is behind the last committed position (epoch {}, seq {})",
                last.epoch, last.sequence
            )));
        }
        if on_gc_list(&entry.key) {
            return Err(ManifestError::failed(format!(
                "wal object `{}` of shard {shard} is on the gc list",
                entry.key
            )));
        }
        self.last_committed = Some(entry.position);
        self.wal_tail.push(entry);
        self.version += 1;
        Ok(WalCommit::Appended)
    }
}

/// Applies `change` to the manifest of `shard` atomically, or refuses it and
/// changes nothing.
///
/// Refused: segments added twice, without an id or key, or already live;
/// segments removed that are not live, or both added and removed; bitmaps set
/// twice, without a key, for a segment not live (or removed), or not newer than
/// the segment's current one; a WAL trim past the last committed position; an
/// added object that is on the GC list (`on_gc_list`: it may be deleted any
/// moment); a retired key the manifest still references afterwards.
/// A change that adds segments and whose every effect is already in the manifest
/// is a retry: [`ChangeOutcome::Duplicate`].
pub fn apply_change(
    manifest: &mut Manifest,
    shard: &dyn Display,
    change: &ManifestChange,
    on_gc_list: impl Fn(&str) -> bool,
) -> Result<ChangeOutcome, ManifestError> {
    if is_repeated_change(manifest, change) {
        return Ok(ChangeOutcome::Duplicate);
    }
    validate_change(manifest, shard, change, on_gc_list)?;

    // Validated: from here on nothing can fail, so the change is all-or-nothing.
    let mut retired_keys: Vec<String> = Vec::new();
    for segment_id in &change.remove_segments {
        if let Ok(index) = manifest.segment_index(segment_id) {
            let segment = manifest.segments.remove(index);
            retired_keys.push(segment.key);
            if let Some(deletes) = segment.deletes {
                retired_keys.push(deletes.key);
            }
        }
    }
    for segment in &change.add_segments {
        match manifest.segment_index(&segment.segment_id) {
            Ok(index) => manifest.segments[index] = segment.clone(),
            Err(index) => manifest.segments.insert(index, segment.clone()),
        }
    }
    for (segment_id, deletes) in &change.set_deletes {
        if let Ok(index) = manifest.segment_index(segment_id)
            && let Some(previous) = manifest.segments[index].deletes.replace(deletes.clone())
            && previous.key != deletes.key
        {
            retired_keys.push(previous.key);
        }
    }
    for (segment_id, probes) in &change.set_probes {
        if let Ok(index) = manifest.segment_index(segment_id) {
            manifest.segments[index].set_probes(probes);
        }
    }
    if let Some(trim_position) = change.trim_wal_through {
        manifest.wal_tail.retain(|entry| {
            let keep = entry.position > trim_position;
            if !keep {
                retired_keys.push(entry.key.clone());
            }
            keep
        });
        manifest.wal_trimmed_through = Some(
            manifest
                .wal_trimmed_through
                .map_or(trim_position, |trimmed| trimmed.max(trim_position)),
        );
    }
    retired_keys.extend(change.retire_keys.iter().cloned());
    manifest.version += 1;
    Ok(ChangeOutcome::Applied { retired_keys })
}

/// Tells whether every effect of `change` is already in the manifest, so the change
/// is a client's retry of a committed change. Only changes that add segments can be
/// recognised (segment ids are never reused).
fn is_repeated_change(manifest: &Manifest, change: &ManifestChange) -> bool {
    if change.add_segments.is_empty() {
        return false;
    }
    let added_present = change.add_segments.iter().all(|segment| {
        manifest
            .segment(&segment.segment_id)
            .is_some_and(|live| live.key == segment.key)
    });
    let removed_absent = change
        .remove_segments
        .iter()
        .all(|segment_id| manifest.segment(segment_id).is_none());
    let trim_done = change.trim_wal_through.is_none_or(|trim_position| {
        manifest
            .wal_trimmed_through
            .is_some_and(|trimmed| trimmed >= trim_position)
    });
    added_present && removed_absent && trim_done
}

fn validate_change(
    manifest: &Manifest,
    shard: &dyn Display,
    change: &ManifestChange,
    on_gc_list: impl Fn(&str) -> bool,
) -> Result<(), ManifestError> {
    let failed = |message: String| Err(ManifestError::failed(message));
    let invalid = |message: String| Err(ManifestError::invalid(message));

    let mut added_ids = BTreeSet::new();
    for segment in &change.add_segments {
        if segment.segment_id.is_empty() || segment.key.is_empty() {
            return invalid(format!(
                "segment added to shard {shard} needs a segment id and an object key"
            ));
        }
        if !added_ids.insert(segment.segment_id.as_str()) {
            return invalid(format!(
                "segment `{}` is added twice to shard {shard}",
                segment.segment_id
            ));
        }
        if manifest.segment(&segment.segment_id).is_some() {
            return failed(format!(
                "segment `{}` is already in the manifest of shard {shard}",
                segment.segment_id
            ));
        }
    }
    let mut removed_ids = BTreeSet::new();
    for segment_id in &change.remove_segments {
        if manifest.segment(segment_id).is_none() {
            return failed(format!(
                "segment `{segment_id}` to remove is not in the manifest of shard {shard}"
            ));
        }
        if added_ids.contains(segment_id.as_str()) || !removed_ids.insert(segment_id.as_str()) {
            return invalid(format!(
                "segment `{segment_id}` is removed twice or both added and removed in shard {shard}"
            ));
        }
    }
    let mut deletes_targets = BTreeSet::new();
    for (segment_id, deletes) in &change.set_deletes {
        if deletes.key.is_empty() {
            return invalid(format!(
                "deletion bitmap of segment `{segment_id}` in shard {shard} has an empty object key"
            ));
        }
        if !deletes_targets.insert(segment_id.as_str()) {
            return invalid(format!(
                "deletion bitmap of segment `{segment_id}` is set twice in shard {shard}"
            ));
        }
        let current_deletes: Option<&DeletesEntry> = if added_ids.contains(segment_id.as_str()) {
            change
                .add_segments
                .iter()
                .find(|segment| &segment.segment_id == segment_id)
                .and_then(|segment| segment.deletes.as_ref())
        } else if removed_ids.contains(segment_id.as_str()) {
            return failed(format!(
                "deletion bitmap set for segment `{segment_id}` that is removed from shard {shard}"
            ));
        } else {
            match manifest.segment(segment_id) {
                Some(segment) => segment.deletes.as_ref(),
                None => {
                    return failed(format!(
                        "deletion bitmap set for segment `{segment_id}` that is not in shard {shard}"
                    ));
                }
            }
        };
        if let Some(current) = current_deletes
            && deletes.version <= current.version
        {
            return failed(format!(
                "deletion bitmap version {} of segment `{segment_id}` in shard {shard} is not newer than version {}",
                deletes.version, current.version
            ));
        }
    }
    let mut probes_targets = BTreeSet::new();
    for (segment_id, _) in &change.set_probes {
        if !probes_targets.insert(segment_id.as_str()) {
            return invalid(format!(
                "default probes of segment `{segment_id}` are set twice in shard {shard}"
            ));
        }
        if added_ids.contains(segment_id.as_str())
            || removed_ids.contains(segment_id.as_str())
            || manifest.segment(segment_id).is_none()
        {
            return failed(format!(
                "default probes set for segment `{segment_id}` that is not a live segment of shard {shard} before and after the change"
            ));
        }
    }
    if let Some(trim_position) = change.trim_wal_through
        && manifest
            .last_committed
            .is_none_or(|last| trim_position > last)
    {
        return failed(format!(
            "wal trim of shard {shard} through {trim_position} goes past the last committed position {}",
            manifest
                .last_committed
                .map_or_else(|| "(none)".to_owned(), |last| last.to_string())
        ));
    }
    // A key to collect must not be one the manifest still references afterwards,
    // and a key waiting for deletion must not come back to life.
    for key in added_keys(change) {
        if on_gc_list(key) {
            return failed(format!(
                "object `{key}` added to shard {shard} is on the gc list"
            ));
        }
    }
    let live_after = live_keys_after(manifest, change);
    if let Some(key) = change
        .retire_keys
        .iter()
        .find(|key| live_after.contains(key.as_str()))
    {
        return invalid(format!(
            "object `{key}` is still referenced by shard {shard} and cannot go on the gc list"
        ));
    }
    Ok(())
}

/// Returns the object keys `change` brings into the manifest: added segments,
/// their bitmaps, and new bitmaps.
pub fn added_keys(change: &ManifestChange) -> impl Iterator<Item = &str> {
    change
        .add_segments
        .iter()
        .flat_map(|segment| {
            std::iter::once(segment.key.as_str())
                .chain(segment.deletes.iter().map(|deletes| deletes.key.as_str()))
        })
        .chain(
            change
                .set_deletes
                .iter()
                .map(|(_, deletes)| deletes.key.as_str()),
        )
}

fn live_keys_after<'a>(manifest: &'a Manifest, change: &'a ManifestChange) -> BTreeSet<&'a str> {
    let removed: BTreeSet<&str> = change.remove_segments.iter().map(String::as_str).collect();
    // A segment whose bitmap the change replaces no longer references the old one.
    let bitmap_replaced: BTreeSet<&str> = change
        .set_deletes
        .iter()
        .map(|(segment_id, _)| segment_id.as_str())
        .collect();
    let mut keys = BTreeSet::new();
    let kept = manifest
        .segments
        .iter()
        .filter(|segment| !removed.contains(segment.segment_id.as_str()));
    for segment in kept.chain(change.add_segments.iter()) {
        keys.insert(segment.key.as_str());
        if let Some(deletes) = &segment.deletes
            && !bitmap_replaced.contains(segment.segment_id.as_str())
        {
            keys.insert(deletes.key.as_str());
        }
    }
    for (_, deletes) in &change.set_deletes {
        keys.insert(deletes.key.as_str());
    }
    for entry in &manifest.wal_tail {
        let trimmed = change
            .trim_wal_through
            .is_some_and(|trim_position| entry.position <= trim_position);
        if !trimmed {
            keys.insert(entry.key.as_str());
        }
    }
    keys
}

/// `Option<u32>` serialized as a number, 0 standing for `None`.
mod zero_is_none {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        value: &Option<u32>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.unwrap_or(0).serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u32>, D::Error> {
        let value = Option::<u32>::deserialize(deserializer)?;
        Ok(value.filter(|value| *value > 0))
    }
}

/// Segments serialized as a map by segment id, read back in id order.
mod segments_by_id {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        segments: &[SegmentEntry],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            segments
                .iter()
                .map(|segment| (segment.segment_id.as_str(), segment)),
        )
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<SegmentEntry>, D::Error> {
        let by_id = BTreeMap::<String, SegmentEntry>::deserialize(deserializer)?;
        Ok(by_id.into_values().collect())
    }
}

#[cfg(test)]
mod tests;
