//! The cluster TLS files checked at start, and handshakes over loopback:
//! members connect; another cluster's node, a client without a certificate and
//! a plaintext client are refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::StreamExt;
use tonic::codegen::Service;

use super::connect::ClusterConnector;
use super::{ClusterTls, ServerIo, incoming};

struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("ca key");
        let certificate = params.self_signed(&key).expect("ca certificate");
        TestCa {
            issuer: Issuer::new(params, key),
            pem: certificate.pem(),
        }
    }

    /// A role certificate (no names needed: peers check the CA only).
    fn leaf(&self, usages: Vec<ExtendedKeyUsagePurpose>) -> (String, String) {
        let mut params = CertificateParams::new(vec!["quiver-role".to_string()]).expect("params");
        params.distinguished_name.push(DnType::CommonName, "role");
        params.extended_key_usages = usages;
        let key = KeyPair::generate().expect("key");
        let certificate = params.signed_by(&key, &self.issuer).expect("leaf");
        (certificate.pem(), key.serialize_pem())
    }
}

fn write(directory: &Path, name: &str, text: &str) -> PathBuf {
    let path = directory.join(name);
    std::fs::write(&path, text).expect("write test file");
    path
}

/// Writes a CA and a role certificate it signed; returns the loaded settings.
fn member(directory: &Path, prefix: &str, ca: &TestCa) -> ClusterTls {
    let (cert, key) = ca.leaf(vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ]);
    ClusterTls::from_pem_files(
        &write(directory, &format!("{prefix}-ca.pem"), &ca.pem),
        &write(directory, &format!("{prefix}-cert.pem"), &cert),
        &write(directory, &format!("{prefix}-key.pem"), &key),
    )
    .expect("a member's files load")
}

#[test]
fn bad_cluster_files_are_named_in_the_error() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path();
    let ca = TestCa::new("cluster");
    let other_ca = TestCa::new("another cluster");
    let (cert, key) = ca.leaf(Vec::new());
    let (foreign_cert, foreign_key) = other_ca.leaf(Vec::new());
    let (server_only_cert, server_only_key) = ca.leaf(vec![ExtendedKeyUsagePurpose::ServerAuth]);
    let ca_path = write(path, "ca.pem", &ca.pem);
    let cert_path = write(path, "cert.pem", &cert);
    let key_path = write(path, "key.pem", &key);
    let garbage = write(path, "garbage.pem", "not pem at all\n");
    let missing = path.join("missing.pem");
    let message = |ca: &Path, cert: &Path, key: &Path| {
        ClusterTls::from_pem_files(ca, cert, key)
            .expect_err("bad files")
            .message
    };

    // No extended key usage at all is fine (any purpose).
    ClusterTls::from_pem_files(&ca_path, &cert_path, &key_path).expect("a member loads");
    let text = message(&missing, &cert_path, &key_path);
    assert!(
        text.contains("cannot read cluster CA file") && text.contains("missing.pem"),
        "{text}"
    );
    let text = message(&garbage, &cert_path, &key_path);
    assert!(
        text.contains("cluster CA file") && text.contains("no `BEGIN CERTIFICATE`"),
        "{text}"
    );
    let text = message(&ca_path, &garbage, &key_path);
    assert!(
        text.contains("cluster TLS certificate file") && text.contains("garbage.pem"),
        "{text}"
    );
    let text = message(&ca_path, &cert_path, &cert_path);
    assert!(
        text.contains("cluster TLS key file") && text.contains("no `BEGIN PRIVATE KEY`"),
        "{text}"
    );
    let other_key = write(path, "other-key.pem", &foreign_key);
    let text = message(&ca_path, &cert_path, &other_key);
    assert!(text.contains("does not fit certificate file"), "{text}");
    let text = message(
        &ca_path,
        &write(path, "foreign.pem", &foreign_cert),
        &other_key,
    );
    assert!(
        text.contains("foreign.pem") && text.contains("not signed by that CA"),
        "{text}"
    );
    let text = message(
        &ca_path,
        &write(path, "server-only.pem", &server_only_cert),
        &write(path, "server-only.key", &server_only_key),
    );
    assert!(
        text.contains("as a client certificate") && text.contains("serverAuth and clientAuth"),
        "{text}"
    );
}

