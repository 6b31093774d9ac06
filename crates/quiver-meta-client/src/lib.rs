//! The metadata service's client, for every role that talks to it (indexers,
//! searchers, gateways, the `quiver` binary, tests): no Raft, no storage engine.
//!
//! - [`MetaClient`] (settings: [`MetaClientConfig`]): every catalog call, sent to
//!   the node last seen as leader, moved at once to the leader a follower names,
//!   retried with the shared full-jitter [`quiver_common::RetryPolicy`] until the
//!   call's deadline; each attempt has a timeout.
//! - [`keep_registered`] with a [`NodeIdentity`]: a data node's registration and
//!   heartbeat loop.
//! - [`MetaClientError`]: what a call fails with, in the shared error vocabulary.
//! - [`lazy_channel`]: the gRPC channel to a metadata node (also used between
//!   metadata nodes).

mod channel;
mod client;
mod error;
mod membership;

pub use channel::lazy_channel;
pub use client::{MetaClient, MetaClientConfig};
pub use error::{MetaClientError, MetaClientResult};
pub use membership::{NodeIdentity, keep_registered};
