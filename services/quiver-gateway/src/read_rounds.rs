//! Strong reads share read-index rounds. Every strong search needs the routing
//! of its collection as meta has it *after* the search started (one Raft
//! read-index round on the leader); concurrent searches of one collection share
//! rounds instead of each paying one: the first caller starts a round, callers
//! arriving while it is in flight wait for the next round, which starts once that
//! one ended — so every caller is answered by a round that began after it
//! arrived, which is what keeps the read linearizable. At most one round per key
//! is in flight and one more is gathering waiters.
//!
//! A round other callers share runs in its own task: a caller that goes away
//! (its request was cancelled) does not cancel the round the other callers
//! wait for. A caller that finds no round in flight runs one itself, in its
//! own task — nobody else waits for that round's answer.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;

type Round<T> = watch::Receiver<Option<GatewayResult<T>>>;

struct Slot<T> {
    /// The round in flight, if any.
    running: Option<Round<T>>,
    /// The round gathering callers, to start when `running` ends.
    next: Option<Round<T>>,
}

/// Rounds per key (a collection name), shared by concurrent callers.
pub(crate) struct SharedRounds<T> {
    slots: Arc<Mutex<HashMap<String, Slot<T>>>>,
}

impl<T: Clone + Send + Sync + 'static> SharedRounds<T> {
    pub(crate) fn new() -> Self {
        SharedRounds {
            slots: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Returns the result of a round of `key` that started after this call
    /// began: the next round already gathering callers, a new one gathering
    /// callers once the round in flight has ended, or — when no round is in
    /// flight — one this caller runs itself, at once, in its own task (no
    /// spawn, no hand-off: the common case when strong reads do not overlap, and
    /// the only one on a metadata service that answers without a round). A
    /// caller running its own round shares it with nobody: callers arriving
    /// meanwhile gather for the next, which waits only for its end, so
    /// cancelling it cancels nobody else's answer.
    pub(crate) async fn join<F, Fut>(&self, key: &str, start_round: F) -> GatewayResult<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = GatewayResult<T>> + Send + 'static,
    {
        let own = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = slots.entry(key.to_string()).or_insert(Slot {
                running: None,
                next: None,
            });
            if let Some(next) = &slot.next {
                METRICS.strong_read_rounds_shared.inc();
                Joined::Gathering(next.clone())
            } else {
                let (sender, receiver) = watch::channel(None);
                match slot.running.clone() {
                    Some(previous) => {
                        slot.next = Some(receiver.clone());
                        Joined::Next(previous, sender, receiver)
                    }
                    None => {
                        slot.running = Some(receiver.clone());
                        Joined::Own(OwnRound {
                            slots: self.slots.clone(),
                            key: key.to_string(),
                            sender,
                            own: receiver,
                        })
                    }
                }
            }
        };
        let round = match own {
            Joined::Gathering(round) => round,
            Joined::Next(previous, sender, receiver) => {
                tokio::spawn(run_round(
                    self.slots.clone(),
                    key.to_string(),
                    previous,
                    sender,
                    receiver.clone(),
                    start_round(),
                ));
                receiver
            }
            Joined::Own(own) => {
                METRICS.strong_read_rounds.inc();
                let result = start_round().await;
                let _ = own.sender.send(Some(result.clone()));
                return result;
            }
        };
        wait(round).await
    }
}

/// What a caller of [`SharedRounds::join`] found.
enum Joined<T> {
    /// A round gathering callers: wait for its answer.
    Gathering(Round<T>),
    /// A round in flight: start the next one (it waits for that one to end).
    Next(Round<T>, watch::Sender<Option<GatewayResult<T>>>, Round<T>),
    /// Nothing in flight: run a round in this task.
    Own(OwnRound<T>),
}

/// A round a caller runs in its own task: when it ends — answered or
/// cancelled — the slot forgets it and the next round, if one is gathering,
/// may begin.
struct OwnRound<T> {
    slots: Arc<Mutex<HashMap<String, Slot<T>>>>,
    key: String,
    sender: watch::Sender<Option<GatewayResult<T>>>,
    own: Round<T>,
}

impl<T> Drop for OwnRound<T> {
    fn drop(&mut self) {
        // The next round waits for this one to end (its sender, dropped
        // after this, tells it even when this one was cancelled unanswered).
        round_ended(&self.slots, &self.key, &self.own);
    }
}

