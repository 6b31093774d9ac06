//! IVF + RaBitQ search over one segment, and exact (flat) search as the reference.
//!
//! Keys are "smaller is better" internally: squared distance for l2, negated inner
//! product for dot and cosine. Hits carry the user-facing score.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use quiver_simd::{BulkOp, EstimateTerms, RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS};

use crate::error::{IndexError, IndexResult};
use crate::format::SectionKind;
use crate::params::{Metric, Probe, RawPrecision, SearchParams};
use crate::rabitq::{self, FACTOR_BLOCK_BYTES};
use crate::reader::{ListEntry, Segment};
use crate::source::{ByteSource, ReadSession};

mod shared;

use shared::finish_shared;
pub use shared::{SharedProbe, SharedSearch, search_shared};

/// Lists scored exactly beyond 1.5 × `nprobe`, so the 1-bit list estimates only
/// have to put the right lists in a generous shortlist.
const PROBE_SHORTLIST_EXTRA: usize = 32;

/// How much farther than the ratio a list's estimated distance may be and still
/// be shortlisted when lists are chosen by distance: room for the estimates'
/// error (the exact distances then decide).
const RATIO_SHORTLIST_SLACK: f32 = 1.1;

/// Counts the lists whose squared distance (`key + offset`) is within `factor`
/// times the nearest one's.
fn lists_within(keys: &[(f32, u32)], offset: f32, factor: f32) -> usize {
    let nearest = keys
        .iter()
        .map(|&(key, _)| key + offset)
        .fold(f32::INFINITY, f32::min)
        .max(0.0);
    let limit = nearest * factor - offset;
    keys.iter().filter(|&&(key, _)| key <= limit).count()
}

/// One result: a row of a segment and its score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    /// Row in the segment.
    pub row: u32,
    /// Cosine similarity, inner product, or squared distance (by metric).
    pub score: f32,
}

/// Decides which rows may be returned (deletions, filters).
pub trait RowFilter: Sync {
    /// Returns true when `row` may be returned.
    fn allows(&self, row: u32) -> bool;
}

impl<F: Fn(u32) -> bool + Sync> RowFilter for F {
    fn allows(&self, row: u32) -> bool {
        self(row)
    }
}

/// Counters of the last search through a scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Lists probed (of the shard: a list probed in every member of a
    /// shared search counts once).
    pub lists_probed: usize,
    /// Rows whose codes were scored.
    pub rows_scanned: usize,
    /// Rows rescored with full vectors.
    pub rows_rescored: usize,
}

#[derive(Clone, Copy, Debug, Default)]
struct Candidate {
    key: f32,
    lower: f32,
    row: u32,
}

/// A ranked row: its key and its handle (member segment << 32 | row).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ranked {
    key: f32,
    handle: u64,
}

/// Returns the handle of `row` of member segment `member`.
#[inline]
fn handle(member: usize, row: u32) -> u64 {
    ((member as u64) << 32) | u64::from(row)
}

/// Returns the member segment and row of a handle.
#[inline]
fn unhandle(handle: u64) -> (usize, u32) {
    ((handle >> 32) as usize, handle as u32)
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .total_cmp(&other.key)
            .then(self.handle.cmp(&other.handle))
    }
}

/// The best `k` (smallest keys) seen so far.
struct TopK {
    k: usize,
    heap: BinaryHeap<Ranked>,
}

impl TopK {
    fn new(k: usize, heap: BinaryHeap<Ranked>) -> Self {
        let mut top = TopK { k, heap };
        top.heap.clear();
        top
    }

    /// Returns the key a new row must beat to enter.
    fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::INFINITY
        } else {
            self.heap.peek().map_or(f32::INFINITY, |r| r.key)
        }
    }

    fn push(&mut self, key: f32, handle: u64) {
        if self.heap.len() < self.k {
            self.heap.push(Ranked { key, handle });
        } else if key < self.threshold() {
            self.heap.pop();
            self.heap.push(Ranked { key, handle });
        }
    }
}

/// Buffers reused from query to query, so a search allocates nothing per row.
#[derive(Default)]
pub struct SearchScratch {
    query: Vec<f32>,
    rotated: Vec<f32>,
    planes: Vec<u64>,
    list_keys: Vec<(f32, u32)>,
    /// The lists left out of `list_keys`, nearest first, once a search needs
    /// more rows than its chosen lists hold (`rank_unchosen_lists`).
    more_lists: Vec<(f32, u32)>,
    list_dots: Vec<f32>,
    /// The shortlisted lists and their centroids' inner products with the
    /// query (`choose_lists`).
    shortlist_rows: Vec<u32>,
    shortlist_dots: Vec<f32>,
    keys: Vec<f32>,
    lowers: Vec<f32>,
    masks: Vec<u32>,
    counts: Vec<u32>,
    candidates: Vec<Candidate>,
    /// Candidates waiting for the rescoring, with their member (see [`Ranking`]).
    pending: Vec<(usize, Candidate)>,
    upper_heap: BinaryHeap<Ranked>,
    row_scores: Vec<f32>,
    heap: BinaryHeap<Ranked>,
    reserve: BinaryHeap<Ranked>,
    fetch_ranges: Vec<(u64, usize)>,
    /// Per member of a shared search, the ranges of its rows to fetch ahead.
    member_ranges: Vec<Vec<(u64, usize)>>,
    /// Counters of the last search.
    pub stats: SearchStats,
}

