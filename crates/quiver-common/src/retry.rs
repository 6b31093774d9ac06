//! The one retry policy of the code base: exponential backoff with full jitter
//! (each delay drawn uniformly from zero up to the exponential bound), bounded by a
//! number of attempts and optionally by the time elapsed since the first attempt.
//!
//! Full jitter matters here: after a metadata leader change or a node restart,
//! every node retries at once, and fixed delays make them come back in lockstep.

use std::future::Future;
use std::time::{Duration, Instant};

use rand::Rng;

/// Says whether an error is worth another attempt, and whether it names a wait.
pub trait Retryable {
    /// Returns whether the failed operation may succeed when tried again.
    fn is_retryable(&self) -> bool;

    /// Returns the wait the failure asks for (a server's retry hint), if any; the
    /// policy waits at least that long before the next attempt.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// How often and how patiently an operation is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = never retry).
    pub max_attempts: usize,
    /// The bound on the first retry's delay; each later bound doubles it.
    pub base_delay: Duration,
    /// The largest bound a delay is drawn under.
    pub max_delay: Duration,
    /// Gives up once this much time has passed since the first attempt (no new
    /// attempt starts after it, and no wait runs past it).
    pub max_elapsed: Option<Duration>,
}

impl RetryPolicy {
    /// Returns a policy of `max_attempts` attempts with delays bounded by `base_delay`
    /// doubling up to `max_delay`, and no time limit.
    pub const fn new(max_attempts: usize, base_delay: Duration, max_delay: Duration) -> Self {
        RetryPolicy {
            max_attempts,
            base_delay,
            max_delay,
            max_elapsed: None,
        }
    }

    /// Returns this policy, giving up once `max_elapsed` has passed since the first attempt.
    pub const fn with_max_elapsed(mut self, max_elapsed: Duration) -> Self {
        self.max_elapsed = Some(max_elapsed);
        self
    }

    /// Returns this policy with no bound on the number of attempts (bound it by time).
    pub const fn unlimited_attempts(mut self) -> Self {
        self.max_attempts = usize::MAX;
        self
    }

    /// Returns the upper bound of the delay before retry number `retry` (1-based):
    /// `base_delay · 2^(retry-1)`, capped at `max_delay`.
    pub fn delay_bound(&self, retry: usize) -> Duration {
        let doublings = retry.saturating_sub(1).min(32) as u32;
        self.base_delay
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(self.max_delay)
    }

    /// Returns the delay before retry number `retry` (1-based), drawn uniformly from
    /// zero to [`RetryPolicy::delay_bound`] (full jitter).
    pub fn delay(&self, retry: usize) -> Duration {
        jitter(self.delay_bound(retry))
    }

    /// Returns a backoff that hands out this policy's delays one retry at a time,
    /// for loops that are not one operation (reconnecting streams, polling).
    pub fn backoff(&self) -> Backoff {
        Backoff {
            policy: *self,
            retries: 0,
            started: Instant::now(),
        }
    }

