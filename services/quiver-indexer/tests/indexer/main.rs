//! The write path against a real object store (memory, and the S3 server when
//! `QUIVER_TEST_S3_ENDPOINT` is set) and the in-memory catalog. (The node's gRPC
//! API against a real metadata service is tested in the `quiver` package's
//! `cluster` suite, `indexer_api.rs`: this crate does not link the Raft server.)

mod faults;
mod gc_property;
mod support;
mod takeover;
mod writes;
