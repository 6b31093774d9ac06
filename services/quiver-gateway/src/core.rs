//! The client API's operations, shared by the REST and gRPC front ends:
//! validation (nothing of a bad request is written), routing writes to the
//! shard's indexer and searches to one ready replica per shard, merging.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use quiver_index::{Filter, Metric, PointId, SegmentSpec, validate_point};
use quiver_proto::convert::{collection_from_proto, point_id, shard_of, wire_point_id};
use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::data::{self, write_record};
use quiver_proto::{ErrorCode, meta as pb};
use serde_json::Value;

use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;
use crate::request_id::outgoing;
use crate::routing::{CollectionRoute, Router, ShardPlacement};

/// Request limits; each is enforced with an INVALID_ARGUMENT naming it.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Points per upsert, ids per delete or get.
    pub max_batch_points: usize,
    /// Bytes of one point's payload (as JSON).
    pub max_payload_bytes: usize,
    /// Largest `k`.
    pub max_k: usize,
    /// Searches per batch.
    pub max_batch_searches: usize,
    /// Shards per collection.
    pub max_shards: u32,
    /// Largest `rescore` multiple.
    pub max_rescore: u32,
    /// Bytes of one request: a REST body or a gRPC message.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch_points: 10_000,
            max_payload_bytes: 64 << 10,
            max_k: 10_000,
            max_batch_searches: 256,
            max_shards: 1024,
            max_rescore: 1000,
            max_request_bytes: 128 << 20,
        }
    }
}

/// Read consistency of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    /// At least as new as every write acknowledged before the request began.
    #[default]
    Strong,
    /// Whatever the searchers hold now.
    Eventual,
}

impl Consistency {
    /// Parses `strong` or `eventual`.
    pub fn parse(text: &str) -> GatewayResult<Self> {
        match text {
            "strong" => Ok(Consistency::Strong),
            "eventual" => Ok(Consistency::Eventual),
            other => Err(GatewayError::invalid(format!(
                "consistency must be \"strong\" or \"eventual\", got {other:?}"
            ))),
        }
    }
}

/// One point to upsert.
#[derive(Clone, Debug)]
pub struct UpsertPoint {
    pub id: PointId,
    pub vector: Vec<f32>,
    pub payload: Option<Value>,
}

/// One search.
#[derive(Clone, Debug)]
pub struct SearchInput {
    pub vector: Vec<f32>,
    pub k: usize,
    /// A filter: its string form, or its JSON tree.
    pub filter: Option<Value>,
    pub nprobe: Option<u32>,
    pub rescore: Option<u32>,
    pub consistency: Consistency,
    pub include_payload: bool,
    pub include_vector: bool,
}

/// One hit of a collection search.
#[derive(Clone, Debug)]
pub struct Hit {
    pub id: PointId,
    pub score: f32,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

/// A point read by id.
#[derive(Clone, Debug)]
pub struct PointOut {
    pub id: PointId,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

/// What a search cost, summed over shards (time: the slowest shard).
#[derive(Clone, Copy, Debug, Default)]
pub struct SearchCost {
    pub shards: u64,
    pub segments: u64,
    pub rows_scanned: u64,
    pub rows_rescored: u64,
    pub tail_rows_scored: u64,
    pub search_ms: f64,
    /// Cache regions found in the searchers' caches.
    pub cache_regions_hit: u64,
    /// Cache regions fetched from object storage.
    pub cache_regions_missed: u64,
    /// Bytes fetched from object storage.
    pub bytes_fetched: u64,
}

/// Live statistics of a collection.
#[derive(Clone, Debug, Default)]
pub struct CollectionStats {
    pub points: u64,
    pub segments: u64,
    pub wal_tail_rows: u64,
    pub bytes: u64,
}

/// The gateway's engine.
/// What an admin compaction did while the caller waited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Merges finished by the shards that are done.
    pub merges: u32,
    /// Shards whose compaction is still running (ask again to wait for them).
    pub running_shards: Vec<u32>,
}

pub struct Gateway {
    router: Arc<Router>,
    limits: Limits,
    write_deadline: Duration,
    compact_wait: Duration,
}

fn is_retryable(error: &GatewayError) -> bool {
    matches!(
        error.code,
        ErrorCode::Unavailable | ErrorCode::FailedPrecondition
    )
}

/// Checks a collection name: 1–255 bytes of `[A-Za-z0-9_-]`.
pub fn validate_name(name: &str) -> GatewayResult<()> {
    if name.is_empty()
        || name.len() > 255
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    {
        return Err(GatewayError::invalid(format!(
            "collection name {name:?} must be 1-255 characters of A-Z, a-z, 0-9, _ and -"
        )));
    }
    Ok(())
}

impl Gateway {
    /// Returns a gateway routing through `router`.
    pub fn new(router: Arc<Router>, limits: Limits) -> Self {
        Gateway {
            router,
            limits,
            write_deadline: Duration::from_secs(15),
            compact_wait: Duration::from_secs(24),
        }
    }

