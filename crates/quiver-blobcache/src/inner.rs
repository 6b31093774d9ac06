//! The state every handle of one cache shares ([`Inner`], behind an `Arc`): the
//! object store, the mapped cache file, the region table and its lock-free
//! counters. Each concept adds its own `impl Inner` in its own file: slots and
//! eviction (`slots.rs`), fills (`fill.rs`), checks (`verify.rs`), reads that
//! bypass the file (`read_through.rs`).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use quiver_storage::Storage;
use tokio::runtime::Handle;

use crate::cache_file::CacheFile;
use crate::metrics::{Counters, METRICS};
use crate::read_through::CheckedChunks;
use crate::slots::{SlotCounters, State};

/// What identifies an object's bytes: a changed object (size or version) is a
/// different identity, so it is never served from the old one's regions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ObjectIdentity {
    pub(crate) key: String,
    pub(crate) size: u64,
    pub(crate) version: Option<String>,
}

/// One aligned region of one object: the key of the region table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RegionKey {
    pub(crate) object: Arc<ObjectIdentity>,
    pub(crate) region: u64,
}

/// The tier of codes, centroids, ids and everything else.
pub(crate) const HOT_TIER: &str = "hot";
/// The tier of raw vectors and payloads.
pub(crate) const ROW_TIER: &str = "rows";

pub(crate) struct Inner {
    pub(crate) storage: Storage,
    pub(crate) runtime: Handle,
    /// Which tier this is ("hot" or "rows"), for the metrics.
    pub(crate) tier: &'static str,
    /// The mapped cache file; `None` in read-through mode (no file could be made).
    pub(crate) file: Option<CacheFile>,
    pub(crate) region_bytes: usize,
    /// `log2(region_bytes)` when it is a power of two (the default is).
    pub(crate) region_shift: Option<u32>,
    /// The region table; never held across I/O.
    pub(crate) state: Mutex<State>,
    /// The lock-free part of each slot, by slot index.
    pub(crate) slot_counters: Vec<SlotCounters>,
    /// Fills so far (drives the frequency decay).
    pub(crate) fills: AtomicU64,
    /// Hits already added to the process-wide metric.
    pub(crate) exported_hits: AtomicU64,
    pub(crate) counters: Counters,
    /// Chunks read around the regions (read-through mode, or reads made while
    /// every region was pinned), fetched whole and checked, kept in memory
    /// (bounded) so that the many small reads of a query do not each fetch and
    /// check a whole chunk again.
    pub(crate) verified_chunks: CheckedChunks,
    /// Objects of a `file://` store are mapped from their files, not cached.
    pub(crate) map_local_files: bool,
}

impl Inner {
    /// Returns true for the row tier.
    #[inline]
    pub(crate) fn is_row_tier(&self) -> bool {
        self.tier == ROW_TIER
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `future` (an object-store call) to completion from synchronous code.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        crate::waits::waiting_for_store(|| match Handle::try_current() {
            // Inside a multi-thread runtime: let the scheduler move other tasks away.
            Ok(_) => tokio::task::block_in_place(|| self.runtime.block_on(future)),
            Err(_) => self.runtime.block_on(future),
        })
    }

    /// Fetches `range` of `key` from the object store for synchronous code: the
    /// request runs as a task on the runtime (its connection's reads and the
    /// body's chunks stay on the runtime's threads), and the caller sleeps once
    /// until the bytes are in. Polling the request from the calling thread instead
    /// woke that thread for every chunk the socket delivered: ~9 context switches
    /// per 64 KiB fill, most of a cold query's CPU (perf, docs/architecture.md).
    pub(crate) fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, String> {
        self.get_ranges(key, vec![range], 1)
            .pop()
            .expect("one result per request")
    }

    /// Fetches the ranges `requests` of `key`, `in_flight` at a time, in one task
    /// on the runtime; the caller sleeps once until every one is in. The results
    /// come in the order of `requests`.
    pub(crate) fn get_ranges(
        &self,
        key: &str,
        requests: Vec<Range<u64>>,
        in_flight: usize,
    ) -> Vec<Result<Bytes, String>> {
        let fetching = self.send_ranges(key, requests, in_flight);
        crate::waits::waiting_for_store(|| fetching.receive())
    }

    /// Sends the requests for the ranges `requests` of `key`, `in_flight` at a
    /// time, in one task on the runtime, and returns at once: the caller
    /// receives the results (in the order of `requests`) when it needs them,
    /// so several objects' requests can be in flight while it waits once.
    pub(crate) fn send_ranges(
        &self,
        key: &str,
        requests: Vec<Range<u64>>,
        in_flight: usize,
    ) -> Fetching {
        let count = requests.len();
        let storage = self.storage.clone();
        let owned_key = key.to_owned();
        let (done, result) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let fetches = requests
                .into_iter()
                .map(|range| storage.get_range(&owned_key, range));
            use futures_util::StreamExt;
            let fetched: Vec<_> = futures_util::stream::iter(fetches)
                .buffered(in_flight.max(1))
                .collect()
                .await;
            let _ = done.send(
                fetched
                    .into_iter()
                    .map(|fetched| fetched.map_err(|error| error.to_string()))
                    .collect::<Vec<_>>(),
            );
        });
        Fetching {
            key: key.to_owned(),
            count,
            result,
        }
    }

    /// Tells whether reads go straight to the object store (no cache file).
    #[inline]
    pub(crate) fn is_read_through(&self) -> bool {
        self.file.is_none()
    }

    /// Returns the region of the object that `offset` lies in.
    #[inline]
    pub(crate) fn region_of(&self, offset: u64) -> u64 {
        match self.region_shift {
            Some(shift) => offset >> shift,
            None => offset / self.region_bytes as u64,
        }
    }

    /// Returns the first byte of `slot`'s region in the mapping.
    #[inline]
    pub(crate) fn region_pointer(&self, slot: usize) -> *const u8 {
        self.file
            .as_ref()
            .expect("slots exist only when the cache file is mapped")
            .region_pointer(slot, self.region_bytes)
    }

    /// Writes a fill's bytes into `slot`'s region (see [`CacheFile::write_region`]).
    pub(crate) fn write_region(&self, slot: usize, bytes: &[u8]) -> std::io::Result<()> {
        self.file
            .as_ref()
            .expect("slots exist only when the cache file is mapped")
            .write_region(slot, self.region_bytes, bytes)
    }

    /// Moves the hit count into the process-wide metric (done on fills and on
    /// `stats()`, not on every hit).
    pub(crate) fn export_hits(&self) {
        let hits = self.counters.hits.load(Ordering::Relaxed);
        let exported = self.exported_hits.swap(hits, Ordering::Relaxed);
        METRICS.hits.inc_by(hits.saturating_sub(exported));
    }
}

/// Requests sent by [`Inner::send_ranges`], their results not received yet.
pub(crate) struct Fetching {
    key: String,
    count: usize,
    result: std::sync::mpsc::Receiver<Vec<Result<Bytes, String>>>,
}

impl Fetching {
    /// Sleeps until every result is in (giving the core back inside a tokio
    /// runtime) and returns them, in the order of the requests. The caller
    /// tells the thread's store-wait observer (`waits::waiting_for_store`).
    pub(crate) fn receive(&self) -> Vec<Result<Bytes, String>> {
        let received = match Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| self.result.recv()),
            Err(_) => self.result.recv(),
        };
        received.unwrap_or_else(|_| {
            let message = format!("the runtime shut down while {} was being read", self.key);
            vec![Err(message); self.count]
        })
    }
}
