//! Writes: upserts and deletes split by shard and sent to each shard's indexer
//! in parallel, retried (full-jitter backoff, the indexer's retry hint honoured)
//! while a lease moves.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use quiver_common::RetryPolicy;
use quiver_index::PointId;
use quiver_proto::convert::{shard_of, wire_point_id};
use quiver_proto::data::indexer_client::IndexerClient;
use quiver_proto::data::{self, write_record};
use quiver_proto::{ErrorCode, meta as pb};

use crate::core::validate::{check_id, prepare_upsert, validate_name};
use crate::core::{Gateway, UpsertPoint};
use crate::error::{GatewayError, GatewayResult};
use crate::request_id::outgoing;
use crate::routing::CollectionRoute;

/// Tells whether a write refused with `error` may succeed on the shard's next
/// indexer: none is there now, or the lease moved under it.
fn is_retryable(error: &GatewayError) -> bool {
    matches!(
        error.code,
        ErrorCode::Unavailable | ErrorCode::FailedPrecondition
    )
}

/// How writes retry while a shard's lease moves; bounded in time by the
/// gateway's write deadline.
const WRITE_RETRY: RetryPolicy = RetryPolicy::new(
    usize::MAX,
    Duration::from_millis(20),
    Duration::from_millis(500),
);

impl Gateway {
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
        // Full jitter, bounded by the write deadline: after a failover every
        // gateway retries at once, and fixed delays would bring them back together.
        let mut backoff = WRITE_RETRY.with_max_elapsed(self.write_deadline).backoff();
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
            let error = match attempt {
                Ok(response) => return Ok(response),
                Err(error) if is_retryable(&error) => error,
                Err(error) => return Err(error),
            };
            let Some(delay) = backoff.next_delay_after(error.retry_after) else {
                return Err(error);
            };
            tracing::debug!(collection = name, shard, %error, ?delay, "write retry after routing refresh");
            tokio::time::sleep(delay).await;
            self.router.refresh().await.ok();
            route = self.router.route(name).await?;
        }
    }
}
