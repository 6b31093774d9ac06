//! One shard as a searcher serves it ([`ShardView`]): the manifest's segments
//! opened through the region cache, each with the rows it must not return
//! (deleted, or replaced by a newer copy in the WAL tail), plus the WAL tail's
//! points scored exactly.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_blobcache::{CachedObject, ReadCounts};
use quiver_index::{
    Filter, Metric, PointId, RowFilter, SearchParams, SearchScratch, Segment, SegmentSpec,
    SharedProbe, SharedSearch, search_shared,
};
use quiver_storage::manifest::{Manifest, SegmentEntry};
use roaring::RoaringBitmap;
use serde_json::Value;

use crate::context::ReadContext;
use crate::error::{SearcherError, SearcherResult};
use crate::ranking::{Best, HitSource};
use crate::tail::Tail;
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
    /// Lists probed per codebook group of segments (`None`: the calibrated default).
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
    /// Row-tier reads (raw vectors, payloads) served from the local cache file.
    pub row_reads_local: u64,
    /// Row-tier reads fetched from object storage.
    pub row_reads_remote: u64,
    /// Time the search waited for object storage, milliseconds.
    pub store_wait_ms: f64,
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

/// A shard at one manifest version, ready to answer.
pub struct ShardView {
    manifest: Manifest,
    metric: Metric,
    dimension: usize,
    segments: Vec<SegmentView>,
    /// Segments that share a codebook, searched together (indexes into
    /// `segments`); a segment without a codebook is a group of its own.
    groups: Vec<Vec<usize>>,
    tail: Tail,
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

/// Rows of a segment a search may return: those not in the bitmap.
struct NotIn<'a>(&'a RoaringBitmap);

impl RowFilter for NotIn<'_> {
    fn allows(&self, row: u32) -> bool {
        !self.0.contains(row)
    }
}

/// Rows of a segment a search may return: those in the bitmap.
struct In<'a>(&'a RoaringBitmap);

