//! The object key layout (ARCHITECTURE.md, "Object layout"), in one place. Keys
//! are relative to the store URL's prefix.

/// The prefix under which every Quiver object lives.
pub const COLLECTIONS_PREFIX: &str = "collections";

/// Returns the key prefix of every object of one shard.
pub fn shard_prefix(collection_id: &str, shard: u32) -> String {
    format!("{COLLECTIONS_PREFIX}/{collection_id}/shards/{shard}")
}

/// Returns the key of a WAL object: `{epoch:010}-{seq:020}.wal`, so keys sort in
/// commit order.
pub fn wal_key(collection_id: &str, shard: u32, epoch: u64, sequence: u64) -> String {
    format!(
        "{}/wal/{epoch:010}-{sequence:020}.wal",
        shard_prefix(collection_id, shard)
    )
}

/// Returns the key of a segment.
pub fn segment_key(collection_id: &str, shard: u32, segment_id: &str) -> String {
    format!(
        "{}/segments/{segment_id}.qseg",
        shard_prefix(collection_id, shard)
    )
}

/// Returns the key of a segment's deletion bitmap at one version.
pub fn deletes_key(collection_id: &str, shard: u32, segment_id: &str, version: u64) -> String {
    format!(
        "{}/deletes/{segment_id}-{version}.del",
        shard_prefix(collection_id, shard)
    )
}

/// What a key names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Wal {
        collection_id: String,
        shard: u32,
        epoch: u64,
        sequence: u64,
    },
    Segment {
        collection_id: String,
        shard: u32,
        segment_id: String,
    },
    Deletes {
        collection_id: String,
        shard: u32,
        segment_id: String,
        version: u64,
    },
}

/// Parses a key of the layout; `None` for anything else (e.g. a stray object).
pub fn parse_key(key: &str) -> Option<ObjectKind> {
    let parts: Vec<&str> = key.split('/').collect();
    let ["collections", collection_id, "shards", shard, kind, name] = parts.as_slice() else {
        return None;
    };
    let collection_id = collection_id.to_string();
    let shard: u32 = shard.parse().ok()?;
    match *kind {
        "wal" => {
            let (epoch, sequence) = name.strip_suffix(".wal")?.split_once('-')?;
            Some(ObjectKind::Wal {
                collection_id,
                shard,
                epoch: epoch.parse().ok()?,
                sequence: sequence.parse().ok()?,
            })
        }
        "segments" => Some(ObjectKind::Segment {
            collection_id,
            shard,
            segment_id: name.strip_suffix(".qseg")?.to_string(),
        }),
        "deletes" => {
            let (segment_id, version) = name.strip_suffix(".del")?.rsplit_once('-')?;
            Some(ObjectKind::Deletes {
                collection_id,
                shard,
                segment_id: segment_id.to_string(),
                version: version.parse().ok()?,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sort_in_commit_order() {
        let wal = wal_key("c1", 3, 7, 42);
        assert_eq!(
            wal,
            "collections/c1/shards/3/wal/0000000007-00000000000000000042.wal"
        );
        assert_eq!(
            parse_key(&wal),
            Some(ObjectKind::Wal {
                collection_id: "c1".into(),
                shard: 3,
                epoch: 7,
                sequence: 42
            })
        );
        assert!(wal_key("c", 0, 1, 9) < wal_key("c", 0, 1, 10));
        assert!(wal_key("c", 0, 1, 999) < wal_key("c", 0, 2, 0));
        let segment = segment_key("c1", 0, "seg-a");
        assert_eq!(
            parse_key(&segment),
            Some(ObjectKind::Segment {
                collection_id: "c1".into(),
                shard: 0,
                segment_id: "seg-a".into()
            })
        );
        let deletes = deletes_key("c1", 0, "seg-a", 5);
        assert_eq!(
            parse_key(&deletes),
            Some(ObjectKind::Deletes {
                collection_id: "c1".into(),
                shard: 0,
                segment_id: "seg-a".into(),
                version: 5
            })
        );
        assert_eq!(parse_key("collections/c1/other"), None);
        assert_eq!(parse_key("collections/c1/shards/x/wal/1-2.wal"), None);
    }
}
