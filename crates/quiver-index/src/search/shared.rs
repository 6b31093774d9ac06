//! Search over the segments of one codebook ([`search_shared`]): the query is
//! ranked against the shared centroids once, and every probed list is scanned in
//! every member against one top-k. A batch of queries opens the members once
//! ([`SharedSearch`]).

use std::collections::BinaryHeap;

use super::{
    EncodedQuery, Hit, Ranking, RowFilter, SearchScratch, SearchStats, TopK, handle, to_score,
    unhandle,
};
use crate::error::{IndexError, IndexResult};
use crate::params::{CALIBRATED_K, MIN_ROWS_PER_HIT, Metric, SearchParams};
use crate::reader::{Segment, fetch_together};
use crate::source::ByteSource;

/// One member of a shared search: a segment and the rows it may return.
pub struct SharedProbe<'a, S: ByteSource> {
    /// The segment.
    pub segment: &'a Segment<S>,
    /// Rows it may return (`None`: all).
    pub filter: Option<&'a dyn RowFilter>,
}

/// Returns the approximate top-`k` over segments that share one codebook, as
/// `(member index, hit)`, best first.
///
/// The query is rotated, quantized and ranked against the centroids once (the
/// first member's: every member has the same). Each of the `nprobe` nearest
/// lists is then scanned in every member against one top-k, one reserve and one
/// error-bound threshold, so the cost is that of one segment holding every
/// member's rows: `nprobe` means lists of the shard, not of each segment. One
/// member is [`Segment::search`]. Several queries over the same members share
/// one [`SharedSearch`].
pub fn search_shared<S: ByteSource>(
    members: &[SharedProbe<'_, S>],
    query: &[f32],
    params: &SearchParams,
    scratch: &mut SearchScratch,
) -> IndexResult<Vec<(usize, Hit)>> {
    SharedSearch::open(members)?.search(query, params, scratch)
}

/// The members of one codebook opened for a batch of queries: checked to share
/// their lists once, and read through one session per member, so a batch pins
/// each member's code regions once instead of once per query.
pub struct SharedSearch<'m, 'a, S: ByteSource> {
    members: &'m [SharedProbe<'a, S>],
    sessions: Vec<S::Session<'a>>,
}

