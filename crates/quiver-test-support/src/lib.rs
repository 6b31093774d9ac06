//! What Quiver's test suites share, written once instead of once per suite. Use
//! it as a dev-dependency only; it may panic and uses `anyhow`, as tests do.
//!
//! - [`skip_or_fail`] and [`under_ci`]: a test that cannot run here (no S3 test
//!   server, no permission to mount) says so on stderr and passes as skipped —
//!   except under `CI=true`, where it fails: CI must run everything.
//! - [`S3TestServer`]: the S3-compatible test server named by
//!   `QUIVER_TEST_S3_ENDPOINT` (moto in CI), its settings, and fresh buckets
//!   ([`fresh_bucket_name`]).
//! - [`eventually`]: polls a check until it holds or a deadline passes.
//! - [`Tmpfs`]: a small tmpfs mounted for a test (a disk that can be filled).
//! - [`process`]: loopback ports, signals to child processes, SIGTERM with a
//!   deadline, exit checks that leave the child to be reaped.

mod ci;
mod poll;
pub mod process;
mod s3;
mod tmpfs;

pub use ci::{skip_or_fail, under_ci};
pub use poll::{eventually, eventually_every};
pub use s3::{S3_ENDPOINT_VARIABLE, S3TestServer, fresh_bucket_name};
pub use tmpfs::Tmpfs;
