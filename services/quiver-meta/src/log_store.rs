//! The Raft log and vote in redb on local disk.
//!
//! Every write is one redb transaction committed with `Durability::Immediate`
//! (fsync) before openraft is told it is durable, so a crash never loses an
//! acknowledged entry or vote. All redb calls run on tokio's blocking pool.

// openraft's `StorageError` is the error type its storage traits demand; the
// helpers return it as is rather than boxing and unboxing it at every call.
#![allow(clippy::result_large_err)]

use std::fmt::{Debug, Display};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, StorageIOError,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::{MetaError, MetaResult};
use crate::raft_types::TypeConfig;
use crate::raft_types::typ::{Entry, LogId, StorageError, Vote};

const LOG_TABLE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("raft_log");
const META_TABLE: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("raft_meta");
const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const LAST_PURGED_KEY: &str = "last_purged";

/// The Raft log and vote of one metadata node, in a redb file.
///
/// Cloning is cheap and shares the database (openraft's log readers are clones).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<LogStoreInner>,
}

struct LogStoreInner {
    database: Database,
    path: PathBuf,
    /// Last committed index seen (0 = none), for status and metrics.
    committed_index: AtomicU64,
}

fn storage_error(subject: ErrorSubject<u64>, verb: ErrorVerb, error: impl Display) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::error(error)).into()
}

impl LogStore {
    /// Opens (or creates) the log database at `path`.
    pub fn open(path: &Path) -> MetaResult<LogStore> {
        let database =
            Database::create(path).map_err(|error| MetaError::storage(path.display(), error))?;
        let transaction = database
            .begin_write()
            .map_err(|error| MetaError::storage(path.display(), error))?;
        transaction
            .open_table(LOG_TABLE)
            .map_err(|error| MetaError::storage(path.display(), error))?;
        transaction
            .open_table(META_TABLE)
            .map_err(|error| MetaError::storage(path.display(), error))?;
        transaction
            .commit()
            .map_err(|error| MetaError::storage(path.display(), error))?;
        let store = LogStore {
            inner: Arc::new(LogStoreInner {
                database,
                path: path.to_owned(),
                committed_index: AtomicU64::new(0),
            }),
        };
        let committed: Option<LogId> = store
            .read_meta_blocking(COMMITTED_KEY)
            .map_err(|error| MetaError::storage(path.display(), error))?;
        if let Some(log_id) = committed {
            store
                .inner
                .committed_index
                .store(log_id.index, Ordering::Relaxed);
        }
        Ok(store)
    }

    /// Returns the last committed log index this node has persisted (0 if none).
    pub fn committed_index(&self) -> u64 {
        self.inner.committed_index.load(Ordering::Relaxed)
    }

    /// Returns how many other handles share this database (openraft's log readers,
    /// storage calls still running on the blocking pool); the file stays locked until
    /// the last one is dropped.
    pub(crate) fn other_handles(&self) -> usize {
        Arc::strong_count(&self.inner).saturating_sub(1)
    }

    /// Returns the path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn read_meta_blocking<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StorageError> {
        let subject = || ErrorSubject::Store;
        let transaction = self
            .inner
            .database
            .begin_read()
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let table = transaction
            .open_table(META_TABLE)
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let Some(value) = table
            .get(key)
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?
        else {
            return Ok(None);
        };
        let decoded = serde_json::from_slice(value.value())
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        Ok(Some(decoded))
    }

    /// Writes one metadata key; `durable = false` skips the fsync (the value reaches
    /// disk with the next durable transaction).
    fn write_meta_blocking<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        subject: ErrorSubject<u64>,
        durable: bool,
    ) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(value)
            .map_err(|error| storage_error(subject.clone(), ErrorVerb::Write, error))?;
        let mut transaction = self
            .inner
            .database
            .begin_write()
            .map_err(|error| storage_error(subject.clone(), ErrorVerb::Write, error))?;
        if !durable {
            transaction
                .set_durability(redb::Durability::None)
                .map_err(|error| storage_error(subject.clone(), ErrorVerb::Write, error))?;
        }
        {
            let mut table = transaction
                .open_table(META_TABLE)
                .map_err(|error| storage_error(subject.clone(), ErrorVerb::Write, error))?;
            table
                .insert(key, bytes.as_slice())
                .map_err(|error| storage_error(subject.clone(), ErrorVerb::Write, error))?;
        }
        transaction
            .commit()
            .map_err(|error| storage_error(subject, ErrorVerb::Write, error))
    }

    fn read_entries_blocking(
        &self,
        start: u64,
        end_exclusive: Option<u64>,
    ) -> Result<Vec<Entry>, StorageError> {
        let subject = || ErrorSubject::Logs;
        let transaction = self
            .inner
            .database
            .begin_read()
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let table = transaction
            .open_table(LOG_TABLE)
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let range = match end_exclusive {
            Some(end) => table.range(start..end),
            None => table.range(start..),
        }
        .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let mut entries = Vec::new();
        for item in range {
            let (index, value) =
                item.map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
            let entry: Entry = serde_json::from_slice(value.value()).map_err(|error| {
                storage_error(
                    ErrorSubject::LogIndex(index.value()),
                    ErrorVerb::Read,
                    error,
                )
            })?;
            entries.push(entry);
        }
        Ok(entries)
    }

    fn last_entry_blocking(&self) -> Result<Option<Entry>, StorageError> {
        let subject = || ErrorSubject::Logs;
        let transaction = self
            .inner
            .database
            .begin_read()
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let table = transaction
            .open_table(LOG_TABLE)
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        let last = table
            .last()
            .map_err(|error| storage_error(subject(), ErrorVerb::Read, error))?;
        match last {
            None => Ok(None),
            Some((_, value)) => serde_json::from_slice(value.value())
                .map(Some)
                .map_err(|error| storage_error(subject(), ErrorVerb::Read, error)),
        }
    }

    fn append_blocking(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StorageError> {
        let subject = || ErrorSubject::Logs;
        let transaction = self
            .inner
            .database
            .begin_write()
            .map_err(|error| storage_error(subject(), ErrorVerb::Write, error))?;
        {
            let mut table = transaction
                .open_table(LOG_TABLE)
                .map_err(|error| storage_error(subject(), ErrorVerb::Write, error))?;
            for (index, bytes) in entries {
                table
                    .insert(*index, bytes.as_slice())
                    .map_err(|error| storage_error(subject(), ErrorVerb::Write, error))?;
            }
        }
        transaction
            .commit()
            .map_err(|error| storage_error(subject(), ErrorVerb::Write, error))
    }

    /// Deletes entries with index in `range`; with `purged`, records it as the last purged id in
    /// the same transaction.
    fn delete_blocking(
        &self,
        range: (Bound<u64>, Bound<u64>),
        purged: Option<LogId>,
    ) -> Result<(), StorageError> {
        let subject = || ErrorSubject::Logs;
        let transaction = self
            .inner
            .database
            .begin_write()
            .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
        {
            let mut table = transaction
                .open_table(LOG_TABLE)
                .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
            table
                .retain_in(range, |_, _| false)
                .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
            if let Some(log_id) = purged {
                let bytes = serde_json::to_vec(&log_id)
                    .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
                let mut meta = transaction
                    .open_table(META_TABLE)
                    .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
                meta.insert(LAST_PURGED_KEY, bytes.as_slice())
                    .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))?;
            }
        }
        transaction
            .commit()
            .map_err(|error| storage_error(subject(), ErrorVerb::Delete, error))
    }

    /// Runs a blocking storage call on tokio's blocking pool.
    async fn blocking<T, F>(&self, work: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&LogStore) -> Result<T, StorageError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|error| storage_error(ErrorSubject::Store, ErrorVerb::Write, error))?
    }
}

