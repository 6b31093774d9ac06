//! Per-segment calibration of the default probe: the smallest distance ratio
//! (`SearchParams::probe_ratio`) — or, for inner products, the fewest lists —
//! that reaches a recall target on the segment's own data, so users get high
//! recall without tuning, whatever the data's difficulty.
//!
//! Queries are a sample of the segment's rows, each searched leave-one-out (its
//! own row is excluded from both the exact and the approximate answer), which
//! mimics queries drawn from the same distribution as the data. Real queries
//! often are not (questions against passages): a ratio, unlike a count, probes
//! more lists for a query far from the data, so its recall holds up better
//! (experiments item 41).

use rand::SeedableRng;
use rand::seq::index::sample;
use rayon::prelude::*;

use crate::build_pool::build_pool;
use crate::error::{IndexError, IndexResult};
use crate::params::{CalibratedProbe, Metric, SearchParams};
use crate::reader::Segment;
use crate::search::{SearchScratch, SharedProbe, search_shared};
use crate::source::ByteSource;

/// Sample queries of a calibration. The sample's mean recall has a standard
/// error of about 0.8 / √n points, and near the target the recall curve is flat
/// (real 100k × 384 MiniLM: 0.965 at `nprobe` 176, 0.971 at 208, 0.977 at 256),
/// so a point of noise moves `nprobe` by a fifth. With 100 samples one load
/// calibrated 116 (recall 0.944 on held-out queries); with 300, five seeds gave
/// 176–256 (held-out 0.965–0.977) and three loads served 0.956–0.972; with 1,000
/// they give 200–232 (0.971–0.976) on the engine's and the server's segments
/// (experiments item 40, `examples/calibration_spread.rs` in quiver-bench). The
/// exact answers come from one pass over the segment
/// (`Segment::exact_rows_many`, a blocked matrix product): 2.7 s for 1,000
/// samples of that segment one query at a time.
pub const DEFAULT_SAMPLE_QUERIES: usize = 1000;

/// The fewest sample queries a segment too large for the exact-work budget is
/// calibrated with.
pub const MIN_SAMPLE_QUERIES: usize = 300;

/// Multiply-adds the sample's exact answers may cost by default (samples × rows
/// × dimension): 1,000 samples up to 1M rows of 768 dimensions; larger
/// segments get fewer samples, never fewer than [`MIN_SAMPLE_QUERIES`].
pub const DEFAULT_EXACT_WORK: u64 = 1000 * 1_000_000 * 768;

/// What to calibrate for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibrationOptions {
    /// Hits per query.
    pub k: usize,
    /// Mean recall@k to reach.
    pub target_recall: f64,
    /// Sample queries (fewer when the segment is small, or when their exact
    /// answers would cost more than `exact_work`).
    pub sample_queries: usize,
    /// Multiply-adds (samples × rows × dimension) the exact answers may cost;
    /// the sample shrinks to fit, down to [`MIN_SAMPLE_QUERIES`].
    pub exact_work: u64,
    /// Seed of the sample.
    pub seed: u64,
    /// Threads the sample's searches run on (0 = one per core): the build
    /// pool of that many threads, shared with segment builds
    /// (`BuildParams::threads`).
    pub threads: usize,
}

/// Sample queries of a segment's second calibration, for
/// [`crate::CALIBRATED_WIDE_K`] hits: each counts a hundred neighbours, so
/// fewer queries measure its recall as finely as the first's thousand.
pub const WIDE_SAMPLE_QUERIES: usize = 300;

impl CalibrationOptions {
    /// The second calibration of a segment: the same target for the hundred
    /// nearest (see [`crate::CALIBRATED_WIDE_K`]).
    pub fn wide() -> Self {
        CalibrationOptions {
            k: crate::params::CALIBRATED_WIDE_K,
            sample_queries: WIDE_SAMPLE_QUERIES,
            ..CalibrationOptions::default()
        }
    }
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            k: crate::params::CALIBRATED_K,
            target_recall: 0.97,
            sample_queries: DEFAULT_SAMPLE_QUERIES,
            exact_work: DEFAULT_EXACT_WORK,
            seed: 0x5155_4956,
            threads: 0,
        }
    }
}

