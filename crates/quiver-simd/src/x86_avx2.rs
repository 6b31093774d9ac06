//! AVX2 + FMA kernels (x86-64).

use std::arch::x86_64::*;

use crate::dispatch::{Isa, Kernels};
use crate::{BulkOp, RABITQ_BLOCK_ROWS};

/// Rows ahead whose cache lines a gather kernel prefetches.
const GATHER_PREFETCH_AHEAD: usize = 4;

pub(crate) fn is_supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

pub(crate) const KERNELS: Kernels = Kernels {
    isa: Isa::Avx2,
    dot_f32: entry_dot_f32,
    l2sq_f32: entry_l2sq_f32,
    dot_bf16: entry_dot_bf16,
    l2sq_bf16: entry_l2sq_bf16,
    dot_i8: entry_dot_i8,
    i8_bulk: entry_i8_bulk,
    f32_bulk: entry_f32_bulk,
    bf16_bulk: entry_bf16_bulk,
    f32_gather: entry_f32_gather,
    bf16_gather: entry_bf16_gather,
    rabitq_blocks: entry_rabitq_blocks,
    dot_block16: entry_dot_block16,
    estimate: crate::estimate::estimate_avx2,
};

// SAFETY (all entry points below): this kernel set is installed only after
// `is_supported()` confirmed AVX2 and FMA on this CPU.
fn entry_dot_f32(a: &[f32], b: &[f32]) -> f32 {
    unsafe { dot_f32(a, b) }
}
fn entry_l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    unsafe { l2sq_f32(a, b) }
}
fn entry_dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    unsafe { dot_bf16(query, row) }
}
fn entry_l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    unsafe { l2sq_bf16(query, row) }
}
fn entry_dot_i8(a: &[i8], b: &[i8]) -> i32 {
    unsafe { dot_i8(a, b) }
}
fn entry_i8_bulk(query: &[i8], rows: &[i8], out: &mut [i32]) {
    unsafe { i8_bulk(query, rows, out) }
}
fn entry_f32_bulk(op: BulkOp, query: &[f32], rows: &[f32], out: &mut [f32]) {
    unsafe { f32_bulk(op, query, rows, out) }
}
fn entry_bf16_bulk(op: BulkOp, query: &[f32], rows: &[u16], out: &mut [f32]) {
    unsafe { bf16_bulk(op, query, rows, out) }
}
fn entry_f32_gather(op: BulkOp, query: &[f32], matrix: &[f32], rows: &[u32], out: &mut [f32]) {
    unsafe { f32_gather(op, query, matrix, rows, out) }
}
fn entry_bf16_gather(op: BulkOp, query: &[f32], matrix: &[u16], rows: &[u32], out: &mut [f32]) {
    unsafe { bf16_gather(op, query, matrix, rows, out) }
}
fn entry_rabitq_blocks(codes: &[u64], words: usize, planes: &[u64], out: &mut [u32]) {
    unsafe { rabitq_blocks(codes, words, planes, out) }
}
fn entry_dot_block16(queries: &[f32], dim: usize, block: &[f32], out: &mut [f32]) {
    unsafe { dot_block16(queries, dim, block, out) }
}

