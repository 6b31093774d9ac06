//! One shard as a searcher serves it ([`ShardView`]): the manifest's segments
//! opened through the region cache, each with the rows it must not return
//! (deleted, or replaced by a newer copy in the WAL tail), plus the WAL tail's
//! points scored exactly.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_blobcache::{CachedObject, ReadCounts};
use quiver_index::{Filter, Metric, PointId, SearchParams, SearchScratch, Segment, SegmentSpec};
use quiver_storage::WalRecord;
use quiver_storage::manifest::{Manifest, SegmentEntry};
use roaring::RoaringBitmap;
use serde_json::Value;

use crate::context::ReadContext;
use crate::error::{SearcherError, SearcherResult};
use quiver_proto::{ErrorCode, ServiceError};

/// A filter keeping at most this many of a segment's rows is always answered by
/// scoring exactly the rows it keeps (recall does not depend on the lists).
const EXACT_FILTER_ROWS: u64 = 2048;
/// Above that, exact scoring is chosen when it is cheaper than the widened IVF probe:
/// scoring one row exactly (a gather of its full vector) costs about this many times
/// scanning one row's 1-bit code and checking the filter bitmap (measured on real
/// 384-d embeddings: ~13×). So a filter keeping 10% of a 100k segment probes every
/// list through the codes instead of gathering 10k full vectors, and a 1% filter on a
/// 1M segment gathers its 10k rows instead of scanning most lists.
const EXACT_ROW_COST_IN_CODE_ROWS: u64 = 16;

/// One search against a shard.
#[derive(Clone, Debug)]
pub struct SearchRequest {
    /// The query vector.
    pub vector: Vec<f32>,
    /// Hits wanted.
    pub k: usize,
    /// Lists probed per segment (`None`: the segment's calibrated default).
    pub nprobe: Option<usize>,
    /// Rescoring guard multiplier (`None`: the default).
    pub rescore: Option<usize>,
    /// Rows must satisfy this filter.
    pub filter: Option<Filter>,
    /// Return each hit's payload.
    pub include_payload: bool,
    /// Return each hit's vector.
    pub include_vector: bool,
}

/// One hit of a shard.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardHit {
    /// Point id.
    pub id: PointId,
    /// Cosine similarity, inner product, or squared distance (by metric).
    pub score: f32,
    /// Payload, when asked for and present.
    pub payload: Option<Value>,
    /// Vector, when asked for.
    pub vector: Option<Vec<f32>>,
}

/// What one shard search cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueryCost {
    /// Segments searched.
    pub segments: u64,
    /// Rows whose quantized codes were scored.
    pub rows_scanned: u64,
    /// Rows scored with their full vectors (rescoring, or exact filtered search).
    pub rows_rescored: u64,
    /// WAL-tail rows scored exactly.
    pub tail_rows_scored: u64,
    /// Cache regions the search found in the cache.
    pub cache_regions_hit: u64,
    /// Cache regions the search had to fetch from object storage.
    pub cache_regions_missed: u64,
    /// Bytes the search fetched from object storage.
    pub bytes_fetched: u64,
    /// Time spent, milliseconds.
    pub search_ms: f64,
}

/// A point read by id.
#[derive(Clone, Debug, PartialEq)]
pub struct PointRecord {
    /// Point id.
    pub id: PointId,
    /// Payload, if any.
    pub payload: Option<Value>,
    /// Vector, when asked for (unit length for cosine collections).
    pub vector: Option<Vec<f32>>,
}

struct SegmentView {
    entry: SegmentEntry,
    segment: Arc<Segment<CachedObject>>,
    /// Rows never returned: deleted, or replaced/deleted in the WAL tail.
    blocked: RoaringBitmap,
}

enum TailPoint {
    Upsert {
        vector: Vec<f32>,
        payload: Option<Value>,
    },
    Deleted,
}

/// A shard at one manifest version, ready to answer.
pub struct ShardView {
    manifest: Manifest,
    metric: Metric,
    dimension: usize,
    segments: Vec<SegmentView>,
    tail: HashMap<PointId, Arc<TailPoint>>,
}

/// What building a [`ShardView`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Segments opened (new to this shard's view).
    pub segments_opened: u64,
    /// Segments kept open from the previous view.
    pub segments_reused: u64,
    /// WAL-tail objects read into the view (only the new ones when the tail grew).
    pub wal_batches_applied: u64,
}

enum HitSource {
    Segment { index: usize, row: u32 },
    Tail,
}

impl ShardView {
    /// Opens everything `manifest` lists (blocking: run off the async workers).
    pub fn load(
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
    ) -> SearcherResult<ShardView> {
        counted(Self::build(context, spec, manifest, None)).map(|(view, _)| view)
    }

