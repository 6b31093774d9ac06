//! Elections with a pre-vote round, run by this crate around openraft 0.9.
//!
//! openraft 0.9 has no pre-vote: a follower or candidate that hears from no leader
//! raises its term and campaigns every election timeout, even when it reaches nobody.
//! A node cut off for a few seconds therefore comes back with a term well above the
//! cluster's and a shorter log, and then:
//! - its vote requests are refused because of its log, but openraft refuses them
//!   *before* adopting the higher term (databendlabs/openraft#2117, #1429), so the
//!   others stay at their lower term;
//! - it refuses the leader's appends (their term is lower), and the refusal carries its
//!   higher vote, so the leader steps down;
//! - the majority elects again, often at a term still below the returning node's, which
//!   meanwhile has campaigned again, and the cycle repeats. With an isolated follower
//!   the cluster was still split 30 s after healing in 4 runs of 20; the others took
//!   1–29 s.
//!
//! No 0.9 release fixes this (0.9.25 is the last); upstream added pre-vote in
//! 0.10.0-alpha.22, and #2117 is still open.
//!
//! So openraft's own election timer is switched off (`Config::enable_elect = false`)
//! and [`run_elections`] decides when to campaign. After the quiet period openraft
//! would have waited (the election timeout, plus the leader lease while the node's vote
//! is for an elected leader), the node first asks every voter whether it *would* vote
//! for it: a pre-vote, which changes no state anywhere. A voter says yes only if
//! - it has not heard from a leader within the leader lease (as a leader: no quorum
//!   acknowledged it within the lease) — exactly when openraft would not refuse a real
//!   vote because of the lease, and
//! - the candidate's last log id is at least its own.
//!
//! Only when a quorum says yes (a majority of every configuration of a joint
//! membership; the candidate counts itself) does the node call `trigger().elect()`,
//! and openraft runs the real election with all its own checks. A node that cannot
//! reach a quorum thus never raises its term; when it rejoins, the leader's appends
//! carry a term at least as high as its own, so it follows at once and nobody is
//! deposed.
//!
//! Safety stays openraft's: a pre-vote only decides whether to *start* an election.
//! Votes, terms, commits and read-index rounds are unchanged, so an isolated node can
//! still neither commit nor serve a linearizable read. A peer answering `UNIMPLEMENTED`
//! (a version before pre-vote, during a rolling upgrade) counts as a yes, which is how
//! that peer itself behaves.
//!
//! The same loop adds check-quorum, which openraft 0.9 also lacks (see
//! [`Elections::check_quorum`]): a leader that no quorum has acknowledged for two
//! leader leases stops sending appends, so that a leader whose links are merely slow
//! (round trips above the heartbeat interval: every append times out on its side, yet
//! arrives) cannot hold the followers' lease forever while committing nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use openraft::ServerState;
use openraft::storage::RaftLogStorage;
use quiver_meta_client::lazy_channel;
use quiver_proto::raft::RaftPayload;
use quiver_proto::raft::raft_service_client::RaftServiceClient;
use quiver_proto::tls::ClusterTls;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::log_store::LogStore;
use crate::metrics::MetaMetrics;
use crate::raft_types::MetaNodeId;
use crate::raft_types::typ::{LogId, Raft};

/// "Would you vote for me now?", sent to every voter before an election.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PreVoteRequest {
    pub(crate) candidate: MetaNodeId,
    /// The term the candidate would campaign at (for logs; not part of the decision).
    pub(crate) next_term: u64,
    pub(crate) last_log_id: Option<LogId>,
}

/// A voter's answer to a [`PreVoteRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PreVoteResponse {
    pub(crate) granted: bool,
    /// Why, in words (for logs).
    pub(crate) reason: String,
}

