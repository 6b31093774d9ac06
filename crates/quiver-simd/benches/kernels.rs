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

/// Rows and vectors of one k-means product (a task's rows against a panel
/// of centroids).
const PRODUCT_ROWS: usize = 128;
const PRODUCT_VECTORS: usize = 1024;

/// Inner products of a k-means task's rows with a panel of centroids: the bf16
/// product unit (AMX tiles or AVX512-BF16, whichever this CPU has) against the
/// f32 block kernel, in products per second.
fn products(c: &mut Criterion) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    eprintln!(
        "quiver-simd bf16 product unit: {}",
        quiver_simd::product_unit().map_or("none".to_string(), |unit| unit.to_string())
    );
    for dim in DIMS {
        let rows = random_f32(&mut rng, PRODUCT_ROWS * dim);
        let vectors = random_f32(&mut rng, PRODUCT_VECTORS * dim);
        let mut group = c.benchmark_group(format!("products/{dim}"));
        group.throughput(Throughput::Elements(
            (PRODUCT_ROWS * PRODUCT_VECTORS) as u64,
        ));
        if quiver_simd::tile_products_available() {
            let center = vec![0f32; dim];
            let panel = quiver_simd::TilePanel::new(&vectors, dim, &center);
            let mut bf16_rows = Vec::new();
            let padded_rows = quiver_simd::tile_rows(&rows, dim, &center, &mut bf16_rows);
            let mut out = vec![0f32; padded_rows * panel.padded_count()];
            group.bench_function(BenchmarkId::new("bf16_unit", dim), |b| {
                b.iter(|| quiver_simd::tile_products(&bf16_rows, &panel, &mut out))
            });
        }
        // The f32 kernel's layout: 16 vectors to a block, transposed.
        let columns = quiver_simd::BLOCK_COLUMNS;
        let mut blocks = vec![0f32; PRODUCT_VECTORS * dim];
        for (index, vector) in vectors.chunks_exact(dim).enumerate() {
            let block = &mut blocks[(index / columns) * dim * columns..][..dim * columns];
            for (d, &value) in vector.iter().enumerate() {
                block[d * columns + index % columns] = value;
            }
        }
        let mut dots = vec![0f32; 64 * columns];
        group.bench_function(BenchmarkId::new("f32_blocks", dim), |b| {
            b.iter(|| {
                for tile in rows.chunks_exact(64 * dim) {
                    for block in blocks.chunks_exact(dim * columns) {
                        quiver_simd::dot_transposed_block(tile, dim, block, &mut dots);
                    }
                }
            })
        });
        group.finish();
    }
}

criterion_group!(benches, kernels, products);
criterion_main!(benches);