    /// Runs `operation` (given the attempt number, from 1) until it succeeds, fails
    /// with an error that is not [`Retryable::is_retryable`], or the policy is spent;
    /// returns the success or the last error.
    pub async fn retry<T, E, F, Fut>(&self, operation: F) -> Result<T, E>
    where
        E: Retryable,
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.retry_if(
            operation,
            |error: &E| error.is_retryable(),
            Retryable::retry_after,
        )
        .await
    }

    /// Runs `operation` like [`RetryPolicy::retry`], deciding with `should_retry`
    /// which errors are retried and with `hint` which ask for a wait.
    pub async fn retry_if<T, E, F, Fut, P, H>(
        &self,
        mut operation: F,
        should_retry: P,
        hint: H,
    ) -> Result<T, E>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        P: Fn(&E) -> bool,
        H: Fn(&E) -> Option<Duration>,
    {
        let mut backoff = self.backoff();
        let mut attempt = 1;
        loop {
            let error = match operation(attempt).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if !should_retry(&error) {
                return Err(error);
            }
            let Some(delay) = backoff.next_delay_after(hint(&error)) else {
                return Err(error);
            };
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

/// Returns a duration drawn uniformly from zero to `bound`.
fn jitter(bound: Duration) -> Duration {
    if bound.is_zero() {
        return bound;
    }
    let nanos = rand::rng().random_range(0..=bound.as_nanos().min(u64::MAX as u128) as u64);
    Duration::from_nanos(nanos)
}

/// The delays of one [`RetryPolicy`] for one operation or loop.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    retries: usize,
    started: Instant,
}

impl Backoff {
    /// Returns the delay before the next attempt, or `None` when the policy is spent
    /// (attempts used up, or the next attempt would start past `max_elapsed`).
    pub fn next_delay(&mut self) -> Option<Duration> {
        self.next_delay_after(None)
    }

    /// Returns the delay before the next attempt, or `None` when the policy is spent.
    /// A `hint` (a server's retry-after) is waited at least, plus up to a quarter of
    /// it at random, so the callers one overload turned away come back spread out.
    pub fn next_delay_after(&mut self, hint: Option<Duration>) -> Option<Duration> {
        if self.retries.saturating_add(1) >= self.policy.max_attempts {
            return None;
        }
        self.retries += 1;
        let mut delay = self.policy.delay(self.retries);
        if let Some(hint) = hint {
            delay = delay.max(hint.saturating_add(jitter(hint / 4)));
        }
        if let Some(max_elapsed) = self.policy.max_elapsed {
            let remaining = max_elapsed.checked_sub(self.started.elapsed())?;
            if remaining.is_zero() {
                return None;
            }
            delay = delay.min(remaining);
        }
        Some(delay)
    }

    /// Returns the number of retries handed out so far.
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// Starts over after a success: the next delay is a first retry's again.
    pub fn reset(&mut self) {
        self.retries = 0;
        self.started = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug, PartialEq)]
    enum TestError {
        Transient,
        Permanent,
        Busy(Duration),
    }

    impl Retryable for TestError {
        fn is_retryable(&self) -> bool {
            !matches!(self, TestError::Permanent)
        }

        fn retry_after(&self) -> Option<Duration> {
            match self {
                TestError::Busy(wait) => Some(*wait),
                _ => None,
            }
        }
    }

    const FAST: RetryPolicy =
        RetryPolicy::new(4, Duration::from_millis(1), Duration::from_millis(4));

    #[test]
    fn delays_are_jittered_under_a_doubling_capped_bound() {
        let policy = RetryPolicy::new(10, Duration::from_millis(10), Duration::from_millis(60));
        assert_eq!(policy.delay_bound(1), Duration::from_millis(10));
        assert_eq!(policy.delay_bound(2), Duration::from_millis(20));
        assert_eq!(policy.delay_bound(3), Duration::from_millis(40));
        assert_eq!(policy.delay_bound(4), Duration::from_millis(60));
        assert_eq!(policy.delay_bound(1000), Duration::from_millis(60));
        let draws: Vec<Duration> = (0..200).map(|_| policy.delay(3)).collect();
        assert!(
            draws
                .iter()
                .all(|delay| *delay <= Duration::from_millis(40))
        );
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(
            distinct.len() > 50,
            "full jitter draws differ: {}",
            distinct.len()
        );
    }

    #[test]
    fn a_backoff_stops_after_its_attempts_and_restarts_on_reset() {
        let mut backoff = FAST.backoff();
        assert!(backoff.next_delay().is_some());
        assert!(backoff.next_delay().is_some());
        assert!(backoff.next_delay().is_some());
        assert_eq!(backoff.next_delay(), None, "4 attempts = 3 retries");
        assert_eq!(backoff.retries(), 3);
        backoff.reset();
        assert!(backoff.next_delay().is_some());
    }

    #[test]
    fn a_backoff_never_waits_past_its_time_limit() {
        let policy = RetryPolicy::new(2, Duration::from_secs(10), Duration::from_secs(10))
            .unlimited_attempts()
            .with_max_elapsed(Duration::from_millis(50));
        let mut backoff = policy.backoff();
        let delay = backoff.next_delay().expect("within the time limit");
        assert!(delay <= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(backoff.next_delay(), None);
    }

    #[tokio::test]
    async fn retry_runs_until_success_and_counts_attempts() {
        let calls = AtomicUsize::new(0);
        let result = FAST
            .retry(|attempt| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if attempt < 3 {
                        Err(TestError::Transient)
                    } else {
                        Ok(attempt)
                    }
                }
            })
            .await;
        assert_eq!(result, Ok(3));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn retry_gives_up_on_permanent_errors_and_when_spent() {
        let calls = AtomicUsize::new(0);
        let permanent: Result<(), _> = FAST
            .retry(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(TestError::Permanent) }
            })
            .await;
        assert_eq!(permanent, Err(TestError::Permanent));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        calls.store(0, Ordering::SeqCst);
        let spent: Result<(), _> = FAST
            .retry(|_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(TestError::Transient) }
            })
            .await;
        assert_eq!(spent, Err(TestError::Transient));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn a_hint_is_waited_with_up_to_a_quarter_more_at_random() {
        let hint = Duration::from_millis(400);
        let draws: Vec<Duration> = (0..100)
            .map(|_| {
                FAST.backoff()
                    .next_delay_after(Some(hint))
                    .expect("a first retry")
            })
            .collect();
        assert!(
            draws
                .iter()
                .all(|delay| *delay >= hint && *delay <= hint + hint / 4),
            "{draws:?}"
        );
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(
            distinct.len() > 50,
            "hinted waits are spread: {}",
            distinct.len()
        );
    }

    #[tokio::test]
    async fn retry_waits_at_least_the_hint() {
        let started = Instant::now();
        let result = FAST
            .retry(|attempt| async move {
                if attempt == 1 {
                    Err(TestError::Busy(Duration::from_millis(30)))
                } else {
                    Ok(())
                }
            })
            .await;
        assert_eq!(result, Ok(()));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }
}
