//! `POST /v1/collections/{name}/search` and `…/search/batch`.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_api::{PointId, SearchCost};
use serde::Serialize;
use serde_json::value::RawValue;

use super::decode::{BodyResult, body_bytes, decode_batch, decode_search, wire_id};
use super::{Segment, Shared, handle};
use crate::auth::Access;
use crate::core::Hit;

/// A search answer as the gateway writes it: the JSON of
/// [`quiver_api::SearchResponse`], with each payload written as the JSON text it
/// was stored as — never parsed into a tree and written out again, which for
/// 1–4 KB payloads cost 26–69 µs per query of ten hits (searcher and gateway
/// each parsed and wrote every payload).
#[derive(Serialize)]
struct Answer {
    hits: Vec<AnswerHit>,
    took_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<SearchCost>,
}

/// One hit of an [`Answer`]: [`quiver_api::SearchHit`]'s JSON.
#[derive(Serialize)]
struct AnswerHit {
    id: PointId,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vector: Option<Vec<f32>>,
}

/// [`quiver_api::BatchSearchResponse`]'s JSON.
#[derive(Serialize)]
struct BatchAnswer {
    results: Vec<Answer>,
}

impl Answer {
    /// About how many bytes its JSON takes (a little more, rarely less): the
    /// answer is written into a buffer of this size at once instead of one
    /// grown by doubling from 128 bytes (eight reallocations and copies of
    /// the payloads for ten hits of 2 KB).
    fn json_size_hint(&self) -> usize {
        128 + self
            .hits
            .iter()
            .map(|hit| {
                96 + hit
                    .payload
                    .as_ref()
                    .map_or(0, |payload| payload.get().len())
                    + hit.vector.as_ref().map_or(0, |vector| vector.len() * 16)
            })
            .sum::<usize>()
    }
}

/// A JSON answer serialized into a buffer sized for it up front.
struct SizedJson<T> {
    body: T,
    size_hint: usize,
}

impl<T: Serialize> IntoResponse for SizedJson<T> {
    fn into_response(self) -> Response {
        let mut buffer = Vec::with_capacity(self.size_hint);
        match serde_json::to_writer(&mut buffer, &self.body) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                buffer,
            )
                .into_response(),
            Err(error) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the answer: {error}"),
            )
                .into_response(),
        }
    }
}

impl From<Answer> for SizedJson<Answer> {
    fn from(answer: Answer) -> Self {
        let size_hint = answer.json_size_hint();
        SizedJson {
            body: answer,
            size_hint,
        }
    }
}

impl From<BatchAnswer> for SizedJson<BatchAnswer> {
    fn from(batch: BatchAnswer) -> Self {
        let size_hint = 32
            + batch
                .results
                .iter()
                .map(Answer::json_size_hint)
                .sum::<usize>();
        SizedJson {
            body: batch,
            size_hint,
        }
    }
}

fn search_response(hits: Vec<Hit>, took_ms: f64, cost: Option<SearchCost>) -> Answer {
    Answer {
        hits: hits
            .into_iter()
            .map(|hit| AnswerHit {
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
        Ok(SizedJson::from(search_response(hits, took_ms, Some(cost))))
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
        Ok(SizedJson::from(BatchAnswer { results }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use quiver_api::{BatchSearchResponse, SearchHit, SearchResponse};
    use quiver_index::PointId as ModelId;
    use serde_json::json;

    use super::*;

    fn hit(id: u64, payload: Option<&str>, vector: Option<Vec<f32>>) -> Hit {
        Hit {
            id: ModelId::U64(id),
            score: 0.5,
            payload: payload.map(|text| RawValue::from_string(text.to_string()).unwrap()),
            vector,
        }
    }

    #[test]
    fn an_answer_with_stored_payload_text_reads_as_the_api_response() {
        let payload = r#"{"title": "ünï", "tags": ["a", "b"], "n": 1.5e3, "nested": {"x": null}}"#;
        let answer = search_response(
            vec![
                hit(7, Some(payload), Some(vec![0.25, -1.0])),
                hit(8, None, None),
            ],
            1.25,
            Some(SearchCost::default()),
        );
        let text = serde_json::to_string(&answer).unwrap();
        let read: SearchResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(
            read,
            SearchResponse {
                hits: vec![
                    SearchHit {
                        id: PointId::U64(7),
                        score: 0.5,
                        payload: Some(serde_json::from_str(payload).unwrap()),
                        vector: Some(vec![0.25, -1.0]),
                    },
                    SearchHit {
                        id: PointId::U64(8),
                        score: 0.5,
                        payload: None,
                        vector: None,
                    },
                ],
                took_ms: 1.25,
                cost: Some(SearchCost::default()),
            }
        );
        // Absent fields are left out, as the API type does.
        assert_eq!(
            serde_json::to_value(search_response(vec![hit(8, None, None)], 2.0, None)).unwrap(),
            json!({"hits": [{"id": 8, "score": 0.5}], "took_ms": 2.0})
        );
        let batch = BatchAnswer {
            results: vec![search_response(
                vec![hit(7, Some(payload), None)],
                1.0,
                None,
            )],
        };
        let read: BatchSearchResponse =
            serde_json::from_str(&serde_json::to_string(&batch).unwrap()).unwrap();
        assert_eq!(
            read.results[0].hits[0].payload,
            Some(serde_json::from_str(payload).unwrap())
        );
    }
}
