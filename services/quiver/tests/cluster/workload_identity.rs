//! Workload identity (EKS IRSA): a `quiver` process given no S3 keys, only a web
//! identity token file and a role, exchanges the token at STS
//! (`AssumeRoleWithWebIdentity`) and signs its S3 requests with the credentials it
//! gets back. STS is a small HTTPS server in the test (a certificate from a test
//! CA, trusted by the process through `AWS_CA_BUNDLE`); S3 is the test S3 server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::post;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::support::free_address;
use crate::tls::TestPki;

const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/quiver";
const TOKEN: &str = "eyJ-projected-service-account-token-7f3a";
const ISSUED_KEY_ID: &str = "ASIAQUIVERWEBIDENTITY";

/// The STS requests seen: each one's query parameters.
type Calls = Arc<Mutex<Vec<HashMap<String, String>>>>;

/// Accepts TLS connections for axum (handshake failures are dropped).
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// `AssumeRoleWithWebIdentity` as AWS STS answers it, for the right token only.
async fn assume_role(
    State(calls): State<Calls>,
    Query(query): Query<HashMap<String, String>>,
) -> (axum::http::StatusCode, String) {
    calls.lock().unwrap().push(query.clone());
    let wanted = query.get("Action").map(String::as_str) == Some("AssumeRoleWithWebIdentity")
        && query.get("RoleArn").map(String::as_str) == Some(ROLE_ARN)
        && query.get("WebIdentityToken").map(String::as_str) == Some(TOKEN);
    if !wanted {
        return (
            axum::http::StatusCode::FORBIDDEN,
            "<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>".into(),
        );
    }
    let body = format!(
        "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
         <AssumeRoleWithWebIdentityResult><Credentials>\
         <AccessKeyId>{ISSUED_KEY_ID}</AccessKeyId>\
         <SecretAccessKey>issued-secret</SecretAccessKey>\
         <SessionToken>issued-session-token</SessionToken>\
         <Expiration>2099-01-01T00:00:00Z</Expiration>\
         </Credentials></AssumeRoleWithWebIdentityResult>\
         </AssumeRoleWithWebIdentityResponse>"
    );
    (axum::http::StatusCode::OK, body)
}

/// Starts the STS stand-in over TLS; returns its https URL.
async fn start_sts(pki: &TestPki, calls: Calls) -> String {
    quiver_proto::tls::install_crypto_provider();
    let certificates = CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    };
    let app = axum::Router::new()
        .route("/", post(assume_role))
        .with_state(calls);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("https://localhost:{port}")
}

/// An indexer with web identity only (no keys): it creates its bucket first
/// (before it looks for meta), so the bucket's HEAD and PUT need the exchanged
/// credentials.
fn start_indexer(
    directory: &Path,
    s3_endpoint: &str,
    sts: &str,
    bucket: &str,
    token_file: &Path,
) -> (Child, std::path::PathBuf) {
    let log_path = directory.join(format!("indexer-{bucket}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args([
            "indexer",
            "--meta",
            "127.0.0.1:1",
            "--listen",
            &free_address(),
        ])
        .args(["--object-store", &format!("s3://{bucket}/quiver")])
        .args(["--node-id", "web-identity-test"])
        .env("RUST_LOG", "info")
        .env("AWS_ENDPOINT_URL", s3_endpoint)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_WEB_IDENTITY_TOKEN_FILE", token_file)
        .env("AWS_ROLE_ARN", ROLE_ARN)
        .env("AWS_ROLE_SESSION_NAME", "quiver-test")
        .env("AWS_ENDPOINT_URL_STS", sts)
        .env("AWS_CA_BUNDLE", directory.join("ca.pem"))
        // Nothing else to fall back to: no instance metadata service.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    (child, log_path)
}

#[tokio::test]
async fn web_identity_credentials_sign_the_s3_requests() {
    let Some(server) = quiver_test_support::S3TestServer::from_env("the web identity test") else {
        return;
    };
    let directory = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    std::fs::write(directory.path().join("ca.pem"), &pki.ca_pem).unwrap();
    let calls: Calls = Arc::default();
    let sts = start_sts(&pki, calls.clone()).await;
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();

    // The right token: credentials are issued, the bucket is made with them.
    let token_file = directory.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let bucket = quiver_test_support::fresh_bucket_name("web-identity");
    let (mut child, log_path) = start_indexer(
        directory.path(),
        server.endpoint(),
        &sts,
        &bucket,
        &token_file,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !read(&log_path).contains("created bucket") && child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "log:\n{}", read(&log_path));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = read(&log_path);
    let seen = calls.lock().unwrap().clone();
    assert!(!seen.is_empty(), "STS was never asked; log:\n{log}");
    assert_eq!(
        seen[0].get("RoleSessionName").map(String::as_str),
        Some("quiver-test")
    );
    assert!(
        log.contains("created bucket"),
        "the bucket was created with the issued credentials; log:\n{log}"
    );
    let storage = server.storage(&bucket, "", Default::default());
    storage.list("").await.expect("the bucket exists");

    // A token STS refuses: the process fails, naming the bucket, and makes nothing.
    std::fs::write(&token_file, "a-stale-token").unwrap();
    let refused = quiver_test_support::fresh_bucket_name("web-identity-refused");
    let (mut child, log_path) = start_indexer(
        directory.path(),
        server.endpoint(),
        &sts,
        &refused,
        &token_file,
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "log:\n{}", read(&log_path));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = read(&log_path);
    assert!(!status.success(), "log:\n{log}");
    assert!(
        log.contains(&refused),
        "the error names the bucket; log:\n{log}"
    );
    assert!(
        !log.contains("created bucket"),
        "nothing is created without credentials; log:\n{log}"
    );
}
