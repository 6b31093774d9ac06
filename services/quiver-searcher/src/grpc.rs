//! The searcher's gRPC service (`quiver.v1.data.Searcher`): search, get and
//! shard stats, each answered from the shard's view at least as new as the
//! request asks. Searches and point reads run on the node's bounded search pool
//! (never on the async workers), each thread with its own reused scratch space.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use quiver_index::{Filter, SearchScratch, SegmentSpec};
use quiver_proto::convert::{
    collection_from_proto, manifest_from_proto, point_id, wire_hit, wire_point_id,
};
use quiver_proto::data::searcher_server::Searcher;
use quiver_proto::data::{self};
use quiver_proto::meta as pb;
use quiver_proto::status_of;
use quiver_storage::manifest::{Manifest, ShardRef};
use tonic::{Request, Response, Status};

use crate::error::SearcherError;
use crate::metrics::METRICS;
use crate::node::NodeState;
use crate::reload::{ReloadTarget, ServedShard, note_read_error, reload};
use crate::search_pool::SearchPool;
use crate::shard::{QueryCost, SearchRequest, ShardHit, ShardView};

fn shard_ref(shard: &pb::ShardRef) -> ShardRef {
    ShardRef {
        collection_id: shard.collection_id.to_string(),
        shard: shard.shard,
    }
}

thread_local! {
    static SCRATCH: RefCell<SearchScratch> = RefCell::new(SearchScratch::new());
}

/// The service over one node's state.
pub(crate) struct SearcherGrpc {
    state: Arc<NodeState>,
}

impl SearcherGrpc {
    pub(crate) fn new(state: Arc<NodeState>) -> Self {
        SearcherGrpc { state }
    }

