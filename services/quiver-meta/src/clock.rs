//! The leader's clock: the catalog time it writes into every command
//! (`MetaRequest::now_ms`) and judges heartbeats, leases and GC grace by.
//!
//! Every expiry in the catalog (a node's `last_heartbeat_ms + node_timeout_ms`, a
//! lease's `expires_at_ms`, a GC entry's delete-after time) is compared with the
//! `now_ms` of a later command. Taking that straight from the leader's wall clock made
//! every decision hostage to it: a forward jump declared every node dead and expired
//! every lease at the next control-loop tick; a backward jump froze catalog time
//! (it never runs backwards), so for the length of the jump no dead node was noticed
//! and no lease expired; GC entries became due early after a forward jump.
//!
//! So catalog time follows the leader's *monotonic* clock, and the wall clock only
//! steers it: between two readings catalog time advances by at least the monotonic
//! time elapsed and by at most 1 % more ([`MAX_CATCH_UP_PER_MILLE`]), as close to the
//! wall clock as that allows. A wall-clock step in either direction therefore changes
//! no decision; catalog time drifts towards a stepped-forward wall clock at 1 % (a
//! one-hour step shifts durations by at most 1 %) and ignores a stepped-back one.
//! A new leader starts from the applied catalog clock carried forward by the
//! monotonic time since this node applied it, which is never later than the old
//! leader's time (conservative: a timeout judged by a new leader can only run long).
//! A brand-new catalog (clock 0) starts from the wall clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How much faster than the monotonic clock catalog time may run while it catches up
/// with the wall clock, in thousandths.
pub(crate) const MAX_CATCH_UP_PER_MILLE: u128 = 10;

/// Where the leader clock reads time (replaced in tests).
pub(crate) trait TimeSource: Send + Sync {
    /// Milliseconds since the Unix epoch (may jump).
    fn wall_ms(&self) -> u64;
    /// Time since an arbitrary fixed origin (never jumps, never goes back).
    fn monotonic(&self) -> Duration;
}

/// The operating system's clocks.
struct SystemTimeSource {
    origin: Instant,
}

impl TimeSource for SystemTimeSource {
    fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| {
                u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
            })
    }

    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// Catalog time as of the last reading, in microseconds so that frequent readings
/// still accumulate the 1 % catch-up.
#[derive(Clone, Copy, Debug)]
struct Reading {
    term: u64,
    catalog_us: u128,
    monotonic: Duration,
}

/// The catalog clock of a leader; see the module documentation.
pub(crate) struct LeaderClock {
    source: Arc<dyn TimeSource>,
    last: Mutex<Option<Reading>>,
}

impl LeaderClock {
    /// Returns a clock reading the operating system's clocks.
    pub(crate) fn system() -> LeaderClock {
        LeaderClock::with_source(Arc::new(SystemTimeSource {
            origin: Instant::now(),
        }))
    }

    /// Returns a clock reading `source`.
    pub(crate) fn with_source(source: Arc<dyn TimeSource>) -> LeaderClock {
        LeaderClock {
            source,
            last: Mutex::new(None),
        }
    }

