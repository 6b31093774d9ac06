//! Quiver's gRPC services and messages, generated at build time from `proto/`, and
//! the small error-code vocabulary every Quiver service maps its errors into.
//!
//! - [`meta`]: the metadata service's client-facing API (`proto/quiver/v1/meta.proto`).
//! - [`raft`]: the peer-only Raft RPCs between metadata nodes (`raft.proto`).
//! - [`data`]: the data plane between roles: indexer writes, searcher reads (`data.proto`).
//! - [`client`]: the client API the gateway serves over gRPC (`client.proto`).
//! - [`convert`]: wire messages ↔ the shared model (`quiver-model`).
//! - [`ErrorCode`]: one code per kind of failure, with its gRPC and HTTP mapping.
//! - [`request_span`]: the span each role's gRPC server runs a call in, carrying
//!   the request id the gateway sends as [`REQUEST_ID_HEADER`] metadata.
//! - [`in_process`]: a role's gRPC service called by clients in the same process
//!   ([`RpcChannel`], [`serve_in_process`]; `quiver standalone`).
//! - [`tls`]: TLS for every port that speaks it — PEM files, mutual TLS between
//!   roles with the cluster CA ([`tls::ClusterTls`]), the TLS listener, and the
//!   server connections and client channels of the roles' gRPC ports.

pub mod convert;
mod error;
pub mod http2;
pub mod in_process;
pub mod tls;
mod trace;

pub use error::{
    ErrorCode, LEADER_ADDRESS_HEADER, LEADER_ID_HEADER, RETRY_AFTER_MS_HEADER, ServiceError,
    retry_after_of_status, status_of,
};
pub use in_process::{
    InProcessRegistration, LocalMeta, LocalSearcher, LocalService, MetaWatchStream, RpcChannel,
    call_local, local_meta, local_searcher, local_service, serve_in_process, serve_meta_in_process,
    serve_searcher_in_process,
};
pub use trace::{MAX_REQUEST_ID_BYTES, REQUEST_ID_HEADER, request_span, valid_request_id};

/// The metadata service's messages and its tonic client and server (`quiver.v1.meta`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod meta {
    tonic::include_proto!("quiver.v1.meta");
}

/// Peer-only Raft RPCs between metadata nodes (`quiver.v1.raft`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod raft {
    tonic::include_proto!("quiver.v1.raft");
}

/// The data plane between roles: indexer writes and searcher reads (`quiver.v1.data`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod data {
    tonic::include_proto!("quiver.v1.data");
}

/// The client API served by gateways over gRPC (`quiver.v1.client`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod client {
    tonic::include_proto!("quiver.v1.client");
}
