//! One shard's writer: group commit into WAL objects, L0 flushes with deletion
//! bitmaps, tiered merges, and the replay that makes a takeover lose nothing.
//!
//! Durability: a write is acknowledged only after its WAL object is in object
//! storage *and* the metadata service has appended it to the shard's WAL tail
//! under this writer's lease epoch. Everything else (flushes, merges) only moves
//! acknowledged rows from the WAL tail into segments, one atomic manifest change
//! at a time, so a crash at any point loses nothing: the next writer rebuilds its
//! state from the manifest and replays the tail.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use quiver_index::{PointId, SegmentSpec, validate_id, validate_point};
use quiver_storage::{Storage, WalBatch, WalRecord, keys};
use roaring::RoaringBitmap;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::catalog::{
    Catalog, CatalogError, DeletesEntry, Manifest, ManifestChange, SegmentEntry, ShardRef,
    WalEntry, WalPosition,
};
use crate::config::IndexerConfig;
use crate::error::{IndexerError, IndexerErrorKind, IndexerResult};
use crate::failpoints;
use crate::memtable::{Memtable, PendingOp};
use crate::merge::{MergePlan, plan_merges};
use crate::metrics::METRICS;
use crate::segments::{
    RowRef, ShardIndex, build_segment, download_segment, encode_deletes, load_deletes,
};

/// How often an ambiguous commit is re-checked against the manifest.
const RECONCILE_ATTEMPTS: u32 = 6;

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

struct CommitRequest {
    records: Vec<WalRecord>,
    bytes: usize,
    reply: oneshot::Sender<IndexerResult<WalPosition>>,
}

struct ShardState {
    /// Committed writes not being flushed.
    active: Memtable,
    /// Ids in the flush under way (they still count against backpressure).
    flushing_rows: usize,
    next_sequence: u64,
    last_committed: Option<WalPosition>,
    index: ShardIndex,
    manifest_version: u64,
    fenced: bool,
    /// Set when a commit's outcome could not be learned: writes are refused
    /// until the state is rebuilt from the manifest.
    poisoned: Option<String>,
}

