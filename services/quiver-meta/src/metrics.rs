//! Prometheus metrics of the metadata service (`quiver_meta_*`).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use crate::error::{MetaError, MetaResult};

/// The metadata service's metrics, registered in one registry.
#[derive(Clone)]
pub struct MetaMetrics {
    registry: Registry,
    /// Current Raft term.
    pub raft_term: IntGauge,
    /// Node id of the known leader (0 = none).
    pub raft_leader: IntGauge,
    /// 1 when this node is the leader.
    pub raft_is_leader: IntGauge,
    /// Last committed log index this node knows.
    pub raft_commit_index: IntGauge,
    /// Last log index applied to the catalog.
    pub raft_applied_index: IntGauge,
    /// Log entries kept on disk (last index − last purged index).
    pub raft_log_entries: IntGauge,
    /// Index of the newest snapshot.
    pub raft_snapshot_index: IntGauge,
    /// Snapshots built by this node.
    pub snapshots_total: IntCounter,
    /// Commands proposed through this node, by command.
    pub proposals_total: IntCounterVec,
    /// Proposals that failed or were rejected, by command and error code.
    pub proposal_errors_total: IntCounterVec,
    /// Time from proposal to applied response.
    pub proposal_duration_seconds: Histogram,
    /// gRPC handler time, by method.
    pub rpc_duration_seconds: HistogramVec,
    /// Catalog version applied on this node.
    pub catalog_version: IntGauge,
    /// Control loop reconciliations committed by this node as leader.
    pub reconciliations_total: IntCounter,
    /// Pre-vote rounds this node ran before a possible election, by outcome.
    pub pre_vote_rounds_total: IntCounterVec,
    /// Times this node stepped down as leader because no quorum acknowledged it.
    pub leader_step_downs_total: IntCounter,
    /// Linearizable reads served, by path: `local` (this node decides alone: a
    /// one-node metadata service) or `read_index` (a Raft read-index round).
    pub linearizable_reads_total: IntCounterVec,
}

