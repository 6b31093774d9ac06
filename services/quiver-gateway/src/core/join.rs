//! Single searches to a busy searcher, joined into batches.
//!
//! Each call to a searcher over the network costs both processes a fixed
//! amount of work besides the search: HTTP/2 framing, protobuf, a socket write
//! and read on each side, the wake-ups of the tasks that carry it, and the
//! searcher's hand-off to its search pool and back. A searcher computes only as
//! many searches at once as it has CPU slots, and keeps them busy with as many
//! calls as it says in every answer (`SearchResponse.search_calls`: its slots,
//! more while its searches wait for the object store); more calls than that
//! only queue in its pool. So the gateway keeps at most that many calls in
//! flight to each searcher and holds the single searches that come meanwhile; when a call ends, the ones
//! waiting for the same shard leave together as one `SearchBatch` call (which
//! the searcher spreads over its slots, see its `batch_parts`). Under light
//! load nothing waits and every search is its own call; under load the fixed
//! cost is paid once per batch instead of once per search.
//!
//! Each search still gets its own answer. A batch the searcher refuses as a
//! whole for a reason that is not the searcher's state (an invalid search
//! among valid ones, a searcher from before batch search) is sent again one
//! search at a time, so each search gets its own answer; an error of the
//! searcher itself (unavailable, overloaded, deadline) is every joined
//! search's, and each goes on to the shard's next replica as a single search
//! would.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver_proto::data::searcher_client::SearcherClient;
use quiver_proto::{ErrorCode, RpcChannel, data, status_of};
use tokio::sync::oneshot;
use tonic::metadata::MetadataMap;

use crate::error::GatewayError;
use crate::metrics::METRICS;

/// Most searches one joined batch carries.
pub(crate) const MAX_JOINED: usize = 64;

/// Searches that may wait for a searcher per search slot it has, as its own
/// pool's queue holds 64 jobs per slot; past that a search is refused at once
/// with a retryable `RESOURCE_EXHAUSTED`, as the searcher would refuse it.
const WAITING_PER_SLOT: usize = 64;

type Answer = Result<data::SearchResponse, tonic::Status>;

/// What a searcher's answer said of its search pool.
#[derive(Clone, Copy)]
struct PoolSaid {
    slots: u32,
    calls: u32,
}

impl PoolSaid {
    fn of(answer: &data::SearchResponse) -> Self {
        PoolSaid {
            slots: answer.search_slots,
            calls: answer.search_calls,
        }
    }
}

/// The searches waiting for each searcher (by address), and the calls in
/// flight to it.
pub(crate) struct SearchLanes {
    lanes: Mutex<HashMap<String, Lane>>,
    /// Longest a joined search waits for its answer, its wait for a slot
    /// included (a call's own timeout, so a search never waits for two).
    timeout: Duration,
}

#[derive(Default)]
struct Lane {
    /// Calls to the searcher not answered yet.
    in_flight: usize,
    /// The searcher's search slots, from its last answer (None: not known yet,
    /// and then no search waits).
    slots: Option<usize>,
    /// The calls that keep those slots busy, from its last answer (None: not
    /// said, then the slots).
    calls: Option<usize>,
    waiting: VecDeque<Waiting>,
    /// How long a call to the searcher takes (a moving average; zero until
    /// one has ended), for the retry hint of a refused search.
    call_time: Duration,
}

struct Waiting {
    request: data::SearchRequest,
    metadata: MetadataMap,
    reply: oneshot::Sender<Answer>,
}

impl Lane {
    /// Notes what the searcher said of its pool and how long a call took.
    fn learn(&mut self, pool: Option<PoolSaid>, took: Duration) {
        if let Some(pool) = pool {
            self.slots = (pool.slots > 0).then_some(pool.slots as usize);
            self.calls = (pool.calls > 0).then_some(pool.calls as usize);
        }
        self.call_time = if self.call_time.is_zero() {
            took
        } else {
            (self.call_time * 7 + took) / 8
        };
    }

