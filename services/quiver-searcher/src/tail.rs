//! A shard's WAL tail as a searcher holds it: the rows committed but in no
//! segment yet, one chunk per WAL object with its vectors back to back, so a
//! query scores them with the SIMD bulk kernels.
//!
//! Right after a large load the tail holds tens of thousands of rows (80k of a
//! 100k load of 384-d rows, for a few seconds, until the indexer's flushes catch
//! up), and a scan of their f32 vectors is bound by memory bandwidth: 123 MB,
//! ~7 ms per query on the 2-core machine. So every row also keeps an int8 copy
//! (one scale per row): a large tail is scanned in int8 — a quarter of the
//! bytes — and the best candidates of that scan are rescored in f32, so the
//! scores returned are exact.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_index::{Filter, Metric, PointId, normalized};
use quiver_simd::BulkOp;

/// A tail of at most this many rows is scored in f32 directly: the int8 scan
/// and the rescoring cost more than they save on so few rows.
const EXACT_TAIL_ROWS: u32 = 4_096;

/// The int8 scan of a larger tail keeps this many candidates per hit asked…
const TAIL_RESCORE_PER_HIT: usize = 4;

/// …and at least this many more than the hits asked, for their f32 rescoring.
/// The int8 estimate of a 384-d inner product errs by ~1e-3 (one rounding step
/// per value), well inside the gap between the k-th and the 4k-th neighbour.
const TAIL_RESCORE_EXTRA: usize = 32;
use quiver_storage::WalRecord;
use roaring::RoaringBitmap;
use serde_json::Value;

use crate::error::SearcherResult;
use crate::ranking::{Best, HitSource};

