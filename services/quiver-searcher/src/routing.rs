//! Routing: which shards this node serves, and their manifests, as meta's watch
//! stream announces them. Each event carries the changed shards with their
//! manifests; a newer manifest is applied to the shard's view incrementally (only
//! new segments are opened). A broken stream is reopened after a backoff (the
//! shared retry policy, full jitter, so searchers do not come back in lockstep
//! after a meta restart); a slow safety poll of the routing table catches
//! anything a stream might have missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use quiver_common::RetryPolicy;
use quiver_index::SegmentSpec;
use quiver_proto::convert::{collection_from_proto, manifest_from_proto};
use quiver_proto::meta as pb;
use quiver_storage::manifest::{Manifest, ShardRef};

use crate::metrics::METRICS;
use crate::node::NodeState;
use crate::reload::{ReloadTarget, ServedShard, reload};

/// One shard this node should serve, as a pass over the routing learned it.
struct Assignment {
    collection: pb::Collection,
    manifest_version: u64,
    /// The manifest itself, when the watch delivered it.
    manifest: Option<Manifest>,
}

/// Serves the shards of `assigned`, drops the others, and starts reloads of
/// shards whose view is older than what was announced.
fn apply_assignments(
    state: &Arc<NodeState>,
    assigned: HashMap<ShardRef, Assignment>,
    trigger: &'static str,
) {
    {
        let mut shards = state.shards.write().unwrap_or_else(|p| p.into_inner());
        shards.retain(|shard, _| assigned.contains_key(shard));
        for (shard, assignment) in &assigned {
            if shards.contains_key(shard) {
                continue;
            }
            match collection_from_proto(&assignment.collection)
                .map(|collection| SegmentSpec::for_collection(&collection))
            {
                Ok(spec) => {
                    shards.insert(shard.clone(), Arc::new(ServedShard::new(spec)));
                }
                Err(error) => tracing::error!(%shard, %error, "collection spec unusable"),
            }
        }
    }
    state.synced.store(true, Ordering::Release);
    for (shard, assignment) in assigned {
        let Some(served) = state.served(&shard) else {
            continue;
        };
        if served
            .version()
            .is_some_and(|version| version >= assignment.manifest_version)
        {
            continue;
        }
        let target = match assignment.manifest {
            Some(manifest) => {
                if !served.want(manifest) {
                    continue;
                }
                ReloadTarget::Announced
            }
            None => ReloadTarget::AtLeast {
                version: assignment.manifest_version,
                linearizable: false,
            },
        };
        let state = state.clone();
        // Reload off the loop so one slow shard does not hold the others; the
        // reload ends when the node stops (its blocking load runs to its end).
        state.tasks.clone().spawn(async move {
            tokio::select! {
                reloaded = reload(&state, &shard, &served, target, trigger) => {
                    if let Err(error) = reloaded {
                        tracing::warn!(%shard, %error, "shard reload failed");
                    }
                }
                _ = state.shutdown.cancelled() => {}
            }
        });
    }
}

/// The part of the catalog the watch stream has told this node about.
#[derive(Default)]
struct WatchedCatalog {
    collections: HashMap<u64, pb::Collection>,
    shards: HashMap<(u64, u32), pb::ShardUpdate>,
}

impl WatchedCatalog {
    fn apply(&mut self, event: pb::WatchEvent) {
        // An event lists every collection whenever any was created or dropped.
        if !event.collections.is_empty() {
            self.collections = event
                .collections
                .into_iter()
                .map(|collection| (collection.collection_id, collection))
                .collect();
        }
        for dropped in event.dropped_collection_ids {
            self.collections.remove(&dropped);
            self.shards
                .retain(|(collection_id, _), _| *collection_id != dropped);
        }
        for update in event.shards {
            let Some(reference) = update.routing.as_ref().and_then(|routing| routing.shard) else {
                continue;
            };
            self.shards
                .insert((reference.collection_id, reference.shard), update);
        }
    }

