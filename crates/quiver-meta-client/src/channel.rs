//! The gRPC channel to a metadata node.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Returns a lazily connecting channel to `address` (`host:port` or a URL), with
/// `connect_timeout`, TCP_NODELAY and HTTP/2 keep-alives (a dead peer is noticed
/// within seconds, not at the next call's timeout).
pub fn lazy_channel(
    address: &str,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let url = if address.starts_with("http://") || address.starts_with("https://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    Ok(Endpoint::from_shared(url)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}