impl MetaMetrics {
    /// Creates the metrics in a fresh registry.
    pub fn new() -> MetaResult<MetaMetrics> {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| -> MetaResult<IntGauge> {
            let gauge = IntGauge::new(name, help).map_err(metric_error)?;
            registry
                .register(Box::new(gauge.clone()))
                .map_err(metric_error)?;
            Ok(gauge)
        };
        let counter = |name: &str, help: &str| -> MetaResult<IntCounter> {
            let counter = IntCounter::new(name, help).map_err(metric_error)?;
            registry
                .register(Box::new(counter.clone()))
                .map_err(metric_error)?;
            Ok(counter)
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| -> MetaResult<IntCounterVec> {
            let counter =
                IntCounterVec::new(Opts::new(name, help), labels).map_err(metric_error)?;
            registry
                .register(Box::new(counter.clone()))
                .map_err(metric_error)?;
            Ok(counter)
        };
        let latency_buckets =
            prometheus::exponential_buckets(0.0005, 2.0, 16).map_err(metric_error)?;
        let proposal_duration_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "quiver_meta_proposal_duration_seconds",
                "time from proposing a command to its applied result",
            )
            .buckets(latency_buckets.clone()),
        )
        .map_err(metric_error)?;
        registry
            .register(Box::new(proposal_duration_seconds.clone()))
            .map_err(metric_error)?;
        let rpc_duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "quiver_meta_rpc_duration_seconds",
                "metadata grpc handler time",
            )
            .buckets(latency_buckets),
            &["method", "code"],
        )
        .map_err(metric_error)?;
        registry
            .register(Box::new(rpc_duration_seconds.clone()))
            .map_err(metric_error)?;
        Ok(MetaMetrics {
            raft_term: gauge("quiver_meta_raft_term", "current raft term")?,
            raft_leader: gauge(
                "quiver_meta_raft_leader",
                "node id of the known raft leader, 0 if none",
            )?,
            raft_is_leader: gauge(
                "quiver_meta_raft_is_leader",
                "1 when this node is the raft leader",
            )?,
            raft_commit_index: gauge(
                "quiver_meta_raft_commit_index",
                "last committed raft log index",
            )?,
            raft_applied_index: gauge(
                "quiver_meta_raft_applied_index",
                "last raft log index applied to the catalog",
            )?,
            raft_log_entries: gauge(
                "quiver_meta_raft_log_entries",
                "raft log entries kept on disk",
            )?,
            raft_snapshot_index: gauge(
                "quiver_meta_raft_snapshot_index",
                "log index of the newest snapshot",
            )?,
            snapshots_total: counter("quiver_meta_snapshots_total", "catalog snapshots built")?,
            proposals_total: counter_vec(
                "quiver_meta_proposals_total",
                "commands proposed through this node",
                &["command"],
            )?,
            proposal_errors_total: counter_vec(
                "quiver_meta_proposal_errors_total",
                "proposals that failed or were rejected",
                &["command", "code"],
            )?,
            proposal_duration_seconds,
            rpc_duration_seconds,
            catalog_version: gauge(
                "quiver_meta_catalog_version",
                "catalog version applied on this node",
            )?,
            reconciliations_total: counter(
                "quiver_meta_reconciliations_total",
                "control loop reconciliations committed as leader",
            )?,
            pre_vote_rounds_total: counter_vec(
                "quiver_meta_pre_vote_rounds_total",
                "pre-vote rounds run before an election, by outcome (granted starts an election)",
                &["outcome"],
            )?,
            leader_step_downs_total: counter(
                "quiver_meta_leader_step_downs_total",
                "times this node stepped down as leader because no quorum acknowledged it (check-quorum)",
            )?,
            linearizable_reads_total: counter_vec(
                "quiver_meta_linearizable_reads_total",
                "linearizable reads served, by path: local (a one-node metadata service decides alone) or read_index (a raft read-index round)",
                &["path"],
            )?,
            registry,
        })
    }

    /// Returns the registry holding these metrics (add process metrics to it freely).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Renders all metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
    }

    /// Updates the Raft gauges from openraft's metrics.
    pub(crate) fn observe_raft(
        &self,
        raft_metrics: &crate::raft_types::typ::RaftMetrics,
        committed_index: u64,
    ) {
        self.raft_term.set(clamp(raft_metrics.current_term));
        self.raft_leader
            .set(clamp(raft_metrics.current_leader.unwrap_or(0)));
        self.raft_is_leader.set(i64::from(
            raft_metrics.current_leader == Some(raft_metrics.id),
        ));
        self.raft_commit_index.set(clamp(committed_index));
        let applied = raft_metrics.last_applied.map_or(0, |log_id| log_id.index);
        self.raft_applied_index.set(clamp(applied));
        let last_log = raft_metrics.last_log_index.unwrap_or(0);
        let purged = raft_metrics.purged.map_or(0, |log_id| log_id.index);
        self.raft_log_entries
            .set(clamp(last_log.saturating_sub(purged)));
        self.raft_snapshot_index.set(clamp(
            raft_metrics.snapshot.map_or(0, |log_id| log_id.index),
        ));
    }
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn metric_error(error: prometheus::Error) -> MetaError {
    MetaError::Config(format!("metrics registration failed: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_the_quiver_meta_prefix() {
        let metrics = MetaMetrics::new().expect("metrics");
        metrics
            .proposals_total
            .with_label_values(&["commit_wal"])
            .inc();
        metrics.raft_term.set(3);
        let text = metrics.render();
        assert!(
            text.contains("quiver_meta_proposals_total{command=\"commit_wal\"} 1"),
            "{text}"
        );
        assert!(text.contains("quiver_meta_raft_term 3"));
        for line in text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
        {
            assert!(line.starts_with("quiver_meta_"), "{line}");
        }
    }
}
