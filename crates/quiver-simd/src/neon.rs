//! NEON kernels (AArch64).

use std::arch::aarch64::*;

use crate::dispatch::{Isa, Kernels};
use crate::{BulkOp, RABITQ_BLOCK_ROWS};

pub(crate) const KERNELS: Kernels = Kernels {
    isa: Isa::Neon,
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
    dot_block16: crate::scalar::dot_block16,
    estimate: crate::estimate::estimate_scalar,
};

// SAFETY (all entry points below): this kernel set is installed only after NEON
// was detected on this CPU.
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
    for (row, slot) in rows.chunks_exact(query.len()).zip(out) {
        *slot = entry_dot_i8(query, row);
    }
}
fn entry_f32_bulk(op: BulkOp, query: &[f32], rows: &[f32], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        *slot = match op {
            BulkOp::Dot => entry_dot_f32(query, row),
            BulkOp::L2Squared => entry_l2sq_f32(query, row),
        };
    }
}
fn entry_bf16_bulk(op: BulkOp, query: &[f32], rows: &[u16], out: &mut [f32]) {
    let dim = query.len();
    for (row, slot) in rows.chunks_exact(dim).zip(out.iter_mut()) {
        *slot = match op {
            BulkOp::Dot => entry_dot_bf16(query, row),
            BulkOp::L2Squared => entry_l2sq_bf16(query, row),
        };
    }
}
fn entry_f32_gather(op: BulkOp, query: &[f32], matrix: &[f32], rows: &[u32], out: &mut [f32]) {
    let dim = query.len();
    for (&row, slot) in rows.iter().zip(out.iter_mut()) {
        let vector = &matrix[row as usize * dim..][..dim];
        *slot = match op {
            BulkOp::Dot => entry_dot_f32(query, vector),
            BulkOp::L2Squared => entry_l2sq_f32(query, vector),
        };
    }
}
fn entry_bf16_gather(op: BulkOp, query: &[f32], matrix: &[u16], rows: &[u32], out: &mut [f32]) {
    let dim = query.len();
    for (&row, slot) in rows.iter().zip(out.iter_mut()) {
        let vector = &matrix[row as usize * dim..][..dim];
        *slot = match op {
            BulkOp::Dot => entry_dot_bf16(query, vector),
            BulkOp::L2Squared => entry_l2sq_bf16(query, vector),
        };
    }
}
fn entry_rabitq_blocks(codes: &[u64], words: usize, planes: &[u64], out: &mut [u32]) {
    unsafe { rabitq_blocks(codes, words, planes, out) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    // SAFETY: every load reads 4 floats at index i with i + 4 <= n.
    let mut sum = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        while i + 16 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 4;
                *accumulator = vfmaq_f32(
                    *accumulator,
                    vld1q_f32(pa.add(offset)),
                    vld1q_f32(pb.add(offset)),
                );
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
            i += 4;
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ))
    };
    for j in i..n {
        sum += a[j] * b[j];
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn l2sq_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    // SAFETY: every load reads 4 floats at index i with i + 4 <= n.
    let mut sum = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        while i + 16 <= n {
            for (lane, accumulator) in acc.iter_mut().enumerate() {
                let offset = i + lane * 4;
                let diff = vsubq_f32(vld1q_f32(pa.add(offset)), vld1q_f32(pb.add(offset)));
                *accumulator = vfmaq_f32(*accumulator, diff, diff);
            }
            i += 16;
        }
        while i + 4 <= n {
            let diff = vsubq_f32(vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
            acc[0] = vfmaq_f32(acc[0], diff, diff);
            i += 4;
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ))
    };
    for j in i..n {
        let diff = a[j] - b[j];
        sum += diff * diff;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn dot_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut i = 0;
    // SAFETY: every load reads 4 elements at index i with i + 4 <= n.
    let mut sum = unsafe {
        let mut acc = vdupq_n_f32(0.0);
        while i + 4 <= n {
            let widened = vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(pr.add(i))));
            acc = vfmaq_f32(acc, vld1q_f32(pq.add(i)), widened);
            i += 4;
        }
        vaddvq_f32(acc)
    };
    for j in i..n {
        sum += query[j] * crate::bf16_bits_to_f32(row[j]);
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn l2sq_bf16(query: &[f32], row: &[u16]) -> f32 {
    let n = query.len().min(row.len());
    let (pq, pr) = (query.as_ptr(), row.as_ptr());
    let mut i = 0;
    // SAFETY: every load reads 4 elements at index i with i + 4 <= n.
    let mut sum = unsafe {
        let mut acc = vdupq_n_f32(0.0);
        while i + 4 <= n {
            let widened = vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(pr.add(i))));
            let diff = vsubq_f32(vld1q_f32(pq.add(i)), widened);
            acc = vfmaq_f32(acc, diff, diff);
            i += 4;
        }
        vaddvq_f32(acc)
    };
    for j in i..n {
        let diff = query[j] - crate::bf16_bits_to_f32(row[j]);
        sum += diff * diff;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    // SAFETY: every load reads 8 bytes at index i with i + 8 <= n.
    let mut sum = unsafe {
        let mut acc = vdupq_n_s32(0);
        while i + 8 <= n {
            let products = vmull_s8(vld1_s8(pa.add(i)), vld1_s8(pb.add(i)));
            acc = vpadalq_s16(acc, products);
            i += 8;
        }
        vaddvq_s32(acc)
    };
    for j in i..n {
        sum += a[j] as i32 * b[j] as i32;
    }
    sum
}

