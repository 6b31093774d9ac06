//! Portable kernels: the reference every ISA version is tested against, and the
//! fallback on CPUs without a faster path. Chunked loops with independent
//! accumulators so the compiler can still vectorise them.

// Indexing by lane keeps the accumulators independent, which is what vectorises.
#![allow(clippy::needless_range_loop)]

use crate::{BulkOp, RABITQ_BLOCK_ROWS, RABITQ_QUERY_BITS, bf16_bits_to_f32};

const LANES: usize = 8;

/// Returns the inner product of two f32 slices (scalar reference).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.len() / LANES;
    for chunk in 0..chunks {
        for lane in 0..LANES {
            let i = chunk * LANES + lane;
            acc[lane] += a[i] * b[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * LANES..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

/// Returns the squared Euclidean distance of two f32 slices (scalar reference).
pub fn l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.len() / LANES;
    for chunk in 0..chunks {
        for lane in 0..LANES {
            let i = chunk * LANES + lane;
            let diff = a[i] - b[i];
            acc[lane] += diff * diff;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * LANES..a.len() {
        let diff = a[i] - b[i];
        sum += diff * diff;
    }
    sum
}

/// Returns the inner product of an f32 query and a bf16 row (scalar reference).
pub fn dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = query.len() / LANES;
    for chunk in 0..chunks {
        for lane in 0..LANES {
            let i = chunk * LANES + lane;
            acc[lane] += query[i] * bf16_bits_to_f32(row[i]);
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * LANES..query.len() {
        sum += query[i] * bf16_bits_to_f32(row[i]);
    }
    sum
}

/// Returns the squared Euclidean distance of an f32 query and a bf16 row.
pub fn l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = query.len() / LANES;
    for chunk in 0..chunks {
        for lane in 0..LANES {
            let i = chunk * LANES + lane;
            let diff = query[i] - bf16_bits_to_f32(row[i]);
            acc[lane] += diff * diff;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * LANES..query.len() {
        let diff = query[i] - bf16_bits_to_f32(row[i]);
        sum += diff * diff;
    }
    sum
}

/// Returns the exact inner product of two int8 slices.
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// int8 inner products of rows with one query (scalar reference); see
/// [`crate::dot_i8_bulk`].
pub fn i8_bulk(query: &[i8], rows: &[i8], out: &mut [i32]) {
    for (row, slot) in rows.chunks_exact(query.len()).zip(out) {
        *slot = dot_i8(query, row);
    }
}

/// Scans RaBitQ code blocks (scalar reference); see [`crate::rabitq_scan_blocks`].
pub fn rabitq_blocks(codes: &[u64], words: usize, query_planes: &[u64], out: &mut [u32]) {
    let block_len = words * RABITQ_BLOCK_ROWS;
    for (block_index, block) in codes.chunks_exact(block_len).enumerate() {
        let out_block = &mut out[block_index * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        for (lane, slot) in out_block.iter_mut().enumerate() {
            let mut total = 0u32;
            for word in 0..words {
                let code = block[word * RABITQ_BLOCK_ROWS + lane];
                for plane in 0..RABITQ_QUERY_BITS {
                    total += (code & query_planes[plane * words + word]).count_ones() << plane;
                }
            }
            *slot = total;
        }
    }
}

/// Inner products of every query with the 16 columns of a transposed block
/// (`block[d * 16 + column]`), written as 16 scores per query (scalar reference).
pub fn dot_block16(queries: &[f32], dim: usize, block: &[f32], out: &mut [f32]) {
    for (query, scores) in queries.chunks_exact(dim).zip(out.chunks_exact_mut(16)) {
        let mut acc = [0f32; 16];
        for (d, &value) in query.iter().enumerate() {
            for (column, slot) in acc.iter_mut().enumerate() {
                *slot += value * block[d * 16 + column];
            }
        }
        scores.copy_from_slice(&acc);
    }
}

pub(crate) fn f32_bulk(op: BulkOp, query: &[f32], rows: &[f32], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        *slot = match op {
            BulkOp::Dot => dot_f32(query, row),
            BulkOp::L2Squared => l2sq_f32(query, row),
        };
    }
}

pub(crate) fn bf16_bulk(op: BulkOp, query: &[f32], rows: &[u16], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        *slot = match op {
            BulkOp::Dot => dot_bf16(query, row),
            BulkOp::L2Squared => l2sq_bf16(query, row),
        };
    }
}

pub(crate) fn f32_gather(op: BulkOp, query: &[f32], matrix: &[f32], rows: &[u32], out: &mut [f32]) {
    let dim = query.len();
    for (&row, slot) in rows.iter().zip(out.iter_mut()) {
        let vector = &matrix[row as usize * dim..][..dim];
        *slot = match op {
            BulkOp::Dot => dot_f32(query, vector),
            BulkOp::L2Squared => l2sq_f32(query, vector),
        };
    }
}

pub(crate) fn bf16_gather(
    op: BulkOp,
    query: &[f32],
    matrix: &[u16],
    rows: &[u32],
    out: &mut [f32],
) {
    let dim = query.len();
    for (&row, slot) in rows.iter().zip(out.iter_mut()) {
        let vector = &matrix[row as usize * dim..][..dim];
        *slot = match op {
            BulkOp::Dot => dot_bf16(query, vector),
            BulkOp::L2Squared => l2sq_bf16(query, vector),
        };
    }
}
