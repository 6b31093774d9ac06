//! TLS between roles on real processes: three `quiver meta` (Raft over mutual
//! TLS), an indexer, a searcher and a gateway, each with its own certificate
//! of one cluster CA (given as flags, `QUIVER_CLUSTER_TLS_*` variables and
//! config-file keys), objects in a shared `file://` store. Upserts and searches
//! go through the gateway; plaintext clients, clients without a certificate and
//! nodes of another cluster are refused, each with the reason in the log or the
//! error; incomplete or wrong flags stop a role at start with one line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use quiver_meta_client::{MetaClient, MetaClientConfig};
use quiver_proto::meta::ClusterStatusRequest;
use quiver_proto::meta::meta_service_client::MetaServiceClient;
use quiver_proto::tls::ClusterTls;
use quiver_test_support::eventually;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use serde_json::{Value, json};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::support::{RoleProcess, free_address, vector};

const DIM: usize = 8;

/// A cluster CA that signs role certificates.
struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A role's files: the CA it trusts, its certificate and its key.
struct RoleFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl RoleFiles {
    fn flags(&self) -> Vec<String> {
        vec![
            "--cluster-tls-ca".into(),
            self.ca.display().to_string(),
            "--cluster-tls-cert".into(),
            self.cert.display().to_string(),
            "--cluster-tls-key".into(),
            self.key.display().to_string(),
        ]
    }

    fn load(&self) -> ClusterTls {
        ClusterTls::from_pem_files(&self.ca, &self.cert, &self.key).expect("role files load")
    }
}

impl ClusterCa {
    fn new(name: &str) -> ClusterCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("ca key");
        let certificate = params.self_signed(&key).expect("ca certificate");
        ClusterCa {
            issuer: Issuer::new(params, key),
            pem: certificate.pem(),
        }
    }

    /// Writes the CA and a certificate for `role` (server and client usage;
    /// `localhost` and 127.0.0.1 only so the test's own tonic clients, which
    /// check names, can connect) into `directory`.
    fn role_files(&self, directory: &Path, role: &str) -> RoleFiles {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("role params");
        params.distinguished_name.push(DnType::CommonName, role);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("role key");
        let certificate = params.signed_by(&key, &self.issuer).expect("role cert");
        let files = RoleFiles {
            ca: directory.join(format!("{role}-ca.pem")),
            cert: directory.join(format!("{role}.pem")),
            key: directory.join(format!("{role}.key")),
        };
        std::fs::write(&files.ca, &self.pem).expect("write ca");
        std::fs::write(&files.cert, certificate.pem()).expect("write cert");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }
}

/// Short Raft and write-path timings; top-level keys (TLS files) go first.
fn config_text(top_level: &str, scratch_dir: &Path) -> String {
    format!(
        r#"log_format = "text"
{top_level}
[meta]
heartbeat_interval_ms = 50
election_timeout_min_ms = 300
election_timeout_max_ms = 600
control_interval_ms = 200
node_timeout_ms = 10000
lease_ttl_ms = 5000
proposal_timeout_ms = 2000
connect_timeout_ms = 300

[indexer]
commit_window_ms = 5
flush_interval_ms = 700
flush_rows = 500
scratch_dir = "{}"
"#,
        scratch_dir.display()
    )
}

