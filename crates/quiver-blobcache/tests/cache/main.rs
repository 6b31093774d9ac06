//! The region cache against real stores (memory, a local directory, and the S3
//! server `.ci/run` starts), with concurrency, faults and a real segment.

mod disk_full;
mod faults;
mod local_files;
mod search;
mod stress;
mod support;
mod tiers;
