//! Runtime CPU dispatch: the best kernel set for this CPU, chosen once.

use std::sync::OnceLock;

use crate::{BulkOp, scalar};

/// The instruction set whose kernels are in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable scalar code (also the reference).
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512 (F, BW, VL) with VPOPCNTDQ.
    Avx512,
    /// AArch64 NEON.
    Neon,
}

impl Isa {
    /// Returns the lowercase name used in logs and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

type Estimate = fn(&[u32], &[f32], &crate::EstimateTerms, &mut [f32], &mut [f32], &mut [u32]);
type GatherF32 = fn(BulkOp, &[f32], &[f32], &[u32], &mut [f32]);
type GatherBf16 = fn(BulkOp, &[f32], &[u16], &[u32], &mut [f32]);

pub(crate) struct Kernels {
    pub isa: Isa,
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub l2sq_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_bf16: fn(&[f32], &[u16]) -> f32,
    pub l2sq_bf16: fn(&[f32], &[u16]) -> f32,
    pub dot_i8: fn(&[i8], &[i8]) -> i32,
    /// int8 inner products of many rows (`query.len()` values each) with one query.
    pub i8_bulk: fn(&[i8], &[i8], &mut [i32]),
    pub f32_bulk: fn(BulkOp, &[f32], &[f32], &mut [f32]),
    pub bf16_bulk: fn(BulkOp, &[f32], &[u16], &mut [f32]),
    pub f32_gather: GatherF32,
    pub bf16_gather: GatherBf16,
    pub rabitq_blocks: fn(&[u64], usize, &[u64], &mut [u32]),
    pub dot_block16: fn(&[f32], usize, &[f32], &mut [f32]),
    pub estimate: Estimate,
}

const SCALAR: Kernels = Kernels {
    isa: Isa::Scalar,
    dot_f32: scalar::dot_f32,
    l2sq_f32: scalar::l2sq_f32,
    dot_bf16: scalar::dot_bf16,
    l2sq_bf16: scalar::l2sq_bf16,
    dot_i8: scalar::dot_i8,
    i8_bulk: scalar::i8_bulk,
    f32_bulk: scalar::f32_bulk,
    bf16_bulk: scalar::bf16_bulk,
    f32_gather: scalar::f32_gather,
    bf16_gather: scalar::bf16_gather,
    rabitq_blocks: scalar::rabitq_blocks,
    dot_block16: scalar::dot_block16,
    estimate: crate::estimate::estimate_scalar,
};

static KERNELS: OnceLock<Kernels> = OnceLock::new();

pub(crate) fn kernels() -> &'static Kernels {
    KERNELS.get_or_init(detect)
}

/// Returns the instruction set chosen for this process (detected once).
pub fn selected_isa() -> Isa {
    kernels().isa
}

fn detect() -> Kernels {
    if std::env::var_os("QUIVER_SIMD_FORCE_SCALAR").is_some() {
        return SCALAR;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::x86_avx512::is_supported() {
            return crate::x86_avx512::kernels_for_this_cpu();
        }
        if crate::x86_avx2::is_supported() {
            return crate::x86_avx2::KERNELS;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return crate::neon::KERNELS;
        }
    }
    SCALAR
}

#[cfg(test)]
pub(crate) fn all_kernel_sets() -> Vec<&'static Kernels> {
    let mut sets: Vec<&'static Kernels> = vec![&SCALAR];
    #[cfg(target_arch = "x86_64")]
    {
        if crate::x86_avx2::is_supported() {
            sets.push(&crate::x86_avx2::KERNELS);
        }
        if crate::x86_avx512::is_supported() {
            sets.push(&crate::x86_avx512::KERNELS);
            if crate::x86_avx512::has_vnni() {
                sets.push(&crate::x86_avx512::KERNELS_VNNI);
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            sets.push(&crate::neon::KERNELS);
        }
    }
    sets
}
