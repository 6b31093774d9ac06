//! What every Quiver crate shares, and nothing else: small, dependency-light
//! building blocks that would otherwise be written once per crate.
//!
//! - [`ErrorCode`] and [`ServiceError`]: the one error vocabulary. Every service
//!   error says which code it is; one mapping turns any of them into a gRPC status
//!   (feature `grpc`) or an HTTP status and JSON body (the gateway), and the SDKs
//!   decode the same codes.
//! - [`RetryPolicy`]: the one retry policy (exponential backoff with full jitter,
//!   bounded by attempts and by elapsed time) every client loop uses.
//! - [`hash`]: the stable hashes whose outputs are part of the data format
//!   (shard routing, rendezvous placement) or of reproducible tests.
//! - [`stats`]: percentiles over sorted samples, for benchmarks and reports.
//! - [`vecs`]: `.fvecs`/`.ivecs` dataset files (read by the CLI and the benchmarks).
//! - [`memory_limit`], [`rows_memory_budget`]: the memory the process can count
//!   on (its cgroup's limit or the machine's), and what of it rows may keep
//!   resident.

mod error;
pub mod hash;
mod memory;
mod retry;
pub mod stats;
pub mod vecs;

pub use error::{ErrorCode, RETRY_AFTER_MS_HEADER, ServiceError};
#[cfg(feature = "grpc")]
pub use error::{retry_after_of_status, status_of};
pub use memory::{memory_limit, rows_memory_budget};
pub use retry::{RetryPolicy, Retryable};
