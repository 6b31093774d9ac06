//! The gRPC front end (`quiver.v1.client.Quiver`): the same operations as REST,
//! with the same validation, API keys (`authorization: Bearer <key>` metadata)
//! and error codes.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use quiver_proto::client::quiver_server::Quiver;
use quiver_proto::client::{self as api};
use quiver_proto::convert::{point_id, wire_hit, wire_point_id};
use quiver_proto::data;
use quiver_proto::{ErrorCode, REQUEST_ID_HEADER, status_of};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::auth::{Access, ApiKeys, Denied};
use crate::core::{Consistency, Gateway, Limits, SearchInput, UpsertPoint, check_search_options};
use crate::error::GatewayError;
use crate::metrics::METRICS;
use crate::request_id;

/// The client API service.
pub struct ClientApi {
    pub gateway: Arc<Gateway>,
    pub keys: ApiKeys,
}

fn presented_key(metadata: &MetadataMap) -> Option<&str> {
    if let Some(value) = metadata
        .get("authorization")
        .and_then(|value| value.to_str().ok())
    {
        return Some(value.strip_prefix("Bearer ").unwrap_or(value).trim());
    }
    metadata.get("x-api-key").and_then(|v| v.to_str().ok())
}

impl ClientApi {
    fn authorize(&self, metadata: &MetadataMap, needed: Access) -> Result<(), GatewayError> {
        match self.keys.check(presented_key(metadata), needed) {
            Ok(()) => Ok(()),
            Err(Denied::Unauthenticated) => Err(GatewayError::new(
                ErrorCode::Unauthenticated,
                "missing or unknown API key (send `authorization: Bearer <key>` metadata)",
            )),
            Err(Denied::PermissionDenied(access)) => Err(GatewayError::new(
                ErrorCode::PermissionDenied,
                format!("this API key lacks {} access", access.name()),
            )),
        }
    }

    /// Runs one call: request id (the client's `x-request-id` or a new one, sent
    /// back in the response metadata either way), span, auth, metrics.
    async fn serve<T, R, F, Fut>(
        &self,
        request: Request<T>,
        route: &'static str,
        access: Access,
        work: F,
    ) -> Result<Response<R>, Status>
    where
        F: FnOnce(T) -> Fut,
        Fut: Future<Output = Result<R, GatewayError>>,
    {
        let started = Instant::now();
        let request_id = request_id::accept_or_generate(
            request
                .metadata()
                .get(REQUEST_ID_HEADER)
                .and_then(|value| value.to_str().ok()),
        );
        let span = tracing::info_span!("request", request_id = %request_id, route);
        let authorized = self.authorize(request.metadata(), access);
        let message = request.into_inner();
        // On the heap, as in the REST front door (`rest::handle`): the layers
        // around it would otherwise copy it with every move of this future.
        let outcome = request_id::scope(
            request_id.clone(),
            Box::pin(
                async move {
                    authorized?;
                    work(message).await
                }
                .instrument(span.clone()),
            ),
        )
        .await;
        let code = match &outcome {
            Ok(_) => "OK",
            Err(error) => error.code.as_str(),
        };
        METRICS.requests.with_label_values(&[route, code]).inc();
        let seconds = started.elapsed().as_secs_f64();
        METRICS
            .duration
            .with_label_values(&[route])
            .observe(seconds);
        span.in_scope(|| match &outcome {
            Err(error) if error.code == ErrorCode::Internal => {
                tracing::error!(message = %error.message, "request failed");
            }
            _ => tracing::debug!(code, elapsed_ms = seconds * 1e3, "request done"),
        });
        // Request ids are visible ASCII (checked or generated); should one not
        // be, the answer goes without it rather than failing.
        let request_id = MetadataValue::try_from(request_id.as_str()).ok();
        match outcome {
            Ok(answer) => {
                let mut response = Response::new(answer);
                if let Some(request_id) = request_id {
                    response
                        .metadata_mut()
                        .insert(REQUEST_ID_HEADER, request_id);
                }
                Ok(response)
            }
            Err(error) => {
                let mut status = status_of(&error);
                if let Some(request_id) = request_id {
                    status.metadata_mut().insert(REQUEST_ID_HEADER, request_id);
                }
                Err(status)
            }
        }
    }
}

