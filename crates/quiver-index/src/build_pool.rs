//! The thread pools segment builds run on: one per thread count asked for,
//! built the first time a build asks for it and shared by every later build,
//! so building a segment starts no threads of its own.
//!
//! A count names the whole pool, not one build's share: builds that ask for the
//! same count at the same time share its threads (e.g. every merge of an
//! indexer, `merge_threads`), so the count bounds the CPU they take together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{IndexError, IndexResult};

type Pools = Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>;

static POOLS: OnceLock<Pools> = OnceLock::new();

/// Returns the shared pool of `threads` threads (0 = one per core).
pub(crate) fn build_pool(threads: usize) -> IndexResult<Arc<rayon::ThreadPool>> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |cores| cores.get())
    } else {
        threads
    };
    let mut pools = POOLS
        .get_or_init(Pools::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(pool) = pools.get(&threads) {
        return Ok(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |index| format!("quiver-build-{threads}-{index}"))
        .build()
        .map_err(|error| {
            IndexError::InvalidArgument(format!("build thread pool of {threads} threads: {error}"))
        })?;
    let pool = Arc::new(pool);
    pools.insert(threads, pool.clone());
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_asking_for_the_same_count_share_one_pool() {
        let first = build_pool(2).expect("pool");
        let second = build_pool(2).expect("pool");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.current_num_threads(), 2);
        let all_cores = build_pool(0).expect("pool");
        assert_eq!(
            all_cores.current_num_threads(),
            std::thread::available_parallelism().map_or(1, |cores| cores.get())
        );
    }
}
