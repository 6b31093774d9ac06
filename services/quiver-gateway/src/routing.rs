//! Where each shard lives: the routing table from the metadata service (kept
//! fresh in the background, re-read on demand and linearizably for strong
//! reads), and gRPC channels to the indexers and searchers it names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use quiver_meta_client::MetaClient;
use quiver_proto::RpcChannel;
use quiver_proto::meta as pb;
use quiver_proto::tls::{ClusterTls, connect_lazy};
use tonic::transport::{Channel, Endpoint};

use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;
use crate::read_rounds::SharedRounds;

/// One shard's current placement.
#[derive(Clone, Debug)]
pub struct ShardPlacement {
    /// Shard number.
    pub shard: u32,
    /// Address of the indexer holding the lease, if any.
    pub indexer: Option<(String, String, u64)>,
    /// Searchers `(node id, address, ready)`.
    pub searchers: Vec<(String, String, bool)>,
    /// The manifest version meta reported.
    pub manifest_version: u64,
}

/// A collection and its shards. Only collections that meta sent with their spec
/// get a route (the spec holds the name the table is keyed by), so the spec is
/// kept beside the collection rather than looked up in it each time.
#[derive(Clone, Debug)]
pub struct CollectionRoute {
    pub collection: pb::Collection,
    spec: pb::CollectionSpec,
    pub shards: Vec<ShardPlacement>,
}

impl CollectionRoute {
    /// Returns the collection's spec.
    pub fn spec(&self) -> &pb::CollectionSpec {
        &self.spec
    }
}

/// The routing table and the channels of the gateway.
pub struct Router {
    meta: MetaClient,
    table: RwLock<HashMap<String, Arc<CollectionRoute>>>,
    /// Linearizable reads of one collection's route, shared by concurrent callers.
    strong_rounds: SharedRounds<Arc<CollectionRoute>>,
    channels: Mutex<HashMap<String, Channel>>,
    next_replica: AtomicUsize,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Mutual TLS with the cluster CA on the channels (none: plaintext).
    cluster_tls: Option<ClusterTls>,
}

fn build_routes(routing: &pb::GetRoutingResponse) -> HashMap<String, Arc<CollectionRoute>> {
    let nodes: HashMap<&str, &pb::NodeInfo> = routing
        .nodes
        .iter()
        .map(|node| (node.node_id.as_str(), node))
        .collect();
    let alive = |node_id: &str| -> Option<String> {
        let node = nodes.get(node_id)?;
        (node.state == pb::NodeState::Alive as i32 || node.state == pb::NodeState::Draining as i32)
            .then(|| node.address.clone())
    };
    let mut routes = HashMap::new();
    for collection in &routing.collections {
        let Some(spec) = &collection.spec else {
            // Requests for it answer NOT_FOUND; say why in the log.
            tracing::warn!(
                collection_id = collection.collection_id,
                "meta sent a collection without its spec; it is left out of the routing table"
            );
            continue;
        };
        let mut shards: Vec<ShardPlacement> = routing
            .shards
            .iter()
            .filter(|shard| {
                shard
                    .shard
                    .as_ref()
                    .is_some_and(|reference| reference.collection_id == collection.collection_id)
            })
            .map(|shard| ShardPlacement {
                shard: shard.shard.as_ref().map_or(0, |reference| reference.shard),
                indexer: shard.lease.as_ref().and_then(|lease| {
                    alive(&lease.holder).map(|address| (lease.holder.clone(), address, lease.epoch))
                }),
                searchers: shard
                    .searchers
                    .iter()
                    .filter_map(|searcher| {
                        alive(&searcher.node_id)
                            .map(|address| (searcher.node_id.clone(), address, searcher.ready))
                    })
                    .collect(),
                manifest_version: shard.manifest_version,
            })
            .collect();
        shards.sort_by_key(|shard| shard.shard);
        routes.insert(
            spec.name.clone(),
            Arc::new(CollectionRoute {
                collection: collection.clone(),
                spec: spec.clone(),
                shards,
            }),
        );
    }
    routes
}

impl Router {
    /// Returns a router reading from `meta`, calling nodes with `request_timeout`
    /// (over mutual TLS with `cluster_tls`).
    pub fn new(
        meta: MetaClient,
        request_timeout: Duration,
        cluster_tls: Option<ClusterTls>,
    ) -> Self {
        Router {
            meta,
            table: RwLock::new(HashMap::new()),
            strong_rounds: SharedRounds::new(),
            channels: Mutex::new(HashMap::new()),
            next_replica: AtomicUsize::new(0),
            connect_timeout: Duration::from_secs(2),
            request_timeout,
            cluster_tls,
        }
    }