    /// Returns the catalog time for a command proposed now by the leader of `term`.
    /// `applied_clock_ms` is this node's applied catalog clock and `applied_age` how
    /// long ago it was applied here (`None`: unknown, taken as just now); they seed
    /// the clock when this node starts leading in `term`.
    pub(crate) fn now_ms(
        &self,
        term: u64,
        applied_clock_ms: u64,
        applied_age: Option<Duration>,
    ) -> u64 {
        let monotonic = self.source.monotonic();
        let wall_us = u128::from(self.source.wall_ms()) * 1_000;
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let base = match *last {
            Some(reading) if reading.term == term => reading,
            _ => {
                let catalog_us = if applied_clock_ms == 0 {
                    wall_us
                } else {
                    let age = applied_age.unwrap_or_default().min(monotonic);
                    u128::from(applied_clock_ms) * 1_000 + age.as_micros()
                };
                Reading {
                    term,
                    catalog_us,
                    monotonic,
                }
            }
        };
        let elapsed_us = monotonic.saturating_sub(base.monotonic).as_micros();
        let floor_us = base.catalog_us + elapsed_us;
        let ceiling_us = floor_us + elapsed_us * MAX_CATCH_UP_PER_MILLE / 1_000;
        let catalog_us = wall_us.clamp(floor_us, ceiling_us);
        *last = Some(Reading {
            term,
            catalog_us,
            monotonic,
        });
        u64::try_from(catalog_us / 1_000).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

    use quiver_model::{IdType, IndexParams, Metric};

    use super::*;
    use crate::catalog::Catalog;
    use crate::model::{
        CollectionSpec, Command, MetaRequest, NodeRole, NodeState, Outcome, ShardKey,
    };

    /// A clock whose wall and monotonic readings the test moves by hand.
    #[derive(Default)]
    struct ManualTime {
        wall_ms: AtomicI64,
        monotonic_ms: AtomicU64,
    }

    impl ManualTime {
        fn starting_at(wall_ms: i64) -> Arc<ManualTime> {
            let time = Arc::new(ManualTime::default());
            time.wall_ms.store(wall_ms, Ordering::SeqCst);
            time
        }

        /// Real time passes: both clocks advance.
        fn pass(&self, milliseconds: u64) {
            self.monotonic_ms.fetch_add(milliseconds, Ordering::SeqCst);
            self.wall_ms.fetch_add(
                i64::try_from(milliseconds).expect("small"),
                Ordering::SeqCst,
            );
        }

        /// The wall clock is stepped (NTP, an operator, a VM resume); real time does
        /// not pass.
        fn step_wall(&self, milliseconds: i64) {
            self.wall_ms.fetch_add(milliseconds, Ordering::SeqCst);
        }
    }

    impl TimeSource for ManualTime {
        fn wall_ms(&self) -> u64 {
            u64::try_from(self.wall_ms.load(Ordering::SeqCst)).unwrap_or(0)
        }

        fn monotonic(&self) -> Duration {
            Duration::from_millis(self.monotonic_ms.load(Ordering::SeqCst))
        }
    }

    const HOUR_MS: i64 = 3_600_000;
    const NODE_TIMEOUT_MS: u64 = 10_000;
    const LEASE_TTL_MS: u64 = 10_000;

    /// A leader applying commands stamped by a [`LeaderClock`], as replicas would.
    struct Leader {
        time: Arc<ManualTime>,
        clock: LeaderClock,
        catalog: Catalog,
    }

    impl Leader {
        fn new() -> Leader {
            let time = ManualTime::starting_at(1_700_000_000_000);
            let clock = LeaderClock::with_source(time.clone());
            Leader {
                time,
                clock,
                catalog: Catalog::default(),
            }
        }

        fn now_ms(&self) -> u64 {
            self.clock
                .now_ms(1, self.catalog.clock_ms(), Some(Duration::ZERO))
        }

        fn apply(&mut self, command: Command) -> Outcome {
            let request = MetaRequest {
                now_ms: self.now_ms(),
                command,
            };
            self.catalog.apply(&request).expect("command accepted")
        }

        fn heartbeat(&mut self, node_id: &str) {
            self.apply(Command::Heartbeat {
                node_id: node_id.into(),
                ready_shards: Vec::new(),
            });
        }

        fn reconcile(&mut self) {
            self.apply(Command::Reconcile {
                node_timeout_ms: NODE_TIMEOUT_MS,
                lease_ttl_ms: LEASE_TTL_MS,
            });
        }

        fn state_of(&self, node_id: &str) -> NodeState {
            self.catalog
                .nodes()
                .find(|node| node.node_id == node_id)
                .map(|node| node.state)
                .expect("node registered")
        }

        fn lease_holder(&self) -> Option<(String, u64)> {
            let shard = ShardKey {
                collection_id: 1,
                shard: 0,
            };
            self.catalog
                .shard(shard)
                .and_then(|record| record.lease.as_ref())
                .map(|lease| (lease.holder.clone(), lease.epoch))
        }

        /// Both indexers registered, a one-shard collection, its lease granted.
        fn with_two_indexers_and_a_leased_shard() -> Leader {
            let mut leader = Leader::new();
            for node_id in ["indexer-a", "indexer-b"] {
                leader.apply(Command::RegisterNode {
                    node_id: node_id.into(),
                    role: NodeRole::Indexer,
                    address: format!("{node_id}:7200"),
                });
            }
            leader.apply(Command::CreateCollection {
                spec: CollectionSpec {
                    name: "docs".into(),
                    dimension: 8,
                    metric: Metric::Cosine,
                    id_type: IdType::U64,
                    shards: 1,
                    replication: 1,
                    index: IndexParams::default(),
                    payload_schema: Vec::new(),
                },
            });
            leader.reconcile();
            assert!(leader.lease_holder().is_some());
            leader
        }
    }

    #[test]
    fn catalog_time_follows_a_sane_wall_clock() {
        let leader = Leader::new();
        let start = leader.now_ms();
        assert_eq!(start, 1_700_000_000_000);
        leader.time.pass(1_234);
        assert_eq!(leader.now_ms(), start + 1_234);
    }

    #[test]
    fn a_wall_clock_step_moves_catalog_time_by_at_most_one_percent_of_real_time() {
        let leader = Leader::new();
        let start = leader.now_ms();
        leader.time.step_wall(HOUR_MS);
        leader.time.pass(1_000);
        let after_forward_step = leader.now_ms();
        assert!(after_forward_step >= start + 1_000);
        assert!(
            after_forward_step <= start + 1_010,
            "{}",
            after_forward_step - start
        );

        // Many quick readings still catch up at 1 %, no faster.
        for _ in 0..1_000 {
            leader.time.pass(10);
        }
        let caught_up = leader.now_ms() - after_forward_step;
        assert!((10_000..=10_100).contains(&caught_up), "{caught_up}");
        assert!(caught_up > 10_000, "catalog time does catch up");

        // Stepped back: catalog time keeps running at the monotonic rate.
        let before_back_step = leader.now_ms();
        leader.time.step_wall(-3 * HOUR_MS);
        leader.time.pass(5_000);
        assert_eq!(leader.now_ms(), before_back_step + 5_000);
    }

    #[test]
    fn a_new_leader_starts_from_the_applied_clock_carried_forward() {
        let time = ManualTime::starting_at(1_700_000_000_000);
        let clock = LeaderClock::with_source(time.clone());
        time.pass(60_000);
        // This node's wall clock is an hour fast; the catalog clock was applied 2 s ago.
        time.step_wall(HOUR_MS);
        let now = clock.now_ms(7, 1_700_000_050_000, Some(Duration::from_secs(2)));
        assert_eq!(now, 1_700_000_052_000);
        // A fresh catalog starts from the wall clock.
        let fresh = LeaderClock::with_source(time.clone());
        assert_eq!(fresh.now_ms(1, 0, None), time.wall_ms());
    }

    #[test]
    fn a_wall_clock_jump_on_the_leader_neither_expires_leases_nor_keeps_dead_nodes_alive() {
        let mut leader = Leader::with_two_indexers_and_a_leased_shard();
        let (holder, epoch) = leader.lease_holder().expect("leased");
        let other = if holder == "indexer-a" {
            "indexer-b"
        } else {
            "indexer-a"
        };

        // The leader's wall clock jumps an hour ahead. With the wall clock as catalog
        // time, the next reconcile would have found every node silent for an hour.
        leader.time.pass(500);
        leader.time.step_wall(HOUR_MS);
        let mut wall_clock_catalog = leader.catalog.clone();
        wall_clock_catalog.reconcile(leader.time.wall_ms(), NODE_TIMEOUT_MS, LEASE_TTL_MS);
        assert!(
            wall_clock_catalog
                .nodes()
                .all(|node| node.state == NodeState::Dead),
            "the scenario must be one that the wall clock gets wrong"
        );
        leader.reconcile();
        assert_eq!(leader.state_of(&holder), NodeState::Alive);
        assert_eq!(leader.state_of(other), NodeState::Alive);
        assert_eq!(leader.lease_holder(), Some((holder.clone(), epoch)));

        // Real time passes: the holder heartbeats and renews, the other node is silent.
        // Halfway the wall clock jumps back two hours; the silent node still dies on
        // time and the holder keeps its lease at the same epoch.
        for second in 1..=15 {
            leader.time.pass(1_000);
            if second == 7 {
                leader.time.step_wall(-2 * HOUR_MS);
            }
            leader.heartbeat(&holder);
            leader.apply(Command::RenewLease {
                shard: ShardKey {
                    collection_id: 1,
                    shard: 0,
                },
                node_id: holder.clone(),
                epoch,
                ttl_ms: LEASE_TTL_MS,
            });
            leader.reconcile();
            // Registered at 0, the reconcile above at 0.5 s: silent for more than
            // 10 s from second 10 on (catch-up adds at most 1 %, 75 ms here).
            let expected = if second < 10 {
                NodeState::Alive
            } else {
                NodeState::Dead
            };
            assert_eq!(leader.state_of(other), expected, "after {second} s");
            assert_eq!(leader.state_of(&holder), NodeState::Alive);
            assert_eq!(leader.lease_holder(), Some((holder.clone(), epoch)));
        }

        // The holder falls silent too: its lease expires after its ttl of real time,
        // wall clock or not, and the shard waits for a live indexer.
        leader.time.step_wall(HOUR_MS);
        for _ in 0..11 {
            leader.time.pass(1_000);
            leader.reconcile();
        }
        assert_eq!(leader.state_of(&holder), NodeState::Dead);
        assert_eq!(leader.lease_holder(), None);
    }
}
