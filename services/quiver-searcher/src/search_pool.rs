//! The bounded CPU pool searches and point reads run on: a fixed number of CPU
//! slots (one per core by default) and jobs taken from a bounded queue. When the
//! queue is full a request is refused at once with a retryable overload error,
//! before any of it ran, so an overloaded searcher never half-answers and never
//! piles up unbounded blocking threads. A job whose caller went away (the
//! request was cancelled) is skipped when its turn comes.
//!
//! A job holds a slot while it computes, not while it waits for the object store:
//! a region fill gives the slot back (`quiver_blobcache::StoreWaitObserver`) and
//! another job runs meanwhile, on one of the pool's spare threads
//! ([`WAIT_THREADS_PER_SLOT`] per slot). With a cache smaller than the data, the
//! searcher then keeps its cores busy and its round trips overlapped instead of
//! idling one query's wait after another.
//!
//! How many jobs keep the slots busy depends on how long they wait: the pool
//! measures the share of its jobs' time spent waiting for the store and says
//! so ([`SearchPool::calls`]) — the searcher cuts a batch into that many jobs
//! and tells the gateway how many calls to keep in flight, so searches waiting
//! for the store overlap instead of waiting one after another in one job.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::SearcherError;
use crate::metrics::METRICS;

/// Threads per CPU slot: how many jobs may be in the pool at once (computing or
/// waiting for the store) per job computing.
pub(crate) const WAIT_THREADS_PER_SLOT: usize = 4;

/// The shortest wait an overloaded caller is told to take before retrying.
const MIN_OVERLOAD_RETRY_AFTER: Duration = Duration::from_millis(50);

/// The longest: past it a client had better try again and learn more.
const MAX_OVERLOAD_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Weight of the newest job in the moving average of job service time.
const SERVICE_TIME_WEIGHT: f64 = 0.1;

/// The pool logs that it refuses work at most once per interval.
const OVERLOAD_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Returns how long a request refused behind `queued` waiting jobs should wait
/// before retrying: the time the pool takes to drain them (and run the
/// request), `(queued + 1) × mean_service / slots`, within
/// [`MIN_OVERLOAD_RETRY_AFTER`]..[`MAX_OVERLOAD_RETRY_AFTER`]. A fixed 50 ms
/// hint, with 128 searches queued at ~50 a second (2.5 s of work), had clients
/// spend every retry before the queue drained.
pub(crate) fn overload_retry_after(
    queued: usize,
    mean_service: Duration,
    slots: usize,
) -> Duration {
    let jobs = u32::try_from(queued.saturating_add(1)).unwrap_or(u32::MAX);
    let slots = u32::try_from(slots.max(1)).unwrap_or(u32::MAX);
    (mean_service.saturating_mul(jobs) / slots)
        .clamp(MIN_OVERLOAD_RETRY_AFTER, MAX_OVERLOAD_RETRY_AFTER)
}

/// How many jobs keep `slots` slots busy when a job takes `service` seconds of
/// which it waits `store_wait` for the store: `slots × service / (service −
/// store_wait)`, rounded, within `slots..=slots × WAIT_THREADS_PER_SLOT`.
fn calls_for(slots: usize, service: f64, store_wait: f64) -> usize {
    if service <= 0.0 || store_wait <= 0.0 {
        return slots;
    }
    // A job that only waits (busy 0) divides to infinity, which the cast
    // saturates: the pool's threads.
    let busy = service - store_wait;
    ((slots as f64 * service / busy).round() as usize).clamp(slots, slots * WAIT_THREADS_PER_SLOT)
}

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Queue {
    jobs: VecDeque<(Instant, Job)>,
    stopping: bool,
    /// Jobs holding a CPU slot (computing, not waiting for the store).
    computing: usize,
    /// Pool threads asleep, waiting for a job they may run.
    idle_threads: usize,
    /// Jobs back from the store, waiting for a slot (they go before new jobs).
    resuming: usize,
    /// Times an idle thread woke and found nothing it could run.
    woken_for_nothing: u64,
    /// Moving average of the time a job took from its start to its end
    /// (store waits included), in seconds; 0 before the first job.
    mean_service_seconds: f64,
    /// Moving average of the time a job spent waiting for the store (from a
    /// fill's wait to its answer, not the wait for a slot after it, which the
    /// cache's `ReadCounts::store_wait_nanos` includes), seconds.
    mean_store_wait_seconds: f64,
    /// When the pool last logged that it refuses work.
    overload_logged_at: Option<Instant>,
    /// Requests refused since then.
    refused_since_log: u64,
}

