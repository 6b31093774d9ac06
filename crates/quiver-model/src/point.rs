//! Point ids and the shard each one lives in.

use quiver_common::hash::{fnv1a64, splitmix64};
use serde::{Deserialize, Serialize};

/// A point id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PointId {
    /// An unsigned integer id.
    U64(u64),
    /// A string id.
    String(String),
}

impl std::fmt::Display for PointId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PointId::U64(id) => write!(formatter, "{id}"),
            PointId::String(id) => write!(formatter, "{id:?}"),
        }
    }
}

/// Returns the shard of `id` among `shards`: a fixed hash (splitmix64 of u64 ids,
/// FNV-1a of string ids) modulo the shard count, so every gateway routes alike.
///
/// Part of the data format: every stored point sits in the shard this names, so
/// the outputs must never change (pinned by a test).
pub fn shard_of(id: &PointId, shards: u32) -> u32 {
    let hash = match id {
        PointId::U64(number) => splitmix64(*number),
        PointId::String(text) => fnv1a64(text.as_bytes()),
    };
    (hash % u64::from(shards.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_spread_over_shards_and_stay_put() {
        let mut counts = [0u32; 4];
        for id in 0..4000u64 {
            counts[shard_of(&PointId::U64(id), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&count| (800..1200).contains(&count)),
            "{counts:?}"
        );
        assert_eq!(
            shard_of(&PointId::U64(12345), 4),
            shard_of(&PointId::U64(12345), 4)
        );
        assert_eq!(shard_of(&PointId::String("doc".into()), 1), 0);
        assert_eq!(shard_of(&PointId::U64(7), 0), 0, "no shards count as one");
        // Pinned values: changing the hash would move every stored point.
        assert_eq!(shard_of(&PointId::U64(1), 1000), 465);
        assert_eq!(shard_of(&PointId::U64(42), 7), 5);
        assert_eq!(shard_of(&PointId::String("doc".into()), 1000), 437);
    }

    /// The routing before it used the shared hashes, kept as the reference.
    fn reference_shard_of(id: &PointId, shards: u32) -> u32 {
        let hash = match id {
            PointId::U64(number) => {
                let mut z = number.wrapping_add(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            }
            PointId::String(text) => text.bytes().fold(0xCBF2_9CE4_8422_2325u64, |hash, byte| {
                (hash ^ byte as u64).wrapping_mul(0x0100_0000_01B3)
            }),
        };
        (hash % shards.max(1) as u64) as u32
    }

    proptest::proptest! {
        #[test]
        fn routing_matches_the_reference(number: u64, text: String, shards in 0u32..5000) {
            proptest::prop_assert_eq!(
                shard_of(&PointId::U64(number), shards),
                reference_shard_of(&PointId::U64(number), shards)
            );
            let id = PointId::String(text);
            proptest::prop_assert_eq!(shard_of(&id, shards), reference_shard_of(&id, shards));
        }
    }

    #[test]
    fn ids_serialize_untagged() {
        assert_eq!(serde_json::to_string(&PointId::U64(5)).unwrap(), "5");
        assert_eq!(
            serde_json::from_str::<PointId>("\"a\"").unwrap(),
            PointId::String("a".into())
        );
    }
}
