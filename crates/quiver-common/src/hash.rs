//! Stable hashes. Their outputs are part of what Quiver stores and routes by
//! (a point's shard, a shard's searchers), so they must never change: each has a
//! test pinning known values.

/// Returns the splitmix64 finalizer of `state + golden ratio`: a fast, well-mixed
/// 64-bit hash of a 64-bit value (Steele, Lea, Flood 2014).
pub fn splitmix64(state: u64) -> u64 {
    mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// Returns splitmix64's finalizer of `value` (no increment): spreads the bits of a
/// hash that is already well distributed in its low bits, e.g. an FNV-1a.
pub fn mix64(value: u64) -> u64 {
    let mut mixed = value;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^ (mixed >> 31)
}

/// The FNV-1a 64-bit offset basis: the hash of no bytes.
pub const FNV1A64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

const FNV1A64_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Returns `hash` extended with `bytes` by FNV-1a (64-bit); start from
/// [`FNV1A64_OFFSET`], or use [`fnv1a64`] for one slice.
pub fn fnv1a64_extend(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV1A64_PRIME)
    })
}

/// Returns the FNV-1a 64-bit hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_extend(FNV1A64_OFFSET, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The reference generator's outputs from seed 0 (state advanced by the golden
        // ratio each step), as published with the algorithm.
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn fnv1a64_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a64_extend(fnv1a64(b"foo"), b"bar"), fnv1a64(b"foobar"));
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), splitmix64(0));
    }
}