    /// Refuses a search when as many wait as the searcher's own queue would
    /// hold: with a retry hint of the time the waiting ones take to leave.
    fn refuse_when_full(&self, address: &str) -> Result<(), tonic::Status> {
        let Some(slots) = self.slots else {
            return Ok(());
        };
        let slots = slots.max(1);
        if self.waiting.len() < slots * WAITING_PER_SLOT {
            return Ok(());
        }
        let batches_ahead = self.waiting.len().div_ceil(MAX_JOINED * slots) as u32 + 1;
        let retry_after = (self.call_time * batches_ahead).max(Duration::from_millis(1));
        let mut refusal = GatewayError::new(
            ErrorCode::ResourceExhausted,
            format!(
                "the searcher at {address} is busy: {} searches already wait for it (it \
                 computes {slots} at once); retry in about {} ms",
                self.waiting.len(),
                retry_after.as_millis()
            ),
        );
        refusal.retry_after = Some(retry_after);
        Err(status_of(&refusal))
    }

    fn has_room(&self) -> bool {
        self.slots
            .is_none_or(|slots| self.in_flight < self.calls.unwrap_or(slots).max(1))
    }

    /// Takes the next searches to send together: the oldest waiting search
    /// and the others waiting for its shard, up to [`MAX_JOINED`]. Searches
    /// whose caller has gone are dropped.
    fn take_batch(&mut self) -> Vec<Waiting> {
        self.waiting.retain(|waiting| !waiting.reply.is_closed());
        let Some(first) = self.waiting.pop_front() else {
            return Vec::new();
        };
        let shard = first.request.shard;
        let mut batch = vec![first];
        let mut index = 0;
        while index < self.waiting.len() && batch.len() < MAX_JOINED {
            if self.waiting[index].request.shard == shard {
                batch.extend(self.waiting.remove(index));
            } else {
                index += 1;
            }
        }
        batch
    }
}

impl SearchLanes {
    /// Lanes whose joined searches give up after `timeout`.
    pub(crate) fn new(timeout: Duration) -> Self {
        SearchLanes {
            lanes: Mutex::default(),
            timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lane>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `request` to the searcher at `address`: at once as its own call
    /// when the searcher has a free slot, else with the searches waiting for
    /// the same shard once a call to it ends.
    pub(crate) async fn search(
        self: &Arc<Self>,
        address: &str,
        mut client: SearcherClient<RpcChannel>,
        request: tonic::Request<data::SearchRequest>,
    ) -> Result<tonic::Response<data::SearchResponse>, tonic::Status> {
        let mut request = Some(request);
        let receiver = {
            let mut lanes = self.lock();
            let lane = lanes.entry(address.to_string()).or_default();
            if lane.has_room() && lane.waiting.is_empty() {
                lane.in_flight += 1;
                None
            } else {
                lane.refuse_when_full(address)?;
                let (metadata, _, request) = request.take().expect("not sent yet").into_parts();
                let (reply, receiver) = oneshot::channel();
                lane.waiting.push_back(Waiting {
                    request,
                    metadata,
                    reply,
                });
                Some(receiver)
            }
        };
        if let Some(receiver) = receiver {
            return match tokio::time::timeout(self.timeout, receiver).await {
                Ok(Ok(answer)) => answer.map(tonic::Response::new),
                Ok(Err(_)) => Err(tonic::Status::internal(
                    "the call carrying this search to its searcher ended without an answer",
                )),
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "the searcher at {address} did not answer within {:?} (the search \
                     waited for one of its calls in flight, then went with others)",
                    self.timeout
                ))),
            };
        }
        // This call holds a slot until it ends, or until it is dropped (its
        // client gone, its deadline passed): then the slot goes to the
        // searches waiting, if any.
        let slot = Slot {
            lanes: self.clone(),
            address: address.to_string(),
            client: Some(client.clone()),
        };
        let request = request.expect("not queued, so still here");
        let started = std::time::Instant::now();
        let answer = client.search(request).await;
        slot.learn(
            answer
                .as_ref()
                .ok()
                .map(|response| PoolSaid::of(response.get_ref())),
            started.elapsed(),
        );
        drop(slot);
        answer
    }

    /// Ends one call to `address`: its slot carries the searches waiting
    /// there, in batches, until none waits.
    fn release(self: Arc<Self>, address: String, client: SearcherClient<RpcChannel>) {
        let batch = {
            let mut lanes = self.lock();
            let Some(lane) = lanes.get_mut(&address) else {
                return;
            };
            let batch = lane.take_batch();
            if batch.is_empty() {
                lane.in_flight = lane.in_flight.saturating_sub(1);
                return;
            }
            batch
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send them on (shutting down): they fail, and the
            // slot is freed.
            let mut lanes = self.lock();
            if let Some(lane) = lanes.get_mut(&address) {
                lane.in_flight = lane.in_flight.saturating_sub(1);
            }
            for waiting in batch {
                let _ = waiting.reply.send(Err(tonic::Status::unavailable(
                    "the gateway is shutting down",
                )));
            }
            return;
        };
        runtime.spawn(async move {
            let mut batch = batch;
            loop {
                let started = std::time::Instant::now();
                let pool = send_joined(&client, batch).await;
                let mut lanes = self.lock();
                let Some(lane) = lanes.get_mut(&address) else {
                    return;
                };
                lane.learn(pool, started.elapsed());
                batch = lane.take_batch();
                if batch.is_empty() {
                    lane.in_flight = lane.in_flight.saturating_sub(1);
                    return;
                }
            }
        });
    }
}

