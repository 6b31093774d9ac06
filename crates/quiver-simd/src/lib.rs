//! Distance kernels for Quiver: f32, bf16-stored and int8 vectors, and the RaBitQ
//! 1-bit code × 4-bit query kernel, each with a portable scalar reference and
//! per-ISA versions (AVX-512, AVX2+FMA, NEON) chosen once at runtime.
//!
//! Single-pair kernels score one row; bulk kernels score a whole block of rows (a
//! posting list, or a list of candidate rows) in one call, writing into a buffer the
//! caller owns. Nothing is allocated or copied per call.
//!
//! Layout of RaBitQ codes: rows are grouped into blocks of [`RABITQ_BLOCK_ROWS`]
//! rows; inside a block, 64-bit word `w` of all rows is stored contiguously
//! (`block[w * 32 + lane]`), so one vector register holds the same word of several
//! rows and the scan needs no masked or unaligned loads.

mod dispatch;
mod estimate;
mod scalar;
mod tiles;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

pub use dispatch::{
    Isa, SIMD_MAX_ENV, SimdError, SimdResult, parse_simd_max, selected_isa, simd_max_from_env,
};
pub use estimate::EstimateTerms;
pub use tiles::{
    ProductUnit, TILE_DIMS, TILE_ROWS, TILE_VECTORS, TilePanel, cpu_has_bf16_products,
    cpu_has_tiles, product_unit, tile_products, tile_products_available, tile_rows,
    tiles_allowed_by_cap,
};

/// Rows per RaBitQ code block.
pub const RABITQ_BLOCK_ROWS: usize = 32;
/// Bits per dimension of the quantized query used by the RaBitQ kernel.
pub const RABITQ_QUERY_BITS: usize = 4;

/// Scalar reference implementations, exposed so tests and benchmarks can compare
/// every dispatched kernel against them.
pub mod reference {
    pub use crate::scalar::{
        dot_bf16, dot_block16 as dot_transposed_block, dot_f32, dot_i8, l2sq_bf16, l2sq_f32,
        rabitq_blocks as rabitq_scan_blocks,
    };
}

/// Returns the inner product of two f32 vectors of equal length.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    (dispatch::kernels().dot_f32)(a, b)
}

/// Returns the squared Euclidean distance between two f32 vectors of equal length.
#[inline]
pub fn l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "l2sq_f32: length mismatch");
    (dispatch::kernels().l2sq_f32)(a, b)
}

/// Returns the cosine similarity of two f32 vectors (0 when either has zero norm).
pub fn cosine_f32(a: &[f32], b: &[f32]) -> f32 {
    let kernels = dispatch::kernels();
    assert_eq!(a.len(), b.len(), "cosine_f32: length mismatch");
    let norms = (kernels.dot_f32)(a, a) * (kernels.dot_f32)(b, b);
    if norms <= 0.0 {
        return 0.0;
    }
    (kernels.dot_f32)(a, b) / norms.sqrt()
}

/// Returns the inner product of an f32 query with a row stored as bf16 bit patterns.
#[inline]
pub fn dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    assert_eq!(query.len(), row.len(), "dot_bf16: length mismatch");
    (dispatch::kernels().dot_bf16)(query, row)
}

/// Returns the squared Euclidean distance between an f32 query and a bf16 row.
#[inline]
pub fn l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    assert_eq!(query.len(), row.len(), "l2sq_bf16: length mismatch");
    (dispatch::kernels().l2sq_bf16)(query, row)
}

/// Returns the inner product of two int8 vectors as an exact i32.
#[inline]
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    assert_eq!(a.len(), b.len(), "dot_i8: length mismatch");
    (dispatch::kernels().dot_i8)(a, b)
}

/// Which distance a bulk kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BulkOp {
    /// Inner product (larger is closer).
    Dot,
    /// Squared Euclidean distance (smaller is closer).
    L2Squared,
}

/// Scores `rows` (row-major, `dim` values each) against `query`, writing one score
/// per row into `out[..rows.len() / dim]`.
pub fn score_f32_bulk(op: BulkOp, query: &[f32], rows: &[f32], out: &mut [f32]) {
    let dim = query.len();
    assert!(
        dim > 0 && rows.len().is_multiple_of(dim),
        "score_f32_bulk: rows not a multiple of dim"
    );
    let n = rows.len() / dim;
    assert!(out.len() >= n, "score_f32_bulk: output buffer too small");
    (dispatch::kernels().f32_bulk)(op, query, rows, &mut out[..n]);
}

