//! API keys per access level on both ports, secrets kept out of debug logs and
//! out of the admin API, and request ids followed from the gateway to the
//! indexer and searcher hops in the JSON log of a real `quiver standalone`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use quiver_proto::client::quiver_client::QuiverClient;
use quiver_proto::client::{self as api};
use quiver_proto::data;
use quiver_proto::meta as pb;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Standalone, StartOptions, free_address, vector};

const READER: &str = "reader-key-sec-5f1e2d";
const WRITER: &str = "writer-key-sec-7a9c4b";
const ADMIN: &str = "admin-key-sec-3e8d6f";
const WRONG: &str = "presented-wrong-key-0b7c";
const S3_SECRET_ENV: &str = "s3-secret-env-c41d9a";
const S3_SECRET_FILE: &str = "s3-secret-file-2b6e8f";
const SECRETS: [&str; 6] = [READER, WRITER, ADMIN, WRONG, S3_SECRET_ENV, S3_SECRET_FILE];
const DIM: usize = 4;
const DEBUG_LOG: &str = "debug,openraft=info,h2=info,hyper=info,hyper_util=info,tower=info";

fn keyed<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

fn assert_no_secret(text: &str, what: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret}"
        );
    }
}

/// Tells whether a JSON log line ran in a span named `span_name` carrying
/// `request_id` (and, for hops, a path containing `path`).
fn line_in_span(line: &Value, span_name: &str, request_id: &str, path: &str) -> bool {
    let mut spans: Vec<&Value> = line["spans"].as_array().into_iter().flatten().collect();
    spans.push(&line["span"]);
    spans.iter().any(|span| {
        span["name"] == span_name
            && span["request_id"] == request_id
            && span["path"].as_str().unwrap_or_default().contains(path)
    })
}

