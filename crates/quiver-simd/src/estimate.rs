//! RaBitQ estimates for whole code blocks: turns the popcount kernel's outputs and
//! the per-row factors into keys, lower bounds and a per-block mask of the rows
//! worth looking at. One portable body, compiled per ISA (the compiler vectorises
//! it with the wider registers), chosen by the same runtime dispatch.

use crate::RABITQ_BLOCK_ROWS;

/// Per-list terms of the RaBitQ estimate; see [`crate::rabitq_estimate_blocks`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EstimateTerms {
    /// Lower end of the query's quantization range.
    pub low: f32,
    /// Twice the query's quantization step.
    pub step2: f32,
    /// `Σ c − Σ q̃` for the list.
    pub list_term: f32,
    /// Added to every key of the list.
    pub list_constant: f32,
    /// Multiplier of the estimated inner product (−2 for l2, −1 for inner product).
    pub multiplier: f32,
    /// Multiplier of the per-row error factor in the lower bound.
    pub bound_scale: f32,
    /// A row is interesting when its lower bound is below this …
    pub lower_threshold: f32,
    /// … or its key is below this.
    pub key_threshold: f32,
}

#[inline(always)]
pub(crate) fn estimate_portable(
    counts: &[u32],
    factors: &[f32],
    terms: &EstimateTerms,
    keys: &mut [f32],
    lowers: &mut [f32],
    masks: &mut [u32],
) {
    const FACTOR_BLOCK: usize = 4 * RABITQ_BLOCK_ROWS;
    for (block, mask) in masks.iter_mut().enumerate() {
        let block_factors = &factors[block * FACTOR_BLOCK..][..FACTOR_BLOCK];
        let (constant, rest) = block_factors.split_at(RABITQ_BLOCK_ROWS);
        let (rescale, rest) = rest.split_at(RABITQ_BLOCK_ROWS);
        let (error, popcount2) = rest.split_at(RABITQ_BLOCK_ROWS);
        let counts = &counts[block * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        let keys = &mut keys[block * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        let lowers = &mut lowers[block * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        let mut bits = 0u32;
        for lane in 0..RABITQ_BLOCK_ROWS {
            let inner =
                terms.low * popcount2[lane] + terms.step2 * counts[lane] as f32 + terms.list_term;
            let key =
                constant[lane] + terms.list_constant + terms.multiplier * rescale[lane] * inner;
            let lower = key - terms.bound_scale * error[lane];
            keys[lane] = key;
            lowers[lane] = lower;
            let interesting = (lower < terms.lower_threshold) | (key < terms.key_threshold);
            bits |= (interesting as u32) << lane;
        }
        *mask = bits;
    }
}

pub(crate) fn estimate_scalar(
    counts: &[u32],
    factors: &[f32],
    terms: &EstimateTerms,
    keys: &mut [f32],
    lowers: &mut [f32],
    masks: &mut [u32],
) {
    estimate_portable(counts, factors, terms, keys, lowers, masks)
}

/// Defines a safe entry point that runs the portable body compiled with `$features`
/// enabled (the compiler vectorises it for those registers).
macro_rules! estimate_for_features {
    ($entry:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        pub(crate) fn $entry(
            counts: &[u32],
            factors: &[f32],
            terms: &EstimateTerms,
            keys: &mut [f32],
            lowers: &mut [f32],
            masks: &mut [u32],
        ) {
            #[target_feature(enable = $features)]
            unsafe fn compiled(
                counts: &[u32],
                factors: &[f32],
                terms: &EstimateTerms,
                keys: &mut [f32],
                lowers: &mut [f32],
                masks: &mut [u32],
            ) {
                estimate_portable(counts, factors, terms, keys, lowers, masks)
            }
            // SAFETY: installed only after these features were detected on this CPU.
            unsafe { compiled(counts, factors, terms, keys, lowers, masks) }
        }
    };
}

estimate_for_features!(estimate_avx2, "avx2,fma");
estimate_for_features!(estimate_avx512, "avx512f,avx512bw,avx512vl,fma");
