//! Region slots, pins and LFU eviction.
//!
//! One mutex guards the region table (index, states, keys); it is never held
//! across I/O. Pin counts, frequencies and generations are atomics beside the
//! table, so a hit takes no lock: an object remembers which slot (and generation)
//! holds each of its regions, a reader pins that slot and checks the generation is
//! unchanged. Eviction claims a slot by swapping its pin count from 0 to an
//! `EVICTING` mark under the lock, so a reader either pinned first (and the slot is
//! not evicted) or sees the mark and takes the slow path. Region memory is written
//! only while `Filling` (by the one filler) and read only while pinned `Ready` — so
//! a slice handed to a reader never changes under it.
//!
//! Eviction is sampled LFU with decay: a victim is the least frequently used of
//! the next [`EVICTION_SAMPLE`] evictable regions after a clock hand (all of them
//! in a small cache), so an eviction costs the same in a cache of a thousand
//! regions and of a million. Every access bumps a slot's frequency, and every
//! time as many fills as there are regions have happened, all frequencies halve,
//! so old popularity fades. Regions a query fetched ahead (or found resident
//! when it did) and has not read yet are awaited: passed over while anything
//! else can go, until read or until the second halving after (one halving
//! could come at any time, even right after the fill).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::bytes::RegionGuard;
use crate::error::{CacheError, CacheResult};
use crate::fill::FillSignal;
use crate::inner::{Inner, ObjectIdentity, RegionKey};
use crate::metrics::{METRICS, ReadCounts};

/// Bits of a remembered region location that hold the slot index.
/// Whether an eviction may take a region a query fetched ahead and has not
/// read yet (`SlotCounters::awaited`) when nothing else can go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Evict {
    /// For a read: it must make progress, so it takes one when nothing else is.
    AwaitedToo,
    /// For a fetch ahead (a round, a warm-up): it stops claiming instead.
    NotAwaited,
}

const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// The most slots a cache may have (a remembered location holds 24 bits of slot).
pub(crate) const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// Evictable regions compared to choose one victim.
pub(crate) const EVICTION_SAMPLE: usize = 32;

/// Set in a slot's pin count while the slot is being evicted.
const EVICTING: u32 = 1 << 31;

/// Returns the remembered location of a fill: `(generation << 24 | slot) + 1`
/// (0 means "not known").
#[inline]
pub(crate) fn remembered_location(slot: usize, generation: u64) -> u64 {
    ((generation << SLOT_BITS) | slot as u64) + 1
}

/// Returns the (slot, generation) of a remembered location, `None` for "not known".
#[inline]
pub(crate) fn remembered_fill(location: u64) -> Option<(usize, u64)> {
    let location = location.checked_sub(1)?;
    Some(((location & SLOT_MASK) as usize, location >> SLOT_BITS))
}

pub(crate) enum SlotStatus {
    Free,
    Filling(Arc<FillSignal>),
    Ready,
}

pub(crate) struct Slot {
    pub(crate) key: Option<RegionKey>,
    pub(crate) status: SlotStatus,
    /// Valid bytes (the last region of an object is shorter).
    pub(crate) length: usize,
}

impl Slot {
    pub(crate) fn free() -> Self {
        Slot {
            key: None,
            status: SlotStatus::Free,
            length: 0,
        }
    }
}

/// The lock-free part of a slot.
#[derive(Default)]
pub(crate) struct SlotCounters {
    /// Readers holding the region (plus `EVICTING` while it is being recycled).
    pub(crate) pins: AtomicU32,
    /// Accesses, halved every few passes over the table (LFU with decay).
    pub(crate) frequency: AtomicU32,
    /// Bumped whenever the slot changes hands, so a remembered slot can be checked.
    pub(crate) generation: AtomicU64,
    /// Valid bytes while Ready (mirrors the table, for the lock-free path).
    pub(crate) length: AtomicUsize,
    /// Set when a reader found the region's bytes damaged: the slot left the
    /// index, and sessions still holding it refuse to read from it.
    pub(crate) discarded: AtomicBool,
    /// Set once the current fill passed its object's chunk checksums; cleared
    /// whenever the slot changes hands, so every fill is checked anew.
    pub(crate) verified: AtomicBool,
    /// Non-zero while a query that fetched the region ahead (or found it
    /// resident when it did) has not read it yet: an eviction takes it only
    /// when every region of its sample is awaited too (and a fetch ahead
    /// never does). Cleared by the read and when the slot changes hands;
    /// counted down by each decay pass, so a query that never reads it does
    /// not protect it for long — two passes, as one may come right after the
    /// fill: with 8 cold queries at once over a 512-region tier, a pass came
    /// every ~0.3 s, about as often as a query's search, and cleared half the
    /// marks before their reads. Without it, a fetch-ahead's
    /// fresh fills — used once, the least frequent regions there are — were
    /// the first pick of the next eviction whose sample reached them: over a
    /// 512-region row tier (a sample of 32, so the hand laps it every 16
    /// evictions) one miss among a run's reads evicted another of the run's
    /// rows, whose read then missed and evicted the next, and the slowest
    /// cold queries fetched ~40 rows twice, one round trip each.
    pub(crate) awaited: AtomicU8,
}