impl Queue {
    /// Whether a new job may take a slot now: one is free and no job back from
    /// the store is waiting for it.
    fn room_for_a_new_job(&self, slots: usize) -> bool {
        self.computing + self.resuming < slots
    }
}

struct Shared {
    queue: Mutex<Queue>,
    /// Idle threads wait here for a job they may run.
    job_ready: Condvar,
    /// Jobs back from the store wait here for a free slot.
    slot_free: Condvar,
    capacity: usize,
    slots: usize,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a slot freed up: wakes the one waiter that takes it — a job back
    /// from the store first, else an idle thread when a job is queued. One
    /// wake-up per free slot, so a search costs no herd of threads woken for
    /// nothing (every enqueue and completion used to wake all of them).
    fn hand_on_slot(&self, queue: &Queue) {
        if queue.resuming > 0 {
            self.slot_free.notify_one();
        } else if !queue.jobs.is_empty() && queue.idle_threads > 0 {
            self.job_ready.notify_one();
        }
    }
}

thread_local! {
    /// When this pool thread's job began its current wait for the store.
    static STORE_WAIT_STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
    /// How long this pool thread's current job has waited for the store.
    static STORE_WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// A pool thread's job waiting for the object store gives its slot back.
struct SlotHandBack(Arc<Shared>);

impl quiver_blobcache::StoreWaitObserver for SlotHandBack {
    fn waiting(&self) {
        STORE_WAIT_STARTED.set(Some(Instant::now()));
        let mut queue = self.0.lock();
        queue.computing -= 1;
        METRICS.search_pool_busy.dec();
        self.0.hand_on_slot(&queue);
    }

    fn resumed(&self) {
        if let Some(started) = STORE_WAIT_STARTED.take() {
            STORE_WAITED.set(STORE_WAITED.get() + started.elapsed());
        }
        let mut queue = self.0.lock();
        queue.resuming += 1;
        // A stopping pool finishes what it runs without waiting for a slot.
        while queue.computing >= self.0.slots && !queue.stopping {
            queue = self
                .0
                .slot_free
                .wait(queue)
                .unwrap_or_else(|p| p.into_inner());
        }
        queue.resuming -= 1;
        queue.computing += 1;
        METRICS.search_pool_busy.inc();
    }
}

/// A fixed set of threads with a bounded queue in front of them.
pub(crate) struct SearchPool {
    shared: Arc<Shared>,
}

impl SearchPool {
    /// Starts a pool of `slots` CPU slots (0: one per core), with
    /// [`WAIT_THREADS_PER_SLOT`] threads per slot, behind a queue of
    /// `queue_capacity` waiting jobs (0: 64 per slot).
    pub(crate) fn new(slots: usize, queue_capacity: usize) -> Result<Self, SearcherError> {
        let slots = if slots == 0 {
            std::thread::available_parallelism().map_or(1, |cores| cores.get())
        } else {
            slots
        };
        let capacity = if queue_capacity == 0 {
            slots * 64
        } else {
            queue_capacity
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::with_capacity(capacity),
                stopping: false,
                computing: 0,
                idle_threads: 0,
                resuming: 0,
                woken_for_nothing: 0,
                mean_service_seconds: 0.0,
                mean_store_wait_seconds: 0.0,
                overload_logged_at: None,
                refused_since_log: 0,
            }),
            job_ready: Condvar::new(),
            slot_free: Condvar::new(),
            capacity,
            slots,
        });
        let threads = slots * WAIT_THREADS_PER_SLOT;
        for index in 0..threads {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("quiver-search-{index}"))
                .spawn(move || {
                    quiver_blobcache::observe_store_waits(Some(Arc::new(SlotHandBack(
                        shared.clone(),
                    ))));
                    work(&shared)
                })
                .map_err(|error| {
                    SearcherError::Internal(format!("cannot start search thread: {error}"))
                })?;
        }
        METRICS.search_pool_threads.set(slots as i64);
        METRICS.search_pool_calls.set(slots as i64);
        Ok(SearchPool { shared })
    }

    /// Returns how many searches may compute at once (CPU slots).
    pub(crate) fn slots(&self) -> usize {
        self.shared.slots
    }

    /// Returns how many jobs keep the slots busy now: the slots, times the
    /// jobs' time over their time not waiting for the store (a job waiting
    /// half its time, two per slot), within the slots and the pool's threads.
    pub(crate) fn calls(&self) -> usize {
        let queue = self.shared.lock();
        calls_for(
            self.shared.slots,
            queue.mean_service_seconds,
            queue.mean_store_wait_seconds,
        )
    }

    /// Runs `job` on a pool thread and returns its result; refuses it with
    /// [`SearcherError::Overloaded`] when the queue is full. Dropping the future
    /// before the job started means it never runs.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T, SearcherError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let wrapped: Job = Box::new(move || {
            if sender.is_closed() {
                METRICS.search_pool_abandoned.inc();
                return;
            }
            let _ = sender.send(job());
        });
        {
            let mut queue = self.shared.lock();
            if queue.stopping {
                return Err(SearcherError::Internal(
                    "the search pool is stopping".into(),
                ));
            }
            if queue.jobs.len() >= self.shared.capacity {
                METRICS.search_pool_rejected.inc();
                let queued = queue.jobs.len();
                let mean_service = Duration::from_secs_f64(queue.mean_service_seconds);
                let retry_after = overload_retry_after(queued, mean_service, self.shared.slots);
                queue.refused_since_log += 1;
                let log_now = queue
                    .overload_logged_at
                    .is_none_or(|logged| logged.elapsed() >= OVERLOAD_LOG_INTERVAL);
                if log_now {
                    queue.overload_logged_at = Some(Instant::now());
                    let refused = std::mem::take(&mut queue.refused_since_log);
                    drop(queue);
                    tracing::warn!(
                        queued,
                        slots = self.shared.slots,
                        mean_service_ms = mean_service.as_secs_f64() * 1e3,
                        retry_after_ms = retry_after.as_millis() as u64,
                        refused,
                        "searcher overloaded: its search queue is full, refusing searches (RESOURCE_EXHAUSTED) until it drains"
                    );
                }
                return Err(SearcherError::Overloaded {
                    queued,
                    retry_after,
                });
            }
            queue.jobs.push_back((Instant::now(), wrapped));
            METRICS.search_pool_queued.set(queue.jobs.len() as i64);
            // Wake one idle thread if the job may start now; otherwise the
            // thread that frees a slot takes it.
            if queue.room_for_a_new_job(self.shared.slots) && queue.idle_threads > 0 {
                self.shared.job_ready.notify_one();
            }
        }
        receiver
            .await
            .map_err(|_| SearcherError::Internal("a search job panicked".into()))
    }
}

