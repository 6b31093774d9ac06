//! Every kernel of every ISA this CPU supports, against an f64 reference, on random
//! data of awkward lengths and misaligned starts.

use proptest::prelude::*;

use crate::dispatch::all_kernel_sets;
use crate::{BulkOp, RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS, bf16_bits_to_f32, f32_to_bf16_bits};

fn reference_dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn reference_l2sq(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum()
}

/// Float kernels reorder sums; allow error relative to the magnitude of the terms.
fn assert_close(actual: f32, expected: f64, magnitude: f64, what: &str) {
    let tolerance = 1e-5 * magnitude.max(1.0) + 1e-5;
    assert!(
        (actual as f64 - expected).abs() <= tolerance,
        "{what}: got {actual}, expected {expected} (tolerance {tolerance})"
    );
}

fn vectors(max_len: usize) -> impl Strategy<Value = (Vec<f32>, Vec<f32>, usize)> {
    (0..max_len, 0usize..8).prop_flat_map(|(len, offset)| {
        (
            prop::collection::vec(-4.0f32..4.0, len + offset),
            prop::collection::vec(-4.0f32..4.0, len + offset),
            Just(offset),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn f32_kernels_match_reference((a, b, offset) in vectors(1100)) {
        let (a, b) = (&a[offset..], &b[offset..]);
        let magnitude: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
        for kernels in all_kernel_sets() {
            assert_close((kernels.dot_f32)(a, b), reference_dot(a, b), magnitude, kernels.isa.name());
            let l2_magnitude = reference_l2sq(a, b);
            assert_close((kernels.l2sq_f32)(a, b), l2_magnitude, l2_magnitude, kernels.isa.name());
        }
    }

    #[test]
    fn bf16_kernels_match_reference((a, b, offset) in vectors(1100)) {
        let (query, row_f32) = (&a[offset..], &b[offset..]);
        let row: Vec<u16> = row_f32.iter().map(|&x| f32_to_bf16_bits(x)).collect();
        let widened: Vec<f32> = row.iter().map(|&bits| bf16_bits_to_f32(bits)).collect();
        let magnitude: f64 = query.iter().zip(&widened).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
        for kernels in all_kernel_sets() {
            assert_close((kernels.dot_bf16)(query, &row), reference_dot(query, &widened), magnitude, kernels.isa.name());
            let l2 = reference_l2sq(query, &widened);
            assert_close((kernels.l2sq_bf16)(query, &row), l2, l2, kernels.isa.name());
        }
    }

    #[test]
    fn int8_kernels_are_exact(
        (a, b, offset) in (0usize..1100, 0usize..8).prop_flat_map(|(len, offset)| (
            prop::collection::vec(any::<i8>(), len + offset),
            prop::collection::vec(any::<i8>(), len + offset),
            Just(offset),
        ))
    ) {
        let (a, b) = (&a[offset..], &b[offset..]);
        let expected: i32 = a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum();
        for kernels in all_kernel_sets() {
            prop_assert_eq!((kernels.dot_i8)(a, b), expected, "isa {}", kernels.isa.name());
        }
    }

    #[test]
    fn int8_bulk_kernels_are_exact(
        (query, rows, offset) in (1usize..300, 0usize..6, 0usize..8).prop_flat_map(|(dim, rows, offset)| (
            prop::collection::vec(any::<i8>(), dim),
            prop::collection::vec(any::<i8>(), dim * rows + offset),
            Just(offset),
        ))
    ) {
        // Rows starting at any alignment, every byte value (-128 included).
        let rows = &rows[offset..];
        let expected: Vec<i32> = rows
            .chunks_exact(query.len())
            .map(|row| row.iter().zip(&query).map(|(&x, &y)| x as i32 * y as i32).sum())
            .collect();
        for kernels in all_kernel_sets() {
            let mut out = vec![i32::MIN; expected.len() + 1];
            (kernels.i8_bulk)(&query, rows, &mut out);
            prop_assert_eq!(&out[..expected.len()], &expected[..], "isa {}", kernels.isa.name());
            prop_assert_eq!(out[expected.len()], i32::MIN, "isa {}: wrote past the rows", kernels.isa.name());
        }
    }

    #[test]
    fn rabitq_scan_matches_bitwise_reference(
        words in 1usize..20,
        blocks in 1usize..5,
        seed in any::<u64>(),
    ) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let codes: Vec<u64> = (0..words * RABITQ_BLOCK_ROWS * blocks).map(|_| rng.random()).collect();
        let query_values: Vec<u32> = (0..words * 64).map(|_| rng.random_range(0..16)).collect();
        let mut planes = vec![0u64; RABITQ_QUERY_BITS * words];
        for (dim, &value) in query_values.iter().enumerate() {
            for bit in 0..RABITQ_QUERY_BITS {
                if value >> bit & 1 == 1 {
                    planes[bit * words + dim / 64] |= 1 << (dim % 64);
                }
            }
        }
        // Reference: the inner product of each row's bits with the 4-bit query.
        let mut expected = vec![0u32; blocks * RABITQ_BLOCK_ROWS];
        for block in 0..blocks {
            for lane in 0..RABITQ_BLOCK_ROWS {
                let mut total = 0;
                for (dim, &value) in query_values.iter().enumerate() {
                    let code = codes[block * words * RABITQ_BLOCK_ROWS + (dim / 64) * RABITQ_BLOCK_ROWS + lane];
                    if code >> (dim % 64) & 1 == 1 {
                        total += value;
                    }
                }
                expected[block * RABITQ_BLOCK_ROWS + lane] = total;
            }
        }
        for kernels in all_kernel_sets() {
            let mut out = vec![0u32; blocks * RABITQ_BLOCK_ROWS];
            (kernels.rabitq_blocks)(&codes, words, &planes, &mut out);
            prop_assert_eq!(&out, &expected, "isa {}", kernels.isa.name());
        }
    }

    #[test]
    fn estimates_match_reference(blocks in 1usize..4, seed in any::<u64>()) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let rows = blocks * RABITQ_BLOCK_ROWS;
        let counts: Vec<u32> = (0..rows).map(|_| rng.random_range(0..2000)).collect();
        let factors: Vec<f32> = (0..rows * 4).map(|_| rng.random_range(-2.0..2.0)).collect();
        let terms = crate::EstimateTerms {
            low: -0.3, step2: 0.04, list_term: 1.5, list_constant: 0.7, multiplier: -2.0,
            bound_scale: 1.9, lower_threshold: rng.random_range(-50.0..50.0), key_threshold: rng.random_range(-50.0..50.0),
        };
        let mut expected = (vec![0f32; rows], vec![0f32; rows], vec![0u32; blocks]);
        crate::estimate::estimate_scalar(&counts, &factors, &terms, &mut expected.0, &mut expected.1, &mut expected.2);
        for kernels in all_kernel_sets() {
            let mut got = (vec![0f32; rows], vec![0f32; rows], vec![0u32; blocks]);
            (kernels.estimate)(&counts, &factors, &terms, &mut got.0, &mut got.1, &mut got.2);
            for row in 0..rows {
                assert_close(got.0[row], expected.0[row] as f64, 100.0, kernels.isa.name());
                assert_close(got.1[row], expected.1[row] as f64, 100.0, kernels.isa.name());
            }
            // FMA contraction may move a value across a threshold only within rounding.
            for block in 0..blocks {
                let differing = got.2[block] ^ expected.2[block];
                for lane in 0..RABITQ_BLOCK_ROWS {
                    if differing >> lane & 1 == 1 {
                        let row = block * RABITQ_BLOCK_ROWS + lane;
                        let near = (expected.1[row] - terms.lower_threshold).abs() < 1e-3
                            || (expected.0[row] - terms.key_threshold).abs() < 1e-3;
                        prop_assert!(near, "mask differs at row {} for {}", row, kernels.isa.name());
                    }
                }
            }
        }
    }

    #[test]
    fn transposed_block_matches_reference(dim in 1usize..90, queries in 0usize..21, seed in any::<u64>()) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let query_data: Vec<f32> = (0..dim * queries).map(|_| rng.random_range(-1.0..1.0)).collect();
        let block: Vec<f32> = (0..dim * 16).map(|_| rng.random_range(-1.0..1.0)).collect();
        for kernels in all_kernel_sets() {
            let mut out = vec![f32::NAN; queries * 16];
            (kernels.dot_block16)(&query_data, dim, &block, &mut out);
            for q in 0..queries {
                for column in 0..16 {
                    let expected: f64 = (0..dim).map(|d| query_data[q * dim + d] as f64 * block[d * 16 + column] as f64).sum();
                    assert_close(out[q * 16 + column], expected, dim as f64, kernels.isa.name());
                }
            }
        }
    }

    #[test]
    fn bulk_and_gather_match_single_row_kernels(
        dim in 1usize..200,
        rows in 1usize..40,
        seed in any::<u64>(),
    ) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let query: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let matrix: Vec<f32> = (0..dim * rows).map(|_| rng.random_range(-1.0..1.0)).collect();
        let matrix_bf16: Vec<u16> = matrix.iter().map(|&x| f32_to_bf16_bits(x)).collect();
        let picks: Vec<u32> = (0..rows * 2).map(|_| rng.random_range(0..rows as u32)).collect();
        for kernels in all_kernel_sets() {
            for op in [BulkOp::Dot, BulkOp::L2Squared] {
                let single = |row: &[f32]| match op {
                    BulkOp::Dot => crate::scalar::dot_f32(&query, row),
                    BulkOp::L2Squared => crate::scalar::l2sq_f32(&query, row),
                };
                let single_bf16 = |row: &[u16]| match op {
                    BulkOp::Dot => crate::scalar::dot_bf16(&query, row),
                    BulkOp::L2Squared => crate::scalar::l2sq_bf16(&query, row),
                };
                let mut out = vec![0f32; rows];
                (kernels.f32_bulk)(op, &query, &matrix, &mut out);
                for (row, score) in matrix.chunks_exact(dim).zip(&out) {
                    assert_close(*score, single(row) as f64, dim as f64, "f32 bulk");
                }
                (kernels.bf16_bulk)(op, &query, &matrix_bf16, &mut out);
                for (row, score) in matrix_bf16.chunks_exact(dim).zip(&out) {
                    assert_close(*score, single_bf16(row) as f64, dim as f64, "bf16 bulk");
                }
                let mut gathered = vec![0f32; picks.len()];
                (kernels.f32_gather)(op, &query, &matrix, &picks, &mut gathered);
                for (&row, score) in picks.iter().zip(&gathered) {
                    let vector = &matrix[row as usize * dim..][..dim];
                    assert_close(*score, single(vector) as f64, dim as f64, "f32 gather");
                }
                (kernels.bf16_gather)(op, &query, &matrix_bf16, &picks, &mut gathered);
                for (&row, score) in picks.iter().zip(&gathered) {
                    let vector = &matrix_bf16[row as usize * dim..][..dim];
                    assert_close(*score, single_bf16(vector) as f64, dim as f64, "bf16 gather");
                }
            }
        }
    }
}