struct Shared {
    shard: ShardRef,
    epoch: u64,
    spec: SegmentSpec,
    config: IndexerConfig,
    storage: Storage,
    catalog: Arc<dyn Catalog>,
    scratch_dir: PathBuf,
    state: Mutex<ShardState>,
    /// Serialises manifest changes (flushes, merges, resyncs) of this shard.
    manifest_lock: tokio::sync::Mutex<()>,
    flush_wanted: Notify,
    /// Wakes the merge loop after a flush added a segment.
    merge_wanted: Notify,
    /// One merge plan at a time: the background merges and an admin
    /// compaction would otherwise plan over the same segments, and the one
    /// that commits second finds its sources gone.
    merge_lock: tokio::sync::Mutex<()>,
    stopping: std::sync::atomic::AtomicBool,
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
type CompactionOutcome = Option<Result<usize, (IndexerErrorKind, String)>>;

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
        let state = load_state(&shard, epoch, &storage, catalog.as_ref(), &scratch_dir).await?;
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
            let unflushed = state.active.len() + state.flushing_rows;
            if unflushed >= self.shared.config.max_unflushed_rows {
                METRICS.backpressure_rejections.inc();
                self.shared.flush_wanted.notify_one();
                return Err(IndexerError::Backpressure {
                    shard: self.shared.shard.clone(),
                    unflushed_rows: unflushed,
                    limit: self.shared.config.max_unflushed_rows,
                    retry_after_ms: (self.shared.config.flush_interval_ms / 10).clamp(50, 1000),
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
        let invalid = |error: quiver_index::IndexError| {
            let text = error.to_string();
            IndexerError::InvalidArgument(
                text.strip_prefix("invalid argument: ")
                    .map(str::to_string)
                    .unwrap_or(text),
            )
        };
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
        flush_once(&self.shared).await
    }

    /// Merges every segment it can (the admin "compact"); returns the merges done.
    ///
    /// The work runs in a background task, so a caller that stops waiting (a
    /// client's timeout on a large shard) does not cancel it; a call while one
    /// runs, or after one finished that no caller saw the end of, joins it and
    /// gets its outcome instead of starting another.
    pub async fn compact(&self) -> IndexerResult<usize> {
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
                            .map_err(|error| (error.kind(), error.to_string()));
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
        let result = match outcome.wait_for(Option::is_some).await {
            Ok(result) => {
                delivered.store(true, std::sync::atomic::Ordering::Release);
                result.clone().expect("waited for an outcome")
            }
            Err(_) => Err((
                IndexerErrorKind::Unavailable,
                format!(
                    "shard {}: the compaction was stopped (shard closed)",
                    self.shared.shard
                ),
            )),
        };
        result.map_err(|(kind, message)| IndexerError::Compaction { kind, message })
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

impl Shared {
    fn update_gauges(&self) {
        let label = self.shard.to_string();
        let state = self.lock_state();
        METRICS
            .unflushed_rows
            .with_label_values(&[label.as_str()])
            .set((state.active.len() + state.flushing_rows) as i64);
        METRICS
            .segments
            .with_label_values(&[label.as_str()])
            .set(state.index.segments.len() as i64);
    }

    fn lock_state(&self) -> MutexGuard<'_, ShardState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_writable(&self, state: &ShardState) -> IndexerResult<()> {
        if state.fenced {
            return Err(IndexerError::Fenced {
                shard: self.shard.clone(),
                epoch: self.epoch,
            });
        }
        if let Some(reason) = &state.poisoned {
            return Err(IndexerError::Catalog(CatalogError::Unavailable(format!(
                "shard {} is resynchronising after {reason}",
                self.shard
            ))));
        }
        Ok(())
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    fn note_catalog_error(&self, error: &CatalogError) {
        if matches!(error, CatalogError::Fenced { .. }) {
            tracing::warn!(shard = %self.shard, epoch = self.epoch, "lease taken over; writer fenced");
            self.lock_state().fenced = true;
        }
    }
}

/// Reads the manifest, rebuilds segments and primary keys, replays the WAL tail.
async fn load_state(
    shard: &ShardRef,
    epoch: u64,
    storage: &Storage,
    catalog: &dyn Catalog,
    scratch_dir: &std::path::Path,
) -> IndexerResult<ShardState> {
    let manifest = catalog.manifest(shard).await?;
    let mut index = ShardIndex::default();
    for entry in &manifest.segments {
        let deleted = match &entry.deletes {
            Some(deletes) => load_deletes(storage, &deletes.key).await?,
            None => RoaringBitmap::new(),
        };
        let downloaded = download_segment(storage, &entry.key, scratch_dir).await?;
        let ids = tokio::task::block_in_place(|| downloaded.segment.ids())?;
        index.add_segment(entry.clone(), deleted, ids);
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
        next_sequence,
        last_committed,
        index,
        manifest_version: manifest.version,
        fenced: false,
        poisoned: None,
    })
}

async fn read_wal(storage: &Storage, entry: &WalEntry) -> IndexerResult<WalBatch> {
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

/// Gathers requests for one commit window and commits them as one WAL object.
async fn commit_loop(shared: Arc<Shared>, mut receiver: mpsc::Receiver<CommitRequest>) {
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
    let unflushed = state.active.len();
    drop(state);
    METRICS.rows_written.inc_by(rows as u64);
    METRICS.wal_bytes.inc_by(wal_bytes as u64);
    METRICS.wal_batches.inc();
    if unflushed >= shared.config.flush_rows {
        shared.flush_wanted.notify_one();
    }
    shared.update_gauges();
    Ok(position)
}

/// Learns whether an ambiguous change landed by re-reading the manifest. Returns
/// Ok(true) if it did, Ok(false) if it did not; if the manifest cannot be read
/// either, the shard is marked for a resync and the error returned.
async fn reconcile(
    shared: &Shared,
    landed: impl Fn(&Manifest) -> bool,
    reason: &str,
) -> IndexerResult<bool> {
    let mut delay = Duration::from_millis(50);
    for _ in 0..RECONCILE_ATTEMPTS {
        match shared.catalog.manifest(&shared.shard).await {
            Ok(manifest) => return Ok(landed(&manifest)),
            Err(error) => {
                tracing::warn!(shard = %shared.shard, %error, "manifest unreadable while reconciling");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    shared.lock_state().poisoned = Some(format!("an unconfirmed commit ({reason})"));
    shared.flush_wanted.notify_one();
    Err(IndexerError::Catalog(CatalogError::Unavailable(format!(
        "commit outcome unknown: {reason}"
    ))))
}

/// Flushes on a timer or when asked; merges when the policy finds work.
async fn maintenance_loop(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.flush_interval_ms);
    loop {
        // A writer that lost track of a commit's outcome rebuilds itself first,
        // retrying every second until the catalog answers.
        if shared.lock_state().poisoned.is_some() {
            if shared.stopping() {
                return;
            }
            if let Err(error) = resync(&shared).await {
                tracing::warn!(shard = %shared.shard, %error, "resync failed; retrying");
                tokio::time::sleep(interval.min(Duration::from_secs(1))).await;
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.flush_wanted.notified() => {}
        }
        if shared.stopping() || shared.lock_state().fenced {
            return;
        }
        if shared.lock_state().poisoned.is_some() {
            continue;
        }
        let flushed = flush_once(&shared).await;
        shared.update_gauges();
        match flushed {
            Ok(true) => shared.merge_wanted.notify_one(),
            Ok(false) => {}
            Err(error) => tracing::warn!(shard = %shared.shard, %error, "flush failed; will retry"),
        }
    }
}

/// Merges in the background, beside the flushes: a merge of large segments
/// takes minutes, and flushes waiting behind it would let unflushed rows pile
/// up to the backpressure bound and refuse writes.
async fn merge_loop(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.flush_interval_ms);
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
                plan_merges(&state.index, &shared.config, false)
            };
            let Some(plan) = plan else { break };
            let merged = merge_once(&shared, plan).await;
            shared.update_gauges();
            match merged {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    tracing::warn!(shard = %shared.shard, %error, "merge failed; will retry");
                    break;
                }
            }
        }
    }
}

/// Rebuilds the state from the manifest after an unconfirmed commit.
async fn resync(shared: &Shared) -> IndexerResult<()> {
    let _manifest_guard = shared.manifest_lock.lock().await;
    let fresh = load_state(
        &shared.shard,
        shared.epoch,
        &shared.storage,
        shared.catalog.as_ref(),
        &shared.scratch_dir,
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

/// Moves every committed write into a new L0 segment (and deletion bitmaps for
/// the older copies it replaces), then trims the WAL tail — one manifest change.
async fn flush_once(shared: &Shared) -> IndexerResult<bool> {
    let _manifest_guard = shared.manifest_lock.lock().await;
    let (mut frozen, through) = {
        let mut state = shared.lock_state();
        shared.check_writable(&state)?;
        let Some(through) = state.active.last_position() else {
            return Ok(false);
        };
        let frozen = std::mem::take(&mut state.active);
        state.flushing_rows = frozen.len();
        (frozen, through)
    };
    let started = Instant::now();
    let result = flush_frozen(shared, &mut frozen, through).await;
    let mut state = shared.lock_state();
    state.flushing_rows = 0;
    match result {
        Ok(true) => {
            METRICS.flushes.inc();
            METRICS
                .flush_seconds
                .observe(started.elapsed().as_secs_f64());
            Ok(true)
        }
        Ok(false) | Err(_) => {
            // Not flushed: the writes go back, under anything newer.
            let newer = std::mem::take(&mut state.active);
            frozen.absorb(newer);
            state.active = frozen;
            result
        }
    }
}

/// The body of a flush; returns Ok(true) once the manifest change committed.
async fn flush_frozen(
    shared: &Shared,
    frozen: &mut Memtable,
    through: WalPosition,
) -> IndexerResult<bool> {
    // Batches committed with an outcome this writer never learned are in the
    // tail but not in memory: fold them in so trimming the tail loses nothing.
    let manifest = shared.catalog.manifest(&shared.shard).await?;
    for entry in &manifest.wal_tail {
        if entry.position <= through && !frozen.contains_position(&entry.position) {
            let batch = read_wal(&shared.storage, entry).await?;
            frozen.apply_batch(entry.position, batch);
        }
    }
    let upserts: Vec<(&PointId, &[f32], &[u8])> = frozen
        .iter()
        .filter_map(|(id, _, op)| match op {
            PendingOp::Upsert { vector, payload } => {
                Some((id, vector.as_slice(), payload.as_slice()))
            }
            PendingOp::Delete => None,
        })
        .collect();
    let mut change = ManifestChange {
        trim_wal_through: Some(through),
        retire_keys: manifest
            .wal_tail
            .iter()
            .filter(|entry| entry.position <= through)
            .map(|entry| entry.key.clone())
            .collect(),
        ..Default::default()
    };
    let mut new_segment = None;
    if !upserts.is_empty() {
        let spec = shared.spec.clone();
        let rows: Vec<(PointId, Vec<f32>, Vec<u8>)> = upserts
            .iter()
            .map(|(id, vector, payload)| ((*id).clone(), vector.to_vec(), payload.to_vec()))
            .collect();
        let built = tokio::task::spawn_blocking(move || {
            build_segment(
                &spec,
                rows.iter()
                    .map(|(id, vector, payload)| (id, vector.as_slice(), payload.as_slice())),
                &|_, _, _| {},
            )
        })
        .await
        .map_err(|error| IndexerError::Internal(format!("segment build task: {error}")))??;
        let segment_id = new_segment_id(through, "l0");
        let key = keys::segment_key(&shared.shard.collection_id, shared.shard.shard, &segment_id);
        let entry = SegmentEntry {
            segment_id,
            key: key.clone(),
            rows: built.ids.len() as u32,
            size_bytes: built.bytes.len() as u64,
            deletes: None,
            default_nprobe: Some(built.default_nprobe),
        };
        failpoints::during("flush-upload", shared.storage.put(&key, built.bytes.into())).await?;
        change.add_segments.push(entry.clone());
        new_segment = Some((entry, built.ids));
    }
    // Older persisted copies of every id written here are deleted.
    let new_deletes = {
        let state = shared.lock_state();
        let mut per_segment: HashMap<Arc<str>, RoaringBitmap> = HashMap::new();
        for (id, _, _) in frozen.iter() {
            if let Some(row_ref) = state.index.primary_keys.get(id) {
                per_segment
                    .entry(row_ref.segment_id.clone())
                    .or_default()
                    .insert(row_ref.row);
            }
        }
        per_segment
            .into_iter()
            .filter_map(|(segment_id, rows)| {
                let live = state.index.segments.get(&segment_id)?;
                let mut deleted = live.deleted.clone();
                deleted |= rows;
                Some((segment_id, live.entry.clone(), deleted))
            })
            .collect::<Vec<_>>()
    };
    let mut staged_deletes = Vec::new();
    for (segment_id, entry, deleted) in new_deletes {
        let version = entry
            .deletes
            .as_ref()
            .map_or(1, |deletes| deletes.version + 1);
        let key = keys::deletes_key(
            &shared.shard.collection_id,
            shared.shard.shard,
            &segment_id,
            version,
        );
        shared
            .storage
            .put(&key, encode_deletes(entry.rows, &deleted))
            .await?;
        if let Some(old) = &entry.deletes {
            change.retire_keys.push(old.key.clone());
        }
        let deletes = DeletesEntry {
            key,
            version,
            deleted_rows: deleted.len() as u32,
        };
        change
            .set_deletes
            .push((segment_id.to_string(), deletes.clone()));
        staged_deletes.push((segment_id, deletes, deleted));
    }
    failpoints::reached("flush-commit");
    let committed = shared
        .catalog
        .commit_manifest_change(&shared.shard, shared.epoch, change)
        .await;
    let manifest = match committed {
        Ok(manifest) => manifest,
        Err(CatalogError::Unavailable(reason)) => {
            let landed = |manifest: &Manifest| {
                manifest
                    .wal_tail
                    .iter()
                    .all(|entry| entry.position > through)
            };
            if !reconcile(shared, landed, &reason).await? {
                return Ok(false);
            }
            shared.catalog.manifest(&shared.shard).await?
        }
        Err(error) => {
            shared.note_catalog_error(&error);
            return Err(error.into());
        }
    };
    // Committed: the persisted side now holds these writes.
    let mut state = shared.lock_state();
    for (segment_id, deletes, deleted) in staged_deletes {
        if let Some(live) = state.index.segments.get_mut(&segment_id) {
            live.entry.deletes = Some(deletes);
            live.deleted = deleted;
        }
    }
    for (id, _, op) in frozen.iter() {
        if matches!(op, PendingOp::Delete) {
            state.index.primary_keys.remove(id);
        }
    }
    if let Some((entry, ids)) = new_segment {
        state.index.add_segment(entry, RoaringBitmap::new(), ids);
    }
    state.manifest_version = manifest.version;
    Ok(true)
}

fn new_segment_id(through: WalPosition, level: &str) -> String {
    format!(
        "{:010}-{:012}-{level}-{:08x}",
        through.epoch,
        through.sequence,
        rand::random::<u32>()
    )
}

/// Merges the segments of `plan` into one (live rows only, index retrained).
/// Returns Ok(false) when the plan no longer applies.
/// Flushes, then merges every segment it can, one merge after the other.
async fn compact_all(shared: &Shared) -> IndexerResult<usize> {
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

async fn merge_once(shared: &Shared, plan: MergePlan) -> IndexerResult<bool> {
    let started = Instant::now();
    // Snapshot what the merge reads: the sources and their deletions now.
    let sources: Vec<(Arc<str>, SegmentEntry, RoaringBitmap)> = {
        let state = shared.lock_state();
        let mut sources = Vec::new();
        for segment_id in &plan.segment_ids {
            let Some(live) = state.index.segments.get(segment_id.as_str()) else {
                return Ok(false);
            };
            sources.push((
                Arc::from(segment_id.as_str()),
                live.entry.clone(),
                live.deleted.clone(),
            ));
        }
        sources
    };
    let mut downloaded = Vec::new();
    for (_, entry, _) in &sources {
        downloaded.push(download_segment(&shared.storage, &entry.key, &shared.scratch_dir).await?);
    }
    let mut spec = shared.spec.clone();
    spec.build.threads = shared.config.merge_threads;
    let snapshot: Vec<RoaringBitmap> = sources
        .iter()
        .map(|(_, _, deleted)| deleted.clone())
        .collect();
    let (built, origins) = tokio::task::spawn_blocking(move || -> IndexerResult<_> {
        let mut rows: Vec<(PointId, Vec<f32>, Vec<u8>)> = Vec::new();
        let mut origins: HashMap<PointId, (usize, u32)> = HashMap::new();
        for (source_index, (source, deleted)) in downloaded.iter().zip(&snapshot).enumerate() {
            let segment = &source.segment;
            let ids = segment.ids()?;
            for (row, id) in ids.into_iter().enumerate() {
                let row = row as u32;
                if deleted.contains(row) {
                    continue;
                }
                let vector = segment.vector(row)?;
                let payload = segment.payload_bytes(row)?.unwrap_or_default();
                origins.insert(id.clone(), (source_index, row));
                rows.push((id, vector, payload));
            }
        }
        if rows.is_empty() {
            // Every row was deleted: the merge only removes the sources.
            return Ok((None, origins));
        }
        let built = build_segment(
            &spec,
            rows.iter()
                .map(|(id, vector, payload)| (id, vector.as_slice(), payload.as_slice())),
            &|_, _, _| {},
        )?;
        Ok((Some(built), origins))
    })
    .await
    .map_err(|error| IndexerError::Internal(format!("merge task: {error}")))??;

    let (bytes, ids, default_nprobe) = match built {
        Some(built) => (built.bytes, built.ids, Some(built.default_nprobe)),
        None => (Vec::new(), Vec::new(), None),
    };
    let _manifest_guard = shared.manifest_lock.lock().await;
    // Rows deleted from the sources while the merge ran are deleted in the result.
    let (late_deleted, through) = {
        let state = shared.lock_state();
        shared.check_writable(&state)?;
        let mut late = RoaringBitmap::new();
        let new_rows: HashMap<&PointId, u32> = ids
            .iter()
            .enumerate()
            .map(|(row, id)| (id, row as u32))
            .collect();
        for (source_index, (segment_id, _, deleted_then)) in sources.iter().enumerate() {
            let Some(live) = state.index.segments.get(segment_id) else {
                return Ok(false);
            };
            let deleted_since = &live.deleted - deleted_then;
            if deleted_since.is_empty() {
                continue;
            }
            for (id, (origin_source, origin_row)) in &origins {
                if *origin_source == source_index
                    && deleted_since.contains(*origin_row)
                    && let Some(row) = new_rows.get(id)
                {
                    late.insert(*row);
                }
            }
        }
        (late, state.last_committed.unwrap_or_default())
    };
    let segment_id = new_segment_id(through, &format!("m{}", plan.level));
    let key = keys::segment_key(&shared.shard.collection_id, shared.shard.shard, &segment_id);
    let mut entry = SegmentEntry {
        segment_id: segment_id.clone(),
        key: key.clone(),
        rows: ids.len() as u32,
        size_bytes: bytes.len() as u64,
        deletes: None,
        default_nprobe,
    };
    let empty_result = ids.is_empty();
    if !empty_result {
        failpoints::during("merge-upload", shared.storage.put(&key, bytes.into())).await?;
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
                return Ok(false);
            }
            shared.catalog.manifest(&shared.shard).await?
        }
        Err(error) => {
            shared.note_catalog_error(&error);
            return Err(error.into());
        }
    };
    let mut state = shared.lock_state();
    // Primary keys that pointed into a source now point into the result.
    let source_ids: Vec<Arc<str>> = sources.iter().map(|(id, _, _)| id.clone()).collect();
    let new_id: Arc<str> = Arc::from(segment_id.as_str());
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
    if !empty_result {
        state.index.segments.insert(
            new_id,
            crate::segments::LiveSegment {
                entry,
                deleted: late_deleted,
            },
        );
    }
    state.manifest_version = manifest.version;
    drop(state);
    METRICS.merges.inc();
    METRICS
        .merge_seconds
        .observe(started.elapsed().as_secs_f64());
    tracing::info!(
        shard = %shared.shard,
        sources = plan.segment_ids.len(),
        rows = ids.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "segments merged"
    );
    Ok(true)
}