    /// Runs a read of `shard` on the search pool: a full pool's refusal and the
    /// read's own error both become its status (damage is noted against the shard).
    async fn on_pool<T: Send + 'static>(
        &self,
        shard: Option<&pb::ShardRef>,
        read: impl FnOnce() -> Result<T, SearcherError> + Send + 'static,
    ) -> Result<T, Status> {
        self.state
            .search_pool
            .run(read)
            .await
            .and_then(|result| result)
            .map_err(|error| {
                if let Some(shard) = shard {
                    note_read_error(&shard_ref(shard), &error);
                }
                status_of(&error)
            })
    }

    /// Serves a shard meta assigned to this node that the assignment loop has
    /// not picked up yet (a request raced it, e.g. just after a restart).
    async fn adopt(&self, reference: &ShardRef) -> Result<Arc<ServedShard>, Status> {
        let routing = self
            .state
            .meta
            .get_routing("", false)
            .await
            .map_err(|error| Status::unavailable(format!("routing unavailable: {error}")))?;
        let assigned = routing.shards.iter().any(|shard| {
            shard.shard.is_some_and(|candidate| {
                candidate.collection_id.to_string() == reference.collection_id
                    && candidate.shard == reference.shard
            }) && shard
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == self.state.config.node_id)
        });
        let collection = routing
            .collections
            .iter()
            .find(|collection| collection.collection_id.to_string() == reference.collection_id);
        let (true, Some(collection)) = (assigned, collection) else {
            return Err(Status::unavailable(format!(
                "shard {reference} is not served by searcher `{}`",
                self.state.config.node_id
            )));
        };
        let spec = collection_from_proto(collection)
            .map(|collection| SegmentSpec::for_collection(&collection))
            .map_err(Status::internal)?;
        let mut shards = self.state.shards.write().unwrap_or_else(|p| p.into_inner());
        Ok(shards
            .entry(reference.clone())
            .or_insert_with(|| Arc::new(ServedShard::new(spec)))
            .clone())
    }

    /// Returns the shard's view, at least `min_version` new.
    async fn view(
        &self,
        shard: Option<&pb::ShardRef>,
        min_version: u64,
    ) -> Result<Arc<ShardView>, Status> {
        let shard = shard.ok_or_else(|| Status::invalid_argument("`shard` is required"))?;
        let reference = shard_ref(shard);
        let served = match self.state.served(&reference) {
            Some(served) => served,
            None => self.adopt(&reference).await?,
        };
        match served.view() {
            Some(view) if view.manifest().version >= min_version => Ok(view),
            current => {
                // The served view may hold the same rows as the newer manifest
                // (only flushes and merges since): it answers, and the new
                // layout loads in the background.
                if let Some(view) = served.view_with_rows_of(min_version) {
                    METRICS.manifest_same_rows.inc();
                    return Ok(view);
                }
                let mut target = ReloadTarget::AtLeast {
                    version: min_version,
                    linearizable: true,
                };
                if let Some(view) = current {
                    match self
                        .same_rows_per_meta(shard, &reference, &served, view, min_version)
                        .await
                    {
                        SameRows::Yes(view) => {
                            METRICS.manifest_same_rows.inc();
                            return Ok(view);
                        }
                        SameRows::No(manifest) => target = ReloadTarget::Fetched(manifest),
                        SameRows::Unknown => {}
                    }
                }
                METRICS.manifest_waits.inc();
                reload(&self.state, &reference, &served, target, "query").await
            }
        }
    }

    /// Asks meta for the shard's manifest (linearizable): when it is at least
    /// `min_version` and has the served `view`'s rows (the same
    /// `last_committed`, see [`ServedShard::view_with_rows_of`]), the view
    /// answers and that manifest loads in the background. Otherwise the
    /// manifest read is the one the query's reload loads.
    async fn same_rows_per_meta(
        &self,
        shard: &pb::ShardRef,
        reference: &ShardRef,
        served: &Arc<ServedShard>,
        view: Arc<ShardView>,
        min_version: u64,
    ) -> SameRows {
        let Ok(manifest) = self.state.meta.get_manifest(*shard, true).await else {
            return SameRows::Unknown;
        };
        let manifest = manifest_from_proto(&manifest);
        if manifest.version < min_version {
            return SameRows::Unknown;
        }
        if manifest.last_committed != view.manifest().last_committed {
            return SameRows::No(manifest);
        }
        served.note_same_rows(view.manifest().version, manifest.version);
        if served.want(manifest) {
            let state = self.state.clone();
            let reference = reference.clone();
            let served = served.clone();
            self.state.tasks.clone().spawn(async move {
                tokio::select! {
                    reloaded = reload(&state, &reference, &served, ReloadTarget::Announced, "query") => {
                        if let Err(error) = reloaded {
                            tracing::warn!(shard = %reference, %error, "shard reload failed");
                        }
                    }
                    _ = state.shutdown.cancelled() => {}
                }
            });
        }
        SameRows::Yes(view)
    }
}

/// Whether the served view holds the rows a strong read needs.
enum SameRows {
    /// It does: it answers.
    Yes(Arc<ShardView>),
    /// It does not: load this manifest (read for the check) first.
    No(Manifest),
    /// Meta did not say (no answer, or an older manifest than asked for).
    Unknown,
}

/// Cuts a batch of `len` searches into at most `jobs` consecutive parts of
/// nearly equal size (none empty): one per CPU slot of the search pool, or
/// more while searches wait for the store ([`crate::search_pool::SearchPool::calls`]).
fn batch_parts(len: usize, jobs: usize) -> Vec<std::ops::Range<usize>> {
    let parts = len.min(jobs.max(1));
    (0..parts)
        .map(|part| part * len / parts..(part + 1) * len / parts)
        .collect()
}