/// What a voter knows when it answers a pre-vote.
#[derive(Clone, Debug)]
struct VoterView {
    server_state: ServerState,
    /// As leader: time since a quorum last acknowledged this node.
    since_quorum_ack: Option<Duration>,
    /// The vote is for an elected leader (this node or another).
    vote_committed: bool,
    vote_leader: MetaNodeId,
    /// Time since the vote changed or was refreshed by the leader's appends.
    since_vote_refresh: Option<Duration>,
    last_log_id: Option<LogId>,
}

/// Decides a pre-vote by the rules of openraft's real vote, without the term.
fn decide_pre_vote(
    view: &VoterView,
    request: &PreVoteRequest,
    leader_lease: Duration,
) -> PreVoteResponse {
    let refuse = |reason: String| PreVoteResponse {
        granted: false,
        reason,
    };
    if view.server_state == ServerState::Leader {
        if let Some(since_ack) = view.since_quorum_ack
            && since_ack <= leader_lease
        {
            return refuse(format!(
                "node is the leader and a quorum acknowledged it {} ms ago",
                since_ack.as_millis()
            ));
        }
    } else if view.vote_committed
        && let Some(since_refresh) = view.since_vote_refresh
        && since_refresh <= leader_lease
    {
        return refuse(format!(
            "heard from leader {} {} ms ago",
            view.vote_leader,
            since_refresh.as_millis()
        ));
    }
    if request.last_log_id < view.last_log_id {
        return refuse(format!(
            "candidate's last log {:?} is behind this node's {:?}",
            request.last_log_id, view.last_log_id
        ));
    }
    PreVoteResponse {
        granted: true,
        reason: "no live leader and the candidate's log is up to date".into(),
    }
}

/// Tells whether `granted` holds a majority of every configuration of `joint_config`.
fn quorum_granted(joint_config: &[BTreeSet<MetaNodeId>], granted: &BTreeSet<MetaNodeId>) -> bool {
    !joint_config.is_empty()
        && joint_config.iter().all(|voters| {
            let yes = voters
                .iter()
                .filter(|voter| granted.contains(voter))
                .count();
            yes * 2 > voters.len()
        })
}

/// Tells whether a node that is not the leader has been quiet long enough to run a
/// pre-vote round: the same wait as openraft's own timer (the election timeout, plus
/// the leader lease while the vote is for an elected leader), and at least one
/// election timeout since its last round.
fn quiet_long_enough(
    vote_committed: bool,
    since_vote_refresh: Option<Duration>,
    since_last_round: Option<Duration>,
    election_timeout: Duration,
    leader_lease: Duration,
) -> bool {
    let needed = if vote_committed {
        leader_lease + election_timeout
    } else {
        election_timeout
    };
    since_vote_refresh.is_none_or(|quiet| quiet >= needed)
        && since_last_round.is_none_or(|since| since >= election_timeout)
}

/// Everything a node needs to ask for and answer pre-votes.
pub(crate) struct Elections {
    pub(crate) node_id: MetaNodeId,
    pub(crate) raft: Raft,
    pub(crate) raft_config: Arc<openraft::Config>,
    pub(crate) log_store: LogStore,
    pub(crate) metrics: MetaMetrics,
    /// Routes to peers that win over the addresses in the membership.
    pub(crate) address_overrides: Arc<BTreeMap<MetaNodeId, String>>,
    pub(crate) connect_timeout: Duration,
    /// Mutual TLS with the cluster CA on peer channels (none: plaintext).
    pub(crate) tls: Option<ClusterTls>,
    /// Shared with the network: set while this node steps down as leader.
    pub(crate) stepping_down: Arc<AtomicBool>,
}

/// Where a leader is in its check-quorum step-down (see [`Elections::check_quorum`]).
#[derive(Default)]
struct StepDown {
    stepped_down_at: Option<Instant>,
    resumed_at: Option<Instant>,
}

/// The node's own Raft state, read in one step from openraft.
struct OwnState {
    server_state: ServerState,
    vote_committed: bool,
    vote_leader: MetaNodeId,
    term: u64,
    since_vote_refresh: Option<Duration>,
    is_voter: bool,
    joint_config: Vec<BTreeSet<MetaNodeId>>,
    voter_addresses: BTreeMap<MetaNodeId, String>,
}