impl SearchScratch {
    /// Returns empty buffers.
    pub fn new() -> Self {
        SearchScratch::default()
    }
}

fn to_score(metric: Metric, key: f32) -> f32 {
    match metric {
        Metric::L2 => key,
        Metric::Dot | Metric::Cosine => -key,
    }
}

/// The rotated, quantized query and its squared norm, shared by every list.
struct EncodedQuery {
    quantized: rabitq::QuantizedQuery,
    norm_sq: f32,
}

/// What a search has ranked so far: the exact top-k, the reserve of rows the
/// bound ruled out (best by estimate), the `k` smallest upper bounds of the
/// candidates seen, and how many rows were rescored.
///
/// Nothing is rescored while the lists are scanned: each list's candidates
/// wait in `SearchScratch::pending`, bounded by `uppers` (each row's exact key
/// lies within its estimate ± the error bound, so a row whose lower bound is
/// past the k-th smallest upper bound cannot enter the top-k), and once every
/// list is scanned they are rescored most hopeful first, their rows fetched
/// ahead in a run or two ([`SharedSearch`]'s `rescore_pending`). Rescoring list
/// by list waited for the store once per list holding a candidate — 10.4 round
/// trips per query on average, up to 92, on real 100k × 384 at recall 0.976,
/// against 1.65 (up to 6) — and rescored 120 rows per query where the global
/// order rescores 86 (`quiver-bench` example `cold_rounds`).
struct Ranking {
    top: TopK,
    reserve: TopK,
    uppers: TopK,
    rescored: usize,
}

impl Ranking {
    /// The key a row's lower bound must beat to be a candidate.
    #[inline]
    fn candidate_bound(&self) -> f32 {
        self.top.threshold().min(self.uppers.threshold())
    }
}

/// The hot loop of a list scan: walks the blocks' masks of rows whose estimate
/// may enter the top-k or the reserve; rows whose lower bound beats
/// `threshold` become candidates (`scratch.candidates`), the others go to the
/// reserve. Padding lanes past the list's end are never looked at.
#[inline]
fn select_candidates(
    entry: ListEntry,
    member: usize,
    threshold: f32,
    filter: Option<&dyn RowFilter>,
    scratch: &mut SearchScratch,
    reserve: &mut TopK,
) {
    scratch.candidates.clear();
    let blocks = (entry.rows as usize).div_ceil(RABITQ_BLOCK_ROWS);
    for (block, &block_mask) in scratch.masks[..blocks].iter().enumerate() {
        let lanes = (entry.rows as usize - block * RABITQ_BLOCK_ROWS).min(RABITQ_BLOCK_ROWS);
        let mut mask = if lanes == RABITQ_BLOCK_ROWS {
            block_mask
        } else {
            block_mask & ((1u32 << lanes) - 1)
        };
        while mask != 0 {
            let lane = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let position = block * RABITQ_BLOCK_ROWS + lane;
            let (key, lower) = (scratch.keys[position], scratch.lowers[position]);
            let row = entry.row_start + position as u32;
            if filter.is_some_and(|f| !f.allows(row)) {
                continue;
            }
            if lower < threshold {
                scratch.candidates.push(Candidate { key, lower, row });
            } else {
                reserve.push(key, handle(member, row));
            }
        }
    }
}

/// Makes `buffer` at least `length` long (never shorter).
#[inline]
fn grow<T: Copy>(buffer: &mut Vec<T>, length: usize, fill: T) {
    if buffer.len() < length {
        buffer.resize(length, fill);
    }
}

/// Keeps a list's candidates for the rescoring after the scan (see
/// [`Ranking`]): each one's upper bound joins `uppers`, and those whose lower
/// bound is already past the k-th upper bound go to the reserve instead.
fn defer_candidates(member: usize, scratch: &mut SearchScratch, ranking: &mut Ranking) {
    for candidate in &scratch.candidates {
        ranking
            .uppers
            .push(2.0 * candidate.key - candidate.lower, 0);
    }
    let bound = ranking.uppers.threshold();
    for &candidate in &scratch.candidates {
        if candidate.lower < bound {
            scratch.pending.push((member, candidate));
        } else {
            ranking
                .reserve
                .push(candidate.key, handle(member, candidate.row));
        }
    }
}

impl<S: ByteSource> Segment<S> {
    fn prepare_query(&self, query: &[f32], scratch: &mut SearchScratch) -> IndexResult<()> {
        if query.len() != self.header.dim {
            return Err(IndexError::InvalidArgument(format!(
                "query has dimension {}, the segment has dimension {}",
                query.len(),
                self.header.dim
            )));
        }
        crate::writer::validate_query(query, self.header.dim, self.header.metric)?;
        if self.header.metric == Metric::Cosine {
            crate::writer::normalize_into(query, &mut scratch.query);
        } else {
            scratch.query.clear();
            scratch.query.extend_from_slice(query);
        }
        Ok(())
    }

    fn exact_key(&self, query: &[f32], raw: &[u8]) -> IndexResult<f32> {
        let dot_op = self.header.metric != Metric::L2;
        Ok(match self.header.raw_precision {
            RawPrecision::F32 => {
                let row: &[f32] = self.cast("raw vector", raw)?;
                if dot_op {
                    -quiver_simd::dot_f32(query, row)
                } else {
                    quiver_simd::l2sq_f32(query, row)
                }
            }
            RawPrecision::Bf16 => {
                let row: &[u16] = self.cast("raw vector", raw)?;
                if dot_op {
                    -quiver_simd::dot_bf16(query, row)
                } else {
                    quiver_simd::l2sq_bf16(query, row)
                }
            }
        })
    }

