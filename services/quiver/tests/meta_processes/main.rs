//! Real `quiver meta` processes: failover under kill -9, catch-up after restart,
//! full-cluster restart, configuration errors. (The failover and commit
//! measurements are `quiver-bench meta`.)

mod config_errors;
mod failover;
mod startup;
mod support;