/// The outcome of a calibration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// The fewest lists probed that reached the target (all lists if none did).
    pub nprobe: usize,
    /// Mean recall@k measured at that `nprobe`.
    pub recall: f64,
    /// Sample queries it was measured with.
    pub samples: usize,
    /// Searches of the whole sample it ran (one per ratio or `nprobe` tried).
    pub passes: usize,
    /// The smallest [`SearchParams::probe_ratio`] that reached the target
    /// (`nprobe` is then the mean lists it probed on the sample), or `None`
    /// when lists are counted: for [`Metric::Dot`], or when even the widest
    /// ratio fell short of the target.
    pub probe_ratio: Option<f32>,
}

impl Calibration {
    /// The probe it calibrated.
    pub fn probe(&self) -> CalibratedProbe {
        CalibratedProbe {
            nprobe: self.nprobe,
            ratio: self.probe_ratio,
        }
    }
}

/// The widest ratio a calibration tries: lists up to 5 × the nearest's squared
/// distance (the probe stops at [`crate::max_ratio_probes`] lists anyway).
pub const MAX_PROBE_RATIO: f32 = 4.0;

/// How finely a calibration resolves the ratio.
const PROBE_RATIO_RESOLUTION: f32 = 0.01;

/// Measures the smallest distance ratio (or, for inner products and when no
/// ratio reaches it, the fewest lists) whose mean recall@k on sample rows
/// reaches the target. Cost: the sample's exact answers (one pass over the
/// segment's full vectors for all of them), then one search of the sample per
/// ratio or `nprobe` tried — usually one or two, starting where the lists of
/// the exact answers say the target can first be reached.
pub fn calibrate_nprobe<S: ByteSource>(
    segment: &Segment<S>,
    options: &CalibrationOptions,
) -> IndexResult<Calibration> {
    calibrate_group(&[segment], options)
}

