//! RaBitQ (Gao & Long, SIGMOD 2024): 1 bit per dimension of the rotated residual
//! of each row to its centroid, plus per-row correction factors that make the
//! inner-product estimate unbiased and give it an error bound.
//!
//! With `o` the rotated residual of a row to its centroid `c`, `u = o/‖o‖`, bits
//! `b_i = [o_i > 0]` and `x̄ = (2b − 1)/√D`, the estimate of `⟨o, w⟩` for the query
//! residual `w = q − c` is `‖o‖·⟨x̄, w⟩/⟨x̄, u⟩ = ‖o‖²/Σ|o_i| · (2·Σ_{b_i=1} w_i − Σ w_i)`,
//! and its error has a standard deviation of about
//! `‖o‖·‖w‖·√(1−⟨x̄,u⟩²)/⟨x̄,u⟩/√(D−1)` (the bound is ε₀ of those).
//!
//! Because `Σ_{b_i=1} w_i = Σ_{b_i=1} q_i − Σ_{b_i=1} c_i`, the row's share of the
//! centroid term is folded into a per-row constant at build time, so the query is
//! rotated and quantized (4 bits per dimension) once per query, not once per list,
//! and `Σ_{b_i=1} q_i` becomes popcounts against the query's bit planes.

use quiver_simd::{RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS};

use crate::params::Metric;

/// Factors stored per row, in per-block arrays of 32 (structure of arrays).
pub(crate) const FACTOR_ARRAYS: usize = 4;
/// Bytes of the factors of one block.
pub(crate) const FACTOR_BLOCK_BYTES: usize = FACTOR_ARRAYS * RABITQ_BLOCK_ROWS * 4;

/// Returns the multiplier of the estimated `⟨o, w⟩` in a row's key (keys are
/// "smaller is better": squared distance, or negated inner product).
pub(crate) fn key_multiplier(metric: Metric) -> f32 {
    match metric {
        Metric::L2 => -2.0,
        Metric::Dot | Metric::Cosine => -1.0,
    }
}

/// Per-row factors. A row's key is
/// `constant + list_constant + multiplier·rescale·(low·popcount2 + 2·step·dot + Σc − Σq)`
/// where `dot` is the popcount kernel's output and `low`, `step`, `Σq` come from
/// the quantized query, `Σc` and `list_constant` from the list's centroid.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RowFactors {
    /// `‖o‖²` (l2) or `−⟨o, c⟩` (inner product), minus `multiplier·rescale·2·Σ_{b_i=1} c_i`.
    pub constant: f32,
    /// `‖o‖² / Σ|o_i|`.
    pub rescale: f32,
    /// `‖o‖·√(1−⟨x̄,u⟩²)/⟨x̄,u⟩/√(D−1)`: the error per unit of `‖w‖` and of ε₀.
    pub error: f32,
    /// `2·popcount(b)`.
    pub popcount2: f32,
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
    let mut centroid_on_bits = 0f32;
    for (dim, (&value, &centroid)) in residual.iter().zip(rotated_centroid).enumerate() {
        abs_sum += value.abs();
        if value > 0.0 {
            words[dim / 64] |= 1 << (dim % 64);
            popcount += 1;
            centroid_on_bits += centroid;
        }
    }
    let base = match metric {
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
        constant: base - key_multiplier(metric) * rescale * 2.0 * centroid_on_bits,
        rescale,
        error,
        popcount2: 2.0 * popcount as f32,
    }
}

/// The rotated query quantized to 4 bits per dimension.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QuantizedQuery {
    /// Lower end of the quantization range.
    pub low: f32,
    /// Step between levels.
    pub step: f32,
    /// Σ q̃_i of the quantized rotated query.
    pub sum: f32,
}

/// Quantizes the rotated `query` to 4 bits per dimension, writing its bit planes
/// (`planes[j * words + w]`, weight `2^j`).
pub(crate) fn quantize_query(query: &[f32], planes: &mut [u64]) -> QuantizedQuery {
    let words = query.len() / 64;
    debug_assert_eq!(planes.len(), RABITQ_QUERY_BITS * words);
    let (mut low, mut high) = (f32::INFINITY, f32::NEG_INFINITY);
    for &value in query {
        low = low.min(value);
        high = high.max(value);
    }
    let levels = ((1 << RABITQ_QUERY_BITS) - 1) as f32;
    let step = if high > low {
        (high - low) / levels
    } else {
        1.0
    };
    let inverse_step = 1.0 / step;
    let mut level_bytes = [0u8; 64];
    let mut level_sum = 0u32;
    for (word, chunk) in query.chunks_exact(64).enumerate() {
        for (level, &value) in level_bytes.iter_mut().zip(chunk) {
            *level = ((value - low) * inverse_step + 0.5).min(levels) as u8;
            level_sum += *level as u32;
        }
        for plane in 0..RABITQ_QUERY_BITS {
            let mut bits = 0u64;
            for (position, &level) in level_bytes.iter().enumerate() {
                bits |= (((level >> plane) & 1) as u64) << position;
            }
            planes[plane * words + word] = bits;
        }
    }
    // Σq of the quantized query, so the estimate is exactly ⟨x̄, q̃ − c⟩ scaled and
    // the rounding leaves no bias that is shared by every row.
    let sum = query.len() as f32 * low + step * level_sum as f32;
    QuantizedQuery { low, step, sum }
}

/// 1-bit codes of the centroids themselves, so picking the lists to probe costs a
/// popcount scan (48 bytes per list at 384-d) instead of streaming every full
/// centroid; only a shortlist is then scored exactly.
pub(crate) struct ListCodes {
    codes: Vec<u64>,
    factors: Vec<f32>,
    lists: usize,
    metric: Metric,
}

