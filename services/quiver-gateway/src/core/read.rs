//! Reads: gets and searches, sent to one searcher per shard (the next replica
//! when one fails), merged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use quiver_index::{Metric, PointId};
use quiver_proto::convert::{point_id, shard_of, wire_point_id};
use quiver_proto::data;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::{ErrorCode, RpcChannel, meta as pb};

use crate::core::validate::{
    check_id, check_search_options, parse_payload, prepare_search, validate_name,
};
use crate::core::{Consistency, Gateway, Hit, PointOut, SearchCost, SearchInput};
use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;
use crate::request_id::outgoing;
use crate::routing::{CollectionRoute, ShardPlacement};

impl Gateway {
    /// Calls `call` on the shard's searchers in turn until one answers.
    pub(super) async fn on_searchers<T, F, Fut>(
        &self,
        placement: &ShardPlacement,
        call: F,
    ) -> GatewayResult<T>
    where
        F: Fn(SearcherClient<RpcChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let order = self.router.searcher_order(placement);
        if order.is_empty() {
            return Err(GatewayError::unavailable(format!(
                "shard {} has no live searcher right now",
                placement.shard
            )));
        }
        let mut last_error = None;
        for address in order {
            let client = SearcherClient::new(self.router.searcher_channel(&address)?)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            match call(client).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => {
                    let error = GatewayError::from_status(&status);
                    if !matches!(
                        error.code,
                        ErrorCode::Unavailable
                            | ErrorCode::Internal
                            | ErrorCode::DataLoss
                            | ErrorCode::DeadlineExceeded
                    ) {
                        return Err(error);
                    }
                    tracing::debug!(shard = placement.shard, %address, %error, "searcher failed; trying another replica");
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| GatewayError::unavailable("no searcher answered")))
    }

    async fn read_route(
        &self,
        name: &str,
        consistency: Consistency,
    ) -> GatewayResult<Arc<CollectionRoute>> {
        match consistency {
            Consistency::Strong => self.router.route_linearizable(name).await,
            Consistency::Eventual => self.router.route(name).await,
        }
    }

    /// Returns the points with these ids (missing ids are left out).
    pub async fn get(
        &self,
        name: &str,
        ids: Vec<PointId>,
        include_vector: bool,
        consistency: Consistency,
    ) -> GatewayResult<Vec<PointOut>> {
        validate_name(name)?;
        if ids.len() > self.limits.max_batch_points {
            return Err(GatewayError::invalid(format!(
                "{} ids in one request; the limit is {}",
                ids.len(),
                self.limits.max_batch_points
            )));
        }
        let route = self.read_route(name, consistency).await?;
        let spec = Self::spec_of(&route)?;
        for (index, id) in ids.iter().enumerate() {
            check_id(&spec, id)
                .map_err(|message| GatewayError::invalid(format!("ids[{index}]: {message}")))?;
        }
        let shards = route.spec().shards.max(1);
        let mut by_shard: HashMap<u32, Vec<data::PointId>> = HashMap::new();
        for id in &ids {
            by_shard
                .entry(shard_of(id, shards))
                .or_default()
                .push(wire_point_id(id));
        }
        let calls = by_shard.into_iter().filter_map(|(shard, shard_ids)| {
            let placement = route
                .shards
                .iter()
                .find(|placement| placement.shard == shard)?;
            let request = data::GetRequest {
                shard: Some(pb::ShardRef {
                    collection_id: route.collection.collection_id,
                    shard,
                }),
                min_manifest_version: if consistency == Consistency::Strong {
                    placement.manifest_version
                } else {
                    0
                },
                ids: shard_ids,
                include_vector,
            };
            Some(self.on_searchers(placement, move |mut client| {
                let request = request.clone();
                async move { client.get(outgoing(request)).await }
            }))
        });
        let mut found: HashMap<PointId, PointOut> = HashMap::new();
        for answer in join_all(calls).await {
            for point in answer?.points {
                let Some(id) = point.id.as_ref().and_then(point_id) else {
                    continue;
                };
                found.insert(
                    id.clone(),
                    PointOut {
                        id,
                        payload: parse_payload(&point.payload_json),
                        vector: include_vector.then_some(point.vector),
                    },
                );
            }
        }
        Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
    }

    /// Searches every shard (one replica each, in parallel) and merges the best `k`.
    pub async fn search(&self, name: &str, input: SearchInput) -> GatewayResult<(Vec<Hit>, f64)> {
        self.search_with_cost(name, input)
            .await
            .map(|(hits, took_ms, _)| (hits, took_ms))
    }

    /// Like [`Gateway::search`], with what the search cost.
    pub async fn search_with_cost(
        &self,
        name: &str,
        input: SearchInput,
    ) -> GatewayResult<(Vec<Hit>, f64, SearchCost)> {
        let started = Instant::now();
        validate_name(name)?;
        check_search_options(&self.limits, &input)?;
        let route = self.read_route(name, input.consistency).await?;
        let spec = Self::spec_of(&route)?;
        let filter = prepare_search(&spec, name, &input)?;
        let calls = route.shards.iter().map(|placement| {
            let request = data::SearchRequest {
                shard: Some(pb::ShardRef {
                    collection_id: route.collection.collection_id,
                    shard: placement.shard,
                }),
                min_manifest_version: if input.consistency == Consistency::Strong {
                    placement.manifest_version
                } else {
                    0
                },
                vector: input.vector.clone(),
                k: input.k as u32,
                nprobe: input.nprobe.unwrap_or(0),
                rescore: input.rescore.unwrap_or(0),
                filter: filter.clone(),
                include_payload: input.include_payload,
                include_vector: input.include_vector,
            };
            self.on_searchers(placement, move |mut client| {
                let request = request.clone();
                async move { client.search(outgoing(request)).await }
            })
        });
        let mut hits = Vec::new();
        let mut cost = SearchCost::default();
        for answer in join_all(calls).await {
            let answer = answer?;
            if let Some(shard_cost) = &answer.cost {
                cost.shards += 1;
                cost.segments += shard_cost.segments;
                cost.rows_scanned += shard_cost.rows_scanned;
                cost.rows_rescored += shard_cost.rows_rescored;
                cost.tail_rows_scored += shard_cost.tail_rows_scored;
                cost.cache_regions_hit += shard_cost.cache_regions_hit;
                cost.cache_regions_missed += shard_cost.cache_regions_missed;
                cost.bytes_fetched += shard_cost.bytes_fetched;
                cost.row_reads_local += shard_cost.row_reads_local;
                cost.row_reads_remote += shard_cost.row_reads_remote;
                cost.store_wait_ms = cost.store_wait_ms.max(shard_cost.store_wait_ms);
                cost.search_ms = cost.search_ms.max(shard_cost.search_ms);
            }
            for hit in answer.hits {
                let Some(id) = hit.id.as_ref().and_then(point_id) else {
                    continue;
                };
                hits.push(Hit {
                    id,
                    score: hit.score,
                    payload: if input.include_payload {
                        parse_payload(&hit.payload_json)
                    } else {
                        None
                    },
                    vector: input.include_vector.then_some(hit.vector),
                });
            }
        }
        if spec.metric == Metric::L2 {
            hits.sort_by(|a, b| a.score.total_cmp(&b.score));
        } else {
            hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        }
        hits.truncate(input.k);
        let took_ms = started.elapsed().as_secs_f64() * 1e3;
        METRICS.search_hits.observe(hits.len() as f64);
        Ok((hits, took_ms, cost))
    }
}
