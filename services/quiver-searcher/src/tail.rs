//! A shard's WAL tail as a searcher holds it: the rows committed but in no
//! segment yet, one chunk per WAL object with its vectors back to back, so a
//! query scores them with the SIMD bulk kernel.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_index::{Filter, Metric, PointId, normalized};
use quiver_simd::BulkOp;
use quiver_storage::WalRecord;
use roaring::RoaringBitmap;
use serde_json::Value;

use crate::error::SearcherResult;
use crate::ranking::{Best, HitSource};

/// The upserts of one WAL object, laid out for bulk scoring: `vectors` holds
/// every row's vector back to back (unit length for cosine collections).
pub(crate) struct TailChunk {
    pub ids: Vec<PointId>,
    pub vectors: Vec<f32>,
    pub payloads: Vec<Option<Value>>,
}

/// Where the newest WAL-tail record of an id is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TailSlot {
    /// An upsert: its position among the tail's rows (over every chunk).
    Row(u32),
    /// A delete.
    Deleted,
}

/// The WAL tail, not yet in a segment: chunks of rows in commit order, the
/// newest record of every id, and the rows a later record superseded.
#[derive(Clone, Default)]
pub(crate) struct Tail {
    chunks: Vec<Arc<TailChunk>>,
    /// Position of the first row of every chunk.
    chunk_starts: Vec<u32>,
    rows: u32,
    /// The newest record of every id in the tail.
    pub newest: HashMap<PointId, TailSlot>,
    /// Rows replaced or deleted by a later record of the same id.
    superseded: RoaringBitmap,
}

impl Tail {
    /// Appends one WAL object's records.
    pub fn apply(
        &mut self,
        key: &str,
        records: &[WalRecord],
        metric: Metric,
        dimension: usize,
    ) -> SearcherResult<()> {
        let mut chunk = TailChunk {
            ids: Vec::new(),
            vectors: Vec::new(),
            payloads: Vec::new(),
        };
        for record in records {
            let slot = match record {
                WalRecord::Upsert {
                    id,
                    vector,
                    payload,
                } => {
                    if vector.len() != dimension {
                        return Err(quiver_storage::StorageError::Corrupted {
                            key: key.to_string(),
                            reason: format!(
                                "vector of {id} has dimension {}, the collection {dimension}",
                                vector.len()
                            ),
                        }
                        .into());
                    }
                    let payload = if payload.is_empty() {
                        None
                    } else {
                        Some(serde_json::from_slice(payload).map_err(|error| {
                            quiver_storage::StorageError::Corrupted {
                                key: key.to_string(),
                                reason: format!("payload of {id} is not JSON: {error}"),
                            }
                        })?)
                    };
                    if metric == Metric::Cosine {
                        chunk.vectors.extend(normalized(vector));
                    } else {
                        chunk.vectors.extend_from_slice(vector);
                    }
                    chunk.ids.push(id.clone());
                    chunk.payloads.push(payload);
                    TailSlot::Row(self.rows + chunk.ids.len() as u32 - 1)
                }
                WalRecord::Delete { .. } => TailSlot::Deleted,
            };
            if let Some(TailSlot::Row(old)) = self.newest.insert(record.id().clone(), slot) {
                self.superseded.insert(old);
            }
        }
        if !chunk.ids.is_empty() {
            self.chunk_starts.push(self.rows);
            self.rows += chunk.ids.len() as u32;
            self.chunks.push(Arc::new(chunk));
        }
        Ok(())
    }

    /// Returns the chunk and the index in it of tail row `position`.
    pub fn locate(&self, position: u32) -> (&TailChunk, usize) {
        let chunk = self
            .chunk_starts
            .partition_point(|&start| start <= position)
            - 1;
        (
            &self.chunks[chunk],
            (position - self.chunk_starts[chunk]) as usize,
        )
    }

    /// Returns the live upsert of `id`: its vector and payload.
    pub fn get(&self, id: &PointId) -> Option<Option<(&[f32], Option<&Value>)>> {
        match self.newest.get(id)? {
            TailSlot::Deleted => Some(None),
            TailSlot::Row(position) => {
                let (chunk, index) = self.locate(*position);
                let dimension = chunk.vectors.len() / chunk.ids.len();
                Some(Some((
                    &chunk.vectors[index * dimension..][..dimension],
                    chunk.payloads[index].as_ref(),
                )))
            }
        }
    }

    pub fn live_rows(&self) -> u64 {
        u64::from(self.rows) - self.superseded.len()
    }
    /// Scores the live rows for `query` in bulk, one chunk at a time, into
    /// `best`; a row's filter is evaluated only when its score would enter the
    /// top-k. Returns the rows scored.
    pub fn search(
        &self,
        query: &[f32],
        metric: Metric,
        filter: Option<&Filter>,
        best: &mut Best,
    ) -> u64 {
        if self.rows == 0 {
            return 0;
        }
        let query = if metric == Metric::Cosine {
            normalized(query)
        } else {
            query.to_vec()
        };
        let (op, negate) = match metric {
            Metric::L2 => (BulkOp::L2Squared, false),
            Metric::Dot | Metric::Cosine => (BulkOp::Dot, true),
        };
        let mut scores = Vec::new();
        for (chunk, &start) in self.chunks.iter().zip(&self.chunk_starts) {
            scores.resize(chunk.ids.len(), 0.0);
            quiver_simd::score_f32_bulk(op, &query, &chunk.vectors, &mut scores);
            for (index, &score) in scores.iter().enumerate() {
                let position = start + index as u32;
                let key = if negate { -score } else { score };
                if key >= best.threshold() || self.superseded.contains(position) {
                    continue;
                }
                if let Some(filter) = filter
                    && !filter.matches_payload(chunk.payloads[index].as_ref())
                {
                    continue;
                }
                best.push(key, HitSource::Tail { position });
            }
        }
        self.live_rows()
    }
}
