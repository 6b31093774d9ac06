//! The shard writer's API: open a shard under a lease epoch, validate and
//! write records, flush, compact in the background, report, close.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use quiver_index::{SegmentSpec, validate_id, validate_point};
use quiver_storage::{Storage, WalRecord};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::Shared;
use super::commit::{CommitRequest, commit_loop};
use super::flush::{flush_once, maintenance_loop};
use super::merge::{compact_all, merge_loop};
use super::recovery::load_state;
use crate::catalog::{Catalog, ShardRef, WalPosition};
use crate::config::IndexerConfig;
use quiver_proto::{ErrorCode, ServiceError};

use crate::error::{IndexerError, IndexerResult};
use crate::metrics::METRICS;

/// What a caller sees of a shard writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardStats {
    /// Committed ids waiting for a flush.
    pub unflushed_rows: usize,
    /// Live segments.
    pub segments: usize,
    /// Live rows in segments (deletions applied).
    pub segment_rows: u64,
    /// The newest committed WAL batch.
    pub last_committed: Option<WalPosition>,
    /// The manifest version this writer last saw.
    pub manifest_version: u64,
    /// True once another indexer took the shard over.
    pub fenced: bool,
}

/// Writes one shard under one lease epoch.
pub struct ShardWriter {
    shared: Arc<Shared>,
    commit_sender: mpsc::Sender<CommitRequest>,
    tasks: Vec<JoinHandle<()>>,
    /// The admin compaction running in the background, if any: callers join it
    /// (a caller that gives up does not stop it).
    compaction: Mutex<Option<RunningCompaction>>,
}

/// The outcome of a background compaction, once it is known.
type CompactionOutcome = Option<Result<usize, (ErrorCode, String)>>;

struct RunningCompaction {
    outcome: tokio::sync::watch::Receiver<CompactionOutcome>,
    /// Set once a caller received the outcome: the next call compacts again.
    /// Until then a caller gets this one's outcome (its merges are reported
    /// even when the caller that started it gave up waiting).
    delivered: Arc<std::sync::atomic::AtomicBool>,
    task: JoinHandle<()>,
}

