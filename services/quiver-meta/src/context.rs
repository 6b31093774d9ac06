//! What a metadata node's handlers and background tasks share ([`MetaContext`]):
//! Raft, the applied catalog and the leader's clock, and the steps every request
//! goes through — proposing a command (refused on a follower with the leader's
//! address, or while the disk is nearly full), and confirming leadership for a
//! linearizable read.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use openraft::error::{ClientWriteError, RaftError};
use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;

use crate::clock::LeaderClock;
use crate::config::MetaConfig;
use crate::convert;
use crate::error::{MetaError, MetaResult};
use crate::log_store::LogStore;
use crate::metrics::MetaMetrics;
use crate::model::{Command, MetaRequest, Outcome};
use crate::raft_types::typ::{Raft, RaftMetrics};
use crate::raft_types::{MetaNode, MetaNodeId};
use crate::state_machine::CatalogHandle;

/// Everything a metadata node's handlers and background tasks share.
pub(crate) struct MetaContext {
    pub(crate) node_id: MetaNodeId,
    pub(crate) raft: Raft,
    pub(crate) catalog: CatalogHandle,
    pub(crate) config: MetaConfig,
    pub(crate) metrics: MetaMetrics,
    pub(crate) log_store: LogStore,
    /// The catalog time this node stamps commands with as leader.
    pub(crate) clock: LeaderClock,
    /// Set (for good, until the process restarts) before this node first
    /// proposes a membership change: from then on every linearizable read takes
    /// a read-index round (see [`MetaContext::decides_alone`]).
    pub(crate) membership_changing: AtomicBool,
}

pub(crate) fn forward_error(
    leader_id: Option<MetaNodeId>,
    leader_node: Option<MetaNode>,
) -> MetaError {
    MetaError::NotLeader {
        leader_id,
        leader_address: leader_node.map(|node| node.address),
    }
}

impl MetaContext {
    /// Returns the catalog time for a command proposed or a decision taken now by
    /// this node as leader: monotonic, steered by the wall clock (see `clock.rs`).
    pub(crate) fn leader_now_ms(&self) -> u64 {
        let term = self.raft.metrics().borrow().current_term;
        let (applied_clock_ms, clock_advanced_at) = self
            .catalog
            .read(|state| (state.catalog.clock_ms(), state.clock_advanced_at));
        self.clock.now_ms(
            term,
            applied_clock_ms,
            clock_advanced_at.map(|advanced_at| advanced_at.elapsed()),
        )
    }

