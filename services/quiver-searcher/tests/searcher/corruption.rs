//! Damaged objects in the bucket: a segment with flipped bits or cut short, a WAL
//! object with flipped bits or cut short, a damaged deletion bitmap. Each is
//! caught by its checksum (or length), the error is DATA_LOSS naming the object's
//! key, the damaged-object counter moves, and no answer is served from it.

use quiver_index::{MemorySource, SearchScratch, SectionKind, Segment};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_searcher::ShardView;
use quiver_storage::Storage;

use crate::faults::write_shard;
use crate::reload::{context, memory_storage};
use crate::{request, spec, vectors};

fn corrupted_objects() -> f64 {
    prometheus::gather()
        .iter()
        .filter(|family| family.name() == "quiver_searcher_corrupted_objects_total")
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value())
        .sum()
}

fn assert_damage_named(error: &quiver_searcher::SearcherError, key: &str) {
    assert_eq!(error.error_code(), ErrorCode::DataLoss, "{error}");
    assert!(
        error.to_string().contains(key),
        "the error names {key}: {error}"
    );
}

async fn replace(storage: &Storage, key: &str, damage: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = storage.get(key).await.unwrap().to_vec();
    damage(&mut bytes);
    storage.put(key, bytes.into()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_segments_wal_objects_and_bitmaps_are_errors_naming_the_object() {
    let storage = memory_storage();
    let shard = quiver_indexer::ShardRef {
        collection_id: "c-damage".into(),
        shard: 0,
    };
    let manifest = write_shard(&storage, &shard).await;
    let counted_before = corrupted_objects();

    // Flipped bits in a segment's codes: every search probes codes, so every
    // search fails naming the segment — none returns an answer.
    let segment_key = manifest.segments[0].key.clone();
    let original = storage.get(&segment_key).await.unwrap();
    let codes = Segment::open(MemorySource::new("probe", &original))
        .unwrap()
        .sections()
        .iter()
        .find(|section| section.kind == SectionKind::Codes)
        .copied()
        .unwrap();
    replace(&storage, &segment_key, |bytes| {
        for offset in (codes.offset..codes.offset + codes.length).step_by(997) {
            bytes[offset as usize] ^= 0x24;
        }
    })
    .await;
    let directory = tempfile::tempdir().unwrap();
    let loader = context(&storage, directory.path(), 64 << 10);
    let (checked, key) = (manifest.clone(), segment_key.clone());
    tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&loader, &spec(), checked).unwrap();
        let mut scratch = SearchScratch::new();
        for query in vectors(5, 3) {
            let error = view
                .search(&loader, &request(&query, 10, None), &mut scratch)
                .unwrap_err();
            assert_damage_named(&error, &key);
        }
    })
    .await
    .unwrap();

    // The segment cut short: the view does not load.
    replace(&storage, &segment_key, |bytes| {
        *bytes = original[..original.len() - 5000].to_vec()
    })
    .await;
    let directory = tempfile::tempdir().unwrap();
    let loader = context(&storage, directory.path(), 64 << 10);
    let (checked, key) = (manifest.clone(), segment_key.clone());
    tokio::task::spawn_blocking(move || {
        let error = ShardView::load(&loader, &spec(), checked).err().unwrap();
        assert_damage_named(&error, &key);
    })
    .await
    .unwrap();
    storage.put(&segment_key, original).await.unwrap();

    // A WAL object with one flipped bit, then cut short.
    let wal_key = manifest.wal_tail[0].key.clone();
    let wal = storage.get(&wal_key).await.unwrap();
    for damage in [0usize, 1] {
        replace(&storage, &wal_key, |bytes| {
            if damage == 0 {
                let middle = bytes.len() / 2;
                bytes[middle] ^= 0x01;
            } else {
                bytes.truncate(bytes.len() - 7);
            }
        })
        .await;
        let directory = tempfile::tempdir().unwrap();
        let loader = context(&storage, directory.path(), 64 << 10);
        let (checked, key) = (manifest.clone(), wal_key.clone());
        tokio::task::spawn_blocking(move || {
            let error = ShardView::load(&loader, &spec(), checked).err().unwrap();
            assert_damage_named(&error, &key);
        })
        .await
        .unwrap();
        storage.put(&wal_key, wal.clone()).await.unwrap();
    }

    // A damaged deletion bitmap.
    let deletes_key = manifest
        .segments
        .iter()
        .find_map(|segment| segment.deletes.as_ref())
        .unwrap()
        .key
        .clone();
    replace(&storage, &deletes_key, |bytes| bytes[20] ^= 0x80).await;
    let directory = tempfile::tempdir().unwrap();
    let loader = context(&storage, directory.path(), 64 << 10);
    let (checked, key) = (manifest.clone(), deletes_key.clone());
    tokio::task::spawn_blocking(move || {
        let error = ShardView::load(&loader, &spec(), checked).err().unwrap();
        assert_damage_named(&error, &key);
    })
    .await
    .unwrap();

    // Repaired, the shard answers again; every damaged read was counted.
    replace(&storage, &deletes_key, |bytes| bytes[20] ^= 0x80).await;
    let directory = tempfile::tempdir().unwrap();
    let loader = context(&storage, directory.path(), 64 << 10);
    tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&loader, &spec(), manifest).unwrap();
        let mut scratch = SearchScratch::new();
        let hits = view
            .search(&loader, &request(&vectors(1, 3)[0], 10, None), &mut scratch)
            .unwrap();
        assert_eq!(hits.len(), 10);
    })
    .await
    .unwrap();
    assert!(
        corrupted_objects() >= counted_before + 9.0,
        "damaged reads counted: {} → {}",
        counted_before,
        corrupted_objects()
    );
}
