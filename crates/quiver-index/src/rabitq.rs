//! RaBitQ (Gao & Long, SIGMOD 2024): 1 bit per dimension of the rotated residual
//! of each row to its centroid, plus per-row correction factors that make the
//! inner-product estimate unbiased and give it an error bound.
//!
//! With `o` the rotated residual of a row, `u = o/‖o‖`, bits `b_i = [u_i > 0]` and
//! `x̄ = (2b − 1)/√D`, the estimate of `⟨o, w⟩` for a query residual `w` is
//! `‖o‖·⟨x̄, w⟩/⟨x̄, u⟩ = ‖o‖/Σ|u_i| · (2·Σ_{b_i=1} w_i − Σ w_i)`, and its error is at
//! most `‖o‖·‖w‖·√(1−⟨x̄,u⟩²)/⟨x̄,u⟩ · ε₀/√(D−1)` with high probability.
//! The query residual is quantized to 4 bits so `Σ_{b_i=1} w_i` becomes popcounts.

use quiver_simd::{RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS};

use crate::params::Metric;

/// Factors stored per row, in per-block arrays of 32 (structure of arrays).
pub(crate) const FACTOR_ARRAYS: usize = 4;
/// Bytes of the factors of one block.
pub(crate) const FACTOR_BLOCK_BYTES: usize = FACTOR_ARRAYS * RABITQ_BLOCK_ROWS * 4;

/// Per-row factors: `key = add + query_const + multiplier·rescale·(lo·pc2 + Δ·(2·dot − Σq))`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RowFactors {
    /// `‖o‖²` (l2) or `−⟨o, c⟩` (inner product).
    pub add: f32,
    /// `‖o‖ / Σ|u_i| = ‖o‖² / Σ|o_i|`.
    pub rescale: f32,
    /// `‖o‖·√(1−⟨x̄,u⟩²)/⟨x̄,u⟩/√(D−1)`: the error per unit of query norm and ε₀.
    pub error: f32,
    /// `2·popcount(b) − D`.
    pub pc2: f32,
}

/// Encodes one rotated residual: writes its bits into `words` and returns its factors.
pub(crate) fn encode_row(
    residual: &[f32],
    rotated_centroid: &[f32],
    metric: Metric,
    words: &mut [u64],
) -> RowFactors {
    let padded_dim = residual.len();
    let norm_sq: f32 = residual.iter().map(|v| v * v).sum();
    let norm = norm_sq.sqrt();
    words.fill(0);
    let mut abs_sum = 0f32;
    let mut popcount = 0u32;
    for (dim, &value) in residual.iter().enumerate() {
        abs_sum += value.abs();
        if value > 0.0 {
            words[dim / 64] |= 1 << (dim % 64);
            popcount += 1;
        }
    }
    let add = match metric {
        Metric::L2 => norm_sq,
        Metric::Dot | Metric::Cosine => -residual
            .iter()
            .zip(rotated_centroid)
            .map(|(o, c)| o * c)
            .sum::<f32>(),
    };
    let (rescale, error) = if norm > 0.0 && abs_sum > 0.0 {
        // ⟨x̄, u⟩ = Σ|u_i|/√D = Σ|o_i| / (‖o‖·√D).
        let x_dot_u = (abs_sum / (norm * (padded_dim as f32).sqrt())).min(1.0);
        let spread = (1.0 - x_dot_u * x_dot_u).max(0.0).sqrt() / x_dot_u;
        (
            norm_sq / abs_sum,
            norm * spread / ((padded_dim as f32 - 1.0).max(1.0)).sqrt(),
        )
    } else {
        (0.0, 0.0)
    };
    RowFactors {
        add,
        rescale,
        error,
        pc2: 2.0 * popcount as f32 - padded_dim as f32,
    }
}

/// A query residual quantized for one list: 4 bit planes plus the affine terms.
pub(crate) struct QuantizedResidual {
    /// Lower end of the quantization range.
    pub low: f32,
    /// Step between levels.
    pub step: f32,
    /// Sum of the quantized levels.
    pub level_sum: f32,
    /// ‖w‖, the norm of the (unquantized) residual.
    pub norm: f32,
}