    /// Returns the view of `manifest`, a newer manifest of the shard `previous`
    /// answers from, built incrementally: segments both list stay open (only new
    /// ones are opened), a tail that only grew gets just its new WAL objects
    /// applied, and rows are re-masked only where a deletion bitmap changed or the
    /// tail was trimmed. Blocking: run off the async workers.
    pub fn reload(
        previous: &ShardView,
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
    ) -> SearcherResult<(ShardView, LoadStats)> {
        counted(Self::build(context, spec, manifest, Some(previous)))
    }

    fn build(
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
        previous: Option<&ShardView>,
    ) -> SearcherResult<(ShardView, LoadStats)> {
        let mut stats = LoadStats::default();
        // The tail grew (same prefix) or was rebuilt (trimmed by a flush).
        let tail_grew = previous.is_some_and(|previous| {
            let old = &previous.manifest.wal_tail;
            manifest.wal_tail.len() >= old.len() && manifest.wal_tail[..old.len()] == old[..]
        });
        let (mut tail, first_new_entry) = match previous {
            Some(previous) if tail_grew => {
                (previous.tail.clone(), previous.manifest.wal_tail.len())
            }
            _ => (HashMap::new(), 0),
        };
        let mut new_tail_ids: Vec<PointId> = Vec::new();
        for entry in &manifest.wal_tail[first_new_entry..] {
            let batch = context.wal_batch(&entry.key)?;
            stats.wal_batches_applied += 1;
            for record in &batch.records {
                let point = match record {
                    WalRecord::Upsert {
                        id,
                        vector,
                        payload,
                    } => {
                        let payload = if payload.is_empty() {
                            None
                        } else {
                            Some(serde_json::from_slice(payload).map_err(|error| {
                                quiver_storage::StorageError::Corrupted {
                                    key: entry.key.clone(),
                                    reason: format!("payload of {id} is not JSON: {error}"),
                                }
                            })?)
                        };
                        let vector = if spec.metric == Metric::Cosine {
                            normalized(vector)
                        } else {
                            vector.clone()
                        };
                        TailPoint::Upsert { vector, payload }
                    }
                    WalRecord::Delete { .. } => TailPoint::Deleted,
                };
                tail.insert(record.id().clone(), Arc::new(point));
                new_tail_ids.push(record.id().clone());
            }
        }
        let previous_segments: HashMap<&str, &SegmentView> = previous
            .map(|previous| {
                previous
                    .segments
                    .iter()
                    .map(|view| (view.entry.key.as_str(), view))
                    .collect()
            })
            .unwrap_or_default();
        let mut segments = Vec::with_capacity(manifest.segments.len());
        for entry in &manifest.segments {
            let view = match previous_segments.get(entry.key.as_str()) {
                Some(old) => {
                    stats.segments_reused += 1;
                    let same_deletes = old.entry.deletes.as_ref().map(|deletes| &deletes.key)
                        == entry.deletes.as_ref().map(|deletes| &deletes.key);
                    let blocked = if same_deletes && tail_grew {
                        let mut blocked = old.blocked.clone();
                        block_rows(&old.segment, &new_tail_ids, &mut blocked)?;
                        blocked
                    } else {
                        masked_rows(context, entry, &old.segment, tail.keys())?
                    };
                    SegmentView {
                        entry: entry.clone(),
                        segment: old.segment.clone(),
                        blocked,
                    }
                }
                None => {
                    stats.segments_opened += 1;
                    let segment = context.open_segment(entry)?;
                    let blocked = masked_rows(context, entry, &segment, tail.keys())?;
                    SegmentView {
                        entry: entry.clone(),
                        segment,
                        blocked,
                    }
                }
            };
            segments.push(view);
        }
        let view = ShardView {
            manifest,
            metric: spec.metric,
            dimension: spec.dim,
            segments,
            tail,
        };
        Ok((view, stats))
    }

    /// Returns the opened segments.
    pub fn segments(&self) -> impl Iterator<Item = &Segment<CachedObject>> {
        self.segments.iter().map(|view| view.segment.as_ref())
    }

    /// Returns the manifest this view answers from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Returns the live points (deletions and replacements applied).
    pub fn live_points(&self) -> u64 {
        let in_segments: u64 = self
            .segments
            .iter()
            .map(|view| view.segment.rows() - view.blocked.len())
            .sum();
        let in_tail = self
            .tail
            .values()
            .filter(|point| matches!(point.as_ref(), TailPoint::Upsert { .. }))
            .count() as u64;
        in_segments + in_tail
    }

    /// Returns the rows of the WAL tail (not yet in a segment).
    pub fn wal_tail_rows(&self) -> u64 {
        self.manifest
            .wal_tail
            .iter()
            .map(|entry| entry.rows as u64)
            .sum()
    }

