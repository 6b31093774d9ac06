//! Committed writes not yet in a segment, newest per id.

use std::collections::{BTreeSet, HashMap};

use quiver_index::PointId;
use quiver_storage::{WalBatch, WalRecord};

use crate::catalog::WalPosition;

/// The latest committed operation on one id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PendingOp {
    /// The point's new vector and payload (JSON bytes, empty for none).
    Upsert { vector: Vec<f32>, payload: Vec<u8> },
    /// The point was deleted.
    Delete,
}

/// Committed, unflushed writes of one shard: one entry per id (the newest), plus
/// which WAL batches they came from.
#[derive(Clone, Debug, Default)]
pub(crate) struct Memtable {
    ops: HashMap<PointId, (WalPosition, PendingOp)>,
    positions: BTreeSet<WalPosition>,
    /// About the memory the held operations take ([`PendingOp::bytes`]).
    bytes: usize,
}

impl PendingOp {
    /// About the memory one held operation takes: its vector and payload,
    /// plus the id and the map's entry.
    pub fn bytes(&self) -> usize {
        const ENTRY_BYTES: usize = 96;
        match self {
            PendingOp::Upsert { vector, payload } => ENTRY_BYTES + vector.len() * 4 + payload.len(),
            PendingOp::Delete => ENTRY_BYTES,
        }
    }
}

impl Memtable {
    /// Applies every record of a committed batch; a record older than what is
    /// already held for its id (a batch replayed late) changes nothing.
    pub fn apply_batch(&mut self, position: WalPosition, batch: WalBatch) {
        if !self.positions.insert(position) {
            return;
        }
        for record in batch.records {
            let (id, op) = match record {
                WalRecord::Upsert {
                    id,
                    vector,
                    payload,
                } => (id, PendingOp::Upsert { vector, payload }),
                WalRecord::Delete { id } => (id, PendingOp::Delete),
            };
            self.offer(id, position, op);
        }
    }

    /// Holds `op` for `id` unless a newer operation is held.
    fn offer(&mut self, id: PointId, position: WalPosition, op: PendingOp) {
        if let Some((held, _)) = self.ops.get(&id)
            && *held > position
        {
            return;
        }
        self.bytes += op.bytes();
        if let Some((_, replaced)) = self.ops.insert(id, (position, op)) {
            self.bytes -= replaced.bytes();
        }
    }

    /// Returns about how much memory the held operations take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Returns true when the batch at `position` was applied.
    pub fn contains_position(&self, position: &WalPosition) -> bool {
        self.positions.contains(position)
    }

    /// Returns the newest applied batch position.
    pub fn last_position(&self) -> Option<WalPosition> {
        self.positions.last().copied()
    }

    /// Returns the ids held (upserts and deletes).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&PointId, &WalPosition, &PendingOp)> {
        self.ops
            .iter()
            .map(|(id, (position, op))| (id, position, op))
    }

    /// Returns the newest operation on `id`, if any.
    #[cfg(test)]
    pub fn get(&self, id: &PointId) -> Option<&PendingOp> {
        self.ops.get(id).map(|(_, op)| op)
    }

    /// Folds `newer` on top of `self` (per id, the newer position wins).
    pub fn absorb(&mut self, newer: Memtable) {
        self.positions.extend(newer.positions);
        for (id, (position, op)) in newer.ops {
            self.offer(id, position, op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: Vec<WalRecord>) -> WalBatch {
        WalBatch {
            shard: 0,
            epoch: 1,
            sequence: 1,
            dimension: 1,
            records,
        }
    }

    fn upsert(id: u64, value: f32) -> WalRecord {
        WalRecord::Upsert {
            id: PointId::U64(id),
            vector: vec![value],
            payload: Vec::new(),
        }
    }

    #[test]
    fn newest_position_wins_even_when_replayed_out_of_order() {
        let mut memtable = Memtable::default();
        let first = WalPosition {
            epoch: 1,
            sequence: 1,
        };
        let second = WalPosition {
            epoch: 1,
            sequence: 2,
        };
        memtable.apply_batch(second, batch(vec![upsert(7, 2.0)]));
        memtable.apply_batch(
            first,
            batch(vec![
                upsert(7, 1.0),
                WalRecord::Delete {
                    id: PointId::U64(8),
                },
            ]),
        );
        assert_eq!(
            memtable.get(&PointId::U64(7)),
            Some(&PendingOp::Upsert {
                vector: vec![2.0],
                payload: Vec::new()
            })
        );
        assert_eq!(memtable.get(&PointId::U64(8)), Some(&PendingOp::Delete));
        // A batch applied twice changes nothing.
        memtable.apply_batch(second, batch(vec![upsert(9, 1.0)]));
        assert_eq!(memtable.get(&PointId::U64(9)), None);
        assert_eq!(memtable.last_position(), Some(second));
    }

    #[test]
    fn within_a_batch_the_later_record_wins() {
        let mut memtable = Memtable::default();
        let position = WalPosition {
            epoch: 2,
            sequence: 1,
        };
        memtable.apply_batch(
            position,
            batch(vec![
                upsert(1, 1.0),
                WalRecord::Delete {
                    id: PointId::U64(1),
                },
            ]),
        );
        assert_eq!(memtable.get(&PointId::U64(1)), Some(&PendingOp::Delete));
        let mut older = Memtable::default();
        older.apply_batch(
            WalPosition {
                epoch: 1,
                sequence: 9,
            },
            batch(vec![upsert(1, 5.0), upsert(2, 5.0)]),
        );
        older.absorb(memtable);
        assert_eq!(older.get(&PointId::U64(1)), Some(&PendingOp::Delete));
        assert!(older.get(&PointId::U64(2)).is_some());
        // The bytes follow what is held: one delete, one one-value upsert.
        assert_eq!(older.bytes(), PendingOp::Delete.bytes() + 96 + 4);
    }

    #[test]
    fn bytes_count_vectors_and_payloads_of_what_is_held() {
        let mut memtable = Memtable::default();
        let big = |id: u64| WalRecord::Upsert {
            id: PointId::U64(id),
            vector: vec![0.0; 768],
            payload: vec![b'x'; 1000],
        };
        memtable.apply_batch(
            WalPosition {
                epoch: 1,
                sequence: 1,
            },
            batch((0..10).map(big).collect()),
        );
        assert_eq!(memtable.bytes(), 10 * (96 + 3072 + 1000));
        // Replacing rows with deletes gives their memory back.
        memtable.apply_batch(
            WalPosition {
                epoch: 1,
                sequence: 2,
            },
            batch(
                (0..10)
                    .map(|id| WalRecord::Delete {
                        id: PointId::U64(id),
                    })
                    .collect(),
            ),
        );
        assert_eq!(memtable.bytes(), 10 * 96);
    }
}
