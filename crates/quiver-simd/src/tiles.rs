//! Inner products of many rows with many vectors in bf16 (bf16 inputs, f32
//! sums): the matrix product of k-means assignment and of a calibration's
//! exact answers, where the AVX-512 FMA kernel reaches ~100–130 GFLOPS per
//! core. Two units compute them:
//! - Intel AMX tiles (`TDPBF16PS`: several times the FMA kernel);
//! - AVX512-BF16 (`VDPBF16PS`: two products per f32 lane and instruction, twice
//!   the FMA kernel's products per instruction), on CPUs without AMX — AMD
//!   Zen 4 and later, Intel Cooper Lake.
//!
//! Inputs are rounded to bf16 (8 significant bits), so a product is off by at
//! most ~2⁻⁸·Σ|xᵢ·cᵢ| (≤ 2⁻⁸·‖x‖·‖c‖) on either unit: callers that need the
//! exact nearest re-check, in f32, the few vectors within that of the best (see
//! `quiver-index`'s k-means).
//!
//! AMX is used when the CPU has AMX-TILE and AMX-BF16 and the kernel grants the
//! process the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, Linux ≥ 5.16),
//! else AVX512-BF16 when the CPU has it; `QUIVER_SIMD_NO_TILES` turns both off,
//! and so does a cap below AVX-512 (`QUIVER_SIMD_MAX=avx2` or `scalar`,
//! `QUIVER_SIMD_FORCE_SCALAR`).

use std::sync::OnceLock;

/// Rows of one tile pass: products are computed for row groups of this many.
pub const TILE_ROWS: usize = 32;
/// Vectors of a panel come in groups of this many (zero vectors pad the last).
pub const TILE_VECTORS: usize = 32;
/// Dimensions are padded to a multiple of this (zeros).
pub const TILE_DIMS: usize = 32;

/// Vectors prepared for [`tile_products`]: bf16, grouped 16 to a block, each
/// block's dimensions in 32-wide chunks laid out as AMX wants its second
/// operand (pairs of dimensions interleaved per vector: `[pair][vector][2]`).
pub struct TilePanel {
    values: Vec<u16>,
    count: usize,
    padded_count: usize,
    padded_dim: usize,
}

impl TilePanel {
    /// Prepares `vectors` (`n × dim`, f32), each minus `center` (`dim` values)
    /// — distances do not change when rows and vectors are moved together, and
    /// the rounding error shrinks with the norms.
    pub fn new(vectors: &[f32], dim: usize, center: &[f32]) -> TilePanel {
        assert!(
            dim > 0 && vectors.len().is_multiple_of(dim),
            "TilePanel: ragged vectors"
        );
        assert_eq!(center.len(), dim, "TilePanel: center is not dim values");
        let count = vectors.len() / dim;
        let padded_count = count.div_ceil(TILE_VECTORS) * TILE_VECTORS;
        let padded_dim = padded_dim(dim);
        let chunks = padded_dim / TILE_DIMS;
        let mut values = vec![0u16; padded_count * padded_dim];
        for (index, vector) in vectors.chunks_exact(dim).enumerate() {
            let (block, column) = (index / 16, index % 16);
            for (d, (&value, &middle)) in vector.iter().zip(center).enumerate() {
                let (chunk, within) = (d / TILE_DIMS, d % TILE_DIMS);
                let (pair, half) = (within / 2, within % 2);
                let at = ((block * chunks + chunk) * 16 + pair) * 32 + column * 2 + half;
                values[at] = crate::f32_to_bf16_bits(value - middle);
            }
        }
        TilePanel {
            values,
            count,
            padded_count,
            padded_dim,
        }
    }

    /// Vectors in the panel (without padding).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Vectors including the zero padding: the row stride of [`tile_products`]' output.
    pub fn padded_count(&self) -> usize {
        self.padded_count
    }

    /// Dimensions including the zero padding: the row length [`tile_rows`] writes.
    pub fn padded_dim(&self) -> usize {
        self.padded_dim
    }
}

