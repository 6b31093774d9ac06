//! Shared helpers: stores, shard writers, and a reader of a shard's contents
//! straight from its manifest (the checker every test compares against).

use std::collections::HashMap;
use std::sync::Arc;

use quiver_index::{IdType, MemorySource, Metric, PointId, Segment, SegmentSpec};
use quiver_indexer::{IndexerConfig, Manifest, MemoryCatalog, ShardRef, ShardWriter};
use quiver_storage::{
    DeletionBitmap, S3Settings, Storage, StorageOptions, StoreUrl, WalBatch, WalRecord,
};
use quiver_test_support::S3TestServer;

pub const DIM: usize = 8;

pub fn shard() -> ShardRef {
    ShardRef {
        collection_id: "c-test".into(),
        shard: 0,
    }
}

pub fn spec() -> SegmentSpec {
    SegmentSpec::new(DIM, Metric::L2, IdType::U64)
}

pub fn memory_storage() -> Storage {
    Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap()
}

/// The S3 test server's storage (a fresh bucket), or `None` (a visible skip)
/// without a server; under CI a missing server fails.
pub async fn s3_storage() -> Option<Storage> {
    let server = S3TestServer::from_env("the S3 part of this test")?;
    Some(
        server
            .fresh_storage("quiver-indexer-test", "indexer-tests")
            .await,
    )
}

/// A config that never flushes or merges on its own (tests call flush).
pub fn manual_config() -> IndexerConfig {
    IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 1_000,
        codebook_refresh: false,
        consolidate_quiet_ms: 0,
        ..IndexerConfig::default()
    }
}

pub async fn open_writer(
    storage: &Storage,
    catalog: &Arc<MemoryCatalog>,
    epoch: u64,
    config: IndexerConfig,
) -> ShardWriter {
    catalog.set_epoch(&shard(), epoch);
    ShardWriter::open(
        shard(),
        epoch,
        spec(),
        config,
        storage.clone(),
        catalog.clone(),
    )
    .await
    .unwrap()
}

/// A deterministic vector for `id` at `version` (so a replaced point differs).
pub fn vector(id: u64, version: u32) -> Vec<f32> {
    (0..DIM)
        .map(|i| ((id * 31 + i as u64 * 7 + version as u64 * 13) % 97) as f32 / 10.0 + 0.1)
        .collect()
}

pub fn upsert(id: u64, version: u32) -> WalRecord {
    WalRecord::Upsert {
        id: PointId::U64(id),
        vector: vector(id, version),
        payload: format!(r#"{{"version":{version}}}"#).into_bytes(),
    }
}

pub fn delete(id: u64) -> WalRecord {
    WalRecord::Delete {
        id: PointId::U64(id),
    }
}

/// Every live point of the shard as a searcher would see it: segments minus
/// their deletion bitmaps, then the WAL tail in order on top. Panics if a live
/// id is in two segments (an upsert that failed to delete its older copy).
pub async fn contents(storage: &Storage, manifest: &Manifest) -> HashMap<PointId, Vec<f32>> {
    let mut points = HashMap::new();
    for entry in &manifest.segments {
        let bytes = storage.get(&entry.key).await.unwrap();
        let segment = Segment::open(MemorySource::new(&entry.key, &bytes)).unwrap();
        segment.verify().unwrap();
        assert_eq!(segment.rows(), entry.rows as u64, "{}", entry.key);
        let deleted = match &entry.deletes {
            Some(deletes) => {
                let bytes = storage.get(&deletes.key).await.unwrap();
                let bitmap = DeletionBitmap::decode(&deletes.key, &bytes).unwrap();
                assert_eq!(bitmap.deleted.len() as u32, deletes.deleted_rows);
                bitmap.deleted
            }
            None => Default::default(),
        };
        for (row, id) in segment.ids().unwrap().into_iter().enumerate() {
            if deleted.contains(row as u32) {
                continue;
            }
            let vector = segment.vector(row as u32).unwrap();
            assert!(
                points.insert(id.clone(), vector).is_none(),
                "id {id} is live in two segments"
            );
        }
    }
    for wal in &manifest.wal_tail {
        let bytes = storage.get(&wal.key).await.unwrap();
        let batch = WalBatch::decode(&wal.key, &bytes).unwrap();
        for record in batch.records {
            match record {
                WalRecord::Upsert { id, vector, .. } => {
                    points.insert(id, vector);
                }
                WalRecord::Delete { id } => {
                    points.remove(&id);
                }
            }
        }
    }
    points
}

/// Asserts the shard holds exactly `expected` (id → version).
pub async fn assert_contents(storage: &Storage, manifest: &Manifest, expected: &HashMap<u64, u32>) {
    let points = contents(storage, manifest).await;
    assert_eq!(points.len(), expected.len(), "live point count");
    for (&id, &version) in expected {
        let stored = points
            .get(&PointId::U64(id))
            .unwrap_or_else(|| panic!("acknowledged point {id} is missing"));
        let want = vector(id, version);
        assert!(
            stored.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
            "point {id} has the wrong vector: {stored:?} vs {want:?}"
        );
    }
}