/// The upserts of one WAL object, laid out for bulk scoring: `vectors` holds
/// every row's vector back to back (unit length for cosine collections), and
/// `codes` the same rows in int8, row `i` ≈ `scales[i]` × its codes.
pub(crate) struct TailChunk {
    pub ids: Vec<PointId>,
    pub vectors: Vec<f32>,
    pub payloads: Vec<Option<Value>>,
    codes: Vec<i8>,
    scales: Vec<f32>,
    /// Each row's squared length (of its f32 vector), for l2 estimates.
    squared_norms: Vec<f32>,
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
            codes: Vec::new(),
            scales: Vec::new(),
            squared_norms: Vec::new(),
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
                    let start = chunk.vectors.len();
                    if metric == Metric::Cosine {
                        chunk.vectors.extend(normalized(vector));
                    } else {
                        chunk.vectors.extend_from_slice(vector);
                    }
                    let row = &chunk.vectors[start..];
                    chunk
                        .scales
                        .push(quiver_simd::quantize_i8(row, &mut chunk.codes));
                    chunk.squared_norms.push(quiver_simd::dot_f32(row, row));
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
    /// top-k (of the int8 scan's candidates, for a large tail). Returns the
    /// rows scored.
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
        if self.rows <= EXACT_TAIL_ROWS {
            self.search_exact(&query, metric, filter, best);
        } else {
            self.search_quantized(&query, metric, filter, best);
        }
        self.live_rows()
    }

    /// Scores every live row in f32.
    fn search_exact(
        &self,
        query: &[f32],
        metric: Metric,
        filter: Option<&Filter>,
        best: &mut Best,
    ) {
        let (op, negate) = match metric {
            Metric::L2 => (BulkOp::L2Squared, false),
            Metric::Dot | Metric::Cosine => (BulkOp::Dot, true),
        };
        let mut scores = Vec::new();
        for (chunk, &start) in self.chunks.iter().zip(&self.chunk_starts) {
            scores.resize(chunk.ids.len(), 0.0);
            quiver_simd::score_f32_bulk(op, query, &chunk.vectors, &mut scores);
            for (index, &score) in scores.iter().enumerate() {
                let position = start + index as u32;
                let key = if negate { -score } else { score };
                if key >= best.threshold() || !self.admits(chunk, index, position, filter) {
                    continue;
                }
                best.push(key, HitSource::Tail { position });
            }
        }
    }

    /// Scans every live row's int8 codes, keeps the best candidates of that
    /// estimate, and rescores them in f32 into `best`.
    fn search_quantized(
        &self,
        query: &[f32],
        metric: Metric,
        filter: Option<&Filter>,
        best: &mut Best,
    ) {
        let wanted = best.k();
        let mut candidates =
            Best::new((wanted * TAIL_RESCORE_PER_HIT).max(wanted + TAIL_RESCORE_EXTRA));
        let mut query_codes = Vec::with_capacity(query.len());
        let query_scale = quiver_simd::quantize_i8(query, &mut query_codes);
        let query_norm = quiver_simd::dot_f32(query, query);
        let mut dots = Vec::new();
        for (chunk, &start) in self.chunks.iter().zip(&self.chunk_starts) {
            dots.resize(chunk.ids.len(), 0);
            quiver_simd::dot_i8_bulk(&query_codes, &chunk.codes, &mut dots);
            for (index, &dot) in dots.iter().enumerate() {
                let estimate = query_scale * chunk.scales[index] * dot as f32;
                let key = match metric {
                    Metric::L2 => query_norm + chunk.squared_norms[index] - 2.0 * estimate,
                    Metric::Dot | Metric::Cosine => -estimate,
                };
                let position = start + index as u32;
                if key >= candidates.threshold() || !self.admits(chunk, index, position, filter) {
                    continue;
                }
                candidates.push(key, HitSource::Tail { position });
            }
        }
        for ranked in candidates.heap {
            let HitSource::Tail { position } = ranked.source else {
                continue;
            };
            let (chunk, index) = self.locate(position);
            let dimension = query.len();
            let row = &chunk.vectors[index * dimension..][..dimension];
            let key = match metric {
                Metric::L2 => quiver_simd::l2sq_f32(query, row),
                Metric::Dot | Metric::Cosine => -quiver_simd::dot_f32(query, row),
            };
            best.push(key, ranked.source);
        }
    }

    /// Whether tail row `position` (row `index` of `chunk`) is live and passes
    /// `filter`.
    fn admits(
        &self,
        chunk: &TailChunk,
        index: usize,
        position: u32,
        filter: Option<&Filter>,
    ) -> bool {
        !self.superseded.contains(position)
            && filter.is_none_or(|filter| filter.matches_payload(chunk.payloads[index].as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const DIM: usize = 96;

    /// Rows around 30 centres, as embeddings cluster: neighbours lie close.
    fn rows(rng: &mut StdRng, count: usize, centres: &[Vec<f32>]) -> Vec<Vec<f32>> {
        (0..count)
            .map(|_| {
                let centre = &centres[rng.random_range(0..centres.len())];
                centre
                    .iter()
                    .map(|value| value + rng.random_range(-0.3f32..0.3))
                    .collect()
            })
            .collect()
    }

    /// The f32 key (smaller is closer) of `vector` for `query`, as the tail
    /// stores it (unit length for cosine).
    fn exact_key(query: &[f32], vector: &[f32], metric: Metric) -> f32 {
        match metric {
            Metric::L2 => quiver_simd::l2sq_f32(query, vector),
            Metric::Dot => -quiver_simd::dot_f32(query, vector),
            Metric::Cosine => -quiver_simd::dot_f32(&normalized(query), &normalized(vector)),
        }
    }

    /// The exact top-k of the live tail, as (id, key) pairs.
    fn exact(
        live: &HashMap<u64, (Vec<f32>, u64)>,
        query: &[f32],
        metric: Metric,
        keep: impl Fn(u64) -> bool,
        k: usize,
    ) -> Vec<(u64, f32)> {
        let mut all: Vec<(u64, f32)> = live
            .iter()
            .filter(|(_, (_, bucket))| keep(*bucket))
            .map(|(&id, (vector, _))| (id, exact_key(query, vector, metric)))
            .collect();
        all.sort_by(|a, b| a.1.total_cmp(&b.1));
        all.truncate(k);
        all
    }

    #[test]
    fn a_large_tail_scanned_in_int8_answers_the_exact_top_k_with_exact_scores() {
        let mut rng = StdRng::seed_from_u64(11);
        let centres: Vec<Vec<f32>> = (0..30)
            .map(|_| (0..DIM).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        for metric in [Metric::Cosine, Metric::Dot, Metric::L2] {
            let mut tail = Tail::default();
            let mut live = HashMap::new();
            let mut next_id = 0u64;
            // Nine WAL objects of 700 upserts, each also replacing and deleting
            // some earlier points: the superseded rows must never come back.
            for object in 0..9 {
                let mut records = Vec::new();
                for vector in rows(&mut rng, 700, &centres) {
                    let id = if object > 0 && rng.random_bool(0.1) {
                        rng.random_range(0..next_id)
                    } else {
                        next_id += 1;
                        next_id - 1
                    };
                    let bucket = id % 4;
                    records.push(WalRecord::Upsert {
                        id: PointId::U64(id),
                        vector: vector.clone(),
                        payload: format!(r#"{{"bucket": {bucket}}}"#).into_bytes(),
                    });
                    live.insert(id, (vector, bucket));
                }
                for _ in 0..20 {
                    let id = rng.random_range(0..next_id);
                    records.push(WalRecord::Delete {
                        id: PointId::U64(id),
                    });
                    live.remove(&id);
                }
                tail.apply("wal", &records, metric, DIM).unwrap();
            }
            assert!(
                tail.rows > EXACT_TAIL_ROWS,
                "the int8 path is the one tested"
            );
            let filter = Filter::parse("bucket = 2").unwrap();
            let (mut found, mut wanted) = (0usize, 0usize);
            for query in rows(&mut rng, 60, &centres) {
                for (k, filtered) in [(10, false), (1, false), (10, true)] {
                    let mut best = Best::new(k);
                    tail.search(&query, metric, filtered.then_some(&filter), &mut best);
                    let hits: Vec<(u64, f32)> = best
                        .heap
                        .into_sorted_vec()
                        .into_iter()
                        .map(|ranked| {
                            let HitSource::Tail { position } = ranked.source else {
                                panic!("a tail search returns tail rows");
                            };
                            let (chunk, index) = tail.locate(position);
                            let PointId::U64(id) = chunk.ids[index] else {
                                panic!("u64 ids");
                            };
                            (id, ranked.key)
                        })
                        .collect();
                    let truth = exact(&live, &query, metric, |bucket| !filtered || bucket == 2, k);
                    assert_eq!(hits.len(), truth.len(), "{metric:?}: as many hits as asked");
                    for (id, key) in &hits {
                        let (vector, bucket) = live
                            .get(id)
                            .unwrap_or_else(|| panic!("{metric:?}: {id} was replaced or deleted"));
                        assert!(
                            !filtered || *bucket == 2,
                            "{metric:?}: {id} fails the filter"
                        );
                        let exact_key = exact_key(&query, vector, metric);
                        assert!(
                            (key - exact_key).abs() <= 1e-5 * exact_key.abs().max(1.0),
                            "{metric:?}: the score of {id} is its f32 score ({key} against {exact_key})"
                        );
                    }
                    found += hits
                        .iter()
                        .filter(|(id, _)| truth.iter().any(|(truth_id, _)| truth_id == id))
                        .count();
                    wanted += truth.len();
                }
            }
            let recall = found as f64 / wanted as f64;
            assert!(
                recall >= 0.995,
                "{metric:?}: recall {recall} against f32 over every live row"
            );
        }
    }
}
