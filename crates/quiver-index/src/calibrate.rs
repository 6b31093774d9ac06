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

use crate::error::IndexResult;
use crate::params::{Metric, SearchParams};
use crate::reader::Segment;
use crate::search::SearchScratch;
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
/// ([`Segment::flat_search_many`]): 2.7 s for 1,000 samples of that segment.
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
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            k: 10,
            target_recall: 0.97,
            sample_queries: DEFAULT_SAMPLE_QUERIES,
            exact_work: DEFAULT_EXACT_WORK,
            seed: 0x5155_4956,
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
    /// The smallest [`SearchParams::probe_ratio`] that reached the target
    /// (`nprobe` is then the mean lists it probed on the sample), or `None`
    /// when lists are counted: for [`Metric::Dot`], or when even the widest
    /// ratio fell short of the target.
    pub probe_ratio: Option<f32>,
}

/// The widest ratio a calibration tries: lists up to 5 × the nearest's squared
/// distance (the probe stops at [`crate::max_ratio_probes`] lists anyway).
pub const MAX_PROBE_RATIO: f32 = 4.0;

/// How finely a calibration resolves the ratio.
const PROBE_RATIO_RESOLUTION: f32 = 0.01;

/// Measures the smallest `nprobe` whose mean recall@k on sample rows reaches the
/// target. Cost: one exact scan of the segment per sample query, plus a few
/// approximate searches per candidate `nprobe`.
pub fn calibrate_nprobe<S: ByteSource>(
    segment: &Segment<S>,
    options: &CalibrationOptions,
) -> IndexResult<Calibration> {
    let rows = segment.rows() as usize;
    let nlist = segment.header().nlist;
    let k = options.k.max(1);
    if rows <= k + 1 || nlist <= 1 {
        return Ok(Calibration {
            nprobe: nlist,
            recall: 1.0,
            samples: 0,
            probe_ratio: None,
        });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let per_sample = (rows as u64)
        .saturating_mul(segment.header().dim as u64)
        .max(1);
    let affordable = (options.exact_work / per_sample).max(MIN_SAMPLE_QUERIES as u64) as usize;
    let samples = options.sample_queries.min(affordable).min(rows);
    let sample_rows = sample(&mut rng, rows, samples);
    let mut scratch = SearchScratch::new();
    let rows_sampled: Vec<u32> = sample_rows.iter().map(|row| row as u32).collect();
    let vectors = rows_sampled
        .iter()
        .map(|&row| segment.vector(row))
        .collect::<IndexResult<Vec<_>>>()?;
    // One pass over the full vectors for all sample queries.
    let query_refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
    let truths = segment.flat_search_many(&query_refs, k + 1, None, &mut scratch)?;
    let queries: Vec<(u32, &[f32], Vec<u32>)> = rows_sampled
        .iter()
        .zip(&query_refs)
        .zip(truths)
        .map(|((&row, &vector), truth)| {
            let truth = truth
                .into_iter()
                .map(|hit| hit.row)
                .filter(|&hit| hit != row)
                .take(k)
                .collect();
            (row, vector, truth)
        })
        .collect();
    // Mean recall@k of the sample, and mean lists probed, under `probe`.
    let mut measure = |probe: &dyn Fn(&mut SearchParams)| -> IndexResult<(f64, f64)> {
        let mut params = SearchParams::new(k + 1);
        probe(&mut params);
        let mut found = 0usize;
        let mut wanted = 0usize;
        let mut lists = 0usize;
        for (row, vector, truth) in &queries {
            let hits = segment.search(vector, &params, None, &mut scratch)?;
            lists += scratch.stats.lists_probed;
            let answer: Vec<u32> = hits
                .into_iter()
                .map(|hit| hit.row)
                .filter(|hit| hit != row)
                .take(k)
                .collect();
            found += truth.iter().filter(|row| answer.contains(row)).count();
            wanted += truth.len();
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
    // ratio that reaches the target, if the widest one does.
    if segment.header().metric != Metric::Dot {
        let with_ratio =
            |ratio: f32| move |params: &mut SearchParams| params.probe_ratio = Some(ratio);
        let (mut low, mut high) = (0.0f32, MAX_PROBE_RATIO);
        let (mut high_recall, mut high_lists) = measure(&with_ratio(high))?;
        if high_recall >= target {
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
                probe_ratio: Some(high),
            });
        }
    }
    let mut measure_nprobe = |nprobe: usize| {
        measure(&move |params: &mut SearchParams| params.nprobe = Some(nprobe))
            .map(|(recall, _)| recall)
    };
    // Grow geometrically until the target is met, then narrow down.
    let mut low = 0usize;
    let mut high = 1usize;
    let mut high_recall = measure_nprobe(high)?;
    while high_recall < target && high < nlist {
        low = high;
        high = (high * 2).min(nlist);
        high_recall = measure_nprobe(high)?;
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
        probe_ratio: None,
    })
}