impl<'m, 'a, S: ByteSource + 'a> SharedSearch<'m, 'a, S> {
    /// Checks that `members` share one codebook and opens their read sessions.
    pub fn open(members: &'m [SharedProbe<'a, S>]) -> IndexResult<Self> {
        if let Some(lead) = members.first().map(|member| member.segment) {
            for member in &members[1..] {
                member.segment.check_shares_lists_with(lead)?;
            }
        }
        // The codes are read through one session per member: a cache pins each
        // region once for the whole batch instead of once per read. Raw vectors
        // are read row by row outside it (see `Segment::rescore_row`).
        let sessions = members
            .iter()
            .map(|member| member.segment.source.session())
            .collect();
        Ok(SharedSearch { members, sessions })
    }

    /// Returns the approximate top-`k` of one query over the members, as
    /// `(member index, hit)`, best first (see [`search_shared`]).
    pub fn search(
        &self,
        query: &[f32],
        params: &SearchParams,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<(usize, Hit)>> {
        if params.k == 0 {
            return Err(IndexError::InvalidArgument("k must be at least 1".into()));
        }
        let members = self.members;
        let Some(lead) = members.first().map(|member| member.segment) else {
            return Ok(Vec::new());
        };
        lead.prepare_query(query, scratch)?;
        // Lists for a large k: at least MIN_ROWS_PER_HIT rows per hit past the
        // calibrated ten, at the members' mean rows per list.
        let nlist = lead.header.nlist;
        let rows: u64 = members.iter().map(|member| member.segment.rows()).sum();
        let past_calibrated = params.k.saturating_sub(CALIBRATED_K);
        let lists_for_k = ((past_calibrated.saturating_mul(MIN_ROWS_PER_HIT) as u64)
            .saturating_mul(nlist as u64)
            .div_ceil(rows.max(1))) as usize;
        let probe = params
            .probe(nlist, lead.header.metric)
            .at_least(lists_for_k, nlist);
        scratch.stats = SearchStats::default();
        let encoded = lead.encode_query(scratch);
        lead.choose_lists(&encoded, probe, scratch);
        // Cold members' probed codes come in together: one wait, not one per
        // list and member.
        self.fetch_lists_ahead(&scratch.list_keys, &mut scratch.member_ranges);
        let mut ranking = Ranking {
            top: TopK::new(params.k, std::mem::take(&mut scratch.heap)),
            reserve: TopK::new(
                params.k * params.rescore.max(1),
                std::mem::take(&mut scratch.reserve),
            ),
            uppers: TopK::new(params.k, std::mem::take(&mut scratch.upper_heap)),
            rescored: 0,
        };
        scratch.pending.clear();
        for probe in 0..scratch.list_keys.len() {
            let list = scratch.list_keys[probe].1 as usize;
            self.probe_members(list, &encoded, params, scratch, &mut ranking)?;
        }
        // A full answer whenever the members hold k rows their filters allow:
        // the chosen lists (few, for a query among dense rows; or thinned by a
        // filter or by deletions) can hold fewer than k of them, so the next
        // nearest lists are probed until they do. While fewer than k rows are
        // ranked, every allowed row of a probed list is kept (the top-k and
        // the reserve have room), so this count is the allowed rows seen.
        let ranked = |ranking: &Ranking, pending: usize| {
            ranking.top.heap.len() + ranking.reserve.heap.len() + pending
        };
        if ranked(&ranking, scratch.pending.len()) < params.k {
            lead.rank_unchosen_lists(encoded.norm_sq, scratch);
            let more = std::mem::take(&mut scratch.more_lists);
            for &(_, list) in &more {
                if ranked(&ranking, scratch.pending.len()) >= params.k {
                    break;
                }
                self.probe_members(list as usize, &encoded, params, scratch, &mut ranking)?;
            }
            scratch.more_lists = more;
        }
        self.rescore_pending(params.k, scratch, &mut ranking)?;
        // The guard: the best ruled-out rows by estimate are rescored as well.
        let Ranking {
            mut top,
            mut reserve,
            mut rescored,
            uppers,
            ..
        } = ranking;
        scratch.upper_heap = uppers.heap;
        // Their rows were ruled out, so they were never read: fetch the missing
        // ones together (one round trip to the store per member, not one per row).
        self.fetch_rows_ahead(
            |index| {
                reserve
                    .heap
                    .iter()
                    .map(|ranked| unhandle(ranked.handle))
                    .filter(move |&(of, _)| of == index)
                    .map(|(_, row)| row)
            },
            &mut scratch.member_ranges,
        );
        for ranked in reserve.heap.drain() {
            let (index, row) = unhandle(ranked.handle);
            let segment = members[index].segment;
            top.push(segment.rescore_row(&scratch.query, row)?, ranked.handle);
            rescored += 1;
        }
        scratch.reserve = reserve.heap;
        scratch.stats.rows_rescored = rescored;
        Ok(finish_shared(lead.header.metric, top, scratch))
    }
}