impl RowFilter for In<'_> {
    fn allows(&self, row: u32) -> bool {
        self.0.contains(row)
    }
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
            _ => (Tail::default(), 0),
        };
        let mut new_tail_ids: Vec<PointId> = Vec::new();
        for entry in &manifest.wal_tail[first_new_entry..] {
            let batch = context.wal_batch(&entry.key)?;
            stats.wal_batches_applied += 1;
            tail.apply(&entry.key, &batch.records, spec.metric, spec.dim)?;
            new_tail_ids.extend(batch.records.iter().map(|record| record.id().clone()));
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
                        masked_rows(context, entry, &old.segment, tail.newest.keys())?
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
                    let blocked = masked_rows(context, entry, &segment, tail.newest.keys())?;
                    SegmentView {
                        entry: entry.clone(),
                        segment,
                        blocked,
                    }
                }
            };
            segments.push(view);
        }
        let groups = codebook_groups(&segments);
        let view = ShardView {
            manifest,
            metric: spec.metric,
            dimension: spec.dim,
            segments,
            groups,
            tail,
        };
        Ok((view, stats))
    }

    /// Returns the opened segments.
    pub fn segments(&self) -> impl Iterator<Item = &Segment<CachedObject>> {
        self.segments.iter().map(|view| view.segment.as_ref())
    }

    /// Returns how many groups of segments a search ranks centroids for (one
    /// per codebook, plus one per segment without a codebook).
    pub fn codebook_groups(&self) -> usize {
        self.groups.len()
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
        in_segments + self.tail.live_rows()
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
        self.check(request)?;
        let mut answers =
            counted(self.search_checked(context, std::slice::from_ref(request), scratch))?;
        answers
            .pop()
            .ok_or_else(|| SearcherError::Internal("a search of one query gave no answer".into()))
    }

    /// Answers several searches together (blocking: run off the async
    /// workers), in order, each with what it cost. The batch goes through the
    /// shard segment group by segment group: a group's segments are opened for
    /// the whole batch (one read session per segment, so each segment's code
    /// regions are pinned once, and one set of deletion masks), and every
    /// search of the batch runs against them before the next group. Each
    /// search's cost counts its own work (its `search_ms` the time spent on
    /// it). An invalid search refuses the whole batch, naming it
    /// (`searches[i]`).
    pub fn search_batch(
        &self,
        context: &ReadContext,
        requests: &[SearchRequest],
        scratch: &mut SearchScratch,
    ) -> SearcherResult<Vec<(Vec<ShardHit>, QueryCost)>> {
        for (index, request) in requests.iter().enumerate() {
            self.check(request).map_err(|error| match error {
                SearcherError::InvalidArgument(message) => {
                    SearcherError::InvalidArgument(format!("searches[{index}]: {message}"))
                }
                other => other,
            })?;
        }
        counted(self.search_checked(context, requests, scratch))
    }

    /// Refuses a search this shard cannot answer, naming what is wrong.
    fn check(&self, request: &SearchRequest) -> SearcherResult<()> {
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
        Ok(())
    }

    /// Smaller-is-better key of a user-facing score, and back.
    fn key_of(&self, score: f32) -> f32 {
        if self.metric.higher_is_better() {
            -score
        } else {
            score
        }
    }

    /// Runs checked searches: every codebook group for the whole batch, then
    /// each search's WAL tail and hits.
    fn search_checked(
        &self,
        context: &ReadContext,
        requests: &[SearchRequest],
        scratch: &mut SearchScratch,
    ) -> SearcherResult<Vec<(Vec<ShardHit>, QueryCost)>> {
        let mut costs = vec![QueryCost::default(); requests.len()];
        let mut best: Vec<Best> = requests
            .iter()
            .map(|request| Best::new(request.k))
            .collect();
        for group in &self.groups {
            self.search_group(context, group, requests, scratch, &mut costs, &mut best)?;
        }
        let mut answers = Vec::with_capacity(requests.len());
        for ((request, mut best), mut cost) in requests.iter().zip(best).zip(costs) {
            let hits = measured(&mut cost, |cost| {
                cost.tail_rows_scored += self.tail.search(
                    &request.vector,
                    self.metric,
                    request.filter.as_ref(),
                    &mut best,
                );
                std::mem::take(&mut best.heap)
                    .into_sorted_vec()
                    .into_iter()
                    .map(|ranked| self.hit_of(ranked.source, self.key_of(ranked.key), request))
                    .collect::<SearcherResult<Vec<_>>>()
            })?;
            answers.push((hits, cost));
        }
        Ok(answers)
    }

    /// Searches the segments of one codebook group for every request, adding
    /// each one's hits (with the index of their segment in `self.segments`) to
    /// its `best`. Unfiltered requests share the group's sessions and masks.
    fn search_group(
        &self,
        context: &ReadContext,
        group: &[usize],
        requests: &[SearchRequest],
        scratch: &mut SearchScratch,
        costs: &mut [QueryCost],
        best: &mut [Best],
    ) -> SearcherResult<()> {
        let views: Vec<&SegmentView> = group.iter().map(|&index| &self.segments[index]).collect();
        // The group's lists are the codebook's: every segment of it records
        // the nprobe calibrated for the codebook (the largest is the safest).
        let default_nprobe = views
            .iter()
            .filter_map(|view| view.entry.default_nprobe)
            .max()
            .map(|nprobe| nprobe as usize);
        let params_of = |request: &SearchRequest| {
            let mut params = SearchParams::new(request.k);
            params.nprobe = request.nprobe.or(default_nprobe);
            if let Some(rescore) = request.rescore {
                params.rescore = rescore;
            }
            params
        };
        let masks: Vec<NotIn<'_>> = views.iter().map(|view| NotIn(&view.blocked)).collect();
        let probes: Vec<SharedProbe<'_, CachedObject>> = views
            .iter()
            .zip(&masks)
            .map(|(view, mask)| SharedProbe {
                segment: view.segment.as_ref(),
                filter: (!view.blocked.is_empty()).then_some(mask as &dyn RowFilter),
            })
            .collect();
        // Opened once the first unfiltered request needs it.
        let mut shared: Option<SharedSearch<'_, '_, CachedObject>> = None;
        for ((request, cost), best) in requests.iter().zip(costs.iter_mut()).zip(best) {
            let params = params_of(request);
            let hits = measured(cost, |cost| {
                cost.segments += views.len() as u64;
                match &request.filter {
                    None => {
                        let search = match &mut shared {
                            Some(search) => search,
                            None => shared.insert(SharedSearch::open(&probes)?),
                        };
                        let hits = search.search(&request.vector, &params, scratch)?;
                        cost.rows_scanned += scratch.stats.rows_scanned as u64;
                        cost.rows_rescored += scratch.stats.rows_rescored as u64;
                        Ok(hits)
                    }
                    Some(filter) => self.search_group_filtered(
                        context, &views, request, filter, params, scratch, cost,
                    ),
                }
            })?;
            for (member, hit) in hits {
                best.push(
                    self.key_of(hit.score),
                    HitSource::Segment {
                        index: group[member],
                        row: hit.row,
                    },
                );
            }
        }
        Ok(())
    }

    /// Searches one group's segments for a filtered request; hits carry the
    /// index of their segment in `views`. A filter keeping few rows is
    /// answered exactly from those rows; a looser one widens the probe.
    #[allow(clippy::too_many_arguments)]
    fn search_group_filtered(
        &self,
        context: &ReadContext,
        views: &[&SegmentView],
        request: &SearchRequest,
        filter: &Filter,
        mut params: SearchParams,
        scratch: &mut SearchScratch,
        cost: &mut QueryCost,
    ) -> SearcherResult<Vec<(usize, quiver_index::Hit)>> {
        let mut account = |stats: quiver_index::SearchStats| {
            cost.rows_scanned += stats.rows_scanned as u64;
            cost.rows_rescored += stats.rows_rescored as u64;
        };
        let mut allowed = Vec::with_capacity(views.len());
        for view in views {
            let matching = context.filter_rows(&view.entry.key, &view.segment, filter)?;
            allowed.push(&*matching - &view.blocked);
        }
        let kept: u64 = allowed.iter().map(RoaringBitmap::len).sum();
        if kept == 0 {
            return Ok(Vec::new());
        }
        let rows: u64 = views.iter().map(|view| view.segment.rows()).sum();
        // A looser filter would probe more lists, as many more as the filter is selective.
        let nlist = views[0].segment.header().nlist;
        let base = params
            .nprobe
            .unwrap_or_else(|| quiver_index::default_nprobe(nlist));
        let widened = ((base as f64 * rows as f64 / kept as f64).ceil() as usize).clamp(1, nlist);
        let scanned = (rows * widened as u64).div_ceil(nlist.max(1) as u64);
        if kept <= EXACT_FILTER_ROWS || kept.saturating_mul(EXACT_ROW_COST_IN_CODE_ROWS) <= scanned
        {
            let mut hits = Vec::new();
            for (member, (view, rows)) in views.iter().zip(&allowed).enumerate() {
                if rows.is_empty() {
                    continue;
                }
                let found =
                    view.segment
                        .search_rows(&request.vector, rows.iter(), request.k, scratch)?;
                account(scratch.stats);
                hits.extend(found.into_iter().map(|hit| (member, hit)));
            }
            return Ok(hits);
        }
        params.nprobe = Some(widened);
        let masks: Vec<In<'_>> = allowed.iter().map(In).collect();
        let probes: Vec<SharedProbe<'_, CachedObject>> = views
            .iter()
            .zip(&masks)
            .map(|(view, mask)| SharedProbe {
                segment: view.segment.as_ref(),
                filter: Some(mask as &dyn RowFilter),
            })
            .collect();
        let hits = search_shared(&probes, &request.vector, &params, scratch)?;
        account(scratch.stats);
        Ok(hits)
    }

    /// Reads what `request` wants of one hit: its id, payload and vector.
    fn hit_of(
        &self,
        source: HitSource,
        score: f32,
        request: &SearchRequest,
    ) -> SearcherResult<ShardHit> {
        match source {
            HitSource::Tail { position } => {
                let (chunk, index) = self.tail.locate(position);
                Ok(ShardHit {
                    id: chunk.ids[index].clone(),
                    score,
                    payload: chunk.payloads[index]
                        .clone()
                        .filter(|_| request.include_payload),
                    vector: request.include_vector.then(|| {
                        chunk.vectors[index * self.dimension..][..self.dimension].to_vec()
                    }),
                })
            }
            HitSource::Segment { index, row } => {
                let segment = &self.segments[index].segment;
                let payload = if request.include_payload {
                    segment.payload(row)?
                } else {
                    None
                };
                let vector = if request.include_vector {
                    Some(segment.vector(row)?)
                } else {
                    None
                };
                Ok(ShardHit {
                    id: segment.id(row)?,
                    score,
                    payload,
                    vector,
                })
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
            if let Some(newest) = self.tail.get(id) {
                if let Some((vector, payload)) = newest {
                    found.push(PointRecord {
                        id: id.clone(),
                        payload: payload.cloned(),
                        vector: include_vector.then(|| vector.to_vec()),
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

/// Groups segments by the codebook they were built with, in manifest order.
fn codebook_groups(segments: &[SegmentView]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_codebook: HashMap<u64, usize> = HashMap::new();
    for (index, view) in segments.iter().enumerate() {
        match view.segment.header().codebook {
            Some(codebook) => match by_codebook.get(&codebook.id) {
                Some(&group) => groups[group].push(index),
                None => {
                    by_codebook.insert(codebook.id, groups.len());
                    groups.push(vec![index]);
                }
            },
            None => groups.push(vec![index]),
        }
    }
    groups
}

/// Runs one search's share of a batch, adding the time it took and the
/// region-cache reads it made (on this thread) to its cost.
fn measured<T>(
    cost: &mut QueryCost,
    work: impl FnOnce(&mut QueryCost) -> SearcherResult<T>,
) -> SearcherResult<T> {
    let started = std::time::Instant::now();
    let before = ReadCounts::of_this_thread();
    let result = work(cost);
    let reads = ReadCounts::of_this_thread().since(before);
    cost.cache_regions_hit += reads.region_hits;
    cost.cache_regions_missed += reads.region_misses;
    cost.bytes_fetched += reads.bytes_fetched;
    cost.row_reads_local += reads.row_hits;
    cost.row_reads_remote += reads.row_misses;
    cost.store_wait_ms += reads.store_wait_nanos as f64 / 1e6;
    cost.search_ms += started.elapsed().as_secs_f64() * 1e3;
    result
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