/// A call's hold on one of its searcher's slots; released when dropped.
struct Slot {
    lanes: Arc<SearchLanes>,
    address: String,
    client: Option<SearcherClient<RpcChannel>>,
}

impl Slot {
    fn learn(&self, pool: Option<PoolSaid>, took: Duration) {
        let mut lanes = self.lanes.lock();
        if let Some(lane) = lanes.get_mut(&self.address) {
            lane.learn(pool, took);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            self.lanes
                .clone()
                .release(std::mem::take(&mut self.address), client);
        }
    }
}

/// Sends `batch` (searches of one shard) and hands each its answer; returns
/// what the searcher said of its pool, when it answered.
async fn send_joined(client: &SearcherClient<RpcChannel>, batch: Vec<Waiting>) -> Option<PoolSaid> {
    if batch.len() == 1 {
        let waiting = batch.into_iter().next().expect("one search");
        return send_alone(client, waiting).await;
    }
    let mut client = client.clone();
    METRICS.joined_batches.inc();
    METRICS.searches_joined.inc_by(batch.len() as u64);
    let shard = batch[0].request.shard;
    let request = data::SearchBatchRequest {
        shard,
        min_manifest_version: batch
            .iter()
            .map(|waiting| waiting.request.min_manifest_version)
            .max()
            .unwrap_or(0),
        searches: batch
            .iter()
            .map(|waiting| waiting.request.clone())
            .collect(),
    };
    // The batch travels under the first search's request id.
    let metadata = batch[0].metadata.clone();
    let answer = client
        .search_batch(tonic::Request::from_parts(
            metadata,
            tonic::Extensions::default(),
            request,
        ))
        .await;
    match answer {
        Ok(response) if response.get_ref().results.len() == batch.len() => {
            let results = response.into_inner().results;
            let pool = results.first().map(PoolSaid::of);
            for (waiting, result) in batch.into_iter().zip(results) {
                let _ = waiting.reply.send(Ok(result));
            }
            pool
        }
        Ok(response) => {
            let status = tonic::Status::internal(format!(
                "a searcher answered {} of a batch of {} searches",
                response.get_ref().results.len(),
                batch.len()
            ));
            for waiting in batch {
                let _ = waiting.reply.send(Err(status.clone()));
            }
            None
        }
        Err(status) if searcher_state(&status) => {
            for waiting in batch {
                let _ = waiting.reply.send(Err(status.clone()));
            }
            None
        }
        Err(_) => {
            // Refused as a batch for what one search is, or not understood:
            // each search alone, for its own answer.
            let singles = batch
                .into_iter()
                .map(|waiting| send_alone(&client, waiting));
            futures_util::future::join_all(singles).await;
            None
        }
    }
}

