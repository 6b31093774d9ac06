//! Group commit, flushes, replacements, deletes, backpressure, merges, bad input.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use quiver_index::PointId;
use quiver_indexer::{Catalog, IndexerConfig, MemoryCatalog};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_storage::{Storage, WalRecord};

use crate::support::*;

async fn acknowledged_writes_survive_flushes(storage: Storage) {
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = Arc::new(open_writer(&storage, &catalog, 1, manual_config()).await);
    // 40 concurrent writers of 5 points each land in a few group commits.
    let mut tasks = Vec::new();
    for client in 0..40u64 {
        let writer = writer.clone();
        tasks.push(tokio::spawn(async move {
            let records = (0..5).map(|i| upsert(client * 5 + i, 0)).collect();
            writer.write(records).await
        }));
    }
    let mut positions = Vec::new();
    for task in tasks {
        positions.push(task.await.unwrap().expect("write acknowledged"));
    }
    positions.sort();
    positions.dedup();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_eq!(manifest.wal_tail.len(), positions.len());
    assert!(
        positions.len() < 40,
        "40 concurrent writes became {} WAL objects",
        positions.len()
    );
    let mut expected: HashMap<u64, u32> = (0..200).map(|id| (id, 0)).collect();
    assert_contents(&storage, &manifest, &expected).await;

    // Flush: one L0 segment, the tail trimmed, the same contents.
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_eq!(manifest.segments.len(), 1);
    assert!(manifest.wal_tail.is_empty());
    assert_eq!(manifest.segments[0].rows, 200);
    assert_contents(&storage, &manifest, &expected).await;
    assert!(!writer.flush().await.unwrap(), "nothing left to flush");

    // Replace some, delete some, add some: the old copies get a deletion bitmap.
    writer
        .write(vec![
            upsert(3, 1),
            upsert(150, 1),
            delete(7),
            delete(9999),
            upsert(500, 0),
        ])
        .await
        .unwrap();
    expected.insert(3, 1);
    expected.insert(150, 1);
    expected.remove(&7);
    expected.insert(500, 0);
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_eq!(manifest.segments.len(), 2);
    let first = manifest
        .segments
        .iter()
        .find(|segment| segment.rows == 200)
        .unwrap();
    assert_eq!(first.deletes.as_ref().unwrap().deleted_rows, 3);
    assert_contents(&storage, &manifest, &expected).await;
    let stats = writer.stats();
    assert_eq!(stats.unflushed_rows, 0);
    assert_eq!(stats.segment_rows, expected.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_flushes_in_memory() {
    acknowledged_writes_survive_flushes(memory_storage()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_flushes_on_the_s3_server() {
    if let Some(storage) = s3_storage().await {
        acknowledged_writes_survive_flushes(storage).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_are_refused_and_write_nothing() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = open_writer(&storage, &catalog, 1, manual_config()).await;
    let cases: Vec<(Vec<WalRecord>, &str)> = vec![
        (Vec::new(), "the request has no records"),
        (
            vec![
                upsert(1, 0),
                WalRecord::Upsert {
                    id: PointId::U64(2),
                    vector: vec![1.0; DIM + 1],
                    payload: Vec::new(),
                },
            ],
            "dimension 9, expected 8",
        ),
        (
            vec![WalRecord::Upsert {
                id: PointId::U64(2),
                vector: {
                    let mut v = vector(2, 0);
                    v[3] = f32::NAN;
                    v
                },
                payload: Vec::new(),
            }],
            "non-finite value at position 3",
        ),
        (
            vec![WalRecord::Upsert {
                id: PointId::String("doc".into()),
                vector: vector(2, 0),
                payload: Vec::new(),
            }],
            "is a string, but the collection",
        ),
        (
            vec![WalRecord::Upsert {
                id: PointId::U64(2),
                vector: vector(2, 0),
                payload: b"[1, 2]".to_vec(),
            }],
            "must be a JSON object",
        ),
        (
            vec![WalRecord::Upsert {
                id: PointId::U64(2),
                vector: vector(2, 0),
                payload: b"{not json".to_vec(),
            }],
            "not JSON",
        ),
        (
            vec![WalRecord::Upsert {
                id: PointId::U64(2),
                vector: vector(2, 0),
                payload: format!(r#"{{"text": "{}"}}"#, "x".repeat(64 << 10)).into_bytes(),
            }],
            "has 65548 bytes; the limit is 65536 bytes (max_payload_bytes)",
        ),
        (
            vec![
                delete(1),
                WalRecord::Delete {
                    id: PointId::String("1".into()),
                },
            ],
            "id \"1\" of row 1 is a string",
        ),
    ];
    for (records, message) in cases {
        let error = writer.write(records).await.unwrap_err();
        assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "{error}");
        assert!(
            error.to_string().contains(message),
            "{error} lacks {message:?}"
        );
    }
    assert!(
        storage.list("").await.unwrap().is_empty(),
        "nothing was written"
    );
    assert!(
        catalog
            .manifest(&shard())
            .await
            .unwrap()
            .wal_tail
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_failures_fail_writes_or_are_reconciled() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = open_writer(&storage, &catalog, 1, manual_config()).await;
    writer.write(vec![upsert(1, 0)]).await.unwrap();

    // Refused before applying: the write fails, nothing of it is committed.
    catalog.fail_commits.store(true, Ordering::Relaxed);
    let error = writer.write(vec![upsert(2, 0)]).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::Unavailable, "{error}");
    catalog.fail_commits.store(false, Ordering::Relaxed);

    // The catalog unreachable altogether: the outcome is unknown, the write
    // fails, and the writer refuses writes until it has resynchronised.
    catalog.fail_before.store(true, Ordering::Relaxed);
    let error = writer.write(vec![upsert(20, 0)]).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::Unavailable, "{error}");
    catalog.fail_before.store(false, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match writer.write(vec![upsert(21, 0)]).await {
            Ok(_) => break,
            Err(error) if std::time::Instant::now() < deadline => {
                assert_eq!(error.error_code(), ErrorCode::Unavailable, "{error}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(error) => panic!("writer never recovered: {error}"),
        }
    }

    // Applied but reported as failed: the writer checks the manifest and acks.
    catalog.fail_after.store(true, Ordering::Relaxed);
    let ambiguous = writer.write(vec![upsert(3, 0)]).await;
    catalog.fail_after.store(false, Ordering::Relaxed);
    assert!(ambiguous.is_ok(), "{ambiguous:?}");

    writer.write(vec![upsert(4, 0)]).await.unwrap();
    // Point 20 was refused (never applied); the resync did not invent it.
    let expected: HashMap<u64, u32> = [(1, 0), (3, 0), (4, 0), (21, 0)].into_iter().collect();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
    writer.flush().await.unwrap();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_unflushed_rows_push_back() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let config = IndexerConfig {
        flush_rows: 50,
        max_unflushed_rows: 100,
        ..manual_config()
    };
    let writer = open_writer(&storage, &catalog, 1, config).await;
    // 100 rows reach the limit; the next write is refused until a flush has
    // taken them. The background flush they start may win the race against
    // the next write on a busy machine, so try a few rounds: the limit must
    // push back in one of them.
    let mut refusal = None;
    for round in 0..20u64 {
        writer
            .write((0..100).map(|i| upsert(round * 100 + i, 0)).collect())
            .await
            .unwrap();
        if let Err(error) = writer.write(vec![upsert(100_000 + round, 0)]).await {
            refusal = Some(error);
            break;
        }
    }
    let error = refusal.expect("100 unflushed rows never pushed back");
    assert_eq!(error.error_code(), ErrorCode::ResourceExhausted, "{error}");
    assert!(error.to_string().contains("retry in about"), "{error}");
    writer.flush().await.unwrap();
    writer.write(vec![upsert(200_000, 0)]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unflushed_rows_taking_too_much_memory_push_back() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    // Rows limit far away; 64 KiB of rows is the limit (a flush starts at 16 KiB).
    let config = IndexerConfig {
        commit_max_bytes: 64 << 10,
        max_unflushed_bytes: 64 << 10,
        ..manual_config()
    };
    let writer = open_writer(&storage, &catalog, 1, config).await;
    // 700 rows take more than 64 KiB (each about 96 bytes of entry, a vector
    // and its payload); as above, the flush they start may win a round.
    let mut refusal = None;
    for round in 0..20u64 {
        writer
            .write((0..700).map(|i| upsert(round * 1000 + i, 0)).collect())
            .await
            .unwrap();
        if let Err(error) = writer.write(vec![upsert(100_000 + round, 0)]).await {
            refusal = Some(error);
            break;
        }
    }
    let error = refusal.expect("64 KiB of unflushed rows never pushed back");
    assert_eq!(error.error_code(), ErrorCode::ResourceExhausted, "{error}");
    assert!(error.to_string().contains("max_unflushed_bytes"), "{error}");
    assert!(error.to_string().contains("retry in about"), "{error}");
    writer.flush().await.unwrap();
    writer.write(vec![upsert(200_000, 0)]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_flushes_and_tiered_merges_keep_every_point() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let config = IndexerConfig {
        commit_window_ms: 2,
        flush_interval_ms: 50,
        flush_rows: 100,
        max_unflushed_rows: 100_000,
        merge_factor: 3,
        merge_floor_rows: 50,
        max_segment_rows: 100_000,
        ..IndexerConfig::default()
    };
    let writer = open_writer(&storage, &catalog, 1, config).await;
    let mut expected = HashMap::new();
    for round in 0..12u64 {
        let records: Vec<WalRecord> = (0..120)
            .map(|i| {
                let id = (round * 120 + i) % 700;
                upsert(id, round as u32)
            })
            .chain((0..10).map(|i| delete(round * 37 + i)))
            .collect();
        for record in &records {
            match record {
                WalRecord::Upsert {
                    id: PointId::U64(id),
                    ..
                } => {
                    expected.insert(*id, round as u32);
                }
                WalRecord::Delete {
                    id: PointId::U64(id),
                } => {
                    expected.remove(id);
                }
                _ => unreachable!(),
            }
        }
        writer.write(records).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    }
    // Let the background settle, then compact everything.
    writer.compact().await.unwrap();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
    assert_eq!(manifest.segments.len(), 1, "compaction leaves one segment");
    let segment = &manifest.segments[0];
    assert_eq!(segment.live_rows() as usize, expected.len());
    assert!(segment.deletes.is_none(), "compaction dropped deleted rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_shard_is_consolidated_into_one_segment() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let config = IndexerConfig {
        commit_window_ms: 2,
        flush_interval_ms: 50,
        merge_factor: 8,
        merge_floor_rows: 50,
        consolidate_quiet_ms: 400,
        ..manual_config()
    };
    let writer = open_writer(&storage, &catalog, 1, config).await;
    // Two flushes of different tiers (300 and 100 rows): no tiered merge.
    let mut expected = HashMap::new();
    for (round, rows) in [(0u32, 0..300u64), (1, 300..400)] {
        let records: Vec<WalRecord> = rows.map(|id| upsert(id, round)).collect();
        for record in &records {
            if let WalRecord::Upsert {
                id: PointId::U64(id),
                ..
            } = record
            {
                expected.insert(*id, round);
            }
        }
        writer.write(records).await.unwrap();
        writer.flush().await.unwrap();
    }
    let flushed = catalog.manifest(&shard()).await.unwrap();
    assert_eq!(flushed.segments.len(), 2, "two flushes, two segments");
    // Quiet for 400 ms: merged into one, every point kept.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let manifest = loop {
        let manifest = catalog.manifest(&shard()).await.unwrap();
        if manifest.segments.len() == 1 {
            break manifest;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {} segments after 20 s of quiet",
            manifest.segments.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_contents(&storage, &manifest, &expected).await;
    assert_eq!(manifest.segments[0].rows, 400);
}

/// The codebook (id, trained rows) each segment of `manifest` records, and the
/// default probe of its entry (`default_nprobe`, `probe_ratio_milli`).
async fn codebooks(
    storage: &Storage,
    manifest: &quiver_indexer::Manifest,
) -> Vec<(u32, quiver_index::CodebookInfo, (Option<u32>, Option<u32>))> {
    let mut found = Vec::new();
    for entry in &manifest.segments {
        let bytes = storage.get(&entry.key).await.unwrap();
        let segment =
            quiver_index::Segment::open(quiver_index::MemorySource::new(&entry.key, &bytes))
                .unwrap();
        let codebook = segment
            .header()
            .codebook
            .expect("new segments record a codebook");
        found.push((
            entry.rows,
            codebook,
            (entry.default_nprobe, entry.probe_ratio_milli),
        ));
    }
    found.sort_by_key(|(rows, _, _)| *rows);
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_share_the_shard_codebook_until_a_merge_outgrows_it() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = open_writer(&storage, &catalog, 1, manual_config()).await;
    // The first flush trains the codebook on its 300 rows.
    writer
        .write((0..300).map(|id| upsert(id, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    // Later flushes (up to twice the trained rows) join its lists.
    for round in 1..4u64 {
        writer
            .write((0..200).map(|i| upsert(round * 1000 + i, 0)).collect())
            .await
            .unwrap();
        assert!(writer.flush().await.unwrap());
    }
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let found = codebooks(&storage, &manifest).await;
    assert_eq!(found.len(), 4);
    let first = found.iter().find(|(rows, _, _)| *rows == 300).unwrap();
    assert_eq!(first.1.trained_rows, 300);
    // Calibrated when it was trained: a probe recorded — a distance ratio, or a
    // count of lists when no ratio within half of these 300 lattice rows' four
    // lists reaches the target (the order the rows arrive in decides; the
    // calibration's own tests cover both).
    assert!(first.2.0.is_some(), "default probe {:?}", first.2);
    for (rows, codebook, _) in &found {
        assert_eq!(
            codebook.id, first.1.id,
            "segment of {rows} rows has another codebook"
        );
    }
    // Compacting 900 rows (over twice 300) trains the next codebook on them.
    writer.compact().await.unwrap();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let merged = codebooks(&storage, &manifest).await;
    assert_eq!(merged.len(), 1);
    assert_ne!(merged[0].1.id, first.1.id);
    assert_eq!(merged[0].1.trained_rows, 900);
    drop(writer);

    // A writer opened again (recovery) keeps building with that codebook.
    let writer = open_writer(&storage, &catalog, 2, manual_config()).await;
    writer
        .write((0..100).map(|i| upsert(50_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let after = codebooks(&storage, &manifest).await;
    assert_eq!(after.len(), 2);
    assert!(
        after
            .iter()
            .all(|(_, codebook, _)| codebook.id == merged[0].1.id),
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_left_under_an_older_codebook_are_merged_into_the_current_one() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    // Without codebook maintenance: a 300-row flush trains codebook 1, a 700-row
    // flush (over twice 300) trains codebook 2 — two groups to search.
    let writer = open_writer(&storage, &catalog, 1, manual_config()).await;
    writer
        .write((0..300).map(|id| upsert(id, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    writer
        .write((0..700).map(|i| upsert(10_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let before = codebooks(&storage, &manifest).await;
    assert_eq!(before.len(), 2);
    assert_ne!(before[0].1.id, before[1].1.id, "{before:?}");
    let current = before[1].1;
    assert_eq!(current.trained_rows, 700);
    drop(writer);

    // The next holder maintains codebooks: 1,000 rows are not over twice the 700
    // of the current codebook (no refresh), but the 300-row segment of the older
    // codebook is re-encoded with the current one, in the background.
    let config = IndexerConfig {
        codebook_refresh: true,
        // The merge loop looks at the shard at this interval.
        flush_interval_ms: 200,
        ..manual_config()
    };
    let writer = open_writer(&storage, &catalog, 2, config).await;
    writer
        .write((0..10).map(|i| upsert(20_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let manifest = catalog.manifest(&shard()).await.unwrap();
        let found = codebooks(&storage, &manifest).await;
        if found
            .iter()
            .all(|(_, codebook, _)| codebook.id == current.id)
        {
            let rows: u32 = found.iter().map(|(rows, _, _)| rows).sum();
            assert_eq!(rows, 1_010, "{found:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still under several codebooks: {found:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let expected: HashMap<u64, u32> = (0..300)
        .chain(10_000..10_700)
        .chain(20_000..20_010)
        .map(|id| (id, 0))
        .collect();
    assert_contents(&storage, &manifest, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_after_the_codebooks_group_doubled_record_probes_calibrated_over_it() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    // A shard past `max_segment_rows` (no refresh retrains its codebook), scaled
    // down: segments of at most 400 rows.
    let config = IndexerConfig {
        max_segment_rows: 400,
        merge_floor_rows: 100,
        ..manual_config()
    };
    let writer = open_writer(&storage, &catalog, 1, config.clone()).await;
    // Every segment records probes calibrated over `rows` rows of its group.
    let assert_all_calibrated_over = |manifest: &quiver_indexer::Manifest, rows: u64| {
        let found: Vec<(u32, Option<u64>, Option<u32>)> = manifest
            .segments
            .iter()
            .map(|entry| (entry.rows, entry.calibrated_rows, entry.default_nprobe))
            .collect();
        assert!(
            found
                .iter()
                .all(|(_, calibrated, nprobe)| *calibrated == Some(rows) && nprobe.is_some()),
            "{found:?}"
        );
        found.len()
    };
    // The first flush trains the codebook and calibrates it on its 300 rows.
    writer
        .write((0..300).map(|id| upsert(id, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    // 250 more share it: 550 rows, under twice 300, so no recalibration.
    writer
        .write((0..250).map(|i| upsert(1_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    assert!(!writer.recalibrating(), "550 rows are not twice 300");
    assert_all_calibrated_over(&catalog.manifest(&shard()).await.unwrap(), 300);
    // 150 more make 700, over twice 300: the group is calibrated again, in
    // the background, and what that found is recorded on every member at once
    // (searchers use it without waiting for a flush), then by later flushes.
    writer
        .write((0..150).map(|i| upsert(2_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while writer.recalibrating() {
        assert!(
            std::time::Instant::now() < deadline,
            "the recalibration did not end"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_all_calibrated_over(&catalog.manifest(&shard()).await.unwrap(), 700);
    writer
        .write((0..100).map(|i| upsert(3_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_eq!(assert_all_calibrated_over(&manifest, 700), 4);
    drop(writer);

    // A writer opened again takes the codebook with its newest calibration:
    // its next flush records it too.
    let writer = open_writer(&storage, &catalog, 2, config).await;
    writer
        .write((0..50).map(|i| upsert(4_000 + i, 0)).collect())
        .await
        .unwrap();
    assert!(writer.flush().await.unwrap());
    let manifest = catalog.manifest(&shard()).await.unwrap();
    let reopened = manifest.segments.iter().find(|entry| entry.rows == 50);
    assert_eq!(
        reopened.and_then(|entry| entry.calibrated_rows),
        Some(700),
        "{:?}",
        manifest.segments
    );
}
