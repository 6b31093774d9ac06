//! `quiver-bench gen` then `engine` as a user runs them: real files, real binary.

use std::path::Path;
use std::process::Command;

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
    assert!(cache["regions_fetched"].as_u64().unwrap() <= cache["regions_total"].as_u64().unwrap());
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
