//! The bounded CPU pool searches and point reads run on: a fixed number of
//! threads (one per core by default) taking jobs from a bounded queue. When the
//! queue is full a request is refused at once with a retryable overload error,
//! before any of it ran, so an overloaded searcher never half-answers and never
//! piles up unbounded blocking threads. A job whose caller went away (the
//! request was cancelled) is skipped when its turn comes.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::SearcherError;
use crate::metrics::METRICS;

/// How long an overloaded caller is told to wait before retrying.
const OVERLOAD_RETRY_AFTER: Duration = Duration::from_millis(50);

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Queue {
    jobs: VecDeque<(Instant, Job)>,
    stopping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    available: Condvar,
    capacity: usize,
}

/// A fixed set of threads with a bounded queue in front of them.
pub(crate) struct SearchPool {
    shared: Arc<Shared>,
}

impl SearchPool {
    /// Starts `threads` threads (0: one per core) behind a queue of `queue_capacity`
    /// waiting jobs (0: 64 per thread).
    pub(crate) fn new(threads: usize, queue_capacity: usize) -> Result<Self, SearcherError> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |cores| cores.get())
        } else {
            threads
        };
        let capacity = if queue_capacity == 0 {
            threads * 64
        } else {
            queue_capacity
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::with_capacity(capacity),
                stopping: false,
            }),
            available: Condvar::new(),
            capacity,
        });
        for index in 0..threads {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("quiver-search-{index}"))
                .spawn(move || work(&shared))
                .map_err(|error| {
                    SearcherError::Internal(format!("cannot start search thread: {error}"))
                })?;
        }
        METRICS.search_pool_threads.set(threads as i64);
        Ok(SearchPool { shared })
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
            let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            if queue.stopping {
                return Err(SearcherError::Internal(
                    "the search pool is stopping".into(),
                ));
            }
            if queue.jobs.len() >= self.shared.capacity {
                METRICS.search_pool_rejected.inc();
                return Err(SearcherError::Overloaded {
                    queued: queue.jobs.len(),
                    retry_after: OVERLOAD_RETRY_AFTER,
                });
            }
            queue.jobs.push_back((Instant::now(), wrapped));
            METRICS.search_pool_queued.set(queue.jobs.len() as i64);
        }
        self.shared.available.notify_one();
        receiver
            .await
            .map_err(|_| SearcherError::Internal("a search job panicked".into()))
    }
}

fn work(shared: &Shared) {
    loop {
        let (queued_at, job) = {
            let mut queue = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(entry) = queue.jobs.pop_front() {
                    METRICS.search_pool_queued.set(queue.jobs.len() as i64);
                    break entry;
                }
                if queue.stopping {
                    return;
                }
                queue = shared
                    .available
                    .wait(queue)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        METRICS
            .search_pool_wait_seconds
            .observe(queued_at.elapsed().as_secs_f64());
        METRICS.search_pool_busy.inc();
        // A panicking job drops its sender: the caller gets an internal error and
        // this thread goes on serving.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        METRICS.search_pool_busy.dec();
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
        self.shared.available.notify_all();
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

    #[tokio::test]
    async fn a_full_queue_refuses_with_a_retryable_overload_error() {
        let pool = Arc::new(SearchPool::new(1, 2).expect("pool"));
        // Hold the only thread, then fill the queue.
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
        let queued: Vec<_> = (0..2)
            .map(|value| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run(move || value).await })
            })
            .collect();
        // Both queued jobs are in the queue once the gauge says so.
        while pool.shared.queue.lock().expect("lock").jobs.len() < 2 {
            tokio::task::yield_now().await;
        }
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
            Some(OVERLOAD_RETRY_AFTER)
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
