//! `quiver-bench gen`: synthetic clustered datasets with exact ground truth.
//!
//! Like `shared/bench/make_synthetic.py`: unit-norm gaussian cluster centres with
//! Zipf-distributed weights, anisotropic noise (power-law spectrum in a random
//! orthonormal basis) of norm `noise`, every vector normalised, queries drawn
//! fresh from the same mixture, exact top-`k` by inner product.

use std::path::Path;

use anyhow::{Result, bail};
use quiver_common::vecs::{write_fvecs, write_ivecs};
use quiver_simd::BulkOp;
use rand::distr::weighted::WeightedIndex;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::progress::bar;

/// Settings of a generated dataset.
pub struct GenSpec {
    pub rows: usize,
    pub dim: usize,
    pub clusters: usize,
    pub queries: usize,
    pub noise: f32,
    pub decay: f32,
    pub zipf: f64,
    pub ground_truth_k: usize,
    pub seed: u64,
}

fn normalise(vector: &mut [f32]) {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v /= norm);
    }
}

/// Returns `dim` orthonormal rows (modified Gram–Schmidt on a gaussian matrix).
fn random_orthonormal(dim: usize, rng: &mut impl Rng) -> Vec<f64> {
    let mut basis: Vec<f64> = (0..dim * dim).map(|_| StandardNormal.sample(rng)).collect();
    for i in 0..dim {
        for j in 0..i {
            let dot: f64 = (0..dim)
                .map(|d| basis[i * dim + d] * basis[j * dim + d])
                .sum();
            for d in 0..dim {
                basis[i * dim + d] -= dot * basis[j * dim + d];
            }
        }
        let norm = (0..dim)
            .map(|d| basis[i * dim + d].powi(2))
            .sum::<f64>()
            .sqrt();
        for d in 0..dim {
            basis[i * dim + d] /= norm;
        }
    }
    basis
}

/// Generates the dataset described by `spec` into `out` (base, queries, ground truth).
pub fn generate(spec: &GenSpec, out: &Path) -> Result<()> {
    if spec.rows == 0 || spec.dim == 0 || spec.clusters == 0 {
        bail!("--n, --dim and --clusters must be positive");
    }
    std::fs::create_dir_all(out)?;
    let dim = spec.dim;
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut centres: Vec<f32> = (0..spec.clusters * dim)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    centres.chunks_exact_mut(dim).for_each(normalise);
    let weights: Vec<f64> = (1..=spec.clusters)
        .map(|rank| 1.0 / (rank as f64).powf(spec.zipf))
        .collect();
    let chooser = WeightedIndex::new(&weights)?;
    // Noise: std of principal direction i ∝ i^(−decay/2), total norm = noise.
    let mut spectrum: Vec<f64> = (1..=dim)
        .map(|i| (i as f64).powf(-(spec.decay as f64) / 2.0))
        .collect();
    let total = spectrum.iter().map(|s| s * s).sum::<f64>().sqrt();
    spectrum
        .iter_mut()
        .for_each(|s| *s *= spec.noise as f64 / total);
    let basis = random_orthonormal(dim, &mut rng);
    let mixing: Vec<f32> = (0..dim * dim)
        .map(|i| (spectrum[i / dim] * basis[i]) as f32)
        .collect();

    let sample = |count: usize, seed: u64, label: &str| -> Vec<f32> {
        let progress = bar(label, count as u64);
        let mut data = vec![0f32; count * dim];
        data.par_chunks_mut(dim * 1024)
            .enumerate()
            .for_each(|(chunk_index, chunk)| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(
                    seed ^ (chunk_index as u64).wrapping_mul(0x9e37_79b9),
                );
                let mut noise = vec![0f32; dim];
                for vector in chunk.chunks_exact_mut(dim) {
                    let centre = chooser.sample(&mut rng);
                    vector.copy_from_slice(&centres[centre * dim..][..dim]);
                    noise
                        .iter_mut()
                        .for_each(|z| *z = StandardNormal.sample(&mut rng));
                    for (z, row) in noise.iter().zip(mixing.chunks_exact(dim)) {
                        for (value, m) in vector.iter_mut().zip(row) {
                            *value += z * m;
                        }
                    }
                    normalise(vector);
                }
                progress.inc((chunk.len() / dim) as u64);
            });
        progress.finish();
        data
    };
    let base = sample(spec.rows, spec.seed.wrapping_add(1), "base");
    let queries = sample(spec.queries, spec.seed.wrapping_add(2), "queries");
    let k = spec.ground_truth_k.min(spec.rows);
    let truth = exact_top_k(&base, &queries, dim, k, BulkOp::Dot);
    write_fvecs(&out.join("base.fvecs"), dim, &base)?;
    write_fvecs(&out.join("queries.fvecs"), dim, &queries)?;
    write_ivecs(&out.join("groundtruth.ivecs"), k, &truth)?;
    println!(
        "wrote {} base and {} query vectors of dimension {dim}, and exact top-{k}, to {}",
        spec.rows,
        spec.queries,
        out.display()
    );
    Ok(())
}

/// Returns the exact top-`k` base rows of every query (ids as i32, best first).
pub fn exact_top_k(base: &[f32], queries: &[f32], dim: usize, k: usize, op: BulkOp) -> Vec<i32> {
    let query_count = queries.len() / dim;
    let rows = base.len() / dim;
    let progress = bar("ground truth", query_count as u64);
    let mut truth = vec![0i32; query_count * k];
    truth
        .par_chunks_mut(k)
        .zip(queries.par_chunks(dim))
        .for_each(|(out, query)| {
            let mut scores = vec![0f32; rows];
            quiver_simd::score_f32_bulk(op, query, base, &mut scores);
            let key = |row: usize| {
                if op == BulkOp::Dot {
                    -scores[row]
                } else {
                    scores[row]
                }
            };
            let mut order: Vec<usize> = (0..rows).collect();
            if k < rows {
                order.select_nth_unstable_by(k - 1, |&a, &b| key(a).total_cmp(&key(b)));
                order.truncate(k);
            }
            order.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
            for (slot, row) in out.iter_mut().zip(order) {
                *slot = row as i32;
            }
            progress.inc(1);
        });
    progress.finish();
    truth
}
