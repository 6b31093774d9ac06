//! Vectors per second for every kernel at the dimensions the workload uses.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use quiver_simd::{BulkOp, RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS};
use rand::{Rng, SeedableRng};

const ROWS: usize = 1024;
const DIMS: [usize; 3] = [384, 768, 1024];

fn random_f32(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn kernels(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    eprintln!("quiver-simd selected isa: {}", quiver_simd::selected_isa());
    for dim in DIMS {
        let query = random_f32(&mut rng, dim);
        let matrix = random_f32(&mut rng, dim * ROWS);
        let matrix_bf16: Vec<u16> = matrix
            .iter()
            .map(|&x| quiver_simd::f32_to_bf16_bits(x))
            .collect();
        let matrix_i8: Vec<i8> = (0..dim * ROWS).map(|_| rng.random()).collect();
        let query_i8: Vec<i8> = (0..dim).map(|_| rng.random()).collect();
        let mut out = vec![0f32; ROWS];
        let mut group = c.benchmark_group(format!("kernels/{dim}"));
        group.throughput(Throughput::Elements(ROWS as u64));
        group.bench_function(BenchmarkId::new("f32_dot_bulk", dim), |b| {
            b.iter(|| quiver_simd::score_f32_bulk(BulkOp::Dot, &query, &matrix, &mut out))
        });
        group.bench_function(BenchmarkId::new("f32_l2_bulk", dim), |b| {
            b.iter(|| quiver_simd::score_f32_bulk(BulkOp::L2Squared, &query, &matrix, &mut out))
        });
        group.bench_function(BenchmarkId::new("bf16_dot_bulk", dim), |b| {
            b.iter(|| quiver_simd::score_bf16_bulk(BulkOp::Dot, &query, &matrix_bf16, &mut out))
        });
        group.bench_function(BenchmarkId::new("i8_dot", dim), |b| {
            b.iter(|| {
                let mut total = 0i64;
                for row in matrix_i8.chunks_exact(dim) {
                    total += quiver_simd::dot_i8(&query_i8, row) as i64;
                }
                total
            })
        });
        let mut out_i32 = vec![0i32; ROWS];
        group.bench_function(BenchmarkId::new("i8_dot_bulk", dim), |b| {
            b.iter(|| quiver_simd::dot_i8_bulk(&query_i8, &matrix_i8, &mut out_i32))
        });
        let picks: Vec<u32> = (0..ROWS)
            .map(|_| rng.random_range(0..ROWS as u32))
            .collect();
        group.bench_function(BenchmarkId::new("f32_dot_gather", dim), |b| {
            b.iter(|| quiver_simd::score_f32_gather(BulkOp::Dot, &query, &matrix, &picks, &mut out))
        });
        let words = dim.div_ceil(64);
        let codes: Vec<u64> = (0..words * ROWS).map(|_| rng.random()).collect();
        let planes: Vec<u64> = (0..words * RABITQ_QUERY_BITS)
            .map(|_| rng.random())
            .collect();
        let mut counts = vec![0u32; ROWS];
        debug_assert_eq!(ROWS % RABITQ_BLOCK_ROWS, 0);
        group.bench_function(BenchmarkId::new("rabitq_1bit_x_4bit", dim), |b| {
            b.iter(|| quiver_simd::rabitq_scan_blocks(&codes, words, &planes, &mut counts))
        });
        group.finish();
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