/// [`calibrate_nprobe`] over segments that share one codebook, searched as a
/// searcher searches them ([`search_shared`]: the same lists probed in every
/// member against one top-k). The sample is drawn from all their rows and its
/// exact answers span all of them, so the probe found is what the group as a
/// whole needs: with more rows under the same lists a query's nearest rows
/// sit in fewer of them (a codebook trained and calibrated on 17k synthetic
/// 1,024-d rows probed 171 of its 265 lists; with 200k rows under it, 59 reach
/// the same recall — experiments item 61). Every member must share the
/// first's codebook ([`IndexError`] otherwise).
pub fn calibrate_group<S: ByteSource>(
    members: &[&Segment<S>],
    options: &CalibrationOptions,
) -> IndexResult<Calibration> {
    let Some(&lead) = members.first() else {
        return Err(IndexError::InvalidArgument(
            "a calibration needs at least one segment".into(),
        ));
    };
    for member in &members[1..] {
        member.check_shares_lists_with(lead)?;
    }
    let group = Group::new(members);
    let rows = group.rows();
    let nlist = lead.header().nlist;
    let k = options.k.max(1);
    if rows <= k + 1 || nlist <= 1 {
        return Ok(Calibration {
            nprobe: nlist,
            recall: 1.0,
            samples: 0,
            passes: 0,
            probe_ratio: None,
        });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let per_sample = (rows as u64)
        .saturating_mul(lead.header().dim as u64)
        .max(1);
    let affordable = (options.exact_work / per_sample).max(MIN_SAMPLE_QUERIES as u64) as usize;
    let samples = options.sample_queries.min(affordable).min(rows);
    let sample_rows = sample(&mut rng, rows, samples);
    let mut scratch = SearchScratch::new();
    let rows_sampled: Vec<GroupRow> = sample_rows.iter().map(|row| group.locate(row)).collect();
    let vectors = rows_sampled
        .iter()
        .map(|&row| group.vector(row))
        .collect::<IndexResult<Vec<_>>>()?;
    // One pass over the full vectors for all sample queries, scored as a
    // blocked matrix product.
    let query_refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
    let truths = group.exact_rows_many(&query_refs, k + 1, &mut scratch)?;
    let queries: Vec<(GroupRow, &[f32], Vec<GroupRow>)> = rows_sampled
        .iter()
        .zip(&query_refs)
        .zip(truths)
        .map(|((&row, &vector), truth)| {
            let truth = truth
                .into_iter()
                .filter(|&hit| hit != row)
                .take(k)
                .collect();
            (row, vector, truth)
        })
        .collect();
    // Recall counts ties: a hit as near as the k-th exact neighbour is a right
    // answer whatever its row (rows repeated many times over would otherwise
    // never count as found, and the calibration would probe every list).
    let kth_keys = queries
        .iter()
        .map(|(_, vector, truth)| {
            truth.iter().try_fold(f32::NEG_INFINITY, |kth, &row| {
                Ok::<_, IndexError>(kth.max(group.exact_key(vector, row)?))
            })
        })
        .collect::<IndexResult<Vec<f32>>>()?;
    // Mean recall@k of the sample, and mean lists probed, under `probe`: the
    // sample's searches spread over the build pool (a pass of 300 searches
    // for a hundred hits, probing most lists of 50k × 1024-d, took ~1.2 s on
    // one thread).
    let pool = build_pool(options.threads)?;
    let mut passes = 0usize;
    let mut measure = |probe: &dyn Fn(&mut SearchParams)| -> IndexResult<(f64, f64)> {
        passes += 1;
        let mut params = SearchParams::new(k + 1);
        probe(&mut params);
        let counts = pool.install(|| {
            queries
                .par_iter()
                .zip(&kth_keys)
                .map_init(
                    SearchScratch::new,
                    |scratch, ((row, vector, truth), &kth)| {
                        let hits = group.search(vector, &params, scratch)?;
                        let lists = scratch.stats.lists_probed;
                        let mut right = 0usize;
                        for &hit in hits.iter().filter(|&&hit| hit != *row).take(k) {
                            if truth.contains(&hit)
                                || group.exact_key(vector, hit)? <= kth + kth.abs() * 1e-6
                            {
                                right += 1;
                            }
                        }
                        Ok((right.min(truth.len()), truth.len(), lists))
                    },
                )
                .collect::<IndexResult<Vec<(usize, usize, usize)>>>()
        })?;
        let (mut found, mut wanted, mut lists) = (0usize, 0usize, 0usize);
        for (right, truth, probed) in counts {
            found += right;
            wanted += truth;
            lists += probed;
        }
        let recall = if wanted == 0 {
            1.0
        } else {
            found as f64 / wanted as f64
        };
        Ok((recall, lists as f64 / queries.len().max(1) as f64))
    };
    let target = options.target_recall;
    // Lists chosen by distance, where the keys are distances: the smallest
    // ratio that reaches the target, if the widest one does. Where each true
    // neighbour's list is probed bounds the recall of every ratio, so the
    // search starts at the smallest ratio that bound allows and rarely needs
    // more than a few passes over the sample (a bisection of the whole range
    // took ten, the widest ratios the dearest).
    let needs = probe_needs(&group, &queries, &mut SearchScratch::new())?;
    if lead.header().metric != Metric::Dot {
        let needs = &needs.ratios;
        let with_ratio =
            |ratio: f32| move |params: &mut SearchParams| params.probe_ratio = Some(ratio);
        // `low` fails (or no smaller ratio can pass), `high` passes.
        let mut low = share_of(needs, target).unwrap_or(f32::INFINITY);
        let mut high = None;
        if low <= MAX_PROBE_RATIO {
            let (recall, lists) = measure(&with_ratio(low))?;
            if recall >= target {
                high = Some((low, recall, lists));
            } else {
                // Aim at a bound above the target by twice the last shortfall.
                let mut shortfall = target - recall;
                while low < MAX_PROBE_RATIO {
                    let candidate = share_of(needs, target + 2.0 * shortfall)
                        .unwrap_or(f32::INFINITY)
                        .max(low + PROBE_RATIO_RESOLUTION)
                        .min(MAX_PROBE_RATIO);
                    let (recall, lists) = measure(&with_ratio(candidate))?;
                    if recall >= target {
                        high = Some((candidate, recall, lists));
                        break;
                    }
                    low = candidate;
                    shortfall = (2.0 * shortfall).max(target - recall);
                }
            }
        }
        if let Some((mut high, mut high_recall, mut high_lists)) = high {
            while high - low > PROBE_RATIO_RESOLUTION {
                let middle = (low + high) / 2.0;
                let (recall, lists) = measure(&with_ratio(middle))?;
                if recall >= target {
                    (high, high_recall, high_lists) = (middle, recall, lists);
                } else {
                    low = middle;
                }
            }
            return Ok(Calibration {
                nprobe: (high_lists.ceil() as usize).clamp(1, nlist),
                recall: high_recall,
                samples,
                passes,
                probe_ratio: Some(high),
            });
        }
    }
    let mut measure_nprobe = |nprobe: usize| {
        measure(&move |params: &mut SearchParams| params.nprobe = Some(nprobe))
            .map(|(recall, _)| recall)
    };
    // Counted lists, started the same way: fewer lists than the bound allows
    // cannot reach the target (a bisection from one list took ~13 searches).
    let counts = &needs.counts;
    let mut high = share_of(counts, target).unwrap_or(nlist).clamp(1, nlist);
    let mut low = high - 1;
    let mut high_recall = measure_nprobe(high)?;
    let mut shortfall = target - high_recall;
    while high_recall < target && high < nlist {
        low = high;
        // At least a quarter more each time: the bisection below refines it,
        // and a bound that keeps falling short cannot cost a pass per list.
        high = share_of(counts, target + 2.0 * shortfall)
            .unwrap_or(nlist)
            .clamp((high + 1).max(high + high / 4).min(nlist), nlist);
        high_recall = measure_nprobe(high)?;
        shortfall = (2.0 * shortfall).max(target - high_recall);
    }
    while high - low > 1.max(high / 16) {
        let middle = (low + high) / 2;
        let recall = measure_nprobe(middle)?;
        if recall >= target {
            high = middle;
            high_recall = recall;
        } else {
            low = middle;
        }
    }
    Ok(Calibration {
        nprobe: high,
        recall: high_recall,
        samples,
        passes,
        probe_ratio: None,
    })
}

/// A row of a calibrated group: (member, row in that member).
type GroupRow = (usize, u32);

/// The members of a calibration, their rows numbered one after the other.
struct Group<'g, 'a, S: ByteSource> {
    members: &'g [&'a Segment<S>],
    /// The first group row of each member, and the group's rows last.
    starts: Vec<usize>,
}

