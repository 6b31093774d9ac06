//! One shard's writer: group commit into WAL objects, L0 flushes with deletion
//! bitmaps, tiered merges, and the replay that makes a takeover lose nothing.
//!
//! Durability: a write is acknowledged only after its WAL object is in object
//! storage *and* the metadata service has appended it to the shard's WAL tail
//! under this writer's lease epoch. Everything else (flushes, merges) only moves
//! acknowledged rows from the WAL tail into segments, one atomic manifest change
//! at a time, so a crash at any point loses nothing: the next writer rebuilds its
//! state from the manifest and replays the tail.
//!
//! The modules, one concept each: `writer` is the API ([`ShardWriter`]:
//! open, validate and write, flush, compact, close); `recovery` rebuilds a
//! writer's state from the manifest and the WAL tail (takeover, resync) and
//! settles commits whose outcome was lost; `commit` is the group commit of
//! writes into WAL objects; `flush` moves committed writes into L0 segments and
//! deletion bitmaps; `merge` runs the tiered merges and the admin compaction;
//! `recalibrate` calibrates the codebook's probes again over its grown group.
//! This file holds the state they share.

mod commit;
mod flush;
mod merge;
mod recalibrate;
mod recovery;
mod writer;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use quiver_index::SegmentSpec;
use quiver_storage::Storage;
use tokio::sync::Notify;

use crate::catalog::{Catalog, CatalogError, ShardRef, WalPosition};
use crate::config::IndexerConfig;
use crate::error::{IndexerError, IndexerResult};
use crate::memtable::Memtable;
use crate::metrics::METRICS;
use crate::segments::ShardIndex;

pub use writer::{ShardStats, ShardWriter};

struct ShardState {
    /// Committed writes not being flushed.
    active: Memtable,
    /// Ids in the flush under way (they still count against backpressure).
    flushing_rows: usize,
    /// Memory of the flush under way ([`Memtable::bytes`]).
    flushing_bytes: usize,
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
    /// A recalibration of the codebook's group is running (`recalibrate`).
    recalibrating: std::sync::atomic::AtomicBool,
    /// After a failed recalibration, none starts before this.
    recalibrate_not_before: Mutex<Option<std::time::Instant>>,
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