impl Elections {
    /// openraft's leader lease: how long a vote for a leader stands without news.
    fn leader_lease(&self) -> Duration {
        Duration::from_millis(self.raft_config.election_timeout_max)
    }

    fn random_election_timeout(&self) -> Duration {
        Duration::from_millis(
            self.raft_config
                .new_rand_election_timeout::<openraft::TokioRuntime>(),
        )
    }

    async fn last_log_id(&self) -> Option<LogId> {
        let mut log_store = self.log_store.clone();
        match log_store.get_log_state().await {
            Ok(state) => state.last_log_id,
            Err(error) => {
                tracing::warn!(%error, "cannot read the last log id for a pre-vote");
                None
            }
        }
    }

    async fn own_state(&self) -> Option<OwnState> {
        let node_id = self.node_id;
        self.raft
            .with_raft_state(move |state| {
                let vote = state.vote_ref();
                let membership = state.membership_state.effective().membership();
                OwnState {
                    server_state: state.server_state,
                    vote_committed: vote.is_committed(),
                    vote_leader: vote.leader_id().voted_for().unwrap_or_default(),
                    term: vote.leader_id().term,
                    since_vote_refresh: state
                        .vote_last_modified()
                        .map(|refreshed| refreshed.elapsed()),
                    is_voter: membership.voter_ids().any(|voter| voter == node_id),
                    joint_config: membership.get_joint_config().clone(),
                    voter_addresses: membership
                        .voter_ids()
                        .filter_map(|voter| {
                            membership
                                .get_node(&voter)
                                .map(|node| (voter, node.address.clone()))
                        })
                        .collect(),
                }
            })
            .await
            .ok()
    }

    /// Check-quorum, which openraft 0.9 lacks: a leader that no quorum has
    /// acknowledged for `step_down_after` stops sending appends (see
    /// [`crate::network`]) for a while. Without it, a leader whose round trips
    /// exceed the heartbeat interval commits nothing (every append times out on
    /// its side), while its late appends still reach the followers and keep them
    /// from electing anyone: writes would stop for as long as the links stay
    /// slow. Once its appends stop, the followers' leader lease runs out, they
    /// grant each other a pre-vote and elect a leader that reaches a quorum; its
    /// higher term makes this node a follower, which ends the step-down.
    ///
    /// If nobody is elected meanwhile (the others are down, or the one peer that
    /// came back cannot win without this node's vote), the node resumes sending
    /// after three leader leases — a peer that answers restores its quorum — and
    /// steps down again only after another `step_down_after` without one.
    fn check_quorum(&self, own: &OwnState, state: &mut StepDown, step_down_after: Duration) {
        let leading = own.server_state == ServerState::Leader;
        if !leading {
            if let Some(since) = state.stepped_down_at.take() {
                tracing::info!(
                    node_id = self.node_id,
                    term = own.term,
                    leader = own.vote_leader,
                    after_ms = since.elapsed().as_millis() as u64,
                    "stepped down: another node leads now"
                );
                self.stepping_down.store(false, Ordering::Release);
            }
            state.resumed_at = None;
            return;
        }
        if let Some(since) = state.stepped_down_at {
            if since.elapsed() >= step_down_after * 3 / 2 {
                tracing::warn!(
                    node_id = self.node_id,
                    term = own.term,
                    "no other leader elected while this one stepped down; sending again"
                );
                state.stepped_down_at = None;
                state.resumed_at = Some(Instant::now());
                self.stepping_down.store(false, Ordering::Release);
            }
            return;
        }
        let since_quorum_ack = self
            .raft
            .metrics()
            .borrow()
            .millis_since_quorum_ack
            .map(Duration::from_millis);
        let lost_quorum = since_quorum_ack.is_some_and(|since| since > step_down_after);
        let resumed_lately = state
            .resumed_at
            .is_some_and(|resumed| resumed.elapsed() < step_down_after);
        if lost_quorum && !resumed_lately {
            tracing::warn!(
                node_id = self.node_id,
                term = own.term,
                since_quorum_ack_ms = since_quorum_ack.unwrap_or_default().as_millis() as u64,
                "no quorum acknowledged this leader; stepping down so that the others can elect one"
            );
            self.metrics.leader_step_downs_total.inc();
            state.stepped_down_at = Some(Instant::now());
            self.stepping_down.store(true, Ordering::Release);
        }
    }

