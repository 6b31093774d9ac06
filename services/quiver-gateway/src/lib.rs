//! Quiver's front door (the gateway role): the client API over REST/JSON and
//! gRPC with validation, API keys and one error vocabulary; writes routed to the
//! indexer holding each shard's lease, searches fanned out to one ready searcher
//! per shard and merged; the admin API proxied to the metadata service.

mod auth;
mod core;
mod error;
#[cfg(test)]
mod fuzz;
mod grpc;
mod metrics;
mod request_id;
mod rest;
mod routing;
mod server;
mod tls;

pub use auth::{Access, ApiKeys};
pub use core::{Consistency, Gateway, Limits};
pub use error::{GatewayError, GatewayResult};
pub use server::{GatewayConfig, GatewayServer};
pub use tls::{ServerTls, install_crypto_provider};
