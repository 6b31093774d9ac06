//! Real `quiver meta` processes: failover under kill -9, catch-up after restart,
//! full-cluster restart, configuration errors, and (ignored) measurements.

mod config_errors;
mod failover;
mod measurements;
mod startup;
mod support;