pub fn ids_of(ids: &[data::PointId]) -> Result<Vec<quiver_index::PointId>, GatewayError> {
    ids.iter()
        .enumerate()
        .map(|(index, id)| {
            point_id(id).ok_or_else(|| GatewayError::invalid(format!("ids[{index}] is empty")))
        })
        .collect()
}

fn payload_of(bytes: &[u8], what: &str) -> Result<Option<serde_json::Value>, GatewayError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice::<serde_json::Value>(bytes)
        .map(|payload| Some(payload).filter(|payload| !payload.is_null()))
        .map_err(|error| GatewayError::invalid(format!("{what}: payload is not JSON: {error}")))
}

/// Converts a gRPC search into the shared form and checks its options; zero
/// `k`, `nprobe` and `rescore` mean "the default" (proto3 cannot tell unset apart).
pub fn search_input(
    request: api::SearchRequest,
    limits: &Limits,
) -> Result<SearchInput, GatewayError> {
    let filter = if request.filter.trim().is_empty() {
        None
    } else if request.filter.trim_start().starts_with('{') {
        Some(serde_json::from_str(&request.filter).map_err(|error| {
            GatewayError::invalid(format!(
                "filter is neither a filter string nor JSON: {error}"
            ))
        })?)
    } else {
        Some(serde_json::Value::String(request.filter))
    };
    let consistency = match api::Consistency::try_from(request.consistency) {
        Ok(api::Consistency::Unspecified | api::Consistency::Strong) => Consistency::Strong,
        Ok(api::Consistency::Eventual) => Consistency::Eventual,
        Err(_) => {
            return Err(GatewayError::invalid(format!(
                "consistency {} is not a known value (0 unspecified, 1 strong, 2 eventual)",
                request.consistency
            )));
        }
    };
    let input = SearchInput {
        vector: request.vector,
        k: if request.k == 0 {
            quiver_api::DEFAULT_K
        } else {
            request.k as usize
        },
        filter,
        nprobe: (request.nprobe > 0).then_some(request.nprobe),
        rescore: (request.rescore > 0).then_some(request.rescore),
        consistency,
        include_payload: request.include_payload,
        include_vector: request.include_vector,
    };
    check_search_options(limits, &input)?;
    Ok(input)
}

/// Converts gRPC points into the shared form (ids present, payloads JSON).
pub fn upsert_points(points: Vec<data::Point>) -> Result<Vec<UpsertPoint>, GatewayError> {
    points
        .into_iter()
        .enumerate()
        .map(|(index, point)| {
            let what = format!("points[{index}]");
            Ok(UpsertPoint {
                id: point
                    .id
                    .as_ref()
                    .and_then(point_id)
                    .ok_or_else(|| GatewayError::invalid(format!("{what} has no id")))?,
                payload: payload_of(&point.payload_json, &what)?,
                vector: point.vector,
            })
        })
        .collect()
}

fn hits_of(hits: Vec<crate::core::Hit>, took_ms: f64) -> api::SearchResponse {
    api::SearchResponse {
        hits: hits
            .into_iter()
            .map(|hit| wire_hit(&hit.id, hit.score, hit.payload, hit.vector))
            .collect(),
        took_ms,
    }
}

#[tonic::async_trait]
impl Quiver for ClientApi {
    async fn create_collection(
        &self,
        request: Request<api::CreateCollectionRequest>,
    ) -> Result<Response<api::CreateCollectionResponse>, Status> {
        self.serve(
            request,
            "create_collection",
            Access::Admin,
            |message| async {
                let spec = message
                    .spec
                    .ok_or_else(|| GatewayError::invalid("`spec` is required"))?;
                let collection = self.gateway.create_collection(spec).await?;
                Ok(api::CreateCollectionResponse {
                    collection: Some(collection),
                })
            },
        )
        .await
    }

    async fn list_collections(
        &self,
        request: Request<api::ListCollectionsRequest>,
    ) -> Result<Response<api::ListCollectionsResponse>, Status> {
        self.serve(request, "list_collections", Access::Read, |_| async {
            let collections = self.gateway.list_collections().await?;
            Ok(api::ListCollectionsResponse { collections })
        })
        .await
    }

