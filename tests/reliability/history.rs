//! The record of everything the workload did and saw: per id the writes in the
//! order they were issued (one writer per id, one write at a time), each
//! acknowledged, unknown (the request failed: it may or may not have been
//! applied) or still in flight; every strong read and search with what it saw;
//! and the faults injected. The checker works on this record.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use quiver_common::hash::splitmix64;

/// The deterministic vector of `id` at `version`: values in [-1, 1), different
/// for every (id, version), so a read names the write it sees.
pub fn vector(id: u64, version: u32, dimension: usize) -> Vec<f32> {
    let mut state = id
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(version).wrapping_mul(0xD1B5_4A32_D192_ED03))
        ^ 0x2545_F491_4F6C_DD1D;
    (0..dimension)
        .map(|_| {
            // The splitmix64 sequence from `state`.
            let mixed = splitmix64(state);
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            (mixed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Tells whether two vectors are the same (up to JSON float round trips).
pub fn same_vector(left: &[f32], right: &[f32]) -> bool {
    left.len() == right.len()
        && left
            .iter()
            .zip(right)
            .all(|(a, b)| (a - b).abs() <= 1e-6 * a.abs().max(1.0))
}

/// A write of one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    Upsert { version: u32 },
    Delete,
}

/// What became of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    InFlight,
    Acknowledged,
    /// The request failed; the write may or may not have been applied.
    Unknown,
}

/// One write of one id.
#[derive(Clone, Debug)]
pub struct Write {
    pub kind: WriteKind,
    pub invoked: Instant,
    pub completed: Option<Instant>,
    pub outcome: Outcome,
}

/// What a strong read saw of one id.
#[derive(Clone, Debug)]
pub enum Seen {
    Absent,
    Vector(Vec<f32>),
}

/// One id as seen by one strong read (a get, a search hit, or a check).
#[derive(Clone, Debug)]
pub struct Observation {
    pub id: u64,
    pub started: Instant,
    pub finished: Instant,
    pub seen: Seen,
}

/// A strong exact-vector search for the vector of `(id, version)`.
#[derive(Clone, Debug)]
pub struct SearchRecord {
    pub id: u64,
    pub version: u32,
    pub started: Instant,
    pub finished: Instant,
    pub hit_ids: Vec<u64>,
}

/// A fault and when it was injected.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: String,
    pub at: Instant,
}

/// When requests failed or succeeded (for unavailability windows).
#[derive(Clone, Copy, Debug)]
pub struct Attempt {
    pub is_write: bool,
    pub started: Instant,
    pub finished: Instant,
    pub ok: bool,
}

#[derive(Default)]
struct Inner {
    writes: HashMap<u64, Vec<Write>>,
    observations: Vec<Observation>,
    searches: Vec<SearchRecord>,
    faults: Vec<Fault>,
    attempts: Vec<Attempt>,
}

/// The shared record (cheap to lock: appends only).
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

/// A handle on writes just issued: `(id, index in the id's list)`.
pub type WriteHandles = Vec<(u64, usize)>;

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records writes about to be sent (one request); returns their handles.
    pub fn invoke(&self, writes: &[(u64, WriteKind)], at: Instant) -> WriteHandles {
        let mut inner = self.lock();
        writes
            .iter()
            .map(|(id, kind)| {
                let list = inner.writes.entry(*id).or_default();
                debug_assert!(
                    list.last()
                        .is_none_or(|write| write.outcome != Outcome::InFlight),
                    "one write of an id at a time"
                );
                list.push(Write {
                    kind: *kind,
                    invoked: at,
                    completed: None,
                    outcome: Outcome::InFlight,
                });
                (*id, list.len() - 1)
            })
            .collect()
    }

    /// Records the end of a request's writes.
    pub fn complete(&self, handles: &WriteHandles, acknowledged: bool, at: Instant) {
        let mut inner = self.lock();
        for (id, index) in handles {
            let write = &mut inner.writes.get_mut(id).expect("invoked")[*index];
            write.completed = Some(at);
            write.outcome = if acknowledged {
                Outcome::Acknowledged
            } else {
                Outcome::Unknown
            };
        }
    }

    pub fn observe(&self, observations: Vec<Observation>) {
        self.lock().observations.extend(observations);
    }

    pub fn searched(&self, search: SearchRecord) {
        self.lock().searches.push(search);
    }

    pub fn attempt(&self, attempt: Attempt) {
        self.lock().attempts.push(attempt);
    }

    /// Records a fault injected now; returns its time.
    pub fn fault(&self, kind: &str) -> Instant {
        let at = Instant::now();
        self.lock().faults.push(Fault {
            kind: kind.to_string(),
            at,
        });
        at
    }

    /// Returns the newest upsert version issued for `id`, if any.
    pub fn latest_version(&self, id: u64) -> Option<u32> {
        let inner = self.lock();
        inner
            .writes
            .get(&id)?
            .iter()
            .rev()
            .find_map(|write| match write.kind {
                WriteKind::Upsert { version } => Some(version),
                WriteKind::Delete => None,
            })
    }

    /// Tells whether a write started at or after `since` was acknowledged and a
    /// strong read started at or after `since` succeeded.
    pub fn recovered_since(&self, since: Instant) -> bool {
        let inner = self.lock();
        let ok = |is_write: bool| {
            inner.attempts.iter().any(|attempt| {
                attempt.is_write == is_write && attempt.ok && attempt.started >= since
            })
        };
        ok(true) && ok(false)
    }

    /// Returns a copy of the record.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            writes: inner.writes.clone(),
            observations: inner.observations.clone(),
            searches: inner.searches.clone(),
            faults: inner.faults.clone(),
            attempts: inner.attempts.clone(),
        }
    }
}

/// A copy of the record at one moment.
pub struct Snapshot {
    pub writes: HashMap<u64, Vec<Write>>,
    pub observations: Vec<Observation>,
    pub searches: Vec<SearchRecord>,
    pub faults: Vec<Fault>,
    pub attempts: Vec<Attempt>,
}
