//! Random orthogonal rotation in O(D log D): rounds of random sign flips followed
//! by a normalised fast Walsh–Hadamard transform. When the padded dimension is not
//! a power of two, rounds alternate between the leading and the trailing
//! power-of-two block (they overlap), so every coordinate is mixed with every other.

use rand::{Rng, SeedableRng};

const ROUNDS: usize = 4;

/// A seeded rotation of vectors of dimension `dim`, zero-padded to `padded_dim`
/// (a multiple of 64, the width of one code word).
#[derive(Clone, Debug)]
pub struct Rotation {
    dim: usize,
    padded_dim: usize,
    block: usize,
    signs: Vec<f32>,
}

/// Returns `dim` rounded up to a multiple of 64.
pub fn padded_dimension(dim: usize) -> usize {
    dim.div_ceil(64).max(1) * 64
}

impl Rotation {
    /// Returns the rotation determined by `seed` for vectors of dimension `dim`.
    pub fn new(dim: usize, seed: u64) -> Self {
        let padded_dim = padded_dimension(dim);
        let block = if padded_dim.is_power_of_two() {
            padded_dim
        } else {
            1 << (usize::BITS - 1 - padded_dim.leading_zeros())
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let signs = (0..ROUNDS * padded_dim)
            .map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 })
            .collect();
        Rotation {
            dim,
            padded_dim,
            block,
            signs,
        }
    }

    /// Returns the dimension of rotated vectors.
    #[cfg(test)]
    pub fn padded_dim(&self) -> usize {
        self.padded_dim
    }

    /// Rotates `input` (`dim` values) into `output` (`padded_dim` values).
    pub fn apply(&self, input: &[f32], output: &mut [f32]) {
        debug_assert_eq!(input.len(), self.dim);
        debug_assert_eq!(output.len(), self.padded_dim);
        output[..self.dim].copy_from_slice(input);
        output[self.dim..].fill(0.0);
        let scale = 1.0 / (self.block as f32).sqrt();
        for round in 0..ROUNDS {
            let signs = &self.signs[round * self.padded_dim..][..self.padded_dim];
            for (value, sign) in output.iter_mut().zip(signs) {
                *value *= sign;
            }
            let start = if round % 2 == 1 {
                self.padded_dim - self.block
            } else {
                0
            };
            let window = &mut output[start..start + self.block];
            walsh_hadamard(window);
            for value in window.iter_mut() {
                *value *= scale;
            }
        }
    }
}

/// In-place unnormalised fast Walsh–Hadamard transform of a power-of-two slice.
fn walsh_hadamard(values: &mut [f32]) {
    let n = values.len();
    debug_assert!(n.is_power_of_two());
    let mut half = 1;
    while half < n {
        for chunk in values.chunks_exact_mut(2 * half) {
            let (left, right) = chunk.split_at_mut(half);
            for (a, b) in left.iter_mut().zip(right.iter_mut()) {
                let (x, y) = (*a, *b);
                *a = x + y;
                *b = x - y;
            }
        }
        half *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norms_and_inner_products() {
        for dim in [1, 7, 64, 100, 384, 768, 1000] {
            let rotation = Rotation::new(dim, 42);
            let mut rng = rand::rngs::StdRng::seed_from_u64(dim as u64);
            let a: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut ra = vec![0.0; rotation.padded_dim()];
            let mut rb = vec![0.0; rotation.padded_dim()];
            rotation.apply(&a, &mut ra);
            rotation.apply(&b, &mut rb);
            let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
            assert!((dot(&a, &b) - dot(&ra, &rb)).abs() < 1e-3, "dim {dim}");
            assert!((dot(&a, &a) - dot(&ra, &ra)).abs() < 1e-3, "dim {dim}");
        }
    }

    #[test]
    fn rotation_spreads_a_spike() {
        let rotation = Rotation::new(384, 1);
        let mut spike = vec![0.0; 384];
        spike[5] = 1.0;
        let mut rotated = vec![0.0; rotation.padded_dim()];
        rotation.apply(&spike, &mut rotated);
        let largest = rotated.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            largest < 0.5,
            "a unit spike must be spread out, largest coordinate {largest}"
        );
    }
}