    /// Proposes `command` with this node's clock (only a leader can) and waits for
    /// its applied outcome.
    pub(crate) async fn propose(&self, command: Command) -> MetaResult<Outcome> {
        let command_name = command.name();
        self.metrics
            .proposals_total
            .with_label_values(&[command_name])
            .inc();
        let started = Instant::now();
        let request = MetaRequest {
            now_ms: self.leader_now_ms(),
            command,
        };
        let timeout = self.config.proposal_timeout();
        let write = async {
            self.refuse_if_disk_full()?;
            self.refuse_if_cut_off()?;
            tokio::select! {
                written = tokio::time::timeout(timeout, self.raft.client_write(request)) => Ok(written),
                // Cut off while waiting: the entry cannot commit unless the
                // partition heals first, so the outcome is unknown either way.
                since_ms = self.cut_off() => Err(MetaError::Unavailable(format!(
                    "{command_name} was not committed within {} ms: no quorum acknowledged this \
                     leader for {since_ms} ms",
                    started.elapsed().as_millis()
                ))),
            }
        };
        let result = match write.await {
            Err(error) => Err(error),
            Ok(Err(_elapsed)) => Err(MetaError::Unavailable(format!(
                "{command_name} was not committed within {} ms (no quorum?)",
                timeout.as_millis()
            ))),
            Ok(Ok(Ok(response))) => response.data.0.map_err(MetaError::from),
            Ok(Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))))) => {
                Err(forward_error(forward.leader_id, forward.leader_node))
            }
            Ok(Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error))))) => {
                Err(MetaError::Rejected {
                    code: ErrorCode::FailedPrecondition,
                    message: error.to_string(),
                })
            }
            Ok(Ok(Err(RaftError::Fatal(fatal)))) => {
                Err(MetaError::Unavailable(format!("raft stopped: {fatal}")))
            }
        };
        self.metrics
            .proposal_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            self.metrics
                .proposal_errors_total
                .with_label_values(&[command_name, error.kind().as_str()])
                .inc();
        }
        result
    }

    /// Refuses a write while the data directory's disk has less room than
    /// `min_free_disk_bytes` (see `disk.rs`); nothing is proposed.
    pub(crate) fn refuse_if_disk_full(&self) -> MetaResult<()> {
        let reserve = self.config.min_free_disk_bytes;
        if reserve == 0 {
            return Ok(());
        }
        match crate::disk::free_disk_bytes(&self.config.data_dir) {
            Some(free) if free < reserve => Err(MetaError::Rejected {
                code: ErrorCode::ResourceExhausted,
                message: format!(
                    "metadata disk full: {free} bytes free under {}, below min_free_disk_bytes \
                     ({reserve}); writes are refused until space is freed (reads keep working)",
                    self.config.data_dir.display()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Returns for how long no quorum acknowledged this node if it leads and that
    /// is longer than the leader lease (the longest election timeout): it is cut
    /// off from its peers, which may have elected another leader meanwhile.
    pub(crate) fn cut_off_for_ms(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let since_ms = metrics.millis_since_quorum_ack?;
        (metrics.current_leader == Some(self.node_id)
            && since_ms > self.config.election_timeout_max_ms)
            .then_some(since_ms)
    }

    /// Refuses at once (nothing is proposed, so a client may try another node)
    /// while this node leads but is cut off: a proposal or a read-index round
    /// would only wait out the proposal timeout, and clients stuck on it miss
    /// heartbeats and lease renewals elsewhere.
    fn refuse_if_cut_off(&self) -> MetaResult<()> {
        match self.cut_off_for_ms() {
            Some(since_ms) => Err(MetaError::Unavailable(format!(
                "meta node {} leads but no quorum acknowledged it for {since_ms} ms (cut off \
                 from its peers?); ask another node",
                self.node_id
            ))),
            None => Ok(()),
        }
    }

    /// Returns once this node leads and is cut off (see [`Self::cut_off_for_ms`]).
    async fn cut_off(&self) -> u64 {
        loop {
            if let Some(since_ms) = self.cut_off_for_ms() {
                return since_ms;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Whether this node alone decides what is committed, so that a
    /// linearizable read needs no read-index round: it leads, it has applied
    /// an entry of its own term (so every entry of earlier terms — writes
    /// acknowledged before a restart among them — is applied too), it is the
    /// only member (voter or learner) of the latest membership in its log,
    /// committed or not, and no membership change was ever proposed through it
    /// since it started. Then its applied catalog holds every write
    /// acknowledged before the read — a write is acknowledged only once applied
    /// (`client_write` answers with the applied outcome) — and no other node
    /// can lead or commit anything without first being added by a membership
    /// change, which only this node can propose and which ends this path before
    /// it is proposed. This is `quiver standalone`'s meta and a one-node
    /// metadata service.
    pub(crate) fn decides_alone(&self) -> bool {
        if self.membership_changing.load(Ordering::SeqCst) {
            return false;
        }
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        metrics.current_leader == Some(self.node_id)
            && metrics.state == openraft::ServerState::Leader
            && metrics
                .last_applied
                .is_some_and(|applied| applied.leader_id.get_term() == metrics.current_term)
            && membership.nodes().all(|(id, _)| *id == self.node_id)
            && membership.voter_ids().all(|id| id == self.node_id)
    }

    /// Marks that a membership change is about to be proposed through this
    /// node: linearizable reads take read-index rounds from now on.
    pub(crate) fn begin_membership_change(&self) {
        self.membership_changing.store(true, Ordering::SeqCst);
    }

    /// Makes a read linearizable: nothing to do on a node that decides alone
    /// ([`Self::decides_alone`]); otherwise confirms leadership with a
    /// read-index round and waits until the catalog has applied everything
    /// committed before it.
    pub(crate) async fn linearize(&self) -> MetaResult<()> {
        if self.decides_alone() {
            self.metrics
                .linearizable_reads_total
                .with_label_values(&["local"])
                .inc();
            return Ok(());
        }
        self.metrics
            .linearizable_reads_total
            .with_label_values(&["read_index"])
            .inc();
        self.refuse_if_cut_off()?;
        let started = Instant::now();
        let timeout = self.config.proposal_timeout();
        let confirmed = tokio::select! {
            confirmed = tokio::time::timeout(timeout, self.raft.ensure_linearizable()) => confirmed,
            since_ms = self.cut_off() => {
                return Err(MetaError::Unavailable(format!(
                    "leadership not confirmed within {} ms: no quorum acknowledged this leader \
                     for {since_ms} ms",
                    started.elapsed().as_millis()
                )));
            }
        };
        match confirmed {
            Err(_elapsed) => Err(MetaError::Unavailable(format!(
                "leadership not confirmed within {} ms",
                timeout.as_millis()
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(
                forward,
            )))) => Err(forward_error(forward.leader_id, forward.leader_node)),
            Ok(Err(RaftError::APIError(error))) => Err(MetaError::Unavailable(error.to_string())),
            Ok(Err(RaftError::Fatal(fatal))) => {
                Err(MetaError::Unavailable(format!("raft stopped: {fatal}")))
            }
        }
    }

    pub(crate) fn raft_metrics(&self) -> RaftMetrics {
        self.raft.metrics().borrow().clone()
    }

    pub(crate) fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.current_leader == Some(self.node_id)
    }

    pub(crate) fn members(&self) -> Vec<pb::MetaMember> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<MetaNodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| pb::MetaMember {
                id: *id,
                address: node.address.clone(),
                role: if voters.contains(id) {
                    pb::MemberRole::Voter
                } else {
                    pb::MemberRole::Learner
                } as i32,
            })
            .collect()
    }

    pub(crate) fn cluster_status(&self) -> pb::ClusterStatusResponse {
        let metrics = self.raft_metrics();
        let leader_id = metrics.current_leader.unwrap_or(0);
        let leader_address = metrics
            .current_leader
            .and_then(|leader| {
                metrics
                    .membership_config
                    .membership()
                    .get_node(&leader)
                    .cloned()
            })
            .map(|node| node.address)
            .unwrap_or_default();
        let (nodes, collections, catalog_version) = self.catalog.read(|state| {
            (
                state.catalog.nodes().map(convert::node_to_proto).collect(),
                state.catalog.collections().count() as u64,
                state.catalog.version(),
            )
        });
        let raft_state = match metrics.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        };
        pb::ClusterStatusResponse {
            node_id: self.node_id,
            leader_id,
            leader_address,
            term: metrics.current_term,
            commit_index: self.log_store.committed_index(),
            applied_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            members: self.members(),
            nodes,
            collections,
            catalog_version,
            raft_state: raft_state.to_owned(),
            snapshot_index: metrics.snapshot.map_or(0, |log_id| log_id.index),
        }
    }
}
