//! What the write path needs from the metadata service: a shard's manifest and
//! the two fenced commits. The cluster implements [`Catalog`] over meta's gRPC
//! client; tests use an in-memory one.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One shard of one collection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardRef {
    /// The collection's id (not its name: a dropped and re-created collection
    /// gets a new id, so its objects never mix with the old ones).
    pub collection_id: String,
    /// Shard number, `0..shards`.
    pub shard: u32,
}

impl std::fmt::Display for ShardRef {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}/{}", self.collection_id, self.shard)
    }
}

/// A position in a shard's write history: WAL batches are ordered by
/// `(epoch, sequence)`; the sequence restarts at 1 in every lease epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct WalPosition {
    /// Lease epoch of the writer.
    pub epoch: u64,
    /// Batch number within the epoch.
    pub sequence: u64,
}

/// A committed WAL object whose rows are not in a segment yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalEntry {
    /// Where the batch sits in the history.
    pub position: WalPosition,
    /// Object key.
    pub key: String,
    /// Records in the batch.
    pub rows: u32,
}

/// A segment's deletion bitmap at one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletesEntry {
    /// Object key of the bitmap.
    pub key: String,
    /// Version (increases with every new bitmap of the segment).
    pub version: u64,
    /// Rows deleted.
    pub deleted_rows: u32,
}

/// A live segment of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Unique id within the shard.
    pub segment_id: String,
    /// Object key.
    pub key: String,
    /// Rows in the segment (deleted ones included).
    pub rows: u32,
    /// Object size.
    pub size_bytes: u64,
    /// The current deletion bitmap, if any row is deleted.
    pub deletes: Option<DeletesEntry>,
}

impl SegmentEntry {
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
    /// Live segments.
    pub segments: Vec<SegmentEntry>,
    /// Committed WAL batches not in any segment yet, in history order.
    pub wal_tail: Vec<WalEntry>,
}

/// One atomic change of a manifest (a flush or a merge).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestChange {
    /// Segments added.
    pub add_segments: Vec<SegmentEntry>,
    /// Ids of segments removed.
    pub remove_segments: Vec<String>,
    /// New deletion bitmaps of existing segments: `(segment_id, bitmap)`.
    pub set_deletes: Vec<(String, DeletesEntry)>,
    /// Drop WAL tail entries up to and including this position.
    pub trim_wal_through: Option<WalPosition>,
    /// Objects no longer referenced once this change commits (to delete after
    /// a grace period).
    pub retire_keys: Vec<String>,
}

/// Why the catalog refused or failed a call.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The writer's lease epoch is no longer the shard's: another indexer took
    /// over. Nothing was changed.
    #[error("shard {shard}: lease epoch {epoch} is stale (current {current})")]
    Fenced {
        shard: ShardRef,
        epoch: u64,
        current: u64,
    },
    /// The shard or collection does not exist.
    #[error("shard {0} not found")]
    NotFound(ShardRef),
    /// The call failed or timed out; it may or may not have been applied.
    #[error("metadata service unavailable: {0}")]
    Unavailable(String),
    /// The change is inconsistent with the manifest (e.g. removes an unknown
    /// segment); nothing was changed.
    #[error("manifest change rejected: {0}")]
    Rejected(String),
}

/// The metadata service as seen by an indexer.
#[async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Returns the shard's manifest (linearizable: at least as new as any
    /// change acknowledged before the call).
    async fn manifest(&self, shard: &ShardRef) -> Result<Manifest, CatalogError>;

    /// Appends a committed WAL batch to the shard's tail, fenced by `epoch`.
    /// Idempotent: committing the same entry again succeeds without a duplicate.
    async fn commit_wal(
        &self,
        shard: &ShardRef,
        epoch: u64,
        entry: WalEntry,
    ) -> Result<u64, CatalogError>;

    /// Applies `change` atomically, fenced by `epoch`; returns the new manifest.
    async fn commit_manifest_change(
        &self,
        shard: &ShardRef,
        epoch: u64,
        change: ManifestChange,
    ) -> Result<Manifest, CatalogError>;
}

