//! The control loop that runs on the Raft leader.
//!
//! Each interval the leader checks, on a copy of its catalog, whether the rules of
//! [`Catalog::reconcile`](crate::Catalog::reconcile) would change anything (a silent
//! node, an expired lease, a shard without writer or with too few searchers); only
//! then does it propose a `Reconcile` command, which every replica applies with the
//! leader's clock. For one node timeout after winning an election the leader
//! stretches the timeout, so nodes that were talking to the previous leader get time
//! to reach the new one before they are declared dead; the same after a time of
//! refused writes for lack of disk space.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::catalog::placement_changes;
use crate::context::MetaContext;
use crate::model::{Command, Outcome};

pub(crate) async fn run_control_loop(context: Arc<MetaContext>, shutdown: CancellationToken) {
    let config = &context.config;
    let mut ticker = tokio::time::interval(Duration::from_millis(config.control_interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut leader_since_ms: Option<u64> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => break,
        }
        // While the disk is full nothing can be proposed, heartbeats included:
        // once it has room again, nodes get the same grace as after an election.
        if !context.is_leader() || context.refuse_if_disk_full().is_err() {
            leader_since_ms = None;
            continue;
        }
        // Catalog time from the leader's monotonic clock (see `clock.rs`), so a
        // wall-clock jump neither kills every node nor keeps dead ones alive.
        let now_ms = context.leader_now_ms();
        let leader_since = *leader_since_ms.get_or_insert(now_ms);
        let grace_left_ms = (leader_since + config.node_timeout_ms).saturating_sub(now_ms);
        let node_timeout_ms = config.node_timeout_ms + grace_left_ms;
        let lease_ttl_ms = config.lease_ttl_ms;
        // Cloning and scanning a large catalog is CPU work: keep it off the runtime.
        let catalog = context.catalog.clone();
        let preview = tokio::task::spawn_blocking(move || {
            catalog.read(|state| {
                let mut preview = state.catalog.clone();
                let apply_time_ms = now_ms.max(preview.clock_ms());
                if preview.reconcile(apply_time_ms, node_timeout_ms, lease_ttl_ms) == 0 {
                    return None;
                }
                Some(placement_changes(&state.catalog, &preview))
            })
        })
        .await;
        let placement = match preview {
            Ok(Some(placement)) => placement,
            Ok(None) => continue,
            Err(error) => {
                tracing::warn!(%error, "reconcile preview failed");
                continue;
            }
        };
        let command = Command::Reconcile {
            node_timeout_ms,
            lease_ttl_ms,
        };
        match context.propose(command).await {
            Ok(Outcome::Reconciled { changes }) => {
                context.metrics.reconciliations_total.inc();
                tracing::info!(changes, "reconciled catalog");
                // What the preview changed is what the proposal applied, up to
                // the apply time's few milliseconds: name it for the operator.
                for change in &placement {
                    change.log();
                }
            }
            Ok(other) => tracing::warn!(?other, "unexpected reconcile outcome"),
            Err(error) => tracing::debug!(%error, "reconcile proposal failed"),
        }
    }
}