#[test]
fn cosine_of_parallel_and_orthogonal_vectors() {
    assert!((crate::cosine_f32(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0]) - 1.0).abs() < 1e-6);
    assert!(crate::cosine_f32(&[1.0, 0.0], &[0.0, 5.0]).abs() < 1e-6);
    assert_eq!(crate::cosine_f32(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
}

#[test]
fn an_isa_is_selected_and_reported() {
    let isa = crate::selected_isa();
    assert!(!isa.name().is_empty());
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert_ne!(
            isa,
            crate::Isa::Scalar,
            "AVX2 CPU must not fall back to scalar"
        );
    }
}

#[test]
fn int8_bulk_scores_every_row_exactly() {
    let dim = 37;
    let query: Vec<i8> = (0..dim).map(|i| (i as i32 * 7 - 120) as i8).collect();
    let rows: Vec<i8> = (0..dim * 5)
        .map(|i| ((i * 31) % 255) as i32 as u8 as i8)
        .collect();
    let mut out = vec![0i32; 6];
    crate::dot_i8_bulk(&query, &rows, &mut out);
    for (row, &score) in rows.chunks_exact(dim).zip(&out) {
        let expected: i32 = row
            .iter()
            .zip(&query)
            .map(|(&x, &y)| x as i32 * y as i32)
            .sum();
        assert_eq!(score, expected);
    }
    assert_eq!(out[5], 0, "only the rows given are written");
}

#[test]
fn int8_quantization_keeps_values_within_half_a_step() {
    let values = [0.5f32, -1.25, 0.0, 1e-4, 0.75];
    let mut codes = vec![3i8];
    let scale = crate::quantize_i8(&values, &mut codes);
    assert_eq!(codes.len(), 6, "codes are appended");
    assert_eq!(codes[2], -127, "the largest magnitude maps to ±127");
    assert!((scale - 1.25 / 127.0).abs() < 1e-9);
    for (&value, &code) in values.iter().zip(&codes[1..]) {
        assert!(
            (value - scale * code as f32).abs() <= scale / 2.0 + 1e-7,
            "{value} -> {code}"
        );
    }
    let mut zeros = Vec::new();
    assert_eq!(crate::quantize_i8(&[0.0; 4], &mut zeros), 0.0);
    assert_eq!(zeros, vec![0; 4]);
}
