//! `PUT/GET/DELETE /v1/collections/{name}` and `GET /v1/collections`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use quiver_api::{
    Collection, CollectionIndex, DescribeCollectionResponse, DropCollectionResponse, FieldSchema,
    ListCollectionsResponse,
};
use quiver_proto::meta as pb;

use super::decode::{BodyResult, body_bytes, decode_create};
use super::{Segment, Shared, handle};
use crate::auth::Access;
use crate::error::{GatewayError, GatewayResult};

fn metric_name(metric: i32) -> &'static str {
    match pb::Metric::try_from(metric) {
        Ok(pb::Metric::Dot) => "dot",
        Ok(pb::Metric::L2) => "l2",
        _ => "cosine",
    }
}

fn field_kind_name(kind: i32) -> &'static str {
    match pb::FieldKind::try_from(kind) {
        Ok(pb::FieldKind::Integer) => "integer",
        Ok(pb::FieldKind::Float) => "float",
        Ok(pb::FieldKind::Bool) => "bool",
        _ => "keyword",
    }
}

fn raw_precision_name(index: Option<&pb::IndexParams>) -> &'static str {
    match index.map(|index| pb::VectorPrecision::try_from(index.raw_precision)) {
        Some(Ok(pb::VectorPrecision::Bf16)) => "bf16",
        _ => "f32",
    }
}

/// Returns the wire form of a collection's definition.
pub(super) fn collection_of(collection: &pb::Collection) -> GatewayResult<Collection> {
    let spec = collection.spec.as_ref().ok_or_else(|| {
        GatewayError::internal(format!(
            "meta answered collection {} without its spec",
            collection.collection_id
        ))
    })?;
    Ok(Collection {
        name: spec.name.clone(),
        collection_id: collection.collection_id,
        dimension: spec.dimension,
        metric: metric_name(spec.metric).to_string(),
        id_type: if spec.id_type == pb::IdType::String as i32 {
            "string"
        } else {
            "u64"
        }
        .to_string(),
        shards: spec.shards,
        replication: spec.replication,
        index: CollectionIndex {
            raw_precision: raw_precision_name(spec.index.as_ref()).to_string(),
        },
        payload_schema: spec
            .payload_schema
            .iter()
            .map(|field| FieldSchema {
                name: field.name.clone(),
                kind: field_kind_name(field.kind).to_string(),
            })
            .collect(),
        created_at_ms: collection.created_at_ms,
    })
}

#[utoipa::path(put, path = "/v1/collections/{name}", tag = "collections",
    params(super::openapi::CollectionName),
    request_body = quiver_api::CreateCollectionRequest,
    responses(
        (status = 200, description = "The collection as created", body = quiver_api::Collection),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn create_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "create_collection",
        Access::Admin,
        async move {
            let spec = decode_create(name, body_bytes(&body, gateway.limits())?)?;
            let collection = gateway.create_collection(spec).await?;
            Ok(Json(collection_of(&collection)?))
        },
    )
    .await
}

#[utoipa::path(get, path = "/v1/collections", tag = "collections",
    responses(
        (status = 200, description = "Every collection", body = quiver_api::ListCollectionsResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn list_collections(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "list_collections",
        Access::Read,
        async move {
            let collections = gateway
                .list_collections()
                .await?
                .iter()
                .map(collection_of)
                .collect::<GatewayResult<Vec<_>>>()?;
            Ok(Json(ListCollectionsResponse { collections }))
        },
    )
    .await
}

#[utoipa::path(get, path = "/v1/collections/{name}", tag = "collections",
    params(super::openapi::CollectionName),
    responses(
        (status = 200, description = "Definition and statistics", body = quiver_api::DescribeCollectionResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn describe_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "describe_collection",
        Access::Read,
        async move {
            let (collection, stats) = gateway.describe(&name).await?;
            Ok(Json(DescribeCollectionResponse::new(
                collection_of(&collection)?,
                stats,
            )))
        },
    )
    .await
}

#[utoipa::path(delete, path = "/v1/collections/{name}", tag = "collections",
    params(super::openapi::CollectionName),
    responses(
        (status = 200, description = "Dropped (its objects are deleted in the background)", body = quiver_api::DropCollectionResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn drop_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "drop_collection",
        Access::Admin,
        async move {
            gateway.drop_collection(&name).await?;
            Ok(Json(DropCollectionResponse {
                name,
                dropped: true,
            }))
        },
    )
    .await
}
