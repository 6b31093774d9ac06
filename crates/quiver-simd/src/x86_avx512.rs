//! AVX-512 kernels (x86-64): F + BW + VL for the float and int8 kernels, VPOPCNTDQ
//! for the RaBitQ scan.
//!
//! bf16 rows are widened to f32 exactly (a shift) rather than scored with
//! `VDPBF16PS`, which would also round the query to bf16 and cost recall at high
//! targets for no gain: the widening is free next to the memory traffic.

use std::arch::x86_64::*;

use crate::dispatch::{Isa, Kernels};
use crate::{BulkOp, RABITQ_BLOCK_ROWS};

/// Rows ahead whose cache lines a gather kernel prefetches.
const GATHER_PREFETCH_AHEAD: usize = 4;
/// Code blocks ahead that the RaBitQ scan prefetches.
const SCAN_PREFETCH_BLOCKS: usize = 2;

pub(crate) fn is_supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vpopcntdq")
        && is_x86_feature_detected!("fma")
}

/// Returns the AVX-512 kernel set, with the VNNI int8 kernel when the CPU has it.
pub(crate) fn kernels_for_this_cpu() -> Kernels {
    if has_vnni() { KERNELS_VNNI } else { KERNELS }
}

pub(crate) fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
}

/// The AVX-512 set with AVX512-VNNI for the int8 kernels (`VPDPWSSD` for one
/// dot product, `VPDPBUSD` for many rows against one query).
pub(crate) const KERNELS_VNNI: Kernels = Kernels {
    dot_i8: entry_dot_i8_vnni,
    i8_bulk: entry_i8_bulk_vnni,
    ..KERNELS
};

pub(crate) const KERNELS: Kernels = Kernels {
    isa: Isa::Avx512,
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
    estimate: crate::estimate::estimate_avx512,
};

