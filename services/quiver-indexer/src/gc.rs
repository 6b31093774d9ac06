//! The garbage collector: deletes objects whose GC grace period is over, then
//! tells the GC list. Objects go on the list only when a manifest change stops
//! referencing them, and wait out a grace period there, so a searcher still
//! answering from an older manifest can keep reading them.

use quiver_storage::{Storage, StorageErrorKind};

use crate::catalog::{CatalogError, GcList};
use crate::metrics::METRICS;

/// Deletes up to `limit` due objects; returns how many were deleted (a missing
/// object counts: someone deleted it already). Objects whose delete fails stay
/// on the list for the next run.
pub async fn collect_garbage(
    list: &dyn GcList,
    storage: &Storage,
    limit: u32,
) -> Result<usize, CatalogError> {
    let due = list.take_due(limit).await?;
    let mut deleted = Vec::with_capacity(due.len());
    for key in due {
        match storage.delete(&key).await {
            Ok(()) => deleted.push(key),
            Err(error) if error.kind() == StorageErrorKind::NotFound => deleted.push(key),
            Err(error) => tracing::warn!(%key, %error, "gc delete failed"),
        }
    }
    let count = deleted.len();
    if count > 0 {
        list.acknowledge(deleted).await?;
        METRICS.gc_deleted.inc_by(count as u64);
        tracing::info!(objects = count, "garbage collected");
    }
    Ok(count)
}
