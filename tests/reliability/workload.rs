//! Concurrent clients through the gateways' REST API: writers upsert and delete
//! (deterministic vectors per id and version; each writer owns its ids and has
//! one write per id in flight at most), readers run strong gets and strong
//! exact-vector searches. Everything goes into the [`History`]. The workload
//! can be paused (every client parks between requests) for a quiet check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use rand::{SeedableRng, seq::IndexedRandom};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Api, ApiError};
use crate::history::{Attempt, History, Observation, SearchRecord, Seen, WriteKind, vector};

/// An id that is not touched again this long after a write of it failed, so a
/// failed request still in flight somewhere cannot land after a newer write.
const QUARANTINE: Duration = Duration::from_secs(5);

/// Sizes and mix of a workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub collection: String,
    pub dimension: usize,
    /// Ids are `0..ids`.
    pub ids: u64,
    pub writers: usize,
    pub readers: usize,
    /// Ids per write request (1..=max).
    pub max_batch: usize,
    /// Share of write requests that delete.
    pub delete_fraction: f64,
    /// Pause between two requests of one client.
    pub think_time: Duration,
    pub write_timeout: Duration,
    pub read_timeout: Duration,
    pub seed: u64,
}

impl WorkloadConfig {
    pub fn new(collection: &str, dimension: usize, ids: u64, seed: u64) -> Self {
        WorkloadConfig {
            collection: collection.to_string(),
            dimension,
            ids,
            writers: 3,
            readers: 2,
            max_batch: 8,
            delete_fraction: 0.2,
            think_time: Duration::from_millis(5),
            write_timeout: Duration::from_secs(40),
            read_timeout: Duration::from_secs(20),
            seed,
        }
    }
}

struct Shared {
    config: WorkloadConfig,
    history: Arc<History>,
    gateways: std::sync::RwLock<Vec<Api>>,
    paused: watch::Sender<bool>,
    parked: AtomicUsize,
    stop: AtomicBool,
    read_errors: AtomicUsize,
    write_errors: AtomicUsize,
    /// Failed requests by kind and error (digits blanked, so alike errors group).
    error_kinds: std::sync::Mutex<BTreeMap<String, usize>>,
}

impl Shared {
    fn note_error(&self, request: &str, error: &ApiError) {
        let text: String = error
            .to_string()
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .take(160)
            .collect();
        *self
            .error_kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(format!("{request}: {text}"))
            .or_default() += 1;
    }

    fn gateway(&self, rng: &mut StdRng) -> Api {
        let gateways = self.gateways.read().unwrap_or_else(|p| p.into_inner());
        gateways.choose(rng).expect("at least one gateway").clone()
    }

    /// Parks while paused; returns false once the workload stops.
    async fn wait_if_paused(&self) -> bool {
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        let mut paused = self.paused.subscribe();
        if *paused.borrow_and_update() {
            self.parked.fetch_add(1, Ordering::AcqRel);
            let _ = paused.wait_for(|paused| !*paused).await;
            self.parked.fetch_sub(1, Ordering::AcqRel);
        }
        !self.stop.load(Ordering::Acquire)
    }
}

