//! The gRPC front end (`quiver.v1.client.Quiver`): the same operations as REST,
//! with the same validation, API keys (`authorization: Bearer <key>` metadata)
//! and error codes.

use std::sync::Arc;

use quiver_proto::ErrorCode;
use quiver_proto::client::quiver_server::Quiver;
use quiver_proto::client::{self as api};
use quiver_proto::convert::{point_id, wire_point_id};
use quiver_proto::data;
use tonic::{Request, Response, Status};

use crate::auth::{Access, ApiKeys, Denied};
use crate::core::{Consistency, Gateway, SearchInput, UpsertPoint};
use crate::error::GatewayError;
use crate::metrics::METRICS;

/// The client API service.
pub struct ClientApi {
    pub gateway: Arc<Gateway>,
    pub keys: ApiKeys,
}

impl ClientApi {
    fn authorize<T>(&self, request: &Request<T>, needed: Access) -> Result<(), Status> {
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(|value| value.strip_prefix("Bearer ").unwrap_or(value).trim())
            .or_else(|| {
                request
                    .metadata()
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
            });
        match self.keys.check(presented, needed) {
            Ok(()) => Ok(()),
            Err(Denied::Unauthenticated) => {
                Err(Status::unauthenticated("missing or unknown API key"))
            }
            Err(Denied::PermissionDenied(access)) => Err(Status::permission_denied(format!(
                "this API key lacks {} access",
                access.name()
            ))),
        }
    }
}

fn finish<T>(route: &'static str, outcome: Result<T, GatewayError>) -> Result<Response<T>, Status> {
    let code = match &outcome {
        Ok(_) => "OK",
        Err(error) => error.code.as_str(),
    };
    METRICS.requests.with_label_values(&[route, code]).inc();
    outcome
        .map(Response::new)
        .map_err(|error| error.to_status())
}

fn ids_of(ids: &[data::PointId]) -> Result<Vec<quiver_index::PointId>, GatewayError> {
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
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|error| GatewayError::invalid(format!("{what}: payload is not JSON: {error}")))
}

fn search_input(request: api::SearchRequest) -> Result<SearchInput, GatewayError> {
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
    Ok(SearchInput {
        vector: request.vector,
        k: if request.k == 0 {
            10
        } else {
            request.k as usize
        },
        filter,
        nprobe: (request.nprobe > 0).then_some(request.nprobe),
        rescore: (request.rescore > 0).then_some(request.rescore),
        consistency: if request.consistency == api::Consistency::Eventual as i32 {
            Consistency::Eventual
        } else {
            Consistency::Strong
        },
        include_payload: request.include_payload,
        include_vector: request.include_vector,
    })
}

