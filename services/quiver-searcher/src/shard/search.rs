//! Searching a [`ShardView`]: one search, or a batch run together segment
//! group by segment group; filters answered exactly or by a widened probe; the
//! hits' ids, payloads and vectors read at the end.

use quiver_blobcache::{CachedObject, ReadCounts};
use quiver_index::{
    CalibratedProbe, Filter, RowFilter, SearchParams, SearchScratch, Segment, SharedProbe,
    SharedSearch, probe_for_k, search_shared,
};
use roaring::RoaringBitmap;

use super::{QueryCost, SearchRequest, SegmentView, ShardHit, ShardView, counted};
use crate::context::ReadContext;
use crate::error::{SearcherError, SearcherResult};
use crate::ranking::{Best, HitSource};

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
/// A filtered search probes at least the nearest lists holding this many of
/// the rows it keeps per hit asked for. The calibrated probe says where a
/// query's ten nearest rows lie; a filter's ten nearest kept rows lie as far
/// out as its hundred or thousand nearest. Segments calibrated for the hundred
/// nearest too (`SegmentEntry::wide_nprobe`) give a filter keeping a share `s`
/// of the rows the probe calibrated for `k / s` hits ([`probe_for_k`]); this
/// floor is for the others, and past a hundred. Widening the narrow probe by
/// the filter's selectivity alone covers it when that probe is wide (real
/// embeddings: hundreds of lists), not when it is one list: with small tight
/// clusters (50k × 1024-d, 2,000 clusters of 25) the calibration probes the
/// query's own list, a 10 % filter widened that to ten lists, and recall@10
/// was 0.43; the nearest lists holding 100 kept rows per hit (a third of the
/// rows there) find 0.71; the wide calibration's lists 0.97 or more.
const FILTER_ROWS_PER_HIT: u64 = 100;

/// The default probes of a group of segments sharing a codebook: the one
/// calibrated for ten hits and, if calibrated, the one for a hundred.
#[derive(Clone, Copy)]
struct DefaultProbes {
    narrow: CalibratedProbe,
    wide: Option<CalibratedProbe>,
}

/// Of a group's members, as `(rows, calibrated_rows)`, the rows of the
/// calibration its probes come from: the one made over the most rows not
/// above the group's (a codebook's probe is first calibrated on the rows that
/// trained it, then again over its group as flushes grow it, and with more
/// rows under the same lists fewer of them reach the same recall), else —
/// when merges have since taken rows out of the group — the one over the
/// fewest. Members that record none (`None`, taken as 0) count as calibrated
/// over their own rows: any recorded calibration within the group wins.
fn calibration_rows(members: impl Iterator<Item = (u32, Option<u64>)> + Clone) -> u64 {
    let group_rows: u64 = members.clone().map(|(rows, _)| rows as u64).sum();
    let calibrated = members.map(|(_, calibrated)| calibrated.unwrap_or(0));
    calibrated
        .clone()
        .filter(|&rows| rows <= group_rows)
        .max()
        .or_else(|| calibrated.min())
        .unwrap_or(0)
}

impl DefaultProbes {
    /// The group's calibrated probes: those of its members calibrated over
    /// the rows [`calibration_rows`] picks (the widest among them; the
    /// index's size-based default for members that record none).
    fn of(views: &[&SegmentView]) -> DefaultProbes {
        let chosen = calibration_rows(
            views
                .iter()
                .map(|view| (view.entry.rows, view.entry.calibrated_rows)),
        );
        let views: Vec<&SegmentView> = views
            .iter()
            .copied()
            .filter(|view| view.entry.calibrated_rows.unwrap_or(0) == chosen)
            .collect();
        let widest_milli = |milli: &dyn Fn(&SegmentView) -> Option<u32>| {
            views
                .iter()
                .filter_map(|view| milli(view))
                .max()
                .map(|milli| milli as f32 / 1000.0)
        };
        let nlist = views.first().map_or(1, |view| view.segment.header().nlist);
        let narrow = CalibratedProbe {
            nprobe: views
                .iter()
                .filter_map(|view| view.entry.default_nprobe)
                .max()
                .map_or_else(
                    || quiver_index::default_nprobe(nlist),
                    |nprobe| nprobe as usize,
                ),
            ratio: widest_milli(&|view| view.entry.probe_ratio_milli),
        };
        let wide = views
            .iter()
            .filter_map(|view| view.entry.wide_nprobe)
            .max()
            .map(|nprobe| CalibratedProbe {
                nprobe: nprobe as usize,
                ratio: widest_milli(&|view| view.entry.wide_probe_ratio_milli),
            });
        DefaultProbes { narrow, wide }
    }