    /// Returns the metadata client.
    pub fn meta(&self) -> &MetaClient {
        &self.meta
    }

    /// Re-reads the whole routing table.
    pub async fn refresh(&self) -> GatewayResult<()> {
        let routing = self.meta.get_routing("", false).await?;
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = build_routes(&routing);
        Ok(())
    }

    /// Returns the route of `name`, from the table or meta.
    pub async fn route(&self, name: &str) -> GatewayResult<Arc<CollectionRoute>> {
        if let Some(route) = self.cached(name) {
            return Ok(route);
        }
        self.refresh().await?;
        self.cached(name)
            .ok_or_else(|| GatewayError::not_found(format!("collection `{name}` does not exist")))
    }

    /// Returns the route of `name` as meta has it right now (Raft read-index):
    /// manifest versions at least as new as every write acknowledged before this
    /// call. Concurrent callers share one round (see `read_rounds`).
    pub async fn route_linearizable(&self, name: &str) -> GatewayResult<Arc<CollectionRoute>> {
        let route = self
            .strong_rounds
            .join(name, || {
                let meta = self.meta.clone();
                let name = name.to_string();
                async move {
                    let routing = meta.get_routing(&name, true).await?;
                    build_routes(&routing).remove(&name).ok_or_else(|| {
                        GatewayError::not_found(format!("collection `{name}` does not exist"))
                    })
                }
            })
            .await?;
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), route.clone());
        Ok(route)
    }

    /// Forgets `name` (after a drop).
    pub fn forget(&self, name: &str) {
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    fn cached(&self, name: &str) -> Option<Arc<CollectionRoute>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Timeout of one call to an indexer or searcher.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Returns the way to the searcher at `address`: its service when it runs
    /// in this process (`quiver standalone`), else a channel.
    pub fn searcher_channel(&self, address: &str) -> GatewayResult<RpcChannel> {
        let channel = RpcChannel::to(address, self.request_timeout, || self.channel(address))?;
        self.count_searcher_call(channel.is_local());
        Ok(channel)
    }

    /// Counts a call to a searcher, in this process or over the network.
    pub fn count_searcher_call(&self, local: bool) {
        let path = if local { "local" } else { "remote" };
        METRICS.searcher_calls.with_label_values(&[path]).inc();
    }

    /// Returns a channel to `address` (created lazily, reused).
    pub fn channel(&self, address: &str) -> GatewayResult<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|error| {
                GatewayError::unavailable(format!("bad node address `{address}`: {error}"))
            })?
            .connect_timeout(self.connect_timeout)
            .timeout(self.request_timeout)
            .tcp_nodelay(true);
        let channel = connect_lazy(endpoint, self.cluster_tls.as_ref());
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Re-reads the routing table until shard `shard` of collection `name` has
    /// a searcher at an address not in `tried`, for at most `wait`, and returns
    /// those searchers in the order to try them (none when the wait ran out). A
    /// shard meta has not placed yet (a collection just created, a searcher just
    /// replaced) gets one within the control loop's interval; a restarted
    /// searcher's new address appears once it has registered.
    pub async fn wait_for_searchers(
        &self,
        name: &str,
        shard: u32,
        wait: Duration,
        tried: &[String],
    ) -> Vec<String> {
        let deadline = Instant::now() + wait;
        let mut delay = Duration::from_millis(20);
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Vec::new();
            }
            tokio::time::sleep(delay.min(remaining)).await;
            delay = (delay * 2).min(Duration::from_millis(200));
            if self.refresh().await.is_err() {
                continue;
            }
            let placement = self.cached(name).and_then(|route| {
                route
                    .shards
                    .iter()
                    .find(|placement| placement.shard == shard)
                    .cloned()
            });
            if let Some(placement) = placement {
                let order: Vec<String> = self
                    .searcher_order(&placement)
                    .into_iter()
                    .filter(|address| !tried.contains(address))
                    .collect();
                if !order.is_empty() {
                    return order;
                }
            }
        }
    }

    /// Returns the ready searchers of `placement` in the order to try them
    /// (rotated per call so load spreads over replicas).
    pub fn searcher_order(&self, placement: &ShardPlacement) -> Vec<String> {
        let mut ready: Vec<String> = placement
            .searchers
            .iter()
            .filter(|(_, _, ready)| *ready)
            .map(|(_, address, _)| address.clone())
            .collect();
        if ready.is_empty() {
            // None reported ready yet: any assigned searcher will load on demand.
            ready = placement
                .searchers
                .iter()
                .map(|(_, address, _)| address.clone())
                .collect();
        }
        if !ready.is_empty() {
            let start = self.next_replica.fetch_add(1, Ordering::Relaxed) % ready.len();
            ready.rotate_left(start);
        }
        ready
    }
}