fn hits_of(hits: Vec<crate::core::Hit>, took_ms: f64) -> api::SearchResponse {
    api::SearchResponse {
        hits: hits
            .into_iter()
            .map(|hit| data::Hit {
                id: Some(wire_point_id(&hit.id)),
                score: hit.score,
                payload_json: hit
                    .payload
                    .map(|payload| serde_json::to_vec(&payload).unwrap_or_default())
                    .unwrap_or_default(),
                vector: hit.vector.unwrap_or_default(),
            })
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
        self.authorize(&request, Access::Admin)?;
        let outcome = match request.into_inner().spec {
            None => Err(GatewayError::invalid("`spec` is required")),
            Some(spec) => self.gateway.create_collection(spec).await,
        };
        finish(
            "create_collection",
            outcome.map(|collection| api::CreateCollectionResponse {
                collection: Some(collection),
            }),
        )
    }

    async fn list_collections(
        &self,
        request: Request<api::ListCollectionsRequest>,
    ) -> Result<Response<api::ListCollectionsResponse>, Status> {
        self.authorize(&request, Access::Read)?;
        let outcome = self.gateway.list_collections().await;
        finish(
            "list_collections",
            outcome.map(|collections| api::ListCollectionsResponse { collections }),
        )
    }

    async fn describe_collection(
        &self,
        request: Request<api::DescribeCollectionRequest>,
    ) -> Result<Response<api::DescribeCollectionResponse>, Status> {
        self.authorize(&request, Access::Read)?;
        let outcome = self.gateway.describe(&request.into_inner().name).await;
        finish(
            "describe_collection",
            outcome.map(|(collection, stats)| api::DescribeCollectionResponse {
                info: Some(api::CollectionInfo {
                    collection: Some(collection),
                    stats: Some(api::CollectionStats {
                        points: stats.points,
                        segments: stats.segments,
                        wal_tail_rows: stats.wal_tail_rows,
                        bytes: stats.bytes,
                    }),
                }),
            }),
        )
    }

    async fn drop_collection(
        &self,
        request: Request<api::DropCollectionRequest>,
    ) -> Result<Response<api::DropCollectionResponse>, Status> {
        self.authorize(&request, Access::Admin)?;
        let outcome = self
            .gateway
            .drop_collection(&request.into_inner().name)
            .await;
        finish(
            "drop_collection",
            outcome.map(|()| api::DropCollectionResponse {}),
        )
    }

    async fn upsert(
        &self,
        request: Request<api::UpsertRequest>,
    ) -> Result<Response<api::WriteResponse>, Status> {
        self.authorize(&request, Access::Write)?;
        let request = request.into_inner();
        let outcome = async {
            let points =
                request
                    .points
                    .into_iter()
                    .enumerate()
                    .map(|(index, point)| {
                        let what = format!("points[{index}]");
                        Ok(UpsertPoint {
                            id: point.id.as_ref().and_then(point_id).ok_or_else(|| {
                                GatewayError::invalid(format!("{what} has no id"))
                            })?,
                            payload: payload_of(&point.payload_json, &what)?,
                            vector: point.vector,
                        })
                    })
                    .collect::<Result<Vec<_>, GatewayError>>()?;
            self.gateway.upsert(&request.collection, points).await
        }
        .await;
        finish(
            "upsert",
            outcome.map(|sequence| api::WriteResponse { sequence }),
        )
    }

    async fn delete(
        &self,
        request: Request<api::DeleteRequest>,
    ) -> Result<Response<api::WriteResponse>, Status> {
        self.authorize(&request, Access::Write)?;
        let request = request.into_inner();
        let outcome = match ids_of(&request.ids) {
            Ok(ids) => self.gateway.delete(&request.collection, ids).await,
            Err(error) => Err(error),
        };
        finish(
            "delete",
            outcome.map(|sequence| api::WriteResponse { sequence }),
        )
    }

    async fn get_points(
        &self,
        request: Request<api::GetPointsRequest>,
    ) -> Result<Response<api::GetPointsResponse>, Status> {
        self.authorize(&request, Access::Read)?;
        let request = request.into_inner();
        let outcome = match ids_of(&request.ids) {
            Ok(ids) => {
                self.gateway
                    .get(
                        &request.collection,
                        ids,
                        request.include_vector,
                        Consistency::Strong,
                    )
                    .await
            }
            Err(error) => Err(error),
        };
        finish(
            "get",
            outcome.map(|points| api::GetPointsResponse {
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
            }),
        )
    }

    async fn search(
        &self,
        request: Request<api::SearchRequest>,
    ) -> Result<Response<api::SearchResponse>, Status> {
        self.authorize(&request, Access::Read)?;
        let request = request.into_inner();
        let collection = request.collection.clone();
        let outcome = match search_input(request) {
            Ok(input) => self.gateway.search(&collection, input).await,
            Err(error) => Err(error),
        };
        finish(
            "search",
            outcome.map(|(hits, took_ms)| hits_of(hits, took_ms)),
        )
    }

    async fn search_batch(
        &self,
        request: Request<api::SearchBatchRequest>,
    ) -> Result<Response<api::SearchBatchResponse>, Status> {
        self.authorize(&request, Access::Read)?;
        let request = request.into_inner();
        let outcome = async {
            if request.searches.len() > self.gateway.limits().max_batch_searches {
                return Err(GatewayError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "{} searches in one batch; the limit is {}",
                        request.searches.len(),
                        self.gateway.limits().max_batch_searches
                    ),
                ));
            }
            let mut results = Vec::new();
            for search in request.searches {
                let input = search_input(search)?;
                let (hits, took_ms) = self.gateway.search(&request.collection, input).await?;
                results.push(hits_of(hits, took_ms));
            }
            Ok(api::SearchBatchResponse { results })
        }
        .await;
        finish("search_batch", outcome)
    }
}