    /// The default probe for `hits` hits.
    fn for_hits(&self, hits: usize) -> CalibratedProbe {
        probe_for_k(hits, self.narrow, self.wide)
    }
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
        self.check_batch(requests)?;
        self.search_batch_checked(context, requests, scratch)
    }

    /// [`ShardView::search_batch`] of searches that already passed
    /// [`ShardView::check_batch`] (the gRPC handler checks a batch once, then
    /// runs it in parts).
    pub fn search_batch_checked(
        &self,
        context: &ReadContext,
        requests: &[SearchRequest],
        scratch: &mut SearchScratch,
    ) -> SearcherResult<Vec<(Vec<ShardHit>, QueryCost)>> {
        counted(self.search_checked(context, requests, scratch))
    }

    /// Refuses a batch holding a search this shard cannot answer, naming it
    /// (`searches[i]`) and what is wrong with it.
    pub fn check_batch(&self, requests: &[SearchRequest]) -> SearcherResult<()> {
        for (index, request) in requests.iter().enumerate() {
            self.check(request).map_err(|error| match error {
                SearcherError::InvalidArgument(message) => {
                    SearcherError::InvalidArgument(format!("searches[{index}]: {message}"))
                }
                other => other,
            })?;
        }
        Ok(())
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
        quiver_index::validate_query(&request.vector, self.dimension, self.metric)
            .map_err(|error| SearcherError::InvalidArgument(error.message()))
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
                let ranked = std::mem::take(&mut best.heap).into_sorted_vec();
                self.fetch_hits_ahead(ranked.iter().map(|ranked| &ranked.source), request);
                ranked
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
        // the probes calibrated for the codebook (the largest are the safest).
        let defaults = DefaultProbes::of(&views);
        let params_of = |request: &SearchRequest| {
            let mut params = SearchParams::new(request.k);
            // A query's own nprobe counts lists; without one, the probe
            // calibrated for its k (a ratio: lists chosen by distance).
            match request.nprobe {
                Some(nprobe) => params.nprobe = Some(nprobe),
                None => {
                    let probe = defaults.for_hits(request.k);
                    params.nprobe = Some(probe.nprobe);
                    params.probe_ratio = probe.ratio;
                }
            }
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
                        context, &views, request, filter, params, &defaults, scratch, cost,
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
        defaults: &DefaultProbes,
        scratch: &mut SearchScratch,
        cost: &mut QueryCost,
    ) -> SearcherResult<Vec<(usize, quiver_index::Hit)>> {
        let mut account = |stats: quiver_index::SearchStats| {
            cost.rows_scanned += stats.rows_scanned as u64;
            cost.rows_rescored += stats.rows_rescored as u64;
        };
        let mut allowed = Vec::with_capacity(views.len());
        let filter_key = filter.to_wire();
        for view in views {
            let matching =
                context.filter_rows(&view.entry.key, &view.segment, filter, &filter_key)?;
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
        let for_hits = (request.k as u64)
            .saturating_mul(FILTER_ROWS_PER_HIT)
            .saturating_mul(nlist as u64)
            .div_ceil(kept);
        // Without a query's own nprobe: the probe calibrated for as many hits
        // as the filter's selectivity says lie around its k kept ones.
        let calibrated = match request.nprobe {
            Some(_) => 0,
            None => {
                let around = (request.k as u64).saturating_mul(rows).div_ceil(kept);
                defaults
                    .for_hits(around.min(usize::MAX as u64) as usize)
                    .nprobe
            }
        };
        let widened = ((base as f64 * rows as f64 / kept as f64).ceil() as usize)
            .max(for_hits.min(nlist as u64) as usize)
            .max(calibrated)
            .clamp(1, nlist);
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
        if kept < rows {
            // Lists counted, widened for the rows the filter leaves out.
            params.nprobe = Some(widened);
            params.probe_ratio = None;
        }
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

    /// Asks each segment holding hits for their ids, payloads and vectors (as
    /// `request` wants them) together, before [`Self::hit_of`] reads them one
    /// by one: a cold cache waits for the store twice in all, not once or
    /// twice per hit and segment.
    fn fetch_hits_ahead<'h>(
        &self,
        hits: impl Iterator<Item = &'h HitSource>,
        request: &SearchRequest,
    ) {
        let mut rows: Vec<(usize, u32)> = hits
            .filter_map(|source| match *source {
                HitSource::Segment { index, row } => Some((index, row)),
                HitSource::Tail { .. } => None,
            })
            .collect();
        rows.sort_unstable();
        let ordered: Vec<u32> = rows.iter().map(|&(_, row)| row).collect();
        let mut start = 0;
        let hits: Vec<(&Segment<CachedObject>, &[u32])> = rows
            .chunk_by(|a, b| a.0 == b.0)
            .map(|same| {
                start += same.len();
                let rows = &ordered[start - same.len()..start];
                (&*self.segments[same[0].0].segment, rows)
            })
            .collect();
        Segment::fetch_hits_ahead_together(&hits, request.include_payload, request.include_vector);
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
                        .as_ref()
                        .filter(|_| request.include_payload)
                        .map(|payload| serde_json::to_vec(payload).unwrap_or_default()),
                    vector: request.include_vector.then(|| {
                        chunk.vectors[index * self.dimension..][..self.dimension].to_vec()
                    }),
                })
            }
            HitSource::Segment { index, row } => {
                let segment = &self.segments[index].segment;
                // The stored JSON text, passed on as it is.
                let payload = if request.include_payload {
                    segment.payload_bytes(row)?
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
    cost.store_waits += reads.store_waits;
    cost.search_ms += started.elapsed().as_secs_f64() * 1e3;
    result
}

#[cfg(test)]
mod tests {
    use super::calibration_rows;

    fn chosen(members: &[(u32, Option<u64>)]) -> u64 {
        calibration_rows(members.iter().copied())
    }

    #[test]
    fn a_group_takes_the_probes_calibrated_over_the_most_rows_it_still_holds() {
        // The first flush trained and calibrated the codebook on its 17k
        // rows; flushes after the group grew carry calibrations over more.
        assert_eq!(
            chosen(&[
                (17_000, Some(17_000)),
                (17_000, Some(17_000)),
                (17_000, Some(34_000)),
            ]),
            34_000
        );
        // A calibration over more rows than the group holds (a merge took
        // some out) is too narrow for it.
        assert_eq!(
            chosen(&[
                (17_000, Some(17_000)),
                (17_000, Some(34_000)),
                (17_000, Some(68_000)),
            ]),
            34_000
        );
        assert_eq!(
            chosen(&[
                (17_000, Some(17_000)),
                (17_000, Some(34_000)),
                (17_000, Some(34_000)),
                (17_000, Some(68_000)),
                (17_000, Some(68_000)),
            ]),
            68_000
        );
        // Merges took most of its rows out: the narrowest calibration left
        // is over more rows than remain, so the one over the fewest serves.
        assert_eq!(
            chosen(&[(10_000, Some(68_000)), (10_000, Some(34_000))]),
            34_000
        );
        // Members from before calibrations recorded their rows count as
        // calibrated over their own: a recorded one within the group wins.
        assert_eq!(chosen(&[(17_000, None), (17_000, Some(34_000))]), 34_000);
        assert_eq!(chosen(&[(17_000, None), (17_000, None)]), 0);
    }
}