impl<'g, 'a, S: ByteSource> Group<'g, 'a, S> {
    fn new(members: &'g [&'a Segment<S>]) -> Self {
        let mut starts = Vec::with_capacity(members.len() + 1);
        let mut next = 0usize;
        for member in members {
            starts.push(next);
            next += member.rows() as usize;
        }
        starts.push(next);
        Group { members, starts }
    }

    fn rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The member and row of group row `row` (below [`Group::rows`]).
    fn locate(&self, row: usize) -> GroupRow {
        let member = self.starts.partition_point(|&start| start <= row) - 1;
        (member, (row - self.starts[member]) as u32)
    }

    fn vector(&self, (member, row): GroupRow) -> IndexResult<Vec<f32>> {
        self.members[member].vector(row)
    }

    /// The exact key (smaller is nearer) of `row` for `query`, as a segment's
    /// exact search ranks it.
    fn exact_key(&self, query: &[f32], row: GroupRow) -> IndexResult<f32> {
        let vector = self.vector(row)?;
        Ok(match self.members[row.0].header().metric {
            Metric::L2 => quiver_simd::l2sq_f32(query, &vector),
            Metric::Cosine | Metric::Dot => -quiver_simd::dot_f32(query, &vector),
        })
    }

    /// The exact `k` nearest group rows of each query, nearest first: each
    /// member's (one blocked pass over its full vectors), merged by key.
    fn exact_rows_many(
        &self,
        queries: &[&[f32]],
        k: usize,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<Vec<GroupRow>>> {
        if let [only] = self.members {
            return Ok(only
                .exact_rows_many(queries, k, scratch)?
                .into_iter()
                .map(|rows| rows.into_iter().map(|row| (0, row)).collect())
                .collect());
        }
        let mut merged: Vec<Vec<(f32, GroupRow)>> = vec![Vec::new(); queries.len()];
        for (member, segment) in self.members.iter().enumerate() {
            let answers = segment.exact_rows_many(queries, k, scratch)?;
            for ((query, rows), merged) in queries.iter().zip(answers).zip(&mut merged) {
                for row in rows {
                    let row = (member, row);
                    merged.push((self.exact_key(query, row)?, row));
                }
            }
        }
        Ok(merged
            .into_iter()
            .map(|mut keyed| {
                keyed.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                keyed.into_iter().take(k).map(|(_, row)| row).collect()
            })
            .collect())
    }

    /// Searches the group as a searcher does: one member alone
    /// ([`Segment::search`]), several as one shared search.
    fn search(
        &self,
        query: &[f32],
        params: &SearchParams,
        scratch: &mut SearchScratch,
    ) -> IndexResult<Vec<GroupRow>> {
        if let [only] = self.members {
            return Ok(only
                .search(query, params, None, scratch)?
                .into_iter()
                .map(|hit| (0, hit.row))
                .collect());
        }
        let probes: Vec<SharedProbe<'_, S>> = self
            .members
            .iter()
            .map(|&segment| SharedProbe {
                segment,
                filter: None,
            })
            .collect();
        Ok(search_shared(&probes, query, params, scratch)?
            .into_iter()
            .map(|(member, hit)| (member, hit.row))
            .collect())
    }
}

