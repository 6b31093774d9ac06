//! Quiver's front door (the gateway role): the client API over REST/JSON and
//! gRPC with validation, API keys and one error vocabulary; writes routed to the
//! indexer holding each shard's lease, searches fanned out to one ready searcher
//! per shard and merged; the admin API proxied to the metadata service.
//!
//! - `core`: the operations both front ends share ([`Gateway`], [`Limits`]).
//! - `rest`: the REST front end (routes, decoding into `quiver-api` types, the
//!   error answer, one module per handler group); reference in `docs/api.md`.
//! - `grpc`: the gRPC front end (`quiver.v1.client.Quiver`).
//! - `routing`: the routing table from meta and the channels to the nodes (a
//!   searcher in this process is called directly: `quiver_proto::in_process`);
//!   `read_rounds`: concurrent strong reads sharing one meta read-index round.
//! - `error`: [`GatewayError`], a `ServiceError` of the shared vocabulary.
//! - `server`: [`GatewayServer`], the role's lifecycle; `auth`, `tls`,
//!   `request_id`, `metrics`: the front door's parts.

mod auth;
mod core;
mod error;
#[cfg(test)]
mod fuzz;
mod grpc;
mod metrics;
mod read_rounds;
mod request_id;
mod rest;
mod routing;
mod server;
mod tls;

pub use auth::{Access, ApiKeys};
pub use core::{Consistency, Gateway, Limits};
pub use error::{GatewayError, GatewayResult};
pub use server::{GatewayConfig, GatewayServer};
pub use tls::ServerTls;