async fn dial(tls: &ClusterTls, address: std::net::SocketAddr) -> std::io::Result<String> {
    let mut connector = ClusterConnector {
        config: tls.client_config(),
    };
    let uri = format!("http://{address}").parse().expect("uri");
    let stream = connector.call(uri).await?;
    let mut stream = stream.into_inner();
    stream.write_all(b"ping").await?;
    let mut answer = [0u8; 4];
    stream.read_exact(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_connect_and_strangers_are_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("cluster");
    let server_tls = member(directory.path(), "server", &ca);
    let client_tls = member(directory.path(), "client", &ca);
    let stranger_tls = member(
        directory.path(),
        "stranger",
        &TestCa::new("another cluster"),
    );

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let mut connections = incoming(listener, Some(&server_tls)).expect("incoming");
    // Echo "pong" on every connection whose handshake succeeded.
    let server = tokio::spawn(async move {
        let mut served = 0usize;
        while let Some(connection) = connections.next().await {
            let ServerIo::Tls(mut stream) = connection.expect("accepted") else {
                panic!("a TLS port hands out TLS connections");
            };
            served += 1;
            tokio::spawn(async move {
                let mut request = [0u8; 4];
                if stream.read_exact(&mut request).await.is_ok() {
                    let _ = stream.write_all(b"pong").await;
                }
            });
            if served == 1 {
                return served;
            }
        }
        served
    });

    // A node of another cluster does not trust this server's certificate.
    let error = dial(&stranger_tls, address)
        .await
        .expect_err("another cluster's node is refused");
    let text = error.to_string();
    assert!(
        text.contains("cluster TLS handshake with")
            && text.contains("UnknownIssuer")
            && text.contains("not signed by this node's cluster CA"),
        "{text}"
    );

    // A client trusting the cluster CA but without a certificate of it: the
    // server refuses it (TLS 1.3 reports that after the client's side ended).
    let mut roots = rustls::RootCertStore::empty();
    for certificate in
        super::read_certificates(&directory.path().join("client-ca.pem"), "cluster CA file")
            .expect("ca")
    {
        roots.add(certificate).expect("root");
    }
    let anonymous = rustls::ClientConfig::builder_with_provider(super::crypto_provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let stream = TcpStream::connect(address).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("quiver-role").expect("name");
    let refused = async {
        let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(anonymous))
            .connect(name, stream)
            .await?;
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await
    }
    .await;
    assert!(
        refused.is_err(),
        "a client without a certificate is refused"
    );

    // Plaintext to the TLS port: closed without an answer.
    let mut plaintext = TcpStream::connect(address).await.expect("connect");
    plaintext
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), plaintext.read_to_end(&mut answer))
        .await
        .expect("the server closes a plaintext connection");
    assert!(read.is_err() || answer.is_empty(), "{answer:?}");

    // A member of the cluster connects and talks.
    assert_eq!(dial(&client_tls, address).await.expect("member"), "pong");
    assert_eq!(server.await.expect("server task"), 1);

    // TLS to a port without it (it reads the hello, finds no HTTP/2, closes).
    let plaintext_server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let plaintext_address = plaintext_server.local_addr().expect("address");
    tokio::spawn(async move {
        if let Ok((mut stream, _)) = plaintext_server.accept().await {
            let mut hello = [0u8; 16];
            let _ = stream.read(&mut hello).await;
        }
    });
    let text = dial(&client_tls, plaintext_address)
        .await
        .expect_err("a plaintext server fails the handshake")
        .to_string();
    assert!(
        text.contains("cluster TLS handshake with") && text.contains("TLS between roles turned on"),
        "{text}"
    );
}