    /// Scores `row` exactly. Raw vectors are read one row at a time, not through
    /// the query's read session: a cache pins a row's bytes only while it is
    /// scored, so a query never holds the (many, scattered) regions of the
    /// vectors it rescored.
    fn rescore_row(&self, query: &[f32], row: u32) -> IndexResult<f32> {
        let row_bytes = self.header.dim * self.header.raw_precision.value_bytes();
        let raw = self.read(
            SectionKind::RawVectors,
            row as u64 * row_bytes as u64,
            row_bytes,
        )?;
        self.exact_key(query, &raw)
    }

    /// Asks the source to make the raw vectors of `rows` resident together before
    /// they are read one by one (see [`ByteSource::fetch_ahead`]); `ranges` is
    /// scratch space.
    pub(super) fn fetch_rows_ahead(
        &self,
        rows: impl Iterator<Item = u32>,
        ranges: &mut Vec<(u64, usize)>,
    ) {
        self.row_ranges(rows, ranges);
        if ranges.len() > 1 {
            self.source.fetch_ahead(ranges);
        }
    }

    /// Sets `ranges` to the ranges of the raw vectors of `rows`.
    pub(super) fn row_ranges(
        &self,
        rows: impl Iterator<Item = u32>,
        ranges: &mut Vec<(u64, usize)>,
    ) {
        let row_bytes = self.header.dim * self.header.raw_precision.value_bytes();
        let raw = self.section(SectionKind::RawVectors).offset;
        ranges.clear();
        ranges.extend(rows.map(|row| (raw + row as u64 * row_bytes as u64, row_bytes)));
    }

    /// Sets `ranges` to the ranges of the codes of the probed `lists`, in the
    /// order they are scanned (see [`ByteSource::fetch_scan_ahead_together`]).
    pub(super) fn list_ranges(&self, lists: &[(f32, u32)], ranges: &mut Vec<(u64, usize)>) {
        let block_bytes =
            (self.header.padded_dim / 64) * RABITQ_BLOCK_ROWS * 8 + FACTOR_BLOCK_BYTES;
        let codes = self.section(SectionKind::Codes).offset;
        ranges.clear();
        ranges.extend(lists.iter().filter_map(|&(_, list)| {
            let entry = self.lists.get(list as usize)?;
            (entry.rows > 0).then(|| {
                (
                    codes + entry.block_start as u64 * block_bytes as u64,
                    (entry.rows as usize).div_ceil(RABITQ_BLOCK_ROWS) * block_bytes,
                )
            })
        }));
    }

