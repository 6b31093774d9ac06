//! What the write path needs from the metadata service: a shard's manifest and
//! the two fenced commits. The cluster implements [`Catalog`] over meta's gRPC
//! client; tests use an in-memory one. The manifest model itself lives in
//! `quiver-storage` (searchers read it too).

use async_trait::async_trait;
pub use quiver_storage::manifest::{
    DeletesEntry, Manifest, ManifestChange, SegmentEntry, ShardRef, WalEntry, WalPosition,
    apply_change,
};

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
                        .last_committed
                        .is_some_and(|last| last >= entry.position)
                    {
                        return Err(CatalogError::Rejected(format!(
                            "WAL position {:?} is not after the tail",
                            entry.position
                        )));
                    }
                    manifest.last_committed = Some(entry.position);
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
