//! Keeping a data node (indexer, searcher, gateway) registered with the
//! metadata service: register until it works, then heartbeat every interval
//! (with the shards the node reports ready), registering again if meta forgot it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;
use tokio_util::sync::CancellationToken;

use crate::client::MetaClient;

/// Who a data node is.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// Unique node id.
    pub node_id: String,
    /// Its role.
    pub role: pb::NodeRole,
    /// The address other nodes reach it at.
    pub address: String,
}

/// Registers `node` and heartbeats every `interval` until `shutdown` is cancelled.
/// `registered` tells the node whether meta knows it; `ready_shards` is called
/// before each heartbeat.
pub async fn keep_registered(
    meta: MetaClient,
    node: NodeIdentity,
    interval: Duration,
    registered: Arc<AtomicBool>,
    ready_shards: impl Fn() -> Vec<pb::ShardRef> + Send,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        if !registered.load(Ordering::Acquire) {
            let request = pb::RegisterNodeRequest {
                node_id: node.node_id.clone(),
                role: node.role as i32,
                address: node.address.clone(),
            };
            match meta.register_node(request).await {
                Ok(_) => registered.store(true, Ordering::Release),
                Err(error) => {
                    tracing::warn!(node_id = %node.node_id, %error, "registration failed; retrying")
                }
            }
            continue;
        }
        let request = pb::HeartbeatRequest {
            node_id: node.node_id.clone(),
            ready_shards: ready_shards(),
        };
        if let Err(error) = meta.heartbeat(request).await {
            tracing::warn!(node_id = %node.node_id, %error, "heartbeat failed");
            if error.kind() == ErrorCode::NotFound {
                // Meta forgot the node (e.g. a restored catalog): register again.
                registered.store(false, Ordering::Release);
            }
        }
    }
}
