//! Waits for the object store, told to whoever runs the thread: a pool of CPU
//! threads (the searcher's search pool) registers a [`StoreWaitObserver`] on each
//! of its threads, and a job that blocks on a region fill (its own, one in flight
//! for another reader, or fetches ahead) gives its core back for the length of
//! the wait, so another job can use it. Without it, a pool sized to the cores
//! spends a cold cache's round trips idle: two search threads waiting for the
//! store are a searcher answering nothing.

use std::cell::RefCell;
use std::sync::Arc;

/// Told when the thread it is registered on starts and stops waiting for the
/// object store.
pub trait StoreWaitObserver: Send + Sync {
    /// The thread is about to wait for the store: its core is free.
    fn waiting(&self);
    /// The wait is over: returns once the thread may run again.
    fn resumed(&self);
}

thread_local! {
    static OBSERVER: RefCell<Option<Arc<dyn StoreWaitObserver>>> = const { RefCell::new(None) };
}

/// Registers `observer` for the waits of this thread (`None` removes it).
pub fn observe_store_waits(observer: Option<Arc<dyn StoreWaitObserver>>) {
    OBSERVER.with(|slot| *slot.borrow_mut() = observer);
}

/// Runs `wait` (a wait for the object store) with this thread's observer told
/// before and after; waits nested inside it are not told again.
pub fn waiting_for_store<T>(wait: impl FnOnce() -> T) -> T {
    let Some(observer) = OBSERVER.with(|slot| slot.borrow_mut().take()) else {
        return wait();
    };
    /// Tells the observer the wait is over and puts it back, also on a panic.
    struct Resume(Option<Arc<dyn StoreWaitObserver>>);
    impl Drop for Resume {
        fn drop(&mut self) {
            if let Some(observer) = self.0.take() {
                observer.resumed();
                OBSERVER.with(|slot| *slot.borrow_mut() = Some(observer));
            }
        }
    }
    observer.waiting();
    let _resume = Resume(Some(observer));
    wait()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Count {
        waiting: AtomicUsize,
        resumed: AtomicUsize,
    }

    impl StoreWaitObserver for Count {
        fn waiting(&self) {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        fn resumed(&self) {
            self.resumed.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_observer_of_the_thread_is_told_once_per_outer_wait() {
        let count = Arc::new(Count::default());
        assert_eq!(
            waiting_for_store(|| 1),
            1,
            "no observer: the wait just runs"
        );
        observe_store_waits(Some(count.clone()));
        let value = waiting_for_store(|| waiting_for_store(|| 7));
        assert_eq!(value, 7);
        assert_eq!(count.waiting.load(Ordering::SeqCst), 1);
        assert_eq!(count.resumed.load(Ordering::SeqCst), 1);
        let panicked = std::panic::catch_unwind(|| waiting_for_store(|| panic!("in the wait")));
        assert!(panicked.is_err());
        assert_eq!(
            count.resumed.load(Ordering::SeqCst),
            2,
            "told after a panic too"
        );
        waiting_for_store(|| ());
        assert_eq!(
            count.waiting.load(Ordering::SeqCst),
            3,
            "registered again after the panic"
        );
        std::thread::spawn(|| waiting_for_store(|| ()))
            .join()
            .unwrap();
        assert_eq!(
            count.waiting.load(Ordering::SeqCst),
            3,
            "other threads are not observed"
        );
        observe_store_waits(None);
    }
}