fn range_to_bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(end) => Some(end.saturating_add(1)),
        Bound::Excluded(end) => Some(*end),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = range_to_bounds(&range);
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        self.blocking(move |store| store.read_entries_blocking(start, end))
            .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.blocking(|store| {
            let last_purged_log_id: Option<LogId> = store.read_meta_blocking(LAST_PURGED_KEY)?;
            let last_log_id = store
                .last_entry_blocking()?
                .map(|entry| entry.log_id)
                .or(last_purged_log_id);
            Ok(LogState {
                last_purged_log_id,
                last_log_id,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let vote = *vote;
        self.blocking(move |store| {
            store.write_meta_blocking(VOTE_KEY, &vote, ErrorSubject::Vote, true)
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.blocking(|store| store.read_meta_blocking(VOTE_KEY))
            .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(log_id) = committed {
            self.inner
                .committed_index
                .fetch_max(log_id.index, Ordering::Relaxed);
        }
        self.blocking(move |store| {
            // The committed id only shortens replay after a restart; it may lag, so
            // it rides along with the next fsynced log write instead of its own fsync.
            store.write_meta_blocking(COMMITTED_KEY, &committed, ErrorSubject::Store, false)
        })
        .await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .blocking(|store| store.read_meta_blocking(COMMITTED_KEY))
            .await?;
        Ok(committed.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(|error| {
                storage_error(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, error)
            })?;
            encoded.push((entry.log_id.index, bytes));
        }
        let result = self
            .blocking(move |store| store.append_blocking(&encoded))
            .await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating raft log");
        self.blocking(move |store| {
            store.delete_blocking((Bound::Included(log_id.index), Bound::Unbounded), None)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "purging raft log");
        self.blocking(move |store| {
            store.delete_blocking(
                (Bound::Unbounded, Bound::Included(log_id.index)),
                Some(log_id),
            )
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader, Vote};

    use super::*;
    use crate::model::{Command, MetaRequest};

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(MetaRequest {
                now_ms: index,
                command: Command::AckGc {
                    object_keys: vec![format!("key-{index}")],
                },
            }),
        }
    }

    async fn append(store: &mut LogStore, entries: Vec<Entry>) {
        store.blocking_append(entries).await.expect("append");
    }

    #[tokio::test]
    async fn log_vote_and_purge_survive_a_reopen() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("raft-log.redb");
        {
            let mut store = LogStore::open(&path).expect("open");
            append(&mut store, (1..=10).map(|index| entry(1, index)).collect()).await;
            store.save_vote(&Vote::new(3, 2)).await.expect("vote");
            store
                .save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 8)))
                .await
                .expect("committed");
            store
                .truncate(LogId::new(CommittedLeaderId::new(1, 1), 9))
                .await
                .expect("truncate");
            store
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
                .await
                .expect("purge");
        }
        let mut reopened = LogStore::open(&path).expect("reopen");
        assert_eq!(
            reopened.read_vote().await.expect("vote"),
            Some(Vote::new(3, 2))
        );
        assert_eq!(reopened.committed_index(), 8);
        let state = reopened.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id.map(|log_id| log_id.index), Some(3));
        assert_eq!(state.last_log_id.map(|log_id| log_id.index), Some(8));
        let entries = reopened.try_get_log_entries(0..100).await.expect("read");
        let indexes: Vec<u64> = entries.iter().map(|entry| entry.log_id.index).collect();
        assert_eq!(indexes, (4..=8).collect::<Vec<u64>>());
        assert_eq!(entries[0], entry(1, 4));
    }
}
