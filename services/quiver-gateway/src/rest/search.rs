//! `POST /v1/collections/{name}/search` and `…/search/batch`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use quiver_api::{BatchSearchResponse, SearchCost, SearchHit, SearchResponse};

use super::decode::{BodyResult, body_bytes, decode_batch, decode_search, wire_id};
use super::{Segment, Shared, handle};
use crate::auth::Access;
use crate::core::Hit;

fn search_response(hits: Vec<Hit>, took_ms: f64, cost: Option<SearchCost>) -> SearchResponse {
    SearchResponse {
        hits: hits
            .into_iter()
            .map(|hit| SearchHit {
                id: wire_id(&hit.id),
                score: hit.score,
                payload: hit.payload,
                vector: hit.vector,
            })
            .collect(),
        took_ms,
        cost,
    }
}

#[utoipa::path(post, path = "/v1/collections/{name}/search", tag = "search",
    params(super::openapi::CollectionName),
    request_body = quiver_api::SearchRequest,
    responses(
        (status = 200, description = "The top k, best first, with the query's cost", body = quiver_api::SearchResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn search(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "search", Access::Read, async move {
        let input = decode_search(body_bytes(&body, gateway.limits())?, gateway.limits())?;
        let (hits, took_ms, cost) = gateway.search_with_cost(&name, input).await?;
        Ok(Json(search_response(hits, took_ms, Some(cost))))
    })
    .await
}

#[utoipa::path(post, path = "/v1/collections/{name}/search/batch", tag = "search",
    params(super::openapi::CollectionName),
    request_body = quiver_api::BatchSearchRequest,
    responses(
        (status = 200, description = "One answer per search, in order", body = quiver_api::BatchSearchResponse),
        super::openapi::ErrorResponses,
    ))]
pub(super) async fn search_batch(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "search_batch", Access::Read, async move {
        let inputs = decode_batch(body_bytes(&body, gateway.limits())?, gateway.limits())?;
        let results = gateway
            .search_batch(&name, inputs)
            .await?
            .into_iter()
            .map(|(hits, took_ms, cost)| search_response(hits, took_ms, Some(cost)))
            .collect();
        Ok(Json(BatchSearchResponse { results }))
    })
    .await
}