    fn assigned_to(&self, node_id: &str) -> HashMap<ShardRef, Assignment> {
        let mut assigned = HashMap::new();
        for ((collection_id, shard), update) in &self.shards {
            let Some(routing) = &update.routing else {
                continue;
            };
            if !routing
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == node_id)
            {
                continue;
            }
            let Some(collection) = self.collections.get(collection_id) else {
                continue;
            };
            assigned.insert(
                ShardRef {
                    collection_id: collection_id.to_string(),
                    shard: *shard,
                },
                Assignment {
                    collection: collection.clone(),
                    manifest_version: routing.manifest_version,
                    manifest: update.manifest.as_ref().map(manifest_from_proto),
                },
            );
        }
        assigned
    }
}

/// Follows meta's watch stream: every event updates the assignments and
/// announces new manifests. A broken stream is reopened (from scratch, so
/// nothing is missed) after a backoff whose bound doubles up to
/// `watch_max_backoff`, and starts over once an event arrives.
pub(crate) async fn watch_loop(state: Arc<NodeState>) {
    let reconnect = RetryPolicy::new(
        usize::MAX,
        state.config.watch_initial_backoff,
        state.config.watch_max_backoff,
    );
    let mut backoff = reconnect.backoff();
    let shutdown = &state.shutdown;
    loop {
        if !state.registered_or_stopped().await {
            return;
        }
        let request = pb::WatchRequest {
            collection_id: 0,
            from_version: 0,
        };
        let opened = tokio::select! {
            opened = state.meta.watch(request) => opened,
            _ = shutdown.cancelled() => return,
        };
        match opened {
            Ok(mut stream) => {
                let mut catalog = WatchedCatalog::default();
                loop {
                    let message = tokio::select! {
                        message = stream.message() => message,
                        _ = shutdown.cancelled() => return,
                    };
                    match message {
                        Ok(Some(event)) => {
                            backoff.reset();
                            catalog.apply(event);
                            let assigned = catalog.assigned_to(&state.config.node_id);
                            apply_assignments(&state, assigned, "watch");
                        }
                        Ok(None) => {
                            tracing::warn!("watch stream from meta ended; reopening");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(%status, "watch stream from meta failed; reopening");
                            break;
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot open the watch stream from meta"),
        }
        METRICS.watch_reconnects.inc();
        // The policy has no attempt limit; the bound is its cap should it ever end.
        let pause = backoff
            .next_delay()
            .unwrap_or(state.config.watch_max_backoff);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Reads the whole routing table now and then, in case the watch stream missed
/// something (the first pass runs at once, so a node starts even without it).
pub(crate) async fn safety_poll_loop(state: Arc<NodeState>) {
    let mut ticker = tokio::time::interval(state.config.safety_poll_interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = state.shutdown.cancelled() => return,
        }
        if !state.registered_or_stopped().await {
            return;
        }
        let routing = match state.meta.get_routing("", false).await {
            Ok(routing) => routing,
            Err(error) => {
                tracing::warn!(%error, "routing unavailable");
                continue;
            }
        };
        let collections: HashMap<u64, &pb::Collection> = routing
            .collections
            .iter()
            .map(|collection| (collection.collection_id, collection))
            .collect();
        let mut assigned = HashMap::new();
        for shard in &routing.shards {
            let Some(reference) = &shard.shard else {
                continue;
            };
            let mine = shard
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == state.config.node_id);
            if !mine {
                continue;
            }
            if let Some(collection) = collections.get(&reference.collection_id) {
                assigned.insert(
                    ShardRef {
                        collection_id: reference.collection_id.to_string(),
                        shard: reference.shard,
                    },
                    Assignment {
                        collection: (*collection).clone(),
                        manifest_version: shard.manifest_version,
                        manifest: None,
                    },
                );
            }
        }
        apply_assignments(&state, assigned, "poll");
    }
}
