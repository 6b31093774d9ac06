//! Single-flight fills: a miss marks its region `Filling` and fetches it with one
//! ranged GET outside the lock; other readers of that region wait on the fill's
//! signal and see its error if it fails. A failed fill leaves nothing behind: its
//! slot changes hands and goes back to the free list. A fill found damaged is
//! discarded (dropped from the index) so the next reader fetches it again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::bytes::RegionGuard;
use crate::error::{CacheError, CacheResult};
use crate::inner::{Fetching, Inner, ObjectIdentity, RegionKey};
use crate::metrics::{METRICS, ReadCounts};
use crate::slots::{Evict, Slot, SlotStatus, State};

/// The most bytes of neighbouring regions a query's fetch-ahead asks for in one
/// request (16 row regions; hot regions, 1 MiB and more, go one per request).
pub(crate) const FETCH_AHEAD_RUN_BYTES: usize = 1 << 20;

/// The outcome of one fill, shared with every reader waiting for it.
pub(crate) struct FillSignal {
    outcome: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

impl FillSignal {
    fn new() -> Self {
        FillSignal {
            outcome: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    fn finish(&self, outcome: Result<(), String>) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<(), String> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(result) = outcome.as_ref() {
                return result.clone();
            }
            outcome = self.done.wait(outcome).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Inner {
    /// Returns a pinned guard on region `region` of `object`, filling it on a miss.
    pub(crate) fn acquire(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
    ) -> CacheResult<RegionGuard<'_>> {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        loop {
            let mut state = self.lock();
            if let Some(&slot) = state.index.get(&key) {
                match &state.slots[slot].status {
                    SlotStatus::Ready => {
                        let guard = self.pin_locked(&state, slot);
                        drop(state);
                        self.touch(slot);
                        return Ok(guard);
                    }
                    SlotStatus::Filling(signal) => {
                        let signal = signal.clone();
                        drop(state);
                        let waiting = std::time::Instant::now();
                        let outcome = crate::waits::waiting_for_store(|| signal.wait());
                        ReadCounts::add_wait(waiting.elapsed());
                        match outcome {
                            Ok(()) => continue,
                            Err(message) => {
                                return Err(CacheError::Fill {
                                    key: object.key.clone(),
                                    region,
                                    message,
                                });
                            }
                        }
                    }
                    SlotStatus::Free => unreachable!("free regions are not in the index"),
                }
            }
            let (slot, signal) = self.claim_locked(&mut state, &key, Evict::AwaitedToo)?;
            drop(state);
            let start = key.region * self.region_bytes as u64;
            let end = (start + self.region_bytes as u64).min(key.object.size);
            let waiting = std::time::Instant::now();
            let fetched = self.get_range(&key.object.key, start..end);
            ReadCounts::add_wait(waiting.elapsed());
            return self.finish_fill(&key, slot, &signal, fetched);
        }
    }

    /// Claims (pins) the regions of `object` in `regions` that are neither
    /// cached nor being filled and sends their requests (`in_flight` at a
    /// time, neighbouring regions as one request of up to `max_run_bytes`);
    /// [`finish_fills`] waits for them (`None` when nothing was claimed), and
    /// how many of `regions` it left: it stops claiming, without error, once
    /// every slot is pinned or awaited by a read, and leaves the rest. `awaited`: the
    /// fills are for reads that follow (a query's), and are kept from
    /// eviction until then (see `SlotCounters::awaited`).
    pub(crate) fn start_fills(
        &self,
        object: &Arc<ObjectIdentity>,
        regions: &[u64],
        max_run_bytes: usize,
        in_flight: usize,
        awaited: bool,
    ) -> (Option<PendingFills<'_>>, usize) {
        let mut claimed = Vec::with_capacity(regions.len());
        let mut left = 0;
        for (position, &region) in regions.iter().enumerate() {
            let key = RegionKey {
                object: object.clone(),
                region,
            };
            let mut state = self.lock();
            if let Some(&slot) = state.index.get(&key) {
                // Filled (or being filled) by another reader: kept for this
                // one's read too, so this round's claims do not evict it.
                if awaited {
                    self.slot_counters[slot].await_read();
                }
                continue;
            }
            // A round never evicts what another query fetched ahead and has
            // not read: it stops, and its own reads fetch the rest later.
            match self.claim_locked(&mut state, &key, Evict::NotAwaited) {
                Ok((slot, signal)) => claimed.push((key, slot, signal)),
                Err(error) => {
                    tracing::debug!(key = %object.key, region, %error, "fetch ahead stopped");
                    left = regions.len() - position;
                    break;
                }
            }
        }
        if claimed.is_empty() {
            return (None, left);
        }
        // Neighbouring regions go out as one request (up to max_run_bytes):
        // a store charges, and a server spends, per request more than per byte,
        // and the rows a list's candidates need are often next to each other.
        claimed.sort_unstable_by_key(|(key, _, _)| key.region);
        let region_bytes = self.region_bytes as u64;
        let max_run = (max_run_bytes / self.region_bytes).max(1);
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for index in 0..claimed.len() {
            match runs.last_mut() {
                Some(run)
                    if claimed[index - 1].0.region + 1 == claimed[index].0.region
                        && run.len() < max_run =>
                {
                    run.end = index + 1
                }
                _ => runs.push(index..index + 1),
            }
        }
        let requests = runs
            .iter()
            .map(|run| {
                let start = claimed[run.start].0.region * region_bytes;
                let end = ((claimed[run.end - 1].0.region + 1) * region_bytes).min(object.size);
                start..end
            })
            .collect();
        let fetching = self.send_ranges(&object.key, requests, in_flight);
        let pending = PendingFills {
            inner: self,
            object: object.clone(),
            claimed,
            runs,
            fetching,
            awaited,
        };
        (Some(pending), left)
    }

    /// Takes a slot for `key` (not in the index): a free one or an evicted one,
    /// marked `Filling` and pinned for the caller, which must finish the fill
    /// ([`Self::finish_fill`]) whatever happens.
    fn claim_locked(
        &self,
        state: &mut MutexGuard<'_, State>,
        key: &RegionKey,
        evict: Evict,
    ) -> CacheResult<(usize, Arc<FillSignal>)> {
        let slot = match state.free.pop() {
            Some(slot) => slot,
            None => self.evict(state, evict)?,
        };
        let signal = Arc::new(FillSignal::new());
        state.slots[slot] = Slot {
            key: Some(key.clone()),
            status: SlotStatus::Filling(signal.clone()),
            length: 0,
        };
        let counters = &self.slot_counters[slot];
        counters.pins.fetch_add(1, Ordering::AcqRel);
        counters.frequency.store(1, Ordering::Relaxed);
        counters.awaited.store(0, Ordering::Relaxed);
        counters.verified.store(false, Ordering::Release);
        state.index.insert(key.clone(), slot);
        METRICS.fills_in_flight.inc();
        Ok((slot, signal))
    }

    /// Writes the bytes `fetched` for region `key` into `slot` (claimed by
    /// [`Self::claim_locked`]) and wakes the readers waiting on `signal`; on an
    /// error, gives the slot back.
    fn finish_fill<'a>(
        &'a self,
        key: &RegionKey,
        slot: usize,
        signal: &FillSignal,
        fetched: Result<bytes::Bytes, String>,
    ) -> CacheResult<RegionGuard<'a>> {
        self.counters.add(&self.counters.misses, &METRICS.misses, 1);
        let object = &key.object;
        let start = key.region * self.region_bytes as u64;
        let end = (start + self.region_bytes as u64).min(object.size);
        let fetched = fetched.and_then(|bytes| {
            // The store checks short reads; a wrong length here would write
            // past the region, so it is refused rather than trusted.
            if bytes.len() as u64 != end - start {
                return Err(format!(
                    "the store returned {} bytes for the {} bytes asked for",
                    bytes.len(),
                    end - start
                ));
            }
            // This slot is Filling and owned by this call alone: it was free
            // or evicted with no pins, and readers of its key wait for the
            // signal, so nothing reads the region while it is written.
            self.write_region(slot, &bytes)
                .map_err(|error| format!("cannot write the cache file: {error}"))?;
            Ok(bytes.len())
        });
        METRICS.fills_in_flight.dec();
        let counters = &self.slot_counters[slot];
        match fetched {
            Ok(length) => {
                counters.length.store(length, Ordering::Release);
                let mut state = self.lock();
                state.slots[slot].status = SlotStatus::Ready;
                state.slots[slot].length = length;
                state.resident += 1;
                // Read under the lock: a discard (which bumps it) needs the lock
                // and a Ready slot, so this is the generation of this very fill.
                let generation = counters.generation.load(Ordering::Acquire);
                state.update_gauges(self.tier);
                drop(state);
                self.counters.add(
                    &self.counters.bytes_fetched,
                    &METRICS.bytes_fetched,
                    length as u64,
                );
                ReadCounts::add_miss(length as u64, self.is_row_tier());
                signal.finish(Ok(()));
                self.decay_after_fill();
                Ok(RegionGuard::pinned(self, slot, length, generation, true))
            }
            Err(message) => {
                // Nothing of a failed fill stays: the slot changes hands and goes back
                // to the free list.
                let mut state = self.lock();
                state.index.remove(key);
                state.slots[slot] = Slot::free();
                counters.generation.fetch_add(1, Ordering::AcqRel);
                counters.pins.fetch_sub(1, Ordering::AcqRel);
                state.free.push(slot);
                drop(state);
                self.counters
                    .add(&self.counters.fill_errors, &METRICS.fill_errors, 1);
                signal.finish(Err(message.clone()));
                Err(CacheError::Fill {
                    key: object.key.clone(),
                    region: key.region,
                    message,
                })
            }
        }
    }

