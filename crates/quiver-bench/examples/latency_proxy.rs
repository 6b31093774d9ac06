//! An object store farther away: a proxy in front of an S3 endpoint on this
//! machine that holds every request for `--latency-ms` before forwarding it
//! (`quiver_storage::testing::FaultProxy`), as a store in another zone or
//! region would. Prints its endpoint (`http://127.0.0.1:PORT`) and serves until
//! killed. Point a cluster's `AWS_ENDPOINT_URL` at it to see what a query waits
//! for round trips (this VM's kernel has no `netem`).
//!
//! ```text
//! cargo run --release -p quiver-bench --example latency_proxy -- \
//!     --upstream http://127.0.0.1:8014 --latency-ms 10
//! ```

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use quiver_storage::testing::{FaultConfig, FaultProxy};

#[derive(Parser)]
struct Options {
    /// The S3 endpoint to forward to.
    #[arg(long)]
    upstream: String,
    /// Added to every request, milliseconds.
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = Options::parse();
    let config = FaultConfig::none().with_latency(Duration::from_millis(options.latency_ms));
    let proxy = FaultProxy::start(&options.upstream, config).await?;
    println!("{}", proxy.endpoint());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