    /// Returns the approximate top-`k` rows for `query` (IVF + RaBitQ + rescoring).
    ///
    /// Lists are probed nearest first. Every scanned row gets an estimated key and
    /// a lower bound (estimate − `bound_sigma` standard deviations); rows whose lower
    /// bound beats the k-th smallest upper bound seen so far are candidates. Once
    /// every list is scanned the candidates are rescored with their full vector,
    /// lowest lower bound first, until the next one's lower bound no longer beats
    /// the k-th exact key (their rows fetched ahead in a few runs, see
    /// `Ranking`). Of the rows the bound ruled out, the best `k × rescore` by
    /// estimate are rescored at the end too, a guard against the bound's rare
    /// misses.
    pub fn search(
        &self,
        query: &[f32],
        params: &SearchParams,
        filter: Option<&dyn RowFilter>,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Hit>> {
        let member = SharedProbe {
            segment: self,
            filter,
        };
        let hits = search_shared(std::slice::from_ref(&member), query, params, scratch)?;
        Ok(hits.into_iter().map(|(_, hit)| hit).collect())
    }

    /// Checks that `self` has the same lists as `lead` (one codebook).
    pub(crate) fn check_shares_lists_with(&self, lead: &Segment<S>) -> IndexResult<()> {
        let (a, b) = (&lead.header, &self.header);
        let same = a.codebook.is_some()
            && a.codebook.map(|c| c.id) == b.codebook.map(|c| c.id)
            && a.dim == b.dim
            && a.padded_dim == b.padded_dim
            && a.metric == b.metric
            && a.nlist == b.nlist
            && a.rotation_seed == b.rotation_seed;
        if same {
            Ok(())
        } else {
            Err(IndexError::InvalidArgument(format!(
                "segments {} and {} do not share one codebook; search them separately",
                lead.name(),
                self.name()
            )))
        }
    }

    /// Rotates the prepared query into the codes' space and quantizes it to
    /// bit planes (`scratch.rotated`, `scratch.planes`).
    fn encode_query(&self, scratch: &mut SearchScratch) -> EncodedQuery {
        let padded_dim = self.header.padded_dim;
        let words = padded_dim / 64;
        scratch.rotated.resize(padded_dim, 0.0);
        self.rotation.apply(&scratch.query, &mut scratch.rotated);
        scratch.planes.resize(RABITQ_QUERY_BITS * words, 0);
        let quantized = rabitq::quantize_query(&scratch.rotated, &mut scratch.planes);
        let norm_sq = quiver_simd::dot_f32(&scratch.rotated, &scratch.rotated);
        EncodedQuery { quantized, norm_sq }
    }

    /// Picks the lists to probe into `scratch.list_keys` — the `nprobe` nearest,
    /// or those within a distance ratio of the nearest (see [`Probe`]) — nearest
    /// first, and keeps each one's exact query·centroid in `scratch.list_dots`.
    ///
    /// Every list's key is estimated from the centroids' 1-bit codes, then a
    /// shortlist is scored exactly. Lists were clustered by Euclidean distance,
    /// so for l2 and cosine (unit vectors) the nearest centroids are probed:
    /// ranking by inner product would favour tight clusters, whose centroids are
    /// longer, and miss neighbours in looser ones. Only for dot is the query's
    /// inner product the ranking.
    fn choose_lists(&self, encoded: &EncodedQuery, probe: Probe, scratch: &mut SearchScratch) {
        let nlist = self.header.nlist;
        let query_norm_sq = encoded.norm_sq;
        self.tables.list_codes.estimate(
            &scratch.planes,
            &encoded.quantized,
            query_norm_sq,
            &mut scratch.counts,
            &mut scratch.list_keys,
        );
        // The lists whose keys are computed exactly: a shortlist by estimate.
        let shortlist = match probe {
            Probe::Nearest(nprobe) => nprobe + nprobe / 2 + PROBE_SHORTLIST_EXTRA,
            Probe::Within { ratio, min, max } => {
                // Every list whose estimated distance is within the ratio, with
                // room for the estimates' error. Cosine estimates leave out the
                // query's squared norm (a constant), distances need it.
                let offset = if self.header.metric == Metric::L2 {
                    0.0
                } else {
                    query_norm_sq
                };
                let within = lists_within(
                    &scratch.list_keys,
                    offset,
                    (1.0 + ratio) * RATIO_SHORTLIST_SLACK,
                );
                (within + within / 4 + PROBE_SHORTLIST_EXTRA)
                    .min(max + max / 2 + PROBE_SHORTLIST_EXTRA)
                    .max(min + min / 2 + PROBE_SHORTLIST_EXTRA)
            }
        }
        .min(nlist);
        if shortlist < nlist {
            scratch
                .list_keys
                .select_nth_unstable_by(shortlist - 1, |a, b| a.0.total_cmp(&b.0));
            scratch.list_keys.truncate(shortlist);
        }
        // One inner product per shortlisted list, kept for the scan; the
        // shortlisted centroids are scattered over the centroid table, so they
        // are gathered with the next ones prefetched meanwhile.
        scratch.list_dots.resize(nlist, 0.0);
        scratch.shortlist_rows.clear();
        scratch
            .shortlist_rows
            .extend(scratch.list_keys.iter().map(|&(_, list)| list));
        self.score_shortlisted_centroids(scratch);
        for ((key, list), &dot) in scratch
            .list_keys
            .iter_mut()
            .zip(scratch.shortlist_dots.iter())
        {
            let list = *list as usize;
            scratch.list_dots[list] = dot;
            *key = self.list_key(query_norm_sq, list, dot);
        }
        let nprobe = match probe {
            Probe::Nearest(nprobe) => nprobe,
            Probe::Within { ratio, min, max } => {
                lists_within(&scratch.list_keys, 0.0, 1.0 + ratio).clamp(min.max(1), max)
            }
        };
        if nprobe < scratch.list_keys.len() {
            scratch
                .list_keys
                .select_nth_unstable_by(nprobe - 1, |a, b| a.0.total_cmp(&b.0));
            scratch.list_keys.truncate(nprobe);
        }
        scratch
            .list_keys
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// Writes into `out` every list's key for `query` as a probe ranks the lists
    /// (the exact keys of [`Segment::choose_lists`], from the bf16 centroids):
    /// the squared distance to its centroid, or for dot the negated inner
    /// product. What a calibration needs to tell, without searching, the ratio
    /// or the count of lists at which each list is probed.
    pub(crate) fn list_keys(
        &self,
        query: &[f32],
        scratch: &mut SearchScratch,
        out: &mut Vec<f32>,
    ) -> IndexResult<()> {
        self.prepare_query(query, scratch)?;
        let encoded = self.encode_query(scratch);
        let nlist = self.header.nlist;
        scratch.shortlist_rows.clear();
        scratch.shortlist_rows.extend(0..nlist as u32);
        self.score_shortlisted_centroids(scratch);
        out.clear();
        out.extend(
            scratch
                .shortlist_dots
                .iter()
                .enumerate()
                .map(|(list, &dot)| self.list_key(encoded.norm_sq, list, dot)),
        );
        Ok(())
    }

    /// Ranks the lists that `choose_lists` left out (`scratch.list_keys` holds
    /// the chosen ones), nearest first, into `scratch.more_lists`, and records
    /// their centroids' inner products in `scratch.list_dots`: where a search
    /// whose chosen lists held fewer than k rows it may return goes on.
    fn rank_unchosen_lists(&self, query_norm_sq: f32, scratch: &mut SearchScratch) {
        let nlist = self.header.nlist;
        let mut chosen = vec![false; nlist];
        for &(_, list) in &scratch.list_keys {
            chosen[list as usize] = true;
        }
        scratch.shortlist_rows.clear();
        scratch
            .shortlist_rows
            .extend((0..nlist as u32).filter(|&list| !chosen[list as usize]));
        self.score_shortlisted_centroids(scratch);
        scratch.more_lists.clear();
        for (&list, &dot) in scratch.shortlist_rows.iter().zip(&scratch.shortlist_dots) {
            scratch.list_dots[list as usize] = dot;
            scratch
                .more_lists
                .push((self.list_key(query_norm_sq, list as usize, dot), list));
        }
        scratch
            .more_lists
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// Scores the centroids of `scratch.shortlist_rows` against the rotated
    /// query into `scratch.shortlist_dots`, from the bf16 table (the
    /// shortlisted centroids are scattered over it, so they are gathered with
    /// the next ones prefetched meanwhile).
    fn score_shortlisted_centroids(&self, scratch: &mut SearchScratch) {
        scratch.shortlist_dots.clear();
        scratch
            .shortlist_dots
            .resize(scratch.shortlist_rows.len(), 0.0);
        quiver_simd::score_bf16_gather(
            quiver_simd::BulkOp::Dot,
            &scratch.rotated,
            &self.tables.bf16,
            &scratch.shortlist_rows,
            &mut scratch.shortlist_dots,
        );
    }

    /// A list's exact key — its centroid's squared distance to the query, or
    /// for dot the negated inner product — from the query's squared norm and
    /// the centroid's inner product with it.
    fn list_key(&self, query_norm_sq: f32, list: usize, dot: f32) -> f32 {
        if self.header.metric == Metric::Dot {
            -dot
        } else {
            query_norm_sq + self.tables.norms[list] - 2.0 * dot
        }
    }

    /// Returns the list `row` belongs to (rows are stored list by list).
    pub(crate) fn list_of_row(&self, row: u32) -> usize {
        self.lists
            .partition_point(|entry| entry.row_start <= row)
            .saturating_sub(1)
    }

    /// Scans one list: estimates every row's key and lower bound from its code,
    /// keeps the hopeful rows as candidates (the others go to the reserve), and
    /// rescores the candidates.
    #[allow(clippy::too_many_arguments)]
    fn probe_list<R: ReadSession>(
        &self,
        member: usize,
        session: &R,
        list: usize,
        encoded: &EncodedQuery,
        params: &SearchParams,
        filter: Option<&dyn RowFilter>,
        scratch: &mut SearchScratch,
        ranking: &mut Ranking,
    ) -> IndexResult<()> {
        let entry = self.lists[list];
        scratch.stats.lists_probed += 1;
        if entry.rows == 0 {
            return Ok(());
        }
        let metric = self.header.metric;
        let words = self.header.padded_dim / 64;
        let (quantized, query_norm_sq) = (&encoded.quantized, encoded.norm_sq);
        let multiplier = rabitq::key_multiplier(metric);
        let block_u64s = words * RABITQ_BLOCK_ROWS;
        let query_dot_centroid = scratch.list_dots[list];
        let residual_norm_sq =
            (query_norm_sq + self.tables.norms[list] - 2.0 * query_dot_centroid).max(0.0);
        let list_constant = match metric {
            Metric::L2 => residual_norm_sq,
            Metric::Dot | Metric::Cosine => -query_dot_centroid,
        };
        let list_term = self.tables.sums[list] - quantized.sum;
        let bound_scale = -multiplier * residual_norm_sq.sqrt() * params.bound_sigma;

        let blocks = (entry.rows as usize).div_ceil(RABITQ_BLOCK_ROWS);
        let block_bytes = block_u64s * 8 + FACTOR_BLOCK_BYTES;
        let list_bytes = self.read_in(
            session,
            SectionKind::Codes,
            (entry.block_start as usize * block_bytes) as u64,
            blocks * block_bytes,
        )?;
        let (code_bytes, factor_bytes) = list_bytes.split_at(blocks * block_u64s * 8);
        let codes: &[u64] = self.cast("codes", code_bytes)?;
        let lanes = blocks * RABITQ_BLOCK_ROWS;
        // The buffers only grow: the kernels write the lanes of this list, and
        // shrinking them for a short list made the next long one zero them again.
        grow(&mut scratch.counts, lanes, 0);
        quiver_simd::rabitq_scan_blocks(
            codes,
            words,
            &scratch.planes,
            &mut scratch.counts[..lanes],
        );
        let factors: &[f32] = self.cast("factors", factor_bytes)?;

        let threshold = ranking.candidate_bound();
        let terms = EstimateTerms {
            low: quantized.low,
            step2: 2.0 * quantized.step,
            list_term,
            list_constant,
            multiplier,
            bound_scale,
            lower_threshold: threshold,
            key_threshold: ranking.reserve.threshold(),
        };
        grow(&mut scratch.keys, lanes, 0.0);
        grow(&mut scratch.lowers, lanes, 0.0);
        grow(&mut scratch.masks, blocks, 0);
        quiver_simd::rabitq_estimate_blocks(
            &scratch.counts[..lanes],
            factors,
            &terms,
            &mut scratch.keys[..lanes],
            &mut scratch.lowers[..lanes],
            &mut scratch.masks[..blocks],
        );
        select_candidates(
            entry,
            member,
            threshold,
            filter,
            scratch,
            &mut ranking.reserve,
        );
        defer_candidates(member, scratch, ranking);
        scratch.stats.rows_scanned += entry.rows as usize;
        Ok(())
    }

    fn finish_hits(&self, top: TopK, scratch: &mut SearchScratch) -> Vec<Hit> {
        finish_shared(self.header.metric, top, scratch)
            .into_iter()
            .map(|(_, hit)| hit)
            .collect()
    }

    /// Returns the exact top-`k` of the given rows (a selective filter's matches):
    /// every listed row is scored with its full vector.
    pub fn search_rows(
        &self,
        query: &[f32],
        rows: impl IntoIterator<Item = u32>,
        k: usize,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Hit>> {
        if k == 0 {
            return Err(IndexError::InvalidArgument("k must be at least 1".into()));
        }
        self.prepare_query(query, scratch)?;
        let mut top = TopK::new(k, std::mem::take(&mut scratch.heap));
        let mut scored = 0;
        // In chunks whose missing rows a cache fetches together: a round trip to
        // the store per chunk, not per row.
        const CHUNK_ROWS: usize = 256;
        let mut rows = rows.into_iter().peekable();
        let mut chunk: Vec<u32> = Vec::with_capacity(CHUNK_ROWS);
        while rows.peek().is_some() {
            chunk.clear();
            chunk.extend(rows.by_ref().take(CHUNK_ROWS));
            for &row in &chunk {
                self.check_row(row)?;
            }
            self.fetch_rows_ahead(chunk.iter().copied(), &mut scratch.fetch_ranges);
            for &row in &chunk {
                top.push(self.rescore_row(&scratch.query, row)?, u64::from(row));
                scored += 1;
            }
        }
        scratch.stats = SearchStats {
            lists_probed: 0,
            rows_scanned: 0,
            rows_rescored: scored,
        };
        Ok(self.finish_hits(top, scratch))
    }

    /// Returns the exact top-`k` rows for `query` by scoring every row's full vector.
    pub fn flat_search(
        &self,
        query: &[f32],
        k: usize,
        filter: Option<&dyn RowFilter>,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Hit>> {
        let mut answers = self.flat_search_many(&[query], k, filter, scratch)?;
        Ok(answers.pop().unwrap_or_default())
    }

    /// Returns the exact top-`k` rows of each query, reading the full vectors
    /// once for all of them: each list's rows are scored against every query
    /// while they are in the CPU's cache, so many queries cost one pass over
    /// memory instead of one each (what calibrating a large segment needs).
    pub fn flat_search_many(
        &self,
        queries: &[&[f32]],
        k: usize,
        filter: Option<&dyn RowFilter>,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<Hit>>> {
        if k == 0 {
            return Err(IndexError::InvalidArgument("k must be at least 1".into()));
        }
        let mut prepared = Vec::with_capacity(queries.len());
        for query in queries {
            self.prepare_query(query, scratch)?;
            prepared.push(scratch.query.clone());
        }
        let dim = self.header.dim;
        let row_bytes = dim * self.header.raw_precision.value_bytes();
        let op = if self.header.metric == Metric::L2 {
            BulkOp::L2Squared
        } else {
            BulkOp::Dot
        };
        let mut tops: Vec<TopK> = prepared
            .iter()
            .enumerate()
            .map(|(index, _)| {
                let heap = if index == 0 {
                    std::mem::take(&mut scratch.heap)
                } else {
                    BinaryHeap::new()
                };
                TopK::new(k, heap)
            })
            .collect();
        for entry in &self.lists {
            if entry.rows == 0 {
                continue;
            }
            let bytes = self.read(
                SectionKind::RawVectors,
                entry.row_start as u64 * row_bytes as u64,
                entry.rows as usize * row_bytes,
            )?;
            scratch.row_scores.resize(entry.rows as usize, 0.0);
            for (query, top) in prepared.iter().zip(&mut tops) {
                match self.header.raw_precision {
                    RawPrecision::F32 => quiver_simd::score_f32_bulk(
                        op,
                        query,
                        self.cast("raw vectors", &bytes)?,
                        &mut scratch.row_scores,
                    ),
                    RawPrecision::Bf16 => quiver_simd::score_bf16_bulk(
                        op,
                        query,
                        self.cast("raw vectors", &bytes)?,
                        &mut scratch.row_scores,
                    ),
                }
                for (offset, &score) in scratch.row_scores.iter().enumerate() {
                    let row = entry.row_start + offset as u32;
                    if filter.is_some_and(|f| !f.allows(row)) {
                        continue;
                    }
                    top.push(
                        if op == BulkOp::Dot { -score } else { score },
                        u64::from(row),
                    );
                }
            }
        }
        scratch.stats = SearchStats {
            lists_probed: self.lists.len(),
            rows_scanned: self.header.rows as usize,
            rows_rescored: 0,
        };
        Ok(tops
            .into_iter()
            .map(|top| self.finish_hits(top, scratch))
            .collect())
    }

    /// The rows of each query's exact top-`k`, best first, for many queries at
    /// once (a calibration's sample): each list's rows are transposed into
    /// blocks of 16 and scored against tiles of 64 queries with the
    /// register-blocked product of k-means assignment, so each row value is
    /// loaded once per 8 queries instead of once per query. The product sums in
    /// another order than a search's rescoring, so it shortlists `2k + 8` rows,
    /// which are rescored exactly and ranked as [`Segment::flat_search_many`]
    /// ranks them (ties by row): the answers a calibration compares a search's
    /// with must break ties as the search does. Bf16 rows and a few queries go
    /// through `flat_search_many` itself; on CPUs with AMX tiles the products
    /// are bf16 with a bound (`exact_rows_on_tiles`).
    pub(crate) fn exact_rows_many(
        &self,
        queries: &[&[f32]],
        k: usize,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<u32>>> {
        /// Fewer queries than this are answered one by one.
        const FEWEST_QUERIES: usize = 16;
        if self.header.raw_precision != RawPrecision::F32 || queries.len() < FEWEST_QUERIES {
            return Ok(self
                .flat_search_many(queries, k, None, scratch)?
                .into_iter()
                .map(|hits| hits.into_iter().map(|hit| hit.row).collect())
                .collect());
        }
        if k == 0 {
            return Err(IndexError::InvalidArgument("k must be at least 1".into()));
        }
        let dim = self.header.dim;
        let mut packed = Vec::with_capacity(queries.len() * dim);
        for query in queries {
            self.prepare_query(query, scratch)?;
            packed.extend_from_slice(&scratch.query);
        }
        if dim >= 32 && quiver_simd::tile_products_available() {
            return self.exact_rows_on_tiles(queries, &packed, k, scratch);
        }
        self.exact_rows_blocked(queries, &packed, k, scratch)
    }

    /// `exact_rows_many` of `queries` (prepared: `packed`, one after another)
    /// with the f32 block kernel.
    fn exact_rows_blocked(
        &self,
        queries: &[&[f32]],
        packed: &[f32],
        k: usize,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<u32>>> {
        const TILE_QUERIES: usize = 64;
        const COLUMNS: usize = quiver_simd::BLOCK_COLUMNS;
        let dim = self.header.dim;
        let l2 = self.header.metric == Metric::L2;
        let shortlist = 2 * k + 8;
        let mut tops: Vec<TopK> = packed
            .chunks_exact(dim)
            .map(|_| TopK::new(shortlist, BinaryHeap::new()))
            .collect();
        let mut blocks: Vec<f32> = Vec::new();
        let mut norms: Vec<f32> = Vec::new();
        // The largest squared norm of a row (bounds the keys' rounding).
        let mut largest_norm = 0f32;
        let mut dots = vec![0f32; TILE_QUERIES * COLUMNS];
        self.for_each_list_rows(|entry, values| {
            let rows = entry.rows as usize;
            // The list's rows transposed, 16 to a block (padding is never scored).
            crate::kmeans::transpose_in_blocks(values, dim, &mut blocks, &mut norms);
            largest_norm = norms[..rows].iter().fold(largest_norm, |a, &b| a.max(b));
            for (tile_index, tile) in packed.chunks(TILE_QUERIES * dim).enumerate() {
                let tile_queries = tile.len() / dim;
                let tile_tops = &mut tops[tile_index * TILE_QUERIES..][..tile_queries];
                for (block, block_values) in blocks.chunks_exact(dim * COLUMNS).enumerate() {
                    let dots = &mut dots[..tile_queries * COLUMNS];
                    quiver_simd::dot_transposed_block(tile, dim, block_values, dots);
                    let block_norms = &norms[block * COLUMNS..][..COLUMNS];
                    let columns = (rows - block * COLUMNS).min(COLUMNS);
                    for (top, query_dots) in tile_tops.iter_mut().zip(dots.chunks_exact(COLUMNS)) {
                        for column in 0..columns {
                            // ‖q − x‖² − ‖q‖² = ‖x‖² − 2·q·x: the query's norm
                            // does not change its order.
                            let key = if l2 {
                                block_norms[column] - 2.0 * query_dots[column]
                            } else {
                                -query_dots[column]
                            };
                            let row = entry.row_start as usize + block * COLUMNS + column;
                            top.push(key, row as u64);
                        }
                    }
                }
            }
            Ok(())
        })?;
        self.finish_exact(
            queries,
            packed,
            tops,
            k,
            (largest_norm.sqrt(), 0.0),
            scratch,
        )
    }

    /// `exact_rows_many` on AMX tiles: each list's rows minus their mean, in
    /// bf16, against every query (`quiver_simd::tile_products`), the mean's own
    /// product added in f32, shortlisting `2k + 8` rows by these approximate
    /// keys, which are rescored exactly. A product is off by at most
    /// ~2⁻⁸·‖q‖·‖x − μ‖, so a query's answer is exact when every row left out
    /// (approximate key at least the shortlist's last) is provably worse than
    /// its k-th; the few queries for which that cannot be shown (exact ties at
    /// the k-th, rows packed tighter than the rounding) are answered again one by
    /// one (see `finish_exact`).
    fn exact_rows_on_tiles(
        &self,
        queries: &[&[f32]],
        packed: &[f32],
        k: usize,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<u32>>> {
        let dim = self.header.dim;
        let count = packed.len() / dim;
        let l2 = self.header.metric == Metric::L2;
        let shortlist = 2 * k + 8;
        let zero = vec![0f32; dim];
        let mut query_tiles = Vec::new();
        quiver_simd::tile_rows(packed, dim, &zero, &mut query_tiles);
        let mut tops: Vec<TopK> = (0..count)
            .map(|_| TopK::new(shortlist, BinaryHeap::new()))
            .collect();
        let (mut largest_offset, mut largest_norm) = (0f32, 0f32);
        let (mut norms, mut products) = (Vec::new(), Vec::new());
        self.for_each_list_rows(|entry, values| {
            let mean = crate::kmeans::mean_of(values.chunks_exact(dim), dim);
            norms.clear();
            for row in values.chunks_exact(dim) {
                let norm = quiver_simd::dot_f32(row, row);
                norms.push(norm);
                largest_norm = largest_norm.max(norm.sqrt());
                largest_offset = largest_offset.max(quiver_simd::l2sq_f32(row, &mean).sqrt());
            }
            let panel = quiver_simd::TilePanel::new(values, dim, &mean);
            let stride = panel.padded_count();
            products.resize(query_tiles.len() / panel.padded_dim() * stride, 0.0);
            quiver_simd::tile_products(&query_tiles, &panel, &mut products);
            for ((top, query), dots) in tops
                .iter_mut()
                .zip(packed.chunks_exact(dim))
                .zip(products.chunks_exact(stride))
            {
                let shift = quiver_simd::dot_f32(query, &mean);
                for (column, (&product, &norm)) in dots.iter().zip(&norms).enumerate() {
                    let dot = product + shift;
                    let key = if l2 { norm - 2.0 * dot } else { -dot };
                    top.push(key, entry.row_start as u64 + column as u64);
                }
            }
            Ok(())
        })?;
        self.finish_exact(
            queries,
            packed,
            tops,
            k,
            (largest_norm, largest_offset),
            scratch,
        )
    }

    /// Calls `visit` with every non-empty list and its rows' f32 vectors.
    fn for_each_list_rows(
        &self,
        mut visit: impl FnMut(&ListEntry, &[f32]) -> IndexResult<()>,
    ) -> IndexResult<()> {
        let row_bytes = self.header.dim * std::mem::size_of::<f32>();
        for entry in &self.lists {
            let rows = entry.rows as usize;
            if rows == 0 {
                continue;
            }
            let bytes = self.read(
                SectionKind::RawVectors,
                entry.row_start as u64 * row_bytes as u64,
                rows * row_bytes,
            )?;
            visit(entry, self.cast("raw vectors", &bytes)?)?;
        }
        Ok(())
    }

    /// Rescores each query's shortlist (`tops`, by approximate keys: the block
    /// kernel's ‖x‖² − 2·q·x or −q·x, or the tiles' with their bf16 products)
    /// and keeps the `k` best, ties by row. An answer is exact when every row
    /// left out — whose approximate key is at least the shortlist's last — is
    /// provably worse than the k-th: its key's error is at most the products'
    /// (2⁻⁸·‖q‖·‖x − μ‖ on tiles, `largest_offset` the largest ‖x − μ‖) plus
    /// f32 rounding (`dim` · 2⁻²⁴ of the terms, `largest_norm` the largest
    /// ‖x‖). The queries it cannot be shown for (exact ties at the k-th, rows
    /// closer together than the rounding) are answered by
    /// [`Segment::flat_search_many`], as a search would rescore them.
    fn finish_exact(
        &self,
        queries: &[&[f32]],
        packed: &[f32],
        tops: Vec<TopK>,
        k: usize,
        (largest_norm, largest_offset): (f32, f32),
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<u32>>> {
        /// Bound on a bf16 product's error relative to ‖q‖·‖x − μ‖.
        const PRODUCT_ERROR: f32 = 1.0 / 256.0 + 1.0 / 4096.0;
        let dim = self.header.dim;
        let l2 = self.header.metric == Metric::L2;
        let rounding = (dim + 4) as f32 * f32::EPSILON;
        let mut answers = Vec::with_capacity(tops.len());
        let mut unproven = Vec::new();
        for (index, (top, query)) in tops.into_iter().zip(packed.chunks_exact(dim)).enumerate() {
            let full = top.heap.len() == top.k;
            let last = top.threshold();
            let mut exact = top
                .heap
                .into_iter()
                .map(|ranked| {
                    Ok(Ranked {
                        key: self.rescore_row(query, ranked.handle as u32)?,
                        handle: ranked.handle,
                    })
                })
                .collect::<IndexResult<Vec<Ranked>>>()?;
            exact.sort_unstable();
            exact.truncate(k);
            if full {
                // The smallest exact key a row left out can have, in the exact
                // keys' units (an l2 key is ‖q − x‖², the approximate one ‖x‖² −
                // 2·q·x, i.e. less ‖q‖²).
                let norm = quiver_simd::dot_f32(query, query).sqrt();
                let mut error = PRODUCT_ERROR * norm * largest_offset
                    + rounding * (largest_norm * largest_norm + 2.0 * norm * largest_norm);
                let mut floor = last;
                if l2 {
                    error *= 2.0;
                    floor += norm * norm;
                }
                let kth = exact.last().map_or(f32::INFINITY, |ranked| ranked.key);
                if exact.len() < k || floor - error <= kth {
                    unproven.push(index);
                }
            }
            answers.push(
                exact
                    .into_iter()
                    .map(|ranked| ranked.handle as u32)
                    .collect(),
            );
        }
        if !unproven.is_empty() {
            let again: Vec<&[f32]> = unproven.iter().map(|&index| queries[index]).collect();
            let hits = self.flat_search_many(&again, k, None, scratch)?;
            for (index, hits) in unproven.into_iter().zip(hits) {
                answers[index] = hits.into_iter().map(|hit| hit.row).collect();
            }
        }
        Ok(answers)
    }
}

/// Merges per-segment hit lists into the best `k` overall, best first.
pub fn merge_hits(
    metric: Metric,
    lists: impl IntoIterator<Item = Vec<(usize, Hit)>>,
    k: usize,
) -> Vec<(usize, Hit)> {
    let mut all: Vec<(usize, Hit)> = lists.into_iter().flatten().collect();
    if metric.higher_is_better() {
        all.sort_by(|a, b| b.1.score.total_cmp(&a.1.score));
    } else {
        all.sort_by(|a, b| a.1.score.total_cmp(&b.1.score));
    }
    all.truncate(k);
    all
}