impl ListCodes {
    /// Encodes `centroids` (rotated, `padded_dim` each) for probing by `metric`
    /// (`L2` for squared distance, `Dot` for inner product).
    pub(crate) fn new(centroids: &[f32], padded_dim: usize, metric: Metric) -> Self {
        let words = padded_dim / 64;
        let lists = centroids.len() / padded_dim;
        let blocks = lists.div_ceil(RABITQ_BLOCK_ROWS);
        let mut codes = vec![0u64; blocks * words * RABITQ_BLOCK_ROWS];
        let mut factors = vec![0f32; blocks * FACTOR_BLOCK_BYTES / 4];
        let origin = vec![0f32; padded_dim];
        let mut bits = vec![0u64; words];
        for (list, centroid) in centroids.chunks_exact(padded_dim).enumerate() {
            let row = encode_row(centroid, &origin, metric, &mut bits);
            let (block, lane) = (list / RABITQ_BLOCK_ROWS, list % RABITQ_BLOCK_ROWS);
            for (word, &value) in bits.iter().enumerate() {
                codes[block * words * RABITQ_BLOCK_ROWS + word * RABITQ_BLOCK_ROWS + lane] = value;
            }
            let block_factors = &mut factors[block * FACTOR_BLOCK_BYTES / 4..];
            block_factors[lane] = row.constant;
            block_factors[RABITQ_BLOCK_ROWS + lane] = row.rescale;
            block_factors[2 * RABITQ_BLOCK_ROWS + lane] = row.error;
            block_factors[3 * RABITQ_BLOCK_ROWS + lane] = row.popcount2;
        }
        ListCodes {
            codes,
            factors,
            lists,
            metric,
        }
    }

    /// Writes `(estimated key, list)` for every list: squared distance to the
    /// query, or its negated inner product.
    pub(crate) fn estimate(
        &self,
        planes: &[u64],
        quantized: &QuantizedQuery,
        query_norm_sq: f32,
        counts: &mut Vec<u32>,
        keys: &mut Vec<(f32, u32)>,
    ) {
        let words = planes.len() / RABITQ_QUERY_BITS;
        counts.resize(self.codes.len() / words, 0);
        quiver_simd::rabitq_scan_blocks(&self.codes, words, planes, counts);
        let multiplier = key_multiplier(self.metric);
        let query_constant = if self.metric == Metric::L2 {
            query_norm_sq
        } else {
            0.0
        };
        keys.clear();
        keys.extend((0..self.lists).map(|list| {
            let (block, lane) = (list / RABITQ_BLOCK_ROWS, list % RABITQ_BLOCK_ROWS);
            let factors = &self.factors[block * FACTOR_BLOCK_BYTES / 4..];
            let inner = quantized.low * factors[3 * RABITQ_BLOCK_ROWS + lane]
                + 2.0 * quantized.step * counts[list] as f32
                - quantized.sum;
            let key = factors[lane]
                + query_constant
                + multiplier * factors[RABITQ_BLOCK_ROWS + lane] * inner;
            (key, list as u32)
        }));
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// For a row and a query around a non-zero centroid, the estimated squared
    /// distance is unbiased and its error behaves like a gaussian whose standard
    /// deviation is the row's error factor times ‖w‖: about 6% of estimates fall
    /// outside 1.9σ (the paper's ε₀) and almost none outside 3.5σ.
    #[test]
    fn estimates_distances_within_the_error_bound() {
        let padded_dim = 384;
        let words = padded_dim / 64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let centroid: Vec<f32> = (0..padded_dim)
            .map(|_| rng.random_range(-0.5..0.5))
            .collect();
        let query: Vec<f32> = (0..padded_dim)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut planes = vec![0u64; RABITQ_QUERY_BITS * words];
        let quantized = quantize_query(&query, &mut planes);
        let residual_query: Vec<f32> = query.iter().zip(&centroid).map(|(q, c)| q - c).collect();
        let w_norm_sq: f32 = residual_query.iter().map(|v| v * v).sum();
        let centroid_sum: f32 = centroid.iter().sum();
        let (mut total_error, mut outside, mut far_outside) = (0f64, 0, 0);
        let trials = 2000;
        for _ in 0..trials {
            let residual: Vec<f32> = (0..padded_dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut code = vec![0u64; words];
            let factors = encode_row(&residual, &centroid, Metric::L2, &mut code);
            let dot: u32 = (0..RABITQ_QUERY_BITS)
                .map(|plane| {
                    code.iter()
                        .zip(&planes[plane * words..][..words])
                        .map(|(c, p)| (c & p).count_ones() << plane)
                        .sum::<u32>()
                })
                .sum();
            let estimate = factors.constant
                + w_norm_sq
                + key_multiplier(Metric::L2)
                    * factors.rescale
                    * (quantized.low * factors.popcount2
                        + 2.0 * quantized.step * dot as f32
                        + centroid_sum
                        - quantized.sum);
            let exact: f32 = residual
                .iter()
                .zip(&residual_query)
                .map(|(o, w)| (o - w) * (o - w))
                .sum();
            total_error += (estimate - exact) as f64;
            let sigma = 2.0 * factors.error * w_norm_sq.sqrt();
            if (estimate - exact).abs() > sigma * 1.9 {
                outside += 1;
            }
            if (estimate - exact).abs() > sigma * 3.5 {
                far_outside += 1;
            }
        }
        let mean_error = total_error / trials as f64;
        assert!(mean_error.abs() < 0.5, "estimator bias {mean_error}");
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
