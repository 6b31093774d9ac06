//! The gRPC channel to a metadata node.

use std::time::Duration;

use quiver_proto::tls::{ClusterTls, connect_lazy};
use tonic::transport::{Channel, Endpoint};

/// Returns a lazily connecting channel to `address` (`host:port` or a URL), with
/// `connect_timeout`, TCP_NODELAY and HTTP/2 keep-alives (a dead peer is noticed
/// within seconds, not at the next call's timeout); with `tls`, over mutual TLS
/// with the cluster CA (the connect timeout covers the handshake).
pub fn lazy_channel(
    address: &str,
    connect_timeout: Duration,
    tls: Option<&ClusterTls>,
) -> Result<Channel, tonic::transport::Error> {
    let url = match address.strip_prefix("https://") {
        // The channel's connector speaks TLS itself; tonic must not.
        Some(rest) if tls.is_some() => format!("http://{rest}"),
        _ if address.starts_with("http://") || address.starts_with("https://") => {
            address.to_owned()
        }
        _ => format!("http://{address}"),
    };
    let endpoint = Endpoint::from_shared(url)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(connect_lazy(endpoint, tls))
}
