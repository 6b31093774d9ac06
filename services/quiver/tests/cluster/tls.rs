//! TLS on both ports of a real `quiver standalone`: a CA and a server
//! certificate made in the test, REST (raw HTTP, the Rust SDK, quiverctl) and
//! gRPC calls over TLS, plaintext to the TLS ports refused, and clients that do
//! not trust the CA failing with a certificate error.

use std::path::Path;
use std::process::Command;

use quiver_proto::client::quiver_client::QuiverClient;
use quiver_proto::client::{ListCollectionsRequest, SearchRequest};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::support::{Standalone, StartOptions, http_client, vector};

const DIM: usize = 8;

/// A test CA and a server certificate it signed for `localhost` and 127.0.0.1.
pub struct TestPki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestPki {
    pub fn new() -> TestPki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "quiver test CA");
        let ca_key = KeyPair::generate().expect("ca key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server params");
        server_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_key = KeyPair::generate().expect("server key");
        let server_cert = server_params
            .signed_by(&server_key, &issuer)
            .expect("server cert");
        TestPki {
            ca_pem: ca_cert.pem(),
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
        }
    }

    /// Writes the server's certificate and key; returns the TLS flags.
    pub fn write_server_files(&self, directory: &Path) -> Vec<String> {
        let cert = directory.join("server.pem");
        let key = directory.join("server.key");
        std::fs::write(&cert, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        vec![
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
        ]
    }
}

async fn grpc_channel(url: &str, ca_pem: &str) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(url.to_string())
        .expect("endpoint url")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca_pem))
                .domain_name("localhost"),
        )?
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ports_speak_tls_and_refuse_plaintext_and_untrusted_clients() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let directory = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let server = Standalone::start_with(
        &directory.path().join("data"),
        StartOptions {
            args: pki.write_server_files(directory.path()),
            ca_pem: Some(pki.ca_pem.clone()),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();
    let base = server.base_url();
    assert!(base.starts_with("https://"), "{base}");

    // REST over TLS through the Rust SDK: create, write, search.
    let client = quiver_client::Client::with_options(
        &base,
        quiver_client::ClientOptions {
            api_key: None,
            ca_certificate_pem: Some(pki.ca_pem.clone().into_bytes()),
        },
    )
    .unwrap();
    client
        .create_collection(
            "secure",
            &quiver_client::CollectionConfig {
                dimension: DIM as u32,
                metric: "cosine".into(),
                id_type: None,
                shards: None,
                replication: None,
                payload_schema: Vec::new(),
            },
        )
        .await
        .expect("create over https");
    let points: Vec<quiver_client::Point> = (0..20)
        .map(|id| quiver_client::Point {
            id: quiver_client::PointId::U64(id),
            vector: vector(id, DIM),
            payload: Some(json!({"n": id})),
        })
        .collect();
    client
        .upsert("secure", &points)
        .await
        .expect("upsert over https");
    let found = client
        .search("secure", &quiver_client::Search::new(vector(7, DIM), 3))
        .await
        .expect("search over https");
    assert_eq!(found.hits[0].id, json!(7), "{found:?}");

    // Plain HTTP to the TLS REST port: a JSON error saying to use https.
    let (status, body) = {
        let response = http_client(None)
            .get(format!("http://{}/v1/collections", server.http))
            .send()
            .await
            .expect("the TLS port answers plaintext with an error");
        (
            response.status().as_u16(),
            response.json::<serde_json::Value>().await.expect("json"),
        )
    };
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("https://")),
        "{body}"
    );

    // A client that does not trust the CA: the SDK names the certificate problem.
    let untrusting = quiver_client::Client::new(&base, None).unwrap();
    let error = untrusting
        .list_collections()
        .await
        .expect_err("an untrusted certificate must fail");
    assert!(
        matches!(error, quiver_client::Error::Tls { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("certificate"), "{error}");
    let error = http_client(None)
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect_err("raw client without the CA fails");
    assert!(format!("{error:?}").contains("UnknownIssuer"), "{error:?}");

    // quiverctl: --ca-cert works, without it the same certificate error.
    let ca_path = directory.path().join("ca.pem");
    std::fs::write(&ca_path, &pki.ca_pem).unwrap();
    let quiverctl = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_quiverctl"))
            .args(["--endpoint", &base])
            .args(extra)
            .args(["collections", "list"])
            .env_remove("QUIVER_CA_CERT")
            .output()
            .expect("quiverctl runs")
    };
    let listed = quiverctl(&["--ca-cert", ca_path.to_str().unwrap()]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains("secure"));
    let refused = quiverctl(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("certificate") && stderr.contains("--ca-cert"),
        "{stderr}"
    );

    // gRPC over TLS with the CA: list and search.
    let channel = grpc_channel(&server.grpc_url(), &pki.ca_pem)
        .await
        .expect("grpc tls connect");
    let mut grpc = QuiverClient::new(channel);
    let listed = grpc
        .list_collections(ListCollectionsRequest {})
        .await
        .expect("list over grpc+tls")
        .into_inner();
    assert_eq!(listed.collections.len(), 1);
    let answer = grpc
        .search(SearchRequest {
            collection: "secure".into(),
            vector: vector(3, DIM),
            k: 2,
            ..SearchRequest::default()
        })
        .await
        .expect("search over grpc+tls")
        .into_inner();
    assert_eq!(answer.hits.len(), 2);

    // gRPC without TLS to the TLS port fails; so does TLS trusting another CA.
    let plaintext = async {
        let channel = Endpoint::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await?;
        QuiverClient::new(channel)
            .list_collections(ListCollectionsRequest {})
            .await
            .map_err(anyhow::Error::from)
    }
    .await;
    assert!(
        plaintext.is_err(),
        "plaintext gRPC to the TLS port must fail"
    );
    let other_ca = TestPki::new().ca_pem;
    let untrusted = async {
        let channel = grpc_channel(&server.grpc_url(), &other_ca).await?;
        QuiverClient::new(channel)
            .list_collections(ListCollectionsRequest {})
            .await
            .map_err(anyhow::Error::from)
    }
    .await;
    let error = untrusted.expect_err("a client trusting another CA must fail");
    assert!(
        format!("{error:?}").contains("UnknownIssuer")
            || format!("{error:?}").contains("certificate"),
        "{error:?}"
    );
}