    /// Sets how long [`Gateway::compact`] waits before reporting the shards
    /// still compacting.
    pub fn with_compact_wait(mut self, wait: Duration) -> Self {
        self.compact_wait = wait;
        self
    }

    /// Returns the router.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// Returns the limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Creates a collection (an identical existing one is returned as is).
    pub async fn create_collection(
        &self,
        mut spec: pb::CollectionSpec,
    ) -> GatewayResult<pb::Collection> {
        validate_name(&spec.name)?;
        if spec.dimension == 0 || spec.dimension > 65_536 {
            return Err(GatewayError::invalid(format!(
                "dimension must be 1..=65536, got {}",
                spec.dimension
            )));
        }
        if spec.shards == 0 {
            spec.shards = 1;
        }
        if spec.shards > self.limits.max_shards {
            return Err(GatewayError::invalid(format!(
                "shards must be at most {}, got {}",
                self.limits.max_shards, spec.shards
            )));
        }
        if spec.replication == 0 {
            spec.replication = 1;
        }
        let response = self.router.meta().create_collection(spec).await?;
        // New shards get their indexer and searchers within a control interval;
        // the next request re-reads the table if it does not know the name yet.
        let _ = self.router.refresh().await;
        response.collection.ok_or_else(|| {
            GatewayError::new(ErrorCode::Internal, "meta answered without the collection")
        })
    }

    /// Lists the collections.
    pub async fn list_collections(&self) -> GatewayResult<Vec<pb::Collection>> {
        Ok(self.router.meta().list_collections(true).await?)
    }

    /// Drops a collection; its objects are garbage-collected.
    pub async fn drop_collection(&self, name: &str) -> GatewayResult<()> {
        validate_name(name)?;
        self.router.meta().drop_collection(name).await?;
        self.router.forget(name);
        Ok(())
    }

    /// Returns a collection with its live statistics (deletions applied).
    pub async fn describe(&self, name: &str) -> GatewayResult<(pb::Collection, CollectionStats)> {
        validate_name(name)?;
        let route = self.router.route_linearizable(name).await?;
        let reference = |shard: u32| pb::ShardRef {
            collection_id: route.collection.collection_id,
            shard,
        };
        let calls = route.shards.iter().map(|placement| {
            let request = data::ShardStatsRequest {
                shard: Some(reference(placement.shard)),
                min_manifest_version: placement.manifest_version,
            };
            self.on_searchers(placement, move |mut client| async move {
                client.shard_stats(outgoing(request)).await
            })
        });
        let mut stats = CollectionStats::default();
        for answer in join_all(calls).await {
            let answer = answer?;
            stats.points += answer.live_points;
            stats.segments += answer.segments;
            stats.wal_tail_rows += answer.wal_tail_rows;
            stats.bytes += answer.segment_bytes;
        }
        Ok((route.collection.clone(), stats))
    }

    fn spec_of(route: &CollectionRoute) -> GatewayResult<SegmentSpec> {
        collection_from_proto(&route.collection)
            .map(|collection| SegmentSpec::for_collection(&collection))
            .map_err(|error| GatewayError::new(ErrorCode::Internal, error))
    }

    /// Validates and writes `points`; returns the write's sequence.
    pub async fn upsert(&self, name: &str, points: Vec<UpsertPoint>) -> GatewayResult<u64> {
        validate_name(name)?;
        if points.is_empty() {
            return Err(GatewayError::invalid("points must not be empty"));
        }
        if points.len() > self.limits.max_batch_points {
            return Err(GatewayError::invalid(format!(
                "{} points in one request; the limit is {}",
                points.len(),
                self.limits.max_batch_points
            )));
        }
        let route = self.router.route(name).await?;
        let spec = Self::spec_of(&route)?;
        let records = prepare_upsert(&spec, &self.limits, points)?;
        self.write(&route, records).await
    }

    /// Deletes `ids`; returns the write's sequence.
    pub async fn delete(&self, name: &str, ids: Vec<PointId>) -> GatewayResult<u64> {
        validate_name(name)?;
        if ids.is_empty() {
            return Err(GatewayError::invalid("ids must not be empty"));
        }
        if ids.len() > self.limits.max_batch_points {
            return Err(GatewayError::invalid(format!(
                "{} ids in one request; the limit is {}",
                ids.len(),
                self.limits.max_batch_points
            )));
        }
        let route = self.router.route(name).await?;
        let spec = Self::spec_of(&route)?;
        for (index, id) in ids.iter().enumerate() {
            check_id(&spec, id)
                .map_err(|message| GatewayError::invalid(format!("ids[{index}]: {message}")))?;
        }
        let records = ids
            .into_iter()
            .map(|id| {
                let record = data::WriteRecord {
                    op: Some(write_record::Op::Delete(wire_point_id(&id))),
                };
                (id, record)
            })
            .collect();
        self.write(&route, records).await
    }