// SAFETY (all entry points below): this kernel set is installed only after
// `is_supported()` confirmed every feature these functions enable.
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
fn entry_dot_i8_vnni(a: &[i8], b: &[i8]) -> i32 {
    unsafe { dot_i8_vnni(a, b) }
}
fn entry_i8_bulk(query: &[i8], rows: &[i8], out: &mut [i32]) {
    for (row, slot) in rows.chunks_exact(query.len()).zip(out) {
        *slot = entry_dot_i8(query, row);
    }
}
fn entry_i8_bulk_vnni(query: &[i8], rows: &[i8], out: &mut [i32]) {
    unsafe { i8_bulk_vnni(query, rows, out) }
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

/// 16 columns = one register per query; 8 queries per pass keep 8 FMA chains busy.
/// The dimensions are taken in chunks of `CHUNK`, each chunk of the block scored
/// against every query before the next (partial sums kept in `out`), so the
/// chunk (16 KiB) stays in L1 for all of them: the whole block (48 KiB at 768
/// dimensions) and 8 queries' rows do not fit L1 together. Each output is still
/// one FMA chain over the dimensions in order, so the sums are those of an
/// unchunked pass bit for bit.
#[target_feature(enable = "avx512f,fma")]
unsafe fn dot_block16(queries: &[f32], dim: usize, block: &[f32], out: &mut [f32]) {
    const TILE: usize = 8;
    const CHUNK: usize = 256;
    let count = queries.len() / dim;
    let column_ptr = block.as_ptr();
    let mut start = 0;
    while start < dim {
        let end = (start + CHUNK).min(dim);
        let mut query = 0;
        while query < count {
            let tile = (count - query).min(TILE);
            // SAFETY: start <= d < end <= dim, so every load stays inside `block`
            // (dim × 16) and the tile's query rows (short tiles repeat their last
            // row); loads and stores of `out` touch 16 floats per real query
            // (the caller sized it `count × 16`).
            unsafe {
                let out_base = out.as_mut_ptr();
                let out_ptr = |i: usize| out_base.add((query + i.min(tile - 1)) * 16);
                let mut acc: [__m512; TILE] = std::array::from_fn(|i| {
                    if start == 0 {
                        _mm512_setzero_ps()
                    } else {
                        _mm512_loadu_ps(out_ptr(i))
                    }
                });
                let rows: [*const f32; TILE] =
                    std::array::from_fn(|i| queries.as_ptr().add((query + i.min(tile - 1)) * dim));
                for d in start..end {
                    let columns = _mm512_loadu_ps(column_ptr.add(d * 16));
                    for (i, accumulator) in acc.iter_mut().enumerate() {
                        *accumulator =
                            _mm512_fmadd_ps(_mm512_set1_ps(*rows[i].add(d)), columns, *accumulator);
                    }
                }
                for (i, accumulator) in acc.iter().enumerate().take(tile) {
                    _mm512_storeu_ps(out_ptr(i), *accumulator);
                }
            }
            query += tile;
        }
        start = end;
    }
}

#[inline]
fn tail_mask16(remaining: usize) -> __mmask16 {
    debug_assert!(remaining < 16);
    ((1u32 << remaining) - 1) as __mmask16
}

/// Loads 16 bf16 values (the first `count` of them, zeros after) widened to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_bf16x16(pointer: *const u16, mask: __mmask16) -> __m512 {
    // SAFETY: the caller guarantees the masked-in elements are readable.
    let raw = unsafe { _mm256_maskz_loadu_epi16(mask, pointer as *const i16) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: full loads read 16 floats with i + 16 <= n; the tail load is masked.
    unsafe {
        while i + 64 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 16;
                *accumulator = _mm512_fmadd_ps(
                    _mm512_loadu_ps(pa.add(offset)),
                    _mm512_loadu_ps(pb.add(offset)),
                    *accumulator,
                );
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i)),
                _mm512_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 16;
        }
        if i < n {
            let mask = tail_mask16(n - i);
            acc[1] = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, pa.add(i)),
                _mm512_maskz_loadu_ps(mask, pb.add(i)),
                acc[1],
            );
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[1]),
        _mm512_add_ps(acc[2], acc[3]),
    ))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: full loads read 16 floats with i + 16 <= n; the tail load is masked.
    unsafe {
        while i + 64 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 16;
                let diff = _mm512_sub_ps(
                    _mm512_loadu_ps(pa.add(offset)),
                    _mm512_loadu_ps(pb.add(offset)),
                );
                *accumulator = _mm512_fmadd_ps(diff, diff, *accumulator);
            }
            i += 64;
        }
        while i + 16 <= n {
            let diff = _mm512_sub_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
            acc[0] = _mm512_fmadd_ps(diff, diff, acc[0]);
            i += 16;
        }
        if i < n {
            let mask = tail_mask16(n - i);
            let diff = _mm512_sub_ps(
                _mm512_maskz_loadu_ps(mask, pa.add(i)),
                _mm512_maskz_loadu_ps(mask, pb.add(i)),
            );
            acc[1] = _mm512_fmadd_ps(diff, diff, acc[1]);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[1]),
        _mm512_add_ps(acc[2], acc[3]),
    ))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: full loads read 16 elements with i + 16 <= n; the tail loads are masked.
    unsafe {
        while i + 32 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(pq.add(i)),
                load_bf16x16(pr.add(i), 0xffff),
                acc[0],
            );
            acc[1] = _mm512_fmadd_ps(
                _mm512_loadu_ps(pq.add(i + 16)),
                load_bf16x16(pr.add(i + 16), 0xffff),
                acc[1],
            );
            i += 32;
        }
        while i < n {
            let mask = if n - i >= 16 {
                0xffff
            } else {
                tail_mask16(n - i)
            };
            acc[0] = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, pq.add(i)),
                load_bf16x16(pr.add(i), mask),
                acc[0],
            );
            i += 16;
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: full loads read 16 elements with i + 16 <= n; the tail loads are masked.
    unsafe {
        while i + 32 <= n {
            let d0 = _mm512_sub_ps(_mm512_loadu_ps(pq.add(i)), load_bf16x16(pr.add(i), 0xffff));
            let d1 = _mm512_sub_ps(
                _mm512_loadu_ps(pq.add(i + 16)),
                load_bf16x16(pr.add(i + 16), 0xffff),
            );
            acc[0] = _mm512_fmadd_ps(d0, d0, acc[0]);
            acc[1] = _mm512_fmadd_ps(d1, d1, acc[1]);
            i += 32;
        }
        while i < n {
            let mask = if n - i >= 16 {
                0xffff
            } else {
                tail_mask16(n - i)
            };
            let diff = _mm512_sub_ps(
                _mm512_maskz_loadu_ps(mask, pq.add(i)),
                load_bf16x16(pr.add(i), mask),
            );
            acc[0] = _mm512_fmadd_ps(diff, diff, acc[0]);
            i += 16;
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    // SAFETY: each (masked) load reads only bytes below n.
    unsafe {
        while i < n {
            let mask: __mmask32 = if n - i >= 32 {
                u32::MAX
            } else {
                (1u32 << (n - i)) - 1
            };
            let wide_a = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, pa.add(i)));
            let wide_b = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, pb.add(i)));
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(wide_a, wide_b));
            i += 32;
        }
    }
    _mm512_reduce_add_epi32(acc)
}

/// int8 dot with one fused multiply-add of i16 pairs per step (AVX512-VNNI).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_i8_vnni(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm512_setzero_si512(); 2];
    let mut i = 0;
    // SAFETY: each (masked) load reads only bytes below n.
    unsafe {
        while i < n {
            let mask: __mmask32 = if n - i >= 32 {
                u32::MAX
            } else {
                (1u32 << (n - i)) - 1
            };
            let wide_a = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, pa.add(i)));
            let wide_b = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, pb.add(i)));
            let lane = (i / 32) % 2;
            acc[lane] = _mm512_dpwssd_epi32(acc[lane], wide_a, wide_b);
            i += 32;
        }
    }
    _mm512_reduce_add_epi32(_mm512_add_epi32(acc[0], acc[1]))
}

