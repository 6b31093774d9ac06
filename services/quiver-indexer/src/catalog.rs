//! What the write path needs from the metadata service: a shard's manifest and
//! the two fenced commits. The cluster implements [`Catalog`] over meta's gRPC
//! client; tests use an in-memory one that applies the metadata service's own
//! manifest rules. The manifest model and those rules live in `quiver-model`
//! (re-exported by `quiver-storage`; searchers read manifests too).

use async_trait::async_trait;
pub use quiver_storage::manifest::{
    DeletesEntry, Manifest, ManifestChange, SegmentEntry, SegmentProbes, ShardRef, WalEntry,
    WalPosition, apply_change,
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

/// The GC list as the garbage collector sees it: objects retired by manifest
/// changes, each deletable once its grace period is over.
#[async_trait]
pub trait GcList: Send + Sync + 'static {
    /// Returns up to `limit` keys whose grace period is over.
    async fn take_due(&self, limit: u32) -> Result<Vec<String>, CatalogError>;

    /// Removes keys whose objects are gone from the list.
    async fn acknowledge(&self, object_keys: Vec<String>) -> Result<(), CatalogError>;
}

#[cfg(any(test, feature = "testsuite"))]
pub use memory::{MemoryCatalog, manifest_keys};

#[cfg(any(test, feature = "testsuite"))]
mod memory {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use quiver_storage::manifest::ChangeOutcome;

    use super::*;

    type Shards = HashMap<ShardRef, (u64, Manifest)>;

    /// Returns every object key `manifest` references.
    pub fn manifest_keys(manifest: &Manifest) -> BTreeSet<String> {
        manifest
            .referenced_keys()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// An in-memory catalog for tests: manifests and epochs, with switches to
    /// fail calls (before or after applying them) and to fence a writer, and a
    /// GC list with the metadata service's rules on a clock the test moves.
    #[derive(Default)]
    pub struct MemoryCatalog {
        shards: Mutex<Shards>,
        /// Object key → the catalog time from which it may be deleted.
        gc: Mutex<BTreeMap<String, u64>>,
        /// The catalog's clock, ms (moved by tests).
        pub now_ms: AtomicU64,
        /// Grace period of retired objects, ms.
        pub gc_grace_ms: AtomicU64,
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

        /// Returns the GC list: `(key, delete_after_ms)` in key order.
        pub fn gc_entries(&self) -> Vec<(String, u64)> {
            let gc = self.gc.lock().expect("gc lock");
            gc.iter().map(|(key, at)| (key.clone(), *at)).collect()
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
                let gc = self.gc.lock().expect("gc lock");
                // The metadata service's own rules (`quiver-model`).
                manifest
                    .commit_wal(shard, entry, |key| gc.contains_key(key))
                    .map_err(|error| CatalogError::Rejected(error.message))?;
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
                let mut gc = self.gc.lock().expect("gc lock");
                // The metadata service's own rules (`quiver-model`): what leaves
                // the manifest, plus the keys the writer names, waits out the
                // grace period; a key still live cannot be retired, and a retired
                // key cannot come back.
                let outcome = apply_change(manifest, shard, &change, |key| gc.contains_key(key))
                    .map_err(|error| CatalogError::Rejected(error.message))?;
                if let ChangeOutcome::Applied { retired_keys } = outcome {
                    let delete_after = self.now_ms.load(Ordering::Relaxed)
                        + self.gc_grace_ms.load(Ordering::Relaxed);
                    for key in retired_keys {
                        gc.insert(key, delete_after);
                    }
                }
                manifest.clone()
            };
            self.outcome(manifest)
        }
    }

    #[async_trait]
    impl GcList for MemoryCatalog {
        async fn take_due(&self, limit: u32) -> Result<Vec<String>, CatalogError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.fail_before.load(Ordering::Relaxed) {
                return Err(CatalogError::Unavailable("injected failure".into()));
            }
            let now = self.now_ms.load(Ordering::Relaxed);
            let gc = self.gc.lock().expect("gc lock");
            let mut due: Vec<(&String, &u64)> = gc.iter().filter(|(_, at)| **at <= now).collect();
            due.sort_by_key(|(key, at)| (**at, (*key).clone()));
            Ok(due
                .into_iter()
                .take(limit as usize)
                .map(|(key, _)| key.clone())
                .collect())
        }

        async fn acknowledge(&self, object_keys: Vec<String>) -> Result<(), CatalogError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mut gc = self.gc.lock().expect("gc lock");
            for key in object_keys {
                gc.remove(&key);
            }
            Ok(())
        }
    }
}