/// Quantizes `residual` to 4 bits per dimension, writing the bit planes
/// (`planes[j * words + w]`) and returning the terms that undo the quantization.
pub(crate) fn quantize_residual(residual: &[f32], planes: &mut [u64]) -> QuantizedResidual {
    let words = residual.len() / 64;
    debug_assert_eq!(planes.len(), RABITQ_QUERY_BITS * words);
    let (mut low, mut high) = (f32::INFINITY, f32::NEG_INFINITY);
    let mut norm_sq = 0f32;
    for &value in residual {
        low = low.min(value);
        high = high.max(value);
        norm_sq += value * value;
    }
    let levels = ((1 << RABITQ_QUERY_BITS) - 1) as f32;
    let step = if high > low {
        (high - low) / levels
    } else {
        1.0
    };
    let inverse_step = 1.0 / step;
    planes.fill(0);
    let mut level_sum = 0u32;
    for (word, chunk) in residual.chunks_exact(64).enumerate() {
        let mut plane_words = [0u64; RABITQ_QUERY_BITS];
        for (bit, &value) in chunk.iter().enumerate() {
            let level = ((value - low) * inverse_step + 0.5) as u32;
            let level = level.min(levels as u32);
            level_sum += level;
            for (plane, plane_word) in plane_words.iter_mut().enumerate() {
                *plane_word |= ((level >> plane) as u64 & 1) << bit;
            }
        }
        for (plane, plane_word) in plane_words.into_iter().enumerate() {
            planes[plane * words + word] = plane_word;
        }
    }
    QuantizedResidual {
        low,
        step,
        level_sum: level_sum as f32,
        norm: norm_sq.sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The estimator is unbiased and its error behaves like a gaussian whose
    /// standard deviation is the per-row error factor: about 6% of estimates fall
    /// outside 1.9σ (the paper's ε₀) and almost none outside 3.5σ.
    #[test]
    fn estimates_inner_products_within_the_error_bound() {
        let padded_dim = 384;
        let words = padded_dim / 64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let centroid = vec![0.0f32; padded_dim];
        let query: Vec<f32> = (0..padded_dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut planes = vec![0u64; RABITQ_QUERY_BITS * words];
        let quantized = quantize_residual(&query, &mut planes);
        let mut total_error = 0f64;
        let (mut outside, mut far_outside) = (0, 0);
        let trials = 2000;
        for _ in 0..trials {
            let row: Vec<f32> = (0..padded_dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut code = vec![0u64; words];
            let factors = encode_row(&row, &centroid, Metric::L2, &mut code);
            let dot_levels: u32 = (0..RABITQ_QUERY_BITS)
                .map(|plane| {
                    code.iter()
                        .zip(&planes[plane * words..][..words])
                        .map(|(c, p)| (c & p).count_ones() << plane)
                        .sum::<u32>()
                })
                .sum();
            let estimate = factors.rescale
                * (quantized.low * factors.pc2
                    + quantized.step * (2.0 * dot_levels as f32 - quantized.level_sum));
            let exact: f32 = row.iter().zip(&query).map(|(a, b)| a * b).sum();
            total_error += (estimate - exact) as f64;
            let sigma = factors.error * quantized.norm;
            if (estimate - exact).abs() > sigma * 1.9 {
                outside += 1;
            }
            if (estimate - exact).abs() > sigma * 3.5 {
                far_outside += 1;
            }
        }
        let mean_error = total_error / trials as f64;
        assert!(mean_error.abs() < 0.2, "estimator bias {mean_error}");
        assert!(
            outside < trials / 12,
            "{outside} of {trials} estimates outside 1.9σ"
        );
        assert!(
            outside > trials / 100,
            "the bound is far too loose: {outside} of {trials} outside 1.9σ"
        );
        assert!(
            far_outside <= trials / 500,
            "{far_outside} of {trials} estimates outside 3.5σ"
        );
    }
}
