//! `POST /v1/collections/{name}/search` and `…/search/batch`.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_api::SearchCost;

use super::decode::{BodyResult, body_bytes, decode_batch, decode_search, wire_id};
use super::{Segment, Shared, handle};
use crate::auth::Access;
use crate::core::Hit;

/// A search answer as the gateway writes it: the JSON of
/// [`quiver_api::SearchResponse`], with each payload written as the JSON text it
/// was stored as — never parsed into a tree and written out again, which for
/// 1–4 KB payloads cost 26–69 µs per query of ten hits (searcher and gateway
/// each parsed and wrote every payload), nor checked again (~4 µs per query of
/// ten 2 KB payloads): the text is what serde_json wrote when the point was
/// upserted ([`crate::core::Hit::payload`]).
struct Answer {
    hits: Vec<Hit>,
    took_ms: f64,
    cost: Option<SearchCost>,
}

/// [`quiver_api::BatchSearchResponse`]'s JSON.
struct BatchAnswer {
    results: Vec<Answer>,
}

/// A JSON answer written straight into one buffer.
trait WriteJson {
    /// About how many bytes the JSON takes (a little more, rarely less): the
    /// answer is written into a buffer of this size at once instead of one
    /// grown by doubling (eight reallocations and copies of the payloads for
    /// ten hits of 2 KB).
    fn json_size_hint(&self) -> usize;

    /// Appends the JSON to `out`.
    fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()>;
}

impl WriteJson for Answer {
    fn json_size_hint(&self) -> usize {
        128 + self
            .hits
            .iter()
            .map(|hit| {
                96 + hit.payload.as_ref().map_or(0, Vec::len)
                    + hit.vector.as_ref().map_or(0, |vector| vector.len() * 16)
            })
            .sum::<usize>()
    }

    /// Writes `{"hits": [{"id", "score", "payload"?, "vector"?}…], "took_ms",
    /// "cost"?}`, the fields [`quiver_api::SearchResponse`] reads (absent ones
    /// left out, as its serializer does).
    fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"hits\":[");
        for (index, hit) in self.hits.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            serde_json::to_writer(&mut *out, &wire_id(&hit.id))?;
            out.extend_from_slice(b",\"score\":");
            serde_json::to_writer(&mut *out, &hit.score)?;
            if let Some(payload) = &hit.payload {
                out.extend_from_slice(b",\"payload\":");
                out.extend_from_slice(payload);
            }
            if let Some(vector) = &hit.vector {
                out.extend_from_slice(b",\"vector\":");
                serde_json::to_writer(&mut *out, vector)?;
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"took_ms\":");
        serde_json::to_writer(&mut *out, &self.took_ms)?;
        if let Some(cost) = &self.cost {
            out.extend_from_slice(b",\"cost\":");
            serde_json::to_writer(&mut *out, cost)?;
        }
        out.push(b'}');
        Ok(())
    }
}

impl WriteJson for BatchAnswer {
    fn json_size_hint(&self) -> usize {
        32 + self
            .results
            .iter()
            .map(Answer::json_size_hint)
            .sum::<usize>()
    }

    fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"results\":[");
        for (index, answer) in self.results.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            answer.write_json(out)?;
        }
        out.extend_from_slice(b"]}");
        Ok(())
    }
}

/// A [`WriteJson`] answer as an HTTP response.
struct SizedJson<T>(T);

impl<T: WriteJson> SizedJson<T> {
    fn to_bytes(&self) -> serde_json::Result<Vec<u8>> {
        let mut buffer = Vec::with_capacity(self.0.json_size_hint());
        self.0.write_json(&mut buffer)?;
        Ok(buffer)
    }
}

impl<T: WriteJson> IntoResponse for SizedJson<T> {
    fn into_response(self) -> Response {
        match self.to_bytes() {
            Ok(buffer) => (
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

fn search_response(hits: Vec<Hit>, took_ms: f64, cost: Option<SearchCost>) -> Answer {
    Answer {
        hits,
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
        Ok(SizedJson(search_response(hits, took_ms, Some(cost))))
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
        Ok(SizedJson(BatchAnswer { results }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use quiver_api::{BatchSearchResponse, PointId, SearchHit, SearchResponse};
    use quiver_index::PointId as ModelId;
    use serde_json::json;

    use super::*;

    fn hit(id: u64, payload: Option<&str>, vector: Option<Vec<f32>>) -> Hit {
        Hit {
            id: ModelId::U64(id),
            score: 0.5,
            payload: payload.map(|text| text.as_bytes().to_vec()),
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
        let text = SizedJson(answer).to_bytes().unwrap();
        let read: SearchResponse = serde_json::from_slice(&text).unwrap();
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
            serde_json::from_slice::<serde_json::Value>(
                &SizedJson(search_response(vec![hit(8, None, None)], 2.0, None))
                    .to_bytes()
                    .unwrap()
            )
            .unwrap(),
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
            serde_json::from_slice(&SizedJson(batch).to_bytes().unwrap()).unwrap();
        assert_eq!(
            read.results[0].hits[0].payload,
            Some(serde_json::from_str(payload).unwrap())
        );
    }

    #[test]
    fn the_written_answer_is_the_api_types_json() {
        let payload = r#"{"quote": "a \"b\" \\ c", "emoji": "😀", "list": [1, 2.5, -3e-7]}"#;
        let hits = vec![
            Hit {
                id: ModelId::String("doc \"7\" ünï\n".into()),
                score: -1.25e-3,
                payload: Some(payload.as_bytes().to_vec()),
                vector: Some(vec![0.1, f32::MIN_POSITIVE, -3.5e10]),
            },
            Hit {
                id: ModelId::U64(u64::MAX),
                score: 0.75,
                payload: None,
                vector: Some(Vec::new()),
            },
        ];
        let api_hits: Vec<SearchHit> = hits
            .iter()
            .map(|hit| SearchHit {
                id: wire_id(&hit.id),
                score: hit.score,
                payload: hit
                    .payload
                    .as_ref()
                    .map(|text| serde_json::from_slice(text).unwrap()),
                vector: hit.vector.clone(),
            })
            .collect();
        let cost = SearchCost {
            rows_scanned: 12_345,
            search_ms: 0.5,
            ..SearchCost::default()
        };
        let batch = BatchAnswer {
            results: vec![
                search_response(hits, 3.5, Some(cost)),
                search_response(Vec::new(), 0.0, None),
            ],
        };
        let expected = BatchSearchResponse {
            results: vec![
                SearchResponse {
                    hits: api_hits,
                    took_ms: 3.5,
                    cost: Some(cost),
                },
                SearchResponse {
                    hits: Vec::new(),
                    took_ms: 0.0,
                    cost: None,
                },
            ],
        };
        let written = SizedJson(batch).to_bytes().unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&written).unwrap(),
            // (through text: a tree holds an f32 as the f64 it widens to)
            serde_json::from_str::<serde_json::Value>(&serde_json::to_string(&expected).unwrap())
                .unwrap()
        );
    }
}
