//! Results of the peer libraries (`shared/bench/run_peers.py` JSON), so the engine
//! report, table and plot put Quiver and its peers side by side.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// Recall targets the comparison table reports.
pub const RECALL_TARGETS: [f64; 4] = [0.90, 0.95, 0.98, 0.99];

#[derive(Deserialize)]
struct PeerFile {
    results: Vec<PeerResult>,
}

#[derive(Deserialize)]
struct PeerResult {
    system: String,
    #[serde(default)]
    build_s: f64,
    #[serde(default)]
    points: Vec<PeerPoint>,
}

#[derive(Deserialize)]
struct PeerPoint {
    recall: f64,
    qps1_cpu: f64,
}

/// One peer's measured points: `(recall, single-thread QPS per CPU-second)`.
pub struct PeerCurve {
    pub system: String,
    pub build_s: f64,
    pub points: Vec<(f64, f64)>,
}

/// Reads the peers' JSON written by `run_peers.py --out`.
pub fn load(path: &Path) -> Result<Vec<PeerCurve>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file: PeerFile = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not run_peers.py JSON", path.display()))?;
    Ok(file
        .results
        .into_iter()
        .map(|result| PeerCurve {
            system: result.system,
            build_s: result.build_s,
            points: result
                .points
                .iter()
                .map(|p| (p.recall, p.qps1_cpu))
                .collect(),
        })
        .collect())
}

/// Returns the best QPS among points reaching `target` recall.
pub fn best_at(points: &[(f64, f64)], target: f64) -> Option<f64> {
    points
        .iter()
        .filter(|(recall, _)| *recall >= target)
        .map(|(_, qps)| *qps)
        .reduce(f64::max)
}

/// Returns the Pareto frontier (no other point has both higher recall and QPS),
/// sorted by recall.
pub fn frontier(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut best_qps = f64::NEG_INFINITY;
    let mut out = Vec::new();
    for (recall, qps) in sorted {
        if qps > best_qps {
            best_qps = qps;
            out.push((recall, qps));
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontier_and_targets() {
        let points = [(0.9, 100.0), (0.95, 50.0), (0.93, 40.0), (0.99, 10.0)];
        assert_eq!(
            frontier(&points),
            vec![(0.9, 100.0), (0.95, 50.0), (0.99, 10.0)]
        );
        assert_eq!(best_at(&points, 0.94), Some(50.0));
        assert_eq!(best_at(&points, 0.995), None);
    }
}
