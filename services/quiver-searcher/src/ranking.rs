//! The best hits of a shard search so far, from segments and the WAL tail.

use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug)]
pub(crate) enum HitSource {
    /// Row `row` of the view's segment `index`.
    Segment { index: usize, row: u32 },
    /// Row `position` of the WAL tail.
    Tail { position: u32 },
}

impl HitSource {
    /// A total order, so equal scores rank the same way every time.
    fn order(&self) -> (usize, u32) {
        match *self {
            HitSource::Segment { index, row } => (index, row),
            HitSource::Tail { position } => (usize::MAX, position),
        }
    }
}

/// Smaller-is-better keys of the best `k` hits so far, with where each is.
pub(crate) struct Best {
    k: usize,
    pub heap: BinaryHeap<Ranked>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Ranked {
    pub key: f32,
    pub source: HitSource,
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key
            .total_cmp(&other.key)
            .then_with(|| self.source.order().cmp(&other.source.order()))
    }
}

impl Best {
    pub fn new(k: usize) -> Self {
        Best {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }

    /// How many hits it keeps.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The key a hit must beat to enter.
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::INFINITY
        } else {
            self.heap.peek().map_or(f32::INFINITY, |ranked| ranked.key)
        }
    }

    pub fn push(&mut self, key: f32, source: HitSource) {
        if self.heap.len() < self.k {
            self.heap.push(Ranked { key, source });
        } else if key < self.threshold() {
            self.heap.pop();
            self.heap.push(Ranked { key, source });
        }
    }
}
