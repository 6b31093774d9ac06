//! Helpers of the tests that start roles in this process: object stores (the S3
//! server, memory), a searcher's read context, a one-node metadata service, an
//! indexer that moves only when the test writes, a searcher, a gateway and a
//! REST client for it, a one-shard collection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quiver_gateway::{GatewayConfig, GatewayServer};
use quiver_indexer::{IndexerNode, IndexerNodeConfig};
use quiver_meta_client::MetaClient;
use quiver_proto::data;
use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::meta as pb;
use quiver_searcher::{ReadContext, SearcherNode, SearcherNodeConfig};
use quiver_storage::testing::{FaultConfig, FaultProxy};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};
use quiver_test_support::S3TestServer;
use serde_json::Value;

/// A fresh bucket of the S3 server: its storage (keys under `key_prefix`), a
/// fault proxy in front of the server (no faults yet), and the same storage
/// through that proxy — for a searcher whose store the test slows or breaks
/// while the indexer writes at full speed.
pub async fn store_and_proxied(
    server: &S3TestServer,
    bucket_prefix: &str,
    key_prefix: &str,
) -> (Storage, FaultProxy, Storage) {
    let bucket = server.create_bucket(bucket_prefix).await;
    let storage = server.storage(&bucket, key_prefix, StorageOptions::default());
    let proxy = FaultProxy::start(server.endpoint(), FaultConfig::none())
        .await
        .unwrap();
    let proxied = server.storage_via(
        &proxy.endpoint(),
        &bucket,
        key_prefix,
        StorageOptions::default(),
    );
    (storage, proxy, proxied)
}

/// Writes `records` to `shard` through `indexer`, retrying for up to 30 s
/// while it refuses them (it may still be opening the shard).
pub async fn write_until_accepted(
    indexer: &mut IndexerClient<tonic::transport::Channel>,
    shard: pb::ShardRef,
    records: Vec<data::WriteRecord>,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match indexer
            .write(data::WriteRequest {
                shard: Some(shard),
                records: records.clone(),
            })
            .await
        {
            Ok(_) => return,
            Err(status) if std::time::Instant::now() < deadline => {
                tracing::debug!(%status, "write not accepted yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("write failed: {status}"),
        }
    }
}

/// A one-node metadata service keeping its data in `directory`, and a client.
pub async fn single_meta(directory: &Path) -> (quiver_meta::MetaServer, MetaClient) {
    let meta = quiver_meta::run_single_node(directory, "127.0.0.1:0")
        .await
        .unwrap();
    let client = MetaClient::connect([meta.local_address().to_string()]).unwrap();
    (meta, client)
}

/// An indexer under [`manual_config`] writing to `storage`, and its address.
pub async fn manual_indexer(
    node_id: &str,
    meta: &MetaClient,
    storage: &Storage,
) -> (IndexerNode, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut config = IndexerNodeConfig::new(node_id, &address);
    config.indexer = manual_config();
    config.heartbeat_interval = Duration::from_millis(200);
    let indexer = IndexerNode::start(config, listener, meta.clone(), storage.clone())
        .await
        .unwrap();
    // Registered before the caller creates a collection, so that the create
    // gives it the shard's lease at once (not at the control loop's next pass).
    wait_until(node_id, || indexer.is_ready()).await;
    (indexer, address)
}

/// A searcher reading through `read_context` (heartbeats every 200 ms, then
/// `configure`), and its address.
pub async fn searcher_node(
    node_id: &str,
    meta: &MetaClient,
    read_context: Arc<ReadContext>,
    configure: impl FnOnce(&mut SearcherNodeConfig),
) -> (SearcherNode, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut config = SearcherNodeConfig::new(node_id, &address);
    config.heartbeat_interval = Duration::from_millis(200);
    configure(&mut config);
    let searcher = SearcherNode::start(config, listener, meta.clone(), read_context)
        .await
        .unwrap();
    // Registered (and synced) before the caller creates a collection, so that
    // the create assigns it the shards at once: a search sent straight to it
    // right after would otherwise race the control loop's next pass.
    wait_until(node_id, || searcher.is_ready()).await;
    (searcher, address)
}

/// Waits (30 s at most) until `node_id` says it is ready.
async fn wait_until(node_id: &str, ready: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "`{node_id}` did not register with meta within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates a one-shard collection and returns its shard.
pub async fn one_shard_collection(
    meta: &MetaClient,
    name: &str,
    dimension: usize,
    metric: pb::Metric,
) -> pb::ShardRef {
    let created = meta
        .create_collection(pb::CollectionSpec {
            name: name.into(),
            dimension: dimension as u32,
            metric: metric as i32,
            shards: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    pb::ShardRef {
        collection_id: created.collection.unwrap().collection_id,
        shard: 0,
    }
}

/// The S3 server's storage (a fresh bucket named from `bucket_prefix`, keys under
/// `key_prefix`), or `None` (a visible skip) without one; under CI a missing server fails.
pub async fn s3_storage(bucket_prefix: &str, key_prefix: &str) -> Option<Storage> {
    let server = quiver_test_support::S3TestServer::from_env("this in-process cluster test")?;
    Some(server.fresh_storage(bucket_prefix, key_prefix).await)
}

/// An in-memory object store.
pub fn memory_storage() -> Storage {
    Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap()
}

/// Indexer settings under which nothing flushes or merges on its own.
pub fn manual_config() -> quiver_indexer::IndexerConfig {
    quiver_indexer::IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 1000,
        codebook_refresh: false,
        consolidate_quiet_ms: 0,
        ..quiver_indexer::IndexerConfig::default()
    }
}

/// A searcher's read context over `storage`, its cache in `directory` with
/// 256 regions of `region_bytes`.
pub fn context(
    storage: &Storage,
    directory: &std::path::Path,
    region_bytes: u64,
) -> Arc<ReadContext> {
    let cache = quiver_blobcache::BlobCache::new(
        &quiver_blobcache::BlobCacheConfig {
            directory: directory.to_path_buf(),
            capacity_bytes: 256 * region_bytes,
            region_bytes,
            map_local_files: true,
            row_region_bytes: 0,
        },
        storage.clone(),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    Arc::new(ReadContext::new(
        Arc::new(cache),
        storage.clone(),
        tokio::runtime::Handle::current(),
    ))
}

/// Returns the sum of a counter's series in this process.
pub fn counter(name: &str) -> f64 {
    prometheus::gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric())
        .map(|metric| metric.get_counter().get_value())
        .sum()
}

/// A REST client of one gateway.
#[derive(Clone)]
pub struct Rest {
    pub base: String,
    pub client: reqwest::Client,
}

impl Rest {
    /// Sends `body` (if any) with `method` to `path`; returns the status and
    /// the JSON answer (`null` when it is not JSON).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let mut request = match method {
            "GET" => self.client.get(url),
            "PUT" => self.client.put(url),
            _ => self.client.post(url),
        };
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// A gateway named `node_id` on free ports, and a REST client of it.
pub async fn gateway_node(node_id: &str, meta: &MetaClient) -> (GatewayServer, Rest) {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rest = Rest {
        base: format!("http://{}", http.local_addr().unwrap()),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
    };
    let gateway = GatewayServer::start(
        GatewayConfig::new(node_id),
        http,
        grpc,
        meta.clone(),
        axum::Router::new(),
    )
    .await
    .unwrap();
    (gateway, rest)
}
