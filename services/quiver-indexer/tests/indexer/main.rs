//! The write path against a real object store (memory, and the S3 server when
//! `QUIVER_TEST_S3_ENDPOINT` is set) and the in-memory catalog; the indexer
//! node's gRPC API against a real metadata service and the S3 server.

mod api;
mod faults;
mod gc_property;
mod support;
mod takeover;
mod writes;
