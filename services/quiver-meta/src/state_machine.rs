//! The Raft state machine: the catalog in memory plus its snapshot on disk.
//!
//! The catalog is applied in memory; durability comes from the Raft log (redb) and
//! from snapshot files. On start the newest snapshot is loaded and openraft replays
//! the log after it. A snapshot file is written to a temporary name, fsynced and
//! renamed, so a crash leaves either the old or the new snapshot, never half of one.

// openraft's `StorageError` is the error type its storage traits demand; the
// helpers return it as is rather than boxing and unboxing it at every call.
#![allow(clippy::result_large_err)]

use std::fs;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder,
    StorageIOError,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::error::{MetaError, MetaResult};
use crate::metrics::MetaMetrics;
use crate::model::{MetaResponse, Outcome};
use crate::raft_types::TypeConfig;
use crate::raft_types::typ::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
};

const SNAPSHOT_FILE: &str = "snapshot.bin";

/// The newest snapshot's metadata and bytes, shared with the snapshot builder.
type CurrentSnapshot = Arc<Mutex<Option<(SnapshotMeta, Vec<u8>)>>>;

/// What a snapshot holds: the applied position, the membership and the catalog.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SnapshotPayload {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    catalog: Catalog,
}

/// The applied state shared between the state machine and the API handlers.
#[derive(Default)]
pub(crate) struct AppliedState {
    pub(crate) last_applied: Option<LogId>,
    pub(crate) last_membership: StoredMembership,
    pub(crate) catalog: Catalog,
    /// When this node last saw the catalog clock advance (applied an entry that moved
    /// it, or installed a snapshot); a new leader's clock starts from there.
    pub(crate) clock_advanced_at: Option<Instant>,
}

/// Read access to the applied catalog plus a notification on every change.
#[derive(Clone)]
pub(crate) struct CatalogHandle {
    state: Arc<RwLock<AppliedState>>,
    version_sender: Arc<watch::Sender<u64>>,
}

impl CatalogHandle {
    /// Runs `read` against the applied state (keep it short: it holds a read lock).
    pub(crate) fn read<T>(&self, read: impl FnOnce(&AppliedState) -> T) -> T {
        let guard = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        read(&guard)
    }

    /// Returns a receiver of the catalog version, updated after each applied batch.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version_sender.subscribe()
    }
}

/// The metadata service's openraft state machine.
pub struct StateMachineStore {
    handle: CatalogHandle,
    snapshot_dir: PathBuf,
    current_snapshot: CurrentSnapshot,
    snapshot_counter: Arc<AtomicU64>,
    metrics: Option<MetaMetrics>,
}

fn storage_error(
    subject: ErrorSubject<u64>,
    verb: ErrorVerb,
    error: impl std::fmt::Display,
) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::error(error)).into()
}

impl StateMachineStore {
    /// Opens the state machine whose snapshots live in `snapshot_dir`, loading the
    /// newest snapshot if there is one.
    pub fn open(
        snapshot_dir: &Path,
        metrics: Option<MetaMetrics>,
    ) -> MetaResult<StateMachineStore> {
        fs::create_dir_all(snapshot_dir)
            .map_err(|error| MetaError::storage(snapshot_dir.display(), error))?;
        let path = snapshot_dir.join(SNAPSHOT_FILE);
        let mut applied = AppliedState::default();
        let mut current_snapshot = None;
        if path.exists() {
            let bytes =
                fs::read(&path).map_err(|error| MetaError::storage(path.display(), error))?;
            let (meta, data) = decode_snapshot_file(&bytes)
                .map_err(|error| MetaError::storage(path.display(), error))?;
            let payload: SnapshotPayload = serde_json::from_slice(&data)
                .map_err(|error| MetaError::storage(path.display(), error))?;
            tracing::info!(last_log_id = ?meta.last_log_id, path = %path.display(), "loaded catalog snapshot");
            applied = AppliedState {
                last_applied: payload.last_applied,
                last_membership: payload.last_membership,
                catalog: payload.catalog,
                clock_advanced_at: None,
            };
            current_snapshot = Some((meta, data));
        }
        let version = applied.catalog.version();
        let (version_sender, _) = watch::channel(version);
        Ok(StateMachineStore {
            handle: CatalogHandle {
                state: Arc::new(RwLock::new(applied)),
                version_sender: Arc::new(version_sender),
            },
            snapshot_dir: snapshot_dir.to_owned(),
            current_snapshot: Arc::new(Mutex::new(current_snapshot)),
            snapshot_counter: Arc::new(AtomicU64::new(0)),
            metrics,
        })
    }

