//! A new lease holder rebuilds from the manifest and the WAL tail; the old one
//! is fenced.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_indexer::{Catalog, MemoryCatalog};
use quiver_proto::{ErrorCode, ServiceError};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_replays_the_tail_and_fences_the_old_writer() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let old = open_writer(&storage, &catalog, 1, manual_config()).await;
    let mut expected = HashMap::new();
    old.write((0..300).map(|id| upsert(id, 0)).collect())
        .await
        .unwrap();
    old.flush().await.unwrap();
    // Acknowledged but only in the WAL tail when the lease moves.
    old.write(vec![upsert(5, 1), delete(6), upsert(1000, 0)])
        .await
        .unwrap();
    for id in 0..300 {
        expected.insert(id, 0);
    }
    expected.insert(5, 1);
    expected.remove(&6);
    expected.insert(1000, 0);

    let new = open_writer(&storage, &catalog, 2, manual_config()).await;
    let error = old.write(vec![upsert(7, 9)]).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::FailedPrecondition, "{error}");
    assert!(error.to_string().contains("taken over"), "{error}");
    assert!(old.flush().await.is_err(), "a fenced writer cannot flush");

    let stats = new.stats();
    assert_eq!(stats.unflushed_rows, 3, "the tail was replayed");
    new.write(vec![upsert(8, 2)]).await.unwrap();
    expected.insert(8, 2);
    new.flush().await.unwrap();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert!(manifest.wal_tail.is_empty());
    assert_contents(&storage, &manifest, &expected).await;

    // A third writer rebuilds the primary keys from the segments alone: its
    // replacement deletes the right older copy.
    new.close().await;
    let third = open_writer(&storage, &catalog, 3, manual_config()).await;
    third
        .write(vec![upsert(5, 3), upsert(8, 3), delete(0)])
        .await
        .unwrap();
    third.flush().await.unwrap();
    expected.insert(5, 3);
    expected.insert(8, 3);
    expected.remove(&0);
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
    drop(old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_restarted_under_the_same_epoch_never_reuses_a_sequence() {
    let storage = memory_storage();
    let catalog = Arc::new(MemoryCatalog::default());
    let first = open_writer(&storage, &catalog, 1, manual_config()).await;
    first.write(vec![upsert(1, 0)]).await.unwrap();
    first.write(vec![upsert(2, 0)]).await.unwrap();
    first.flush().await.unwrap();
    first.close().await;
    // Same node, same lease epoch (a process restart): the tail is empty, but
    // the catalog remembers the last position.
    let second = open_writer(&storage, &catalog, 1, manual_config()).await;
    let position = second.write(vec![upsert(3, 0)]).await.unwrap();
    assert_eq!((position.epoch, position.sequence), (1, 3));
    second.flush().await.unwrap();
    let expected: HashMap<u64, u32> = [(1, 0), (2, 0), (3, 0)].into_iter().collect();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert_contents(&storage, &manifest, &expected).await;
}
