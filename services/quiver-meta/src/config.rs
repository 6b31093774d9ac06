//! Configuration of one metadata node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{MetaError, MetaResult};
use crate::raft_types::MetaNodeId;

/// Configuration of one metadata node; every field has a default except the node
/// id, data directory and listen address. Unknown keys are rejected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// Raft node id (≥ 1), stable for the life of the node.
    pub node_id: MetaNodeId,
    /// Where the Raft log (`raft-log.redb`) and snapshots (`snapshots/`) live.
    pub data_dir: PathBuf,
    /// Address of the gRPC port (client API and Raft), e.g. `127.0.0.1:7100`.
    pub listen: String,
    /// Address other nodes and clients use to reach this node (default: `listen`).
    pub advertise_address: Option<String>,
    /// Metadata nodes by id. With `init`, they become the first voters; the
    /// addresses are also this node's routes to its peers.
    pub peers: BTreeMap<MetaNodeId, String>,
    /// Initializes a new cluster from `peers` (or this node alone) if this node has
    /// no Raft state yet; ignored afterwards.
    pub init: bool,
    /// Leader heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_timeout_max_ms: u64,
    /// A snapshot is built after this many log entries since the last one.
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot (for slow followers); the rest is purged.
    pub logs_to_keep: u64,
    /// Also snapshot on this period when anything was applied since the last
    /// snapshot (0 = only by `snapshot_logs`).
    pub snapshot_interval_ms: u64,
    /// Control loop interval on the leader.
    pub control_interval_ms: u64,
    /// Heartbeat silence after which a data node is dead.
    pub node_timeout_ms: u64,
    /// Time to live of leases the control loop grants.
    pub lease_ttl_ms: u64,
    /// Time replaced objects stay on the GC list before they may be deleted.
    pub gc_grace_ms: u64,
    /// Longest wait for a proposal to commit or a read-index round.
    pub proposal_timeout_ms: u64,
    /// Connect timeout for peer channels.
    pub connect_timeout_ms: u64,
    /// Writes are refused (`RESOURCE_EXHAUSTED`) while the disk of `data_dir`
    /// has less room than this, so the Raft log never meets a full disk (a
    /// failed log write stops openraft for good); 0 turns the check off.
    pub min_free_disk_bytes: u64,
    /// This is the one metadata node of `quiver standalone`, in process with
    /// every other role: its membership never changes, so adding, promoting or
    /// removing a metadata node is refused (`FAILED_PRECONDITION`). Set by the
    /// binary, not read from a config file.
    #[serde(skip)]
    pub fixed_membership: bool,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            node_id: 1,
            data_dir: PathBuf::from("data/meta"),
            listen: "127.0.0.1:7100".into(),
            advertise_address: None,
            peers: BTreeMap::new(),
            init: false,
            heartbeat_interval_ms: 250,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 2_000,
            snapshot_logs: 10_000,
            logs_to_keep: 1_000,
            snapshot_interval_ms: 3_600_000,
            control_interval_ms: 1_000,
            node_timeout_ms: 10_000,
            lease_ttl_ms: 10_000,
            gc_grace_ms: 300_000,
            proposal_timeout_ms: 5_000,
            connect_timeout_ms: 1_000,
            min_free_disk_bytes: 64 << 20,
            fixed_membership: false,
        }
    }
}

impl MetaConfig {
    /// Returns a config for `node_id` with `data_dir` and `listen`, the rest default.
    pub fn new(
        node_id: MetaNodeId,
        data_dir: impl Into<PathBuf>,
        listen: impl Into<String>,
    ) -> Self {
        MetaConfig {
            node_id,
            data_dir: data_dir.into(),
            listen: listen.into(),
            ..MetaConfig::default()
        }
    }

    /// Returns the config with short Raft and control-loop timings for tests.
    pub fn with_fast_timings(mut self) -> Self {
        self.heartbeat_interval_ms = 50;
        self.election_timeout_min_ms = 300;
        self.election_timeout_max_ms = 600;
        self.control_interval_ms = 100;
        self.proposal_timeout_ms = 2_000;
        self.connect_timeout_ms = 300;
        self
    }