    pub(crate) fn handle(&self) -> CatalogHandle {
        self.handle.clone()
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, AppliedState> {
        self.handle
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn publish_version(&self) {
        let version = self.handle.read(|state| state.catalog.version());
        self.handle.version_sender.send_if_modified(|current| {
            let changed = *current != version;
            *current = version;
            changed
        });
    }

    fn builder(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            handle: self.handle.clone(),
            snapshot_dir: self.snapshot_dir.clone(),
            current_snapshot: self.current_snapshot.clone(),
            snapshot_counter: self.snapshot_counter.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// Encodes a snapshot file: the metadata as one line of JSON, then the payload.
fn encode_snapshot_file(meta: &SnapshotMeta, data: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec(meta)?;
    bytes.push(b'\n');
    bytes.extend_from_slice(data);
    Ok(bytes)
}

fn decode_snapshot_file(bytes: &[u8]) -> Result<(SnapshotMeta, Vec<u8>), String> {
    let split = bytes
        .iter()
        .position(|byte| *byte == b'\n')
        .ok_or_else(|| "snapshot file has no metadata line".to_owned())?;
    let meta: SnapshotMeta =
        serde_json::from_slice(&bytes[..split]).map_err(|error| error.to_string())?;
    Ok((meta, bytes[split + 1..].to_vec()))
}

/// Writes the snapshot file atomically (temporary file, fsync, rename, fsync dir).
fn persist_snapshot(snapshot_dir: &Path, meta: &SnapshotMeta, data: &[u8]) -> std::io::Result<()> {
    let bytes = encode_snapshot_file(meta, data).map_err(std::io::Error::other)?;
    let temporary = snapshot_dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let written = fs::File::create(&temporary).and_then(|mut file| {
        file.write_all(&bytes)?;
        file.sync_all()
    });
    if let Err(error) = written {
        // A half-written file on a full disk would only keep it full.
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    fs::rename(&temporary, snapshot_dir.join(SNAPSHOT_FILE))?;
    fs::File::open(snapshot_dir)?.sync_all()
}

/// Builds snapshots from a point-in-time copy of the catalog.
pub struct SnapshotBuilder {
    handle: CatalogHandle,
    snapshot_dir: PathBuf,
    current_snapshot: CurrentSnapshot,
    snapshot_counter: Arc<AtomicU64>,
    metrics: Option<MetaMetrics>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let handle = self.handle.clone();
        let payload = tokio::task::spawn_blocking(move || {
            handle.read(|state| SnapshotPayload {
                last_applied: state.last_applied,
                last_membership: state.last_membership.clone(),
                catalog: state.catalog.clone(),
            })
        })
        .await
        .map_err(|error| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, error))?;
        let counter = self.snapshot_counter.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match payload.last_applied {
            Some(log_id) => format!("{}-{}-{counter}", log_id.leader_id.term, log_id.index),
            None => format!("0-0-{counter}"),
        };
        let meta = SnapshotMeta {
            last_log_id: payload.last_applied,
            last_membership: payload.last_membership.clone(),
            snapshot_id,
        };
        let snapshot_dir = self.snapshot_dir.clone();
        let meta_for_disk = meta.clone();
        let data = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
            let data = serde_json::to_vec(&payload).map_err(|error| error.to_string())?;
            persist_snapshot(&snapshot_dir, &meta_for_disk, &data)
                .map_err(|error| error.to_string())?;
            Ok(data)
        })
        .await
        .map_err(|error| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, error))?
        .map_err(|error| {
            storage_error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                error,
            )
        })?;
        tracing::info!(snapshot_id = %meta.snapshot_id, size_bytes = data.len(), "built catalog snapshot");
        if let Some(metrics) = &self.metrics {
            metrics.snapshots_total.inc();
        }
        *self
            .current_snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self
            .handle
            .read(|state| (state.last_applied, state.last_membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MetaResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        {
            let mut state = self.write_lock();
            let clock_before = state.catalog.clock_ms();
            for entry in entries {
                state.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => MetaResponse(Ok(Outcome::Nothing)),
                    EntryPayload::Normal(request) => {
                        let result = state.catalog.apply(&request);
                        if let Err(rejection) = &result {
                            tracing::debug!(command = request.command.name(), code = %rejection.code, message = %rejection.message, "command rejected");
                        }
                        MetaResponse(result)
                    }
                    EntryPayload::Membership(membership) => {
                        state.last_membership =
                            StoredMembership::new(Some(entry.log_id), membership);
                        MetaResponse(Ok(Outcome::Nothing))
                    }
                };
                responses.push(response);
            }
            if state.catalog.clock_ms() != clock_before {
                state.clock_advanced_at = Some(Instant::now());
            }
        }
        self.publish_version();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.builder()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let payload: SnapshotPayload = serde_json::from_slice(&data).map_err(|error| {
            storage_error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Read,
                error,
            )
        })?;
        let snapshot_dir = self.snapshot_dir.clone();
        let meta_for_disk = meta.clone();
        let data_for_disk = data.clone();
        tokio::task::spawn_blocking(move || {
            persist_snapshot(&snapshot_dir, &meta_for_disk, &data_for_disk)
        })
        .await
        .map_err(|error| storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, error))?
        .map_err(|error| {
            storage_error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                error,
            )
        })?;
        {
            let mut state = self.write_lock();
            state.last_applied = meta.last_log_id;
            state.last_membership = meta.last_membership.clone();
            state.catalog = payload.catalog;
            state.clock_advanced_at = Some(Instant::now());
        }
        tracing::info!(snapshot_id = %meta.snapshot_id, last_log_id = ?meta.last_log_id, "installed catalog snapshot");
        *self
            .current_snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((meta.clone(), data));
        self.publish_version();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let current = self
            .current_snapshot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(current.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