/// Inner products of int8 rows (row-major, `query.len()` values each) with an int8
/// query: one exact i32 per row into `out[..rows.len() / dim]`. A quarter of the
/// bytes an f32 scan reads, for scans that are bound by memory bandwidth (a
/// searcher's WAL tail, rescored in f32 afterwards).
pub fn dot_i8_bulk(query: &[i8], rows: &[i8], out: &mut [i32]) {
    let dim = query.len();
    assert!(
        dim > 0 && rows.len().is_multiple_of(dim),
        "dot_i8_bulk: rows not a multiple of dim"
    );
    let n = rows.len() / dim;
    assert!(out.len() >= n, "dot_i8_bulk: output buffer too small");
    (dispatch::kernels().i8_bulk)(query, rows, &mut out[..n]);
}

/// Quantizes `values` to int8 with one symmetric scale (the largest magnitude maps
/// to ±127), appending the codes to `out`; returns the scale, so that
/// `values[i] ≈ scale × out[i]` (0 for an all-zero input).
pub fn quantize_i8(values: &[f32], out: &mut Vec<i8>) -> f32 {
    let largest = values
        .iter()
        .fold(0.0f32, |largest, value| largest.max(value.abs()));
    if largest == 0.0 || !largest.is_finite() {
        out.extend(std::iter::repeat_n(0i8, values.len()));
        return 0.0;
    }
    let inverse = 127.0 / largest;
    out.extend(
        values
            .iter()
            .map(|value| (value * inverse).round().clamp(-127.0, 127.0) as i8),
    );
    largest / 127.0
}

/// Scores the rows of a bf16 matrix (`dim` values each) against an f32 query.
pub fn score_bf16_bulk(op: BulkOp, query: &[f32], rows: &[u16], out: &mut [f32]) {
    let dim = query.len();
    assert!(
        dim > 0 && rows.len().is_multiple_of(dim),
        "score_bf16_bulk: rows not a multiple of dim"
    );
    let n = rows.len() / dim;
    assert!(out.len() >= n, "score_bf16_bulk: output buffer too small");
    (dispatch::kernels().bf16_bulk)(op, query, rows, &mut out[..n]);
}

/// Scores selected rows of an f32 matrix: `out[i]` = score of row `row_indices[i]`.
/// Rows ahead are prefetched, so scattered candidates (rescoring) do not stall on
/// one memory access at a time.
pub fn score_f32_gather(
    op: BulkOp,
    query: &[f32],
    matrix: &[f32],
    row_indices: &[u32],
    out: &mut [f32],
) {
    let dim = query.len();
    assert!(
        out.len() >= row_indices.len(),
        "score_f32_gather: output buffer too small"
    );
    let rows = matrix.len() / dim;
    assert!(
        row_indices.iter().all(|&row| (row as usize) < rows),
        "score_f32_gather: row index out of range"
    );
    (dispatch::kernels().f32_gather)(
        op,
        query,
        matrix,
        row_indices,
        &mut out[..row_indices.len()],
    );
}

/// Scores selected rows of a bf16 matrix: `out[i]` = score of row `row_indices[i]`.
pub fn score_bf16_gather(
    op: BulkOp,
    query: &[f32],
    matrix: &[u16],
    row_indices: &[u32],
    out: &mut [f32],
) {
    let dim = query.len();
    assert!(
        out.len() >= row_indices.len(),
        "score_bf16_gather: output buffer too small"
    );
    let rows = matrix.len() / dim;
    assert!(
        row_indices.iter().all(|&row| (row as usize) < rows),
        "score_bf16_gather: row index out of range"
    );
    (dispatch::kernels().bf16_gather)(
        op,
        query,
        matrix,
        row_indices,
        &mut out[..row_indices.len()],
    );
}