/// The shard search a wire request asks for (its filter parsed).
fn search_of(request: data::SearchRequest) -> Result<SearchRequest, Status> {
    let filter = if request.filter.is_empty() {
        None
    } else {
        Some(
            Filter::from_wire(&request.filter)
                .map_err(|error| Status::invalid_argument(error.message()))?,
        )
    };
    Ok(SearchRequest {
        vector: request.vector,
        k: request.k as usize,
        nprobe: (request.nprobe > 0).then_some(request.nprobe as usize),
        rescore: (request.rescore > 0).then_some(request.rescore as usize),
        filter,
        include_payload: request.include_payload,
        include_vector: request.include_vector,
    })
}

/// What a searcher tells its callers of its search pool in every answer.
#[derive(Clone, Copy)]
struct PoolSays {
    slots: u32,
    calls: u32,
}

impl PoolSays {
    fn of(pool: &SearchPool) -> Self {
        PoolSays {
            slots: u32::try_from(pool.slots()).unwrap_or(u32::MAX),
            calls: u32::try_from(pool.calls()).unwrap_or(u32::MAX),
        }
    }
}

/// The wire answer of one search.
fn answer_of(
    hits: Vec<ShardHit>,
    cost: QueryCost,
    manifest_version: u64,
    pool: PoolSays,
) -> data::SearchResponse {
    data::SearchResponse {
        search_slots: pool.slots,
        search_calls: pool.calls,
        hits: hits
            .into_iter()
            .map(|hit| wire_hit(&hit.id, hit.score, hit.payload, hit.vector))
            .collect(),
        manifest_version,
        cost: Some(data::SearchCost {
            segments: cost.segments,
            rows_scanned: cost.rows_scanned,
            rows_rescored: cost.rows_rescored,
            tail_rows_scored: cost.tail_rows_scored,
            search_ms: cost.search_ms,
            cache_regions_hit: cost.cache_regions_hit,
            cache_regions_missed: cost.cache_regions_missed,
            bytes_fetched: cost.bytes_fetched,
            row_reads_local: cost.row_reads_local,
            row_reads_remote: cost.row_reads_remote,
            store_wait_ms: cost.store_wait_ms,
            store_waits: cost.store_waits,
        }),
    }
}

