//! Where each shard lives: the routing table from the metadata service (kept
//! fresh in the background, re-read on demand and linearizably for strong
//! reads), and gRPC channels to the indexers and searchers it names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// Meta's default heartbeat silence before a node is declared dead
/// (`node_timeout_ms`) plus its control loop interval: how long a shard of a
/// dead searcher waits for its move, when meta does not say (an older meta).
const DEFAULT_MOVE_AFTER: Duration = Duration::from_millis(10_000 + 1_000);

/// The shortest retry hint of a read whose searchers are unreachable: once
/// the move is due, clients come back after this (the gateway learns the new
/// placement within its routing interval).
const MIN_UNREACHABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A warning about an unreachable searcher is logged at most once per
/// searcher and cause in this interval (not once per request).
const UNREACHABLE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// An unreachable searcher is forgotten after this long without news (its
/// address is gone from the routing table, or it answered).
const UNREACHABLE_FORGET_AFTER: Duration = Duration::from_secs(600);

/// A searcher this gateway could not reach, since when, and when each cause
/// was last logged.
struct UnreachableSearcher {
    since: Instant,
    last_failure: Instant,
    logged: HashMap<String, Instant>,
}

/// Returns the retry hint of a read whose searcher has been unreachable for
/// `unreachable_for`: the time left until meta, which moves a silent node's
/// shards `move_after` after its last heartbeat (at the latest, since the
/// gateway saw it fail after that heartbeat), has moved the shard; at least
/// [`MIN_UNREACHABLE_RETRY_AFTER`].
pub(crate) fn unreachable_retry_after(move_after: Duration, unreachable_for: Duration) -> Duration {
    move_after
        .saturating_sub(unreachable_for)
        .max(MIN_UNREACHABLE_RETRY_AFTER)
}

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
    /// How long after a searcher's last heartbeat meta moves its shards
    /// (meta's node timeout + control interval, from the routing table).
    move_after_ms: AtomicU64,
    /// Searchers that could not be reached, by address.
    unreachable: Mutex<HashMap<String, UnreachableSearcher>>,
    /// Whether `unreachable` may hold anything (spares a lock per answer).
    any_unreachable: AtomicBool,
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
            move_after_ms: AtomicU64::new(DEFAULT_MOVE_AFTER.as_millis() as u64),
            unreachable: Mutex::new(HashMap::new()),
            any_unreachable: AtomicBool::new(false),
        }
    }

    /// Returns the metadata client.
    pub fn meta(&self) -> &MetaClient {
        &self.meta
    }

    /// Re-reads the whole routing table.
    pub async fn refresh(&self) -> GatewayResult<()> {
        let routing = self.meta.get_routing("", false).await?;
        if routing.node_timeout_ms > 0 {
            let move_after_ms = routing.node_timeout_ms + routing.control_interval_ms;
            self.move_after_ms.store(move_after_ms, Ordering::Relaxed);
        }
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = build_routes(&routing);
        Ok(())
    }

    /// Returns how long after a searcher's last heartbeat meta moves its
    /// shards to live searchers (node timeout + control interval).
    pub fn move_after(&self) -> Duration {
        Duration::from_millis(self.move_after_ms.load(Ordering::Relaxed))
    }

    /// Records that the searcher `node_id` at `address` could not be reached
    /// (`cause`), logs it (once per searcher and cause per
    /// [`UNREACHABLE_LOG_INTERVAL`]) and returns how long it has been
    /// unreachable, as this gateway saw it.
    pub fn searcher_unreachable(&self, node_id: &str, address: &str, cause: &str) -> Duration {
        METRICS.searchers_unreachable.inc();
        let now = Instant::now();
        let (unreachable_for, log) = {
            let mut unreachable = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
            unreachable.retain(|_, searcher| {
                now.duration_since(searcher.last_failure) < UNREACHABLE_FORGET_AFTER
            });
            let searcher =
                unreachable
                    .entry(address.to_owned())
                    .or_insert_with(|| UnreachableSearcher {
                        since: now,
                        last_failure: now,
                        logged: HashMap::new(),
                    });
            searcher.last_failure = now;
            let log = match searcher.logged.get(cause) {
                Some(logged) if now.duration_since(*logged) < UNREACHABLE_LOG_INTERVAL => false,
                _ => {
                    searcher.logged.insert(cause.to_owned(), now);
                    true
                }
            };
            self.any_unreachable.store(true, Ordering::Release);
            (now.duration_since(searcher.since), log)
        };
        if log {
            tracing::warn!(
                node_id,
                address,
                cause,
                unreachable_for_ms = unreachable_for.as_millis() as u64,
                move_after_ms = self.move_after().as_millis() as u64,
                "searcher unreachable; reads of its shards fail over to other replicas, or wait for meta to move them"
            );
        }
        unreachable_for
    }

    /// Records that the searcher at `address` answered.
    pub fn searcher_reachable(&self, address: &str) {
        if !self.any_unreachable.load(Ordering::Acquire) {
            return;
        }
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        if unreachable.remove(address).is_some() {
            tracing::info!(address, "searcher reachable again");
        }
        if unreachable.is_empty() {
            self.any_unreachable.store(false, Ordering::Release);
        }
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
    /// those searchers (node id, address) in the order to try them (none when
    /// the wait ran out). A
    /// shard meta has not placed yet (a collection just created, a searcher just
    /// replaced) gets one within the control loop's interval; a restarted
    /// searcher's new address appears once it has registered.
    pub async fn wait_for_searchers(
        &self,
        name: &str,
        shard: u32,
        wait: Duration,
        tried: &[String],
    ) -> Vec<(String, String)> {
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
                let order: Vec<(String, String)> = self
                    .searcher_order(&placement)
                    .into_iter()
                    .filter(|(_, address)| !tried.contains(address))
                    .collect();
                if !order.is_empty() {
                    return order;
                }
            }
        }
    }

    /// Returns the ready searchers `(node id, address)` of `placement` in the
    /// order to try them (rotated per call so load spreads over replicas).
    pub fn searcher_order(&self, placement: &ShardPlacement) -> Vec<(String, String)> {
        let mut ready: Vec<(String, String)> = placement
            .searchers
            .iter()
            .filter(|(_, _, ready)| *ready)
            .map(|(node_id, address, _)| (node_id.clone(), address.clone()))
            .collect();
        if ready.is_empty() {
            // None reported ready yet: any assigned searcher will load on demand.
            ready = placement
                .searchers
                .iter()
                .map(|(node_id, address, _)| (node_id.clone(), address.clone()))
                .collect();
        }
        if !ready.is_empty() {
            let start = self.next_replica.fetch_add(1, Ordering::Relaxed) % ready.len();
            ready.rotate_left(start);
        }
        ready
    }
}