/// A running workload.
pub struct Workload {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Starts the clients against `gateways` (REST base URLs).
    pub fn start(config: WorkloadConfig, gateways: Vec<Api>, history: Arc<History>) -> Workload {
        let (paused, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            config,
            history,
            gateways: std::sync::RwLock::new(gateways),
            paused,
            parked: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            read_errors: AtomicUsize::new(0),
            write_errors: AtomicUsize::new(0),
            error_kinds: Default::default(),
        });
        let mut tasks = Vec::new();
        for writer in 0..shared.config.writers {
            tasks.push(tokio::spawn(write_loop(shared.clone(), writer)));
        }
        for reader in 0..shared.config.readers {
            tasks.push(tokio::spawn(read_loop(shared.clone(), reader)));
        }
        Workload { shared, tasks }
    }

    /// Parks every client after its current request; returns once all are parked.
    pub async fn pause(&self) {
        self.shared.paused.send_replace(true);
        let clients = self.tasks.len();
        while self.shared.parked.load(Ordering::Acquire) < clients
            && !self.tasks.iter().all(JoinHandle::is_finished)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets the clients run again.
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Requests that failed so far: (writes, reads).
    pub fn errors(&self) -> (usize, usize) {
        (
            self.shared.write_errors.load(Ordering::Acquire),
            self.shared.read_errors.load(Ordering::Acquire),
        )
    }

    /// Failed requests grouped by error.
    pub fn error_kinds(&self) -> BTreeMap<String, usize> {
        self.shared
            .error_kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the clients and waits for them.
    pub async fn stop(self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.paused.send_replace(false);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

async fn write_loop(shared: Arc<Shared>, writer: usize) {
    let config = shared.config.clone();
    let mut rng = StdRng::seed_from_u64(config.seed ^ ((writer as u64 + 1) * 0x1000_0001));
    let owned: Vec<u64> = (0..config.ids)
        .filter(|id| id % config.writers as u64 == writer as u64)
        .collect();
    let mut next_version: HashMap<u64, u32> = HashMap::new();
    let mut quarantined: HashMap<u64, Instant> = HashMap::new();
    while shared.wait_if_paused().await {
        let now = Instant::now();
        quarantined.retain(|_, until| *until > now);
        let count = rng.random_range(1..=config.max_batch);
        let ids: Vec<u64> = owned
            .iter()
            .copied()
            .filter(|id| !quarantined.contains_key(id))
            .choose_multiple(&mut rng, count);
        if ids.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let delete = rng.random_bool(config.delete_fraction);
        let writes: Vec<(u64, WriteKind)> = ids
            .iter()
            .map(|id| {
                if delete {
                    (*id, WriteKind::Delete)
                } else {
                    let version = next_version.entry(*id).or_insert(0);
                    *version += 1;
                    (*id, WriteKind::Upsert { version: *version })
                }
            })
            .collect();
        let api = shared.gateway(&mut rng);
        let started = Instant::now();
        let handles = shared.history.invoke(&writes, started);
        let answer = if delete {
            api.delete(&config.collection, &ids, config.write_timeout)
                .await
        } else {
            let points: Vec<(u64, Vec<f32>)> = writes
                .iter()
                .map(|(id, kind)| match kind {
                    WriteKind::Upsert { version } => (*id, vector(*id, *version, config.dimension)),
                    WriteKind::Delete => unreachable!("an upsert batch"),
                })
                .collect();
            api.upsert(&config.collection, &points, config.write_timeout)
                .await
        };
        let finished = Instant::now();
        if let Err(error) = &answer {
            shared.note_error(if delete { "delete" } else { "upsert" }, error);
        }
        let ok = answer.is_ok();
        shared.history.complete(&handles, ok, finished);
        shared.history.attempt(Attempt {
            is_write: true,
            started,
            finished,
            ok,
        });
        if !ok {
            shared.write_errors.fetch_add(1, Ordering::AcqRel);
            for id in &ids {
                quarantined.insert(*id, finished + QUARANTINE);
            }
        }
        tokio::time::sleep(config.think_time).await;
    }
}

async fn read_loop(shared: Arc<Shared>, reader: usize) {
    let config = shared.config.clone();
    let mut rng = StdRng::seed_from_u64(config.seed ^ ((reader as u64 + 1) * 0x7000_0003));
    // A few ids past the written range are read too: they must never appear.
    let universe = config.ids + 50;
    while shared.wait_if_paused().await {
        let api = shared.gateway(&mut rng);
        let search_id = rng.random_range(0..config.ids);
        let version = shared.history.latest_version(search_id);
        let started = Instant::now();
        let ok = match version {
            Some(version) if rng.random_bool(0.4) => {
                let query = vector(search_id, version, config.dimension);
                match api
                    .search_batch(&config.collection, &[query], 5, config.read_timeout)
                    .await
                {
                    Ok(mut results) => {
                        let finished = Instant::now();
                        let hits = results.pop().unwrap_or_default();
                        shared.history.searched(SearchRecord {
                            id: search_id,
                            version,
                            started,
                            finished,
                            hit_ids: hits.iter().map(|(id, _)| *id).collect(),
                        });
                        shared.history.observe(
                            hits.into_iter()
                                .map(|(id, vector)| Observation {
                                    id,
                                    started,
                                    finished,
                                    seen: Seen::Vector(vector),
                                })
                                .collect(),
                        );
                        true
                    }
                    Err(error) => {
                        shared.note_error("search", &error);
                        false
                    }
                }
            }
            _ => {
                let count = rng.random_range(1..=16);
                let ids: Vec<u64> = (0..universe).choose_multiple(&mut rng, count);
                match api.get(&config.collection, &ids, config.read_timeout).await {
                    Ok(points) => {
                        let finished = Instant::now();
                        let requested: HashSet<u64> = ids.iter().copied().collect();
                        let mut found: HashMap<u64, Vec<f32>> = HashMap::new();
                        let mut observations = Vec::new();
                        for (id, vector) in points {
                            if requested.contains(&id) {
                                found.insert(id, vector);
                            } else {
                                // Not asked for: the checker flags it (never written
                                // or not at this version).
                                observations.push(Observation {
                                    id,
                                    started,
                                    finished,
                                    seen: Seen::Vector(vector),
                                });
                            }
                        }
                        for id in ids {
                            observations.push(Observation {
                                id,
                                started,
                                finished,
                                seen: match found.remove(&id) {
                                    Some(vector) => Seen::Vector(vector),
                                    None => Seen::Absent,
                                },
                            });
                        }
                        shared.history.observe(observations);
                        true
                    }
                    Err(error) => {
                        shared.note_error("get", &error);
                        false
                    }
                }
            }
        };
        let finished = Instant::now();
        shared.history.attempt(Attempt {
            is_write: false,
            started,
            finished,
            ok,
        });
        if !ok {
            shared.read_errors.fetch_add(1, Ordering::AcqRel);
        }
        tokio::time::sleep(config.think_time).await;
    }
}