/// Sends one waiting search as its own call and hands it its answer; returns
/// what the searcher said of its pool, when it answered.
async fn send_alone(client: &SearcherClient<RpcChannel>, waiting: Waiting) -> Option<PoolSaid> {
    let request = tonic::Request::from_parts(
        waiting.metadata,
        tonic::Extensions::default(),
        waiting.request,
    );
    let answer = client
        .clone()
        .search(request)
        .await
        .map(tonic::Response::into_inner);
    let pool = answer.as_ref().ok().map(PoolSaid::of);
    let _ = waiting.reply.send(answer);
    pool
}

/// Tells whether `status` is about the searcher (down, overloaded, slow,
/// shutting down, damaged) rather than about a search: then it is every joined
/// search's answer, as it would have been each one's alone.
fn searcher_state(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::ResourceExhausted
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Internal
            | tonic::Code::DataLoss
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use quiver_proto::data::searcher_server::{Searcher, SearcherServer};
    use quiver_proto::meta::ShardRef;
    use tonic::{Request, Response, Status};

    use super::*;

    /// A searcher with one search slot over a real socket: a search's one hit
    /// is the point whose id is the search's `k`; `k = 99` is refused; each
    /// call takes `delay`, so that searches sent meanwhile wait and are joined.
    struct OneSlotSearcher {
        singles: AtomicUsize,
        batches: AtomicUsize,
        delay: Duration,
        /// The calls it says keep its slot busy (0: not said).
        calls: u32,
    }

    impl OneSlotSearcher {
        fn new(delay: Duration) -> Self {
            OneSlotSearcher {
                singles: AtomicUsize::new(0),
                batches: AtomicUsize::new(0),
                delay,
                calls: 0,
            }
        }
    }

    /// Serves `searcher` on a free port; returns its address and a client.
    async fn serve(searcher: Arc<OneSlotSearcher>) -> (String, SearcherClient<RpcChannel>) {
        serve_with_timeout(searcher, None).await
    }

    /// [`serve`], its client's channel giving up on a call after `timeout`.
    async fn serve_with_timeout(
        searcher: Arc<OneSlotSearcher>,
        timeout: Option<Duration>,
    ) -> (String, SearcherClient<RpcChannel>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let service = SearcherServer::from_arc(searcher);
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
        });
        let mut endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap();
        if let Some(timeout) = timeout {
            endpoint = endpoint.timeout(timeout);
        }
        let channel = endpoint.connect_lazy();
        (address, SearcherClient::new(RpcChannel::Remote(channel)))
    }

    fn answer(request: &data::SearchRequest, calls: u32) -> Result<data::SearchResponse, String> {
        if request.k == 99 {
            return Err("k must not be 99".into());
        }
        Ok(data::SearchResponse {
            hits: vec![data::Hit {
                id: Some(data::PointId {
                    kind: Some(data::point_id::Kind::Num(u64::from(request.k))),
                }),
                score: request.k as f32,
                ..Default::default()
            }],
            search_slots: 1,
            search_calls: calls,
            ..Default::default()
        })
    }

    #[tonic::async_trait]
    impl Searcher for OneSlotSearcher {
        async fn search(
            &self,
            request: Request<data::SearchRequest>,
        ) -> Result<Response<data::SearchResponse>, Status> {
            self.singles.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            answer(request.get_ref(), self.calls)
                .map(Response::new)
                .map_err(Status::invalid_argument)
        }

        async fn search_batch(
            &self,
            request: Request<data::SearchBatchRequest>,
        ) -> Result<Response<data::SearchBatchResponse>, Status> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            let mut results = Vec::new();
            for (index, search) in request.get_ref().searches.iter().enumerate() {
                results.push(answer(search, self.calls).map_err(|message| {
                    Status::invalid_argument(format!("searches[{index}]: {message}"))
                })?);
            }
            Ok(Response::new(data::SearchBatchResponse {
                results,
                manifest_version: 0,
            }))
        }

        async fn get(
            &self,
            _: Request<data::GetRequest>,
        ) -> Result<Response<data::GetResponse>, Status> {
            Err(Status::unimplemented("get"))
        }

        async fn shard_stats(
            &self,
            _: Request<data::ShardStatsRequest>,
        ) -> Result<Response<data::ShardStatsResponse>, Status> {
            Err(Status::unimplemented("shard_stats"))
        }
    }

    fn search(shard: u32, k: u32) -> tonic::Request<data::SearchRequest> {
        tonic::Request::new(data::SearchRequest {
            shard: Some(ShardRef {
                collection_id: 1,
                shard,
            }),
            k,
            ..Default::default()
        })
    }

    fn hit_id(response: &data::SearchResponse) -> u64 {
        match response.hits[0].id.as_ref().and_then(|id| id.kind.as_ref()) {
            Some(data::point_id::Kind::Num(id)) => *id,
            other => panic!("not a numeric id: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_past_the_request_timeout_is_deadline_exceeded_not_cancelled() {
        // tonic's own answer to a call past the channel's timeout is
        // `CANCELLED: Timeout expired` (HTTP 499 at the front door, as if the
        // client had gone); the gateway makes it what it is.
        let searcher = Arc::new(OneSlotSearcher::new(Duration::from_millis(600)));
        let (address, client) =
            serve_with_timeout(searcher, Some(Duration::from_millis(100))).await;
        let lanes = Arc::new(SearchLanes::new(Duration::from_secs(10)));
        let status = lanes
            .search(&address, client, search(0, 1))
            .await
            .expect_err("the searcher answers after the timeout");
        let error = crate::error::GatewayError::from_status(&status);
        assert_eq!(error.code, ErrorCode::DeadlineExceeded, "{status:?}");
        assert!(
            error.message.contains("request_timeout_ms"),
            "{}",
            error.message
        );
        assert!(crate::error::timed_out_here(&status));
        // A cancellation the node sends is left as it is.
        assert!(!crate::error::timed_out_here(&Status::cancelled(
            "shutting down"
        )));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_searches_leave_joined_and_each_gets_its_own_answer() {
        let searcher = Arc::new(OneSlotSearcher::new(Duration::from_millis(20)));
        let (address, client) = serve(searcher.clone()).await;
        let lanes = Arc::new(SearchLanes::new(Duration::from_secs(10)));

        // The first search learns the searcher's one slot.
        let first = lanes.search(&address, client.clone(), search(0, 1)).await;
        assert_eq!(hit_id(first.unwrap().get_ref()), 1);
        assert_eq!(lanes.lock()[&address].slots, Some(1));

        // Then 30 at once over two shards, one of them refused: while one call
        // is in flight the others wait, then leave per shard in batches; the
        // batch holding the refused search is sent again one by one.
        let calls = (0..30u32).map(|index| {
            let (lanes, client, address) = (lanes.clone(), client.clone(), address.clone());
            let k = if index == 17 { 99 } else { index + 2 };
            tokio::spawn(async move {
                (
                    k,
                    lanes.search(&address, client, search(index % 2, k)).await,
                )
            })
        });
        let mut answered = 0;
        for call in calls.collect::<Vec<_>>() {
            let (k, answer) = call.await.unwrap();
            match answer {
                Ok(response) => {
                    assert_eq!(hit_id(response.get_ref()), u64::from(k));
                    answered += 1;
                }
                Err(status) => {
                    assert_eq!(k, 99, "{status}");
                    assert_eq!(status.code(), tonic::Code::InvalidArgument);
                    assert!(status.message().contains("k must not be 99"), "{status}");
                }
            }
        }
        assert_eq!(answered, 29);
        assert!(
            searcher.batches.load(Ordering::SeqCst) >= 2,
            "searches over two shards while the one slot was busy: {} batches",
            searcher.batches.load(Ordering::SeqCst)
        );
        // Nothing left waiting, and the slot freed once the last call's task
        // has handed out its answers.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            {
                let lanes = lanes.lock();
                assert!(lanes[&address].waiting.is_empty());
                if lanes[&address].in_flight == 0 {
                    break;
                }
            }
            assert!(std::time::Instant::now() < deadline, "a slot is still held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_searchers_own_queue_a_search_is_refused_with_a_retry_hint() {
        let searcher = Arc::new(OneSlotSearcher::new(Duration::from_millis(400)));
        let (address, client) = serve(searcher.clone()).await;
        let lanes = Arc::new(SearchLanes::new(Duration::from_secs(10)));
        lanes
            .search(&address, client.clone(), search(0, 1))
            .await
            .expect("learns the one slot");
        // One call in flight for 400 ms, then 100 searches: 64 wait (the queue
        // a one-slot searcher holds), the rest are refused at once. Their `k`
        // stays clear of 99, which the searcher refuses: the order the tasks
        // reach the lane in is the scheduler's, so any of them may wait.
        let in_flight = tokio::spawn({
            let (lanes, client, address) = (lanes.clone(), client.clone(), address.clone());
            async move { lanes.search(&address, client, search(0, 2)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let calls: Vec<_> = (0..100u32)
            .map(|index| {
                let (lanes, client, address) = (lanes.clone(), client.clone(), address.clone());
                tokio::spawn(
                    async move { lanes.search(&address, client, search(0, index + 100)).await },
                )
            })
            .collect();
        let (mut answered, mut refused) = (0, 0);
        for call in calls {
            match call.await.unwrap() {
                Ok(_) => answered += 1,
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                    assert!(
                        status.message().contains("64 searches already wait"),
                        "{status}"
                    );
                    let hint = status
                        .metadata()
                        .get(quiver_common::RETRY_AFTER_MS_HEADER)
                        .expect("a retry hint");
                    let hint: u64 = hint.to_str().unwrap().parse().unwrap();
                    assert!((1..=2_000).contains(&hint), "{hint}");
                    refused += 1;
                }
            }
        }
        assert_eq!((answered, refused), (64, 36));
        assert!(in_flight.await.unwrap().is_ok());
    }

    #[test]
    fn a_batch_is_the_oldest_search_and_the_others_of_its_shard_still_wanted() {
        let mut lane = Lane::default();
        let mut receivers = Vec::new();
        for (shard, k) in [(0, 1), (1, 2), (0, 3), (0, 4)] {
            let (reply, receiver) = oneshot::channel();
            lane.waiting.push_back(Waiting {
                request: search(shard, k).into_inner(),
                metadata: MetadataMap::new(),
                reply,
            });
            receivers.push(receiver);
        }
        // The caller of k = 4 went away.
        drop(receivers.pop());
        let batch = lane.take_batch();
        let ks: Vec<u32> = batch.iter().map(|waiting| waiting.request.k).collect();
        assert_eq!(ks, [1, 3]);
        assert_eq!(lane.waiting.len(), 1);
        assert_eq!(lane.waiting[0].request.k, 2);
        // Room: unlimited until the searcher says its slots.
        assert!(lane.has_room());
        lane.slots = Some(1);
        lane.in_flight = 1;
        assert!(!lane.has_room());
        // A searcher whose searches wait for the store takes more calls.
        lane.calls = Some(2);
        assert!(lane.has_room());
        lane.in_flight = 2;
        assert!(!lane.has_room());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_searcher_waiting_for_the_store_gets_as_many_calls_as_it_says() {
        // One slot, but its searches wait for the store: it says 4 calls keep
        // the slot busy, so 4 searches at once go as 4 calls, none joined (a
        // joined batch would wait for its searches' round trips one after
        // another).
        let searcher = Arc::new(OneSlotSearcher {
            calls: 4,
            ..OneSlotSearcher::new(Duration::from_millis(200))
        });
        let (address, client) = serve(searcher.clone()).await;
        let lanes = Arc::new(SearchLanes::new(Duration::from_secs(10)));
        lanes
            .search(&address, client.clone(), search(0, 1))
            .await
            .expect("learns the searcher's pool");
        assert_eq!(lanes.lock()[&address].calls, Some(4));
        let calls: Vec<_> = (0..4u32)
            .map(|index| {
                let (lanes, client, address) = (lanes.clone(), client.clone(), address.clone());
                tokio::spawn(
                    async move { lanes.search(&address, client, search(0, index + 2)).await },
                )
            })
            .collect();
        for (index, call) in calls.into_iter().enumerate() {
            let response = call.await.unwrap().expect("answered");
            assert_eq!(hit_id(response.get_ref()), index as u64 + 2);
        }
        assert_eq!(searcher.batches.load(Ordering::SeqCst), 0, "none joined");
        assert_eq!(searcher.singles.load(Ordering::SeqCst), 5);
    }
}