/// Forgets the ended round `own` of `key`, and the key once no round is in
/// flight or gathering.
fn round_ended<T>(slots: &Mutex<HashMap<String, Slot<T>>>, key: &str, own: &Round<T>) {
    let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(slot) = slots.get_mut(key) {
        if slot
            .running
            .as_ref()
            .is_some_and(|running| running.same_channel(own))
        {
            slot.running = None;
        }
        if slot.running.is_none() && slot.next.is_none() {
            slots.remove(key);
        }
    }
}

async fn wait<T: Clone>(mut round: Round<T>) -> GatewayResult<T> {
    match round.wait_for(Option::is_some).await {
        Ok(result) => result.as_ref().cloned().unwrap_or_else(|| {
            Err(GatewayError::unavailable(
                "strong read round gave no answer",
            ))
        }),
        Err(_) => Err(GatewayError::unavailable(
            "strong read round ended without an answer",
        )),
    }
}

async fn run_round<T: Clone + Send + Sync + 'static>(
    slots: Arc<Mutex<HashMap<String, Slot<T>>>>,
    key: String,
    mut previous: Round<T>,
    sender: watch::Sender<Option<GatewayResult<T>>>,
    own: Round<T>,
    round: impl Future<Output = GatewayResult<T>>,
) {
    // Only its end matters; its answer is older than some of our callers.
    let _ = previous.wait_for(Option::is_some).await;
    {
        let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get_mut(&key) {
            // This round starts now: callers from here on need the one after it.
            slot.running = Some(own.clone());
            if slot
                .next
                .as_ref()
                .is_some_and(|next| next.same_channel(&own))
            {
                slot.next = None;
            }
        }
    }
    METRICS.strong_read_rounds.inc();
    let result = round.await;
    let _ = sender.send(Some(result));
    round_ended(&slots, &key, &own);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// Rounds that return their own number and finish only when the test lets
    /// one through.
    struct FakeMeta {
        rounds_started: AtomicU64,
        gate: Arc<Semaphore>,
    }

    impl FakeMeta {
        /// A round is numbered when it begins (is first polled), not when made.
        fn round(self: &Arc<Self>) -> impl Future<Output = GatewayResult<u64>> + Send + 'static {
            let meta = self.clone();
            async move {
                let number = meta.rounds_started.fetch_add(1, Ordering::SeqCst) + 1;
                meta.gate.acquire().await.expect("gate open").forget();
                Ok(number)
            }
        }
    }

    async fn until(condition: impl Fn() -> bool) {
        while !condition() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn callers_during_a_round_share_the_next_one() {
        let meta = Arc::new(FakeMeta {
            rounds_started: AtomicU64::new(0),
            gate: Arc::new(Semaphore::new(0)),
        });
        let rounds = Arc::new(SharedRounds::<u64>::new());
        let first = tokio::spawn({
            let (rounds, meta) = (rounds.clone(), meta.clone());
            async move { rounds.join("docs", || meta.round()).await }
        });
        until(|| meta.rounds_started.load(Ordering::SeqCst) == 1).await;
        // Round 1 is in flight: these arrived after it began, so it must not
        // answer them; they all wait for round 2.
        let later: Vec<_> = (0..8)
            .map(|_| {
                let (rounds, meta) = (rounds.clone(), meta.clone());
                tokio::spawn(async move { rounds.join("docs", || meta.round()).await })
            })
            .collect();
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        // The next round does not begin before round 1 ends.
        assert_eq!(meta.rounds_started.load(Ordering::SeqCst), 1);
        // Another collection has rounds of its own.
        let other = tokio::spawn({
            let (rounds, meta) = (rounds.clone(), meta.clone());
            async move { rounds.join("other", || meta.round()).await }
        });
        until(|| meta.rounds_started.load(Ordering::SeqCst) == 2).await;
        meta.gate.add_permits(1);
        let first_answer = first.await.expect("joined").expect("answered");
        meta.gate.add_permits(2);
        let mut later_answers = Vec::new();
        for caller in later {
            later_answers.push(caller.await.expect("joined").expect("answered"));
        }
        let other_answer = other.await.expect("joined").expect("answered");
        assert_eq!(first_answer, 1);
        assert_eq!(other_answer, 2);
        // One round answered all eight, and it began after round 1 ended.
        assert!(
            later_answers.iter().all(|answer| *answer == 3),
            "{later_answers:?}"
        );
        assert_eq!(meta.rounds_started.load(Ordering::SeqCst), 3);
        // Nothing in flight: the next caller starts a fresh round.
        meta.gate.add_permits(1);
        let fresh = rounds
            .join("docs", || meta.round())
            .await
            .expect("answered");
        assert_eq!(fresh, 4);
        assert!(rounds.slots.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn a_failed_round_answers_its_callers_with_the_error_and_the_next_starts_anew() {
        let rounds = SharedRounds::<u64>::new();
        let error = rounds
            .join("docs", || async {
                Err(GatewayError::unavailable("meta is down"))
            })
            .await
            .expect_err("round failed");
        assert!(error.message.contains("meta is down"), "{error:?}");
        let answer = rounds.join("docs", || async { Ok(5) }).await;
        assert_eq!(answer.expect("answered"), 5);
    }

    /// A caller whose round answers `answer` once the gate lets one through.
    fn gated_caller(
        rounds: &Arc<SharedRounds<u64>>,
        gate: &Arc<Semaphore>,
        answer: u64,
    ) -> tokio::task::JoinHandle<GatewayResult<u64>> {
        let (rounds, gate) = (rounds.clone(), gate.clone());
        tokio::spawn(async move {
            rounds
                .join("docs", move || async move {
                    gate.acquire().await.expect("gate").forget();
                    Ok(answer)
                })
                .await
        })
    }

    /// Whether a round of "docs" is gathering callers.
    fn gathering(rounds: &SharedRounds<u64>) -> bool {
        rounds
            .slots
            .lock()
            .expect("lock")
            .get("docs")
            .is_some_and(|slot| slot.next.is_some())
    }

    #[tokio::test]
    async fn a_cancelled_caller_does_not_cancel_the_shared_round() {
        let gate = Arc::new(Semaphore::new(0));
        let rounds = Arc::new(SharedRounds::<u64>::new());
        let first = gated_caller(&rounds, &gate, 1);
        until(|| !rounds.slots.lock().expect("lock").is_empty()).await;
        // Two callers gather for round 2; the one that started it goes away.
        let cancelled = gated_caller(&rounds, &gate, 2);
        until(|| gathering(&rounds)).await;
        let waiter = gated_caller(&rounds, &gate, 3);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        cancelled.abort();
        gate.add_permits(2);
        assert_eq!(first.await.expect("joined").expect("answered"), 1);
        assert_eq!(
            waiter.await.expect("joined").expect("answered"),
            2,
            "round 2 ran although the caller that started it went away"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_with_none_in_flight_runs_in_the_callers_task() {
        let rounds = SharedRounds::<Option<tokio::task::Id>>::new();
        let caller = tokio::spawn(async move {
            let round = rounds
                .join("docs", || async { Ok(tokio::task::try_id()) })
                .await
                .expect("answered");
            (
                tokio::task::id(),
                round,
                rounds.slots.lock().expect("lock").len(),
            )
        });
        let (caller, round, slots_left) = caller.await.expect("joined");
        assert_eq!(round, Some(caller), "no task spawned for the round");
        assert_eq!(slots_left, 0, "an ended round is forgotten");
    }

    #[tokio::test]
    async fn cancelling_a_callers_own_round_lets_the_next_one_begin() {
        let gate = Arc::new(Semaphore::new(0));
        let rounds = Arc::new(SharedRounds::<u64>::new());
        let own = gated_caller(&rounds, &gate, 1);
        until(|| !rounds.slots.lock().expect("lock").is_empty()).await;
        // Arrived while round 1 runs: gathers for round 2, which waits for it.
        let later = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.join("docs", || async { Ok(2) }).await }
        });
        until(|| gathering(&rounds)).await;
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!later.is_finished(), "round 2 waits for round 1 to end");
        // Round 1's caller goes away unanswered: round 2 begins and answers.
        own.abort();
        assert_eq!(later.await.expect("joined").expect("answered"), 2);
        assert!(rounds.slots.lock().expect("lock").is_empty());
    }
}