async fn call(http: &reqwest::Client, method: &str, url: &str, body: Value) -> (u16, Value) {
    let request = match method {
        "PUT" => http.put(url),
        _ => http.post(url),
    };
    let response = request.json(&body).send().await.expect("request sent");
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// A metadata client with the given TLS and a short retry deadline.
fn meta_client(address: &str, tls: Option<ClusterTls>) -> MetaClient {
    let mut config = MetaClientConfig::new(vec![address.to_string()]);
    config.retry_deadline = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(1);
    config.tls = tls;
    MetaClient::new(config).expect("meta client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_speaks_mutual_tls_and_refuses_strangers() {
    quiver_proto::tls::install_crypto_provider();
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let ca = ClusterCa::new("quiver cluster CA");
    let other_ca = ClusterCa::new("another cluster's CA");
    let scratch = root.join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let config_path = root.join("quiver.toml");
    std::fs::write(&config_path, config_text("", &scratch)).expect("config");
    let config = config_path.display().to_string();
    let objects = format!("file://{}", root.join("objects").display());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client");

    // Three meta nodes: Raft between them over mutual TLS (flags).
    let meta_addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
    let peers = meta_addresses
        .iter()
        .enumerate()
        .map(|(index, address)| format!("{}={address}", index + 1))
        .collect::<Vec<_>>()
        .join(",");
    let metas: Vec<RoleProcess> = meta_addresses
        .iter()
        .enumerate()
        .map(|(index, address)| {
            let node_id = index + 1;
            let name = format!("meta-{node_id}");
            let mut args = vec![
                "meta".to_string(),
                "--node-id".into(),
                node_id.to_string(),
                "--data-dir".into(),
                root.join(&name).display().to_string(),
                "--listen".into(),
                address.clone(),
                "--peers".into(),
                peers.clone(),
                "--config".into(),
                config.clone(),
            ];
            if node_id == 1 {
                args.push("--init".into());
            }
            args.extend(ca.role_files(root, &name).flags());
            RoleProcess::spawn(root, &name, args, &[])
        })
        .collect();
    for meta in &metas {
        meta.wait_ready(&http).await;
    }
    let meta_list = meta_addresses.join(",");

    // A searcher of another cluster (its own CA, certificate and key, all
    // consistent): it starts, but no connection to this cluster's meta succeeds.
    let stranger_files = other_ca.role_files(root, "stranger");
    let mut stranger_args = vec![
        "searcher".to_string(),
        "--meta".into(),
        meta_list.clone(),
        "--object-store".into(),
        objects.clone(),
        "--listen".into(),
        free_address(),
        "--node-id".into(),
        "stranger".into(),
        "--cache-dir".into(),
        root.join("stranger-cache").display().to_string(),
        "--cache-size".into(),
        "16MiB".into(),
        "--config".into(),
        config.clone(),
    ];
    stranger_args.extend(stranger_files.flags());
    let stranger = RoleProcess::spawn(root, "stranger", stranger_args, &[]);

    // The indexer takes its TLS files from QUIVER_CLUSTER_TLS_* variables.
    let indexer_files = ca.role_files(root, "indexer");
    let indexer_address = free_address();
    let indexer = RoleProcess::spawn(
        root,
        "indexer",
        vec![
            "indexer".into(),
            "--meta".into(),
            meta_list.clone(),
            "--object-store".into(),
            objects.clone(),
            "--listen".into(),
            indexer_address.clone(),
            "--node-id".into(),
            "indexer-1".into(),
            "--config".into(),
            config.clone(),
        ],
        &[
            (
                "QUIVER_CLUSTER_TLS_CA",
                indexer_files.ca.display().to_string(),
            ),
            (
                "QUIVER_CLUSTER_TLS_CERT",
                indexer_files.cert.display().to_string(),
            ),
            (
                "QUIVER_CLUSTER_TLS_KEY",
                indexer_files.key.display().to_string(),
            ),
        ],
    );
    // The searcher from its config file's cluster_tls_* keys.
    let searcher_files = ca.role_files(root, "searcher");
    let searcher_config = root.join("searcher.toml");
    std::fs::write(
        &searcher_config,
        config_text(
            &format!(
                "cluster_tls_ca = \"{}\"\ncluster_tls_cert = \"{}\"\ncluster_tls_key = \"{}\"\n",
                searcher_files.ca.display(),
                searcher_files.cert.display(),
                searcher_files.key.display()
            ),
            &scratch,
        ),
    )
    .expect("searcher config");
    let searcher_address = free_address();
    let searcher = RoleProcess::spawn(
        root,
        "searcher",
        vec![
            "searcher".into(),
            "--meta".into(),
            meta_list.clone(),
            "--object-store".into(),
            objects.clone(),
            "--listen".into(),
            searcher_address.clone(),
            "--node-id".into(),
            "searcher-1".into(),
            "--cache-dir".into(),
            root.join("searcher-cache").display().to_string(),
            "--cache-size".into(),
            "32MiB".into(),
            "--config".into(),
            searcher_config.display().to_string(),
        ],
        &[],
    );
    // The gateway from flags; its client ports stay plaintext.
    let mut gateway_args = vec![
        "gateway".to_string(),
        "--meta".into(),
        meta_list.clone(),
        "--grpc-listen".into(),
        free_address(),
        "--node-id".into(),
        "gateway-1".into(),
        "--config".into(),
        config.clone(),
    ];
    gateway_args.extend(ca.role_files(root, "gateway").flags());
    let gateway = RoleProcess::spawn(root, "gateway", gateway_args, &[]);
    for process in [&indexer, &searcher, &gateway] {
        process.wait_ready(&http).await;
    }
    for process in metas.iter().chain([&indexer, &searcher, &gateway]) {
        assert!(
            process.log().contains("cluster_tls=true"),
            "{} does not say it runs TLS between roles:\n{}",
            process.name,
            process.log()
        );
    }

    // Upserts and strong searches through the gateway: gateway → meta,
    // indexer and searcher, indexer and searcher → meta, all over mutual TLS.
    let base = format!("http://{}", gateway.http);
    let (status, body) = call(
        &http,
        "PUT",
        &format!("{base}/v1/collections/secure"),
        json!({"dimension": DIM, "metric": "cosine", "shards": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let points: Vec<Value> = (0..60)
        .map(|id| json!({"id": id, "vector": vector(id, DIM)}))
        .collect();
    let upserted = eventually("upsert accepted", Duration::from_secs(60), || async {
        let (status, body) = call(
            &http,
            "POST",
            &format!("{base}/v1/collections/secure/points"),
            json!({"points": points}),
        )
        .await;
        (status == 200).then_some(body)
    })
    .await;
    if let Err(error) = upserted {
        panic!(
            "{error:#}\nindexer log:\n{}\ngateway log:\n{}",
            indexer.log(),
            gateway.log()
        );
    }
    for id in [3u64, 17, 42] {
        let found = eventually(
            "strong search finds the point",
            Duration::from_secs(60),
            || {
                let http = http.clone();
                let url = format!("{base}/v1/collections/secure/search");
                async move {
                    let (status, body) = call(
                        &http,
                        "POST",
                        &url,
                        json!({"vector": vector(id, DIM), "k": 1, "consistency": "strong"}),
                    )
                    .await;
                    (status == 200 && body["hits"][0]["id"].as_u64() == Some(id)).then_some(())
                }
            },
        )
        .await;
        if let Err(error) = found {
            panic!(
                "{error:#}\nsearcher log:\n{}\ngateway log:\n{}",
                searcher.log(),
                gateway.log()
            );
        }
    }

    // Plaintext gRPC to the TLS ports of meta, the indexer and the searcher:
    // refused (the refusal comes before any service is chosen).
    let plaintext_targets = [
        (&metas[0], meta_addresses[0].clone()),
        (&indexer, indexer_address.clone()),
        (&searcher, searcher_address.clone()),
    ];
    for (process, address) in plaintext_targets {
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .expect("url")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect_lazy();
        let answer = MetaServiceClient::new(channel)
            .cluster_status(ClusterStatusRequest {})
            .await;
        assert!(
            answer.is_err(),
            "plaintext to {} must fail: {answer:?}",
            process.name
        );
        process
            .wait_log(
                "the plaintext refusal logged",
                &["plaintext connection refused: this port requires TLS"],
                Duration::from_secs(10),
            )
            .await;
    }

    // A TLS client trusting the cluster CA but presenting no certificate.
    let anonymous =
        Endpoint::from_shared(format!("https://localhost:{}", port(&meta_addresses[1])))
            .expect("url")
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&ca.pem))
                    .domain_name("localhost"),
            )
            .expect("tls config")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect_lazy();
    let answer = MetaServiceClient::new(anonymous)
        .cluster_status(ClusterStatusRequest {})
        .await;
    assert!(
        answer.is_err(),
        "no client certificate must fail: {answer:?}"
    );
    metas[1]
        .wait_log(
            "the missing client certificate logged",
            &[
                "peer sent no certificates",
                "the client presented no certificate",
            ],
            Duration::from_secs(10),
        )
        .await;

    // A client of another cluster: it refuses meta's certificate, and says why.
    let error = meta_client(
        &meta_addresses[2],
        Some(other_ca.role_files(root, "foreign").load()),
    )
    .cluster_status()
    .await
    .expect_err("another cluster's client is refused")
    .to_string();
    assert!(
        error.contains("cluster TLS handshake with")
            && error.contains("UnknownIssuer")
            && error.contains("not signed by this node's cluster CA"),
        "{error}"
    );
    metas[2]
        .wait_log(
            "the refusal by the client logged",
            &["the client refused this node's certificate"],
            Duration::from_secs(10),
        )
        .await;

    // A client trusting this cluster's CA but holding another CA's certificate
    // (a role cannot start that way, see the flag test; a hand-made client
    // can): meta refuses the certificate and says why.
    let client_config = hand_made_client(&ca.pem, &other_ca, root);
    let refused = handshake_and_read(&meta_addresses[0], client_config).await;
    assert!(
        refused.is_err(),
        "a foreign client certificate must be refused"
    );
    metas[0]
        .wait_log(
            "the foreign client certificate logged",
            &["UnknownIssuer (the client's certificate is not signed by this node's cluster CA"],
            Duration::from_secs(10),
        )
        .await;

    // The searcher of another cluster never registered, and its log says why.
    stranger
        .wait_log(
            "the stranger's refusal",
            &[
                "cluster TLS handshake with",
                "UnknownIssuer (the server's certificate is not signed by this node's cluster CA",
            ],
            Duration::from_secs(60),
        )
        .await;
    let stranger_ready = http
        .get(format!("http://{}/readyz", stranger.http))
        .send()
        .await
        .map(|response| response.status().is_success())
        .unwrap_or(false);
    assert!(!stranger_ready, "the stranger must not be ready");
}

fn port(address: &str) -> &str {
    address.rsplit(':').next().expect("port")
}

/// A rustls client trusting `ca_pem` and presenting a certificate of `other`.
fn hand_made_client(ca_pem: &str, other: &ClusterCa, directory: &Path) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let files = other.role_files(directory, "hand-made");
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(certificate.expect("ca pem")).expect("root");
    }
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .expect("cert file")
        .collect::<Result<Vec<_>, _>>()
        .expect("cert pem");
    let key = PrivateKeyDer::from_pem_file(&files.key).expect("key pem");
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client cert");
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// Runs one TLS handshake plus a read with `config` against `address`; the
/// server's refusal of the client certificate arrives as the read's error.
async fn handshake_and_read(address: &str, config: rustls::ClientConfig) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(address).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, stream)
        .await?;
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await?;
    let mut buffer = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
        Ok(Ok(0)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

fn run_quiver(args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quiver"));
    command.args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = command.output().expect("quiver runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    )
}

#[test]
fn incomplete_or_wrong_cluster_tls_settings_stop_a_role_with_one_line() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let ca = ClusterCa::new("quiver cluster CA");
    let other_ca = ClusterCa::new("another cluster's CA");
    let files = ca.role_files(root, "role");
    let foreign = other_ca.role_files(root, "foreign");
    let data_dir = root.join("meta");
    let data_dir = data_dir.to_str().expect("utf-8");
    let listen = free_address();
    let (ca_path, cert, key) = (
        files.ca.to_str().expect("utf-8"),
        files.cert.to_str().expect("utf-8"),
        files.key.to_str().expect("utf-8"),
    );
    let meta = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "meta",
            "--node-id",
            "1",
            "--data-dir",
            data_dir,
            "--listen",
            &listen,
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    };
    let standalone_config = root.join("standalone.toml");
    std::fs::write(
        &standalone_config,
        format!("cluster_tls_ca = \"{ca_path}\"\n"),
    )
    .expect("config");
    let missing = root.join("missing.pem");
    let missing = missing.to_str().expect("utf-8");
    let foreign_cert = foreign.cert.to_str().expect("utf-8");
    let foreign_key = foreign.key.to_str().expect("utf-8");
    let indexer = [
        "indexer",
        "--meta",
        "127.0.0.1:1",
        "--object-store",
        "memory://",
        "--listen",
        "127.0.0.1:0",
    ];

    // (arguments, environment, what stderr says); every case but clap's own
    // (an unknown flag, with its usage lines) is one line.
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        (
            meta(&["--cluster-tls-cert", cert]),
            vec![],
            vec!["missing --cluster-tls-ca and --cluster-tls-key"],
        ),
        (
            meta(&["--cluster-tls-cert", cert, "--cluster-tls-key", key]),
            vec![],
            vec!["missing --cluster-tls-ca"],
        ),
        (
            indexer.iter().map(|arg| arg.to_string()).collect(),
            vec![("QUIVER_CLUSTER_TLS_CA", ca_path)],
            vec!["missing --cluster-tls-cert and --cluster-tls-key"],
        ),
        (
            meta(&[
                "--cluster-tls-ca",
                missing,
                "--cluster-tls-cert",
                cert,
                "--cluster-tls-key",
                key,
            ]),
            vec![],
            vec!["cannot read cluster CA file", "missing.pem"],
        ),
        (
            meta(&[
                "--cluster-tls-ca",
                ca_path,
                "--cluster-tls-cert",
                key,
                "--cluster-tls-key",
                key,
            ]),
            vec![],
            vec![
                "cluster TLS certificate file",
                "no `BEGIN CERTIFICATE` block",
            ],
        ),
        (
            meta(&[
                "--cluster-tls-ca",
                ca_path,
                "--cluster-tls-cert",
                cert,
                "--cluster-tls-key",
                foreign_key,
            ]),
            vec![],
            vec!["cluster TLS key file", "does not fit certificate file"],
        ),
        (
            meta(&[
                "--cluster-tls-ca",
                ca_path,
                "--cluster-tls-cert",
                foreign_cert,
                "--cluster-tls-key",
                foreign_key,
            ]),
            vec![],
            vec!["foreign.pem", "not signed by that CA"],
        ),
        (
            vec![
                "standalone".into(),
                "--data-dir".into(),
                root.join("standalone").display().to_string(),
                "--config".into(),
                standalone_config.display().to_string(),
            ],
            vec![],
            vec!["do not apply to `quiver standalone`"],
        ),
        (
            vec![
                "standalone".into(),
                "--data-dir".into(),
                root.join("standalone").display().to_string(),
                "--cluster-tls-ca".into(),
                ca_path.into(),
            ],
            vec![],
            vec!["--cluster-tls-ca"],
        ),
    ];
    for (args, envs, needles) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (succeeded, stderr) = run_quiver(&args, &envs);
        assert!(!succeeded, "{args:?} must fail");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{args:?}: `{needle}` not in: {stderr}"
            );
        }
        let unknown_flag = stderr.contains("unexpected argument");
        if !unknown_flag {
            assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        }
    }
}