impl ShardWriter {
    /// Opens `shard` under lease `epoch`: reads the manifest, rebuilds the
    /// primary-key map from the live segments, replays the WAL tail, and starts
    /// the committer and the flush/merge loop.
    pub async fn open(
        shard: ShardRef,
        epoch: u64,
        spec: SegmentSpec,
        config: IndexerConfig,
        storage: Storage,
        catalog: Arc<dyn Catalog>,
    ) -> IndexerResult<ShardWriter> {
        config.validate().map_err(IndexerError::InvalidArgument)?;
        let scratch_dir = if config.scratch_dir.is_empty() {
            std::env::temp_dir()
        } else {
            PathBuf::from(&config.scratch_dir)
        };
        let started = Instant::now();
        let state = load_state(&shard, epoch, &storage, catalog.as_ref()).await?;
        tracing::info!(
            shard = %shard,
            epoch,
            segments = state.index.segments.len(),
            primary_keys = state.index.primary_keys.len(),
            replayed_ids = state.active.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "shard opened"
        );
        let shared = Arc::new(Shared {
            shard,
            epoch,
            spec,
            config,
            storage,
            catalog,
            scratch_dir,
            state: Mutex::new(state),
            manifest_lock: tokio::sync::Mutex::new(()),
            flush_wanted: Notify::new(),
            merge_wanted: Notify::new(),
            merge_lock: tokio::sync::Mutex::new(()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            recalibrating: std::sync::atomic::AtomicBool::new(false),
            recalibrate_not_before: std::sync::Mutex::new(None),
        });
        let (commit_sender, commit_receiver) = mpsc::channel(1024);
        let tasks = vec![
            tokio::spawn(commit_loop(shared.clone(), commit_receiver)),
            tokio::spawn(maintenance_loop(shared.clone())),
            tokio::spawn(merge_loop(shared.clone())),
        ];
        Ok(ShardWriter {
            shared,
            commit_sender,
            tasks,
            compaction: Mutex::new(None),
        })
    }

    /// Returns the shard written.
    pub fn shard(&self) -> &ShardRef {
        &self.shared.shard
    }

    /// Returns the lease epoch written under.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// Validates `records`, commits them durably (WAL object + catalog) together
    /// with whatever else arrived in the same window, and returns the batch's
    /// position. Nothing of an invalid request is written.
    pub async fn write(&self, records: Vec<WalRecord>) -> IndexerResult<WalPosition> {
        let bytes = self.validate(&records)?;
        {
            let state = self.shared.lock_state();
            self.shared.check_writable(&state)?;
            let config = &self.shared.config;
            let unflushed = state.active.len() + state.flushing_rows;
            let unflushed_bytes = state.active.bytes() + state.flushing_bytes;
            let over = if unflushed >= config.max_unflushed_rows {
                Some(format!(
                    "{unflushed} unflushed rows (limit {})",
                    config.max_unflushed_rows
                ))
            } else if unflushed_bytes >= config.max_unflushed_bytes {
                Some(format!(
                    "{unflushed} unflushed rows taking {} MiB (limit {} MiB, max_unflushed_bytes)",
                    unflushed_bytes >> 20,
                    config.max_unflushed_bytes >> 20
                ))
            } else {
                None
            };
            if let Some(what) = over {
                METRICS.backpressure_rejections.inc();
                self.shared.flush_wanted.notify_one();
                return Err(IndexerError::Backpressure {
                    shard: self.shared.shard.clone(),
                    what,
                    retry_after_ms: (config.flush_interval_ms / 10).clamp(50, 1000),
                });
            }
        }
        let (reply, answer) = oneshot::channel();
        self.commit_sender
            .send(CommitRequest {
                records,
                bytes,
                reply,
            })
            .await
            .map_err(|_| IndexerError::ShardClosed(self.shared.shard.clone()))?;
        answer
            .await
            .map_err(|_| IndexerError::ShardClosed(self.shared.shard.clone()))?
    }

    /// Checks every record of a write against the collection and the limits;
    /// returns the bytes the write adds to a WAL batch. Errors name the record
    /// (by its index in the request), the field and the value or limit.
    fn validate(&self, records: &[WalRecord]) -> IndexerResult<usize> {
        if records.is_empty() {
            return Err(IndexerError::InvalidArgument(
                "the request has no records: an upsert needs at least one point, a delete at least one id"
                    .into(),
            ));
        }
        let spec = &self.shared.spec;
        let max_payload_bytes = self.shared.config.max_payload_bytes;
        let invalid =
            |error: quiver_index::IndexError| IndexerError::InvalidArgument(error.message());
        let mut bytes = 0;
        for (index, record) in records.iter().enumerate() {
            match record {
                WalRecord::Upsert {
                    id,
                    vector,
                    payload,
                } => {
                    if payload.len() > max_payload_bytes {
                        return Err(IndexerError::InvalidArgument(format!(
                            "payload of point {index} has {} bytes; the limit is {max_payload_bytes} bytes (max_payload_bytes)",
                            payload.len()
                        )));
                    }
                    let parsed: Option<serde_json::Value> = if payload.is_empty() {
                        None
                    } else {
                        Some(serde_json::from_slice(payload).map_err(|error| {
                            IndexerError::InvalidArgument(format!(
                                "payload of point {index} is not JSON: {error}"
                            ))
                        })?)
                    };
                    validate_point(spec, index, id, vector, parsed.as_ref()).map_err(invalid)?;
                    bytes += vector.len() * 4 + payload.len() + 16;
                }
                WalRecord::Delete { id } => {
                    validate_id(spec, index, id).map_err(invalid)?;
                    bytes += 16;
                }
            }
        }
        Ok(bytes)
    }

    /// Flushes every committed write now; returns true when something was flushed.
    pub async fn flush(&self) -> IndexerResult<bool> {
        let flushed = flush_once(&self.shared).await?;
        if flushed {
            super::recalibrate::maybe_recalibrate(&self.shared);
        }
        Ok(flushed)
    }

    /// Whether a recalibration of the shard codebook's group runs (started
    /// by a flush that grew the group; see `shard::recalibrate`).
    pub fn recalibrating(&self) -> bool {
        self.shared
            .recalibrating
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Merges every segment it can (the admin "compact"); returns the merges done.
    ///
    /// The work runs in a background task, so a caller that stops waiting (a
    /// client's timeout on a large shard) does not cancel it; a call while one
    /// runs, or after one finished that no caller saw the end of, joins it and
    /// gets its outcome instead of starting another.
    pub async fn compact(&self) -> IndexerResult<usize> {
        self.compact_within(None)
            .await
            .map(|merges| merges.expect("no wait limit: the outcome"))
    }

    /// [`ShardWriter::compact`], answering `None` (still running) once `wait` has
    /// passed. Only an answer with the outcome marks it delivered, so a caller
    /// told "running" who asks again gets it.
    pub async fn compact_within(
        &self,
        wait: Option<std::time::Duration>,
    ) -> IndexerResult<Option<usize>> {
        let (mut outcome, delivered) = {
            let mut slot = self.compaction.lock().unwrap_or_else(|p| p.into_inner());
            match slot.as_ref() {
                Some(running) if !running.delivered.load(std::sync::atomic::Ordering::Acquire) => {
                    (running.outcome.clone(), running.delivered.clone())
                }
                _ => {
                    let (sender, receiver) = tokio::sync::watch::channel(None);
                    let shared = self.shared.clone();
                    let task = tokio::spawn(async move {
                        let result = compact_all(&shared)
                            .await
                            .map_err(|error| (error.error_code(), error.to_string()));
                        sender.send_replace(Some(result));
                    });
                    let delivered = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    *slot = Some(RunningCompaction {
                        outcome: receiver.clone(),
                        delivered: delivered.clone(),
                        task,
                    });
                    (receiver, delivered)
                }
            }
        };
        let waited = match wait {
            Some(wait) => {
                match tokio::time::timeout(wait, outcome.wait_for(Option::is_some)).await {
                    Ok(waited) => waited.map(|result| result.clone()),
                    Err(_still_running) => return Ok(None),
                }
            }
            None => outcome
                .wait_for(Option::is_some)
                .await
                .map(|result| result.clone()),
        };
        let result = match waited {
            Ok(result) => {
                delivered.store(true, std::sync::atomic::Ordering::Release);
                result.expect("waited for an outcome")
            }
            Err(_) => Err((
                ErrorCode::Unavailable,
                format!(
                    "shard {}: the compaction was stopped (shard closed)",
                    self.shared.shard
                ),
            )),
        };
        result
            .map(Some)
            .map_err(|(code, message)| IndexerError::Compaction { code, message })
    }

    /// Returns counters of the shard.
    pub fn stats(&self) -> ShardStats {
        let state = self.shared.lock_state();
        ShardStats {
            unflushed_rows: state.active.len() + state.flushing_rows,
            segments: state.index.segments.len(),
            segment_rows: state
                .index
                .segments
                .values()
                .map(|segment| segment.entry.live_rows() as u64)
                .sum(),
            last_committed: state.last_committed,
            manifest_version: state.manifest_version,
            fenced: state.fenced,
        }
    }

    /// Stops the writer: pending writes fail, background work ends. Nothing
    /// acknowledged depends on this (it is all in the WAL tail or in segments).
    pub async fn close(mut self) {
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.flush_wanted.notify_one();
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        let compaction = self
            .compaction
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(running) = compaction {
            running.task.abort();
            let _ = running.task.await;
        }
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(running) = self
            .compaction
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            running.task.abort();
        }
    }
}