/// int8 inner products of many rows with one query, 64 values per `VPDPBUSD`
/// (which multiplies unsigned by signed bytes): the query is offset to u8 once
/// (q + 128), and each row's own sum, from a second `VPDPBUSD` against ones,
/// takes the offset back out: Σ (q + 128)·r − 128·Σ r = Σ q·r. Half the
/// instructions per row of widening both sides to i16 (`dot_i8_vnni`), and
/// the query is not re-read and re-widened for every row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn i8_bulk_vnni(query: &[i8], rows: &[i8], out: &mut [i32]) {
    let dim = query.len();
    let chunks = dim.div_ceil(64);
    let mask_of = |chunk: usize| -> __mmask64 {
        let left = dim - chunk * 64;
        if left >= 64 {
            u64::MAX
        } else {
            (1u64 << left) - 1
        }
    };
    let offset = _mm512_set1_epi8(i8::MIN);
    let ones = _mm512_set1_epi8(1);
    // SAFETY: every (masked) load reads only bytes below `dim` of the query or of
    // a row, and `rows.chunks_exact(dim)` yields whole rows only.
    unsafe {
        let shifted: Vec<__m512i> = (0..chunks)
            .map(|chunk| {
                let values =
                    _mm512_maskz_loadu_epi8(mask_of(chunk), query.as_ptr().add(chunk * 64));
                _mm512_xor_si512(values, offset)
            })
            .collect();
        for (row, slot) in rows.chunks_exact(dim).zip(out) {
            let mut products = _mm512_setzero_si512();
            let mut sums = _mm512_setzero_si512();
            for (chunk, query_chunk) in shifted.iter().enumerate() {
                let values = _mm512_maskz_loadu_epi8(mask_of(chunk), row.as_ptr().add(chunk * 64));
                products = _mm512_dpbusd_epi32(products, *query_chunk, values);
                sums = _mm512_dpbusd_epi32(sums, ones, values);
            }
            *slot = _mm512_reduce_add_epi32(_mm512_sub_epi32(products, _mm512_slli_epi32(sums, 7)));
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vpopcntdq")]
unsafe fn rabitq_blocks(codes: &[u64], words: usize, planes: &[u64], out: &mut [u32]) {
    const GROUPS: usize = RABITQ_BLOCK_ROWS / 8;
    let block_len = words * RABITQ_BLOCK_ROWS;
    let block_count = codes.len() / block_len;
    for block_index in 0..block_count {
        let block = &codes[block_index * block_len..][..block_len];
        let prefetch_base = codes
            .as_ptr()
            .wrapping_add((block_index + SCAN_PREFETCH_BLOCKS) * block_len);
        let prefetch_ok = block_index + SCAN_PREFETCH_BLOCKS < block_count;
        let mut acc = [_mm512_setzero_si512(); GROUPS];
        for word in 0..words {
            if prefetch_ok {
                prefetch_bytes(
                    prefetch_base.wrapping_add(word * RABITQ_BLOCK_ROWS) as *const u8,
                    RABITQ_BLOCK_ROWS * 8,
                );
            }
            let plane = |bit: usize| _mm512_set1_epi64(planes[bit * words + word] as i64);
            let (p0, p1, p2, p3) = (plane(0), plane(1), plane(2), plane(3));
            let word_codes = &block[word * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
            for (group, accumulator) in acc.iter_mut().enumerate() {
                // SAFETY: `word_codes` has 32 u64; this reads 8 of them.
                let code = unsafe {
                    _mm512_loadu_si512(word_codes.as_ptr().add(group * 8) as *const __m512i)
                };
                let c0 = _mm512_popcnt_epi64(_mm512_and_si512(code, p0));
                let c1 = _mm512_popcnt_epi64(_mm512_and_si512(code, p1));
                let c2 = _mm512_popcnt_epi64(_mm512_and_si512(code, p2));
                let c3 = _mm512_popcnt_epi64(_mm512_and_si512(code, p3));
                let weighted = _mm512_add_epi64(
                    _mm512_add_epi64(c0, _mm512_slli_epi64::<1>(c1)),
                    _mm512_add_epi64(_mm512_slli_epi64::<2>(c2), _mm512_slli_epi64::<3>(c3)),
                );
                *accumulator = _mm512_add_epi64(*accumulator, weighted);
            }
        }
        let out_block = &mut out[block_index * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        for (group, accumulator) in acc.iter().enumerate() {
            let narrowed = _mm512_cvtepi64_epi32(*accumulator);
            // SAFETY: `out_block` has 32 u32; this writes 8 of them.
            unsafe {
                _mm256_storeu_si256(
                    out_block.as_mut_ptr().add(group * 8) as *mut __m256i,
                    narrowed,
                )
            };
        }
    }
}
