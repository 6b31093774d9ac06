//! What a collection really holds: every shard's manifest read from meta
//! (linearizable), every live segment and deletion bitmap and every WAL-tail
//! object read from S3 and decoded with the repository's own crates, scanned
//! flat (no index, no cache, no searcher).

use std::collections::HashMap;

use anyhow::{Context, bail};
use quiver_index::{MemorySource, PointId, Segment};
use quiver_proto::convert::manifest_from_proto;
use quiver_proto::meta as pb;
use quiver_storage::{DeletionBitmap, WalBatch, WalRecord};

use crate::cluster::Cluster;

/// Totals of one scan.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanStats {
    pub segments: usize,
    pub segment_rows: u64,
    pub wal_tail_batches: usize,
    /// Highest lease epoch among the WAL-tail entries.
    pub max_tail_epoch: u64,
}

/// Returns every live point (id → vector) of `collection`: per shard, segments
/// minus their deletion bitmaps, then the WAL tail in commit order. Fails if an
/// id is live in two segments, if a point sits in the wrong shard's files, if
/// an object is missing or corrupt, or if the WAL tail is not in position order
/// (a stale epoch committed after a newer one).
pub async fn stored_points(
    cluster: &Cluster,
    collection: &str,
) -> anyhow::Result<(HashMap<u64, Vec<f32>>, ScanStats)> {
    let meta = cluster.meta_client();
    let storage = cluster.storage()?;
    let described = meta
        .get_collection(collection, true)
        .await
        .with_context(|| format!("collection {collection} from meta"))?;
    let shard_count = described.spec.as_ref().map_or(1, |spec| spec.shards).max(1);
    let mut points: HashMap<u64, Vec<f32>> = HashMap::new();
    let mut stats = ScanStats::default();
    for shard in 0..shard_count {
        let reference = pb::ShardRef {
            collection_id: described.collection_id,
            shard,
        };
        let manifest = meta
            .get_manifest(reference, true)
            .await
            .with_context(|| format!("manifest of shard {shard}"))?;
        let manifest = manifest_from_proto(&manifest);
        let mut shard_points: HashMap<u64, Vec<f32>> = HashMap::new();
        for entry in &manifest.segments {
            let bytes = storage
                .get(&entry.key)
                .await
                .with_context(|| format!("segment {}", entry.key))?;
            let segment = Segment::open(MemorySource::new(&entry.key, &bytes))
                .with_context(|| format!("opening segment {}", entry.key))?;
            segment
                .verify()
                .with_context(|| format!("checksums of segment {}", entry.key))?;
            if segment.rows() != u64::from(entry.rows) {
                bail!(
                    "segment {} has {} rows, its manifest entry says {}",
                    entry.key,
                    segment.rows(),
                    entry.rows
                );
            }
            let deleted = match &entry.deletes {
                Some(deletes) => {
                    let bytes = storage
                        .get(&deletes.key)
                        .await
                        .with_context(|| format!("deletion bitmap {}", deletes.key))?;
                    let bitmap = DeletionBitmap::decode(&deletes.key, &bytes)?;
                    if bitmap.deleted.len() != u64::from(deletes.deleted_rows) {
                        bail!(
                            "deletion bitmap {} holds {} rows, the manifest says {}",
                            deletes.key,
                            bitmap.deleted.len(),
                            deletes.deleted_rows
                        );
                    }
                    bitmap.deleted
                }
                None => Default::default(),
            };
            stats.segments += 1;
            stats.segment_rows += segment.rows();
            for (row, id) in segment.ids()?.into_iter().enumerate() {
                if deleted.contains(row as u32) {
                    continue;
                }
                let id = u64_id(&id)?;
                let vector = segment.vector(row as u32)?;
                if shard_points.insert(id, vector).is_some() {
                    bail!(
                        "id {id} is live in two segments of shard {shard} (an older copy was not deleted); segment {}",
                        entry.key
                    );
                }
            }
        }
        let mut previous = None;
        for wal in &manifest.wal_tail {
            if previous.is_some_and(|position| position >= wal.position) {
                bail!(
                    "WAL tail of shard {shard} is out of order: {:?} after {:?}",
                    wal.position,
                    previous
                );
            }
            previous = Some(wal.position);
            stats.wal_tail_batches += 1;
            stats.max_tail_epoch = stats.max_tail_epoch.max(wal.position.epoch);
            let bytes = storage
                .get(&wal.key)
                .await
                .with_context(|| format!("WAL object {}", wal.key))?;
            let batch = WalBatch::decode(&wal.key, &bytes)?;
            for record in batch.records {
                match record {
                    WalRecord::Upsert { id, vector, .. } => {
                        shard_points.insert(u64_id(&id)?, vector);
                    }
                    WalRecord::Delete { id } => {
                        shard_points.remove(&u64_id(&id)?);
                    }
                }
            }
        }
        for (id, vector) in shard_points {
            let owner = quiver_proto::convert::shard_of(&PointId::U64(id), shard_count);
            if owner != shard {
                bail!("id {id} is stored in shard {shard}, but it belongs to shard {owner}");
            }
            points.insert(id, vector);
        }
    }
    Ok((points, stats))
}

fn u64_id(id: &PointId) -> anyhow::Result<u64> {
    match id {
        PointId::U64(id) => Ok(*id),
        PointId::String(text) => bail!("string id {text:?} in a u64 collection"),
    }
}