fn work(shared: &Shared) {
    loop {
        let (queued_at, job) = {
            let mut queue = shared.lock();
            loop {
                if queue.room_for_a_new_job(shared.slots)
                    && let Some(entry) = queue.jobs.pop_front()
                {
                    queue.computing += 1;
                    METRICS.search_pool_queued.set(queue.jobs.len() as i64);
                    // Jobs queued while this thread was being woken may have
                    // room too: pass the wake-up on.
                    if !queue.jobs.is_empty()
                        && queue.room_for_a_new_job(shared.slots)
                        && queue.idle_threads > 0
                    {
                        shared.job_ready.notify_one();
                    }
                    break entry;
                }
                if queue.stopping && queue.jobs.is_empty() {
                    return;
                }
                queue.idle_threads += 1;
                queue = shared
                    .job_ready
                    .wait(queue)
                    .unwrap_or_else(|p| p.into_inner());
                queue.idle_threads -= 1;
                if (queue.jobs.is_empty() || !queue.room_for_a_new_job(shared.slots))
                    && !queue.stopping
                {
                    queue.woken_for_nothing += 1;
                }
            }
        };
        METRICS
            .search_pool_wait_seconds
            .observe(queued_at.elapsed().as_secs_f64());
        METRICS.search_pool_busy.inc();
        let started = Instant::now();
        STORE_WAITED.set(Duration::ZERO);
        // A panicking job drops its sender: the caller gets an internal error and
        // this thread goes on serving.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let service_seconds = started.elapsed().as_secs_f64();
        let store_wait_seconds = STORE_WAITED.take().as_secs_f64();
        METRICS.search_pool_busy.dec();
        let mut queue = shared.lock();
        queue.computing -= 1;
        let store_wait_seconds = store_wait_seconds.min(service_seconds);
        if queue.mean_service_seconds == 0.0 {
            queue.mean_service_seconds = service_seconds;
            queue.mean_store_wait_seconds = store_wait_seconds;
        } else {
            queue.mean_service_seconds +=
                SERVICE_TIME_WEIGHT * (service_seconds - queue.mean_service_seconds);
            queue.mean_store_wait_seconds +=
                SERVICE_TIME_WEIGHT * (store_wait_seconds - queue.mean_store_wait_seconds);
        }
        METRICS.search_pool_calls.set(calls_for(
            shared.slots,
            queue.mean_service_seconds,
            queue.mean_store_wait_seconds,
        ) as i64);
        // A job back from the store takes the slot; otherwise this thread takes
        // the next queued job itself, without waking another.
        if queue.resuming > 0 {
            shared.slot_free.notify_one();
        }
    }
}