/// `dim` rounded up to whole tile chunks.
pub fn padded_dim(dim: usize) -> usize {
    dim.div_ceil(TILE_DIMS) * TILE_DIMS
}

/// Writes `rows` (`n × dim`, f32) minus `center` as bf16 rows of `padded_dim`
/// values into `out`, zero rows after them up to a whole number of
/// [`TILE_ROWS`]; returns the rows written (padding included).
pub fn tile_rows(rows: &[f32], dim: usize, center: &[f32], out: &mut Vec<u16>) -> usize {
    let count = rows.len() / dim;
    let padded_rows = count.div_ceil(TILE_ROWS).max(1) * TILE_ROWS;
    let padded = padded_dim(dim);
    out.clear();
    out.resize(padded_rows * padded, 0);
    for (row, values) in rows.chunks_exact(dim).zip(out.chunks_exact_mut(padded)) {
        for ((slot, &value), &middle) in values.iter_mut().zip(row).zip(center) {
            *slot = crate::f32_to_bf16_bits(value - middle);
        }
    }
    padded_rows
}

/// Whether the kernel cap (`QUIVER_SIMD_MAX`, `QUIVER_SIMD_FORCE_SCALAR`)
/// leaves the tiles on: no cap or `avx512` does, a lower one does not.
pub fn tiles_allowed_by_cap() -> bool {
    crate::dispatch::allowed(
        crate::Isa::Avx512,
        crate::simd_max_from_env().unwrap_or(None),
    )
}

/// The unit that computes [`tile_products`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductUnit {
    /// Intel AMX tiles (`TDPBF16PS`).
    AmxTiles,
    /// AVX512-BF16 (`VDPBF16PS`) on the vector units.
    Avx512Bf16,
}

impl std::fmt::Display for ProductUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProductUnit::AmxTiles => "amx",
            ProductUnit::Avx512Bf16 => "avx512-bf16",
        })
    }
}

/// The unit [`tile_products`] runs on here, `None` when neither may (detected
/// once per process): AMX tiles first, else AVX512-BF16.
pub fn product_unit() -> Option<ProductUnit> {
    static UNIT: OnceLock<Option<ProductUnit>> = OnceLock::new();
    *UNIT.get_or_init(|| {
        if std::env::var_os("QUIVER_SIMD_NO_TILES").is_some() || !tiles_allowed_by_cap() {
            return None;
        }
        if platform::enable() {
            Some(ProductUnit::AmxTiles)
        } else if platform::cpu_has_avx512_bf16() {
            Some(ProductUnit::Avx512Bf16)
        } else {
            None
        }
    })
}

/// Whether [`tile_products`] can run here (detected once per process).
pub fn tile_products_available() -> bool {
    product_unit().is_some()
}

/// Whether the CPU reports AMX-TILE and AMX-BF16 (whether or not the kernel
/// grants their state).
pub fn cpu_has_tiles() -> bool {
    platform::cpu_has_tiles()
}

/// Whether the CPU has a unit for [`tile_products`]: AMX tiles (whether or
/// not the kernel grants their state) or AVX512-BF16.
pub fn cpu_has_bf16_products() -> bool {
    platform::cpu_has_tiles() || platform::cpu_has_avx512_bf16()
}

/// Inner products of every row of `rows` (bf16 as [`tile_rows`] writes them: a
/// multiple of [`TILE_ROWS`] rows of `panel.padded_dim()` values) with every
/// vector of `panel`: `out[row * panel.padded_count() + vector]`.
///
/// Panics when [`tile_products_available`] is false or the sizes disagree.
pub fn tile_products(rows: &[u16], panel: &TilePanel, out: &mut [f32]) {
    let unit = product_unit().expect("tile_products: no bf16 product unit is available");
    assert!(
        rows.len().is_multiple_of(panel.padded_dim * TILE_ROWS),
        "tile_products: rows are not whole tiles of the panel's dimensions"
    );
    let count = rows.len() / panel.padded_dim;
    assert!(
        out.len() >= count * panel.padded_count,
        "tile_products: output buffer too small"
    );
    products_on(unit, rows, panel, count, out);
}