/// 16 columns = two registers per query; 4 queries per pass keep 8 FMA chains busy.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_block16(queries: &[f32], dim: usize, block: &[f32], out: &mut [f32]) {
    const TILE: usize = 4;
    let count = queries.len() / dim;
    let column_ptr = block.as_ptr();
    let mut query = 0;
    while query < count {
        let tile = (count - query).min(TILE);
        let mut acc = [[_mm256_setzero_ps(); 2]; TILE];
        // SAFETY: d < dim, so every load stays inside `block` (dim × 16) and the
        // tile's query rows; stores write 16 floats per query of `out`.
        unsafe {
            let rows: [*const f32; TILE] =
                std::array::from_fn(|i| queries.as_ptr().add((query + i.min(tile - 1)) * dim));
            for d in 0..dim {
                let low = _mm256_loadu_ps(column_ptr.add(d * 16));
                let high = _mm256_loadu_ps(column_ptr.add(d * 16 + 8));
                for (i, pair) in acc.iter_mut().enumerate() {
                    let value = _mm256_set1_ps(*rows[i].add(d));
                    pair[0] = _mm256_fmadd_ps(value, low, pair[0]);
                    pair[1] = _mm256_fmadd_ps(value, high, pair[1]);
                }
            }
            for (i, pair) in acc.iter().enumerate().take(tile) {
                let target = out.as_mut_ptr().add((query + i) * 16);
                _mm256_storeu_ps(target, pair[0]);
                _mm256_storeu_ps(target.add(8), pair[1]);
            }
        }
        query += tile;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn horizontal_sum(v: __m256) -> f32 {
    let low = _mm256_castps256_ps128(v);
    let high = _mm256_extractf128_ps::<1>(v);
    let sum4 = _mm_add_ps(low, high);
    let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    let sum1 = _mm_add_ss(sum2, _mm_movehdup_ps(sum2));
    _mm_cvtss_f32(sum1)
}

/// Loads 8 bf16 values and widens them exactly to f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_bf16x8(pointer: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable u16 at `pointer`.
    let raw = unsafe { _mm_loadu_si128(pointer as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 floats at index i with i + 8 <= n.
    unsafe {
        while i + 32 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 8;
                *accumulator = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(offset)),
                    _mm256_loadu_ps(pb.add(offset)),
                    *accumulator,
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
    }
    let mut sum = horizontal_sum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += a[j] * b[j];
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 floats at index i with i + 8 <= n.
    unsafe {
        while i + 32 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 8;
                let diff = _mm256_sub_ps(
                    _mm256_loadu_ps(pa.add(offset)),
                    _mm256_loadu_ps(pb.add(offset)),
                );
                *accumulator = _mm256_fmadd_ps(diff, diff, *accumulator);
            }
            i += 32;
        }
        while i + 8 <= n {
            let diff = _mm256_sub_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            acc[0] = _mm256_fmadd_ps(diff, diff, acc[0]);
            i += 8;
        }
    }
    let mut sum = horizontal_sum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        let diff = a[j] - b[j];
        sum += diff * diff;
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: every load reads 8 elements at index i with i + 8 <= n.
    unsafe {
        while i + 16 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(i)), load_bf16x8(pr.add(i)), acc[0]);
            acc[1] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pq.add(i + 8)),
                load_bf16x8(pr.add(i + 8)),
                acc[1],
            );
            i += 16;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(i)), load_bf16x8(pr.add(i)), acc[0]);
            i += 8;
        }
    }
    let mut sum = horizontal_sum(_mm256_add_ps(acc[0], acc[1]));
    for j in i..n {
        sum += query[j] * crate::bf16_bits_to_f32(row[j]);
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: every load reads 8 elements at index i with i + 8 <= n.
    unsafe {
        while i + 16 <= n {
            let d0 = _mm256_sub_ps(_mm256_loadu_ps(pq.add(i)), load_bf16x8(pr.add(i)));
            let d1 = _mm256_sub_ps(_mm256_loadu_ps(pq.add(i + 8)), load_bf16x8(pr.add(i + 8)));
            acc[0] = _mm256_fmadd_ps(d0, d0, acc[0]);
            acc[1] = _mm256_fmadd_ps(d1, d1, acc[1]);
            i += 16;
        }
        while i + 8 <= n {
            let d0 = _mm256_sub_ps(_mm256_loadu_ps(pq.add(i)), load_bf16x8(pr.add(i)));
            acc[0] = _mm256_fmadd_ps(d0, d0, acc[0]);
            i += 8;
        }
    }
    let mut sum = horizontal_sum(_mm256_add_ps(acc[0], acc[1]));
    for j in i..n {
        let diff = query[j] - crate::bf16_bits_to_f32(row[j]);
        sum += diff * diff;
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm256_setzero_si256();
    let mut i = 0;
    // SAFETY: every load reads 16 bytes at index i with i + 16 <= n.
    unsafe {
        while i + 16 <= n {
            let wide_a = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let wide_b = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i) as *const __m128i));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(wide_a, wide_b));
            i += 16;
        }
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` has room for 8 i32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc) };
    let mut sum: i32 = lanes.iter().sum();
    for j in i..n {
        sum += a[j] as i32 * b[j] as i32;
    }
    sum
}

/// int8 inner products of many rows with one query: the query is widened to i16
/// once, so a row costs one widening and one `VPMADDWD` per 16 values (`dot_i8`
/// widens both sides for every row).
#[target_feature(enable = "avx2,fma")]
unsafe fn i8_bulk(query: &[i8], rows: &[i8], out: &mut [i32]) {
    let dim = query.len();
    let whole = dim / 16 * 16;
    // SAFETY: every load reads 16 bytes at an index i with i + 16 <= whole <= dim,
    // of the query or of a row (`chunks_exact(dim)` yields whole rows only).
    unsafe {
        let widened: Vec<__m256i> = (0..whole)
            .step_by(16)
            .map(|i| _mm256_cvtepi8_epi16(_mm_loadu_si128(query.as_ptr().add(i) as *const __m128i)))
            .collect();
        for (row, slot) in rows.chunks_exact(dim).zip(out) {
            let mut acc = _mm256_setzero_si256();
            for (part, query_part) in widened.iter().enumerate() {
                let values = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                    row.as_ptr().add(part * 16) as *const __m128i
                ));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(*query_part, values));
            }
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc);
            let mut sum: i32 = lanes.iter().sum();
            for j in whole..dim {
                sum += query[j] as i32 * row[j] as i32;
            }
            *slot = sum;
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_bulk(op: BulkOp, query: &[f32], rows: &[f32], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        // SAFETY: same target features as this function.
        *slot = unsafe {
            match op {
                BulkOp::Dot => dot_f32(query, row),
                BulkOp::L2Squared => l2sq_f32(query, row),
            }
        };
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_bulk(op: BulkOp, query: &[f32], rows: &[u16], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        // SAFETY: same target features as this function.
        *slot = unsafe {
            match op {
                BulkOp::Dot => dot_bf16(query, row),
                BulkOp::L2Squared => l2sq_bf16(query, row),
            }
        };
    }
}

#[inline]
fn prefetch_bytes(start: *const u8, length: usize) {
    let mut offset = 0;
    while offset < length {
        // SAFETY: prefetch never faults; the address stays inside the slice.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset) as *const i8) };
        offset += 64;
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_gather(op: BulkOp, query: &[f32], matrix: &[f32], rows: &[u32], out: &mut [f32]) {
    let dim = query.len();
    for (i, (&row, slot)) in rows.iter().zip(out.iter_mut()).enumerate() {
        if let Some(&ahead) = rows.get(i + GATHER_PREFETCH_AHEAD) {
            prefetch_bytes(
                matrix[ahead as usize * dim..].as_ptr() as *const u8,
                dim * 4,
            );
        }
        let vector = &matrix[row as usize * dim..][..dim];
        // SAFETY: same target features as this function.
        *slot = unsafe {
            match op {
                BulkOp::Dot => dot_f32(query, vector),
                BulkOp::L2Squared => l2sq_f32(query, vector),
            }
        };
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_gather(op: BulkOp, query: &[f32], matrix: &[u16], rows: &[u32], out: &mut [f32]) {
    let dim = query.len();
    for (i, (&row, slot)) in rows.iter().zip(out.iter_mut()).enumerate() {
        if let Some(&ahead) = rows.get(i + GATHER_PREFETCH_AHEAD) {
            prefetch_bytes(
                matrix[ahead as usize * dim..].as_ptr() as *const u8,
                dim * 2,
            );
        }
        let vector = &matrix[row as usize * dim..][..dim];
        // SAFETY: same target features as this function.
        *slot = unsafe {
            match op {
                BulkOp::Dot => dot_bf16(query, vector),
                BulkOp::L2Squared => l2sq_bf16(query, vector),
            }
        };
    }
}

/// Per-byte popcount of a 256-bit value through a nibble lookup table.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn popcount_bytes(value: __m256i) -> __m256i {
    let lookup = _mm256_setr_epi8(
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3,
        3, 4,
    );
    let low_mask = _mm256_set1_epi8(0x0f);
    let low = _mm256_and_si256(value, low_mask);
    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(value), low_mask);
    _mm256_add_epi8(
        _mm256_shuffle_epi8(lookup, low),
        _mm256_shuffle_epi8(lookup, high),
    )
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rabitq_blocks(codes: &[u64], words: usize, planes: &[u64], out: &mut [u32]) {
    const QUARTERS: usize = RABITQ_BLOCK_ROWS / 4;
    let block_len = words * RABITQ_BLOCK_ROWS;
    let zero = _mm256_setzero_si256();
    for (block_index, block) in codes.chunks_exact(block_len).enumerate() {
        let mut acc = [zero; QUARTERS];
        for word in 0..words {
            let plane = |bit: usize| _mm256_set1_epi64x(planes[bit * words + word] as i64);
            let (p0, p1, p2, p3) = (plane(0), plane(1), plane(2), plane(3));
            let word_codes = &block[word * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
            for (quarter, accumulator) in acc.iter_mut().enumerate() {
                // SAFETY: `word_codes` has 32 u64; this reads 4 of them.
                let code = unsafe {
                    _mm256_loadu_si256(word_codes.as_ptr().add(quarter * 4) as *const __m256i)
                };
                let c0 = popcount_bytes(_mm256_and_si256(code, p0));
                let c1 = popcount_bytes(_mm256_and_si256(code, p1));
                let c2 = popcount_bytes(_mm256_and_si256(code, p2));
                let c3 = popcount_bytes(_mm256_and_si256(code, p3));
                // Byte counts are ≤ 8, so the weighted sum (≤ 120) fits in a byte.
                let c1 = _mm256_add_epi8(c1, c1);
                let c2 = _mm256_add_epi8(c2, c2);
                let c2 = _mm256_add_epi8(c2, c2);
                let c3 = _mm256_add_epi8(c3, c3);
                let c3 = _mm256_add_epi8(c3, c3);
                let c3 = _mm256_add_epi8(c3, c3);
                let weighted = _mm256_add_epi8(_mm256_add_epi8(c0, c1), _mm256_add_epi8(c2, c3));
                *accumulator = _mm256_add_epi64(*accumulator, _mm256_sad_epu8(weighted, zero));
            }
        }
        let out_block = &mut out[block_index * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        for (quarter, accumulator) in acc.iter().enumerate() {
            let mut lanes = [0u64; 4];
            // SAFETY: `lanes` has room for 4 u64.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, *accumulator) };
            for (lane, value) in lanes.iter().enumerate() {
                out_block[quarter * 4 + lane] = *value as u32;
            }
        }
    }
}