impl<'m, 'a, S: ByteSource + 'a> SharedSearch<'m, 'a, S> {
    /// Rescores the candidates the scan kept (see [`Ranking`]): those whose
    /// lower bound beats the final k-th upper bound, most hopeful first, until
    /// the next one's lower bound no longer beats the k-th exact key; the rest
    /// go to the reserve. Their rows are fetched ahead in runs: the `k` most
    /// hopeful first (once scored they give a k-th exact key), then up to
    /// [`deferred_fetch_rows`] at a time of those still hopeful under the k-th
    /// exact key so far — so a cold search waits for the store two or three
    /// times (with the guard's rows), and fetches about the rows it reads: a
    /// first run that also fetched the guard's rows and 80 candidates waited
    /// less often but fetched 40 % more bytes, which over an S3 server on the
    /// same machine cost more than the round trips saved.
    fn rescore_pending(
        &self,
        k: usize,
        scratch: &mut SearchScratch,
        ranking: &mut Ranking,
    ) -> IndexResult<()> {
        let bound = ranking.candidate_bound();
        let mut pending = std::mem::take(&mut scratch.pending);
        pending.sort_unstable_by(|a, b| a.1.lower.total_cmp(&b.1.lower));
        let hopeful = pending.partition_point(|(_, candidate)| candidate.lower < bound);
        let run = deferred_fetch_rows(k);
        let mut fetched_up_to = 0;
        let mut rescored_up_to = hopeful;
        for position in 0..hopeful {
            let (member, candidate) = pending[position];
            let threshold = ranking.top.threshold();
            if candidate.lower >= threshold {
                rescored_up_to = position;
                break;
            }
            if position == fetched_up_to {
                let length = if position == 0 { k } else { run };
                let end = (position + length).min(hopeful);
                fetched_up_to = position
                    + pending[position..end]
                        .partition_point(|(_, candidate)| candidate.lower < threshold);
                let run = &pending[position..fetched_up_to];
                self.fetch_rows_ahead(
                    |index| {
                        run.iter()
                            .filter(move |(of, _)| *of == index)
                            .map(|(_, candidate)| candidate.row)
                    },
                    &mut scratch.member_ranges,
                );
            }
            let segment = self.members[member].segment;
            ranking.top.push(
                segment.rescore_row(&scratch.query, candidate.row)?,
                handle(member, candidate.row),
            );
            ranking.rescored += 1;
        }
        for &(member, candidate) in &pending[rescored_up_to..] {
            ranking
                .reserve
                .push(candidate.key, handle(member, candidate.row));
        }
        pending.clear();
        scratch.pending = pending;
        Ok(())
    }

    /// Makes the raw vectors of `rows(member)` of every member resident
    /// together (see [`ByteSource::fetch_ahead_together`]): a cold search over
    /// several segments waits for the store once per run of rows, not once
    /// per run and segment. `ranges` is scratch space.
    fn fetch_rows_ahead<I: Iterator<Item = u32>>(
        &self,
        rows: impl Fn(usize) -> I,
        ranges: &mut Vec<Vec<(u64, usize)>>,
    ) {
        ranges.resize_with(self.members.len(), Vec::new);
        for (index, member) in self.members.iter().enumerate() {
            member.segment.row_ranges(rows(index), &mut ranges[index]);
        }
        fetch_together(self.members.iter().map(|member| member.segment), ranges);
    }

    /// Makes the codes of the probed `lists` of every member whose source
    /// fetches them ahead resident together (see
    /// [`ByteSource::fetch_scan_ahead_together`]); nothing is built for
    /// sources that do not (memory, mapped files). `ranges` is scratch space.
    fn fetch_lists_ahead(&self, lists: &[(f32, u32)], ranges: &mut Vec<Vec<(u64, usize)>>) {
        if !self
            .members
            .iter()
            .any(|member| member.segment.source.scans_ahead())
        {
            return;
        }
        ranges.resize_with(self.members.len(), Vec::new);
        let mut requests: Vec<(&S, &[(u64, usize)])> = Vec::with_capacity(self.members.len());
        for (member, ranges) in self.members.iter().zip(ranges.iter_mut()) {
            if member.segment.source.scans_ahead() {
                member.segment.list_ranges(lists, ranges);
                requests.push((&member.segment.source, ranges.as_slice()));
            }
        }
        S::fetch_scan_ahead_together(&requests);
    }

    /// Scans `list` in every member.
    fn probe_members(
        &self,
        list: usize,
        encoded: &EncodedQuery,
        params: &SearchParams,
        scratch: &mut SearchScratch,
        ranking: &mut Ranking,
    ) -> IndexResult<()> {
        for (index, member) in self.members.iter().enumerate() {
            member.segment.probe_list(
                index,
                &self.sessions[index],
                list,
                encoded,
                params,
                member.filter,
                scratch,
                ranking,
            )?;
        }
        // One list of the shard, however many members hold it (each member's
        // probe counted it): `lists_probed` means what `nprobe` does, and a
        // calibration over a group records it as the mean lists probed.
        scratch.stats.lists_probed -= self.members.len().saturating_sub(1);
        Ok(())
    }
}

/// Candidates' rows a search fetches ahead at once (see
/// [`SharedSearch::rescore_pending`]): a search of real 100k × 384 at
/// recall 0.976 rescores ~86 rows for k = 10.
fn deferred_fetch_rows(k: usize) -> usize {
    (8 * k).max(64)
}

/// Turns the final top-k into `(member, hit)`, best first, and keeps the
/// heap's buffer for the next query.
pub(super) fn finish_shared(
    metric: Metric,
    top: TopK,
    scratch: &mut SearchScratch,
) -> Vec<(usize, Hit)> {
    let mut ranked = top.heap.into_sorted_vec();
    let hits = ranked
        .iter()
        .map(|r| {
            let (member, row) = unhandle(r.handle);
            (
                member,
                Hit {
                    row,
                    score: to_score(metric, r.key),
                },
            )
        })
        .collect();
    ranked.clear();
    scratch.heap = BinaryHeap::from(ranked);
    hits
}