/// What it takes to probe the list of each exact neighbour of each sample
/// row (one entry per pair), each sorted: a neighbour whose list is not
/// probed is not found, so the share of pairs at or below a ratio (or a
/// count) bounds the recall a search with it reaches — the codes' estimates
/// may still miss a few of the others.
struct ProbeNeeds {
    /// The smallest distance ratio that probes the list (infinite when more
    /// than [`crate::max_ratio_probes`] lists are nearer).
    ratios: Vec<f32>,
    /// The fewest nearest lists that include it.
    counts: Vec<usize>,
}

fn probe_needs<S: ByteSource>(
    group: &Group<'_, '_, S>,
    queries: &[(GroupRow, &[f32], Vec<GroupRow>)],
    scratch: &mut SearchScratch,
) -> IndexResult<ProbeNeeds> {
    // The members share their lists: the lead's centroids rank them for all.
    let lead = group.members[0];
    let max_lists = crate::max_ratio_probes(lead.header().nlist);
    let pairs = queries.iter().map(|(_, _, truth)| truth.len()).sum();
    let mut needs = ProbeNeeds {
        ratios: Vec::with_capacity(pairs),
        counts: Vec::with_capacity(pairs),
    };
    let mut keys = Vec::new();
    for (_, vector, truth) in queries {
        lead.list_keys(vector, scratch, &mut keys)?;
        let nearest = keys.iter().copied().fold(f32::INFINITY, f32::min).max(0.0);
        for &(member, row) in truth {
            let key = keys[group.members[member].list_of_row(row)];
            let nearer = keys.iter().filter(|&&other| other < key).count();
            needs.counts.push(nearer + 1);
            needs.ratios.push(if nearer >= max_lists {
                f32::INFINITY
            } else if key <= nearest {
                0.0
            } else if nearest <= 0.0 {
                f32::INFINITY
            } else {
                // A hair above, so the search's own rounding of `nearest × (1
                // + ratio)` still takes the list in.
                let ratio = key / nearest - 1.0;
                ratio + ratio * 1e-5 + 1e-6
            });
        }
    }
    needs.ratios.sort_unstable_by(f32::total_cmp);
    needs.counts.sort_unstable();
    Ok(needs)
}

