//! `POST /v1/collections/{name}/points` (upsert), `…/points/delete`, `…/points/get`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use quiver_api::{GetPointsResponse, PointRecord, WriteResponse};

use super::decode::{BodyResult, body_bytes, decode_ids, decode_upsert, wire_id};
use super::{Segment, Shared, handle};
use crate::auth::Access;

#[utoipa::path(post, path = "/v1/collections/{name}/points", tag = "points",
    params(super::openapi::CollectionName),
    request_body = quiver_api::UpsertRequest,
    responses(
        (status = 200, description = "Durable: in the WAL, committed; visible to the next strong read", body = quiver_api::WriteResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn upsert(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "upsert", Access::Write, async move {
        let points = decode_upsert(body_bytes(&body, gateway.limits())?)?;
        let sequence = gateway.upsert(&name, points).await?;
        Ok(Json(WriteResponse { sequence }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/collections/{name}/points/delete", tag = "points",
    params(super::openapi::CollectionName),
    request_body = quiver_api::PointIdsRequest,
    responses(
        (status = 200, description = "Durable", body = quiver_api::WriteResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn delete_points(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "delete", Access::Write, async move {
        let (ids, _, _) = decode_ids(body_bytes(&body, gateway.limits())?)?;
        let sequence = gateway.delete(&name, ids).await?;
        Ok(Json(WriteResponse { sequence }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/collections/{name}/points/get", tag = "points",
    params(super::openapi::CollectionName),
    request_body = quiver_api::PointIdsRequest,
    responses(
        (status = 200, description = "The points found (missing ids are left out)", body = quiver_api::GetPointsResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn get_points(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "get", Access::Read, async move {
        let (ids, include_vector, consistency) = decode_ids(body_bytes(&body, gateway.limits())?)?;
        let points = gateway.get(&name, ids, include_vector, consistency).await?;
        Ok(Json(GetPointsResponse {
            points: points
                .into_iter()
                .map(|point| PointRecord {
                    id: wire_id(&point.id),
                    payload: point.payload,
                    vector: point.vector,
                })
                .collect(),
        }))
    })
    .await
}
