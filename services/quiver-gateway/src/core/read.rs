//! Reads: gets and searches, sent to one searcher per shard (the next replica
//! when one fails), merged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use quiver_index::{Metric, PointId};
use quiver_proto::convert::{point_id, shard_of, wire_point_id};
use quiver_proto::data;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::{ErrorCode, LocalSearcher, RpcChannel, meta as pb};

use crate::core::join::SearchLanes;
use crate::core::validate::{
    check_id, check_search_options, parse_payload, prepare_search, stored_payload, validate_name,
};
use crate::core::{Consistency, Gateway, Hit, PointOut, SearchCost, SearchInput};
use crate::error::{GatewayError, GatewayResult, is_unreachable, timed_out_here};
use crate::metrics::METRICS;
use crate::request_id::outgoing;
use crate::routing::{CollectionRoute, ShardPlacement, unreachable_retry_after};

/// Longest wait of a read for a shard that has no searcher yet (see
/// [`Gateway::on_searchers`]): meta places a new shard at once, or within its
/// control interval (1 s by default).
pub(crate) const SEARCHER_WAIT: Duration = Duration::from_secs(3);

/// A searcher to call: over gRPC, or — in `quiver standalone` — its handlers
/// in this process, called with the messages as they are (no protobuf encoding
/// of the query and of the hits with their payloads, no HTTP/2 framing).
pub(crate) enum SearcherStub {
    /// A searcher over gRPC, and its address (its lane in [`SearchLanes`]).
    Remote(SearcherClient<RpcChannel>, Arc<SearchLanes>, String),
    Local(LocalSearcher, Duration),
}

/// The searcher methods the gateway calls, each over either path.
macro_rules! searcher_methods {
    ($($method:ident($request:ty) -> $response:ty, $path:literal;)*) => {
        impl SearcherStub {
            $(
                pub(crate) async fn $method(
                    &mut self,
                    request: tonic::Request<$request>,
                ) -> Result<tonic::Response<$response>, tonic::Status> {
                    match self {
                        SearcherStub::Remote(client, ..) => client.$method(request).await,
                        SearcherStub::Local(searcher, timeout) => {
                            let searcher = searcher.clone();
                            let timeout = *timeout;
                            let metadata = request.metadata().clone();
                            quiver_proto::call_local($path, metadata, timeout, async move {
                                searcher.$method(request).await
                            })
                            .await
                        }
                    }
                }
            )*
        }
    };
}

impl SearcherStub {
    /// One search: over gRPC through the searcher's lane (joined with the
    /// searches waiting for the same shard when the searcher is busy, see
    /// [`SearchLanes`]), or in this process directly.
    pub(crate) async fn search_joined(
        self,
        request: tonic::Request<data::SearchRequest>,
    ) -> Result<tonic::Response<data::SearchResponse>, tonic::Status> {
        match self {
            SearcherStub::Remote(client, lanes, address) => {
                lanes.search(&address, client, request).await
            }
            mut local => local.search(request).await,
        }
    }
}

searcher_methods! {
    search(data::SearchRequest) -> data::SearchResponse, "/quiver.v1.data.Searcher/Search";
    search_batch(data::SearchBatchRequest) -> data::SearchBatchResponse, "/quiver.v1.data.Searcher/SearchBatch";
    get(data::GetRequest) -> data::GetResponse, "/quiver.v1.data.Searcher/Get";
    shard_stats(data::ShardStatsRequest) -> data::ShardStatsResponse, "/quiver.v1.data.Searcher/ShardStats";
}

