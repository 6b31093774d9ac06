//! The reliability suite: a real multi-process cluster (`quiver meta`,
//! `indexer`, `searcher` and `gateway` as separate processes on loopback ports,
//! objects in a real S3 server), a concurrent workload whose every request is
//! recorded, a checker of that record, and faults: kill -9 (at random moments
//! and at precise crash points of the indexer), SIGSTOP, restarts, network
//! partitions, full disks, and a misbehaving object store.
//!
//! Profiles: quick by default (CI); `QUIVER_RELIABILITY_PROFILE=long` runs many
//! more iterations. Scenarios run one at a time (each starts its own cluster).
//! Every scenario appends a JSON summary line to
//! `$CARGO_TARGET_TMPDIR/reliability-summary.jsonl`. See tests/README.md.

mod api;
mod checker;
mod cluster;
mod drive;
mod history;
mod proxy;
mod scan;
mod workload;

mod chaos;
mod indexer_kills;
mod replace_and_delete;
mod searcher_kills;

mod disk_full;
mod object_store;
mod partitions;
mod soak;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

/// One scenario at a time: each starts about ten processes on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Tells whether the long profile was asked for.
pub fn long_profile() -> bool {
    match std::env::var("QUIVER_RELIABILITY_PROFILE").as_deref() {
        Ok("long") => true,
        Ok("quick") | Err(_) => false,
        Ok(other) => panic!("QUIVER_RELIABILITY_PROFILE must be `quick` or `long`, got `{other}`"),
    }
}

/// The seed of a scenario: `QUIVER_RELIABILITY_SEED` or a fresh one (printed,
/// so a failure can be replayed with the same fault choices).
pub fn seed(scenario: &str) -> u64 {
    let seed = std::env::var("QUIVER_RELIABILITY_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{scenario}: seed {seed} (replay with QUIVER_RELIABILITY_SEED={seed})");
    seed
}

/// What a scenario did, printed and appended to the summary file.
#[derive(Debug, Default)]
pub struct Summary {
    pub scenario: String,
    pub iterations: usize,
    pub faults: BTreeMap<String, usize>,
    pub writes: usize,
    pub acknowledged: usize,
    pub unknown: usize,
    pub observations: usize,
    pub searches: usize,
    pub checkpoints: usize,
    pub violations: usize,
    pub unavailability: BTreeMap<String, (Duration, Duration)>,
    pub read_errors: usize,
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Summary {
    pub fn new(scenario: &str) -> Summary {
        Summary {
            scenario: scenario.to_string(),
            ..Default::default()
        }
    }

    /// Prints the summary and appends it to the summary file.
    pub fn publish(&self, started: Instant) {
        let line = json!({
            "scenario": self.scenario,
            "profile": if long_profile() { "long" } else { "quick" },
            "seconds": started.elapsed().as_secs_f64(),
            "iterations": self.iterations,
            "faults": self.faults,
            "writes": self.writes,
            "acknowledged": self.acknowledged,
            "unknown": self.unknown,
            "read_observations": self.observations,
            "searches_checked": self.searches,
            "checkpoints": self.checkpoints,
            "violations": self.violations,
            "read_errors": self.read_errors,
            "unavailability_ms": self.unavailability.iter().map(|(kind, (write, read))| {
                (kind.clone(), json!({"write": write.as_millis() as u64, "strong_read": read.as_millis() as u64}))
            }).collect::<serde_json::Map<_, _>>(),
            "extra": self.extra,
        });
        eprintln!("SUMMARY {line}");
        let path =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability-summary.jsonl");
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}
