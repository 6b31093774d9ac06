//! `quiver-bench gen` then `engine` as a user runs them: real files, real binary.

use std::path::Path;
use std::process::Command;

use quiver_test_support::process::free_address;

/// Returns an `engine` command on the dataset `gen` wrote into `data`.
fn engine_on(data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quiver-bench"));
    command
        .arg("engine")
        .arg("--base")
        .arg(data.join("base.fvecs"))
        .arg("--queries")
        .arg(data.join("queries.fvecs"))
        .arg("--gt")
        .arg(data.join("groundtruth.ivecs"));
    command
}

#[test]
fn gen_then_engine_writes_table_json_and_plot() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let binary = env!("CARGO_BIN_EXE_quiver-bench");
    let status = Command::new(binary)
        .args([
            "gen",
            "--kind",
            "clustered",
            "--n",
            "3000",
            "--dim",
            "48",
            "--clusters",
            "40",
        ])
        .args(["--queries", "50", "--out"])
        .arg(&data)
        .status()
        .unwrap();
    assert!(status.success());
    for file in ["base.fvecs", "queries.fvecs", "groundtruth.ivecs"] {
        assert!(data.join(file).exists(), "{file} written");
    }
    let json = directory.path().join("engine.json");
    let output = engine_on(&data)
        .args([
            "--metric",
            "cosine",
            "--k",
            "10",
            "--nprobe",
            "2,50",
            "--rescore",
            "1,2",
            "--segment-rows",
            "1200",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("nprobe") && stdout.contains("recall"),
        "table printed: {stdout}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(report["build_s"].as_f64().unwrap() > 0.0);
    assert!(report["index_bytes"].as_u64().unwrap() > 0);
    assert_eq!(report["segments"], 3);
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    for point in points {
        for field in ["nprobe", "rescore", "recall", "qps", "p50_ms", "p99_ms"] {
            assert!(point[field].is_number(), "{field} in {point}");
        }
    }
    // Probing every list of every segment finds nearly all true neighbours.
    let best = points
        .iter()
        .map(|p| p["recall"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(best >= 0.97, "best recall {best}");
    let png = std::fs::read(json.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn engine_rejects_bad_input_with_a_clear_message() {
    let directory = tempfile::tempdir().unwrap();
    let bad = directory.path().join("bad.fvecs");
    std::fs::write(&bad, [3u8, 0, 0, 0, 1, 2]).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_quiver-bench"))
        .arg("engine")
        .arg("--base")
        .arg(&bad)
        .arg("--queries")
        .arg(&bad)
        .arg("--gt")
        .arg(&bad)
        .args(["--metric", "l2", "--json"])
        .arg(directory.path().join("out.json"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.fvecs") && stderr.contains("not a multiple"),
        "{stderr}"
    );
}

#[test]
fn engine_through_the_region_cache_reports_cold_and_warm_numbers() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let binary = env!("CARGO_BIN_EXE_quiver-bench");
    let status = Command::new(binary)
        .args([
            "gen",
            "--n",
            "4000",
            "--dim",
            "32",
            "--clusters",
            "20",
            "--queries",
            "20",
            "--out",
        ])
        .arg(&data)
        .status()
        .unwrap();
    assert!(status.success());
    let objects = directory.path().join("objects");
    let json = directory.path().join("cached.json");
    let output = engine_on(&data)
        .args([
            "--metric",
            "l2",
            "--k",
            "10",
            "--nprobe",
            "4,64",
            "--rescore",
            "2",
        ])
        .arg("--object-store")
        .arg(format!("file://{}", objects.display()))
        .arg("--cache-dir")
        .arg(directory.path().join("cache"))
        .args(["--cache-size", "1MiB", "--region-size", "64KiB", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cache = &report["cache"];
    for field in [
        "cold_first_query_ms",
        "regions_fetched",
        "regions_total",
        "boundary_copies",
    ] {
        assert!(cache[field].is_number(), "{field} in {cache}");
    }
    // The cache was used (a file:// store is read through its regions, not
    // mapped), and fetched no more regions than the segments have.
    let fetched = cache["regions_fetched"].as_u64().unwrap();
    let total = cache["regions_total"].as_u64().unwrap();
    assert!(fetched > 0 && fetched <= total, "{cache}");
    assert!(cache["misses"].as_u64().unwrap() > 0, "{cache}");
    let best = report["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["recall"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(best >= 0.95, "recall through the cache {best}");
    // The segments really went to the object store.
    assert!(
        std::fs::read_dir(objects.join("collections/quiver-bench/shards/0/segments"))
            .unwrap()
            .count()
            >= 1
    );
}

/// Writes a small dataset with `gen` into `data`.
fn small_dataset(data: &Path, rows: &str, dim: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_quiver-bench"))
        .args(["gen", "--n", rows, "--dim", dim, "--clusters", "20"])
        .args(["--queries", "20", "--out"])
        .arg(data)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn engine_through_a_memory_store_counts_regions_in_one_unit() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    small_dataset(&data, "6000", "64");
    let json = directory.path().join("memory.json");
    let output = engine_on(&data)
        .args([
            "--metric",
            "l2",
            "--k",
            "10",
            "--nprobe",
            "8",
            "--rescore",
            "4",
        ])
        .args(["--object-store", "memory://", "--cache-dir"])
        .arg(directory.path().join("cache"))
        .args(["--cache-size", "32MiB", "--segment-rows", "2000", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cache = &report["cache"];
    let fetched = cache["regions_fetched"].as_u64().unwrap();
    let total = cache["regions_total"].as_u64().unwrap();
    assert!(fetched > 0 && fetched <= total, "{cache}");
    assert_eq!(
        fetched,
        cache["regions_fetched_hot"].as_u64().unwrap()
            + cache["regions_fetched_rows"].as_u64().unwrap(),
        "{cache}"
    );
}

#[test]
fn engine_and_cluster_create_the_report_directory_before_running() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    small_dataset(&data, "1000", "16");
    let json = directory.path().join("missing/deeper/out.json");
    let output = engine_on(&data)
        .args([
            "--metric",
            "l2",
            "--k",
            "10",
            "--nprobe",
            "4",
            "--rescore",
            "1",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(json.exists(), "the report was written");
    // cluster: the directory exists before anything is measured (here the
    // server is unreachable, so the run itself fails).
    let cluster_json = directory.path().join("cluster-out/report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_quiver-bench"))
        .args([
            "cluster",
            "--endpoint",
            "http://127.0.0.1:9",
            "--collection",
            "c",
        ])
        .arg("--queries")
        .arg(data.join("queries.fvecs"))
        .arg("--gt")
        .arg(data.join("groundtruth.ivecs"))
        .args(["--k", "10", "--concurrency", "1", "--json"])
        .arg(&cluster_json)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        cluster_json.parent().unwrap().is_dir(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A directory that cannot be created is refused at once, naming it.
    let blocker = directory.path().join("a-file");
    std::fs::write(&blocker, b"").unwrap();
    let output = engine_on(&data)
        .args(["--metric", "l2", "--json"])
        .arg(blocker.join("out.json"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("a-file"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("built"),
        "nothing was built"
    );
}

/// `quiver standalone` from the same build, on free ports, killed on drop.
struct Standalone {
    child: std::process::Child,
    endpoint: String,
    grpc_endpoint: String,
    _data: tempfile::TempDir,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Returns the `quiver` binary built beside `quiver-bench` (`cargo test
/// --workspace` builds both); None, a visible skip, when it was not built (under
/// CI a failure).
fn quiver_binary() -> Option<std::path::PathBuf> {
    let quiver = Path::new(env!("CARGO_BIN_EXE_quiver-bench")).with_file_name("quiver");
    if !quiver.exists() {
        quiver_test_support::skip_or_fail(
            "this test",
            &format!(
                "{} is not built (run cargo test --workspace, or cargo build -p quiver)",
                quiver.display()
            ),
        );
        return None;
    }
    Some(quiver)
}

/// Starts the `quiver` binary built beside `quiver-bench`; None, said so, when
/// it was not built.
fn standalone() -> Option<Standalone> {
    let quiver = quiver_binary()?;
    let data = tempfile::tempdir().unwrap();
    let (http, grpc) = (free_address(), free_address());
    let child = Command::new(&quiver)
        .arg("standalone")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--http-listen", &http])
        .args(["--grpc-listen", &grpc])
        .args(["--cache-size", "256MiB"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let server = Standalone {
        child,
        endpoint: format!("http://{http}"),
        grpc_endpoint: format!("http://{grpc}"),
        _data: data,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(mut stream) = std::net::TcpStream::connect(&http) {
            use std::io::{Read, Write};
            let _ = stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n");
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                return Some(server);
            }
        }
        assert!(std::time::Instant::now() < deadline, "standalone not ready");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn run_bench(args: &[&str], paths: &[(&str, &Path)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quiver-bench"));
    command.args(args);
    for (flag, path) in paths {
        command.arg(flag).arg(path);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "quiver-bench {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn report(json: &Path) -> serde_json::Value {
    let png = std::fs::read(json.with_extension("png")).unwrap();
    assert_eq!(
        &png[..8],
        b"\x89PNG\r\n\x1a\n",
        "plot beside {}",
        json.display()
    );
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

/// `cluster`, `filter` and `ingest` against a real `quiver standalone` over
/// REST, as the README runs them: tables, JSON of the documented shape, plots.
#[test]
fn cluster_filter_and_ingest_benches_against_a_standalone_process() {
    let Some(server) = standalone() else {
        return;
    };
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    run_bench(
        &["gen", "--kind", "clustered", "--n", "3000", "--dim", "32"],
        &[("--out", &data)],
    );
    let (base, queries, gt) = (
        data.join("base.fvecs"),
        data.join("queries.fvecs"),
        data.join("groundtruth.ivecs"),
    );

    let json = directory.path().join("cluster.json");
    let server_pid = server.child.id().to_string();
    let stdout = run_bench(
        &[
            "cluster",
            "--endpoint",
            &server.endpoint,
            "--collection",
            "bench",
            "--load",
            "--k",
            "10",
            "--concurrency",
            "1,4",
            "--max-queries",
            "100",
            "--settle-seconds",
            "1",
            "--server-pid",
            &server_pid,
            "--engine",
        ],
        &[
            ("--base", &base),
            ("--queries", &queries),
            ("--gt", &gt),
            ("--json", &json),
        ],
    );
    assert!(stdout.contains("settled in"), "{stdout}");
    let cluster = report(&json);
    let points = cluster["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (point, concurrency) in points.iter().zip([1, 4]) {
        assert_eq!(point["concurrency"], concurrency);
        assert_eq!(point["errors"], 0, "{point}");
        assert!(point["recall"].as_f64().unwrap() >= 0.95, "{point}");
        for field in ["qps", "p50_ms", "p99_ms"] {
            assert!(
                point[field].as_f64().is_some_and(|value| value > 0.0),
                "{field} in {point}"
            );
        }
        // The server's CPU is read in clock ticks (10 ms): a short run may
        // count none, so these are numbers (not null, as an infinite ratio
        // is written), not necessarily above zero.
        for field in [
            "server_cpu_ms_per_query",
            "cpu_vs_engine",
            "cpu_vs_engine_all_cores",
        ] {
            assert!(
                point[field].as_f64().is_some_and(|value| value >= 0.0),
                "{field} in {point}"
            );
        }
    }
    // The engine alone at the server's recall, on one thread and on every core.
    let engine = &cluster["engine"];
    let lowest = points
        .iter()
        .map(|point| point["recall"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(
        engine["recall"].as_f64().unwrap() >= lowest - 1e-9,
        "{engine}"
    );
    for field in ["ms_per_query", "cpu_ms_per_query_all_cores"] {
        assert!(
            engine[field].as_f64().is_some_and(|value| value > 0.0),
            "{field} in {engine}"
        );
    }
    assert!(engine["cores"].as_u64().unwrap() >= 1, "{engine}");
    assert!(stdout.contains("engine_cores"), "{stdout}");

    // The same searches over the gRPC client API, single and in batches.
    for batch in ["1", "8"] {
        let json = directory.path().join(format!("cluster-grpc-{batch}.json"));
        run_bench(
            &[
                "cluster",
                "--endpoint",
                &server.endpoint,
                "--grpc-endpoint",
                &server.grpc_endpoint,
                "--collection",
                "bench",
                "--k",
                "10",
                "--concurrency",
                "2",
                "--batch",
                batch,
                "--max-queries",
                "100",
                "--include-payload",
            ],
            &[("--queries", &queries), ("--gt", &gt), ("--json", &json)],
        );
        let point = &report(&json)["points"][0];
        assert_eq!(point["errors"], 0, "gRPC, batch {batch}: {point}");
        assert!(
            point["recall"].as_f64().unwrap() >= 0.95,
            "gRPC, batch {batch}: {point}"
        );
        assert!(point["qps"].as_f64().unwrap() > 0.0, "{point}");
    }

    let json = directory.path().join("filter.json");
    run_bench(
        &[
            "filter",
            "--endpoint",
            &server.endpoint,
            "--collection",
            "filtered",
            "--load",
            "--selectivity",
            "0.5,0.01",
            "--max-queries",
            "50",
        ],
        &[
            ("--base", &base),
            ("--queries", &queries),
            ("--json", &json),
        ],
    );
    let filter = report(&json);
    let points = filter["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (point, (selectivity, matching)) in points.iter().zip([(0.5, 1500), (0.01, 30)]) {
        assert_eq!(point["selectivity"], selectivity);
        assert_eq!(point["matching_rows"], matching, "{point}");
        assert_eq!(point["errors"], 0, "{point}");
        assert!(point["recall"].as_f64().unwrap() >= 0.95, "{point}");
    }

    let json = directory.path().join("ingest.json");
    run_bench(
        &[
            "ingest",
            "--endpoint",
            &server.endpoint,
            "--shards",
            "1,2",
            "--batch",
            "250",
        ],
        &[("--base", &base), ("--json", &json)],
    );
    let ingest = report(&json);
    let points = ingest["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (point, shards) in points.iter().zip([1, 2]) {
        assert_eq!(point["shards"], shards);
        assert_eq!(point["rows"], 3000, "{point}");
        assert_eq!(point["errors"], 0, "{point}");
        assert!(point["rows_per_s"].as_f64().unwrap() > 0.0, "{point}");
        assert!(point["ack_p99_ms"].as_f64().unwrap() >= point["ack_p50_ms"].as_f64().unwrap());
        assert!(point["ack_to_segment_p50_ms"].as_f64().is_some(), "{point}");
    }
}

/// `meta` against three real `quiver meta` processes, shortened: one failover,
/// a few commits, one second per CommitWal run; the report has the documented fields.
#[test]
fn meta_bench_measures_a_real_three_node_cluster() {
    let Some(quiver) = quiver_binary() else {
        return;
    };
    let directory = tempfile::tempdir().unwrap();
    let json = directory.path().join("meta.json");
    let table = run_bench(
        &[
            "meta",
            "--rounds",
            "1",
            "--commits",
            "5",
            "--wal-seconds",
            "1",
        ],
        &[("--quiver", &quiver), ("--json", &json)],
    );
    assert!(table.contains("failover"), "{table}");
    assert!(table.contains("CommitWal throughput"), "{table}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        report["failovers_ms"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert!(
        report["failover"]["p50_ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["manifest_commit"]["p99_ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let runs = report["commit_wal"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report}");
    assert!(
        runs.iter()
            .all(|run| run["calls_per_s"].as_f64().unwrap() > 0.0),
        "{report}"
    );
}
