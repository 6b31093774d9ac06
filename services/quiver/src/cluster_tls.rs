//! TLS between roles from flags, `QUIVER_CLUSTER_TLS_*` variables or the config
//! file's `cluster_tls_*` keys: the cluster CA, the role's certificate and its
//! key — all three or none — read and checked before the role starts.

use std::path::PathBuf;

use anyhow::bail;
use quiver_proto::tls::ClusterTls;

/// Flags of TLS between roles (meta, indexer, searcher, gateway).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterTlsArgs {
    /// PEM certificate(s) of the cluster CA: the certificates of the other
    /// roles must be signed by it (TLS between roles; with --cluster-tls-cert
    /// and --cluster-tls-key).
    #[arg(long, env = "QUIVER_CLUSTER_TLS_CA")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// PEM certificate chain of this role (leaf first), signed by the cluster
    /// CA: served on its gRPC port and presented when it calls other roles.
    #[arg(long, env = "QUIVER_CLUSTER_TLS_CERT")]
    pub cluster_tls_cert: Option<PathBuf>,
    /// PEM private key of --cluster-tls-cert.
    #[arg(long, env = "QUIVER_CLUSTER_TLS_KEY")]
    pub cluster_tls_key: Option<PathBuf>,
}

/// The config file's top-level `cluster_tls_*` keys (flags and variables win).
#[derive(Debug, Clone, Default)]
pub struct ClusterTlsFileKeys {
    /// `cluster_tls_ca` (as --cluster-tls-ca).
    pub cluster_tls_ca: Option<PathBuf>,
    /// `cluster_tls_cert` (as --cluster-tls-cert).
    pub cluster_tls_cert: Option<PathBuf>,
    /// `cluster_tls_key` (as --cluster-tls-key).
    pub cluster_tls_key: Option<PathBuf>,
}

impl ClusterTlsFileKeys {
    /// Tells whether any key is set.
    pub fn any(&self) -> bool {
        self.cluster_tls_ca.is_some()
            || self.cluster_tls_cert.is_some()
            || self.cluster_tls_key.is_some()
    }
}

/// Returns the role's TLS between roles: none when nothing is set; the files
/// read and checked when all three are; an error naming what is missing
/// otherwise.
pub fn cluster_tls(
    args: &ClusterTlsArgs,
    file: &ClusterTlsFileKeys,
) -> anyhow::Result<Option<ClusterTls>> {
    let ca = args.cluster_tls_ca.clone().or(file.cluster_tls_ca.clone());
    let cert = args
        .cluster_tls_cert
        .clone()
        .or(file.cluster_tls_cert.clone());
    let key = args
        .cluster_tls_key
        .clone()
        .or(file.cluster_tls_key.clone());
    match (ca, cert, key) {
        (None, None, None) => Ok(None),
        (Some(ca), Some(cert), Some(key)) => {
            Ok(Some(ClusterTls::from_pem_files(&ca, &cert, &key)?))
        }
        (ca, cert, key) => {
            let missing: Vec<&str> = [
                (ca.is_none(), "--cluster-tls-ca"),
                (cert.is_none(), "--cluster-tls-cert"),
                (key.is_none(), "--cluster-tls-key"),
            ]
            .into_iter()
            .filter_map(|(absent, flag)| absent.then_some(flag))
            .collect();
            bail!(
                "TLS between roles needs --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key together; missing {} (flag, QUIVER_CLUSTER_TLS_* variable or cluster_tls_* config key)",
                missing.join(" and ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_three_or_none_and_the_missing_flags_are_named() {
        let none = cluster_tls(&ClusterTlsArgs::default(), &ClusterTlsFileKeys::default());
        assert!(none.expect("nothing set is fine").is_none());
        let args = ClusterTlsArgs {
            cluster_tls_cert: Some("/nonexistent/cert.pem".into()),
            ..ClusterTlsArgs::default()
        };
        let error = cluster_tls(&args, &ClusterTlsFileKeys::default())
            .expect_err("a certificate alone is refused")
            .to_string();
        assert!(
            error.contains("missing --cluster-tls-ca and --cluster-tls-key"),
            "{error}"
        );
        // The file's keys complete the flags; then the (missing) files are named.
        let file = ClusterTlsFileKeys {
            cluster_tls_ca: Some("/nonexistent/ca.pem".into()),
            cluster_tls_key: Some("/nonexistent/key.pem".into()),
            ..ClusterTlsFileKeys::default()
        };
        let error = cluster_tls(&args, &file)
            .expect_err("missing files are refused")
            .to_string();
        assert!(
            error.contains("cannot read cluster CA file /nonexistent/ca.pem"),
            "{error}"
        );
    }
}