    /// Returns the bytes of the live segments.
    pub fn segment_bytes(&self) -> u64 {
        self.segments.iter().map(|view| view.entry.size_bytes).sum()
    }

    /// Answers `request` (blocking: run off the async workers).
    pub fn search(
        &self,
        context: &ReadContext,
        request: &SearchRequest,
        scratch: &mut SearchScratch,
    ) -> SearcherResult<Vec<ShardHit>> {
        self.search_with_cost(context, request, scratch)
            .map(|(hits, _)| hits)
    }

    /// Answers `request` and says what it cost.
    pub fn search_with_cost(
        &self,
        context: &ReadContext,
        request: &SearchRequest,
        scratch: &mut SearchScratch,
    ) -> SearcherResult<(Vec<ShardHit>, QueryCost)> {
        counted(self.search_counting(context, request, scratch))
    }

    fn search_counting(
        &self,
        context: &ReadContext,
        request: &SearchRequest,
        scratch: &mut SearchScratch,
    ) -> SearcherResult<(Vec<ShardHit>, QueryCost)> {
        let started = std::time::Instant::now();
        let reads_before = ReadCounts::of_this_thread();
        let mut cost = QueryCost::default();
        if request.k == 0 {
            return Err(SearcherError::InvalidArgument(
                "k must be at least 1".into(),
            ));
        }
        if request.vector.len() != self.dimension {
            return Err(SearcherError::InvalidArgument(format!(
                "query vector has dimension {}, the collection has dimension {}",
                request.vector.len(),
                self.dimension
            )));
        }
        if let Some(position) = request.vector.iter().position(|value| !value.is_finite()) {
            return Err(SearcherError::InvalidArgument(format!(
                "query vector has a non-finite value at position {position}"
            )));
        }
        let mut candidates: Vec<(f32, PointId, HitSource)> = Vec::new();
        for (index, view) in self.segments.iter().enumerate() {
            let hits = self.search_segment(context, view, request, scratch)?;
            cost.segments += 1;
            cost.rows_scanned += scratch.stats.rows_scanned as u64;
            cost.rows_rescored += scratch.stats.rows_rescored as u64;
            for hit in hits {
                let id = view.segment.id(hit.row)?;
                candidates.push((
                    hit.score,
                    id,
                    HitSource::Segment {
                        index,
                        row: hit.row,
                    },
                ));
            }
        }
        let query = if self.metric == Metric::Cosine {
            normalized(&request.vector)
        } else {
            request.vector.clone()
        };
        for (id, point) in &self.tail {
            let TailPoint::Upsert { vector, payload } = point.as_ref() else {
                continue;
            };
            if let Some(filter) = &request.filter
                && !filter.matches_payload(payload.as_ref())
            {
                continue;
            }
            let score = match self.metric {
                Metric::L2 => quiver_simd::l2sq_f32(&query, vector),
                Metric::Dot | Metric::Cosine => quiver_simd::dot_f32(&query, vector),
            };
            cost.tail_rows_scored += 1;
            candidates.push((score, id.clone(), HitSource::Tail));
        }
        if self.metric.higher_is_better() {
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        } else {
            candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        candidates.truncate(request.k);
        let hits = candidates
            .into_iter()
            .map(|(score, id, source)| {
                let (payload, vector) = self.point_parts(&id, &source, request)?;
                Ok(ShardHit {
                    id,
                    score,
                    payload,
                    vector,
                })
            })
            .collect::<SearcherResult<Vec<_>>>()?;
        // The search ran on this thread, and so did every region fill it caused.
        let reads = ReadCounts::of_this_thread().since(reads_before);
        cost.cache_regions_hit = reads.region_hits;
        cost.cache_regions_missed = reads.region_misses;
        cost.bytes_fetched = reads.bytes_fetched;
        cost.search_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok((hits, cost))
    }

    fn search_segment(
        &self,
        context: &ReadContext,
        view: &SegmentView,
        request: &SearchRequest,
        scratch: &mut SearchScratch,
    ) -> SearcherResult<Vec<quiver_index::Hit>> {
        let segment = &view.segment;
        let rows = segment.rows();
        let mut params = SearchParams::new(request.k);
        params.nprobe = request
            .nprobe
            .or(view.entry.default_nprobe.map(|nprobe| nprobe as usize));
        if let Some(rescore) = request.rescore {
            params.rescore = rescore;
        }
        let Some(filter) = &request.filter else {
            if view.blocked.is_empty() {
                return Ok(segment.search(&request.vector, &params, None, scratch)?);
            }
            let allows = |row: u32| !view.blocked.contains(row);
            return Ok(segment.search(&request.vector, &params, Some(&allows), scratch)?);
        };
        let matching = context.filter_rows(&view.entry.key, segment, filter)?;
        let allowed: RoaringBitmap = &*matching - &view.blocked;
        let kept = allowed.len();
        if kept == 0 {
            return Ok(Vec::new());
        }
        // A looser filter would probe more lists, as many more as the filter is selective.
        let nlist = segment.header().nlist;
        let base = params
            .nprobe
            .unwrap_or_else(|| quiver_index::default_nprobe(nlist));
        let widened = ((base as f64 * rows as f64 / kept as f64).ceil() as usize).clamp(1, nlist);
        let scanned = (rows * widened as u64).div_ceil(nlist.max(1) as u64);
        if kept <= EXACT_FILTER_ROWS || kept.saturating_mul(EXACT_ROW_COST_IN_CODE_ROWS) <= scanned
        {
            return Ok(segment.search_rows(&request.vector, allowed.iter(), request.k, scratch)?);
        }
        params.nprobe = Some(widened);
        let allows = |row: u32| allowed.contains(row);
        Ok(segment.search(&request.vector, &params, Some(&allows), scratch)?)
    }

    fn point_parts(
        &self,
        id: &PointId,
        source: &HitSource,
        request: &SearchRequest,
    ) -> SearcherResult<(Option<Value>, Option<Vec<f32>>)> {
        match source {
            HitSource::Tail => match self.tail.get(id).map(Arc::as_ref) {
                Some(TailPoint::Upsert { vector, payload }) => Ok((
                    payload.clone().filter(|_| request.include_payload),
                    request.include_vector.then(|| vector.clone()),
                )),
                _ => Ok((None, None)),
            },
            HitSource::Segment { index, row } => {
                let segment = &self.segments[*index].segment;
                let payload = if request.include_payload {
                    segment.payload(*row)?
                } else {
                    None
                };
                let vector = if request.include_vector {
                    Some(segment.vector(*row)?)
                } else {
                    None
                };
                Ok((payload, vector))
            }
        }
    }

    /// Reads points by id; ids that do not exist are left out.
    pub fn get(&self, ids: &[PointId], include_vector: bool) -> SearcherResult<Vec<PointRecord>> {
        counted(self.get_counting(ids, include_vector))
    }

    fn get_counting(
        &self,
        ids: &[PointId],
        include_vector: bool,
    ) -> SearcherResult<Vec<PointRecord>> {
        let mut found = Vec::new();
        for id in ids {
            if let Some(point) = self.tail.get(id) {
                if let TailPoint::Upsert { vector, payload } = point.as_ref() {
                    found.push(PointRecord {
                        id: id.clone(),
                        payload: payload.clone(),
                        vector: include_vector.then(|| vector.clone()),
                    });
                }
                continue;
            }
            for view in &self.segments {
                let Some(row) = view.segment.row_of(id)? else {
                    continue;
                };
                if view.blocked.contains(row) {
                    continue;
                }
                found.push(PointRecord {
                    id: id.clone(),
                    payload: view.segment.payload(row)?,
                    vector: if include_vector {
                        Some(view.segment.vector(row)?)
                    } else {
                        None
                    },
                });
                break;
            }
        }
        Ok(found)
    }
}

/// Counts a damaged object (segment, bitmap, WAL object) met by a read: the
/// error names it, and no answer is served from it.
fn counted<T>(result: SearcherResult<T>) -> SearcherResult<T> {
    if let Err(error) = &result
        && error.error_code() == ErrorCode::DataLoss
    {
        crate::metrics::METRICS.corrupted_objects.inc();
    }
    result
}

/// Rows of `segment` never to return: its deletion bitmap, plus the rows of ids
/// the WAL tail holds a newer copy (or a delete) of.
fn masked_rows<'i>(
    context: &ReadContext,
    entry: &SegmentEntry,
    segment: &Segment<CachedObject>,
    tail_ids: impl Iterator<Item = &'i PointId>,
) -> SearcherResult<RoaringBitmap> {
    let mut blocked = match &entry.deletes {
        Some(deletes) => (*context.bitmap(&deletes.key)?).clone(),
        None => RoaringBitmap::new(),
    };
    for id in tail_ids {
        if let Some(row) = segment.row_of(id)? {
            blocked.insert(row);
        }
    }
    Ok(blocked)
}

/// Adds the rows of `ids` in `segment` to `blocked`.
fn block_rows(
    segment: &Segment<CachedObject>,
    ids: &[PointId],
    blocked: &mut RoaringBitmap,
) -> SearcherResult<()> {
    for id in ids {
        if let Some(row) = segment.row_of(id)? {
            blocked.insert(row);
        }
    }
    Ok(())
}

fn normalized(vector: &[f32]) -> Vec<f32> {
    let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
    if norm == 0.0 {
        return vector.to_vec();
    }
    vector.iter().map(|value| value / norm).collect()
}