#[target_feature(enable = "neon")]
unsafe fn rabitq_blocks(codes: &[u64], words: usize, planes: &[u64], out: &mut [u32]) {
    const PAIRS: usize = RABITQ_BLOCK_ROWS / 2;
    let block_len = words * RABITQ_BLOCK_ROWS;
    for (block_index, block) in codes.chunks_exact(block_len).enumerate() {
        let out_block = &mut out[block_index * RABITQ_BLOCK_ROWS..][..RABITQ_BLOCK_ROWS];
        // SAFETY: loads read 2 u64 inside `block`; the store writes 2 u64 to a local.
        unsafe {
            let mut acc = [vdupq_n_u64(0); PAIRS];
            for word in 0..words {
                let p0 = vdupq_n_u64(planes[word]);
                let p1 = vdupq_n_u64(planes[words + word]);
                let p2 = vdupq_n_u64(planes[2 * words + word]);
                let p3 = vdupq_n_u64(planes[3 * words + word]);
                let word_codes = block.as_ptr().add(word * RABITQ_BLOCK_ROWS);
                for (pair, accumulator) in acc.iter_mut().enumerate() {
                    let code = vld1q_u64(word_codes.add(pair * 2));
                    let c0 = vcntq_u8(vreinterpretq_u8_u64(vandq_u64(code, p0)));
                    let c1 = vcntq_u8(vreinterpretq_u8_u64(vandq_u64(code, p1)));
                    let c2 = vcntq_u8(vreinterpretq_u8_u64(vandq_u64(code, p2)));
                    let c3 = vcntq_u8(vreinterpretq_u8_u64(vandq_u64(code, p3)));
                    let weighted = vaddq_u8(
                        vaddq_u8(c0, vshlq_n_u8::<1>(c1)),
                        vaddq_u8(vshlq_n_u8::<2>(c2), vshlq_n_u8::<3>(c3)),
                    );
                    *accumulator = vpadalq_u32(*accumulator, vpaddlq_u16(vpaddlq_u8(weighted)));
                }
            }
            for (pair, accumulator) in acc.iter().enumerate() {
                let mut lanes = [0u64; 2];
                vst1q_u64(lanes.as_mut_ptr(), *accumulator);
                out_block[pair * 2] = lanes[0] as u32;
                out_block[pair * 2 + 1] = lanes[1] as u32;
            }
        }
    }
}