impl Gateway {
    /// Calls `call` on the shard's searchers of collection `name` in turn until
    /// one answers. A shard with no searcher yet (just created, or its searcher
    /// just replaced) gets a bounded wait for one ([`SEARCHER_WAIT`]) before the
    /// call fails with `UNAVAILABLE`; so does a shard whose every searcher could
    /// not be reached, for one at another address (a restarted searcher
    /// registers its new address a moment after it starts: `quiver standalone`
    /// restarted answered its first reads `UNAVAILABLE: tcp connect error`) —
    /// only within [`SEARCHER_WAIT`] of this gateway first failing to reach it:
    /// a searcher gone for longer (killed, its shard not moved yet) gets an
    /// answer at once, naming it, with a retry hint sized to when meta moves
    /// the shard ([`unreachable_error`]).
    pub(super) async fn on_searchers<T, F, Fut>(
        &self,
        name: &str,
        placement: &ShardPlacement,
        call: F,
    ) -> GatewayResult<T>
    where
        F: Fn(SearcherStub) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut order = self.router.searcher_order(placement);
        let mut waited = false;
        if order.is_empty() {
            let wait = SEARCHER_WAIT.min(self.router.request_timeout());
            order = self
                .router
                .wait_for_searchers(name, placement.shard, wait, &[])
                .await;
            waited = true;
        }
        if order.is_empty() {
            return Err(GatewayError::unavailable(format!(
                "shard {} of collection `{name}` has no live searcher right now",
                placement.shard
            )));
        }
        let mut tried: Vec<String> = Vec::new();
        let mut unreachable: Vec<UnreachableSearcher> = Vec::new();
        let mut last_error: Option<GatewayError> = None;
        loop {
            for (node_id, address) in std::mem::take(&mut order) {
                tried.push(address.clone());
                let local = quiver_proto::local_searcher(&address);
                let remote = local.is_none();
                let stub = match local {
                    Some(searcher) => {
                        self.router.count_searcher_call(true);
                        SearcherStub::Local(searcher, self.router.request_timeout())
                    }
                    None => SearcherStub::Remote(
                        SearcherClient::new(self.router.searcher_channel(&address)?)
                            .max_decoding_message_size(64 << 20)
                            .max_encoding_message_size(64 << 20),
                        self.search_lanes.clone(),
                        address.clone(),
                    ),
                };
                // On the heap: a searcher call's future (a gRPC client call) is
                // kilobytes, which this future and the caller's `join_all` would
                // otherwise hold and copy as they move.
                match Box::pin(call(stub)).await {
                    Ok(response) => {
                        self.router.searcher_reachable(&address);
                        return Ok(response.into_inner());
                    }
                    Err(status) => {
                        let mut error = GatewayError::from_status(&status);
                        if timed_out_here(&status) {
                            error = error.with_context(format!(
                                "shard {} of collection `{name}`, searcher at {address}",
                                placement.shard
                            ));
                        }
                        if remote && error.code == ErrorCode::Unavailable && is_unreachable(&status)
                        {
                            let unreachable_for = self.router.searcher_unreachable(
                                &node_id,
                                &address,
                                &error.message,
                            );
                            unreachable.push(UnreachableSearcher {
                                node_id: node_id.clone(),
                                address: address.clone(),
                                cause: error.message.clone(),
                                unreachable_for,
                            });
                        }
                        // Another replica may well answer: this one is down, damaged,
                        // slow, shutting down (cancelled) or full (its search queue).
                        // The last error is the answer when none does.
                        if !matches!(
                            error.code,
                            ErrorCode::Unavailable
                                | ErrorCode::Internal
                                | ErrorCode::DataLoss
                                | ErrorCode::DeadlineExceeded
                                | ErrorCode::Cancelled
                                | ErrorCode::ResourceExhausted
                        ) {
                            return Err(error);
                        }
                        tracing::debug!(shard = placement.shard, %address, %error, "searcher failed; trying another replica");
                        last_error = Some(error);
                    }
                }
            }
            let last_unavailable = last_error
                .as_ref()
                .is_some_and(|error| error.code == ErrorCode::Unavailable);
            if waited || !last_unavailable {
                break;
            }
            // Every searcher known failed, the last one unavailable: wait once,
            // bounded, for one at an address not tried yet — for a searcher this
            // gateway could not reach, only within SEARCHER_WAIT of its first
            // failure, so that a searcher that is gone does not hold every read
            // of its shard until meta moves it.
            let newest_failure = unreachable
                .iter()
                .map(|searcher| searcher.unreachable_for)
                .min();
            let wait = SEARCHER_WAIT
                .saturating_sub(newest_failure.unwrap_or(Duration::ZERO))
                .min(self.router.request_timeout());
            if wait.is_zero() {
                break;
            }
            waited = true;
            order = self
                .router
                .wait_for_searchers(name, placement.shard, wait, &tried)
                .await;
            if order.is_empty() {
                break;
            }
        }
        let last_error =
            last_error.unwrap_or_else(|| GatewayError::unavailable("no searcher answered"));
        if last_error.code == ErrorCode::Unavailable && !unreachable.is_empty() {
            return Err(unreachable_error(
                name,
                placement.shard,
                &unreachable,
                self.router.move_after(),
            ));
        }
        Err(last_error)
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
            Some(self.on_searchers(name, placement, move |mut client| {
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
            let request = shard_search(&route, placement, &input, &filter);
            self.on_searchers(name, placement, move |client| {
                let request = request.clone();
                async move { client.search_joined(outgoing(request)).await }
            })
        });
        let answers = join_all(calls)
            .await
            .into_iter()
            .collect::<GatewayResult<Vec<_>>>()?;
        let (hits, cost) = merge_shard_answers(spec.metric, &input, answers);
        let took_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok((hits, took_ms, cost))
    }

