//! Waiting for a state with a deadline, instead of sleeping and hoping.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] checks.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Returns the first `Some` of `check`, polled every 20 ms, or an error naming
/// `what` once `timeout` has passed without one.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_every(what, timeout, POLL_INTERVAL, check).await
}

/// Returns the first `Some` of `check`, polled every `interval`, or an error
/// naming `what` once `timeout` has passed without one.
pub async fn eventually_every<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn eventually_returns_the_first_value_or_names_what_it_waited_for() {
        let calls = AtomicUsize::new(0);
        let value = eventually("the third call", Duration::from_secs(5), || async {
            (calls.fetch_add(1, Ordering::SeqCst) == 2).then_some("third")
        })
        .await
        .unwrap();
        assert_eq!(value, "third");
        let error = eventually("nothing", Duration::from_millis(50), || async {
            None::<()>
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("waiting for nothing"), "{error}");
    }
}