    /// Answers a peer's pre-vote from this node's current state; changes nothing.
    pub(crate) async fn answer(&self, request: &PreVoteRequest) -> PreVoteResponse {
        let Some(own) = self.own_state().await else {
            return PreVoteResponse {
                granted: false,
                reason: "raft is not running".into(),
            };
        };
        let since_quorum_ack = self
            .raft
            .metrics()
            .borrow()
            .millis_since_quorum_ack
            .map(Duration::from_millis);
        let view = VoterView {
            server_state: own.server_state,
            since_quorum_ack,
            vote_committed: own.vote_committed,
            vote_leader: own.vote_leader,
            since_vote_refresh: own.since_vote_refresh,
            last_log_id: self.last_log_id().await,
        };
        let response = decide_pre_vote(&view, request, self.leader_lease());
        tracing::debug!(
            candidate = request.candidate,
            next_term = request.next_term,
            granted = response.granted,
            reason = %response.reason,
            "answered a pre-vote"
        );
        response
    }

    /// Asks every other voter for a pre-vote and tells whether a quorum granted it.
    async fn pre_vote_round(
        &self,
        own: &OwnState,
        clients: &mut BTreeMap<MetaNodeId, (String, RaftServiceClient<Channel>)>,
    ) -> bool {
        let request = PreVoteRequest {
            candidate: self.node_id,
            next_term: own.term + 1,
            last_log_id: self.last_log_id().await,
        };
        let data = match serde_json::to_vec(&request) {
            Ok(data) => data,
            Err(error) => {
                tracing::warn!(%error, "cannot encode a pre-vote request");
                return false;
            }
        };
        let timeout = Duration::from_millis(self.raft_config.election_timeout_min);
        let mut calls = Vec::new();
        for (voter, membership_address) in &own.voter_addresses {
            if *voter == self.node_id {
                continue;
            }
            let address = self
                .address_overrides
                .get(voter)
                .unwrap_or(membership_address);
            let client = match clients.get(voter) {
                Some((known_address, client)) if known_address == address => client.clone(),
                _ => match lazy_channel(address, self.connect_timeout, self.tls.as_ref()) {
                    Ok(channel) => {
                        let client = RaftServiceClient::new(channel);
                        clients.insert(*voter, (address.clone(), client.clone()));
                        client
                    }
                    Err(error) => {
                        tracing::warn!(voter, address, %error, "no channel for a pre-vote");
                        continue;
                    }
                },
            };
            let data = data.clone();
            calls.push(async move {
                (
                    *voter,
                    ask_for_pre_vote(client, data, timeout, *voter).await,
                )
            });
        }
        let mut granted = BTreeSet::from([self.node_id]);
        if quorum_granted(&own.joint_config, &granted) {
            return true;
        }
        // Stop at the first quorum: a peer whose host is down would otherwise hold the
        // round (and the failover) up for the whole timeout.
        let mut answers: FuturesUnordered<_> = calls.into_iter().collect();
        while let Some((voter, answer)) = answers.next().await {
            match answer {
                Ok(response) if response.granted => {
                    granted.insert(voter);
                }
                Ok(response) => {
                    tracing::debug!(voter, reason = %response.reason, "pre-vote refused");
                }
                Err(error) => tracing::debug!(voter, %error, "pre-vote not answered"),
            }
            if quorum_granted(&own.joint_config, &granted) {
                return true;
            }
        }
        false
    }
}