/// [`tile_products`] on `unit` (which must be available here).
fn products_on(unit: ProductUnit, rows: &[u16], panel: &TilePanel, count: usize, out: &mut [f32]) {
    match unit {
        ProductUnit::AmxTiles => platform::products(rows, panel, count, out),
        ProductUnit::Avx512Bf16 => platform::bf16_products(rows, panel, count, out),
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod platform {
    use super::{TILE_DIMS, TILE_ROWS, TILE_VECTORS, TilePanel};
    use std::arch::asm;

    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    /// Pairs of 16-vector blocks (a pair: 32 vectors, 48 KiB of bf16 at 768
    /// dimensions) scored against every row group before the next pairs: this
    /// many (768 KiB at 768 dimensions) stay in L2 while the row groups pass.
    const PAIRS_PER_PASS: usize = 16;

    pub(super) fn cpu_has_tiles() -> bool {
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
    }

    pub(super) fn cpu_has_avx512_bf16() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }

    /// Bytes of the panel scored against every group of rows before the next
    /// ones (`bf16_products`): with the rows of a k-means task (128 rows, 256
    /// KiB at 1,024 dimensions) they stay in a 1 MiB L2.
    const BF16_PASS_BYTES: usize = 512 * 1024;
    /// Rows whose products `bf16_products` computes at once: 8 rows × 32
    /// vectors are 16 accumulators, two panel registers and a broadcast.
    const BF16_ROWS: usize = 8;

    /// `products` with `VDPBF16PS`: for each pair of dimensions, a row's two
    /// bf16 values broadcast to every lane and multiplied with the same pair of
    /// 16 vectors (the panel's layout holds them side by side, as for AMX).
    pub(super) fn bf16_products(rows: &[u16], panel: &TilePanel, count: usize, out: &mut [f32]) {
        assert!(
            cpu_has_avx512_bf16(),
            "bf16_products: the CPU has no AVX512-BF16"
        );
        assert!(
            count.is_multiple_of(BF16_ROWS)
                && rows.len() >= count * panel.padded_dim
                && out.len() >= count * panel.padded_count,
            "bf16_products: rows or output do not hold {count} whole rows"
        );
        // SAFETY: the CPU has AVX-512F and AVX512-BF16, and the sizes this
        // reads and writes were checked above.
        unsafe { bf16_products_avx512(rows, panel, count, out) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn bf16_products_avx512(rows: &[u16], panel: &TilePanel, count: usize, out: &mut [f32]) {
        use std::arch::x86_64::*;
        // SAFETY: every load reads inside `rows` (row0 + r < count rows of
        // padded_dim values) or the panel (group < padded_count / 32, q <
        // dim_pairs); every store writes 16 floats inside `out` (count ×
        // padded_count, checked by `tile_products`).
        unsafe {
            let padded_dim = panel.padded_dim;
            let dim_pairs = padded_dim / 2;
            let stride = panel.padded_count;
            let groups = panel.padded_count / TILE_VECTORS;
            let per_pass = (BF16_PASS_BYTES / (TILE_VECTORS * padded_dim * 2)).max(1);
            let mut first = 0;
            while first < groups {
                let last = (first + per_pass).min(groups);
                for row0 in (0..count).step_by(BF16_ROWS) {
                    let row_ptr = rows.as_ptr().add(row0 * padded_dim);
                    for group in first..last {
                        // Block 2·group's pair q of dimensions for its 16 vectors
                        // is 32 values at ((2·group)·dim_pairs + q)·32; block
                        // 2·group + 1's follow dim_pairs·32 values later.
                        let low = panel.values.as_ptr().add(2 * group * dim_pairs * 32);
                        let high = low.add(dim_pairs * 32);
                        let mut acc = [[_mm512_setzero_ps(); 2]; BF16_ROWS];
                        for q in 0..dim_pairs {
                            let a: __m512bh =
                                std::mem::transmute(_mm512_loadu_si512(low.add(q * 32).cast()));
                            let b: __m512bh =
                                std::mem::transmute(_mm512_loadu_si512(high.add(q * 32).cast()));
                            for (r, pair) in acc.iter_mut().enumerate() {
                                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(
                                    row_ptr
                                        .add(r * padded_dim + 2 * q)
                                        .cast::<i32>()
                                        .read_unaligned(),
                                ));
                                pair[0] = _mm512_dpbf16_ps(pair[0], x, a);
                                pair[1] = _mm512_dpbf16_ps(pair[1], x, b);
                            }
                        }
                        for (r, pair) in acc.iter().enumerate() {
                            let o = out
                                .as_mut_ptr()
                                .add((row0 + r) * stride + group * TILE_VECTORS);
                            _mm512_storeu_ps(o, pair[0]);
                            _mm512_storeu_ps(o.add(16), pair[1]);
                        }
                    }
                }
                first = last;
            }
        }
    }

    pub(super) fn enable() -> bool {
        if !cpu_has_tiles() {
            return false;
        }
        // SAFETY: a plain system call asking for permission to use the tile
        // state; it changes nothing else.
        unsafe { syscall_arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }

    unsafe fn syscall_arch_prctl(code: i64, argument: i64) -> i64 {
        const SYS_ARCH_PRCTL: i64 = 158;
        let result: i64;
        // SAFETY: the x86-64 Linux system call convention; arch_prctl reads
        // only its two integer arguments.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => result,
                in("rdi") code,
                in("rsi") argument,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result
    }

    /// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    fn config() -> Config {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for tile in 0..8 {
            bytes[16 + tile * 2] = 64; // bytes per row (low byte of a u16)
            bytes[48 + tile] = 16; // rows
        }
        Config(bytes)
    }

    pub(super) fn products(rows: &[u16], panel: &TilePanel, count: usize, out: &mut [f32]) {
        let config = config();
        let padded_dim = panel.padded_dim;
        let chunks = padded_dim / TILE_DIMS;
        let row_stride = padded_dim * 2;
        let out_stride = panel.padded_count * 4;
        let pairs = panel.padded_count / TILE_VECTORS;
        // SAFETY: the tile state was granted (`tile_products_available`); every
        // tile load reads 16 rows of 64 bytes inside `rows` (group < count /
        // 32, chunk < chunks) or inside the panel (block < padded_count / 16),
        // every store writes 16 rows of 16 floats inside `out` (sized
        // count × padded_count); tiles are released before returning.
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
            let mut first_pair = 0;
            while first_pair < pairs {
                let last_pair = (first_pair + PAIRS_PER_PASS).min(pairs);
                for group in 0..count / TILE_ROWS {
                    let rows_ptr = rows.as_ptr().add(group * TILE_ROWS * padded_dim);
                    for pair in first_pair..last_pair {
                        let blocks = panel.values.as_ptr().add(pair * 2 * chunks * 16 * 32);
                        asm!(
                            "tilezero tmm0",
                            "tilezero tmm1",
                            "tilezero tmm2",
                            "tilezero tmm3",
                            options(nostack, nomem),
                        );
                        for chunk in 0..chunks {
                            let a = rows_ptr.add(chunk * TILE_DIMS);
                            let a2 = a.add(16 * padded_dim);
                            let b = blocks.add(chunk * 16 * 32);
                            let b2 = blocks.add((chunks + chunk) * 16 * 32);
                            asm!(
                                "tileloadd tmm4, [{a} + {sa}*1]",
                                "tileloadd tmm5, [{a2} + {sa}*1]",
                                "tileloadd tmm6, [{b} + {sb}*1]",
                                "tileloadd tmm7, [{b2} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                a = in(reg) a,
                                a2 = in(reg) a2,
                                b = in(reg) b,
                                b2 = in(reg) b2,
                                sa = in(reg) row_stride,
                                sb = in(reg) 64usize,
                                options(nostack, readonly),
                            );
                        }
                        let base = out
                            .as_mut_ptr()
                            .add(group * TILE_ROWS * panel.padded_count + pair * TILE_VECTORS);
                        let lower = base.add(16 * panel.padded_count);
                        asm!(
                            "tilestored [{o} + {so}*1], tmm0",
                            "tilestored [{o16} + {so}*1], tmm1",
                            "tilestored [{l} + {so}*1], tmm2",
                            "tilestored [{l16} + {so}*1], tmm3",
                            o = in(reg) base,
                            o16 = in(reg) base.add(16),
                            l = in(reg) lower,
                            l16 = in(reg) lower.add(16),
                            so = in(reg) out_stride,
                            options(nostack),
                        );
                    }
                }
                first_pair = last_pair;
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod platform {
    use super::TilePanel;

    pub(super) fn cpu_has_tiles() -> bool {
        false
    }

    pub(super) fn enable() -> bool {
        false
    }

    pub(super) fn cpu_has_avx512_bf16() -> bool {
        false
    }

    pub(super) fn products(_: &[u16], _: &TilePanel, _: usize, _: &mut [f32]) {
        unreachable!("tile products are checked available first")
    }

    pub(super) fn bf16_products(_: &[u16], _: &TilePanel, _: usize, _: &mut [f32]) {
        unreachable!("tile products are checked available first")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every unit that can compute the products here: the one chosen, and
    /// AVX512-BF16 beside AMX when the CPU has both.
    fn units_here() -> Vec<ProductUnit> {
        let mut units = Vec::new();
        if let Some(unit) = product_unit() {
            units.push(unit);
            if unit == ProductUnit::AmxTiles && platform::cpu_has_avx512_bf16() {
                units.push(ProductUnit::Avx512Bf16);
            }
        }
        units
    }

    #[test]
    fn tile_products_are_the_inner_products_within_the_bf16_bound() {
        if !cpu_has_bf16_products() {
            // Nothing to check on this CPU but that the path is off.
            assert!(!tile_products_available());
            return;
        }
        assert!(
            tile_products_available()
                || std::env::var_os("QUIVER_SIMD_NO_TILES").is_some()
                || !tiles_allowed_by_cap(),
            "the CPU has a bf16 product unit (AMX or AVX512-BF16) but it is not used"
        );
        if platform::cpu_has_avx512_bf16() && !cpu_has_tiles() {
            assert_eq!(
                product_unit().is_some(),
                tile_products_available(),
                "AVX512-BF16 is the unit of a CPU without AMX"
            );
        }
        let units = units_here();
        if units.is_empty() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for (dim, rows, vectors) in [(768, 70, 100), (33, 32, 16), (5, 1, 1), (384, 64, 64)] {
            let data: Vec<f32> = (0..rows * dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let panel_values: Vec<f32> = (0..vectors * dim)
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            let center: Vec<f32> = (0..dim).map(|_| rng.random_range(-0.5..0.5)).collect();
            let panel = TilePanel::new(&panel_values, dim, &center);
            let mut bf16_rows = Vec::new();
            let padded_rows = tile_rows(&data, dim, &center, &mut bf16_rows);
            assert_eq!(padded_rows % TILE_ROWS, 0);
            for &unit in &units {
                let mut out = vec![f32::NAN; padded_rows * panel.padded_count()];
                products_on(unit, &bf16_rows, &panel, padded_rows, &mut out);
                for row in 0..rows {
                    let x: Vec<f32> = data[row * dim..][..dim]
                        .iter()
                        .zip(&center)
                        .map(|(v, c)| v - c)
                        .collect();
                    for vector in 0..panel.padded_count() {
                        let got = out[row * panel.padded_count() + vector];
                        if vector >= vectors {
                            assert_eq!(got, 0.0, "padding vector {vector}");
                            continue;
                        }
                        let c: Vec<f32> = panel_values[vector * dim..][..dim]
                            .iter()
                            .zip(&center)
                            .map(|(v, m)| v - m)
                            .collect();
                        let exact: f64 = x.iter().zip(&c).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let scale: f64 = x
                            .iter()
                            .zip(&c)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        assert!(
                            (got as f64 - exact).abs()
                                <= scale * (1.0 / 256.0 + 1.0 / 4096.0) + 1e-6,
                            "{unit}: dim {dim} row {row} vector {vector}: {got} against {exact} (scale {scale})"
                        );
                    }
                }
            }
        }
    }
}
