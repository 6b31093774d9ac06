//! A property of the write path and the garbage collector together: over random
//! interleavings of upserts, deletes, flushes, merges, GC runs and the passing of
//! time, GC never deletes an object the current manifest references, nor one an
//! older manifest references while a reader may still hold that manifest (until
//! the grace period after it was replaced) — and every object the current
//! manifest references exists after every step, with the shard's contents equal
//! to the acknowledged writes.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use quiver_indexer::{
    Catalog, IndexerConfig, Manifest, MemoryCatalog, collect_garbage, manifest_keys,
};

use crate::support::{assert_contents, delete, memory_storage, open_writer, shard, upsert};

const GRACE_MS: u64 = 1_000;

#[derive(Clone, Debug)]
enum Step {
    Upsert(Vec<u64>),
    Delete(Vec<u64>),
    Flush,
    Merge,
    Gc,
    Tick(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => proptest::collection::vec(0..40u64, 1..12).prop_map(Step::Upsert),
        1 => proptest::collection::vec(0..40u64, 1..6).prop_map(Step::Delete),
        2 => Just(Step::Flush),
        1 => Just(Step::Merge),
        2 => Just(Step::Gc),
        2 => (0..2 * GRACE_MS).prop_map(Step::Tick),
    ]
}

/// A manifest a reader may hold: readable until `replaced_at + GRACE_MS`.
struct Held {
    keys: BTreeSet<String>,
    replaced_at: Option<u64>,
    version: u64,
}

async fn existing(storage: &quiver_storage::Storage) -> BTreeSet<String> {
    storage
        .list("collections")
        .await
        .unwrap()
        .into_iter()
        .map(|object| object.key)
        .collect()
}

async fn run(steps: Vec<Step>) {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    catalog.gc_grace_ms.store(GRACE_MS, Ordering::Relaxed);
    let config = IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 2,
        merge_floor_rows: 1,
        ..IndexerConfig::default()
    };
    let writer = open_writer(&storage, &catalog, 1, config).await;
    let mut expected: HashMap<u64, u32> = HashMap::new();
    let mut version = 0u32;
    let mut held: Vec<Held> = Vec::new();
    for step in steps {
        match &step {
            Step::Upsert(ids) => {
                version += 1;
                writer
                    .write(ids.iter().map(|id| upsert(*id, version)).collect())
                    .await
                    .unwrap();
                for id in ids {
                    expected.insert(*id, version);
                }
            }
            Step::Delete(ids) => {
                writer
                    .write(ids.iter().map(|id| delete(*id)).collect())
                    .await
                    .unwrap();
                for id in ids {
                    expected.remove(id);
                }
            }
            Step::Flush => {
                writer.flush().await.unwrap();
            }
            Step::Merge => {
                writer.compact().await.unwrap();
            }
            Step::Gc => {
                let current = manifest_keys(&catalog.manifest(&shard()).await.unwrap());
                let due: Vec<String> = catalog
                    .gc_entries()
                    .into_iter()
                    .filter(|(_, at)| *at <= catalog.now_ms.load(Ordering::Relaxed))
                    .map(|(key, _)| key)
                    .collect();
                for key in &due {
                    assert!(!current.contains(key), "{key} is due for GC but referenced");
                }
                let deleted = collect_garbage(catalog.as_ref(), &storage, 1_000)
                    .await
                    .unwrap();
                assert_eq!(deleted, due.len());
            }
            Step::Tick(ms) => {
                catalog.now_ms.fetch_add(*ms, Ordering::Relaxed);
            }
        }
        // Readers: the manifest now, and every one replaced within the grace period.
        let now = catalog.now_ms.load(Ordering::Relaxed);
        let manifest: Manifest = catalog.manifest(&shard()).await.unwrap();
        if held
            .last()
            .is_none_or(|last| last.version != manifest.version)
        {
            if let Some(last) = held.last_mut() {
                last.replaced_at = Some(now);
            }
            held.push(Held {
                keys: manifest_keys(&manifest),
                replaced_at: None,
                version: manifest.version,
            });
        }
        held.retain(|reader| reader.replaced_at.is_none_or(|at| now < at + GRACE_MS));
        let present = existing(&storage).await;
        for reader in &held {
            for key in &reader.keys {
                assert!(
                    present.contains(key),
                    "after {step:?}: {key} of manifest version {} (replaced at {:?}, now {now}) is gone",
                    reader.version,
                    reader.replaced_at
                );
            }
        }
    }
    // Nothing acknowledged was lost along the way.
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
    writer.close().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn gc_never_deletes_what_a_reader_may_still_read(steps in proptest::collection::vec(step(), 1..30)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run(steps));
    }
}