    async fn describe_collection(
        &self,
        request: Request<api::DescribeCollectionRequest>,
    ) -> Result<Response<api::DescribeCollectionResponse>, Status> {
        self.serve(
            request,
            "describe_collection",
            Access::Read,
            |message| async move {
                let (collection, stats) = self.gateway.describe(&message.name).await?;
                Ok(api::DescribeCollectionResponse {
                    info: Some(api::CollectionInfo {
                        collection: Some(collection),
                        stats: Some(api::CollectionStats {
                            points: stats.points,
                            segments: stats.segments,
                            wal_tail_rows: stats.wal_tail_rows,
                            bytes: stats.bytes,
                        }),
                    }),
                })
            },
        )
        .await
    }

    async fn drop_collection(
        &self,
        request: Request<api::DropCollectionRequest>,
    ) -> Result<Response<api::DropCollectionResponse>, Status> {
        self.serve(
            request,
            "drop_collection",
            Access::Admin,
            |message| async move {
                self.gateway.drop_collection(&message.name).await?;
                Ok(api::DropCollectionResponse {})
            },
        )
        .await
    }

    async fn upsert(
        &self,
        request: Request<api::UpsertRequest>,
    ) -> Result<Response<api::WriteResponse>, Status> {
        self.serve(request, "upsert", Access::Write, |message| async move {
            let points = upsert_points(message.points)?;
            let sequence = self.gateway.upsert(&message.collection, points).await?;
            Ok(api::WriteResponse { sequence })
        })
        .await
    }

    async fn delete(
        &self,
        request: Request<api::DeleteRequest>,
    ) -> Result<Response<api::WriteResponse>, Status> {
        self.serve(request, "delete", Access::Write, |message| async move {
            let ids = ids_of(&message.ids)?;
            let sequence = self.gateway.delete(&message.collection, ids).await?;
            Ok(api::WriteResponse { sequence })
        })
        .await
    }

    async fn get_points(
        &self,
        request: Request<api::GetPointsRequest>,
    ) -> Result<Response<api::GetPointsResponse>, Status> {
        self.serve(request, "get", Access::Read, |message| async move {
            let ids = ids_of(&message.ids)?;
            let points = self
                .gateway
                .get(
                    &message.collection,
                    ids,
                    message.include_vector,
                    Consistency::Strong,
                )
                .await?;
            Ok(api::GetPointsResponse {
                points: points
                    .into_iter()
                    .map(|point| data::Point {
                        id: Some(wire_point_id(&point.id)),
                        vector: point.vector.unwrap_or_default(),
                        payload_json: point
                            .payload
                            .map(|payload| serde_json::to_vec(&payload).unwrap_or_default())
                            .unwrap_or_default(),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn search(
        &self,
        request: Request<api::SearchRequest>,
    ) -> Result<Response<api::SearchResponse>, Status> {
        self.serve(request, "search", Access::Read, |message| async move {
            let collection = message.collection.clone();
            let input = search_input(message, self.gateway.limits())?;
            let (hits, took_ms) = self.gateway.search(&collection, input).await?;
            Ok(hits_of(hits, took_ms))
        })
        .await
    }

    async fn search_batch(
        &self,
        request: Request<api::SearchBatchRequest>,
    ) -> Result<Response<api::SearchBatchResponse>, Status> {
        self.serve(
            request,
            "search_batch",
            Access::Read,
            |message| async move {
                let limits = self.gateway.limits();
                if message.searches.len() > limits.max_batch_searches {
                    return Err(GatewayError::invalid(format!(
                        "{} searches in one batch; the limit is {}",
                        message.searches.len(),
                        limits.max_batch_searches
                    )));
                }
                let inputs = message
                    .searches
                    .into_iter()
                    .enumerate()
                    .map(|(index, search)| {
                        // An inner search names the batch's collection or none.
                        if !search.collection.is_empty() && search.collection != message.collection
                        {
                            return Err(GatewayError::invalid(format!(
                                "searches[{index}]: collection {:?} differs from the batch's \
                                 collection {:?} (leave it empty or name the same one)",
                                search.collection, message.collection
                            )));
                        }
                        search_input(search, limits)
                            .map_err(|error| error.with_context(format!("searches[{index}]")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let results = self
                    .gateway
                    .search_batch(&message.collection, inputs)
                    .await?
                    .into_iter()
                    .map(|(hits, took_ms, _)| hits_of(hits, took_ms))
                    .collect();
                Ok(api::SearchBatchResponse { results })
            },
        )
        .await
    }
}