/// The smallest need that `share` of the pairs meet (see [`ProbeNeeds`]), if
/// there are any.
fn share_of<T: Copy>(needs: &[T], share: f64) -> Option<T> {
    let wanted = (share.min(1.0) * needs.len() as f64).ceil() as usize;
    needs.get(wanted.clamp(1, needs.len().max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use crate::PointId;
    use crate::params::{IdType, Metric};
    use crate::reader::Segment;
    use crate::search::SearchScratch;
    use crate::source::MemorySource;
    use crate::writer::{SegmentSpec, SegmentWriter};

    fn segment(
        metric: Metric,
        rows: usize,
        dim: usize,
        mut vector: impl FnMut(usize) -> Vec<f32>,
    ) -> Segment<MemorySource> {
        let mut writer = SegmentWriter::new(SegmentSpec::new(dim, metric, IdType::U64)).unwrap();
        for row in 0..rows {
            writer
                .add(PointId::U64(row as u64), &vector(row), None)
                .unwrap();
        }
        let mut bytes = Vec::new();
        writer.finish(&mut bytes, &|_, _, _| {}).unwrap();
        Segment::open(MemorySource::new("calibrate.qseg", &bytes)).unwrap()
    }

    #[test]
    fn blocked_exact_answers_are_the_exact_answers() {
        for metric in [Metric::L2, Metric::Cosine, Metric::Dot] {
            // Random rows, and rows on a coarse lattice that repeats every 97
            // (exact duplicates and many equal distances: ties broken by row,
            // as a search's rescoring breaks them).
            let lattice = |row: usize| -> Vec<f32> {
                (0..8)
                    .map(|i| ((row * 31 + i * 7) % 97) as f32 / 10.0 + 0.1)
                    .collect()
            };
            let mut rows = rand::rngs::StdRng::seed_from_u64(7);
            let random =
                |_: usize| -> Vec<f32> { (0..40).map(|_| rows.random_range(-1.0..1.0)).collect() };
            // The same lattice in 48 dimensions (on CPUs with AMX tiles the
            // products are then bf16, and ties at the k-th must be proven or
            // answered again in f32).
            let wide_lattice = |row: usize| -> Vec<f32> {
                (0..48)
                    .map(|i| ((row * 31 + i * 7) % 97) as f32 / 10.0 + 0.1)
                    .collect()
            };
            // Rows on a sphere of radius 1 + row·10⁻⁵ around a point far from the
            // origin, which is itself a row every 100: from it, the rows' exact
            // distances differ by less than a bf16 product's error, so on tiles
            // its answer must be recognised as unproven and answered in f32.
            let mut directions = rand::rngs::StdRng::seed_from_u64(8);
            let sphere = |row: usize| -> Vec<f32> {
                if row.is_multiple_of(100) {
                    return vec![10.0; 48];
                }
                let direction: Vec<f32> = (0..48)
                    .map(|_| directions.random_range(-1.0..1.0))
                    .collect();
                let length = quiver_simd::dot_f32(&direction, &direction).sqrt();
                let radius = 1.0 + row as f32 * 1e-5;
                direction
                    .iter()
                    .map(|d| 10.0 + d / length * radius)
                    .collect()
            };
            for (dim, segment) in [
                (40, segment(metric, 1_500, 40, random)),
                (8, segment(metric, 600, 8, lattice)),
                (48, segment(metric, 600, 48, wide_lattice)),
                (48, segment(metric, 600, 48, sphere)),
            ] {
                // Rows of the segment, as a calibration's sample.
                let queries: Vec<Vec<f32>> = (0..100)
                    .map(|row| segment.vector(row * 5).unwrap())
                    .collect();
                let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let mut scratch = SearchScratch::new();
                let blocked = segment.exact_rows_many(&refs, 11, &mut scratch).unwrap();
                let one_by_one = segment
                    .flat_search_many(&refs, 11, None, &mut scratch)
                    .unwrap();
                assert_eq!(blocked.len(), refs.len());
                for (blocked, exact) in blocked.iter().zip(one_by_one) {
                    let exact: Vec<u32> = exact.into_iter().map(|hit| hit.row).collect();
                    assert_eq!(blocked, &exact, "{metric:?}, {dim} dimensions");
                }
            }
        }
    }
}