/// Scans RaBitQ code blocks against a 4-bit quantized query.
///
/// `codes` holds whole blocks of [`RABITQ_BLOCK_ROWS`] rows × `words` u64 each, in
/// the blocked layout described in the crate docs. `query_planes` holds the query's
/// 4 bit planes, `words` u64 each, plane `j` (weight `2^j`) at
/// `query_planes[j * words..]`. For every row, `out[row]` receives
/// `Σ_j 2^j · popcount(code & plane_j)`, i.e. the inner product of the row's bit
/// vector with the quantized query.
pub fn rabitq_scan_blocks(codes: &[u64], words: usize, query_planes: &[u64], out: &mut [u32]) {
    let block_len = words * RABITQ_BLOCK_ROWS;
    assert!(
        words > 0 && codes.len().is_multiple_of(block_len),
        "rabitq_scan_blocks: partial block"
    );
    assert_eq!(
        query_planes.len(),
        RABITQ_QUERY_BITS * words,
        "rabitq_scan_blocks: bad planes"
    );
    let rows = codes.len() / block_len * RABITQ_BLOCK_ROWS;
    assert!(
        out.len() >= rows,
        "rabitq_scan_blocks: output buffer too small"
    );
    (dispatch::kernels().rabitq_blocks)(codes, words, query_planes, &mut out[..rows]);
}

/// Asks the CPU to start loading `bytes` into cache (a hint; never faults).
/// Rescoring calls it a few candidates ahead so scattered rows arrive in time.
#[inline]
pub fn prefetch_read(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = bytes.as_ptr();
        for offset in (0..bytes.len()).step_by(64) {
            // SAFETY: prefetch is a hint that never faults, and SSE is part of the
            // x86-64 baseline; the address lies inside `bytes`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Turns popcount-kernel outputs into RaBitQ keys and lower bounds for whole blocks.
///
/// `counts` holds the kernel's output for `masks.len()` blocks, `factors` the
/// blocks' factor arrays (per block: 32 constants, 32 rescales, 32 error factors,
/// 32 doubled popcounts). For every row `key = constant + list_constant +
/// multiplier·rescale·(low·popcount2 + step2·count + list_term)` and
/// `lower = key − bound_scale·error`; bit `lane` of `masks[block]` is set when the
/// row's lower bound is below `lower_threshold` or its key below `key_threshold`.
pub fn rabitq_estimate_blocks(
    counts: &[u32],
    factors: &[f32],
    terms: &EstimateTerms,
    keys: &mut [f32],
    lowers: &mut [f32],
    masks: &mut [u32],
) {
    let rows = masks.len() * RABITQ_BLOCK_ROWS;
    assert!(
        counts.len() >= rows && keys.len() >= rows && lowers.len() >= rows,
        "rabitq_estimate_blocks: short buffers"
    );
    assert!(
        factors.len() >= masks.len() * 4 * RABITQ_BLOCK_ROWS,
        "rabitq_estimate_blocks: short factors"
    );
    (dispatch::kernels().estimate)(counts, factors, terms, keys, lowers, masks);
}

/// Columns of a transposed block for [`dot_transposed_block`].
pub const BLOCK_COLUMNS: usize = 16;

/// Scores many queries against 16 vectors at once, the inner loop of k-means
/// assignment (a small matrix product): `block` holds the 16 vectors transposed
/// (`block[d * 16 + column]`, `dim × 16` values), and `out[q * 16 + column]`
/// receives the inner product of query `q` with vector `column`.
pub fn dot_transposed_block(queries: &[f32], dim: usize, block: &[f32], out: &mut [f32]) {
    assert!(
        dim > 0 && queries.len().is_multiple_of(dim),
        "dot_transposed_block: ragged queries"
    );
    assert_eq!(
        block.len(),
        dim * BLOCK_COLUMNS,
        "dot_transposed_block: block is not dim × 16"
    );
    let count = queries.len() / dim;
    assert!(
        out.len() >= count * BLOCK_COLUMNS,
        "dot_transposed_block: output buffer too small"
    );
    (dispatch::kernels().dot_block16)(queries, dim, block, &mut out[..count * BLOCK_COLUMNS]);
}

/// Converts an f32 to bf16 bits with round-to-nearest-even.
#[inline]
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    half::bf16::from_f32(value).to_bits()
}

/// Converts bf16 bits to f32 exactly.
#[inline]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

#[cfg(test)]
mod kernel_tests;