/// Decay passes a region stays awaited for (see `SlotCounters::awaited`).
const AWAITED_PASSES: u8 = 2;

impl SlotCounters {
    /// Marks the region awaited by a read to come.
    pub(crate) fn await_read(&self) {
        if self.awaited.load(Ordering::Relaxed) != AWAITED_PASSES {
            self.awaited.store(AWAITED_PASSES, Ordering::Relaxed);
        }
    }

    /// Whether a read to come awaits the region.
    pub(crate) fn is_awaited(&self) -> bool {
        self.awaited.load(Ordering::Relaxed) != 0
    }

    /// The region is read, or changes hands: no read awaits it any more.
    pub(crate) fn clear_awaited(&self) {
        if self.is_awaited() {
            self.awaited.store(0, Ordering::Relaxed);
        }
    }
}

/// The region table, behind [`Inner::state`].
pub(crate) struct State {
    pub(crate) index: HashMap<RegionKey, usize>,
    pub(crate) slots: Vec<Slot>,
    pub(crate) free: Vec<usize>,
    pub(crate) resident: u64,
    /// Where the next eviction starts looking.
    pub(crate) hand: usize,
}

impl State {
    /// Returns a table of `regions` free slots.
    pub(crate) fn with_free_slots(regions: usize) -> State {
        State {
            index: HashMap::with_capacity(regions),
            slots: (0..regions).map(|_| Slot::free()).collect(),
            free: (0..regions).rev().collect(),
            resident: 0,
            hand: 0,
        }
    }

    pub(crate) fn update_gauges(&self, tier: &str) {
        METRICS
            .resident_regions
            .with_label_values(&[tier])
            .set(self.resident as i64);
    }
}

impl Inner {
    /// Releases one pin of `slot`.
    #[inline]
    pub(crate) fn unpin(&self, slot: usize) {
        self.slot_counters[slot].pins.fetch_sub(1, Ordering::AcqRel);
    }

    /// Returns how many regions readers hold right now.
    pub(crate) fn pinned_regions(&self) -> u64 {
        self.slot_counters
            .iter()
            .filter(|counters| {
                let pins = counters.pins.load(Ordering::Acquire);
                pins & !EVICTING > 0
            })
            .count() as u64
    }

    /// Counts an access of `slot` (a hit).
    #[inline]
    pub(crate) fn touch(&self, slot: usize) {
        // A plain load and store, not a locked add: a lost increment under a race
        // only blurs the popularity estimate, and the hit path stays cheap.
        let counters = &self.slot_counters[slot];
        counters.frequency.store(
            counters.frequency.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        counters.clear_awaited();
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        ReadCounts::add_hit(self.is_row_tier());
    }

    /// Counts a fill and, every time as many fills as there are regions have
    /// happened, halves every frequency (LFU with decay: old popularity fades).
    pub(crate) fn decay_after_fill(&self) {
        let fills = self.fills.fetch_add(1, Ordering::Relaxed) + 1;
        if fills.is_multiple_of(self.slot_counters.len() as u64) {
            for counters in &self.slot_counters {
                let frequency = counters.frequency.load(Ordering::Relaxed);
                counters.frequency.store(frequency / 2, Ordering::Relaxed);
                let awaited = counters.awaited.load(Ordering::Relaxed);
                if awaited != 0 {
                    counters.awaited.store(awaited - 1, Ordering::Relaxed);
                }
            }
        }
        self.export_hits();
    }

    /// Pins `slot` if it still holds the fill of `generation`; the lock-free hit path.
    #[inline]
    pub(crate) fn try_pin(&self, slot: usize, generation: u64) -> Option<RegionGuard<'_>> {
        let counters = &self.slot_counters[slot];
        let previous = counters.pins.fetch_add(1, Ordering::AcqRel);
        if previous & EVICTING != 0 || counters.generation.load(Ordering::Acquire) != generation {
            counters.pins.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.touch(slot);
        let length = counters.length.load(Ordering::Acquire);
        Some(RegionGuard::pinned(self, slot, length, generation, false))
    }

    /// Pins the ready `slot` under the table lock (nobody evicts meanwhile, so the
    /// pin always holds); returns the guard, without counting an access.
    pub(crate) fn pin_locked(&self, _state: &State, slot: usize) -> RegionGuard<'_> {
        let counters = &self.slot_counters[slot];
        counters.pins.fetch_add(1, Ordering::AcqRel);
        let generation = counters.generation.load(Ordering::Acquire);
        let length = counters.length.load(Ordering::Acquire);
        RegionGuard::pinned(self, slot, length, generation, false)
    }