    /// Runs several searches of one collection together, answering each in
    /// order: one routing round for the batch (linearizable when any search is
    /// strong), one call per shard carrying every search (the searcher runs
    /// the batch segment group by segment group, see its
    /// `ShardView::search_batch`), then each search's shard answers merged.
    /// An empty batch is refused (`INVALID_ARGUMENT`), as an upsert of no
    /// points is; an invalid search refuses the batch, naming it
    /// (`searches[i]`); each answer's `took_ms` is the batch's.
    pub async fn search_batch(
        &self,
        name: &str,
        inputs: Vec<SearchInput>,
    ) -> GatewayResult<Vec<(Vec<Hit>, f64, SearchCost)>> {
        let started = Instant::now();
        validate_name(name)?;
        let named = |index: usize| {
            move |error: GatewayError| error.with_context(format!("searches[{index}]"))
        };
        // Like an upsert of no points: an empty batch is a client's mistake.
        if inputs.is_empty() {
            return Err(GatewayError::invalid("searches must not be empty"));
        }
        for (index, input) in inputs.iter().enumerate() {
            check_search_options(&self.limits, input).map_err(named(index))?;
        }
        let consistency = if inputs
            .iter()
            .any(|input| input.consistency == Consistency::Strong)
        {
            Consistency::Strong
        } else {
            Consistency::Eventual
        };
        let route = self.read_route(name, consistency).await?;
        let spec = Self::spec_of(&route)?;
        let filters = inputs
            .iter()
            .enumerate()
            .map(|(index, input)| prepare_search(&spec, name, input).map_err(named(index)))
            .collect::<GatewayResult<Vec<_>>>()?;
        let calls = route.shards.iter().map(|placement| {
            let searches: Vec<data::SearchRequest> = inputs
                .iter()
                .zip(&filters)
                .map(|(input, filter)| shard_search(&route, placement, input, filter))
                .collect();
            let request = data::SearchBatchRequest {
                shard: searches[0].shard,
                min_manifest_version: searches
                    .iter()
                    .map(|search| search.min_manifest_version)
                    .max()
                    .unwrap_or(0),
                searches,
            };
            self.on_searchers(name, placement, move |mut client| {
                let request = request.clone();
                async move {
                    match client.search_batch(outgoing(request.clone())).await {
                        // A searcher from before batch search: one at a time.
                        Err(status) if status.code() == tonic::Code::Unimplemented => {
                            let mut results = Vec::with_capacity(request.searches.len());
                            for search in request.searches {
                                results.push(client.search(outgoing(search)).await?.into_inner());
                            }
                            Ok(tonic::Response::new(data::SearchBatchResponse {
                                results,
                                manifest_version: 0,
                            }))
                        }
                        answer => answer,
                    }
                }
            })
        });
        let mut per_search: Vec<Vec<data::SearchResponse>> = inputs
            .iter()
            .map(|_| Vec::with_capacity(route.shards.len()))
            .collect();
        for answer in join_all(calls).await {
            let answer = answer?;
            if answer.results.len() != inputs.len() {
                return Err(GatewayError::internal(format!(
                    "a searcher answered {} of a batch of {} searches",
                    answer.results.len(),
                    inputs.len()
                )));
            }
            for (answers, result) in per_search.iter_mut().zip(answer.results) {
                answers.push(result);
            }
        }
        let took_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(inputs
            .iter()
            .zip(per_search)
            .map(|(input, answers)| {
                let (hits, cost) = merge_shard_answers(spec.metric, input, answers);
                (hits, took_ms, cost)
            })
            .collect())
    }
}

/// A searcher a read could not reach, and for how long this gateway has
/// failed to reach it.
struct UnreachableSearcher {
    node_id: String,
    address: String,
    cause: String,
    unreachable_for: Duration,
}

