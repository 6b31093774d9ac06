//! Collection operations: create, list, drop, describe (with live statistics
//! from the searchers), compact (on the indexers).

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use quiver_proto::data::{self, indexer_client::IndexerClient};
use quiver_proto::meta as pb;

use crate::core::validate::validate_name;
use crate::core::{CollectionStats, Compaction, Gateway};
use crate::error::{GatewayError, GatewayResult};
use crate::request_id::outgoing;

/// Longest wait of a create for the new collection's shards to be placed
/// (see [`Gateway::wait_until_servable`]).
const CREATE_WAIT: Duration = Duration::from_secs(5);

impl Gateway {
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
        let name = spec.name.clone();
        let response = self.router.meta().create_collection(spec).await?;
        let collection = response
            .collection
            .ok_or_else(|| GatewayError::internal("meta answered without the collection"))?;
        self.wait_until_servable(&name, CREATE_WAIT).await;
        Ok(collection)
    }

    /// Waits, for at most `wait`, until every shard of `name` has an indexer and
    /// a searcher (meta places a new collection's shards as it creates it, or
    /// within its control interval), so that a describe, search or write right
    /// after the create is served. When the wait runs out — no alive searcher
    /// or indexer, say — the collection exists all the same: the create still
    /// succeeds, and a read then waits briefly for a searcher itself.
    async fn wait_until_servable(&self, name: &str, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut delay = Duration::from_millis(20);
        loop {
            let servable = self
                .router
                .route_linearizable(name)
                .await
                .is_ok_and(|route| {
                    let expected = route.spec().shards.max(1) as usize;
                    route.shards.len() == expected
                        && route.shards.iter().all(|placement| {
                            placement.indexer.is_some() && !placement.searchers.is_empty()
                        })
                });
            let remaining = deadline.saturating_duration_since(Instant::now());
            if servable {
                return;
            }
            if remaining.is_zero() {
                tracing::info!(
                    collection = name,
                    wait_ms = wait.as_millis() as u64,
                    "created collection is not placed yet; reads will wait for a searcher"
                );
                return;
            }
            tokio::time::sleep(delay.min(remaining)).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
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
            self.on_searchers(name, placement, move |mut client| async move {
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
            // The indexer answers "running" when the wait is over: a call given
            // up here could lose the outcome it was about to carry.
            let call = client.compact(outgoing(data::ShardRequest {
                shard: Some(pb::ShardRef {
                    collection_id,
                    shard: placement.shard,
                }),
                compact_wait_ms: wait.as_millis().max(1) as u64,
            }));
            let answer = call
                .await
                .map_err(|status| GatewayError::from_status(&status))?;
            let answer = answer.into_inner();
            Ok((placement.shard, (!answer.running).then_some(answer.merges)))
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