impl Drop for SearchPool {
    /// Lets the threads finish the queued jobs and exit (not joined: the last
    /// owner may be an async task, which must not block).
    fn drop(&mut self) {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stopping = true;
        self.shared.job_ready.notify_all();
        self.shared.slot_free.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use quiver_proto::{ErrorCode, ServiceError};

    use super::*;

    #[tokio::test]
    async fn jobs_run_on_the_pool_and_return_their_result() {
        let pool = SearchPool::new(2, 4).expect("pool");
        let name = pool
            .run(|| std::thread::current().name().map(str::to_string))
            .await
            .expect("ran");
        assert!(name.is_some_and(|name| name.starts_with("quiver-search-")));
        assert_eq!(pool.run(|| 6 * 7).await.expect("ran"), 42);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_waiting_for_the_store_gives_its_slot_to_another() {
        // One slot: the first job waits for the store until the second one has
        // run — which it can only do on the slot the first gave back. (It gives
        // up after ~30 s of 1 ms naps, so a regression fails instead of hanging.)
        let pool = Arc::new(SearchPool::new(1, 4).expect("pool"));
        let second_ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first_waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first = tokio::spawn({
            let pool = pool.clone();
            let second_ran = second_ran.clone();
            let first_waiting = first_waiting.clone();
            async move {
                pool.run(move || {
                    quiver_blobcache::waiting_for_store(|| {
                        first_waiting.store(true, std::sync::atomic::Ordering::SeqCst);
                        for _ in 0..30_000 {
                            if second_ran.load(std::sync::atomic::Ordering::SeqCst) {
                                return true;
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        false
                    })
                })
                .await
            }
        });
        // The second job is queued once the first is waiting for the store (the
        // job says so itself: while it waits it holds no slot, so the queue alone
        // cannot tell it from a job that has not started).
        while !first_waiting.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            pool.shared.lock().computing,
            0,
            "a waiting job holds no slot"
        );
        let flag = second_ran.clone();
        pool.run(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
            .await
            .expect("the second job ran");
        assert!(
            first.await.expect("joined").expect("ran"),
            "the first job saw the second run while it waited"
        );
        // The slot goes back just after the answer: wait for it.
        for _ in 0..10_000 {
            if pool.shared.lock().computing == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("a slot was never given back");
    }

    #[test]
    fn the_calls_that_keep_the_slots_busy_grow_with_the_share_of_time_waited() {
        assert_eq!(calls_for(2, 0.0, 0.0), 2, "no job yet");
        assert_eq!(calls_for(2, 0.001, 0.0), 2, "jobs that only compute");
        assert_eq!(calls_for(2, 0.010, 0.005), 4, "half the time waiting");
        assert_eq!(calls_for(2, 0.010, 0.0075), 8);
        assert_eq!(calls_for(2, 0.010, 0.0099), 8, "at most the threads");
        assert_eq!(calls_for(2, 0.010, 0.010), 8);
        assert_eq!(calls_for(1, 0.010, 0.0001), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_waiting_for_the_store_raise_the_calls_and_computing_ones_lower_them() {
        let pool = SearchPool::new(1, 8).expect("pool");
        assert_eq!(pool.calls(), 1, "nothing measured yet");
        for _ in 0..20 {
            pool.run(|| {
                quiver_blobcache::waiting_for_store(|| std::thread::sleep(Duration::from_millis(5)))
            })
            .await
            .expect("ran");
        }
        assert_eq!(
            pool.calls(),
            WAIT_THREADS_PER_SLOT,
            "jobs that only wait for the store: as many as the pool's threads"
        );
        for _ in 0..100 {
            pool.run(|| {
                let started = Instant::now();
                while started.elapsed() < Duration::from_millis(1) {
                    std::hint::spin_loop();
                }
            })
            .await
            .expect("ran");
        }
        assert_eq!(pool.calls(), 1, "jobs that compute: one per slot");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_wakes_one_thread_not_the_whole_pool() {
        // 2 slots, 8 threads, all idle between jobs: each job needs one wake-up.
        // Waking every thread for every job (as the pool once did) costs 7 vain
        // wake-ups — context switches on a loaded machine — per search.
        let pool = SearchPool::new(2, 16).expect("pool");
        for _ in 0..100 {
            // Let the threads go back to sleep between jobs.
            while pool.shared.lock().idle_threads < 2 * WAIT_THREADS_PER_SLOT {
                tokio::task::yield_now().await;
            }
            assert_eq!(pool.run(|| 1).await.expect("ran"), 1);
        }
        let vain = pool.shared.lock().woken_for_nothing;
        assert!(vain < 10, "{vain} vain wake-ups for 100 jobs");
    }

    type Job<T> = tokio::task::JoinHandle<Result<T, SearcherError>>;

    /// Holds the pool's only thread with a job that waits for the returned
    /// sender, then queues `jobs` more (job `i` answers `i`) and waits until
    /// the queue holds them all.
    async fn hold_the_thread_and_fill_the_queue(
        pool: &Arc<SearchPool>,
        jobs: usize,
    ) -> (mpsc::Sender<()>, Job<()>, Vec<Job<usize>>) {
        let (release, hold) = mpsc::channel::<()>();
        let (started, wait_started) = mpsc::channel::<()>();
        let busy = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run(move || {
                    started.send(()).expect("test waits");
                    hold.recv().expect("released");
                })
                .await
            }
        });
        tokio::task::spawn_blocking(move || wait_started.recv().expect("job started"))
            .await
            .expect("joined");
        let queued = (0..jobs)
            .map(|value| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run(move || value).await })
            })
            .collect();
        while pool.shared.lock().jobs.len() < jobs {
            tokio::task::yield_now().await;
        }
        (release, busy, queued)
    }

    #[tokio::test]
    async fn a_full_queue_refuses_with_a_retryable_overload_error() {
        let pool = Arc::new(SearchPool::new(1, 2).expect("pool"));
        let (release, busy, queued) = hold_the_thread_and_fill_the_queue(&pool, 2).await;
        let refused = pool.run(|| 99).await.expect_err("queue is full");
        assert!(matches!(
            refused,
            SearcherError::Overloaded { queued: 2, .. }
        ));
        assert_eq!(refused.error_code(), ErrorCode::ResourceExhausted);
        let status = quiver_proto::status_of(&refused);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            quiver_proto::retry_after_of_status(&status),
            Some(MIN_OVERLOAD_RETRY_AFTER),
            "no job finished yet: the shortest hint"
        );
        // The queued jobs still complete, whole, once the thread is free.
        release.send(()).expect("release");
        busy.await.expect("joined").expect("ran");
        let mut results = Vec::new();
        for job in queued {
            results.push(job.await.expect("joined").expect("ran"));
        }
        assert_eq!(results, vec![0, 1]);
        assert_eq!(pool.run(|| 7).await.expect("room again"), 7);
    }

    #[test]
    fn the_overload_hint_is_the_time_to_drain_the_queue_within_bounds() {
        let ms = Duration::from_millis;
        // 128 queued at 20 ms each on one slot (~50 a second): ~2.6 s, not 50 ms.
        assert_eq!(overload_retry_after(128, ms(20), 1), ms(2_580));
        // Two slots drain twice as fast.
        assert_eq!(overload_retry_after(127, ms(20), 2), ms(1_280));
        // Fast searches: the floor; a huge backlog: the ceiling.
        assert_eq!(
            overload_retry_after(10, Duration::from_micros(100), 4),
            ms(50)
        );
        assert_eq!(overload_retry_after(0, Duration::ZERO, 1), ms(50));
        assert_eq!(
            overload_retry_after(10_000, ms(100), 1),
            Duration::from_secs(5)
        );
        assert_eq!(
            overload_retry_after(10, Duration::MAX, 0),
            Duration::from_secs(5)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refusal_hints_at_the_time_the_queue_takes_to_drain() {
        // One slot, jobs of ~100 ms: once one has run, a refusal behind 4
        // queued jobs asks for about (4 + 1) × 100 ms, not a fixed 50 ms.
        let pool = Arc::new(SearchPool::new(1, 4).expect("pool"));
        pool.run(|| std::thread::sleep(Duration::from_millis(100)))
            .await
            .expect("ran");
        let (release, busy, queued) = hold_the_thread_and_fill_the_queue(&pool, 4).await;
        let refused = pool.run(|| 99).await.expect_err("queue is full");
        let hint = refused.retry_after().expect("a hint");
        assert!(
            hint >= Duration::from_millis(450) && hint <= Duration::from_millis(1_500),
            "{hint:?}"
        );
        release.send(()).expect("release");
        busy.await.expect("joined").expect("ran");
        for job in queued {
            job.await.expect("joined").expect("ran");
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_internal_error_and_the_pool_goes_on() {
        let pool = SearchPool::new(1, 4).expect("pool");
        let error = pool
            .run(|| -> u32 { panic!("job failed") })
            .await
            .expect_err("panicked");
        assert_eq!(error.error_code(), ErrorCode::Internal);
        assert_eq!(pool.run(|| 1).await.expect("still serving"), 1);
    }
}
