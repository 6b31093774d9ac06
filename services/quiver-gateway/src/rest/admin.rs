//! The admin API: cluster status, a collection's shards, compaction, draining a
//! node, metadata membership, orphaned objects.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use quiver_api::{
    ClusterMeta, ClusterShard, ClusterStatus, CollectionShards, CompactResponse, MetaMember,
    MetaMembersRequest, MetaMembersResponse, Node, Orphan, OrphansResponse, SearcherState,
    SegmentStatus, ShardLease, ShardStatus,
};
use quiver_proto::meta as pb;

use super::decode::{BodyResult, parse};
use super::{Segment, Shared, handle};
use crate::auth::Access;
use crate::core::validate_name;
use crate::error::GatewayError;

fn role_name(role: i32) -> &'static str {
    match pb::NodeRole::try_from(role) {
        Ok(pb::NodeRole::Indexer) => "indexer",
        Ok(pb::NodeRole::Searcher) => "searcher",
        Ok(pb::NodeRole::Gateway) => "gateway",
        _ => "unknown",
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::NodeState::try_from(state) {
        Ok(pb::NodeState::Alive) => "alive",
        Ok(pb::NodeState::Dead) => "dead",
        Ok(pb::NodeState::Draining) => "draining",
        _ => "unknown",
    }
}

fn node_of(node: &pb::NodeInfo) -> Node {
    Node {
        id: node.node_id.clone(),
        role: role_name(node.role).to_string(),
        address: node.address.clone(),
        state: state_name(node.state).to_string(),
        last_heartbeat_ms: node.last_heartbeat_ms,
    }
}

fn members_of(members: &[pb::MetaMember]) -> Vec<MetaMember> {
    members
        .iter()
        .map(|member| MetaMember {
            id: member.id,
            address: member.address.clone(),
            role: if member.role == pb::MemberRole::Learner as i32 {
                "learner"
            } else {
                "voter"
            }
            .to_string(),
        })
        .collect()
}

fn searchers_of(searchers: &[pb::SearcherAssignment]) -> Vec<SearcherState> {
    searchers
        .iter()
        .map(|searcher| SearcherState {
            id: searcher.node_id.clone(),
            ready: searcher.ready,
        })
        .collect()
}

#[utoipa::path(get, path = "/admin/v1/cluster", tag = "admin",
    responses(
        (status = 200, description = "Nodes, metadata members, shard placement", body = quiver_api::ClusterStatus),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn cluster_status(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "cluster_status",
        Access::Admin,
        async move {
            let meta = gateway.router().meta();
            let status = meta.cluster_status().await?;
            let routing = meta.get_routing("", false).await?;
            // A shard without its reference names nothing; leave it out.
            let shards = routing
                .shards
                .iter()
                .filter_map(|shard| {
                    let reference = shard.shard?;
                    Some(ClusterShard {
                        collection_id: reference.collection_id,
                        shard: reference.shard,
                        indexer: shard.lease.as_ref().map(|lease| lease.holder.clone()),
                        epoch: shard.epoch,
                        searchers: searchers_of(&shard.searchers),
                        manifest_version: shard.manifest_version,
                    })
                })
                .collect();
            Ok(Json(ClusterStatus {
                meta: ClusterMeta {
                    leader: status.leader_id,
                    leader_address: status.leader_address,
                    term: status.term,
                    commit_index: status.commit_index,
                    applied_index: status.applied_index,
                    members: members_of(&status.members),
                },
                nodes: status.nodes.iter().map(node_of).collect(),
                collections: status.collections,
                shards,
            }))
        },
    )
    .await
}

#[utoipa::path(get, path = "/admin/v1/collections/{name}/shards", tag = "admin",
    params(super::openapi::CollectionName),
    responses(
        (status = 200, description = "Each shard's lease, searchers, segments and WAL tail", body = quiver_api::CollectionShards),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn collection_shards(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "collection_shards",
        Access::Admin,
        async move {
            validate_name(&name)?;
            let meta = gateway.router().meta();
            let routing = meta.get_routing(&name, true).await?;
            let collection = routing
                .collections
                .iter()
                .find(|collection| {
                    collection
                        .spec
                        .as_ref()
                        .is_some_and(|spec| spec.name == name)
                })
                .ok_or_else(|| {
                    GatewayError::not_found(format!("collection `{name}` does not exist"))
                })?;
            let mut shards = Vec::new();
            for shard in &routing.shards {
                let Some(reference) = shard.shard else {
                    continue;
                };
                if reference.collection_id != collection.collection_id {
                    continue;
                }
                let manifest = meta.get_manifest(reference, false).await?;
                shards.push(ShardStatus {
                    shard: reference.shard,
                    indexer: shard.lease.as_ref().map(|lease| ShardLease {
                        id: lease.holder.clone(),
                        epoch: lease.epoch,
                        expires_at_ms: lease.expires_at_ms,
                    }),
                    epoch: shard.epoch,
                    searchers: searchers_of(&shard.searchers),
                    manifest_version: manifest.version,
                    segments: manifest
                        .segments
                        .iter()
                        .map(|segment| SegmentStatus {
                            segment_id: segment.segment_id.clone(),
                            rows: segment.rows,
                            deleted_rows: segment.deleted_rows,
                            size_bytes: segment.size_bytes,
                        })
                        .collect(),
                    wal_tail: manifest.wal_tail.len() as u64,
                    wal_tail_rows: manifest.wal_tail.iter().map(|entry| entry.rows).sum(),
                });
            }
            shards.sort_by_key(|shard| shard.shard);
            Ok(Json(CollectionShards {
                collection: name,
                shards,
            }))
        },
    )
    .await
}

