//! The write path through a fault-injecting proxy in front of the S3 server: with
//! a share of requests answered 503, reset, stalled, or cut off midway, every
//! write either succeeds (object_store retried) or fails with an error naming the
//! object and is not acknowledged; afterwards the shard holds exactly the
//! acknowledged writes. With every PUT failing, writes and flushes fail cleanly
//! and the shard carries on once the store is back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use quiver_indexer::{Catalog, MemoryCatalog};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_storage::testing::{Fault, FaultConfig, FaultProxy};
use quiver_storage::{Storage, StorageOptions};
use quiver_test_support::S3TestServer;

use crate::support::{assert_contents, manual_config, open_writer, shard, upsert};

/// Storage through `proxy` (short timeouts, few retries) and straight to the
/// server, on one fresh bucket.
async fn stores(proxy_for: &str) -> Option<(FaultProxy, Storage, Storage)> {
    let server = S3TestServer::from_env(proxy_for)?;
    let bucket = server.create_bucket("quiver-faults").await;
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let options = StorageOptions {
        operation_timeout: Duration::from_secs(4),
        request_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(500),
        max_retries: 3,
        initial_backoff: Duration::from_millis(20),
        ..StorageOptions::default()
    };
    let faulty = server.storage_via(&proxy.endpoint(), &bucket, "faults", options);
    let direct = server.storage(&bucket, "faults", StorageOptions::default());
    Some((proxy, faulty, direct))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_faulty_store_are_acknowledged_only_when_durable() {
    let Some((proxy, faulty, direct)) = stores("the write-fault test").await else {
        return;
    };
    let catalog = Arc::new(MemoryCatalog::default());
    let writer = open_writer(&faulty, &catalog, 1, manual_config()).await;
    // The write path only PUTs (the bodies that can be cut are on reads).
    let mut stall = FaultConfig::new(0.4, &[Fault::ServerError, Fault::Reset, Fault::Stall]);
    stall.stall = Duration::from_secs(2);
    proxy.set_config(stall);

    let mut acknowledged: HashMap<u64, u32> = HashMap::new();
    let mut failures = Vec::new();
    for batch in 0..24u64 {
        let ids: Vec<u64> = (batch * 5..batch * 5 + 5).collect();
        match writer
            .write(ids.iter().map(|id| upsert(*id, 1)).collect())
            .await
        {
            Ok(_) => {
                for id in ids {
                    acknowledged.insert(id, 1);
                }
            }
            Err(error) => failures.push(error),
        }
        if batch % 8 == 7 {
            // A flush may fail too; its rows stay in memory and in the WAL tail.
            if let Err(error) = writer.flush().await {
                assert_eq!(error.error_code(), ErrorCode::Unavailable, "{error}");
                assert!(error.to_string().contains("collections/"), "{error}");
            }
        }
    }
    for error in &failures {
        assert_eq!(error.error_code(), ErrorCode::Unavailable, "{error}");
        assert!(
            error.to_string().contains("/wal/"),
            "the error names the WAL object: {error}"
        );
    }
    let injected = proxy.stats();
    eprintln!(
        "faults injected: {injected:?}; {} of 24 writes failed",
        failures.len()
    );
    for fault in [Fault::ServerError, Fault::Reset, Fault::Stall] {
        assert!(
            injected
                .injected
                .iter()
                .any(|(name, count)| *name == fault.name() && *count > 0),
            "no {} injected: {injected:?}",
            fault.name()
        );
    }
    assert!(
        acknowledged.len() >= 60,
        "retries carried most writes through: {} acknowledged, failures {failures:?}",
        acknowledged.len()
    );

    // Every PUT refused: writes and flushes fail, nothing is acknowledged.
    proxy.set_config(FaultConfig::none());
    writer.write(vec![upsert(500, 1)]).await.unwrap();
    acknowledged.insert(500, 1);
    proxy.set_config(FaultConfig::new(1.0, &[Fault::ServerError]).only_methods(&["PUT"]));
    let refused = writer.write(vec![upsert(1000, 1)]).await.unwrap_err();
    assert_eq!(refused.error_code(), ErrorCode::Unavailable, "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("/wal/") && message.contains("503"),
        "{message}"
    );
    let flush = writer.flush().await.unwrap_err();
    assert_eq!(flush.error_code(), ErrorCode::Unavailable, "{flush}");
    assert!(flush.to_string().contains("/segments/"), "{flush}");

    // The store back: the shard carries on and holds exactly what was acknowledged.
    proxy.set_config(FaultConfig::none());
    writer.write(vec![upsert(2000, 2)]).await.unwrap();
    acknowledged.insert(2000, 2);
    writer.flush().await.unwrap();
    let manifest = catalog.manifest(&shard()).await.unwrap();
    assert!(manifest.wal_tail.is_empty());
    assert_contents(&direct, &manifest, &acknowledged).await;
    writer.close().await;
}
