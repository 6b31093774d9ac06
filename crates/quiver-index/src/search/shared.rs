//! Search over the segments of one codebook ([`search_shared`]): the query is
//! ranked against the shared centroids once, and every probed list is scanned in
//! every member against one top-k. A batch of queries opens the members once
//! ([`SharedSearch`]).

use std::collections::BinaryHeap;

use super::{
    EncodedQuery, Hit, Ranking, RowFilter, SearchScratch, SearchStats, TopK, to_score, unhandle,
};
use crate::error::{IndexError, IndexResult};
use crate::params::{CALIBRATED_K, MIN_ROWS_PER_HIT, Metric, SearchParams};
use crate::reader::Segment;
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
        let mut ranking = Ranking {
            top: TopK::new(params.k, std::mem::take(&mut scratch.heap)),
            reserve: TopK::new(
                params.k * params.rescore.max(1),
                std::mem::take(&mut scratch.reserve),
            ),
            rescored: 0,
        };
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
        let ranked = |ranking: &Ranking| ranking.top.heap.len() + ranking.reserve.heap.len();
        if ranked(&ranking) < params.k {
            lead.rank_unchosen_lists(encoded.norm_sq, scratch);
            let more = std::mem::take(&mut scratch.more_lists);
            for &(_, list) in &more {
                if ranked(&ranking) >= params.k {
                    break;
                }
                self.probe_members(list as usize, &encoded, params, scratch, &mut ranking)?;
            }
            scratch.more_lists = more;
        }
        // The guard: the best ruled-out rows by estimate are rescored as well.
        let Ranking {
            mut top,
            mut reserve,
            mut rescored,
        } = ranking;
        // Their rows were ruled out, so they were never read: fetch the missing
        // ones together (one round trip to the store per member, not one per row).
        for (index, member) in members.iter().enumerate() {
            member.segment.fetch_rows_ahead(
                reserve
                    .heap
                    .iter()
                    .map(|ranked| unhandle(ranked.handle))
                    .filter(|&(of, _)| of == index)
                    .map(|(_, row)| row),
                &mut scratch.fetch_ranges,
            );
        }
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
