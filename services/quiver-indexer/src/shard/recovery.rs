//! Recovery: a new writer (a takeover, or a restart under the same lease)
//! rebuilds its state from the manifest and replays the WAL tail; a writer that
//! lost track of a commit's outcome learns it from the manifest, or rebuilds
//! itself (resync).

use std::time::Duration;

use quiver_common::RetryPolicy;
use quiver_storage::{Storage, WalBatch};
use roaring::RoaringBitmap;

use super::{ShardState, Shared};
use crate::catalog::{Catalog, CatalogError, Manifest, ShardRef, WalEntry};
use crate::error::{IndexerError, IndexerResult};
use crate::memtable::Memtable;
use crate::segments::{ShardIndex, load_deletes, read_ids_and_codebook};

/// How patiently an ambiguous commit is re-checked against the manifest: six
/// reads, with full-jitter waits bounded by 50 ms doubling up to 2 s.
const RECONCILE_RETRY: RetryPolicy =
    RetryPolicy::new(6, Duration::from_millis(50), Duration::from_secs(2));

/// Reads the manifest, rebuilds segments and primary keys (each segment's ids and
/// codebook read by ranges, not the segment downloaded), replays the WAL tail.
pub(super) async fn load_state(
    shard: &ShardRef,
    epoch: u64,
    storage: &Storage,
    catalog: &dyn Catalog,
) -> IndexerResult<ShardState> {
    let manifest = catalog.manifest(shard).await?;
    let mut index = ShardIndex::default();
    for entry in &manifest.segments {
        let deleted = match &entry.deletes {
            Some(deletes) => load_deletes(storage, &deletes.key).await?,
            None => RoaringBitmap::new(),
        };
        let (ids, codebook) = read_ids_and_codebook(storage, entry).await?;
        let codebook_id = codebook.as_ref().map(|codebook| codebook.codebook.id());
        if let Some(codebook) = codebook {
            index.offer_codebook(codebook);
        }
        index.add_segment(entry.clone(), deleted, ids, codebook_id);
    }
    let mut active = Memtable::default();
    for wal in &manifest.wal_tail {
        let batch = read_wal(storage, wal).await?;
        active.apply_batch(wal.position, batch);
    }
    let last_committed = manifest.wal_tail.last().map(|entry| entry.position);
    // Never reuse a sequence number of this epoch, even one whose batch was
    // trimmed from the tail already (a writer restarted under the same lease).
    let next_sequence = manifest
        .wal_tail
        .iter()
        .map(|entry| entry.position)
        .chain(manifest.last_committed)
        .filter(|position| position.epoch == epoch)
        .map(|position| position.sequence + 1)
        .max()
        .unwrap_or(1);
    Ok(ShardState {
        active,
        flushing_rows: 0,
        flushing_bytes: 0,
        next_sequence,
        last_committed,
        index,
        manifest_version: manifest.version,
        fenced: false,
        poisoned: None,
    })
}

pub(super) async fn read_wal(storage: &Storage, entry: &WalEntry) -> IndexerResult<WalBatch> {
    let bytes = storage.get(&entry.key).await?;
    let batch = WalBatch::decode(&entry.key, &bytes)?;
    if batch.epoch != entry.position.epoch || batch.sequence != entry.position.sequence {
        return Err(IndexerError::Storage(
            quiver_storage::StorageError::Corrupted {
                key: entry.key.clone(),
                reason: format!(
                    "holds batch {}-{}, the manifest says {}-{}",
                    batch.epoch, batch.sequence, entry.position.epoch, entry.position.sequence
                ),
            },
        ));
    }
    Ok(batch)
}

/// Learns whether an ambiguous change landed by re-reading the manifest. Returns
/// Ok(true) if it did, Ok(false) if it did not; if the manifest cannot be read
/// either, the shard is marked for a resync and the error returned.
pub(super) async fn reconcile(
    shared: &Shared,
    landed: impl Fn(&Manifest) -> bool,
    reason: &str,
) -> IndexerResult<bool> {
    let manifest = RECONCILE_RETRY
        .retry_if(
            |_attempt| async {
                let read = shared.catalog.manifest(&shared.shard).await;
                if let Err(error) = &read {
                    tracing::warn!(shard = %shared.shard, %error, "manifest unreadable while reconciling");
                }
                read
            },
            |_| true,
            |_| None,
        )
        .await;
    if let Ok(manifest) = manifest {
        return Ok(landed(&manifest));
    }
    shared.lock_state().poisoned = Some(format!("an unconfirmed commit ({reason})"));
    shared.flush_wanted.notify_one();
    Err(IndexerError::Catalog(CatalogError::Unavailable(format!(
        "commit outcome unknown: {reason}"
    ))))
}

/// Rebuilds the state from the manifest after an unconfirmed commit.
pub(super) async fn resync(shared: &Shared) -> IndexerResult<()> {
    let _manifest_guard = shared.manifest_lock.lock().await;
    let fresh = load_state(
        &shared.shard,
        shared.epoch,
        &shared.storage,
        shared.catalog.as_ref(),
    )
    .await?;
    let mut state = shared.lock_state();
    let next_sequence = state.next_sequence.max(fresh.next_sequence);
    *state = ShardState {
        next_sequence,
        ..fresh
    };
    tracing::info!(shard = %shared.shard, "shard resynchronised from the manifest");
    Ok(())
}
