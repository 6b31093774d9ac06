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

/// The environment variable capping the instruction set a process uses:
/// `scalar`, `avx2` or `avx512` (unset: the best the CPU has). `avx2` on an
/// AVX-512 machine runs what a CPU without AVX-512 would (its kernels, no AMX
/// tiles): to compare the two on one machine, or to rule a kernel out.
pub const SIMD_MAX_ENV: &str = "QUIVER_SIMD_MAX";

/// What can go wrong choosing the kernels.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimdError {
    /// [`SIMD_MAX_ENV`] names no instruction set this build knows.
    #[error(
        "{SIMD_MAX_ENV}={value:?} is not an instruction set this build knows: use scalar, avx2 or avx512 (or leave it unset for the best this CPU has)"
    )]
    UnknownCap { value: String },
}

/// Results of this crate's fallible calls.
pub type SimdResult<T> = Result<T, SimdError>;

/// Parses a value of [`SIMD_MAX_ENV`], naming the accepted ones when it is
/// none of them.
pub fn parse_simd_max(value: &str) -> SimdResult<Isa> {
    match value.trim().to_ascii_lowercase().as_str() {
        "scalar" => Ok(Isa::Scalar),
        "avx2" => Ok(Isa::Avx2),
        "avx512" => Ok(Isa::Avx512),
        _ => Err(SimdError::UnknownCap {
            value: value.to_owned(),
        }),
    }
}

/// The cap [`SIMD_MAX_ENV`] sets, if it is set (`Err`: set to something
/// [`parse_simd_max`] refuses; `quiver` refuses to start then, and the kernels
/// ignore the cap). `QUIVER_SIMD_FORCE_SCALAR` caps at scalar.
pub fn simd_max_from_env() -> SimdResult<Option<Isa>> {
    if std::env::var_os("QUIVER_SIMD_FORCE_SCALAR").is_some() {
        return Ok(Some(Isa::Scalar));
    }
    match std::env::var(SIMD_MAX_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(SimdError::UnknownCap {
            value: value.to_string_lossy().into_owned(),
        }),
        Ok(value) => parse_simd_max(&value).map(Some),
    }
}

/// Whether a kernel set of `isa` is allowed under `cap`: scalar allows no
/// vector set; `avx2` allows AVX2 and NEON, not AVX-512.
pub(crate) fn allowed(isa: Isa, cap: Option<Isa>) -> bool {
    let level = |isa: Isa| match isa {
        Isa::Scalar => 0,
        Isa::Avx2 | Isa::Neon => 1,
        Isa::Avx512 => 2,
    };
    cap.is_none_or(|cap| level(isa) <= level(cap))
}

fn detect() -> Kernels {
    detect_with(simd_max_from_env().unwrap_or(None))
}

/// The best kernel set of this CPU that `cap` allows.
fn detect_with(cap: Option<Isa>) -> Kernels {
    #[cfg(target_arch = "x86_64")]
    {
        if allowed(Isa::Avx512, cap) && crate::x86_avx512::is_supported() {
            return crate::x86_avx512::kernels_for_this_cpu();
        }
        if allowed(Isa::Avx2, cap) && crate::x86_avx2::is_supported() {
            return crate::x86_avx2::KERNELS;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if allowed(Isa::Neon, cap) && std::arch::is_aarch64_feature_detected!("neon") {
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

#[cfg(test)]
mod cap_tests {
    use super::*;

    #[test]
    fn the_cap_names_an_instruction_set_or_says_which_it_accepts() {
        assert_eq!(parse_simd_max("avx2"), Ok(Isa::Avx2));
        assert_eq!(parse_simd_max(" AVX512 "), Ok(Isa::Avx512));
        assert_eq!(parse_simd_max("scalar"), Ok(Isa::Scalar));
        let refused = parse_simd_max("sse4")
            .expect_err("not an instruction set")
            .to_string();
        assert!(
            refused.contains("QUIVER_SIMD_MAX=\"sse4\"")
                && refused.contains("scalar, avx2 or avx512"),
            "{refused}"
        );
    }

    #[test]
    fn a_cap_allows_the_sets_up_to_it() {
        assert!(allowed(Isa::Avx512, None));
        assert!(allowed(Isa::Avx512, Some(Isa::Avx512)));
        assert!(!allowed(Isa::Avx512, Some(Isa::Avx2)));
        assert!(allowed(Isa::Avx2, Some(Isa::Avx2)));
        assert!(allowed(Isa::Neon, Some(Isa::Avx2)));
        assert!(!allowed(Isa::Avx2, Some(Isa::Scalar)));
        assert!(!allowed(Isa::Neon, Some(Isa::Scalar)));
        assert!(allowed(Isa::Scalar, Some(Isa::Scalar)));
    }

    #[test]
    fn the_kernels_chosen_under_a_cap_are_the_best_it_allows() {
        let best = detect_with(None).isa;
        assert_eq!(detect_with(Some(Isa::Scalar)).isa, Isa::Scalar);
        let under_avx2 = detect_with(Some(Isa::Avx2)).isa;
        assert_ne!(under_avx2, Isa::Avx512);
        if best == Isa::Avx512 {
            // Every AVX-512 CPU this build accepts has AVX2 and FMA too.
            assert_eq!(under_avx2, Isa::Avx2);
        } else {
            assert_eq!(under_avx2, best);
        }
        assert_eq!(detect_with(Some(Isa::Avx512)).isa, best);
    }
}