    /// Pins region `region` of `object` if it is cached and ready, without filling
    /// it or counting an access (a look at a neighbour of a region being checked).
    pub(crate) fn pin_resident(
        &self,
        object: &Arc<ObjectIdentity>,
        region: u64,
    ) -> Option<RegionGuard<'_>> {
        let key = RegionKey {
            object: object.clone(),
            region,
        };
        let state = self.lock();
        let &slot = state.index.get(&key)?;
        if !matches!(state.slots[slot].status, SlotStatus::Ready) {
            return None;
        }
        Some(self.pin_locked(&state, slot))
    }

    /// Picks the least frequently used of the next [`EVICTION_SAMPLE`] unpinned
    /// ready regions after the clock hand that no read awaits
    /// (`SlotCounters::awaited`), claims it and frees it; looks further when a
    /// reader pinned the pick meanwhile. An awaited region is taken only when
    /// the whole table holds nothing else, and only for a read
    /// (`Evict::AwaitedToo`): a fetch ahead stops there instead, so a round
    /// never evicts the fresh rows of another query's round. The eviction fails
    /// when no region of it may be evicted.
    pub(crate) fn evict(&self, state: &mut State, evict: Evict) -> CacheResult<usize> {
        let slots = state.slots.len();
        let mut looked_at = 0;
        // The least used awaited region seen: the pick when nothing else is.
        let mut awaited: Option<(u32, usize)> = None;
        while looked_at < slots {
            let mut best: Option<(u32, usize)> = None;
            let mut sampled = 0;
            while sampled < EVICTION_SAMPLE && looked_at < slots {
                let index = state.hand;
                state.hand = (state.hand + 1) % slots;
                looked_at += 1;
                let counters = &self.slot_counters[index];
                if !matches!(state.slots[index].status, SlotStatus::Ready)
                    || counters.pins.load(Ordering::Acquire) != 0
                {
                    continue;
                }
                let frequency = counters.frequency.load(Ordering::Relaxed);
                if counters.is_awaited() {
                    if awaited.is_none_or(|(lowest, _)| frequency < lowest) {
                        awaited = Some((frequency, index));
                    }
                    continue;
                }
                sampled += 1;
                if best.is_none_or(|(lowest, _)| frequency < lowest) {
                    best = Some((frequency, index));
                }
            }
            let took_awaited = best.is_none();
            let Some((_, victim)) = best.or_else(|| match evict {
                Evict::AwaitedToo => awaited.take(),
                Evict::NotAwaited => None,
            }) else {
                break;
            };
            if self.claim(state, victim) {
                if took_awaited {
                    self.counters.add(
                        &self.counters.awaited_evictions,
                        &METRICS.awaited_evictions,
                        1,
                    );
                }
                return Ok(victim);
            }
        }
        Err(CacheError::Full {
            regions: state.slots.len(),
        })
    }

    /// Claims the unpinned ready `victim` and frees it; false when a lock-free
    /// reader pinned it first.
    fn claim(&self, state: &mut State, victim: usize) -> bool {
        let counters = &self.slot_counters[victim];
        if counters
            .pins
            .compare_exchange(0, EVICTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        counters.generation.fetch_add(1, Ordering::AcqRel);
        counters.frequency.store(0, Ordering::Relaxed);
        counters.awaited.store(0, Ordering::Relaxed);
        counters.discarded.store(false, Ordering::Release);
        counters.verified.store(false, Ordering::Release);
        // A discarded slot left the index already; its key may name a newer fill.
        if let Some(key) = state.slots[victim].key.take()
            && state.index.get(&key) == Some(&victim)
        {
            state.index.remove(&key);
        }
        state.slots[victim] = Slot::free();
        state.resident -= 1;
        // Readers that bumped the count while it was marked undo their own bump.
        counters.pins.fetch_sub(EVICTING, Ordering::AcqRel);
        self.counters
            .add(&self.counters.evictions, &METRICS.evictions, 1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_location_round_trips_and_zero_is_unknown() {
        assert_eq!(remembered_fill(0), None);
        for (slot, generation) in [(0, 0), (5, 1), (MAX_SLOTS - 1, 12345)] {
            let location = remembered_location(slot, generation);
            assert_ne!(location, 0);
            assert_eq!(remembered_fill(location), Some((slot, generation)));
        }
    }
}