/// Returns the answer to a read of shard `shard` of collection `name` whose
/// every searcher failed, some of them unreachable: `UNAVAILABLE` naming the
/// shard, the collection and each unreachable searcher, with a retry hint of
/// the time left until meta moves the shard (`move_after` after the searcher's
/// last heartbeat; the oldest failure seen here bounds that from above).
fn unreachable_error(
    name: &str,
    shard: u32,
    unreachable: &[UnreachableSearcher],
    move_after: Duration,
) -> GatewayError {
    let oldest_failure = unreachable
        .iter()
        .map(|searcher| searcher.unreachable_for)
        .max()
        .unwrap_or(Duration::ZERO);
    let retry_after = unreachable_retry_after(move_after, oldest_failure);
    let searchers = unreachable
        .iter()
        .map(|searcher| {
            format!(
                "searcher `{}` at {} is unreachable ({})",
                searcher.node_id, searcher.address, searcher.cause
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut error = GatewayError::unavailable(format!(
        "shard {shard} of collection `{name}` has no reachable searcher right now: {searchers}; \
         the request can be retried: meta moves the shard to a live searcher once the \
         searcher has missed heartbeats for {:.1} s (retry in about {:.1} s)",
        move_after.as_secs_f64(),
        retry_after.as_secs_f64()
    ));
    error.retry_after = Some(retry_after);
    error
}

/// The search of one shard a collection search sends.
fn shard_search(
    route: &CollectionRoute,
    placement: &ShardPlacement,
    input: &SearchInput,
    filter: &str,
) -> data::SearchRequest {
    data::SearchRequest {
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
        filter: filter.to_string(),
        include_payload: input.include_payload,
        include_vector: input.include_vector,
    }
}

/// Returns `score` as a finite number, so that no answer carries `null` (JSON
/// has no infinity or NaN) or a score no client can compare: an infinite one
/// becomes `±f32::MAX`, a NaN the worst finite score of `metric`. Vectors the
/// API accepts never overflow a score (`quiver_index::MAX_SQUARED_LENGTH`);
/// rows stored before that bound existed still can.
pub(crate) fn finite_score(metric: Metric, score: f32) -> f32 {
    if score.is_nan() {
        return if metric == Metric::L2 {
            f32::MAX
        } else {
            -f32::MAX
        };
    }
    score.clamp(-f32::MAX, f32::MAX)
}

/// Merges the shards' answers to one search: the best `k` hits and the summed
/// cost (times of the slowest shard).
fn merge_shard_answers(
    metric: Metric,
    input: &SearchInput,
    answers: Vec<data::SearchResponse>,
) -> (Vec<Hit>, SearchCost) {
    let mut hits = Vec::new();
    let mut cost = SearchCost::default();
    for answer in answers {
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
            cost.store_waits = cost.store_waits.max(shard_cost.store_waits);
            cost.search_ms = cost.search_ms.max(shard_cost.search_ms);
        }
        for hit in answer.hits {
            let Some(id) = hit.id.as_ref().and_then(point_id) else {
                continue;
            };
            hits.push(Hit {
                id,
                score: finite_score(metric, hit.score),
                payload: if input.include_payload {
                    stored_payload(hit.payload_json)
                } else {
                    None
                },
                vector: input.include_vector.then_some(hit.vector),
            });
        }
    }
    if metric == Metric::L2 {
        hits.sort_by(|a, b| a.score.total_cmp(&b.score));
    } else {
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    }
    hits.truncate(input.k);
    METRICS.search_hits.observe(hits.len() as f64);
    (hits, cost)
}

#[cfg(test)]
mod finite_score_tests {
    use super::*;

    #[test]
    fn a_score_is_always_a_finite_number() {
        assert_eq!(finite_score(Metric::Dot, f32::INFINITY), f32::MAX);
        assert_eq!(finite_score(Metric::Dot, f32::NEG_INFINITY), -f32::MAX);
        assert_eq!(finite_score(Metric::Dot, f32::NAN), -f32::MAX);
        assert_eq!(finite_score(Metric::Cosine, f32::NAN), -f32::MAX);
        assert_eq!(finite_score(Metric::L2, f32::NAN), f32::MAX);
        assert_eq!(finite_score(Metric::L2, 2.5), 2.5);
        assert_eq!(finite_score(Metric::Dot, -0.5), -0.5);
    }
}

#[cfg(test)]
mod unreachable_tests {
    use super::*;

    #[test]
    fn an_unreachable_searcher_is_named_with_a_hint_sized_to_its_shard_move() {
        let unreachable = [UnreachableSearcher {
            node_id: "searcher-2".into(),
            address: "127.0.0.1:7971".into(),
            cause: "tcp connect error".into(),
            unreachable_for: Duration::from_millis(2_500),
        }];
        let error = unreachable_error("docs", 1, &unreachable, Duration::from_secs(11));
        assert_eq!(error.code, ErrorCode::Unavailable);
        for needle in [
            "shard 1 of collection `docs`",
            "searcher `searcher-2` at 127.0.0.1:7971 is unreachable (tcp connect error)",
            "can be retried",
        ] {
            assert!(
                error.message.contains(needle),
                "{needle}: {}",
                error.message
            );
        }
        // Meta moves the shard 11 s after the last heartbeat at the latest,
        // which was before the first failure 2.5 s ago.
        assert_eq!(error.retry_after, Some(Duration::from_millis(8_500)));
        // Past the move: come back soon, not never.
        assert_eq!(
            unreachable_retry_after(Duration::from_secs(11), Duration::from_secs(30)),
            Duration::from_secs(1)
        );
    }
}