    /// Sends each shard its records (in parallel), retrying while a lease moves.
    async fn write(
        &self,
        route: &CollectionRoute,
        records: Vec<(PointId, data::WriteRecord)>,
    ) -> GatewayResult<u64> {
        let shards = route.spec().shards.max(1);
        let mut by_shard: HashMap<u32, Vec<data::WriteRecord>> = HashMap::new();
        for (id, record) in records {
            by_shard
                .entry(shard_of(&id, shards))
                .or_default()
                .push(record);
        }
        let name = route.spec().name.clone();
        let collection_id = route.collection.collection_id;
        let writes = by_shard.into_iter().map(|(shard, records)| {
            let name = name.clone();
            async move {
                let request = data::WriteRequest {
                    shard: Some(pb::ShardRef {
                        collection_id,
                        shard,
                    }),
                    records,
                };
                self.write_shard(&name, shard, request).await
            }
        });
        let mut sequence = 0u64;
        for outcome in join_all(writes).await {
            let response = outcome?;
            sequence = sequence.max((response.epoch << 40) | response.seq);
        }
        Ok(sequence)
    }

    async fn write_shard(
        &self,
        name: &str,
        shard: u32,
        request: data::WriteRequest,
    ) -> GatewayResult<data::WriteResponse> {
        let deadline = Instant::now() + self.write_deadline;
        let mut backoff = Duration::from_millis(20);
        let mut route = self.router.route(name).await?;
        loop {
            let placement = route
                .shards
                .iter()
                .find(|placement| placement.shard == shard);
            let attempt = match placement.and_then(|placement| placement.indexer.clone()) {
                None => Err(GatewayError::unavailable(format!(
                    "shard {shard} of collection `{name}` has no live indexer right now"
                ))),
                Some((_, address, _)) => {
                    let mut client = IndexerClient::new(self.router.channel(&address)?)
                        .max_decoding_message_size(64 << 20)
                        .max_encoding_message_size(64 << 20);
                    client
                        .write(outgoing(request.clone()))
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|status| GatewayError::from_status(&status))
                }
            };
            match attempt {
                Ok(response) => return Ok(response),
                Err(error) if is_retryable(&error) && Instant::now() < deadline => {
                    tracing::debug!(collection = name, shard, %error, "write retry after routing refresh");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    self.router.refresh().await.ok();
                    route = self.router.route(name).await?;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Calls `call` on the shard's searchers in turn until one answers.
    async fn on_searchers<T, F, Fut>(&self, placement: &ShardPlacement, call: F) -> GatewayResult<T>
    where
        F: Fn(SearcherClient<tonic::transport::Channel>) -> Fut,
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
            let client = SearcherClient::new(self.router.channel(&address)?)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            match call(client).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => {
                    let error = GatewayError::from_status(&status);
                    if !matches!(
                        error.code,
                        ErrorCode::Unavailable | ErrorCode::Internal | ErrorCode::DeadlineExceeded
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

    /// Asks every shard's indexer to merge everything it can, and waits for up
    /// to about the request timeout. Compactions go on in the indexers past
    /// that (a large shard takes minutes); the shards still compacting are
    /// returned, and asking again joins them rather than starting over.
    pub async fn compact(&self, name: &str) -> GatewayResult<Compaction> {
        validate_name(name)?;
        let route = self.router.route_linearizable(name).await?;
        // Below the channel's own timeout, so that this answers first.
        let wait = self
            .compact_wait
            .min(self.router.request_timeout().mul_f64(0.8));
        let collection_id = route.collection.collection_id;
        let calls = route.shards.iter().map(|placement| async move {
            let Some((_, address, _)) = &placement.indexer else {
                return Err(GatewayError::unavailable(format!(
                    "shard {} has no live indexer right now",
                    placement.shard
                )));
            };
            let mut client = IndexerClient::new(self.router.channel(address)?);
            let call = client.compact(outgoing(data::ShardRequest {
                shard: Some(pb::ShardRef {
                    collection_id,
                    shard: placement.shard,
                }),
            }));
            match tokio::time::timeout(wait, call).await {
                Err(_still_running) => Ok((placement.shard, None)),
                Ok(answer) => answer
                    .map(|response| (placement.shard, Some(response.into_inner().merges)))
                    .map_err(|status| GatewayError::from_status(&status)),
            }
        });
        let mut compaction = Compaction::default();
        for answer in join_all(calls).await {
            match answer? {
                (_, Some(merges)) => compaction.merges += merges,
                (shard, None) => compaction.running_shards.push(shard),
            }
        }
        compaction.running_shards.sort_unstable();
        Ok(compaction)
    }
}

/// Checks the options of a search that need no collection: `k`, `nprobe`, `rescore`.
pub fn check_search_options(limits: &Limits, input: &SearchInput) -> GatewayResult<()> {
    if input.k == 0 || input.k > limits.max_k {
        return Err(GatewayError::invalid(format!(
            "k must be 1..={}, got {}",
            limits.max_k, input.k
        )));
    }
    if input.nprobe == Some(0) {
        return Err(GatewayError::invalid("nprobe must be at least 1, got 0"));
    }
    if let Some(rescore) = input.rescore
        && (rescore == 0 || rescore > limits.max_rescore)
    {
        return Err(GatewayError::invalid(format!(
            "rescore must be 1..={}, got {rescore}",
            limits.max_rescore
        )));
    }
    Ok(())
}

/// Checks a search against the collection (dimension, finite values, a filter on
/// declared fields of the right types); returns the filter's string form.
pub fn prepare_search(
    spec: &SegmentSpec,
    name: &str,
    input: &SearchInput,
) -> GatewayResult<String> {
    if input.vector.len() != spec.dim {
        return Err(GatewayError::invalid(format!(
            "vector has dimension {}, collection `{name}` has dimension {}",
            input.vector.len(),
            spec.dim
        )));
    }
    if let Some(position) = input.vector.iter().position(|value| !value.is_finite()) {
        return Err(GatewayError::invalid(format!(
            "vector has a non-finite value at position {position}"
        )));
    }
    match &input.filter {
        None | Some(Value::Null) => Ok(String::new()),
        Some(value) => {
            let filter = Filter::from_json(value).map_err(|error| {
                GatewayError::invalid(format!("filter: {}", describe_index_error(&error)))
            })?;
            filter.check(&spec.fields).map_err(|error| {
                GatewayError::invalid(format!("filter: {}", describe_index_error(&error)))
            })?;
            Ok(filter.to_string())
        }
    }
}

/// Checks every point against the collection and the payload limit; returns the
/// write records. Nothing is written when any point is wrong.
pub fn prepare_upsert(
    spec: &SegmentSpec,
    limits: &Limits,
    points: Vec<UpsertPoint>,
) -> GatewayResult<Vec<(PointId, data::WriteRecord)>> {
    let mut records = Vec::with_capacity(points.len());
    for (index, point) in points.into_iter().enumerate() {
        validate_point(
            spec,
            index,
            &point.id,
            &point.vector,
            point.payload.as_ref(),
        )
        .map_err(|error| {
            GatewayError::invalid(format!("points[{index}]: {}", describe_index_error(&error)))
        })?;
        let payload_json = match &point.payload {
            Some(payload) => serde_json::to_vec(payload).unwrap_or_default(),
            None => Vec::new(),
        };
        if payload_json.len() > limits.max_payload_bytes {
            return Err(GatewayError::invalid(format!(
                "points[{index}]: payload is {} bytes; the limit is {}",
                payload_json.len(),
                limits.max_payload_bytes
            )));
        }
        records.push((
            point.id.clone(),
            data::WriteRecord {
                op: Some(write_record::Op::Upsert(data::Point {
                    id: Some(wire_point_id(&point.id)),
                    vector: point.vector,
                    payload_json,
                })),
            },
        ));
    }
    Ok(records)
}

fn parse_payload(bytes: &[u8]) -> Option<Value> {
    if bytes.is_empty() {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

fn check_id(spec: &SegmentSpec, id: &PointId) -> Result<(), String> {
    match (id, spec.id_type) {
        (PointId::U64(_), quiver_index::IdType::U64) => Ok(()),
        (PointId::String(text), quiver_index::IdType::String) => {
            if text.is_empty() || text.len() > quiver_index::MAX_STRING_ID_BYTES {
                Err(format!(
                    "string id has {} bytes, expected 1..={}",
                    text.len(),
                    quiver_index::MAX_STRING_ID_BYTES
                ))
            } else {
                Ok(())
            }
        }
        (PointId::U64(_), quiver_index::IdType::String) => {
            Err("id is a number, but the collection's ids are strings".into())
        }
        (PointId::String(_), quiver_index::IdType::U64) => {
            Err("id is a string, but the collection's ids are unsigned integers".into())
        }
    }
}

/// Strips the engine's "invalid argument:" prefix; the code says it already.
fn describe_index_error(error: &quiver_index::IndexError) -> String {
    let text = error.to_string();
    text.strip_prefix("invalid argument: ")
        .map(str::to_string)
        .unwrap_or(text)
}