    /// Drops region `region` of `object` from the index (its bytes were found
    /// damaged): the next reader fetches it again; the old slot is recycled once
    /// its readers are gone, and sessions still holding it get an error.
    pub(crate) fn discard(&self, object: &Arc<ObjectIdentity>, region: u64) {
        self.discard_fill(object, region, None);
    }

    /// Like [`Inner::discard`], but when `fill` (slot, generation) is given, only if
    /// the region is still that fill (a newer fill was not found damaged).
    pub(crate) fn discard_fill(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
        fill: Option<(usize, u64)>,
    ) {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        let mut state = self.lock();
        let Some(&slot) = state.index.get(&key) else {
            return;
        };
        if !matches!(state.slots[slot].status, SlotStatus::Ready) {
            return;
        }
        let counters = &self.slot_counters[slot];
        if fill.is_some_and(|(expected_slot, generation)| {
            expected_slot != slot || counters.generation.load(Ordering::Acquire) != generation
        }) {
            return;
        }
        state.index.remove(&key);
        counters.discarded.store(true, Ordering::Release);
        counters.generation.fetch_add(1, Ordering::AcqRel);
        counters.frequency.store(0, Ordering::Relaxed);
        drop(state);
        self.counters
            .add(&self.counters.discards, &METRICS.discards, 1);
        tracing::warn!(key = %object.key, region, "cached region failed its checksum; dropped, to be fetched again");
    }
}

