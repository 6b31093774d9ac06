//! Running a scenario: a cluster, a workload over it, faults recorded in the
//! history, and a quiet check after each fault.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::Summary;
use crate::api::Api;
use crate::checker::{Checkpoint, assert_clean, check_history, quiet_check, unavailability};
use crate::cluster::Cluster;
use crate::history::History;
use crate::workload::{Workload, WorkloadConfig};

/// A cluster under a workload.
pub struct Run {
    pub cluster: Cluster,
    pub history: Arc<History>,
    pub workload: Option<Workload>,
    pub config: WorkloadConfig,
    pub summary: Summary,
    pub started: Instant,
}

impl Run {
    /// Starts the workload over every gateway of `cluster`.
    pub fn start(cluster: Cluster, config: WorkloadConfig, scenario: &str) -> Run {
        let history = Arc::new(History::default());
        let gateways = cluster
            .gateway_urls()
            .into_iter()
            .map(|base| Api::new(cluster.http.clone(), base))
            .collect();
        let workload = Workload::start(config.clone(), gateways, history.clone());
        Run {
            cluster,
            history,
            workload: Some(workload),
            config,
            summary: Summary::new(scenario),
            started: Instant::now(),
        }
    }

    /// Records a fault of `kind` injected now.
    pub fn fault(&mut self, kind: &str) -> Instant {
        *self.summary.faults.entry(kind.to_string()).or_default() += 1;
        self.history.fault(kind)
    }

    /// Waits until a write and a strong read started after `since` succeeded.
    pub async fn wait_recovered(&self, since: Instant, what: &str) -> anyhow::Result<()> {
        let timeout = Duration::from_secs(90);
        let deadline = Instant::now() + timeout;
        while !self.history.recovered_since(since) {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "no successful write and strong read within {timeout:?} after {what}; processes:\n{}",
                    self.cluster.describe_processes()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Pauses the workload, checks everything (with the flat scan if `scan`),
    /// fails the test on any violation, and resumes.
    pub async fn checkpoint(&mut self, scan: bool, when: &str) -> anyhow::Result<Checkpoint> {
        let workload = self.workload.as_ref().context("workload running")?;
        workload.pause().await;
        let api = self.cluster.api();
        let checkpoint = quiet_check(
            &self.cluster,
            &api,
            &self.history,
            &self.config.collection,
            self.config.dimension,
            self.config.ids,
            scan,
        )
        .await
        .with_context(|| format!("quiet check {when}"));
        let checkpoint = match checkpoint {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                self.cluster.dump_logs(40);
                return Err(error);
            }
        };
        assert_clean(&checkpoint.report, &self.cluster, when);
        self.summary.checkpoints += 1;
        self.summary.searches += checkpoint.report.searches;
        workload.resume();
        Ok(checkpoint)
    }

    /// Stops the workload, runs the last full check, fills in the summary and
    /// publishes it.
    pub async fn finish(mut self) -> anyhow::Result<Summary> {
        let workload = self.workload.take().context("workload running")?;
        workload.pause().await;
        let (_, read_errors) = workload.errors();
        let error_kinds = workload.error_kinds();
        workload.stop().await;
        let api = self.cluster.api();
        let last = quiet_check(
            &self.cluster,
            &api,
            &self.history,
            &self.config.collection,
            self.config.dimension,
            self.config.ids,
            true,
        )
        .await
        .context("final check")?;
        assert_clean(&last.report, &self.cluster, "at the end");
        let snapshot = self.history.snapshot();
        let (report, _) = check_history(&snapshot, self.config.dimension);
        assert_clean(&report, &self.cluster, "over the whole history");
        let mut summary = std::mem::take(&mut self.summary);
        summary.checkpoints += 1;
        summary.writes = report.writes;
        summary.acknowledged = report.acknowledged;
        summary.unknown = report.unknown;
        summary.observations = report.observations;
        summary.searches += report.searches + last.report.searches;
        summary.violations = report.violations.len() + last.report.violations.len();
        summary.unavailability = unavailability(&snapshot);
        summary.read_errors = read_errors;
        summary
            .extra
            .insert("live_points_at_end".into(), last.live_points.into());
        summary.extra.insert(
            "failed_requests".into(),
            serde_json::to_value(&error_kinds).unwrap_or_default(),
        );
        anyhow::ensure!(
            summary.acknowledged > 0,
            "the workload got no write acknowledged"
        );
        summary.publish(self.started);
        self.cluster.mark_passed();
        Ok(summary)
    }
}
