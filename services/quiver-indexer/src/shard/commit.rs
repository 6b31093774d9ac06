//! Group commit: writes that arrive within one commit window become one WAL
//! object, acknowledged once it is in object storage and the metadata service
//! appended it to the shard's WAL tail under this writer's epoch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_storage::{WalBatch, WalRecord, keys};
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use super::recovery::reconcile;
use crate::catalog::{CatalogError, WalEntry, WalPosition};
use crate::error::{IndexerError, IndexerResult};
use crate::failpoints;
use crate::metrics::METRICS;

pub(super) struct CommitRequest {
    pub(super) records: Vec<WalRecord>,
    pub(super) bytes: usize,
    pub(super) reply: oneshot::Sender<IndexerResult<WalPosition>>,
}

/// Gathers requests for one commit window and commits them as one WAL object.
pub(super) async fn commit_loop(shared: Arc<Shared>, mut receiver: mpsc::Receiver<CommitRequest>) {
    let window = Duration::from_millis(shared.config.commit_window_ms);
    while let Some(first) = receiver.recv().await {
        let deadline = tokio::time::Instant::now() + window;
        let mut bytes = first.bytes;
        let mut requests = vec![first];
        while bytes < shared.config.commit_max_bytes {
            tokio::select! {
                next = receiver.recv() => match next {
                    Some(request) => {
                        bytes += request.bytes;
                        requests.push(request);
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let outcome = commit_batch(&shared, &mut requests).await;
        for request in requests {
            let answer = match &outcome {
                Ok(position) => Ok(*position),
                Err(error) => Err(clone_error(&shared, error)),
            };
            let _ = request.reply.send(answer);
        }
    }
}

/// Errors are reported to every writer of a batch; this gives each its own copy.
fn clone_error(shared: &Shared, error: &IndexerError) -> IndexerError {
    match error {
        IndexerError::Fenced { shard, epoch } => IndexerError::Fenced {
            shard: shard.clone(),
            epoch: *epoch,
        },
        IndexerError::Catalog(CatalogError::Fenced { .. }) => IndexerError::Fenced {
            shard: shared.shard.clone(),
            epoch: shared.epoch,
        },
        IndexerError::Catalog(CatalogError::Unavailable(reason)) => {
            IndexerError::Catalog(CatalogError::Unavailable(reason.clone()))
        }
        IndexerError::Storage(error)
            if error.kind() == quiver_storage::StorageErrorKind::Unavailable =>
        {
            IndexerError::StorageUnavailable(error.to_string())
        }
        IndexerError::StorageUnavailable(message) => {
            IndexerError::StorageUnavailable(message.clone())
        }
        other => IndexerError::Internal(other.to_string()),
    }
}

async fn commit_batch(
    shared: &Shared,
    requests: &mut [CommitRequest],
) -> IndexerResult<WalPosition> {
    let records: Vec<WalRecord> = requests
        .iter_mut()
        .flat_map(|request| std::mem::take(&mut request.records))
        .collect();
    let position = {
        let mut state = shared.lock_state();
        shared.check_writable(&state)?;
        // A sequence number is never reused, even after a failed commit: a WAL
        // key is written once.
        let position = WalPosition {
            epoch: shared.epoch,
            sequence: state.next_sequence,
        };
        state.next_sequence += 1;
        position
    };
    let batch = WalBatch {
        shard: shared.shard.shard,
        epoch: position.epoch,
        sequence: position.sequence,
        dimension: shared.spec.dim as u32,
        records,
    };
    let key = keys::wal_key(
        &shared.shard.collection_id,
        shared.shard.shard,
        position.epoch,
        position.sequence,
    );
    let encoded = batch.encode();
    let wal_bytes = encoded.len();
    let started = Instant::now();
    failpoints::during("wal-put", shared.storage.put(&key, encoded)).await?;
    METRICS
        .wal_put_seconds
        .observe(started.elapsed().as_secs_f64());
    let entry = WalEntry {
        position,
        key,
        rows: batch.records.len() as u32,
    };
    failpoints::reached("wal-commit");
    let started = Instant::now();
    let committed = shared
        .catalog
        .commit_wal(&shared.shard, shared.epoch, entry.clone())
        .await;
    METRICS
        .wal_commit_seconds
        .observe(started.elapsed().as_secs_f64());
    match committed {
        Ok(_) => {}
        Err(CatalogError::Unavailable(reason)) => {
            // The commit may have happened: ask the manifest before answering.
            if !reconcile(
                shared,
                |manifest| manifest.wal_tail.contains(&entry),
                &reason,
            )
            .await?
            {
                return Err(IndexerError::Catalog(CatalogError::Unavailable(reason)));
            }
        }
        Err(error) => {
            shared.note_catalog_error(&error);
            return Err(error.into());
        }
    }
    failpoints::reached("wal-ack");
    let rows = batch.records.len();
    let mut state = shared.lock_state();
    state.active.apply_batch(position, batch);
    state.last_committed = Some(position);
    let (unflushed, unflushed_bytes) = (state.active.len(), state.active.bytes());
    drop(state);
    METRICS.rows_written.inc_by(rows as u64);
    METRICS.wal_bytes.inc_by(wal_bytes as u64);
    METRICS.wal_batches.inc();
    if unflushed >= shared.config.flush_rows
        || unflushed_bytes >= shared.config.max_unflushed_bytes / 4
    {
        shared.flush_wanted.notify_one();
    }
    shared.update_gauges();
    Ok(position)
}