async fn ask_for_pre_vote(
    mut client: RaftServiceClient<Channel>,
    data: Vec<u8>,
    timeout: Duration,
    voter: MetaNodeId,
) -> Result<PreVoteResponse, String> {
    let mut request = tonic::Request::new(RaftPayload {
        data,
        blob: Vec::new(),
    });
    request.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.pre_vote(request)).await {
        Err(_elapsed) => Err(format!(
            "pre-vote to node {voter} timed out after {} ms",
            timeout.as_millis()
        )),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => Ok(PreVoteResponse {
            granted: true,
            reason: "peer predates pre-vote".into(),
        }),
        Ok(Err(status)) => Err(format!(
            "pre-vote to node {voter}: {}: {}",
            status.code(),
            status.message()
        )),
        Ok(Ok(response)) => serde_json::from_slice(&response.into_inner().data)
            .map_err(|error| format!("undecodable pre-vote answer from node {voter}: {error}")),
    }
}

/// Starts elections on this node, each only after a quorum granted a pre-vote (see
/// the module documentation); runs until `shutdown`.
pub(crate) async fn run_elections(elections: Arc<Elections>, shutdown: CancellationToken) {
    let config = &elections.raft_config;
    let tick_ms = config
        .heartbeat_interval
        .min(config.election_timeout_min / 4)
        .max(10);
    let mut ticker = tokio::time::interval(Duration::from_millis(tick_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let leader_lease = elections.leader_lease();
    let step_down_after = leader_lease * 2;
    let mut step_down = StepDown::default();
    let mut election_timeout = elections.random_election_timeout();
    let mut last_round: Option<Instant> = None;
    let mut clients = BTreeMap::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => break,
        }
        let Some(own) = elections.own_state().await else {
            // Raft stopped (shutdown or a fatal storage error, logged by openraft).
            break;
        };
        elections.check_quorum(&own, &mut step_down, step_down_after);
        if own.server_state == ServerState::Leader || !own.is_voter {
            continue;
        }
        if !quiet_long_enough(
            own.vote_committed,
            own.since_vote_refresh,
            last_round.map(|started| started.elapsed()),
            election_timeout,
            leader_lease,
        ) {
            continue;
        }
        last_round = Some(Instant::now());
        election_timeout = elections.random_election_timeout();
        let granted = elections.pre_vote_round(&own, &mut clients).await;
        let outcome = if granted { "granted" } else { "refused" };
        elections
            .metrics
            .pre_vote_rounds_total
            .with_label_values(&[outcome])
            .inc();
        if !granted {
            tracing::debug!(
                node_id = elections.node_id,
                term = own.term,
                "pre-vote refused by a quorum; not campaigning"
            );
            continue;
        }
        tracing::info!(
            node_id = elections.node_id,
            next_term = own.term + 1,
            "pre-vote granted by a quorum; starting an election"
        );
        if let Err(error) = elections.raft.trigger().elect().await {
            tracing::warn!(%error, "election not started");
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(2_000);

    fn log_id(term: u64, index: u64) -> Option<LogId> {
        Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(term, 1),
            index,
        ))
    }

    fn follower(since_refresh_ms: u64, last_log_id: Option<LogId>) -> VoterView {
        VoterView {
            server_state: ServerState::Follower,
            since_quorum_ack: None,
            vote_committed: true,
            vote_leader: 1,
            since_vote_refresh: Some(Duration::from_millis(since_refresh_ms)),
            last_log_id,
        }
    }

    fn request(last_log_id: Option<LogId>) -> PreVoteRequest {
        PreVoteRequest {
            candidate: 3,
            next_term: 9,
            last_log_id,
        }
    }

    #[test]
    fn a_follower_that_hears_its_leader_refuses_and_one_that_does_not_grants() {
        let refused = decide_pre_vote(&follower(100, log_id(2, 5)), &request(log_id(2, 5)), LEASE);
        assert!(!refused.granted);
        assert!(
            refused.reason.contains("heard from leader 1"),
            "{refused:?}"
        );

        let granted = decide_pre_vote(
            &follower(2_500, log_id(2, 5)),
            &request(log_id(2, 5)),
            LEASE,
        );
        assert!(granted.granted, "{granted:?}");

        // A vote for a candidate (not an elected leader) does not hold anyone off.
        let mut candidate_voter = follower(100, log_id(2, 5));
        candidate_voter.vote_committed = false;
        assert!(decide_pre_vote(&candidate_voter, &request(log_id(2, 5)), LEASE).granted);
    }

    #[test]
    fn a_candidate_whose_log_is_behind_is_refused_whatever_its_term() {
        let view = follower(5_000, log_id(3, 7));
        for behind in [None, log_id(3, 6), log_id(2, 9)] {
            let answer = decide_pre_vote(&view, &request(behind), LEASE);
            assert!(!answer.granted, "{behind:?}");
            assert!(answer.reason.contains("behind"), "{answer:?}");
        }
        for up_to_date in [log_id(3, 7), log_id(3, 8), log_id(4, 1)] {
            assert!(
                decide_pre_vote(&view, &request(up_to_date), LEASE).granted,
                "{up_to_date:?}"
            );
        }
    }

    #[test]
    fn a_leader_refuses_while_a_quorum_acknowledges_it() {
        let mut leader = follower(10_000, log_id(2, 5));
        leader.server_state = ServerState::Leader;
        leader.since_quorum_ack = Some(Duration::from_millis(50));
        assert!(!decide_pre_vote(&leader, &request(log_id(2, 5)), LEASE).granted);
        // A leader cut off from its quorum does not hold the others off.
        leader.since_quorum_ack = Some(Duration::from_millis(2_500));
        assert!(decide_pre_vote(&leader, &request(log_id(2, 5)), LEASE).granted);
        leader.since_quorum_ack = None;
        assert!(decide_pre_vote(&leader, &request(log_id(2, 5)), LEASE).granted);
    }

    #[test]
    fn a_quorum_is_a_majority_of_every_joint_configuration() {
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        let uniform = vec![set(&[1, 2, 3])];
        assert!(!quorum_granted(&uniform, &set(&[1])));
        assert!(quorum_granted(&uniform, &set(&[1, 3])));
        let single = vec![set(&[1])];
        assert!(quorum_granted(&single, &set(&[1])));
        let joint = vec![set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!quorum_granted(&joint, &set(&[1, 2])));
        assert!(quorum_granted(&joint, &set(&[1, 3, 4])));
        let four = vec![set(&[1, 2, 3, 4])];
        assert!(!quorum_granted(&four, &set(&[1, 2])));
        assert!(!quorum_granted(&[], &set(&[1])));
    }

    #[test]
    fn a_node_waits_as_long_as_openraft_would_before_a_round() {
        let timeout = Duration::from_millis(400);
        let ms = Duration::from_millis;
        // Following an elected leader: lease + election timeout of silence.
        assert!(!quiet_long_enough(
            true,
            Some(ms(2_300)),
            None,
            timeout,
            LEASE
        ));
        assert!(quiet_long_enough(
            true,
            Some(ms(2_400)),
            None,
            timeout,
            LEASE
        ));
        // No elected leader: one election timeout.
        assert!(!quiet_long_enough(
            false,
            Some(ms(300)),
            None,
            timeout,
            LEASE
        ));
        assert!(quiet_long_enough(
            false,
            Some(ms(400)),
            None,
            timeout,
            LEASE
        ));
        assert!(quiet_long_enough(false, None, None, timeout, LEASE));
        // And one election timeout between rounds.
        assert!(!quiet_long_enough(
            false,
            Some(ms(5_000)),
            Some(ms(100)),
            timeout,
            LEASE
        ));
        assert!(quiet_long_enough(
            false,
            Some(ms(5_000)),
            Some(ms(400)),
            timeout,
            LEASE
        ));
    }
}