/// Waits until the log has a gateway line and a hop line for `request_id`.
async fn wait_for_hops(server: &Standalone, request_id: &str, hop_path: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<Value> = server
            .log()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let gateway = lines.iter().any(|line| {
            line["target"]
                .as_str()
                .is_some_and(|target| target.starts_with("quiver_gateway"))
                && line_in_span(line, "request", request_id, "")
        });
        let hop = lines
            .iter()
            .any(|line| line_in_span(line, "rpc", request_id, hop_path));
        if gateway && hop {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "request id {request_id}: gateway line {gateway}, {hop_path} line {hop}; log:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_secrets_and_request_ids_on_both_ports() {
    let directory = tempfile::tempdir().unwrap();
    let config = directory.path().join("quiver.toml");
    std::fs::write(
        &config,
        format!(
            "[storage]\naccess_key_id = \"AKIDTEST\"\nsecret_access_key = \"{S3_SECRET_FILE}\"\n"
        ),
    )
    .unwrap();
    let server = Standalone::start_with(
        &directory.path().join("data"),
        StartOptions {
            envs: vec![
                ("QUIVER_API_KEYS_READ", READER),
                ("QUIVER_API_KEYS_WRITE", WRITER),
                ("QUIVER_API_KEYS_ADMIN", ADMIN),
                ("AWS_ACCESS_KEY_ID", "AKIDTESTENV"),
                ("AWS_SECRET_ACCESS_KEY", S3_SECRET_ENV),
            ],
            args: vec![
                "--config".into(),
                config.display().to_string(),
                "--log-format".into(),
                "json".into(),
            ],
            rust_log: Some(DEBUG_LOG),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();

    // REST: each level can do its own work, not the next level's.
    let create = json!({"dimension": DIM, "metric": "cosine"});
    let points = json!({"points": (0..10).map(|id| json!({"id": id, "vector": vector(id, DIM)})).collect::<Vec<_>>()});
    let search = json!({"vector": vector(3, DIM), "k": 2});
    let rest = [
        (
            "PUT",
            "/v1/collections/guarded",
            Some(create.clone()),
            Some(WRITER),
            403,
        ),
        (
            "PUT",
            "/v1/collections/guarded",
            Some(create),
            Some(ADMIN),
            200,
        ),
        (
            "POST",
            "/v1/collections/guarded/points",
            Some(points.clone()),
            Some(READER),
            403,
        ),
        (
            "POST",
            "/v1/collections/guarded/points",
            Some(points),
            Some(WRITER),
            200,
        ),
        (
            "POST",
            "/v1/collections/guarded/search",
            Some(search.clone()),
            Some(READER),
            200,
        ),
        (
            "POST",
            "/v1/collections/guarded/search",
            Some(search.clone()),
            Some(WRONG),
            401,
        ),
        (
            "POST",
            "/v1/collections/guarded/search",
            Some(search),
            None,
            401,
        ),
        ("GET", "/admin/v1/cluster", None, Some(READER), 403),
        ("GET", "/admin/v1/cluster", None, Some(WRITER), 403),
        (
            "GET",
            "/admin/v1/collections/guarded/shards",
            None,
            Some(WRITER),
            403,
        ),
        (
            "POST",
            "/admin/v1/collections/guarded/compact",
            None,
            Some(WRITER),
            403,
        ),
    ];
    for (method, path, body, key, expected) in rest {
        let (status, answer) = server.call_with_key(method, path, body, key).await;
        assert_eq!(status, expected, "{method} {path} with {key:?}: {answer}");
    }

    // gRPC: the same levels.
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = QuiverClient::new(channel);
    let spec = |name: &str| pb::CollectionSpec {
        name: name.into(),
        dimension: DIM as u32,
        metric: pb::Metric::L2 as i32,
        ..pb::CollectionSpec::default()
    };
    let upsert = || api::UpsertRequest {
        collection: "guarded".into(),
        points: vec![data::Point {
            id: Some(data::PointId {
                kind: Some(data::point_id::Kind::Num(42)),
            }),
            vector: vector(42, DIM),
            payload_json: Vec::new(),
        }],
    };
    let search = || api::SearchRequest {
        collection: "guarded".into(),
        vector: vector(5, DIM),
        k: 3,
        ..api::SearchRequest::default()
    };
    let code = |outcome: Result<(), tonic::Status>| outcome.err().map(|status| status.code());
    assert_eq!(
        code(grpc.search(keyed(search(), None)).await.map(|_| ())),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(grpc.search(keyed(search(), Some(WRONG))).await.map(|_| ())),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(grpc.search(keyed(search(), Some(READER))).await.map(|_| ())),
        None
    );
    assert_eq!(
        code(grpc.upsert(keyed(upsert(), Some(READER))).await.map(|_| ())),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(grpc.upsert(keyed(upsert(), Some(WRITER))).await.map(|_| ())),
        None
    );
    let create = || api::CreateCollectionRequest {
        spec: Some(spec("grpc_made")),
    };
    assert_eq!(
        code(
            grpc.create_collection(keyed(create(), Some(WRITER)))
                .await
                .map(|_| ())
        ),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(
            grpc.create_collection(keyed(create(), Some(ADMIN)))
                .await
                .map(|_| ())
        ),
        None
    );
    let drop = |name: &str| api::DropCollectionRequest { name: name.into() };
    assert_eq!(
        code(
            grpc.drop_collection(keyed(drop("grpc_made"), Some(WRITER)))
                .await
                .map(|_| ())
        ),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(
            grpc.drop_collection(keyed(drop("grpc_made"), Some(ADMIN)))
                .await
                .map(|_| ())
        ),
        None
    );

    // Request ids: REST and gRPC, kept or made, returned, and seen at each hop.
    let (status, _, headers) = server
        .send_raw(
            "POST",
            "/v1/collections/guarded/points",
            Some(
                serde_json::to_vec(&json!({"points": [{"id": 77, "vector": vector(77, DIM)}]}))
                    .unwrap(),
            ),
            &[
                ("authorization", &format!("Bearer {WRITER}")),
                ("content-type", "application/json"),
                ("x-request-id", "rid-rest-upsert-1"),
            ],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-request-id"], "rid-rest-upsert-1");
    let (status, _, headers) = server
        .send_raw(
            "POST",
            "/v1/collections/guarded/search",
            Some(serde_json::to_vec(&json!({"vector": vector(77, DIM)})).unwrap()),
            &[
                ("authorization", &format!("Bearer {READER}")),
                ("x-request-id", "rid-rest-search-2"),
            ],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-request-id"], "rid-rest-search-2");
    let (_, _, headers) = server
        .send_raw(
            "GET",
            "/v1/collections",
            None,
            &[
                ("authorization", &format!("Bearer {READER}")),
                ("x-request-id", "no spaces allowed"),
            ],
        )
        .await;
    let made = headers["x-request-id"].to_str().unwrap().to_string();
    assert!(!made.is_empty() && made != "no spaces allowed", "{made}");
    let mut request = keyed(search(), Some(READER));
    request
        .metadata_mut()
        .insert("x-request-id", "rid-grpc-search-3".parse().unwrap());
    let response = grpc.search(request).await.expect("grpc search");
    assert_eq!(
        response.metadata().get("x-request-id").unwrap(),
        "rid-grpc-search-3"
    );
    let status = grpc
        .search(keyed(search(), Some(WRONG)))
        .await
        .expect_err("wrong key");
    assert!(
        status.metadata().get("x-request-id").is_some(),
        "errors carry a request id too"
    );
    wait_for_hops(&server, "rid-rest-upsert-1", "Indexer/Write").await;
    wait_for_hops(&server, "rid-rest-search-2", "Searcher/Search").await;
    wait_for_hops(&server, "rid-grpc-search-3", "Searcher/Search").await;

    // Secrets: not in the admin API, not in the debug log.
    for path in ["/admin/v1/cluster", "/admin/v1/collections/guarded/shards"] {
        let (status, answer) = server.call_with_key("GET", path, None, Some(ADMIN)).await;
        assert_eq!(status, 200, "{answer}");
        assert_no_secret(&answer.to_string(), path);
    }
    let (_, metrics) = server.call("GET", "/metrics", None).await;
    assert_no_secret(&metrics.to_string(), "/metrics");
    let log = server.log();
    assert!(
        log.lines()
            .filter(|line| line.contains("\"DEBUG\""))
            .count()
            > 10,
        "debug logging is on"
    );
    assert_no_secret(&log, "the debug log");
}

/// An indexer talking to a real S3 server with debug logging: its S3 secret
/// never reaches the log. Needs the test S3 server (`QUIVER_TEST_S3_ENDPOINT`).
#[test]
fn s3_secret_keys_stay_out_of_debug_logs() {
    let Some(server) = quiver_test_support::S3TestServer::from_env("this test") else {
        return;
    };
    let endpoint = server.endpoint();
    let directory = tempfile::tempdir().unwrap();
    let log_path = directory.path().join("indexer.log");
    let bucket = quiver_test_support::fresh_bucket_name("secrets");
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args([
            "indexer",
            "--meta",
            "127.0.0.1:1",
            "--listen",
            &free_address(),
        ])
        .args(["--object-store", &format!("s3://{bucket}/quiver")])
        .args(["--log-format", "json", "--node-id", "secret-test"])
        .env("RUST_LOG", "debug,h2=info,hyper=info,hyper_util=info")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "AKIDS3TEST")
        .env("AWS_SECRET_ACCESS_KEY", S3_SECRET_ENV)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    // The bucket is made before the indexer looks for meta; its S3 requests are
    // in the log once it does.
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read(&log_path).contains("metadata") && child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "log:\n{}", read(&log_path));
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = read(&log_path);
    // Requests signed with the secret were made while the S3 client's and the
    // HTTP stack's debug logging was on: the bucket was created with them.
    assert!(
        log.contains(&bucket)
            && log.contains("created bucket")
            && log.contains("object_store")
            && log.contains("reqwest"),
        "the signed S3 requests and their debug logging are in the log:\n{}",
        &log[..log.len().min(4000)]
    );
    assert!(
        !log.contains(S3_SECRET_ENV),
        "the S3 secret key is in the log"
    );
}