    /// Returns the address other nodes use to reach this one.
    pub fn advertised(&self) -> String {
        self.advertise_address
            .clone()
            .or_else(|| self.peers.get(&self.node_id).cloned())
            .unwrap_or_else(|| self.listen.clone())
    }

    /// Checks the configuration; the error names the bad field.
    pub fn validate(&self) -> MetaResult<()> {
        let invalid = |message: String| Err(MetaError::Config(message));
        if self.node_id == 0 {
            return invalid("node_id must be at least 1".into());
        }
        if self.data_dir.as_os_str().is_empty() {
            return invalid("data_dir must be set".into());
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return invalid(format!(
                "listen `{}` is not an ip:port address",
                self.listen
            ));
        }
        if self.peers.keys().any(|peer_id| *peer_id == 0) {
            return invalid("peer ids must be at least 1".into());
        }
        if let Some((peer_id, address)) = self.peers.iter().find(|(_, address)| address.is_empty())
        {
            return invalid(format!("peer {peer_id} has an empty address `{address}`"));
        }
        if self.init && !self.peers.is_empty() && !self.peers.contains_key(&self.node_id) {
            return invalid(format!(
                "--init with peers must list this node ({}) among the peers",
                self.node_id
            ));
        }
        if self.heartbeat_interval_ms == 0
            || self.election_timeout_min_ms <= self.heartbeat_interval_ms
        {
            return invalid(format!(
                "election_timeout_min_ms ({}) must exceed heartbeat_interval_ms ({}) and both must be positive",
                self.election_timeout_min_ms, self.heartbeat_interval_ms
            ));
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return invalid(format!(
                "election_timeout_max_ms ({}) must exceed election_timeout_min_ms ({})",
                self.election_timeout_max_ms, self.election_timeout_min_ms
            ));
        }
        for (name, value) in [
            ("snapshot_logs", self.snapshot_logs),
            ("control_interval_ms", self.control_interval_ms),
            ("node_timeout_ms", self.node_timeout_ms),
            ("lease_ttl_ms", self.lease_ttl_ms),
            ("proposal_timeout_ms", self.proposal_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if value == 0 {
                return invalid(format!("{name} must be positive"));
            }
        }
        Ok(())
    }

    pub(crate) fn proposal_timeout(&self) -> Duration {
        Duration::from_millis(self.proposal_timeout_ms)
    }

    pub(crate) fn raft_config(&self) -> MetaResult<openraft::Config> {
        let config = openraft::Config {
            cluster_name: "quiver-meta".into(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_logs),
            max_in_snapshot_log_to_keep: self.logs_to_keep,
            install_snapshot_timeout: self.proposal_timeout_ms.max(1_000),
            // Elections are started by `election::run_elections`, after a quorum
            // granted a pre-vote; openraft's own timer would campaign without one.
            enable_elect: false,
            ..openraft::Config::default()
        };
        config
            .validate()
            .map_err(|error| MetaError::Config(format!("raft settings rejected: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_the_field() {
        MetaConfig::default()
            .validate()
            .expect("defaults are valid");
        MetaConfig::default()
            .with_fast_timings()
            .validate()
            .expect("fast timings are valid");
        let config = MetaConfig {
            listen: "not an address".into(),
            ..MetaConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("listen")
        );
        let mut config = MetaConfig {
            init: true,
            ..MetaConfig::default()
        };
        config.peers.insert(2, "127.0.0.1:1".into());
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--init")
        );
        let mut config = MetaConfig::default();
        config.election_timeout_max_ms = config.election_timeout_min_ms;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("election_timeout_max_ms")
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let parsed: Result<MetaConfig, _> =
            serde_json::from_str(r#"{"node_id": 2, "colour": "red"}"#);
        assert!(parsed.unwrap_err().to_string().contains("colour"));
        let parsed: MetaConfig =
            serde_json::from_str(r#"{"node_id": 2, "peers": {"1": "a:1"}}"#).expect("parse");
        assert_eq!(parsed.node_id, 2);
        assert_eq!(parsed.peers[&1], "a:1");
    }
}