/// `200 {"done": true, "merges": n}` once every shard is compacted, or `202
/// {"done": false, "running_shards": [...]}` when some are still compacting
/// after the wait: the compaction goes on, and POSTing again waits for it.
#[utoipa::path(post, path = "/admin/v1/collections/{name}/compact", tag = "admin",
    params(super::openapi::CollectionName),
    responses(
        (status = 200, description = "Every shard compacted", body = quiver_api::CompactResponse),
        (status = 202, description = "Some shard still compacting after the gateway's wait (about 24 s); POST again to wait for it", body = quiver_api::CompactResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn compact(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "compact", Access::Admin, async move {
        let compaction = gateway.compact(&name).await?;
        let done = compaction.running_shards.is_empty();
        let mut answer = CompactResponse {
            collection: name,
            merges: u64::from(compaction.merges),
            done,
            running_shards: None,
            message: None,
        };
        if done {
            return Ok(Json(answer).into_response());
        }
        answer.running_shards = Some(compaction.running_shards);
        answer.message =
            Some("compaction still running on the indexers; POST again to wait for it".to_string());
        Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
    })
    .await
}

#[utoipa::path(post, path = "/admin/v1/nodes/{id}/drain", tag = "admin",
    params(("id" = String, Path, description = "Node id")),
    responses(
        (status = 200, description = "The node, now draining", body = quiver_api::Node),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn drain_node(
    State(state): Shared,
    Segment(id): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "drain_node", Access::Admin, async move {
        let node = gateway.router().meta().drain_node(&id).await?;
        Ok(Json(node_of(&node)))
    })
    .await
}

/// Objects in the bucket that nothing references, as the indexers' sweep
/// reported them (deleted once `delete_after_ms` has passed).
#[utoipa::path(get, path = "/admin/v1/orphans", tag = "admin",
    responses(
        (status = 200, description = "Unreferenced objects found by the sweep, before they are deleted", body = quiver_api::OrphansResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn list_orphans(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "list_orphans",
        Access::Admin,
        async move {
            let orphans = gateway.router().meta().list_orphans(true).await?;
            let total_bytes = orphans.iter().map(|orphan| orphan.size_bytes).sum();
            Ok(Json(OrphansResponse {
                count: orphans.len() as u64,
                total_bytes,
                orphans: orphans
                    .into_iter()
                    .map(|orphan| Orphan {
                        key: orphan.object_key,
                        size_bytes: orphan.size_bytes,
                        last_modified_ms: orphan.last_modified_ms,
                        first_seen_ms: orphan.first_seen_ms,
                        delete_after_ms: orphan.delete_after_ms,
                    })
                    .collect(),
            }))
        },
    )
    .await
}

#[utoipa::path(post, path = "/admin/v1/meta/members", tag = "admin",
    request_body = quiver_api::MetaMembersRequest,
    responses(
        (status = 200, description = "The members after the change", body = quiver_api::MetaMembersResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn meta_members(
    State(state): Shared,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "meta_members",
        Access::Admin,
        async move {
            let body: MetaMembersRequest = parse(&body, gateway.limits())?;
            let meta = gateway.router().meta();
            let members = match body.action.as_str() {
                "add" => {
                    let address = body.address.ok_or_else(|| {
                        GatewayError::invalid("adding a metadata node needs its \"address\"")
                    })?;
                    meta.add_learner(body.id, &address).await?
                }
                "promote" => meta.promote_voter(body.id).await?,
                "remove" => meta.remove_member(body.id).await?,
                other => {
                    return Err(GatewayError::invalid(format!(
                        "action must be \"add\", \"promote\" or \"remove\", got {other:?}"
                    )));
                }
            };
            Ok(Json(MetaMembersResponse {
                members: members_of(&members),
            }))
        },
    )
    .await
}
