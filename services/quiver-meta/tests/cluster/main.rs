//! In-process metadata clusters: election, the API end to end, the control loop,
//! snapshots and compaction, restarts, membership changes and a leader partition.

mod api;
mod control;
mod election;
mod membership;
mod partition;
mod snapshots;
mod standalone;
mod support;