/// Applies `change` to `manifest` (the rules every catalog implements), or
/// says why it cannot apply.
pub fn apply_change(manifest: &mut Manifest, change: &ManifestChange) -> Result<(), String> {
    for removed in &change.remove_segments {
        if !manifest
            .segments
            .iter()
            .any(|segment| &segment.segment_id == removed)
        {
            return Err(format!("segment {removed} is not in the manifest"));
        }
    }
    for (segment_id, _) in &change.set_deletes {
        let known = manifest
            .segments
            .iter()
            .chain(&change.add_segments)
            .any(|segment| &segment.segment_id == segment_id);
        if !known || change.remove_segments.contains(segment_id) {
            return Err(format!(
                "deletes for segment {segment_id}, which is not live"
            ));
        }
    }
    for added in &change.add_segments {
        if manifest
            .segments
            .iter()
            .any(|segment| segment.segment_id == added.segment_id)
        {
            return Err(format!("segment {} is already live", added.segment_id));
        }
    }
    manifest
        .segments
        .retain(|segment| !change.remove_segments.contains(&segment.segment_id));
    manifest
        .segments
        .extend(change.add_segments.iter().cloned());
    for (segment_id, deletes) in &change.set_deletes {
        if let Some(segment) = manifest
            .segments
            .iter_mut()
            .find(|segment| &segment.segment_id == segment_id)
        {
            segment.deletes = Some(deletes.clone());
        }
    }
    if let Some(through) = change.trim_wal_through {
        manifest.wal_tail.retain(|entry| entry.position > through);
    }
    manifest.version += 1;
    Ok(())
}

#[cfg(any(test, feature = "testsuite"))]
pub use memory::MemoryCatalog;

#[cfg(any(test, feature = "testsuite"))]
mod memory {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::*;

    type Shards = HashMap<ShardRef, (u64, Manifest)>;

    /// An in-memory catalog for tests: manifests and epochs, with switches to
    /// fail calls (before or after applying them) and to fence a writer.
    #[derive(Default)]
    pub struct MemoryCatalog {
        shards: Mutex<Shards>,
        /// Fail the next calls (reads included) without applying them.
        pub fail_before: AtomicBool,
        /// Fail the next commits without applying them (reads still work).
        pub fail_commits: AtomicBool,
        /// Apply the next calls but report a failure (an ambiguous outcome).
        pub fail_after: AtomicBool,
        /// Calls made.
        pub calls: AtomicU64,
    }

    impl MemoryCatalog {
        /// Creates `shard` with lease epoch `epoch` (or moves it to `epoch`).
        pub fn set_epoch(&self, shard: &ShardRef, epoch: u64) {
            let mut shards = self.shards.lock().expect("catalog lock");
            shards.entry(shard.clone()).or_default().0 = epoch;
        }

        fn check(
            &self,
            shard: &ShardRef,
            epoch: u64,
        ) -> Result<std::sync::MutexGuard<'_, Shards>, CatalogError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.fail_before.load(Ordering::Relaxed) || self.fail_commits.load(Ordering::Relaxed)
            {
                return Err(CatalogError::Unavailable("injected failure".into()));
            }
            let shards = self.shards.lock().expect("catalog lock");
            let Some((current, _)) = shards.get(shard) else {
                return Err(CatalogError::NotFound(shard.clone()));
            };
            if *current != epoch {
                return Err(CatalogError::Fenced {
                    shard: shard.clone(),
                    epoch,
                    current: *current,
                });
            }
            Ok(shards)
        }

        fn outcome<T>(&self, value: T) -> Result<T, CatalogError> {
            if self.fail_after.load(Ordering::Relaxed) {
                return Err(CatalogError::Unavailable(
                    "injected failure after apply".into(),
                ));
            }
            Ok(value)
        }
    }

    #[async_trait]
    impl Catalog for MemoryCatalog {
        async fn manifest(&self, shard: &ShardRef) -> Result<Manifest, CatalogError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.fail_before.load(Ordering::Relaxed) {
                return Err(CatalogError::Unavailable("injected failure".into()));
            }
            let shards = self.shards.lock().expect("catalog lock");
            shards
                .get(shard)
                .map(|(_, manifest)| manifest.clone())
                .ok_or_else(|| CatalogError::NotFound(shard.clone()))
        }

        async fn commit_wal(
            &self,
            shard: &ShardRef,
            epoch: u64,
            entry: WalEntry,
        ) -> Result<u64, CatalogError> {
            let version = {
                let mut shards = self.check(shard, epoch)?;
                let manifest = &mut shards.get_mut(shard).expect("checked").1;
                if !manifest.wal_tail.contains(&entry) {
                    if manifest
                        .wal_tail
                        .last()
                        .is_some_and(|last| last.position >= entry.position)
                    {
                        return Err(CatalogError::Rejected(format!(
                            "WAL position {:?} is not after the tail",
                            entry.position
                        )));
                    }
                    manifest.wal_tail.push(entry);
                    manifest.version += 1;
                }
                manifest.version
            };
            self.outcome(version)
        }

        async fn commit_manifest_change(
            &self,
            shard: &ShardRef,
            epoch: u64,
            change: ManifestChange,
        ) -> Result<Manifest, CatalogError> {
            let manifest = {
                let mut shards = self.check(shard, epoch)?;
                let manifest = &mut shards.get_mut(shard).expect("checked").1;
                apply_change(manifest, &change).map_err(CatalogError::Rejected)?;
                manifest.clone()
            };
            self.outcome(manifest)
        }
    }
}
