//! Rust SDK of Quiver's REST API: collections, writes, reads, search and the
//! admin API. Requests and answers are the wire types of `quiver-api` (the same
//! structs the gateway uses), re-exported here; errors carry the server's code
//! as an [`ErrorCode`] and its retry hint. Calls that are safe to repeat are
//! retried with full-jitter backoff while the server is briefly unavailable;
//! upserts and deletes are idempotent by id, so they are retried too.
//! `https://` endpoints are verified against the system's CA certificates plus
//! any given in [`ClientOptions::ca_certificate_pem`].
//!
//! - `client`: [`Client`] and its options;
//! - `error`: [`Error`], with [`Error::code`] and [`Error::retry_after`];
//! - `tls`: the TLS configuration.

mod client;
mod error;
mod tls;

pub use client::{Client, ClientOptions, CollectionConfig};
pub use error::{Error, Result};
pub use quiver_api::{
    ClusterStatus, Collection, CollectionShards, CompactResponse, CreateCollectionRequest,
    DescribeCollectionResponse, ErrorCode, MetaMembersResponse, Node, OrphansResponse, Point,
    PointId, PointRecord, SearchCost, SearchHit, SearchRequest, SearchResponse,
};

/// One search (the wire type [`SearchRequest`]; `Search::new(vector, k)`).
pub type Search = SearchRequest;
/// One hit of a search.
pub type Hit = SearchHit;
/// The answer to a search: hits best first, `took_ms`, and the `cost` block.
pub type SearchResult = SearchResponse;