#[tonic::async_trait]
impl Searcher for SearcherGrpc {
    async fn search(
        &self,
        request: Request<data::SearchRequest>,
    ) -> Result<Response<data::SearchResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        let shard = request.shard;
        let search = search_of(request)?;
        let context = self.state.context.clone();
        let searched_view = view.clone();
        let (hits, cost) = self
            .on_pool(shard.as_ref(), move || {
                SCRATCH.with(|scratch| {
                    searched_view.search_with_cost(&context, &search, &mut scratch.borrow_mut())
                })
            })
            .await?;
        METRICS.queries.inc();
        METRICS
            .query_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(answer_of(
            hits,
            cost,
            view.manifest().version,
            PoolSays::of(&self.state.search_pool),
        )))
    }

    /// A batch of searches of one shard: one view, the batch cut into one part
    /// per CPU slot of the search pool ([`batch_parts`]; more parts while
    /// searches wait for the store, so their waits overlap), each part one task
    /// on the pool run segment group by segment group
    /// ([`ShardView::search_batch`]), so a batch computes on every core instead
    /// of one. The answers come back in the batch's order; an invalid search
    /// refuses the whole batch before any of it runs.
    async fn search_batch(
        &self,
        request: Request<data::SearchBatchRequest>,
    ) -> Result<Response<data::SearchBatchResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        let mut searches = request
            .searches
            .into_iter()
            .enumerate()
            .map(|(index, search)| {
                search_of(search).map_err(|status| {
                    Status::new(
                        status.code(),
                        format!("searches[{index}]: {}", status.message()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        view.check_batch(&searches)
            .map_err(|error| status_of(&error))?;
        let count = searches.len();
        let parts: Vec<Vec<SearchRequest>> = batch_parts(count, self.state.search_pool.calls())
            .into_iter()
            .map(|range| searches.drain(..range.len()).collect())
            .collect();
        let shard = request.shard.as_ref();
        let answers = futures_util::future::try_join_all(parts.into_iter().map(|part| {
            let context = self.state.context.clone();
            let searched_view = view.clone();
            self.on_pool(shard, move || {
                SCRATCH.with(|scratch| {
                    searched_view.search_batch_checked(&context, &part, &mut scratch.borrow_mut())
                })
            })
        }))
        .await?;
        let answers = answers.into_iter().flatten();
        METRICS.queries.inc_by(count as u64);
        METRICS
            .query_seconds
            .observe(started.elapsed().as_secs_f64());
        let version = view.manifest().version;
        let pool = PoolSays::of(&self.state.search_pool);
        Ok(Response::new(data::SearchBatchResponse {
            results: answers
                .map(|(hits, cost)| answer_of(hits, cost, version, pool))
                .collect(),
            manifest_version: version,
        }))
    }

    async fn get(
        &self,
        request: Request<data::GetRequest>,
    ) -> Result<Response<data::GetResponse>, Status> {
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        let ids = request
            .ids
            .iter()
            .map(|id| point_id(id).ok_or_else(|| Status::invalid_argument("an id is empty")))
            .collect::<Result<Vec<_>, _>>()?;
        let include_vector = request.include_vector;
        let read_view = view.clone();
        let points = self
            .on_pool(request.shard.as_ref(), move || {
                read_view.get(&ids, include_vector)
            })
            .await?;
        Ok(Response::new(data::GetResponse {
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
            manifest_version: view.manifest().version,
        }))
    }

    async fn shard_stats(
        &self,
        request: Request<data::ShardStatsRequest>,
    ) -> Result<Response<data::ShardStatsResponse>, Status> {
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        Ok(Response::new(data::ShardStatsResponse {
            live_points: view.live_points(),
            segments: view.manifest().segments.len() as u64,
            wal_tail_rows: view.wal_tail_rows(),
            segment_bytes: view.segment_bytes(),
            manifest_version: view.manifest().version,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{Filter, batch_parts, data, search_of};

    #[test]
    fn a_filter_in_either_wire_form_is_read_and_a_bad_one_says_invalid_argument_once() {
        let request = |filter: &str| data::SearchRequest {
            vector: vec![0.5],
            k: 3,
            filter: filter.into(),
            ..data::SearchRequest::default()
        };
        for (wire, expected) in [
            ("lang in []", Filter::parse("lang in []").unwrap()),
            (
                r#"{"or": []}"#,
                Filter::from_json(&serde_json::json!({"or": []})).unwrap(),
            ),
            (
                r#"{"field": "my-field", "in": ["a"]}"#,
                Filter::from_json(&serde_json::json!({"field": "my-field", "in": ["a"]})).unwrap(),
            ),
        ] {
            let search = search_of(request(wire)).unwrap();
            assert_eq!(search.filter, Some(expected), "{wire}");
        }
        let status = search_of(request("lang = en")).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with("filter: "), "{status:?}");
        assert!(!status.message().contains("invalid argument"), "{status:?}");
    }

    #[test]
    fn a_batch_is_cut_into_one_part_per_slot_in_order() {
        assert_eq!(batch_parts(64, 2), vec![0..32, 32..64]);
        assert_eq!(batch_parts(7, 3), vec![0..2, 2..4, 4..7]);
        // Fewer searches than slots: one part each; no slot count: one part.
        assert_eq!(batch_parts(2, 8), vec![0..1, 1..2]);
        assert_eq!(batch_parts(5, 0), vec![0..5]);
        assert!(batch_parts(0, 4).is_empty());
        // Every search in exactly one part, in order.
        for len in 0..40 {
            for slots in 1..9 {
                let parts = batch_parts(len, slots);
                let covered: Vec<usize> = parts.iter().flat_map(|part| part.clone()).collect();
                assert_eq!(covered, (0..len).collect::<Vec<_>>(), "{len} / {slots}");
                assert!(parts.iter().all(|part| !part.is_empty()));
            }
        }
    }
}