/// Regions of one object claimed by [`Inner::start_fills`], their requests
/// sent: [`finish_fills`] waits for them, writes them and releases them.
pub(crate) struct PendingFills<'a> {
    inner: &'a Inner,
    object: Arc<ObjectIdentity>,
    claimed: Vec<(RegionKey, usize, Arc<FillSignal>)>,
    runs: Vec<std::ops::Range<usize>>,
    fetching: Fetching,
    awaited: bool,
}

impl PendingFills<'_> {
    /// Writes the fetched runs into their regions and releases them (the
    /// reads that want them pin them again); a failed run's regions are given
    /// back, and their readers fetch them again.
    fn complete(self, fetched: Vec<Result<bytes::Bytes, String>>) {
        let PendingFills {
            inner,
            object,
            claimed,
            runs,
            awaited,
            ..
        } = self;
        let region_bytes = inner.region_bytes as u64;
        for (run, fetched) in runs.into_iter().zip(fetched) {
            for (key, slot, signal) in &claimed[run.clone()] {
                let part = fetched.as_ref().map_err(Clone::clone).and_then(|bytes| {
                    let offset =
                        ((key.region - claimed[run.start].0.region) * region_bytes) as usize;
                    let end = (offset + inner.region_bytes).min(bytes.len());
                    if offset >= end {
                        return Err(format!(
                            "the store returned {} bytes for {} regions",
                            bytes.len(),
                            run.len()
                        ));
                    }
                    Ok(bytes.slice(offset..end))
                });
                match inner.finish_fill(key, *slot, signal, part) {
                    // Marked while still pinned: no eviction can take it first.
                    Ok(_pinned) if awaited => inner.slot_counters[*slot].await_read(),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(key = %object.key, region = key.region, %error, "fetch ahead failed")
                    }
                }
            }
        }
    }
}

/// Waits once for every fill of `pending` (their requests all in flight
/// together, whatever objects and tiers they are of), then writes and releases
/// them: a round of fetch-ahead costs its caller one wait for the store.
pub(crate) fn finish_fills(pending: Vec<PendingFills<'_>>) {
    if pending.is_empty() {
        return;
    }
    let waiting = std::time::Instant::now();
    let fetched: Vec<_> = crate::waits::waiting_for_store(|| {
        pending
            .iter()
            .map(|pending| pending.fetching.receive())
            .collect()
    });
    ReadCounts::add_wait(waiting.elapsed());
    for (pending, fetched) in pending.into_iter().zip(fetched) {
        pending.complete(fetched);
    }
}
