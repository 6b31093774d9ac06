//! Collections: creating one (with its shards), dropping one (its objects go on
//! the GC list), and the limits a definition must keep.

use std::collections::BTreeSet;

use quiver_proto::ErrorCode;

use super::{ApplyResult, Catalog};
use crate::model::{Collection, CollectionSpec, Outcome, Rejection, ShardKey, ShardRecord};

/// Dropped collection ids remembered for watchers that lag behind.
const DROPPED_HISTORY: usize = 1024;
/// Largest shard count of a collection.
const MAX_SHARDS: u32 = 1024;
/// Largest search replication factor.
const MAX_REPLICATION: u32 = 64;
/// Largest vector dimension.
const MAX_DIMENSION: u32 = 65_536;

impl Catalog {
    pub(super) fn create_collection(&mut self, spec: &CollectionSpec, now_ms: u64) -> ApplyResult {
        let spec = normalize_spec(spec)?;
        if let Some(existing) = self.collections.get(&spec.name) {
            if existing.spec == spec {
                return Ok(Outcome::Collection {
                    collection: existing.clone(),
                    created: false,
                });
            }
            return Err(Rejection::new(
                ErrorCode::AlreadyExists,
                format!(
                    "collection `{}` already exists with a different definition",
                    spec.name
                ),
            ));
        }
        self.next_collection_id += 1;
        let collection_id = self.next_collection_id;
        let version = self.bump_version();
        for shard in 0..spec.shards {
            let record = ShardRecord {
                changed_at_version: version,
                ..ShardRecord::default()
            };
            self.shards.insert(
                ShardKey {
                    collection_id,
                    shard,
                },
                record,
            );
        }
        let collection = Collection {
            collection_id,
            spec,
            created_at_ms: now_ms,
        };
        self.collections
            .insert(collection.spec.name.clone(), collection.clone());
        self.collections_changed_at_version = version;
        Ok(Outcome::Collection {
            collection,
            created: true,
        })
    }

    pub(super) fn drop_collection(&mut self, name: &str, delete_after_ms: u64) -> ApplyResult {
        let Some(collection) = self.collections.remove(name) else {
            return Err(Rejection::new(
                ErrorCode::NotFound,
                format!("collection `{name}` does not exist"),
            ));
        };
        let collection_id = collection.collection_id;
        let shard_keys: Vec<ShardKey> = self
            .shards
            .range(shard_range(collection_id))
            .map(|(key, _)| *key)
            .collect();
        for shard_key in shard_keys {
            if let Some(record) = self.shards.remove(&shard_key) {
                for segment in record.manifest.segments {
                    self.gc.insert(segment.key, delete_after_ms);
                    if let Some(deletes) = segment.deletes {
                        self.gc.insert(deletes.key, delete_after_ms);
                    }
                }
                for wal_entry in record.manifest.wal_tail {
                    self.gc.insert(wal_entry.key, delete_after_ms);
                }
            }
        }
        let version = self.bump_version();
        self.collections_changed_at_version = version;
        self.dropped.insert(collection_id, version);
        while self.dropped.len() > DROPPED_HISTORY {
            self.dropped.pop_first();
        }
        Ok(Outcome::Dropped { collection_id })
    }
}

/// Checks a spec and fills its defaults (0 shards or replication = 1).
fn normalize_spec(spec: &CollectionSpec) -> Result<CollectionSpec, Rejection> {
    let invalid = |message: String| Err(Rejection::new(ErrorCode::InvalidArgument, message));
    let name = &spec.name;
    if name.is_empty()
        || name.len() > 255
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    {
        return invalid(format!(
            "collection name `{name}` must be 1 to 255 characters of [A-Za-z0-9_-]"
        ));
    }
    if spec.dimension == 0 || spec.dimension > MAX_DIMENSION {
        return invalid(format!(
            "dimension {} of collection `{name}` must be between 1 and {MAX_DIMENSION}",
            spec.dimension
        ));
    }
    let mut normalized = spec.clone();
    if normalized.shards == 0 {
        normalized.shards = 1;
    }
    if normalized.replication == 0 {
        normalized.replication = 1;
    }
    if normalized.shards > MAX_SHARDS {
        return invalid(format!(
            "shard count {} of collection `{name}` is above the limit {MAX_SHARDS}",
            spec.shards
        ));
    }
    if normalized.replication > MAX_REPLICATION {
        return invalid(format!(
            "replication {} of collection `{name}` is above the limit {MAX_REPLICATION}",
            spec.replication
        ));
    }
    if normalized.index.extended_bits > 8 {
        return invalid(format!(
            "index.extended_bits {} of collection `{name}` must be at most 8",
            spec.index.extended_bits
        ));
    }
    let mut field_names = BTreeSet::new();
    for field in &spec.payload_schema {
        if field.name.is_empty() || !field_names.insert(field.name.as_str()) {
            return invalid(format!(
                "payload field `{}` of collection `{name}` is empty or declared twice",
                field.name
            ));
        }
    }
    Ok(normalized)
}

fn shard_range(collection_id: u64) -> std::ops::RangeInclusive<ShardKey> {
    ShardKey {
        collection_id,
        shard: 0,
    }..=ShardKey {
        collection_id,
        shard: u32::MAX,
    }
}
